"""The NumPy dispatch of traced arrays: plain NumPy calls on tracers (``np.exp(x)``,
``np.sum(x)``, SciPy's ufuncs) arrive at `apply_ufunc` and `apply_function` through the tracer's
``__array_ufunc__`` and ``__array_function__``, and are served by the array functions of
`UFUNCS` and `FUNCTIONS`: the families' own entries, merged here in one place. NumPy's dispatch
does not look inside lists: ``np.mean([x, y])`` of tracers reaches `apply_function` through the
substitutes of `routes` while a trace runs.
"""
from __future__ import annotations

import builtins
import functools

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


# Supported functions that do the job of an unsupported one (of its family), and how.
SAME_JOB = {"cumulative_sum": ("cumsum", "which does the same"), "cumulative_prod": ("cumprod", "which does the same"),
            "fix": ("trunc", "which does the same")}
# SciPy's special functions have short names whose near spellings are other functions (gammaincinv
# and gammainc, zetac and betainc): for them, a hint names only an equal function.
SPECIAL_EQUIVALENTS = {"loggamma": "scipy.special.gammaln (equal for real x)", "rgamma": "1 / scipy.special.gamma"}


def unsupported_error(func) -> UnsupportedError:
    """The function by its path, and the supported function that does its job where there is one:
    its name spelled with other underscores or case, or one of `SAME_JOB` (a name that is merely
    close, ``np.std`` for ``np.linalg.svd``, would mislead, and so would the same name in another
    module: ``np.add`` for ``np.char.add``)."""
    path = dispatch_path(func)
    if path.startswith("scipy.special."):
        equal = SPECIAL_EQUIVALENTS.get(func.__name__)
        return UnsupportedError(f"{path} is not supported by morphjit{f' (use {equal})' if equal else ''}",
                                user_location())
    supported = {dispatch_path(f).rpartition(".")[2]: dispatch_path(f) for f in (*UFUNCS, *FUNCTIONS)}
    name, spelling = func.__name__, lambda name: name.replace("_", "").lower()
    same, how = SAME_JOB.get(name) or (next((n for n in supported if n != name and spelling(n) == spelling(name)), None),
                                       "which does the same")
    hint = f" (use {supported[same]}, {how})" if same in supported else ""
    return UnsupportedError(f"{path} is not supported by morphjit{hint}", user_location())


def _routed(function):
    """NumPy's ``function``, which calls morphjit's where an argument is a traced array or a list or
    tuple holding one (NumPy's dispatch would convert such a list to an array, and fail)."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        if builtins.any(map(core.holds_tracers, args)) or builtins.any(map(core.holds_tracers, kwargs.values())):
            return apply_function(function, args, kwargs)
        return function(*args, **kwargs)
    return call


def routes() -> list[tuple[object, str, object]]:
    """``(module, name, substitute)`` for each function of `FUNCTIONS` that is an attribute of ``np``,
    ``np.linalg`` or ``np.lib.stride_tricks``."""
    modules = (np, np.linalg, np.lib.stride_tricks)
    return [(module, name, _routed(value)) for module in modules for name, value in vars(module).items()
            if callable(value) and value in FUNCTIONS]
