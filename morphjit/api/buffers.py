"""Arrays the traced function makes, and conversions of traced arrays, while a trace runs.

``np.zeros``, ``np.ones``, ``np.empty``, ``np.full``, ``np.eye`` and the ``*_like`` of NumPy arrays, called
from the user's code in the tracing thread, make traced buffers, so that traced values can be
written into them (``out = np.zeros((n, k)); out[i] = ...``); an element of ``np.empty``'s that is
read before it was written is refused. Library code (NumPy's, SciPy's, morphjit's, anything
installed) and other threads get NumPy's own arrays. ``np.array``, ``np.asarray``,
``np.asanyarray``, ``np.ascontiguousarray`` and ``np.asfortranarray`` of a traced array (or of a
list holding traced values) follow NumPy's view-or-copy rule, and so do ``np.r_[...]`` and ``np.c_[...]``
of traced values (the conversion their items go through); ``np.float64``, ``np.float32``, ``np.int64``
and ``np.int32`` of traced values cast them (`scalar_type`). ``install`` registers them as
substitutes (``morphjit.tracing.substitutes``).
"""
from __future__ import annotations

import dis
import functools
import os
import sys
import sysconfig

import numpy as np
from numba.extending import typeof_impl

from ..ir import Sym
from ..tracing import ANY_TRACE, SUPPORTED_DTYPES, Tracer, storage, tracer as trace
from ..util import inside_package, user_location
from . import core as A
from .writes import conversion_copy

NUMPY = {name: getattr(np, name) for name in ("zeros", "ones", "empty", "full", "eye", "zeros_like", "ones_like",
                                              "empty_like", "full_like", "array", "asarray", "asanyarray",
                                              "ascontiguousarray", "asfortranarray")}
_LIBRARIES = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()["purelib"],
                                                          sysconfig.get_paths()["platlib"],
                                                          sysconfig.get_paths()["stdlib"]})


def _user_trace(name: str):
    """The calling thread's trace, where the user's code calls ``name`` itself (not a library's
    code, nor a compiled extension called from the user's line, which would take a tracer for an
    array)."""
    t = trace.current_trace()
    if t is None:
        return None
    frame = sys._getframe(2)
    filename = os.path.abspath(frame.f_code.co_filename)
    if inside_package(filename) or filename.startswith(_LIBRARIES):
        return None
    return t if callee_name(frame.f_code, frame.f_lasti) == name else None


_LOADS = ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF")


@functools.lru_cache(maxsize=4096)
def callee_name(code, offset: int) -> str | None:
    """The name the call at ``offset`` of ``code`` loads its callable by (``zeros`` in
    ``np.zeros(n)``), found by walking back over its arguments; None where it is not a plain call."""
    instructions = list(dis.get_instructions(code))
    # The frame's last instruction may be one of the call's inline cache entries (CPython 3.11+).
    at = next((k for k in range(len(instructions) - 1, -1, -1) if instructions[k].offset <= offset), None)
    if at is None or not instructions[at].opname.startswith("CALL"):
        return None
    need, depth = instructions[at].arg or 0, 0
    for ins in reversed(instructions[:at]):
        if ins.opname in ("PRECALL", "KW_NAMES", "CACHE", "PUSH_NULL"):
            continue
        if ins.opname.startswith(("JUMP", "POP_JUMP", "FOR_ITER", "RETURN")):
            return None
        if depth == need and ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            return ins.argval        # the last attribute of the callable's expression
        depth += dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=False)
        if depth > need:
            return ins.argval if ins.opname in _LOADS else None
    return None


def _made(t, name: str, shape, fill, dtype, order):
    """A buffer of ``shape`` filled with ``fill``, traced in ``t``; NumPy's where morphjit cannot trace it."""
    dtype = np.dtype(float if dtype is None else dtype)
    if dtype not in SUPPORTED_DTYPES or order not in ("C", "F"):
        return None
    shape = A.extents(shape)
    if any(isinstance(d, Sym) for d in shape):
        x = A.full(shape, fill, dtype, like=t)      # a batch-dependent shape: traced from the start
        x.own_storage().layout = order
    else:
        x = Tracer.buffer(t, NUMPY["full"](shape, fill, dtype, order), order)
    store = x.storage
    store.made = user_location(sys._getframe(2))
    if name == "empty" and not any(isinstance(d, Sym) for d in x.shape):
        store.unwritten = np.ones(storage.concrete_shape(x.shape), bool)
    return x


def _maker(name: str, fill):
    def make(shape, dtype=None, order="C", *, like=None, **kwargs):
        t = _user_trace(name) if like is None and not kwargs else None
        made = None if t is None else _made(t, name, shape, fill, dtype, order)
        return NUMPY[name](shape, dtype, order, like=like, **kwargs) if made is None else made
    make.__name__ = name
    return make


def full(shape, fill_value, dtype=None, order="C", *, like=None, **kwargs):
    t = _user_trace("full") if like is None and not kwargs and not isinstance(fill_value, Tracer) else None
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    made = None if t is None else _made(t, "full", shape, fill_value, dtype, order)
    return NUMPY["full"](shape, fill_value, dtype, order, like=like, **kwargs) if made is None else made


def _like_maker(name: str, fill):
    def make(a, dtype=None, order="K", subok=True, shape=None, **kwargs):
        t = _user_trace(f"{name}_like") if isinstance(a, np.ndarray) and not kwargs else None
        made = None if t is None else _made(t, name, a.shape if shape is None else shape, fill,
                                            a.dtype if dtype is None else dtype, _like_layout(a, order))
        return NUMPY[f"{name}_like"](a, dtype, order, subok, shape, **kwargs) if made is None else made
    make.__name__ = f"{name}_like"
    return make


def _like_layout(a: np.ndarray, order: str) -> str:
    keeps = order in ("K", "A") and a.flags.f_contiguous and not a.flags.c_contiguous
    return "F" if order == "F" or keeps else "C"


def eye(N, M=None, k=0, dtype=float, order="C", *, like=None, **kwargs):
    t = _user_trace("eye") if like is None and not kwargs else None
    made = NUMPY["eye"](N, M, k, dtype, order, like=like, **kwargs)
    return made if t is None or made.dtype not in SUPPORTED_DTYPES else Tracer.buffer(t, made, order)


def full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, **kwargs):
    t = _user_trace("full_like") if isinstance(a, np.ndarray) and not kwargs else None
    made = None if t is None else _made(t, "full", a.shape if shape is None else shape, fill_value,
                                        a.dtype if dtype is None else dtype, "C")
    return NUMPY["full_like"](a, fill_value, dtype, order, subok, shape, **kwargs) if made is None else made


# ---------------------------------------------------------------------------------------------
# Conversions of traced arrays


def _from_numpy(name: str) -> bool:
    """Whether the conversion is NumPy's or SciPy's own (which refuse a traced array with their
    message), or a compiled extension's (which would take a tracer for an array)."""
    frame = sys._getframe(2)
    module = frame.f_globals.get("__name__", "")
    return module.split(".")[0] in ("numpy", "scipy") or callee_name(frame.f_code, frame.f_lasti) != name


def array(obj, dtype=None, *, copy=True, order="K", subok=False, ndmin=0, like=None):
    if like is None and not subok and A.holds_tracers(obj) and not _from_numpy("array"):
        if isinstance(obj, Tracer):
            return _at_least(conversion_copy(obj, dtype, order, copy), ndmin)
        return _traced_array(obj, dtype, ndmin)
    return NUMPY["array"](obj, dtype, copy=copy, order=order, subok=subok, ndmin=ndmin, like=like)


def _traced_array(obj, dtype, ndmin: int):
    """A tracer, or a list holding some, as an array of ``dtype`` (its own if None) with at least
    ``ndmin`` dimensions."""
    x = A.as_array(obj)
    return _at_least(x if dtype is None else A.astype(x, dtype), ndmin)


def index_tricks_array(obj, dtype=None, *, copy=True, order="K", subok=False, ndmin=0, like=None):
    """The ``array`` that ``np.r_`` and ``np.c_`` convert their items with: traced items become
    traced arrays (which their concatenation then dispatches on)."""
    if like is None and A.holds_tracers(obj):
        return _traced_array(obj, dtype, ndmin)
    return NUMPY["array"](obj, dtype, copy=copy, order=order, subok=subok, ndmin=ndmin, like=like)


def _converter(name: str, order: str):
    """``np.<name>(a, dtype, order, copy=...)`` of a traced array, in ``order`` unless given one."""
    def convert(a, dtype=None, *args, **kwargs):
        if isinstance(a, Tracer) and not kwargs.get("like") and not _from_numpy(name):
            given = args[0] if args else kwargs.get("order")
            return conversion_copy(a, dtype, given or order, kwargs.get("copy"))
        return NUMPY[name](a, dtype, *args, **kwargs)
    convert.__name__ = name
    return convert


def _at_least(x, ndmin: int):
    return A.reshape(x, (1,) * (ndmin - x.ndim) + tuple(x.shape)) if ndmin > x.ndim else x


# ---------------------------------------------------------------------------------------------
# NumPy's scalar types called on traced values: ``np.float64(x)`` is ``x.astype(np.float64)``


class _ScalarTypeMeta(type):
    """The metaclass of a scalar type's substitute, which stands for the NumPy type in ``isinstance``,
    ``issubclass``, ``==`` and hashing (only ``is`` tells them apart); ``np.dtype`` of it is the type's."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls.numpy_type)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, cls.numpy_type)

    def __eq__(cls, other):
        return other is cls or other is cls.numpy_type

    def __hash__(cls):
        return hash(cls.numpy_type)


@typeof_impl.register(_ScalarTypeMeta)
def _numba_type(substitute, context):
    """numba's type of a substitute: its NumPy type's (a numba function compiled while a trace runs, in
    any thread, reads ``np.float64`` from NumPy's module)."""
    return typeof_impl(substitute.numpy_type, context)


def scalar_type(numpy_type):
    """A substitute of ``numpy_type`` (``np.float64``): called on a traced value or a list holding
    some, the values cast to it (as NumPy does an array: ``np.float64`` of a float32 array is a
    cast); on anything else, NumPy's own scalar."""
    def new(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and A.holds_tracers(args[0]):
            return A.astype(A.as_array(args[0]), numpy_type)
        return numpy_type(*args, **kwargs)
    return _ScalarTypeMeta(numpy_type.__name__, (numpy_type,), {"__new__": new, "numpy_type": numpy_type,
                                                                "__module__": "numpy", "__doc__": numpy_type.__doc__})


SCALAR_TYPES = {np.float64: ("float64", "double"), np.float32: ("float32", "single"), np.int64: ("int64",),
                np.int32: ("int32",)}


def install() -> None:
    """Register the substitutes while any trace runs."""
    for name in ("zeros", "ones", "empty"):
        ANY_TRACE.register(np, name, _maker(name, 1 if name == "ones" else 0))
    for name in ("zeros", "ones", "empty"):
        ANY_TRACE.register(np, f"{name}_like", _like_maker(name, 1 if name == "ones" else 0))
    ANY_TRACE.register(np, "full", full)
    ANY_TRACE.register(np, "eye", eye)
    ANY_TRACE.register(np, "full_like", full_like)
    ANY_TRACE.register(np, "array", array)
    ANY_TRACE.register(sys.modules["numpy.lib._index_tricks_impl"], "array", index_tricks_array)
    for numpy_type, names in SCALAR_TYPES.items():
        substitute = scalar_type(numpy_type)
        for name in names:
            ANY_TRACE.register(np, name, substitute)
    for name, order in (("asarray", "K"), ("asanyarray", "K"), ("ascontiguousarray", "C"), ("asfortranarray", "F")):
        ANY_TRACE.register(np, name, _converter(name, order))
