"""SciPy's probability distributions on traced arrays: ``scipy.stats.norm.logpdf(x, mu, sigma)``.

SciPy's distribution methods turn their arguments into NumPy arrays before computing, which a
traced array cannot become. While a trace runs, the methods below are replaced
(``substitutes.ANY_TRACE``): called with a traced argument, they compute SciPy's result from
element-wise ops, so that it differentiates and fuses; called without one, they are SciPy's own.
Arguments are parsed by the distribution's own ``_parse_args`` (SciPy's names, defaults and
errors). As in SciPy, a value outside the support has density 0 (log-density -inf), and invalid
parameters (``scale <= 0``, ``df <= 0``, a probability outside [0, 1], ...) or a NaN give NaN.
Results keep the inputs' float dtype (SciPy's are float64). A distribution or method not listed
keeps SciPy's conversion error, which names it.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import numpy as np
import scipy.special as sp
import scipy.stats as ss

from . import array_api as A
from .conversions import MODULE_HINTS
from .errors import UnsupportedError, user_location
from .linalg import cholesky, solve_triangular
from .substitutes import ANY_TRACE

LOG_2PI = math.log(2 * math.pi)
EVERYWHERE = (-np.inf, np.inf)
POSITIVE = (0.0, np.inf)


class Continuous(NamedTuple):
    """A continuous distribution of the standardised variable ``z = (x - loc) / scale``."""
    logpdf: Callable                       # log-density inside the support, ``(z, *shapes)``
    support: tuple = EVERYWHERE            # closed bounds of z
    valid: Callable = lambda *shapes: True  # the shape parameters SciPy accepts
    cdf: Callable | None = None            # ``(z, *shapes) -> (log cdf, log sf)``, where given


class Discrete(NamedTuple):
    """A discrete distribution of ``k - loc`` on the integers of its support."""
    logpmf: Callable                       # ``(k, *shapes)`` on the support
    support: Callable                      # ``(*shapes) -> (first, last)``
    valid: Callable


def _betaln(a, b):
    return sp.gammaln(a) + sp.gammaln(b) - sp.gammaln(a + b)


def _probability(p):
    return (p >= 0.0) & (p <= 1.0)


def _logistic_log_cdf(z):
    return -np.logaddexp(0.0, -z)


CONTINUOUS = {
    "norm": Continuous(lambda z: -0.5 * z * z - 0.5 * LOG_2PI,
                       cdf=lambda z: (sp.log_ndtr(z), sp.log_ndtr(-z))),
    "t": Continuous(lambda z, df: sp.gammaln((df + 1) / 2) - sp.gammaln(df / 2) - 0.5 * np.log(np.pi * df)
                    - (df + 1) / 2 * np.log1p(z * z / df), valid=lambda df: df > 0),
    "cauchy": Continuous(lambda z: -math.log(math.pi) - np.log1p(z * z)),
    "laplace": Continuous(lambda z: -np.abs(z) - math.log(2.0)),
    "logistic": Continuous(lambda z: -np.abs(z) - 2.0 * np.log1p(np.exp(-np.abs(z))),
                           cdf=lambda z: (_logistic_log_cdf(z), _logistic_log_cdf(-z))),
    "expon": Continuous(lambda z: -z, POSITIVE, cdf=lambda z: (np.log(-np.expm1(-z)), -z)),
    "gamma": Continuous(lambda z, a: sp.xlogy(a - 1.0, z) - z - sp.gammaln(a), POSITIVE, lambda a: a > 0),
    "chi2": Continuous(lambda z, df: sp.xlogy(df / 2 - 1.0, z) - z / 2 - sp.gammaln(df / 2) - df / 2 * math.log(2.0),
                       POSITIVE, lambda df: df > 0),
    "lognorm": Continuous(lambda z, s: -np.log(s * z) - 0.5 * LOG_2PI - np.log(z) ** 2 / (2 * s * s),
                          (np.nextafter(0.0, 1.0), np.inf), lambda s: s > 0),   # z > 0
    "halfnorm": Continuous(lambda z: -0.5 * z * z + 0.5 * math.log(2 / math.pi), POSITIVE),
    "beta": Continuous(lambda z, a, b: sp.xlogy(a - 1.0, z) + sp.xlog1py(b - 1.0, -z) - _betaln(a, b), (0.0, 1.0),
                       lambda a, b: (a > 0) & (b > 0)),
    "uniform": Continuous(lambda z: 0.0 * z, (0.0, 1.0)),
}

DISCRETE = {
    "poisson": Discrete(lambda k, mu: sp.xlogy(k, mu) - sp.gammaln(k + 1.0) - mu, lambda mu: (0, np.inf),
                        lambda mu: mu >= 0),
    "bernoulli": Discrete(lambda k, p: sp.xlogy(k, p) + sp.xlog1py(1.0 - k, -p), lambda p: (0, 1), _probability),
    "binom": Discrete(lambda k, n, p: sp.gammaln(n + 1.0) - sp.gammaln(k + 1.0) - sp.gammaln(n - k + 1.0)
                      + sp.xlogy(k, p) + sp.xlog1py(n - k, -p), lambda n, p: (0, n),
                      lambda n, p: (n >= 0) & (n == np.floor(n)) & _probability(p)),
    "geom": Discrete(lambda k, p: sp.xlog1py(k - 1.0, -p) + np.log(p), lambda p: (1, np.inf),
                     lambda p: (p > 0) & (p <= 1)),
    "nbinom": Discrete(lambda k, n, p: sp.gammaln(n + k) - sp.gammaln(k + 1.0) - sp.gammaln(n) + sp.xlogy(n, p)
                       + sp.xlog1py(k, -p), lambda n, p: (0, np.inf), lambda n, p: (n > 0) & _probability(p)),
}


# ---------------------------------------------------------------------------------------------
# The substituted methods


def _masked(inside, value, outside, valid):
    """``value`` inside the support, ``outside`` beyond it, NaN where the parameters are invalid."""
    return np.where(valid, np.where(inside, value, outside), np.nan)


def _standardised(dist, x, args, kwds):
    """``z = (x - loc) / scale``; z with its points outside the support replaced by one inside (so
    that the unused branch stays finite); the mask of z inside the support; the mask of valid
    parameters."""
    spec = CONTINUOUS[dist.name]
    shapes, loc, scale = dist._parse_args(*args, **kwds)
    z = (x - loc) / scale
    lo, hi = spec.support
    inside = (z >= lo) & (z <= hi)
    valid = (scale > 0) & spec.valid(*shapes) & ~np.isnan(z)
    return spec, shapes, scale, z, np.where(inside, z, 0.5 if hi == 1.0 else 1.0), inside, valid


def logpdf(dist, x, *args, **kwds):
    spec, shapes, scale, _, z, inside, valid = _standardised(dist, x, args, kwds)
    log_scale = np.log(np.where(scale > 0, scale, 1.0))
    return _masked(inside, spec.logpdf(z, *shapes) - log_scale, -np.inf, valid)


def _log_tail(upper: bool, dist, x, args, kwds):
    """log cdf, or log sf when ``upper``: 0 or -inf beyond the ends of the support."""
    spec, shapes, _, raw, z, inside, valid = _standardised(dist, x, args, kwds)
    below = raw < spec.support[0]
    outside = np.where(below, 0.0, -np.inf) if upper else np.where(below, -np.inf, 0.0)
    return _masked(inside, spec.cdf(z, *shapes)[upper], outside, valid)


def logcdf(dist, x, *args, **kwds):
    return _log_tail(False, dist, x, args, kwds)


def logsf(dist, x, *args, **kwds):
    return _log_tail(True, dist, x, args, kwds)


def logpmf(dist, k, *args, **kwds):
    spec = DISCRETE[dist.name]
    shapes, loc, _ = dist._parse_args(*args, **kwds)
    j = k - loc
    first, last = spec.support(*shapes)
    inside = (j >= first) & (j <= last) & (j == np.floor(j))
    safe = np.where(inside, j, first)
    return _masked(inside, spec.logpmf(safe, *shapes), -np.inf, spec.valid(*shapes) & ~np.isnan(j))


def _exp_of(log_method):
    return lambda dist, x, *args, **kwds: np.exp(log_method(dist, x, *args, **kwds))


# ---------------------------------------------------------------------------------------------
# The multivariate normal


def _dimension(mean, cov) -> int:
    if mean is not None:
        return int(np.size(mean))
    return int(np.shape(cov)[0]) if np.ndim(cov) else 1


def mvn_logpdf(dist, x, mean=None, cov=1, allow_singular=False):
    """``multivariate_normal.logpdf``: the Cholesky factor of a full ``cov`` (a 1-d ``cov`` is the
    diagonal, a scalar a multiple of the identity); rows of ``x`` along its last axis."""
    if allow_singular:
        raise UnsupportedError("scipy.stats.multivariate_normal: allow_singular=True is not supported on traced "
                               "arrays (the covariance is factored by Cholesky)", user_location())
    d = _dimension(mean, cov)
    x = A.as_array(x)
    if x.ndim == 0:
        x = np.reshape(x, (1,))
    if x.ndim == 1:
        x = np.reshape(x, (-1, 1) if d == 1 else (1, -1))
    dev = x - (0.0 if mean is None else np.reshape(mean, (d,)))
    if np.ndim(cov) == 2:
        factor = cholesky(cov, lower=True)
        rows = np.reshape(dev, (-1, d))
        white = solve_triangular(factor, np.transpose(rows), lower=True)
        distance = np.reshape(np.sum(white * white, axis=0), dev.shape[:-1])
        log_det = 2.0 * np.sum(np.log(np.diagonal(factor)))
    else:
        variances = cov * np.ones(d) if np.ndim(cov) == 0 else cov
        distance = np.sum(dev * dev / variances, axis=-1)
        log_det = np.sum(np.log(variances))
    return np.squeeze(-0.5 * (d * LOG_2PI + log_det + distance))


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


def _continuous_with(need_cdf: bool):
    return lambda dist: dist.name in CONTINUOUS and (not need_cdf or CONTINUOUS[dist.name].cdf is not None)


for _name, _twin in (("logpdf", logpdf), ("pdf", _exp_of(logpdf))):
    _substitute(ss.rv_continuous, _name, _twin, _continuous_with(False))
for _name, _twin in (("logcdf", logcdf), ("cdf", _exp_of(logcdf)), ("logsf", logsf), ("sf", _exp_of(logsf))):
    _substitute(ss.rv_continuous, _name, _twin, _continuous_with(True))
for _name, _twin in (("logpmf", logpmf), ("pmf", _exp_of(logpmf))):
    _substitute(ss.rv_discrete, _name, _twin, lambda dist: dist.name in DISCRETE)
for _name, _twin in (("logpdf", mvn_logpdf), ("pdf", _exp_of(mvn_logpdf))):
    _substitute(type(ss.multivariate_normal), _name, _twin, lambda dist: True)

MODULE_HINTS["scipy.stats"] = (
    f"on traced arrays scipy.stats computes logpdf and pdf of {', '.join(sorted(CONTINUOUS))} "
    f"(and logcdf, cdf, logsf, sf of {', '.join(sorted(k for k, v in CONTINUOUS.items() if v.cdf))}), logpmf "
    f"and pmf of {', '.join(sorted(DISCRETE))}, and multivariate_normal.logpdf and pdf: write other functions "
    f"with NumPy's")
