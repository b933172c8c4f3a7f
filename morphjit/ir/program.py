"""The SSA IR: values, bindings, programs, their text form and their verifier.

A program is a list of bindings ``out = op inputs params`` in topological order. Inputs of a
binding are values (``Var``) or scalar literals (``Lit``). Printing renumbers values in order of
definition, so two structurally equal programs print identically (``parse`` reads the text back).
The printer and the verifier are here with the program, whose ``str()`` and ``verify()`` they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..util import SourceLoc
from .op import OPS
from .types import TensorType, dtype_name


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


# ---------------------------------------------------------------------------------------------
# Verifier


class VerifyError(AssertionError):
    pass


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
        if b.op not in OPS:
            raise VerifyError(f"unknown op {b.op!r}")
        expected = OPS[b.op].infer([x.type for x in b.inputs], **b.kwargs)
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
