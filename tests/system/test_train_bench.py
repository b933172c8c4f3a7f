"""The training-step benchmark machinery (perf.train_bench) end to end on the tiny workload, quick
mode, morphjit and NumPy only: the JSON has the expected structure and the correctness check
passed. No timing assertions."""
import json
import os
import subprocess
import sys

import pytest

import numpy as np
from support.paths import ROOT

IMPLS = ("morphjit.fused", "morphjit+numpy", "morphjit+numpy.alloc", "numpy")


@pytest.mark.slow
def test_train_bench_tiny_quick(tmp_path):
    out, md = tmp_path / "train_results.json", tmp_path / "TRAIN_RESULTS.md"
    cmd = [sys.executable, "-m", "perf.train_bench", "--quick", "--only", "tiny", "--dtype", "float32",
           "--impls", ",".join(IMPLS), "--budget", "0.02", "--min-samples", "2", "--json", str(out),
           "--markdown", str(md)]
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert {"command", "machine", "date", "options", "results"} <= set(data)
    assert data["machine"]["cores"] and "numpy" in data["machine"]["versions"]
    assert data["options"]["threads"] == 1 and set(data["options"]["optimizers"]) == {"adam", "sgd"}
    [result] = data["results"]
    assert (result["workload"], result["dtype"]) == ("tiny", "float32")
    assert "error" not in result, result.get("error")
    assert result["threadpools"] and result["max_rss_mb"] > 0
    for optim in ("adam", "sgd"):
        impls = result["optimizers"][optim]["impls"]
        assert set(impls) == set(IMPLS)
        assert impls["morphjit.fused"]["check"] == "reference"
        for name, entry in impls.items():
            assert entry["status"] == "ok", (optim, name, entry)
            assert set(entry["time"]) >= {"median_s", "q1_s", "q3_s", "iqr_s", "samples", "calls_per_sample"}
            assert len(entry["check_losses"]) == 3 and all(np.isfinite(entry["check_losses"]))
            if name != "morphjit.fused":
                assert entry["check"]["passed"] and entry["check"]["max_rel_err"] < entry["check"]["rtol"]
    text = md.read_text()
    assert "| tiny | float32 | adam |" in text and "python -m perf.train_bench" in text
    assert "train_bench" in done.stdout or "morphjit.fused" in done.stdout


def test_missing_peer_and_wrong_update_are_reported_not_raised():
    sys.path.insert(0, str(ROOT))
    from perf import impls, train_bench
    from perf.workloads import WORKLOADS

    def missing(*_):
        raise impls.Missing("No module named 'nothing'")

    def wrong(wl, opt, params, data):   # the NumPy step with the update's sign flipped
        built = train_bench.build_numpy(wl, opt, params, data)
        step = built.call

        def call():
            before = {k: v.copy() for k, v in params.items()}
            value = step()
            for k, p in params.items():
                p[...] = 2 * before[k] - p
            return value

        built.call = call
        return built

    saved = dict(train_bench.TRAIN_IMPLS)
    train_bench.TRAIN_IMPLS["jax"] = train_bench.TrainImpl("jax", "peer", missing, alloc_visible=False)
    train_bench.TRAIN_IMPLS["numpy"] = train_bench.TrainImpl("numpy", "reference", wrong)
    try:
        result = train_bench.run_optimizer(WORKLOADS["tiny"], train_bench.OPTIMIZERS["sgd"], "float64",
                                           ["morphjit.fused", "numpy", "jax"], 0.01, 2)
    finally:
        train_bench.TRAIN_IMPLS.update(saved)
    entries = result["impls"]
    assert entries["jax"]["status"] == "missing"
    assert entries["numpy"]["status"] == "wrong" and "time" not in entries["numpy"]
    assert entries["morphjit.fused"]["status"] == "ok" and "time" in entries["morphjit.fused"]
