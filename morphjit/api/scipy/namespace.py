"""SciPy's array-API functions on traced arrays, with or without ``SCIPY_ARRAY_API``.

SciPy's ``logsumexp``, ``softmax`` and ``log_softmax`` are written against the array API: they
ask ``array_namespace(a, b)`` which namespace to compute with. Unless SciPy runs with
``SCIPY_ARRAY_API=1`` the answer is NumPy's, whose ``asarray`` converts a traced array; with it,
SciPy refuses NumPy and traced arrays mixed in one call. While a trace runs, the lookup in their
module (and in ``array_api_extra.at``, which they call) is replaced (``substitutes.ANY_TRACE``,
`substitutes` lists them for ``morphjit.api.methods`` to install) by one that answers the traced
array's namespace (``morphjit.api.namespace``) when an argument is traced, and SciPy's own
otherwise: SciPy's algorithm is then traced, differentiated and compiled.

One part of it is replaced too: ``logsumexp`` sums the maximal elements apart from the others, so
that where several are maximal its gradient reaches them through ``max``, split evenly whatever
their weights ``b``. On traced arrays its inner sum is the usual one, with the shift held out of
the gradient.
"""
from __future__ import annotations

import sys

import numpy as np
import scipy.special
from scipy._lib.array_api_extra._lib import _at

from .. import core as A, namespace as traced_namespace
from ..custom import stop_gradient

FUNCTIONS = (scipy.special.logsumexp, scipy.special.softmax, scipy.special.log_softmax)


def _answering_traced(original):
    def array_namespace(*arrays):
        if A.trace_of(arrays) is not None:
            return traced_namespace
        return original(*arrays)
    return array_namespace


def _weighted_logsumexp(original):
    """SciPy's ``_logsumexp(a, b, axis, return_sign, xp) -> (out, sign)`` (``keepdims`` shapes)."""
    def _logsumexp(a, b, *, axis, return_sign, xp):
        if A.trace_of([a, b]) is None:
            return original(a, b, axis=axis, return_sign=return_sign, xp=xp)
        if b is not None:
            a = np.where(b == 0, -np.inf, a)   # a zero weight drops its term, even an infinite one
        shift = stop_gradient(np.max(a, axis=axis, keepdims=True))
        shift = np.where(np.isfinite(shift), shift, 0.0)
        terms = np.exp(a - shift) if b is None else b * np.exp(a - shift)
        total = np.sum(terms, axis=axis, keepdims=True)
        sign, out = np.sign(total), np.log(np.abs(total)) + shift
        return (out if return_sign else np.where(sign < 0, np.nan, out)), sign
    return _logsumexp


def substitutes() -> list[tuple[object, str, object]]:
    """``(owner, name, substitute)``: each attribute replaced while a trace runs."""
    lookups = [(module, "array_namespace", _answering_traced(module.array_namespace))
               for module in {sys.modules[f.__module__] for f in FUNCTIONS} | {_at}]
    logsumexp = sys.modules[scipy.special.logsumexp.__module__]
    return lookups + [(logsumexp, "_logsumexp", _weighted_logsumexp(logsumexp._logsumexp))]
