"""SciPy's multivariate distributions on traced arrays (registered by ``morphjit.api.scipy.stats``
with the others): ``multivariate_normal.logpdf``, ``pdf`` and ``entropy`` (a full covariance by
its Cholesky factor) and ``dirichlet.logpdf``, which is NaN where SciPy raises ``ValueError`` on
the values (an alpha <= 0, a point off the simplex), as the other distributions are for invalid
parameters.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.special as sp

from ...ir import Specialize, Sym
from ...util import UnsupportedError, user_location
from .. import core as A
from ..linalg import cholesky, solve_triangular

LOG_2PI = math.log(2 * math.pi)



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
    else:
        factor = None
        distance = np.sum(dev * dev / _variances(cov, d), axis=-1)
    return np.squeeze(-0.5 * (d * LOG_2PI + _log_det(cov, d, factor) + distance))


def _variances(cov, d):
    """A diagonal ``cov``'s variances (a scalar: the same d times)."""
    return cov * np.ones(d) if np.ndim(cov) == 0 else cov


def _log_det(cov, d, factor=None):
    """``log det cov``: of a full one from its Cholesky ``factor`` (computed where not given)."""
    if np.ndim(cov) == 2:
        factor = cholesky(cov, lower=True) if factor is None else factor
        return 2.0 * np.sum(np.log(np.diagonal(factor)))
    return np.sum(np.log(_variances(cov, d)))


def mvn_entropy(dist, mean=None, cov=1):
    """``multivariate_normal.entropy``: ``(d (log 2 pi + 1) + log det cov) / 2`` (a full ``cov``
    positive definite: Cholesky)."""
    return 0.5 * (_dimension(mean, cov) * (LOG_2PI + 1.0) + _log_det(cov, _dimension(mean, cov)))


# ---------------------------------------------------------------------------------------------
# The Dirichlet distribution

DIRICHLET = "scipy.stats.dirichlet.logpdf"
SIMPLEX_TOLERANCE = 10e-10   # SciPy's, on |sum(x) - 1|


def _components(x, alpha):
    """``x`` with its components along the first axis, the last one ``1 - sum`` where it has one fewer."""
    k = A.shape_of(alpha)[0]
    if isinstance(A.shape_of(x)[0], Sym):
        raise Specialize("x's components along the batch axis are as many as alpha's at one batch size")
    if A.shape_of(x)[0] == k - 1:
        return np.concatenate([x, 1.0 - np.sum(x, axis=0, keepdims=True)], axis=0)
    if A.shape_of(x)[0] != k:
        raise ValueError(f"{DIRICHLET}: Vector 'x' must have either the same number of entries as, or one entry "
                         f"fewer than, parameter vector 'a', but alpha.shape = {A.shape_of(alpha)} and "
                         f"x.shape = {A.shape_of(x)}.")
    return x


def _refused(x, alpha, along):
    """Where SciPy raises ``ValueError``, per point: an alpha <= 0, an x outside [0, 1] (or 0 where
    its alpha < 1), or off the simplex."""
    entries = (x < 0) | (x > 1) | ((x == 0) & (along < 1))
    return (np.any(entries, axis=0) | (np.abs(np.sum(x, axis=0) - 1.0) > SIMPLEX_TOLERANCE)
            | np.any(alpha <= 0))


def dirichlet_logpdf(dist, x, alpha):
    """``dirichlet.logpdf``: ``sum((alpha - 1) log x) - log B(alpha)`` over the first axis of x.
    NaN, and NaN gradients, where SciPy raises on the values; SciPy's errors on the shapes."""
    alpha, x = A.as_array(alpha), A.as_array(x)
    if alpha.ndim != 1:
        raise ValueError(f"{DIRICHLET}: Parameter vector 'a' must be one dimensional, but a.shape = {alpha.shape}.")
    x = _components(x, alpha)
    along = np.reshape(alpha, alpha.shape + (1,) * (x.ndim - 1))   # alpha along x's first axis
    refused = _refused(x, alpha, along)
    log_beta = np.sum(sp.gammaln(alpha)) - sp.gammaln(np.sum(alpha))
    value = np.sum(sp.xlogy(along - 1.0, x), axis=0) - log_beta
    poison = np.where(refused, np.nan, 0.0) * (np.sum(x, axis=0) + np.sum(alpha))   # its gradient NaN there
    return np.squeeze(np.where(refused, poison, value))
