"""morphjit: compile a NumPy-style loss function into one fused forward+backward step.

This module is the public interface (``mj.*``). The package is built in layers, one folder each,
in this order:

    util < ir < native < cache < tracing < api < ops < transforms < backend < runtime < jit < integrations

A folder imports only itself and the folders before it, and another folder only through its
``__init__`` (its interface); ``tests/system/test_architecture.py`` reads the order from here. It is the
order of the pipeline but for one layer: the op table (``ops``) comes after the array functions
users call (``api``), because its VJP and lowering rules are written with them, although the
pipeline reads the table first (tracing looks ops up by name in the registry of ``ir``).
"""
from . import ops  # noqa: F401 (the op table: its families declare their ops as they load)
from .api import (abs, add, all, any, arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, argmax, argmin,
                  array_split, as_strided, astype, at, atleast_1d, atleast_2d, atleast_3d, average, avg_pool2d,
                  broadcast_arrays, broadcast_to, cbrt, ceil, choose, clip, column_stack, concatenate, conv1d,
                  conv2d, conv3d, conv_transpose2d, copysign, cos, cosh, cumprod, cumsum, custom_vjp, deg2rad,
                  diag, diagonal, diff, digamma, divide, divmod, dot, dropout, dstack, einsum, entr, equal, erf,
                  erfc, erfinv, exp, exp2, expand_dims, expit, expm1, fabs, flip, fliplr, flipud, float_power,
                  floor, floor_divide, fmod, full, full_like, gammaln, greater, greater_equal, heaviside, hstack,
                  hypot, inner, isfinite, isinf, isnan, kron, less, less_equal, linalg, log, log10, log1p, log2,
                  log_expit, log_ndtr, log_softmax, logaddexp, logaddexp2, logical_and, logical_not, logical_or,
                  logit, logsumexp, matmul, max, max_pool2d, maximum, mean, meshgrid, min, minimum, mod, moveaxis,
                  multiply, namespace as array_namespace, nan_to_num, nanmean, nansum, ndim, ndtr, negative, norm,
                  not_equal, one_hot, ones_like, outer, pad, power, prod, ptp, rad2deg, random, ravel, reciprocal,
                  relu, remainder, repeat, reshape, rint, roll, round, shape, sigmoid, sign, sin, sinc, sinh, size,
                  sliding_window_view, softmax, softmax_cross_entropy, softplus, split, sqrt, square, squeeze,
                  stack, std, stop_gradient, subtract, sum, swapaxes, take, take_along_axis, tan, tanh, tensordot,
                  tile, transpose, tril, triu, trunc, var, vdot, vstack, where, xlog1py, xlogy, zeros_like,
                  beta, betainc, betaln, gamma, gammainc, gammaincc, i0, i1, iv, j0, j1, kv, polygamma, y0, y1,
                  betaincc, stdtr)
from .cache import cache_info, clear_cache, prune_cache
from .integrations import scipy_objective
from .ir import Program, parse
from .jit import (CompiledFunction, CompiledGrad, CompiledLoss, TrainStep, compile, compile_loss, grad,
                  grad_program, hessian, hvp, jacfwd, jacobian, jacrev, jvp, optim, show_config, train_step,
                  value_and_grad, vjp)
from .runtime import run
from .tracing import FrozenValueError, trace
from .util import (VERSION as __version__, ArgumentError, ArgumentOverflowError, ArgumentWriteError, DtypeError,
                   IndexingError, LayoutError, MorphjitError, RecompileWarning, ShapeError, TracingError,
                   UnsupportedError, ravel_pytree)
_LAZY = {"dask": ".integrations.dask", "stats": ".api.scipy.stats", "signal": ".api.scipy.signal"}


def __getattr__(name):
    """``mj.dask``, ``mj.stats`` and ``mj.signal`` are imported on first use, so that ``import morphjit``
    imports neither Dask nor scipy.stats and scipy.signal (a third of its import time)."""
    if name in _LAZY:
        import importlib
        return importlib.import_module(_LAZY[name], __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
