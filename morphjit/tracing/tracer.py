"""Tracing: run the user's function on tracer arrays and record the forward SSA program."""
from __future__ import annotations

import inspect
import math
import threading

import numpy as np

from ..util import pytree
from .conversions import as_strided_caller, scipy_caller, scipy_conversion_error, updates_through_at
from ..util.errors import DtypeError, MorphjitError, TracingError, UnsupportedError, user_location
from ..ir.program import BATCH_SIZE, DTYPE_NAMES, Binding, Lit, Program, TensorType, Var, params_of
from ..util.interrupts import guarded
from ..ops.core import ELEMENTWISE, OPS
from .substitutes import ANY_TRACE, SYMBOLIC_EXTENT


class Trace:
    """Records bindings while a function runs on tracers."""

    def __init__(self):
        self.bindings: list[Binding] = []
        self.consts: list[tuple[Var, np.ndarray]] = []
        self._const_vars: dict[int, tuple[np.ndarray, Var]] = {}
        self.closed = False
        self.loc = None  # when set, the source location given to new bindings
        self.paths: dict[int, str] = {}  # id(input var) -> the argument path it stands for

    def bind(self, op_name: str, operands, **params) -> "Tracer":
        """Append one binding; operands are tracers of this trace, literals or NumPy arrays."""
        if self.closed:
            raise escaped_tracer_error()
        op = OPS[op_name]
        inputs = [self.operand(x, lift_literals=op.kind != ELEMENTWISE) for x in operands]
        frozen = params_of(params)
        if op.kind == ELEMENTWISE and inputs and all(isinstance(x, Lit) for x in inputs):
            return Tracer(self, self._fold(op_name, inputs, dict(frozen)))
        loc = self.loc or user_location()
        try:
            out_type = op.infer([x.type for x in inputs], **dict(frozen))
        except MorphjitError as e:
            e.loc = e.loc or loc
            raise
        out = Var(out_type)
        self.bindings.append(Binding(out, op_name, tuple(inputs), frozen, loc))
        return Tracer(self, out)

    def operand(self, x, lift_literals: bool):
        """The IR operand for a tracer, literal or captured array."""
        if isinstance(x, Tracer):
            if x.trace is not self:
                raise escaped_tracer_error()
            x = x.operand
        elif isinstance(x, np.ndarray):
            x = self._const(x)
        if isinstance(x, Lit) and lift_literals:
            return self.bind("fill", (), shape=(), dtype=DTYPE_NAMES[x.dtype], value=x.value).operand
        return x

    def _const(self, array: np.ndarray) -> Var:
        """A NumPy array captured by the function: its value is fixed when the function is traced, in
        a C-contiguous copy (compiled code reads a constant's buffer in row-major order)."""
        key = id(array)
        if key not in self._const_vars:
            var = Var(TensorType(array.shape, array.dtype))
            self.consts.append((var, np.array(array, copy=True, order="C")))
            # Keep `array` alive: a temporary's id may otherwise be reused by a later array.
            self._const_vars[key] = (array, var)
        return self._const_vars[key][1]

    @staticmethod
    def _fold(op_name: str, inputs: list[Lit], params: dict) -> Lit:
        args = [np.asarray(x.value, x.dtype) for x in inputs]
        value = np.asarray(OPS[op_name].impl(*args, **params))
        return Lit(value.item(), value.dtype)


def escaped_tracer_error() -> TracingError:
    return TracingError("a traced value escaped from an earlier trace (it was stored outside the "
                        "function, e.g. in a global or a closure, and used after tracing ended)",
                        user_location())


class Tracer:
    """A stand-in for an array while a function is traced: it carries shape and dtype only."""

    __slots__ = ("trace", "operand", "weak")
    __array_priority__ = 1000

    def __init__(self, trace: Trace, operand, weak: bool = False):
        self.trace = trace
        self.operand = operand
        self.weak = weak  # a Python scalar argument: promotes like one (NumPy's NEP 50)

    @property
    def type(self) -> TensorType:
        return self.operand.type

    shape = property(lambda self: self.operand.type.shape)
    dtype = property(lambda self: self.operand.type.dtype)
    ndim = property(lambda self: self.operand.type.ndim)
    size = property(lambda self: self.operand.type.size)
    T = property(lambda self: A.transpose(self))
    # As if C-contiguous (mj.as_strided reads strides computed from these).
    strides = property(lambda self: tuple(self.dtype.itemsize * math.prod(self.shape[k + 1:])
                                          for k in range(self.ndim)))

    def __repr__(self) -> str:
        return f"Tracer({self.type})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d traced array")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d traced array")
        return self._rows()

    def _rows(self):
        # A generator: ``iter(x)`` (np.iterable asks) does not need a batch-dependent length.
        for i in range(len(self)):
            yield self[i]

    # Python asks for concrete values here; a tracer has none.
    def __bool__(self):
        raise concrete_value_error("bool() or an `if`/`while` test", "use mj.where(cond, a, b) instead")

    def __float__(self):
        raise concrete_value_error("float()", "keep the value as an array")

    def __int__(self):
        raise concrete_value_error("int()", "shapes are static: use x.shape")

    __index__ = __int__

    def __array__(self, dtype=None, copy=None):
        strided = as_strided_caller()
        if strided is not None:
            raise UnsupportedError("np.lib.stride_tricks.as_strided converts its argument to a NumPy array, which a "
                                   "traced array cannot become: call mj.as_strided (window views) or "
                                   "np.lib.stride_tricks.sliding_window_view instead", user_location(strided))
        caller = scipy_caller()
        if caller is not None:
            raise scipy_conversion_error(*caller)
        raise concrete_value_error("conversion to a NumPy array (np.asarray, np.array)",
                                   "use the traced value with NumPy functions directly")

    def __hash__(self):
        return id(self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return A.apply_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return A.apply_function(func, args, kwargs)

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

    def __setitem__(self, key, value):
        if not updates_through_at(inspect.currentframe().f_back):
            raise UnsupportedError("item assignment (x[...] = v) on a traced array is not supported (a traced "
                                   "array cannot be changed in place): write x = mj.at(x)[...].set(v) (or "
                                   ".add(v) for np.add.at), or x = np.where(mask, v, x) for x[mask] = v",
                                   user_location())
        new = updated(self, key, value)
        self.operand, self.weak = new.operand, new.weak

    # The array API standard (SciPy with SCIPY_ARRAY_API=1): see morphjit.array_namespace.
    device = property(lambda self: "cpu")
    mT = property(lambda self: A.swap_last(self))

    def __array_namespace__(self, *, api_version=None):
        if api_version not in array_namespace.API_VERSIONS:
            raise ValueError(f"morphjit's array namespace implements the array API "
                             f"{array_namespace.__array_api_version__}, not {api_version}")
        return array_namespace

    def to_device(self, device, /, *, stream=None):
        if device != self.device:
            raise ValueError(f"device {device!r}: traced arrays live on {self.device!r}")
        return self

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
    astype = lambda self, dtype, order="K", casting="unsafe", subok=True, copy=True: A.astype(self, dtype, casting)
    dot = lambda self, b, out=None: A.dot(self, b, out)
    clip = lambda self, min=None, max=None, out=None, **kwargs: A.clip(self, min, max, out, **kwargs)
    squeeze = lambda self, axis=None: A.squeeze(self, axis)
    swapaxes = lambda self, axis1, axis2: A.swapaxes(self, axis1, axis2)
    ravel = lambda self, order="C": A.ravel(self, order)
    flatten = ravel
    # Methods whose functions live in the op-family modules reach them through NumPy's dispatch.
    prod = lambda self, *args, **kwargs: np.prod(self, *args, **kwargs)
    argmax = lambda self, *args, **kwargs: np.argmax(self, *args, **kwargs)
    argmin = lambda self, *args, **kwargs: np.argmin(self, *args, **kwargs)
    any = lambda self, *args, **kwargs: np.any(self, *args, **kwargs)
    all = lambda self, *args, **kwargs: np.all(self, *args, **kwargs)
    cumsum = lambda self, *args, **kwargs: np.cumsum(self, *args, **kwargs)
    cumprod = lambda self, *args, **kwargs: np.cumprod(self, *args, **kwargs)
    round = lambda self, decimals=0: np.round(self, decimals)


def concrete_value_error(what: str, hint: str) -> TracingError:
    return TracingError(f"{what} needs a concrete value, but this array is traced: its value is only "
                        f"known when the compiled step runs; {hint}", user_location())


# ---------------------------------------------------------------------------------------------
# Tracing a function

SUPPORTED_DTYPES = tuple(DTYPE_NAMES)


def trace(fn, *args) -> Program:
    """Run ``fn`` on tracers standing for ``args`` and return the forward program.

    Every array leaf of the arguments is a program input; the program's outputs are the leaves
    of what ``fn`` returns.
    """
    program, _ = trace_with_tree(fn, args)
    return program


def trace_with_tree(fn, args, batched=frozenset()):
    """``trace`` that also returns the output tree structure. The leading extent of the leaves
    whose indices are in ``batched`` is the symbolic batch size."""
    leaves, treedef = pytree.flatten(tuple(args))
    paths = pytree.leaf_paths(treedef, "")
    names = argument_names(fn, len(args))
    t = Trace()
    tracers = [input_tracer(t, leaf, readable_path(p, names), k in batched)
               for k, (leaf, p) in enumerate(zip(leaves, paths))]
    t.paths.update((id(x.operand), readable_path(p, names)) for x, p in zip(tracers, paths))
    try:
        out_leaves, out_tree = recorded(t, bool(batched), lambda: pytree.flatten(fn(*pytree.unflatten(treedef, tracers))))
        outputs = tuple(output_var(t, x) for x in out_leaves)
    finally:
        t.closed = True
    program = Program(tuple(x.operand for x in tracers), tuple(t.bindings), outputs, tuple(t.consts),
                      getattr(fn, "__name__", "program"))
    return program, out_tree


_current = threading.local()


def recorded(t: Trace, symbolic: bool, call):
    """``call()``, the user's function on ``t``'s tracers, with ``t`` this thread's current trace
    and the library functions that need it replaced (``substitutes``)."""
    sections = (Current(t), ANY_TRACE, SYMBOLIC_EXTENT) if symbolic else (Current(t), ANY_TRACE)
    return guarded(call, sections)


class Current:
    """``t`` the calling thread's current trace while entered (a section of `interrupts.guarded`)."""

    def __init__(self, t: Trace):
        self.t = t

    def enter(self) -> None:
        _current.__dict__.setdefault("traces", []).append(self.t)

    def leave(self) -> None:
        _current.traces.pop()


def current_trace() -> Trace | None:
    """The trace the calling thread records into (the innermost one); None outside tracing."""
    stack = getattr(_current, "traces", None)
    return stack[-1] if stack else None


def argument_names(fn, count: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:count] + [f"args[{i}]" for i in range(len(names), count)]


def readable_path(path: str, names: list[str]) -> str:
    """Turn ``[0]['W1']`` (a path into the argument tuple) into ``params['W1']``."""
    index, _, rest = path[1:].partition("]")
    return names[int(index)] + rest


# Leaf types that are not data, by type: ``maker(trace, leaf, path)`` is what the function receives
# for such a leaf, and its ``operand`` the program input standing for it (``rng.py`` registers
# random generators).
LEAF_TRACERS: dict = {}


def input_tracer(t: Trace, leaf, path: str, batched: bool = False) -> Tracer:
    maker = LEAF_TRACERS.get(type(leaf))
    if maker is not None:
        return maker(t, leaf, path)
    if isinstance(leaf, (bool, int, float)) and not isinstance(leaf, np.generic):
        dtype = np.result_type(type(leaf))
        return Tracer(t, Var(TensorType((), dtype)), weak=True)
    if isinstance(leaf, (np.ndarray, np.generic)):
        if leaf.dtype not in SUPPORTED_DTYPES:
            raise DtypeError(f"argument {path} has dtype {leaf.dtype}; morphjit traces "
                             f"float32, float64, int32, int64 and bool arrays", user_location())
        shape = np.shape(leaf)
        return Tracer(t, Var(TensorType((BATCH_SIZE,) + shape[1:] if batched else shape, leaf.dtype)))
    raise TracingError(f"argument {path} is a {type(leaf).__name__}, which cannot be traced: pass NumPy "
                       f"arrays, Python scalars, or dicts, lists and tuples of them", user_location())


class NotAnArray:
    """A traced value that cannot be an array (``x[mask]``, whose shape depends on the data);
    ``why`` says what to write instead, ``loc`` is where it was made. The array functions pass it
    on: an element-wise function of it is ``x.elementwise(fn, *operands)``, ``sum``/``mean`` of it
    its own ``sum``/``mean``."""
    why = ""
    loc = None


def output_var(t: Trace, x) -> Var:
    if isinstance(x, NotAnArray):
        raise UnsupportedError(f"the function returned {x.why}", x.loc or user_location())
    if not isinstance(x, (Tracer, np.ndarray, np.generic, bool, int, float)):
        raise TracingError(f"the function returned a {type(x).__name__}; it must return arrays",
                           user_location())
    return t.operand(x if isinstance(x, Tracer) else np.asarray(x), lift_literals=True)


A = None  # the array functions behind the tracer's operators and methods


def use_array_functions(namespace) -> None:
    """Called by ``morphjit.array_api`` as it loads: a tracer's operators are its functions, and
    the array layer is built on the tracer, so it installs itself here rather than being imported."""
    global A
    A = namespace


getitem = None  # NumPy indexing, ``x[key]``, installed by ``morphjit.numpy_index``
array_namespace = None  # ``x.__array_namespace__()`` and ``updated(x, key, v)``: ``morphjit.array_namespace``
updated = None


def use_indexing(function) -> None:
    """Called by ``morphjit.numpy_index`` as it loads (it is built on the array layer)."""
    global getitem
    getitem = function


def use_array_namespace(module, update) -> None:
    """Called by ``morphjit.array_namespace`` as it loads (it is built on the array layer)."""
    global array_namespace, updated
    array_namespace, updated = module, update
