"""The benchmark suite: morphjit against its peers, references and the GEMM floor.

Run: python -m perf.bench [--only tiny,small] [--impls morphjit,numpy,jax] [--dtype float32]
                          [--quick] [--threads 1] [--json perf/results/results.json] [--markdown perf/results/RESULTS.md]

The runner spawns ONE fresh process per (workload, dtype); inside it every implementation is
built from the workload's declaration (perf.workloads), checked against morphjit (loss and
gradients allclose; a wrong implementation is reported, not timed) and timed interleaved with the
others (perf.timing). Before that, two more fresh processes measure morphjit's cold compile (empty
MORPHJIT_CACHE_DIR) and warm start from the disk cache (perf.startup); the workload process then
loads the step from that cache. The compiling peers (JAX, torch.compile, PyTensor) get the same
two fresh processes with their own persistent caches on the --startup-peers-on workloads (default
small).

BLAS threads are held equal: OPENBLAS/OMP/MKL_NUM_THREADS and threadpoolctl for NumPy's and
numba's (scipy's) BLAS, torch.set_num_threads, and XLA_FLAGS for JAX (XLA's own thread pool is not
fully governed by them; the report says so). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed
from the children's environment; the kernel OpenBLAS then picks is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_JSON = os.path.join(ROOT, "perf", "results", "results.json")
DEFAULT_MARKDOWN = os.path.join(ROOT, "perf", "results", "RESULTS.md")
UNSET_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
PEER_MODULES = {"jax": "jax", "torch": "torch", "torch.compile": "torch", "pytensor": "pytensor"}
VERSION_MODULES = ("numpy", "scipy", "numba", "llvmlite", "morphjit", "jax", "jaxlib", "torch", "pytensor",
                   "threadpoolctl")
QUICK = dict(budget_s=0.15, min_samples=3)
FULL = dict(budget_s=1.5, min_samples=7)


# ================================================================ the workload process

def run_workload(workload: str, dtype: str, impl_names: list, threads: int, budget_s: float,
                 min_samples: int) -> dict:
    """Build, check and time every implementation of one workload at one dtype (in this process)."""
    import resource
    import tracemalloc

    from perf.impls import IMPLEMENTATIONS, Missing, NotApplicable, check_close
    from perf.timing import measure
    from perf.workloads import WORKLOADS

    wl = WORKLOADS[workload]
    limits = hold_threads(threads, impl_names)
    params, data = wl.make(dtype)
    impls, built = {}, {}
    for name in impl_names:
        impl = IMPLEMENTATIONS[name]
        entry = impls[name] = dict(kind=impl.kind)
        try:
            b = built[name] = impl.build(wl, params, data)
        except NotApplicable:
            del impls[name]
            continue
        except Missing as e:
            entry.update(status="missing", message=str(e))
            continue
        except Exception as e:  # a peer that cannot express the workload is reported, not fatal
            entry.update(status="error", message=f"{type(e).__name__}: {e}".strip()[:500],
                         traceback=traceback.format_exc(limit=4)[-1500:])
            continue
        entry.update(status="ok", first_call_s=b.first_call_s, note=b.note)

    # morphjit is the reference; a peer run in a venv of its own is checked against NumPy's step.
    checker = next((name for name in ("morphjit", "numpy") if name in built), None)
    reference = built[checker].result(built[checker].call()) if checker else None
    for name, b in list(built.items()):
        if b.result is None or name == checker:
            continue
        if reference is None:
            impls[name].update(status="unchecked", message="neither morphjit nor numpy ran")
            continue
        try:
            problem = check_close(b.result(b.call()), reference, dtype)
        except Exception as e:
            problem = f"{type(e).__name__}: {e}"
        if problem:
            impls[name].update(status="wrong", message=problem)
            del built[name]
    impls.setdefault(checker or "morphjit", {}).setdefault("check", "reference")
    for name in built:
        if IMPLEMENTATIONS[name].alloc_visible:
            tracemalloc.start()
            built[name].call()
            impls[name]["alloc_peak_bytes"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()

    stats = measure({k: b.call for k, b in built.items()}, budget_s=budget_s * len(built),
                    min_samples=min_samples)
    for name, s in stats.items():
        impls[name]["time"] = s.as_dict()
    pools = threadpools_of(limits)
    if limits is not None:
        limits.restore_original_limits()
    return dict(workload=workload, dtype=dtype, description=wl.description, impls=impls,
                max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                threads=threads, threadpools=pools, versions=versions())


def hold_threads(threads: int, impl_names: list):
    """Import the peers to be run, then cap every BLAS/OpenMP pool they brought to ``threads``."""
    for name in impl_names:
        if name in PEER_MODULES:
            try:
                __import__(PEER_MODULES[name])
            except ImportError:
                pass
    import numba  # noqa: F401  (numba's np.dot goes through scipy's BLAS)
    import scipy.linalg  # noqa: F401
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=threads)


def threadpools_of(limits) -> list:
    if limits is None:
        return [dict(note="threadpoolctl not installed: only the *_NUM_THREADS variables hold threads")]
    from threadpoolctl import threadpool_info
    keys = ("user_api", "internal_api", "prefix", "version", "num_threads", "architecture", "threading_layer")
    pools = [{k: p[k] for k in keys if k in p} for p in threadpool_info()]
    if "torch" in sys.modules:
        pools.append(dict(user_api="torch", num_threads=sys.modules["torch"].get_num_threads()))
    return pools


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": platform.python_version()}
    for m in VERSION_MODULES:
        try:
            out[m] = version(m)
        except PackageNotFoundError:
            out[m] = None
    return out


# ================================================================ the runner

def child_env(threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                            "intra_op_parallelism_threads=1").strip()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def spawn_workload(workload: str, dtype: str, opts, env: dict) -> dict:
    """The workload process; a peer with a venv of its own (impls.interpreter) runs in a second
    process beside NumPy's step, which checks it, and joins the first one's figures."""
    from perf.impls import interpreter
    apart = [i for i in opts.impls if interpreter(i) != sys.executable]
    here = [i for i in opts.impls if i not in apart]
    result = spawn_child("perf.bench", workload, dtype, _child_args(here, opts), env)
    for impl in apart:
        other = spawn_child("perf.bench", workload, dtype, _child_args(["numpy", impl], opts), env,
                            interpreter(impl))
        entry = other.get("impls", {}).get(impl) or dict(status="error", message=other.get("error", "")[-2000:])
        if entry["status"] == "ok":
            entry["note"] = (f"{entry['note']}; own venv (numba {other['versions']['numba']}), "
                             "timed in a process of its own")
        result.setdefault("impls", {})[impl] = entry
    return result


def _child_args(impls: list, opts) -> list:
    return ["--impls", ",".join(impls), "--threads", str(opts.threads), "--budget", str(opts.budget),
            "--min-samples", str(opts.min_samples)]


def spawn_child(module: str, workload: str, dtype: str, args: list, env: dict, python: str = sys.executable) -> dict:
    """Run ``python -m module --child workload dtype *args`` and return the dict it prints on its
    ``RESULT `` line (or an ``error`` entry if it failed)."""
    cmd = [python, "-m", module, "--child", workload, dtype] + list(args)
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        return dict(workload=workload, dtype=dtype, error=f"exit {done.returncode}: {done.stderr[-3000:]}", impls={})
    return json.loads(lines[-1][len("RESULT "):])


def run(opts, on_result=None) -> dict:
    """Every selected workload and dtype; ``on_result(data so far)`` after each one."""
    from perf import report, startup
    env = child_env(opts.threads)
    results = []
    for workload in opts.only:
        for dtype in opts.dtypes:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="morphjit-bench-") as cache_dir:
                env_w = dict(env, MORPHJIT_CACHE_DIR=cache_dir)
                start = None
                if opts.startup and "morphjit" in opts.impls:
                    try:
                        start = startup.cold_and_warm(workload, dtype, cache_dir, env_w, threads=opts.threads)
                    except RuntimeError as e:
                        start = dict(error=str(e)[-2000:])
                r = spawn_workload(workload, dtype, opts, env_w)
            r["startup"] = start
            if opts.startup and workload in opts.startup_peers_on:
                r["peer_startup"] = startup.peers(workload, dtype, opts.startup_peers, env, opts.threads)
            r["wall_s"] = time.perf_counter() - t0
            results.append(r)
            print(report.workload_lines(r), flush=True)
            if on_result:
                on_result(_data(opts, results))
    return _data(opts, results)


def _data(opts, results: list) -> dict:
    return dict(command=" ".join(["python -m perf.bench"] + opts.argv), machine=machine_info(results),
                date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), options=dict(
                    threads=opts.threads, budget_s=opts.budget, min_samples=opts.min_samples,
                    quick=opts.quick, unset_env=list(UNSET_ENV)),
                results=results)


def machine_info(results: list) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    first = next((r for r in results if "versions" in r), {})
    return dict(cpu=cpu, cores=os.cpu_count(), platform=platform.platform(),
                versions=first.get("versions", {}), threadpools=first.get("threadpools", []))


def parse(argv=None):
    from perf.impls import IMPLEMENTATIONS
    from perf.workloads import DTYPES, WORKLOADS
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m perf.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"workloads, from {','.join(WORKLOADS)}")
    ap.add_argument("--impls", default=",".join(IMPLEMENTATIONS),
                    help=f"implementations, from {','.join(IMPLEMENTATIONS)}")
    ap.add_argument("--dtype", default="float32,float64", help="float32, float64 or both")
    ap.add_argument("--quick", action="store_true", help="short time boxes (figures are rough)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS / intra-op threads of every implementation")
    ap.add_argument("--budget", type=float, help="seconds of timing per implementation and workload")
    ap.add_argument("--min-samples", type=int)
    ap.add_argument("--no-startup", dest="startup", action="store_false",
                    help="skip the cold-compile and warm-start processes")
    ap.add_argument("--startup-peers", help="peers whose cold compile and warm start are measured in fresh "
                    "processes too (default: the peers of --impls among jax,torch.compile,pytensor; '' for none)")
    ap.add_argument("--startup-peers-on", default="small",
                    help="workloads on which the peers' start-up is measured ('all' for every one; about 50 s "
                    "per workload and dtype with all three peers)")
    ap.add_argument("--json", help=f"where to write the JSON results ({PUBLISHED_HELP})")
    ap.add_argument("--markdown", help=f"where to write RESULTS.md ({PUBLISHED_HELP})")
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "DTYPE"), help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    opts.argv = argv
    result_paths(ap, opts, {"json": DEFAULT_JSON, "markdown": DEFAULT_MARKDOWN}, ("only", "impls", "dtype"))
    mode = QUICK if opts.quick else FULL
    opts.budget = mode["budget_s"] if opts.budget is None else opts.budget
    opts.min_samples = mode["min_samples"] if opts.min_samples is None else opts.min_samples
    opts.only = [w for w in opts.only.split(",") if w]
    opts.impls = [i for i in opts.impls.split(",") if i]
    opts.dtypes = [d for d in opts.dtype.split(",") if d]
    from perf.startup import PEERS
    opts.startup_peers = ([i for i in opts.impls if i in PEERS] if opts.startup_peers is None
                          else [i for i in opts.startup_peers.split(",") if i])
    opts.startup_peers_on = (list(WORKLOADS) if opts.startup_peers_on == "all"
                             else [w for w in opts.startup_peers_on.split(",") if w])
    bad = [i for i in opts.startup_peers if i not in PEERS]
    if bad:
        ap.error(f"no start-up measurement for {', '.join(bad)}; choose from {', '.join(PEERS)}")
    for kind, chosen, known in (("workload", opts.only, WORKLOADS), ("implementation", opts.impls, IMPLEMENTATIONS),
                                ("dtype", opts.dtypes, DTYPES)):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            ap.error(f"unknown {kind} {', '.join(unknown)}; choose from {', '.join(known)}")
    return opts


PUBLISHED_HELP = "default: the file in perf/results/ for a full run, none for --quick or a subset; '' for none"


def result_paths(ap, opts, published: dict[str, str], chosen: tuple[str, ...]) -> None:
    """Where a run writes its results: where given, else the ``published`` files (by option) for
    a full run (not ``--quick``, every option of ``chosen`` at its default), else nowhere, so
    that a rough or partial run never replaces the published figures."""
    full = not opts.quick and all(getattr(opts, k) == ap.get_default(k) for k in chosen)
    for option, path in published.items():
        if getattr(opts, option) is None:
            setattr(opts, option, path if full else "")


def run_and_report(opts, run, markdown, terminal) -> dict:
    """``run(opts, on_result)``, writing the JSON and the markdown after every workload (so an
    interrupted run keeps what it measured), then the terminal table."""
    def write(data):
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump(data, f, indent=1)
        if opts.markdown:
            with open(opts.markdown, "w") as f:
                f.write(markdown(data))

    data = run(opts, on_result=write)
    print()
    print(terminal(data))
    print(f"\nJSON: {opts.json or '-'}  Markdown: {opts.markdown or '-'}")
    return data


def main(argv=None) -> dict | None:
    opts = parse(argv)
    if opts.child:
        result = run_workload(*opts.child, opts.impls, opts.threads, opts.budget, opts.min_samples)
        print("RESULT " + json.dumps(result), flush=True)
        return None
    from perf import report
    return run_and_report(opts, run, report.markdown, report.terminal)


if __name__ == "__main__":
    main()
