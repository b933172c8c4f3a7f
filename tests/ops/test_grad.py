"""Every differentiable op's gradient, through the public API (``mj.compile_loss``, interp backend).

Each case is a function of float inputs reduced against a random cotangent ``u``:
``loss(*xs) = sum(op(*xs) * u)``, so the gradients are ``J^T u``. They are checked in float64
against central finite differences in a random direction (``<J^T u, v> == <u, J v>``) and against
autograd. The table is keyed by primitive name: a differentiable op of ``morphjit.ops.OPS``
without an entry makes ``test_every_differentiable_op_has_a_gradient_case`` fail, and every case
checks that the primitive it claims to test really is in the traced program.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import morphjit as mj
from morphjit.api.custom import is_user_op
from morphjit.ir import OPS

from support.gradcheck import AG, check_against_autograd, check_vjp_fd

from support.gradient_cases import CASES, Case, cotangent, inputs_of

BACKEND = "interp"


def _bindings(program):
    return [b.op for b in program.bindings]


def _loss_fns(case, u):
    def mj_loss(*xs):
        return mj.sum(case.fn(mj, *xs) * u)

    def ag_loss(xs):
        return AG.sum(case.fn(AG, *xs) * u)
    return mj_loss, ag_loss


def test_every_differentiable_op_has_a_gradient_case():
    differentiable = {name for name, op in OPS.items() if op.vjp is not None and not is_user_op(name)}
    covered = {c.op for c in CASES}
    missing = sorted(differentiable - covered)
    assert not missing, f"differentiable ops without a gradient test case: {missing}"
    assert covered <= set(OPS), f"cases name unknown ops: {sorted(covered - set(OPS))}"


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_gradient(case: Case):
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    xs = inputs_of(case, rng)
    u = cotangent(rng, case.fn, xs)
    mj_loss, ag_loss = _loss_fns(case, u)
    argnums = tuple(range(len(xs)))

    program = mj.grad_program(mj_loss, *xs, argnums=argnums)
    assert case.op in _bindings(mj.trace(mj_loss, *xs)), \
        f"{case.id}: the traced program does not use {case.op}:\n{mj.trace(mj_loss, *xs)}"
    program.verify()

    step = mj.compile_loss(mj_loss, argnums=argnums, backend=BACKEND)
    before = [x.copy() for x in xs]
    value, grads = step(*xs)
    assert isinstance(grads, tuple) and len(grads) == len(xs)
    for x, b in zip(xs, before):
        np.testing.assert_array_equal(x, b)
    for x, g in zip(xs, grads):
        assert isinstance(g, np.ndarray) and g.shape == x.shape and g.dtype == x.dtype, \
            f"gradient {g.dtype}{np.shape(g)} for input {x.dtype}{x.shape}"
    # The forward value: eager morphjit on NumPy arrays and autograd.numpy.
    np.testing.assert_allclose(value, mj_loss(*xs), rtol=1e-12, atol=1e-12)

    # <J^T u, v> against <u, J v>, J v from central differences of the op alone.
    if case.fd:
        check_vjp_fd(lambda ys: case.fn(mj, *ys), xs, u, list(grads), rng=rng, eps=case.eps,
                     rtol=case.rtol, what=case.id)
    # autograd on the same function.
    check_against_autograd(ag_loss, [x.astype(np.float64) for x in xs], value, list(grads),
                           rtol=case.ag_rtol, atol=1e-10, what=case.id)


# ---------------------------------------------------------------------------------------------
# Ties and kinks, against the definitions

def _grad(fn, *xs):
    value, grads = mj.compile_loss(fn, argnums=tuple(range(len(xs))), backend=BACKEND)(*xs)
    return grads if len(xs) > 1 else grads[0]


def _shared_extremum_grad(x, axis, u, reduce):
    """JAX's definition: g is shared equally among the elements attaining the extremum."""
    ans = reduce(x, axis=axis, keepdims=True)
    hit = (x == ans).astype(x.dtype)
    return np.broadcast_to(np.reshape(u, ans.shape), x.shape) * hit / hit.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("reduce_name", ["max", "min"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
def test_extremum_ties_share_the_gradient_equally(reduce_name, axis):
    rng = np.random.default_rng(7)
    x = rng.integers(-1, 2, size=(3, 2, 4)).astype(np.float64)  # many ties
    mj_reduce, np_reduce = getattr(mj, reduce_name), getattr(np, reduce_name)
    u = rng.standard_normal(np.shape(np_reduce(x, axis=axis)))
    g = _grad(lambda x: mj.sum(mj_reduce(x, axis=axis) * u), x)
    np.testing.assert_allclose(g, _shared_extremum_grad(x, axis, u, np_reduce), rtol=1e-14)
    # Each output's cotangent is conserved: split, not copied.
    np.testing.assert_allclose(g.sum(), u.sum(), rtol=1e-12)


def test_max_tie_explicit():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 1.0, 0.0], [5.0, 5.0, 5.0]])
    u = np.array([2.0, 7.0, 3.0])
    g = _grad(lambda x: mj.sum(mj.max(x, axis=1) * u), x)
    np.testing.assert_array_equal(g, [[0, 1.0, 1.0], [7.0, 0, 0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize("name,wins", [("maximum", np.greater), ("minimum", np.less)])
def test_maximum_minimum_ties_split_evenly(name, wins):
    a = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]])
    b = np.array([[1.0, 0.0, 5.0], [0.0, -1.0, 4.0]])
    u = np.arange(1.0, 7.0).reshape(2, 3)
    ga, gb = _grad(lambda a, b: mj.sum(getattr(mj, name)(a, b) * u), a, b)
    tie = a == b
    np.testing.assert_array_equal(ga, np.where(tie, u / 2, np.where(wins(a, b), u, 0.0)))
    np.testing.assert_array_equal(gb, np.where(tie, u / 2, np.where(wins(a, b), 0.0, u)))
    # maximum(x, 0) at x == 0 exactly: half the gradient.
    gx = _grad(lambda x: mj.sum(getattr(mj, name)(x, 0.0) * u[0]), np.array([0.0, 1.0, -1.0]))
    np.testing.assert_array_equal(gx, [u[0, 0] / 2, u[0, 1] * (name == "maximum"), u[0, 2] * (name == "minimum")])


@pytest.mark.parametrize("fn", [mj.abs, mj.relu], ids=["abs", "relu"])
def test_kink_at_zero_has_zero_gradient(fn):
    x = np.array([0.0, -0.0, 2.0, -3.0])
    g = _grad(lambda x: mj.sum(fn(x) * 5.0), x)
    expected = np.array([0.0, 0.0, 5.0, -5.0 if fn is mj.abs else 0.0])
    np.testing.assert_array_equal(g, expected)


def test_pow_edge_cases():
    # d/dx x**2 at 0 is 0; x**0 is constant; d/dp x**p = x**p log x.
    x = np.array([0.0, 1.5, 2.0])
    np.testing.assert_array_equal(_grad(lambda x: mj.sum(x ** 2.0), x), 2 * x)
    np.testing.assert_array_equal(_grad(lambda x: mj.sum(x ** 0.0), x), np.zeros(3))
    xp, p = np.array([0.5, 1.5, 2.0]), np.array(1.7)
    gx, gp = _grad(lambda x, p: mj.sum(x ** p), xp, p)
    np.testing.assert_allclose(gx, p * xp ** (p - 1), rtol=1e-14)
    np.testing.assert_allclose(gp, np.sum(xp ** p * np.log(xp)), rtol=1e-14)


def test_clip_gradient_routes_to_the_active_bound():
    x = np.array([-2.0, 0.0, 2.0])
    lo, hi = np.array(-1.0), np.array(1.0)
    gx, glo, ghi = _grad(lambda x, lo, hi: mj.sum(mj.clip(x, lo, hi) * np.array([1.0, 2.0, 3.0])), x, lo, hi)
    np.testing.assert_array_equal(gx, [0.0, 2.0, 0.0])
    assert glo == 1.0 and ghi == 3.0


def test_integer_index_scatters_into_zeros():
    x = np.arange(12.0).reshape(3, 4)
    g = _grad(lambda x: x[1, 2] * 3.0 + mj.sum(x[::2, ::3]), x)
    expected = np.zeros((3, 4))
    expected[1, 2] += 3.0
    expected[::2, ::3] += 1.0
    np.testing.assert_array_equal(g, expected)


def test_softmax_cross_entropy_gradient_is_softmax_minus_onehot():
    rng = np.random.default_rng(3)
    z, labels, g = rng.standard_normal((6, 5)), rng.integers(0, 5, 6), rng.standard_normal(6)
    grad = _grad(lambda z: mj.sum(mj.softmax_cross_entropy(z, labels) * g), z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(grad, (p - np.eye(5)[labels]) * g[:, None], rtol=1e-12, atol=1e-15)


def test_softmax_cross_entropy_backward_uses_softmax_and_one_hot_ops():
    rng = np.random.default_rng(4)
    z, labels = rng.standard_normal((6, 5)), rng.integers(0, 5, 6)

    def loss(z):
        return mj.mean(mj.softmax_cross_entropy(z, labels))

    forward = mj.trace(loss, z)
    joint = mj.grad_program(loss, z)
    backward_ops = _bindings(joint)[len(forward.bindings):]
    assert "softmax" in backward_ops and "one_hot" in backward_ops, str(joint)
    generic = {"exp", "log", "max", "logsumexp", "log_softmax", "div", "unslice"}
    assert not generic & set(_bindings(joint)), f"sce differentiated through generic ops:\n{joint}"


def test_composites_are_stable_for_largeinputs_of():
    x = np.array([[1000.0, 1000.0, -1000.0], [-800.0, 0.0, 800.0]])
    u = np.array([1.0, 2.0])
    g = _grad(lambda x: mj.sum(mj.logsumexp(x, axis=1) * u), x)
    np.testing.assert_allclose(g, [[0.5, 0.5, 0.0], [0.0, 0.0, 2.0]], atol=1e-300)
    for fn in (mj.softmax, mj.log_softmax):
        value, g = mj.compile_loss(lambda x: mj.sum(fn(x) * x), backend=BACKEND)(x)
        assert np.isfinite(value) and np.all(np.isfinite(g)), fn.__name__
    labels = np.array([2, 0])
    value, g = mj.compile_loss(lambda x: mj.sum(mj.softmax_cross_entropy(x, labels)), backend=BACKEND)(x)
    np.testing.assert_allclose(value, 2000.0 + np.log(2.0) + 1600.0, rtol=1e-12)
    np.testing.assert_allclose(g, [[0.5, 0.5, -1.0], [-1.0, 0.0, 1.0]], atol=1e-300)
