"""Integer-array indexing in a training step: morphjit against NumPy, a hand-written numba loop,
JAX and PyTorch (when importable), side by side in one run.

Two workloads at batch 64, float32 and float64, each the loss and the gradients of all parameters:

* ``embedding``: a bag of embeddings, ``mean(E[tokens], axis=1) @ W`` and a softmax
  cross-entropy (V=1000 words of d=32, 16 tokens per example, 10 classes); the gradient of ``E``
  is a scatter-add with repeated tokens.
* ``ce-pick``: ``-mean(log_softmax(x @ W)[np.arange(n), y])`` (64 features, 100 classes), with
  ``n = y.shape[0]``, so morphjit's step is the one serving every batch size.

Every implementation is checked against morphjit before it is timed; times are medians of
interleaved samples (``perf.timing``), one BLAS thread. Run:
``python -m perf.indexing_bench`` (peers from whatever environment runs it).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import platform  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

import morphjit as mj  # noqa: E402
from perf.timing import measure  # noqa: E402

BATCH, VOCAB, DIM, TOKENS, CLASSES = 64, 1000, 32, 16, 10
FEATURES, PICK_CLASSES = 64, 100


# ---------------------------------------------------------------------------------------------
# The losses, written once in NumPy style (morphjit traces them; NumPy runs them eagerly)

def embedding_loss(p, tokens, y):
    h = np.mean(p["E"][tokens], axis=1)
    return mj.mean(mj.softmax_cross_entropy(h @ p["W"], y))


def pick_loss(p, x, y):
    z = x @ p["W"]
    logp = z - mj.logsumexp(z, axis=1, keepdims=True)
    return -np.mean(logp[np.arange(y.shape[0]), y])


# ---------------------------------------------------------------------------------------------
# NumPy by hand

def _softmax_rows(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def numpy_embedding(p, tokens, y):
    E, W = p["E"], p["W"]
    h = E[tokens].mean(axis=1)
    z = h @ W
    s = _softmax_rows(z)
    n = len(y)
    value = np.mean(np.log(np.sum(np.exp(z - z.max(axis=1, keepdims=True)), axis=1)) + z.max(axis=1) - z[np.arange(n), y])
    dz = s
    dz[np.arange(n), y] -= 1
    dz /= n
    dW = h.T @ dz
    dh = dz @ W.T / tokens.shape[1]
    dE = np.zeros_like(E)
    np.add.at(dE, tokens, np.broadcast_to(dh[:, None, :], tokens.shape + (E.shape[1],)))
    return value, {"E": dE, "W": dW}


def numpy_pick(p, x, y):
    z = x @ p["W"]
    n = len(y)
    m = z.max(axis=1, keepdims=True)
    logp = z - m - np.log(np.sum(np.exp(z - m), axis=1, keepdims=True))
    value = -np.mean(logp[np.arange(n), y])
    dz = np.exp(logp)
    dz[np.arange(n), y] -= 1
    return value, {"W": x.T @ (dz / n)}


# ---------------------------------------------------------------------------------------------
# numba by hand: the same gathers and scatters as loops, GEMMs through np.dot

@numba.njit(fastmath=True, boundscheck=False, nogil=True)
def _cross_entropy_rows(z, y, dz):
    """The mean softmax cross-entropy of the rows of ``z`` at the labels ``y``; its gradient with
    respect to ``z`` is written to ``dz`` (which may be ``z``)."""
    n = z.shape[0]
    total = 0.0
    for i in range(n):
        m = z[i, 0]
        for c in range(z.shape[1]):
            m = max(m, z[i, c])
        label = z[i, y[i]]
        s = 0.0
        for c in range(z.shape[1]):
            dz[i, c] = np.exp(z[i, c] - m)
            s += dz[i, c]
        total += np.log(s) + m - label
        for c in range(z.shape[1]):
            dz[i, c] = dz[i, c] / s / n
        dz[i, y[i]] -= 1.0 / n
    return total / n


@numba.njit(fastmath=True, boundscheck=False, nogil=True)
def _embedding_kernel(E, W, tokens, y, h, z, dz, dh, dE, dW):
    n, k = tokens.shape
    d = E.shape[1]
    for i in range(n):
        for j in range(d):
            h[i, j] = 0.0
        for t in range(k):
            row = tokens[i, t]
            for j in range(d):
                h[i, j] += E[row, j]
        for j in range(d):
            h[i, j] /= k
    np.dot(h, W, z)
    value = _cross_entropy_rows(z, y, dz)
    np.dot(h.T, dz, dW)
    np.dot(dz, W.T, dh)
    dE[...] = 0.0
    for i in range(n):
        for t in range(k):
            row = tokens[i, t]
            for j in range(d):
                dE[row, j] += dh[i, j] / k
    return value


def numba_embedding(dtype):
    n, dt = BATCH, np.dtype(dtype)
    h, z, dz, dh = (np.empty(s, dt) for s in ((n, DIM), (n, CLASSES), (n, CLASSES), (n, DIM)))
    dE, dW = np.empty((VOCAB, DIM), dt), np.empty((DIM, CLASSES), dt)

    def run(p, tokens, y):
        value = _embedding_kernel(p["E"], p["W"], tokens, y, h, z, dz, dh, dE, dW)
        return value, {"E": dE, "W": dW}
    return run


@numba.njit(fastmath=True, boundscheck=False, nogil=True)
def _pick_kernel(x, W, y, z, dW):
    np.dot(x, W, z)
    value = _cross_entropy_rows(z, y, z)
    np.dot(x.T, z, dW)
    return value


def numba_pick(dtype):
    z, dW = np.empty((BATCH, PICK_CLASSES), dtype), np.empty((FEATURES, PICK_CLASSES), dtype)

    def run(p, x, y):
        return _pick_kernel(x, p["W"], y, z, dW), {"W": dW}
    return run


# ---------------------------------------------------------------------------------------------
# Peers

def jax_step(loss_name):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)

    def embedding(p, tokens, y):
        h = jnp.mean(p["E"][tokens], axis=1)
        z = h @ p["W"]
        return jnp.mean(jax.nn.logsumexp(z, axis=1) - z[jnp.arange(len(y)), y])

    def pick(p, x, y):
        logp = jax.nn.log_softmax(x @ p["W"], axis=1)
        return -jnp.mean(logp[jnp.arange(len(y)), y])

    step = jax.jit(jax.value_and_grad({"embedding": embedding, "ce-pick": pick}[loss_name]))

    def run(p, a, y):
        value, grads = step(p, a, y)
        grads = jax.block_until_ready(grads)
        return value, grads
    return run


def torch_step(loss_name):
    import torch
    torch.set_num_threads(1)

    def run(p, a, y):
        tp = {k: torch.from_numpy(v).requires_grad_() for k, v in p.items()}
        ta, ty = torch.from_numpy(a), torch.from_numpy(y)
        if loss_name == "embedding":
            z = tp["E"][ta].mean(dim=1) @ tp["W"]
            value = torch.nn.functional.cross_entropy(z, ty)
        else:
            logp = torch.log_softmax(ta @ tp["W"], dim=1)
            value = -logp[torch.arange(len(ty)), ty].mean()
        value.backward()
        return value.item(), {k: t.grad.numpy() for k, t in tp.items()}
    return run


def peers(loss_name):
    found = {}
    for name, make in (("JAX jit", jax_step), ("PyTorch", torch_step)):
        try:
            found[name] = make(loss_name)
        except ImportError:
            pass
    return found


# ---------------------------------------------------------------------------------------------

def workload(name, dtype, rng):
    if name == "embedding":
        params = {"E": rng.normal(size=(VOCAB, DIM)).astype(dtype),
                  "W": rng.normal(scale=0.2, size=(DIM, CLASSES)).astype(dtype)}
        data = (rng.integers(0, VOCAB, size=(BATCH, TOKENS)), rng.integers(0, CLASSES, size=BATCH))
        return params, data, embedding_loss, numpy_embedding, numba_embedding(dtype)
    params = {"W": rng.normal(scale=0.2, size=(FEATURES, PICK_CLASSES)).astype(dtype)}
    data = (rng.normal(size=(BATCH, FEATURES)).astype(dtype), rng.integers(0, PICK_CLASSES, size=BATCH))
    return params, data, pick_loss, numpy_pick, numba_pick(dtype)


def run_workload(name, dtype, budget_s):
    rng = np.random.default_rng(0)
    params, data, loss, by_hand, by_numba = workload(name, dtype, rng)
    compiled = mj.compile_loss(loss)
    impls = {"morphjit": lambda: compiled(params, *data), "NumPy": lambda: by_hand(params, *data),
             "numba loop": lambda: by_numba(params, *data)}
    impls.update({k: (lambda f=f: f(params, *data)) for k, f in peers(name).items()})
    value, grads = compiled(params, *data)
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    for k, fn in impls.items():
        v, g = fn()
        np.testing.assert_allclose(float(v), float(value), rtol=rtol, err_msg=k)
        for leaf in grads:
            np.testing.assert_allclose(np.asarray(g[leaf]), grads[leaf], rtol=rtol * 10, atol=rtol * 1e-2, err_msg=k)
    return measure(impls, budget_s=budget_s)


def main(budget_s=3.0, repeats=3):
    print(f"# indexing bench: batch {BATCH}, 1 thread, {platform.processor() or platform.machine()}, "
          f"numba {numba.__version__}, numpy {np.__version__}")
    print("# median us per step (loss and gradients) over", repeats, "runs; in brackets time / morphjit's")
    for name in ("embedding", "ce-pick"):
        for dtype in (np.float32, np.float64):
            runs = [run_workload(name, dtype, budget_s) for _ in range(repeats)]
            medians = {k: float(np.median([r[k].median_s for r in runs])) * 1e6 for k in runs[0]}
            base = medians["morphjit"]
            cells = "  ".join(f"{k} {t:.1f} ({t / base:.2f}x)" for k, t in medians.items())
            print(f"{name:10s} {np.dtype(dtype).name}: {cells}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timing per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    main(args.budget, args.repeats)
