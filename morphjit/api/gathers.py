"""NumPy's ``take``, ``take_along_axis`` and ``choose`` on traced arrays: one gather along an axis
(``indexing``'s index arrays), with NumPy's ``mode``. `FUNCTIONS` is this family's entries of
the NumPy dispatch.
"""
from __future__ import annotations

import numpy as np

from ..ir import Sym, broadcast_shapes
from ..util import ShapeError, UnsupportedError, user_location
from . import core as A
from .indexing import index_array, iota

MODES = ("raise", "wrap", "clip")


def moded(indices, extent, mode: str):
    """Index array ``indices`` into an axis of ``extent`` read in NumPy's ``mode``: 'raise' checks
    them (negative ones count from the end), 'wrap' takes them modulo the extent, 'clip' clips
    them into ``[0, extent)``."""
    if mode not in MODES:
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    if mode != "raise":
        if isinstance(extent, Sym):
            raise UnsupportedError(f"mode={mode!r} along the batch axis is not supported", user_location())
        k = A.as_array(indices)
        indices = np.remainder(k, extent) if mode == "wrap" else A.clip(k, 0, extent - 1)
    return index_array(indices, extent)


def take(a, indices, axis=None, out=None, mode="raise"):
    """``np.take``: the elements at ``indices`` along ``axis`` (of the flattened array if None)."""
    A.no_out("take", out)
    a = A.as_array(a)
    if axis is None:
        a, axis = A.ravel(a), 0
    axis = A.normalize_axes("take", axis, a.ndim)[0]
    return A.gather(a, (moded(indices, a.shape[axis], mode),), axis)


def take_along_axis(arr, indices, axis=-1):
    """``np.take_along_axis``: ``indices`` (with ``arr``'s number of dimensions) picks along
    ``axis``, broadcasting against ``arr`` on the other axes; along the flattened ``arr`` where
    ``axis`` is None."""
    arr, indices = A.as_array(arr), A.as_array(indices)
    if axis is None:
        if indices.ndim != 1:
            raise ShapeError(f"take_along_axis: axis=None needs 1-d indices, got {indices.ndim} dimensions",
                             user_location())
        arr, axis = A.ravel(arr), 0
    if indices.ndim != arr.ndim:
        raise ShapeError(f"take_along_axis: indices of {indices.ndim} dimensions for an array of {arr.ndim}",
                         user_location())
    axis = A.normalize_axes("take_along_axis", axis, arr.ndim)[0]
    t = A.trace_of([arr, indices])
    index = [index_array(indices, arr.shape[k]) if k == axis else
             iota(tuple(arr.shape[k] if j == k else 1 for j in range(arr.ndim)), k, np.int64, t)
             for k in range(arr.ndim)]
    return A.gather(arr, tuple(index), 0)


def choose(a, choices, out=None, mode="raise"):
    """``np.choose``: ``choices[a[i]][i]`` at every position, everything broadcast together
    (negative entries of ``a`` count from the last choice, where NumPy raises)."""
    A.no_out("choose", out)
    a, choices = A.as_array(a), [A.as_array(c) for c in choices]
    shape = broadcast_shapes("choose", a.shape, *(c.shape for c in choices))
    stacked = A.stack([A.broadcast_to(c, shape) for c in A.promote(choices)[1]], axis=0)
    chosen = moded(A.expand_dims(A.broadcast_to(a, shape), 0), len(choices), mode)
    return A.squeeze(take_along_axis(stacked, chosen, 0), 0)


FUNCTIONS = {np.take: take, np.take_along_axis: take_along_axis, np.choose: choose}
