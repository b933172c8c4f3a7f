"""SciPy's probability distributions on traced arrays: ``scipy.stats.norm.logpdf(x, mu, sigma)``.

SciPy's distribution methods turn their arguments into NumPy arrays before computing, which a
traced array cannot become. While a trace runs, the methods below are replaced
(``substitutes.ANY_TRACE``): called with a traced argument, they compute SciPy's result from
element-wise ops, so that it differentiates and fuses; called without one, they are SciPy's own.
Arguments are parsed by the distribution's own ``_parse_args`` (SciPy's names, defaults and
errors). As in SciPy, a value outside the support has density 0 (log-density -inf), and invalid
parameters (``scale <= 0``, ``df <= 0``, a probability outside [0, 1], ...) or a NaN give NaN
(and NaN gradients). At +-inf and at the ends of the support the gradients are the limits there:
the formulas see only points inside the support, and +-inf only where the value there is infinite
(elsewhere a method is flat at an infinity).
Results keep the inputs' float dtype (SciPy's are float64). A distribution or method not listed
keeps SciPy's conversion error, which names it. The multivariate ones are in ``multivariate``.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import numpy as np
import scipy.special as sp
import scipy.stats as ss

from ...tracing import ANY_TRACE
from .. import core as A
from ..custom import stop_gradient
from .multivariate import LOG_2PI, dirichlet_logpdf, mvn_entropy, mvn_logpdf

EVERYWHERE = (-np.inf, np.inf)
POSITIVE = (0.0, np.inf)


class Standard(NamedTuple):
    """The standardised variable where the formulas see it: ``z = (x - loc) / scale``, with
    ``x - loc``, the scale and its log, from which the terms in ``log z`` are computed."""
    z: object
    distance: object    # x - loc
    scale: object
    log_scale: object

    def where(self, mask, distance):
        """The same at the points ``mask``, and at ``distance`` from loc elsewhere: a branch that
        only some points use sees finite values at the others, so that their zero cotangents
        never meet an infinite partial derivative."""
        d = np.where(mask, self.distance, distance)
        return Standard(d / self.scale, d, self.scale, self.log_scale)


class Tails(NamedTuple):
    """The tails of a continuous distribution inside its support, each ``(z, *shapes)``. A log tail
    is evaluated at the infinity where it tends to -inf (its gradient there the limit): by its
    formula, or where that gives 0 * inf there, by its ``asymptote`` ``(Standard, *shapes)``; or
    with ``flat_logs``, it is -inf there, with the gradient 0 of SciPy's, which underflows first."""
    cdf: Callable
    sf: Callable
    logcdf: Callable
    logsf: Callable
    flat_logs: bool = False
    asymptote: Callable | None = None


class Continuous(NamedTuple):
    """A continuous distribution of the standardised variable ``z = (x - loc) / scale``."""
    logpdf: Callable                       # log-density inside the support, ``(Standard, *shapes)``
    support: tuple = EVERYWHERE            # closed bounds of z
    valid: Callable = lambda *shapes: True  # the shape parameters SciPy accepts
    tails: Tails | None = None             # where given


class Discrete(NamedTuple):
    """A discrete distribution of ``k - loc`` on the integers of its support."""
    logpmf: Callable                       # ``(k, *shapes)`` on the support
    support: Callable                      # ``(*shapes) -> (first, last)``
    valid: Callable
    tails: Tails | None = None             # ``(k, *shapes)`` for whole k, first <= k < last


def _betaln(a, b):
    return sp.gammaln(a) + sp.gammaln(b) - sp.gammaln(a + b)


def _probability(p):
    return (p >= 0.0) & (p <= 1.0)


# The terms in log z are computed from x - loc and log(scale): through z, their gradient in the
# scale is (c / z) * (-z / scale), inf * 0 at z = 0, where it is -c / scale.


def _xlog_z(c, s: Standard):
    """``c log z``, 0 where c is 0 (SciPy's ``xlogy(c, z)``), for z >= 0."""
    return sp.xlogy(c, s.distance) - c * s.log_scale


def _log_abs_z(s: Standard):
    """``log|z|`` for z != 0; its gradient in x is 0 where x is infinite (log|x| grows slower than x)."""
    finite = np.isfinite(s.distance)
    return np.where(finite, np.log(np.abs(np.where(finite, s.distance, 1.0))), np.inf) - s.log_scale


TAIL = 1e18   # |z| beyond which log1p(z^2 / c) is computed from log|z| (z * z overflows float32 at 1.8e19)


def _log1p_square(s: Standard, c):
    """``log(1 + z^2 / c)``. Through z its gradients at infinite z are NaN (0 * inf); in the far
    tails it is ``t + log1p(exp(-t))``, ``t = 2 log|z| - log c``, whose gradients are the limits."""
    far = np.abs(s.z) > TAIL
    near = s.where(~far, 0.0).z
    t = 2.0 * _log_abs_z(s.where(far, 1.0)) - np.log(c)
    return np.where(far, t + np.log1p(np.exp(-t)), np.log1p(near * near / c))


def _log_of(tail, other):
    """SciPy's log of a tail: ``log(tail)`` below the median (where the tail is under 1/2), else
    ``log1p(-other)``; each formula sees only its own points."""
    def log_tail(z, *shapes):
        t, o = tail(z, *shapes), other(z, *shapes)
        small = t < 0.5
        return np.where(small, np.log(np.where(small, t, 0.5)), np.log1p(-np.where(small, 0.5, o)))
    return log_tail


def _logs(cdf, sf, **kw):
    """A distribution's tails whose logs are SciPy's (`_log_of`)."""
    return Tails(cdf, sf, _log_of(cdf, sf), _log_of(sf, cdf), **kw)


def _gamma_tails(shape, half):
    """gamma's (``half`` 1) and chi2's (``half`` 1/2: shape df / 2, at z / 2) tails."""
    cdf = lambda z, a: sp.gammainc(shape(a), z * half)
    sf = lambda z, a: sp.gammaincc(shape(a), z * half)
    return _logs(cdf, sf, flat_logs=True)


def _halfnorm_tails():
    """SciPy's logcdf; the log of its sf ``2 ndtr(-z)`` from ``log_ndtr`` in the far tail."""
    cdf, sf = (lambda z: sp.erf(z * math.sqrt(0.5))), (lambda z: 2.0 * sp.ndtr(-z))
    return Tails(cdf, sf, _log_of(cdf, sf), lambda z: math.log(2.0) + sp.log_ndtr(-z))


def _laplace_cdf(z):
    """SciPy's branches, each seeing only its own points (so that neither overflows)."""
    left, right = np.where(z > 0, 0.0, z), np.where(z > 0, z, 0.0)
    return np.where(z > 0, 1.0 - 0.5 * np.exp(-right), 0.5 * np.exp(left))


def _laplace_logcdf(z):
    """``log(laplace.cdf)`` without underflow: ``log(1/2) + z`` on the left."""
    left, right = np.where(z > 0, 0.0, z), np.where(z > 0, z, 0.0)
    return np.where(z > 0, np.log1p(-0.5 * np.exp(-right)), math.log(0.5) + left)


def _lognorm_logpdf(s: Standard, shape):
    log_z = _log_abs_z(s)
    return -np.log(shape) - log_z - 0.5 * LOG_2PI - log_z ** 2 / (2 * shape * shape)


CONTINUOUS = {
    "norm": Continuous(lambda s: -0.5 * s.z * s.z - 0.5 * LOG_2PI,
                       tails=Tails(sp.ndtr, lambda z: sp.ndtr(-z), sp.log_ndtr, lambda z: sp.log_ndtr(-z))),
    "t": Continuous(lambda s, df: sp.gammaln((df + 1) / 2) - sp.gammaln(df / 2) - 0.5 * np.log(np.pi * df)
                    - (df + 1) / 2 * _log1p_square(s, df), valid=lambda df: df > 0,
                    tails=_logs(lambda z, df: sp.stdtr(df, z), lambda z, df: sp.stdtr(df, -z),
                                asymptote=lambda s, df: -df * _log_abs_z(s))),   # log|z|^-df
    "cauchy": Continuous(lambda s: -math.log(math.pi) - _log1p_square(s, 1.0),
                         tails=_logs(lambda z: np.arctan2(1.0, -z) / np.pi, lambda z: np.arctan2(1.0, z) / np.pi,
                                     asymptote=lambda s: -_log_abs_z(s))),   # log(1 / pi|z|)
    "laplace": Continuous(lambda s: -np.abs(s.z) - math.log(2.0),
                          tails=Tails(_laplace_cdf, lambda z: _laplace_cdf(-z), _laplace_logcdf,
                                      lambda z: _laplace_logcdf(-z))),
    "logistic": Continuous(lambda s: -np.abs(s.z) - 2.0 * np.log1p(np.exp(-np.abs(s.z))),
                           tails=Tails(sp.expit, lambda z: sp.expit(-z), sp.log_expit, lambda z: sp.log_expit(-z))),
    "expon": Continuous(lambda s: -s.z, POSITIVE,
                        tails=Tails(lambda z: -np.expm1(-z), lambda z: np.exp(-z), lambda z: np.log(-np.expm1(-z)),
                                    lambda z: -z)),
    "gamma": Continuous(lambda s, a: _xlog_z(a - 1.0, s) - s.z - sp.gammaln(a), POSITIVE, lambda a: a > 0,
                        _gamma_tails(lambda a: a, 1.0)),
    "chi2": Continuous(lambda s, df: _xlog_z(df / 2 - 1.0, s) - s.z / 2 - sp.gammaln(df / 2) - df / 2 * math.log(2.0),
                       POSITIVE, lambda df: df > 0, _gamma_tails(lambda df: df / 2, 0.5)),
    "lognorm": Continuous(_lognorm_logpdf, (np.nextafter(0.0, 1.0), np.inf), lambda s: s > 0,   # z > 0
                          Tails(lambda z, s: sp.ndtr(np.log(z) / s), lambda z, s: sp.ndtr(-np.log(z) / s),
                                lambda z, s: sp.log_ndtr(np.log(z) / s), lambda z, s: sp.log_ndtr(-np.log(z) / s),
                                asymptote=lambda s, shape: sp.log_ndtr(-_log_abs_z(s) / shape))),
    "halfnorm": Continuous(lambda s: -0.5 * s.z * s.z + 0.5 * math.log(2 / math.pi), POSITIVE,
                           tails=_halfnorm_tails()),
    "beta": Continuous(lambda s, a, b: _xlog_z(a - 1.0, s) + sp.xlog1py(b - 1.0, -s.z) - _betaln(a, b), (0.0, 1.0),
                       lambda a, b: (a > 0) & (b > 0),
                       _logs(lambda z, a, b: sp.betainc(a, b, z), lambda z, a, b: sp.betaincc(a, b, z))),
    "uniform": Continuous(lambda s: 0.0 * s.z, (0.0, 1.0),
                          tails=_logs(lambda z: z, lambda z: 1.0 - z)),
}


def _plain_logs(cdf, sf):
    """Tails whose logs are SciPy's for a discrete distribution: ``log(cdf)`` and ``log(sf)``."""
    return Tails(cdf, sf, lambda k, *shapes: np.log(cdf(k, *shapes)), lambda k, *shapes: np.log(sf(k, *shapes)))


_BINOM_TAILS = _plain_logs(lambda k, n, p: sp.betaincc(k + 1.0, n - k, p),
                           lambda k, n, p: sp.betainc(k + 1.0, n - k, p))


def _nbinom_logcdf(k, n, p):
    """SciPy's: ``log1p(-betainc(k + 1, n, 1 - p))`` where the cdf is over 1/2."""
    cdf = sp.betainc(n, k + 1.0, p)
    high = cdf > 0.5
    low = np.log(np.where(high, 0.5, cdf))
    return np.where(high, np.log1p(-sp.betainc(k + 1.0, n, 1.0 - np.where(high, p, 0.5))), low)


def _geom_tail(lower: bool):
    """SciPy's ``-expm1(k log1p(-p))`` (cdf) or ``exp(k log1p(-p))`` (sf); at p = 1 from the power
    ``(1 - p)^k``, whose gradient there is the limit (through log1p(-1) it is 0 * inf)."""
    def tail(k, p):
        certain = p == 1.0
        power = (1.0 - np.where(certain, p, 1.0)) ** k
        log_sf = k * np.log1p(-np.where(certain, 0.5, p))
        return np.where(certain, 1.0 - power, -np.expm1(log_sf)) if lower else np.where(certain, power, np.exp(log_sf))
    return tail


DISCRETE = {
    "poisson": Discrete(lambda k, mu: sp.xlogy(k, mu) - sp.gammaln(k + 1.0) - mu, lambda mu: (0, np.inf),
                        lambda mu: mu >= 0,
                        _plain_logs(lambda k, mu: sp.gammaincc(k + 1.0, mu), lambda k, mu: sp.gammainc(k + 1.0, mu))),
    "bernoulli": Discrete(lambda k, p: sp.xlogy(k, p) + sp.xlog1py(1.0 - k, -p), lambda p: (0, 1), _probability,
                          Tails(*(lambda k, p, tail=tail: tail(k, 1.0, p) for tail in _BINOM_TAILS[:4]))),   # n = 1
    "binom": Discrete(lambda k, n, p: sp.gammaln(n + 1.0) - sp.gammaln(k + 1.0) - sp.gammaln(n - k + 1.0)
                      + sp.xlogy(k, p) + sp.xlog1py(n - k, -p), lambda n, p: (0, n),
                      lambda n, p: (n >= 0) & (n == np.floor(n)) & _probability(p), _BINOM_TAILS),
    "geom": Discrete(lambda k, p: sp.xlog1py(k - 1.0, -p) + np.log(p), lambda p: (1, np.inf),
                     lambda p: (p > 0) & (p <= 1),
                     Tails(_geom_tail(True), _geom_tail(False), lambda k, p: np.log(_geom_tail(True)(k, p)),
                           lambda k, p: k * np.log1p(-p))),
    "nbinom": Discrete(lambda k, n, p: sp.gammaln(n + k) - sp.gammaln(k + 1.0) - sp.gammaln(n) + sp.xlogy(n, p)
                       + sp.xlog1py(k, -p), lambda n, p: (0, np.inf), lambda n, p: (n > 0) & (p > 0) & (p <= 1),
                       Tails(lambda k, n, p: sp.betainc(n, k + 1.0, p), lambda k, n, p: sp.betaincc(n, k + 1.0, p),
                             _nbinom_logcdf, lambda k, n, p: np.log(sp.betaincc(n, k + 1.0, p)))),
}


# ---------------------------------------------------------------------------------------------
# The substituted methods


def _masked(inside, value, outside, valid, arguments):
    """``value`` inside the support, ``outside`` beyond it; NaN where a parameter is invalid or an
    argument NaN, and there the gradient of every argument NaN too."""
    dtype = A.dtype_of(value)
    poison = np.where(valid, dtype.type(0.0), dtype.type(np.nan)) * sum(arguments)   # its gradient is 0 where valid
    return np.where(valid, np.where(inside, value, A.astype(outside, dtype)), poison)


def _scale_and_log(scale):
    """The scale where it is positive (else 1) and its log; of a Python number, Python numbers
    (weak in NumPy's promotion, so that float32 stays float32)."""
    if isinstance(scale, (int, float)):
        scale = float(scale) if scale > 0 else 1.0
        return scale, math.log(scale)
    scale = np.where(scale > 0, scale, 1.0)
    return scale, np.log(scale)


def _standardised(dist, x, args, kwds, infinite_inside):
    """The arguments; the standardised variable at the points inside the support (a point inside
    stands in for the others, so that the unused branch stays finite and its gradients 0); the mask
    of those points; the mask of valid parameters. ``infinite_inside`` says whether z = -inf and
    z = +inf are evaluated by the formula: they are not where a method's value there is a finite
    constant (a cdf's 0 and 1, a density's 0), whose gradient is 0."""
    spec = CONTINUOUS[dist.name]
    shapes, loc, scale = dist._parse_args(*args, **kwds)
    z = (x - loc) / scale
    lo, hi = spec.support
    inside = (z >= lo) & (z <= hi)
    for infinity, evaluated in zip((-np.inf, np.inf), infinite_inside):
        if not evaluated:
            inside = inside & (z != infinity)
    valid = (scale > 0) & spec.valid(*shapes) & ~np.isnan(z)
    safe_scale, log_scale = _scale_and_log(scale)
    distance = np.where(inside, x - loc, (0.5 if hi == 1.0 else 1.0) * safe_scale)
    standard = Standard(distance / safe_scale, distance, safe_scale, log_scale)
    return spec, shapes, (x, *shapes, loc, scale), z, standard, inside, valid


def _density(log: bool, dist, x, *args, **kwds):
    """logpdf (``log``) or pdf: -inf or 0 outside the support."""
    spec, shapes, arguments, z, standard, inside, valid = _standardised(dist, x, args, kwds, (log, log))
    value = spec.logpdf(standard, *shapes) - standard.log_scale
    if log:
        return _masked(inside, value, -np.inf, valid, arguments)
    outside = 0.0
    for infinity, end in zip((-np.inf, np.inf), spec.support):
        if end == infinity:   # the pdf is flat there; its value is SciPy's exp(logpdf), NaN where that is
            at_end = spec.logpdf(Standard(infinity, infinity, standard.scale, standard.log_scale), *shapes)
            at_end = A.astype(np.exp(stop_gradient(at_end - standard.log_scale)), A.dtype_of(value))
            outside = np.where(z == infinity, at_end, outside)
    return _masked(inside, np.exp(value), outside, valid, arguments)


def _tail(kind: str, dist, x, *args, **kwds):
    """A tail (``cdf``, ``sf``, ``logcdf``, ``logsf``): its values beyond the ends of the support,
    and at the infinity where it tends to one of them."""
    upper, log = kind.endswith("sf"), kind.startswith("log")
    # The infinity where the tail tends to 0 (-inf for a log) is evaluated: its gradient is a limit.
    at_infinity = log and not CONTINUOUS[dist.name].tails.flat_logs
    evaluated = (at_infinity and not upper, at_infinity and upper)
    spec, shapes, arguments, raw, standard, inside, valid = _standardised(dist, x, args, kwds, evaluated)
    empty, full = (-np.inf, 0.0) if log else (0.0, 1.0)
    below = (raw < spec.support[0]) | (raw == -np.inf)
    outside = np.where(below, full, empty) if upper else np.where(below, empty, full)
    value = getattr(spec.tails, kind)(standard.z, *shapes)
    if at_infinity and spec.tails.asymptote is not None:
        infinite = np.isinf(standard.z)
        value = np.where(infinite, spec.tails.asymptote(standard.where(infinite, 1.0), *shapes),
                         getattr(spec.tails, kind)(standard.where(~infinite, 1.0).z, *shapes))
    return _masked(inside, value, outside, valid, arguments)


def logpmf(dist, k, *args, **kwds):
    spec = DISCRETE[dist.name]
    shapes, loc, _ = dist._parse_args(*args, **kwds)
    j = k - loc
    first, last = spec.support(*shapes)
    inside = (j >= first) & (j <= last) & (j == np.floor(j))
    safe = np.where(inside, j, first)
    return _masked(inside, spec.logpmf(safe, *shapes), -np.inf, spec.valid(*shapes) & ~np.isnan(j),
                   (k, *shapes, loc))


def _discrete_tail(kind: str, dist, k, *args, **kwds):
    """A tail at ``floor(k - loc)`` (flat in k and loc), SciPy's 0 and 1 (-inf and 0) beyond the support."""
    spec = DISCRETE[dist.name]
    shapes, loc, _ = dist._parse_args(*args, **kwds)
    j = stop_gradient(np.floor(k - loc))
    first, last = spec.support(*shapes)
    inside = (j >= first) & (j < last)
    empty, full = (-np.inf, 0.0) if kind.startswith("log") else (0.0, 1.0)
    outside = np.where(j < first, full, empty) if kind.endswith("sf") else np.where(j < first, empty, full)
    value = getattr(spec.tails, kind)(np.where(inside, j, first), *shapes)
    return _masked(inside, value, outside, spec.valid(*shapes) & ~np.isnan(j), (k, *shapes, loc))


def _exp_of(log_method):
    return lambda dist, x, *args, **kwds: np.exp(log_method(dist, x, *args, **kwds))


# ---------------------------------------------------------------------------------------------
# Registration


def _traced(args, kwds) -> bool:
    return A.trace_of([*args, *kwds.values()]) is not None


def _substitute(cls, name: str, twin, handles) -> None:
    """While a trace runs, ``cls.name`` computes ``twin`` on traced arguments it ``handles``."""
    original = vars(cls)[name]

    @functools.wraps(original)
    def method(self, *args, **kwds):
        if _traced(args, kwds) and handles(self):
            # NumPy's float dtype of the arguments (SciPy's results are float64): float32 stays float32.
            dtype = A.result_dtype([A.as_value(v) for v in (*args, *kwds.values()) if v is not None], floating=True)
            return A.astype(twin(self, *args, **kwds), dtype)
        return original(self, *args, **kwds)

    ANY_TRACE.register(cls, name, method)


def _continuous_with(need_tails: bool):
    return lambda dist: dist.name in CONTINUOUS and (not need_tails or CONTINUOUS[dist.name].tails is not None)


for _name, _log in (("logpdf", True), ("pdf", False)):
    _substitute(ss.rv_continuous, _name, functools.partial(_density, _log), _continuous_with(False))
for _name in ("cdf", "sf", "logcdf", "logsf"):
    _substitute(ss.rv_continuous, _name, functools.partial(_tail, _name), _continuous_with(True))
for _name, _twin in (("logpmf", logpmf), ("pmf", _exp_of(logpmf))):
    _substitute(ss.rv_discrete, _name, _twin, lambda dist: dist.name in DISCRETE)
for _name in ("cdf", "sf", "logcdf", "logsf"):
    _substitute(ss.rv_discrete, _name, functools.partial(_discrete_tail, _name), lambda dist: dist.name in DISCRETE)
for _name, _twin in (("logpdf", mvn_logpdf), ("pdf", _exp_of(mvn_logpdf)), ("entropy", mvn_entropy)):
    _substitute(type(ss.multivariate_normal), _name, _twin, lambda dist: True)
_substitute(type(ss.dirichlet), "logpdf", dirichlet_logpdf, lambda dist: True)

CONVERSION_HINT = (
    f"on traced arrays scipy.stats computes logpdf and pdf of {', '.join(sorted(CONTINUOUS))} "
    f"(and logcdf, cdf, logsf, sf of {', '.join(sorted(k for k, v in CONTINUOUS.items() if v.tails))}), logpmf, "
    f"pmf, logcdf, cdf, logsf and sf of {', '.join(sorted(DISCRETE))}, and multivariate_normal.logpdf, pdf and "
    f"entropy, and dirichlet.logpdf: write other functions with NumPy's")
