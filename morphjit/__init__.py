"""morphjit: compile a NumPy-style loss function into one fused forward+backward step."""
from .array_api import (
    abs, add, astype, broadcast_to, clip, concatenate, cos, divide, dot, equal, exp, expand_dims,
    full, full_like, greater, greater_equal, less, less_equal, log, log1p, log_softmax,
    logical_and, logical_not, logical_or, logsumexp, matmul, max, maximum, mean, min, minimum,
    multiply, negative, not_equal, one_hot, ones_like, power, ravel, relu, reshape, sigmoid, sign,
    sin, softmax, softmax_cross_entropy, sqrt, square, squeeze, stack, std, subtract, sum,
    swapaxes, tanh, transpose, var, where, zeros_like,
)
from .numpy_index import at
from .numpy_take import choose, take, take_along_axis
from .numpy_ext import (
    arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, cbrt, ceil, copysign, cosh,
    deg2rad, divmod, exp2, expm1, fabs, float_power, floor, floor_divide, fmod, heaviside, hypot,
    isfinite, isinf, isnan, log10, log2, logaddexp, logaddexp2, mod, nan_to_num, rad2deg,
    reciprocal, remainder, rint, round, sinc, sinh, tan, trunc,
)
from .special import (
    digamma, entr, erf, erfc, erfinv, expit, gammaln, log_expit, log_ndtr, logit, ndtr, softplus,
    xlog1py, xlogy,
)
from .numpy_reduce import (
    all, any, argmax, argmin, average, cumprod, cumsum, nanmean, nansum, norm, prod, ptp,
)
from .einsum import (
    diag, diagonal, einsum, inner, kron, outer, tensordot, tril, triu, vdot,
)
from .numpy_shape import (
    array_split, atleast_1d, atleast_2d, atleast_3d, broadcast_arrays, column_stack, diff, dstack,
    flip, fliplr, flipud, hstack, meshgrid, moveaxis, ndim, pad, repeat, roll, shape, size, split,
    tile, vstack,
)
from .custom import custom_vjp, stop_gradient
from . import array_namespace
from . import scipy_namespace
from .conv import avg_pool2d, conv1d, conv2d, conv3d, conv_transpose2d, max_pool2d
from .stride_tricks import as_strided, sliding_window_view
from .cache import cache_info, clear_cache, prune_cache
from .compiler import (CompiledFunction, CompiledGrad, CompiledLoss, compile, compile_loss, grad, grad_program,
                       value_and_grad)
from .errors import (ArgumentError, ArgumentOverflowError, DtypeError, IndexingError, MorphjitError, ShapeError,
                     TracingError, UnsupportedError)
from .interp import run
from .pytree import ravel_pytree
from .second import hessian, hvp
from .scipy_adapter import scipy_objective
from .ir import Program, parse
from .trace import trace
from .train import TrainStep, train_step
from . import optim
from . import rng as random
from .rng import dropout
from .frozen import FrozenValueError

from . import linalg
from .substitutes import ANY_TRACE

ANY_TRACE.provided_by("scipy.stats", f"{__name__}.stats")   # SciPy's distributions on traced arrays

__version__ = "0.1.0"


def __getattr__(name):
    """``mj.dask``, ``mj.stats`` and ``mj.signal`` are imported on first use, so that ``import morphjit``
    imports neither Dask nor scipy.stats and scipy.signal (a third of its import time)."""
    if name in ("dask", "stats", "signal"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
