"""The IR's types: dtypes and their short names, the batch-size polynomials (``Sym``: an extent
that depends on the run-time batch size ``B``) and ``TensorType`` (a shape of such extents and a
dtype)."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

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
    (ordering, truth, ``int()``, the traced function comparing two different extents) raises
    ``Specialize``.
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
