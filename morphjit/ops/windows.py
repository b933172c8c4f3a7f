"""Window views and their transposes: ``window`` (a view reading ``x`` through an affine map,
owning no buffer: a consumer reads ``x`` through the composed map, MoA's psi-composition),
``unwindow`` (its transpose: every element of the cotangent added into zeros at the position the
view read it from, a scatter loop: col2im) and ``window_max`` (max pooling: the maximum over the
window axes, its gradient to the first maximal element of each window in row-major order, as in
PyTorch)."""
from __future__ import annotations

import math

import numpy as np

from .. import api as A
from ..api import unwindow, window, window_values
from ..ir import (COMPOSITE, STRUCTURAL, VIEW, Const, Gather, IndexMap, Load, Nest, Scatter, Store, Sym,
                  TensorType, defop, loads, loop, reduced_shape)
from ..util import ShapeError


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
    return [loop(b.out, Const(0, b.out.dtype)), Scatter(domain, at, expr(g, loops))]


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

# Max pooling's op: the maximum over the window axes


def _window_max_rule(types, shape, coeffs, axes):
    window_rule(types, shape, coeffs)
    return TensorType(reduced_shape(shape, axes), types[0].dtype)


def _window_max_vjp(g, ans, x, shape, coeffs, axes):
    """The first maximal element of each window (row-major; a NaN counts as maximal) takes the
    cotangent, as PyTorch's max pooling does."""
    xw = window(x, shape, coeffs)
    keep = tuple(1 if k in axes else d for k, d in enumerate(shape))
    top = A.reshape(ans, keep)
    position = np.arange(math.prod(shape[k] for k in axes), dtype=x.dtype).reshape(
        tuple(shape[k] if k in axes else 1 for k in range(len(shape))))
    hit = A.logical_or(A.equal(xw, top), A.not_equal(xw, xw))
    first = A.extremum("min", A.where(hit, position, np.inf), axes, keepdims=True)
    routed = A.where(A.equal(position, first), A.reshape(g, keep), 0.0)
    return (unwindow(routed, x.shape, coeffs),)


defop("window_max", COMPOSITE, _window_max_rule,
      lambda x, shape, coeffs, axes: np.max(window_values(x, shape, coeffs), axis=axes), _window_max_vjp,
      lower=lambda x, shape, coeffs, axes: A.extremum("max", window(x, shape, coeffs), axes, keepdims=False))

