"""SciPy's special functions that are ops: ``erf``, ``erfc`` and ``gammaln``, element-wise ops
whose templates call the C library (``math.erf``, ``math.lgamma``); ``gamma``, ``beta``,
``betaln``, the regularised incomplete functions ``betainc``, ``betaincc``, ``gammainc`` and
``gammaincc``, Student's t cdf ``stdtr`` and ``polygamma``, whose templates call SciPy's own
kernels (`kernel_template`); and ``erfinv``, ``digamma``, ``xlogy``, ``xlog1py`` and ``entr``,
composite ops whose reference is SciPy's and whose lowering (for the loop backends) is written
here in element-wise ops, with their textbook gradients.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.special as sp

from .. import api as A
from ..api import betaln, digamma, erf, erfc, gammaln, polygamma
from ..ir import COMPOSITE, ELEMENTWISE, EXPENSIVE, NoDerivative, defop, elementwise_rule
from .elementwise import elementwise

TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _in_dtype(K, expr: str) -> str:
    """A C library call (in double precision) brought back to the op's dtype."""
    return f"np.{K.dtype.name}({expr})"


LGAMMA_OVERFLOW = 2.5599833278516383e+305   # the largest x whose lgamma is finite in float64


def _gammaln_template(K, x):
    # SciPy's values at the poles (non-positive integers), at -inf and where lgamma overflows:
    # Python's math.lgamma raises there, so it is called on 1 instead.
    inf = _in_dtype(K, "np.inf")
    infinite = f"(({x} <= {K(0)}) & ({x} == np.floor({x}))) | ({x} > np.float64({LGAMMA_OVERFLOW!r}))"
    if K.dtype == np.float64:  # SciPy's float64 gammaln overflows to inf on subnormals
        infinite += f" | (abs({x}) < np.float64({float(np.finfo(np.float64).tiny)!r}))"
    lgamma = _in_dtype(K, f"math.lgamma(select({infinite} | ({x} == -{inf}), {K(1)}, {x}))")
    return f"select({x} == -{inf}, -{inf}, select({infinite}, {inf}, {lgamma}))"


elementwise("erf", sp.erf, lambda K, x: _in_dtype(K, f"math.erf({x})"),
            lambda g, ans, x: (g * TWO_OVER_SQRT_PI * A.exp(-(x * x)),), cost=EXPENSIVE)
elementwise("erfc", sp.erfc, lambda K, x: _in_dtype(K, f"math.erfc({x})"),
            lambda g, ans, x: (-g * TWO_OVER_SQRT_PI * A.exp(-(x * x)),), cost=EXPENSIVE)
elementwise("gammaln", sp.gammaln, _gammaln_template,
            lambda g, ans, x: (g * digamma(x),), cost=EXPENSIVE)


def kernel_template(name: str, float32_kernel: bool = False):
    """The template calling SciPy's double kernel ``sps.<name>`` (``morphjit.native.special``):
    float32 operands in double, the result rounded back, as SciPy's float32 loops do; or its
    float kernel ``sps.<name>_float32``, where SciPy's float32 loop calls one."""
    def template(K, *operands):
        if K.dtype == np.float32 and float32_kernel:
            return f"sps.{name}_float32({', '.join(operands)})"
        if K.dtype == np.float32:
            return _in_dtype(K, f"sps.{name}({', '.join(f'np.float64({x})' for x in operands)})")
        return f"sps.{name}({', '.join(operands)})"
    return template


def no_derivative(name: str, argument: str) -> NoDerivative:
    return NoDerivative(f"the {argument} of scipy.special.{name}")


def _beta_vjp(g, ans, a, b):
    both = digamma(a + b)
    return g * ans * (digamma(a) - both), g * ans * (digamma(b) - both)


def _betaln_vjp(g, ans, a, b):
    both = digamma(a + b)
    return g * (digamma(a) - both), g * (digamma(b) - both)


def _betainc_vjp(name, sign):
    """In x (``sign`` +1: betainc, -1: betaincc) the beta density ``x^(a-1) (1-x)^(b-1) / B(a, b)``;
    none in the shapes."""
    def vjp(g, ans, a, b, x):
        density = A.exp(A.xlogy(a - 1.0, x) + A.xlog1py(b - 1.0, -x) - betaln(a, b))
        return no_derivative(name, "shape a"), no_derivative(name, "shape b"), sign * g * density
    return vjp


def _stdtr_vjp(g, ans, df, t):
    """In t Student's density; none in the degrees of freedom."""
    log_density = (gammaln((df + 1.0) / 2.0) - gammaln(df / 2.0) - 0.5 * A.log(math.pi * df)
                   - (df + 1.0) / 2.0 * A.log1p(t * t / df))
    return no_derivative("stdtr", "degrees of freedom df"), g * A.exp(log_density)


def _gamma_density(a, x):
    """``x^(a-1) e^-x / Gamma(a)``, the derivative of ``gammainc`` in x; 0 at x = inf."""
    finite = x != np.inf
    safe = A.where(finite, x, 1.0)
    return A.where(finite, A.exp(A.xlogy(a - 1.0, safe) - safe - gammaln(a)), 0.0)


elementwise("gamma", sp.gamma, kernel_template("gamma"), lambda g, ans, x: (g * ans * digamma(x),), cost=EXPENSIVE)
elementwise("beta", sp.beta, kernel_template("beta"), _beta_vjp, cost=EXPENSIVE)
elementwise("betaln", sp.betaln, kernel_template("betaln"), _betaln_vjp, cost=EXPENSIVE)
elementwise("betainc", sp.betainc, kernel_template("betainc", float32_kernel=True), _betainc_vjp("betainc", 1.0),
            cost=EXPENSIVE)
elementwise("betaincc", sp.betaincc, kernel_template("betaincc", float32_kernel=True), _betainc_vjp("betaincc", -1.0),
            cost=EXPENSIVE)
elementwise("stdtr", sp.stdtr, kernel_template("stdtr", float32_kernel=True), _stdtr_vjp, cost=EXPENSIVE)
elementwise("gammainc", sp.gammainc, kernel_template("gammainc"),
            lambda g, ans, a, x: (no_derivative("gammainc", "shape a"), g * _gamma_density(a, x)), cost=EXPENSIVE)
elementwise("gammaincc", sp.gammaincc, kernel_template("gammaincc"),
            lambda g, ans, a, x: (no_derivative("gammaincc", "shape a"), -g * _gamma_density(a, x)), cost=EXPENSIVE)


def _polygamma_template(K, x, n):
    return _in_dtype(K, f"sps.polygamma(np.float64({float(n)!r}), np.float64({x}))")


# polygamma(n, x) for a whole n >= 1 (a parameter; n = 0 is digamma): SciPy's values, in x's dtype
defop("polygamma", ELEMENTWISE, lambda types, n: elementwise_rule("polygamma")(types),
      lambda x, n: np.asarray(sp.polygamma(n, x), x.dtype), lambda g, ans, x, n: (g * polygamma(n + 1, x),),
      scalar=_polygamma_template, cost=EXPENSIVE)


# ---------------------------------------------------------------------------------------------
# erfinv: a first guess (Giles' single-precision approximation; the asymptotic inversion of erfc
# beyond its range, where 1 - |x| < 5e-8), then Newton steps on erf, or near +-1 (where erf has no
# relative precision left) on log(erfc(y) / (1 - |x|)), which is nearly linear in y^2: from a
# guess on either side it converges without overshooting. Within 3 ulps of SciPy in float64.

GILES_CENTRAL = (1.50140941, 0.246640727, -0.00417768164, -0.00125372503, 0.00021858087,
                 -4.39150654e-06, -3.5233877e-06, 3.43273939e-07, 2.81022636e-08)
GILES_TAIL = (2.83297682, 1.00167406, 0.00943887047, -0.0076224613, 0.00573950773, -0.00367342844,
              0.00134934322, 0.000100950558, -0.000200214257)
GILES_TAIL_END = 16.0   # w = -log(1 - x^2) beyond which Giles' fit no longer holds
NEWTON_STEPS = 2


def _polynomial(coefficients, w):
    p = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        p = p * w + c
    return p


def _erfc_inverse_asymptotic(c):
    """y with erfc(y) = c for tiny c (rel. error < 1e-4): y^2 = u solves
    u + log(pi u) / 2 - log(1 - 1 / 2u) = -log(c), one fixed-point step from u = -log(c)."""
    t = -A.log(c)
    u = t - 0.5 * A.log(math.pi * t)
    return A.sqrt(t - 0.5 * A.log(math.pi * u) + A.log1p(-0.5 / u))


def _erfinv_first_guess(a, c, w):
    central = _polynomial(GILES_CENTRAL, w - 2.5) * a
    tail = _polynomial(GILES_TAIL, A.sqrt(A.maximum(w, 5.0)) - 3.0) * a
    far = _erfc_inverse_asymptotic(A.minimum(c, 1e-7))   # 1 - a <= 5.6e-8 there
    return A.where(w < 5.0, central, A.where(w < GILES_TAIL_END, tail, far))


def _erfinv_lower(x):
    a = A.abs(x)
    inside = a < 1.0
    safe = A.where(inside, a, 0.5)
    c = 1.0 - safe   # exact where the tail's residual uses it (safe > 1/2)
    y = _erfinv_first_guess(safe, c, -A.log(c * (1.0 + safe)))
    for _ in range(NEWTON_STEPS):
        tail = erfc(y)
        residual = A.where(safe > 0.5, -A.log1p((tail - c) / c) * tail, erf(y) - safe)
        y = y - residual / (TWO_OVER_SQRT_PI * A.exp(-(y * y)))
    edge = A.astype(A.where(a == 1.0, np.inf, np.nan), x.dtype)
    return A.where(inside, y, edge) * A.sign(x) + A.where(x == 0.0, x, 0.0)


defop("erfinv", COMPOSITE, elementwise_rule("erfinv"), sp.erfinv,
      lambda g, ans, x: (g / TWO_OVER_SQRT_PI * A.exp(ans * ans),), lower=_erfinv_lower)


# ---------------------------------------------------------------------------------------------
# digamma and its derivative: recurrence up to SHIFT, the asymptotic series, reflection below 1/2

SHIFT = 10
DIGAMMA_SERIES = (-1.0 / 12, 1.0 / 120, -1.0 / 252, 1.0 / 240, -1.0 / 132)   # in 1/z^2
TRIGAMMA_SERIES = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66)        # in 1/z^2, times 1/z


def _reflected(x, on_positive, reflection, at_zero):
    """``on_positive`` for x >= 1/2; ``reflection(x, value at 1 - x)`` below; ``at_zero`` at +-0 and
    NaN at the other poles."""
    below = x < 0.5
    value = on_positive(A.where(below, 1.0 - x, x))
    pole = (x <= 0.0) & (A.floor(x) == x)
    return A.where(pole, A.where(x == 0.0, at_zero, np.nan), A.where(below, reflection(x, value), value))


def _pi_x_reduced(x):
    """``pi * (x - round(x))``: the same tangent as pi x, reduced exactly."""
    return math.pi * (x - A.rint(x))


def _digamma_positive(x):
    shift = sum(1.0 / (x + k) for k in range(SHIFT))
    z = x + float(SHIFT)
    r2 = 1.0 / (z * z)
    return A.log(z) - 0.5 / z + r2 * _polynomial(DIGAMMA_SERIES, r2) - shift


def _digamma_lower(x):
    return _reflected(x, _digamma_positive, lambda x, v: v - math.pi / A.tan(_pi_x_reduced(x)),
                      -np.inf * A.sign(1.0 / x))   # SciPy's -inf at +0, inf at -0


def _trigamma_positive(x):
    shift = sum(1.0 / ((x + k) * (x + k)) for k in range(SHIFT))
    z = x + float(SHIFT)
    r2 = 1.0 / (z * z)
    return 1.0 / z + 0.5 * r2 + r2 / z * _polynomial(TRIGAMMA_SERIES, r2) + shift


def trigamma(x):
    """The derivative of digamma (SciPy's ``polygamma(1, x)``), written in element-wise ops. The
    reflection's sine is taken of x below 1/2 only: at a whole x above, sin(pi x) = 0 would give
    the branch not taken an infinite derivative, and its gradient (an HVP of digamma) NaN."""
    sin = A.sin(_pi_x_reduced(A.where(x < 0.5, x, 0.25)))
    return _reflected(x, _trigamma_positive, lambda x, v: (math.pi * math.pi) / (sin * sin) - v, 1.0 / (x * x))


defop("digamma", COMPOSITE, elementwise_rule("digamma"), sp.digamma,
      lambda g, ans, x: (g * trigamma(x),), lower=_digamma_lower)


# ---------------------------------------------------------------------------------------------
# xlogy, xlog1py and entr: composites whose gradients keep their limits where the formulas'
# where() would cut them: d/dx xlogy(x, y) is log y at x == 0 too (-inf at y == 0), and
# d/dx entr(x) is -log x - 1 at 0 (inf) and at inf (-inf)


def _x_log_lower(log_fn, neutral):
    """``x * log_fn(y)``, 0 where x == 0 (unless y is NaN): ``neutral`` is the y whose log is 0."""
    def lower(x, y):
        zero = (x == 0.0) & ~A.isnan(y)
        return A.where(zero, 0.0, x * log_fn(A.where(zero, neutral, y)))
    return lower


def _x_log_vjp(log_fn, argument):
    def vjp(g, ans, x, y):
        flat = (x == 0.0) & ~A.isnan(y)   # 0 for every y
        return g * log_fn(y), A.where(flat, 0.0, g * x / argument(y))
    return vjp


for _name, _impl, _log, _neutral, _argument in [("xlogy", sp.xlogy, A.log, 1.0, lambda y: y),
                                                ("xlog1py", sp.xlog1py, A.log1p, 0.0, lambda y: 1.0 + y)]:
    defop(_name, COMPOSITE, elementwise_rule(_name), _impl, _x_log_vjp(_log, _argument),
          lower=_x_log_lower(_log, _neutral))


def _entr_lower(x):
    """``-x log x`` for x > 0, 0 at 0, -inf below."""
    positive = x > 0.0
    inner = -x * A.log(A.where(positive, x, 1.0))
    return A.where(positive, inner, A.where(x == 0.0, 0.0, A.where(A.isnan(x), x, -np.inf)))


defop("entr", COMPOSITE, elementwise_rule("entr"), sp.entr,
      lambda g, ans, x: (A.where(x < 0.0, 0.0, -g * (A.log(x) + 1.0)),), lower=_entr_lower)

