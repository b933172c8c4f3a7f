"""NumPy's wider element-wise surface: the ufuncs real loss code calls beyond the core table.

Each op is one line of a table (name, NumPy reference, VJP, dtypes accepted); its scalar template
is NumPy's own scalar function, so the compiled loop and the reference agree. Functions that
NumPy defines as formulas of other ufuncs (``deg2rad``, ``sinc``, ``round``, ``nan_to_num``,
``divmod``, ``float_power``) are written as those formulas and fuse like any other chain of
element-wise ops. Loading this module registers the ops into the op table and the functions
into the NumPy dispatch (``array_api.UFUNCS`` / ``FUNCTIONS``).
"""
from __future__ import annotations

import math

import numpy as np

from . import core as A
from ..util.errors import DtypeError, user_location
from ..ops.core import ANY, EXPENSIVE, FLOAT, NUMERIC, elementwise, predicate

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
    return f"({h} if {x} == {K(0)} else ({x} if {x} != {x} else ({K(0)} if {x} < {K(0)} else {K(1)})))"


def _npymath_template(name: str):
    """NumPy's division routines in morphjit/npymath.py (numba's differ at the edges)."""
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


# ---------------------------------------------------------------------------------------------
# The array functions

def _kind(x) -> str:
    return A.dtype_of(x).kind


def floating_function(name):
    """The array function of an op on floats: integer and boolean operands become float64."""
    return A.elementwise_function(name, floating=True)


def _keeps_integers(name):
    """floor, ceil, trunc: integers in, the same integers out (NumPy 2)."""
    float_fn, int_fn = floating_function(name), A.elementwise_function(name)

    def fn(x):
        return int_fn(x) if _kind(x) in "biu" else float_fn(x)
    fn.__name__ = name
    return fn


expm1, log2, log10, exp2 = (floating_function(n) for n in ("expm1", "log2", "log10", "exp2"))
sinh, cosh, tan = floating_function("sinh"), floating_function("cosh"), floating_function("tan")
arcsin, arccos, arctan = floating_function("arcsin"), floating_function("arccos"), floating_function("arctan")
arcsinh, arccosh, arctanh = floating_function("arcsinh"), floating_function("arccosh"), floating_function("arctanh")
cbrt, fabs, rint = floating_function("cbrt"), floating_function("fabs"), floating_function("rint")
floor, ceil, trunc = _keeps_integers("floor"), _keeps_integers("ceil"), _keeps_integers("trunc")
hypot, arctan2, copysign = floating_function("hypot"), floating_function("arctan2"), floating_function("copysign")
logaddexp, logaddexp2, heaviside = floating_function("logaddexp"), floating_function("logaddexp2"), floating_function("heaviside")
remainder, fmod = A.elementwise_function("remainder"), A.elementwise_function("fmod")
floor_divide = A.elementwise_function("floor_divide")
mod = remainder
isnan, isinf, isfinite = (A.elementwise_function(n) for n in ("isnan", "isinf", "isfinite"))


def divmod(x1, x2):
    """``(x1 // x2, x1 % x2)``."""
    return floor_divide(x1, x2), remainder(x1, x2)


def reciprocal(x):
    if _kind(x) in "biu":
        raise DtypeError("reciprocal of an integer array (integer division in NumPy) is not supported; "
                         "write 1.0 / x", user_location())
    return A.divide(1.0, x)


def float_power(x1, x2):
    """``x1 ** x2`` computed in float64 (NumPy's float_power)."""
    return A.power(A.astype(x1, np.float64), A.astype(x2, np.float64))


def float_array(x):
    x = A.as_array(x)
    return x if _kind(x) == "f" else A.astype(x, np.float64)


def deg2rad(x):
    return A.multiply(float_array(x), math.pi / 180.0)


def rad2deg(x):
    return A.multiply(float_array(x), 180.0 / math.pi)


def sinc(x):
    """NumPy's formula: ``sin(pi y) / (pi y)`` with ``y`` nudged off zero."""
    x = float_array(x)
    y = A.multiply(math.pi, A.where(A.equal(x, 0), 1e-20, x))
    return A.divide(A.sin(y), y)


def round(a, decimals=0, out=None):
    """Round half to even; with ``decimals``, NumPy's scale-round-unscale formula."""
    if out is not None:
        raise DtypeError("round: the out= argument is not supported on traced arrays", user_location())
    if _kind(a) in "biu":
        if decimals >= 0:
            return A.as_array(a)
        return _round_integers(a, 10 ** -decimals)
    if decimals == 0:
        return rint(a)
    scale = 10.0 ** decimals
    return A.divide(rint(A.multiply(a, scale)), scale) if decimals > 0 else \
        A.multiply(rint(A.divide(a, 10.0 ** -decimals)), 10.0 ** -decimals)


def _round_integers(a, scale: int):
    """To a multiple of ``scale``, halves to the even multiple."""
    q, r = divmod(a, scale)
    up = A.logical_or(A.greater(2 * r, scale), A.logical_and(A.equal(2 * r, scale), A.equal(remainder(q, 2), 1)))
    return A.multiply(A.add(q, A.astype(up, A.dtype_of(q))), scale)


def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """NaN to ``nan``, infinities to ``posinf``/``neginf`` (the dtype's extremes by default)."""
    x = A.as_array(x)
    if _kind(x) != "f":
        return x
    info = np.finfo(x.dtype)
    big = float(info.max) if posinf is None else posinf
    small = float(info.min) if neginf is None else neginf
    x = A.where(isnan(x), nan, x)
    return A.where(A.equal(x, np.inf), big, A.where(A.equal(x, -np.inf), small, x))


A.UFUNCS.update({
    np.expm1: expm1, np.log2: log2, np.log10: log10, np.exp2: exp2, np.sinh: sinh, np.cosh: cosh,
    np.tan: tan, np.arcsin: arcsin, np.arccos: arccos, np.arctan: arctan, np.arcsinh: arcsinh,
    np.arccosh: arccosh, np.arctanh: arctanh, np.cbrt: cbrt, np.fabs: fabs, np.rint: rint,
    np.floor: floor, np.ceil: ceil, np.trunc: trunc, np.hypot: hypot, np.arctan2: arctan2,
    np.logaddexp: logaddexp, np.logaddexp2: logaddexp2, np.copysign: copysign,
    np.remainder: remainder, np.fmod: fmod, np.floor_divide: floor_divide, np.divmod: divmod,
    np.heaviside: heaviside, np.isnan: isnan, np.isinf: isinf, np.isfinite: isfinite,
    np.reciprocal: reciprocal, np.float_power: float_power, np.deg2rad: deg2rad,
    np.rad2deg: rad2deg, np.radians: deg2rad, np.degrees: rad2deg,
})
A.FUNCTIONS.update({np.sinc: sinc, np.round: round, np.around: round, np.nan_to_num: nan_to_num})
