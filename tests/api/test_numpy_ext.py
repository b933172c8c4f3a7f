"""NumPy's wider surface (morphjit/numpy_ext.py) compiled: the numba step against the reference
executor, values and gradients, with many functions batched into one compiled loss per test.

tests/ops/test_ops.py, test_templates.py and test_grad.py cover each op against NumPy, finite
differences and autograd; these tests check that the compiled loops agree with them.
"""
from __future__ import annotations

import itertools

import numpy as np
import scipy.special as sp
import pytest

import morphjit as mj

F32, F64 = np.float32, np.float64


def _elementwise_terms(x, y):
    """Every element-wise function of numpy_ext, on x in (0.2, 0.8) and y in (0.5, 2)."""
    return [np.expm1(x), np.log2(x), np.log10(x), np.exp2(x), np.sinh(x), np.cosh(x), np.tan(x),
            np.arcsin(x), np.arccos(x), np.arctan(x), np.arcsinh(x), np.arccosh(x + 1.5), np.arctanh(x),
            np.cbrt(x - 0.5), np.fabs(x - 0.5), np.hypot(x, y), np.arctan2(x, y), np.logaddexp(x, y),
            np.logaddexp2(x, y), np.copysign(x, y - 1), x % y, np.fmod(x - 0.5, y), x // 0.3,
            np.floor(x * 5), np.ceil(x * 5), np.trunc(x * 5 - 2), np.rint(x * 5), np.round(x, 1),
            np.heaviside(x - 0.5, 0.5), np.sinc(x), np.deg2rad(x), np.rad2deg(x), np.reciprocal(y),
            np.float_power(x, y), np.nan_to_num(np.log(x - 0.5)), divmod(x, y)[1],
            np.isnan(np.log(x - 0.5)), np.isinf(1 / (x - x)), np.isfinite(np.log(x - 0.5))]


def _loss(x, y):
    return sum(np.sum(t * (k + 1.0) / 40) for k, t in enumerate(_elementwise_terms(x, y)))


def _check_both_backends(loss, x, y, rtol) -> None:
    """The compiled step and the reference executor agree on ``loss(x, y)`` and its gradients in
    ``x.dtype``, and the reference executor agrees with NumPy."""
    results = {b: mj.compile_loss(loss, argnums=(0, 1), backend=b)(x, y) for b in ("numba", "interp")}
    (v_n, g_n), (v_i, g_i) = results["numba"], results["interp"]
    np.testing.assert_allclose(v_n, v_i, rtol=rtol)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(v_i, loss(x, y), rtol=rtol)
    for a, b in zip(g_n, g_i):
        assert a.dtype == b.dtype == x.dtype
        np.testing.assert_allclose(a, b, rtol=rtol * 10, atol=rtol)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_elementwise_family_compiled_matches_reference(dtype):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 0.8, (3, 5)).astype(dtype)
    y = rng.uniform(0.5, 2.0, (5,)).astype(dtype)
    _check_both_backends(_loss, x, y, rtol=1e-5 if dtype == F32 else 1e-12)


def test_integer_elementwise_compiled_matches_numpy():
    rng = np.random.default_rng(1)
    x = rng.uniform(-3, 3, (4, 6))
    k = rng.integers(-20, 20, (4, 6))

    def integers(k):
        return sum([k % 7, k % -3, k // 4, k // -4, np.fmod(k, -3), np.floor(k), np.ceil(k), np.trunc(k),
                    np.round(k, -1), np.remainder(7, np.abs(k) + 1)])

    expected = integers(k)
    assert expected.dtype == k.dtype
    for backend in ("numba", "interp"):
        step = mj.compile_loss(lambda x, k: np.sum(x * integers(k)), argnums=(0,), backend=backend)
        value, (grad,) = step(x, k)
        np.testing.assert_array_equal(grad, expected.astype(F64))  # the gradient is the integer array


def _edge_values(dtype) -> list:
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        return [0, 1, -1, 2, -7, 100, info.max, info.min]
    info = np.finfo(dtype)
    return [0.0, -0.0, 1.0, -1.0, 1.5, -1.5, 7.25, -3.0, info.max, -info.max, info.tiny,
            -info.smallest_subnormal, np.inf, -np.inf, np.nan]


def _division_family(a, b):
    """Each op once (``np.floor_divide``, ``np.mod``, ``divmod`` and the rest are these ops)."""
    return [a // b, a % b, np.fmod(a, b)]


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_division_family_matches_numpy_bit_for_bit_on_edge_values(backend):
    """Every pair of edge values (signed zeros, infinities, NaN, extremes; the most negative
    integer by -1; zero divisors), in each dtype, through one compiled step: each result is the
    gradient of ``sum(w * result)`` in ``w``."""
    dtypes = [F32, F64, np.int32, np.int64]
    pairs = [tuple(np.array(c, dt) for c in zip(*itertools.product(_edge_values(dt), repeat=2))) for dt in dtypes]

    def loss(ws, pairs):
        return sum(np.sum(w * t) for row, (a, b) in zip(ws, pairs) for w, t in zip(row, _division_family(a, b)))

    with np.errstate(all="ignore"):
        expected = [[t.astype(F64) for t in _division_family(a, b)] for a, b in pairs]
    ws = [[np.ones(len(a)) for _ in row] for (a, _), row in zip(pairs, expected)]
    _, grads = mj.compile_loss(loss, backend=backend)(ws, pairs)
    for dtype, got_row, want_row in zip(dtypes, grads, expected):
        for k, (got, want) in enumerate(zip(got_row, want_row)):
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype.__name__} term {k}")
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=f"{dtype.__name__} term {k}")


def test_python_round_and_divmod_on_tracers():
    x = np.array([[1.25, -2.5, 0.5, 3.75]])

    def fn(x):
        q, r = divmod(x, 0.75)
        return round(x, 1), round(x), q, r, abs(x)

    program = mj.trace(fn, x)
    got = mj.run(program, x)
    expected = [np.round(x, 1), np.round(x), *np.divmod(x, 0.75), np.abs(x)]
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_reciprocal_of_integers_is_refused_with_the_spelling_to_use():
    with pytest.raises(mj.DtypeError, match=r"1\.0 / x"):
        mj.trace(lambda k: np.reciprocal(k), np.arange(3))


def _special_loss(x, y):
    """Every function of morphjit/special.py, on x in (0.1, 0.9) and y in (0.5, 2)."""
    terms = [sp.expit(x), sp.logit(x), sp.log_expit(x), sp.erf(x), sp.erfc(x), sp.erfinv(x), sp.erfinv(-x ** 8),
             sp.ndtr(x), sp.log_ndtr(x), sp.log_ndtr(-30 * y), sp.gammaln(y), sp.gammaln(-y), sp.digamma(y),
             sp.digamma(-y), sp.xlogy(x, y), sp.xlog1py(x, y), sp.entr(x), sp.softplus(x), sp.xlogy(1.5, y),
             sp.xlog1py(0.5, -x)]
    return sum(np.sum(t * (k + 1.0) / 20) for k, t in enumerate(terms))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_special_functions_compiled_match_reference(dtype):
    rng = np.random.default_rng(2)
    x = rng.uniform(0.1, 0.9, (3, 5)).astype(dtype)
    y = rng.uniform(0.5, 2.0, (5,)).astype(dtype)
    _check_both_backends(_special_loss, x, y, rtol=1e-4 if dtype == F32 else 1e-11)


def _towards_one(dtype) -> np.ndarray:
    """Points approaching +-1 down to the last float below 1, the edges, and the middle."""
    eps = np.finfo(dtype).epsneg
    near = np.concatenate([1 - np.arange(1, 9) * eps, 1 - np.geomspace(eps * 16, 0.5, 40)])
    x = np.concatenate([near, -near, np.linspace(-0.9, 0.9, 19), [1.0, -1.0, 0.0, 1e-300]])
    return x.astype(dtype)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_erfinv_and_its_gradient_match_scipy_up_to_one(backend):
    """Within a few ulps of SciPy's value, so that the gradient exp(erfinv(x)^2) sqrt(pi) / 2
    (whose relative error is about 70x erfinv's near 1) stays close too. The values are the
    gradient in ``w`` of ``sum(w * erfinv(x))``, the derivatives its gradient in ``x``."""
    xs = [_towards_one(F64), _towards_one(F32)]
    ws = [np.ones_like(x) for x in xs]
    step = mj.compile_loss(lambda ws, xs: sum(np.sum(w * sp.erfinv(x)) for w, x in zip(ws, xs)),
                           argnums=(0, 1), backend=backend)
    _, (values, derivatives) = step(ws, xs)
    for x, got, derivative, ulps, rtol in zip(xs, values, derivatives, (4, 2), (1e-13, 1e-5)):
        want = sp.erfinv(x)
        finite = np.isfinite(want)
        assert np.all(np.abs(got[finite] - want[finite]) <= ulps * np.spacing(np.abs(want[finite]))), x.dtype
        np.testing.assert_array_equal(got[~finite], want[~finite])
        expected = np.sqrt(np.pi) / 2 * np.exp(want.astype(F64) ** 2)
        np.testing.assert_allclose(derivative, expected.astype(x.dtype), rtol=rtol)


def test_a_body_that_reads_each_value_several_times_compiles_in_linear_time():
    """A chain of steps each reading the previous value three times (like erfinv's Newton steps)
    is a DAG: walked, rebuilt, hashed or compared as a tree it would take 3^20 steps."""
    def loss(x):
        y = x
        for _ in range(20):
            y = y * 0.5 + np.sin(y) * y * 0.25
        return np.sum(y)

    x = np.linspace(-1, 1, 7)
    expected = loss(x)
    for backend in ("numba", "interp"):
        np.testing.assert_allclose(mj.compile_loss(loss, backend=backend)(x)[0], expected, rtol=1e-12)


def test_unsupported_scipy_ufunc_is_named_by_its_scipy_path():
    with pytest.raises(mj.UnsupportedError, match=r"scipy\.special\.loggamma is not supported.*use scipy\.special\.gammaln"):
        mj.trace(lambda x: sp.loggamma(x), np.ones(3))


@pytest.mark.parametrize("function", [sp.gammaincinv, sp.zetac, sp.pdtr, sp.ive])
def test_an_unsupported_scipy_ufunc_is_not_hinted_at_another_function_of_a_near_name(function):
    with pytest.raises(mj.UnsupportedError, match=rf"scipy\.special\.{function.__name__} is not supported") as refused:
        mj.trace(lambda x: function(*[x] * function.nin), np.ones(3))
    assert str(refused.value).splitlines()[0].endswith("is not supported by morphjit")


def _prod_grad_reference(x, axis):
    """d prod / d x_i = the product of the other elements, computed directly."""
    moved = np.moveaxis(x, axis, -1)
    n = moved.shape[-1]
    grads = [np.prod(np.delete(moved, i, axis=-1), axis=-1) for i in range(n)]
    return np.moveaxis(np.stack(grads, axis=-1), -1, axis)


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_prod_gradient_is_right_with_zeros(backend):
    x = np.array([[0.0, 2.0, 3.0, -1.5], [0.0, 0.0, 4.0, 2.0], [1.5, -2.0, 0.5, 3.0]])
    step = mj.compile_loss(lambda x: np.sum(np.prod(x, axis=1) * np.array([1.0, 2.0, -3.0])), backend=backend)
    value, grad = step(x)
    np.testing.assert_allclose(grad, _prod_grad_reference(x, 1) * np.array([[1.0], [2.0], [-3.0]]))
    assert np.isfinite(grad).all()


def _reduction_loss(x, w):
    terms = [np.prod(x, axis=1), np.prod(x), x.prod(axis=0), np.cumsum(x, axis=1), np.cumprod(x, axis=0),
             np.average(x, axis=1, weights=w), np.ptp(x, axis=0), np.nansum(x), np.nanmean(x, axis=0),
             np.linalg.norm(x), np.linalg.norm(x, 1), np.linalg.norm(x, np.inf), np.linalg.norm(x, axis=1),
             np.linalg.norm(x[0], 3), np.argmax(x, axis=1), np.argmin(x), np.any(x > 1), np.all(x > -5, axis=0),
             x.argmax(), x.cumsum(), x.cumprod(axis=1)]
    return sum(np.sum(t * (k + 1.0) / 20) for k, t in enumerate(terms))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_reductions_compiled_match_reference(dtype):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 4)).astype(dtype)
    x[0, 1] = 0
    x[1, :2] = 0
    w = rng.uniform(0.5, 2.0, 4).astype(dtype)
    results = {b: mj.compile_loss(_reduction_loss, argnums=(0, 1), backend=b)(x, w) for b in ("numba", "interp")}
    (v_n, g_n), (v_i, g_i) = results["numba"], results["interp"]
    rtol = 1e-5 if dtype == F32 else 1e-12
    np.testing.assert_allclose(v_n, v_i, rtol=rtol)
    np.testing.assert_allclose(v_i, _reduction_loss(x, w), rtol=rtol)
    for a, b in zip(g_n, g_i):
        np.testing.assert_allclose(a, b, rtol=rtol * 10, atol=rtol)


def _contraction_and_shape_terms(a, b, c, sq, v):
    return [np.tensordot(c, b, 1), np.tensordot(c, a, ([1, 2], [0, 1])), np.inner(a, a), np.outer(v, a), np.vdot(a, a),
            np.kron(a, sq), np.trace(sq), np.trace(c, 1, 1, 2), np.diag(sq, 1), np.diag(v, -1), np.diagonal(c, 0, 2, 1),
            np.tril(a), np.triu(c, 1), np.einsum("ii", sq), np.einsum("bij,jk->bki", c, b) ** 2,
            np.einsum("ij,jk,kl->il", a, b, b.T), np.einsum("...j,j->...", c, v[:4]),
            np.hstack([a, a]), np.vstack([a, v[:4]]), np.dstack([a, a]), np.column_stack([v, v]),
            np.split(c, 2, axis=-1)[1], np.moveaxis(c, 0, -1), np.flip(c, 1), np.fliplr(a), np.flipud(a),
            np.roll(c, -1, axis=1), np.tile(a, (2, 1, 3)), np.repeat(a, 2, axis=1), np.repeat(v, [1, 0, 2, 3, 1]),
            np.pad(a, ((1, 2), (0, 3)), constant_values=5.0), np.pad(a, 2, mode="edge"),
            np.pad(a, ((2, 1), (3, 3)), mode="reflect"), np.diff(c, 2, axis=1), np.meshgrid(v, a[0])[0],
            np.broadcast_arrays(v, a[:, :1])[1], mj.stop_gradient(a) * a]


def _contraction_loss(a, b, c, sq, v):
    return sum(np.sum(t * ((k % 7) + 1.0) / 10) for k, t in enumerate(_contraction_and_shape_terms(a, b, c, sq, v)))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_contractions_and_shapes_compiled_match_reference(dtype):
    rng = np.random.default_rng(4)
    args = [rng.normal(size=s).astype(dtype) for s in [(3, 4), (4, 5), (2, 3, 4), (4, 4), (5,)]]
    results = {b: mj.compile_loss(_contraction_loss, argnums=(0, 1, 2, 3, 4), backend=b)(*args)
               for b in ("numba", "interp")}
    (v_n, g_n), (v_i, g_i) = results["numba"], results["interp"]
    rtol = 1e-4 if dtype == F32 else 1e-12
    np.testing.assert_allclose(v_n, v_i, rtol=rtol)
    for a, b in zip(g_n, g_i):
        np.testing.assert_allclose(a, b, rtol=rtol * 10, atol=rtol)


@mj.custom_vjp
def _clip_gradient(x):
    return x * 1.0


_clip_gradient.defvjp(lambda x: (_clip_gradient(x), None), lambda residuals, g: (np.clip(g, -1.0, 1.0),))


@mj.custom_vjp
def _safe_log(x):
    return np.log(x)


_safe_log.defvjp(lambda x: (np.log(x), x), lambda x, g: (g / np.maximum(x, 1e-3),))


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_custom_vjp_uses_the_users_backward_rule(backend):
    x = np.array([[0.5, -2.0, 3.0], [1.0, 4.0, -0.5], [1e-5, 2.0, 0.25]])
    weights = np.array([5.0, -0.5, 2.0])

    def loss(x):
        return np.sum(_clip_gradient(x) * weights) + np.sum(_safe_log(np.abs(x)))

    value, grad = mj.compile_loss(loss, backend=backend)(x)
    np.testing.assert_allclose(value, np.sum(x * weights) + np.sum(np.log(np.abs(x))))
    expected = np.clip(weights, -1, 1) + np.sign(x) / np.maximum(np.abs(x), 1e-3)
    np.testing.assert_allclose(grad, np.broadcast_to(expected, x.shape))
    np.testing.assert_allclose(_safe_log(np.array([2.0])), np.log([2.0]))   # eager: the function itself


def test_custom_vjp_needs_its_rule_and_one_cotangent_per_argument():
    @mj.custom_vjp
    def f(x, y):
        return x * y

    with pytest.raises(mj.TracingError, match="defvjp"):
        mj.compile_loss(lambda x: np.sum(f(x, x)), backend="interp")(np.ones(2))
    f.defvjp(lambda x, y: (x * y, None), lambda residuals, g: (g,))
    with pytest.raises(mj.TracingError, match="1 cotangents for 2 arguments"):
        mj.compile_loss(lambda x: np.sum(f(x, x)), backend="interp")(np.ones(2))


def test_stop_gradient_blocks_only_its_path():
    x = np.array([1.0, -2.0, 3.0])
    for backend in ("interp", "numba"):
        _, grad = mj.compile_loss(lambda x: np.sum(x * mj.stop_gradient(x) + mj.stop_gradient(x ** 3)), backend=backend)(x)
        np.testing.assert_array_equal(grad, x)


def _counts(fn, *args) -> str:
    """The instruction counts of the compiled step (the first line of its source); only the last
    argument is differentiated, so views of the others appear in the forward loops alone."""
    first = mj.compile_loss(fn, argnums=len(args) - 1).source(*args).splitlines()[0]
    return first.split(":", 1)[1].split(";")[0]


@pytest.mark.parametrize("view, plain", [
    (lambda x, y: np.flip(x, 1) * y, lambda x, y: x * y),
    (lambda x, y: np.flipud(np.fliplr(x)) * y, lambda x, y: x * y),
    (lambda x, y: np.moveaxis(x.T, 0, 1) * y, lambda x, y: x * y),
    (lambda x, y: np.diagonal(x) * y[0, :4], lambda x, y: x[0, :4] * y[0, :4]),
    (lambda x, y: np.einsum("ii->i", x[:, :4]) * y[1, :4], lambda x, y: x[0, :4] * y[1, :4]),
])
def test_new_views_fuse_like_the_existing_ones(view, plain):
    x, y = np.ones((4, 5)), np.full((4, 5), 2.0)
    assert _counts(lambda x, y: np.sum(np.sin(view(x, y))), x, y) == \
        _counts(lambda x, y: np.sum(np.sin(plain(x, y))), x, y)


def test_new_functions_compile_once_for_every_batch_size():
    def loss(w, x, y):
        s = np.einsum("bi,ij->bj", x, w)
        return (np.mean(sp.log_expit(s) * np.flip(s, 1)) + np.mean(np.cumsum(s, axis=1))
                + np.mean(np.argmax(s, axis=1) == y) + np.mean(np.tile(s, (1, 2))) + np.mean(np.repeat(s, 2, axis=1))
                + np.mean(np.einsum("bi,bj->b", x, np.tanh(s) @ w.T)) + np.mean(np.pad(s, ((0, 0), (1, 1)))))

    rng = np.random.default_rng(5)
    w = rng.normal(size=(4, 3))
    step, reference = mj.compile_loss(loss), mj.compile_loss(loss, backend="interp")
    for n in (5, 9):
        x, y = rng.normal(size=(n, 4)), rng.integers(0, 3, n)
        (value, grad), (ref_value, ref_grad) = step(w, x, y), reference(w, x, y)
        np.testing.assert_allclose(value, ref_value, rtol=1e-12)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-14)
    assert step.cache_info().misses == 1


def test_a_scipy_function_without_a_traceable_twin_gets_no_hint():
    import scipy.linalg

    with pytest.raises(mj.UnsupportedError, match=r"scipy\.linalg\.expm does not trace") as error:
        mj.trace(lambda a: np.sum(scipy.linalg.expm(a)), np.eye(2))
    assert "mj." not in str(error.value).splitlines()[0]


def test_a_decorated_scipy_function_is_named_by_its_public_name():
    """SciPy 1.17 wraps scipy.linalg.cholesky in a decorator of scipy._lib: the error names the
    function the user called, its traceable twin and the user's line, not the wrapper. (Looked
    up in scipy.linalg as the trace runs, cholesky traces: taken from it before, it is SciPy's.)"""
    from scipy.linalg import cholesky

    def loss(a):
        return np.sum(cholesky(a @ a.T + np.eye(2)))  # <- here

    with pytest.raises(mj.UnsupportedError, match=r"scipy\.linalg\.cholesky does not trace.*mj\.linalg\.cholesky") \
            as error:
        mj.trace(loss, np.eye(2))
    assert "# <- here" in str(error.value)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_max_and_min_of_integer_arrays(backend):
    """Rows made of the dtype's extremes too, where the start value shows; each result is the
    gradient in ``w`` of ``sum(w * result)``."""
    def extrema(k):
        return [np.max(k, axis=1), np.amin(k, axis=0), k.max(), np.max(k > 0, axis=1)]

    ks = []
    for dtype in (np.int32, np.int64):
        info = np.iinfo(dtype)
        ks.append(np.array([[info.min, info.min, info.min], [info.max, info.max, info.max], [-7, 3, 0]], dtype))
    expected = [[t.astype(F64) for t in extrema(k)] for k in ks]
    ws = [[np.ones(np.shape(t)) for t in row] for row in expected]

    def loss(ws, ks):
        return sum(np.sum(w * t) for row, k in zip(ws, ks) for w, t in zip(row, extrema(k)))

    _, grads = mj.compile_loss(loss, backend=backend)(ws, ks)
    for got_row, want_row in zip(grads, expected):
        for got, want in zip(got_row, want_row):
            np.testing.assert_array_equal(got, want)
