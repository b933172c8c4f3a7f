"""The gradient cases of every differentiable op (``CASES``, keyed by the primitive each tests):
a function of float inputs written once for mj and for autograd.numpy, the shapes and domain of
its inputs and the tolerances. ``tests/ops/test_grad.py`` checks each; ``tests/jit/test_second.py``
checks their Hessian-vector products."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import morphjit as mj
from morphjit.api import bind as apply, core as A, draw_checks as checks

from support.gradcheck import AG, AG_SCIPY_LINALG


@dataclass
class Case:
    op: str                       # the primitive under test
    fn: Callable                  # fn(ns, *xs): written once, for mj and for autograd.numpy
    shapes: tuple                 # shapes of the differentiated (float64) inputs
    id: str
    domain: str = "any"           # "any": normal; "pos": in [0.5, 2]
    dtype: object = np.float64    # dtype of the differentiated inputs
    eps: float = 1e-5
    rtol: float = 1e-6            # finite differences
    ag_rtol: float = 1e-9         # autograd
    inputs: Callable | None = None  # rng -> list of inputs, overriding shapes/domain
    fd: bool = True               # False where the gradient is not the forward's (stop_gradient)


def inputs_of(case: Case, rng):
    if case.inputs is not None:
        return [np.asarray(x) for x in case.inputs(rng)]
    if case.domain == "pos":
        return [rng.uniform(0.5, 2.0, s).astype(case.dtype) for s in case.shapes]
    return [rng.standard_normal(s).astype(case.dtype) for s in case.shapes]


BCAST = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((1, 3), (2, 1)), ((), (2, 3)),
         ((4,), (2, 3, 4)), ((2, 1, 4), ())]
AXES = [None, 0, 1, 2, -1, (0, 2), (1, 2)]
LABELS = {(5,): np.array([0, 3, 1, 1, 2]), (2, 3): np.array([[0, 1, 3], [3, 3, 0]]), (): np.array(2)}


def _labels(shape):
    return LABELS[shape]


CASES: list[Case] = []


def case(op, fn, shapes, id, **kw):
    CASES.append(Case(op, fn, tuple(shapes), f"{op}-{id}", **kw))


# Element-wise unary ops, at several ranks.
for _shape in [(), (3,), (2, 3, 4)]:
    _s = "x".join(map(str, _shape)) or "scalar"
    case("neg", lambda ns, x: -x, [_shape], _s)
    case("exp", lambda ns, x: ns.exp(x), [_shape], _s)
    case("log", lambda ns, x: ns.log(x), [_shape], _s, domain="pos")
    case("log1p", lambda ns, x: ns.log1p(x), [_shape], _s, domain="pos")
    case("sqrt", lambda ns, x: ns.sqrt(x), [_shape], _s, domain="pos")
    case("abs", lambda ns, x: ns.abs(x), [_shape], _s)
    case("sign", lambda ns, x: ns.sign(x), [_shape], _s)
    case("sign", lambda ns, x: ns.sign(x) * x, [_shape], _s + "-times-x")
    case("sin", lambda ns, x: ns.sin(x), [_shape], _s)
    case("cos", lambda ns, x: ns.cos(x), [_shape], _s)
    case("tanh", lambda ns, x: ns.tanh(x), [_shape], _s)
    case("sigmoid", lambda ns, x: ns.sigmoid(x), [_shape], _s)
    case("relu", lambda ns, x: ns.relu(x), [_shape], _s)
    case("square", lambda ns, x: ns.square(x), [_shape], _s)

# NumPy's wider element-wise surface (morphjit/numpy_ext.py).
def _uniform(lo, hi, *shapes):
    return lambda rng: [rng.uniform(lo, hi, s) for s in shapes]


for _shape in [(), (2, 3)]:
    _s = "x".join(map(str, _shape)) or "scalar"
    for _name in ["expm1", "exp2", "sinh", "cosh", "arctan", "arcsinh", "cbrt", "fabs", "rint", "floor", "ceil",
                  "trunc"]:
        case(_name, lambda ns, x, f=_name: getattr(ns, f)(x), [_shape], _s)
    for _name in ["log2", "log10"]:
        case(_name, lambda ns, x, f=_name: getattr(ns, f)(x), [_shape], _s, domain="pos")
    for _name in ["tan", "arcsin", "arccos", "arctanh"]:
        case(_name, lambda ns, x, f=_name: getattr(ns, f)(x), [_shape], _s, inputs=_uniform(-0.9, 0.9, _shape))
    case("arccosh", lambda ns, x: ns.arccosh(x + 1.0), [_shape], _s, domain="pos")
for _a, _b in BCAST[:4]:
    _s = f"{_a}-{_b}".replace(" ", "")
    for _name in ["hypot", "arctan2", "logaddexp", "logaddexp2", "copysign", "heaviside"]:
        case(_name, lambda ns, a, b, f=_name: getattr(ns, f)(a, b), [_a, _b], _s)
    for _name in ["remainder", "fmod", "floor_divide"]:
        case(_name, lambda ns, a, b, f=_name: getattr(ns, f)(a, b), [_a, _b], _s, inputs=_uniform(0.5, 3.0, _a, _b))
    case("remainder", lambda ns, a, b: a % b - b % 0.3, [_a, _b], _s + "-operator", inputs=_uniform(0.5, 3.0, _a, _b))
    case("fmod", lambda ns, a, b: ns.fmod(a, b), [_a, _b], _s + "-signs",
         inputs=lambda rng, a=_a, b=_b: [rng.uniform(-3, 3, a), rng.choice([-1, 1], b) * rng.uniform(0.5, 3, b)])
    case("pow", lambda ns, a, b: ns.float_power(a, b), [_a, _b], _s + "-float_power", domain="pos")
case("floor_divide", lambda ns, a, b: a // b + divmod(a, b)[1] if ns is mj else ns.floor_divide(a, b) + ns.remainder(a, b),
     [(2, 3), (3,)], "operators",
     inputs=_uniform(0.5, 3.0, (2, 3), (3,)))
case("mul", lambda ns, x: ns.deg2rad(x) * ns.rad2deg(x), [(2, 3)], "deg2rad-rad2deg")
case("sin", lambda ns, x: ns.sinc(x), [(2, 3)], "sinc")
case("div", lambda ns, x: ns.reciprocal(x), [(2, 3)], "reciprocal", domain="pos")
case("rint", lambda ns, x: ns.round(x, 1) * x, [(2, 3)], "round-decimals")
case("where", lambda ns, x: ns.nan_to_num(ns.log(x)) * x, [(2, 3)], "nan_to_num")

# SciPy's special functions (morphjit/special.py).
for _shape in [(), (2, 3)]:
    _s = "x".join(map(str, _shape)) or "scalar"
    for _op, _name in [("erf", "erf"), ("erfc", "erfc"), ("log1p", "log_expit"), ("log1p", "softplus"),
                       ("erfc", "ndtr"), ("erfc", "log_ndtr"), ("sigmoid", "expit")]:
        case(_op, lambda ns, x, f=_name: getattr(ns, f)(x), [_shape], f"{_name}-{_s}")
    for _op, _name in [("gammaln", "gammaln"), ("digamma", "digamma")]:
        case(_op, lambda ns, x, f=_name: getattr(ns, f)(x), [_shape], f"{_name}-{_s}", domain="pos", ag_rtol=1e-7)
        case(_op, lambda ns, x, f=_name: getattr(ns, f)(-x - 0.5), [_shape], f"{_name}-negative-{_s}",
             inputs=_uniform(0.1, 0.4, _shape), ag_rtol=1e-7)
    for _op, _name in [("erfinv", "erfinv"), ("log", "logit"), ("entr", "entr")]:
        case(_op, lambda ns, x, f=_name: getattr(ns, f)(x), [_shape], f"{_name}-{_s}", inputs=_uniform(0.05, 0.95, _shape))
    case("erfinv", lambda ns, x: ns.erfinv(x), [_shape], f"erfinv-tails-{_s}", inputs=_uniform(-0.999, 0.999, _shape),
         ag_rtol=1e-7)
    for _op, _name in [("xlogy", "xlogy"), ("xlog1py", "xlog1py")]:
        case(_op, lambda ns, x, y, f=_name: getattr(ns, f)(x, y), [_shape, _shape], f"{_name}-{_s}", domain="pos")
case("erfc", lambda ns, x: ns.log_ndtr(x * 30.0), [(2, 3)], "log_ndtr-tails", inputs=_uniform(-1.0, 0.2, (2, 3)),
     ag_rtol=1e-5)


# SciPy's kernels (morphjit/native/special.py), in x; orders and shapes constant.
for _shape in [(), (2, 3)]:
    _s = "x".join(map(str, _shape)) or "scalar"
    for _name in ["gamma", "i0", "i1", "j0", "j1", "y0", "y1"]:
        case(_name, lambda ns, x, f=_name: getattr(ns, f)(x), [_shape], f"{_name}-{_s}", domain="pos")
    for _name in ["gamma", "i0", "i1", "j0", "j1"]:
        case(_name, lambda ns, x, f=_name: getattr(ns, f)(-x - 0.25), [_shape], f"{_name}-negative-{_s}",
             inputs=_uniform(0.1, 0.6, _shape))
    for _name in ["beta", "betaln"]:
        case(_name, lambda ns, a, b, f=_name: getattr(ns, f)(a, b), [_shape, _shape], f"{_name}-{_s}", domain="pos")
    case("betainc", lambda ns, x: ns.betainc(2.5, 1.5, x), [_shape], f"betainc-{_s}", inputs=_uniform(0.05, 0.95, _shape))
    case("betaincc", lambda ns, x: ns.betaincc(2.5, 1.5, x), [_shape], f"betaincc-{_s}",
         inputs=_uniform(0.05, 0.95, _shape))
    case("stdtr", lambda ns, x: ns.stdtr(3.5, x * 3.0), [_shape], f"stdtr-{_s}")
    for _name in ["gammainc", "gammaincc"]:
        case(_name, lambda ns, x, f=_name: getattr(ns, f)(1.75, x), [_shape], f"{_name}-{_s}", domain="pos")
    case("iv", lambda ns, x: ns.iv(1.5, x) + ns.iv(-0.5, x), [_shape], f"iv-{_s}", domain="pos")
    case("kv", lambda ns, x: ns.kv(1.5, x) + ns.kv(0.25, x), [_shape], f"kv-{_s}", domain="pos", ag_rtol=1e-7)
    for _n in (1, 2, 3):
        case("polygamma", lambda ns, x, n=_n: ns.polygamma(n, x), [_shape], f"polygamma-{_n}-{_s}", domain="pos")

# Reductions and scans (morphjit/numpy_reduce.py).
for _axis in [None, 0, -1, (0, 2)]:
    _s = f"axis={_axis}".replace(" ", "")
    case("prod", lambda ns, x, axis=_axis: ns.prod(x, axis=axis), [(2, 3, 4)], _s, inputs=_uniform(0.5, 1.5, (2, 3, 4)))
    case("max", lambda ns, x, axis=_axis: ns.ptp(x, axis=axis), [(2, 3, 4)], "ptp-" + _s)
    case("sum", lambda ns, x, axis=_axis: ns.nansum(x, axis=axis), [(2, 3, 4)], "nansum-" + _s)
    case("div", lambda ns, x, axis=_axis: ns.nanmean(x, axis=axis), [(2, 3, 4)], "nanmean-" + _s)
for _axis in [0, 1, -1]:
    case("concatenate", lambda ns, x, axis=_axis: ns.cumsum(x, axis=axis), [(3, 5, 2)], f"cumsum-axis={_axis}")
    case("concatenate", lambda ns, x, axis=_axis: ns.cumprod(x, axis=axis), [(3, 5, 2)], f"cumprod-axis={_axis}")
    case("sum", lambda ns, x, w, axis=_axis: ns.average(x, axis=axis, weights=w), [(3, 3, 3), (3,)],
         f"average-weights-axis={_axis}", inputs=lambda rng: [rng.standard_normal((3, 3, 3)), rng.uniform(0.5, 2, 3)])
case("concatenate", lambda ns, x: ns.cumsum(x), [(2, 3)], "cumsum-flat")
for _ord in [None, 1, 2, np.inf, 3]:
    case("sum", lambda ns, x, ord=_ord: ns.linalg.norm(x, ord, axis=-1) if ns is AG else ns.norm(x, ord, axis=-1),
         [(3, 4)], f"norm-vector-ord={_ord}")
for _ord in ["fro", 1, np.inf]:
    case("sum", lambda ns, x, ord=_ord: ns.linalg.norm(x, ord) if ns is AG else ns.norm(x, ord),
         [(3, 4)], f"norm-matrix-ord={_ord}")

# Contractions (morphjit/einsum.py): einsum on autograd's einsum, the rest on autograd's functions.
for _k, _sub, _shapes in [(0, "ij,jk->ik", [(3, 4), (4, 5)]), (1, "bij,jk->bki", [(2, 3, 4), (4, 5)]),
                          (2, "ii->i", [(4, 4)]), (3, "ii", [(3, 3)]), (4, "...j,jk->...k", [(2, 3, 4), (4, 5)]),
                          (5, "ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]), (6, "iij->j", [(3, 3, 2)]),
                          (7, "bij,bij->b", [(2, 3, 4), (2, 3, 4)]), (8, "i,j->ij", [(3,), (4,)]),
                          (9, "ii,ij->j", [(3, 3), (3, 2)])]:
    case("matmul" if "," in _sub else "diagonal", lambda ns, *xs, s=_sub: ns.einsum(s, *xs), _shapes, f"einsum-{_k}")
case("diagonal", lambda ns, x: ns.diagonal(x, 1, 2, 0), [(3, 2, 4)], "diagonal-offset")
case("diagonal", lambda ns, x: ns.diagonal(x, -1), [(4, 3)], "diagonal-negative-offset")
case("diagonal", lambda ns, x: (np.trace if ns is mj else ns.trace)(x, 1, 1, 2), [(2, 3, 4)], "trace")
case("diagonal", lambda ns, x: ns.diag(x, 1), [(3, 4)], "diag-matrix")
case("matmul", lambda ns, v: ns.diag(v, -1), [(3,)], "diag-vector")
case("matmul", lambda ns, a, b: ns.tensordot(a, b, ([1, 2], [0, 1])), [(2, 3, 4), (3, 4, 2)], "tensordot")
case("matmul", lambda ns, a, b: ns.inner(a, b), [(2, 4), (3, 4)], "inner")
case("mul", lambda ns, a, b: ns.outer(a, b), [(3,), (2, 2)], "outer")
case("mul", lambda ns, a, b: ns.vdot(a, b), [(2, 3), (6,)], "vdot")
case("mul", lambda ns, a, b: ns.kron(a, b), [(2, 3), (3, 2)], "kron")
case("where", lambda ns, a: ns.tril(a, -1) + ns.triu(a, 1) * 2.0, [(4, 3)], "tril-triu")

# Shapes (morphjit/numpy_shape.py).
case("concatenate", lambda ns, a, b: ns.vstack([a, b]), [(3, 4), (4,)], "vstack")
case("concatenate", lambda ns, a: ns.hstack([a, a * 2.0]), [(3, 4)], "hstack")
case("concatenate", lambda ns, a: ns.dstack([a, a * 2.0]), [(3, 4)], "dstack")
case("concatenate", lambda ns, v, a: ns.column_stack([v, a]), [(3,), (3, 2)], "column_stack")
case("slice", lambda ns, c: ns.split(c, 2, axis=-1)[1] * ns.array_split(c, 3, axis=-1)[0], [(2, 3, 4)], "split")
case("transpose", lambda ns, c: ns.moveaxis(c, 0, -1), [(2, 3, 4)], "moveaxis")
case("slice", lambda ns, c: ns.flip(c, 1) * ns.fliplr(c[0]) + ns.flipud(c[1]), [(2, 3, 3)], "flip")
case("concatenate", lambda ns, c: ns.roll(c, (1, -2), axis=(0, 2)), [(2, 3, 4)], "roll")
case("broadcast_to", lambda ns, a: ns.tile(a, (2, 1, 3)), [(3, 4)], "tile")
case("broadcast_to", lambda ns, a: ns.repeat(a, 2, axis=1), [(3, 4)], "repeat")
case("concatenate", lambda ns, v: ns.repeat(v, [1, 0, 2, 3]), [(4,)], "repeat-counts")
case("concatenate", lambda ns, a: ns.pad(a, ((1, 2), (0, 3))), [(3, 4)], "pad-constant")
case("concatenate", lambda ns, a: ns.pad(a, 2, mode="edge"), [(3, 4)], "pad-edge")
case("concatenate", lambda ns, a: ns.pad(a, ((2, 1), (3, 3)), mode="reflect"), [(3, 4)], "pad-reflect")
case("sub", lambda ns, c: ns.diff(c, 2, axis=1), [(2, 4, 3)], "diff")
case("broadcast_to", lambda ns, v, a: ns.broadcast_arrays(v, a)[0] * ns.meshgrid(v, a[:, 0])[1], [(4,), (3, 1)],
     "broadcast_arrays-meshgrid")
case("stop_gradient", lambda ns, x: x * ns.stop_gradient(x) + ns.stop_gradient(ns.exp(x)), [(2, 3)], "stop_gradient",
     fd=False)
case("identity", lambda ns, x: ns.sin(apply("identity", [x]) if ns is mj else x) * x, [(2, 3)],
     "the-point-of-a-nested-derivative")
case("branch_gate", lambda ns, x: ns.sin(x) * x if ns.sum(x * x) > 0.01 else ns.cos(x), [(2, 3)], "an-if-on-a-traced-value")

# Casts between float32 and float64 (finite differences with a step float32 can resolve).
case("cast", lambda ns, x: ns.astype(ns.astype(x, np.float32), np.float64), [(2, 3)], "f64-f32-f64",
     eps=1e-2, rtol=1e-5, ag_rtol=1e-6)
case("cast", lambda ns, x: ns.astype(x, np.float64) * 3.0, [(2, 3)], "f32-to-f64", dtype=np.float32,
     eps=1e-2, rtol=1e-5, ag_rtol=1e-6)
case("cast", lambda ns, x: ns.astype(x, np.float32), [(2, 3)], "f64-to-f32-loss",
     eps=1e-2, rtol=1e-5, ag_rtol=1e-6)

# Binary element-wise ops over broadcasting shape pairs.
for _a, _b in BCAST:
    _s = f"{_a}-{_b}".replace(" ", "")
    case("add", lambda ns, a, b: a + b, [_a, _b], _s)
    case("sub", lambda ns, a, b: a - b, [_a, _b], _s)
    case("mul", lambda ns, a, b: a * b, [_a, _b], _s)
    case("div", lambda ns, a, b: a / b, [_a, _b], _s, domain="pos")
    case("pow", lambda ns, a, b: a ** b, [_a, _b], _s, domain="pos")
    case("maximum", lambda ns, a, b: ns.maximum(a, b), [_a, _b], _s)
    case("minimum", lambda ns, a, b: ns.minimum(a, b), [_a, _b], _s)
case("add", lambda ns, x: 2.0 + x, [(3,)], "literal")
case("sub", lambda ns, x: 2.0 - x, [(3,)], "literal-left")
case("mul", lambda ns, x: x * x, [(2, 3)], "same-operand")
case("div", lambda ns, x: 1.0 / x, [(2, 3)], "literal-numerator", domain="pos")
case("pow", lambda ns, x: x ** 3, [(2, 3)], "int-literal-exponent")
case("pow", lambda ns, x: x ** 0.5, [(2, 3)], "half", domain="pos")
case("pow", lambda ns, x: 2.0 ** x, [(2, 3)], "literal-base")
case("pow", lambda ns, x, p: x ** p, [(2, 3), ()], "param-exponent", domain="pos")
case("pow", lambda ns, x, p: x ** p, [(2, 3), (3,)], "param-exponent-vector", domain="pos")
case("maximum", lambda ns, x: ns.maximum(x, 0.1), [(2, 3)], "literal")
case("minimum", lambda ns, x: ns.minimum(0.1, x), [(2, 3)], "literal")

# where: the mask broadcasts against both branches; the branches against each other.
_MASK = np.array([[True], [False]])
case("where", lambda ns, a, b: ns.where(_MASK, a, b), [(2, 3), (2, 3)], "same-shape")
case("where", lambda ns, a, b: ns.where(_MASK[:, :, None], a, b), [(2, 3, 4), (3, 1)], "broadcast")
case("where", lambda ns, x: ns.where(x > 0, x, 0.1 * x), [(2, 3)], "leaky")
case("where", lambda ns, a: ns.where(_MASK, a, 0.5), [(3,)], "literal-branch")

# clip with literal bounds and with differentiated array bounds.
case("clip", lambda ns, x: ns.clip(x, -0.5, 0.5), [(3, 4)], "literal-bounds")
case("clip", lambda ns, x, lo, hi: ns.clip(x, lo, hi), [(3, 4), (4,), ()], "array-bounds",
     inputs=lambda rng: [1.5 * rng.standard_normal((3, 4)), rng.uniform(-1, -0.3, (4,)),
                         np.asarray(rng.uniform(0.3, 1))])

# Reductions over every axis, with and without keepdims.
for _axis in AXES:
    for _keep in (False, True):
        _s = f"axis={_axis}-keepdims={_keep}".replace(" ", "")
        case("sum", lambda ns, x, axis=_axis, keep=_keep: ns.sum(x, axis=axis, keepdims=keep),
             [(2, 3, 4)], _s)
        case("max", lambda ns, x, axis=_axis, keep=_keep: ns.max(x, axis=axis, keepdims=keep),
             [(2, 3, 4)], _s)
        case("min", lambda ns, x, axis=_axis, keep=_keep: ns.min(x, axis=axis, keepdims=keep),
             [(2, 3, 4)], _s)
        case("logsumexp", lambda ns, x, axis=_axis, keep=_keep: ns.logsumexp(x, axis=axis, keepdims=keep),
             [(2, 3, 4)], _s)
case("sum", lambda ns, x: ns.mean(x, axis=1), [(2, 3, 4)], "mean")
case("sum", lambda ns, x: ns.var(x, axis=-1, keepdims=True), [(2, 3, 4)], "var")
case("max", lambda ns, x: ns.max(x), [(5,)], "vector")

# Views.
case("reshape", lambda ns, x: ns.reshape(x, (4, 6)), [(2, 3, 4)], "merge")
case("reshape", lambda ns, x: ns.reshape(x, (-1,)), [(2, 3, 4)], "ravel")
case("reshape", lambda ns, x: ns.reshape(x, (2, 1, 3)) * ns.reshape(x, (2, 3, 1)), [(6,)], "split")
case("reshape", lambda ns, x: ns.expand_dims(x, 1) + ns.squeeze(ns.expand_dims(x, 0)), [(2, 3)], "expand-squeeze")
case("transpose", lambda ns, x: x.T, [(2, 3, 4)], "reverse")
case("transpose", lambda ns, x: ns.transpose(x, (1, 2, 0)) * np.array([1.0, -2.0]), [(2, 3, 4)], "perm")
case("transpose", lambda ns, x: ns.swapaxes(x, 0, -1), [(2, 3, 4)], "swapaxes")
case("broadcast_to", lambda ns, x: ns.broadcast_to(x, (2, 3, 4)), [(3, 1)], "explicit")
case("broadcast_to", lambda ns, x: ns.broadcast_to(x, (4, 3)), [()], "scalar")

# Slicing with steps (negative too) and integer indexing: the gradient scatters into zeros.
for _name, _key in [("step", np.s_[::2]), ("start-stop-step", np.s_[1:, 3:0:-2]),
                    ("reverse", np.s_[::-1, :, ::3]), ("int", np.s_[1]), ("int-last", np.s_[:, -1]),
                    ("int-int", np.s_[1, 2]), ("ellipsis-newaxis", np.s_[None, ..., 1:3]),
                    ("mixed", np.s_[-1, ::2, 1])]:
    case("slice", lambda ns, x, key=_key: x[key], [(3, 4, 5)], _name)
case("slice", lambda ns, x: x[1:, :] * x[:-1, :], [(4, 3)], "overlapping")

# Joining.
case("concatenate", lambda ns, a, b: ns.concatenate([a, b], axis=0), [(2, 3), (4, 3)], "axis0")
case("concatenate", lambda ns, a, b: ns.concatenate([a, b, a], axis=-1), [(2, 3), (2, 1)], "axis-1-repeat")
case("concatenate", lambda ns, a, b: ns.concatenate([a, b], axis=1), [(2, 3, 4), (2, 2, 4)], "axis1")
case("concatenate", lambda ns, a, b: ns.stack([a, b]), [(2, 3), (2, 3)], "stack0")
case("concatenate", lambda ns, a, b: ns.stack([a, b], axis=-1), [(2, 3), (2, 3)], "stack-1")
case("concatenate", lambda ns, a, b: ns.stack([a, b, a], axis=1), [(4,), (4,)], "stack1")

# Integer-array indexing: the gradient is a scatter-add, so repeated indices must accumulate.
_DUP = np.array([2, 0, 2, -1, 2])
_PICK = np.array([[0, 2, 2, 0]] * 4)[..., None]
for _name, _fn in [("rows", lambda ns, x: x[_DUP]), ("cols", lambda ns, x: x[:, _DUP]),
                   ("pairs", lambda ns, x: x[np.arange(5) % 4, _DUP]),
                   ("broadcast-pairs", lambda ns, x: x[_DUP[:, None], np.array([0, 0, -3])]),
                   ("separated", lambda ns, x: x[_DUP % 4, :, _DUP[::-1]]),
                   ("int-and-array", lambda ns, x: x[1, ..., _DUP]),
                   # autograd has no take or take_along_axis: it indexes instead
                   ("take", lambda ns, x: ns.take(x, _DUP, axis=-1) if ns is mj else x[:, _DUP]),
                   ("take-flat", lambda ns, x: ns.take(x, _DUP * 3) if ns is mj else x[_DUP, 0]),
                   ("take_along_axis", lambda ns, x: ns.take_along_axis(x, _PICK, 1) if ns is mj
                    else x[np.arange(4)[:, None, None], _PICK, np.arange(4)])]:
    case("gather", _fn, [(4, 3, 4)] if _name in ("separated", "int-and-array", "take_along_axis") else [(4, 3)],
         _name)
case("gather", lambda ns, a, b: ns.choose(_DUP[:4] % 2, [a, b]) if ns is mj else
     ns.where(_DUP[:4] % 2 == 1, b, a), [(3, 4), (4,)], "choose")
case("check_parameter", lambda ns, x: (checks.checked(x, "rng.normal", "scale", checks.NON_NEGATIVE) if ns is mj
                                       else x) * x, [(2, 3)], "scale", domain="pos")
case("scatter_add", lambda ns, g: (A.scatter_add(g, (_DUP,), (4, 3), 0) if ns is mj
                                   else np.eye(4)[(_DUP % 4)].T @ g), [(5, 3)], "repeated")
case("scatter", lambda ns, x, v: A.scatter(x, v, (_DUP,), 0) if ns is mj      # rows 2 and -1 repeat: last wins
     else ns.stack([v[1], x[1], v[4], v[3]]), [(4, 3), (5, 3)], "repeated")
case("update_slice", lambda ns, x, v: A.update_slice(x, v, (1, 0), (3, 3), (1, 2)) if ns is mj
     else ns.concatenate([x[:1], ns.stack([v[:, 0], x[1:3, 1], v[:, 1]], axis=1), x[3:]]), [(4, 3), (2, 2)], "strided")



def _windows_by_stacking(x, k):
    """The last axis's windows of ``k``, stacked from slices (autograd has no window views)."""
    n = x.shape[-1] - k + 1
    return AG.stack([x[..., a:a + n] for a in range(k)], axis=-1)


def _unwindow_by_padding(g, n):
    k = g.shape[-1]
    return sum(AG.concatenate([np.zeros(g.shape[:-2] + (a,)), g[..., a], np.zeros(g.shape[:-2] + (n - g.shape[-2] - a,))],
                              axis=-1) for a in range(k))


case("window", lambda ns, x: ns.lib.stride_tricks.sliding_window_view(x, 3, -1) if ns is np
     else (mj.sliding_window_view(x, 3, -1) if ns is mj else _windows_by_stacking(x, 3)), [(2, 5)], "sliding")
case("unwindow", lambda ns, g: mj.conv_transpose2d(g[None, None], np.ones((1, 1, 1, 3)))[0, 0]
     if ns is mj else _unwindow_by_padding(g[:, :, None] * np.ones((1, 1, 3)), 4), [(4, 2)], "conv_transpose")
case("window_max", lambda ns, x: mj.max_pool2d(x, 2, 1) if ns is mj else
     AG.max(AG.stack([x[:, :, a:a + 3, b:b + 2] for a in range(2) for b in range(2)]), axis=0), [(1, 2, 4, 3)],
     "max_pool2d")

_ROWS = np.zeros((5, 2))
_ROWS[[1, 3], [0, 1]] = 1.0
_COLS = np.zeros((2, 4))
_COLS[[0, 1], [0, 3]] = 1.0
# unslice (the transpose of slice) is not in the user API but is an op with a VJP; autograd
# computes the same scatter as a product with 0/1 matrices.
case("unslice", lambda ns, x: (A.unslice(x, (5, 4), (1, 0), (5, 4), (2, 3)) if ns is mj
                               else _ROWS @ x @ _COLS), [(2, 2)], "steps")

# Matmul: plain, batched with broadcast batch dimensions, and 1-D operands.
for _a, _b in [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
               ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4,)), ((4,), (2, 4, 3))]:
    case("matmul", lambda ns, a, b: a @ b, [_a, _b], f"{_a}@{_b}".replace(" ", ""))
case("matmul", lambda ns, a: ns.dot(a, a.T), [(3, 4)], "gram")

# Stable composites.
for _axis in [0, 1, -1, (0, 2)]:
    case("softmax", lambda ns, x, axis=_axis: ns.softmax(x, axis=axis), [(2, 3, 4)], f"axis={_axis}".replace(" ", ""))
    case("log_softmax", lambda ns, x, axis=_axis: ns.log_softmax(x, axis=axis), [(2, 3, 4)],
         f"axis={_axis}".replace(" ", ""))
for _shape in [(5, 4), (2, 3, 4), (4,)]:
    case("softmax_cross_entropy",
         lambda ns, z, labels=_labels(_shape[:-1]): ns.softmax_cross_entropy(z, labels), [_shape],
         "x".join(map(str, _shape)))
case("softmax_cross_entropy", lambda ns, z: ns.softmax_cross_entropy(3.0 * z, _labels((5,))), [(5, 4)], "scaled")


# Linear algebra: SPD matrices built from a free one (a perturbation keeps them SPD), triangular
# ones as a masked free matrix with a dominant diagonal. Eigenvectors and Q enter squared (their
# signs are arbitrary); autograd has no QR, so its side is the Cholesky factor of the Gram matrix.
def _spd(ns, x):
    return x @ ns.swapaxes(x, -1, -2) + 3.0 * np.eye(x.shape[-1])


def _triangular(x, lower=True):
    n = x.shape[-1]
    return x * (np.tri(n) if lower else np.tri(n).T) + 4.0 * np.eye(n)


def _solve_triangular(ns, a, b, **kw):
    return mj.linalg.solve_triangular(a, b, **kw) if ns is mj else AG_SCIPY_LINALG.solve_triangular(a, b, **kw)


def _qr_squares(ns, a):
    if ns is mj:
        q, r = mj.linalg.qr(a)
    else:
        r = ns.swapaxes(ns.linalg.cholesky(a.T @ a), 0, 1)
        q = _solve_triangular(ns, r, a.T, trans="T").T
    return ns.concatenate([q * q, r * r], axis=0)


case("cholesky", lambda ns, x: ns.linalg.cholesky(_spd(ns, x)), [(4, 4)], "spd")
for _lower in (True, False):
    for _trans in (0, 1):
        case("solve_triangular", lambda ns, a, b, lo=_lower, t=_trans:
             _solve_triangular(ns, _triangular(a, lo), b, lower=lo, trans=t), [(4, 4), (4, 2)],
             f"lower={_lower}-trans={_trans}")
case("solve_triangular", lambda ns, a, b: _solve_triangular(ns, _triangular(a), b, lower=True), [(3, 3), (3,)], "vector")
for _lower in (True, False):
    for _trans in (False, True):
        case("triangular_matmul", lambda ns, a, b, lo=_lower, t=_trans:
             mj.linalg.triangular_matmul(a, b, lower=lo, trans=t) if ns is mj else
             ns.swapaxes(_triangular(a, lo) - 4.0 * np.eye(4), 0, 1) @ b if t else (_triangular(a, lo) - 4.0 * np.eye(4)) @ b,
             [(4, 4), (4, 2)], f"lower={_lower}-trans={_trans}")
# The factor read on its diagonal only (Murray's rule in closed form), or also off it (the full rule)
case("cholesky", lambda ns, x: ns.sum(ns.linalg.cholesky(_spd(ns, x)) * np.eye(4), axis=-1), [(4, 4)], "diagonal-mask")
case("cholesky", lambda ns, x: ns.log(ns.diagonal(ns.linalg.cholesky(_spd(ns, x)))), [(4, 4)], "log-diagonal")
case("cholesky", lambda ns, x: ns.linalg.cholesky(_spd(ns, x)) * (np.eye(3) + np.eye(3, k=-2)), [(3, 3)],
     "almost-diagonal-mask")
case("cholesky", lambda ns, x: ns.linalg.cholesky(_spd(ns, x)) * np.array([[2.0]]), [(3, 3)], "one-by-one-mask")


def _slogdet_after_cholesky(ns, k):
    ns.linalg.cholesky(k)   # the factor slogdet is then given
    return ns.linalg.slogdet(k)[1]


def _inv_given_cholesky(ns, k):
    return apply("factored_inv", [k, ns.linalg.cholesky(k)]) if ns is mj else ns.linalg.inv(k)


# Of a matrix the function factors: from the factor where it is symmetric (to rounding: a GEMM
# builds it), by LU where it is not (its lower triangle still positive definite).
for _name, _fn in (("factored_slogdet", _slogdet_after_cholesky), ("factored_inv", _inv_given_cholesky)):
    case(_name, lambda ns, x, fn=_fn: fn(ns, _spd(ns, x)), [(4, 4)], "spd")
    case(_name, lambda ns, x, y, fn=_fn: fn(ns, _spd(ns, x) + 0.3 * y), [(4, 4), (4, 4)], "not-symmetric")


def _cho_solve(ns, x, b, lower):
    if ns is not mj:
        return ns.linalg.solve(_spd(ns, x), b)
    factor = mj.linalg.cho_factor(_spd(ns, x), lower=lower)
    return mj.linalg.cho_solve(factor, b)


for _lower in (True, False):
    case("cho_solve", lambda ns, x, b, lo=_lower: _cho_solve(ns, x, b, lo), [(4, 4), (4, 2)], f"lower={_lower}")
case("cho_solve", lambda ns, x, b: _cho_solve(ns, x, b, True), [(3, 3), (3,)], "vector")
for _lower in (True, False):
    case("triangular_inverse", lambda ns, a, lo=_lower: mj.linalg.triangular_inverse(_triangular(a, lo), lower=lo)
         if ns is mj else ns.linalg.inv(_triangular(a, lo)), [(4, 4)], f"lower={_lower}")
case("weighted_gram", lambda ns, w, e: apply("weighted_gram", [w, e]) if ns is mj else
     ns.swapaxes(w * np.tri(4), 0, 1) @ (e[:, None] * (w * np.tri(4))), [(4, 4), (4,)], "signed-weights")
case("solve", lambda ns, a, b: ns.linalg.solve(a + 4.0 * np.eye(3), b), [(3, 3), (3, 2)], "matrix")
case("solve", lambda ns, a, b: ns.linalg.solve(a + 4.0 * np.eye(3), b), [(3, 3), (3,)], "vector")
case("inv", lambda ns, a: ns.linalg.inv(a + 4.0 * np.eye(3)), [(3, 3)], "plain")
case("det", lambda ns, a: ns.linalg.det(a + 2.0 * np.eye(3)), [(3, 3)], "plain")
case("slogdet", lambda ns, a: ns.linalg.slogdet(a - 2.0 * np.eye(3))[1], [(3, 3)], "logabsdet")
case("eigh", lambda ns, x: ns.linalg.eigh(_spd(ns, x))[0], [(4, 4)], "eigenvalues")
case("eigh", lambda ns, x: ns.linalg.eigh(_spd(ns, x))[1] ** 2, [(3, 3)], "eigenvectors")
case("qr", _qr_squares, [(5, 3)], "reduced")
case("qr", lambda ns, a, b: ns.linalg.lstsq(a, b)[0] if ns is mj else ns.linalg.solve(a.T @ a, a.T @ b),
     [(5, 3), (5, 2)], "lstsq")
case("qr", lambda ns, a: ns.linalg.pinv(a), [(3, 5)], "pinv-wide")


def _svd_terms(ns, a):
    """The singular values, the squares of U and Vh (free of their signs) and the reconstruction."""
    u, s, vh = ns.linalg.svd(a, full_matrices=False)
    return ns.concatenate([ns.ravel(s), ns.ravel(u * u), ns.ravel(vh * vh), ns.ravel((u * s[..., None, :]) @ vh)])


for _shape in ((4, 3), (3, 5), (3, 3), (2, 3, 2)):
    case("svd", _svd_terms, [_shape], "x".join(map(str, _shape)))
case("svd", lambda ns, a: ns.linalg.svd(a, compute_uv=False), [(4, 3)], "values")

def cotangent(rng, fn, xs):
    """A random cotangent of the output's shape and dtype."""
    out = np.asarray(fn(mj, *xs))
    return rng.standard_normal(out.shape).astype(out.dtype)
