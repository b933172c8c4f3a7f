"""Derivatives inside a traced function (``jit.nest``): ``mj.grad``, compiled losses, ``mj.hvp``,
``mj.hessian`` and ``mj.compile`` called on traced values trace into the enclosing program.

Oracles: autograd's nested derivatives (its own nested tests, ported) and central differences of
the next-lower derivative; the worked examples of perturbation confusion have closed forms.
"""
from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import morphjit as mj

from support.gradcheck import central_difference, flat_leaves, unflatten_like
from support.strategies import random_programs
from test_second import AG   # autograd's namespace with the matrix norms (this folder's)

BACKENDS = ["interp", "numba"]


def grad(fn, *a, **k):
    return mj.grad(fn, *a, backend="interp", **k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_worked_examples_of_nesting_and_perturbation_confusion(backend):
    g = lambda fn: mj.grad(fn, backend=backend)  # noqa: E731
    assert np.isclose(g(g(np.sin))(1.0), -np.sin(1.0))
    # autograd's test_enclosing_scope_ref: the inner function closes over the outer point
    assert np.isclose(g(lambda x: x * g(lambda y: x * y)(2.0))(2.0), 4.0)
    # the inner derivative is taken at the outer value itself: d(x * x)/dx, not d(x * x * x)/dx
    assert np.isclose(g(lambda x: x * g(lambda y: x * y)(x))(3.0), 6.0)
    # Siskind and Pearlmutter's perturbation confusion example
    assert np.isclose(g(lambda x: x * g(lambda y: x + y)(1.0))(5.0), 1.0)
    third = g(g(g(lambda x: np.sin(np.sin(x) + np.sin(x)))))(0.3)
    expected = autograd.grad(autograd.grad(autograd.grad(lambda x: anp.sin(anp.sin(x) + anp.sin(x)))))(0.3)
    np.testing.assert_allclose(third, expected, rtol=1e-12)


def _third_derivative_cases():
    """autograd's test_graphs: nested derivatives with other arguments, fan-out and identities."""
    def fun(x, y):
        return np.sin(np.sin(x) + np.sin(x) * y)

    def afun(x, y):
        return anp.sin(anp.sin(x) + anp.sin(x) * y)

    return [
        ("third_derivative_other_args", lambda g: g(g(g(fun)), 1)(0.5, 0.7),
         autograd.grad(autograd.grad(autograd.grad(afun)), 1)(0.5, 0.7)),
        ("third_derivative_other_args2", lambda g: g(g(g(fun, 1)), 1)(0.5, 0.7),
         autograd.grad(autograd.grad(autograd.grad(afun, 1)), 1)(0.5, 0.7)),
        ("grad_fanout", lambda g: g(lambda x: np.sin(x) + np.sin(x))(0.4), 2 * np.cos(0.4)),
        ("grad_identity", lambda g: g(g(lambda x: x))(0.4), 0.0),
        ("power_arg0", lambda g: g(g(lambda x: x ** 0.0))(0.0), 0.0),
        ("const_graph", lambda g: g(lambda x: g(lambda y: np.sin(y) + 2 * y)(x * 1.5))(0.3),
         autograd.grad(lambda x: autograd.grad(lambda y: anp.sin(y) + 2 * y)(x * 1.5))(0.3)),
    ]


@pytest.mark.parametrize("name, ours, expected", _third_derivative_cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_autograds_nested_graph_tests(name, ours, expected):
    np.testing.assert_allclose(ours(grad), expected, rtol=1e-11, atol=1e-14)


def test_a_tuple_argument_and_a_nested_higher_order_gradient():
    """autograd's test_tuple.py::test_nested_higher_order."""
    def outer(x):
        def inner(y):
            return y[0] * y[1]
        return np.sum(grad(inner)((x, x * x))[0])

    def a_outer(x):
        return anp.sum(autograd.grad(lambda y: y[0] * y[1])((x, x * x))[0])

    for x in (0.5, 1.5):
        np.testing.assert_allclose(grad(grad(outer))(x), autograd.grad(autograd.grad(a_outer))(x), rtol=1e-12)


def _mlp(W, x):
    return np.tanh(np.tanh(x @ W[0]) @ W[1])


def _a_mlp(W, x):
    return anp.tanh(anp.dot(anp.tanh(anp.dot(x, W[0])), W[1]))


def _weights(rng, d=3, h=4):
    return [rng.standard_normal((d, h)) * 0.7, rng.standard_normal((h, 2)) * 0.7]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_penalty_matches_autograd_and_differences(backend):
    """WGAN-GP style: the norm of the input gradient of each row in the loss; the parameters'
    gradient through it, the inner function closing over the outer (traced) weights."""
    rng = np.random.default_rng(0)
    W, x = _weights(rng), rng.standard_normal((5, 3))

    def loss(W, x):
        gx = mj.grad(lambda x: np.sum(_mlp(W, x)))(x)          # per-row input gradients
        return np.mean((np.sqrt(np.sum(gx * gx, axis=1)) - 1.0) ** 2) + np.mean(_mlp(W, x))

    def a_loss(W, x):
        gx = autograd.grad(lambda x: anp.sum(_a_mlp(W, x)))(x)
        return anp.mean((anp.sqrt(anp.sum(gx * gx, axis=1)) - 1.0) ** 2) + anp.mean(_a_mlp(W, x))

    value, gW = mj.value_and_grad(loss, backend=backend)(W, x)
    np.testing.assert_allclose(value, a_loss(W, x), rtol=1e-12)
    for ours, theirs in zip(gW, autograd.grad(a_loss)(W, x)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    flat = np.concatenate([w.ravel() for w in W])

    def at(v):
        return a_loss([v[:12].reshape(3, 4), v[12:].reshape(4, 2)], x)
    np.testing.assert_allclose(np.concatenate([g.ravel() for g in gW]), central_difference(at, flat), rtol=1e-6,
                               atol=1e-8)


def test_per_example_input_gradients_serve_every_batch_size_with_one_step():
    """A row-wise network's input gradient of the sum is each row's own gradient; the batch extent
    stays symbolic through the nested derivative."""
    rng = np.random.default_rng(1)
    W = _weights(rng)

    def penalty(W, x):
        gx = mj.grad(lambda x: np.sum(_mlp(W, x)))(x)
        return np.sum(gx ** 2)

    step = mj.value_and_grad(penalty)
    for n in (7, 3, 11):
        x = rng.standard_normal((n, 3))
        value, gW = step(W, x)
        rows = [autograd.grad(lambda r: anp.sum(_a_mlp(W, r)))(x[i:i + 1]) for i in range(n)]
        np.testing.assert_allclose(value, sum(np.sum(r ** 2) for r in rows), rtol=1e-12)
        expected = autograd.grad(lambda W: anp.sum(autograd.grad(lambda x: anp.sum(_a_mlp(W, x)))(x) ** 2))(W)
        for ours, theirs in zip(gW, expected):
            np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    assert step.cache_info().misses == 1


def test_a_pinn_residual_with_second_derivatives_trains_as_one_step():
    """u_xx + u_yy of a small tanh network at collocation points (reverse over reverse, row by
    row), in a loss trained with Adam: each step's loss and gradient as autograd's."""
    rng = np.random.default_rng(2)
    params = {"W0": rng.standard_normal((2, 8)) * 0.5, "b0": np.zeros(8), "W1": rng.standard_normal((8, 1)) * 0.5}
    X = rng.uniform(0, 1, (16, 2))
    f = -2 * np.pi ** 2 * np.sin(np.pi * X[:, 0]) * np.sin(np.pi * X[:, 1])

    def make(ns, grad_of):
        def u(p, X):
            return ns.tanh(X @ p["W0"] + p["b0"]) @ p["W1"]

        def loss(p, X, f):
            gx = lambda X: grad_of(lambda X: ns.sum(u(p, X)))(X)  # noqa: E731
            lap = sum(grad_of(lambda X: ns.sum(gx(X)[:, k]))(X)[:, k] for k in range(2))
            return ns.mean((lap - f) ** 2)
        return loss

    ours = make(np, mj.grad)
    theirs = make(anp, autograd.grad)
    value, g = mj.value_and_grad(ours)(params, X, f)
    np.testing.assert_allclose(value, theirs(params, X, f), rtol=1e-12)
    expected = autograd.grad(theirs)(params, X, f)
    for k in params:
        np.testing.assert_allclose(g[k], expected[k], rtol=1e-9, atol=1e-12)
    step = mj.train_step(ours, mj.optim.adam(1e-2))
    p, state = {k: v.copy() for k, v in params.items()}, None
    state = step.init(p)
    losses = [step(p, state, X, f) for _ in range(5)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("kind", ["compile_loss", "value_and_grad", "grad", "grad_has_aux", "argnums_tuple", "compile",
                                  "static"])
def test_every_compiled_object_traces_into_the_enclosing_function(kind):
    rng = np.random.default_rng(3)
    W, x = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))

    def f(W, x):
        return np.sum(np.sin(x @ W) ** 2)

    def af(W, x):
        return anp.sum(anp.sin(anp.dot(x, W)) ** 2)

    def aux(W, x):
        return f(W, x), x @ W

    inner = {"compile_loss": lambda W, x: mj.compile_loss(f)(W, x)[1],
             "value_and_grad": lambda W, x: mj.value_and_grad(f)(W, x)[1],
             "grad": lambda W, x: mj.grad(f)(W, x),
             "grad_has_aux": lambda W, x: mj.grad(aux, has_aux=True)(W, x)[0] + 0.0 * np.sum(mj.grad(aux, has_aux=True)(W, x)[1]),
             "argnums_tuple": lambda W, x: mj.grad(f, argnums=(0, 1))(W, x)[0] + np.sum(mj.grad(f, argnums=(0, 1))(W, x)[1]),
             "compile": lambda W, x: mj.compile(lambda W, x: mj.grad(f)(W, x))(W, x),
             "static": lambda W, x: mj.grad(lambda W, x, scale: scale * f(W, x), static_argnums=2)(W, x, 3.0)}[kind]
    expected_inner = {"argnums_tuple": lambda W, x: autograd.grad(af)(W, x) + anp.sum(autograd.grad(af, 1)(W, x)),
                      "static": lambda W, x: 3.0 * autograd.grad(af)(W, x)}.get(kind, autograd.grad(af))

    def outer(W, x):
        return np.sum(inner(W, x) ** 2)

    value, gW = mj.value_and_grad(outer, backend="interp")(W, x)
    np.testing.assert_allclose(value, anp.sum(expected_inner(W, x) ** 2), rtol=1e-12)
    np.testing.assert_allclose(gW, autograd.grad(lambda W: anp.sum(expected_inner(W, x) ** 2))(W), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hvp_and_hessian_inside_a_traced_function(backend):
    rng = np.random.default_rng(4)
    W, x, v = rng.standard_normal((3, 2)), rng.standard_normal((4, 3)), rng.standard_normal((3, 2))

    def f(W, x):
        return np.sum(np.tanh(x @ W) ** 3)

    def af(W, x):
        return anp.sum(anp.tanh(anp.dot(x, W)) ** 3)

    H = autograd.hessian(af)(W, x).reshape(6, 6)
    hv = mj.compile(lambda W, x: mj.hvp(f)(W, v, x), backend=backend)(W, x)
    np.testing.assert_allclose(hv.ravel(), H @ v.ravel(), rtol=1e-11)
    g, hv = mj.compile(lambda W, x: mj.hvp(f).grad_and_hvp(W, v, x), backend=backend)(W, x)
    np.testing.assert_allclose(g, autograd.grad(af)(W, x), rtol=1e-12)
    np.testing.assert_allclose(hv.ravel(), H @ v.ravel(), rtol=1e-11)
    inside = mj.compile(lambda W, x: mj.hessian(f)(W, x), backend=backend)(W, x)
    np.testing.assert_allclose(inside, mj.hessian(f, backend=backend)(W, x), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(inside, H, rtol=1e-11, atol=1e-13)
    # the gradient of a function of the Hessian: third derivatives
    value, gW = mj.value_and_grad(lambda W, x: np.sum(mj.hessian(f)(W, x) ** 2), backend=backend)(W, x)
    np.testing.assert_allclose(value, np.sum(H ** 2), rtol=1e-12)
    np.testing.assert_allclose(gW, autograd.grad(lambda W: anp.sum(autograd.hessian(af)(W, x) ** 2))(W),
                               rtol=1e-9, atol=1e-11)


A_GLOBAL = np.array([1.0, 2.0, 3.0])


def _reads_the_global(x):
    return np.sum(A_GLOBAL * x ** 2)


D_GLOBAL = mj.grad(_reads_the_global)


def test_a_transformation_made_at_module_level_sees_the_arrays_its_function_reads_at_each_call():
    step = mj.value_and_grad(lambda x: np.sum(D_GLOBAL(x) ** 2), backend="interp")
    x = np.ones(3)
    try:
        for a in ([1.0, 2.0, 3.0], [10.0, 0.0, 0.0]):
            A_GLOBAL[:] = a
            value, g = step(x)
            np.testing.assert_allclose(value, np.sum((2 * A_GLOBAL * x) ** 2))
            np.testing.assert_allclose(g, 8 * A_GLOBAL ** 2 * x)
    finally:
        A_GLOBAL[:] = [1.0, 2.0, 3.0]


def test_python_floats_are_differentiated_as_float64_scalars():
    g = mj.grad(lambda x, y: x * x * y, argnums=(0, 1))(3.0, 2.0)
    assert [np.asarray(v).dtype for v in g] == [np.float64, np.float64]
    np.testing.assert_allclose(g, [12.0, 9.0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(allow_cast=False, max_ops=5))
def test_the_gradient_of_a_gradient_of_random_programs_is_autograds(example):
    """``grad(p -> <grad f(p), v>)`` (reverse over reverse, nested) against autograd's."""
    fn, (params, data) = example
    rng = np.random.default_rng(5)
    leaves = flat_leaves(params)
    v = [rng.standard_normal(np.shape(x)) for x in leaves]

    def directional(ns, grad_of):
        f = fn.generic(ns)

        def outer(p):
            gs = grad_of(lambda q: f(unflatten_like(params, q), data))(p)
            return sum(ns.sum(gs[i] * t) for i, t in enumerate(v))
        return outer

    ours = mj.grad(directional(mj, mj.grad), backend="interp")(leaves)
    theirs = autograd.grad(directional(AG, autograd.grad))(leaves)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)


def test_an_error_inside_says_which_transformation_and_the_users_line():
    def inner(y):
        return y * 2.0          # not a scalar

    def outer(x):
        return np.sum(mj.grad(inner)(x))   # the call the message names

    with pytest.raises(mj.ShapeError, match=r"in mj\.grad of inner \(argument y \(argnums=0\)\), called at "
                                            r"test_nested\.py:\d+:\n  inner must return a scalar loss") as raised:
        mj.grad(outer)(np.ones(3))
    assert "differentiate the sum" in str(raised.value)


def test_an_integer_argument_differentiated_inside_is_refused_naming_it():
    def outer(x):
        return mj.grad(lambda k, x: np.sum(x * k))(np.arange(3), x)

    with pytest.raises(mj.DtypeError, match=r"mj\.grad: k is differentiated but is int64; only float32 and "
                                            r"float64 values have derivatives"):
        mj.grad(lambda x: np.sum(outer(x)))(np.ones(3))


def test_what_compiles_a_step_of_its_own_is_refused_inside_a_traced_function():
    f = mj.grad(lambda x: np.sum(x ** 2))

    with pytest.raises(mj.UnsupportedError, match="explain, program, source and step_for") as raised:
        mj.grad(lambda x: np.sum(f.program(x).outputs[0] * 0.0 + x))(np.ones(2))
    assert "f.program(x)" in str(raised.value)
    step = mj.train_step(lambda p, x: np.sum(p * x), mj.optim.sgd(0.1))
    with pytest.raises(mj.UnsupportedError, match="updates its arguments in place"):
        mj.grad(lambda p: step(p, None, np.ones(2)))(np.ones(2))
    with pytest.raises(mj.UnsupportedError, match="out= has no arrays"):
        mj.grad(lambda x: np.sum(f(x, out=np.empty(2))))(np.ones(2))
