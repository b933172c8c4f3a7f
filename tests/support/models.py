"""End-to-end models shared by the plan, backend and perf tests: name -> builder(dtype) -> (fn, args)."""
import numpy as np

import morphjit as mj


def _rng(seed=0):
    return np.random.default_rng(seed)


def mlp2(dtype, batch=16, sizes=(12, 20, 5)):
    """2-layer relu MLP, mean softmax cross-entropy over integer labels."""
    rng = _rng(1)
    params = {"W1": rng.normal(scale=0.4, size=sizes[:2]), "b1": rng.normal(scale=0.1, size=sizes[1]),
              "W2": rng.normal(scale=0.4, size=sizes[1:]), "b2": rng.normal(scale=0.1, size=sizes[2])}

    def loss(params, x, y):
        h = mj.relu(x @ params["W1"] + params["b1"])
        return mj.mean(mj.softmax_cross_entropy(h @ params["W2"] + params["b2"], y))

    x, y = rng.normal(size=(batch, sizes[0])), rng.integers(0, sizes[2], batch)
    return loss, (_cast(params, dtype), x.astype(dtype), y)


def deep_mlp(dtype, sizes=(8, 16, 16, 3), activation=mj.tanh, loss="mse", batch=16, seed=2):
    """An MLP over a list of (W, b) layers, with mean squared error or softmax cross-entropy."""
    rng = _rng(seed)
    params = [(rng.normal(scale=0.4, size=(a, b)), rng.normal(scale=0.1, size=b)) for a, b in zip(sizes, sizes[1:])]

    def mlp_loss(params, x, t):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            h = activation(h) if i < len(params) - 1 else h
        return mj.mean((h - t) ** 2) if loss == "mse" else mj.mean(mj.softmax_cross_entropy(h, t))

    x = rng.normal(size=(batch, sizes[0]))
    t = rng.normal(size=(batch, sizes[-1])).astype(dtype) if loss == "mse" else rng.integers(0, sizes[-1], batch)
    return mlp_loss, (_cast(params, dtype), x.astype(dtype), t)


def mlp3_tanh_mse(dtype):
    """3-layer tanh MLP with mean squared error."""
    return deep_mlp(dtype)


def layernorm(dtype, batch=8, width=12):
    """A linear layer followed by layer norm with learned scale and shift, squared loss."""
    rng = _rng(3)
    params = {"W": rng.normal(scale=0.4, size=(width, width)), "gamma": 1 + rng.normal(scale=0.1, size=width),
              "beta": rng.normal(scale=0.1, size=width)}

    def loss(params, x, t):
        h = x @ params["W"]
        mu = h.mean(axis=-1, keepdims=True)
        var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
        y = (h - mu) / mj.sqrt(var + 1e-5) * params["gamma"] + params["beta"]
        return mj.mean((y - t) ** 2)

    x, t = rng.normal(size=(batch, width)), rng.normal(size=(batch, width))
    return loss, (_cast(params, dtype), x.astype(dtype), t.astype(dtype))


def attention(dtype, batch=2, seq=5, width=8):
    """Single-head self-attention block (batched matmul, softmax over the last axis)."""
    rng = _rng(4)
    params = {k: rng.normal(scale=0.3, size=(width, width)) for k in ("Wq", "Wk", "Wv", "Wo")}

    def loss(params, x, t):
        q, k, v = x @ params["Wq"], x @ params["Wk"], x @ params["Wv"]
        scores = q @ mj.swapaxes(k, -1, -2) / np.sqrt(width)
        out = mj.softmax(scores, axis=-1) @ v @ params["Wo"]
        return mj.mean((out - t) ** 2)

    x, t = rng.normal(size=(batch, seq, width)), rng.normal(size=(batch, seq, width))
    return loss, (_cast(params, dtype), x.astype(dtype), t.astype(dtype))


def logistic(dtype, batch=20, features=6):
    rng = _rng(5)
    params = {"w": rng.normal(size=features), "b": np.asarray(0.1)}

    def loss(params, x, y):
        z = x @ params["w"] + params["b"]
        return mj.mean(mj.log1p(mj.exp(-mj.abs(z))) + mj.maximum(z, 0) - y * z)

    x, y = rng.normal(size=(batch, features)), (rng.random(batch) < 0.5).astype(np.float64)
    return loss, (_cast(params, dtype), x.astype(dtype), y.astype(dtype))


def huber_ridge(dtype, batch=20, features=6):
    """Linear regression with a Huber loss (where) and an L2 penalty."""
    rng = _rng(6)
    params = {"w": rng.normal(size=features)}

    def loss(params, x, t):
        r = x @ params["w"] - t
        huber = mj.where(mj.abs(r) < 1.0, 0.5 * r * r, mj.abs(r) - 0.5)
        return mj.mean(huber) + 0.1 * mj.sum(params["w"] ** 2)

    x, t = rng.normal(size=(batch, features)), rng.normal(scale=2.0, size=batch)
    return loss, (_cast(params, dtype), x.astype(dtype), t.astype(dtype))


def _cast(tree, dtype):
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_cast(v, dtype) for v in tree)
    return np.asarray(tree, dtype)


MODELS = {f.__name__: f for f in (mlp2, mlp3_tanh_mse, layernorm, attention, logistic, huber_ridge)}
