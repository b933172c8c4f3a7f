"""NumPy's wider element-wise surface, the ufuncs real loss code calls beyond the core ops.

Each op is one line of a table (name, NumPy reference, VJP, dtypes accepted); its scalar template
is NumPy's own scalar function, so the compiled loop and the reference agree, or, where numba's
differ at the edges, NumPy's algorithm in ``morphjit.native.npymath``.
"""
from __future__ import annotations

import math

import numpy as np

from .. import api as A
from ..api import cosh, floor, isfinite, isinf, sinh, trunc
from ..ir import EXPENSIVE, FLOAT, NUMERIC
from .elementwise import elementwise, predicate

LN2, LN10 = math.log(2.0), math.log(10.0)


def _zero(g, ans, *xs):
    """Piecewise-constant functions (floor, rint, ...): a zero gradient almost everywhere."""
    return (None,) * len(xs)


def _numpy_template(name: str):
    return lambda K, *xs: f"np.{name}({', '.join(xs)})"


# (op name, NumPy ufunc, VJP, dtype kinds accepted, recompute cost)
UNARY = [
    ("expm1", np.expm1, lambda g, ans, x: (g * (ans + 1.0),), FLOAT, EXPENSIVE),
    ("log2", np.log2, lambda g, ans, x: (g / (x * LN2),), FLOAT, EXPENSIVE),
    ("log10", np.log10, lambda g, ans, x: (g / (x * LN10),), FLOAT, EXPENSIVE),
    ("exp2", np.exp2, lambda g, ans, x: (g * ans * LN2,), FLOAT, EXPENSIVE),
    ("sinh", np.sinh, lambda g, ans, x: (g * cosh(x),), FLOAT, EXPENSIVE),
    ("cosh", np.cosh, lambda g, ans, x: (g * sinh(x),), FLOAT, EXPENSIVE),
    ("tan", np.tan, lambda g, ans, x: (g * (1.0 + ans * ans),), FLOAT, EXPENSIVE),
    ("arcsin", np.arcsin, lambda g, ans, x: (g / A.sqrt((1.0 - x) * (1.0 + x)),), FLOAT, EXPENSIVE),
    ("arccos", np.arccos, lambda g, ans, x: (-g / A.sqrt((1.0 - x) * (1.0 + x)),), FLOAT, EXPENSIVE),
    ("arctan", np.arctan, lambda g, ans, x: (g / (1.0 + x * x),), FLOAT, EXPENSIVE),
    ("arcsinh", np.arcsinh, lambda g, ans, x: (g / A.sqrt(x * x + 1.0),), FLOAT, EXPENSIVE),
    ("arccosh", np.arccosh, lambda g, ans, x: (g / A.sqrt((x - 1.0) * (x + 1.0)),), FLOAT, EXPENSIVE),
    ("arctanh", np.arctanh, lambda g, ans, x: (g / ((1.0 - x) * (1.0 + x)),), FLOAT, EXPENSIVE),
    ("cbrt", np.cbrt, lambda g, ans, x: (g / (3.0 * ans * ans),), FLOAT, EXPENSIVE),
    ("fabs", np.fabs, lambda g, ans, x: (g * A.sign(x),), FLOAT, 1),
    ("rint", np.rint, _zero, FLOAT, 1),
    ("floor", np.floor, _zero, NUMERIC, 1),
    ("ceil", np.ceil, _zero, NUMERIC, 1),
    ("trunc", np.trunc, _zero, NUMERIC, 1),
]

BINARY = [
    ("hypot", np.hypot, lambda g, ans, a, b: (g * _hypot_ratio(a, b, ans), g * _hypot_ratio(b, a, ans)), FLOAT, EXPENSIVE),
    ("arctan2", np.arctan2, lambda g, ans, a, b: _arctan2_vjp(g, a, b), FLOAT, EXPENSIVE),
    ("logaddexp", np.logaddexp, lambda g, ans, a, b: _logaddexp_vjp(g, a, b, 1.0), FLOAT, EXPENSIVE),
    ("logaddexp2", np.logaddexp2, lambda g, ans, a, b: _logaddexp_vjp(g, a, b, LN2), FLOAT, EXPENSIVE),
    ("copysign", np.copysign, lambda g, ans, a, b: (g * A.sign(ans) * A.sign(a), None), FLOAT, 1),
    ("remainder", np.remainder, lambda g, ans, a, b: (g, -g * floor(a / b)), NUMERIC, EXPENSIVE),
    ("fmod", np.fmod, lambda g, ans, a, b: (g, -g * trunc(a / b)), NUMERIC, EXPENSIVE),
    ("floor_divide", np.floor_divide, _zero, NUMERIC, EXPENSIVE),
    ("heaviside", np.heaviside, _zero, FLOAT, 1),
]


def _safe_ratio(a, b):
    """``a / b``, and 0 where ``b`` is 0 (hypot's gradient at the origin: a subgradient)."""
    return A.where(b == 0, 0.0, a / A.where(b == 0, 1.0, b))


def _hypot_ratio(a, b, ans):
    """``a / hypot(a, b)``; +-1 where a is infinite and b finite (the limit, where the ratio is inf / inf)."""
    return A.where(isinf(a) & isfinite(b), A.sign(a), _safe_ratio(a, ans))


def _arctan2_vjp(g, a, b):
    r2 = a * a + b * b
    far = isinf(r2)   # an operand is infinite: a / r2 and b / r2 tend to 0
    return A.where(far, 0.0, g * _safe_ratio(b, r2)), A.where(far, 0.0, -g * _safe_ratio(a, r2))


def _logaddexp_vjp(g, a, b, ln_base):
    """The weights ``expit((a - b) ln base)`` and ``expit((b - a) ln base)``: (1, 0) where only
    ``a`` is +inf (``exp(a - ans)`` is exp(inf - inf) there); NaN where both are the same infinity,
    whose limit depends on how they got there."""
    d = (a - b) * ln_base
    return g * A.sigmoid(d), g * A.sigmoid(-d)


def _heaviside_template(K, x, h):
    return f"select({x} == {K(0)}, {h}, select({x} != {x}, {x}, select({x} < {K(0)}, {K(0)}, {K(1)})))"


def _npymath_template(name: str):
    """NumPy's division routines in morphjit/native/npymath.py (numba's differ at the edges)."""
    return lambda K, a, b: f"npm.{name}_{K.dtype.name}({a}, {b})"


def _fmod_template(K, a, b):
    # numba's float fmod is C's, as NumPy's; its integer one differs from NumPy's
    return f"np.fmod({a}, {b})" if K.dtype.kind == "f" else _npymath_template("fmod")(K, a, b)


TEMPLATES = {"heaviside": _heaviside_template, "fmod": _fmod_template,
             "floor_divide": _npymath_template("floor_divide"), "remainder": _npymath_template("remainder")}

for _name, _ufunc, _vjp, _kinds, _cost in UNARY + BINARY:
    elementwise(_name, _ufunc, TEMPLATES.get(_name, _numpy_template(_name)), _vjp, kinds=_kinds, cost=_cost)

for _name, _ufunc in [("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite)]:
    predicate(_name, _ufunc, _numpy_template(_name))
