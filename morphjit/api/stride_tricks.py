"""Window views and NumPy's stride tricks on traced arrays.

A window view is an affine index map: ``window(x, shape, coeffs)`` reads ``x`` at
``sum_j coeffs[a][j] * i[j]`` along each axis ``a`` of ``x`` (``np.lib.stride_tricks``'s
``sliding_window_view``, and ``as_strided`` where the strides are multiples of ``x``'s own, with
stride and dilation folded into the coefficients). It owns no buffer: a consumer reads ``x``
through the composed map (MoA's psi-composition). Its transpose ``unwindow`` adds every element of
the cotangent into zeros at the position the view read it from (a scatter loop: col2im).
Convolutions and pooling (``morphjit.conv``) are built on these views.
Loading this module registers the ops and ``np.lib.stride_tricks.sliding_window_view``.
"""
from __future__ import annotations

import numpy as np

from . import core as A
from ..util.errors import ShapeError, UnsupportedError, user_location
from ..ir.index import IndexMap
from ..ir.program import Sym, TensorType
from ..ir.loop import Const, Gather, Load, Nest, ScatterAdd, Store, loads, loop
from ..ops.core import STRUCTURAL, VIEW, defop

# ---------------------------------------------------------------------------------------------
# The ops: window (a view) and unwindow (its transpose, a scatter-add)


def _check_window(op: str, x_shape, shape, coeffs) -> None:
    """Every index the map reaches lies inside ``x_shape``; an axis read one to one needs no test
    (its extent may be the symbolic batch size)."""
    if len(coeffs) != len(x_shape) or any(len(row) != len(shape) for row in coeffs):
        raise ShapeError(f"{op}: coefficients {coeffs} do not map a view of {len(shape)} axes onto "
                         f"an array of {len(x_shape)}")
    if any(c < 0 for row in coeffs for c in row):
        raise ShapeError(f"{op}: negative coefficients in {coeffs}")
    if any(not isinstance(d, Sym) and d < 1 for d in shape):
        raise ShapeError(f"{op}: empty windows (view shape {tuple(shape)})")
    for n, row in zip(x_shape, coeffs):
        used = [(c, d) for c, d in zip(row, shape) if c]
        if used == [(1, n)]:
            continue
        if sum(c * (d - 1) for c, d in used) >= n:
            raise ShapeError(f"{op}: a window view of shape {tuple(shape)} reads past an axis of {n}")


def window_rule(types, shape, coeffs):
    (x,) = types
    _check_window("window", x.shape, shape, coeffs)
    return TensorType(shape, x.dtype)


def _unwindow_rule(types, shape, coeffs):
    (g,) = types
    _check_window("unwindow", shape, g.shape, coeffs)
    return TensorType(shape, g.dtype)


def window_values(x, shape, coeffs):
    x = np.ascontiguousarray(x)
    strides = [sum(c * s for c, s in zip(column, x.strides)) for column in zip(*coeffs)]
    return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False).copy()


def _unwindow_impl(g, shape, coeffs):
    out = np.zeros(shape, g.dtype)
    np.add.at(out, tuple(np.einsum("aj,j...->a...", np.asarray(coeffs), np.indices(g.shape))), g)
    return out


def window_map(x_shape, out_shape, shape, coeffs) -> IndexMap:
    return IndexMap((0,) * len(coeffs), tuple(tuple(row) for row in coeffs))


def _unwindow_nests(expr, b) -> list:
    """Zeros, then every element of the cotangent added where the view read it (col2im); where
    the windows tile the output exactly (pooling with stride = kernel), one store per element.
    The loops run in the order of the buffer the cotangent is read from (contiguous reads)."""
    (g,) = b.inputs
    order = _read_order(expr(g, IndexMap.identity(g.ndim)), g.ndim)
    loops = IndexMap((0,) * g.ndim, tuple(tuple(int(a == k) for k in order) for a in range(g.ndim)))
    domain = tuple(g.shape[a] for a in order)
    imap = loops.then(window_map(b.out.shape, g.shape, **b.kwargs))
    if tiles(b.out.shape, g.shape, b.kwargs["coeffs"]):
        return [Nest(domain, (Store(b.out, imap, expr(g, loops)),))]
    at = Gather(b.out, imap, (None,) * b.out.ndim)
    return [loop(b.out, Const(0, b.out.dtype)), ScatterAdd(domain, at, expr(g, loops))]


def _read_order(body, ndim: int) -> tuple[int, ...]:
    """The axes of the loop domain in the order of the buffer ``body`` reads (where it reads one
    buffer through a transpose, as col2im reads the GEMM's result), else in their own order."""
    reads = loads(body)
    if len(reads) == 1 and isinstance(reads[0], Load) and len(reads[0].imap.coeffs) == ndim:
        rows = reads[0].imap.coeffs
        if not any(reads[0].imap.offsets) and all(sorted(row) == [0] * (ndim - 1) + [1] for row in rows):
            order = tuple(row.index(1) for row in rows)
            if sorted(order) == list(range(ndim)):
                return order
    return tuple(range(ndim))


def tiles(x_shape, shape, coeffs) -> bool:
    """Does the window map send the view's elements one to one onto all of ``x_shape``? Along
    each axis the steps must be the place values of a mixed radix whose digits are the extents."""
    for n, row in zip(x_shape, coeffs):
        place = 1
        for c, d in sorted((c, d) for c, d in zip(row, shape) if c and d != 1):
            if c != place:
                return False
            place *= d
        if place != n:
            return False
    return True


defop("window", VIEW, window_rule, window_values,
      lambda g, ans, x, shape, coeffs: (unwindow(g, x.shape, coeffs),), index_map=window_map)
defop("unwindow", STRUCTURAL, _unwindow_rule, _unwindow_impl,
      lambda g, ans, x, shape, coeffs: (window(g, x.shape, coeffs),), nests=_unwindow_nests)
def window(x, shape, coeffs):
    return A.bind("window", [x], shape=tuple(shape), coeffs=coeffs)


def unwindow(g, shape, coeffs):
    return A.bind("unwindow", [g], shape=tuple(shape), coeffs=coeffs)


# ---------------------------------------------------------------------------------------------
# Window geometry


def windows(x_shape, axes, sizes, steps=None, dilations=None) -> tuple[tuple, tuple]:
    """The shape and coefficients of the view of windows of ``sizes`` along ``axes`` (an axis may
    repeat, as in NumPy), positions ``steps`` apart (per axis of ``x``), taps ``dilations`` apart
    (per window): positions first, then one axis per window."""
    n = len(x_shape)
    steps = steps or (1,) * n
    dilations = dilations or (1,) * len(axes)
    spans = [0] * n
    for a, k, d in zip(axes, sizes, dilations):
        spans[a] += d * (k - 1)
    positions = []
    for a, extent in enumerate(x_shape):
        if not spans[a] and steps[a] == 1:
            positions.append(extent)
            continue
        if extent <= spans[a]:
            raise ShapeError(f"windows of size {tuple(sizes)} (dilation {tuple(dilations)}) do not fit an axis of "
                             f"{extent}", user_location())
        positions.append((extent - spans[a] - 1) // steps[a] + 1)
    coeffs = tuple(tuple([steps[a] * (j == a) for j in range(n)] + [d * (e == a) for e, d in zip(axes, dilations)])
                   for a in range(n))
    return tuple(positions) + tuple(sizes), coeffs


# ---------------------------------------------------------------------------------------------
# NumPy's window views


def sliding_window_view(x, window_shape, axis=None, *, subok=False, writeable=False):
    """``np.lib.stride_tricks.sliding_window_view`` as a view (windows appended as last axes)."""
    x = A.as_array(x)
    sizes = (window_shape,) if isinstance(window_shape, (int, np.integer)) else tuple(window_shape)
    if writeable:
        raise UnsupportedError("sliding_window_view: writeable=True (a traced array cannot be written)",
                               user_location())
    if A.trace_of([x]) is None:
        return np.lib.stride_tricks.sliding_window_view(x, sizes, axis)
    axes = tuple(range(x.ndim)) if axis is None else \
        (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if len(axes) != len(sizes):
        raise ValueError(f"sliding_window_view: {len(sizes)} window sizes for {len(axes)} axes")
    if any(k < 0 for k in sizes):
        raise ValueError("sliding_window_view: window_shape cannot contain negative values")
    axes = tuple(A.normalize_axes("sliding_window_view", a, x.ndim)[0] for a in axes)
    return window(x, *windows(x.shape, axes, sizes))


def as_strided(x, shape=None, strides=None, subok=False, writeable=True):
    """``np.lib.stride_tricks.as_strided`` on a traced array, where it is a window view: strides
    that are non-negative multiples of the item size and read inside the array. They are read as
    multiples of the array's own strides where they can be (an index map over its axes), else over
    its elements in order (a view of the flattened array); others are refused."""
    x = A.as_array(x)
    if A.trace_of([x]) is None:
        return np.lib.stride_tricks.as_strided(x, shape, strides, subok, writeable)
    shape = tuple(x.shape if shape is None else shape)
    strides = x.strides if strides is None else tuple(strides)
    if len(strides) != len(shape):
        raise ShapeError(f"as_strided: {len(strides)} strides for a shape of {len(shape)} axes", user_location())
    for source in (x, A.reshape(x, (-1,))):
        columns = [_decompose(s, source.strides, source.shape) for s in strides]
        if None not in columns:
            try:
                return window(source, shape, tuple(tuple(column[a] for column in columns) for a in range(source.ndim)))
            except ShapeError:
                pass
    raise UnsupportedError(f"as_strided: shape {shape} with strides {strides} is not a window view of an array of "
                           f"shape {x.shape} (C strides {x.strides}): it reads outside it or between its elements; "
                           f"use np.lib.stride_tricks.sliding_window_view, slicing or broadcasting", user_location())


def _decompose(stride: int, own, shape) -> tuple | None:
    """``stride`` as non-negative multiples of the array's strides, largest first, each multiple
    below its axis's extent (the digits of the stride in the array's mixed radix)."""
    counts, rest = [], int(stride)
    if rest < 0:
        return None
    for k, (s, n) in enumerate(zip(own, shape)):
        c, rest = divmod(rest, s)
        if k and c >= n:
            return None
        counts.append(c)
    return tuple(counts) if rest == 0 else None


A.FUNCTIONS.update({np.lib.stride_tricks.sliding_window_view: sliding_window_view})
