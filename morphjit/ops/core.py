"""The op table: every primitive declares, in one paragraph, its shape/dtype rule, its NumPy
reference implementation, its scalar code template (element-wise ops) and its VJP rule.

A VJP rule is ``vjp(g, ans, *inputs, **params)``: ``g`` is the cotangent of the output, ``ans``
the output and ``inputs`` the operands, all traced values, so a rule is written with the same
array functions a user writes. It returns one cotangent per input (``None`` where an input is
not differentiable). A cotangent may have the broadcast output's shape: the VJP driver sums it to
the input's shape, so rules never undo broadcasting themselves.

A scalar template ``scalar(K, *operands)`` renders the op on scalar operand expressions; ``K(c)``
renders the constant ``c`` in the op's dtype (so float32 loops stay float32). The record also
holds what fusion and selection need (recompute ``cost``, a view's ``index_map``, the ``body`` or
``nests`` rule of an op selected specially).

One module by design: the table is one paragraph per op with every rule of the op side by side,
so adding an op touches this module (and the array function that binds it) only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.special

from ..native import vecmath
from ..util.errors import DtypeError, ShapeError
from ..ir.index import IndexMap, broadcast_map, is_unit_reshape, slice_map, transpose_map, unit_reshape_map
from ..ir.program import DTYPES_BY_NAME, TYPE_RULES, Sym, TensorType, is_float
from ..ir.loop import Const, Nest, OneHot, Store, loop

ELEMENTWISE = "elementwise"   # scalar function applied over broadcast operands
REDUCE = "reduce"             # accumulates over `axes` (output drops them)
VIEW = "view"                 # an index function over one operand; owns no buffer
MATMUL = "matmul"             # batched GEMM
STRUCTURAL = "structural"     # moves data: concatenate, unslice
COMPOSITE = "composite"       # numerically stable row-wise ops (softmax family)
SOURCE = "source"             # creates data from parameters only
LINALG = "linalg"             # a LAPACK routine over the last axes, batched over the leading ones


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    infer: Callable[..., TensorType]
    impl: Callable[..., np.ndarray]
    vjp: Callable | None
    scalar: Callable[..., str] | None = None
    # Reductions: the accumulator's start value and its update, as a template.
    init: float | None = None
    combine: Callable[[str, str], str] | None = None
    # Composites: the same function in simpler ops (traced values in, traced value out), used
    # by the backends that compile loops; the reference executor runs `impl`.
    lower: Callable | None = None
    # Element-wise ops: what recomputing one element costs, in arithmetic ops (fusion recomputes
    # a cheap value in each of its consumers rather than storing it).
    cost: int = 1
    # Views: index_map(operand shape, output shape, **params) is the IndexMap by which the output
    # reads its operand.
    index_map: Callable[..., IndexMap] | None = None
    # Ops the loop backends select by a rule of their own: body(expr, b, imap) is the loop-body
    # expression of binding b at the loop point imap addresses (expr(v, imap) gives an operand's);
    # nests(expr, b) are the loop nests of a structural op.
    body: Callable | None = None
    nests: Callable[..., list] | None = None
    # Operands the op's loops read from buffers (never inlined): buffered(b, producer) lists
    # them for binding b (``producer`` maps value ids to the bindings computing them).
    buffered: Callable[..., list] | None = None
    # LAPACK ops: the core rank of each operand and then of the output (the leading axes batch).
    core: tuple[int, ...] | None = None
    # Exact comparisons (eq, ne): of two values, those computed by arithmetic are stored, never
    # recomputed. Fast-math lets LLVM round a recomputation differently in another loop, and the
    # gradient of a max or min finds the elements that attain it by comparing them with the
    # stored result. (A comparison with a constant is left alone: its ties are not by design.)
    exact: bool = False

    @property
    def differentiable(self) -> bool:
        return self.vjp is not None

    def start(self, dtype) -> float | int | bool:
        """A reduction's first accumulator value in ``dtype``: an infinite ``init`` (max, min) is
        the dtype's extreme value where it has no infinity (integers, booleans)."""
        dtype = np.dtype(dtype)
        if dtype.kind == "f" or np.isfinite(self.init):
            return self.init
        if dtype == np.bool_:
            return bool(self.init > 0)
        info = np.iinfo(dtype)
        return int(info.max) if self.init > 0 else int(info.min)


OPS: dict[str, Op] = {}


def defop(name: str, kind: str, infer, impl, vjp=None, **extra) -> Op:
    op = Op(name, kind, infer, impl, vjp, **extra)
    OPS[name] = op
    TYPE_RULES[name] = infer
    return op


A = None  # the traced array functions the VJP and lowering rules are written with


def use_array_functions(namespace) -> None:
    """Called by ``morphjit.array_api`` as it loads: the rules are written with the functions a
    user writes, and the array layer is built on this table, so it installs itself here rather
    than this table importing it."""
    global A
    A = namespace


# ---------------------------------------------------------------------------------------------
# Shape and dtype rules

def broadcast_shapes(op: str, *shapes) -> tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes]):
        sizes = set(d for d in dims if d != 1)
        if len(sizes) > 1:
            raise ShapeError(f"{op}: cannot broadcast shapes {' and '.join(str(tuple(s)) for s in shapes)}")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def same_dtype(op: str, types) -> np.dtype:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise DtypeError(f"{op}: operands must share one dtype, got {', '.join(sorted(map(str, dtypes)))}")
    return dtypes.pop()


def require_float(op: str, t: TensorType) -> None:
    if not is_float(t.dtype):
        raise DtypeError(f"{op}: expected a float32 or float64 operand, got {t.dtype}")


FLOAT, NUMERIC, ANY = "f", "fiu", "fiub"   # dtype kinds an element-wise op accepts
EXPENSIVE = 8   # the recompute cost of a transcendental function or a division


def elementwise_rule(name: str, kinds=FLOAT, out_dtype=None):
    def infer(types):
        dtype = same_dtype(name, types)
        if dtype.kind not in kinds:
            expected = {FLOAT: "float32 or float64", NUMERIC: "numeric (not boolean)"}.get(kinds, "any")
            raise DtypeError(f"{name}: expected {expected} operands, got {dtype}")
        return TensorType(broadcast_shapes(name, *(t.shape for t in types)), out_dtype or dtype)
    return infer


def check_axes(op: str, axes, ndim: int) -> tuple[int, ...]:
    for a in axes:
        if not 0 <= a < ndim:
            raise ShapeError(f"{op}: axis {a} is out of range for an array of {ndim} dimensions")
    return axes


def reduced_shape(shape, axes) -> tuple[int, ...]:
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def keepdims_shape(shape, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


# ---------------------------------------------------------------------------------------------
# Element-wise ops

def elementwise(name, impl, scalar, vjp, kinds=FLOAT, cost=1):
    return defop(name, ELEMENTWISE, elementwise_rule(name, kinds), impl, vjp, scalar=scalar, cost=cost)


def predicate(name, impl, scalar, exact=False):
    """A non-differentiable element-wise op giving a boolean mask."""
    return defop(name, ELEMENTWISE, elementwise_rule(name, ANY, np.dtype(np.bool_)), impl,
                 scalar=scalar, exact=exact)


elementwise("neg", np.negative, lambda K, x: f"(-{x})",
            lambda g, ans, x: (-g,), kinds=NUMERIC)
elementwise("exp", np.exp, lambda K, x: vecmath.call("exp", x),
            lambda g, ans, x: (g * ans,), cost=EXPENSIVE)
elementwise("log", np.log, lambda K, x: vecmath.call("log", x),
            lambda g, ans, x: (g / x,), cost=EXPENSIVE)
elementwise("log1p", np.log1p, lambda K, x: vecmath.call("log1p", x),
            lambda g, ans, x: (g / (x + 1.0),), cost=EXPENSIVE)
elementwise("sqrt", np.sqrt, lambda K, x: f"np.sqrt({x})",
            lambda g, ans, x: (g * 0.5 / ans,), cost=EXPENSIVE)
elementwise("abs", np.abs, lambda K, x: f"abs({x})",
            lambda g, ans, x: (g * A.sign(x),), kinds=NUMERIC)
elementwise("sign", np.sign, lambda K, x: f"({K(1)} if {x} > {K(0)} else ({K(-1)} if {x} < {K(0)} else {x}))",
            lambda g, ans, x: (None,), kinds=NUMERIC)
elementwise("sin", np.sin, lambda K, x: vecmath.call("sin", x),
            lambda g, ans, x: (g * A.cos(x),), cost=EXPENSIVE)
elementwise("cos", np.cos, lambda K, x: vecmath.call("cos", x),
            lambda g, ans, x: (-g * A.sin(x),), cost=EXPENSIVE)
# float32 tanh: x * P(x^2) / Q(x^2) evaluated in float64, +-1 beyond |x| >= 9 (where float32 tanh
# rounds to 1). Plain arithmetic, so loops over it vectorise, unlike the C library's tanhf; within
# 0.61 ulp of tanh (NumPy's float32 tanh: 1.36). Derived and checked by `python -m perf.fit_tanh`.
TANH_P = (0.9999999934607076, 0.13084061169730796, 0.003104012986314047, 1.1154894984862142e-05,
          -2.0227565497550033e-08, 5.279054178928119e-11, -8.491499938536964e-14)
TANH_Q = (1.0, 0.46417388296639756, 0.024495405217303746, 0.00025462274679121765)
TANH_LIMIT = 9.0


def _horner(coefficients, s: str) -> str:
    text = f"np.float64({coefficients[-1]!r})"
    for c in reversed(coefficients[:-1]):
        text = f"({text} * {s} + np.float64({c!r}))"
    return text


def _tanh_template(K, x: str) -> str:
    if K.dtype != np.float32:
        return vecmath.call("tanh", x)
    v = f"np.float64({x})"
    s = f"({v} * {v})"
    return (f"(np.float32(np.copysign(np.float64(1.0), {v})) if abs({v}) >= np.float64({TANH_LIMIT!r}) "
            f"else np.float32({v} * {_horner(TANH_P, s)} / {_horner(TANH_Q, s)}))")


elementwise("tanh", np.tanh, _tanh_template,
            lambda g, ans, x: (g * (1.0 - ans * ans),), cost=EXPENSIVE)
elementwise("sigmoid", scipy.special.expit,
      lambda K, x: f"({K(1)} / ({K(1)} + {vecmath.call('exp', f'-{x}')}))",
            lambda g, ans, x: (g * ans * (1.0 - ans),), cost=EXPENSIVE)
elementwise("relu", lambda x: np.where(x < 0, np.zeros_like(x), x),
      lambda K, x: f"({K(0)} if {x} < {K(0)} else {x})",
      # ans > 0 exactly where x > 0; reading ans lets x die inside the forward epilogue.
            lambda g, ans, x: (A.where(ans > 0, g, 0.0),))
elementwise("square", np.square, lambda K, x: f"({x} * {x})",
            lambda g, ans, x: (g * 2.0 * x,), kinds=NUMERIC)
defop("cast", ELEMENTWISE, lambda types, dtype: TensorType(types[0].shape, DTYPES_BY_NAME[dtype]),
      lambda x, dtype: x.astype(DTYPES_BY_NAME[dtype]),
            lambda g, ans, x, dtype: (A.astype(g, x.dtype) if is_float(x.dtype) else None,),
      scalar=lambda K, x, dtype: f"np.{DTYPES_BY_NAME[dtype].name}({x})")

elementwise("add", np.add, lambda K, a, b: f"({a} + {b})",
            lambda g, ans, a, b: (g, g), kinds=NUMERIC)
elementwise("sub", np.subtract, lambda K, a, b: f"({a} - {b})",
            lambda g, ans, a, b: (g, -g), kinds=NUMERIC)
elementwise("mul", np.multiply, lambda K, a, b: f"({a} * {b})",
            lambda g, ans, a, b: (g * b, g * a), kinds=NUMERIC)
elementwise("div", np.divide, lambda K, a, b: f"({a} / {b})",
            lambda g, ans, a, b: (g / b, -g * ans / b), cost=EXPENSIVE)
elementwise("pow", np.power, lambda K, a, b: vecmath.call("pow", a, b),
            lambda g, ans, a, b: (_pow_base_grad(g, a, b), g * ans * A.where(a == 0, 0.0, A.log(a))), cost=EXPENSIVE)
elementwise("maximum", np.maximum, lambda K, a, b: f"({a} if ({a} > {b} or {a} != {a}) else {b})",
            lambda g, ans, a, b: _tie_split(g, a > b, a == b), kinds=NUMERIC)
elementwise("minimum", np.minimum, lambda K, a, b: f"({a} if ({a} < {b} or {a} != {a}) else {b})",
            lambda g, ans, a, b: _tie_split(g, a < b, a == b), kinds=NUMERIC)


def _pow_base_grad(g, a, b):
    # d(a**b)/da = b * a**(b-1), taken as 0 where b == 0 (a**0 is constant even at a == 0).
    return A.where(b == 0, 0.0, g * b * a ** (b - 1.0))


def _tie_split(g, wins, ties):
    """maximum/minimum: the winner takes the gradient, ties split it evenly."""
    half = g * 0.5
    return A.where(wins, g, A.where(ties, half, 0.0)), A.where(wins | ties, A.where(ties, half, 0.0), g)


defop("where", ELEMENTWISE, lambda types: _where_rule(types), np.where,
            lambda g, ans, c, a, b: (None, A.where(c, g, 0.0), A.where(c, 0.0, g)),
      scalar=lambda K, c, a, b: f"({a} if {c} else {b})")


def _where_rule(types):
    cond, a, b = types
    if cond.dtype != np.bool_:
        raise DtypeError(f"where: the condition must be a boolean mask, got {cond.dtype}")
    dtype = same_dtype("where", (a, b))
    return TensorType(broadcast_shapes("where", cond.shape, a.shape, b.shape), dtype)


defop("clip", ELEMENTWISE, elementwise_rule("clip", NUMERIC), np.clip,
            lambda g, ans, x, lo, hi: (A.where((x >= lo) & (x <= hi), g, 0.0),
                                 A.where(x < lo, g, 0.0), A.where(x > hi, g, 0.0)),
      # NumPy's definition: NaN in any operand gives NaN, and hi wins where lo > hi.
      scalar=lambda K, x, lo, hi: f"np.minimum(np.maximum({x}, {lo}), {hi})")

predicate("lt", np.less, lambda K, a, b: f"({a} < {b})")
predicate("le", np.less_equal, lambda K, a, b: f"({a} <= {b})")
predicate("gt", np.greater, lambda K, a, b: f"({a} > {b})")
predicate("ge", np.greater_equal, lambda K, a, b: f"({a} >= {b})")
predicate("eq", np.equal, lambda K, a, b: f"({a} == {b})", exact=True)
predicate("ne", np.not_equal, lambda K, a, b: f"({a} != {b})", exact=True)
predicate("and", np.logical_and, lambda K, a, b: f"({a} and {b})")
predicate("or", np.logical_or, lambda K, a, b: f"({a} or {b})")
predicate("not", np.logical_not, lambda K, a: f"(not {a})")


# ---------------------------------------------------------------------------------------------
# Reductions (axes normalised and sorted; the output drops them)

def reduction_rule(name):
    def infer(types, axes, empty=None):
        (x,) = types
        check_axes(name, axes, x.ndim)
        return TensorType(reduced_shape(x.shape, axes), x.dtype)
    return infer


def expand_back(g, axes, shape):
    """Broadcast a reduced cotangent back over the reduced axes."""
    return A.broadcast_to(A.reshape(g, keepdims_shape(shape, axes)), shape)


def extremum_vjp(g, ans, x, axes, empty=None):
    """Gradient of max/min: shared equally among the elements that attain the extremum."""
    hit = A.astype(x == expand_back(ans, axes, x.shape), x.dtype)
    count = A.sum(hit, axis=axes, keepdims=True)
    return (expand_back(g, axes, x.shape) * hit / count,)


defop("sum", REDUCE, reduction_rule("sum"), lambda x, axes: np.sum(x, axis=axes, dtype=x.dtype),
            lambda g, ans, x, axes: (expand_back(g, axes, x.shape),),
      init=0.0, combine=lambda acc, x: f"{acc} + {x}")
# A max or min of no element has no value: NumPy raises. Where the user's function reduces over
# extents that depend on the batch size, ``empty`` names it, and the step raises its error (NumPy's,
# by ``EMPTY_REDUCTION``) when they are 0 (``plan.empty_reductions``); the reductions morphjit makes
# itself start from -inf/inf (the composites' stable shift: a logsumexp of nothing is -inf).
EMPTY_REDUCTION = {"max": "zero-size array to reduction operation maximum which has no identity",
                   "min": "zero-size array to reduction operation minimum which has no identity",
                   "ptp": "zero-size array to reduction operation maximum which has no identity",
                   "argmax": "attempt to get argmax of an empty sequence",
                   "argmin": "attempt to get argmin of an empty sequence"}


def empty_reduction_error(name: str) -> str:
    """The error of the function ``name`` (a key of ``EMPTY_REDUCTION``) reducing no element."""
    hint = ": give initial= for a value" if name in ("max", "min") else ""
    return f"{name}: {EMPTY_REDUCTION[name]}{hint}"


def _extremum_impl(name: str, reduce):
    """NumPy's ``reduce`` from the compiled loops' start value (an empty reduction's result)."""
    return lambda x, axes, empty=None: reduce(x, axis=axes, initial=OPS[name].start(x.dtype))


defop("max", REDUCE, reduction_rule("max"), _extremum_impl("max", np.max), extremum_vjp,
      init=-np.inf, combine=lambda acc, x: f"({x} if ({x} > {acc} or {x} != {x}) else {acc})")
defop("min", REDUCE, reduction_rule("min"), _extremum_impl("min", np.min), extremum_vjp,
      init=np.inf, combine=lambda acc, x: f"({x} if ({x} < {acc} or {x} != {x}) else {acc})")


# ---------------------------------------------------------------------------------------------
# Views: index functions over one operand

def _reshape_rule(types, shape):
    (x,) = types
    if math.prod(shape) != x.size:
        raise ShapeError(f"reshape: cannot reshape an array of shape {x.shape} into shape {tuple(shape)}")
    return TensorType(shape, x.dtype)


def _transpose_rule(types, perm):
    (x,) = types
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: axes {tuple(perm)} are not a permutation of {x.ndim} dimensions")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _broadcast_to_rule(types, shape):
    (x,) = types
    if broadcast_shapes("broadcast_to", x.shape, shape) != tuple(shape):
        raise ShapeError(f"broadcast_to: cannot broadcast shape {x.shape} to {tuple(shape)}")
    return TensorType(shape, x.dtype)


def slice_shape(starts, stops, steps) -> tuple[int, ...]:
    return tuple(b if a == 0 and s == 1 and isinstance(b, Sym) else len(range(a, b, s))  # all of a batch
                 for a, b, s in zip(starts, stops, steps))


def slice_index(starts, stops, steps) -> tuple[slice, ...]:
    return tuple(slice(a, b if b >= 0 else None, s) for a, b, s in zip(starts, stops, steps))


def _slice_rule(types, starts, stops, steps):
    (x,) = types
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: needs one (start, stop, step) per dimension of {x.shape}")
    return TensorType(slice_shape(starts, stops, steps), x.dtype)


def _reshape_map(x_shape, out_shape, shape) -> IndexMap:
    """Only a reshape that inserts or removes unit axes reads through an index map; others are
    aliases of their operand's buffer (see fusion)."""
    assert is_unit_reshape(x_shape, out_shape), "reshape: not an index map"
    return unit_reshape_map(x_shape, out_shape)


defop("reshape", VIEW, _reshape_rule, lambda x, shape: np.reshape(x, shape),
            lambda g, ans, x, shape: (A.reshape(g, x.shape),),
      index_map=_reshape_map)
defop("transpose", VIEW, _transpose_rule, lambda x, perm: np.transpose(x, perm),
            lambda g, ans, x, perm: (A.transpose(g, tuple(np.argsort(perm))),),
      index_map=lambda x_shape, out_shape, perm: transpose_map(perm))
defop("broadcast_to", VIEW, _broadcast_to_rule, lambda x, shape: np.broadcast_to(x, shape),
            lambda g, ans, x, shape: (g,),
      index_map=lambda x_shape, out_shape, shape: broadcast_map(x_shape, out_shape))
defop("slice", VIEW, _slice_rule, lambda x, starts, stops, steps: x[slice_index(starts, stops, steps)],
            lambda g, ans, x, starts, stops, steps: (A.unslice(g, x.shape, starts, stops, steps),),
      index_map=lambda x_shape, out_shape, starts, stops, steps: slice_map(starts, steps))


# ---------------------------------------------------------------------------------------------
# Structural ops: concatenate and the transpose of slicing

def _concatenate_rule(types, axis):
    first = types[0]
    dtype = same_dtype("concatenate", types)
    check_axes("concatenate", (axis,), first.ndim)
    for t in types[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise ShapeError(f"concatenate: shapes {first.shape} and {t.shape} differ off axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(shape, dtype)


def _concatenate_vjp(g, ans, *xs, axis):
    grads, start = [], 0
    for x in xs:
        starts = [0] * ans.ndim
        starts[axis] = start
        stops = list(ans.shape)
        stops[axis] = start + x.shape[axis]
        grads.append(A.slice_array(g, starts, stops, [1] * ans.ndim))
        start += x.shape[axis]
    return tuple(grads)


def _unslice_rule(types, shape, starts, stops, steps):
    (g,) = types
    if slice_shape(starts, stops, steps) != g.shape:
        raise ShapeError(f"unslice: slice of {tuple(shape)} does not have shape {g.shape}")
    return TensorType(shape, g.dtype)


def _unslice_impl(g, shape, starts, stops, steps):
    out = np.zeros(shape, g.dtype)
    out[slice_index(starts, stops, steps)] = g
    return out


def _concatenate_nests(expr, b) -> list:
    """One nest per operand, storing it at its offset along the axis."""
    axis, start, parts = b.kwargs["axis"], 0, []
    for x in b.inputs:
        offsets = tuple(start if k == axis else 0 for k in range(x.ndim))
        out_map = IndexMap(offsets, IndexMap.identity(x.ndim).coeffs)
        parts.append(Nest(x.shape, (Store(b.out, out_map, expr(x, IndexMap.identity(x.ndim))),)))
        start += x.shape[axis]
    return parts


def _unslice_nests(expr, b) -> list:
    """Zeros, then the slice scattered into them."""
    g, kw = b.inputs[0], b.kwargs
    scatter = Store(b.out, slice_map(kw["starts"], kw["steps"]), expr(g, IndexMap.identity(g.ndim)))
    return [loop(b.out, Const(0, b.out.dtype)), Nest(g.shape, (scatter,))]


defop("concatenate", STRUCTURAL, _concatenate_rule, lambda *xs, axis: np.concatenate(xs, axis),
      _concatenate_vjp, nests=_concatenate_nests)
defop("unslice", STRUCTURAL, _unslice_rule, _unslice_impl,
            lambda g, ans, x, shape, starts, stops, steps: (A.slice_array(g, starts, stops, steps),),
      nests=_unslice_nests)


# ---------------------------------------------------------------------------------------------
# Matmul: [..., m, k] @ [..., k, n] with broadcast batch dimensions

def _matmul_rule(types):
    a, b = types
    dtype = same_dtype("matmul", types)
    require_float("matmul", a)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} are not aligned")
    try:
        batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    except ShapeError:
        raise ShapeError(f"matmul: the batch dimensions of shapes {a.shape} and {b.shape} do not broadcast") from None
    return TensorType(batch + (a.shape[-2], b.shape[-1]), dtype)


defop("matmul", MATMUL, _matmul_rule, np.matmul,
            lambda g, ans, a, b: (g @ A.swap_last(b), A.swap_last(a) @ g))


# ---------------------------------------------------------------------------------------------
# Sources

def _fill_rule(types, shape, dtype, value):
    return TensorType(shape, DTYPES_BY_NAME[dtype])


def _one_hot_rule(types, depth, dtype):
    (labels,) = types
    if labels.dtype.kind not in "iu":
        raise DtypeError(f"one_hot: labels must be integers, got {labels.dtype}")
    return TensorType(labels.shape + (depth,), DTYPES_BY_NAME[dtype])


def _one_hot_body(expr, b, imap: IndexMap) -> OneHot:
    """The labels read at the leading loop indices, compared with the last one."""
    n = len(imap.offsets)
    rows = IndexMap(imap.offsets[:n - 1], imap.coeffs[:n - 1])
    klass = IndexMap(imap.offsets[n - 1:], imap.coeffs[n - 1:])
    return OneHot(expr(b.inputs[0], rows), klass, b.out.dtype)


defop("fill", SOURCE, _fill_rule, lambda shape, dtype, value: np.full(shape, value, DTYPES_BY_NAME[dtype]),
      body=lambda expr, b, imap: Const(b.kwargs["value"], b.out.dtype))
defop("one_hot", ELEMENTWISE, _one_hot_rule,
      lambda labels, depth, dtype: (labels[..., None] == np.arange(depth)).astype(DTYPES_BY_NAME[dtype]),
      body=_one_hot_body)


# ---------------------------------------------------------------------------------------------
# Composites: stable forward formulas and the textbook backward ones

def _row_rule(name, keep):
    def infer(types, axes):
        (x,) = types
        require_float(name, x)
        check_axes(name, axes, x.ndim)
        return TensorType(x.shape if keep else reduced_shape(x.shape, axes), x.dtype)
    return infer


def _stable_max(x, axes):
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    return np.where(np.isfinite(m), m, 0).astype(x.dtype)


def _logsumexp(x, axes, keepdims=False):
    m = _stable_max(x, axes)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axes)


def _softmax(x, axes):
    e = np.exp(x - _stable_max(x, axes))
    return e / np.sum(e, axis=axes, keepdims=True)


def _softmax_vjp(g, ans, x, axes):
    return (ans * (g - A.sum(g * ans, axis=axes, keepdims=True)),)


def _log_softmax_vjp(g, ans, x, axes):
    return (g - A.exp(ans) * A.sum(g, axis=axes, keepdims=True),)


def _sce_rule(types):
    logits, labels = types
    require_float("softmax_cross_entropy", logits)
    if labels.dtype.kind not in "iu":
        raise DtypeError(f"softmax_cross_entropy: labels must be integer class indices, got {labels.dtype}")
    if logits.ndim < 1 or labels.shape != logits.shape[:-1]:
        raise ShapeError(f"softmax_cross_entropy: labels of shape {labels.shape} do not index the rows "
                         f"of logits of shape {logits.shape} (expected labels of shape {logits.shape[:-1]})")
    return TensorType(labels.shape, logits.dtype)


def _sce_impl(logits, labels):
    classes = logits.shape[-1]
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"softmax_cross_entropy: labels must lie in [0, {classes}), "
                         f"got values from {labels.min()} to {labels.max()}")
    picked = np.take_along_axis(logits, labels[..., None].astype(np.intp), axis=-1)[..., 0]
    return _logsumexp(logits, (logits.ndim - 1,)) - picked


def _sce_vjp(g, ans, logits, labels):
    last = (logits.ndim - 1,)
    onehot = A.one_hot(labels, logits.shape[-1], logits.dtype)
    return A.expand_dims(g, -1) * (A.softmax(logits, axis=last) - onehot), None


def _finite_max(x, axes):
    """The shift that keeps exp from overflowing (0 where the maximum is infinite)."""
    m = A.extremum("max", x, axes, keepdims=True)
    return A.where(A.abs(m) != np.inf, m, 0.0)


def _logsumexp_keepdims(x, axes):
    m = _finite_max(x, axes)
    return A.log(A.sum(A.exp(x - m), axis=axes, keepdims=True)) + m


def _softmax_lower(x, axes):
    e = A.exp(x - _finite_max(x, axes))
    return e / A.sum(e, axis=axes, keepdims=True)


def _sce_lower(logits, labels):
    last = (logits.ndim - 1,)
    picked = A.sum(A.where(A.one_hot(labels, logits.shape[-1], np.bool_), logits, 0.0), axis=last)
    return A.squeeze(_logsumexp_keepdims(logits, last), last) - picked


defop("logsumexp", COMPOSITE, _row_rule("logsumexp", keep=False), _logsumexp,
            lambda g, ans, x, axes: (expand_back(g, axes, x.shape) * A.exp(x - expand_back(ans, axes, x.shape)),),
      lower=lambda x, axes: A.squeeze(_logsumexp_keepdims(x, axes), axes))
defop("softmax", COMPOSITE, _row_rule("softmax", keep=True), _softmax, _softmax_vjp, lower=_softmax_lower)
defop("log_softmax", COMPOSITE, _row_rule("log_softmax", keep=True),
      lambda x, axes: x - _logsumexp(x, axes, keepdims=True), _log_softmax_vjp,
      lower=lambda x, axes: x - _logsumexp_keepdims(x, axes))
defop("softmax_cross_entropy", COMPOSITE, _sce_rule, _sce_impl, _sce_vjp, lower=_sce_lower)
