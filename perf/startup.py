"""Start-up figures of morphjit's compiled step, for any workload of the perf suite.

Cold compile and warm start each run in a fresh process: the cold one gets an empty
MORPHJIT_CACHE_DIR and compiles, the warm one finds the disk cache the cold one filled.
Run: .venv/bin/python -m perf.startup [workload ...]   (default: small)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import json, resource
    import morphjit as mj
    from perf.impls import named_loss
    from perf.workloads import WORKLOADS
    wl = WORKLOADS[{workload!r}]
    params, data = wl.make({dtype!r})
    step = mj.compile_loss(named_loss(wl, mj))
    t1 = time.perf_counter()
    step(params, *data)
    t2 = time.perf_counter()
    print(json.dumps(dict(first_call_s=t2 - t1, in_process_s=t2 - t0, setup_s=t1 - t0,
                          from_disk=step.cache_info().disk_loads,
                          max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
""")


def child(workload: str, dtype: str, cache_dir: str, env: dict | None = None) -> dict:
    """Run the first call of the workload's step in a fresh process; its figures, plus the
    wall time of the whole process (interpreter start-up included) as ``process_s``."""
    env = dict(os.environ if env is None else env, MORPHJIT_CACHE_DIR=cache_dir, MORPHJIT_CACHE="1")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD.format(workload=workload, dtype=dtype)],
                          env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"start-up child failed for {workload} {dtype}:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), process_s=wall)


def cold_and_warm(workload: str, dtype: str, cache_dir: str, env: dict | None = None) -> dict:
    """Cold compile into the empty ``cache_dir``, then a warm start from it (both fresh processes)."""
    cold = child(workload, dtype, cache_dir, env)
    warm = child(workload, dtype, cache_dir, env)
    return dict(cold=cold, warm=warm)


def main(argv=None):
    workloads = (argv if argv is not None else sys.argv[1:]) or ["small"]
    print("| workload | dtype | cold first call s | cold process s | warm first call s | warm process s | from disk |")
    print("|---|---|---|---|---|---|---|")
    for workload in workloads:
        for dtype in ("float32", "float64"):
            with tempfile.TemporaryDirectory() as cache_dir:
                r = cold_and_warm(workload, dtype, cache_dir)
            cold, warm = r["cold"], r["warm"]
            print(f"| {workload} | {dtype} | {cold['first_call_s']:.2f} | {cold['process_s']:.2f} | "
                  f"{warm['first_call_s']:.3f} | {warm['process_s']:.2f} | {bool(warm['from_disk'])} |")


if __name__ == "__main__":
    main()
