"""Memory a process keeps per compiled and deleted program, against plain numba (issue 30).

Run: python -m perf.memory_per_program [--programs 60] [--morphjit DIR]   (about 5 minutes)

Each case runs in a fresh process: it compiles and calls three programs (numba's and morphjit's
one-time costs), then compiles, calls and deletes ``--programs`` distinct ones (a tanh layer and a
linear read-out with a squared error, its width and a constant different each time), collects
garbage, returns freed heap to the system (``malloc_trim``) and reports the growth of its resident
memory per program, over all of them and over the second half (morphjit's bounded caches are
full by then: the 16 disk-cached steps used last, the 64 kernels loaded last). The cases:

- numba: the same forward and backward written by hand as one ``njit`` function of loops (the
  comparable plain numba function), compiled and deleted the same way; in a process that never
  imports morphjit, and in one that does (morphjit frees llvmlite's pass managers,
  ``morphjit.passmanagers``, for every numba compilation of the process);
- morphjit with ``cache=False``; with the disk cache, compiling into an empty cache; and loading
  the same programs from that cache in the next process.

--morphjit DIR measures the morphjit package in DIR (``git archive <commit> morphjit | tar -x -C
DIR``) instead of this checkout's: the figures before a change.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WARM_UP = 3

PLAIN = '''
@numba.njit(fastmath=True, error_model="numpy", boundscheck=False, nogil=True)
def step(W, b, v, x, t, gW, gb, gv):
    n, d, m = x.shape[0], x.shape[1], W.shape[1]
    h = np.empty((n, m))
    for i in range(n):
        for j in range(m):
            acc = b[j]
            for k in range(d):
                acc += x[i, k] * W[k, j]
            h[i, j] = np.tanh(acc)
    r = np.empty(n)
    loss = 0.0
    for i in range(n):
        acc = 0.0
        for j in range(m):
            acc += h[i, j] * v[j]
        r[i] = acc * C - t[i]
        loss += r[i] * r[i]
    gW[:] = 0.0
    gb[:] = 0.0
    gv[:] = 0.0
    for i in range(n):
        dr = r[i] * (2.0 / n) * C
        for j in range(m):
            gv[j] += h[i, j] * dr
            dh = dr * v[j] * (1 - h[i, j] * h[i, j])
            gb[j] += dh
            for k in range(d):
                gW[k, j] += x[i, k] * dh
    return loss / n
'''


def problem(k: int):
    """The parameters, data and constant of program ``k``."""
    import numpy as np
    rng = np.random.default_rng(k)
    width = 8 + k % 50
    params = {"W": rng.normal(size=(6, width)), "b": rng.normal(size=width), "v": rng.normal(size=width)}
    return params, rng.normal(size=(16, 6)), rng.normal(size=16), 1.0 + k / 1000


def run_numba(k: int, cache: bool) -> None:
    import numba
    import numpy as np
    params, x, t, c = problem(k)
    namespace = {"numba": numba, "np": np, "C": c}
    exec(compile(PLAIN, f"<plain numba {k}>", "exec"), namespace)
    gradients = [np.empty_like(params[name]) for name in ("W", "b", "v")]
    namespace["step"](params["W"], params["b"], params["v"], x, t, *gradients)


def run_morphjit(k: int, cache: bool) -> None:
    import morphjit as mj
    params, x, t, c = problem(k)

    def loss(p, x, t):
        h = mj.tanh(x @ p["W"] + p["b"])
        return mj.mean((h @ p["v"] * c - t) ** 2)

    mj.compile_loss(loss, cache=cache)(params, x, t)


def resident() -> int:
    """Resident bytes, after a collection and after returning freed heap to the system."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(case: str, programs: int) -> dict:
    run = run_morphjit if case.startswith("morphjit") else run_numba
    if case == "numba, morphjit imported":
        import morphjit  # noqa: F401
    cache = case.startswith("morphjit, disk cache")
    for k in range(WARM_UP):
        run(100_000 + k, cache)
    sizes = [resident()]
    for k in range(programs):
        run(k, cache)
        if k + 1 in (programs // 2, programs):
            sizes.append(resident())
    package = sys.modules.get("morphjit")
    return {"case": case, "morphjit": package and package.__file__, "bytes_per_program": (sizes[2] - sizes[0]) / programs,
            "bytes_per_later_program": (sizes[2] - sizes[1]) / (programs - programs // 2)}


CASES = ("numba", "numba, morphjit imported", "morphjit, cache=False", "morphjit, disk cache (compiled)",
         "morphjit, disk cache (loaded)")


def measure(programs: int, morphjit_dir: str = "") -> list[dict]:
    path = [morphjit_dir] if morphjit_dir else []
    path.append(str(Path(__file__).resolve().parent.parent))
    results = []
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, MORPHJIT_CACHE_DIR=cache_dir, OPENBLAS_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]))
        for case in CASES:
            # run as a file from elsewhere: the package imported is the one PYTHONPATH names first
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", case, "--programs",
                                  str(programs)], env=env, cwd=cache_dir, capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.splitlines()[-1]))
    return results


def report(results: list[dict]) -> str:
    """A row per case: MiB per program over all of them and over the second half (when the
    bounded caches, 16 steps and 64 kernels, are full), each also as a ratio to plain numba in a
    process without morphjit and in one with it."""
    plain = {r["case"]: r for r in results}
    lines = [f"{'case':32s} {'MiB per program':>16s} {'second half':>12s}   ratios: / numba, / numba (morphjit imported)"]
    for r in results:
        ratios = [f"{r[key] / plain[base][key]:.2f}" for key in ("bytes_per_program", "bytes_per_later_program")
                  for base in ("numba", "numba, morphjit imported")]
        lines.append(f"{r['case']:32s} {r['bytes_per_program'] / 2**20:16.2f} {r['bytes_per_later_program'] / 2**20:12.2f}"
                     f"   all {ratios[0]}, {ratios[1]}; second half {ratios[2]}, {ratios[3]}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=60)
    ap.add_argument("--morphjit", default="", help="a directory holding the morphjit package to measure")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.child:
        print(json.dumps(child(opts.child, opts.programs)))
        return
    results = measure(opts.programs, opts.morphjit)
    print("morphjit:", next(r["morphjit"] for r in results if r["morphjit"]))
    print(report(results))


if __name__ == "__main__":
    main()
