"""NumPy's wider element-wise surface: the ufuncs real loss code calls beyond the core functions
(their ops are in ``morphjit.ops.ufuncs``). Functions that NumPy defines as formulas of other
ufuncs (``deg2rad``, ``sinc``, ``round``, ``nan_to_num``, ``divmod``, ``float_power``) are written
as those formulas and fuse like any other chain of element-wise ops. `UFUNCS` and `FUNCTIONS` are
this family's entries of the NumPy dispatch (``morphjit.api.dispatch``).
"""
from __future__ import annotations

import math

import numpy as np

from ..util import DtypeError, user_location
from . import core as A


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


# ---------------------------------------------------------------------------------------------
# Complex parts of real arrays (morphjit's arrays are real): NumPy's answers for real dtypes


def real(val):
    return A.as_array(val)


def imag(val):
    """Zeros of ``val``'s shape and dtype (no gradient)."""
    return A.zeros_like(A.as_array(val))


def conjugate(x):
    if _kind(x) == "b":
        raise DtypeError("np.conjugate of a boolean array (an int8 array in NumPy) is not supported",
                         user_location())
    return A.as_array(x)


def angle(z, deg=False):
    """``arctan2(0, z)`` of a real ``z``: pi where its sign bit is set (-0.0 included), 0 elsewhere,
    NaN at NaN; constant, so its gradient is zero."""
    z = float_array(z)
    negative = A.less(copysign(1.0, z), 0)
    out = A.where(isnan(z), np.nan, A.multiply(A.astype(negative, z.dtype), math.pi))
    return A.multiply(out, 180 / math.pi) if deg else out


def iscomplex(x):
    return A.full_like(A.as_array(x), False, np.bool_)


def isreal(x):
    return A.full_like(A.as_array(x), True, np.bool_)


def iscomplexobj(x):
    A.as_value(x)
    return False


def isrealobj(x):
    A.as_value(x)
    return True


UFUNCS = {
    np.expm1: expm1, np.log2: log2, np.log10: log10, np.exp2: exp2, np.sinh: sinh, np.cosh: cosh,
    np.tan: tan, np.arcsin: arcsin, np.arccos: arccos, np.arctan: arctan, np.arcsinh: arcsinh,
    np.arccosh: arccosh, np.arctanh: arctanh, np.cbrt: cbrt, np.fabs: fabs, np.rint: rint,
    np.floor: floor, np.ceil: ceil, np.trunc: trunc, np.hypot: hypot, np.arctan2: arctan2,
    np.logaddexp: logaddexp, np.logaddexp2: logaddexp2, np.copysign: copysign,
    np.remainder: remainder, np.fmod: fmod, np.floor_divide: floor_divide, np.divmod: divmod,
    np.heaviside: heaviside, np.isnan: isnan, np.isinf: isinf, np.isfinite: isfinite,
    np.reciprocal: reciprocal, np.float_power: float_power, np.deg2rad: deg2rad,
    np.rad2deg: rad2deg, np.radians: deg2rad, np.degrees: rad2deg, np.conjugate: conjugate,
}
FUNCTIONS = {np.sinc: sinc, np.round: round, np.around: round, np.nan_to_num: nan_to_num, np.real: real,
             np.imag: imag, np.angle: angle, np.iscomplex: iscomplex, np.isreal: isreal,
             np.iscomplexobj: iscomplexobj, np.isrealobj: isrealobj}
