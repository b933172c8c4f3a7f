"""Views (index functions over one operand, owning no buffer: ``reshape``, ``transpose``,
``broadcast_to``, ``slice``, ``diagonal``) and the structural ops that move data
(``concatenate``; ``unslice``, the transpose of slicing; ``update_slice``, NumPy's
``x[box] = v`` as a new array)."""
from __future__ import annotations

import math

import numpy as np

from .. import api as A
from ..ir import (STRUCTURAL, VIEW, Const, IndexMap, Nest, Store, TensorType, broadcast_map, broadcast_shapes,
                  check_axes, defop, is_unit_reshape, loop, same_dtype, slice_index, slice_map, slice_shape,
                  transpose_map, unit_reshape_map)
from ..util import ShapeError


def _reshape_rule(types, shape):
    (x,) = types
    if math.prod(shape) != x.size:
        raise ShapeError(f"reshape: cannot reshape an array of shape {x.shape} into shape {tuple(shape)}")
    return TensorType(shape, x.dtype)


def _transpose_rule(types, perm):
    (x,) = types
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: axes {tuple(perm)} are not a permutation of {x.ndim} dimensions")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _broadcast_to_rule(types, shape):
    (x,) = types
    if broadcast_shapes("broadcast_to", x.shape, shape) != tuple(shape):
        raise ShapeError(f"broadcast_to: cannot broadcast shape {x.shape} to {tuple(shape)}")
    return TensorType(shape, x.dtype)


def _slice_rule(types, starts, stops, steps):
    (x,) = types
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: needs one (start, stop, step) per dimension of {x.shape}")
    return TensorType(slice_shape(starts, stops, steps), x.dtype)


def _reshape_map(x_shape, out_shape, shape) -> IndexMap:
    """Only a reshape that inserts or removes unit axes reads through an index map; others are
    aliases of their operand's buffer (see fusion)."""
    assert is_unit_reshape(x_shape, out_shape), "reshape: not an index map"
    return unit_reshape_map(x_shape, out_shape)


defop("reshape", VIEW, _reshape_rule, lambda x, shape: np.reshape(x, shape),
            lambda g, ans, x, shape: (A.reshape(g, x.shape),),
      index_map=_reshape_map)
defop("transpose", VIEW, _transpose_rule, lambda x, perm: np.transpose(x, perm),
            lambda g, ans, x, perm: (A.transpose(g, tuple(np.argsort(perm))),),
      index_map=lambda x_shape, out_shape, perm: transpose_map(perm))
defop("broadcast_to", VIEW, _broadcast_to_rule, lambda x, shape: np.broadcast_to(x, shape),
            lambda g, ans, x, shape: (g,),
      index_map=lambda x_shape, out_shape, shape: broadcast_map(x_shape, out_shape))
defop("slice", VIEW, _slice_rule, lambda x, starts, stops, steps: x[slice_index(starts, stops, steps)],
            lambda g, ans, x, starts, stops, steps: (A.unslice(g, x.shape, starts, stops, steps),),
      index_map=lambda x_shape, out_shape, starts, stops, steps: slice_map(starts, steps))


# diagonal: a view (output axis -1 walks both axes at once)


def _diagonal_length(n1, n2, offset) -> int:
    return max(0, min(n1 + min(offset, 0), n2 - max(offset, 0)))


def _diagonal_rule(types, axis1, axis2, offset):
    (x,) = types
    check_axes("diagonal", (axis1, axis2), x.ndim)
    if axis1 == axis2:
        raise ShapeError("diagonal: axis1 and axis2 must differ")
    rest = tuple(d for k, d in enumerate(x.shape) if k not in (axis1, axis2))
    return TensorType(rest + (_diagonal_length(x.shape[axis1], x.shape[axis2], offset),), x.dtype)


def _diagonal_map(x_shape, out_shape, axis1, axis2, offset) -> IndexMap:
    n = len(out_shape)
    rest = iter(range(n - 1))
    offsets, rows = [], []
    for k in range(len(x_shape)):
        j = n - 1 if k in (axis1, axis2) else next(rest)
        offsets.append(max(0, -offset) if k == axis1 else max(0, offset) if k == axis2 else 0)
        rows.append(tuple(int(m == j) for m in range(n)))
    return IndexMap(tuple(offsets), tuple(rows))


def _diagonal_vjp(g, ans, x, axis1, axis2, offset):
    """Zeros with ``g`` on the diagonal: ``R @ (g[..., None] * C)`` with 0/1 placement matrices."""
    n1, n2, k = x.shape[axis1], x.shape[axis2], ans.shape[-1]
    rows = np.eye(n1, k, -max(0, -offset), dtype=x.dtype)    # R[t + r0, t] = 1
    cols = np.eye(k, n2, max(0, offset), dtype=x.dtype)      # C[t, t + c0] = 1
    placed = A.multiply(A.expand_dims(g, -1), cols)                  # (..., k, n2)
    if n1 != k or offset < 0:   # else R is the identity: no matrix product
        placed = A.matmul(rows, placed)                               # (..., n1, n2)
    others = [a for a in range(x.ndim) if a not in (axis1, axis2)]
    order = others + [axis1, axis2]
    return (A.transpose(placed, tuple(int(i) for i in np.argsort(order))),)


defop("diagonal", VIEW, _diagonal_rule,
      lambda x, axis1, axis2, offset: np.diagonal(x, offset, axis1, axis2), _diagonal_vjp,
      index_map=_diagonal_map)


# ---------------------------------------------------------------------------------------------
# Structural ops: concatenate and the transpose of slicing


def _concatenate_rule(types, axis):
    first = types[0]
    dtype = same_dtype("concatenate", types)
    check_axes("concatenate", (axis,), first.ndim)
    for t in types[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise ShapeError(f"concatenate: shapes {first.shape} and {t.shape} differ off axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(shape, dtype)


def _concatenate_vjp(g, ans, *xs, axis):
    grads, start = [], 0
    for x in xs:
        starts = [0] * ans.ndim
        starts[axis] = start
        stops = list(ans.shape)
        stops[axis] = start + x.shape[axis]
        grads.append(A.slice_array(g, starts, stops, [1] * ans.ndim))
        start += x.shape[axis]
    return tuple(grads)


def _unslice_rule(types, shape, starts, stops, steps):
    (g,) = types
    if slice_shape(starts, stops, steps) != g.shape:
        raise ShapeError(f"unslice: slice of {tuple(shape)} does not have shape {g.shape}")
    return TensorType(shape, g.dtype)


def _unslice_impl(g, shape, starts, stops, steps):
    out = np.zeros(shape, g.dtype)
    out[slice_index(starts, stops, steps)] = g
    return out


def _update_slice_rule(types, starts, stops, steps):
    x, v = types
    if slice_shape(starts, stops, steps) != v.shape or not len(starts) == x.ndim:
        raise ShapeError(f"update_slice: slice of {x.shape} does not have shape {v.shape}")
    same_dtype("update_slice", types)
    return x


def _update_slice_impl(x, v, starts, stops, steps):
    out = np.array(x, copy=True)
    out[slice_index(starts, stops, steps)] = v
    return out


def _update_slice_vjp(g, ans, x, v, starts, stops, steps):
    zeros = A.full(v.shape, 0, g.dtype, like=g.trace)
    return A.update_slice(g, zeros, starts, stops, steps), A.slice_array(g, starts, stops, steps)


def _concatenate_nests(expr, b) -> list:
    """One nest per operand, storing it at its offset along the axis."""
    axis, start, parts = b.kwargs["axis"], 0, []
    for x in b.inputs:
        offsets = tuple(start if k == axis else 0 for k in range(x.ndim))
        out_map = IndexMap(offsets, IndexMap.identity(x.ndim).coeffs)
        parts.append(Nest(x.shape, (Store(b.out, out_map, expr(x, IndexMap.identity(x.ndim))),)))
        start += x.shape[axis]
    return parts


def _unslice_nests(expr, b) -> list:
    """Zeros, then the slice scattered into them."""
    g, kw = b.inputs[0], b.kwargs
    scatter = Store(b.out, slice_map(kw["starts"], kw["steps"]), expr(g, IndexMap.identity(g.ndim)))
    return [loop(b.out, Const(0, b.out.dtype)), Nest(g.shape, (scatter,))]


def _update_slice_nests(expr, b) -> list:
    """A copy of the array, then the values stored into the box."""
    x, v = b.inputs
    box = Store(b.out, slice_map(b.kwargs["starts"], b.kwargs["steps"]), expr(v, IndexMap.identity(v.ndim)))
    return [loop(b.out, expr(x, IndexMap.identity(x.ndim))), Nest(v.shape, (box,))]


defop("concatenate", STRUCTURAL, _concatenate_rule, lambda *xs, axis: np.concatenate(xs, axis),
      _concatenate_vjp, nests=_concatenate_nests)
defop("unslice", STRUCTURAL, _unslice_rule, _unslice_impl,
            lambda g, ans, x, shape, starts, stops, steps: (A.slice_array(g, starts, stops, steps),),
      nests=_unslice_nests)
defop("update_slice", STRUCTURAL, _update_slice_rule, _update_slice_impl, _update_slice_vjp,
      nests=_update_slice_nests)
