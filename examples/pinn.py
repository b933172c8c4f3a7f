"""Solve Poisson's equation u_xx + u_yy = f on the unit square with a physics-informed network.

What it shows:
  * derivatives inside the loss: the network's Laplacian at each collocation point, as
    ``mj.jvp`` of ``mj.jvp`` along each coordinate (forward over forward, row by row: the
    direction is tiled over the points), in a loss that the training step differentiates once
    more with respect to the weights; the whole loss is one compiled step;
  * training with ``mj.train_step`` and Adam, and the boundary condition as a second term;
  * the solution against the exact one, u = sin(pi x) sin(pi y) for f = -2 pi^2 sin(pi x) sin(pi y).

Run:  python examples/pinn.py
"""
import argparse

import numpy as np

import morphjit as mj
from _common import Progress

WIDTHS = (2, 32, 32, 1)


def init(rng):
    return {f"{name}{i}": value
            for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:]))
            for name, value in (("W", rng.normal(size=(a, b)) * np.sqrt(1.0 / a)), ("b", np.zeros(b)))}


def u(p, X):
    """The network at the points ``X`` (one row each): one value per point."""
    h = X
    for i in range(len(WIDTHS) - 1):
        h = h @ p[f"W{i}"] + p[f"b{i}"]
        if i < len(WIDTHS) - 2:
            h = mj.tanh(h)
    return h[:, 0]


def laplacian(p, X):
    """u_xx + u_yy at each point: the second derivative along each coordinate by forward over
    forward (the rows do not mix, so a direction tiled over them gives every row's own)."""
    total = 0.0
    for k in range(2):
        e = mj.zeros_like(X) + np.eye(2)[k]
        du = lambda X, e=e: mj.jvp(lambda X: u(p, X), (X,), (e,))[1]   # noqa: E731
        total = total + mj.jvp(du, (X,), (e,))[1]
    return total


def source(X):
    return -2 * np.pi ** 2 * np.sin(np.pi * X[:, 0]) * np.sin(np.pi * X[:, 1])


def exact(X):
    return np.sin(np.pi * X[:, 0]) * np.sin(np.pi * X[:, 1])


def loss(p, interior, f, boundary):
    residual = laplacian(p, interior) - f
    return mj.mean(residual ** 2) + 10.0 * mj.mean(u(p, boundary) ** 2)


def boundary_points(n):
    s = np.linspace(0.0, 1.0, n)
    zeros, ones = np.zeros(n), np.ones(n)
    return np.concatenate([np.stack(pair, axis=1) for pair in ((s, zeros), (s, ones), (zeros, s), (ones, s))])


def main(steps=3000, points=512, lr=3e-3, seed=0):
    """Train; returns the losses, the largest error against the exact solution on a grid, and
    how many steps were compiled."""
    rng = np.random.default_rng(seed)
    params = init(rng)
    interior = rng.uniform(0.0, 1.0, (points, 2))
    data = (interior, source(interior), boundary_points(32))
    step = mj.train_step(loss, mj.optim.adam(lr))
    state = step.init(params)
    progress = Progress(steps)
    losses = []
    for i in range(steps):
        losses.append(float(step(params, state, *data)))
        progress.update(i, losses[-1])
    progress.close()
    grid = np.stack(np.meshgrid(np.linspace(0, 1, 41), np.linspace(0, 1, 41)), axis=-1).reshape(-1, 2)
    solution = mj.compile(u)(params, grid)
    error = float(np.max(np.abs(solution - exact(grid))))
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.5f}; largest error against sin(pi x) sin(pi y) on a "
          f"41 x 41 grid: {error:.4f} (the solution's peak is 1)")
    return {"initial_loss": losses[0], "final_loss": losses[-1], "max_error": error,
            "compiles": step.cache_info().misses}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--points", type=int, default=512)
    args = parser.parse_args()
    main(steps=args.steps, points=args.points)
