"""morphjit: compile a NumPy-style loss function into one fused forward+backward step."""
from .array_api import (
    abs, add, astype, broadcast_to, clip, concatenate, cos, divide, dot, equal, exp, expand_dims,
    full, full_like, greater, greater_equal, less, less_equal, log, log1p, log_softmax,
    logical_and, logical_not, logical_or, logsumexp, matmul, max, maximum, mean, min, minimum,
    multiply, negative, not_equal, one_hot, ones_like, power, ravel, relu, reshape, sigmoid, sign,
    sin, softmax, softmax_cross_entropy, sqrt, square, squeeze, stack, std, subtract, sum,
    swapaxes, tanh, transpose, var, where, zeros_like,
)
from .array_api import at, choose, take, take_along_axis
from .cache import cache_info, clear_cache, prune_cache
from .compiler import CompiledLoss, compile_loss, grad_program
from .errors import DtypeError, IndexingError, MorphjitError, ShapeError, TracingError, UnsupportedError
from .interp import run
from .ir import Program, parse
from .trace import trace
from .train import TrainStep, train_step
from . import optim

from . import linalg

__version__ = "0.1.0"


def __getattr__(name):
    """``mj.dask`` is imported on first use, so ``import morphjit`` does not import Dask."""
    if name == "dask":
        import importlib
        return importlib.import_module(".dask", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
