"""The NumPy dispatch of traced arrays: plain NumPy calls on tracers (``np.exp(x)``,
``np.sum(x)``, SciPy's ufuncs) arrive at `apply_ufunc` and `apply_function` through the tracer's
``__array_ufunc__`` and ``__array_function__``, and are served by the array functions of
`UFUNCS` and `FUNCTIONS`: the families' own entries, merged here in one place.
"""
from __future__ import annotations

import difflib

import numpy as np

from ..util import UnsupportedError, user_location
from . import contractions, core, gathers, linalg, reductions, shapes, stride_tricks, ufuncs, writes
from .scipy import special

UFUNCS = {**core.UFUNCS, **ufuncs.UFUNCS, **special.UFUNCS}
FUNCTIONS = {**core.FUNCTIONS, **gathers.FUNCTIONS, **ufuncs.FUNCTIONS, **reductions.FUNCTIONS, **contractions.FUNCTIONS,
             **shapes.FUNCTIONS, **stride_tricks.FUNCTIONS, **linalg.FUNCTIONS, **writes.FUNCTIONS}


def apply_ufunc(ufunc, method, inputs, kwargs):
    if method == "at" and ufunc in (np.add, np.subtract):
        return writes.add_at(*inputs, subtract=ufunc is np.subtract)
    kwargs = dict(kwargs)
    out = kwargs.pop("out", None)
    if isinstance(out, tuple) and all(o is None for o in out):
        out = None
    if method != "__call__" or kwargs:
        what = f"np.{ufunc.__name__}.{method}" if method != "__call__" else \
            f"np.{ufunc.__name__}(..., {', '.join(f'{k}=' for k in kwargs)})"
        raise UnsupportedError(f"{what} is not supported on traced arrays", user_location())
    if ufunc not in UFUNCS:
        raise unsupported_error(ufunc)
    if out is not None:
        return writes.with_out(UFUNCS[ufunc], ufunc.__name__, out)(*inputs)
    return UFUNCS[ufunc](*inputs)


def apply_function(func, args, kwargs):
    if func not in FUNCTIONS:
        raise unsupported_error(func)
    return FUNCTIONS[func](*args, **kwargs)


def dispatch_path(func) -> str:
    """How users spell a NumPy or SciPy function: ``np.exp``, ``np.linalg.norm``, ``scipy.special.erf``."""
    name = func.__name__
    if isinstance(func, np.ufunc):
        return f"np.{name}" if getattr(np, name, None) is func else f"scipy.special.{name}"
    module = getattr(func, "__module__", None) or "numpy"
    prefix = "np" + module[len("numpy"):] if module.startswith("numpy") else module
    return f"{prefix}.{name}"


# SciPy's special functions have short names whose near spellings are other functions (gammaincinv
# and gammainc, zetac and betainc): for them, a hint names only an equal function.
SPECIAL_EQUIVALENTS = {"loggamma": "scipy.special.gammaln (equal for real x)", "rgamma": "1 / scipy.special.gamma"}


def unsupported_error(func) -> UnsupportedError:
    """The function by its path, and the nearest supported spelling (of a SciPy special function,
    the equal supported one) where there is one."""
    path = dispatch_path(func)
    if path.startswith("scipy.special."):
        equal = SPECIAL_EQUIVALENTS.get(func.__name__)
        hint = f" (use {equal})" if equal else ""
    else:
        supported = {dispatch_path(f).rpartition(".")[2]: dispatch_path(f) for f in (*UFUNCS, *FUNCTIONS)}
        nearest = difflib.get_close_matches(func.__name__, supported, n=1)
        hint = f" (the nearest supported function is {supported[nearest[0]]})" if nearest else ""
    return UnsupportedError(f"{path} is not supported by morphjit{hint}", user_location())
