"""Gathers, scatter-adds and scatters: the op records behind integer-array indexing and writes.

``gather(x, *index, axis)`` reads ``x`` at the positions of ``m`` integer index arrays along the
``m`` axes starting at ``axis`` (the arrays broadcast to one shape ``B``): its shape is
``x.shape[:axis] + B + x.shape[axis + m:]``, NumPy's ``x[:, i, j]`` with adjacent index arrays.
Negative indices count from the end. ``scatter_add(g, *index, shape, axis)`` is its transpose:
zeros of ``shape`` with every element of ``g`` added at the position the gather reads it from,
so repeated indices accumulate. Each is the other's VJP. ``scatter(x, v, *index, axis)`` is NumPy's
``x[:, i, j] = v`` as a new array: ``x`` with ``v`` (of the gathered shape) stored at the positions,
where a position that repeats keeps the element of ``v`` last in C order, as NumPy's does. ``names`` holds the argument path of
each index array that is an argument ("" for others), for the range check's message; a
``slice_length`` marks the read of a slice with traced bounds of that length, whose index is the
axis length where NumPy's slice has no element (``api.slices``), refused by its range check;
``slice_nth`` tells apart slices of one length traced on one line (the check names it).
``iota(shape, axis, dtype)`` is the index along ``axis`` at every element (``np.arange(n)`` whose
``n`` may be the batch size).

In a loop a gather is a ``Gather`` expression (a load whose index along the picked axes is read
from the index arrays), inlined into its consumers like any element-wise op; a scatter-add is a
zero fill and a ``Scatter`` instruction, a scatter a copy of ``x`` and a ``Scatter`` that stores. Both read their operands from buffers (the index
arrays are range-checked once per call by the plan, see ``backend.plan.range_checks``), except an iota
no longer than its axis: a gather reads along it as along a loop index (``x[np.arange(n), y]``
reads ``x[i, y[i]]``), with no index array and nothing to check.
"""
from __future__ import annotations

import numpy as np

from .. import api as A
from ..ir import (DTYPES_BY_NAME, ELEMENTWISE, SOURCE, STRUCTURAL, Apply, Const, Gather, IndexMap, Load, Position,
                  Scatter, Sym, TensorType, broadcast_map, broadcast_shapes, defop, loop)
from ..util import DtypeError, ShapeError


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


def _gather_rule(types, axis, names=(), slice_length=0, slice_nth=0):
    x, *index = types
    _picked_axes("gather", x.shape, len(index), axis)
    return TensorType(gathered_shape(x.shape, index_shape("gather", index), axis, len(index)), x.dtype)


def _scatter_add_rule(types, shape, axis, names=(), slice_length=0, slice_nth=0):
    g, *index = types
    _picked_axes("scatter_add", shape, len(index), axis)
    expected = gathered_shape(shape, index_shape("scatter_add", index), axis, len(index))
    if tuple(g.shape) != expected:
        raise ShapeError(f"scatter_add: updates of shape {g.shape} do not match the indexed shape {expected}")
    return TensorType(shape, g.dtype)


def _scatter_rule(types, axis, names=()):
    x, v, *index = types
    _picked_axes("scatter", x.shape, len(index), axis)
    expected = gathered_shape(x.shape, index_shape("scatter", index), axis, len(index))
    if tuple(v.shape) != expected or v.dtype != x.dtype:
        raise ShapeError(f"scatter: values {v} do not match the indexed shape {expected} of {x}")
    return x


def _numpy_key(index, axis: int) -> tuple:
    return (slice(None),) * axis + tuple(np.asarray(i, np.intp) for i in index)


def _gather_impl(x, *index, axis, names=(), slice_length=0, slice_nth=0):
    return x[_numpy_key(index, axis)]


def _scatter_impl(x, v, *index, axis, names=()):
    out = np.array(x, copy=True)
    out[_numpy_key(index, axis)] = v
    return out


def _scatter_add_impl(g, *index, shape, axis, names=(), slice_length=0, slice_nth=0):
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
    found = (expr(i, b_rows.then(broadcast_map(i.shape, b_shape))) for i in index)
    return tuple(p if isinstance(p, Position) else from_the_end(p, n, i.dtype)
                 for p, i, n in zip(found, index, extents))


def from_the_end(i, extent, dtype) -> Apply:
    """``i`` if it is not negative, else ``i + extent`` (the range check admits [-extent, extent))."""
    zero = Const(0, dtype)
    return Apply("where", (Apply("lt", (i, zero), (), np.dtype(np.bool_)),
                           Apply("add", (i, Const(extent, dtype)), (), dtype), i), (), dtype)


def address(var, index_exprs, loop_map: IndexMap, axis: int, b_ndim: int) -> Gather:
    """The element of ``var`` a gather reads (or a scatter writes) at ``loop_map``'s point. An
    axis picked at a position is read along that position's affine row, not through a pick."""
    count = len(index_exprs)
    rows = list(zip(loop_map.offsets, loop_map.coeffs))
    zero = (0, (0,) * loop_map.loop_ndim)
    affine = [(p.imap.offsets[0], p.imap.coeffs[0]) if isinstance(p, Position) else zero for p in index_exprs]
    kept = rows[:axis] + affine + rows[axis + b_ndim:]
    imap = IndexMap(tuple(o for o, _ in kept), tuple(c for _, c in kept))
    picked = tuple(None if isinstance(p, Position) else p for p in index_exprs)
    return Gather(var, imap, (None,) * axis + picked + (None,) * (var.ndim - axis - count))


def _gather_body(expr, b, imap: IndexMap) -> Gather | Load:
    """The element read; a plain load where every picked axis is read at a position."""
    x, *index = b.inputs
    axis, b_ndim = b.kwargs["axis"], b.out.ndim - x.ndim + len(index)
    at = address(x, picks(expr, index, picked_extents(b), imap, axis, b_ndim), imap, axis, b_ndim)
    return at if at.children() else Load(x, at.imap)


def _scatter_add_nests(expr, b) -> list:
    """Zeros, then every element of the updates added at its position."""
    g, *index = b.inputs
    axis, b_ndim = b.kwargs["axis"], g.ndim - b.out.ndim + len(index)
    here = IndexMap.identity(g.ndim)
    at = address(b.out, picks(expr, index, picked_extents(b), here, axis, b_ndim), here, axis, b_ndim)
    return [loop(b.out, Const(0, b.out.dtype)), Scatter(g.shape, at, expr(g, here))]


def _scatter_nests(expr, b) -> list:
    """A copy of the array, then every element of the values stored at its position."""
    x, v, *index = b.inputs
    axis, b_ndim = b.kwargs["axis"], v.ndim - x.ndim + len(index)
    here = IndexMap.identity(v.ndim)
    at = address(b.out, picks(expr, index, picked_extents(b), here, axis, b_ndim), here, axis, b_ndim)
    return [loop(b.out, expr(x, IndexMap.identity(x.ndim))), Scatter(v.shape, at, expr(v, here), accumulate=False)]


def index_operands(b) -> list:
    """The index arrays of a gather, scatter-add or scatter binding."""
    return list(b.inputs[2:] if b.op == "scatter" else b.inputs[1:])


def picked_extents(b) -> tuple:
    """The extents of the axes a gather, scatter-add or scatter binding picks along, one per index array."""
    shape = b.kwargs["shape"] if b.op == "scatter_add" else b.inputs[0].shape
    axis = b.kwargs["axis"]
    return tuple(shape[axis:axis + len(index_operands(b))])


def in_range(index, extent, producer: dict) -> bool:
    """Whether ``index`` (a value; ``producer`` maps value ids to bindings) lies in ``[0, extent)``
    by construction: an iota no longer than the axis, so nothing reads it from a buffer or checks it."""
    b = producer.get(id(index))
    if b is None or b.op != "iota":
        return False
    length = b.kwargs["shape"][b.kwargs["axis"]]
    return length == extent or not isinstance(length, Sym) and not isinstance(extent, Sym) and length <= extent


def _buffered(b, producer: dict) -> list:
    """The source of a gather and the index arrays, but those in range by construction."""
    source = [b.inputs[0]] if b.op == "gather" else []
    return source + [i for i, n in zip(index_operands(b), picked_extents(b)) if not in_range(i, n, producer)]


def _iota_rule(types, shape, axis, dtype):
    if DTYPES_BY_NAME[dtype].kind not in "iu" or not 0 <= axis < len(shape):
        raise ShapeError(f"iota: an integer dtype and an axis of shape {tuple(shape)}, got {dtype} and {axis}")
    return TensorType(shape, DTYPES_BY_NAME[dtype])


def _iota_impl(shape, axis, dtype):
    line = np.arange(shape[axis], dtype=DTYPES_BY_NAME[dtype])
    return np.broadcast_to(line.reshape([-1 if k == axis else 1 for k in range(len(shape))]), shape).copy()


def _iota_body(expr, b, imap: IndexMap) -> Position:
    axis = b.kwargs["axis"]
    return Position(IndexMap(imap.offsets[axis:axis + 1], imap.coeffs[axis:axis + 1]), b.out.dtype)


def _gather_vjp(g, ans, x, *index, axis, names=(), slice_length=0, slice_nth=0):
    return (A.scatter_add(g, index, x.shape, axis, names, slice_length, slice_nth),) + (None,) * len(index)


def _scatter_add_vjp(g, ans, updates, *index, shape, axis, names=(), slice_length=0, slice_nth=0):
    return (A.gather(g, index, axis, names, slice_length, slice_nth),) + (None,) * len(index)


def _scatter_vjp(g, ans, x, v, *index, axis, names=()):
    """The written positions get no gradient from before the write; of the values, only those
    written last to their position (the others are overwritten) get the gradient there."""
    zeros = A.full(v.shape, 0, g.dtype, like=g.trace)
    written = A.gather(g, index, axis, names) * _last_written(x, v, index, axis)
    return (A.scatter(g, zeros, index, axis, names), written) + (None,) * len(index)


def _last_written(x, v, index, axis: int):
    """1 where an element of the scatter's values is the last written to its position, else 0,
    shaped to broadcast against the values."""
    shape = broadcast_shapes("scatter", *(tuple(i.shape) for i in index))
    if any(isinstance(d, Sym) for d in shape[1:]):
        raise ShapeError("the gradient of a write at repeated indices needs the index arrays' trailing extents")
    order = sum((A.iota(shape, k, np.int64, v.trace) * int(np.prod(shape[k + 1:], dtype=np.int64))
                 for k in range(len(shape))), A.full(shape, 0, np.int64, like=v.trace))
    positions = tuple(x.shape[axis:axis + len(index)])
    last = A.full(positions, -1, np.int64, like=v.trace)
    winners = A.gather(A.scatter(last, order, index, 0), index, 0) == order
    return A.reshape(A.astype(winners, v.dtype), (1,) * axis + shape + (1,) * (v.ndim - axis - len(shape)))


# The updates of a scatter-add are computed inside its loop.
defop("gather", ELEMENTWISE, _gather_rule, _gather_impl, _gather_vjp, body=_gather_body, buffered=_buffered)
defop("scatter_add", STRUCTURAL, _scatter_add_rule, _scatter_add_impl, _scatter_add_vjp,
      nests=_scatter_add_nests, buffered=_buffered)
defop("scatter", STRUCTURAL, _scatter_rule, _scatter_impl, _scatter_vjp, nests=_scatter_nests, buffered=_buffered)
defop("iota", SOURCE, _iota_rule, _iota_impl, body=_iota_body)
