"""``mj.scipy_objective``: a loss over one flat float64 vector for ``scipy.optimize.minimize``."""
from __future__ import annotations

import copy

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
import scipy.optimize

import morphjit as mj

BACKENDS = pytest.mark.parametrize("backend", ["interp", "numba"])


def loss(params, x, y):
    z = mj.tanh(x @ params["W"]) @ params["v"] + params["c"]
    return mj.mean((z - y) ** 2) + 1e-2 * mj.sum(params["W"] ** 2)


def ag_loss(w, x, y):
    """The same loss through autograd over the flat vector (keys in sorted order: W, c, v)."""
    W, c, v = anp.reshape(w[:12], (4, 3)), w[12], w[13:]
    z = anp.tanh(x @ W) @ v + c
    return anp.mean((z - y) ** 2) + 1e-2 * anp.sum(W ** 2)


def problem(seed=0):
    rng = np.random.default_rng(seed)
    params = {"W": rng.normal(scale=0.5, size=(4, 3)), "v": rng.normal(size=3), "c": np.array(0.1)}
    x = rng.normal(size=(30, 4))
    y = np.sin(x[:, 0]) + 0.1 * rng.normal(size=30)
    return params, x, y


@BACKENDS
def test_fun_hessp_and_hess_match_autograd(backend):
    params, x, y = problem()
    f = mj.scipy_objective(loss, params, x, y, backend=backend)
    w = f.x0 + 0.1
    p = np.linspace(-1.0, 1.0, w.size)
    value, grad = f.fun(w)
    assert type(value) is float and grad.shape == w.shape and grad.dtype == np.float64
    np.testing.assert_allclose(value, ag_loss(w, x, y), rtol=1e-13)
    np.testing.assert_allclose(grad, autograd.grad(ag_loss)(w, x, y), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(f.hessp(w, p), autograd.hessian_vector_product(ag_loss)(w, x, y, p),
                               rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(f.hess(w), autograd.hessian(ag_loss)(w, x, y), rtol=1e-10, atol=1e-13)


def test_each_call_returns_a_vector_of_its_own_and_reads_x_in_place():
    """SciPy keeps earlier gradients (a trust-region step compares two points): a call must not
    overwrite the vector an earlier one returned. The tree is views into x (no copy)."""
    params, x, y = problem()
    f = mj.scipy_objective(loss, params, x, y, backend="interp")
    _, first = f.fun(f.x0)
    kept = first.copy()
    _, second = f.fun(f.x0 + 1.0)
    np.testing.assert_array_equal(first, kept)
    assert not np.shares_memory(first, second)
    assert all(np.shares_memory(leaf, f.x0) for leaf in f.unravel(f.x0).values())
    product = f.hessp(f.x0, f.x0)
    assert not np.shares_memory(product, f.hessp(f.x0, f.x0))


def test_extra_arguments_follow_the_bound_data():
    params, x, y = problem()
    f = mj.scipy_objective(loss, params, backend="interp")     # data through SciPy's args=
    bound = mj.scipy_objective(loss, params, x, backend="interp")
    np.testing.assert_array_equal(f.fun(f.x0, x, y)[1], bound.fun(f.x0, y)[1])
    np.testing.assert_array_equal(f.hessp(f.x0, f.x0, x, y), bound.hessp(f.x0, f.x0, y))


@pytest.mark.parametrize("method", ["L-BFGS-B", "trust-ncg", "Newton-CG"])
def test_minimize_reaches_the_fit_autograd_reaches(method):
    """Few iterations: the problem is not convex, and later Newton-CG steps amplify rounding."""
    params, x, y = problem()
    f = mj.scipy_objective(loss, params, x, y)
    extra = {} if method == "L-BFGS-B" else {"hessp": f.hessp}
    ours = scipy.optimize.minimize(f.fun, f.x0, jac=True, method=method, options={"maxiter": 8}, **extra)
    hvp = autograd.hessian_vector_product(ag_loss)          # hvp(w, x, y, p); SciPy calls hessp(w, p, x, y)
    ag_extra = {} if method == "L-BFGS-B" else {"hessp": lambda w, p, x, y: hvp(w, x, y, p)}
    theirs = scipy.optimize.minimize(autograd.value_and_grad(ag_loss), f.x0, args=(x, y), jac=True,
                                     method=method, options={"maxiter": 8}, **ag_extra)
    assert ours.fun < 0.5 * f.fun(f.x0)[0]
    np.testing.assert_allclose(ours.fun, theirs.fun, rtol=1e-8)
    np.testing.assert_allclose(ours.x, theirs.x, atol=1e-6)
    fitted = f.unravel(ours.x)
    assert set(fitted) == {"W", "v", "c"} and fitted["W"].shape == (4, 3)


def test_what_scipy_objective_refuses():
    params, x, y = problem()
    with pytest.raises(mj.DtypeError, match=r"example_params are float32: SciPy's optimisers work in float64"):
        mj.scipy_objective(loss, {k: v.astype(np.float32) for k, v in params.items()}, x, y)
    with pytest.raises(mj.DtypeError, match=r"example_params\['c'\] is int64"):
        mj.scipy_objective(loss, {**params, "c": np.array(1)}, x, y)
    with pytest.raises(mj.TracingError, match="argnums=1"):
        mj.scipy_objective(mj.compile_loss(lambda x, p: loss(p, x, y), argnums=1), params, x)
    with pytest.raises(TypeError, match="those of the compiled loss given"):
        mj.scipy_objective(mj.compile_loss(loss), params, x, y, backend="interp")
    f = mj.scipy_objective(loss, params, x, y, backend="interp")
    with pytest.raises(mj.ShapeError, match=r"has shape \(16,\), got \(15,\)"):
        f.fun(f.x0[:15])


def test_a_compiled_loss_with_aux_and_static_arguments_serves_scipy():
    params, x, y = problem()
    weighted = lambda params, x, y, weight: (loss(params, x, y) * weight, {"fit": x @ params["W"]})  # noqa: E731
    compiled = mj.compile_loss(weighted, has_aux=True, static_argnums=3, backend="interp")
    f = mj.scipy_objective(compiled, params, x, y, 2.0)
    w = f.x0 + 0.1
    p = np.linspace(-1.0, 1.0, w.size)
    value, grad = f.fun(w)
    assert type(value) is float
    np.testing.assert_allclose(value, 2 * ag_loss(w, x, y), rtol=1e-13)
    np.testing.assert_allclose(grad, 2 * autograd.grad(ag_loss)(w, x, y), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(f.hessp(w, p), 2 * autograd.hessian_vector_product(ag_loss)(w, x, y, p),
                               rtol=1e-10, atol=1e-13)


def test_hess_of_a_noisy_loss_draws_one_noise_for_all_its_rows():
    def noisy(params, x, rng):
        return mj.mean(((x + rng.standard_normal(x.shape)) @ params["w"] + params["c"]) ** 4)
    params, x = {"w": np.array([0.4, -0.7, 1.1]), "c": np.array(0.2)}, np.linspace(-1.0, 1.0, 24).reshape(8, 3)
    step, seed = mj.compile_loss(noisy, backend="interp"), np.random.default_rng(2)
    f = mj.scipy_objective(step, params, x, copy.deepcopy(seed))
    hessian = f.hess(f.x0)
    np.testing.assert_allclose(hessian, hessian.T, rtol=0, atol=1e-13 * np.abs(hessian).max())
    h, columns = 1e-5, []
    for j in range(f.x0.size):
        e = np.zeros_like(f.x0)
        e[j] = h
        gradients = [mj.scipy_objective(step, params, x, copy.deepcopy(seed)).fun(f.x0 + s * e)[1] for s in (1, -1)]
        columns.append((gradients[0] - gradients[1]) / (2 * h))
    reference = np.stack(columns, axis=1)
    np.testing.assert_allclose(hessian, reference, rtol=0, atol=1e-7 * np.abs(reference).max())
