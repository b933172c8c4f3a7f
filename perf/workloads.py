"""The benchmark workloads, each declared once.

A workload is a loss written against an array namespace ``ns`` (``ns.tanh``, ``ns.mean``,
``ns.softmax_cross_entropy``, ... plus Python operators), a maker of its parameters and data, and a
hand-written NumPy forward+backward. Every implementation of the suite is built from these three:
morphjit traces ``loss(mj, ...)``, JAX differentiates ``loss(jax namespace, ...)``, and so on
(the namespaces live in ``perf.impls``).

Parameters are flat dicts of arrays (0-d arrays for scalars); gradients are compared by key, so
the leaf order a framework picks does not matter. ``numpy_step(params, *data)`` returns
``(loss, {name: gradient})``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from perf import handwritten as hw

DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    loss: Callable            # loss(ns, params, *data) -> scalar
    make: Callable            # make(dtype) -> (params, data)
    numpy_step: Callable      # numpy_step(params, *data) -> (loss, grads)
    mlp: tuple | None = None  # (sizes, batch, activation) for the hand-written numba MLP step
    tags: tuple = field(default=())


def _rng(seed):
    return np.random.default_rng(seed)


def _cast(params, dtype):
    return {k: np.asarray(v, dtype) for k, v in params.items()}


# ---------------------------------------------------------------- MLP classification

def mlp_loss(ns, params, x, y, *, activation):
    h = x
    n_layers = len(params) // 2
    for l in range(n_layers):
        h = h @ params[f"W{l}"] + params[f"b{l}"]
        if l < n_layers - 1:
            h = getattr(ns, activation)(h)
    return ns.mean(ns.softmax_cross_entropy(h, y))


def mlp_make(dtype, *, sizes, batch, activation, seed=0):
    p = hw.make_problem(sizes, batch, activation, dtype, seed=seed, workspace=False)
    (Ws, bs), (x, y) = p.params, p.data
    params = {}
    for l, (W, b) in enumerate(zip(Ws, bs)):
        params[f"W{l}"], params[f"b{l}"] = W, b
    return params, (x, y)


def mlp_numpy(params, x, y, *, activation):
    n = len(params) // 2
    Ws = [params[f"W{l}"] for l in range(n)]
    bs = [params[f"b{l}"] for l in range(n)]
    loss, gWs, gbs = hw.numpy_step(x, y, Ws, bs, activation)
    grads = {}
    for l, (gW, gb) in enumerate(zip(gWs, gbs)):
        grads[f"W{l}"], grads[f"b{l}"] = gW, gb
    return loss, grads


def mlp(name, sizes, batch, activation):
    cfg = dict(activation=activation)
    widths = "-".join(map(str, sizes))
    return Workload(name, f"MLP {widths}, batch {batch}, {activation}, mean softmax CE",
                    partial(mlp_loss, **cfg), partial(mlp_make, sizes=sizes, batch=batch, **cfg),
                    partial(mlp_numpy, **cfg), mlp=(sizes, batch, activation), tags=("mlp",))


# ---------------------------------------------------------------- logistic regression

def logistic_loss(ns, params, x, y):
    z = x @ params["w"] + params["b"]
    return ns.mean(ns.log1p(ns.exp(-ns.abs(z))) + ns.maximum(z, 0) - y * z)


def logistic_make(dtype, batch=4096, features=256):
    rng = _rng(5)
    params = {"w": rng.normal(scale=1 / math.sqrt(features), size=features), "b": 0.1}
    x, y = rng.normal(size=(batch, features)), (rng.random(batch) < 0.5)
    return _cast(params, dtype), (x.astype(dtype), y.astype(dtype))


def logistic_numpy(params, x, y):
    z = x @ params["w"] + params["b"]
    loss = np.mean(np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0) - y * z)
    dz = (1 / (1 + np.exp(-z)) - y) / len(y)
    return loss, {"w": x.T @ dz, "b": dz.sum()}


# ---------------------------------------------------------------- layer norm

def layernorm_loss(ns, params, x, t):
    h = x @ params["W"]
    mu = ns.mean(h, axis=-1, keepdims=True)
    var = ns.mean((h - mu) ** 2, axis=-1, keepdims=True)
    y = (h - mu) / ns.sqrt(var + 1e-5) * params["gamma"] + params["beta"]
    return ns.mean((y - t) ** 2)


def layernorm_make(dtype, batch=256, width=256):
    rng = _rng(3)
    params = {"W": rng.normal(scale=1 / math.sqrt(width), size=(width, width)),
              "gamma": 1 + rng.normal(scale=0.1, size=width), "beta": rng.normal(scale=0.1, size=width)}
    x, t = rng.normal(size=(batch, width)), rng.normal(size=(batch, width))
    return _cast(params, dtype), (x.astype(dtype), t.astype(dtype))


def layernorm_numpy(params, x, t):
    h = x @ params["W"]
    mu = h.mean(axis=-1, keepdims=True)
    c = h - mu
    r = 1 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5)
    n = c * r
    y = n * params["gamma"] + params["beta"]
    dy = (y - t) * (2 / y.size)
    loss = np.mean((y - t) ** 2)
    dn = dy * params["gamma"]
    dh = r * (dn - dn.mean(axis=-1, keepdims=True) - n * (dn * n).mean(axis=-1, keepdims=True))
    return loss, {"W": x.T @ dh, "gamma": (dy * n).sum(axis=0), "beta": dy.sum(axis=0)}


# ---------------------------------------------------------------- attention block

def static_shape(a) -> tuple:
    """The shape as Python ints (a PyTensor variable's ``.shape`` is symbolic; its type's is not)."""
    shape = tuple(a.shape)
    return shape if all(isinstance(d, int) for d in shape) else tuple(a.type.shape)


def attention_loss(ns, params, x, t):
    width = static_shape(x)[-1]
    q, k, v = x @ params["Wq"], x @ params["Wk"], x @ params["Wv"]
    scores = q @ ns.swapaxes(k, -1, -2) / math.sqrt(width)
    out = ns.softmax(scores, axis=-1) @ v @ params["Wo"]
    return ns.mean((out - t) ** 2)


def attention_make(dtype, batch=16, seq=64, width=64):
    rng = _rng(4)
    params = {k: rng.normal(scale=1 / math.sqrt(width), size=(width, width)) for k in ("Wq", "Wk", "Wv", "Wo")}
    x, t = rng.normal(size=(batch, seq, width)), rng.normal(size=(batch, seq, width))
    return _cast(params, dtype), (x.astype(dtype), t.astype(dtype))


def attention_numpy(params, x, t):
    width = x.shape[-1]
    scale = 1 / math.sqrt(width)
    q, k, v = x @ params["Wq"], x @ params["Wk"], x @ params["Wv"]
    s = q @ k.swapaxes(-1, -2) * scale
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    a = p @ v
    out = a @ params["Wo"]
    loss = np.mean((out - t) ** 2)
    dout = (out - t) * (2 / out.size)
    flat = lambda z: z.reshape(-1, width)  # noqa: E731
    da = dout @ params["Wo"].T
    dp = da @ v.swapaxes(-1, -2)
    dv = p.swapaxes(-1, -2) @ da
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq, dk = ds @ k, ds.swapaxes(-1, -2) @ q
    xf = flat(x).T
    return loss, {"Wq": xf @ flat(dq), "Wk": xf @ flat(dk), "Wv": xf @ flat(dv),
                  "Wo": flat(a).T @ flat(dout)}


# ---------------------------------------------------------------- RBF-kernel regression

def rbf_loss(ns, params, x, t):
    d2 = ns.sum((x[:, None, :] - params["C"][None, :, :]) ** 2, axis=-1)
    phi = ns.exp(-ns.exp(params["s"]) * d2)
    return ns.mean((phi @ params["w"] - t) ** 2)


def rbf_make(dtype, n=512, centers=128, dim=16):
    rng = _rng(7)
    params = {"C": rng.normal(size=(centers, dim)), "w": rng.normal(scale=0.1, size=centers),
              "s": math.log(0.5 / dim)}
    x, t = rng.normal(size=(n, dim)), rng.normal(size=n)
    return _cast(params, dtype), (x.astype(dtype), t.astype(dtype))


def rbf_numpy(params, x, t):
    g = np.exp(params["s"])
    diff = x[:, None, :] - params["C"][None, :, :]
    d2 = (diff * diff).sum(axis=-1)
    phi = np.exp(-g * d2)
    r = phi @ params["w"] - t
    loss = np.mean(r * r)
    dpred = r * (2 / r.size)
    dd2 = -g * (dpred[:, None] * params["w"][None, :]) * phi
    return loss, {"C": -2 * (dd2[:, :, None] * diff).sum(axis=0), "w": phi.T @ dpred,
                  "s": np.sum(dd2 * d2)}


# ---------------------------------------------------------------- sin/exp curve fit

def curve_loss(ns, params, t, y):
    pred = params["a"] * ns.exp(-params["b"] * t) * ns.sin(params["c"] * t + params["d"])
    return ns.mean((pred - y) ** 2)


def curve_make(dtype, n=100_000):
    rng = _rng(8)
    t = np.linspace(0, 10, n)
    y = 1.5 * np.exp(-0.3 * t) * np.sin(2.0 * t + 0.5) + rng.normal(scale=0.05, size=n)
    params = {"a": 1.2, "b": 0.25, "c": 1.9, "d": 0.4}
    return _cast(params, dtype), (t.astype(dtype), y.astype(dtype))


def curve_numpy(params, t, y):
    a, b, c, d = (params[k] for k in "abcd")
    e = np.exp(-b * t)
    arg = c * t + d
    sn, cs = np.sin(arg), np.cos(arg)
    r = a * e * sn - y
    loss = np.mean(r * r)
    dr = r * (2 / r.size)
    dae = dr * a * e
    return loss, {"a": np.sum(dr * e * sn), "b": -np.sum(dae * sn * t), "c": np.sum(dae * cs * t),
                  "d": np.sum(dae * cs)}


# ---------------------------------------------------------------- transcendental functions

def transcendental_loss(ns, params, x, y):
    z = x * x + 1
    pred = (ns.tanh(params["a"] * x) + ns.exp(-params["b"] * z) * ns.cos(params["c"] * x)
            + z ** params["d"] + params["e"] * ns.log(z) + ns.log1p(params["f"] * z))
    return ns.mean((pred - y) ** 2)


def transcendental_make(dtype, n=100_000):
    rng = _rng(9)
    x = rng.uniform(-3, 3, n)
    params = {"a": 0.8, "b": 0.4, "c": 1.7, "d": 0.3, "e": 0.2, "f": 0.6}
    y = _transcendental_terms(params, x)[-1] + rng.normal(scale=0.05, size=n)
    start = {k: 0.9 * v for k, v in params.items()}   # off the optimum, so the gradients are not noise
    return _cast(start, dtype), (x.astype(dtype), y.astype(dtype))


def _transcendental_terms(params, x):
    a, b, c, d, e, f = (params[k] for k in "abcdef")
    z = x * x + 1
    th, ex, cs, pw, lz = np.tanh(a * x), np.exp(-b * z), np.cos(c * x), z ** d, np.log(z)
    return z, th, ex, cs, pw, lz, th + ex * cs + pw + e * lz + np.log1p(f * z)


def transcendental_numpy(params, x, y):
    z, th, ex, cs, pw, lz, pred = _transcendental_terms(params, x)
    a, c, f = params["a"], params["c"], params["f"]
    r = pred - y
    dr = r * (2 / r.size)
    return np.mean(r * r), {"a": np.sum(dr * (1 - th * th) * x), "b": -np.sum(dr * ex * cs * z),
                            "c": -np.sum(dr * ex * np.sin(c * x) * x), "d": np.sum(dr * pw * lz),
                            "e": np.sum(dr * lz), "f": np.sum(dr * z / (1 + f * z))}


# ---------------------------------------------------------------- the registry

WORKLOADS = {w.name: w for w in (
    mlp("tiny", (64, 32, 10), 32, "tanh"),
    mlp("small", (784, 128, 10), 64, "relu"),
    mlp("medium", (784, 512, 512, 10), 256, "relu"),
    mlp("large", (1024, 2048, 2048, 10), 1024, "relu"),
    Workload("logistic", "logistic regression, batch 4096, 256 features", logistic_loss, logistic_make,
             logistic_numpy),
    Workload("layernorm", "linear 256x256 + layer norm, batch 256, squared error", layernorm_loss,
             layernorm_make, layernorm_numpy),
    Workload("attention", "single-head self-attention, batch 16, seq 64, width 64", attention_loss,
             attention_make, attention_numpy),
    Workload("rbf", "RBF-kernel regression, 512 points x 128 centres x 16 dims (broadcast distances)",
             rbf_loss, rbf_make, rbf_numpy, tags=("elementwise",)),
    Workload("curve", "sin/exp curve fit, 100k points, 4 scalar params (element-wise only)", curve_loss,
             curve_make, curve_numpy, tags=("elementwise",)),
    Workload("transcendental", "tanh, exp, cos, pow, log and log1p of 100k points, 6 scalar params "
             "(element-wise only)", transcendental_loss, transcendental_make, transcendental_numpy,
             tags=("elementwise",)),
)}
