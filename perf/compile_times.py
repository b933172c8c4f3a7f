"""Compile time of generated steps against MLP depth (issue 5).

Run: .venv/bin/python perf/compile_times.py [--depths 2,5,10,20] [--repeat 2] [--quick] [--morphjit DIR]
(about 2 minutes with the defaults). --morphjit DIR measures a frozen copy
(`git archive HEAD morphjit | tar -x -C DIR`) instead of the working tree, which other engineers
edit while this runs.

Every compile figure comes from a FRESH subprocess (MORPHJIT_CACHE=0, OPENBLAS_NUM_THREADS=1),
so numba's one-time costs (LLVM initialisation, first typing of np.dot, ...) count the same way in
every row; times are process CPU seconds (time.process_time), robust on a shared machine, and each
compile figure is the minimum over --repeat processes (one process can read 30% high).

Model: relu MLP with L weight layers (784 -> 128 x (L-1) -> 10), mean softmax cross-entropy,
batch 64, gradients of every weight and bias.

Measured:
- the fixed cost: import numba and compile one tiny njit function calling np.dot;
- the cost of step arguments: compile an empty step taking N arrays, flat or as one tuple;
- the first call, split into the morphjit part (trace + vjp + passes + plan + codegen.render) and
  the numba part (exec of the source + first call of the step: typing, lowering, LLVM), against
  the size of the plan and of the source, and whether the numba part grows linearly with the
  instruction count. The code generator itself emits a loop nest that occurs more than once as one
  shared ``@numba.njit`` helper (``def k0``, ``def k1``, ...) called from ``step``; the helper
  column counts them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

DEPTHS = (2, 5, 10, 20)
DTYPES = ("float32", "float64")
CHILD_ENV = {"MORPHJIT_CACHE": "0", "OPENBLAS_NUM_THREADS": "1", "NUMBA_DISABLE_JIT": "0"}
NJIT_OPTIONS = dict(fastmath={"nsz", "arcp", "contract", "afn", "reassoc"}, error_model="numpy",
                    boundscheck=False, nogil=True)
CLOCK = time.process_time
MORPHJIT_PATH = ""   # --morphjit: a directory holding the morphjit package to measure
REPEAT = 2           # --repeat: fresh processes per compile figure (minimum taken)


def mlp(n_layers: int, dtype: str, batch: int = 64, width: int = 128, n_in: int = 784, n_out: int = 10):
    """(loss, args) of an n-layer relu MLP with mean softmax cross-entropy."""
    import numpy as np
    import morphjit as mj

    rng = np.random.default_rng(n_layers)
    sizes = [n_in] + [width] * (n_layers - 1) + [n_out]
    params = [(rng.normal(scale=1 / math.sqrt(a), size=(a, b)).astype(dtype),
               rng.normal(scale=0.1, size=b).astype(dtype)) for a, b in zip(sizes, sizes[1:])]

    def loss(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < len(params) - 1:
                h = mj.relu(h)
        return mj.mean(mj.softmax_cross_entropy(h, y))

    x = rng.normal(size=(batch, n_in)).astype(dtype)
    y = rng.integers(0, n_out, batch)
    return loss, (params, x, y)


# ---------------------------------------------------------------- child processes

def _emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def child_fixed() -> None:
    """Import numba, compile one tiny njit function calling np.dot (the fixed one-time cost)."""
    t0 = CLOCK()
    import numpy as np
    import numba
    t1 = CLOCK()

    @numba.njit(**NJIT_OPTIONS)
    def tiny(a, b, c):
        np.dot(a, b, c)
        return 0

    @numba.njit(**NJIT_OPTIONS)
    def tiny2(a, b, c):
        np.dot(a, b.T, c)
        return 0

    a = np.ones((4, 4), np.float32)
    t2 = CLOCK()
    tiny(a, a, a.copy())
    t3 = CLOCK()
    tiny2(a, a, a.copy())
    t4 = CLOCK()
    import morphjit  # noqa: F401
    t5 = CLOCK()
    _emit({"import_numba": t1 - t0, "tiny": t3 - t2, "tiny2": t4 - t3, "import_morphjit": t5 - t4})


def child_args(counts) -> None:
    """Compile seconds of an empty step (same options) taking N flat 2-D arrays, or one tuple of them."""
    import numpy as np
    import numba
    from numba import typeof

    a = np.ones((4, 4), np.float32)
    numba.njit(**NJIT_OPTIONS)(lambda x, y, z: np.dot(x, y, z))(a, a, a.copy())    # warm: fixed cost paid
    res = {}
    for n in counts:
        names = ", ".join(f"v{i}" for i in range(n))
        ns: dict = {}
        exec(f"def flat({names}):\n    return 0\ndef tup(t):\n    return 0\n", ns)
        t0 = CLOCK()
        numba.njit(**NJIT_OPTIONS)(ns["flat"]).compile((typeof(a),) * n)
        t1 = CLOCK()
        numba.njit(**NJIT_OPTIONS)(ns["tup"]).compile((typeof((a,) * n),))
        res[n] = (t1 - t0, CLOCK() - t1)
    _emit(res)


def child_compile(n_layers: int, dtype: str) -> None:
    """The first call split into the morphjit part and the numba part, and the size of the step."""
    import morphjit as mj
    from morphjit import cache as disk_cache, codegen
    from morphjit.compiler import arg_spec
    from morphjit.pipeline import compile_plan
    from morphjit.runtime import NativeStep

    fn, args = mlp(n_layers, dtype)
    t0 = CLOCK()
    plan = compile_plan(mj.grad_program(fn, *args))
    source, arguments = codegen.render(plan)
    t_mj = CLOCK() - t0
    _, leaves = arg_spec(fn, args, 0)
    t0 = CLOCK()
    module = disk_cache.load_module(source, name_hint="ct", cache=False)
    step = NativeStep(plan, module.step, arguments)
    step(*leaves)
    t_numba = CLOCK() - t0
    (overload,) = step.kernel.overloads.values()
    counts = plan.counts()
    _emit({"morphjit": t_mj, "numba": t_numba,
           "llvm": (overload.metadata or {}).get("timers", {}).get("llvm_lock", float("nan")),
           "instructions": len(plan.instructions), "nests": counts["loop"] + counts["reduce"],
           "gemms": counts["gemm"], "helpers": source.count("\ndef k"), "lines": source.count("\n"),
           "args": len(arguments)})


def child_e2e(n_layers: int, dtype: str) -> None:
    """The first call of mj.compile_loss as a user sees it (no split)."""
    import morphjit as mj
    fn, args = mlp(n_layers, dtype)
    loss = mj.compile_loss(fn, cache=False)
    t0 = CLOCK()
    loss(*args)
    _emit({"first_call": CLOCK() - t0})


def spawn(*argv) -> dict:
    env = {**os.environ, **CHILD_ENV}
    if MORPHJIT_PATH:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [MORPHJIT_PATH, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *map(str, argv)],
                          capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"child {argv} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[-1][len("RESULT "):])


def measure_compiles(depths, dtypes) -> dict:
    """{(dtype, layers): compile child result}, the least numba time over REPEAT rounds of all cases."""
    best: dict = {}
    for _ in range(REPEAT):
        for dt in dtypes:
            for n in depths:
                r = spawn("compile", n, dt)
                if (dt, n) not in best or r["numba"] < best[dt, n]["numba"]:
                    best[dt, n] = r
    return best


# ---------------------------------------------------------------- the report

def fit_line(xs, ys):
    """Least-squares a, b of y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def report(depths, dtypes, fixed, rows):
    print(f"\n## first call, split (min over {REPEAT} fresh processes; CPU s)\n")
    print("| dtype | layers | instr | nests | GEMMs | helpers | lines | step args | morphjit s | numba s "
          "| LLVM s | numba-fixed s | numba ms/instr | (numba-fixed) ms/instr |")
    print("|---|" + "---:|" * 13)
    for dt in dtypes:
        for n in depths:
            r = rows[dt, n]
            net = r["numba"] - fixed
            print(f"| {dt} | {n} | {r['instructions']} | {r['nests']} | {r['gemms']} | {r['helpers']} "
                  f"| {r['lines']} | {r['args']} | {r['morphjit']:.3f} | {r['numba']:.2f} | {r['llvm']:.2f} "
                  f"| {net:.2f} | {1e3 * r['numba'] / r['instructions']:.1f} | {1e3 * net / r['instructions']:.1f} |")
    print("\nlinearity (numba part against instructions):")
    for dt in dtypes:
        ns = [rows[dt, n]["instructions"] for n in depths]
        ts = [rows[dt, n]["numba"] for n in depths]
        nets = [t - fixed for t in ts]
        marg = [1e3 * (t2 - t1) / (n2 - n1) for n1, n2, t1, t2 in zip(ns, ns[1:], ts, ts[1:])]
        a, b = fit_line(ns, ts)
        slope = fit_line([math.log(n) for n in ns], [math.log(max(t, 1e-9)) for t in nets])[1]
        line = (f"- {dt}: marginal ms/instr between depths {depths}: " + ", ".join(f"{m:.0f}" for m in marg)
                + f"; fit numba = {a:.2f} s + {1e3 * b:.0f} ms x instr; log-log slope of (numba-fixed) {slope:.2f}")
        if 2 in depths and 10 in depths:
            i2, i10 = depths.index(2), depths.index(10)
            line += (f"; 10/2 layers: numba x{ts[i10] / ts[i2]:.2f}, numba-fixed x{nets[i10] / nets[i2]:.2f}, "
                     f"instructions x{ns[i10] / ns[i2]:.2f}")
        print(line)


def main():
    global MORPHJIT_PATH, REPEAT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=REPEAT, help="fresh compile processes per figure (minimum taken)")
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    ap.add_argument("--quick", action="store_true", help="depths 2,5,10, float32 only")
    ap.add_argument("--morphjit", default="", help="measure the morphjit package in this directory "
                    "(e.g. a `git archive HEAD morphjit` snapshot) instead of the installed one")
    ns = ap.parse_args()
    REPEAT = max(ns.repeat, 1)
    MORPHJIT_PATH = os.path.abspath(ns.morphjit) if ns.morphjit else ""
    if ns.child:
        kind, *rest = ns.child
        children = {"fixed": child_fixed, "args": lambda *c: child_args([int(n) for n in c]),
                    "compile": lambda n, dt: child_compile(int(n), dt), "e2e": lambda n, dt: child_e2e(int(n), dt)}
        return children[kind](*rest)
    depths = (2, 5, 10) if ns.quick else tuple(int(d) for d in ns.depths.split(","))
    dtypes = ("float32",) if ns.quick else DTYPES
    t0 = time.perf_counter()
    import numba
    import numpy
    print(f"numba {numba.__version__}, numpy {numpy.__version__}, python {sys.version.split()[0]}; "
          f"child env {CHILD_ENV}; {os.cpu_count()} CPUs")
    where = subprocess.run([sys.executable, "-c", "import morphjit; print(morphjit.__file__)"], text=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": MORPHJIT_PATH or ""},
                           cwd="/").stdout.strip()
    git = subprocess.run(["git", "-C", os.path.dirname(where), "log", "-1", "--format=%h"], text=True,
                         capture_output=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", os.path.dirname(where), "status", "--porcelain", "."], text=True,
                           capture_output=True).stdout.split()[1::2]
    print(f"morphjit measured: {where} (commit {git or '?'}"
          + (f", uncommitted changes in {', '.join(dirty)})" if dirty else ")"))
    fx = spawn("fixed")
    fixed = fx["tiny"]
    print(f"\nfixed cost (fresh process): import numba {fx['import_numba']:.2f} s, first tiny njit with "
          f"np.dot {fx['tiny']:.2f} s, a second one (np.dot with .T) {fx['tiny2']:.2f} s, "
          f"import morphjit after numba {fx['import_morphjit']:.2f} s. 'fixed' below = {fixed:.2f} s.")
    counts = (10, 45, 85, 165)
    ar = spawn("args", *counts)
    print("\nempty step, same options, warm process: compile s by argument count: " + ", ".join(
        f"{n} flat {ar[str(n)][0]:.2f} / one tuple {ar[str(n)][1]:.2f}" for n in counts))
    rows = measure_compiles(depths, dtypes)
    report(depths, dtypes, fixed, rows)
    check = max(d for d in depths if d <= 10)
    e2e = spawn("e2e", check, "float32")
    r = rows["float32", check]
    print(f"\ncheck: mj.compile_loss first call at {check} layers float32 {e2e['first_call']:.2f} s vs split "
          f"morphjit {r['morphjit']:.2f} + numba {r['numba']:.2f} = {r['morphjit'] + r['numba']:.2f} s")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s wall")


if __name__ == "__main__":
    main()
