"""Start-up and per-call figures of the compiled step (issue 5), for the small MLP of the perf suite.

Cold compile and warm start each run in a fresh process (the warm one finds the disk cache the
cold one filled). Run: .venv/bin/python -m perf.startup
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

CHILD = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import json
    import numpy as np
    import morphjit as mj
    from perf.startup import small_mlp
    fn, args = small_mlp({dtype!r})
    step = mj.compile_loss(fn)
    t1 = time.perf_counter()
    step(*args)
    t2 = time.perf_counter()
    print(json.dumps(dict(first_call=t2 - t1, process=t2 - t0, imports=t1 - t0,
                          from_disk=step.cache_info().disk_loads)))
""")


def small_mlp(dtype="float64", batch=64, sizes=(784, 128, 10)):
    rng = np.random.default_rng(0)
    params = {"W1": rng.normal(scale=0.05, size=sizes[:2]), "b1": np.zeros(sizes[1]),
              "W2": rng.normal(scale=0.05, size=sizes[1:]), "b2": np.zeros(sizes[2])}
    params = {k: v.astype(dtype) for k, v in params.items()}
    x, y = rng.normal(size=(batch, sizes[0])).astype(dtype), rng.integers(0, sizes[2], batch)

    def loss(params, x, y):
        import morphjit as mj
        h = mj.relu(x @ params["W1"] + params["b1"])
        return mj.mean(mj.softmax_cross_entropy(h @ params["W2"] + params["b2"], y))

    return loss, (params, x, y)


def child(dtype: str, cache_dir: str) -> dict:
    env = dict(os.environ, MORPHJIT_CACHE_DIR=cache_dir, MORPHJIT_CACHE="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", CHILD.format(dtype=dtype)], env=env, cwd=root,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_call_us(fn, repeats=300) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e6)


def main():
    import morphjit as mj

    print("| dtype | cold first call s | cold process s | warm first call s | warm process s | "
          "from disk | numba us/call | reference us/call | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype in ("float32", "float64"):
        with tempfile.TemporaryDirectory() as cache_dir:
            cold, warm = child(dtype, cache_dir), child(dtype, cache_dir)
        fn, args = small_mlp(dtype)
        compiled, reference = mj.compile_loss(fn, cache=False), mj.compile_loss(fn, backend="interp")
        compiled(*args), reference(*args)
        fast, slow = per_call_us(lambda: compiled(*args)), per_call_us(lambda: reference(*args), 100)
        print(f"| {dtype} | {cold['first_call']:.2f} | {cold['process']:.2f} | {warm['first_call']:.3f} | "
              f"{warm['process']:.2f} | {bool(warm['from_disk'])} | {fast:.0f} | {slow:.0f} | {slow / fast:.1f}x |")


if __name__ == "__main__":
    main()
