"""The SSA IR: typed values, bindings, programs, their text form and verifier.

A program is a list of bindings ``out = op inputs params`` in topological order. Inputs of a
binding are values (``Var``) or scalar literals (``Lit``). Printing renumbers values in order of
definition, so two structurally equal programs print identically, and ``parse`` reads the text
back, which lets tests state programs as text.

One module by design: types, symbolic extents, values, bindings, the text form and its parser,
and the verifier are one vocabulary that every stage speaks; splitting it would only add imports.
"""
from __future__ import annotations

import ast
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .errors import SourceLoc

DTYPE_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.bool_): "bool",
}
DTYPES_BY_NAME = {name: dt for dt, name in DTYPE_NAMES.items()}
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def dtype_name(dtype) -> str:
    return DTYPE_NAMES[np.dtype(dtype)]


def is_float(dtype) -> bool:
    return np.dtype(dtype) in FLOAT_DTYPES


# ---------------------------------------------------------------------------------------------
# Symbolic extents: the batch size B


class Specialize(Exception):
    """Raised where a program's meaning needs the concrete batch size (a comparison, a slice
    bound, a Python int): the signature is traced again with concrete shapes."""


class Sym:
    """An extent that depends on the run-time batch size ``B``: a polynomial in ``B`` with
    non-negative integer coefficients (``B``, ``784*B``, ``B**2``, ``B+1``).

    Arithmetic that stays such a polynomial works; anything that would need the value of ``B``
    (ordering, truth, ``int()``) raises ``Specialize``.
    """

    __slots__ = ("terms",)

    def __init__(self, terms):
        self.terms = tuple(sorted((p, c) for p, c in dict(terms).items() if c))

    @staticmethod
    def of(value):
        """``value`` as a polynomial (ints are constant ones)."""
        if isinstance(value, Sym):
            return value
        return Sym({0: int(value)})

    @staticmethod
    def simplify(terms) -> "Sym | int":
        s = Sym(terms)
        return s if any(p for p, _ in s.terms) else dict(s.terms).get(0, 0)

    def __add__(self, other):
        if not isinstance(other, (Sym, int)):
            return NotImplemented
        terms = dict(self.terms)
        for p, c in Sym.of(other).terms:
            terms[p] = terms.get(p, 0) + c
        return Sym.simplify(terms)

    __radd__ = __add__

    def __mul__(self, other):
        if not isinstance(other, (Sym, int)):
            return NotImplemented
        terms: dict[int, int] = {}
        for p, c in self.terms:
            for q, d in Sym.of(other).terms:
                terms[p + q] = terms.get(p + q, 0) + c * d
        return Sym.simplify(terms)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        """Exact division by an int or a single term; anything else needs the value of B."""
        divisor = Sym.of(other).terms
        if len(divisor) != 1:
            raise Specialize(f"{self} // {other}")
        (q, d), = divisor
        if any(p < q or c % d for p, c in self.terms):
            raise Specialize(f"{self} // {other}")
        return Sym.simplify({p - q: c // d for p, c in self.terms})

    def __rfloordiv__(self, other):
        if Sym.of(other) == self:
            return 1
        raise Specialize(f"{other} // {self}")

    def __pow__(self, exponent: int):
        result = 1
        for _ in range(exponent):
            result = result * self
        return result

    def __eq__(self, other):
        return self._equal(other, when_unequal=False)

    def __ne__(self, other):
        return self._equal(other, when_unequal=True)

    def _equal(self, other, when_unequal: bool):
        """``when_unequal`` unless ``self`` and ``other`` are the same polynomial. Polynomials that
        differ may still take the same value at some batch size (``B`` and ``4`` at ``B = 4``):
        morphjit's own code compares them as expressions, but the traced function's ``if
        x.shape[0] == 4:`` needs the value, and so raises ``Specialize``."""
        if not isinstance(other, (Sym, int, np.integer)):
            return NotImplemented
        if isinstance(other, Sym) and self.terms == other.terms:
            return not when_unequal
        if not _compared_by_morphjit():
            self._needs_value()
        return when_unequal

    def __hash__(self):
        return hash(self.terms)

    def _needs_value(self, *_):
        raise Specialize(f"the program depends on the value of the batch size ({self})")

    __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __index__ = __int__ = __float__ = _needs_value
    __sub__ = __rsub__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = __neg__ = _needs_value

    def evaluate(self, batch: int) -> int:
        return sum(c * batch ** p for p, c in self.terms)

    def magnitude(self) -> tuple:
        """An ordering key for heuristics: larger powers of B dominate."""
        return tuple((p, c) for p, c in reversed(self.terms))

    def __str__(self) -> str:
        parts = []
        for p, c in reversed(self.terms):
            power = "" if p == 0 else BATCH if p == 1 else f"{BATCH}**{p}"
            parts.append(str(c) if not power else power if c == 1 else f"{c}*{power}")
        return "+".join(parts)

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return format(str(self), spec.rstrip("d"))


BATCH = "B"
BATCH_SIZE = Sym({1: 1})


def _compared_by_morphjit() -> bool:
    """Whether the code comparing two extents (the caller of ``Sym._equal``'s caller) is
    morphjit's own rather than the traced function's."""
    return sys._getframe(3).f_globals.get("__name__", "").startswith("morphjit")


def evaluate(value, batch: int):
    """``value`` (an extent, a shape, a parameter) with the batch size filled in."""
    if isinstance(value, Sym):
        return value.evaluate(batch)
    if isinstance(value, tuple):
        return tuple(evaluate(v, batch) for v in value)
    if isinstance(value, dict):
        return {k: evaluate(v, batch) for k, v in value.items()}
    return value


def batch_size(inputs, arrays) -> int | None:
    """The batch size of a call: the leading extent of the arrays whose input's is symbolic."""
    sizes = {np.shape(a)[0] for v, a in zip(inputs, arrays) if v.shape and isinstance(v.shape[0], Sym)}
    if len(sizes) > 1:
        raise ValueError(f"inputs disagree on the batch size: {sorted(sizes)}")
    return sizes.pop() if sizes else None


def is_symbolic(value) -> bool:
    if isinstance(value, Sym):
        return True
    return isinstance(value, tuple) and any(is_symbolic(v) for v in value)


def degree(extent) -> int:
    """The highest power of the batch size in an extent or size."""
    return extent.terms[-1][0] if isinstance(extent, Sym) else 0


def upper_bound(a, b):
    """The coefficient-wise maximum of two sizes: at least either, for every batch size."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return max(a, b)
    terms = dict(Sym.of(a).terms)
    for p, c in Sym.of(b).terms:
        terms[p] = max(terms.get(p, 0), c)
    return Sym.simplify(terms)


def magnitude(extent) -> tuple:
    """Ordering key of an extent or size, B taken as large (for cost heuristics only)."""
    return extent.magnitude() if isinstance(extent, Sym) else ((0, extent),)


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(d if isinstance(d, Sym) else int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int | Sym:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int | Sym:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{dtype_name(self.dtype)}[{','.join(map(str, self.shape))}]"


class Var:
    """An SSA value. Identity is object identity; the name is assigned when printing."""

    __slots__ = ("type",)

    def __init__(self, type: TensorType):
        self.type = type

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def ndim(self):
        return self.type.ndim

    def __repr__(self) -> str:
        return f"Var({self.type})"


@dataclass(frozen=True)
class Lit:
    """A scalar literal operand, already of the dtype the op computes in."""

    value: float | int | bool
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "value", np.dtype(self.dtype).type(self.value).item())

    @property
    def type(self) -> TensorType:
        return TensorType((), self.dtype)

    def __str__(self) -> str:
        if self.dtype == np.bool_:
            return str(self.value)
        text = repr(self.value)
        return text if self.dtype == np.float64 else f"{text}:{dtype_name(self.dtype)}"


class Constants:
    """``K`` of a scalar template: ``K(0.5)`` renders a constant in the op's dtype, ``K.dtype``."""

    def __init__(self, dtype, render=None):
        self.dtype = np.dtype(dtype)
        self.render = render or literal

    def __call__(self, value) -> str:
        return self.render(value, self.dtype)


def literal(value, dtype) -> str:
    """A constant of ``dtype`` as source text (so float32 loops stay in float32)."""
    dtype = np.dtype(dtype)
    if isinstance(value, Sym):
        return f"np.{dtype.name}({value})"
    if dtype == np.bool_:
        return str(bool(value))
    if dtype.kind in "iu":
        return f"np.{dtype.name}({int(value)})"
    value = float(value)
    text = repr(value) if math.isfinite(value) else ("np.nan" if math.isnan(value) else
                                                     ("np.inf" if value > 0 else "-np.inf"))
    return text if dtype == np.float64 else f"np.{dtype.name}({text})"


Operand = Var | Lit


@dataclass(frozen=True, eq=False)
class Binding:
    out: Var
    op: str
    inputs: tuple[Operand, ...]
    params: tuple[tuple[str, object], ...] = ()
    loc: SourceLoc | None = field(default=None, compare=False)

    @property
    def kwargs(self) -> dict:
        return dict(self.params)


@dataclass(frozen=True, eq=False)
class Program:
    inputs: tuple[Var, ...]
    bindings: tuple[Binding, ...]
    outputs: tuple[Var, ...]
    consts: tuple[tuple[Var, np.ndarray], ...] = ()
    name: str = "program"

    def __str__(self) -> str:
        return format_program(self)

    def verify(self) -> "Program":
        verify(self)
        return self

    def replace(self, **changes) -> "Program":
        fields = dict(inputs=self.inputs, bindings=self.bindings, outputs=self.outputs,
                      consts=self.consts, name=self.name)
        fields.update(changes)
        return Program(**fields)


def params_of(kwargs: dict) -> tuple[tuple[str, object], ...]:
    """Canonical, hashable form of op parameters (sorted by name)."""
    return tuple(sorted((k, _freeze(v)) for k, v in kwargs.items()))


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.dtype):
        return dtype_name(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------------------------
# Text form

def format_program(program: Program) -> str:
    names = Namer()
    lines = ["in " + " ".join(names.declare(v) for v in program.inputs)]
    if program.consts:
        lines.append("const " + " ".join(names.declare(v) for v, _ in program.consts))
    for b in program.bindings:
        lines.append("  " + format_binding(b, names))
    lines.append("out " + " ".join(names.use(v) for v in program.outputs))
    return "\n".join(lines) + "\n"


def format_binding(b: Binding, names: "Namer") -> str:
    parts = [names.declare(b.out), "=", b.op]
    parts += [names.use(x) if isinstance(x, Var) else str(x) for x in b.inputs]
    parts += [f"{k}={_format_param(v)}" for k, v in b.params]
    return " ".join(parts)


def _format_param(value) -> str:
    if isinstance(value, str):   # a name as it is; a message (with spaces) quoted
        return repr(value) if any(c.isspace() for c in value) else value
    return repr(value).replace(" ", "")


class Namer:
    """Assigns v0, v1, ... (or another prefix) to values in order of first mention."""

    def __init__(self, prefix: str = "v"):
        self.prefix = prefix
        self.names: dict[int, str] = {}
        self.order: list[Var] = []
        self.aliases: dict[int, Var] = {}

    @classmethod
    def of_program(cls, program: "Program", bindings: bool = True) -> "Namer":
        """Names for a program's values in its printed order: inputs, constants, (bindings)."""
        names = cls()
        for v in program.inputs:
            names.name(v)
        for v, _ in program.consts:
            names.name(v)
        for b in program.bindings if bindings else ():
            names.name(b.out)
        return names

    def same_as(self, v: Var, other: Var) -> None:
        """Name ``v`` as ``other``: two values in one buffer (an output written over an input)."""
        self.aliases[id(v)] = other

    def declare(self, v: Var) -> str:
        return f"{self.name(v)}:{v.type}"

    def name(self, v: Var) -> str:
        if id(v) in self.aliases:
            return self.name(self.aliases[id(v)])
        key = id(v)
        if key not in self.names:
            self.names[key] = f"{self.prefix}{len(self.names)}"
            self.order.append(v)
        return self.names[key]

    def use(self, v: Var) -> str:
        try:
            return self.names[id(v)]
        except KeyError:
            return f"?{v.type}"


_DECL = re.compile(r"^(v\d+):(\w+)\[([\dB*+,]*)\]$")


def parse(text: str) -> Program:
    """Read a program back from its text form (constants become zeros)."""
    env: dict[str, Var] = {}
    inputs, consts, bindings, outputs = [], [], [], []
    for raw in text.strip().splitlines():
        line = raw.strip()
        head, _, rest = line.partition(" ")
        if head == "in":
            inputs = [_declare(tok, env) for tok in rest.split()]
        elif head == "const":
            consts = [(v, np.zeros(v.shape, v.dtype)) for v in (_declare(t, env) for t in rest.split())]
        elif head == "out":
            outputs = [env[tok] for tok in rest.split()]
        else:
            bindings.append(_parse_binding(line, env))
    return Program(tuple(inputs), tuple(bindings), tuple(outputs), tuple(consts))


def _declare(token: str, env: dict[str, Var]) -> Var:
    m = _DECL.match(token)
    if not m:
        raise ValueError(f"bad value declaration {token!r}")
    name, dt, dims = m.groups()
    shape = tuple(_parse_extent(d) for d in dims.split(",") if d)
    env[name] = Var(TensorType(shape, DTYPES_BY_NAME[dt]))
    return env[name]


_TOKEN = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")   # split at spaces outside quotes


def _parse_binding(line: str, env: dict[str, Var]) -> Binding:
    lhs, _, rhs = line.partition(" = ")
    tokens = _TOKEN.findall(rhs)
    op, args = tokens[0], tokens[1:]
    inputs, params = [], {}
    for tok in args:
        if "=" in tok:
            key, _, value = tok.partition("=")
            params[key] = _parse_param(value)
        elif tok in env:
            inputs.append(env[tok])
        else:
            inputs.append(_parse_literal(tok))
    out = _declare(lhs, env)
    return Binding(out, op, tuple(inputs), params_of(params))


_EXTENT = re.compile(r"^[\dB*+(),]*$")


def _parse_extent(text: str):
    """An extent or a tuple of them, as printed (``784*B``, ``B**2+1``, ``(B,10)``)."""
    if not _EXTENT.match(text):
        raise ValueError(f"bad extent {text!r}")
    return eval(text, {"__builtins__": {}}, {BATCH: BATCH_SIZE})


def _parse_param(text: str):
    if BATCH in text and _EXTENT.match(text):
        return _parse_extent(text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return float(text) if text in ("inf", "-inf", "nan") else text  # repr of non-finite floats


def _parse_literal(tok: str) -> Lit:
    value, _, dt = tok.partition(":")
    if value in ("True", "False"):
        return Lit(value == "True", np.bool_)
    dtype = DTYPES_BY_NAME[dt or "f64"]
    return Lit(float(value) if is_float(dtype) else int(value), dtype)


# ---------------------------------------------------------------------------------------------
# Verifier

class VerifyError(AssertionError):
    pass


# op name -> its type rule ``infer(input types, **params) -> TensorType``; the op table (which is
# built on this module) registers each op's rule here as it defines the op.
TYPE_RULES: dict = {}


def verify(program: Program) -> None:
    """Check that every value is defined once before use and every binding is well typed."""
    defined: set[int] = set()

    def define(v: Var, what: str):
        if id(v) in defined:
            raise VerifyError(f"{what} redefines a value")
        defined.add(id(v))

    for v in program.inputs:
        define(v, "input")
    for v, value in program.consts:
        define(v, "const")
        if value.shape != v.shape or value.dtype != v.dtype:
            raise VerifyError(f"const of type {v.type} holds {value.dtype}{list(value.shape)}")
    names = Namer.of_program(program, bindings=False)
    for b in program.bindings:
        for x in b.inputs:
            if isinstance(x, Var) and id(x) not in defined:
                raise VerifyError(f"{format_binding(b, names)}: operand used before definition")
        if b.op not in TYPE_RULES:
            raise VerifyError(f"unknown op {b.op!r}")
        expected = TYPE_RULES[b.op]([x.type for x in b.inputs], **b.kwargs)
        names.name(b.out)
        if expected != b.out.type:
            raise VerifyError(f"{format_binding(b, names)}: op gives {expected}")
        define(b.out, format_binding(b, names))
    for v in program.outputs:
        if id(v) not in defined:
            raise VerifyError("output is not defined in the program")


def uses(bindings: Sequence[Binding], outputs: Sequence[Var]) -> dict[int, int]:
    """How many times each value is read (by bindings and as a program output)."""
    counts: dict[int, int] = {}
    for b in bindings:
        for x in b.inputs:
            if isinstance(x, Var):
                counts[id(x)] = counts.get(id(x), 0) + 1
    for v in outputs:
        counts[id(v)] = counts.get(id(v), 0) + 1
    return counts
