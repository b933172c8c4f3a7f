"""NumPy's indexing on traced arrays: ``x[key]``, ``mj.at(x)[key].add/set`` and boolean masks.

Basic indexing (integers, slices, ``None``, ``...``) is a slice and a reshape, both views; integer
arrays are one gather (``core.gather``, the op records in ``morphjit.ops.gathers``); slices with traced
bounds are gathers at ``start + arange(extent)`` (``slices``). ``x[mask]`` is a ``Masked`` value that can only be
reduced. ``np.arange(n)`` of a batch-dependent ``n`` is an iota (the batch stays symbolic).
``getitem`` is the tracer's ``x[key]`` and `arange` replaces ``np.arange`` while a trace with a
symbolic batch size runs (``morphjit.api.methods`` installs both).
"""
from __future__ import annotations

import numpy as np

from ..ir import OPS, Specialize, Sym, dtype_name, is_float
from ..tracing import Tracer, tracer as trace
from ..util import DtypeError, IndexingError, ShapeError, UnsupportedError, user_location
from . import core as A
from .slices import is_dynamic_slice, slice_positions


def getitem(a, key):
    """NumPy indexing: integers, slices (with steps), ``None``, ``...``, integer arrays and ranges."""
    a = A.as_array(a)
    key = key if isinstance(key, tuple) else (key,)
    key = tuple(np.arange(k.start, k.stop, k.step) if isinstance(k, range) else k for k in key)
    for k in key:
        if not (k is None or k is Ellipsis or isinstance(k, (int, np.integer, slice))
                or is_index_array(k)):
            raise UnsupportedError(
                f"indexing with {type(k).__name__} is not supported (integers, slices, None, ... and "
                f"integer arrays are)", user_location())
    if len(key) == 1 and is_mask(key[0]) and A.trace_of([a, key[0]]) is not None:
        return Masked.select(a, key[0])
    if any(is_dynamic_slice(k) for k in key):
        a, key = _dynamic_slices(a, key)
    if any(is_index_array(k) for k in key):
        return _advanced_getitem(a, key)
    return basic_getitem(a, key)


class at:
    """Functional updates, for NumPy's in-place ``x[key] += v`` / ``np.add.at(x, key, v)`` /
    ``x[key] = v``, which cannot be traced (a traced array cannot change): ``mj.at(x)[key].add(v)``
    and ``mj.at(x)[key].set(v)`` return a new array, differentiable in ``x`` and ``v``.

    ``add`` accumulates at repeated positions (as ``np.add.at``); ``set`` stores their mean
    (NumPy keeps the last one written, an order a compiled loop should not depend on). With a
    boolean mask, ``set(v)`` is ``np.where(mask, v, x)`` (``v`` broadcasts against ``x``)."""

    def __init__(self, x):
        self.x = x

    def __getitem__(self, key):
        return _AtIndex(self.x, key)


class _AtIndex:
    def __init__(self, x, key):
        self.x, self.key = A.as_array(x), key if isinstance(key, tuple) else (key,)

    def add(self, v):
        return A.add(self.x, _placed(self.x, self.key, v))

    def set(self, v):
        if not is_float(self.x.dtype):
            raise DtypeError(f"mj.at(x)[...].set(v) needs a float array, got {self.x.dtype}", user_location())
        if len(self.key) == 1 and is_mask(self.key[0]):
            return A.where(Masked.select(self.x, self.key[0]).mask, v, self.x)
        placed = _placed(self.x, self.key, A.astype(A.as_array(v), self.x.dtype))
        count = _placed(self.x, self.key, A.ones_like(getitem(self.x, self.key)))
        return A.where(count > 0, placed / A.where(count > 0, count, 1.0), self.x)


def _placed(x, key, v):
    """Zeros of ``x``'s shape with ``v`` added where ``x[key]`` reads (repeated positions
    accumulate): the transpose of indexing, from the VJP rules of the ops indexing binds."""
    t = A.trace_of([x, v])
    if t is None:
        out = np.zeros(x.shape, np.result_type(x, v))
        np.add.at(out, key, v)
        return out
    x = x.recorded() if isinstance(x, Tracer) else Tracer(t, t.operand(x, lift_literals=False))
    start = len(t.bindings)
    picked = getitem(x, key)
    if isinstance(picked, Masked):
        return A.where(picked.mask, A.broadcast_to(v, x.shape), 0)
    new = t.bindings[start:]
    active = {id(x.operand)}
    for b in new:
        if any(id(i) in active for i in b.inputs):
            active.add(id(b.out))
    cotangents = {id(picked.operand): A.broadcast_to(A.astype(A.as_array(v), x.dtype), picked.shape)}
    for b in reversed(new):
        g = cotangents.pop(id(b.out), None)
        if g is None:
            continue
        grads = OPS[b.op].vjp(g, Tracer(t, b.out), *(Tracer(t, i) for i in b.inputs), **b.kwargs)
        for i, gi in zip(b.inputs, grads):
            if gi is not None and id(i) in active:
                cotangents[id(i)] = cotangents[id(i)] + gi if id(i) in cotangents else gi
    return cotangents.get(id(x.operand), A.zeros_like(x))


def _dynamic_slices(a, key):
    """Slices with traced bounds, each a gather along its axis at ``start + step * arange(n)``,
    ``n`` the length of ``range(0, stop - start, step)`` (the extent ``stop - start`` must not
    depend on the traced values); the key with them replaced by full slices. ``start`` and the
    positions' bound ``stop`` are NumPy's (``slice.indices``); a position at or past ``stop``,
    which NumPy's slice lacks, reads at the axis length, and the gather's range check refuses it."""
    key = expand_ellipsis(key, a.ndim)
    axis, rest = 0, []
    for k in key:
        if is_dynamic_slice(k):
            index, count, nth = slice_positions(k, a.shape[axis])
            a = A.gather(a, (index,), axis, slice_length=count, slice_nth=nth)
            k = slice(None)
        rest.append(k)
        axis += k is not None
    return a, tuple(rest)


def basic_getitem(a, key):
    starts, stops, steps, out_shape = basic_box(a.shape, key)
    picked = A.reshape(A.slice_array(a, starts, stops, steps), out_shape)
    if _is_scalar_key(key, a.ndim) and isinstance(picked, Tracer):
        return A.copy(picked)   # NumPy returns a scalar, a copy
    return picked


def basic_box(shape, key):
    """The box a basic key (integers, slices, None, ...) reads: per axis of ``shape`` its normalised
    (start, stop, step), and the shape of ``x[key]``."""
    key = expand_ellipsis(key, len(shape))
    starts, stops, steps, out_shape = [], [], [], []
    dim = 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        size = shape[dim]
        if isinstance(size, Sym) and k == slice(None):
            start, stop, step = 0, size, 1          # all of the batch; any other slice needs its size
            out_shape.append(size)
        elif isinstance(k, slice):
            start, stop, step = k.indices(size)
            out_shape.append(len(range(start, stop, step)))
        else:
            if not -size <= k < size:
                raise ShapeError(f"index {k} is out of bounds for axis {dim} with size {size}", user_location())
            start, stop, step = int(k) % size, int(k) % size + 1, 1
        starts.append(start)
        stops.append(stop)
        steps.append(step)
        dim += 1
    return starts, stops, steps, tuple(out_shape)


def _is_scalar_key(key, ndim: int) -> bool:
    """Whether ``x[key]`` is a NumPy scalar: integers only, one per axis."""
    return len(key) == ndim and all(isinstance(k, (int, np.integer)) for k in key)


def is_index_array(k) -> bool:
    return isinstance(k, (Tracer, np.ndarray, list))


def is_mask(k) -> bool:
    return is_index_array(k) and A.as_array(k).dtype == np.bool_


# NumPy's own functions, taken at import: while a trace runs, ``np.sum`` is its substitute (``dispatch.routes``).
MASK_REDUCTIONS = (np.sum, np.mean)
MASK_HINT = ("indexing with a boolean mask gives a shape that depends on the data, which a compiled step cannot have; "
             "it can only be reduced (x[mask].sum(), x[mask].mean(), np.sum(x[mask] ** 2)); "
             "write np.where(mask, x, 0) to keep the shape (and np.where(mask, v, x) for x[mask] = v)")


class Masked(trace.NotAnArray):
    """``x[mask]`` while tracing: the elements of ``values`` (x's shape) where ``mask`` holds.

    Element-wise functions apply to ``values`` (other elements hold 1, so no function of them
    gives a NaN that a gradient would carry); a reduction is a masked reduction of them. Anything
    that needs the data-dependent shape raises, showing the ``np.where`` spelling."""

    __array_priority__ = 2000
    why = f"x[mask]: {MASK_HINT}"

    def __init__(self, values, mask):
        self.values, self.mask, self.loc = values, mask, user_location()

    @staticmethod
    def select(x, mask) -> "Masked":
        x, mask = A.as_array(x), A.as_array(mask)
        if tuple(x.shape[:mask.ndim]) != tuple(mask.shape):
            raise IndexingError(f"a boolean mask{_argument(mask)} of shape {tuple(mask.shape)} does not match "
                                f"the indexed array of shape {tuple(x.shape)}", user_location())
        mask = A.broadcast_to(A.reshape(mask, tuple(mask.shape) + (1,) * (x.ndim - mask.ndim)), x.shape)
        return Masked(A.where(mask, x, 1), mask)

    def elementwise(self, fn, *args):
        operands = []
        for a in args:
            if isinstance(a, Masked):
                if not same_value(a.mask, self.mask):
                    raise UnsupportedError(f"elements picked by two different masks cannot be combined: {MASK_HINT}",
                                           user_location())
                a = a.values
            elif A.shape_of(a) != ():
                raise UnsupportedError(f"x[mask] combined with an array: {MASK_HINT}", user_location())
            operands.append(a)
        return Masked(fn(*operands), self.mask)

    def sum(self, axis=None, dtype=None, out=None, keepdims=False, initial=A.NOT_GIVEN, where=True):
        self._whole("sum", axis, out, keepdims, where)
        return A.sum(A.where(self.mask, self.values, 0), dtype=dtype, initial=initial)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
        self._whole("mean", axis, out, keepdims, where)
        total = self.sum(dtype=dtype)
        values = total if is_float(total.dtype) else A.astype(total, np.float64)
        return values / A.astype(A.sum(self.mask), values.dtype)

    def _whole(self, name, axis, out, keepdims, where) -> None:
        if axis is not None or out is not None or keepdims or where is not True:
            raise UnsupportedError(f"x[mask].{name}() reduces all elements (no axis, out, keepdims or where): "
                                   f"{MASK_HINT}", user_location())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self.elementwise(lambda *xs: getattr(ufunc, method)(*xs, **kwargs), *inputs)

    def __array_function__(self, func, types, args, kwargs):
        if func in MASK_REDUCTIONS:
            return getattr(args[0], func.__name__)(*args[1:], **kwargs)
        raise UnsupportedError(f"np.{func.__name__} of x[mask]: {MASK_HINT}", user_location())

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)   # NumPy's protocol probes
        raise UnsupportedError(f"x[mask].{name}: {MASK_HINT}", user_location())

    def __bool__(self):
        raise UnsupportedError(f"bool(x[mask]): {MASK_HINT}", user_location())

    def __len__(self):
        raise UnsupportedError(f"len(x[mask]): {MASK_HINT}", user_location())

    def __getitem__(self, key):
        raise UnsupportedError(f"indexing x[mask]: {MASK_HINT}", user_location())

    __add__ = lambda self, o: self.elementwise(A.add, self, o)
    __radd__ = lambda self, o: self.elementwise(A.add, o, self)
    __sub__ = lambda self, o: self.elementwise(A.subtract, self, o)
    __rsub__ = lambda self, o: self.elementwise(A.subtract, o, self)
    __mul__ = lambda self, o: self.elementwise(A.multiply, self, o)
    __rmul__ = lambda self, o: self.elementwise(A.multiply, o, self)
    __truediv__ = lambda self, o: self.elementwise(A.divide, self, o)
    __rtruediv__ = lambda self, o: self.elementwise(A.divide, o, self)
    __pow__ = lambda self, o: self.elementwise(A.power, self, o)
    __rpow__ = lambda self, o: self.elementwise(A.power, o, self)
    __neg__ = lambda self: self.elementwise(A.negative, self)
    __abs__ = lambda self: self.elementwise(A.abs, self)
    # x[mask] is a copy: ``x[mask] op= v`` changes the copy, which is then written back.
    __iadd__, __isub__, __imul__, __itruediv__, __ipow__ = __add__, __sub__, __mul__, __truediv__, __pow__


def same_value(a, b) -> bool:
    """Whether two masks are the same value: the same array, or computed alike from the same
    values (``x[~m] * y[~m]`` writes the mask twice)."""
    if a is b:
        return True
    if not (isinstance(a, Tracer) and isinstance(b, Tracer)) or a.trace is not b.trace:
        return False
    return a.trace.same_value(a.operand, b.operand)


def _advanced_getitem(a, key):
    """Integer-array indexing with NumPy's rules: integers count as index arrays, the index arrays
    broadcast together, and their dimensions replace the indexed axes where those are adjacent,
    else they come first. Slices and ``None`` are applied first (a view), then one gather."""
    key = tuple(np.asarray(k) if isinstance(k, (int, np.integer)) else k for k in key)
    key = expand_ellipsis(key, a.ndim)
    basic = tuple(slice(None) if is_index_array(k) else k for k in key)
    viewed = basic_getitem(a, basic)
    positions = [j for j, k in enumerate(key) if is_index_array(k)]
    index = tuple(index_array(key[j], viewed.shape[j]) for j in positions)
    if positions != list(range(positions[0], positions[0] + len(positions))):
        others = [j for j in range(viewed.ndim) if j not in positions]
        viewed, positions = A.transpose(viewed, tuple(positions + others)), list(range(len(positions)))
    result = A.gather(viewed, index, positions[0])
    if isinstance(result, Tracer) and result.storage is None:
        result.layout = _advanced_layout(viewed, positions, result.ndim - viewed.ndim + len(positions))
    return result


def _advanced_layout(viewed, positions: list[int], index_ndim: int) -> str:
    """The memory order of NumPy's integer-array indexing result, where morphjit can tell: NumPy
    lays out the index dimensions outermost, the others after them (in their source's order), then
    moves the index dimensions to where the indexed axes were: ``x[idx]`` of a C-ordered ``x`` is
    C-ordered, ``x[:, idx]`` of a matrix F-ordered; otherwise "unknown"."""
    rest = [d for j, d in enumerate(viewed.shape) if j not in positions]
    if positions[0] == 0 and (sum(d != 1 for d in rest) <= 1 or viewed.contiguous("C")):
        return "C"
    if positions[0] == 1 and len(rest) == 1 and index_ndim == 1:
        return "F"
    return "unknown"


def index_array(k, extent):
    """An index array (a tracer or a constant), checked now where its values are known."""
    k = A.as_array(k)
    if k.dtype == np.bool_:
        raise UnsupportedError(f"a boolean mask combined with other indices: {MASK_HINT}", user_location())
    if k.dtype.kind not in "iu":
        raise IndexingError(f"arrays used as indices must be integers, got {k.dtype}{_argument(k)}", user_location())
    if isinstance(k, np.ndarray) and not isinstance(extent, Sym) and k.size \
            and (k.min() < -extent or k.max() >= extent):
        bad = k[(k < -extent) | (k >= extent)].flat[0]
        raise IndexingError(f"index {bad} is out of bounds for an axis of size {extent}", user_location())
    return k


def _argument(k) -> str:
    """`` (argument path)`` for an index array that is an argument of the traced function, else ""."""
    path = k.trace.paths.get(id(k.operand)) if isinstance(k, Tracer) else None
    return f" (argument {path})" if path else ""


def iota(shape, axis: int, dtype, t):
    """The index along ``axis`` at every element of ``shape`` (whose extents may be symbolic):
    traced in ``t``, or a NumPy array where ``t`` is None."""
    dtype = np.dtype(dtype)
    if t is None:
        return OPS["iota"].impl(shape=tuple(shape), axis=axis, dtype=dtype_name(dtype))
    return t.bind("iota", (), shape=tuple(shape), axis=axis, dtype=dtype_name(dtype))


NUMPY_ARANGE = np.arange
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def arange(*args, **kwargs):
    """``np.arange`` while a trace with a symbolic batch size runs (see
    ``substitutes.SYMBOLIC_EXTENT``): ``np.arange(n)`` with ``n`` the batch size, or a multiple of
    it (``x.shape[0]``), is a traced iota of integers, so the step serves every batch size; a start
    or step with it needs the concrete size. Other calls are NumPy's."""
    if not any(isinstance(a, Sym) for a in (*args, *kwargs.values())):
        return NUMPY_ARANGE(*args, **kwargs)
    bound = dict(zip(("start", "stop", "step") if len(args) > 1 else ("stop",), args), **kwargs)
    dtype = np.dtype(bound.pop("dtype", None) or np.int64)
    stop, start, step = bound.pop("stop", None), bound.pop("start", 0), bound.pop("step", 1)
    if not isinstance(stop, Sym) or start != 0 or step != 1 or bound or dtype not in INDEX_DTYPES \
            or trace.current_trace() is None:
        raise Specialize(f"np.arange({', '.join(map(str, args))}) needs the concrete batch size")
    return iota((stop,), 0, dtype, trace.current_trace())


def expand_ellipsis(key, ndim: int):
    consumed = len([k for k in key if k is not None and k is not Ellipsis])
    if consumed > ndim:
        raise ShapeError(f"too many indices: the array has {ndim} dimensions, {consumed} were indexed",
                         user_location())
    ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
    if len(ellipses) > 1:
        raise ShapeError("an index can only have a single ellipsis ('...')", user_location())
    fill = (slice(None),) * (ndim - consumed)
    if ellipses:
        i = ellipses[0]
        return key[:i] + fill + key[i + 1:]
    return key + fill

