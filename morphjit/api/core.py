"""The array functions users call (``mj.exp``, ``mj.sum``, ...), with NumPy's semantics.

Each function normalises its arguments the way NumPy does (dtype promotion with Python scalars
as weak types, negative axes, ``keepdims``, 1-D matmul operands, ``-1`` in reshapes) and then
binds primitives of the op table. On traced values they record bindings; on concrete arrays they
compute eagerly with the same reference implementations, so ``mj.relu(a)`` also works outside a
traced function. Plain NumPy calls on tracers arrive here through the NumPy dispatch
(``dispatch``; `UFUNCS` and `FUNCTIONS` are this family's entries). Indexing (``x[key]``,
``mj.at``, ``take``) is built on these functions in ``indexing``; the other NumPy and SciPy
families in their own modules (see the README).

One module by design: it is the core the rest is written with (the functions the tracer's
operators, the other families and the op table's VJP and lowering rules call).
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from ..ir import (OPS, Lit, Sym, broadcast_shapes, dtype_name, empty_reduction_error, is_float, keepdims_shape,
                  slice_shape)
from ..tracing import SUPPORTED_DTYPES, Tracer, storage, tracer as trace
from ..util import DtypeError, LayoutError, ShapeError, TracingError, UnsupportedError, user_location

_WEAK_PROTOTYPES = {"b": False, "i": 0, "u": 0, "f": 0.0}
NOT_GIVEN = np._NoValue   # NumPy's default of the keywords its functions pass on only when given


def _value(x):
    """Check an argument and bring it to a tracer, a Python scalar or a NumPy array."""
    if isinstance(x, Tracer):
        return x
    if isinstance(x, trace.NotAnArray):
        raise UnsupportedError(f"an operand is {x.why}", user_location())
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return x
    if holds_tracers(x):
        return _stacked(x)
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        array = np.asarray(x)
        if array.dtype not in SUPPORTED_DTYPES:
            raise DtypeError(f"arrays of dtype {array.dtype} are not supported (float32, float64, "
                             f"int32, int64 and bool are)", user_location())
        return array
    raise TracingError(f"cannot use a {type(x).__name__} as an array", user_location())


def holds_tracers(obj) -> bool:
    """Whether ``obj`` is a traced array or a (nested) list or tuple holding one."""
    if isinstance(obj, Tracer):
        return True
    return isinstance(obj, (list, tuple)) and builtins.any(holds_tracers(x) for x in obj)


def _stacked(obj):
    """A nested list or tuple holding traced values as one array, as ``np.array`` makes it: Python
    scalars in it count as float64, int64 or bool (not weakly, as operands of a ufunc would)."""
    if isinstance(obj, Tracer):
        return Tracer(obj.trace, obj.operand) if obj.weak else obj
    if not holds_tracers(obj):
        return _as_array(obj)
    return stack([_stacked(x) for x in obj])


def _trace_of(values):
    for v in values:
        if isinstance(v, Tracer):
            return v.trace
    return None


def _apply(op_name: str, operands, **params):
    """Bind a primitive on traced operands, or evaluate it when all operands are concrete."""
    trace = _trace_of(operands)
    if trace is not None:
        return trace.bind(op_name, operands, **params)
    args = [np.asarray(x.value, x.dtype) if isinstance(x, Lit) else x for x in operands]
    return np.asarray(OPS[op_name].impl(*args, **params))


def _prototype(v):
    if isinstance(v, Tracer):
        return _WEAK_PROTOTYPES[v.dtype.kind] if v.weak else v.dtype
    return v.dtype if isinstance(v, np.ndarray) else v


def _result_dtype(values, floating: bool = False) -> np.dtype:
    """NumPy's result dtype of the operands (Python scalars and weak tracers weak); float64 where
    ``floating`` asks for a float and it is not one."""
    dtype = np.result_type(*(_prototype(v) for v in values))
    return np.dtype(np.float64) if floating and not is_float(dtype) else dtype


def _promote(values, floating: bool = False):
    """NumPy's result dtype of the operands, and the operands converted to it."""
    dtype = _result_dtype(values, floating)
    return dtype, [_convert(v, dtype) for v in values]


def _convert(v, dtype):
    if isinstance(v, Tracer):
        return v if v.dtype == dtype else _apply("cast", [v], dtype=dtype_name(dtype))
    if isinstance(v, np.ndarray):
        return v.astype(dtype, copy=False)
    return Lit(v, dtype)


def _dtype_of(x) -> np.dtype:
    x = _value(x)
    return np.result_type(_prototype(x)) if not isinstance(x, (Tracer, np.ndarray)) else x.dtype


def _shape_of(x) -> tuple[int, ...]:
    return x.type.shape if isinstance(x, (Tracer, Lit)) else tuple(np.shape(x))


def _literal(x) -> Lit | None:
    """The literal a value stands for, if it is one."""
    if isinstance(x, Tracer):
        x = x.operand
    return x if isinstance(x, Lit) else None


def _as_array(x):
    """An operand that must be an array (views, reductions): Python scalars become 0-d arrays."""
    x = _value(x)
    return x if isinstance(x, (Tracer, np.ndarray)) else np.asarray(x)


# ---------------------------------------------------------------------------------------------
# Element-wise functions


def _elementwise(op_name: str, floating: bool = False):
    def fn(*args):
        masked = next((a for a in args if isinstance(a, trace.NotAnArray)), None)
        if masked is not None:
            return masked.elementwise(fn, *args)
        _, operands = _promote([_value(a) for a in args], floating)
        return _apply(op_name, operands)
    fn.__name__ = op_name
    fn.__doc__ = f"Element-wise ``{op_name}`` with NumPy broadcasting and dtype promotion."
    return fn


def _logical(op_name: str):
    def fn(*args):
        return _apply(op_name, [_truth(a) for a in args])
    fn.__name__ = op_name
    return fn


def _truth(x):
    x = _value(x)
    if _dtype_of(x) == np.bool_:
        return x if isinstance(x, (Tracer, np.ndarray)) else Lit(x, np.bool_)
    return not_equal(x, 0)


add = _elementwise("add")
subtract = _elementwise("sub")
multiply = _elementwise("mul")
divide = _elementwise("div", floating=True)
_float_power = _elementwise("pow", floating=True)


def power(x1, x2):
    """``x1 ** x2``; integer powers (an integer result in NumPy) are not supported."""
    if np.result_type(*(_prototype(_value(v)) for v in (x1, x2))).kind in "biu":
        raise DtypeError("power: integer ** integer is not supported (NumPy would give an integer "
                         "array); make the base or the exponent a float", user_location())
    return _float_power(x1, x2)


maximum = _elementwise("maximum")
minimum = _elementwise("minimum")
negative = _elementwise("neg")
abs = _elementwise("abs")
sign = _elementwise("sign")
square = _elementwise("square")
exp = _elementwise("exp", floating=True)
log = _elementwise("log", floating=True)
log1p = _elementwise("log1p", floating=True)
sqrt = _elementwise("sqrt", floating=True)
sin = _elementwise("sin", floating=True)
cos = _elementwise("cos", floating=True)
tanh = _elementwise("tanh", floating=True)
sigmoid = _elementwise("sigmoid", floating=True)
relu = _elementwise("relu")
less = _elementwise("lt")
less_equal = _elementwise("le")
greater = _elementwise("gt")
greater_equal = _elementwise("ge")
equal = _elementwise("eq")
not_equal = _elementwise("ne")
logical_and = _logical("and")
logical_or = _logical("or")
logical_not = _logical("not")


def _boolean_only(name: str, logical):
    """``&``, ``|``, ``~`` (NumPy's bitwise ufuncs): logical on boolean masks, unsupported otherwise."""
    def fn(*args):
        for a in args:
            if _dtype_of(a) != np.bool_:
                raise UnsupportedError(f"np.{name} on {_dtype_of(a)} arrays is not supported (morphjit "
                                       f"has &, | and ~ for boolean masks only)", user_location())
        return logical(*args)
    fn.__name__ = name
    return fn


bitwise_and = _boolean_only("bitwise_and", logical_and)
bitwise_or = _boolean_only("bitwise_or", logical_or)
invert = _boolean_only("invert", logical_not)


def positive(x):
    return _value(x)


def where(condition, x=NOT_GIVEN, y=NOT_GIVEN, /):
    """Pick ``x`` where ``condition`` holds and ``y`` elsewhere (broadcasting all three)."""
    if x is NOT_GIVEN or y is NOT_GIVEN:
        if x is not y:
            raise ValueError("where: either both or neither of x and y should be given")
        raise UnsupportedError("np.where(condition) with one argument (the positions where it holds, as "
                               "np.nonzero) is not supported on traced arrays: their number depends on the "
                               "values; give x and y", user_location())
    cond = _truth(condition)
    dtype, (a, b) = _promote([_value(x), _value(y)])
    known = _literal(cond)
    if known is None:
        return _apply("where", [cond, a, b])
    chosen = a if known.value else b
    shape = broadcast_shapes("where", _shape_of(a), _shape_of(b))
    if _literal(chosen) is not None:
        return full(shape, _literal(chosen).value, dtype, like=_trace_of([a, b]))
    return broadcast_to(chosen, shape)


def clip(a, a_min=NOT_GIVEN, a_max=NOT_GIVEN, out=None, *, min=NOT_GIVEN, max=NOT_GIVEN, **kwargs):
    """Limit values to ``[a_min, a_max]`` (or NumPy 2's ``min``, ``max``); either bound may be None."""
    _no_out("clip", out)
    if kwargs:
        raise UnsupportedError(f"clip: the ufunc arguments {', '.join(f'{k}=' for k in kwargs)} are not supported "
                               f"on traced arrays", user_location())
    a_min, a_max = _bound("min", a_min, min), _bound("max", a_max, max)
    if a_min is None and a_max is None:
        raise ValueError("clip: give a_min, a_max or both")
    if a_min is None:
        return minimum(a, a_max)
    if a_max is None:
        return maximum(a, a_min)
    _, operands = _promote([_value(a), _value(a_min), _value(a_max)])
    return _apply("clip", operands)


def astype(x, dtype, casting="unsafe"):
    """``x`` as ``dtype``, refused as NumPy refuses a conversion ``casting`` does not allow."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise DtypeError(f"astype: dtype {dtype} is not supported", user_location())
    x = _as_array(x)
    _check_casting(x.dtype, dtype, casting)
    return x if x.dtype == dtype else _apply("cast", [x], dtype=dtype_name(dtype))


CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


def _check_casting(source, target, casting: str) -> None:
    """NumPy's errors for a ``casting=`` rule, or for one that does not let ``source`` become ``target``."""
    if casting not in CASTINGS:
        raise ValueError(f"casting must be one of 'no', 'equiv', 'safe', 'same_kind', or 'unsafe', got {casting!r}")
    if not np.can_cast(source, target, casting):
        raise TypeError(f"Cannot cast array data from {np.dtype(source)!r} to {np.dtype(target)!r} according to "
                        f"the rule {casting!r}")


def _bound(name: str, old, new):
    """A bound of ``clip`` given as ``a_min`` or ``min`` (``a_max`` or ``max``), None if neither."""
    if old is not NOT_GIVEN and new is not NOT_GIVEN:
        raise ValueError(f"clip: passed more than one argument for a_{name}/{name}")
    return None if old is NOT_GIVEN and new is NOT_GIVEN else new if old is NOT_GIVEN else old


# ---------------------------------------------------------------------------------------------
# Reductions


def normalize_axes(op: str, axis, ndim: int) -> tuple[int, ...]:
    """NumPy's ``axis`` argument (None, int or tuple, negatives allowed) as sorted axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    result = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"{op}: axis {a} is out of range for an array of {ndim} dimensions",
                             user_location())
        result.append(int(a) % ndim if ndim else 0)
    if len(set(result)) != len(result):
        raise ShapeError(f"{op}: repeated axis in {axis}", user_location())
    return tuple(sorted(result))


def _no_out(op: str, out):
    if out is not None:
        raise UnsupportedError(f"{op}: the out= argument is not supported on traced arrays",
                               user_location())


def _masked(op: str, a, mask, fill):
    """``a`` where a reduction's ``where=`` mask holds (it broadcasts to ``a``), ``fill`` elsewhere."""
    if mask is True:
        return a
    if broadcast_shapes(op, _shape_of(mask), a.shape) != a.shape:
        raise ShapeError(f"{op}: a where= mask of shape {_shape_of(mask)} does not broadcast to the reduced "
                         f"array's shape {a.shape}", user_location())
    return where(mask, a, fill)


def _with_initial(combine, result, initial):
    """A reduction's result combined with its ``initial=`` value, when one is given."""
    return result if initial is NOT_GIVEN else combine(result, initial)


def _reduce(op_name: str, x, axis, keepdims: bool, **params):
    x = _as_array(x)
    axes = normalize_axes(op_name, axis, x.ndim)
    result = _apply(op_name, [x], axes=axes, **params) if axes else x
    return reshape(result, keepdims_shape(x.shape, axes)) if keepdims else result


def _extremum(op_name: str, x, axis, keepdims: bool, empty: str | None = None):
    """``max`` or ``min``; ``empty`` names the user's function, whose error (NumPy's) a reduction
    over no element raises: when tracing, or when the step runs where the number of elements
    reduced depends on the batch size (see ``ir.rules.EMPTY_REDUCTION``)."""
    x = _as_array(x)
    count = math.prod(x.shape[a] for a in normalize_axes(op_name, axis, x.ndim))
    if empty and count == 0:
        raise ShapeError(empty_reduction_error(empty), user_location())
    return _reduce(op_name, x, axis, keepdims, **({"empty": empty} if empty and isinstance(count, Sym) else {}))


def sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=NOT_GIVEN, where=True):
    if isinstance(a, trace.NotAnArray):
        return a.sum(axis, dtype, out, keepdims, initial=initial, where=where)
    _no_out("sum", out)
    a = _as_array(a)
    if dtype is not None:
        a = astype(a, dtype)
    elif a.dtype.kind in "bi":
        a = astype(a, np.int64)
    return _with_initial(add, _reduce("sum", _masked("sum", a, where, 0), axis, keepdims), initial)


def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
    if isinstance(a, trace.NotAnArray):
        return a.mean(axis, dtype, out, keepdims, where=where)
    _no_out("mean", out)
    a = _as_array(a)
    return _average(astype(a, dtype or (a.dtype if is_float(a.dtype) else np.float64)), axis, keepdims, where)


def _average(a, axis, keepdims, mask, ddof=0):
    """The mean of the float array ``a`` over ``axis`` where ``mask`` holds (``ddof`` taken from
    the count: the divisor of ``var``)."""
    total = sum(a, axis, keepdims=keepdims, where=mask)
    if mask is True:
        return multiply(total, _reciprocal_count(a, normalize_axes("mean", axis, a.ndim), ddof))
    count = sum(astype(broadcast_to(mask, a.shape), a.dtype), axis, keepdims=keepdims)
    return divide(total, maximum(subtract(count, ddof), 0))


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=NOT_GIVEN,
        correction=NOT_GIVEN):
    _no_out("var", out)
    a = _as_array(a)
    a = astype(a, dtype or (a.dtype if is_float(a.dtype) else np.float64))
    centred = subtract(a, _average(a, axis, True, where) if mean is NOT_GIVEN else mean)
    return _average(square(centred), axis, keepdims, where, _ddof("var", ddof, correction))


def _ddof(op: str, ddof, correction):
    """``ddof``, or its array-API name ``correction`` (NumPy refuses both)."""
    if correction is NOT_GIVEN:
        return ddof
    if ddof != 0:
        raise ValueError(f"{op}: ddof and correction can't be provided simultaneously.")
    return correction


def _reciprocal_count(a, axes, ddof=0):
    """``1 / (number of elements reduced - ddof)``: a traced scalar when it depends on the batch size."""
    count = math.prod(a.shape[i] for i in axes)
    if isinstance(count, Sym) and not ddof:
        return divide(1.0, full((), count, a.dtype, like=_trace_of([a])))
    count = builtins.max(count - ddof, 0)
    return 1.0 / count if count else np.nan


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=NOT_GIVEN,
        correction=NOT_GIVEN):
    """``sqrt(var)``; over one element, ``|x - mean|`` scaled, the same values (0, or NaN where x is
    not finite or ``ddof`` leaves no degree of freedom) with the gradient 0 of a function that is 0
    everywhere, where the square root's at 0 would make it NaN."""
    a = _as_array(a)
    axes = normalize_axes("std", axis, a.ndim)
    if math.prod(a.shape[i] for i in axes) != 1 or where is not True or mean is not NOT_GIVEN:
        return sqrt(var(a, axis, dtype, out, ddof, keepdims, where=where, mean=mean, correction=correction))
    _no_out("std", out)
    a = astype(a, dtype or (a.dtype if is_float(a.dtype) else np.float64))
    centred = abs(subtract(a, _average(a, axis, True, True)))
    scale = math.sqrt(_reciprocal_count(a, axes, _ddof("std", ddof, correction)))
    return multiply(sum(centred, axis, keepdims=keepdims), scale)


def _masked_extremum(op_name: str, a, axis, keepdims, initial, mask, combine):
    """``max`` or ``min`` with NumPy's ``initial=`` (combined with the result: no element is then
    no error) and ``where=`` (which needs ``initial``)."""
    if mask is not True and initial is NOT_GIVEN:
        raise ValueError(f"{op_name}: reduction operation '{'maximum' if op_name == 'max' else 'minimum'}' does "
                         f"not have an identity, so to use a where mask one has to specify 'initial'")
    a = _masked(op_name, _as_array(a), mask, initial if mask is not True else 0)
    result = _extremum(op_name, a, axis, keepdims, empty=op_name if initial is NOT_GIVEN else None)
    return _with_initial(combine, result, initial)


def max(a, axis=None, out=None, keepdims=False, initial=NOT_GIVEN, where=True):
    _no_out("max", out)
    return _masked_extremum("max", a, axis, keepdims, initial, where, maximum)


def min(a, axis=None, out=None, keepdims=False, initial=NOT_GIVEN, where=True):
    _no_out("min", out)
    return _masked_extremum("min", a, axis, keepdims, initial, where, minimum)


# ---------------------------------------------------------------------------------------------
# Views


def reshape(a, shape, order="C", *, copy=None):
    """NumPy's reshape: a view where NumPy's is one (``copy=False`` refuses the others), in C
    or F order ('A': F for an F- and not C-contiguous array)."""
    if order not in ("C", "F", "A"):
        raise ValueError(f"reshape: order must be one of 'C', 'F', 'A' (got {order!r})")
    a = _as_array(a)
    shape = _resolve_shape(a.shape, shape)
    if order == "A":
        order = "F" if isinstance(a, Tracer) and a.contiguous("F") and not a.contiguous("C") else "C"
    if copy is True:
        a = _copy(a)
    if order == "F":
        out = transpose(reshape(transpose(a), tuple(reversed(shape))))
    else:
        out = a if shape == a.shape else _apply("reshape", [a], shape=shape)
    if copy is False and isinstance(a, Tracer) and out is not a and out.storage is None:
        raise ValueError("Unable to avoid creating a copy while reshaping.")
    return out


def extents(shape) -> tuple:
    """A shape argument as a tuple of extents (ints, or batch-dependent ``Sym``s)."""
    if isinstance(shape, (int, np.integer, Sym)):
        shape = (shape,)
    return tuple(d if isinstance(d, Sym) else int(d) for d in shape)


def _resolve_shape(old, new) -> tuple[int, ...]:
    new = extents(new)
    size = math.prod(old)
    if new.count(-1) > 1:
        raise ShapeError(f"reshape: can only specify one unknown dimension in {new}", user_location())
    if -1 in new:
        known = math.prod(d for d in new if d != -1)
        if known == 0 or not isinstance(size, Sym) and size % known:
            raise ShapeError(f"reshape: cannot reshape an array of shape {old} into shape {new}",
                             user_location())
        new = tuple(size // known if d == -1 else d for d in new)
    if math.prod(new) != size:
        raise ShapeError(f"reshape: cannot reshape an array of shape {old} into shape {new}", user_location())
    return new


def transpose(a, axes=None):
    a = _as_array(a)
    perm = tuple(reversed(range(a.ndim))) if axes is None else tuple(
        int(p) % a.ndim if -a.ndim <= p < a.ndim else p for p in axes)
    return a if perm == tuple(range(a.ndim)) else _apply("transpose", [a], perm=perm)


def swapaxes(a, axis1, axis2):
    a = _as_array(a)
    i, j = normalize_axes("swapaxes", axis1, a.ndim)[0], normalize_axes("swapaxes", axis2, a.ndim)[0]
    perm = list(range(a.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


def swap_last(a):
    """Swap the last two axes (the transpose matmul's rules need)."""
    return swapaxes(a, -1, -2)


def broadcast_to(array, shape, subok=False):
    shape = extents(shape)
    x = _value(array)
    if isinstance(x, Lit) or not isinstance(x, (Tracer, np.ndarray)):
        return full(shape, x.value if isinstance(x, Lit) else x, _dtype_of(x), like=_trace_of([array]))
    return x if x.shape == shape else _apply("broadcast_to", [x], shape=shape)


def expand_dims(a, axis):
    a = _as_array(a)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out_ndim = a.ndim + len(axes)
    new_axes = normalize_axes("expand_dims", axes, out_ndim)
    dims = iter(a.shape)
    return reshape(a, tuple(1 if i in new_axes else next(dims) for i in range(out_ndim)))


def squeeze(a, axis=None):
    a = _as_array(a)
    axes = tuple(i for i, d in enumerate(a.shape) if d == 1) if axis is None else \
        normalize_axes("squeeze", axis, a.ndim)
    for i in axes:
        if a.shape[i] != 1:
            raise ShapeError(f"squeeze: cannot squeeze axis {i} of size {a.shape[i]}", user_location())
    return reshape(a, tuple(d for i, d in enumerate(a.shape) if i not in axes))


def ravel(a, order="C"):
    """NumPy's ravel: the elements in row-major ('C') or column-major ('F') order, 'A' as 'F' for an
    F- and not C-contiguous array, 'K' in memory order; a view where the array is contiguous in
    that order, else a copy."""
    if order not in ("C", "F", "A", "K"):
        raise ValueError(f"ravel: order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
    a = _as_array(a)
    if not isinstance(a, Tracer):
        return np.ravel(a, order)
    if order in ("A", "K") and a.contiguous("F") and not a.contiguous("C"):
        order = "F"
    elif order == "K" and not a.contiguous("C"):
        a = transpose(a, memory_order(a))
        order = "C"
    elif order != "F":
        order = "C"
    flat = a if order == "C" else transpose(a)
    if not a.contiguous(order):
        flat = _copy(flat, "C")
    return reshape(flat, -1)


def memory_order(a) -> tuple[int, ...]:
    """The axes of ``a`` by decreasing stride magnitude (NumPy's order 'K'); refused where morphjit
    does not follow the layout NumPy gave the array."""
    layout = None if a.storage is None or a.storage.layout == "unknown" else \
        storage.proxy(a.storage.shape, a.steps, a.storage.layout)
    if layout is None:
        raise LayoutError("order='K' reads the memory order NumPy gave this array (computed from a transposed or "
                          "strided view), which morphjit does not follow: use order='C' or 'F', or "
                          "np.ascontiguousarray(...) first", user_location())
    strides = layout.strides
    return tuple(int(k) for k in np.argsort([-builtins.abs(s) for s in strides], kind="stable"))


def slice_array(a, starts, stops, steps):
    """Basic slicing with normalised (start, stop, step) per dimension."""
    a = _as_array(a)
    starts, stops, steps = tuple(starts), tuple(stops), tuple(steps)
    if slice_shape(starts, stops, steps) == a.shape and all(s == 1 for s in steps):
        return a
    return _apply("slice", [a], starts=starts, stops=stops, steps=steps)


def unslice(g, shape, starts, stops, steps):
    """The transpose of ``slice``: place ``g`` at the sliced positions of zeros of ``shape``."""
    g = _as_array(g)
    return _apply("unslice", [g], shape=tuple(shape), starts=tuple(starts), stops=tuple(stops),
                  steps=tuple(steps))


def update_slice(x, v, starts, stops, steps):
    """``x`` with the basic slice (normalised (start, stop, step) per dimension) replaced by ``v``
    (of the slice's shape and ``x``'s dtype): NumPy's ``x[box] = v`` as a new array."""
    return _apply("update_slice", [_as_array(x), _as_array(v)], starts=tuple(starts), stops=tuple(stops),
                  steps=tuple(steps))


def gather(x, index, axis: int = 0, names=None, slice_length=0, slice_nth=0):
    """``x`` read at the integer index arrays ``index`` along the axes from ``axis`` on (the
    arrays broadcast together): NumPy's ``x[(slice(None),) * axis + tuple(index)]``."""
    index = [_as_array(i) for i in index]
    return _apply("gather", [_as_array(x)] + index, axis=int(axis), names=names or _argument_names(index),
                  **_slice_length(slice_length, slice_nth))


def scatter(x, v, index, axis: int = 0, names=None):
    """``x`` with ``v`` (of the gathered shape, ``x``'s dtype) stored where ``gather(x, index, axis)``
    reads: NumPy's ``x[(slice(None),) * axis + index] = v`` as a new array (the last of repeated
    positions in C order wins)."""
    index = [_as_array(i) for i in index]
    return _apply("scatter", [_as_array(x), _as_array(v)] + index, axis=int(axis),
                  names=names or _argument_names(index))


def _copy(a, order="K"):
    """NumPy's copy of ``a``: an array of its own, which later writes into ``a`` do not reach."""
    a = _as_array(a)
    if not isinstance(a, Tracer):
        return np.array(a, copy=True, order=order)
    if a.concrete() is not None:
        copied = np.array(a.concrete(), copy=True, order=order)
        return Tracer.buffer(a.trace, copied, "F" if copied.flags.f_contiguous and not copied.flags.c_contiguous else "C")
    out = Tracer(a.trace, a.operand)
    kept = order in ("K", "A") and (a.contiguous("C") or a.contiguous("F"))
    out.layout = order if order in ("C", "F") else ("F" if kept and not a.contiguous("C") else "C" if kept else "unknown")
    out.own_storage()
    return out


copy = _copy   # (``reshape`` and ``ravel`` take a ``copy`` argument of NumPy's)


def scatter_add(g, index, shape, axis: int = 0, names=None, slice_length=0, slice_nth=0):
    """Zeros of ``shape`` with ``g`` added at the positions ``gather(., index, axis)`` reads;
    repeated positions accumulate."""
    index = [_as_array(i) for i in index]
    return _apply("scatter_add", [_as_array(g)] + index, shape=tuple(shape), axis=int(axis),
                  names=names or _argument_names(index), **_slice_length(slice_length, slice_nth))


def _slice_length(length: int, nth: int) -> dict:
    """The ``slice_length`` parameter of a gather reading a slice with traced bounds (none for
    others), and ``slice_nth`` where other such slices of that length were traced on its line first
    (`api.slices`)."""
    return {"slice_length": length, **({"slice_nth": nth} if nth else {})} if length else {}


def _argument_names(index) -> tuple[str, ...]:
    """The argument path of each index array that is an argument of the traced function."""
    return tuple(i.trace.paths.get(id(i.operand), "") if isinstance(i, Tracer) else "" for i in index)


# ---------------------------------------------------------------------------------------------
# Matmul and joining


def matmul(a, b):
    """NumPy's matmul: 1-D operands are promoted to matrices and the added axis removed."""
    _, (a, b) = _promote([_as_array(a), _as_array(b)], floating=True)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul: operands must not be scalars (use * to scale)", user_location())
    k_a, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
    if k_a != k_b:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} are not aligned: "
                         f"{k_a} (last axis of the left) != {k_b} (first contracted axis of the right)",
                         user_location())
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    out = _apply("matmul", [a2, b2])
    drop = ([-2] if a.ndim == 1 else []) + ([-1] if b.ndim == 1 else [])
    return squeeze(out, tuple(drop)) if drop else out


def dot(a, b, out=None):
    _no_out("dot", out)
    a, b = _as_array(a), _as_array(b)
    if a.ndim == 0 or b.ndim == 0:
        return multiply(a, b)
    if a.ndim > 2 or b.ndim > 2:
        raise UnsupportedError("dot of arrays with more than 2 dimensions is not supported; use matmul",
                               user_location())
    return matmul(a, b)


def concatenate(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _no_out("concatenate", out)
    arrays = _joined("concatenate", arrays, dtype, casting)
    if axis is None:
        arrays, axis = [ravel(x) for x in arrays], 0
    axis = normalize_axes("concatenate", axis, arrays[0].ndim)[0]
    return arrays[0] if len(arrays) == 1 else _apply("concatenate", arrays, axis=axis)


def _joined(op: str, arrays, dtype, casting: str) -> list:
    """The arrays a join takes, as ``dtype`` (NumPy's result dtype of them if None), each refused
    as NumPy refuses a conversion ``casting`` does not allow."""
    arrays = [_as_array(x) for x in arrays]
    if not arrays:
        raise ValueError(f"{op}: need at least one array to {op}")
    target = _result_dtype(arrays) if dtype is None else np.dtype(dtype)
    return [astype(x, target, casting) for x in arrays]


def stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _no_out("stack", out)
    arrays = _joined("stack", arrays, dtype, casting)
    if len({x.shape for x in arrays}) > 1:
        raise ShapeError(f"stack: all arrays must have the same shape, got "
                         f"{', '.join(str(x.shape) for x in arrays)}", user_location())
    axis = normalize_axes("stack", axis, arrays[0].ndim + 1)[0]
    return concatenate([expand_dims(x, axis) for x in arrays], axis)


# ---------------------------------------------------------------------------------------------
# Sources


def full(shape, fill_value, dtype=None, like=None):
    """An array of ``fill_value``; traced (inside ``like``'s trace) when ``like`` is a trace."""
    shape = extents(shape)
    dtype = np.dtype(dtype) if dtype is not None else np.result_type(fill_value)
    value = fill_value if isinstance(fill_value, Sym) else dtype.type(fill_value).item()
    params = dict(shape=shape, dtype=dtype_name(dtype), value=value)
    return like.bind("fill", (), **params) if like is not None else OPS["fill"].impl(**params)


def full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None):
    """An array of ``fill_value`` of ``a``'s shape (or ``shape``) and dtype (or ``dtype``); ``order``
    and ``subok`` change nothing on a traced array, which lives on the CPU."""
    if device not in (None, "cpu"):
        raise ValueError(f'full_like: device {device!r} not understood. Only "cpu" is allowed.')
    return full(_shape_of(a) if shape is None else shape, fill_value, dtype or _dtype_of(a), like=_trace_of([a]))


def zeros_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return full_like(a, 0, dtype, shape=shape, device=device)


def ones_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return full_like(a, 1, dtype, shape=shape, device=device)


def one_hot(labels, depth: int, dtype=np.float64):
    """``out[..., c] = (labels[...] == c)`` as an array of ``dtype``."""
    labels = _as_array(labels)
    return _apply("one_hot", [labels], depth=int(depth), dtype=dtype_name(np.dtype(dtype)))


# ---------------------------------------------------------------------------------------------
# Stable composites


def _float_array(op: str, x):
    x = _as_array(x)
    return x if is_float(x.dtype) else astype(x, np.float64)


def logsumexp(a, axis=None, keepdims=False):
    """``log(sum(exp(a), axis))`` computed without overflow."""
    a = _float_array("logsumexp", a)
    axes = normalize_axes("logsumexp", axis, a.ndim)
    out = _apply("logsumexp", [a], axes=axes)
    return reshape(out, keepdims_shape(a.shape, axes)) if keepdims else out


def softmax(x, axis=-1):
    x = _float_array("softmax", x)
    return _apply("softmax", [x], axes=normalize_axes("softmax", axis, x.ndim))


def log_softmax(x, axis=-1):
    x = _float_array("log_softmax", x)
    return _apply("log_softmax", [x], axes=normalize_axes("log_softmax", axis, x.ndim))


def softmax_cross_entropy(logits, labels):
    """Per-row ``-log softmax(logits)[label]`` over the last axis.

    ``labels`` are integer class indices of shape ``logits.shape[:-1]``, or (soft targets) a
    float array of the shape of ``logits`` whose rows are class probabilities.
    """
    logits, labels = _float_array("softmax_cross_entropy", logits), _as_array(labels)
    if is_float(labels.dtype) and labels.shape == logits.shape:
        return negative(sum(multiply(labels, log_softmax(logits, -1)), axis=-1))
    return _apply("softmax_cross_entropy", [logits, labels])


# ---------------------------------------------------------------------------------------------
# This family's entries of the NumPy dispatch (``dispatch``)

UFUNCS = {
    np.add: add, np.subtract: subtract, np.multiply: multiply, np.divide: divide,
    np.power: power, np.maximum: maximum, np.minimum: minimum, np.negative: negative,
    np.positive: positive, np.absolute: abs, np.sign: sign, np.square: square, np.exp: exp,
    np.log: log, np.log1p: log1p, np.sqrt: sqrt, np.sin: sin, np.cos: cos, np.tanh: tanh,
    np.less: less, np.less_equal: less_equal, np.greater: greater, np.greater_equal: greater_equal,
    np.equal: equal, np.not_equal: not_equal, np.logical_and: logical_and,
    np.logical_or: logical_or, np.logical_not: logical_not, np.matmul: matmul,
    np.bitwise_and: bitwise_and, np.bitwise_or: bitwise_or, np.invert: invert,
}

FUNCTIONS = {
    np.sum: sum, np.mean: mean, np.var: var, np.std: std, np.max: max, np.amax: max, np.min: min,
    np.amin: min, np.dot: dot, np.transpose: transpose, np.reshape: reshape, np.swapaxes: swapaxes,
    np.concatenate: concatenate, np.stack: stack, np.clip: clip, np.expand_dims: expand_dims,
    np.squeeze: squeeze, np.broadcast_to: broadcast_to, np.where: where, np.ravel: ravel,
    np.zeros_like: zeros_like, np.ones_like: ones_like, np.full_like: full_like,
}


# What the other families build their functions with.
bind = _apply
promote = _promote
result_dtype = _result_dtype
prototype = _prototype
as_value = _value
as_array = _as_array
trace_of = _trace_of
dtype_of = _dtype_of
shape_of = _shape_of
truth = _truth
no_out = _no_out
extremum = _extremum
masked = _masked
with_initial = _with_initial
elementwise_function = _elementwise
