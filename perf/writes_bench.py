"""In-place writes in a training step: morphjit on NumPy code that fills buffers, against the same
code's functional spelling in morphjit, NumPy by hand (forward and a hand-written backward), JAX
(``.at[].set``) and PyTorch (in-place writes, autograd), side by side in one run.

Two workloads, each the loss and the gradients of all parameters, float32 and float64:

* ``rnn``: CS231n's ``rnn_forward``, ``h = np.zeros((N, T, H)); h[:, t, :] = np.tanh(...)``
  (N=64, T=40, D=16, H=128), loss ``sum(h ** 2)``.
* ``rows``: a buffer filled row by row, ``out = np.zeros((n, k)); out[i] = np.tanh(x[i] @ W)``
  (n=64, d=32, k=64), loss ``sum(out ** 2)``.

Every implementation is checked against morphjit before it is timed; times are medians of
interleaved samples (``perf.timing``), one BLAS thread. Run: ``python -m perf.writes_bench``
(peers from whatever environment runs it).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import platform  # noqa: E402

import numpy as np  # noqa: E402

import morphjit as mj  # noqa: E402
from perf.timing import measure  # noqa: E402

N, T, D, H = 64, 40, 16, 128
ROWS, FEATURES, UNITS = 64, 32, 64


# ---------------------------------------------------------------------------------------------
# The losses as NumPy code writes them (morphjit traces them; NumPy runs them eagerly)

def rnn_loss(p, x):
    h = np.zeros((x.shape[0], x.shape[1], p["Wh"].shape[0]), x.dtype)
    for t in range(x.shape[1]):
        prev = p["h0"] if t == 0 else h[:, t - 1, :]
        h[:, t, :] = np.tanh(prev @ p["Wh"] + x[:, t, :] @ p["Wx"] + p["b"])
    return np.sum(h ** 2)


def rnn_functional(p, x):
    prev, states = p["h0"], []
    for t in range(x.shape[1]):
        prev = np.tanh(prev @ p["Wh"] + x[:, t, :] @ p["Wx"] + p["b"])
        states.append(prev)
    return np.sum(np.stack(states, axis=1) ** 2)


def rows_loss(p, x):
    out = np.zeros((x.shape[0], p["W"].shape[1]), x.dtype)
    for i in range(x.shape[0]):
        out[i] = np.tanh(x[i] @ p["W"])
    return np.sum(out ** 2)


def rows_functional(p, x):
    return np.sum(np.tanh(x @ p["W"]) ** 2)


# ---------------------------------------------------------------------------------------------
# NumPy by hand: the forward as written, and its backward

def numpy_rnn(p, x):
    h = np.zeros((x.shape[0], x.shape[1], p["Wh"].shape[0]), x.dtype)
    for t in range(x.shape[1]):
        prev = p["h0"] if t == 0 else h[:, t - 1, :]
        h[:, t, :] = np.tanh(prev @ p["Wh"] + x[:, t, :] @ p["Wx"] + p["b"])
    grads = {k: np.zeros_like(v) for k, v in p.items()}
    dh = 2 * h
    carry = np.zeros_like(p["h0"])
    for t in reversed(range(x.shape[1])):
        dz = (dh[:, t, :] + carry) * (1 - h[:, t, :] ** 2)
        prev = p["h0"] if t == 0 else h[:, t - 1, :]
        grads["Wh"] += prev.T @ dz
        grads["Wx"] += x[:, t, :].T @ dz
        grads["b"] += dz.sum(axis=0)
        carry = dz @ p["Wh"].T
    grads["h0"] = carry
    return np.sum(h ** 2), grads


def numpy_rows(p, x):
    out = np.zeros((x.shape[0], p["W"].shape[1]), x.dtype)
    for i in range(x.shape[0]):
        out[i] = np.tanh(x[i] @ p["W"])
    dz = 2 * out * (1 - out ** 2)
    return np.sum(out ** 2), {"W": x.T @ dz}


# ---------------------------------------------------------------------------------------------
# Peers

def jax_step(name):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)

    def rnn(p, x):
        h = jnp.zeros((x.shape[0], x.shape[1], p["Wh"].shape[0]), x.dtype)
        for t in range(x.shape[1]):
            prev = p["h0"] if t == 0 else h[:, t - 1, :]
            h = h.at[:, t, :].set(jnp.tanh(prev @ p["Wh"] + x[:, t, :] @ p["Wx"] + p["b"]))
        return jnp.sum(h ** 2)

    def rows(p, x):
        out = jnp.zeros((x.shape[0], p["W"].shape[1]), x.dtype)
        for i in range(x.shape[0]):
            out = out.at[i].set(jnp.tanh(x[i] @ p["W"]))
        return jnp.sum(out ** 2)

    step = jax.jit(jax.value_and_grad({"rnn": rnn, "rows": rows}[name]))

    def run(p, x):
        value, grads = step(p, x)
        return value, jax.block_until_ready(grads)
    return run


def torch_step(name):
    import torch
    torch.set_num_threads(1)

    def run(p, x):
        tp = {k: torch.from_numpy(v).requires_grad_() for k, v in p.items()}
        tx = torch.from_numpy(x)
        if name == "rnn":
            # autograd refuses a read of h[:, t - 1, :] that the next write into h changes: the
            # step keeps the state it writes, as PyTorch code does
            h = torch.zeros((tx.shape[0], tx.shape[1], tp["Wh"].shape[0]), dtype=tx.dtype)
            prev = tp["h0"]
            for t in range(tx.shape[1]):
                prev = torch.tanh(prev @ tp["Wh"] + tx[:, t, :] @ tp["Wx"] + tp["b"])
                h[:, t, :] = prev
            value = (h ** 2).sum()
        else:
            out = torch.zeros((tx.shape[0], tp["W"].shape[1]), dtype=tx.dtype)
            for i in range(tx.shape[0]):
                out[i] = torch.tanh(tx[i] @ tp["W"])
            value = (out ** 2).sum()
        value.backward()
        return value.item(), {k: t.grad.numpy() for k, t in tp.items()}
    return run


def peers(name):
    found = {}
    for label, make in (("JAX jit", jax_step), ("PyTorch", torch_step)):
        try:
            found[label] = make(name)
        except ImportError:
            pass
    return found


# ---------------------------------------------------------------------------------------------

def workload(name, dtype, rng):
    if name == "rnn":
        params = {"Wh": rng.normal(scale=0.3 / np.sqrt(H), size=(H, H)), "Wx": rng.normal(scale=0.3, size=(D, H)),
                  "b": rng.normal(scale=0.1, size=H), "h0": rng.normal(scale=0.1, size=(N, H))}
        data = rng.normal(size=(N, T, D))
        return params, data, rnn_loss, rnn_functional, numpy_rnn
    params = {"W": rng.normal(scale=0.2, size=(FEATURES, UNITS))}
    return params, rng.normal(size=(ROWS, FEATURES)), rows_loss, rows_functional, numpy_rows


def run_workload(name, dtype, budget_s):
    params, x, loss, functional, by_hand = workload(name, dtype, np.random.default_rng(0))
    params = {k: v.astype(dtype) for k, v in params.items()}
    x = x.astype(dtype)
    compiled, spelled = mj.compile_loss(loss), mj.compile_loss(functional)
    impls = {"morphjit": lambda: compiled(params, x), "morphjit functional": lambda: spelled(params, x),
             "NumPy": lambda: by_hand(params, x)}
    impls.update({k: (lambda f=f: f(params, x)) for k, f in peers(name).items()})
    value, grads = compiled(params, x)
    rtol = 2e-3 if dtype == np.float32 else 1e-9
    for k, fn in impls.items():
        v, g = fn()
        np.testing.assert_allclose(float(v), float(value), rtol=rtol, err_msg=k)
        for leaf in grads:
            np.testing.assert_allclose(np.asarray(g[leaf]), grads[leaf], rtol=rtol * 10, atol=rtol, err_msg=k)
    return measure(impls, budget_s=budget_s)


def main(budget_s=3.0):
    print(f"# writes bench: 1 thread, {platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.2f}")
    for name in ("rnn", "rows"):
        for dtype in (np.float32, np.float64):
            times = {k: stats.median_s for k, stats in run_workload(name, dtype, budget_s).items()}
            base = times["morphjit"]
            cells = ", ".join(f"{k} {t * 1e6:.0f} us ({t / base:.2f}x)" for k, t in times.items())
            print(f"{name} {np.dtype(dtype).name}: {cells}")
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of samples per workload")
    main(parser.parse_args().budget)
