"""morphjit: compile a NumPy-style loss function into one fused forward+backward step."""
from .api.core import (abs, add, astype, broadcast_to, clip, concatenate, cos, divide, dot, equal, exp,
    expand_dims, full, full_like, greater, greater_equal, less, less_equal, log, log1p, log_softmax, logical_and,
    logical_not, logical_or, logsumexp, matmul, max, maximum, mean, min, minimum, multiply, negative, not_equal,
    one_hot, ones_like, power, ravel, relu, reshape, sigmoid, sign, sin, softmax, softmax_cross_entropy, sqrt,
    square, squeeze, stack, std, subtract, sum, swapaxes, tanh, transpose, var, where, zeros_like)
from .api.indexing import at
from .api.take import choose, take, take_along_axis
from .api.ufuncs import (arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, cbrt, ceil, copysign, cosh,
    deg2rad, divmod, exp2, expm1, fabs, float_power, floor, floor_divide, fmod, heaviside, hypot, isfinite, isinf,
    isnan, log10, log2, logaddexp, logaddexp2, mod, nan_to_num, rad2deg, reciprocal, remainder, rint, round, sinc,
    sinh, tan, trunc)
from .api.scipy.special import (digamma, entr, erf, erfc, erfinv, expit, gammaln, log_expit, log_ndtr, logit, ndtr,
    softplus, xlog1py, xlogy)
from .api.reductions import all, any, argmax, argmin, average, cumprod, cumsum, nanmean, nansum, norm, prod, ptp
from .api.einsum import diag, diagonal, einsum, inner, kron, outer, tensordot, tril, triu, vdot
from .api.shapes import (array_split, atleast_1d, atleast_2d, atleast_3d, broadcast_arrays, column_stack, diff,
    dstack, flip, fliplr, flipud, hstack, meshgrid, moveaxis, ndim, pad, repeat, roll, shape, size, split, tile,
    vstack)
from .api.custom import custom_vjp, stop_gradient
from .api import namespace as array_namespace
from .api.scipy import namespace as scipy_namespace
from .api.conv import avg_pool2d, conv1d, conv2d, conv3d, conv_transpose2d, max_pool2d
from .api.stride_tricks import as_strided, sliding_window_view
from .cache.policy import cache_info, clear_cache, prune_cache
from .jit.compiled import (CompiledFunction, CompiledGrad, CompiledLoss, compile, compile_loss, grad, grad_program,
    value_and_grad)
from .util.errors import (ArgumentError, ArgumentOverflowError, DtypeError, IndexingError, MorphjitError,
    ShapeError, TracingError, UnsupportedError)
from .runtime.interp import run
from .util.pytree import ravel_pytree
from .jit.second import hessian, hvp
from .integrations.scipy_adapter import scipy_objective
from .ir.program import Program, parse
from .tracing.tracer import trace
from .jit.train import TrainStep, train_step
from .jit import optim
from .api import random
from .api.random import dropout
from .tracing.twice import FrozenValueError

from .api import linalg
from .tracing.substitutes import ANY_TRACE

ANY_TRACE.provided_by("scipy.stats", f"{__name__}.api.scipy.stats")   # SciPy's distributions on traced arrays

__version__ = "0.1.0"
LAZY = {"dask": ".integrations.dask", "stats": ".api.scipy.stats", "signal": ".api.scipy.signal"}


def __getattr__(name):
    """``mj.dask``, ``mj.stats`` and ``mj.signal`` are imported on first use, so that ``import morphjit``
    imports neither Dask nor scipy.stats and scipy.signal (a third of its import time)."""
    if name in LAZY:
        import importlib
        return importlib.import_module(LAZY[name], __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
