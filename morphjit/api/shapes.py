"""NumPy's shape functions on traced arrays, written from the existing views and joins.

Flips are slices with step -1 and moveaxis a transpose (views: index maps that fuse); tile and
scalar repeat are a broadcast and a reshape; roll, pad, split and the stacks are slices and
concatenations. `FUNCTIONS` is this family's entries of the NumPy dispatch.
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from ..ir import broadcast_shapes
from ..util import ShapeError, UnsupportedError, user_location
from . import core as A
from .indexing import getitem


def shape(a):
    return A.shape_of(A.as_value(a))


def ndim(a):
    return len(shape(a))


def size(a, axis=None):
    s = shape(a)
    return math.prod(s) if axis is None else s[axis]


def _atleast(ndmin: int):
    def one(a):
        a = A.as_array(a)
        if a.ndim >= ndmin:
            return a
        if ndmin == 3 and a.ndim == 2:
            return A.reshape(a, a.shape + (1,))
        if ndmin == 3 and a.ndim == 1:
            return A.reshape(a, (1,) + a.shape + (1,))
        return A.reshape(a, (1,) * (ndmin - a.ndim) + a.shape)

    def fn(*arys):
        out = [one(a) for a in arys]
        return out[0] if len(out) == 1 else out
    fn.__name__ = f"atleast_{ndmin}d"
    return fn


atleast_1d, atleast_2d, atleast_3d = _atleast(1), _atleast(2), _atleast(3)


def _sequence(tup):
    return [A.as_array(x) for x in tup]


def hstack(tup, *, dtype=None, casting="same_kind"):
    arrays = [atleast_1d(x) for x in _sequence(tup)]
    return A.concatenate(arrays, axis=0 if arrays[0].ndim == 1 else 1, dtype=dtype, casting=casting)


def vstack(tup, *, dtype=None, casting="same_kind"):
    return A.concatenate([atleast_2d(x) for x in _sequence(tup)], axis=0, dtype=dtype, casting=casting)


def dstack(tup):
    return A.concatenate([atleast_3d(x) for x in _sequence(tup)], axis=2)


def column_stack(tup):
    arrays = [A.reshape(x, (-1, 1)) if x.ndim < 2 else x for x in _sequence(tup)]
    return A.concatenate(arrays, axis=1)


def _along(a, axis: int, start, stop, step=1):
    """``a[..., start:stop:step, ...]`` on ``axis``; a negative stop means "past the start"."""
    stop = None if stop < 0 else stop
    key = tuple(slice(start, stop, step) if k == axis else slice(None) for k in range(a.ndim))
    return getitem(a, key)


def array_split(ary, indices_or_sections, axis=0):
    a = A.as_array(ary)
    axis = A.normalize_axes("array_split", axis, a.ndim)[0]
    n = a.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0:
            raise ValueError("array_split: number of sections must be larger than 0")
        each, extra = divmod(n, sections)
        bounds = np.cumsum([0] + [each + 1] * extra + [each] * (sections - extra)).tolist()
    else:
        bounds = [0] + [builtins.min(builtins.max(int(i) if i >= 0 else n + int(i), 0), n)
                        for i in indices_or_sections] + [n]
    return [_along(a, axis, lo, builtins.max(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def split(ary, indices_or_sections, axis=0):
    a = A.as_array(ary)
    if isinstance(indices_or_sections, (int, np.integer)):
        n = a.shape[A.normalize_axes("split", axis, a.ndim)[0]]
        if n % int(indices_or_sections):
            raise ShapeError(f"split: an axis of {n} does not divide into {indices_or_sections} equal sections "
                             f"(np.array_split allows unequal ones)", user_location())
    return array_split(a, indices_or_sections, axis)


def _split_along(name: str, min_ndim: int, axis_of):
    """NumPy's ``hsplit``, ``vsplit`` or ``dsplit``: ``split`` along ``axis_of(ndim)``, for arrays of at
    least ``min_ndim`` dimensions."""
    def fn(ary, indices_or_sections):
        a = A.as_array(ary)
        if a.ndim < min_ndim:
            raise ValueError(f"{name} only works on arrays of {min_ndim} or more dimensions")
        return split(a, indices_or_sections, axis_of(a.ndim))
    fn.__name__ = name
    return fn


hsplit = _split_along("hsplit", 1, lambda ndim: 1 if ndim > 1 else 0)
vsplit = _split_along("vsplit", 2, lambda ndim: 0)
dsplit = _split_along("dsplit", 3, lambda ndim: 2)


def moveaxis(a, source, destination):
    a = A.as_array(a)
    src = [A.normalize_axes("moveaxis", s, a.ndim)[0] for s in np.atleast_1d(source).tolist()]
    dst = [A.normalize_axes("moveaxis", d, a.ndim)[0] for d in np.atleast_1d(destination).tolist()]
    order = [k for k in range(a.ndim) if k not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return A.transpose(a, tuple(order))


def flip(m, axis=None):
    m = A.as_array(m)
    axes = A.normalize_axes("flip", axis, m.ndim)
    return getitem(m, tuple(slice(None, None, -1) if k in axes else slice(None) for k in range(m.ndim)))


def fliplr(m):
    return flip(m, 1)


def flipud(m):
    return flip(m, 0)


def roll(a, shift, axis=None):
    a = A.as_array(a)
    if axis is None:
        return A.reshape(roll(A.ravel(a), shift, 0), a.shape)
    shifts, axes = np.broadcast_arrays(np.atleast_1d(shift), np.atleast_1d(axis))
    for s, ax in zip(shifts.tolist(), axes.tolist()):
        ax = A.normalize_axes("roll", ax, a.ndim)[0]
        n = a.shape[ax]
        s = s % n if n else 0
        if s:
            a = A.concatenate([_along(a, ax, n - s, n), _along(a, ax, 0, n - s)], axis=ax)
    return a


def tile(A, reps):   # noqa: N803 (NumPy's name, which callers may pass by keyword)
    return _tile(A, reps)


def _tile(a, reps):
    a = A.as_array(a)
    reps = (int(reps),) if isinstance(reps, (int, np.integer)) else tuple(int(r) for r in reps)
    ndim = builtins.max(a.ndim, len(reps))
    a = A.reshape(a, (1,) * (ndim - a.ndim) + a.shape)
    reps = (1,) * (ndim - len(reps)) + reps
    # A broadcast view (reps, n) per axis, then merged: the copies are read through the view.
    spread = A.broadcast_to(A.reshape(a, tuple(d for n in a.shape for d in (1, n))),
                            tuple(d for r, n in zip(reps, a.shape) for d in (r, n)))
    return A.reshape(spread, tuple(r * n for r, n in zip(reps, a.shape)))


def repeat(a, repeats, axis=None):
    a = A.as_array(a)
    if axis is None:
        a, axis = A.ravel(a), 0
    axis = A.normalize_axes("repeat", axis, a.ndim)[0]
    n = a.shape[axis]
    counts = np.broadcast_to(np.asarray(repeats), (n,)) if np.ndim(repeats) else None
    if counts is None:
        r = int(repeats)
        inserted = A.expand_dims(a, axis + 1)
        spread = A.broadcast_to(inserted, inserted.shape[:axis + 1] + (r,) + inserted.shape[axis + 2:])
        return A.reshape(spread, a.shape[:axis] + (n * r,) + a.shape[axis + 1:])
    pieces = []
    for i, r in enumerate(counts.tolist()):
        if r < 0:
            raise ValueError("repeat: negative repeats are not allowed")
        if r:
            piece = _along(a, axis, i, i + 1)
            pieces.append(A.broadcast_to(piece, piece.shape[:axis] + (int(r),) + piece.shape[axis + 1:]))
    if not pieces:
        raise UnsupportedError("repeat: all repeats are zero (an empty result)", user_location())
    return A.concatenate(pieces, axis=axis)


def _pairs(values, ndim, dtype=None) -> list:
    """A (before, after) pair per axis, from one value, one pair or a pair per axis (np.pad's)."""
    array = np.asarray(values, dtype)
    return np.broadcast_to(array.reshape(-1, 2) if array.ndim == 2 else array, (ndim, 2)).tolist()


PAD_KEYWORDS = {"constant": {"constant_values"}, "edge": set(), "reflect": {"reflect_type"}}


def pad(array, pad_width, mode="constant", **kwargs):
    """np.pad with mode 'constant' (``constant_values``), 'edge' or 'reflect' (the even reflection)."""
    a = A.as_array(array)
    if mode not in PAD_KEYWORDS:
        raise UnsupportedError(f"pad: mode {mode!r} is not supported (constant, edge and reflect are)",
                               user_location())
    unknown = set(kwargs) - PAD_KEYWORDS[mode]
    if unknown:
        raise ValueError(f"pad: unsupported keyword arguments for mode {mode!r}: {sorted(unknown)}")
    if kwargs.get("reflect_type", "even") != "even":
        raise UnsupportedError(f"pad: reflect_type={kwargs['reflect_type']!r} is not supported (the even "
                               f"reflection, NumPy's default, is)", user_location())
    fills = _pairs(kwargs.get("constant_values", 0), a.ndim)
    for axis, ((lo, hi), (fill_lo, fill_hi)) in enumerate(zip(_pairs(pad_width, a.ndim, np.int64), fills)):
        n = a.shape[axis]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise UnsupportedError("pad: reflect widths of the axis length or more are not supported",
                                   user_location())
        parts = [_pad_part(a, axis, lo, mode, fill_lo, before=True), a,
                 _pad_part(a, axis, hi, mode, fill_hi, before=False)]
        parts = [p for p in parts if p is not None]
        a = A.concatenate(parts, axis=axis) if len(parts) > 1 else a
    return a


def _pad_part(a, axis, width, mode, value, before: bool):
    if not width:
        return None
    n = a.shape[axis]
    shape = a.shape[:axis] + (width,) + a.shape[axis + 1:]
    if mode == "constant":
        return A.full(shape, value, A.dtype_of(a), like=A.trace_of([a]))
    if mode == "edge":
        edge = _along(a, axis, 0, 1) if before else _along(a, axis, n - 1, n)
        return A.broadcast_to(edge, shape)
    return _along(a, axis, width, 0, -1) if before else _along(a, axis, n - 2, n - 2 - width, -1)


def diff(a, n=1, axis=-1, prepend=A.NOT_GIVEN, append=A.NOT_GIVEN):
    """NumPy's ``diff``, of ``a`` with ``prepend`` and ``append`` joined along ``axis`` first (a
    scalar one as a slice of the other axes' extents)."""
    a = A.as_array(a)
    axis = A.normalize_axes("diff", axis, a.ndim)[0]
    ends = [(e, k) for e, k in ((prepend, 0), (append, 2)) if e is not A.NOT_GIVEN]
    if ends:
        joined = [a, a, a]
        for end, k in ends:
            end = A.as_array(end)
            joined[k] = A.broadcast_to(end, a.shape[:axis] + (1,) + a.shape[axis + 1:]) if end.ndim == 0 else end
        a = A.concatenate([joined[0]] * (prepend is not A.NOT_GIVEN) + [a] + [joined[2]] * (append is not A.NOT_GIVEN),
                          axis=axis)
    for _ in range(n):
        m = a.shape[axis]
        a = A.subtract(_along(a, axis, 1, m), _along(a, axis, 0, m - 1))
    return a


def broadcast_arrays(*args, subok=False):
    arrays = [A.as_array(x) for x in args]
    target = broadcast_shapes("broadcast_arrays", *(x.shape for x in arrays))
    return [A.broadcast_to(x, target) for x in arrays]


def meshgrid(*xi, indexing="xy", sparse=False, copy=True):
    xs = [A.ravel(x) for x in xi]
    n = len(xs)
    # 'xy' indexing swaps the first two output axes (x varies along columns).
    along = [1, 0] + list(range(2, n)) if indexing == "xy" and n > 1 else list(range(n))
    shapes = [tuple(-1 if k == along[i] else 1 for k in range(n)) for i in range(n)]
    grids = [A.reshape(x, s) for x, s in zip(xs, shapes)]
    return grids if sparse else broadcast_arrays(*grids)


FUNCTIONS = {
    np.shape: shape, np.ndim: ndim, np.size: size, np.atleast_1d: atleast_1d, np.atleast_2d: atleast_2d,
    np.atleast_3d: atleast_3d, np.hstack: hstack, np.vstack: vstack, np.dstack: dstack,
    np.column_stack: column_stack, np.split: split, np.array_split: array_split,
    np.hsplit: hsplit, np.vsplit: vsplit, np.dsplit: dsplit, np.moveaxis: moveaxis,
    np.flip: flip, np.fliplr: fliplr, np.flipud: flipud, np.roll: roll, np.tile: tile, np.repeat: repeat,
    np.pad: pad, np.diff: diff, np.broadcast_arrays: broadcast_arrays, np.meshgrid: meshgrid,
}
