"""NumPy's wider reductions and scans: prod (an op of its own, in ``morphjit.ops.reductions``), and
argmax/argmin, all/any, average, ptp, nansum/nanmean, linalg.norm, cumsum/cumprod written from
existing ops.

Scans run in log2(n) doubling steps of shifted element-wise products or sums (exact for integers,
differentiable through the ops they are made of, zeros included). `FUNCTIONS` is this family's
entries of the NumPy dispatch.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Sym, keepdims_shape
from ..util import ShapeError, UnsupportedError, user_location
from . import core as A, linalg, ufuncs as X
from .indexing import getitem
from .shapes import moveaxis


def prod_op(x, axes):
    return A.bind("prod", [x], axes=axes)


def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=A.NOT_GIVEN, where=True):
    A.no_out("prod", out)
    a = A.as_array(a)
    if dtype is not None:
        a = A.astype(a, dtype)
    elif a.dtype.kind in "bi":
        a = A.astype(a, np.int64)
    axes = A.normalize_axes("prod", axis, a.ndim)
    a = A.masked("prod", a, where, 1)
    result = prod_op(a, axes) if axes else a
    result = A.reshape(result, keepdims_shape(a.shape, axes)) if keepdims else result
    return A.with_initial(A.multiply, result, initial)


def _positions(op: str, a, axis: int):
    """0, 1, ..., n-1 along ``axis``, as a captured constant that broadcasts against ``a``."""
    n = a.shape[axis]
    if isinstance(n, Sym):
        raise UnsupportedError(f"{op} along the batch axis is not supported (its length is only known "
                               f"when the step runs)", user_location())
    return np.arange(n, dtype=np.float64).reshape((n,) + (1,) * (a.ndim - axis - 1))


def _arg_extremum(op: str, reduce: str, a, axis, keepdims):
    a = A.as_array(a)
    if axis is None:
        first = _arg_extremum(op, reduce, A.ravel(a), 0, False)
        return A.reshape(first, (1,) * a.ndim) if keepdims else first
    axis = A.normalize_axes(op, axis, a.ndim)[0]
    # Compiled max/min reductions start from -inf/inf: integers are compared as float64 (exact
    # below 2**53), and positions are counted in float64 too.
    a = X.float_array(a)
    best = A.extremum(reduce, a, axis, keepdims=True, empty=op)
    # The first position holding the extremum; NaN is the extremum wherever there is one (NumPy).
    hit = A.logical_or(A.equal(a, best), A.not_equal(a, a))
    first = A.extremum("min", A.where(hit, _positions(op, a, axis), float(a.shape[axis])), axis, keepdims)
    return A.astype(first, np.int64)


def argmax(a, axis=None, out=None, keepdims=False):
    A.no_out("argmax", out)
    return _arg_extremum("argmax", "max", a, axis, keepdims)


def argmin(a, axis=None, out=None, keepdims=False):
    A.no_out("argmin", out)
    return _arg_extremum("argmin", "min", a, axis, keepdims)


def any(a, axis=None, out=None, keepdims=False, *, where=True):
    """Whether any element is true (where ``where`` holds): a count of the true ones, above zero."""
    A.no_out("any", out)
    return A.greater(A.sum(A.truth(a), axis=axis, keepdims=keepdims, where=where), 0)


def all(a, axis=None, out=None, keepdims=False, *, where=True):
    """Whether every element is true (where ``where`` holds): a count of the false ones, zero."""
    A.no_out("all", out)
    return A.equal(A.sum(A.logical_not(A.truth(a)), axis=axis, keepdims=keepdims, where=where), 0)


def ptp(a, axis=None, out=None, keepdims=False):
    A.no_out("ptp", out)
    return A.subtract(A.extremum("max", a, axis, keepdims, empty="ptp"), A.extremum("min", a, axis, keepdims))


def count_nonzero(a, axis=None, *, keepdims=False):
    """The number of non-zero elements (NaN counts) along ``axis``, as int64; no gradient."""
    return A.sum(A.truth(a), axis, np.int64, keepdims=keepdims)


def average(a, axis=None, weights=None, returned=False, keepdims=False):
    a = A.as_array(a)
    if weights is None:
        avg = A.mean(a, axis=axis, keepdims=keepdims)
        count = math.prod(a.shape[k] for k in A.normalize_axes("average", axis, a.ndim))
        return (avg, A.full_like(avg, count)) if returned else avg
    w = A.as_array(weights)
    if w.shape != a.shape:
        if axis is None or w.ndim != 1:
            raise ShapeError(f"average: weights of shape {w.shape} differ from a's {a.shape}; 1-D weights "
                             f"need an axis", user_location())
        axis_ = A.normalize_axes("average", axis, a.ndim)[0]
        w = A.reshape(w, (w.shape[0],) + (1,) * (a.ndim - axis_ - 1))
    total = A.sum(A.multiply(a, w), axis=axis, keepdims=keepdims)
    scale = A.sum(A.multiply(A.ones_like(a, dtype=total.dtype), w), axis=axis, keepdims=keepdims)
    avg = A.divide(total, scale)
    return (avg, scale) if returned else avg


def nansum(a, axis=None, dtype=None, out=None, keepdims=False, initial=A.NOT_GIVEN, where=True):
    a = A.as_array(a)
    return A.sum(A.where(X.isnan(a), 0, a), axis=axis, dtype=dtype, out=out, keepdims=keepdims, initial=initial,
                 where=where)


def nanmean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
    a = A.as_array(a)
    present = A.logical_not(X.isnan(a))
    total = nansum(a, axis=axis, dtype=dtype, out=out, keepdims=keepdims, where=where)
    count = A.sum(present, axis=axis, keepdims=keepdims, where=where)
    return A.divide(total, A.astype(count, A.dtype_of(total)))


# ---------------------------------------------------------------------------------------------
# Scans


def _scan(op: str, combine, identity, a, axis, dtype):
    a = A.as_array(a)
    if dtype is not None:
        a = A.astype(a, dtype)
    elif a.dtype.kind in "bi":
        a = A.astype(a, np.int64)
    if axis is None:
        a, axis = A.ravel(a), 0
    axis = A.normalize_axes(op, axis, a.ndim)[0]
    n = a.shape[axis]
    if isinstance(n, Sym):
        raise UnsupportedError(f"{op} along the batch axis is not supported", user_location())
    shift = 1
    while shift < n:  # after this step each element combines the 2 * shift elements ending at it
        a = combine(a, _shifted(a, axis, shift, identity))
        shift *= 2
    return a


def _shifted(a, axis, shift, fill):
    """``a`` moved ``shift`` places along ``axis``, ``fill`` coming in at the start."""
    head_shape = tuple(shift if k == axis else d for k, d in enumerate(a.shape))
    keep = tuple(slice(None) if k != axis else slice(0, a.shape[axis] - shift) for k in range(a.ndim))
    return A.concatenate([A.full(head_shape, fill, a.dtype, like=A.trace_of([a])), getitem(a, keep)], axis=axis)


def cumsum(a, axis=None, dtype=None, out=None):
    A.no_out("cumsum", out)
    return _scan("cumsum", A.add, 0, a, axis, dtype)


def cumprod(a, axis=None, dtype=None, out=None):
    A.no_out("cumprod", out)
    return _scan("cumprod", A.multiply, 1, a, axis, dtype)


# ---------------------------------------------------------------------------------------------
# Norms


def norm(x, ord=None, axis=None, keepdims=False):
    """``np.linalg.norm``: vector norms (any ord) and matrix norms (any ord: 'nuc', 2 and -2 from the
    singular values)."""
    x = X.float_array(x)
    if axis is None and (ord is None or x.ndim == 1 or ord == "fro"):
        axes = tuple(range(x.ndim))
        if ord is None or ord == "fro" or ord == 2:
            return A.sqrt(A.sum(A.square(x), axis=axes, keepdims=keepdims))
        axis = 0
    axes = A.normalize_axes("norm", axis if axis is not None else tuple(range(x.ndim)), x.ndim)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, axis if isinstance(axis, tuple) else axes, keepdims)
    raise ShapeError(f"norm: axis {axis} names more than 2 axes", user_location())


def _vector_norm(x, ord, axes, keepdims):
    mag = A.abs(x)
    if ord is None or ord == 2:
        return A.sqrt(A.sum(A.square(x), axis=axes, keepdims=keepdims))
    if ord == np.inf:   # NumPy's starts from 0: the norm of no element is 0
        return A.max(mag, axis=axes, keepdims=keepdims, initial=0.0)
    if ord == -np.inf:
        return A.min(mag, axis=axes, keepdims=keepdims)
    if ord == 0:
        return A.sum(A.astype(A.not_equal(x, 0), x.dtype), axis=axes, keepdims=keepdims)
    if ord == 1:
        return A.sum(mag, axis=axes, keepdims=keepdims)
    return A.power(A.sum(A.power(mag, float(ord)), axis=axes, keepdims=keepdims), 1.0 / ord)


def _matrix_norm(x, ord, axis, keepdims):
    rows, cols = (a % x.ndim for a in axis)
    if ord is None or ord == "fro":
        return A.sqrt(A.sum(A.square(x), axis=(rows, cols), keepdims=keepdims))
    if ord in (1, -1, np.inf, -np.inf):
        summed, over = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = A.sum(A.abs(x), axis=summed, keepdims=True)
        pick = A.max if ord in (1, np.inf) else A.min
        out = pick(sums, axis=over, keepdims=True)
        return out if keepdims else A.squeeze(out, (rows, cols))
    if ord in ("nuc", 2, -2):
        s = linalg.svdvals(moveaxis(x, (rows, cols), (-2, -1)))
        out = {"nuc": A.sum, 2: A.max, -2: A.min}[ord](s, axis=-1)
        return A.expand_dims(out, tuple(sorted((rows, cols)))) if keepdims else out
    raise ValueError(f"norm: invalid norm order {ord!r} for matrices")


FUNCTIONS = {
    np.prod: prod, np.argmax: argmax, np.argmin: argmin, np.any: any, np.all: all, np.ptp: ptp,
    np.average: average, np.nansum: nansum, np.nanmean: nanmean, np.cumsum: cumsum,
    np.cumprod: cumprod, np.linalg.norm: norm, np.count_nonzero: count_nonzero,
}
