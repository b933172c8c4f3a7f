"""The Gaussian-process log marginal likelihood and its gradient (three kernel hyperparameters),
compiled by morphjit, against hand-written NumPy/SciPy, JAX and PyTorch (those installed), at
n = 100, 500 and 2000 points, float64. At large n every implementation is LAPACK-bound, so each
time is also given as a ratio to one bare ``np.linalg.cholesky`` of the kernel matrix.

Run:  python -m perf.gp_bench [--sizes 100 500 2000] [--budget 3]   (peers: run in a venv that has them)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math

import numpy as np
import scipy.linalg

import morphjit as mj
from perf.timing import measure

JITTER = 1e-10
THETA = np.log(np.array([1.5, 0.7, 0.05]))   # log amplitude, length scale, noise level


def data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 5 * math.sqrt(n / 100), n))
    y = np.sin(3 * x) + rng.normal(scale=0.2, size=n)
    return (x[:, None] - x[None, :]) ** 2, y


def morphjit_nlml(theta, sqdist, y):
    n = y.shape[0]
    eye = np.eye(n)
    k = np.exp(theta[0]) * np.exp(-0.5 * sqdist / np.exp(2 * theta[1])) + (np.exp(theta[2]) + JITTER) * eye
    L = np.linalg.cholesky(k)
    alpha = mj.linalg.cho_solve((L, True), y)
    return 0.5 * np.sum(y * alpha) + np.sum(np.log(np.sum(L * eye, axis=1))) + 0.5 * n * np.log(2 * np.pi)


def numpy_nlml(theta, sqdist, y):
    """By hand: dK/dtheta for each hyperparameter, grad = -1/2 tr((alpha alpha^T - K^-1) dK)."""
    n = y.shape[0]
    a, length, s = np.exp(theta)
    e = np.exp(-0.5 * sqdist / length ** 2)
    k = a * e
    k[np.diag_indices(n)] += s + JITTER
    L = scipy.linalg.cholesky(k, lower=True, check_finite=False)
    alpha = scipy.linalg.cho_solve((L, True), y, check_finite=False)
    w = np.outer(alpha, alpha) - scipy.linalg.cho_solve((L, True), np.eye(n), check_finite=False)
    ae = a * e
    grad = -0.5 * np.array([np.sum(w * ae), np.sum(w * ae * sqdist) / length ** 2, s * np.trace(w)])
    value = 0.5 * y @ alpha + np.sum(np.log(np.diag(L))) + 0.5 * n * np.log(2 * np.pi)
    return value, grad


def jax_step():
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    def nlml(theta, sqdist, y):
        n = y.shape[0]
        k = jnp.exp(theta[0]) * jnp.exp(-0.5 * sqdist / jnp.exp(2 * theta[1])) \
            + (jnp.exp(theta[2]) + JITTER) * jnp.eye(n)
        L = jnp.linalg.cholesky(k)
        alpha = jsl.cho_solve((L, True), y)
        return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(L))) + 0.5 * n * jnp.log(2 * jnp.pi)

    step = jax.jit(jax.value_and_grad(nlml))
    return lambda theta, sqdist, y: jax.block_until_ready(step(theta, sqdist, y))


def torch_step():
    import torch

    def step(theta, sqdist, y):
        theta = torch.as_tensor(theta).requires_grad_()
        sqdist, y = torch.as_tensor(sqdist), torch.as_tensor(y)
        n = y.shape[0]
        k = torch.exp(theta[0]) * torch.exp(-0.5 * sqdist / torch.exp(2 * theta[1])) \
            + (torch.exp(theta[2]) + JITTER) * torch.eye(n, dtype=sqdist.dtype)
        L = torch.linalg.cholesky(k)
        alpha = torch.cholesky_solve(y[:, None], L)[:, 0]
        value = 0.5 * y @ alpha + torch.log(torch.diagonal(L)).sum() + 0.5 * n * math.log(2 * math.pi)
        value.backward()
        return value.item(), theta.grad.numpy()
    return step


def implementations() -> dict:
    impls = {"morphjit": mj.compile_loss(morphjit_nlml), "numpy/scipy": numpy_nlml}
    if importlib.util.find_spec("jax"):
        impls["jax"] = jax_step()
    if importlib.util.find_spec("torch"):
        impls["pytorch"] = torch_step()
    return impls


def check(impls, sqdist, y) -> None:
    """Every implementation gives the same value and gradient before any is timed."""
    ref_value, ref_grad = numpy_nlml(THETA, sqdist, y)
    for name, fn in impls.items():
        value, grad = fn(THETA, sqdist, y)
        assert np.isclose(float(value), ref_value, rtol=1e-8), (name, value, ref_value)
        assert np.allclose(np.asarray(grad), ref_grad, rtol=1e-6, atol=1e-8 * abs(ref_grad).max()), (name, grad, ref_grad)


def run(sizes, budget_s: float) -> dict:
    impls = implementations()
    results = {}
    for n in sizes:
        sqdist, y = data(n)
        check(impls, sqdist, y)
        kernel = 1.5 * np.exp(-0.5 * sqdist / 0.49) + 0.05 * np.eye(n)
        cases = {name: (lambda fn=fn: fn(THETA, sqdist, y)) for name, fn in impls.items()}
        cases["bare cholesky"] = lambda: np.linalg.cholesky(kernel)
        stats = measure(cases, budget_s=budget_s, min_samples=5)
        results[n] = {name: s.as_dict() for name, s in stats.items()}
    return results


def report(results: dict) -> str:
    lines = ["GP negative log marginal likelihood + gradient (3 hyperparameters), float64; median ms (IQR),",
             "ratio to the fastest peer, ratio to one bare np.linalg.cholesky", ""]
    for n, stats in results.items():
        chol = stats["bare cholesky"]["median_s"]
        peers = [s["median_s"] for name, s in stats.items() if name not in ("morphjit", "bare cholesky")]
        best = min(peers)
        lines.append(f"n = {n}")
        for name, s in stats.items():
            lines.append(f"  {name:>14}  {s['median_s'] * 1e3:9.3f} ms ({s['iqr_s'] * 1e3:.3f})  "
                         f"x{s['median_s'] / best:5.2f} of best peer  x{s['median_s'] / chol:6.2f} of cholesky")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--budget", type=float, default=3.0)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    results = run(args.sizes, args.budget)
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
