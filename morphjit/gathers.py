"""Gathers and scatter-adds: the op records behind integer-array indexing.

``gather(x, *index, axis)`` reads ``x`` at the positions of ``m`` integer index arrays along the
``m`` axes starting at ``axis`` (the arrays broadcast to one shape ``B``): its shape is
``x.shape[:axis] + B + x.shape[axis + m:]``, NumPy's ``x[:, i, j]`` with adjacent index arrays.
Negative indices count from the end. ``scatter_add(g, *index, shape, axis)`` is its transpose:
zeros of ``shape`` with every element of ``g`` added at the position the gather reads it from,
so repeated indices accumulate. Each is the other's VJP. ``names`` holds the argument path of
each index array that is an argument ("" for others), for the range check's message.

In a loop a gather is a ``Gather`` expression (a load whose index along the picked axes is read
from the index arrays), inlined into its consumers like any element-wise op; a scatter-add is a
zero fill and a ``ScatterAdd`` instruction. Both read their operands from buffers (the index
arrays are range-checked once per call by the plan, see ``plan.range_checks``).
"""
from __future__ import annotations

import numpy as np

from . import ops
from .errors import DtypeError, ShapeError
from .indexing import IndexMap, broadcast_map
from .ir import TensorType
from .loopir import Apply, Const, Gather, ScatterAdd, loop
from .ops import ELEMENTWISE, STRUCTURAL, broadcast_shapes, defop


def index_shape(op: str, index_types) -> tuple:
    for t in index_types:
        if t.dtype.kind not in "iu":
            raise DtypeError(f"{op}: index arrays must be integers, got {t.dtype}")
    return broadcast_shapes(op, *(t.shape for t in index_types))


def _picked_axes(op: str, x_shape, count: int, axis: int) -> None:
    if not 0 <= axis <= len(x_shape) - count:
        raise ShapeError(f"{op}: {count} index arrays from axis {axis} do not fit an array of shape {tuple(x_shape)}")


def gathered_shape(x_shape, b_shape, axis: int, count: int) -> tuple:
    return tuple(x_shape[:axis]) + tuple(b_shape) + tuple(x_shape[axis + count:])


def _gather_rule(types, axis, names=()):
    x, *index = types
    _picked_axes("gather", x.shape, len(index), axis)
    return TensorType(gathered_shape(x.shape, index_shape("gather", index), axis, len(index)), x.dtype)


def _scatter_add_rule(types, shape, axis, names=()):
    g, *index = types
    _picked_axes("scatter_add", shape, len(index), axis)
    expected = gathered_shape(shape, index_shape("scatter_add", index), axis, len(index))
    if tuple(g.shape) != expected:
        raise ShapeError(f"scatter_add: updates of shape {g.shape} do not match the indexed shape {expected}")
    return TensorType(shape, g.dtype)


def _numpy_key(index, axis: int) -> tuple:
    return (slice(None),) * axis + tuple(np.asarray(i, np.intp) for i in index)


def _gather_impl(x, *index, axis, names=()):
    return x[_numpy_key(index, axis)]


def _scatter_add_impl(g, *index, shape, axis, names=()):
    out = np.zeros(shape, g.dtype)
    key = _numpy_key(index, axis)
    np.add.at(out, key, g)
    return out


def picks(expr, index, extents, loop_map: IndexMap, axis: int, b_ndim: int):
    """The index expressions of a gather or scatter at the loop point ``loop_map`` addresses
    (an index into the gathered shape): each index array read at the ``B`` part of it, a negative
    index counting from the end of its axis (of extent ``extents[k]``)."""
    b_rows = IndexMap(loop_map.offsets[axis:axis + b_ndim], loop_map.coeffs[axis:axis + b_ndim])
    b_shape = broadcast_shapes("gather", *(i.shape for i in index))
    return tuple(from_the_end(expr(i, b_rows.then(broadcast_map(i.shape, b_shape))), n, i.dtype)
                 for i, n in zip(index, extents))


def from_the_end(i, extent, dtype) -> Apply:
    """``i`` if it is not negative, else ``i + extent`` (the range check admits [-extent, extent))."""
    zero = Const(0, dtype)
    return Apply("where", (Apply("lt", (i, zero), (), np.dtype(np.bool_)),
                           Apply("add", (i, Const(extent, dtype)), (), dtype), i), (), dtype)


def address(var, index_exprs, loop_map: IndexMap, axis: int, b_ndim: int) -> Gather:
    """The element of ``var`` a gather reads (or a scatter writes) at ``loop_map``'s point."""
    count = len(index_exprs)
    rows = list(zip(loop_map.offsets, loop_map.coeffs))
    zero = (0, (0,) * loop_map.loop_ndim)
    kept = rows[:axis] + [zero] * count + rows[axis + b_ndim:]
    imap = IndexMap(tuple(o for o, _ in kept), tuple(c for _, c in kept))
    picked = (None,) * axis + tuple(index_exprs) + (None,) * (var.ndim - axis - count)
    return Gather(var, imap, picked)


def _gather_body(expr, b, imap: IndexMap) -> Gather:
    x, *index = b.inputs
    axis, b_ndim = b.kwargs["axis"], b.out.ndim - x.ndim + len(index)
    extents = x.shape[axis:axis + len(index)]
    return address(x, picks(expr, index, extents, imap, axis, b_ndim), imap, axis, b_ndim)


def _scatter_add_nests(expr, b) -> list:
    """Zeros, then every element of the updates added at its position."""
    g, *index = b.inputs
    axis, b_ndim = b.kwargs["axis"], g.ndim - b.out.ndim + len(index)
    here = IndexMap.identity(g.ndim)
    extents = b.out.shape[axis:axis + len(index)]
    at = address(b.out, picks(expr, index, extents, here, axis, b_ndim), here, axis, b_ndim)
    return [loop(b.out, Const(0, b.out.dtype)), ScatterAdd(g.shape, at, expr(g, here))]


def _gather_vjp(g, ans, x, *index, axis, names=()):
    return (ops.A.scatter_add(g, index, x.shape, axis, names),) + (None,) * len(index)


def _scatter_add_vjp(g, ans, updates, *index, shape, axis, names=()):
    return (ops.A.gather(g, index, axis, names),) + (None,) * len(index)


# The source of a gather and all index arrays are read from buffers; the updates of a scatter-add
# are computed inside its loop.
defop("gather", ELEMENTWISE, _gather_rule, _gather_impl, _gather_vjp, body=_gather_body,
      buffered=lambda inputs: inputs)
defop("scatter_add", STRUCTURAL, _scatter_add_rule, _scatter_add_impl, _scatter_add_vjp,
      nests=_scatter_add_nests, buffered=lambda inputs: inputs[1:])
