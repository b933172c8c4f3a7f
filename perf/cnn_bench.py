"""The CNN training step of ``examples/cnn_digits.py`` (LeNet-style on 8x8 images, float32):
morphjit against PyTorch eager, ``torch.compile``, JAX and a hand-written NumPy im2col version,
side by side in one run, at batch 64 and 256.

A step is the loss, the gradients of all parameters and a plain SGD update, one thread
everywhere (BLAS, XLA, PyTorch intra-op). Every implementation's loss is checked against
morphjit's on the same parameters before it is timed; times are medians of interleaved samples
(``perf.timing``). Run: ``python -m perf.cnn_bench [--budget S] [--out perf/results/cnn_results.json]``
with the peers installed (they are skipped when not importable).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

import morphjit as mj  # noqa: E402
from perf.timing import measure  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from cnn_digits import cnn_loss, init_params  # noqa: E402

LR = 0.01


# ---------------------------------------------------------------------------------------------
# NumPy by hand: im2col + GEMM, max pooling by reshapes, the backward written out

def im2col(x):
    """(n, c, h, w) padded by 1 -> (n*h*w, c*9) rows of 3x3 windows."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return sliding_window_view(xp, (3, 3), axis=(2, 3)).transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def col2im(cols, shape):
    n, c, h, w = shape
    g = np.zeros((n, c, h + 2, w + 2), cols.dtype)
    windows = cols.reshape(n, h, w, c, 3, 3)
    for i in range(3):
        for j in range(3):
            g[:, :, i:i + h, j:j + w] += windows[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return g[:, :, 1:-1, 1:-1]


def conv_relu_pool(x, k, b):
    n, _, h, w = x.shape
    cols = im2col(x)
    z = (cols @ k.reshape(len(k), -1).T + b).reshape(n, h, w, -1).transpose(0, 3, 1, 2)
    a = np.maximum(z, 0)
    blocks = a.reshape(n, a.shape[1], h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, a.shape[1], h // 2, w // 2, 4)
    first = blocks.argmax(axis=-1)
    return np.take_along_axis(blocks, first[..., None], -1)[..., 0], (cols, z, first)


def conv_relu_pool_backward(g, x, k, saved):
    cols, z, first = saved
    n, o, h, w = z.shape
    blocks = np.zeros(g.shape + (4,), g.dtype)
    np.put_along_axis(blocks, first[..., None], g[..., None], -1)
    ga = blocks.reshape(n, o, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, o, h, w)
    gz = np.where(z > 0, ga, 0).transpose(0, 2, 3, 1).reshape(n * h * w, o)
    gk = (gz.T @ cols).reshape(k.shape)
    gx = col2im(gz @ k.reshape(o, -1), x.shape)
    return gx, gk, gz.sum(axis=0)


def numpy_step(p, x, y):
    h1, s1 = conv_relu_pool(x, p["c1"], p["b1"])
    h2, s2 = conv_relu_pool(h1, p["c2"], p["b2"])
    flat = h2.reshape(len(x), -1)
    logits = flat @ p["W"] + p["b"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(len(y)), y].mean()
    d = np.exp(logp)
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    grads = {"W": flat.T @ d, "b": d.sum(axis=0)}
    g2 = (d @ p["W"].T).reshape(h2.shape)
    g1, grads["c2"], grads["b2"] = conv_relu_pool_backward(g2, h1, p["c2"], s2)
    _, grads["c1"], grads["b1"] = conv_relu_pool_backward(g1, x, p["c1"], s1)
    for key, g in grads.items():
        p[key] -= LR * g.astype(p[key].dtype)
    return loss


# ---------------------------------------------------------------------------------------------
# Peers


def torch_steps(params, x, y):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    weights = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    xt, yt = torch.tensor(x), torch.tensor(y)

    def loss_fn(w, x, y):
        h = F.max_pool2d(F.relu(F.conv2d(x, w["c1"], w["b1"], padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, w["c2"], w["b2"], padding=1)), 2)
        return F.cross_entropy(h.reshape(len(x), -1) @ w["W"] + w["b"], y)

    compiled = torch.compile(loss_fn)
    optimizer = torch.optim.SGD(list(weights.values()), lr=LR)

    def step(fn):
        def run():
            optimizer.zero_grad(set_to_none=True)
            loss = fn(weights, xt, yt)
            loss.backward()
            optimizer.step()
            return loss.detach()
        return run

    return {"PyTorch eager": step(loss_fn), "torch.compile": step(compiled)}, \
        lambda: float(loss_fn({k: torch.tensor(v) for k, v in params.items()}, xt, yt))


def jax_step(params, x, y):
    import jax
    import jax.numpy as jnp

    def conv(x, k, b):
        out = jax.lax.conv_general_dilated(x, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out + b[None, :, None, None]

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss_fn(w, x, y):
        h = pool(jax.nn.relu(conv(x, w["c1"], w["b1"])))
        h = pool(jax.nn.relu(conv(h, w["c2"], w["b2"])))
        logits = h.reshape(x.shape[0], -1) @ w["W"] + w["b"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    @jax.jit
    def update(w, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(w, x, y)
        return loss, jax.tree_util.tree_map(lambda a, g: a - LR * g, w, grads)

    state = {"w": {k: jnp.asarray(v) for k, v in params.items()}}
    xj, yj = jnp.asarray(x), jnp.asarray(y)

    def run():
        loss, state["w"] = update(state["w"], xj, yj)
        return loss.block_until_ready()

    return run, lambda: float(loss_fn({k: jnp.asarray(v) for k, v in params.items()}, xj, yj))


def cases_for(batch: int, rng) -> tuple[dict, dict]:
    params = init_params(rng)
    x = rng.normal(size=(batch, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    reference = float(mj.compile_loss(cnn_loss)(params, x, y)[0])
    losses, cases = {}, {}
    train = mj.train_step(cnn_loss, mj.optim.sgd(LR))
    mine, state = {k: v.copy() for k, v in params.items()}, None
    state = train.init(mine)
    cases["morphjit"] = lambda: train(mine, state, x, y)
    losses["numpy im2col"] = float(numpy_step({k: v.copy() for k, v in params.items()}, x, y))
    theirs = {k: v.copy() for k, v in params.items()}
    cases["numpy im2col"] = lambda: numpy_step(theirs, x, y)
    try:
        torch_cases, torch_loss = torch_steps(params, x, y)
        losses["PyTorch"] = torch_loss()
        cases.update(torch_cases)
    except ImportError:
        pass
    try:
        cases["JAX"], jax_loss = jax_step(params, x, y)
        losses["JAX"] = jax_loss()
    except ImportError:
        pass
    for name, value in losses.items():
        assert abs(value - reference) <= 1e-4 * abs(reference), f"{name}: loss {value} != morphjit's {reference}"
    return cases, losses


def gemm_shapes(batch: int) -> list[tuple[tuple, tuple, bool, bool]]:
    """The GEMMs of the compiled step (as its plan lists them): (a, b, a transposed, b transposed)."""
    n1, n2 = 64 * batch, 16 * batch
    return [((16, 9), (9, n1), False, False), ((32, 144), (144, n2), False, False),
            ((batch, 128), (128, 10), False, False), ((batch, 10), (128, 10), False, True),
            ((batch, 128), (batch, 10), True, False), ((32, n2), (144, n2), False, True),
            ((32, 144), (32, n2), True, False), ((16, n1), (9, n1), False, True)]


def gemms_alone(batch: int, rng):
    """The step's GEMMs by themselves (BLAS through NumPy, into preallocated outputs)."""
    operands = []
    for a_shape, b_shape, ta, tb in gemm_shapes(batch):
        a = rng.normal(size=a_shape).astype(np.float32)
        b = rng.normal(size=b_shape).astype(np.float32)
        a, b = (a.T if ta else a), (b.T if tb else b)
        operands.append((a, b, np.empty((a.shape[0], b.shape[1]), np.float32)))

    def run():
        for a, b, out in operands:
            np.dot(a, b, out)
    return run


def main(budget: float, out: str | None):
    rng = np.random.default_rng(0)
    results = {}
    for batch in (64, 256):
        cases, _ = cases_for(batch, rng)
        cases["(its GEMMs alone)"] = gemms_alone(batch, rng)
        for fn in cases.values():   # compile (torch.compile, JAX, numba) before timing
            fn()
        stats = measure(cases, budget_s=budget)
        results[batch] = {k: s.as_dict() for k, s in stats.items()}
        base = stats["morphjit"].median_s
        print(f"batch {batch}:")
        for name, s in sorted(stats.items(), key=lambda kv: kv[1].median_s):
            print(f"  {name:18s} {s.median_s * 1e3:8.3f} ms  ({s.median_s / base:5.2f}x morphjit)  "
                  f"IQR {s.iqr_s * 1e3:.3f} ms, {s.samples} samples")
    if out:
        Path(out).write_text(json.dumps({"load_average": os.getloadavg(), "results": results}, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timing per batch size")
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    main(args.budget, args.out)
