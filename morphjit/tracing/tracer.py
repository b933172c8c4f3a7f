"""Tracing: run the user's function on tracer arrays and record the forward SSA program."""
from __future__ import annotations

import inspect
import math
import re
import threading

import numpy as np

from ..ir import (BATCH_SIZE, DTYPE_NAMES, ELEMENTWISE, OPS, VIEW, Binding, Lit, Sym, TensorType, Var,
                  params_of)
from ..util import DtypeError, MorphjitError, TracingError, UnsupportedError, guarded, user_location
from . import storage
from .asked import concrete_value_error
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
        self.producers: dict[int, Binding] = {}   # id(var) -> the binding computing it
        self.exploration = None   # while the function runs: the paths of its tests (`branches`)
        self.global_generator = None   # what NumPy's global draws draw from (`jit.captured`), if traced
        self.contents_read: set[str] = set()   # the captured arrays whose contents the trace computed with

    def bind(self, op_name: str, operands, **params) -> "Tracer":
        """Append one binding; operands are tracers of this trace, literals or NumPy arrays. A
        view op of a tracer gives a view of its storage (``storage``), as NumPy's would be."""
        if self.closed:
            raise escaped_tracer_error()
        op = OPS[op_name]
        known = None if symbolic(params) else self._known_operands(operands, read=op.kind != VIEW)
        if known is None:
            return self._recorded(op_name, op, operands, params)
        sources = None if op.kind == VIEW else captured_sources(operands)
        if sources:
            return self._derived(op_name, op, operands, known, params, sources)
        return self._computed(op_name, op, operands, known, params)

    def _recorded(self, op_name: str, op, operands, params: dict) -> "Tracer":
        inputs = [self.operand(x, lift_literals=op.kind != ELEMENTWISE, read=op.kind != VIEW) for x in operands]
        frozen = params_of(params)
        if op.kind == ELEMENTWISE and inputs and all(isinstance(x, Lit) for x in inputs):
            return Tracer(self, self._fold(op_name, inputs, dict(frozen)))
        out = Tracer(self, self.record(op_name, inputs, dict(frozen)))
        source = operands[0] if operands else None
        if op.kind == VIEW and isinstance(source, Tracer):
            storage.make_view(source, out, op_name, frozen)
        elif any(isinstance(x, Tracer) and not x.contiguous() for x in operands):
            out.layout = "F" if op.kind == ELEMENTWISE and fortran_operands(operands, out.shape) else "unknown"
        return out

    def record(self, op_name: str, inputs: list, params: dict):
        """Append one binding of IR operands; its output ``Var``."""
        op = OPS[op_name]
        loc = self.loc or user_location()
        try:
            out_type = op.infer([x.type for x in inputs], **params)
        except MorphjitError as e:
            e.loc = e.loc or loc
            raise
        out = Var(out_type)
        self.bindings.append(Binding(out, op_name, tuple(inputs), params_of(params), loc))
        self.producers[id(out)] = self.bindings[-1]
        return out

    def same_value(self, a, b, depth: int = 8) -> bool:
        """Whether ``a`` and ``b`` are computed alike (the same ops, parameters and inputs, to ``depth``)."""
        if a is b:
            return True
        p, q = self.producers.get(id(a)), self.producers.get(id(b))
        if p is None or q is None or depth == 0 or (p.op, p.kwargs) != (q.op, q.kwargs) or len(p.inputs) != len(q.inputs):
            return isinstance(a, Lit) and isinstance(b, Lit) and (a.value, a.dtype) == (b.value, b.dtype)
        return all(self.same_value(x, y, depth - 1) for x, y in zip(p.inputs, q.inputs))

    def operand(self, x, lift_literals: bool, read: bool = True):
        """The IR operand for a tracer, literal or captured array (whose elements are ``read``:
        not only viewed)."""
        if isinstance(x, Tracer):
            if x.trace is not self:
                raise escaped_tracer_error()
            if read and x.storage is not None and x.storage.unwritten is not None:
                x.storage.check_written(x.steps)
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
    def _known_operands(operands, read: bool) -> list | None:
        """The NumPy values of ``operands`` where each tracer among them is a buffer that is still
        known (made with NumPy in the function, with nothing traced written into it); else None."""
        tracers = [x for x in operands if isinstance(x, Tracer)]
        if not tracers or any(x.storage is None or x.storage.known is None for x in tracers):
            return None
        for x in tracers:
            if read and x.storage.unwritten is not None:
                x.storage.check_written(x.steps)
        return [storage.concrete_view(x.storage.known, x.steps) if isinstance(x, Tracer)
                else np.asarray(x.value, x.dtype) if isinstance(x, Lit) else x for x in operands]

    def _computed(self, op_name: str, op, operands, values: list, params: dict):
        """An op of known buffers, computed as NumPy would: a view of a buffer is a view of it (which
        a later traced write reaches), anything else a new known buffer (which traced keys can index)."""
        if op.kind == VIEW:
            out = Tracer(self, None)
            storage.make_view(operands[0], out, op_name, params_of(params))
            if out.storage is not None:
                out.seen = -1
                return out
        return Tracer.buffer(self, np.asarray(op.impl(*values, **params)))

    def _derived(self, op_name: str, op, operands, values: list, params: dict, sources: frozenset) -> "Tracer":
        """An op of known buffers some of which are computed from captured arrays: NumPy's value,
        known while tracing, and the op recorded on the arrays as read on each call."""
        value = np.asarray(op.impl(*values, **params))
        try:
            out = self._recorded(op_name, op, operands, params)
        except MorphjitError:     # NumPy computes what the step cannot: the step holds for the contents
            self.contents_read.update(sources)
            return Tracer.buffer(self, value)
        out.storage = storage.Storage(self, out.operand, None, storage.layout_of(value), known=value, captured=sources)
        out.seen = -1
        return out

    @staticmethod
    def _fold(op_name: str, inputs: list[Lit], params: dict) -> Lit:
        args = [np.asarray(x.value, x.dtype) for x in inputs]
        value = np.asarray(OPS[op_name].impl(*args, **params))
        return Lit(value.item(), value.dtype)


def fortran_operands(operands, shape) -> bool:
    """Whether the operands of an element-wise op that have its result's shape are all F-ordered:
    NumPy's result is then F-ordered too (the broadcast ones do not decide)."""
    full = [x for x in operands if isinstance(x, (Tracer, np.ndarray)) and tuple(x.shape) == tuple(shape)]
    return len(shape) >= 2 and bool(full) and all(
        x.contiguous("F") if isinstance(x, Tracer) else storage.layout_of(x) == "F" for x in full)


def captured_sources(operands) -> frozenset[str]:
    """The captured arrays the known buffers among ``operands`` are computed from."""
    return frozenset().union(*(x.storage.captured for x in operands
                               if isinstance(x, Tracer) and x.storage.captured is not None))


def symbolic(params: dict) -> bool:
    """Whether an op's parameters hold a batch size (which NumPy cannot compute with)."""
    return any(isinstance(v, Sym) or isinstance(v, tuple) and any(isinstance(d, Sym) for d in v)
               for v in params.values())


def escaped_tracer_error() -> TracingError:
    return TracingError("a traced value escaped from an earlier trace (it was stored outside the "
                        "function, e.g. in a global or a closure, and used after tracing ended)",
                        user_location())


class Tracer:
    """A stand-in for an array while a function is traced: it carries shape and dtype only.

    What needs no array function is here; the operators, the methods, indexing and NumPy's
    protocols are the array layer's, installed on this class once (``morphjit.api.methods``).
    """

    __slots__ = ("trace", "_operand", "weak", "storage", "steps", "seen", "layout", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, trace: Trace, operand, weak: bool = False):
        self.trace = trace
        self._operand = operand
        self.weak = weak  # a Python scalar argument: promotes like one (NumPy's NEP 50)
        self.storage = None   # a view of an array (storage.Storage), or None: a value of its own
        self.steps, self.seen = (), 0
        self.layout = "C"     # its storage's when it gets one (`storage.Storage.layout`)

    @property
    def operand(self):
        """The IR value of the array as it is now (re-read where its storage was written since)."""
        s = self.storage
        if s is not None and self.seen != s.version:
            self._operand, self.seen = s.read(self.steps), s.version
        return self._operand

    @classmethod
    def buffer(cls, trace: Trace, array: np.ndarray, layout: str = "C", origin: str | None = None) -> "Tracer":
        """A buffer the traced function made with NumPy: ``array`` until a traced value is written into
        it (``origin``: what a write into it is refused as, for an array it did not make)."""
        x = cls(trace, None)
        x.storage, x.seen = storage.Storage(trace, None, origin, layout, known=array), -1
        return x

    @classmethod
    def captured(cls, trace: Trace, name: str, array: np.ndarray, source: "Tracer") -> "Tracer":
        """The array ``name`` the function captures: NumPy computes with ``array`` (its contents
        now), traced values read ``source`` (the input holding it on each call); not writable."""
        x = cls(trace, None)
        origin = f"the array {name}, which the function captures"
        x.storage = storage.Storage(trace, source.operand, origin, storage.layout_of(array), known=array,
                                    captured=frozenset({name}))
        x.seen = -1
        return x

    def own_storage(self, origin: str | None = None) -> "storage.Storage":
        """The storage this array views, made (with the array its whole view) where it has none."""
        if self.storage is None:
            self.storage = storage.Storage(self.trace, self._operand, origin, self.layout)
            self.steps, self.seen = (), 0
        return self.storage

    def concrete(self) -> np.ndarray | None:
        """The NumPy view this array is of a buffer that is still known (see `storage.Storage.known`)."""
        s = self.storage
        if s is None or s.known is None:
            return None
        if s.captured is not None:
            self.trace.contents_read.update(s.captured)
        return storage.concrete_view(s.known, self.steps)

    def recorded(self) -> "Tracer":
        """This array as a value whose ops are recorded: a known buffer's contents as a constant
        (NumPy computes the ops of a known buffer without recording them), a captured array as read
        on each call, else itself."""
        s = self.storage
        if s is None or s.known is None:
            return self
        if s.captured is not None:
            return Tracer(self.trace, s.read(self.steps))
        return Tracer(self.trace, self.trace.operand(np.array(self.concrete()), lift_literals=False))

    def contiguous(self, order: str = "C") -> bool:
        """Whether NumPy's array would be C- (or F-) contiguous, as far as morphjit follows layouts."""
        if self.storage is None:
            return self.layout == order or self.layout != "unknown" and self.ndim <= 1
        if self.storage.layout == "unknown":
            return False
        if not self.steps:
            return self.storage.layout == order or self.ndim <= 1
        return storage.contiguous(self.storage, self.steps, order)

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
            raise numpy_write_error() or TypeError("len() of a 0-d traced array")
        return self.shape[0]

    def __iter__(self):
        if not self.shape and self.dtype.kind in "iu":   # NumPy iterates over what it takes for a shape
            raise concrete_value_error("a shape, a length or a count", "shapes are static: use x.shape", self)
        if not self.shape:
            raise TypeError("iteration over a 0-d traced array")
        return self._rows()

    def _rows(self):
        # A generator: ``iter(x)`` (np.iterable asks) does not need a batch-dependent length.
        for i in range(len(self)):
            yield self[i]

    # Python asks for concrete values here; a tracer has none.
    def __bool__(self):
        if self.concrete() is not None:
            return bool(self.concrete())
        if self.trace.exploration is not None:
            return self.trace.exploration.decide(self)
        raise concrete_value_error("bool() or an `if`/`while` test", "use mj.where(cond, a, b) instead", self)

    def __float__(self):
        if self.concrete() is not None:
            return float(self.concrete())
        raise numpy_write_error() or concrete_value_error("float()", "keep the value as an array", self)

    def __int__(self):
        if self.concrete() is not None:
            return int(self.concrete())
        raise concrete_value_error("int()", "shapes are static: use x.shape", self)

    def __index__(self):
        if self.concrete() is not None:
            return self.concrete().__index__()
        raise concrete_value_error("an index", "shapes are static: use x.shape", self)

    def __hash__(self):
        return id(self)

    def to_device(self, device, /, *, stream=None):
        if device != self.device:
            raise ValueError(f"device {device!r}: traced arrays live on {self.device!r}")
        return self


def numpy_write_error() -> UnsupportedError | None:
    """The error of a line writing a traced value into a NumPy array (``a[i] = x``, which makes
    NumPy convert it), or None for other lines."""
    loc = user_location()
    if loc is None or not re.search(r"\]\s*[-+*/]?=(?!=)", loc.code or ""):
        return None
    return UnsupportedError("this line writes a traced value into a NumPy array, which cannot hold one (and a "
                            "compiled function never changes an array from outside it): make the array inside "
                            "the traced function (np.zeros(...), or a.copy() of a captured array a), and write "
                            "into that", loc)


# ---------------------------------------------------------------------------------------------
# Tracing a function

SUPPORTED_DTYPES = tuple(DTYPE_NAMES)


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
    if isinstance(leaf, Tracer) and leaf.concrete() is not None:
        leaf = np.array(leaf.concrete())     # a buffer an enclosing trace made, still NumPy's array
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
        x = Tracer(t, Var(TensorType((BATCH_SIZE,) + shape[1:] if batched else shape, leaf.dtype)))
        if isinstance(leaf, np.ndarray):
            x.layout = storage.layout_of(leaf)   # part of the call's signature (jit.callsite.leaf_signature)
            x.own_storage(f"argument {path}")
        return x
    raise TracingError(f"argument {path} is a {type(leaf).__name__}, which cannot be traced: pass NumPy "
                       f"arrays, Python scalars, or dicts, lists, tuples and objects of them", user_location())


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
