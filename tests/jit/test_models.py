"""End-to-end models through ``mj.compile_loss`` (both backends): values and gradients against
autograd and finite differences, in float64 and float32.

Each model is written once, over an array namespace ``ns``: ``mj`` when compiled, ``AG``
(autograd.numpy) for the reference gradients.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import morphjit as mj

from support.gradcheck import (AG, assert_same_structure, check_against_autograd, check_loss_grads_fd,
                       flat_leaves, unflatten_like)

BACKENDS = pytest.mark.parametrize("backend", ["interp", "numba"])


# ---------------------------------------------------------------------------------------------
# Models

def logistic_regression(ns, params, x, y):
    """y in {-1, +1}; mean softplus(-y z)."""
    z = x @ params["w"] + params["b"]
    return ns.mean(ns.log1p(ns.exp(-y * z)))


def mlp2(ns, params, x, labels):
    h = ns.relu(x @ params["W1"] + params["b1"])
    logits = h @ params["W2"] + params["b2"]
    return ns.mean(ns.softmax_cross_entropy(logits, labels))


def mlp3(ns, params, x, labels):
    (W1, b1), (W2, b2), (W3, b3) = params
    h = ns.tanh(x @ W1 + b1)
    h = ns.relu(h @ W2 + b2)
    logits = h @ W3 + b3
    return ns.mean(ns.softmax_cross_entropy(logits, labels)) + 1e-3 * ns.sum(W1 * W1)


def ridge(ns, params, x, y):
    r = x @ params["w"] + params["b"] - y
    return ns.mean(r ** 2) + 0.1 * ns.sum(ns.square(params["w"]))


def layer_norm(ns, params, x, target):
    mu = ns.mean(x, axis=-1, keepdims=True)
    var = ns.mean((x - mu) ** 2, axis=-1, keepdims=True)
    xhat = (x - mu) / ns.sqrt(var + 1e-5)
    out = xhat * params["gamma"] + params["beta"]
    return ns.mean((out - target) ** 2)


def attention(ns, params, x, target):
    """One head over a batch of sequences x: [B, T, D]."""
    q, k, v = x @ params["Wq"], x @ params["Wk"], x @ params["Wv"]
    scores = q @ ns.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # a Python float keeps f32
    out = ns.softmax(scores, axis=-1) @ v
    return ns.mean(ns.sum((out @ params["Wo"] - target) ** 2, axis=-1))


def huber(ns, params, x, y, delta=1.0):
    r = x @ params["w"] + params["b"] - y
    a = ns.abs(r)
    return ns.mean(ns.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta)))


def _data(name, rng):
    n, d, c, hdim = 8, 5, 4, 6
    x = rng.standard_normal((n, d))
    labels = rng.integers(0, c, n)
    if name == "logistic_regression":
        return {"w": rng.standard_normal(d), "b": np.array(0.1)}, x, np.sign(rng.standard_normal(n))
    if name == "mlp2":
        return {"W1": rng.standard_normal((d, hdim)) / 2, "b1": 0.1 * rng.standard_normal(hdim),
                "W2": rng.standard_normal((hdim, c)) / 2, "b2": 0.1 * rng.standard_normal(c)}, x, labels
    if name == "mlp3":
        return [(rng.standard_normal((d, hdim)) / 2, 0.1 * rng.standard_normal(hdim)),
                (rng.standard_normal((hdim, hdim)) / 2, 0.1 * rng.standard_normal(hdim)),
                (rng.standard_normal((hdim, c)) / 2, 0.1 * rng.standard_normal(c))], x, labels
    if name == "ridge":
        return {"w": rng.standard_normal((d, 1)), "b": np.array([0.3])}, x, rng.standard_normal((n, 1))
    if name == "layer_norm":
        return ({"gamma": 1 + 0.1 * rng.standard_normal(d), "beta": 0.1 * rng.standard_normal(d)},
                rng.standard_normal((3, n, d)) * 2 + 1, rng.standard_normal((3, n, d)))
    if name == "attention":
        b, t = 2, 4
        return ({k: rng.standard_normal((d, d)) / np.sqrt(d) for k in ("Wq", "Wk", "Wv", "Wo")},
                rng.standard_normal((b, t, d)), rng.standard_normal((b, t, d)))
    if name == "huber":
        w = rng.standard_normal(d)
        return {"w": w, "b": np.array(0.0)}, x, x @ w + 2 * rng.standard_normal(n)  # some |r| > 1
    raise KeyError(name)


MODELS = {m.__name__: m for m in (logistic_regression, mlp2, mlp3, ridge, layer_norm, attention, huber)}


def _cast(tree, dtype):
    leaves = [x.astype(dtype) if np.asarray(x).dtype.kind == "f" else x for x in flat_leaves(tree)]
    return unflatten_like(tree, leaves)


def _run(model, backend, params, *data):
    step = mj.compile_loss(lambda p, *d: model(mj, p, *d), backend=backend)
    return step(params, *data)


@BACKENDS
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_float64(name, backend):
    model, rng = MODELS[name], np.random.default_rng(sorted(MODELS).index(name))
    params, *data = _data(name, rng)
    value, grads = _run(model, backend, params, *data)
    assert type(value) is np.float64
    assert_same_structure(grads, params)
    np.testing.assert_allclose(value, model(mj, params, *data), rtol=1e-13)  # eager on NumPy
    leaves = flat_leaves(params)
    flat = lambda ns: lambda xs: model(ns, unflatten_like(params, xs), *data)  # noqa: E731
    check_against_autograd(flat(AG), leaves, value, flat_leaves(grads), rtol=1e-9, atol=1e-12, what=name)
    check_loss_grads_fd(flat(mj), leaves, flat_leaves(grads), rng=rng, eps=1e-6, rtol=1e-6, what=name)


@BACKENDS
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_float32(name, backend):
    model, rng = MODELS[name], np.random.default_rng(100 + sorted(MODELS).index(name))
    params64, *data64 = _data(name, rng)
    params, data = _cast(params64, np.float32), _cast(list(data64), np.float32)
    value, grads = _run(model, backend, params, *data)
    assert type(value) is np.float32, type(value)
    assert_same_structure(grads, params)
    for g in flat_leaves(grads):
        assert g.dtype == np.float32
    # autograd in float64 at the same (float32-representable) point.
    leaves = [x.astype(np.float64) for x in flat_leaves(params)]
    data_as64 = _cast(data, np.float64)
    scale = 1 + max(float(np.max(np.abs(g))) for g in flat_leaves(grads))
    check_against_autograd(lambda xs: model(AG, unflatten_like(params, xs), *data_as64), leaves,
                           value, flat_leaves(grads), rtol=2e-4, atol=2e-5 * scale, what=name)


def test_huber_exercises_both_branches():
    params, x, y = _data("huber", np.random.default_rng(sorted(MODELS).index("huber")))
    r = np.abs(x @ params["w"] + params["b"] - y)
    assert (r <= 1).any() and (r > 1).any()


def test_attention_uses_batched_matmul_and_softmax():
    params, x, target = _data("attention", np.random.default_rng(0))
    program = mj.grad_program(lambda p, x, t: attention(mj, p, x, t), params, x, target)
    ops = [b.op for b in program.bindings]
    assert "softmax" in ops and "exp" not in ops
    batched = [b for b in program.bindings if b.op == "matmul" and all(x.type.ndim == 3 for x in b.inputs)]
    assert batched, str(program)


# ---------------------------------------------------------------------------------------------
# The same MLP written with plain NumPy calls

def mlp_numpy(params, x, onehot):
    """A 2-layer MLP with softmax cross-entropy, using only np.* calls and operators."""
    h = np.maximum(np.dot(x, params["W1"]) + params["b1"], 0.0)
    logits = h @ params["W2"] + params["b2"]
    m = np.max(logits, axis=1, keepdims=True)
    lse = np.log(np.sum(np.exp(logits - m), axis=1)) + np.squeeze(m, axis=1)
    return np.mean(lse - np.sum(logits * onehot, axis=1))


@BACKENDS
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_mlp_matches_mj_mlp(dtype, backend):
    params, x, labels = _data("mlp2", np.random.default_rng(5))
    params, x = _cast(params, dtype), x.astype(dtype)
    onehot = np.eye(4, dtype=dtype)[labels]
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)

    # Eagerly on NumPy arrays: the two spellings agree.
    np.testing.assert_allclose(mlp_numpy(params, x, onehot), mlp2(mj, params, x, labels), **tol)

    np_step = mj.compile_loss(mlp_numpy, backend=backend)
    mj_step = mj.compile_loss(lambda p, x, y: mlp2(mj, p, x, y), backend=backend)
    v_np, g_np = np_step(params, x, onehot)
    v_mj, g_mj = mj_step(params, x, labels)
    assert type(v_np) is type(v_mj) is np.dtype(dtype).type
    np.testing.assert_allclose(v_np, v_mj, **tol)
    np.testing.assert_allclose(v_np, mlp_numpy(params, x, onehot), **tol)
    assert_same_structure(g_np, params)
    for k in params:
        np.testing.assert_allclose(g_np[k], g_mj[k], err_msg=k, **tol)
    # NumPy calls on traced values record bindings: nothing was evaluated eagerly and captured.
    program = np_step.program(params, x, onehot)
    assert not program.consts, str(program)
