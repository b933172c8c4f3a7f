"""A fresh process loads a compiled step from the disk cache without compiling."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from support.paths import TESTS

CHILD = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import morphjit as mj
    from morphjit.runtime import kernels
    sys.path.insert(0, {tests!r})
    from support.models import MODELS
    fn, args = MODELS["mlp2"](np.float64)
    step = mj.compile_loss(fn)
    t1 = time.perf_counter()
    value, grads = step(*args)
    t2 = time.perf_counter()
    info = step.cache_info()
    print(json.dumps(dict(value=float(value), disk_loads=info.disk_loads, misses=info.misses,
                          first_call=t2 - t1, process=t2 - t0, kernels=kernels.statistics())))
""")


def run_child(cache_dir):
    env = dict(os.environ, MORPHJIT_CACHE_DIR=str(cache_dir))
    code = CHILD.format(tests=str(TESTS))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), stderr=done.stderr)


@pytest.mark.slow
def test_fresh_process_loads_the_step_from_disk(tmp_path):
    cold = run_child(tmp_path)
    warm = run_child(tmp_path)
    assert cold["disk_loads"] == 0 and cold["misses"] == 1
    assert warm["disk_loads"] == 1, f"the second process compiled instead of loading from disk: {warm['stderr']}"
    assert warm["value"] == cold["value"]
    # the kernels the step calls are cache entries of their own, loaded from disk too
    assert cold["kernels"]["compiled"] > 0 and cold["kernels"]["disk"] == 0
    assert warm["kernels"] == {"compiled": 0, "disk": cold["kernels"]["compiled"], "reused": 0}
