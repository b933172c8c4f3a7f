"""Second derivatives (``mj.hvp``, ``mj.hessian``): Hessian-vector products against central
differences of the (separately tested) gradient and against autograd's reverse over reverse.

* every gradient case of ``support.gradient_cases.CASES`` (every differentiable op): the HVP of
  ``sum(op(xs) * u)``, so every VJP rule is differentiated once more (interp backend);
* the models of ``test_models`` on both backends, and random programs (hypothesis);
* the dense Hessian, the batch-polymorphic and disk-cached step, and the errors.
"""
from __future__ import annotations

import copy
import warnings
import zlib

import autograd
import autograd.numpy as anp
import numpy as np
import scipy.special
import pytest
from hypothesis import HealthCheck, given, settings

import morphjit as mj
from morphjit.api import bind
from morphjit.ir import ELEMENTWISE, OPS, defop, elementwise_rule

from support.gradcheck import AutogradNS, flat_leaves, unflatten_like
from support.strategies import random_programs
from support.gradient_cases import CASES, cotangent, inputs_of
from test_models import MODELS, _data   # (end-to-end models of this folder)

EPS = 1e-5        # central differences of the gradient: error ~ EPS**2 * (third derivative)
FD_RTOL = 1e-6    # relative to the largest entry of H v (the bound)


class _Linalg:
    """autograd.numpy.linalg, with the test namespace's norm (which knows the matrix norms)."""
    norm = staticmethod(AutogradNS.linalg.norm)

    def __getattr__(self, name):
        return getattr(anp.linalg, name)


class _AutogradNS(AutogradNS):
    linalg = _Linalg()
    norm = staticmethod(AutogradNS.linalg.norm)   # the cases test `ns is gradcheck.AG`, not this


AG = _AutogradNS()


def fd_hvp(grad, params, v, eps=EPS) -> list[np.ndarray]:
    """``H v`` by central differences of ``grad(params) -> list of leaves``."""
    step = lambda sign: unflatten_like(params, [np.asarray(p + sign * eps * t)  # noqa: E731
                                                for p, t in zip(flat_leaves(params), flat_leaves(v))])
    return [(a - b) / (2 * eps) for a, b in zip(flat_leaves(grad(step(1))), flat_leaves(grad(step(-1))))]


def autograd_hvp(loss, params, v) -> list[np.ndarray]:
    """autograd's reverse over reverse: the gradient of ``<grad(params), v>``."""
    leaves, directions = flat_leaves(params), flat_leaves(v)
    flat = lambda xs: loss(unflatten_like(params, xs))  # noqa: E731
    inner = lambda xs: sum(anp.sum(g * t) for g, t in zip(autograd.grad(flat)(xs), directions))  # noqa: E731
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Output seems independent of input")   # a linear case
        return [np.asarray(h) for h in autograd.grad(inner)(leaves)]


def assert_close(actual, expected, rtol, what):
    """Every leaf within ``rtol`` of the largest entry of ``expected`` (plus rounding noise)."""
    actual, expected = flat_leaves(actual), flat_leaves(expected)
    scale = max((float(np.max(np.abs(e))) for e in expected if e.size), default=0.0)
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape and a.dtype == e.dtype, f"{what}: leaf {k} is {a.dtype}{a.shape}, not {e.dtype}{e.shape}"
        np.testing.assert_allclose(a, e, rtol=0, atol=rtol * scale + 1e-12, err_msg=f"{what}: leaf {k}")


# ---------------------------------------------------------------------------------------------
# Every VJP rule, differentiated again

SECOND_ORDER_CASES = [c for c in CASES if c.dtype == np.float64 and c.fd]


@pytest.mark.parametrize("case", SECOND_ORDER_CASES, ids=lambda c: c.id)
def test_hvp_of_every_gradient_case(case):
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    xs = inputs_of(case, rng)
    u = cotangent(rng, case.fn, xs)
    v = [rng.standard_normal(x.shape) for x in xs]

    def loss(xs):
        return mj.sum(case.fn(mj, *xs) * u)

    hv = mj.hvp(loss, backend="interp")(xs, v)
    gradient = mj.compile_loss(loss, backend="interp")
    assert_close(hv, fd_hvp(lambda p: gradient(p)[1], xs, v), FD_RTOL, f"{case.id} against finite differences")
    reference = autograd_hvp(lambda p: AG.sum(case.fn(AG, *p) * u), xs, v)
    assert_close(hv, reference, 1e-9, f"{case.id} against autograd")


def test_the_second_order_cases_cover_every_differentiable_op():
    covered = {c.op for c in SECOND_ORDER_CASES}
    missing = sorted(name for name, op in OPS.items() if op.differentiable and name not in covered
                     and name not in ("stop_gradient", "branch_gate") and not name.startswith("custom_vjp_"))
    assert not missing, missing   # branch_gate: test_second_derivatives_follow_the_path_taken


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_second_derivatives_follow_the_path_taken(backend):
    def piecewise(x):
        if mj.sum(x) > 0:
            return mj.sum(mj.sin(x) * x)
        return mj.sum(mj.sqrt(-x) * x[::-1])
    hvp = mj.hvp(piecewise, backend=backend)
    for x in (np.array([0.5, 1.5, -0.25]), np.array([-0.5, -1.5, -0.25])):
        v = np.array([1.0, -2.0, 0.5])
        gradient = mj.compile_loss(piecewise, backend="interp")
        np.testing.assert_allclose(hvp(x, v), fd_hvp(lambda p: gradient(p)[1], x, v)[0], rtol=1e-6, atol=1e-8)


def test_stop_gradient_stops_second_derivatives_too():
    """JAX's meaning: the gradient of x * stop_gradient(x) is stop_gradient(x), constant."""
    x, v = np.array([0.5, -2.0, 3.0]), np.array([1.0, 2.0, -1.0])
    hv = mj.hvp(lambda x: mj.sum(x * mj.stop_gradient(x) + x ** 3), backend="interp")(x, v)
    np.testing.assert_allclose(hv, 6 * x * v, rtol=1e-14)


def test_a_custom_backward_rule_is_differentiated_again():
    @mj.custom_vjp
    def cube(x):
        return x ** 3

    cube.defvjp(lambda x: (x ** 3, x), lambda x, g: (3.0 * x * x * g,))
    x, v = np.array([0.5, -2.0, 3.0]), np.array([1.0, 2.0, -1.0])
    hv = mj.hvp(lambda x: mj.sum(cube(x)), backend="interp")(x, v)
    np.testing.assert_allclose(hv, 6 * x * v, rtol=1e-14)


def test_an_op_without_a_vjp_rule_on_a_differentiated_value_is_refused():
    """Taking its result as constant would be a silently wrong gradient (first order or second)."""
    defop("floor_without_vjp", ELEMENTWISE, elementwise_rule("floor_without_vjp"), np.floor,
          scalar=lambda K, x: f"np.floor({x})")
    try:
        def loss(x):
            return mj.sum(bind("floor_without_vjp", [x]) * x)
        with pytest.raises(mj.UnsupportedError, match="floor_without_vjp has no VJP rule") as info:
            mj.compile_loss(loss, backend="interp")(np.ones(3))
        assert "test_second.py" in str(info.value)   # the user's line
    finally:
        del OPS["floor_without_vjp"]


# ---------------------------------------------------------------------------------------------
# Models, on both backends

def _model_case(name):
    model, rng = MODELS[name], np.random.default_rng(sorted(MODELS).index(name))
    params, *data = _data(name, rng)
    v = unflatten_like(params, [rng.standard_normal(np.shape(x)) for x in flat_leaves(params)])
    return model, params, v, data


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hvp_of_the_models_interp(name):
    _check_model(name, "interp")


@pytest.mark.parametrize("name", ["mlp3", "logistic_regression", "attention"])  # mlp2: below
def test_hvp_of_the_models_numba(name):
    _check_model(name, "numba")


def _check_model(name, backend):
    model, params, v, data = _model_case(name)
    hvp = mj.hvp(lambda p, *d: model(mj, p, *d), backend=backend)
    before = [np.copy(x) for x in flat_leaves((params, v, data))]
    hv = hvp(params, v, *data)
    for x, b in zip(flat_leaves((params, v, data)), before):
        np.testing.assert_array_equal(x, b, err_msg="the HVP step modified its inputs")
    assert type(hv) is type(params)
    gradient = mj.compile_loss(lambda p, *d: model(mj, p, *d), backend="interp")
    assert_close(hv, fd_hvp(lambda p: gradient(p, *data)[1], params, v), FD_RTOL, f"{name} against finite differences")
    assert_close(hv, autograd_hvp(lambda p: model(AG, p, *data), params, v), 1e-10, f"{name} against autograd")
    grad, hv_again = hvp.grad_and_hvp(params, v, *data)
    assert_close(grad, gradient(params, *data)[1], 1e-13, f"{name}: the gradient that comes with the product")
    assert_close(hv_again, hv, 0, f"{name}: grad_and_hvp")


def test_a_float32_hvp_stays_float32():
    model, params, v, data = _model_case("mlp3")
    as32 = lambda tree: unflatten_like(tree, [np.asarray(x, np.float32) if np.asarray(x).dtype.kind == "f"  # noqa: E731
                                              else x for x in flat_leaves(tree)])
    hv = mj.hvp(lambda p, *d: model(mj, p, *d), backend="interp")(as32(params), as32(v), *as32(data))
    assert all(h.dtype == np.float32 for h in flat_leaves(hv))
    reference = autograd_hvp(lambda p: model(AG, p, *as32(data)), as32(params), as32(v))
    assert_close(hv, [r.astype(np.float32) for r in reference], 1e-5, "float32 against autograd at the same point")


def test_hvp_serves_every_batch_size_with_one_step_and_is_cached_on_disk():
    model, params, v, (x, labels) = _model_case("mlp2")
    hvp = mj.hvp(lambda p, x, y: model(mj, p, x, y))
    for n in (8, 5, 3):
        hv = hvp(params, v, x[:n], labels[:n])
        reference = autograd_hvp(lambda p: model(AG, p, x[:n], labels[:n]), params, v)
        assert_close(hv, reference, 1e-10, f"batch of {n}")
    info = hvp.cache_info()
    assert len(info.signatures) == 1 and "B" in info.signatures[0], info
    assert "cached on disk" in repr(hvp)
    text = str(hvp.explain(params, v, x, labels))
    assert "hvp_<lambda>" in text and "softmax" in text


def test_hvp_accepts_a_compiled_loss_and_keeps_its_settings():
    model, params, v, data = _model_case("logistic_regression")
    loss = mj.compile_loss(lambda p, x, y: model(mj, p, x, y), backend="interp")
    hvp = mj.hvp(loss)
    assert hvp.backend == "interp"
    assert_close(hvp(params, v, *data), autograd_hvp(lambda p: model(AG, p, *data), params, v), 1e-10, "hvp")
    with pytest.raises(mj.TracingError, match="argnums=1"):
        mj.hvp(mj.compile_loss(lambda x, p: model(mj, p, x, data[1]), argnums=1))


def test_hvp_with_out_writes_into_the_given_tree():
    model, params, v, data = _model_case("mlp2")
    hvp = mj.hvp(lambda p, *d: model(mj, p, *d), backend="interp")
    out = {k: np.empty_like(x) for k, x in params.items()}
    assert hvp(params, v, *data, out=out) is out
    assert_close(out, hvp(params, v, *data), 0, "out=")


# ---------------------------------------------------------------------------------------------
# Random programs

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(allow_cast=False, max_ops=6))
def test_hvp_of_random_programs(example):
    fn, (params, data) = example
    rng = np.random.default_rng(len(fn.source))
    v = unflatten_like(params, [rng.standard_normal(np.shape(x)) for x in flat_leaves(params)])
    hv = mj.hvp(fn, backend="interp")(params, v, data)
    reference = autograd_hvp(lambda p: fn.generic(AG)(p, data), params, v)
    assert_close(hv, reference, 1e-7, fn.source)


# ---------------------------------------------------------------------------------------------
# Dense Hessians

@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_hessian_of_a_small_mlp_matches_autograd(backend):
    model, params, _, data = _model_case("mlp2")
    hessian = mj.hessian(lambda p, *d: model(mj, p, *d), backend=backend)(params, *data)
    flat, _ = mj.ravel_pytree(params)
    bounds = np.cumsum([0] + [x.size for x in flat_leaves(params)])
    unravel = lambda w: unflatten_like(params, [w[a:b].reshape(x.shape) for a, b, x in  # noqa: E731
                                                 zip(bounds, bounds[1:], flat_leaves(params))])
    reference = autograd.hessian(lambda w: model(AG, unravel(w), *data))(flat)
    assert hessian.shape == (flat.size, flat.size) and hessian.dtype == np.float64
    np.testing.assert_allclose(hessian, reference, rtol=0, atol=1e-10 * np.max(np.abs(reference)))


def test_hessian_refuses_a_large_parameter_count():
    x = np.ones(2001)
    with pytest.raises(ValueError, match=r"2001 parameters, above max_parameters=2000.*mj\.hvp"):
        mj.hessian(lambda w: mj.sum(w ** 4), backend="interp")(x)
    hessian = mj.hessian(lambda w: mj.sum(w ** 4), backend="interp", max_parameters=3)
    np.testing.assert_allclose(hessian(np.arange(3.0)), np.diag(12 * np.arange(3.0) ** 2), rtol=1e-14)
    assert "pow" in str(hessian.explain(np.ones(3)))     # the report on the HVP step of each row


def noisy_loss(p, x, rng):
    """A loss whose noise enters its curvature: rows drawn with different noise would make its
    Hessian non-symmetric."""
    return mj.mean(((x + rng.standard_normal(x.shape)) @ p) ** 4)


def gradient_differences(step, p, x, rng, h=1e-5):
    """Central differences of the gradient of ``step``, each evaluation with a copy of ``rng``
    (the same seed, so the same noise)."""
    columns = []
    for j in range(p.size):
        e = np.zeros_like(p)
        e[j] = h
        plus, minus = step(p + e, x, copy.deepcopy(rng))[1], step(p - e, x, copy.deepcopy(rng))[1]
        columns.append((plus - minus) / (2 * h))
    return np.stack(columns, axis=1)


@pytest.mark.parametrize("backend, make", [("interp", np.random.default_rng), ("interp", np.random.RandomState),
                                           ("numba", np.random.default_rng)])
def test_the_hessian_of_a_noisy_loss_is_that_of_one_draw_of_its_noise(backend, make):
    p, x = np.array([0.4, -0.7, 1.1]), np.linspace(-1.0, 1.0, 24).reshape(8, 3)
    rng = make(5)
    before = copy.deepcopy(rng)
    hessian = mj.hessian(noisy_loss, backend=backend)(p, x, rng)
    np.testing.assert_allclose(hessian, hessian.T, rtol=0, atol=1e-13 * np.abs(hessian).max())
    step = mj.compile_loss(noisy_loss, backend=backend)
    reference = gradient_differences(step, p, x, before)
    np.testing.assert_allclose(hessian, reference, rtol=0, atol=1e-7 * np.abs(reference).max())
    one_call = copy.deepcopy(before)
    step(p, x, one_call)
    assert rng.random() == one_call.random()   # advanced as by one call
    assert not np.allclose(mj.hessian(noisy_loss, backend=backend)(p, x, rng), hessian)   # a new seed


# ---------------------------------------------------------------------------------------------
# Errors

def test_a_direction_shaped_unlike_the_parameters_is_named():
    hvp = mj.hvp(lambda params, x: mj.sum((x @ params["w"]) ** 2), backend="interp")
    params, x = {"w": np.ones(3)}, np.ones((4, 3))
    with pytest.raises(mj.ShapeError, match=r"v\['w'\] is f64\[2\], but the parameter it is a direction for is f64\[3\]"):
        hvp(params, {"w": np.ones(2)}, x)
    with pytest.raises(mj.TracingError, match=r"v must have the structure of params"):
        hvp(params, {"b": np.ones(3)}, x)
    with pytest.raises(mj.DtypeError, match=r"v\['w'\] is f32\[3\], but the parameter it is a direction for is f64\[3\]"):
        hvp(params, {"w": np.ones(3, np.float32)}, x)


def test_a_loss_that_is_not_a_scalar_is_refused():
    with pytest.raises(mj.ShapeError, match="must return a scalar loss"):
        mj.hvp(lambda w: w * 2.0, backend="interp")(np.ones(3), np.ones(3))


def test_ravel_pytree_round_trips_through_views():
    tree = {"b": np.arange(3.0), "W": np.arange(6.0).reshape(2, 3), "s": np.array(7.0)}
    flat, unravel = mj.ravel_pytree(tree)
    np.testing.assert_array_equal(flat, [0, 1, 2, 3, 4, 5, 0, 1, 2, 7])   # keys in sorted order
    back = unravel(flat)
    assert all(np.shares_memory(back[k], flat) for k in tree)
    for k in tree:
        np.testing.assert_array_equal(back[k], tree[k])
    with pytest.raises(mj.ShapeError, match=r"has shape \(10,\), got \(9,\)"):
        unravel(flat[:9])
    with pytest.raises(mj.DtypeError, match=r"tree\['s'\] is float32"):
        mj.ravel_pytree({**tree, "s": np.float32(1.0)})


# ---------------------------------------------------------------------------------------------
# Compiled losses with aux outputs and static arguments

def _scaled_loss(params, x, y, power, reduce="mean"):
    """A loss whose static arguments change the program: ``power`` positionally, ``reduce`` by name."""
    err = (mj.tanh(x @ params["W"]) @ params["v"] - y) ** power
    return mj.mean(err) if reduce == "mean" else mj.sum(err)


def _ag_scaled_loss(params, x, y, power, reduce="mean"):
    err = (anp.tanh(x @ params["W"]) @ params["v"] - y) ** power
    return anp.mean(err) if reduce == "mean" else anp.sum(err)


def _scaled_problem():
    rng = np.random.default_rng(3)
    params = {"W": rng.normal(size=(3, 4)), "v": rng.normal(size=4)}
    v = {"W": rng.normal(size=(3, 4)), "v": rng.normal(size=4)}
    return params, v, rng.normal(size=(6, 3)), rng.normal(size=6)


def test_hvp_keeps_the_static_arguments_of_a_compiled_loss_and_takes_its_own():
    params, v, x, y = _scaled_problem()
    compiled = mj.compile_loss(_scaled_loss, static_argnums=3, static_argnames="reduce", backend="interp")
    given = mj.hvp(_scaled_loss, static_argnums=(3,), static_argnames=("reduce",), backend="interp")
    for power, reduce in [(2, "mean"), (4, "sum")]:
        reference = autograd_hvp(lambda p: _ag_scaled_loss(p, x, y, power, reduce), params, v)
        assert_close(mj.hvp(compiled)(params, v, x, y, power, reduce=reduce), reference, 1e-10, "inherited")
        assert_close(given(params, v, x, y, power, reduce), reference, 1e-10, "given")
    hessian = mj.hessian(_scaled_loss, static_argnums=3, backend="interp")(params, x, y, 4)
    flat = hessian @ mj.ravel_pytree(v)[0]
    np.testing.assert_allclose(flat, mj.ravel_pytree(given(params, v, x, y, 4, "mean"))[0], rtol=1e-12)
    with pytest.raises(TypeError, match="argument 0"):
        mj.hvp(_scaled_loss, static_argnums=0)


def test_hvp_of_a_loss_with_aux_is_the_hvp_of_its_loss():
    params, v, x, y = _scaled_problem()
    with_aux = mj.compile_loss(lambda p, x, y: (_scaled_loss(p, x, y, 2), {"h": mj.tanh(x @ p["W"])}),
                               has_aux=True, backend="interp")
    reference = autograd_hvp(lambda p: _ag_scaled_loss(p, x, y, 2), params, v)
    assert_close(mj.hvp(with_aux)(params, v, x, y), reference, 1e-10, "has_aux")


def test_hvp_of_digamma_is_polygamma_2_at_whole_numbers_and_below_one_half():
    # trigamma's reflection branch, not taken at a whole x >= 1/2, must not poison the gradient there
    x = np.array([1.0, 2.0, 3.0, 7.0, 1.5, 0.25, -0.5, -1.5, -2.25])
    hv = mj.hvp(lambda p: mj.sum(scipy.special.digamma(p)), backend="interp")(x, np.ones_like(x))
    np.testing.assert_allclose(hv, scipy.special.polygamma(2, x), rtol=1e-9)


_SCALES = np.array([1.0, 2.0, 3.0])


def _cubic(x):
    return mj.sum(_SCALES * x ** 3)


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_the_hvp_and_hessian_see_the_arrays_the_loss_reads_at_each_call(backend):
    hvp, hessian = mj.hvp(_cubic, backend=backend), mj.hessian(_cubic, backend=backend)
    x, v = np.array([1.0, -0.5, 2.0]), np.ones(3)
    try:
        for scales in ([1.0, 2.0, 3.0], [10.0, 0.0, -1.0]):
            _SCALES[:] = scales
            np.testing.assert_allclose(hvp(x, v), 6 * _SCALES * x * v)
            np.testing.assert_allclose(hessian(x), np.diag(6 * _SCALES * x))
    finally:
        _SCALES[:] = [1.0, 2.0, 3.0]


def test_the_hvp_step_returns_h_v_alone_and_grad_and_hvp_agrees_with_it():
    model, params, v, (x, labels) = _model_case("mlp2")
    hvp = mj.hvp(lambda p, x, y: model(mj, p, x, y))
    hv = hvp(params, v, x, labels)
    assert len(hvp.program(params, v, x, labels).outputs) == len(flat_leaves(params))   # no value, no gradient
    grad, hv_too = hvp.grad_and_hvp(params, v, x, labels)
    assert_close(hv, hv_too, 1e-12, "H v of both steps")
    assert_close(grad, mj.grad(lambda p: model(mj, p, x, labels))(params), 1e-12, "the gradient")
