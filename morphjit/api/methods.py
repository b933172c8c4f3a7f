"""The array layer's part of the tracer, installed on ``Tracer`` once, from above (``install``,
called by ``morphjit.api``): its operators and methods (NumPy's, written with the array
functions), NumPy's protocols (the dispatch of plain NumPy calls, conversion refused with a hint),
indexing and item assignment, the array-API namespace; and, also installed there, the tracers of
random generator arguments and of lists of ints, and the library functions replaced while traces run.
"""
from __future__ import annotations

import sys


import numpy as np

from ..ir import TensorType, Var
from ..native import GENERATORS
from ..tracing import ANY_TRACE, LEAF_TRACERS, SYMBOLIC_EXTENT, Tracer, concrete_value_error, tracer as trace
from ..util import UnsupportedError, user_location
from . import buffers, core as A, dispatch, namespace, writes
from .conversions import as_strided_caller, scipy_caller, scipy_conversion_error
from .indexing import arange, getitem
from .random import global_draws, traced_generator
from .scipy import namespace as scipy_namespace, special as scipy_special


def _ufunc_of_a_list_error(frame) -> UnsupportedError | None:
    """The error of a NumPy ufunc called (at ``frame``) on a list holding traced values, which the ufunc
    converts to an array itself (before any dispatch a tracer could take); None for other callers."""
    name = buffers.callee_name(frame.f_code, frame.f_lasti)
    if not isinstance(getattr(np, name or "", None), np.ufunc):
        return None
    return UnsupportedError(f"np.{name} of a list holding traced values: NumPy's ufuncs convert a list to an array "
                            f"themselves, which a traced value cannot join; write np.{name}(np.array([...]))",
                            user_location())


class ArrayMethods:
    """What a traced array has as an array: `install` puts each of these on ``Tracer``."""

    T = property(lambda self: A.transpose(self))
    mT = property(lambda self: A.swap_last(self))   # the array API standard's

    def __array__(self, dtype=None, copy=None):
        if self.concrete() is not None:      # a buffer still known: NumPy's copy of it, read-only
            known = np.array(self.concrete(), dtype=dtype)
            known.flags.writeable = False
            return known
        strided = as_strided_caller()
        if strided is not None:
            raise UnsupportedError("np.lib.stride_tricks.as_strided converts its argument to a NumPy array, which a "
                                   "traced array cannot become: call mj.as_strided (window views) or "
                                   "np.lib.stride_tricks.sliding_window_view instead", user_location(strided))
        caller = scipy_caller()
        if caller is not None:
            raise scipy_conversion_error(*caller)
        raise trace.numpy_write_error() or _ufunc_of_a_list_error(sys._getframe(1)) or concrete_value_error(
            "conversion to a NumPy array (np.asarray, np.array)", "use the traced value with NumPy functions directly")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return dispatch.apply_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return dispatch.apply_function(func, args, kwargs)

    __add__ = lambda self, other: A.add(self, other)
    __radd__ = lambda self, other: A.add(other, self)
    __sub__ = lambda self, other: A.subtract(self, other)
    __rsub__ = lambda self, other: A.subtract(other, self)
    __mul__ = lambda self, other: A.multiply(self, other)
    __rmul__ = lambda self, other: A.multiply(other, self)
    __truediv__ = lambda self, other: A.divide(self, other)
    __rtruediv__ = lambda self, other: A.divide(other, self)
    __pow__ = lambda self, other: A.power(self, other)
    __rpow__ = lambda self, other: A.power(other, self)
    # These dispatch through NumPy's ufuncs, so they need no array function of their own here.
    __mod__ = lambda self, other: np.remainder(self, other)
    __rmod__ = lambda self, other: np.remainder(other, self)
    __floordiv__ = lambda self, other: np.floor_divide(self, other)
    __rfloordiv__ = lambda self, other: np.floor_divide(other, self)
    __divmod__ = lambda self, other: np.divmod(self, other)
    __rdivmod__ = lambda self, other: np.divmod(other, self)
    __round__ = lambda self, ndigits=None: np.round(self, ndigits or 0)
    __matmul__ = lambda self, other: A.matmul(self, other)
    __rmatmul__ = lambda self, other: A.matmul(other, self)
    __neg__ = lambda self: A.negative(self)
    __pos__ = lambda self: self
    __abs__ = lambda self: A.abs(self)
    __lt__ = lambda self, other: A.less(self, other)
    __le__ = lambda self, other: A.less_equal(self, other)
    __gt__ = lambda self, other: A.greater(self, other)
    __ge__ = lambda self, other: A.greater_equal(self, other)
    __eq__ = lambda self, other: A.equal(self, other)
    __ne__ = lambda self, other: A.not_equal(self, other)
    __and__ = lambda self, other: A.bitwise_and(self, other)
    __rand__ = lambda self, other: A.bitwise_and(other, self)
    __or__ = lambda self, other: A.bitwise_or(self, other)
    __ror__ = lambda self, other: A.bitwise_or(other, self)
    __invert__ = lambda self: A.invert(self)
    __getitem__ = lambda self, key: getitem(self, key)

    __setitem__ = lambda self, key, value: writes.setitem(self, key, value, sys._getframe(1))
    __iadd__ = writes.inplace(A.add, "add")
    __isub__ = writes.inplace(A.subtract, "subtract")
    __imul__ = writes.inplace(A.multiply, "multiply")
    __itruediv__ = writes.inplace(A.divide, "divide")
    __ipow__ = writes.inplace(A.power, "power")
    __imatmul__ = writes.inplace(A.matmul, "matmul")
    __imod__ = writes.inplace(np.remainder, "remainder")
    __ifloordiv__ = writes.inplace(np.floor_divide, "floor_divide")
    __iand__ = writes.inplace(A.bitwise_and, "bitwise_and")
    __ior__ = writes.inplace(A.bitwise_or, "bitwise_or")

    # The array API standard (SciPy with SCIPY_ARRAY_API=1): see ``morphjit.api.namespace``.
    def __array_namespace__(self, *, api_version=None):
        if api_version not in namespace.API_VERSIONS:
            raise ValueError(f"morphjit's array namespace implements the array API "
                             f"{namespace.__array_api_version__}, not {api_version}")
        return namespace

    def reshape(self, *shape, order="C", copy=None):
        return A.reshape(self, shape[0] if len(shape) == 1 else shape, order=order, copy=copy)

    def transpose(self, *axes):
        return A.transpose(self, axes[0] if len(axes) == 1 else (axes or None))

    # ndarray's methods take the arguments of NumPy's functions after the array.
    sum = lambda self, *args, **kwargs: A.sum(self, *args, **kwargs)
    mean = lambda self, *args, **kwargs: A.mean(self, *args, **kwargs)
    max = lambda self, *args, **kwargs: A.max(self, *args, **kwargs)
    min = lambda self, *args, **kwargs: A.min(self, *args, **kwargs)
    var = lambda self, *args, **kwargs: A.var(self, *args, **kwargs)
    std = lambda self, *args, **kwargs: A.std(self, *args, **kwargs)
    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        cast = A.astype(self, dtype, casting)
        return writes.conversion_copy(cast, None, order, True) if copy and cast is self else cast

    def item(self, *args):
        if self.concrete() is None:
            raise concrete_value_error("x.item()", "keep the value as an array")
        return self.concrete().item(*args)

    def tolist(self):
        if self.concrete() is None:
            raise concrete_value_error("x.tolist()", "keep the value as an array")
        return self.concrete().tolist()

    def copy(self, order="C"):
        return A.copy(self, order)

    def view(self, dtype=None, type=None):
        if dtype is not None and np.dtype(dtype) != self.dtype or type is not None:
            raise UnsupportedError("x.view(dtype) reinterprets memory, which morphjit does not trace: use "
                                   "x.astype(dtype)", user_location())
        return self   # the same memory: writes through either are seen by both

    dot = lambda self, b, out=None: A.dot(self, b, out)
    clip = lambda self, min=None, max=None, out=None, **kwargs: A.clip(self, min, max, out, **kwargs)
    squeeze = lambda self, axis=None: A.squeeze(self, axis)
    swapaxes = lambda self, axis1, axis2: A.swapaxes(self, axis1, axis2)
    ravel = lambda self, order="C": A.ravel(self, order)
    flatten = lambda self, order="C": A.copy(A.ravel(self, order), "C")
    # Methods whose functions live in the op-family modules reach them through NumPy's dispatch.
    prod = lambda self, *args, **kwargs: np.prod(self, *args, **kwargs)
    argmax = lambda self, *args, **kwargs: np.argmax(self, *args, **kwargs)
    argmin = lambda self, *args, **kwargs: np.argmin(self, *args, **kwargs)
    any = lambda self, *args, **kwargs: np.any(self, *args, **kwargs)
    all = lambda self, *args, **kwargs: np.all(self, *args, **kwargs)
    cumsum = lambda self, *args, **kwargs: np.cumsum(self, *args, **kwargs)
    cumprod = lambda self, *args, **kwargs: np.cumprod(self, *args, **kwargs)
    round = lambda self, decimals=0: np.round(self, decimals)


class TracedInts(list):
    """A list of Python ints argument, traced: one int64 array input (``operand``), whose elements
    the function reads as traced Python ints (weak in promotions, as the ints are)."""

    operand = None


def traced_int_list(t, ints: list, path: str) -> TracedInts:
    array = Tracer(t, Var(TensorType((len(ints),), np.dtype(np.int64))))
    traced = TracedInts(Tracer(t, getitem(array, k).operand, weak=True) for k in range(len(ints)))
    traced.operand = array.operand
    return traced


def install() -> None:
    """Make ``Tracer`` an array: the members of `ArrayMethods`; the tracers of random generator
    arguments; ``np.arange`` of the batch size while a trace with a symbolic batch size runs;
    SciPy's array-API lookups and ``scipy.special.polygamma`` (and ``scipy.stats``' distributions and
    ``scipy.linalg``'s functions, loaded with SciPy's), NumPy's global draws and NumPy's functions of
    lists holding traced values while any trace runs."""
    for name, member in vars(ArrayMethods).items():
        if callable(member) or isinstance(member, property):
            setattr(Tracer, name, member)
    for kind in GENERATORS:
        LEAF_TRACERS[kind] = traced_generator
    LEAF_TRACERS[list] = traced_int_list    # the lists that are leaves: of ints (``util.pytree``)
    for owner, name, substitute in global_draws():
        ANY_TRACE.register(owner, name, substitute)
    SYMBOLIC_EXTENT.register(np, "arange", arange)
    buffers.install()
    taken = set(ANY_TRACE.attributes())
    for owner, name, substitute in dispatch.routes():
        if (owner, name) not in taken:    # np.zeros_like makes buffers (``buffers``), and dispatches
            ANY_TRACE.register(owner, name, substitute)
    for owner, name, substitute in scipy_namespace.substitutes() + scipy_special.substitutes():
        ANY_TRACE.register(owner, name, substitute)
    ANY_TRACE.provided_by("scipy.stats", f"{__package__}.scipy.stats")
    ANY_TRACE.provided_by("scipy.linalg", f"{__package__}.scipy.linalg")
