"""Derives the numba options of generated code (``FASTMATH``, ``JIT`` in morphjit/backend/codegen/writer.py).

Facts the code generator's design depends on, measured around the hand-written MLP step
(``perf/handwritten.py``): compile time against depth, element-wise kernels by literal dtype,
fast-math sets and NaN propagation, call overhead by argument form.

Run: .venv/bin/python -m perf.tools.facts_handwritten [--reps N]
Alternatives are timed side by side in one process, interleaved; figures are medians.
BLAS runs single-threaded unless OPENBLAS_NUM_THREADS is set. Single-threaded, times are process
CPU time, which leaves out the time the process waits for a core on a shared machine.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
import timeit  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from perf import handwritten as hw  # noqa: E402

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
CLOCK = time.process_time if os.environ["OPENBLAS_NUM_THREADS"] == "1" else time.perf_counter
FASTMATH_SETS = {"none": False, "nsz,arcp,contract,afn,reassoc": set(hw.FASTMATH), "True": True}


# ---------------------------------------------------------------- timing helpers

def bench(cases, reps, target=1e-3):
    """Interleaved median seconds per call of {name: callable or timeit.Timer}."""
    timers = {k: v if isinstance(v, timeit.Timer) else timeit.Timer(v, timer=CLOCK)
              for k, v in cases.items()}
    numbers = {k: _calibrate(t, target) for k, t in timers.items()}
    samples = {k: [] for k in timers}
    for _ in range(reps):
        for k, t in timers.items():
            samples[k].append(t.timeit(numbers[k]) / numbers[k])
    return {k: statistics.median(v) for k, v in samples.items()}


def _calibrate(timer, target):
    """Calls per sample so that one sample lasts about `target` seconds."""
    n = 1
    while timer.timeit(n) < target and n < 1 << 20:
        n *= 2
    return n


def first_call(fn, *args):
    """Seconds taken by the first (compiling) call of a numba dispatcher."""
    t0 = CLOCK()
    fn(*args)
    return CLOCK() - t0


def step_args(p):
    """The hand-written step's argument tuple for a problem."""
    (Ws, bs), (x, y), w = p.params, p.data, p.work
    return (x, y, Ws, bs, w.hs, w.ds, w.gWs, w.gbs)


def us(sec):
    return f"{sec * 1e6:9.1f}"


# ---------------------------------------------------------------- main table

def table(reps):
    """Cold compile and per-step medians: hand-written vs NumPy vs GEMM floor."""
    print("\n## step: compile (s), median us/step, ratios")
    print(f"{'model':7} {'dtype':7} {'compile':>7} {'numba':>9} {'numpy':>9} {'gemm':>9}"
          f" {'np/nb':>6} {'nb/gemm':>7}")
    for name, (sizes, batch, act) in hw.MODELS.items():
        for dt in (F32, F64):
            p = hw.make_problem(sizes, batch, act, dt)
            step = hw.build_step(act, dt)
            args = step_args(p)
            comp = first_call(step, *args)
            t = bench({"numba": lambda: step(*args), "numpy": lambda: hw.run_numpy(p),
                       "gemm": lambda: hw.run_gemm_floor(p)},
                      reps if name != "medium" else max(20, reps // 5))
            print(f"{name:7} {dt.name:7} {comp:7.2f} {us(t['numba'])} {us(t['numpy'])}"
                  f" {us(t['gemm'])} {t['numpy'] / t['numba']:6.2f} {t['numba'] / t['gemm']:7.2f}")


# ---------------------------------------------------------------- a. compile time vs body size

TEMPLATES = {
    "bias_relu": ("h, b", "", """\
for i in range(h.shape[0]):
    for j in range(h.shape[1]):
        v = h[i, j] + b[j]
        h[i, j] = 0.0 if v < 0.0 else v
"""),
    "softmax_ce": ("z, b, y, g, gb", "loss", """\
for j in range(z.shape[1]):
    gb[j] = 0.0
loss = 0.0
for i in range(z.shape[0]):
    m = z[i, 0] + b[0]
    for j in range(z.shape[1]):
        v = z[i, j] + b[j]
        z[i, j] = v
        m = max(m, v)
    s = 0.0
    for j in range(z.shape[1]):
        e = math.exp(z[i, j] - m)
        g[i, j] = e
        s += e
    yi = y[i]
    loss += math.log(s) + m - z[i, yi]
    r = 1.0 / (s * z.shape[0])
    for j in range(z.shape[1]):
        v = g[i, j] * r
        if j == yi:
            v -= 1.0 / z.shape[0]
        g[i, j] = v
        gb[j] += v
loss /= z.shape[0]
"""),
    "relu_bwd": ("dp, h, gb", "", """\
for j in range(dp.shape[1]):
    gb[j] = 0.0
for i in range(dp.shape[0]):
    for j in range(dp.shape[1]):
        v = dp[i, j] if h[i, j] > 0.0 else 0.0
        dp[i, j] = v
        gb[j] += v
"""),
}


def _loop(kind, names, mode):
    """One loop nest: inline (names substituted), a call of its helper, or nothing ("dots")."""
    params, ret, body = TEMPLATES[kind]
    if mode == "dots":
        return f"{ret} = 0.0\n" if ret else ""
    if mode == "helpers":
        call = f"{kind}({', '.join(names)})"
        return f"{ret} = {call}\n" if ret else call + "\n"
    for formal, actual in sorted(zip(params.split(", "), names), key=lambda fa: -len(fa[0])):
        body = _rename(body, formal, actual)
    return body


def _rename(src, old, new):
    """Replace identifier `old` by `new` in template source (whole words only)."""
    return re.sub(rf"\b{old}\b", new, src)


def _helper_defs(opts):
    """Source of the @njit helpers, one per loop kind."""
    out = []
    for kind, (params, ret, body) in TEMPLATES.items():
        tail = f"    return {ret}\n" if ret else ""
        out.append(f"@njit({opts})\ndef {kind}({params}):\n{textwrap.indent(body, '    ')}{tail}")
    return "\n".join(out)


def mlp_source(n_layers, mode, opts="fastmath=FM, error_model='numpy'"):
    """Source of an n-layer relu MLP step (float64) as ONE function.

    mode: "inline" (all loops in the body), "helpers" (one @njit helper per loop kind),
    "dots" (the GEMMs alone).
    """
    L = n_layers
    names = {k: [f"{k}{l}" for l in range(L)] for k in ("W", "b", "h", "d", "gW", "gb")}
    args = ["x", "y"] + sum(names.values(), [])
    prev = ["x"] + names["h"][:-1]
    body = []
    for l in range(L - 1):
        body.append(f"np.dot({prev[l]}, W{l}, h{l})\n")
        body.append(_loop("bias_relu", [f"h{l}", f"b{l}"], mode))
    body.append(f"np.dot({prev[L - 1]}, W{L - 1}, h{L - 1})\n")
    body.append(_loop("softmax_ce", [f"h{L - 1}", f"b{L - 1}", "y", f"d{L - 1}", f"gb{L - 1}"],
                      mode))
    for l in range(L - 1, -1, -1):
        body.append(f"np.dot({prev[l]}.T, d{l}, gW{l})\n")
        if l > 0:
            body.append(f"np.dot(d{l}, W{l}.T, d{l - 1})\n")
            body.append(_loop("relu_bwd", [f"d{l - 1}", f"h{l - 1}", f"gb{l - 1}"], mode))
    body.append("return loss\n")
    head = "import math\nimport numpy as np\nfrom numba import njit\n\n"
    helper_src = _helper_defs(opts) + "\n" if mode == "helpers" else ""
    step = f"@njit({opts})\ndef step({', '.join(args)}):\n{textwrap.indent(''.join(body), '    ')}"
    return head + helper_src + step


def load_step(src):
    """Exec generated source in a fresh namespace; returns its (uncompiled) `step` dispatcher."""
    ns = {"FM": set(hw.FASTMATH)}
    exec(compile(src, "<generated>", "exec"), ns)
    return ns["step"]


def flat_args(p):
    """Flat argument list of the generated step: x, y, W*, b*, h*, d*, gW*, gb*."""
    (Ws, bs), (x, y), w = p.params, p.data, p.work
    return (x, y, *Ws, *bs, *w.hs, *w.ds, *w.gWs, *w.gbs)


def fact_a(reps):
    """Compile seconds and step time: inline vs helpers vs hand-written tuple loop vs GEMMs only."""
    print("\n## a. compile time vs depth (relu, width 64, batch 32, f64; args = 2 + 6 * layers)")
    cols = ("inline", "helpers", "tuple", "dots")
    print(f"{'layers':>6} {'lines':>5} | compile s: " + " ".join(f"{c:>7}" for c in cols)
          + " | us/step: " + " ".join(f"{c:>7}" for c in cols[:3]))
    for n in (2, 5, 10, 20):
        p = hw.make_problem([64] * n + [10], 32, "relu", F64)
        src = mlp_source(n, "inline")
        steps = {"inline": load_step(src), "helpers": load_step(mlp_source(n, "helpers")),
                 "tuple": hw.build_step("relu", F64), "dots": load_step(mlp_source(n, "dots"))}
        argsets = {k: step_args(p) if k == "tuple" else flat_args(p) for k in steps}
        comp = {k: first_call(f, *argsets[k]) for k, f in steps.items()}
        want = hw.run_numpy(p)[0]
        steps.pop("dots")
        for k, f in steps.items():
            assert abs(f(*argsets[k]) - want) < 1e-9, k
        t = bench({k: (lambda f=f, a=argsets[k]: f(*a)) for k, f in steps.items()}, reps // 2)
        print(f"{n:6} {src.count(chr(10)):5} |            "
              + " ".join(f"{comp[k]:7.2f}" for k in cols) + " |          "
              + " ".join(f"{t[k] * 1e6:7.1f}" for k in steps))


# ---------------------------------------------------------------- b. f32 math and literal typing

def _ew(expr, setup=""):
    """An njit element-wise kernel out[i, j] = expr(a[i, j]) with optional hoisted setup."""
    src = (f"def k(a, out):\n    {setup or 'pass'}\n"
           "    for i in range(a.shape[0]):\n        for j in range(a.shape[1]):\n"
           f"            x = a[i, j]\n            out[i, j] = {expr}\n")
    ns = {"math": math, "np": np}
    exec(src, ns)
    return njit(fastmath=set(hw.FASTMATH), error_model="numpy")(ns["k"])


TANH_EXP = "math.copysign((1 - math.exp(-2 * abs(x))) / (1 + math.exp(-2 * abs(x))), x)"
B_KERNELS = {
    # name: (literal expr, f32-hoisted setup, hoisted expr)
    "tanh": ("math.tanh(x)", "", "math.tanh(x)"),
    "tanh via exp": (TANH_EXP, "c1 = np.float32(1.0); c2 = np.float32(-2.0)",
                     TANH_EXP.replace("1 ", "c1 ").replace("-2", "c2")),
    "exp": ("math.exp(x)", "", "math.exp(x)"),
    "x*0.5+1": ("x * 0.5 + 1", "c5 = np.float32(0.5); c1 = np.float32(1.0)", "x * c5 + c1"),
    "x*(1-x*x)": ("x * (1 - x * x)", "c1 = np.float32(1.0)", "x * (c1 - x * x)"),
    "gelu": ("0.5 * x * (1.0 + math.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))",
             "c5 = np.float32(0.5); c1 = np.float32(1.0); ca = np.float32(0.7978845608); "
             "cb = np.float32(0.044715)",
             "c5 * x * (c1 + math.tanh(ca * (x + cb * x * x * x)))"),
}


def _max_rel_err_eps(got, want):
    """Largest relative error of `got` against float64 `want`, in units of got's epsilon."""
    err = np.abs(got.astype(F64) - want) / np.maximum(np.abs(want), np.finfo(F64).tiny)
    return float(err.max() / np.finfo(got.dtype).eps)


def fact_b(reps):
    """ns/element of f32 math with float literals, f32-hoisted literals, f64, and NumPy."""
    typer = njit(lambda x: (x * 0.5, 1 - x, x * np.float32(0.5)))
    typer.compile("(float32,)")
    print("\n## b. element-wise kernels, 256x512 standard normal input, ns/element")
    print("   numba typing, x float32: (x*0.5, 1-x, x*np.float32(0.5)) -> "
          f"{typer.nopython_signatures[0].return_type}")
    rng = np.random.default_rng(0)
    a64 = rng.standard_normal((256, 512))
    a32 = a64.astype(F32)
    o32, o64 = np.empty_like(a32), np.empty_like(a64)
    print(f"{'kernel':>13} {'f32 literal':>12} {'f32 hoisted':>12} {'f64':>8}")
    kernels = {}
    for name, (lit, setup, hoisted) in B_KERNELS.items():
        k_lit, k_hoist = kernels[name] = _ew(lit), _ew(hoisted, setup)
        cases = {"f32 literal": lambda: k_lit(a32, o32), "f32 hoisted": lambda: k_hoist(a32, o32),
                 "f64": lambda: k_lit(a64, o64)}
        t = bench(cases, reps)
        print(f"{name:>13} " + " ".join(f"{t[c] / a32.size * 1e9:12.2f}" for c in cases))
    for ufunc in (np.tanh, np.exp):
        t = bench({"f32": lambda: ufunc(a32, out=o32), "f64": lambda: ufunc(a64, out=o64)}, reps)
        print(f"{'numpy ' + ufunc.__name__:>13} {t['f32'] / a32.size * 1e9:12.2f} {'':12}"
              f" {t['f64'] / a32.size * 1e9:8.2f}")
    want64, want32 = np.tanh(a64), np.tanh(a32.astype(F64))
    for name in ("tanh", "tanh via exp"):
        k_lit, k_hoist = kernels[name]
        k_lit(a64, o64)
        k_hoist(a32, o32)
        print(f"   {name}: max relative error f64 {_max_rel_err_eps(o64, want64):.1f} eps,"
              f" f32 {_max_rel_err_eps(o32, want32):.1f} eps")


# ---------------------------------------------------------------- c, e: loops under options

def loop_kernels(dt, act):
    """Python (not yet jitted) fused loops of the step for one dtype and hidden activation."""
    DT = np.dtype(dt).type
    TANH = act == "tanh"

    def bias_act(h, b):
        zero = DT(0.0)
        for i in range(h.shape[0]):
            for j in range(h.shape[1]):
                v = h[i, j] + b[j]
                h[i, j] = math.tanh(v) if TANH else (zero if v < zero else v)

    def act_bwd_colsum(dp, h, gb):
        zero, one = DT(0.0), DT(1.0)
        for j in range(dp.shape[1]):
            gb[j] = zero
        for i in range(dp.shape[0]):
            for j in range(dp.shape[1]):
                hv = h[i, j]
                v = dp[i, j] * (one - hv * hv) if TANH else (dp[i, j] if hv > zero else zero)
                dp[i, j] = v
                gb[j] += v

    return {f"bias+{act}": bias_act, f"{act}_bwd+colsum": act_bwd_colsum}


def common_kernels(dt):
    """Python loops independent of the activation: a division and a scalar reduction."""
    DT = np.dtype(dt).type

    def divide(a, s, out):
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                out[i, j] = a[i, j] / s[j]

    def sum_squares(a):
        acc = DT(0.0)
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                acc += a[i, j] * a[i, j]
        return acc

    return {"a/s[j] (division)": divide, "sum(a*a) (reduction)": sum_squares}


def _kernel_args(name, dt, rng):
    """Arguments (256x512 work) for one loop kernel."""
    a = rng.standard_normal((256, 512)).astype(dt)
    v = (rng.random(512) + 0.5).astype(dt)
    if name.startswith("bias"):
        return (a, v)
    if "bwd" in name:
        return (a, np.tanh(rng.standard_normal(a.shape)).astype(dt), v)
    if name.startswith("sum"):
        return (a,)
    return (a, v, np.empty_like(a))


def _option_table(title, option_sets, reps, step_models=("tiny", "small")):
    """Time loop kernels and full steps under several njit option sets; prints us per call."""
    print(f"\n## {title} (us per call; kernels 256x512; steps from the table above)")
    print(f"{'case':34} " + " ".join(f"{k:>14}" for k in option_sets))
    rng = np.random.default_rng(0)
    for dt in (F32, F64):
        kernels = {**loop_kernels(dt, "relu"), **loop_kernels(dt, "tanh"), **common_kernels(dt)}
        for name, fn in kernels.items():
            args = _kernel_args(name, dt, rng)
            ks = {k: njit(**o)(fn) for k, o in option_sets.items()}
            t = bench({k: (lambda f=f: f(*args)) for k, f in ks.items()}, reps)
            print(f"{name + ' ' + dt.name:34} " + " ".join(f"{t[k] * 1e6:14.1f}" for k in ks))
        for model in step_models:
            sizes, batch, act = hw.MODELS[model]
            p = hw.make_problem(sizes, batch, act, dt)
            args = step_args(p)
            steps = {k: hw.build_step(act, dt, **o) for k, o in option_sets.items()}
            t = bench({k: (lambda f=f: f(*args)) for k, f in steps.items()}, reps)
            print(f"{'step ' + model + ' ' + dt.name:34} "
                  + " ".join(f"{t[k] * 1e6:14.1f}" for k in steps))


def nan_check(option_sets):
    """Does a NaN in x still give a NaN loss under each option set?"""
    print("   NaN in x[0, 0] -> loss is NaN?")
    for model in ("tiny", "small"):
        sizes, batch, act = hw.MODELS[model]
        for dt in (F32, F64):
            p = hw.make_problem(sizes, batch, act, dt)
            p.data[0][0, 0] = np.nan
            res = {k: bool(np.isnan(hw.build_step(act, dt, **o)(*step_args(p))))
                   for k, o in option_sets.items()}
            print(f"   {model} {dt.name}: " + ", ".join(f"{k}: {v}" for k, v in res.items())
                  + f"; numpy: {bool(np.isnan(hw.run_numpy(p)[0]))}")


def fact_c(reps):
    """fastmath: none vs the chosen set vs True; speed and NaN propagation."""
    sets = {k: {"fastmath": v, "error_model": "numpy"} for k, v in FASTMATH_SETS.items()}
    _option_table("c. fastmath", sets, reps)
    nan_check(sets)


def fact_e(reps):
    """boundscheck and error_model, with the chosen fastmath set."""
    fm = set(hw.FASTMATH)
    sets = {"numpy (default)": {"fastmath": fm, "error_model": "numpy"},
            "error_model=py": {"fastmath": fm, "error_model": "python"},
            "boundscheck": {"fastmath": fm, "error_model": "numpy", "boundscheck": True}}
    _option_table("e. error_model / boundscheck", sets, reps)


# ---------------------------------------------------------------- d. call overhead

def _noop(n):
    """An njit function of n array arguments touching one element, and its tuple twin."""
    names = [f"a{i}" for i in range(n)]
    ns = {}
    exec(f"def flat({', '.join(names)}):\n    return a0[0, 0]\n"
         "def tup(t):\n    return t[0][0, 0]\n", ns)
    return njit(ns["flat"]), njit(ns["tup"]), names


def fact_d(reps):
    """Dispatch cost of N flat array args vs a tuple, and Python-side argument building.

    entry_point: the compiled overload called directly, skipping the dispatcher's type lookup.
    """
    print("\n## d. call overhead (us per call) and compile seconds of the no-op")
    print(f"{'N':>3} {'flat args':>10} {'uni tuple':>10} {'mixed tup':>10} {'py f(N)':>8}"
          f" {'entry_point':>11} {'list+f(*l)':>11} {'dict->list':>11}"
          f" | compile s: {'flat':>5} {'tuple':>5}")
    for n in (10, 30, 60):
        flat, tup, names = _noop(n)
        arrs = [np.zeros((4, 4)) for _ in range(n)]
        kinds = (lambda: np.zeros((4, 4)), lambda: np.zeros(4), lambda: np.zeros(4, np.int64))
        mixed = tuple(kinds[i % 3]() for i in range(n))
        params = dict(zip(names, arrs))
        comp = first_call(flat, *arrs), first_call(tup, tuple(arrs))
        tup(mixed)
        ns = {"flat": flat, "tup": tup, "t": tuple(arrs), "m": mixed, "params": params,
              "names": names, "py": eval(f"lambda {', '.join(names)}: None"),
              "entry": flat.overloads[flat.signatures[0]].entry_point, **params}
        call = f"({', '.join(names)})"
        stmts = {"flat": "flat" + call, "tuple": "tup(t)", "mixed": "tup(m)", "py": "py" + call,
                 "entry": "entry" + call, "list": "flat(*[params[k] for k in names])",
                 "dict": "[params[k] for k in names]"}
        t = bench({k: timeit.Timer(v, timer=CLOCK, globals=ns) for k, v in stmts.items()}, reps)
        print(f"{n:3} " + " ".join(f"{t[k] * 1e6:{w}.2f}" for k, w in
                                   zip(t, (10, 10, 10, 8, 11, 11, 11)))
              + f" |            {comp[0]:5.2f} {comp[1]:5.2f}")
    p = hw.make_problem(*hw.MODELS["tiny"], F32)
    args = step_args(p)
    noop = njit(lambda x, y, Ws, bs, hs, ds, gWs, gbs: x[0, 0])
    noop(*args)
    t = bench({"noop": lambda: noop(*args)}, reps)
    print(f"   hand-written step signature (2 arrays + 6 tuples of 2), no-op body: "
          f"{t['noop'] * 1e6:.2f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200, help="interleaved samples per case")
    reps = ap.parse_args().reps
    t0 = time.perf_counter()
    print(f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}")
    njit(lambda: 0)()  # numba's one-off initialisation is not part of any compile below
    table(reps)
    fact_a(reps)
    fact_b(reps)
    fact_c(reps)
    fact_d(reps)
    fact_e(reps)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
