"""Start-up figures of a workload's compiled step, for morphjit and its compiling peers.

Cold compile and warm start each run in a fresh process: the cold one gets an empty cache
directory and compiles, the warm one finds the disk cache the cold one filled. One parameterised
child serves every implementation; what differs per implementation is its ``Kind``: how its disk
cache is pointed at the directory (environment and/or in-process configuration), how the child
holds its threads, and how it tells that the step came from the disk cache. The step itself is
built by the suite's own builder (``perf.impls.IMPLEMENTATIONS[name].build``), whose
``first_call_s`` is the first call's time (PyTensor's includes building the graph).

- morphjit: MORPHJIT_CACHE_DIR; from disk = the step's ``cache_info().disk_loads``.
- jax: ``jax_compilation_cache_dir`` with the minimum compile time and entry size at 0 (so small
  programs are cached); from disk = '/jax/compilation_cache/cache_hits' events.
- torch.compile: TORCHINDUCTOR_CACHE_DIR (FX-graph and AOTAutograd caches), TORCHINDUCTOR_COMPILE_THREADS
  = threads; from disk = inductor's fxgraph_cache_hit counter.
- pytensor: PYTENSOR_FLAGS=base_compiledir=... (its numba cache lives there, not in compiledir);
  from disk = that directory was not empty at start.

Threads are held by the environment of ``perf.bench.child_env`` (BLAS/OMP/NUMBA variables,
XLA_FLAGS) and ``torch.set_num_threads``. The framework is imported before the suite's modules
(``perf.workloads`` imports numba for the hand-written reference): ``import_s`` is the framework's
import, ``harness_s`` the suite's imports and data making, both inside ``setup_s``.

Run: python -m perf.startup [--impls morphjit,jax,torch.compile,pytensor] [--dtype float32,float64]
                            [--threads 1] [workload ...]   (default: small)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The child: interpreter start, then everything in ``child_main`` (this module imports stdlib only).
CHILD = ("import time; t0 = time.perf_counter()\n"
         "from perf.startup import child_main\n"
         "child_main({impl!r}, {workload!r}, {dtype!r}, {cache_dir!r}, {threads!r}, t0)\n")


# ================================================================ per implementation

def _setup_morphjit(cache_dir, threads):
    import morphjit  # noqa: F401
    return lambda built: built.note == "loaded from disk cache"


def _setup_jax(cache_dir, threads):
    import jax
    import jax.monitoring
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    return lambda built: len(hits)


def _setup_torch_compile(cache_dir, threads):
    import torch
    torch.set_num_threads(threads)
    from torch._dynamo.utils import counters
    return lambda built: counters["inductor"]["fxgraph_cache_hit"]


def _setup_pytensor(cache_dir, threads):
    had_files = bool(_count_files(cache_dir))
    import pytensor  # noqa: F401
    return lambda built: had_files


@dataclass(frozen=True)
class Kind:
    """How one implementation's start-up is measured: ``env(cache_dir, threads, base_env)``, the
    variables its children get, and ``setup(cache_dir, threads)``, which imports the framework in
    the child, configures it and returns ``from_disk(built)``."""
    env: Callable[[str, int, dict], dict]
    setup: Callable[[str, int], Callable]


KINDS = {
    "morphjit": Kind(lambda d, t, base: dict(MORPHJIT_CACHE_DIR=d, MORPHJIT_CACHE="1"), _setup_morphjit),
    "jax": Kind(lambda d, t, base: {}, _setup_jax),
    "torch.compile": Kind(lambda d, t, base: dict(TORCHINDUCTOR_CACHE_DIR=d, TORCHINDUCTOR_COMPILE_THREADS=str(t)),
                          _setup_torch_compile),
    "pytensor": Kind(lambda d, t, base: dict(PYTENSOR_FLAGS=",".join(filter(None, [
        base.get("PYTENSOR_FLAGS", ""), f"base_compiledir={d}"]))), _setup_pytensor),
}
PEERS = tuple(k for k in KINDS if k != "morphjit")


def _count_files(d: str) -> int:
    return sum(len(files) for _, _, files in os.walk(d))


def _emit(**fields):
    print("STARTUP " + json.dumps(fields), flush=True)


def child_main(impl: str, workload: str, dtype: str, cache_dir: str, threads: int, t0: float):
    """In the fresh process: import and configure the implementation, build the workload's step and
    call it once; print the figures on a ``STARTUP`` line."""
    import resource
    files_before = _count_files(cache_dir)
    try:
        from_disk = KINDS[impl].setup(cache_dir, threads)
    except ImportError as e:
        return _emit(status="missing", message=str(e))
    t_import = time.perf_counter()
    from perf.impls import IMPLEMENTATIONS, Missing
    from perf.workloads import WORKLOADS
    wl = WORKLOADS[workload]
    params, data = wl.make(dtype)
    t_harness = time.perf_counter()
    try:
        built = IMPLEMENTATIONS[impl].build(wl, params, data)
    except Missing as e:
        return _emit(status="missing", message=str(e))
    t_end = time.perf_counter()
    _emit(status="ok", first_call_s=built.first_call_s, in_process_s=t_end - t0,
          setup_s=t_end - t0 - built.first_call_s, import_s=t_import - t0, harness_s=t_harness - t_import,
          from_disk=from_disk(built), cache_files_before=files_before,
          max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


# ================================================================ the parent

def child(workload: str, dtype: str, cache_dir: str, env: dict | None = None, impl: str = "morphjit",
          threads: int = 1) -> dict:
    """Run the first call of ``impl``'s step of the workload in a fresh process; its figures, plus
    the wall time of the whole process (interpreter start-up included) as ``process_s``. A peer
    that is not installed gives ``status: missing``; a failing child raises RuntimeError."""
    from perf.impls import interpreter
    base = os.environ if env is None else env
    env = dict(base, **KINDS[impl].env(cache_dir, threads, base))
    code = CHILD.format(impl=impl, workload=workload, dtype=dtype, cache_dir=cache_dir, threads=threads)
    start = time.perf_counter()
    done = subprocess.run([interpreter(impl), "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("STARTUP ")]
    if done.returncode or not lines:
        raise RuntimeError(f"start-up child failed for {impl} {workload} {dtype} (exit {done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    out = json.loads(lines[-1][len("STARTUP "):])
    if out["status"] == "ok":
        out["process_s"] = wall
    return out


def cold_and_warm(workload: str, dtype: str, cache_dir: str, env: dict | None = None, impl: str = "morphjit",
                  threads: int = 1) -> dict:
    """Cold compile into the empty ``cache_dir``, then a warm start from it (both fresh processes)."""
    cold = child(workload, dtype, cache_dir, env, impl, threads)
    if cold["status"] != "ok":
        return dict(status=cold["status"], message=cold.get("message", ""))
    warm = child(workload, dtype, cache_dir, env, impl, threads)
    return dict(status="ok", cold=cold, warm=warm)


def peers(workload: str, dtype: str, impls, env: dict | None = None, threads: int = 1) -> dict:
    """``cold_and_warm`` of every peer in ``impls`` that has a Kind, each with its own temporary cache
    directory; a missing peer is reported as such, a failing one as ``status: error``."""
    out = {}
    for impl in impls:
        if impl not in PEERS:
            continue
        with tempfile.TemporaryDirectory(prefix=f"{impl}-startup-") as cache_dir:
            try:
                out[impl] = cold_and_warm(workload, dtype, cache_dir, env, impl, threads)
            except RuntimeError as e:
                out[impl] = dict(status="error", message=str(e)[-2000:])
    return out


def _fmt(x, digits=2):
    return "" if x is None else f"{x:.{digits}f}"


def main(argv=None):
    from perf.bench import child_env
    ap = argparse.ArgumentParser(prog="python -m perf.startup", description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="*", default=["small"])
    ap.add_argument("--impls", default=",".join(KINDS), help=f"from {','.join(KINDS)}")
    ap.add_argument("--dtype", default="float32,float64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here")
    opts = ap.parse_args(argv)
    env = child_env(opts.threads)
    impls = [i for i in opts.impls.split(",") if i]
    unknown = [i for i in impls if i not in KINDS]
    if unknown:
        ap.error(f"unknown implementation {', '.join(unknown)}; choose from {', '.join(KINDS)}")
    print("| workload | dtype | impl | cold first call s | cold process s | warm first call s | warm process s "
          "| warm from disk | warm import s | cold RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for workload in opts.workloads:
        for dtype in (d for d in opts.dtype.split(",") if d):
            for impl in impls:
                with tempfile.TemporaryDirectory(prefix=f"{impl}-startup-") as cache_dir:
                    try:
                        r = cold_and_warm(workload, dtype, cache_dir, env, impl, opts.threads)
                    except RuntimeError as e:
                        r = dict(status="error", message=str(e)[-2000:])
                results.append(dict(r, workload=workload, dtype=dtype, impl=impl))
                if r["status"] != "ok":
                    print(f"| {workload} | {dtype} | {impl} | {r['status']}: {r['message'][-200:]!r} |")
                    continue
                cold, warm = r["cold"], r["warm"]
                print(f"| {workload} | {dtype} | {impl} | {_fmt(cold['first_call_s'])} | {_fmt(cold['process_s'])} "
                      f"| {_fmt(warm['first_call_s'], 3)} | {_fmt(warm['process_s'])} | {warm['from_disk']} "
                      f"| {_fmt(warm['import_s'])} | {_fmt(cold['max_rss_mb'], 0)} |", flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
