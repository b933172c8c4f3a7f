"""The cost of a random draw per element inside a fused loop, against NumPy's generators.

Run: python -m perf.random_draws [--n 1000000] [--seconds 2]

morphjit: ``sum(x * draw) + sum(w)``, one reduction loop computing each element of the draw
where it is read (nothing allocated); the same step without the draw (``sum(x * x)``) is timed
alongside, and the difference, per element, is the draw's cost. NumPy: ``rng.standard_normal(n)``
and ``rng.random(n)`` into a preallocated array (``out=``), so its figure is the generator's alone,
and with the same reduction (``np.dot(x, draw)``). Cases take turns (``perf.timing``); on a loaded
machine ratios taken side by side are what to read.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import morphjit as mj
from perf.timing import measure


def compiled(draw, n: int):
    """A compiled step over data of n elements reading ``draw(x, rng)``; a call of it."""
    step = mj.compile_loss(lambda w, x, rng: np.sum(x * draw(x, rng)) + np.sum(w), cache=False)
    w, x, rng = np.zeros(1), np.ones(n), np.random.default_rng(0)
    step(w, x, rng)
    return lambda: step(w, x, rng)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    n = args.n
    rng, x, out = np.random.default_rng(0), np.ones(n), np.empty(n)
    cases = {
        "morphjit: no draw (sum(x * x))": compiled(lambda x, rng: x, n),
        "morphjit: standard_normal": compiled(lambda x, rng: rng.standard_normal(x.shape), n),
        "morphjit: random (uniform)": compiled(lambda x, rng: rng.random(x.shape), n),
        "numpy: rng.standard_normal(out=)": lambda: rng.standard_normal(n, out=out),
        "numpy: rng.random(out=)": lambda: rng.random(n, out=out),
        "numpy: np.dot(x, rng.standard_normal(n))": lambda: np.dot(x, rng.standard_normal(n)),
    }
    stats = measure(cases, budget_s=args.seconds * len(cases))
    base = stats["morphjit: no draw (sum(x * x))"].median_s
    print(f"n = {n}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, s in stats.items():
        extra = f"   draw alone {(s.median_s - base) / n * 1e9:5.2f} ns/element" if name.startswith("morphjit: ") \
            and "no draw" not in name else ""
        print(f"{name:44s} {s.median_s * 1e3:8.3f} ms  {s.median_s / n * 1e9:6.2f} ns/element{extra}")


if __name__ == "__main__":
    main()
