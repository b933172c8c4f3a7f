"""Derivatives inside the loss against JAX: a physics-informed network's residual loss and a
gradient penalty, value and gradient with respect to the parameters, per call.

* PINN: a 2-64-64-64-1 tanh network ``u`` at 1024 collocation points of the unit square, the loss
  ``mean((u_xx + u_yy - f)^2)`` of Poisson's equation with ``f = -2 pi^2 sin(pi x) sin(pi y)``. The
  Laplacian is written row by row three ways in each framework: forward over forward
  (``jvp(jvp)`` along each coordinate, tiled over the rows), forward over reverse (``jvp`` of the
  input gradient) and reverse over reverse (``grad`` of a column of the input gradient); JAX also
  as ``vmap(hessian)``, the spelling most PINN code uses.
* WGAN-GP: the critic penalty of a 784-256-256-1 leaky-relu critic at batch 64,
  ``mean((|grad_x D(x)| - 1)^2)`` beside ``mean(D(x))``, the input gradient by ``grad`` of a sum.

Every implementation's value and gradients are checked against morphjit's (float64, 1e-8
relative) before it is timed. Each framework's cases are timed in a group of their own and the
groups take turns (``perf.hvp_bench.best_of_rounds``).

Run:  python -m perf.pinn_bench [--budget 6] [--markdown perf/results/PINN_RESULTS.md]
(JAX: in a venv that has it; without it, morphjit's formulations are timed against each other)
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import morphjit as mj
from perf.hvp_bench import best_of_rounds

WIDTHS = (2, 64, 64, 64, 1)
POINTS = 1024
CRITIC = (784, 256, 256, 1)
CRITIC_BATCH = 64


def pinn_problem(dtype="float64"):
    rng = np.random.default_rng(0)
    params = {}
    for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        params[f"W{i}"] = (rng.standard_normal((a, b)) * np.sqrt(1.0 / a)).astype(dtype)
        params[f"b{i}"] = np.zeros(b, dtype)
    X = rng.uniform(0.0, 1.0, (POINTS, 2)).astype(dtype)
    f = (-2 * np.pi ** 2 * np.sin(np.pi * X[:, 0]) * np.sin(np.pi * X[:, 1])).astype(dtype)
    return params, X, f


def mlp(ns, p, X):
    h = X
    layers = len(WIDTHS) - 1
    for i in range(layers):
        h = h @ p[f"W{i}"] + p[f"b{i}"]
        if i < layers - 1:
            h = ns.tanh(h)
    return h[:, 0]


def pinn_losses(ns, jvp, grad):
    """The PINN loss of each formulation, written with a framework's ``jvp`` and ``grad``."""
    def directions(X):
        return [ns.zeros_like(X) + np.eye(2, dtype=X.dtype)[k] for k in range(2)]

    def forward_forward(p, X):
        u = lambda X: mlp(ns, p, X)  # noqa: E731
        total = 0.0
        for e in directions(X):
            du = lambda X, e=e: jvp(u, (X,), (e,))[1]  # noqa: E731
            total = total + jvp(du, (X,), (e,))[1]
        return total

    def forward_reverse(p, X):
        gx = lambda X: grad(lambda X: ns.sum(mlp(ns, p, X)))(X)  # noqa: E731
        return sum(jvp(gx, (X,), (e,))[1][:, k] for k, e in enumerate(directions(X)))

    def reverse_reverse(p, X):
        gx = lambda X: grad(lambda X: ns.sum(mlp(ns, p, X)))(X)  # noqa: E731
        return sum(grad(lambda X, k=k: ns.sum(gx(X)[:, k]))(X)[:, k] for k in range(2))

    def loss(laplacian):
        def residual(p, X, f):
            r = laplacian(p, X) - f
            return ns.mean(r * r)
        return residual
    return {"forward over forward": loss(forward_forward), "forward over reverse": loss(forward_reverse),
            "reverse over reverse": loss(reverse_reverse)}


def critic_problem(dtype="float64"):
    rng = np.random.default_rng(1)
    params = {f"W{i}": (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(dtype)
              for i, (a, b) in enumerate(zip(CRITIC, CRITIC[1:]))}
    return params, rng.standard_normal((CRITIC_BATCH, CRITIC[0])).astype(dtype)


def critic_loss(ns, grad):
    def critic(p, x):
        h = x
        for i in range(len(CRITIC) - 1):
            h = h @ p[f"W{i}"]
            if i < len(CRITIC) - 2:
                h = ns.maximum(h, 0.2 * h)
        return h[:, 0]

    def loss(p, x):
        gx = grad(lambda x: ns.sum(critic(p, x)))(x)
        norm = ns.sqrt(ns.sum(gx * gx, axis=1))
        return ns.mean(critic(p, x)) + 10.0 * ns.mean((norm - 1.0) ** 2)
    return loss


def morphjit_cases(pinn, critic):
    cases = {}
    for name, loss in pinn_losses(mj, mj.jvp, mj.grad).items():
        step = mj.value_and_grad(loss)
        cases[f"pinn: morphjit {name}"] = lambda step=step: step(*pinn)
    step = mj.value_and_grad(critic_loss(mj, mj.grad))
    cases["wgan-gp: morphjit"] = lambda: step(*critic)
    return cases


def jax_cases(pinn, critic):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    cases = {}
    losses = pinn_losses(jnp, jax.jvp, jax.grad)

    def u_point(p, x):
        return mlp(jnp, p, x[None, :])[0]

    def vmap_hessian(p, X, f):
        lap = jax.vmap(lambda x: jnp.trace(jax.hessian(lambda x: u_point(p, x))(x)))(X)
        return jnp.mean((lap - f) ** 2)
    losses["vmap(hessian)"] = vmap_hessian
    args = [jax.device_put(a) if not isinstance(a, dict) else {k: jax.device_put(v) for k, v in a.items()}
            for a in pinn]
    for name, loss in losses.items():
        step = jax.jit(jax.value_and_grad(loss))
        cases[f"pinn: jax {name}"] = lambda step=step: jax.block_until_ready(step(*args))
    step = jax.jit(jax.value_and_grad(critic_loss(jnp, jax.grad)))
    cargs = [{k: jax.device_put(v) for k, v in critic[0].items()}, jax.device_put(critic[1])]
    cases["wgan-gp: jax"] = lambda: jax.block_until_ready(step(*cargs))
    return cases


def check(cases: dict, reference: dict) -> None:
    """Each case's value and gradients against morphjit's of the same problem (1e-8 relative)."""
    for name, run in cases.items():
        value, grads = run()
        expected = reference[name.split(":")[0]]
        assert np.allclose(float(value), expected[0], rtol=1e-8), (name, float(value), expected[0])
        for k, g in expected[1].items():
            scale = np.max(np.abs(g))
            assert np.allclose(np.asarray(grads[k]), g, rtol=0, atol=1e-8 * scale), (name, k)


def report(best: dict, header: str) -> str:
    lines = [header, "", "| case | median ms (IQR) | / best JAX of its problem |", "|---|---:|---:|"]
    for problem in ("pinn", "wgan-gp"):
        mine = {k: v for k, v in best.items() if k.startswith(problem + ":")}
        jax_best = min((v["median_s"] for k, v in mine.items() if ": jax" in k), default=None)
        for k, v in sorted(mine.items(), key=lambda kv: kv[1]["median_s"]):
            ratio = f"{v['median_s'] / jax_best:.2f}x" if jax_best else "-"
            lines.append(f"| {k} | {v['median_s'] * 1e3:.2f} ({v['iqr_s'] * 1e3:.2f}) | {ratio} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=6.0, help="seconds of timing per case group")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    pinn, critic = pinn_problem(), critic_problem()
    ours = morphjit_cases(pinn, critic)
    reference = {"pinn": ours["pinn: morphjit forward over forward"](), "wgan-gp": ours["wgan-gp: morphjit"]()}
    check(ours, reference)
    groups = [ours]
    try:
        theirs = jax_cases(pinn, critic)
        check(theirs, reference)
        groups.append(theirs)
        import jax
        peers = f"JAX {jax.__version__}"
    except ImportError:
        peers = "no JAX"
    best = best_of_rounds(groups, args.budget)
    load = os.getloadavg()[0]
    header = (f"# PINN and WGAN-GP, value and gradient per call (float64)\n\n{started}, {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores, load {load:.1f} at the end, morphjit {mj.__version__}, {peers}, default "
              f"threads.\n`python -m perf.pinn_bench --budget {args.budget:g}`")
    text = report(best, header)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
