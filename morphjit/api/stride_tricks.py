"""Window views and NumPy's stride tricks on traced arrays.

A window view is an affine index map: ``window(x, shape, coeffs)`` reads ``x`` at
``sum_j coeffs[a][j] * i[j]`` along each axis ``a`` of ``x`` (``np.lib.stride_tricks``'s
``sliding_window_view``, and ``as_strided`` where the strides are multiples of ``x``'s own, with
stride and dilation folded into the coefficients). It owns no buffer: a consumer reads ``x``
through the composed map (MoA's psi-composition). Its transpose ``unwindow`` adds every element of
the cotangent into zeros at the position the view read it from (a scatter loop: col2im).
Convolutions and pooling (``morphjit.api.conv``) are built on these views; the ops are in
``morphjit.ops.windows``. `FUNCTIONS` is this family's entry of the NumPy dispatch.
"""
from __future__ import annotations

import numpy as np

from ..util import ShapeError, UnsupportedError, user_location
from . import core as A

NUMPY_AS_STRIDED = np.lib.stride_tricks.as_strided   # (replaced while traces run: see ``dispatch.routes``)


def window_values(x, shape, coeffs):
    """The window view of the NumPy array ``x`` (the op's reference, and eager pooling's)."""
    x = np.ascontiguousarray(x)
    strides = [sum(c * s for c, s in zip(column, x.strides)) for column in zip(*coeffs)]
    return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False).copy()


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
    """``np.lib.stride_tricks.as_strided`` on a traced array, where it is a window view: strides (in
    bytes of the array's C layout) that are non-negative multiples of the item size and read inside
    the array; the view is read-only (its elements may overlap), writes through it are refused. They are read as
    multiples of the array's own strides where they can be (an index map over its axes), else over
    its elements in order (a view of the flattened array); others are refused."""
    x = A.as_array(x)
    if A.trace_of([x]) is None:
        return NUMPY_AS_STRIDED(x, shape, strides, subok, writeable)
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


# (NumPy's as_strided does not dispatch: it is reached through its substitute, ``dispatch.routes``.)
FUNCTIONS = {np.lib.stride_tricks.sliding_window_view: sliding_window_view, NUMPY_AS_STRIDED: as_strided}
