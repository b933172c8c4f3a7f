"""The shape and dtype rules that op families share (broadcasting, one dtype, axes, slices),
used by the op table's rules and by the array functions that check arguments before binding an
op, and the errors of reductions over no element."""
from __future__ import annotations

import numpy as np

from ..util import DtypeError, ShapeError
from .types import Sym, TensorType, is_float


def broadcast_shapes(op: str, *shapes) -> tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes]):
        sizes = set(d for d in dims if d != 1)
        if len(sizes) > 1:
            raise ShapeError(f"{op}: cannot broadcast shapes {' and '.join(str(tuple(s)) for s in shapes)}")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def same_dtype(op: str, types) -> np.dtype:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise DtypeError(f"{op}: operands must share one dtype, got {', '.join(sorted(map(str, dtypes)))}")
    return dtypes.pop()


def require_float(op: str, t: TensorType) -> None:
    if not is_float(t.dtype):
        raise DtypeError(f"{op}: expected a float32 or float64 operand, got {t.dtype}")


FLOAT, NUMERIC, ANY = "f", "fiu", "fiub"   # dtype kinds an element-wise op accepts


def elementwise_rule(name: str, kinds=FLOAT, out_dtype=None):
    def infer(types):
        dtype = same_dtype(name, types)
        if dtype.kind not in kinds:
            expected = {FLOAT: "float32 or float64", NUMERIC: "numeric (not boolean)"}.get(kinds, "any")
            raise DtypeError(f"{name}: expected {expected} operands, got {dtype}")
        return TensorType(broadcast_shapes(name, *(t.shape for t in types)), out_dtype or dtype)
    return infer


def check_axes(op: str, axes, ndim: int) -> tuple[int, ...]:
    for a in axes:
        if not 0 <= a < ndim:
            raise ShapeError(f"{op}: axis {a} is out of range for an array of {ndim} dimensions")
    return axes


def reduced_shape(shape, axes) -> tuple[int, ...]:
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def keepdims_shape(shape, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def slice_shape(starts, stops, steps) -> tuple[int, ...]:
    return tuple(b if a == 0 and s == 1 and isinstance(b, Sym) else len(range(a, b, s))  # all of a batch
                 for a, b, s in zip(starts, stops, steps))


def slice_index(starts, stops, steps) -> tuple[slice, ...]:
    return tuple(slice(a, b if b >= 0 else None, s) for a, b, s in zip(starts, stops, steps))


# A max or min of no element has no value: NumPy raises. Where the user's function reduces over
# extents that depend on the batch size, ``empty`` names it, and the step raises its error (NumPy's,
# by ``EMPTY_REDUCTION``) when they are 0 (``backend.plan.empty_reductions``); the reductions morphjit makes
# itself start from -inf/inf (the composites' stable shift: a logsumexp of nothing is -inf).
EMPTY_REDUCTION = {"max": "zero-size array to reduction operation maximum which has no identity",
                   "min": "zero-size array to reduction operation minimum which has no identity",
                   "ptp": "zero-size array to reduction operation maximum which has no identity",
                   "argmax": "attempt to get argmax of an empty sequence",
                   "argmin": "attempt to get argmin of an empty sequence"}


def empty_reduction_error(name: str) -> str:
    """The error of the function ``name`` (a key of ``EMPTY_REDUCTION``) reducing no element."""
    hint = ": give initial= for a value" if name in ("max", "min") else ""
    return f"{name}: {EMPTY_REDUCTION[name]}{hint}"

