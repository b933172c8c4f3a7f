"""SciPy's special functions that call SciPy's own kernels (morphjit/native/special.py), traced
and compiled on both backends: values exactly SciPy's at edge points and random ones, in float32
and float64; gradients against central differences; the gradient in an order or shape argument
refused where that argument is differentiated, and computed where it is only traced.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sp

import morphjit as mj

from support.gradcheck import check_loss_grads_fd

F32, F64 = np.float32, np.float64
BACKENDS = ["interp", "numba"]
EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, -3.0, 2.0, 30.0, 171.5, 1e3, -1e3, 1e-300, np.inf, -np.inf, np.nan]
UNARY = ["gamma", "i0", "i1", "j0", "j1", "y0", "y1"]
BINARY = ["beta", "betaln", "gammainc", "gammaincc", "iv", "kv", "stdtr"]
POLYGAMMA_ORDERS = (1, 2, 3, 6)


def _points(rng, dtype):
    """The edge points (the poles of gamma among them) and random ones of many magnitudes."""
    spread = rng.standard_normal(60) * 10.0 ** rng.uniform(-3, 3, 60)
    return np.concatenate([EDGES, spread]).astype(dtype)


def _every_function(x, y, u):
    return ([getattr(sp, name)(x) for name in UNARY] + [getattr(sp, name)(y, x) for name in BINARY]
            + [sp.betainc(np.abs(y), np.abs(x), u), sp.betaincc(np.abs(y), np.abs(x), u)]
            + [sp.polygamma(n, x) for n in POLYGAMMA_ORDERS])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_values_are_scipys(backend, dtype):
    rng = np.random.default_rng(3)
    x = _points(rng, dtype)
    y, u = rng.permutation(x), np.concatenate([[0.0, 1.0, 0.5, np.nan, -0.5, 2.0], rng.random(x.size - 6)]).astype(dtype)
    got = mj.compile(_every_function, backend=backend)(x, y, u)
    with np.errstate(all="ignore"):
        want = _every_function(x, y, u)
    names = UNARY + BINARY + ["betainc", "betaincc"] + [f"polygamma{n}" for n in POLYGAMMA_ORDERS]
    for name, g, w in zip(names, got, want):
        w = np.asarray(w).astype(dtype)   # SciPy's polygamma is float64 for float32 x
        assert g.dtype == dtype, name
        np.testing.assert_array_equal(g, w, err_msg=f"{name} on {backend}, {dtype.__name__}")


def _loss_terms(x, v, u):
    """Every function differentiable in x (``v`` an order or shape > 0, ``u`` in (0, 1))."""
    terms = [sp.gamma(x), sp.beta(x, v), sp.beta(v, x), sp.betaln(x, v), sp.betaln(v, x), sp.gammainc(v, x),
             sp.gammaincc(v, x), sp.i0(x), sp.i1(x), sp.iv(v, x), sp.j0(x), sp.j1(x), sp.y0(x), sp.y1(x),
             sp.kv(v, x), sp.betainc(v, v + 0.5, u), sp.betaincc(v, v + 0.5, u), sp.stdtr(v, x - 2.0)]
    terms += [sp.polygamma(n, x) for n in POLYGAMMA_ORDERS]
    return terms


def _loss(x, v, u):
    return sum(np.sum(t * (k + 1.0) / 20) for k, t in enumerate(_loss_terms(x, v, u)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_gradients_in_x_match_central_differences(backend, dtype):
    rng = np.random.default_rng(5)
    x = rng.uniform(0.3, 4.0, 12).astype(dtype)
    v = rng.uniform(0.5, 3.0, 12).astype(dtype)
    u = rng.uniform(0.05, 0.95, 12).astype(dtype)
    _, (gx, gu) = mj.compile_loss(_loss, argnums=(0, 2), backend=backend)(x, v, u)
    assert gx.dtype == gu.dtype == dtype
    wide = [a.astype(F64) for a in (x, v, u)]
    rtol, eps = (2e-3, 1e-3) if dtype == F32 else (1e-6, 1e-6)
    check_loss_grads_fd(lambda xs: _loss(xs[0], wide[1], xs[1]), [wide[0], wide[2]],
                        [gx.astype(F64), gu.astype(F64)], rng=rng, rtol=rtol, eps=eps)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_derivative_at_its_points(backend):
    """The derivatives one by one, against their closed forms and their limits (j1 and i1 at 0,
    gammainc's density at x = inf, iv and kv by the recurrences)."""
    x = np.array([0.0, 0.5, 2.0, 7.5, np.inf])
    v = np.array([1.5, 0.5, 2.0, 1.0, 3.0])
    with np.errstate(invalid="ignore"):   # the density's formula at x = inf: 0 * inf
        density = np.where(x == np.inf, 0.0, np.exp(-x) * x ** (v - 1) / sp.gamma(v))
    cases = {
        "j1": (lambda x, v: sp.j1(x), 0.5 * (sp.j0(x) - sp.jv(2, x))),
        "i1": (lambda x, v: sp.i1(x), 0.5 * (sp.i0(x) + sp.iv(2, x))),
        "gammainc": (lambda x, v: sp.gammainc(v, x), density),
        "gammaincc": (lambda x, v: sp.gammaincc(v, x), -density),
        "iv": (lambda x, v: sp.iv(v, x), sp.ivp(v, x)),
    }
    for name, (fn, want) in cases.items():
        _, (got,) = mj.compile_loss(lambda x, v: np.sum(fn(x, v)), argnums=(0,), backend=backend)(x, v)
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, err_msg=name)
        np.testing.assert_array_equal(np.isfinite(got), finite, err_msg=name)
    positive = x[1:4]
    _, (got,) = mj.compile_loss(lambda x, v: np.sum(sp.kv(v, x)), argnums=(0,), backend=backend)(positive, v[1:4])
    np.testing.assert_allclose(got, sp.kvp(v[1:4], positive), rtol=1e-12)


REFUSED = [(lambda v, x: sp.iv(v, x), "the order v of scipy.special.iv"),
           (lambda v, x: sp.kv(v, x), "the order v of scipy.special.kv"),
           (lambda v, x: sp.gammainc(v, x), "the shape a of scipy.special.gammainc"),
           (lambda v, x: sp.gammaincc(v, x), "the shape a of scipy.special.gammaincc"),
           (lambda v, x: sp.betainc(v, 2.0, x / 10), "the shape a of scipy.special.betainc"),
           (lambda v, x: sp.betainc(2.0, v, x / 10), "the shape b of scipy.special.betainc"),
           (lambda v, x: sp.betaincc(v, 2.0, x / 10), "the shape a of scipy.special.betaincc"),
           (lambda v, x: sp.stdtr(v, x), "the degrees of freedom df of scipy.special.stdtr")]


@pytest.mark.parametrize("fn, what", REFUSED, ids=[w.split()[1] + "-" + w.split()[-1] for _, w in REFUSED])
def test_the_gradient_in_an_order_or_shape_is_refused_where_it_is_differentiated(fn, what):
    v, x = np.array([1.5, 2.5]), np.array([0.5, 3.0])
    with pytest.raises(mj.UnsupportedError, match=f"gradient in {what} is not supported"):
        mj.value_and_grad(lambda v, x: np.sum(fn(v, x)), argnums=(0, 1))(v, x)
    with pytest.raises(mj.UnsupportedError, match=f"gradient in {what}"):   # through another op too
        mj.value_and_grad(lambda v, x: np.sum(fn(v * 1.0 + 0.0, x)), argnums=0)(v, x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, what", REFUSED, ids=[w.split()[1] + "-" + w.split()[-1] for _, w in REFUSED])
def test_a_traced_order_or_shape_not_differentiated_is_fine(backend, fn, what):
    rng = np.random.default_rng(7)
    v, x = np.array([1.5, 2.5, 0.75]), np.array([0.5, 3.0, 1.25])
    value, (gx,) = mj.compile_loss(lambda v, x: np.sum(fn(v, x)), argnums=(1,), backend=backend)(v, x)
    np.testing.assert_allclose(value, np.sum(fn(v, x)), rtol=1e-14)
    check_loss_grads_fd(lambda xs: np.sum(fn(v, xs[0])), [x], [gx], rng=rng)
    held = mj.compile_loss(lambda v, x: np.sum(fn(mj.stop_gradient(v), x)), argnums=(0, 1), backend=backend)
    _, (gv, gx_held) = held(v, x)
    np.testing.assert_array_equal(gv, 0.0)
    np.testing.assert_array_equal(gx_held, gx)


@pytest.mark.parametrize("n", [np.array(2), 1.5, -1, np.array([1, 2])])
def test_polygamma_refuses_an_order_that_is_not_a_static_whole_number(n):
    with pytest.raises(mj.UnsupportedError, match="polygamma: the order n must be a whole number >= 0"):
        mj.trace(lambda n, x: sp.polygamma(n, x), n, np.ones(2)) if isinstance(n, np.ndarray) and n.ndim == 0 \
            else mj.trace(lambda x: sp.polygamma(n, x), np.ones(2))


def test_polygamma_outside_traces_is_scipys():
    mj.compile(lambda x: sp.polygamma(1, x))(np.ones(2))   # a trace has run and ended
    assert sp.polygamma.__module__.startswith("scipy")
    np.testing.assert_array_equal(sp.polygamma([1, 2], [0.5, 3.0]), [sp.polygamma(1, 0.5), sp.polygamma(2, 3.0)])
