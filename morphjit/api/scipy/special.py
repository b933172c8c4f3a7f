"""SciPy's special functions that are NumPy ufuncs and appear in loss code (``scipy.special.X``):
those that are ops (``morphjit.ops.special``, ``morphjit.ops.bessel``) and the rest, formulas of
existing ops. `UFUNCS` is this family's entries of the NumPy dispatch; ``polygamma``, a Python
function in SciPy, is replaced while traces run (`substitutes`).
"""
from __future__ import annotations

import math

import numpy as np
import scipy.special as sp

from ...ir import Lit
from ...util import UnsupportedError, user_location
from .. import core as A, ufuncs as X

SQRT_HALF = math.sqrt(0.5)


erf, erfc, gammaln = (X.floating_function(n) for n in ("erf", "erfc", "gammaln"))
erfinv, digamma, entr = (X.floating_function(n) for n in ("erfinv", "digamma", "entr"))
gamma, beta, betaln, betainc = (X.floating_function(n) for n in ("gamma", "beta", "betaln", "betainc"))
gammainc, gammaincc = X.floating_function("gammainc"), X.floating_function("gammaincc")
betaincc, stdtr = X.floating_function("betaincc"), X.floating_function("stdtr")
i0, i1, iv, j0, j1 = (X.floating_function(n) for n in ("i0", "i1", "iv", "j0", "j1"))
y0, y1, kv = (X.floating_function(n) for n in ("y0", "y1", "kv"))
expit = A.sigmoid


def _arrays_out(fn):
    """On concrete operands, operators on 0-d arrays give NumPy scalars: give arrays, as NumPy's ufuncs do."""
    def wrapped(*args):
        return A.as_array(fn(*args))
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


LOGIT_MIDDLE = (0.3, 0.65)   # SciPy's: log1p(s) - log1p(-s), s = 2x - 1, inside (precise near 1/2)


@_arrays_out
def logit(x):
    """SciPy's formulas, the outer one as ``log x - log1p(-x)`` (not ``log(x / (1 - x))``, whose
    gradient is 0 * inf at 0 and 1)."""
    x = X.float_array(x)
    middle = (x >= LOGIT_MIDDLE[0]) & (x <= LOGIT_MIDDLE[1])
    s = 2.0 * (A.where(middle, x, 0.5) - 0.5)
    return A.where(middle, A.log1p(s) - A.log1p(-s), A.log(x) - A.log1p(-x))


@_arrays_out
def log_expit(x):
    """``log(expit(x))`` without overflow: ``min(x, 0) - log1p(exp(-|x|))``."""
    x = X.float_array(x)
    return A.minimum(x, 0.0) - A.log1p(A.exp(-A.abs(x)))


@_arrays_out
def softplus(x):
    """``log(1 + exp(x))`` without overflow."""
    x = X.float_array(x)
    return A.maximum(x, 0.0) + A.log1p(A.exp(-A.abs(x)))


@_arrays_out
def ndtr(x):
    """The standard normal CDF."""
    return 0.5 * erfc(-X.float_array(x) * SQRT_HALF)


LOG_NDTR_TAIL = -20.0   # below, log(ndtr) underflows soon: the asymptotic series takes over
LOG_NDTR_FLAT = -1e18   # below, 1/x^2 is 0 to the series: clipped there, its gradient is not 0 * inf


@_arrays_out
def log_ndtr(x):
    x = X.float_array(x)
    # Each branch sees only its own inputs, so the other's infinities never meet a zero cotangent.
    right, middle = A.where(x > 0.0, x, 0.0), A.where((x > LOG_NDTR_TAIL) & (x <= 0.0), x, 0.0)
    body = A.where(x > 0.0, A.log1p(-ndtr(-right)), A.log(ndtr(middle)))
    far = A.where(x > LOG_NDTR_TAIL, LOG_NDTR_TAIL, x)
    r2 = 1.0 / A.square(A.maximum(far, LOG_NDTR_FLAT))
    series = 1.0 + r2 * (-1.0 + r2 * (3.0 + r2 * (-15.0 + r2 * 105.0)))
    tail = -0.5 * far * far - A.log(-far) - 0.5 * math.log(2 * math.pi) + A.log(series)
    return A.where(x > LOG_NDTR_TAIL, body, tail)


def _floating_binary(name):
    """The array function of a binary composite: Python scalars become constants of the promoted dtype."""
    @_arrays_out
    def fn(x, y):
        _, operands = A.promote([A.as_value(x), A.as_value(y)], floating=True)
        return A.bind(name, [np.asarray(v.value, v.dtype) if isinstance(v, Lit) else v for v in operands])
    fn.__name__ = name
    return fn


xlogy, xlog1py = _floating_binary("xlogy"), _floating_binary("xlog1py")


def _whole_order(n) -> int:
    """polygamma's order: a whole number >= 0 known when tracing."""
    if A.trace_of([n]) is not None or np.ndim(n) != 0 or not float(n).is_integer() or n < 0:
        raise UnsupportedError(f"scipy.special.polygamma: the order n must be a whole number >= 0 known when "
                               f"tracing (a Python or NumPy scalar), got {n!r}", user_location())
    return int(n)


def polygamma(n, x):
    """``scipy.special.polygamma(n, x)`` for a whole ``n >= 0``: digamma at 0, its n-th derivative beyond."""
    n, x = _whole_order(n), X.float_array(x)
    return digamma(x) if n == 0 else A.bind("polygamma", [A.as_value(x)], n=n)


_scipy_polygamma = sp.polygamma


def _polygamma_substitute(n, x):
    """``scipy.special.polygamma`` while traces run (a Python function: no ufunc dispatch reaches it)."""
    return polygamma(n, x) if A.trace_of([n, x]) is not None else _scipy_polygamma(n, x)


def substitutes() -> list[tuple[object, str, object]]:
    """``(owner, name, substitute)``: each attribute replaced while a trace runs."""
    return [(sp, "polygamma", _polygamma_substitute)]


UFUNCS = {
    sp.expit: expit, sp.logit: logit, sp.log_expit: log_expit, sp.erf: erf, sp.erfc: erfc,
    sp.erfinv: erfinv, sp.ndtr: ndtr, sp.log_ndtr: log_ndtr, sp.gammaln: gammaln, sp.digamma: digamma,
    sp.psi: digamma, sp.xlogy: xlogy, sp.xlog1py: xlog1py, sp.entr: entr, sp.gamma: gamma, sp.beta: beta,
    sp.betaln: betaln, sp.betainc: betainc, sp.gammainc: gammainc, sp.gammaincc: gammaincc, sp.i0: i0, sp.i1: i1,
    sp.iv: iv, sp.j0: j0, sp.j1: j1, sp.y0: y0, sp.y1: y1, sp.kv: kv, sp.betaincc: betaincc, sp.stdtr: stdtr,
}
