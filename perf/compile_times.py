"""Compile time of generated steps against depth, and a helper-function prototype (issue 5).

Run: .venv/bin/python perf/compile_times.py [--depths 2,5,10,20] [--variants ...] [--repeat 2]
         [--reps 200] [--quick] [--morphjit DIR]     (about 4.5 minutes with the defaults)
--morphjit DIR measures a frozen copy (`git archive HEAD morphjit | tar -x -C DIR`) instead of the
working tree, which other engineers edit while this runs.

Every compile figure comes from a FRESH subprocess (MORPHJIT_CACHE=0, OPENBLAS_NUM_THREADS=1),
so numba's one-time costs (LLVM initialisation, first typing of np.dot, ...) count the same way in
every row; times are process CPU seconds (time.process_time), robust on a shared machine.

Model: relu MLP with L weight layers (784 -> 128 x (L-1) -> 10), mean softmax cross-entropy,
batch 64, gradients of every weight and bias.

Part 1 splits the first call into the morphjit part (trace + vjp + passes + plan + codegen.render)
and the numba part (exec of the source + first call of the step: typing, lowering, LLVM), and
relates the numba part to the size of the plan. A separate process measures the fixed cost: import
numba and compile one tiny njit function calling np.dot.

Part 2 prototypes helpers without touching morphjit/: `with_helpers(source)` rewrites the rendered
source so that every loop nest (and optionally every GEMM statement) becomes a separate
``@numba.njit`` function with the step's options, identical nests (same text after renaming their
array arguments a0, a1, ...) are emitted once, and ``step`` calls them. Variants:
  inline        the source as codegen renders it
  helpers       loop nests as deduplicated helpers, loop bounds as constants
  shared        only nests that occur 2+ times become helpers; nests used once stay inline
  bounds        like helpers, but the range() bounds become int arguments of the helpers
  helpers+gemm  (optional) also each np.dot statement as a deduplicated helper
  packed        (optional) shared, and the pooled buffers are sliced out of one workspace
                buffer per dtype in the step instead of being arguments
Each compile figure is the minimum over --repeat fresh processes (the machine is shared: one
process can read 30% high).
Run time: median of --reps interleaved calls per variant in one process (process_time).
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
import math
import os
import statistics
import subprocess
import sys
import time

DEPTHS = (2, 5, 10, 20)
DTYPES = ("float32", "float64")
VARIANTS = ("inline", "helpers", "shared", "bounds")          # also: helpers+gemm, packed
CHILD_ENV = {"MORPHJIT_CACHE": "0", "OPENBLAS_NUM_THREADS": "1", "NUMBA_DISABLE_JIT": "0"}
CLOCK = time.process_time
MORPHJIT_PATH = ""   # --morphjit: a directory holding the morphjit package to measure


# ---------------------------------------------------------------- the model

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


# ---------------------------------------------------------------- the source transformation

_NOT_PARAMS = {"np", "numba", "math", "range", "abs", "min", "max", "bool", "int", "float", "len"}


def _is_gemm(stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "dot")


def _is_alias(stmt) -> bool:
    """`vK = vJ.reshape(...)`: a view, stays in the step."""
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "reshape")


def _is_fill(stmt) -> bool:
    """A loop nest that only stores expressions of no variable but the loop's (`v[i] = 0.0`)."""
    if not isinstance(stmt, ast.For):
        return False
    loop_vars, node = set(), stmt
    while isinstance(node, ast.For) and len(node.body) == 1:
        loop_vars.add(node.target.id)
        node = node.body[0]
    if isinstance(node, ast.For):
        return False
    return (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
            and {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} <= {"np"} | loop_vars)


def _stored(stmts) -> set[str]:
    return {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _names(stmts, ctx=ast.AST) -> list[str]:
    """Names (of context `ctx`) in order of first appearance in the text."""
    seen: dict[str, None] = {}

    def visit(node):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ctx):
            seen.setdefault(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for s in stmts:
        visit(s)
    return list(seen)


def segments(body, gemm: bool):
    """Split the step's top-level statements into ('keep', stmt) and ('kernel', [stmts]).

    A kernel is one loop nest with what codegen emits around it: leading fill loops and
    accumulator initialisations, and trailing statements that read its locals (a reduction's
    finish). With `gemm`, each np.dot statement is a kernel of its own.
    """
    out, cur, closed = [], None, False
    for stmt in body:
        top = _is_gemm(stmt) or _is_alias(stmt) or isinstance(stmt, ast.Return)
        if top:
            if cur:
                out.append(("kernel", cur))
            cur, closed = None, False
            out.append(("kernel", [stmt]) if gemm and _is_gemm(stmt) else ("keep", stmt))
            continue
        reads_locals = set(_names([stmt], ast.Load)) & _stored(cur or [])
        if cur and closed and (isinstance(stmt, ast.For) or not reads_locals):
            out.append(("kernel", cur))
            cur, closed = None, False
        cur = (cur or []) + [stmt]
        closed = closed or (isinstance(stmt, ast.For) and not _is_fill(stmt))
    if cur:
        out.append(("kernel", cur))
    return out


class _Rename(ast.NodeTransformer):
    def __init__(self, mapping, bounds: bool):
        self.mapping, self.bounds, self.bound_values = mapping, bounds, []

    def visit_Name(self, node):
        if node.id in self.mapping:
            return ast.copy_location(ast.Name(self.mapping[node.id], node.ctx), node)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if (self.bounds and isinstance(node.func, ast.Name) and node.func.id == "range"
                and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)):
            name = f"n{len(self.bound_values)}"
            self.bound_values.append(node.args[0].value)
            node.args[0] = ast.Name(name, ast.Load())
        return node


def with_helpers(source: str, gemm: bool = False, bounds: bool = False, min_uses: int = 1) -> str:
    """`source` with each loop nest (and with `gemm` each np.dot) moved into a deduplicated
    ``@numba.njit`` helper of the step's options, called from ``step``.

    Helpers are keyed by their text after renaming their free names to a0, a1, ... in order of
    first appearance (and, with `bounds`, their range() constants to arguments n0, n1, ...), named
    k0, k1, ... in order of first use. A kernel whose text occurs fewer than `min_uses` times
    stays inline in ``step``.
    """
    tree = ast.parse(source)
    (step,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "step"]
    decorator = "@" + ast.unparse(step.decorator_list[0])
    outer = {a.arg for a in step.args.args} | {s.targets[0].id for s in step.body if _is_alias(s)}
    items = []
    for kind, item in segments(step.body, gemm):
        if kind == "keep":
            items.append((None, [item], None, None))
            continue
        stored = _stored(item)
        free = [n for n in _names(item) if n not in stored]
        params = [n for n in free if n in outer]
        unknown = {n for n in free if n not in outer and n not in _NOT_PARAMS and not hasattr(builtins, n)}
        assert not unknown, f"kernel reads locals of another kernel: {unknown}"
        assert not stored & outer, f"kernel rebinds step variables: {stored & outer}"
        renamer = _Rename({p: f"a{k}" for k, p in enumerate(params)}, bounds)
        renamed = [renamer.visit(ast.parse(ast.unparse(s)).body[0]) for s in item]
        text = "\n".join(ast.unparse(ast.fix_missing_locations(s)) for s in renamed)
        formals = [f"a{k}" for k in range(len(params))] + [f"n{k}" for k in range(len(renamer.bound_values))]
        items.append((text, item, formals, params + [str(b) for b in renamer.bound_values]))
    uses: dict[str, int] = {}
    for text, *_ in items:
        uses[text] = uses.get(text, 0) + 1
    helpers: dict[str, str] = {}      # canonical body text -> helper name
    defs, body = [], []
    for text, item, formals, actuals in items:
        if text is None or uses[text] < min_uses:
            body += [line for s in item for line in ast.unparse(s).splitlines()]
            continue
        name = helpers.get(text)
        if name is None:
            name = helpers[text] = f"k{len(helpers)}"
            indented = "\n".join("    " + line for line in text.splitlines())
            defs.append(f"{decorator}\ndef {name}({', '.join(formals)}):\n{indented}\n")
        body.append(f"{name}({', '.join(actuals)})")
    head = [line for line in source.splitlines() if line.startswith("#")]
    head.append(f"# with_helpers(gemm={gemm}, bounds={bounds}, min_uses={min_uses}): {len(helpers)} helpers, "
                f"{sum(line.startswith('k') for line in body)} calls")
    args = ", ".join(a.arg for a in step.args.args)
    step_src = f"{decorator}\ndef step({args}):\n" + "\n".join("    " + line for line in body) + "\n"
    return "\n".join(head + ["import numpy as np", "import numba", "", ""] + defs + [step_src])


VARIANT_OPTIONS = {"helpers": {}, "shared": {"min_uses": 2}, "helpers+gemm": {"gemm": True},
                   "bounds": {"bounds": True}, "packed": {"min_uses": 2}}


def variant_source(source: str, variant: str) -> str:
    return source if variant == "inline" else with_helpers(source, **VARIANT_OPTIONS[variant])


def workspace_layout(plan, arguments, align: int = 64):
    """Offsets of the pool slots in one workspace buffer per dtype: {slot: (dtype name, offset)}."""
    import numpy as np
    layout, ends = {}, {}
    for k, slot in enumerate(plan.slots):
        dt = np.dtype(slot.dtype)
        step = max(align // dt.itemsize, 1)
        off = -(-ends.get(dt.name, 0) // step) * step
        layout[k] = (dt.name, off)
        ends[dt.name] = off + slot.size
    return layout, ends


def packed(source: str, plan, arguments) -> str:
    """`source` taking one workspace buffer per dtype instead of one argument per pooled value:
    the step slices and reshapes its pooled values out of the workspace on entry."""
    from morphjit.codegen import internal_shape
    layout, ends = workspace_layout(plan, arguments)
    tree = ast.parse(source)
    (step,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "step"]
    names = [a.arg for a in step.args.args]
    assert len(names) == len(arguments)
    keep, prologue = [], []
    for name, v in zip(names, arguments):
        if id(v) not in plan.slot_of:
            keep.append(name)
            continue
        dt, off = layout[plan.slot_of[id(v)]]
        shape = internal_shape(v.shape)
        n = max(math.prod(v.shape), 1)
        view = f"ws_{dt}[{off}:{off + n}]"
        prologue.append(f"{name} = {view}" if len(shape) == 1 else f"{name} = {view}.reshape({shape!r})")
    n_out = len(plan.outputs)
    params = keep[:len(keep) - n_out] + [f"ws_{dt}" for dt in ends] + keep[len(keep) - n_out:]
    lines = source.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("def step("))
    lines[at] = f"def step({', '.join(params)}):"
    return "\n".join(lines[:at + 1] + ["    " + p for p in prologue] + lines[at + 1:]) + "\n"


def packed_step(plan, source, arguments, tag):
    """A NativeStep whose fixed middle arguments are the constants and the workspace buffers."""
    import numpy as np
    step = _native(plan, packed(variant_source(source, "packed"), plan, arguments), arguments, tag)
    _, ends = workspace_layout(plan, arguments)
    consts = {id(v) for v, _ in plan.consts}
    n_in = len(plan.inputs)
    middle = arguments[n_in:len(arguments) - len(plan.outputs)]
    step.fixed = [f for v, f in zip(middle, step.fixed) if id(v) in consts] + \
        [np.zeros(n, dt) for dt, n in ends.items()]
    return step


def make_step(plan, source, arguments, variant, tag):
    if variant == "packed":
        return packed_step(plan, source, arguments, tag)
    return _native(plan, variant_source(source, variant), arguments, tag)


# ---------------------------------------------------------------- child processes

def _emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def child_fixed() -> None:
    """Import numba, compile one tiny njit function calling np.dot (the fixed one-time cost)."""
    t0 = CLOCK()
    import numpy as np
    import numba
    t1 = CLOCK()

    @numba.njit(fastmath={"nsz", "arcp", "contract", "afn", "reassoc"}, error_model="numpy",
                boundscheck=False, nogil=True)
    def tiny(a, b, c):
        np.dot(a, b, c)
        return 0

    @numba.njit(fastmath={"nsz", "arcp", "contract", "afn", "reassoc"}, error_model="numpy",
                boundscheck=False, nogil=True)
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

    opts = dict(fastmath={"nsz", "arcp", "contract", "afn", "reassoc"}, error_model="numpy",
                boundscheck=False, nogil=True)
    a = np.ones((4, 4), np.float32)
    numba.njit(**opts)(lambda x, y, z: np.dot(x, y, z))(a, a, a.copy())    # warm: fixed cost paid
    res = {}
    for n in counts:
        names = ", ".join(f"v{i}" for i in range(n))
        ns: dict = {}
        exec(f"def flat({names}):\n    return 0\ndef tup(t):\n    return 0\n", ns)
        t0 = CLOCK()
        numba.njit(**opts)(ns["flat"]).compile((typeof(a),) * n)
        t1 = CLOCK()
        numba.njit(**opts)(ns["tup"]).compile((typeof((a,) * n),))
        res[n] = (t1 - t0, CLOCK() - t1)
    _emit(res)


def _build(n_layers, dtype):
    """Plan, rendered source, argument order and flat leaves; seconds of the morphjit part."""
    import morphjit as mj
    from morphjit import codegen
    from morphjit.compiler import arg_spec, compile_plan

    fn, args = mlp(n_layers, dtype)
    t0 = CLOCK()
    plan = compile_plan(mj.grad_program(fn, *args))
    source, arguments = codegen.render(plan)
    t_mj = CLOCK() - t0
    _, leaves = arg_spec(fn, args, 0)
    return plan, source, arguments, leaves, t_mj


def _native(plan, source, arguments, tag):
    from morphjit import cache as disk_cache
    from morphjit.runtime import NativeStep

    module = disk_cache.load_module(source, name_hint=tag, cache=False)
    return NativeStep(plan, module.step, arguments)


def child_compile(n_layers: int, dtype: str, variant: str) -> None:
    t0 = CLOCK()
    import numpy  # noqa: F401
    import morphjit  # noqa: F401  (imports numba)
    t_import = CLOCK() - t0
    plan, source, arguments, leaves, t_mj = _build(n_layers, dtype)
    t0 = CLOCK()
    src = variant_source(source, variant)
    t_transform = CLOCK() - t0
    step = make_step(plan, source, arguments, variant, f"ct_{variant.replace('+', '_')}")
    t0 = CLOCK()
    step(*leaves)
    t_numba = CLOCK() - t0
    counts = plan.counts()
    timers = {}
    for ov in step.kernel.overloads.values():
        timers = {k: v for k, v in (ov.metadata or {}).get("timers", {}).items()}
    _emit({"layers": n_layers, "dtype": dtype, "variant": variant, "import": t_import, "morphjit": t_mj,
           "transform": t_transform, "numba": t_numba, "timers": timers,
           "instructions": len(plan.instructions), "nests": counts.get("loop", 0) + counts.get("reduce", 0),
           "gemms": counts.get("gemm", 0), "lines": src.count("\n"), "args": len(arguments),
           "step_args": len(step.fixed) + len(plan.inputs) + len(plan.outputs),
           "helpers": src.count("\ndef k"), "inline_lines": source.count("\n")})


def child_e2e(n_layers: int, dtype: str) -> None:
    """The first call of mj.compile_loss as a user sees it (no split)."""
    import morphjit as mj
    fn, args = mlp(n_layers, dtype)
    loss = mj.compile_loss(fn, cache=False)
    t0 = CLOCK()
    loss(*args)
    _emit({"layers": n_layers, "dtype": dtype, "first_call": CLOCK() - t0})


def child_run(n_layers: int, dtype: str, variants, reps: int) -> None:
    """Interleaved median process seconds per step call of each variant, and their agreement."""
    import numpy as np
    plan, source, arguments, leaves, _ = _build(n_layers, dtype)
    steps = {v: make_step(plan, source, arguments, v, f"rt_{v.replace('+', '_')}") for v in variants}
    ref = steps["inline"](*leaves)
    err = {}
    for v, s in steps.items():
        out = s(*leaves)
        err[v] = max(float(np.max(np.abs(o - r)) / (np.max(np.abs(r)) + 1e-30)) for o, r in zip(out, ref))
    samples = {v: [] for v in steps}
    for _ in range(5):                         # warm-up
        for s in steps.values():
            s(*leaves)
    for _ in range(reps):
        for v, s in steps.items():
            t0 = CLOCK()
            s(*leaves)
            samples[v].append(CLOCK() - t0)
    _emit({"layers": n_layers, "dtype": dtype, "err": err,
           "run": {v: statistics.median(x) for v, x in samples.items()}})


REPEAT = 2


def measure_compiles(depths, dtypes, helper_dtypes, variants) -> dict:
    """{(dtype, layers, variant): compile child result}, the least numba time over REPEAT rounds.

    Each round runs every case once, variants of one depth back to back, so that the variants
    being compared see the same load of the shared machine.
    """
    best: dict = {}
    for _ in range(REPEAT):
        for dt in dtypes:
            for n in depths:
                for v in variants if dt in helper_dtypes else ["inline"]:
                    r = spawn("compile", n, dt, v)
                    if (dt, n, v) not in best or r["numba"] < best[dt, n, v]["numba"]:
                        best[dt, n, v] = r
    return best


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


# ---------------------------------------------------------------- the report

def fit_line(xs, ys):
    """Least-squares a, b of y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def loglog_slope(xs, ys):
    return fit_line([math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys])[1]


def part1(depths, dtypes, fixed, compiles):
    print(f"\n## 1. first call, split (min over {REPEAT} fresh processes; CPU s)\n")
    print("| dtype | layers | instr | nests | GEMMs | lines | args | morphjit s | numba s | LLVM s "
          "| numba-fixed s | numba ms/instr | (numba-fixed) ms/instr |")
    print("|---|" + "---:|" * 12)
    rows = {}
    for dt in dtypes:
        for n in depths:
            r = rows[dt, n] = compiles[dt, n, "inline"]
            net = r["numba"] - fixed
            print(f"| {dt} | {n} | {r['instructions']} | {r['nests']} | {r['gemms']} | {r['lines']} | {r['args']} "
                  f"| {r['morphjit']:.3f} | {r['numba']:.2f} | {r['timers'].get('llvm_lock', float('nan')):.2f} "
                  f"| {net:.2f} | {1e3 * r['numba'] / r['instructions']:.1f} "
                  f"| {1e3 * net / r['instructions']:.1f} |")
    print("\nlinearity (numba part against instructions):")
    for dt in dtypes:
        ns = [rows[dt, n]["instructions"] for n in depths]
        ts = [rows[dt, n]["numba"] for n in depths]
        nets = [t - fixed for t in ts]
        marg = [1e3 * (t2 - t1) / (n2 - n1) for n1, n2, t1, t2 in zip(ns, ns[1:], ts, ts[1:])]
        a, b = fit_line(ns, ts)
        line = f"- {dt}: marginal ms/instr between depths {depths}: " + ", ".join(f"{m:.0f}" for m in marg)
        line += f"; fit numba = {a:.2f} s + {1e3 * b:.0f} ms x instr; log-log slope of (numba-fixed) {loglog_slope(ns, nets):.2f}"
        if 2 in depths and 10 in depths:
            i2, i10 = depths.index(2), depths.index(10)
            line += (f"; 10/2 layers: numba x{ts[i10] / ts[i2]:.2f}, numba-fixed x{nets[i10] / nets[i2]:.2f}, "
                     f"instructions x{ns[i10] / ns[i2]:.2f}")
        print(line)
    return rows


def part2(depths, dtypes, variants, reps, compiles, fixed):
    print(f"\n## 2. helpers prototype (compile: min over {REPEAT} fresh processes; run: median of {reps} interleaved calls, CPU us)\n")
    print("| dtype | layers | variant | helpers | lines | step args | numba s | vs inline | run us | vs inline "
          "| max rel diff |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = {}
    for dt in dtypes:
        for n in depths:
            comp = {v: compiles[dt, n, v] for v in variants}
            run = spawn("run", n, dt, reps, *variants)
            out[dt, n] = comp, run
            for v in variants:
                c, t = comp[v], run["run"][v]
                print(f"| {dt} | {n} | {v} | {c['helpers']} | {c['lines']} | {c['step_args']} | {c['numba']:.2f} "
                      f"| {c['numba'] / comp['inline']['numba']:.2f} | {1e6 * t:.0f} "
                      f"| {t / run['run']['inline']:.2f} | {run['err'][v]:.1e} |")
    print("\nlinearity per variant ((numba - fixed) ms per instruction at each depth; marginal ms/instr "
          "between depths):")
    for dt in dtypes:
        for v in variants:
            ns = [out[dt, n][0][v]["instructions"] for n in depths]
            ts = [out[dt, n][0][v]["numba"] for n in depths]
            per = [1e3 * (t - fixed) / i for t, i in zip(ts, ns)]
            marg = [1e3 * (t2 - t1) / (n2 - n1) for n1, n2, t1, t2 in zip(ns, ns[1:], ts, ts[1:])]
            ratio = ""
            if 2 in depths and 10 in depths:
                i2, i10 = depths.index(2), depths.index(10)
                ratio = (f"; 10/2 layers: numba-fixed x{(ts[i10] - fixed) / (ts[i2] - fixed):.2f} "
                         f"for instructions x{ns[i10] / ns[i2]:.2f}")
            print(f"- {dt} {v}: per instr " + ", ".join(f"{p:.0f}" for p in per)
                  + "; marginal " + ", ".join(f"{m:.0f}" for m in marg) + ratio)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=200, help="run-time samples per variant")
    ap.add_argument("--repeat", type=int, default=2, help="fresh compile processes per figure (minimum taken)")
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    ap.add_argument("--helper-dtypes", default="float32", help="dtypes of part 2 (comma-separated)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="depths 2,5,10, float32 only")
    ap.add_argument("--morphjit", default="", help="measure the morphjit package in this directory "
                    "(e.g. a `git archive HEAD morphjit` snapshot) instead of the installed one")
    ns = ap.parse_args()
    global MORPHJIT_PATH, REPEAT
    REPEAT = max(ns.repeat, 1)
    MORPHJIT_PATH = os.path.abspath(ns.morphjit) if ns.morphjit else ""
    if ns.child:
        kind, *rest = ns.child
        if kind == "fixed":
            return child_fixed()
        if kind == "compile":
            return child_compile(int(rest[0]), rest[1], rest[2])
        if kind == "e2e":
            return child_e2e(int(rest[0]), rest[1])
        if kind == "args":
            return child_args([int(n) for n in rest])
        if kind == "run":
            return child_run(int(rest[0]), rest[1], rest[3:], int(rest[2]))
        raise SystemExit(f"unknown child {kind}")
    depths = (2, 5, 10) if ns.quick else tuple(int(d) for d in ns.depths.split(","))
    dtypes = ("float32",) if ns.quick else DTYPES
    variants = ["inline"] + [v for v in ns.variants.split(",") if v != "inline"]
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
    helper_dtypes = ("float32",) if ns.quick else tuple(ns.helper_dtypes.split(","))
    compiles = measure_compiles(depths, dtypes, helper_dtypes, variants)
    rows = part1(depths, dtypes, fixed, compiles)
    check = max(d for d in depths if d <= 10)
    e2e = spawn("e2e", check, "float32")
    r = rows["float32", check]
    print(f"\ncheck: mj.compile_loss first call at {check} layers float32 {e2e['first_call']:.2f} s vs split "
          f"morphjit {r['morphjit']:.2f} + numba {r['numba']:.2f} = {r['morphjit'] + r['numba']:.2f} s")
    part2(depths, helper_dtypes, variants, ns.reps, compiles, fixed)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s wall")


if __name__ == "__main__":
    main()
