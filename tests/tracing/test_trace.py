"""Tracing plain NumPy code, NumPy 2 dtype promotion, the text form and the verifier.

The NumPy cases are ordinary NumPy functions: each one is traced and run, and compared with
the same function called on the concrete arrays. A test fails when a NumPy function of the
dispatch tables (``dispatch.UFUNCS`` / ``FUNCTIONS``) is not reached by any case.
"""
from __future__ import annotations

import collections
import zlib

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
import scipy.special as sp
import pytest

import morphjit as mj
from morphjit.api import dispatch, indexing as numpy_index
from morphjit.util import pytree
from morphjit.ir import Binding, Lit, Program, TensorType, Var, parse
from morphjit.ir.program import VerifyError

from support.checks import assert_like_numpy, magnitude, ops_of, trace_checked, trace_run

F32, F64 = np.float32, np.float64
DTYPES = [F32, F64]
SEEDS = [0, 1]


def operands(rng, dtype):
    """x, v: [n, m]; w: [m, k]; b: [k]; x6: [n, 6]; t: [n, m, k] (random sizes, edge values)."""
    n, m, k = (int(d) for d in rng.integers(1, 5, size=3))

    def arr(*shape):
        a = rng.standard_normal(shape) * rng.choice([1.0, 5.0])
        a = np.where(rng.random(shape) < 0.2, rng.choice([0.0, -0.0, -1.0, 50.0, -50.0], size=shape), a)
        return a.astype(dtype)

    return dict(x=arr(n, m), v=arr(n, m), w=arr(m, k), b=arr(k), x6=arr(n, 6), t=arr(n, m, k))


# Each case: a NumPy function of some of the operands above (by parameter name).
NUMPY_CASES = {
    # ufuncs
    "exp": lambda x: np.exp(x),
    "copy": lambda x: np.copy(x) * 2,
    "log-sqrt-log1p": lambda x: (np.log(np.abs(x) + 1), np.sqrt(np.abs(x)), np.log1p(np.abs(x))),
    "trig": lambda x: (np.sin(x), np.cos(x), np.tanh(x)),
    "sign-abs-neg-pos": lambda x: (np.sign(x), np.absolute(x), np.negative(x), np.positive(x), abs(x), -x, +x),
    "square": lambda x: np.square(x),
    "arithmetic-ufuncs": lambda x, v: (np.add(x, v), np.subtract(x, 1), np.multiply(2, x),
                                       np.divide(x, 1 + v * v), np.power(np.abs(x), 0.5)),
    "arithmetic-operators": lambda x, v, b: (x + v, 1 - x, x * 3, x / 4, 2 / (1 + x * x), x ** 2,
                                             np.abs(x) ** v, 2.0 ** v, x[:, :1] + b),
    "maximum-minimum": lambda x, v: (np.maximum(x, v), np.minimum(x, 0.5), np.maximum(0, x)),
    "comparison-ufuncs": lambda x, v: (np.less(x, v), np.less_equal(x, 0), np.greater(x, v),
                                       np.greater_equal(x, 0), np.equal(x, v), np.not_equal(x, 0)),
    "comparison-operators": lambda x, v: (x < v, x <= 0, x > v, 0 >= x, x == x, x != v),
    "logical": lambda x, v: (np.logical_and(x > 0, v > 0), np.logical_or(x > 0, v), np.logical_not(x),
                             (x > 0) & (v < 0), (x > 0) | (v < 0), ~(x > 0), True & (x > 0),
                             np.bitwise_and(x > 0, v > 0), np.bitwise_or(x > 0, v > 0), np.invert(x > 0)),
    "matmul": lambda x, w: (x @ w, np.matmul(x, w), np.matmul(x[0], w), x[0] @ w @ w.T),
    "dot": lambda x, w: (np.dot(x, w), np.dot(x[0], x[0]), np.dot(2.0, x), x.dot(w)),
    "linear-relu": lambda x, w, b: np.maximum(x @ w + b, 0),
    "batched-matmul": lambda t: (np.swapaxes(t, 1, 2) @ t, t @ t[0].T),
    # morphjit/numpy_ext.py
    "exp-log-family": lambda x: (np.expm1(x), np.log2(np.abs(x) + 1), np.log10(np.abs(x) + 1), np.exp2(x),
                                 np.cbrt(x), np.fabs(x), np.reciprocal(x), np.float_power(np.abs(x), 1.5)),
    "hyperbolic-inverse-trig": lambda x: (np.sinh(x), np.cosh(x), np.tan(x), np.arcsin(x / 60), np.arccos(x / 60),
                                          np.arctan(x), np.arcsinh(x), np.arccosh(np.abs(x) + 1), np.arctanh(x / 60),
                                          np.deg2rad(x), np.rad2deg(x), np.radians(x), np.degrees(x), np.sinc(x)),
    "binary-float-ufuncs": lambda x, v: (np.hypot(x, v), np.arctan2(x, v), np.logaddexp(x, v),
                                         np.logaddexp2(x, v), np.copysign(x, v), np.heaviside(x, 0.5)),
    "rounding": lambda x: (np.floor(x), np.ceil(x), np.trunc(x), np.rint(x), np.round(x), np.around(x, 1),
                           np.round(x.astype(np.int32), -1), np.floor(x.astype(np.int64))),
    "division-remainder": lambda x, v: (np.remainder(x, 1.5), np.mod(x, v), x % 2, 7 % (np.abs(x) + 1), x // 1.5,
                                        -3 // (np.abs(x) + 1), np.fmod(x, v), np.floor_divide(x, 3), divmod(x, 2.5),
                                        np.divmod(x, 2), x.astype(np.int32) % 3, x.astype(np.int64) // -2),
    "non-finite": lambda x: (np.isnan(x / x), np.isinf(1 / x), np.isfinite(1 / x), np.nan_to_num(1 / x),
                             np.nan_to_num(x / x, nan=-1.0, posinf=5.0)),
    # morphjit/special.py: SciPy's ufuncs
    "scipy-special": lambda x, v: (sp.expit(x), sp.logit(sp.expit(x)), sp.log_expit(x), sp.erf(x), sp.erfc(x),
                                   sp.erfinv(np.tanh(x)), sp.ndtr(x), sp.log_ndtr(x), sp.gammaln(x), sp.digamma(x),
                                   sp.psi(np.abs(x) + 1), sp.xlogy(x, np.abs(v)), sp.xlog1py(x, np.abs(v)),
                                   sp.entr(x), sp.softplus(x)),
    "scipy-special-kernels": lambda x, v: _special_kernels(x.astype(np.float64), v.astype(np.float64)),
    "svd": lambda x: (np.linalg.svd(x)[1], np.linalg.svdvals(x)),
    # morphjit/numpy_reduce.py
    "reductions": lambda x, t: (np.prod(x), np.prod(t, axis=(0, 2)), x.prod(axis=0), np.argmax(x), np.argmin(t, axis=1),
                                x.argmax(axis=0), x.argmin(), np.any(x > 0), np.all(t > 0, axis=0), x.any(), x.all(),
                                np.ptp(t, axis=-1), np.average(x), np.average(t, axis=1, weights=np.abs(x[0]) + 1),
                                np.nansum(x / x), np.nanmean(x / x, axis=0)),
    "scans-norms": lambda x, t: (np.cumsum(x), np.cumsum(t, axis=1), x.cumsum(axis=0), np.cumprod(x / 10, axis=-1),
                                 x.cumprod(), np.linalg.norm(x), np.linalg.norm(t, axis=(0, 2)), np.linalg.norm(x, 1),
                                 np.linalg.norm(x[0], np.inf)),
    # morphjit/einsum.py
    "contractions": lambda x, w, t: (np.einsum("ij,jk->ik", x, w), np.einsum("bij,jk", t, w.T), np.tensordot(t, w.T, 1),
                                     np.inner(x, x), np.outer(x[0], w), np.vdot(x, x), np.kron(x, w), np.trace(x),
                                     np.diag(x), np.diag(x[0], 1), np.diagonal(t, 0, 0, 2), np.tril(x), np.triu(t, -1)),
    # morphjit/numpy_shape.py
    "shapes": lambda x, t, b: (np.atleast_1d(b), np.atleast_2d(b), np.atleast_3d(x), np.hstack([x, x]), np.vstack([x, x]),
                               np.dstack([x, x]), np.column_stack([b, b]), np.split(t, 1, axis=1)[0],
                               np.array_split(b, 2)[0], np.moveaxis(t, 0, -1), np.flip(t), np.fliplr(x), np.flipud(x),
                               np.roll(t, 1, axis=2), np.tile(b, 2), np.repeat(x, 2, axis=0), np.pad(x, 1),
                               np.diff(t, axis=1), np.broadcast_arrays(b, x[:, :1])[0], np.meshgrid(b, b)[0],
                               np.shape(x)[0] * x, np.ndim(x) * x, np.size(x) * x),
    # morphjit/stride_tricks.py
    "windows": lambda x6: (np.lib.stride_tricks.sliding_window_view(x6, 3, axis=1), sliding_window_view(x6, (1, 2))),
    "as_strided": lambda x6: (np.lib.stride_tricks.as_strided(x6, (x6.shape[0], 4, 3), (x6.strides[0], x6.strides[1], x6.strides[1])),),
    "hvdsplit": lambda t: (np.hsplit(t, 1)[0], np.vsplit(t, 1)[0], np.dsplit(t, [1])[1]),
    "real-parts": lambda x: (np.real(x), np.imag(x), np.conj(x), np.angle(x), np.iscomplex(x), np.isreal(x),
                             np.iscomplexobj(x) + x, np.isrealobj(x) * x, np.count_nonzero(x > 0, axis=0),
                             np.count_nonzero(x)),
    # functions
    "sum": lambda x, t: (np.sum(x), np.sum(x, axis=1), np.sum(t, axis=(0, 2)), np.sum(x, axis=-1, keepdims=True)),
    "mean": lambda x, t: (np.mean(x), np.mean(t, axis=1), np.mean(x, axis=0, keepdims=True)),
    "var-std": lambda x: (np.var(x), np.var(x, axis=0), np.std(x, axis=1, keepdims=True), np.std(x)),
    "max-min": lambda x, t: (np.max(x), np.max(t, axis=-1), np.amax(x, axis=0), np.min(x, axis=1),
                             np.amin(t, axis=(0, 1), keepdims=True)),
    "counts": lambda x: (np.sum(x > 0), np.mean(x > 0), np.sum(x > 0, axis=0)),
    "where": lambda x, v: (np.where(x > 0, x, 0.1 * x), np.where(x > v, 1.0, 0.0), np.where(x, v, -1)),
    "concatenate": lambda x, v: (np.concatenate([x, v]), np.concatenate([x, v], axis=1),
                                 np.concatenate((x, v.T[: x.shape[1]].T), axis=-1), np.concatenate([x, v], axis=None)),
    "stack": lambda x, v: (np.stack([x, v]), np.stack([x, v, x], axis=1), np.stack([x[0], v[0]], axis=-1)),
    "clip": lambda x, v: (np.clip(x, -1, 1), np.clip(x, None, 0.5), np.clip(x, -np.abs(v), np.abs(v)), x.clip(-1, 1)),
    "expand-squeeze": lambda x: (np.expand_dims(x, 1), np.expand_dims(x, (0, -1)),
                                 np.squeeze(x[:, None, :, None], axis=(1, 3)), np.squeeze(x[None, :1]), x[None].squeeze(0)),
    "broadcast_to": lambda x, b: (np.broadcast_to(b, (3,) + b.shape), np.broadcast_to(x, (2,) + x.shape),
                                  np.broadcast_to(x[:, :1], x.shape)),
    "transpose": lambda x, t: (np.transpose(x), np.transpose(t, (2, 0, 1)), np.transpose(t, (-1, 0, 1)),
                               np.swapaxes(t, 0, -1), t.transpose(), t.transpose(1, 2, 0), x.T, t.swapaxes(0, 1)),
    "reshape": lambda x, x6, t: (np.reshape(x, (-1,)), np.reshape(x, (x.shape[1], x.shape[0])), x6.reshape(-1, 3),
                                 x6.reshape((3, -1)), t.reshape(t.shape[0], -1), np.ravel(t), t.ravel(), t.flatten()),
    "like": lambda x: (np.zeros_like(x) + x, np.ones_like(x) * x, np.full_like(x, 2.5), np.zeros_like(x)),
    # linear algebra, on a well-conditioned SPD matrix
    "linalg": lambda x: _linalg_case(np.tanh(x) @ np.tanh(x).T / x.shape[1] + np.eye(x.shape[0], dtype=x.dtype),
                                     np.tanh(x)[:, 0]),
    # tracer methods
    "methods": lambda x, t: (x.sum(axis=0, keepdims=True), x.sum(), t.mean(axis=(0, 2)), x.mean(),
                             x.max(), x.max(axis=1, keepdims=True), t.min(axis=0), x.var(axis=0), x.std(),
                             x.astype(np.float64), x.astype(np.float32), x.astype(np.int32), (x > 0).astype(x.dtype)),
    # basic indexing
    "indexing": lambda x, t: (x[0], x[-1], x[1:], x[::-1], x[::2, ::-2], x[None], x[..., 0], x[:, None, 1:],
                              x[-1, ::-3], t[1:, ..., ::-1], t[0, -1], t[:, 0, None, -2:], t[..., None], x[0, 0],
                              t[::-2, 1::2, 0], x[:, -1:-100:-1]),
    # integer-array indexing
    "advanced-indexing": lambda x6, t: (x6[:, [0, 5, 0]], x6[:, np.array([-1, 1])], t[[0, -1], :, [0, -1]],
                                        t[:, [[0], [-1]], [0, 0]], x6[np.array([0, -1, 0]), np.array([1, 5, 0])],
                                        np.take(x6, [3, 0], axis=-1), np.take(t, [0, -1, 0]),
                                        np.take_along_axis(x6, np.array([[0, 4]]), 1), t[0, None, [0, 0]],
                                        np.choose(np.array([[1], [0]]) * np.ones(x6.shape[1], int)[:2], [x6[:1, :2], -x6[:1, :2]])),
    # Python protocols
    "python": lambda x: (len(x), sum(row for row in x), [r * 2 for r in x][-1], x.shape[0] * x,
                         x.ndim + x, x.size * x),
    # NumPy scalars and captured arrays
    "numpy-scalars": lambda x: (x * np.float32(2), x + np.float64(1), x - np.int64(3), np.exp(np.float32(1)) * x,
                                x + np.arange(x.shape[-1], dtype=np.float32)),
    # A small model: multiple outputs in a pytree
    "mlp-tree": lambda x, w, b: {"h": np.tanh(x @ w + b), "loss": [np.mean(np.square(x @ w + b))]},
}


def _special_kernels(x, v):
    """In float64: SciPy gives some of them float64 for float32 input, morphjit keeps float32."""
    return (sp.gamma(x), sp.beta(np.abs(x) + 0.5, np.abs(v) + 0.5),
                                sp.betaln(np.abs(x) + 0.5, 2.0), sp.betainc(2.0, 3.0, sp.expit(x)),
                                sp.betaincc(2.0, 3.0, sp.expit(x)), sp.gammainc(2.0, np.abs(x)),
                                sp.gammaincc(2.0, np.abs(x)), sp.stdtr(3.0, x), sp.i0(x), sp.i1(x),
                                sp.iv(1.5, np.abs(x)), sp.j0(x), sp.j1(x), sp.y0(np.abs(x) + 0.1),
                                sp.y1(np.abs(x) + 0.1), sp.kv(1.5, np.abs(x) + 0.1))


def _linalg_case(a, r):
    q, upper = np.linalg.qr(a)
    fitted, _, _, singular = np.linalg.lstsq(a, r)
    return (np.linalg.cholesky(a), np.linalg.solve(a, r), np.linalg.inv(a), np.linalg.det(a),
            *np.linalg.slogdet(a), np.linalg.eigvalsh(a), np.linalg.eigh(a)[1] ** 2, q ** 2, upper ** 2,
            fitted, singular, np.linalg.pinv(a))


def _args(name, dtype, seed):
    ops = operands(np.random.default_rng([zlib.crc32(name.encode()), seed, np.dtype(dtype).itemsize]), dtype)
    fn = NUMPY_CASES[name]
    return fn, [ops[p] for p in fn.__code__.co_varnames[: fn.__code__.co_argcount]]


@pytest.mark.parametrize("name", sorted(NUMPY_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_code_traces_like_numpy(name, dtype, seed):
    fn, args = _args(name, dtype, seed)
    _, outputs = trace_run(fn, *args)
    with np.errstate(all="ignore"):
        expected, _ = pytree.flatten(fn(*args))
    assert len(outputs) == len(expected)
    for out, exp in zip(outputs, expected):
        assert_like_numpy(out, np.asarray(exp), scale=magnitude(*args))


def test_every_numpy_dispatch_entry_has_a_case(monkeypatch):
    seen = set()
    ufunc, function = dispatch.apply_ufunc, dispatch.apply_function

    def record_ufunc(uf, method, inputs, kwargs):
        seen.add(uf)
        return ufunc(uf, method, inputs, kwargs)

    def record_function(func, args, kwargs):
        seen.add(func)
        return function(func, args, kwargs)

    monkeypatch.setattr(dispatch, "apply_ufunc", record_ufunc)
    monkeypatch.setattr(dispatch, "apply_function", record_function)
    for name in NUMPY_CASES:
        fn, args = _args(name, F32, 0)
        mj.trace(fn, *args)
    missing = sorted(f.__name__ for f in set(dispatch.UFUNCS) | set(dispatch.FUNCTIONS) if f not in seen)
    assert not missing, f"NumPy functions with a dispatch rule but no case in NUMPY_CASES: {missing}"


def test_basic_indexing_matches_numpy_on_many_keys():
    from support.random_keys import rand_index  # one generator of random basic indices
    rng = np.random.default_rng(7)
    for _ in range(60):
        shape = tuple(int(d) for d in rng.integers(1, 7, size=rng.integers(1, 4)))
        x = rng.standard_normal(shape).astype(rng.choice([F32, F64]))
        key = rand_index(rng, shape)
        _, (out,) = trace_run(lambda a: a[key], x)
        assert_like_numpy(out, x[key])
        assert_like_numpy(numpy_index.getitem(x, key), x[key])


# ---------------------------------------------------------------------------------------------
# Dtype promotion (NumPy 2, NEP 50): the traced program's dtype is NumPy's, and NumPy's is the
# one NEP 50 prescribes (Python scalars are weak, NumPy scalars and arrays are not).

I32, I64, BOOL = np.int32, np.int64, np.bool_
PROMOTION = [
    ("f32 * python float", lambda x: x * 2.5, [F32], F32),
    ("f32 + python int", lambda x: x + 1, [F32], F32),
    ("f32 + f64 array", lambda x, y: x + y, [F32, F64], F64),
    ("f64 * f32 array", lambda x, y: x * y, [F64, F32], F64),
    ("f32 + numpy f64 scalar", lambda x: x + np.float64(1.5), [F32], F64),
    ("f64 * numpy f32 scalar", lambda x: x * np.float32(2), [F64], F64),
    ("i32 * python float", lambda i: i * 2.5, [I32], F64),
    ("i64 * python float", lambda i: i * 2.5, [I64], F64),
    ("i32 / python int", lambda i: i / 2, [I32], F64),
    ("i32 + f32 array", lambda i, x: i + x, [I32, F32], F64),
    ("i64 - f32 array", lambda i, x: i - x, [I64, F32], F64),
    ("bool * f32 array", lambda b, x: b * x, [BOOL, F32], F32),
    ("exp of i32", lambda i: np.exp(i), [I32], F64),
    ("f32 < python float", lambda x: x < 1.0, [F32], BOOL),
    ("f32 == i64 array", lambda x, i: x == i, [F32, I64], BOOL),
    ("i32 > python int", lambda i: i > 0, [I32], BOOL),
    ("sum of i32", lambda i: np.sum(i), [I32], I64),
    ("sum of bool", lambda b: np.sum(b), [BOOL], I64),
    ("mean of i32", lambda i: np.mean(i), [I32], F64),
    ("max of i32", lambda i: np.max(i, axis=0), [I32], I32),
    ("where f32 / python int", lambda x: np.where(x > 0, x, 0), [F32], F32),
    ("where python floats", lambda x: np.where(x > 0, 1.0, 0.0), [F32], F64),
    ("concatenate f32 f64", lambda x, y: np.concatenate([x, y]), [F32, F64], F64),
    ("matmul f32 @ f64", lambda x, y: x @ y.T, [F32, F64], F64),
    ("maximum f32 / python int", lambda x: np.maximum(x, 0), [F32], F32),
    ("clip i32 with floats", lambda i: np.clip(i, -0.5, 0.5), [I32], F64),
    ("f32 ** python int", lambda x: x ** 2, [F32], F32),
    ("python float ** f32", lambda x: 2.0 ** x, [F32], F32),
]


def _array(rng, dtype, shape=(3, 4)):
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "i":
        return rng.integers(-3, 4, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("what, fn, dtypes, result", PROMOTION, ids=[p[0] for p in PROMOTION])
def test_promotion_follows_numpy_2(what, fn, dtypes, result):
    rng = np.random.default_rng(0)
    args = [_array(rng, dt) for dt in dtypes]
    with np.errstate(all="ignore"):
        expected = np.asarray(fn(*args))
    assert expected.dtype == result, "NumPy itself does not follow NEP 50 here"
    program, (out,) = trace_run(fn, *args)
    assert program.outputs[0].dtype == result
    assert_like_numpy(out, expected)


@pytest.mark.parametrize("scalar, dtype", [(2.0, F64), (3, I64), (True, BOOL)])
def test_python_scalar_arguments_are_weak_inputs(scalar, dtype):
    x = np.linspace(-1, 1, 6, dtype=F32)
    program, (out,) = trace_run(lambda x, s: x * s, x, scalar)
    assert program.inputs[1].type == TensorType((), dtype)
    assert_like_numpy(out, x * scalar)          # stays float32, as with NumPy
    _, (alone,) = trace_run(lambda s: s * 0.5, scalar)
    assert_like_numpy(alone, np.asarray(scalar * 0.5))


def test_temporary_numpy_values_are_distinct_constants():
    # Temporaries die at once and NumPy reuses their memory (and ids) for the next ones.
    fn = lambda x: [x * np.float64(i) + np.asarray(float(-i)) for i in range(30)]
    x = np.linspace(-1, 1, 5)
    _, outputs = trace_run(fn, x)
    for out, exp in zip(outputs, fn(x)):
        assert_like_numpy(out, exp)


# Integer arithmetic: either exactly NumPy (dtype and values) or refused with a clear error,
# never a silently different dtype or bitwise-vs-logical mix-up.
INT_ARITHMETIC = {
    "i32 + python int": lambda i: i + 1,
    "i32 * i64": lambda i: i * i.astype(np.int64),
    "neg i32": lambda i: -i,
    "abs i32": lambda i: np.abs(i),
    "i32 ** python int": lambda i: i ** 2,
    "i32 & python int": lambda i: i & 3,
    "i32 | i32": lambda i: i | i,
    "~i32": lambda i: ~i,
    "f32 & f32": lambda i: i.astype(np.float32) & i.astype(np.float32),
    "maximum i32": lambda i: np.maximum(i, 0),
    "bool + bool": lambda i: (i > 0) + (i < 0),
}


@pytest.mark.parametrize("name", sorted(INT_ARITHMETIC))
def test_integer_arithmetic_matches_numpy_or_is_refused(name):
    fn = INT_ARITHMETIC[name]
    i = np.arange(-3, 5, dtype=np.int32).reshape(2, 4)
    try:
        _, (out,) = trace_run(fn, i)
    except (mj.DtypeError, mj.UnsupportedError) as e:
        assert "test_trace.py" in str(e)
        return
    try:
        expected = fn(i)
    except TypeError:
        pytest.fail(f"{name}: NumPy refuses this, morphjit silently computed {out.dtype} values")
    assert_like_numpy(out, expected)


# ---------------------------------------------------------------------------------------------
# The text form: golden programs

def _mlp(params, x, y):
    h = np.maximum(x @ params["W1"] + params["b1"], 0)
    return np.mean(mj.softmax_cross_entropy(h @ params["W2"] + params["b2"], y))


def _mlp_one_hot(params, x, y):
    logits = mj.relu(x @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]
    return -np.mean(np.sum(mj.log_softmax(logits) * mj.one_hot(y, 3, np.float32), axis=1))


MLP_PARAMS = dict(W1=((4, 8), F32), b1=((8,), F32), W2=((8, 3), F32), b2=((3,), F32))
GOLDEN = {
    "mlp-softmax-cross-entropy": (_mlp, [MLP_PARAMS, ((5, 4), F32), ((5,), I64)], """\
in v0:f32[4,8] v1:f32[8,3] v2:f32[8] v3:f32[3] v4:f32[5,4] v5:i64[5]
  v6:f32[5,8] = matmul v4 v0
  v7:f32[5,8] = add v6 v2
  v8:f32[5,8] = maximum v7 0.0:f32
  v9:f32[5,3] = matmul v8 v1
  v10:f32[5,3] = add v9 v3
  v11:f32[5] = softmax_cross_entropy v10 v5
  v12:f32[] = sum v11 axes=(0,)
  v13:f32[] = mul v12 0.20000000298023224:f32
out v13
"""),
    "mlp-log-softmax-one-hot": (_mlp_one_hot, [MLP_PARAMS, ((5, 4), F32), ((5,), I64)], """\
in v0:f32[4,8] v1:f32[8,3] v2:f32[8] v3:f32[3] v4:f32[5,4] v5:i64[5]
  v6:f32[5,8] = matmul v4 v0
  v7:f32[5,8] = add v6 v2
  v8:f32[5,8] = relu v7
  v9:f32[5,3] = matmul v8 v1
  v10:f32[5,3] = add v9 v3
  v11:f32[5,3] = log_softmax v10 axes=(1,)
  v12:f32[5,3] = one_hot v5 depth=3 dtype=f32
  v13:f32[5,3] = mul v11 v12
  v14:f32[5] = sum v13 axes=(1,)
  v15:f32[] = sum v14 axes=(0,)
  v16:f32[] = mul v15 0.20000000298023224:f32
  v17:f32[] = neg v16
out v17
"""),
    "broadcasting-add": (lambda x, y: x + y, [((2, 1, 3), F32), ((4, 1), F32)], """\
in v0:f32[2,1,3] v1:f32[4,1]
  v2:f32[2,4,3] = add v0 v1
out v2
"""),
    "broadcasting-add-promotes": (lambda x, y: x + y, [((2, 3), F64), ((3,), F32)], """\
in v0:f64[2,3] v1:f32[3]
  v2:f64[3] = cast v1 dtype=f64
  v3:f64[2,3] = add v0 v2
out v3
"""),
    "reduction-keepdims": (lambda a: a.sum(axis=(0, -1), keepdims=True) / a.max(), [((2, 3, 4), F32)], """\
in v0:f32[2,3,4]
  v1:f32[3] = sum v0 axes=(0,2)
  v2:f32[1,3,1] = reshape v1 shape=(1,3,1)
  v3:f32[] = max v0 axes=(0,1,2)
  v4:f32[1,3,1] = div v2 v3
out v4
"""),
    "slicing": (lambda a: (a[1:, ::-2], a[-1, None, 2:0:-1]), [((4, 5), F64)], """\
in v0:f64[4,5]
  v1:f64[3,3] = slice v0 starts=(1,4) steps=(1,-2) stops=(4,-1)
  v2:f64[1,2] = slice v0 starts=(3,2) steps=(1,-1) stops=(4,0)
out v1 v2
"""),
    "masked-where": (lambda x: np.where(x > 0, x, 0.5 * x), [((3,), F32)], """\
in v0:f32[3]
  v1:bool[3] = gt v0 0.0:f32
  v2:f32[3] = mul 0.5:f32 v0
  v3:f32[3] = where v1 v0 v2
out v3
"""),
}


def _zeros(spec):
    if isinstance(spec, dict):
        return {k: _zeros(v) for k, v in spec.items()}
    shape, dtype = spec
    return np.zeros(shape, dtype)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_text(name):
    fn, specs, text = GOLDEN[name]
    args = [_zeros(s) for s in specs]
    program = trace_checked(fn, *args)
    assert str(program) == text
    assert str(parse(text)) == text


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_text_parses_to_a_runnable_program(name):
    fn, specs, text = GOLDEN[name]
    rng = np.random.default_rng(1)
    args = [_random(rng, s) for s in specs]
    parsed = parse(text)
    parsed.verify()
    leaves, _ = pytree.flatten(tuple(args))
    with np.errstate(all="ignore"):
        expected, _ = pytree.flatten(fn(*args))
    for out, exp in zip(mj.run(parsed, *leaves), expected):
        assert_like_numpy(out, exp)


def _random(rng, spec):
    if isinstance(spec, dict):
        return {k: _random(rng, v) for k, v in spec.items()}
    shape, dtype = spec
    if np.dtype(dtype).kind == "i":
        return rng.integers(0, 3, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def test_text_round_trip_of_literals_and_params():
    x = np.ones(3, F32)
    fn = lambda x: (x * np.inf - np.inf, mj.where(x > 0, x, -np.inf), np.where(x > 0, 0.1, 1e-300),
                    mj.full_like(x, np.inf), mj.full_like(x.astype(np.int32), -7), (x > 0) & True)
    with np.errstate(invalid="ignore"):
        program, outputs = trace_run(fn, x)
        expected = fn(x)
    for out, exp in zip(outputs, expected):
        assert_like_numpy(out, exp)


def test_tracing_is_deterministic():
    args = [_zeros(s) for s in GOLDEN["mlp-softmax-cross-entropy"][1]]
    assert str(mj.trace(_mlp, *args)) == str(mj.trace(_mlp, *args))


# ---------------------------------------------------------------------------------------------
# The verifier catches broken programs

BASE = """\
in v0:f32[2,3] v1:f32[3]
  v2:f32[2,3] = add v0 v1
  v3:f32[2,3] = exp v2
  v4:f32[] = sum v3 axes=(0,1)
out v4
"""


def _broken(kind):
    p = parse(BASE)
    b = list(p.bindings)
    if kind == "use before definition":
        return p.replace(bindings=(b[1], b[0], b[2]))
    if kind == "wrong declared dtype":
        return parse(BASE.replace("v3:f32[2,3] = exp", "v3:f64[2,3] = exp"))
    if kind == "wrong declared shape":
        return parse(BASE.replace("v2:f32[2,3] = add", "v2:f32[3,2] = add"))
    if kind == "wrong reduced shape":
        return parse(BASE.replace("v4:f32[] = sum v3 axes=(0,1)", "v4:f32[2] = sum v3 axes=(0,1)"))
    if kind == "operand from nowhere":
        stray = Var(TensorType((2, 3), F32))
        return p.replace(bindings=(b[0], Binding(b[1].out, "exp", (stray,)), b[2]))
    if kind == "redefinition":
        return p.replace(bindings=(b[0], b[1], Binding(b[0].out, "exp", (b[1].out,)), b[2]))
    if kind == "unknown op":
        return parse(BASE.replace("= exp", "= frobnicate"))
    if kind == "undefined output":
        return p.replace(outputs=(Var(TensorType((), F32)),))
    if kind == "const of the wrong type":
        c = Var(TensorType((3,), F32))
        return p.replace(consts=((c, np.zeros(3, F64)),))
    if kind == "shape mismatch in operands":
        return parse(BASE.replace("v1:f32[3]", "v1:f32[4]"))
    if kind == "dtype mismatch in operands":
        return parse(BASE.replace("v1:f32[3]", "v1:f64[3]"))
    if kind == "bad params":
        return parse(BASE.replace("axes=(0,1)", "axes=(0,2)"))
    raise KeyError(kind)


BROKEN = ["use before definition", "wrong declared dtype", "wrong declared shape", "wrong reduced shape",
          "operand from nowhere", "redefinition", "unknown op", "undefined output",
          "const of the wrong type", "shape mismatch in operands", "dtype mismatch in operands", "bad params"]


def test_base_program_verifies():
    parse(BASE).verify()


@pytest.mark.parametrize("kind", BROKEN)
def test_verify_rejects(kind):
    with pytest.raises((VerifyError, mj.MorphjitError)):
        _broken(kind).verify()


def test_verify_names_the_offending_binding():
    with pytest.raises(VerifyError) as info:
        _broken("wrong declared dtype").verify()
    assert "exp" in str(info.value) and "f32[2,3]" in str(info.value)
    with pytest.raises(VerifyError, match="before definition"):
        _broken("use before definition").verify()


# ---------------------------------------------------------------------------------------------
# Arguments, outputs and captured values

Pair = collections.namedtuple("Pair", "first second")


def test_pytree_arguments_and_outputs():
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((3, 2)), "a": [rng.standard_normal(2), Pair(rng.standard_normal(()), 1.5)]}
    x = rng.standard_normal((4, 3))

    def fn(params, x):
        y = x @ params["w"] + params["a"][0]
        return {"y": y, "z": (np.sum(y) * params["a"][1].first, params["a"][1].second * y)}

    program, outputs = trace_run(fn, params, x)
    leaves, _ = pytree.flatten((params, x))
    assert [v.shape for v in program.inputs] == [np.shape(l) for l in leaves]
    expected, _ = pytree.flatten(fn(params, x))
    for out, exp in zip(outputs, expected):
        assert_like_numpy(out, exp)


def test_captured_arrays_are_constants_fixed_at_trace_time():
    table = np.arange(3.0)
    fn = lambda x: x * table
    x = np.ones(3)
    program = trace_checked(fn, x)
    assert len(program.consts) == 1 and "const v1:f64[3]" in str(program)
    expected = fn(x)
    table += 100  # the program keeps the value it saw while tracing
    assert_like_numpy(mj.run(program, x)[0], expected)


def test_tracer_attributes():
    seen = {}

    def fn(x):
        seen.update(shape=x.shape, ndim=x.ndim, size=x.size, dtype=x.dtype, len=len(x), t=x.T.shape)
        return x

    x = np.zeros((2, 5), F32)
    trace_checked(fn, x)
    assert seen == dict(shape=x.shape, ndim=x.ndim, size=x.size, dtype=x.dtype, len=len(x), t=x.T.shape)


@pytest.mark.parametrize("result", [lambda x: x, lambda x: np.float32(2.5), lambda x: 3, lambda x: (x, x[0])])
def test_outputs_may_be_inputs_or_constants(result):
    x = np.arange(4.0, dtype=F32)
    _, outputs = trace_run(result, x)
    expected, _ = pytree.flatten(result(x))
    for out, exp in zip(outputs, expected):
        assert_like_numpy(out, np.asarray(exp))


def test_ops_of_a_numpy_model_are_the_mj_ops():
    x, w = np.ones((2, 3), F32), np.ones((3, 4), F32)
    p_np = trace_checked(lambda x, w: np.sum(np.exp(x @ w), axis=1), x, w)
    p_mj = trace_checked(lambda x, w: mj.sum(mj.exp(mj.matmul(x, w)), axis=1), x, w)
    assert str(p_np) == str(p_mj)
    assert ops_of(p_np) == {"matmul", "exp", "sum"}


def test_lit_text_forms():
    for lit, text in [(Lit(0.5, F64), "0.5"), (Lit(0.5, F32), "0.5:f32"), (Lit(-3, I32), "-3:i32"),
                      (Lit(True, BOOL), "True")]:
        assert str(lit) == text
    program = Program((), (), ())
    assert str(parse(str(program))) == str(program)
