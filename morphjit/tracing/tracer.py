"""Tracing: run the user's function on tracer arrays and record the forward SSA program."""
from __future__ import annotations

import inspect
import math
import threading

import numpy as np

from ..ir import BATCH_SIZE, DTYPE_NAMES, ELEMENTWISE, OPS, Binding, Lit, Program, TensorType, Var, params_of
from ..util import DtypeError, MorphjitError, TracingError, UnsupportedError, guarded, pytree, user_location
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
    """A stand-in for an array while a function is traced: it carries shape and dtype only.

    What needs no array function is here; the operators, the methods, indexing and NumPy's
    protocols are the array layer's, installed on this class once (``morphjit.api.methods``).
    """

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
    # As if C-contiguous (mj.as_strided reads strides computed from these).
    strides = property(lambda self: tuple(self.dtype.itemsize * math.prod(self.shape[k + 1:])
                                          for k in range(self.ndim)))
    device = property(lambda self: "cpu")   # the array API standard's

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

    def __hash__(self):
        return id(self)

    def to_device(self, device, /, *, stream=None):
        if device != self.device:
            raise ValueError(f"device {device!r}: traced arrays live on {self.device!r}")
        return self


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
# for such a leaf, and its ``operand`` the program input standing for it (the array layer installs
# the makers of random generators, ``morphjit.api.methods``).
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
