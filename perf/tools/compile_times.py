"""Derives the compile-time figures of perf/results/COMPILE_RESULTS.md (quoted in README's Performance).

A tool, since it reads internals: it splits the first call at the pipeline's stages in process CPU
time and counts the kernels compiled and reused. Its figures set the table-step threshold
(``MORPHJIT_TABLE_STEP``).

Compile time of generated steps against MLP depth (issue 5).

Run: .venv/bin/python perf/tools/compile_times.py [--depths 2,5,10,20] [--repeat 2] [--quick] [--morphjit DIR]
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
- the first call, split into the morphjit part (trace + vjp + passes + plan + codegen) and
  the numba part (exec of the source + first call of the step: typing, lowering, LLVM), against
  the size of the plan and of the source, and whether the numba part grows linearly with the
  instruction count. Every loop nest is a kernel of its own (``morphjit.runtime.kernels``: compiled once
  per text, shared by the layers and programs that run it); the kernels column counts the distinct
  ones of a step.

--stages (issue 19) profiles the first call of compile_loss per stage, in process CPU seconds, for
three families (relu MLP of 2-50 layers, a tanh recurrent model unrolled over 10-100 time steps, a
residual MLP of 10-30 blocks), in a fresh process (mode fresh), after compiling an unrelated
program (other) or the same model at another size (edit, the notebook edit cycle), side by side
with the first call of jax.jit(value_and_grad) and torch.compile(grad_and_value) of the same
functions (run by --peer-python; torch.compile with an empty inductor cache and the CPU time of the
C++ compiler it runs counted), and fits first call = fixed + per-instruction cost. Steps of
``MORPHJIT_TABLE_STEP`` instructions or more are tables of kernel calls (``morphjit.runtime.table``; the
step args column says "table"), whose own code is not compiled per program. Example:
  python perf/tools/compile_times.py --stages mlp:2 mlp:10 rnn:100 --modes fresh,edit --repeat 1
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEPTHS = (2, 5, 10, 20)
DTYPES = ("float32", "float64")
CHILD_ENV = {"MORPHJIT_CACHE": "0", "OPENBLAS_NUM_THREADS": "1", "NUMBA_DISABLE_JIT": "0",
             "TORCHINDUCTOR_COMPILE_THREADS": "1"}
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
    from morphjit.backend import render
    from morphjit.cache import load_module
    from morphjit.jit.checks import arg_spec
    from morphjit.jit.pipeline import compile_plan
    from morphjit.runtime import NativeStep

    fn, args = mlp(n_layers, dtype)
    t0 = CLOCK()
    plan = compile_plan(mj.grad_program(fn, *args))
    source, arguments = render(plan)
    t_mj = CLOCK() - t0
    _, leaves = arg_spec(fn, args, 0)
    t0 = CLOCK()
    module = load_module(source, name_hint="ct", cache=False)
    step = NativeStep(plan, module.step, arguments)
    step(*leaves)
    t_numba = CLOCK() - t0
    overloads = [] if step.table else list(step.kernel.overloads.values())   # a table step has none
    counts = plan.counts()
    _emit({"morphjit": t_mj, "numba": t_numba,
           "llvm": sum((o.metadata or {}).get("timers", {}).get("llvm_lock", float("nan")) for o in overloads),
           "instructions": len(plan.instructions), "nests": counts["loop"] + counts["reduce"],
           "gemms": counts["gemm"], "helpers": source.count("kernels.load(") + source.count("table.kernel("), "lines": source.count("\n"),
           "args": len(arguments)})


def child_e2e(n_layers: int, dtype: str) -> None:
    """The first call of mj.compile_loss as a user sees it (no split)."""
    import morphjit as mj
    fn, args = mlp(n_layers, dtype)
    loss = mj.compile_loss(fn, cache=False)
    t0 = CLOCK()
    loss(*args)
    _emit({"first_call": CLOCK() - t0})



# ---------------------------------------------------------------- the stage profile (issue 19)
# Three families of programs, each written once against an array namespace ``ns`` (morphjit
# itself, or perf.impls' JaxOps / TorchOps), so that every tool compiles the same function.

def mlp_family(ns, params, x, y):
    """relu MLP, mean softmax cross-entropy (params W0, b0, W1, b1, ...)."""
    h, n = x, len(params) // 2
    for i in range(n):
        h = h @ params[f"W{i}"] + params[f"b{i}"]
        if i < n - 1:
            h = ns.relu(h)
    return ns.mean(ns.softmax_cross_entropy(h, y))


def rnn_family(ns, params, x, y):
    """tanh recurrent model unrolled over the time axis of x (batch, steps, features)."""
    h = ns.tanh(x[:, 0, :] @ params["Wx"] + params["b"])
    for t in range(1, x.shape[1]):
        h = ns.tanh(x[:, t, :] @ params["Wx"] + h @ params["Wh"] + params["b"])
    return ns.mean(ns.softmax_cross_entropy(h @ params["Wo"], y))


def resmlp_family(ns, params, x, y):
    """Deep residual MLP: h + relu(h @ W + b) per block, then a linear head."""
    h = x @ params["Win"]
    for i in range((len(params) - 2) // 2):
        h = h + ns.relu(h @ params[f"W{i}"] + params[f"b{i}"])
    return ns.mean(ns.softmax_cross_entropy(h @ params["Wout"], y))


def family_data(family: str, size: int, dtype: str = "float32", batch: int = 32):
    """(params dict, (x, y)) of ``family`` at ``size`` (layers, time steps or blocks)."""
    import numpy as np
    rng = np.random.default_rng(size)

    def normal(*shape):
        return (rng.normal(size=shape) / math.sqrt(shape[0])).astype(dtype)

    if family == "mlp":
        sizes = [784] + [128] * (size - 1) + [10]
        params = {k: v for i, (a, b) in enumerate(zip(sizes, sizes[1:]))
                  for k, v in ((f"W{i}", normal(a, b)), (f"b{i}", np.zeros(b, dtype)))}
        x = rng.normal(size=(batch, 784)).astype(dtype)
    elif family == "rnn":
        params = {"Wx": normal(16, 64), "Wh": normal(64, 64), "b": np.zeros(64, dtype), "Wo": normal(64, 10)}
        x = rng.normal(size=(batch, size, 16)).astype(dtype)
    else:
        params = {"Win": normal(64, 128), "Wout": normal(128, 10)}
        for i in range(size):
            params[f"W{i}"], params[f"b{i}"] = normal(128, 128), np.zeros(128, dtype)
        x = rng.normal(size=(batch, 64)).astype(dtype)
    return params, (x, rng.integers(0, 10, batch))


FAMILIES = {"mlp": mlp_family, "rnn": rnn_family, "resmlp": resmlp_family}


def family_loss(family: str, ns):
    """``loss(params, x, y)`` of ``family`` written against ``ns``."""
    def loss(params, x, y):
        return FAMILIES[family](ns, params, x, y)
    loss.__name__ = loss.__qualname__ = f"{family}_loss"
    return loss
# What a process compiles first in mode "other" (unrelated kernels) and "edit" (the same model
# with another depth: the notebook edit cycle).
BEFORE = {"other": lambda family, size: ("rnn" if family != "rnn" else "mlp", 3),
          "edit": lambda family, size: (family, size + 1)}


class PassClock:
    """Wall seconds of numba's compilation phases, from its event stream: type inference, lowering
    to LLVM IR (numba's own Python), LLVM (optimisation, machine code, linking: the LLVM lock) and
    the rest (bytecode analysis, rewrites, cache files). Only the outermost compilation counts;
    what a callee compiles while the caller is typed is the caller's typing."""

    PHASES = {"nopython_type_inference": "typing", "native_lowering": "lowering"}

    def __init__(self):
        from numba.core import event
        self.event = event
        self.recorder = event.RecordingListener()
        self.kinds = ("numba:run_pass", "numba:llvm_lock", "numba:compile")

    def __enter__(self):
        for kind in self.kinds:
            self.event.register(kind, self.recorder)
        return self

    def __exit__(self, *exc):
        for kind in self.kinds:
            self.event.unregister(kind, self.recorder)

    def phases(self) -> dict:
        windows = {"typing": [], "lowering": [], "llvm": [], "numba": []}
        depth = {"numba:compile": 0, "numba:llvm_lock": 0}
        opened: dict = {}
        outer_pass = None
        for ts, ev in self.recorder.buffer:
            if ev.kind == "numba:run_pass":
                name = ev.data["name"].split(" [")[0]
                if depth["numba:compile"] == 1 and name in self.PHASES:
                    if ev.is_start and outer_pass is None:
                        outer_pass, opened["pass"] = name, ts
                    elif ev.is_end and outer_pass == name:
                        windows[self.PHASES[name]].append((opened["pass"], ts))
                        outer_pass = None
                continue
            depth[ev.kind] += 1 if ev.is_start else -1
            if ev.is_start and depth[ev.kind] == 1:
                opened[ev.kind] = ts
            elif ev.is_end and depth[ev.kind] == 0:
                windows["llvm" if ev.kind == "numba:llvm_lock" else "numba"].append((opened[ev.kind], ts))
        llvm = windows["llvm"]
        totals = {k: sum(b - a for a, b in w) for k, w in windows.items()}
        for phase in ("typing", "lowering"):    # LLVM work inside a phase counts as LLVM
            totals[phase] -= sum(max(0.0, min(b, d) - max(a, c)) for a, b in windows[phase] for c, d in llvm)
        totals["other"] = totals["numba"] - totals["typing"] - totals["lowering"] - totals["llvm"]
        return totals


def child_stages(family: str, size: int, mode: str) -> None:
    """One compilation of ``family`` at ``size`` by compile_loss (no disk cache), per stage, in a
    process that compiled nothing before (mode fresh) or another program (other, edit)."""
    t0 = time.perf_counter()
    import morphjit as mj
    imports = time.perf_counter() - t0
    if mode != "fresh":
        kind, n = BEFORE[mode](family, size)
        params, data = family_data(kind, n)
        mj.compile_loss(family_loss(kind, mj), cache=False)(params, *data)
    params, data = family_data(family, size)
    loss = mj.compile_loss(family_loss(family, mj), cache=False)
    with PassClock() as clock:
        t0, c0 = time.perf_counter(), CLOCK()
        loss(params, *data)
        first, wall = CLOCK() - c0, time.perf_counter() - t0
    step, _ = loss.step_for(params, *data)
    stages = step.timings.stages
    phases = {k: v * first / wall for k, v in clock.phases().items()}   # as shares of the CPU time
    _emit({"first": first, "imports": imports, **phases,
           "front": sum(stages.get(k, 0.0) for k in ("trace", "vjp", "passes")),
           "plan": stages.get("lower", 0.0) + stages.get("plan", 0.0), "codegen": stages.get("codegen", 0.0),
           "instructions": len(step.plan.instructions), "lines": step.source.count("\n"),
           "args": len(step.run.input_dtypes) + len(step.run.workspace_values) + len(step.run.output_buffers),
           "form": "table" if step.run.table else "unrolled",
           **{f"kernels_{k}": v for k, v in kernel_counts().items()}})


def kernel_counts() -> dict:
    """How many kernels this process compiled and reused so far (none before kernels were shared)."""
    try:
        from morphjit.runtime import kernels
    except ImportError:
        return {}
    return kernels.statistics()


def child_peer(tool: str, family: str, size: int, mode: str) -> None:
    """The first call of ``family`` under jax.jit(value_and_grad) or torch.compile(grad_and_value)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from perf import impls
    if tool == "jax":
        import jax
        ns = impls.JaxOps()

        def compiled(fn):
            step = jax.jit(jax.value_and_grad(fn))
            return lambda params, *data: jax.block_until_ready(step(params, *data))
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")   # an empty cache
        import torch
        torch.set_num_threads(1)
        ns = impls.TorchOps()

        def compiled(fn):
            step = torch.compile(torch.func.grad_and_value(fn))
            return lambda params, *data: step({k: torch.from_numpy(v) for k, v in params.items()},
                                              *map(torch.from_numpy, data))
    if mode != "fresh":
        kind, n = BEFORE[mode](family, size)
        params, data = family_data(kind, n)
        compiled(family_loss(kind, ns))(params, *data)
    params, data = family_data(family, size)
    step = compiled(family_loss(family, ns))
    t0 = cpu_with_children()
    step(params, *data)
    _emit({"first": cpu_with_children() - t0})


def cpu_with_children() -> float:
    """Process CPU seconds, counting the finished child processes (torch.compile runs a C++ compiler)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def spawn(*argv, python=sys.executable) -> dict:
    env = {**os.environ, **CHILD_ENV}
    if MORPHJIT_PATH:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [MORPHJIT_PATH, env.get("PYTHONPATH")]))
    proc = subprocess.run([python, os.path.abspath(__file__), "--child", *map(str, argv)],
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

STAGE_CASES = [("mlp", n) for n in (2, 5, 10, 20, 50)] + [("rnn", n) for n in (10, 30, 100)] + \
    [("resmlp", n) for n in (10, 30)]


def measure_stages(cases, modes, peers, peer_python) -> dict:
    """{(family, size, mode, tool): the child's result with the least first call over REPEAT rounds}."""
    best: dict = {}
    for _ in range(REPEAT):
        for family, size in cases:
            for mode in modes:
                runs = [("morphjit", lambda: spawn("stages", family, size, mode))]
                runs += [(tool, lambda tool=tool: spawn("peer", tool, family, size, mode, python=peer_python))
                         for tool in peers]
                for tool, run in runs:   # side by side: the tools take turns on the loaded machine
                    try:
                        r = run()
                    except RuntimeError as error:
                        print(f"[{tool} {family} {size} {mode} failed: {str(error).splitlines()[-1]}]")
                        continue
                    key = (family, size, mode, tool)
                    if key not in best or r["first"] < best[key]["first"]:
                        best[key] = r
    return best


def report_stages(cases, modes, peers, rows) -> None:
    print(f"\n## first call per stage (process CPU s, least of {REPEAT} processes; no disk cache)\n")
    print("front = trace + vjp + passes; plan = lower + plan; numba's phases from its event stream, in wall "
          "time scaled to the call's CPU time (typing includes callees typed meanwhile; LLVM = optimisation, "
          "machine code and linking; other = bytecode analysis, rewrites, kernel loading). Peers: "
          "jax.jit(value_and_grad) and torch.compile(grad_and_value), first call, process CPU s including "
          "finished child processes (torch.compile's C++ compiler), torch with an empty inductor cache.\n")
    print("| program | instr | mode | first call | front | plan | codegen | numba typing | numba lowering "
          "| LLVM | numba other | kernels compiled/reused | step args |"
          + "".join(f" {p} first call |" for p in peers))
    print("|---|---:|---|" + "---:|" * (10 + len(peers)))
    for family, size in cases:
        for mode in modes:
            r = rows.get((family, size, mode, "morphjit"))
            if r is None:
                continue
            kernels = f"{r.get('kernels_compiled', '-')}/{r.get('kernels_reused', '-')}"
            peer = [rows.get((family, size, mode, p), {}).get("first") for p in peers]
            print(f"| {family} {size} | {r['instructions']} | {mode} | {r['first']:.2f} | {r['front']:.3f} "
                  f"| {r['plan']:.3f} | {r['codegen']:.3f} | {r['typing']:.2f} | {r['lowering']:.2f} "
                  f"| {r['llvm']:.2f} | {r['other']:.2f} | {kernels} | {r['args']} {r.get('form', '')} |"
                  + "".join(" - |" if t is None else f" {t:.2f} |" for t in peer))
    for mode in modes:
        for family in dict.fromkeys(f for f, _ in cases):
            pts = [(rows[f, n, mode, "morphjit"]["instructions"], rows[f, n, mode, "morphjit"]["first"])
                   for f, n in cases if f == family and (f, n, mode, "morphjit") in rows]
            if len(pts) >= 2:
                a, b = fit_line(*zip(*pts))
                print(f"- {family}, {mode}: first call = {a:.2f} s + {1e3 * b:.1f} ms x instructions")



def fit_line(xs, ys):
    """Least-squares a, b of y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def report(depths, dtypes, fixed, rows):
    print(f"\n## first call, split (min over {REPEAT} fresh processes; CPU s)\n")
    print("| dtype | layers | instr | nests | GEMMs | kernels | lines | step args | morphjit s | numba s "
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
    ap.add_argument("--stages", nargs="*", metavar="FAMILY:SIZE", help="the per-stage profile of issue 19 "
                    "(default cases: " + " ".join(f"{f}:{n}" for f, n in STAGE_CASES) + ") instead of the depth sweep")
    ap.add_argument("--modes", default="fresh,other,edit", help="stages: fresh process, after another "
                    "program, after the same model at another size")
    ap.add_argument("--peers", default="jax,torch", help="stages: tools to compare (empty for none)")
    ap.add_argument("--peer-python", default="/work/wt/benchvenv/bin/python", help="the interpreter with jax, torch")
    ns = ap.parse_args()
    REPEAT = max(ns.repeat, 1)
    MORPHJIT_PATH = os.path.abspath(ns.morphjit) if ns.morphjit else ""
    if ns.child:
        kind, *rest = ns.child
        children = {"fixed": child_fixed, "args": lambda *c: child_args([int(n) for n in c]),
                    "compile": lambda n, dt: child_compile(int(n), dt), "e2e": lambda n, dt: child_e2e(int(n), dt),
                    "stages": lambda f, n, mode: child_stages(f, int(n), mode),
                    "peer": lambda tool, f, n, mode: child_peer(tool, f, int(n), mode)}
        return children[kind](*rest)
    depths = (2, 5, 10) if ns.quick else tuple(int(d) for d in ns.depths.split(","))
    dtypes = ("float32",) if ns.quick else DTYPES
    t0 = time.perf_counter()
    import numba
    import numpy
    print(f"numba {numba.__version__}, numpy {numpy.__version__}, python {sys.version.split()[0]}; "
          f"child env {CHILD_ENV}; {os.cpu_count()} CPUs")
    where = subprocess.run([sys.executable, "-c", "import morphjit; print(morphjit.__file__)"], text=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": MORPHJIT_PATH or os.environ.get("PYTHONPATH", "")},
                           cwd="/").stdout.strip()
    git = subprocess.run(["git", "-C", os.path.dirname(where), "log", "-1", "--format=%h"], text=True,
                         capture_output=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", os.path.dirname(where), "status", "--porcelain", "."], text=True,
                           capture_output=True).stdout.split()[1::2]
    print(f"morphjit measured: {where} (commit {git or '?'}"
          + (f", uncommitted changes in {', '.join(dirty)})" if dirty else ")"))
    if ns.stages is not None:
        cases = [(c.split(":")[0], int(c.split(":")[1])) for c in ns.stages] or STAGE_CASES
        modes, peers = ns.modes.split(","), [p for p in ns.peers.split(",") if p]
        report_stages(cases, modes, peers, measure_stages(cases, modes, peers, ns.peer_python))
        print(f"\ntotal {time.perf_counter() - t0:.0f} s wall")
        return
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
