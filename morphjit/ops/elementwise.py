"""The core element-wise ops, one paragraph each: arithmetic, transcendental functions, casts,
``where``, ``clip`` and the comparisons and logical ops (predicates), with `elementwise` and
`predicate`, the declarations' shorthand that the other families use too."""
from __future__ import annotations

import numpy as np
import scipy.special

from .. import api as A
from ..ir import (ANY, DTYPES_BY_NAME, ELEMENTWISE, EXPENSIVE, FLOAT, NUMERIC, TensorType, broadcast_shapes, defop,
                  elementwise_rule, is_float, same_dtype)
from ..native import vecmath
from ..util import DtypeError


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
elementwise("sign", np.sign, lambda K, x: f"select({x} > {K(0)}, {K(1)}, select({x} < {K(0)}, {K(-1)}, {x}))",
            lambda g, ans, x: (None,), kinds=NUMERIC)
elementwise("sin", np.sin, lambda K, x: vecmath.call("sin", x),
            lambda g, ans, x: (g * A.cos(x),), cost=EXPENSIVE)
elementwise("cos", np.cos, lambda K, x: vecmath.call("cos", x),
            lambda g, ans, x: (-g * A.sin(x),), cost=EXPENSIVE)
# float32 tanh: x * P(x^2) / Q(x^2) evaluated in float64, +-1 beyond |x| >= 9 (where float32 tanh
# rounds to 1). Plain arithmetic, so loops over it vectorise, unlike the C library's tanhf; within
# 0.61 ulp of tanh (NumPy's float32 tanh: 1.36). Derived and checked by `python -m perf.tools.fit_tanh`.
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
    return (f"select(abs({v}) >= np.float64({TANH_LIMIT!r}), np.float32(np.copysign(np.float64(1.0), {v})), "
            f"np.float32({v} * {_horner(TANH_P, s)} / {_horner(TANH_Q, s)}))")


elementwise("tanh", np.tanh, _tanh_template,
            lambda g, ans, x: (g * (1.0 - ans * ans),), cost=EXPENSIVE)
elementwise("sigmoid", scipy.special.expit,
      lambda K, x: f"({K(1)} / ({K(1)} + {vecmath.call('exp', f'-{x}')}))",
            lambda g, ans, x: (g * ans * (1.0 - ans),), cost=EXPENSIVE)
elementwise("relu", lambda x: np.where(x < 0, np.zeros_like(x), x),
      lambda K, x: f"select({x} < {K(0)}, {K(0)}, {x})",
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
elementwise("maximum", np.maximum, lambda K, a, b: f"select(({a} > {b}) | ({a} != {a}), {a}, {b})",
            lambda g, ans, a, b: _tie_split(g, a > b, a == b), kinds=NUMERIC)
elementwise("minimum", np.minimum, lambda K, a, b: f"select(({a} < {b}) | ({a} != {a}), {a}, {b})",
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
      scalar=lambda K, c, a, b: f"select({c}, {a}, {b})")


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
predicate("and", np.logical_and, lambda K, a, b: f"(bool({a}) & bool({b}))")
predicate("or", np.logical_or, lambda K, a, b: f"(bool({a}) | bool({b}))")
predicate("not", np.logical_not, lambda K, a: f"(not {a})")

