"""Forward mode and Jacobians (``jit.forward``): ``mj.jvp``, ``mj.vjp``, ``mj.jacfwd``,
``mj.jacrev``, ``mj.jacobian``, inside and outside traced functions.

Oracles: central differences of the function in the tangent's direction, the adjoint identity
``<u, J v> = <J^T u, v>`` against the (separately tested) reverse mode, reverse over reverse for
``jvp(grad)``, and autograd's ``make_jvp``, ``make_vjp`` and ``jacobian``.
"""
from __future__ import annotations

import zlib

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import morphjit as mj

from support.gradcheck import fd_jvp
from support.gradient_cases import CASES, cotangent, inputs_of

# svd's backward rule tests its cotangent (a quotient is zero where its numerator is exactly zero,
# whatever the gap of the singular values): forward mode through it is refused
# (test_forward_mode_through_svd_is_refused_naming_it).
FORWARD_CASES = [c for c in CASES if c.dtype == np.float64 and c.fd and c.op != "svd"]


def _inner(a, b) -> float:
    return float(sum(np.vdot(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in zip(a, b)))


@pytest.mark.parametrize("case", FORWARD_CASES, ids=lambda c: c.id)
def test_jvp_of_every_gradient_case(case):
    """J v by central differences and by the adjoint of the reverse mode; jvp of the gradient as
    reverse over reverse (every VJP rule is forward-differentiable)."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    xs = inputs_of(case, rng)
    v = [rng.standard_normal(x.shape) for x in xs]
    u = cotangent(rng, case.fn, xs)

    def f(*xs):
        return case.fn(mj, *xs)

    out, jv = mj.compile(lambda xs: mj.jvp(f, xs, v), backend="interp")(tuple(xs))
    np.testing.assert_allclose(out, case.fn(mj, *xs), rtol=1e-12, atol=1e-14)
    scale = max(1.0, float(np.max(np.abs(jv), initial=0.0)))
    np.testing.assert_allclose(jv, fd_jvp(lambda p: case.fn(mj, *p), xs, v, eps=case.eps), rtol=case.rtol,
                               atol=case.rtol * scale)
    loss = lambda xs: mj.sum(f(*xs) * u)  # noqa: E731
    jtu = mj.compile_loss(loss, backend="interp")(xs)[1]
    rtol = max(1e-9, case.ag_rtol)      # the cases through float32 round there
    np.testing.assert_allclose(_inner([u], [jv]), _inner(jtu, v), rtol=rtol, atol=rtol * scale)
    forward_over_reverse = mj.compile(lambda xs: mj.jvp(mj.grad(loss), (xs,), (v,))[1], backend="interp")(xs)
    reverse_over_reverse = mj.hvp(loss, backend="interp")(xs, v)
    for a, b in zip(forward_over_reverse, reverse_over_reverse):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(b), initial=0.0))))


def test_the_forward_cases_cover_every_differentiable_op():
    from morphjit.ir import OPS
    covered = {c.op for c in FORWARD_CASES}
    missing = sorted(name for name, op in OPS.items() if op.differentiable and name not in covered
                     and name not in ("stop_gradient", "branch_gate", "svd") and not name.startswith("custom_vjp_"))
    assert not missing, missing


def test_forward_mode_through_svd_is_refused_naming_it():
    x, v = np.arange(6.0).reshape(2, 3) + np.eye(2, 3), np.ones((2, 3))
    with pytest.raises(mj.UnsupportedError, match="the backward rule of svd tests or clips its cotangent"):
        mj.jvp(lambda a: mj.linalg.svd(a)[1], (x,), (v,))
    np.testing.assert_allclose(mj.jacrev(lambda a: mj.linalg.svd(a)[1])(x).reshape(2, 6) @ v.ravel(),
                               fd_jvp(lambda p: np.linalg.svd(p[0])[1], [x], [v]), rtol=1e-6)


def _h(W, x):
    return np.tanh(x @ W) * np.exp(-x[:, :2] ** 2)


def _ha(W, x):
    return anp.tanh(anp.dot(x, W)) * anp.exp(-x[:, :2] ** 2)


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_jvp_and_vjp_outside_and_inside_a_traced_function_match_autograd(backend):
    rng = np.random.default_rng(1)
    W, x = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    tW, tx = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    ct = rng.standard_normal((4, 2))
    expected = autograd.make_jvp(lambda W: _ha(W, x))(W)(tW)[1] + autograd.make_jvp(lambda x: _ha(W, x))(x)(tx)[1]
    if backend == "numba":
        out, tangent = mj.jvp(_h, (W, x), (tW, tx))     # outside: a compiled step
    else:
        out, tangent = mj.compile(lambda W, x: mj.jvp(_h, (W, x), (tW, tx)), backend="interp")(W, x)
    np.testing.assert_allclose(out, _ha(W, x), rtol=1e-12)
    np.testing.assert_allclose(tangent, expected, rtol=1e-10, atol=1e-12)
    pulled = autograd.make_vjp(_ha, argnum=0)(W, x)[0](ct), autograd.make_vjp(_ha, argnum=1)(W, x)[0](ct)
    if backend == "numba":
        out, vjp_fn = mj.vjp(_h, W, x)
        cW, cx = vjp_fn(ct)
    else:
        out, cW, cx = mj.compile(lambda W, x: (lambda o, fn: (o,) + fn(ct))(*mj.vjp(_h, W, x)), backend="interp")(W, x)
    np.testing.assert_allclose(out, _ha(W, x), rtol=1e-12)
    np.testing.assert_allclose(cW, pulled[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cx, pulled[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("jacobian", [mj.jacfwd, mj.jacrev, mj.jacobian], ids=["jacfwd", "jacrev", "jacobian"])
def test_jacobians_have_jaxs_shapes_and_autograds_values(jacobian):
    rng = np.random.default_rng(2)
    W, x = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    J = jacobian(_h)(W, x)                                  # outside a trace: a compiled step
    assert J.shape == (4, 2, 3, 2)                          # out.shape + in.shape
    np.testing.assert_allclose(J, autograd.jacobian(_ha)(W, x), rtol=1e-10, atol=1e-12)
    JW, Jx = jacobian(_h, argnums=(0, 1))(W, x)
    np.testing.assert_allclose(Jx, autograd.jacobian(_ha, 1)(W, x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(JW, J, rtol=1e-12)
    tree = jacobian(lambda p: {"a": np.sin(p["w"]) * p["s"], "b": np.sum(p["w"] ** 2)})(
        {"w": W[0], "s": np.array(1.5)})
    assert tree["a"]["w"].shape == (2, 2) and tree["a"]["s"].shape == (2,) and tree["b"]["w"].shape == (2,)
    np.testing.assert_allclose(tree["a"]["w"], np.diag(np.cos(W[0]) * 1.5), atol=1e-14)
    np.testing.assert_allclose(tree["b"]["w"], 2 * W[0], atol=1e-14)
    # inside a gradient: the Jacobian's own derivative
    value, gW = mj.value_and_grad(lambda W, x: np.sum(jacobian(_h, argnums=1)(W, x) ** 2), backend="interp")(W, x)
    a_loss = lambda W: anp.sum(autograd.jacobian(_ha, 1)(W, x) ** 2)  # noqa: E731
    np.testing.assert_allclose(value, a_loss(W), rtol=1e-12)
    np.testing.assert_allclose(gW, autograd.grad(a_loss)(W), rtol=1e-9, atol=1e-11)


def test_a_hessian_as_jacfwd_of_jacrev_is_mj_hessian():
    rng = np.random.default_rng(3)
    w = rng.standard_normal(4)

    def f(w):
        return np.sum(np.log1p(w ** 2) * np.sin(w))

    np.testing.assert_allclose(mj.jacfwd(mj.jacrev(f))(w), mj.hessian(f)(w), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(mj.jacfwd(mj.jacrev(f))(w), autograd.hessian(lambda w: anp.sum(
        anp.log1p(w ** 2) * anp.sin(w)))(w), rtol=1e-11, atol=1e-13)


def test_forward_over_forward_gives_a_laplacian_row_by_row():
    """u_xx + u_yy of a row-wise network by jvp of jvp along tiled unit directions: the batch
    stays symbolic (one step for every number of points)."""
    rng = np.random.default_rng(4)
    W0, W1 = rng.standard_normal((2, 6)), rng.standard_normal((6, 1))

    def u(X):
        return (np.tanh(X @ W0) @ W1)[:, 0]

    def laplacian(X):
        total = 0.0
        for k in range(2):
            e = mj.zeros_like(X) + np.eye(2)[k]
            du = lambda X: mj.jvp(u, (X,), (e,))[1]  # noqa: E731
            total = total + mj.jvp(du, (X,), (e,))[1]
        return total

    def a_u(x):
        return (anp.tanh(anp.dot(x, W0)) @ W1)[0]

    step = mj.compile(laplacian)
    for n in (5, 9):
        X = rng.uniform(0, 1, (n, 2))
        expected = [np.trace(autograd.hessian(a_u)(X[i])) for i in range(n)]
        np.testing.assert_allclose(step(X), expected, rtol=1e-10, atol=1e-12)
    assert step.cache_info().misses == 1


def test_a_backward_rule_not_linear_in_its_cotangent_has_no_forward_mode():
    @mj.custom_vjp
    def clip_gradient(x):
        return x

    clip_gradient.defvjp(lambda x: (x, None), lambda residuals, g: (np.clip(g, -1.0, 1.0),))

    @mj.custom_vjp
    def scaled(x):
        return 2.0 * x

    scaled.defvjp(lambda x: (2.0 * x, None), lambda residuals, g: (2.0 * g,))

    x, v = np.array([0.5, -2.0]), np.array([1.0, 3.0])
    np.testing.assert_allclose(mj.jvp(lambda x: np.sin(scaled(x)), (x,), (v,))[1], np.cos(2 * x) * 2 * v)
    with pytest.raises(mj.UnsupportedError, match=r"the backward rule of clip_gradient \(a custom_vjp\) tests or "
                                                  r"clips its cotangent"):
        mj.jvp(lambda x: np.sin(clip_gradient(x)), (x,), (v,))


def test_jvp_refuses_tangents_unlike_the_primals_naming_them():
    x = np.ones(3)
    with pytest.raises(TypeError, match="tuples or lists"):
        mj.jvp(np.sin, x, x)
    with pytest.raises(mj.ShapeError, match=r"tangents\[0\] has shape \(2,\), but its primal has \(3,\)"):
        mj.jvp(np.sin, (x,), (np.ones(2),))
    with pytest.raises(mj.DtypeError, match=r"tangents\[0\] is float32, but its primal is float64"):
        mj.jvp(np.sin, (x,), (np.ones(3, np.float32),))
    with pytest.raises(mj.ShapeError, match="mj.vjp: cotangent leaf 0 is float64\\[2\\]"):
        mj.vjp(np.sin, x)[1](np.ones(2))


def test_a_jacobian_above_max_basis_is_refused_and_one_over_the_batch_is_specialised():
    x = np.ones(300)
    with pytest.raises(mj.ShapeError, match="300 sweeps .* max_basis=256"):
        mj.jacfwd(np.sin)(x)
    np.testing.assert_allclose(mj.jacfwd(np.sin, max_basis=300)(x), np.diag(np.cos(x)))
    W = np.random.default_rng(5).standard_normal((2, 3))

    def loss(W, X):       # X's rows are a batch: the basis needs its extent
        return np.sum(mj.jacrev(lambda X: np.tanh(X @ W))(X) ** 2)

    step = mj.value_and_grad(loss, backend="interp")
    for n in (2, 3):
        X = np.linspace(-1, 1, 2 * n).reshape(n, 2)
        a_loss = lambda W: anp.sum(autograd.jacobian(lambda X: anp.tanh(anp.dot(X, W)))(X) ** 2)  # noqa: E731
        value, gW = step(W, X)
        np.testing.assert_allclose(value, a_loss(W), rtol=1e-12)
        np.testing.assert_allclose(gW, autograd.grad(a_loss)(W), rtol=1e-10)


_SHIFT = np.array([0.0, 1.0, 2.0])


def _shifted(x):
    return np.sin(x + _SHIFT)


def test_a_compiled_jvp_sees_the_arrays_its_function_reads_at_each_call():
    x, v = np.zeros(3), np.ones(3)
    try:
        for shift in ([0.0, 1.0, 2.0], [3.0, -1.0, 0.5]):
            _SHIFT[:] = shift
            out, tangent = mj.jvp(_shifted, (x,), (v,))
            np.testing.assert_allclose(tangent, np.cos(_SHIFT))
            np.testing.assert_allclose(mj.jacrev(_shifted)(x), np.diag(np.cos(_SHIFT)), atol=1e-15)
    finally:
        _SHIFT[:] = [0.0, 1.0, 2.0]
