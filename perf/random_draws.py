"""The cost of a random draw per element inside a fused loop, against NumPy's generators.

Run: python -m perf.random_draws [--n 1000000] [--seconds 2]

morphjit: ``sum(x * draw) + sum(w)``, one reduction loop computing each element of the draw
where it is read (nothing allocated); the same step without the draw (``sum(x * x)``) is timed
alongside, and the difference, per element, is the draw's cost. NumPy: ``rng.standard_normal(n)``
and ``rng.random(n)`` into a preallocated array (``out=``), so its figure is the generator's alone,
and with the same reduction (``np.dot(x, draw)``). The cases take turns call by call and each
keeps its fastest call: on a shared machine the minimum is the call least disturbed by other work.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import morphjit as mj


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
    fastest = fastest_calls(cases, args.seconds * len(cases))
    base = fastest["morphjit: no draw (sum(x * x))"]
    print(f"n = {n}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; fastest call of each")
    for name, seconds in fastest.items():
        extra = f"   draw alone {(seconds - base) / n * 1e9:5.2f} ns/element" if name.startswith("morphjit: ") \
            and "no draw" not in name else ""
        print(f"{name:44s} {seconds * 1e3:8.3f} ms  {seconds / n * 1e9:6.2f} ns/element{extra}")


def fastest_calls(cases: dict, budget_s: float) -> dict:
    """The fastest of the calls each case made while the cases took turns for ``budget_s``."""
    fastest = {name: float("inf") for name in cases}
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline:
        for name, call in cases.items():
            start = time.perf_counter()
            call()
            fastest[name] = min(fastest[name], time.perf_counter() - start)
    return fastest


if __name__ == "__main__":
    main()
