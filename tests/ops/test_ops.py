"""Every op of the op table against NumPy / SciPy, on random shapes, float32 and float64.

``CASES`` is keyed by op: a test fails when an op of ``morphjit.ops.OPS`` has no case, or when
an exported ``mj.*`` array function is not called by any case, so adding an op or a function
forces adding its test. Each case is run three ways: traced (``mj.trace`` + ``verify`` + text
round trip + ``mj.run``), eagerly on NumPy arrays, and compared with the NumPy formula.
"""
from __future__ import annotations

import inspect
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import scipy.linalg
import scipy.special as sp

import morphjit as mj
from morphjit.api import bind as apply, core as array_api, indexing as numpy_index, stride_tricks
from morphjit.native import random as random_draws
from morphjit.ir import DTYPES_BY_NAME, OPS, dtype_name
from morphjit.api.custom import is_user_op

from support.checks import assert_like_numpy, magnitude, ops_of, trace_checked, trace_run
from support.random_keys import rand_shape, broadcast_family, rand_index, advanced_index

F32, F64 = np.float32, np.float64
DTYPES = [F32, F64]
SEEDS = [0, 1, 2]

# Edge values sprinkled into random arrays: zeros of both signs, negatives, large magnitudes.
SPECIALS = {
    "any": [0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 1e3, -1e3],
    "pos": [1e-3, 0.5, 1.0, 2.0, 1e3],
    "big": [-1e4, -1e3, 1e3, 1e4, 0.0],
    "unit": [0.0, -0.0, 1.0, -1.0, 0.5, -0.999999, 1e-9],
    "nonfinite": [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0],
}


# ---------------------------------------------------------------------------------------------
# Random shapes and values


def values(rng, shape, dtype, domain="any"):
    x = rng.standard_normal(shape) * rng.choice([1.0, 3.0, 30.0])
    if domain == "pos":
        x = np.abs(x) + 0.05
    if domain == "unit":
        x = np.tanh(x)
    x = np.where(rng.random(shape) < 0.25, rng.choice(SPECIALS[domain], size=shape), x)
    return np.asarray(x, dtype)


def ints(rng, shape, dtype, lo=-3, hi=4):
    int_dtype = np.int32 if dtype == F32 else np.int64
    return np.asarray(rng.integers(lo, hi, size=shape), int_dtype)


def bools(rng, shape):
    return np.asarray(rng.random(shape) < 0.5)


def rand_axis(rng, ndim, allow_none=True, allow_tuple=True):
    """A NumPy ``axis`` argument: None, an int (maybe negative) or a tuple of distinct axes."""
    choices = (["none"] if allow_none or ndim == 0 else []) + (["int"] if ndim else []) + \
        (["tuple"] if allow_tuple else [])
    kind = rng.choice(choices)
    if kind == "none":
        return None
    if kind == "int":
        return int(rng.integers(-ndim, ndim))
    axes = rng.permutation(ndim)[:rng.integers(0, ndim + 1)]
    return tuple(int(a) - ndim if rng.random() < 0.5 else int(a) for a in axes)


# ---------------------------------------------------------------------------------------------
# The table

@dataclass(frozen=True)
class Case:
    op: str                  # the op-table primitive this case exercises
    name: str
    fn: Callable             # written with mj.* (runs traced and eagerly)
    ref: Callable            # the NumPy / SciPy formula
    make: Callable           # (rng, dtype) -> (arguments, static keyword arguments)
    tol: float = 1.0         # multiplies the default tolerance of the dtype
    finite: bool = False     # finite inputs must give finite outputs (numerical stability)

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


def unary(domain="any"):
    return lambda rng, dt: ((values(rng, rand_shape(rng), dt, domain),), {})


def nary(*domains):
    def make(rng, dt):
        shapes = broadcast_family(rng, len(domains))
        return tuple(values(rng, s, dt, d) for s, d in zip(shapes, domains)), {}
    return make


def other_float(dt):
    return F64 if dt == F32 else F32


def reduce_make(domain="any"):
    def make(rng, dt):
        x = values(rng, rand_shape(rng), dt, domain)
        return (x,), dict(axis=rand_axis(rng, x.ndim), keepdims=bool(rng.random() < 0.5))
    return make


def matmul_make(rng, dt):
    m, k, n = (int(v) for v in rng.integers(1, 5, size=3))
    kind = rng.choice(["2d", "batched", "vec-left", "vec-right", "vec-vec"])
    if kind == "batched":
        a_shape, b_shape = (int(rng.integers(1, 3)), 1, m, k), (int(rng.integers(1, 4)), k, n)
    else:
        a_shape = (k,) if kind in ("vec-left", "vec-vec") else (m, k)
        b_shape = (k,) if kind in ("vec-right", "vec-vec") else (k, n)
    return (values(rng, a_shape, dt), values(rng, b_shape, dt)), {}


def concat_make(second_dtype=None, stack=False):
    def make(rng, dt):
        shape = rand_shape(rng, 0 if stack else 1, 3)
        ndim = len(shape) + (1 if stack else 0)
        axis = int(rng.integers(-ndim, ndim))
        arrays = []
        for i in range(int(rng.integers(1, 4)) if stack else int(rng.integers(2, 4))):
            s = list(shape)
            if not stack:
                s[axis] = int(rng.integers(1, 4))
            arrays.append(values(rng, tuple(s), (second_dtype or dt) if i == 1 else dt))
        return tuple(arrays), dict(axis=axis)
    return make


def reshape_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 3), dt)
    shape, size = x.shape, x.size
    new = [(size,), (-1,), tuple(reversed(shape)), (1,) + shape + (1,), shape[:-1] + (-1,),
           (-1,) + shape[1:]][int(rng.integers(0, 6))]
    return (x,), dict(newshape=new)


def transpose_make(rng, dt):
    x = values(rng, rand_shape(rng, 0, 4), dt)
    perm = None if rng.random() < 0.3 else tuple(int(p) for p in rng.permutation(x.ndim))
    return (x,), dict(axes=perm)


def swapaxes_make(rng, dt):
    x = values(rng, rand_shape(rng, 2, 3), dt)
    a, b = (int(v) - x.ndim * int(rng.integers(0, 2)) for v in rng.permutation(x.ndim)[:2])
    return (x,), dict(axis1=a, axis2=b)


def broadcast_to_make(rng, dt):
    shape = tuple(1 if rng.random() < 0.5 else d for d in rand_shape(rng))
    target = rand_shape(rng, 0, 2) + tuple(int(rng.integers(1, 4)) if d == 1 else d for d in shape)
    return (values(rng, shape, dt),), dict(shape=target)


def expand_dims_make(rng, dt):
    x = values(rng, rand_shape(rng), dt)
    n_new = int(rng.integers(1, 3))
    out_ndim = x.ndim + n_new
    axes = tuple(int(a) - out_ndim if rng.random() < 0.5 else int(a)
                 for a in rng.permutation(out_ndim)[:n_new])
    return (x,), dict(axis=axes[0] if len(axes) == 1 else axes)


def squeeze_make(rng, dt):
    shape = tuple(1 if rng.random() < 0.5 else d for d in rand_shape(rng, 1, 4))
    ones = [i for i, d in enumerate(shape) if d == 1]
    axis = None if rng.random() < 0.4 or not ones else tuple(
        i - len(shape) if rng.random() < 0.5 else i for i in ones[:int(rng.integers(1, len(ones) + 1))])
    return (values(rng, shape, dt),), dict(axis=axis)


def index_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 3, max_dim=6), dt)
    return (x,), dict(key=rand_index(rng, x.shape))


def advanced_index_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 4, max_dim=5), dt)
    return (x,), dict(key=advanced_index(rng, x.shape))


def iota_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 3), dt)
    return (x,), dict(axis=int(rng.integers(0, x.ndim)))


def times_position(x, axis):
    """``x`` times each element's index along ``axis`` (an iota, as ``np.arange`` of the batch size)."""
    return x * numpy_index.iota(x.shape, axis, np.int64, array_api.trace_of([x]))


def take_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 3, max_dim=5), dt)
    axis = rng.choice([None] + list(range(-x.ndim, x.ndim)))
    n = x.size if axis is None else x.shape[axis]
    return (x, rng.integers(-n, n, size=rand_shape(rng, 0, 2))), dict(axis=axis)


def take_along_axis_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 3, max_dim=5), dt)
    axis = int(rng.integers(-x.ndim, x.ndim))
    shape = [d if rng.random() < 0.7 else 1 for d in x.shape]
    shape[axis] = int(rng.integers(1, 6))
    return (x, rng.integers(-x.shape[axis], x.shape[axis], size=shape)), dict(axis=axis)


def choose_make(rng, dt):
    shapes = broadcast_family(rng, 4, 0, 3)
    return (rng.integers(0, 3, size=shapes[0]),) + tuple(values(rng, s, dt) for s in shapes[1:]), {}


def scatter_add_make(rng, dt):
    shape = rand_shape(rng, 1, 3, max_dim=5)
    axis = int(rng.integers(0, len(shape)))
    index = rng.integers(-shape[axis], shape[axis], size=rand_shape(rng, 0, 2))
    g = values(rng, shape[:axis] + index.shape + shape[axis + 1:], dt)
    return (g, index), dict(shape=shape, axis=axis)


def _scatter_add_ref(g, index, shape, axis):
    out = np.zeros(shape, g.dtype)
    np.add.at(out, (slice(None),) * axis + (index,), g)
    return out


def scatter_make(rng, dt):
    shape = rand_shape(rng, 1, 3, max_dim=5)
    axis = int(rng.integers(0, len(shape)))
    index = rng.integers(-shape[axis], shape[axis], size=rand_shape(rng, 0, 2))   # repeats likely
    x, v = values(rng, shape, dt), values(rng, shape[:axis] + index.shape + shape[axis + 1:], dt)
    return (x, v, index), dict(axis=axis)


def _scatter_ref(x, v, index, axis):
    out = x.copy()
    out[(slice(None),) * axis + (index,)] = v       # NumPy's: the last of repeated positions wins
    return out


def update_slice_make(rng, dt):
    (g,), box = unslice_make(rng, dt)
    return (values(rng, box["shape"], dt), g), {k: box[k] for k in ("starts", "stops", "steps")}


def _update_slice_ref(x, v, starts, stops, steps):
    out = x.copy()
    out[unslice_key(x.shape, starts, stops, steps)] = v
    return out


def unslice_make(rng, dt):
    shape = rand_shape(rng, 1, 3, max_dim=6)
    key = tuple(slice(*s) for s in (
        (rng.choice([None, int(rng.integers(-d, d))]), rng.choice([None, int(rng.integers(-d, d + 1))]),
         rng.choice([1, 2, -1, -3])) for d in shape))
    idx = [k.indices(d) for k, d in zip(key, shape)]
    starts, stops, steps = (tuple(t[i] for t in idx) for i in range(3))
    g = values(rng, np.zeros(shape)[key].shape, dt)
    return (g,), dict(shape=shape, starts=starts, stops=stops, steps=steps)


def unslice_key(shape, starts, stops, steps):
    return tuple(slice(a, None if b < 0 else b, s) for a, b, s in zip(starts, stops, steps))


def random_make(dist):
    """A seed (the int64 input a generator argument becomes) and the draw's distribution and dtype."""
    return lambda rng, dt: ((np.array(rng.integers(-2 ** 63, 2 ** 63, dtype=np.int64)),),
                            dict(dist=dist, dtype=dtype_name(dt)))


def random_draw(seed, dist, dtype):
    return array_api.bind("random", [seed], shape=(3, 4), dtype=dtype, dist=dist, stream=1)


def random_ref(seed, dist, dtype):
    return random_draws.draw(seed, 1, dist, DTYPES_BY_NAME[dtype], np.arange(12).reshape(3, 4))


def check_parameter_make(rng, dt):
    """A value and its mask of refused elements, none refused (a refused one raises: test_random.py)."""
    x = values(rng, rand_shape(rng), dt)
    return (x, np.zeros(x.shape, bool)), dict(what="rng.normal: scale < 0", error="ParameterValueError")


def check_parameter(x, refused, what, error):
    return array_api.bind("check_parameter", [x, refused], what=what, error=error)


def branch_gate_make(rng, dt):
    """A value and whether its path is taken (the gate is the identity either way)."""
    return (values(rng, rand_shape(rng), dt), np.bool_(rng.random() < 0.5)), {}


def branch_gate(x, taken):
    return array_api.bind("branch_gate", [x, taken])


def one_hot_make(rng, dt):
    depth = int(rng.integers(1, 6))
    return (ints(rng, rand_shape(rng, 0, 2), dt, 0, depth),), dict(depth=depth, dtype=dt)


def row_make(domain="any", masked=False, tuple_axis=True):
    def make(rng, dt):
        x = values(rng, rand_shape(rng, 1, 3), dt, domain)
        if domain == "big":
            x = (x + rng.choice([-1e3, 1e3, 3e4])).astype(dt)
        if masked:
            x = np.where(rng.random(x.shape) < 0.3, -np.inf, x).astype(dt)
        axis = rand_axis(rng, x.ndim, allow_none=False, allow_tuple=tuple_axis)
        return (x,), dict(axis=axis)
    return make


def sce_make(domain="any"):
    def make(rng, dt):
        shape = rand_shape(rng, 1, 3)
        logits = values(rng, shape, dt, domain)
        if domain == "big":
            logits = (logits + rng.choice([-1e3, 1e3, 3e4])).astype(dt)
        return (logits, ints(rng, shape[:-1], dt, 0, shape[-1])), {}
    return make


def soft_sce_make(rng, dt):
    logits = values(rng, rand_shape(rng, 1, 3), dt)
    return (logits, sp.softmax(values(rng, logits.shape, dt), axis=-1).astype(dt)), {}


def sce_ref(logits, labels):
    log_p = sp.log_softmax(logits, axis=-1)
    if labels.dtype.kind == "f":
        return -np.sum(labels * log_p, axis=-1)
    return -np.take_along_axis(log_p, labels[..., None].astype(np.intp), axis=-1)[..., 0]


def ties(first=lambda dt: dt, second=lambda dt: dt):
    """Operands drawn from a few integers, so comparisons see many ties."""
    def make(rng, dt):
        s1, s2 = broadcast_family(rng, 2)
        return (ints(rng, s1, dt, -2, 3).astype(first(dt)), ints(rng, s2, dt, -2, 3).astype(second(dt))), {}
    return make


def mixed_make(rng, dt):
    s1, s2 = broadcast_family(rng, 2)
    return (values(rng, s1, dt), values(rng, s2, other_float(dt))), {}


def clip_make(rng, dt):
    s1, s2, s3 = broadcast_family(rng, 3)
    lo, hi = -np.abs(values(rng, s2, dt)), np.abs(values(rng, s3, dt))
    return (values(rng, s1, dt), lo, hi), {}


def where_make(rng, dt):
    s1, s2, s3 = broadcast_family(rng, 3)
    return (bools(rng, s1), values(rng, s2, dt), values(rng, s3, dt)), {}


def pow_int_exponent_make(rng, dt):
    s1, s2 = broadcast_family(rng, 2)
    return (values(rng, s1, dt), ints(rng, s2, dt).astype(dt)), {}


def with_bool(rng, dt):
    return (bools(rng, rand_shape(rng)),), {}


def int_make(rng, dt):
    return (ints(rng, rand_shape(rng, 1, 3), dt, -50, 50),), {}


UNARY = [
    ("neg", mj.negative, np.negative), ("exp", mj.exp, np.exp), ("log", mj.log, np.log),
    ("log1p", mj.log1p, np.log1p), ("sqrt", mj.sqrt, np.sqrt), ("abs", mj.abs, np.abs),
    ("sign", mj.sign, np.sign), ("sin", mj.sin, np.sin), ("cos", mj.cos, np.cos),
    ("tanh", mj.tanh, np.tanh), ("sigmoid", mj.sigmoid, sp.expit),
    ("relu", mj.relu, lambda x: np.maximum(x, 0)), ("square", mj.square, np.square),
]
BINARY = [
    ("add", mj.add, np.add), ("sub", mj.subtract, np.subtract), ("mul", mj.multiply, np.multiply),
    ("div", mj.divide, np.divide), ("maximum", mj.maximum, np.maximum),
    ("minimum", mj.minimum, np.minimum),
]
PREDICATES = [
    ("lt", mj.less, np.less), ("le", mj.less_equal, np.less_equal), ("gt", mj.greater, np.greater),
    ("ge", mj.greater_equal, np.greater_equal), ("eq", mj.equal, np.equal),
    ("ne", mj.not_equal, np.not_equal),
]
LOGICAL = [("and", mj.logical_and, np.logical_and), ("or", mj.logical_or, np.logical_or)]

# NumPy's wider element-wise surface (morphjit/numpy_ext.py): (op, function, reference, domain).
EXT_UNARY = [
    ("expm1", mj.expm1, np.expm1, "any"), ("log2", mj.log2, np.log2, "pos"),
    ("log10", mj.log10, np.log10, "pos"), ("exp2", mj.exp2, np.exp2, "any"),
    ("sinh", mj.sinh, np.sinh, "any"), ("cosh", mj.cosh, np.cosh, "any"), ("tan", mj.tan, np.tan, "any"),
    ("arcsin", mj.arcsin, np.arcsin, "any"), ("arccos", mj.arccos, np.arccos, "any"),
    ("arctan", mj.arctan, np.arctan, "any"), ("arcsinh", mj.arcsinh, np.arcsinh, "any"),
    ("arccosh", mj.arccosh, np.arccosh, "pos"), ("arctanh", mj.arctanh, np.arctanh, "any"),
    ("cbrt", mj.cbrt, np.cbrt, "any"), ("fabs", mj.fabs, np.fabs, "any"), ("rint", mj.rint, np.rint, "any"),
    ("floor", mj.floor, np.floor, "any"), ("ceil", mj.ceil, np.ceil, "any"), ("trunc", mj.trunc, np.trunc, "any"),
    ("isnan", mj.isnan, np.isnan, "nonfinite"), ("isinf", mj.isinf, np.isinf, "nonfinite"),
    ("isfinite", mj.isfinite, np.isfinite, "nonfinite"),
    ("mul", mj.deg2rad, np.deg2rad, "any"), ("mul", mj.rad2deg, np.rad2deg, "any"),
    ("sin", mj.sinc, np.sinc, "any"), ("div", mj.reciprocal, np.reciprocal, "any"),
    ("rint", mj.round, np.round, "any"), ("rint", lambda x: mj.round(x, 2), lambda x: np.round(x, 2), "any"),
    ("rint", lambda x: mj.round(x, -1), lambda x: np.round(x, -1), "big"),
    ("where", mj.nan_to_num, np.nan_to_num, "nonfinite"),
    ("where", lambda x: mj.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-9.0),
     lambda x: np.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-9.0), "nonfinite"),
]
EXT_BINARY = [
    ("hypot", mj.hypot, np.hypot), ("arctan2", mj.arctan2, np.arctan2),
    ("logaddexp", mj.logaddexp, np.logaddexp), ("logaddexp2", mj.logaddexp2, np.logaddexp2),
    ("copysign", mj.copysign, np.copysign), ("remainder", mj.remainder, np.remainder),
    ("remainder", mj.mod, np.mod), ("fmod", mj.fmod, np.fmod), ("floor_divide", mj.floor_divide, np.floor_divide),
    ("heaviside", mj.heaviside, np.heaviside), ("pow", mj.float_power, np.float_power),
    ("floor_divide", lambda a, b: mj.divmod(a, b)[0], lambda a, b: np.divmod(a, b)[0]),
    ("remainder", lambda a, b: mj.divmod(a, b)[1], lambda a, b: np.divmod(a, b)[1]),
]
# SciPy's special functions (morphjit/special.py): (op, function, reference, domain, tolerance factor).
SPECIAL_UNARY = [
    ("erf", mj.erf, sp.erf, "any", 1), ("erfc", mj.erfc, sp.erfc, "any", 1),
    ("gammaln", mj.gammaln, sp.gammaln, "any", 10), ("gammaln", mj.gammaln, sp.gammaln, "pos", 10),
    ("erfinv", mj.erfinv, sp.erfinv, "unit", 10), ("digamma", mj.digamma, sp.digamma, "any", 100),
    ("digamma", mj.digamma, sp.digamma, "pos", 10), ("sigmoid", mj.expit, sp.expit, "any", 1),
    ("log", mj.logit, sp.logit, "unit", 10), ("log1p", mj.log_expit, sp.log_expit, "any", 10),
    ("log1p", mj.softplus, sp.softplus, "any", 10), ("erfc", mj.ndtr, sp.ndtr, "any", 10),
    ("erfc", mj.log_ndtr, sp.log_ndtr, "any", 100), ("entr", mj.entr, sp.entr, "any", 1),
    # SciPy's own kernels (morphjit/native/special.py)
    *[(name, getattr(mj, name), getattr(sp, name), domain, 1) for name in ("gamma", "i0", "i1", "j0", "j1", "y0", "y1")
      for domain in ("any", "pos")],
]
SPECIAL_BINARY = [("xlogy", mj.xlogy, sp.xlogy), ("xlog1py", mj.xlog1py, sp.xlog1py),
                  *[(name, getattr(mj, name), getattr(sp, name))
                    for name in ("beta", "betaln", "gammainc", "gammaincc", "iv", "kv", "stdtr")]]
# Reductions and scans (morphjit/numpy_reduce.py): (op, name, function(x, axis, keepdims), reference).
REDUCTIONS = [
    ("prod", "prod", mj.prod, np.prod), ("min", "argmax", mj.argmax, np.argmax),
    ("min", "argmin", mj.argmin, np.argmin), ("sum", "any", mj.any, np.any), ("sum", "all", mj.all, np.all),
    ("max", "ptp", mj.ptp, np.ptp), ("sum", "nansum", mj.nansum, np.nansum),
    ("div", "nanmean", mj.nanmean, np.nanmean), ("sum", "average", mj.average, np.average),
]
SCANS = [("concatenate", mj.cumsum, np.cumsum), ("concatenate", mj.cumprod, np.cumprod)]
NORMS = [None, 1, 2, np.inf, -np.inf, 0, 3, -1.5]
MATRIX_NORMS = [None, "fro", 1, -1, np.inf, -np.inf]


def single_axis_make(domain="any", dtype=None):
    def make(rng, dt):
        x = values(rng, rand_shape(rng, 1, 3), dt, domain) if dtype is None else ints(rng, rand_shape(rng, 1, 3), dt)
        return (x,), dict(axis=rand_axis(rng, x.ndim, allow_tuple=False), keepdims=bool(rng.random() < 0.5))
    return make


def norm_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 3), dt)
    ord = NORMS[int(rng.integers(0, len(NORMS)))]
    return (x,), dict(ord=ord, axis=int(rng.integers(-x.ndim, x.ndim)), keepdims=bool(rng.random() < 0.5))


def matrix_norm_make(rng, dt):
    x = values(rng, rand_shape(rng, 2, 3), dt)
    ord = MATRIX_NORMS[int(rng.integers(0, len(MATRIX_NORMS)))]
    axis = tuple(int(a) for a in rng.permutation(x.ndim)[:2])
    return (x,), dict(ord=ord, axis=axis, keepdims=bool(rng.random() < 0.5))


def weights_make(rng, dt):
    x = values(rng, rand_shape(rng, 1, 3), dt)
    axis = int(rng.integers(-x.ndim, x.ndim))
    return (x, np.abs(values(rng, (x.shape[axis],), dt)) + 0.5), dict(axis=axis)


def scan_make(domain="any", integers=False):
    def make(rng, dt):
        shape = rand_shape(rng, 1, 3, max_dim=9)
        x = ints(rng, shape, dt) if integers else values(rng, shape, dt, domain) / 4
        return (x,), dict(axis=None if rng.random() < 0.25 else int(rng.integers(-x.ndim, x.ndim)))
    return make


# Contractions (morphjit/einsum.py): (op, name, function, reference, make).
def operands_make(*shapes, integers=False):
    def make(rng, dt):
        return tuple(ints(rng, s, dt) if integers else values(rng, s, dt) for s in shapes), {}
    return make


def einsum_make(subscripts, *shapes, integers=False):
    make = operands_make(*shapes, integers=integers)
    return lambda rng, dt: (make(rng, dt)[0], dict(subscripts=subscripts))


EINSUMS = [("ij,jk->ik", (3, 4), (4, 5)), ("ij,jk", (3, 4), (4, 2)), ("bij,jk->bki", (2, 3, 4), (4, 5)),
           ("ii->i", (4, 4)), ("ii", (3, 3)), ("ij->", (3, 4)), ("ji", (3, 4)), ("...j,jk->...k", (2, 3, 4), (4, 5)),
           ("i,i", (4,), (4,)), ("i,j->ij", (3,), (4,)), ("bij,bij->b", (2, 3, 4), (2, 3, 4)),
           ("ij,jk,kl->il", (2, 3), (3, 4), (4, 2)), ("iij->j", (3, 3, 2)), ("bij,j->bi", (2, 3, 4), (4,)),
           ("ij,ij->ij", (3, 4), (3, 4)), ("i...,i->...", (3, 2, 2), (3,)), ("ij,kj->ikj", (1, 4), (3, 4)),
           ("ijk,ikl->ijl", (2, 3, 4), (2, 4, 5)), ("ii,ij->j", (3, 3), (3, 2))]
CONTRACTIONS = [
    ("matmul", "tensordot-1", lambda a, b: mj.tensordot(a, b, 1), lambda a, b: np.tensordot(a, b, 1),
     operands_make((2, 3, 4), (4, 5))),
    ("matmul", "tensordot-pairs", lambda a, b: mj.tensordot(a, b, ([1, 2], [0, 1])),
     lambda a, b: np.tensordot(a, b, ([1, 2], [0, 1])), operands_make((2, 3, 4), (3, 4, 2))),
    ("matmul", "tensordot-default", mj.tensordot, np.tensordot, operands_make((2, 3, 4), (3, 4, 2))),
    ("matmul", "inner", mj.inner, np.inner, operands_make((2, 4), (3, 4))),
    ("mul", "inner-scalar", mj.inner, np.inner, operands_make((), (3, 4))),
    ("mul", "outer", mj.outer, np.outer, operands_make((3,), (2, 2))),
    ("mul", "vdot", mj.vdot, np.vdot, operands_make((2, 3), (6,))),
    ("mul", "kron", mj.kron, np.kron, operands_make((2, 3), (3, 2))),
    ("mul", "kron-ranks", mj.kron, np.kron, operands_make((3,), (2, 2, 2))),
    ("diagonal", "trace", lambda a: mj.add(np.trace(a), 0), lambda a: np.trace(a), operands_make((3, 4))),
    ("diagonal", "trace-offset", lambda a: np.trace(a, 1, 1, 2), lambda a: np.trace(a, 1, 1, 2), operands_make((2, 3, 4))),
    ("diagonal", "diagonal", lambda a: mj.diagonal(a, -1, 2, 0), lambda a: np.diagonal(a, -1, 2, 0),
     operands_make((4, 2, 3))),
    ("diagonal", "diag-matrix", lambda a: mj.diag(a, 1), lambda a: np.diag(a, 1), operands_make((3, 4))),
    ("matmul", "diag-vector", lambda v: mj.diag(v, -2), lambda v: np.diag(v, -2), operands_make((3,))),
    ("sum", "diag-int-vector", mj.diag, np.diag, operands_make((3,), integers=True)),
    ("where", "tril", lambda a: mj.tril(a, -1), lambda a: np.tril(a, -1), operands_make((2, 3, 4))),
    ("where", "triu", lambda a: mj.triu(a, 1), lambda a: np.triu(a, 1), operands_make((4, 3))),
    ("mul", "einsum-int", lambda a, b: mj.einsum("ij,kj->ik", a, b), lambda a, b: np.einsum("ij,kj->ik", a, b),
     operands_make((2, 3), (4, 3), integers=True)),
]

# Shapes (morphjit/numpy_shape.py): (op, name, function, reference, make); function returns one array.
SHAPES = [
    ("reshape", "atleast", lambda v, a: mj.concatenate([mj.ravel(mj.atleast_1d(v[0])), mj.ravel(mj.atleast_2d(v)),
                                                        mj.ravel(mj.atleast_3d(a)), mj.ravel(mj.atleast_3d(v))]),
     lambda v, a: np.concatenate([np.atleast_1d(v[0]).ravel(), np.atleast_2d(v).ravel(), np.atleast_3d(a).ravel(),
                                  np.atleast_3d(v).ravel()]), operands_make((5,), (3, 4))),
    ("concatenate", "hstack", lambda a: mj.hstack([a, a]), lambda a: np.hstack([a, a]), operands_make((3, 4))),
    ("concatenate", "hstack-1d", lambda v: mj.hstack([v, v]), lambda v: np.hstack([v, v]), operands_make((5,))),
    ("concatenate", "vstack", lambda a, v: mj.vstack([a, v]), lambda a, v: np.vstack([a, v]), operands_make((3, 4), (4,))),
    ("concatenate", "dstack", lambda a: mj.dstack([a, a]), lambda a: np.dstack([a, a]), operands_make((3, 4))),
    ("concatenate", "column_stack", lambda v, a: mj.column_stack([v, a]), lambda v, a: np.column_stack([v, a]),
     operands_make((3,), (3, 2))),
    ("slice", "split", lambda c: mj.split(c, 2, axis=-1)[1], lambda c: np.split(c, 2, axis=-1)[1],
     operands_make((2, 3, 4))),
    ("slice", "array_split", lambda v: mj.array_split(v, 3)[0] * mj.array_split(v, 3)[2][0],
     lambda v: np.array_split(v, 3)[0] * np.array_split(v, 3)[2][0], operands_make((7,))),
    ("slice", "split-indices", lambda a: mj.split(a, [1, -1], axis=1)[1], lambda a: np.split(a, [1, -1], axis=1)[1],
     operands_make((3, 4))),
    ("transpose", "moveaxis", lambda c: mj.moveaxis(c, [0, 1], [-1, 0]), lambda c: np.moveaxis(c, [0, 1], [-1, 0]),
     operands_make((2, 3, 4))),
    ("slice", "flip", mj.flip, np.flip, operands_make((2, 3, 4))),
    ("slice", "flip-axis", lambda c: mj.flip(c, 1), lambda c: np.flip(c, 1), operands_make((2, 3, 4))),
    ("slice", "fliplr-flipud", lambda a: mj.fliplr(a) * mj.flipud(a), lambda a: np.fliplr(a) * np.flipud(a),
     operands_make((3, 3))),
    ("concatenate", "roll", lambda c: mj.roll(c, (1, -2), axis=(0, 2)), lambda c: np.roll(c, (1, -2), axis=(0, 2)),
     operands_make((2, 3, 4))),
    ("concatenate", "roll-flat", lambda a: mj.roll(a, 3), lambda a: np.roll(a, 3), operands_make((3, 4))),
    ("broadcast_to", "tile", lambda a: mj.tile(a, (2, 1, 3)), lambda a: np.tile(a, (2, 1, 3)), operands_make((3, 4))),
    ("broadcast_to", "repeat", lambda a: mj.repeat(a, 2, axis=1), lambda a: np.repeat(a, 2, axis=1),
     operands_make((3, 4))),
    ("broadcast_to", "repeat-flat", lambda a: mj.repeat(a, 3), lambda a: np.repeat(a, 3), operands_make((2, 2))),
    ("concatenate", "repeat-counts", lambda v: mj.repeat(v, [1, 0, 2, 3, 1]), lambda v: np.repeat(v, [1, 0, 2, 3, 1]),
     operands_make((5,))),
    ("concatenate", "pad-constant", lambda a: mj.pad(a, ((1, 2), (0, 3)), constant_values=5.0),
     lambda a: np.pad(a, ((1, 2), (0, 3)), constant_values=5.0), operands_make((3, 4))),
    ("concatenate", "pad-edge", lambda a: mj.pad(a, 2, mode="edge"), lambda a: np.pad(a, 2, mode="edge"),
     operands_make((3, 4))),
    ("concatenate", "pad-reflect", lambda a: mj.pad(a, ((2, 1), (3, 3)), mode="reflect"),
     lambda a: np.pad(a, ((2, 1), (3, 3)), mode="reflect"), operands_make((3, 4))),
    ("sub", "diff", lambda c: mj.diff(c, 2, axis=1), lambda c: np.diff(c, 2, axis=1), operands_make((2, 4, 3))),
    ("broadcast_to", "broadcast_arrays", lambda v, a: mj.broadcast_arrays(v, a)[1],
     lambda v, a: np.broadcast_arrays(v, a)[1], operands_make((4,), (3, 1))),
    ("broadcast_to", "meshgrid", lambda x, y: mj.meshgrid(x, y)[0] - mj.meshgrid(x, y, indexing="ij")[1].T,
     lambda x, y: np.meshgrid(x, y)[0] - np.meshgrid(x, y, indexing="ij")[1].T, operands_make((3,), (4,))),
    ("reshape", "meshgrid-sparse", lambda x, y: mj.meshgrid(x, y, sparse=True)[1],
     lambda x, y: np.meshgrid(x, y, sparse=True)[1], operands_make((3,), (4,))),
    ("mul", "shape-ndim-size", lambda c: c * (mj.shape(c)[1] + mj.ndim(c) + mj.size(c) + mj.size(c, 2)),
     lambda c: c * (np.shape(c)[1] + np.ndim(c) + np.size(c) + np.size(c, 2)), operands_make((2, 3, 4))),
    ("stop_gradient", "stop_gradient", mj.stop_gradient, lambda x: x, unary("nonfinite")),
]


# Integer operands where NumPy keeps integers (divisors drawn away from zero).
EXT_INTEGER = [
    ("floor", mj.floor, np.floor), ("ceil", mj.ceil, np.ceil), ("trunc", mj.trunc, np.trunc),
    ("remainder", lambda a: mj.remainder(a, 7), lambda a: np.remainder(a, 7)),
    ("remainder", lambda a: mj.remainder(a, -3), lambda a: np.remainder(a, -3)),
    ("fmod", lambda a: mj.fmod(a, -3), lambda a: np.fmod(a, -3)),
    ("floor_divide", lambda a: mj.floor_divide(a, 4), lambda a: np.floor_divide(a, 4)),
    ("floor_divide", lambda a: mj.floor_divide(a, -4), lambda a: np.floor_divide(a, -4)),
    ("floor_divide", lambda a: mj.round(a, -1), lambda a: np.round(a, -1)),
    ("mul", mj.deg2rad, np.deg2rad), ("log2", mj.log2, np.log2), ("isnan", mj.isnan, np.isnan),
]


def _cases():
    c = []
    for op, f, ref in UNARY:
        c.append(Case(op, "any", f, ref, unary("any")))
        c.append(Case(op, "nonfinite", f, ref, unary("nonfinite")))
    for op, f, ref in UNARY[2:5]:  # log, log1p, sqrt on their domain
        c.append(Case(op, "positive", f, ref, unary("pos")))
    c += [
        Case("exp", "int-input", mj.exp, np.exp, int_make),
        Case("cast", "other-float", lambda x: mj.astype(x, other_float(x.dtype)),
             lambda x: x.astype(other_float(x.dtype)), unary()),
        Case("cast", "to-int32", lambda x: mj.astype(x, np.int32), lambda x: x.astype(np.int32), unary()),
        Case("cast", "to-bool", lambda x: mj.astype(x, np.bool_), lambda x: x.astype(np.bool_), unary()),
        Case("cast", "int-to-float32", lambda i: mj.astype(i, F32), lambda i: i.astype(F32), int_make),
        Case("cast", "bool-to-float64", lambda b: mj.astype(b, F64), lambda b: b.astype(F64), with_bool),
    ]
    for op, f, ref in BINARY:
        c.append(Case(op, "broadcast", f, ref, nary("any", "any")))
        c.append(Case(op, "nonfinite", f, ref, nary("nonfinite", "any")))
        c.append(Case(op, "mixed-f32-f64", f, ref, mixed_make))
        c.append(Case(op, "python-scalar", lambda x, f=f: f(x, 2.5), lambda x, ref=ref: ref(x, 2.5), unary()))
        c.append(Case(op, "scalar-left", lambda x, f=f: f(-3, x), lambda x, ref=ref: ref(-3, x), unary()))
    c += [
        Case("pow", "positive-base", mj.power, np.power, nary("pos", "any")),
        Case("pow", "integer-exponents", mj.power, np.power, pow_int_exponent_make),
        Case("pow", "python-exponent", lambda x: mj.power(x, 3), lambda x: np.power(x, 3), unary()),
        Case("div", "int-operands", mj.divide, np.divide, ties(lambda dt: np.int64, lambda dt: np.int32)),
        Case("where", "broadcast", mj.where, np.where, where_make),
        Case("where", "python-scalar", lambda c, a, b: mj.where(c, a, 0.0),
             lambda c, a, b: np.where(c, a, 0.0), where_make),
        Case("where", "float-condition", lambda c, a, b: mj.where(a, b, 1),
             lambda c, a, b: np.where(a, b, 1), where_make),
        Case("clip", "array-bounds", mj.clip, np.clip, clip_make),
        Case("clip", "scalar-bounds", lambda x: mj.clip(x, -0.5, 2.0), lambda x: np.clip(x, -0.5, 2.0), unary()),
        Case("maximum", "clip-lower-only", lambda x: mj.clip(x, -1, None),
             lambda x: np.clip(x, -1, None), unary()),
    ]
    for op, f, ref, domain in EXT_UNARY:
        c.append(Case(op, f"{getattr(f, '__name__', 'fn')}-{domain}-{len(c)}", f, ref, unary(domain)))
        c.append(Case(op, f"{getattr(f, '__name__', 'fn')}-nonfinite-{len(c)}", f, ref, unary("nonfinite")))
    for op, f, ref in EXT_BINARY:
        name = f"{getattr(f, '__name__', 'fn')}-{len(c)}"
        c.append(Case(op, name + "-broadcast", f, ref, nary("any", "any")))
        c.append(Case(op, name + "-nonfinite", f, ref, nary("nonfinite", "any")))
        c.append(Case(op, name + "-mixed-f32-f64", f, ref, mixed_make))
        c.append(Case(op, name + "-python-scalar", lambda x, f=f: f(x, 2.5), lambda x, ref=ref: ref(x, 2.5), unary()))
        c.append(Case(op, name + "-scalar-left", lambda x, f=f: f(-3, x), lambda x, ref=ref: ref(-3, x), unary()))
    for op, f, ref, domain, tol in SPECIAL_UNARY:
        c.append(Case(op, f"{f.__name__}-{domain}-{len(c)}", f, ref, unary(domain), tol=tol))
        c.append(Case(op, f"{f.__name__}-nonfinite-{len(c)}", f, ref, unary("nonfinite"), tol=tol))
    for op, f, ref in SPECIAL_BINARY:
        c.append(Case(op, f"{f.__name__}-{len(c)}", f, ref, nary("any", "pos")))
        c.append(Case(op, f"{f.__name__}-nonfinite-{len(c)}", f, ref, nary("nonfinite", "any")))
        c.append(Case(op, f"{f.__name__}-zeros-{len(c)}", lambda y, f=f: f(0.0 * y, y), lambda y, ref=ref: ref(0.0 * y, y),
                      unary("nonfinite")))
    c.append(Case("betainc", f"betainc-{len(c)}", mj.betainc, sp.betainc, nary("pos", "pos", "unit")))
    c.append(Case("betainc", f"betainc-nonfinite-{len(c)}", mj.betainc, sp.betainc, nary("pos", "nonfinite", "unit")))
    c.append(Case("betaincc", f"betaincc-{len(c)}", mj.betaincc, sp.betaincc, nary("pos", "pos", "unit")))
    c.append(Case("betaincc", f"betaincc-nonfinite-{len(c)}", mj.betaincc, sp.betaincc, nary("nonfinite", "pos", "unit")))
    for n in (1, 2, 4):
        c.append(Case("polygamma", f"polygamma-{n}-{len(c)}", lambda x, n=n: mj.polygamma(n, x),
                      lambda x, n=n: sp.polygamma(n, x).astype(x.dtype), unary("any")))
    c.append(Case("digamma", f"polygamma-0-{len(c)}", lambda x: mj.polygamma(0, x), sp.digamma, unary("pos"), tol=10))
    for op, name, f, ref in REDUCTIONS:
        call = lambda x, axis, keepdims, f=f: f(x, axis=axis, keepdims=keepdims)
        expected = lambda x, axis, keepdims, ref=ref: ref(x, axis=axis, keepdims=keepdims)
        for domain in ("any", "nonfinite"):
            c.append(Case(op, f"{name}-{domain}", call, expected, single_axis_make(domain), tol=10))
    c += [
        Case("prod", "prod-tuple-axes", lambda x, axis, keepdims: mj.prod(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.prod(x, axis=axis, keepdims=keepdims), reduce_make(), tol=10),
        Case("prod", "prod-int", lambda x: mj.prod(x, axis=-1), lambda x: np.prod(x, axis=-1),
             lambda rng, dt: ((ints(rng, rand_shape(rng, 1, 3), dt),), {})),
        Case("min", "argmax-int", lambda x: mj.argmax(x, axis=0), lambda x: np.argmax(x, axis=0), int_make),
        Case("min", "argmax-flat", mj.argmax, np.argmax, unary("nonfinite")),
        Case("sum", "any-float", lambda x: mj.any(x), lambda x: np.any(x), unary()),
        Case("sum", "average-weights", lambda x, w, axis: mj.average(x, axis=axis, weights=w),
             lambda x, w, axis: np.average(x, axis=axis, weights=w), weights_make, tol=10),
        Case("sum", "average-returned", lambda x, w, axis: mj.average(x, axis=axis, weights=w, returned=True)[1],
             lambda x, w, axis: np.average(x, axis=axis, weights=w, returned=True)[1], weights_make, tol=10),
        Case("sum", "norm-vector", lambda x, ord, axis, keepdims: mj.norm(x, ord, axis, keepdims),
             lambda x, ord, axis, keepdims: np.linalg.norm(x, ord, axis, keepdims), norm_make, tol=100),
        Case("sum", "norm-matrix", lambda x, ord, axis, keepdims: mj.norm(x, ord, axis, keepdims),
             lambda x, ord, axis, keepdims: np.linalg.norm(x, ord, axis, keepdims), matrix_norm_make, tol=100),
        Case("sqrt", "norm-all", mj.norm, np.linalg.norm, unary(), tol=10),
    ]
    for op, f, ref in SCANS:
        c.append(Case(op, f"{f.__name__}-float", lambda x, axis, f=f: f(x, axis=axis),
                      lambda x, axis, ref=ref: ref(x, axis=axis), scan_make(), tol=100))
        c.append(Case(op, f"{f.__name__}-int", lambda x, axis, f=f: f(x, axis=axis),
                      lambda x, axis, ref=ref: ref(x, axis=axis), scan_make(integers=True)))
    for k, (subscripts, *shapes) in enumerate(EINSUMS):
        op = "matmul" if "," in subscripts else {"ji": "transpose", "ii->i": "diagonal"}.get(subscripts, "sum")
        c.append(Case(op, f"einsum-{k}",
                      lambda *xs, subscripts: mj.einsum(subscripts, *xs),
                      lambda *xs, subscripts: np.einsum(subscripts, *xs), einsum_make(subscripts, *shapes),
                      tol=100))  # products of three operands cancel: rounding grows with their magnitude
    for op, name, f, ref, make in CONTRACTIONS + SHAPES:
        c.append(Case(op, name, f, ref, make))
    for op, f, ref in EXT_INTEGER:
        c.append(Case(op, f"{getattr(f, '__name__', 'fn')}-int-{len(c)}", f, ref, int_make))
    for op, f, ref in PREDICATES:
        c.append(Case(op, "broadcast", f, ref, nary("any", "any")))
        c.append(Case(op, "ties", f, ref, ties()))
        c.append(Case(op, "int-vs-float", f, ref, ties(lambda dt: np.int32)))
        c.append(Case(op, "int-vs-int", f, ref, ties(lambda dt: np.int32, lambda dt: np.int64)))
        c.append(Case(op, "python-scalar", lambda x, f=f: f(x, 0.5), lambda x, ref=ref: ref(x, 0.5), unary()))
    for op, f, ref in LOGICAL:
        c.append(Case(op, "bool", lambda a, b, f=f: f(a > 0, b > 0), lambda a, b, ref=ref: ref(a > 0, b > 0),
                      nary("any", "any")))
        c.append(Case(op, "float-truth", f, ref, nary("any", "any")))
    c += [
        Case("not", "bool", lambda a: mj.logical_not(a > 0), lambda a: np.logical_not(a > 0), unary()),
        Case("not", "float-truth", mj.logical_not, np.logical_not, unary()),
        # Reductions
        Case("sum", "axis-keepdims", lambda x, axis, keepdims: mj.sum(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.sum(x, axis=axis, keepdims=keepdims), reduce_make()),
        Case("sum", "bool-counts", mj.sum, np.sum, with_bool),
        Case("sum", "int", lambda x: mj.sum(x, axis=0), lambda x: np.sum(x, axis=0), int_make),
        Case("sum", "mean", lambda x, axis, keepdims: mj.mean(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.mean(x, axis=axis, keepdims=keepdims), reduce_make()),
        Case("sum", "mean-int", mj.mean, np.mean, int_make),
        Case("sum", "var", lambda x, axis, keepdims: mj.var(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.var(x, axis=axis, keepdims=keepdims), reduce_make(), tol=10),
        Case("sum", "std-ddof1", lambda x: mj.std(x, axis=-1, ddof=1), lambda x: np.std(x, axis=-1, ddof=1),
             lambda rng, dt: ((values(rng, rand_shape(rng, 1, 3, max_dim=4) + (3,), dt),), {}), tol=10),
        Case("max", "axis-keepdims", lambda x, axis, keepdims: mj.max(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.max(x, axis=axis, keepdims=keepdims), reduce_make()),
        Case("max", "int", lambda x: mj.max(x, axis=-1), lambda x: np.max(x, axis=-1),
             lambda rng, dt: ((ints(rng, rand_shape(rng, 1, 3), dt),), {})),
        Case("max", "nonfinite", lambda x, axis, keepdims: mj.max(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.max(x, axis=axis, keepdims=keepdims), reduce_make("nonfinite")),
        Case("sum", "nonfinite", lambda x, axis, keepdims: mj.sum(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.sum(x, axis=axis, keepdims=keepdims), reduce_make("nonfinite")),
        Case("min", "axis-keepdims", lambda x, axis, keepdims: mj.min(x, axis=axis, keepdims=keepdims),
             lambda x, axis, keepdims: np.min(x, axis=axis, keepdims=keepdims), reduce_make()),
        # Views
        Case("reshape", "reshape", lambda x, newshape: mj.reshape(x, newshape),
             lambda x, newshape: np.reshape(x, newshape), reshape_make),
        Case("reshape", "ravel", mj.ravel, np.ravel, unary()),
        Case("reshape", "expand_dims", lambda x, axis: mj.expand_dims(x, axis),
             lambda x, axis: np.expand_dims(x, axis), expand_dims_make),
        Case("reshape", "squeeze", lambda x, axis: mj.squeeze(x, axis),
             lambda x, axis: np.squeeze(x, axis), squeeze_make),
        Case("transpose", "transpose", lambda x, axes: mj.transpose(x, axes),
             lambda x, axes: np.transpose(x, axes), transpose_make),
        Case("transpose", "swapaxes", lambda x, axis1, axis2: mj.swapaxes(x, axis1, axis2),
             lambda x, axis1, axis2: np.swapaxes(x, axis1, axis2), swapaxes_make),
        Case("broadcast_to", "broadcast_to", lambda x, shape: mj.broadcast_to(x, shape),
             lambda x, shape: np.broadcast_to(x, shape), broadcast_to_make),
        Case("slice", "basic-index", lambda x, key: numpy_index.getitem(x, key), lambda x, key: x[key],
             index_make),
        Case("gather", "advanced-index", lambda x, key: numpy_index.getitem(x, key), lambda x, key: x[key],
             advanced_index_make),
        Case("gather", "take", lambda x, i, axis: mj.take(x, i, axis=axis),
             lambda x, i, axis: np.take(x, i, axis=axis), take_make),
        Case("gather", "take_along_axis", lambda x, i, axis: mj.take_along_axis(x, i, axis),
             lambda x, i, axis: np.take_along_axis(x, i, axis), take_along_axis_make),
        Case("gather", "choose", lambda a, *cs: mj.choose(a, cs), lambda a, *cs: np.choose(a, cs), choose_make),
        Case("iota", "times-position", times_position, lambda x, axis: x * np.indices(x.shape)[axis], iota_make),
        Case("scatter_add", "repeated-indices", lambda g, i, shape, axis: array_api.scatter_add(g, (i,), shape, axis),
             _scatter_add_ref, scatter_add_make),
        Case("scatter", "repeated-indices", lambda x, v, i, axis: array_api.scatter(x, v, (i,), axis),
             _scatter_ref, scatter_make),
        Case("update_slice", "box", array_api.update_slice, _update_slice_ref, update_slice_make),
        Case("unslice", "unslice", array_api.unslice,
             lambda g, shape, starts, stops, steps: _place(g, shape, unslice_key(shape, starts, stops, steps)),
             unslice_make),
        # Structural
        Case("concatenate", "concatenate", lambda *xs, axis: mj.concatenate(xs, axis=axis),
             lambda *xs, axis: np.concatenate(xs, axis=axis), concat_make()),
        Case("concatenate", "mixed-dtypes", lambda *xs, axis: mj.concatenate(xs, axis=axis),
             lambda *xs, axis: np.concatenate(xs, axis=axis), concat_make(second_dtype=F64)),
        Case("concatenate", "stack", lambda *xs, axis: mj.stack(xs, axis=axis),
             lambda *xs, axis: np.stack(xs, axis=axis), concat_make(stack=True)),
        # Matmul
        Case("matmul", "matmul", mj.matmul, np.matmul, matmul_make),
        Case("matmul", "dot", mj.dot, np.dot,
             lambda rng, dt: matmul_make(rng, dt) if rng.random() < 0.7 else
             ((values(rng, (), dt), values(rng, rand_shape(rng), dt)), {})),
        # Sources
        Case("fill", "zeros_like", mj.zeros_like, np.zeros_like, unary()),
        Case("fill", "ones_like", mj.ones_like, np.ones_like, unary()),
        Case("fill", "full_like", lambda x: mj.full_like(x, 2.5), lambda x: np.full_like(x, 2.5), unary()),
        Case("add", "full-constant", lambda x: mj.add(x, mj.full(x.shape, 2.0, x.dtype)),
             lambda x: x + np.full(x.shape, 2.0, x.dtype), unary()),
        Case("fill", "full_like-int", lambda x: mj.full_like(x, 7), lambda x: np.full_like(x, 7), int_make),
        Case("random", "normal", random_draw, random_ref, random_make("normal")),
        Case("random", "uniform", random_draw, random_ref, random_make("uniform")),
        Case("check_parameter", "pass-through", check_parameter, lambda x, refused, what, error: x,
             check_parameter_make),
        Case("branch_gate", "identity", branch_gate, lambda x, taken: x, branch_gate_make),
        Case("identity", "identity", lambda x: array_api.bind("identity", [x]), lambda x: x, unary("nonfinite")),
        Case("one_hot", "one_hot", lambda labels, depth, dtype: mj.one_hot(labels, depth, dtype),
             lambda labels, depth, dtype: np.eye(depth, dtype=dtype)[labels], one_hot_make),
        # Stable composites
        Case("logsumexp", "any", lambda x, axis: mj.logsumexp(x, axis=axis),
             lambda x, axis: sp.logsumexp(x, axis=axis), row_make(), finite=True),
        Case("logsumexp", "large-magnitudes", lambda x, axis: mj.logsumexp(x, axis=axis, keepdims=True),
             lambda x, axis: sp.logsumexp(x, axis=axis, keepdims=True), row_make("big"), finite=True),
        Case("logsumexp", "masked", lambda x, axis: mj.logsumexp(x, axis=axis),
             lambda x, axis: sp.logsumexp(x, axis=axis), row_make(masked=True)),
        Case("logsumexp", "all-axes", mj.logsumexp, sp.logsumexp, unary("big"), finite=True),
        Case("softmax", "any", lambda x, axis: mj.softmax(x, axis=axis),
             lambda x, axis: sp.softmax(x, axis=axis), row_make(), finite=True),
        Case("softmax", "large-magnitudes", lambda x, axis: mj.softmax(x, axis=axis),
             lambda x, axis: sp.softmax(x, axis=axis), row_make("big"), finite=True),
        Case("softmax", "masked", lambda x, axis: mj.softmax(x, axis=axis),
             lambda x, axis: sp.softmax(x, axis=axis), row_make(masked=True)),
        Case("log_softmax", "any", lambda x, axis: mj.log_softmax(x, axis=axis),
             lambda x, axis: sp.log_softmax(x, axis=axis), row_make(), finite=True),
        Case("log_softmax", "large-magnitudes", lambda x, axis: mj.log_softmax(x, axis=axis),
             lambda x, axis: sp.log_softmax(x, axis=axis), row_make("big"), finite=True),
        Case("softmax_cross_entropy", "labels", mj.softmax_cross_entropy, sce_ref, sce_make(), finite=True),
        Case("softmax_cross_entropy", "large-magnitudes", mj.softmax_cross_entropy, sce_ref,
             sce_make("big"), finite=True),
        Case("log_softmax", "soft-targets", mj.softmax_cross_entropy, sce_ref, soft_sce_make, finite=True),
    ]
    return c


def _place(g, shape, key):
    out = np.zeros(shape, g.dtype)
    out[key] = g
    return out


CASES = _cases()


# Linear algebra over random batch shapes: well-conditioned matrices (a dominant diagonal), SPD
# ones, triangular ones; eigenvectors and Q compared squared (their signs are LAPACK's choice).
def _matrices(rng, dt, n, batch, kind):
    x = rng.standard_normal(batch + (n, n))
    if kind == "spd":
        x = x @ np.swapaxes(x, -1, -2) / n + np.eye(n)
    elif kind == "spd-not-symmetric":   # the lower triangle still positive definite
        x = x @ np.swapaxes(x, -1, -2) / n + np.eye(n) + 0.1 * rng.standard_normal(batch + (n, n))
    elif kind == "lower":
        x = np.tril(x) + 3.0 * np.eye(n)
    else:
        x = x + 3.0 * np.eye(n) * np.sqrt(n)
    return np.asarray(x, dt)


def linalg_make(kind, rhs=None):
    def make(rng, dt):
        n, batch = int(rng.integers(1, 5)), rand_shape(rng, 0, 2, max_dim=3)
        a = _matrices(rng, dt, n, batch, kind)
        if rhs is None:
            return (a,), {}
        b_shape = {"vector": (n,), "matrix": batch[1:] + (n, int(rng.integers(1, 4)))}[rhs]
        return (a, np.asarray(rng.standard_normal(b_shape), dt)), {}
    return make


def _gram_make(rng, dt):
    n, batch = int(rng.integers(1, 5)), rand_shape(rng, 0, 2, max_dim=3)
    return (np.asarray(rng.standard_normal(batch + (n, n)), dt), np.asarray(rng.standard_normal((n,)), dt)), {}


def _batched_solve_triangular(a, b, **kw):
    if a.ndim == 2:
        return scipy.linalg.solve_triangular(a, b, **kw)
    a, b = np.broadcast_to(a, np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + a.shape[-2:]), b
    b = np.broadcast_to(b, a.shape[:-2] + b.shape[-2:])
    return np.stack([scipy.linalg.solve_triangular(x, y, **kw) for x, y in zip(a, b)])


def _linalg_cases() -> list[Case]:
    la = mj.linalg
    return [
        Case("cholesky", "spd", la.cholesky, np.linalg.cholesky, linalg_make("spd"), tol=10),
        Case("cholesky", "upper", lambda a: la.cholesky(a, upper=True),
             lambda a: np.swapaxes(np.linalg.cholesky(a), -1, -2), linalg_make("spd"), tol=10),
        Case("cholesky", "scipy-lower", lambda a: la.cholesky(a, lower=True), np.linalg.cholesky, linalg_make("spd"),
             tol=10),
        Case("cholesky", "scipy-upper", lambda a: la.cholesky(a, lower=False),
             lambda a: np.swapaxes(np.linalg.cholesky(a), -1, -2), linalg_make("spd"), tol=10),
        Case("solve_triangular", "lower", lambda a, b: la.solve_triangular(a, b, lower=True),
             lambda a, b: _batched_solve_triangular(a, b, lower=True), linalg_make("lower", "matrix"), tol=10),
        Case("solve_triangular", "upper-trans", lambda a, b: la.solve_triangular(np.swapaxes(a, -1, -2), b, trans="T"),
             lambda a, b: np.linalg.solve(a, b), linalg_make("lower", "matrix"), tol=100),
        Case("cho_solve", "lower", lambda a, b: la.cho_solve(la.cho_factor(a, lower=True), b),
             np.linalg.solve, linalg_make("spd", "vector"), tol=100),
        Case("cho_solve", "upper", lambda a, b: la.cho_solve(la.cho_factor(a), b),
             np.linalg.solve, linalg_make("spd", "matrix"), tol=100),
        Case("solve_triangular", "cho_solve-given-factor", lambda a, b: la.cho_solve((a, True), b),
             lambda a, b: np.linalg.solve(np.tril(a) @ np.swapaxes(np.tril(a), -1, -2), b),
             linalg_make("lower", "matrix"), tol=100),
        Case("triangular_inverse", "lower", lambda a: la.triangular_inverse(a, lower=True),
             lambda a: np.linalg.inv(np.tril(a)), linalg_make("lower"), tol=100),
        Case("triangular_inverse", "upper", lambda a: la.triangular_inverse(np.swapaxes(a, -1, -2)),
             lambda a: np.linalg.inv(np.swapaxes(np.tril(a), -1, -2)), linalg_make("lower"), tol=100),
        Case("triangular_matmul", "lower-trans",
             lambda a, b: la.triangular_matmul(a, b, lower=True, trans=True),
             lambda a, b: np.swapaxes(np.tril(a), -1, -2) @ b, linalg_make("lower", "matrix")),
        Case("weighted_gram", "signed", lambda w, e: apply("weighted_gram", [w, e]),
             lambda w, e: np.swapaxes(np.tril(w), -1, -2) @ (e[..., None] * np.tril(w)), _gram_make),
        Case("solve", "vector", la.solve, np.linalg.solve, linalg_make("general", "vector"), tol=100),
        Case("solve", "matrix", la.solve, np.linalg.solve, linalg_make("general", "matrix"), tol=100),
        Case("inv", "inv", la.inv, np.linalg.inv, linalg_make("general"), tol=100),
        Case("det", "det", la.det, np.linalg.det, linalg_make("general"), tol=100),
        Case("slogdet", "slogdet", lambda a: mj.stack(la.slogdet(a), axis=-1),
             lambda a: np.stack(np.linalg.slogdet(a), axis=-1), linalg_make("general"), tol=100),
        *[Case("factored_slogdet", kind, lambda a: mj.stack(_slogdet_after_cholesky(a), axis=-1),
               lambda a: np.stack(np.linalg.slogdet(a), axis=-1), linalg_make(kind), tol=100)
          for kind in ("spd", "spd-not-symmetric")],
        *[Case("factored_inv", kind, lambda a: apply("factored_inv", [a, la.cholesky(a)]), np.linalg.inv,
               linalg_make(kind), tol=100) for kind in ("spd", "spd-not-symmetric")],
        Case("eigh", "eigvalsh", la.eigvalsh, np.linalg.eigvalsh, linalg_make("spd"), tol=100),
        Case("eigh", "vectors-squared", lambda a: la.eigh(a)[1] ** 2, lambda a: np.linalg.eigh(a)[1] ** 2,
             linalg_make("spd"), tol=1000),
        Case("qr", "squared", lambda a: mj.concatenate([x ** 2 for x in la.qr(a)], axis=-2),
             lambda a: np.concatenate([x ** 2 for x in np.linalg.qr(a)], axis=-2), linalg_make("general"), tol=100),
        Case("qr", "lstsq", lambda a, b: _lstsq_arrays(mj, la.lstsq(a, b)),
             lambda a, b: _lstsq_arrays(np, np.linalg.lstsq(a, b)), lstsq_make, tol=1000),
        Case("qr", "pinv", la.pinv, np.linalg.pinv, lambda rng, dt: (lstsq_make(rng, dt)[0][:1], {}), tol=1000),
        Case("qr", "pinv-wide", lambda a: la.pinv(a.T), lambda a: np.linalg.pinv(a.T),
             lambda rng, dt: (lstsq_make(rng, dt)[0][:1], {}), tol=1000),
        Case("svd", "svdvals", la.svdvals, np.linalg.svdvals, rectangular_make, tol=100),
        Case("svd", "values", lambda a: la.svd(a, compute_uv=False), lambda a: np.linalg.svd(a, compute_uv=False),
             rectangular_make, tol=100),
        *[Case("svd", f"reconstruction-full={full}", lambda a, full=full: _svd_reconstruction(la, a, full),
               lambda a: a, rectangular_make, tol=100) for full in (False, True)],
        *[Case("svd", f"orthogonal-full={full}", lambda a, full=full: _svd_gram(mj, la.svd(a, full)),
               lambda a, full=full: _svd_gram(np, np.linalg.svd(a, full)), rectangular_make, tol=100)
          for full in (False, True)],
        Case("svd", "matrix-norms", lambda a, axis, keepdims: _matrix_norms(mj, a, axis, keepdims),
             lambda a, axis, keepdims: _matrix_norms(np, a, axis, keepdims), matrix_norms_make, tol=100),
    ]


def rectangular_make(rng, dt):
    """A stack of matrices of random shapes, tall, wide or square."""
    shape = rand_shape(rng, 0, 2, max_dim=3) + tuple(int(d) for d in rng.integers(1, 5, size=2))
    return (np.asarray(rng.standard_normal(shape), dt),), {}


def matrix_norms_make(rng, dt):
    (a,), _ = rectangular_make(rng, dt)
    a = a if a.ndim > 2 else a[None]
    axes = [int(d) for d in rng.permutation(a.ndim)[:2]]
    return (a,), dict(axis=tuple(d - a.ndim if rng.random() < 0.5 else d for d in axes),
                      keepdims=bool(rng.random() < 0.5))


def _svd_reconstruction(la, a, full):
    u, s, vh = la.svd(a, full_matrices=full)
    k = s.shape[-1]
    return (u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :]


def _svd_gram(ns, usv):
    """U^T U and Vh Vh^T (identities, free of the vectors' signs) and the singular values."""
    u, s, vh = usv
    return ns.concatenate([ns.ravel(x) for x in (ns.swapaxes(u, -1, -2) @ u, vh @ ns.swapaxes(vh, -1, -2), s)])


def _matrix_norms(ns, a, axis, keepdims):
    norm = mj.norm if ns is mj else np.linalg.norm
    return ns.stack([norm(a, ord, axis, keepdims) for ord in ("nuc", 2, -2)])


def _slogdet_after_cholesky(a):
    mj.linalg.cholesky(a)   # the factor slogdet is then given
    return mj.linalg.slogdet(a)


def _lstsq_arrays(ns, result):
    """The solution, the residuals and the singular values side by side; the rank as an array."""
    x, residuals, rank, s = result
    return ns.concatenate([x, residuals, s, ns.full_like(s[:1], rank)], axis=0)


def lstsq_make(rng, dt):
    """A tall well-conditioned matrix (orthonormal columns, scaled) and a vector right-hand side."""
    m = int(rng.integers(2, 6))
    n = int(rng.integers(1, m))
    q, _ = np.linalg.qr(rng.standard_normal((m, n)))
    a = q * rng.uniform(1.0, 3.0, n)
    return (a.astype(dt), rng.standard_normal(m).astype(dt)), {}


CASES += _linalg_cases()


# ---------------------------------------------------------------------------------------------
# Windows (morphjit.conv): views of sliding windows, their transpose, max pooling

def window_make(rng, dt):
    shape = rand_shape(rng, 1, 3, max_dim=5)
    axis = tuple(int(a) for a in rng.permutation(len(shape))[:rng.integers(1, len(shape) + 1)])
    return (values(rng, shape, dt),), dict(window_shape=tuple(int(rng.integers(1, shape[a] + 1)) for a in axis),
                                           axis=axis)


def unwindow_make(rng, dt):
    n, k = int(rng.integers(3, 7)), int(rng.integers(1, 3))
    return (values(rng, (2, n - k + 1, k), dt),), dict(n=n)


def _unwindow_ref(g, n):
    out = np.zeros(g.shape[:1] + (n,), g.dtype)
    for a in range(g.shape[-1]):
        out[:, a:a + g.shape[1]] += g[..., a]
    return out


def pool_make(domain="any"):
    def make(rng, dt):
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) + tuple(int(d) for d in rng.integers(2, 6, 2))
        return (values(rng, shape, dt, domain),), dict(k=int(rng.integers(1, 3)), stride=int(rng.integers(1, 3)))
    return make


def _max_pool_ref(x, k, stride):
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.max(windows, axis=(4, 5))


CASES += [
    Case("window", "sliding_window_view", lambda x, window_shape, axis: mj.sliding_window_view(x, window_shape, axis),
         lambda x, window_shape, axis: np.lib.stride_tricks.sliding_window_view(x, window_shape, axis), window_make),
    Case("unwindow", "col2im", lambda g, n: stride_tricks.unwindow(g, (2, n), stride_tricks.windows((2, n), (1,), (g.shape[-1],))[1]),
         _unwindow_ref, unwindow_make),
    Case("window_max", "max_pool2d", lambda x, k, stride: mj.max_pool2d(x, k, stride), _max_pool_ref, pool_make()),
]


def _args(case: Case, dtype, seed):
    rng = np.random.default_rng([zlib.crc32(case.id.encode()), seed, np.dtype(dtype).itemsize])
    return case.make(rng, dtype)


def _check(case: Case, actual, args, kw):
    with np.errstate(all="ignore"):
        expected = case.ref(*args, **kw)
    scale = magnitude(*args)
    rtol = None if np.asarray(expected).dtype.kind != "f" else \
        case.tol * (1e-5 if np.asarray(expected).dtype == F32 else 1e-12)
    assert_like_numpy(actual, expected, rtol=rtol, scale=scale)
    if case.finite and all(np.all(np.isfinite(a)) for a in args if np.asarray(a).dtype.kind == "f"):
        assert np.all(np.isfinite(actual)), "finite inputs gave a non-finite result"


params = pytest.mark.parametrize
case_params = params("case", CASES, ids=[c.id for c in CASES])


@case_params
@params("dtype", DTYPES, ids=["f32", "f64"])
@params("seed", SEEDS)
def test_traced_matches_numpy(case, dtype, seed):
    args, kw = _args(case, dtype, seed)
    _, (out,) = trace_run(lambda *a: case.fn(*a, **kw), *args)
    _check(case, out, args, kw)


@case_params
@params("dtype", DTYPES, ids=["f32", "f64"])
def test_eager_matches_numpy(case, dtype):
    for seed in SEEDS:
        args, kw = _args(case, dtype, seed)
        with np.errstate(all="ignore"):
            out = case.fn(*args, **kw)
        assert isinstance(out, np.ndarray), f"eager {case.id} gave a {type(out).__name__}"
        _check(case, out, args, kw)


# ---------------------------------------------------------------------------------------------
# The table covers the op table and the public functions

def test_every_op_has_a_case():
    missing = sorted(set(OPS) - {c.op for c in CASES} - set(filter(is_user_op, OPS)))
    assert not missing, f"ops without a test case in tests/ops/test_ops.py: {missing}"


def test_every_case_exercises_its_op():
    for case in CASES:
        seen = set()
        for dtype in DTYPES:
            for seed in SEEDS:
                args, kw = _args(case, dtype, seed)
                seen |= ops_of(trace_checked(lambda *a: case.fn(*a, **kw), *args))
        assert case.op in seen, f"case {case.id} never binds {case.op} (it binds {sorted(seen)})"


def _array_functions():
    """The array functions exported as ``mj.*``."""
    return sorted(n for n in dir(mj) if not n.startswith("_") and inspect.isfunction(getattr(mj, n))
                  and any(getattr(mj, n) is getattr(m, n, None) for m in (array_api, numpy_index)))


def _referenced(fn, names) -> set:
    """The mj functions a case function is, binds as a default, or calls as ``mj.<name>``."""
    refs = {n for n in names for obj in (fn, *(fn.__defaults__ or ())) if getattr(mj, n) is obj}
    if "mj" in fn.__code__.co_names:
        refs |= set(fn.__code__.co_names) & set(names)
    return refs


def test_every_mj_array_function_has_a_case():
    names = _array_functions()
    assert {"exp", "sum", "matmul", "softmax_cross_entropy"} <= set(names)
    referenced = set().union(*(_referenced(c.fn, names) for c in CASES))
    missing = sorted(set(names) - referenced)
    assert not missing, f"mj functions that no case in tests/ops/test_ops.py calls: {missing}"


# ---------------------------------------------------------------------------------------------
# Composites that declare a lowering (the same function in simpler ops) agree with their impl

LOWER_CASES = {
    "logsumexp": row_make("big"), "softmax": row_make(masked=True), "log_softmax": row_make("big"),
    "softmax_cross_entropy": sce_make("big"),
    "erfinv": unary("unit"), "digamma": unary("any"), "entr": unary("any"), "xlogy": nary("any", "pos"),
    "xlog1py": nary("any", "pos"), "branch_gate": branch_gate_make, "identity": unary("any"),
    "window_max": lambda rng, dt: ((values(rng, (2, 3, 5, 4), dt),), dict(shape=(2, 3, 4, 2, 2, 3),
                                                                          coeffs=stride_tricks.windows((2, 3, 5, 4), (2, 3), (2, 3))[1],
                                                                          axes=(4, 5))),
}


def _lowered_ops():
    return sorted(name for name, op in OPS.items() if getattr(op, "lower", None) is not None and not is_user_op(name))


def test_every_lowering_has_a_case():
    missing = sorted(set(_lowered_ops()) - set(LOWER_CASES))
    assert not missing, f"ops with a lowering but no case in LOWER_CASES: {missing}"


@params("op_name", sorted(LOWER_CASES))
@params("dtype", DTYPES, ids=["f32", "f64"])
def test_lowering_matches_impl(op_name, dtype):
    op = OPS[op_name]
    if getattr(op, "lower", None) is None:
        pytest.skip(f"{op_name} has no lowering")
    for seed in SEEDS:
        rng = np.random.default_rng([zlib.crc32(op_name.encode()), seed])
        args, kw = LOWER_CASES[op_name](rng, dtype)
        params_ = {"axes": array_api.normalize_axes(op_name, kw["axis"], args[0].ndim)} if "axis" in kw else kw
        program, (out,) = trace_run(lambda *a: op.lower(*a, **params_), *args)
        assert op_name not in ops_of(program), f"the lowering of {op_name} binds {op_name} itself"
        with np.errstate(all="ignore"):
            expected = op.impl(*args, **params_)
        assert_like_numpy(out, expected, scale=magnitude(*args))
