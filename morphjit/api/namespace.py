"""The array-API namespace of traced arrays: what ``x.__array_namespace__()`` returns.

Libraries written against the Python array API standard (SciPy with ``SCIPY_ARRAY_API=1``,
``array_api_extra``) ask an array for its namespace and call
``xp.exp``, ``xp.sum(x, axis=..., keepdims=True)``, ``xp.where`` ... on it. This module is that
namespace for tracers: the standard's names and signatures over morphjit's array functions,
reached through NumPy's dispatch (``np.exp(x)`` on a tracer records the op; on NumPy arrays it
computes), so the library's own algorithm is traced, differentiated and compiled.
``xp.special`` holds morphjit's ``scipy.special`` functions, where SciPy looks for a namespace's
own special functions. A name of the standard that morphjit has no rule for (complex dtypes,
sorting, data-dependent shapes, the ``linalg`` and ``fft`` extensions) raises ``UnsupportedError``
naming it. (``x.__array_namespace__()`` is installed with the tracer's methods, ``methods``.)

Arrays made here (``asarray`` of a NumPy array, ``zeros``, ``arange``) are traced constants while
a function is traced, so that they belong to this namespace as the standard expects.
"""
from __future__ import annotations

import builtins
import math
import sys

import numpy as np

from ..tracing import SUPPORTED_DTYPES, Tracer, tracer as trace
from ..util import UnsupportedError, user_location
from . import core as A, dispatch, shapes as numpy_shape, ufuncs

__array_api_version__ = "2023.12"
API_VERSIONS = (None, "2021.12", "2022.12", "2023.12")

e, inf, nan, pi, newaxis = math.e, math.inf, math.nan, math.pi, None
bool, int32, int64 = np.dtype(np.bool_), np.dtype(np.int32), np.dtype(np.int64)
float32, float64 = np.dtype(np.float32), np.dtype(np.float64)
DEVICE = "cpu"


class UnsupportedName(UnsupportedError, AttributeError):
    """A name of the array API that the namespace does not have (``hasattr`` sees it missing)."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise UnsupportedName(f"xp.{name} (the array API namespace of traced arrays) is not supported by morphjit; "
                          f"call the function on NumPy arrays outside the traced function, or write it with "
                          f"the namespace's other functions", user_location())


def _check_device(device) -> None:
    if device not in (None, DEVICE):
        raise ValueError(f"device {device!r}: traced arrays live on {DEVICE!r}")


def _lifted(array: np.ndarray):
    """A NumPy array as a traced constant of the current trace (unchanged outside tracing)."""
    t = trace.current_trace()
    return array if t is None else Tracer(t, t.operand(A.as_array(array), lift_literals=False))


def _copy(x):
    """A new array object with ``x``'s value: a tracer's updates (``x[key] = v`` from
    ``array_api_extra.at``) rebind the object, so a copy is another object."""
    return Tracer(x.trace, x.operand, x.weak) if isinstance(x, Tracer) else np.array(x, copy=True)


# ---------------------------------------------------------------------------------------------
# Creation


def asarray(obj, /, *, dtype=None, device=None, copy=None):
    _check_device(device)
    x = A.as_value(obj)
    if not isinstance(x, Tracer):
        return _lifted(np.array(x, dtype=dtype, copy=copy))
    if dtype is not None and np.dtype(dtype) != x.dtype:
        if copy is False:
            raise ValueError(f"asarray: copy=False, but converting {x.dtype} to {np.dtype(dtype)} makes a copy")
        return A.astype(x, dtype)
    return _copy(x) if copy else x


def full(shape, fill_value, *, dtype=None, device=None):
    _check_device(device)
    return A.full(shape, fill_value, dtype, like=trace.current_trace())


def zeros(shape, *, dtype=None, device=None):
    return full(shape, 0.0, dtype=dtype or float64, device=device)


def ones(shape, *, dtype=None, device=None):
    return full(shape, 1.0, dtype=dtype or float64, device=device)


def full_like(x, /, fill_value, *, dtype=None, device=None):
    _check_device(device)
    return A.full_like(x, fill_value, dtype)


def zeros_like(x, /, *, dtype=None, device=None):
    return full_like(x, 0, dtype=dtype, device=device)


def ones_like(x, /, *, dtype=None, device=None):
    return full_like(x, 1, dtype=dtype, device=device)


empty, empty_like = zeros, zeros_like   # the standard leaves the values unspecified


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    _check_device(device)
    bounds = (start, stop) if stop is not None else (0, start)
    return _lifted(np.arange(*bounds, step, dtype=dtype))


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    _check_device(device)
    return _lifted(np.eye(n_rows, n_cols, k, dtype=dtype or float64))


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    _check_device(device)
    return _lifted(np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype))


def meshgrid(*arrays, indexing="xy"):
    return np.meshgrid(*arrays, indexing=indexing)


def tril(x, /, *, k=0):
    return np.tril(x, k)


def triu(x, /, *, k=0):
    return np.triu(x, k)


# ---------------------------------------------------------------------------------------------
# Element-wise functions: the standard's names for NumPy's ufuncs


def _ufunc(ufunc, name: str):
    def fn(*args):
        return ufunc(*args)
    fn.__name__ = name
    fn.__doc__ = f"The array API's ``{name}``: ``np.{ufunc.__name__}``."
    return fn


_UFUNC_NAMES = {"acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
                "atan": np.arctan, "atan2": np.arctan2, "atanh": np.arctanh, "bitwise_invert": np.invert,
                "pow": np.power}
_SAME_NAMES = ("abs add bitwise_and bitwise_or ceil copysign cos cosh divide equal exp expm1 floor "
               "floor_divide greater greater_equal hypot isfinite isinf isnan less less_equal log log1p log2 "
               "log10 logaddexp logical_and logical_not logical_or maximum minimum multiply negative "
               "not_equal positive reciprocal remainder sign sin sinh square sqrt subtract tan tanh trunc").split()
_UFUNC_NAMES.update((name, getattr(np, name)) for name in _SAME_NAMES)
globals().update((name, _ufunc(ufunc, name)) for name, ufunc in _UFUNC_NAMES.items())


def round(x, /):
    return np.round(x)


def clip(x, /, min=None, max=None):
    return x if min is None and max is None else np.clip(x, min, max)


real, conj, imag = ufuncs.real, ufuncs.conjugate, ufuncs.imag     # morphjit's arrays are real


# ---------------------------------------------------------------------------------------------
# Reductions and scans


def sum(x, /, *, axis=None, dtype=None, keepdims=False):
    return np.sum(x, axis=axis, dtype=dtype, keepdims=keepdims)


def prod(x, /, *, axis=None, dtype=None, keepdims=False):
    return np.prod(x, axis=axis, dtype=dtype, keepdims=keepdims)


def mean(x, /, *, axis=None, keepdims=False):
    return np.mean(x, axis=axis, keepdims=keepdims)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    return np.var(x, axis=axis, ddof=correction, keepdims=keepdims)


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    return np.std(x, axis=axis, ddof=correction, keepdims=keepdims)


def max(x, /, *, axis=None, keepdims=False):
    return np.max(x, axis=axis, keepdims=keepdims)


def min(x, /, *, axis=None, keepdims=False):
    return np.min(x, axis=axis, keepdims=keepdims)


def argmax(x, /, *, axis=None, keepdims=False):
    return np.argmax(x, axis=axis, keepdims=keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    return np.argmin(x, axis=axis, keepdims=keepdims)


def all(x, /, *, axis=None, keepdims=False):
    return np.all(x, axis=axis, keepdims=keepdims)


def any(x, /, *, axis=None, keepdims=False):
    return np.any(x, axis=axis, keepdims=keepdims)


def _cumulative(scan, identity):
    def fn(x, /, *, axis=None, dtype=None, include_initial=False):
        x = A.as_array(x)
        if axis is None:
            if x.ndim != 1:
                raise ValueError(f"{fn.__name__}: give axis for an array of {x.ndim} dimensions")
            axis = 0
        out = scan(x, axis=axis, dtype=dtype)
        if not include_initial:
            return out
        start = list(out.shape)
        start[axis % out.ndim] = 1
        return np.concatenate([A.full(tuple(start), identity, out.dtype, like=A.trace_of([out])), out], axis=axis)
    return fn


cumulative_sum, cumulative_prod = _cumulative(np.cumsum, 0), _cumulative(np.cumprod, 1)
cumulative_sum.__name__, cumulative_prod.__name__ = "cumulative_sum", "cumulative_prod"


# ---------------------------------------------------------------------------------------------
# Shapes, joins and products


def reshape(x, /, shape, *, copy=None):
    out = np.reshape(x, shape)
    return _copy(out) if copy else out


def permute_dims(x, /, axes):
    return np.transpose(x, axes)


def matrix_transpose(x, /):
    return np.swapaxes(x, -1, -2)


def expand_dims(x, /, *, axis=0):
    return np.expand_dims(x, axis)


def squeeze(x, /, axis):
    return np.squeeze(x, axis)


def broadcast_to(x, /, shape):
    return np.broadcast_to(x, shape)


def broadcast_arrays(*arrays):
    return numpy_shape.broadcast_arrays(*arrays)


def concat(arrays, /, *, axis=0):
    return np.concatenate(list(arrays), axis=axis)


def stack(arrays, /, *, axis=0):
    return np.stack(list(arrays), axis=axis)


def unstack(x, /, *, axis=0):
    return tuple(np.moveaxis(x, axis, 0))


def flip(x, /, *, axis=None):
    return np.flip(x, axis)


def roll(x, /, shift, *, axis=None):
    return np.roll(x, shift, axis)


def moveaxis(x, source, destination, /):
    return np.moveaxis(x, source, destination)


def tile(x, repetitions, /):
    return np.tile(x, repetitions)


def repeat(x, repeats, /, *, axis=None):
    return np.repeat(x, repeats, axis)


def where(condition, x1, x2, /):
    return np.where(condition, x1, x2)


def matmul(x1, x2, /):
    return np.matmul(x1, x2)


def tensordot(x1, x2, /, *, axes=2):
    return np.tensordot(x1, x2, axes)


def vecdot(x1, x2, /, *, axis=-1):
    return np.sum(np.multiply(x1, x2), axis=axis)


def take(x, indices, /, *, axis=None):
    return np.take(x, indices, axis)


def take_along_axis(x, indices, /, *, axis=-1):
    return np.take_along_axis(x, indices, axis)


# ---------------------------------------------------------------------------------------------
# Data types


def astype(x, dtype, /, *, copy=True, device=None):
    _check_device(device)
    out = A.astype(x, dtype)
    return _copy(out) if copy and out is x else out


def _dtype_or_prototype(x):
    if isinstance(x, (Tracer, np.ndarray, np.generic)):
        return A.prototype(A.as_value(x))
    return x    # a dtype or a Python scalar (weak, as NumPy 2 promotes it)


def result_type(*arrays_and_dtypes):
    return np.result_type(*(_dtype_or_prototype(x) for x in arrays_and_dtypes))


def can_cast(from_, to, /):
    return np.can_cast(A.dtype_of(from_) if isinstance(from_, (Tracer, np.ndarray)) else from_, to)


def finfo(type, /):
    return np.finfo(type.dtype if isinstance(type, (Tracer, np.ndarray)) else type)


def iinfo(type, /):
    return np.iinfo(type.dtype if isinstance(type, (Tracer, np.ndarray)) else type)


_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
          "real floating": "f", "complex floating": "c", "numeric": "iufc"}


def isdtype(dtype, kind):
    """Whether ``dtype`` is ``kind``: a dtype, one of the standard's kind names, or a tuple of them."""
    if isinstance(kind, tuple):
        return builtins.any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r} (one of {', '.join(_KINDS)})")
        return np.dtype(dtype).kind in _KINDS[kind]
    return np.dtype(dtype) == np.dtype(kind)


class Info:
    """``xp.__array_namespace_info__()``: one CPU device; float64 and int64 are the defaults."""

    def capabilities(self):
        return {"boolean indexing": False, "data-dependent shapes": False, "max dimensions": None}

    def default_device(self):
        return DEVICE

    def devices(self):
        return [DEVICE]

    def default_dtypes(self, *, device=None):
        _check_device(device)
        return {"real floating": float64, "integral": int64, "indexing": int64}

    def dtypes(self, *, device=None, kind=None):
        _check_device(device)
        return {d.name: d for d in map(np.dtype, SUPPORTED_DTYPES)
                if kind is None or isdtype(d, kind)}


def __array_namespace_info__():
    return Info()


class SpecialFunctions:
    """``xp.special``, where SciPy's ``scipy.special`` looks for a namespace's own functions before
    it converts the arguments to NumPy arrays: the function morphjit's NumPy dispatch has for
    ``scipy.special.<name>``, or one that raises ``UnsupportedError`` naming it."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        public = getattr(sys.modules["scipy.special"], name, None)
        scipy_function = getattr(public, "__wrapped__", public)   # under SciPy's dispatching wrapper
        for function in (public, scipy_function):
            traced = dispatch.UFUNCS.get(function) or dispatch.FUNCTIONS.get(function)
            if traced is not None:
                return traced

        def unsupported(*args, **kwargs):
            if isinstance(scipy_function, np.ufunc):
                raise dispatch.unsupported_error(scipy_function)
            raise UnsupportedError(f"scipy.special.{name} is not supported by morphjit", user_location())
        return unsupported


special = SpecialFunctions()
