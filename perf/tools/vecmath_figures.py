"""Derives the figures of perf/results/VECMATH.md (README: vector math), by switching internals.

morphjit with vectorised transcendental functions against its scalar fallback (the loops before
issue 20) and against the plans before issue 20's plan changes ("loops": pairwise distances as
loop nests, softmax exponentials row by row), NumPy's hand-written step and any peers importable
here, in one process.

Run: python -m perf.tools.vecmath_figures [--only curve,rbf] [--peers jax,torch.compile] [--seconds 3]

The cases take turns call by call and each keeps its fastest call: on a shared machine the
minimum is the call least disturbed by other work, and taking turns exposes every case to the
same disturbances; the order rotates every round, since a call right after a peer's (whose
threads keep the other core busy for a while) can run slower. It is a tool, not a benchmark:
the scalar fallback and the old plans are rendered by switching internals (``vecmath.ENABLED``,
``distances.MIN_DEPTH``, ``selection.SHORT_ROW``) for one compilation.
"""
from __future__ import annotations

import argparse
import time

import morphjit as mj
from morphjit.transforms import distances
from morphjit.backend import selection
from morphjit.native import vecmath
from perf import impls
from perf.workloads import DTYPES, WORKLOADS

DEFAULT = "curve,rbf,transcendental,tiny,small,logistic,attention,layernorm"


def morphjit_step(wl, params, data, vector: bool, rewrites: bool = True):
    """A step compiled with the vector forms on or off (off renders the loops' old NumPy calls),
    and with the distance and short-row rewrites on or off."""
    saved = vecmath.ENABLED, distances.MIN_DEPTH, selection.SHORT_ROW
    vecmath.ENABLED = vector
    if not rewrites:
        distances.MIN_DEPTH, selection.SHORT_ROW = float("inf"), 0
    try:
        step = mj.compile_loss(impls.named_loss(wl, mj), cache=False)
        step(params, *data)
    finally:
        vecmath.ENABLED, distances.MIN_DEPTH, selection.SHORT_ROW = saved
    return lambda: step(params, *data)


def fastest_calls(cases: dict, seconds: float) -> dict:
    best = {k: float("inf") for k in cases}
    order = list(cases.items())
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        order = order[1:] + order[:1]   # each case follows each other one in turn
        for k, call in order:
            start = time.perf_counter()
            call()
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m perf.tools.vecmath_figures", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=DEFAULT)
    ap.add_argument("--peers", default="", help="implementations from perf.impls, e.g. jax,torch.compile")
    ap.add_argument("--seconds", type=float, default=3.0, help="per workload and dtype")
    opts = ap.parse_args(argv)
    for name in opts.only.split(","):
        wl = WORKLOADS[name]
        for dtype in DTYPES:
            params, data = wl.make(dtype)
            cases = {"vector": morphjit_step(wl, params, data, True),
                     "scalar": morphjit_step(wl, params, data, False),
                     "loops": morphjit_step(wl, params, data, True, rewrites=False),
                     "numpy": lambda: wl.numpy_step(params, *data)}
            for peer in filter(None, opts.peers.split(",")):
                cases[peer] = impls.IMPLEMENTATIONS[peer].build(wl, params, data).call
            best = fastest_calls(cases, opts.seconds)
            cells = "  ".join(f"{k} {t * 1e6:.1f} us ({t / best['vector']:.2f}x)" for k, t in best.items())
            print(f"{name} {dtype}: {cells}", flush=True)


if __name__ == "__main__":
    main()
