"""The benchmark machinery (perf.bench) end to end on the tiny workload, quick mode, morphjit and
NumPy only: the JSON has the expected structure and the correctness check passed. No timing
assertions."""
import importlib
import json
import os
import subprocess
import sys

import pytest

from support.paths import ROOT



@pytest.mark.slow
def test_bench_tiny_quick(tmp_path):
    out, md = tmp_path / "results.json", tmp_path / "RESULTS.md"
    cmd = [sys.executable, "-m", "perf.bench", "--quick", "--only", "tiny", "--dtype", "float32",
           "--impls", "morphjit,morphjit.entry,numpy,floor.dot", "--no-startup", "--budget", "0.02",
           "--json", str(out), "--markdown", str(md)]
    env = dict(os.environ, MORPHJIT_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert {"command", "machine", "date", "options", "results"} <= set(data)
    assert data["machine"]["cores"] and "numpy" in data["machine"]["versions"]
    [result] = data["results"]
    assert (result["workload"], result["dtype"]) == ("tiny", "float32")
    assert "error" not in result
    impls = result["impls"]
    assert set(impls) == {"morphjit", "morphjit.entry", "numpy", "floor.dot"}
    assert impls["morphjit"]["check"] == "reference"
    for name, entry in impls.items():
        assert entry["status"] == "ok", (name, entry)
        assert set(entry["time"]) >= {"median_s", "q1_s", "q3_s", "iqr_s", "samples", "calls_per_sample"}
        assert entry["time"]["median_s"] > 0
    assert impls["floor.dot"]["kind"] == "floor"
    assert "alloc_peak_bytes" in impls["numpy"]
    assert result["max_rss_mb"] > 0 and result["threadpools"]
    assert "| tiny | float32 |" in md.read_text()


def test_missing_peer_is_reported_not_raised():
    sys.path.insert(0, str(ROOT))
    from perf import impls
    from perf.workloads import WORKLOADS

    def missing(*_):
        raise impls.Missing("No module named 'nothing'")

    import perf.bench as bench
    saved = impls.IMPLEMENTATIONS["jax"]
    impls.IMPLEMENTATIONS["jax"] = impls.Impl("jax", "peer", missing, alloc_visible=False)
    try:
        result = bench.run_workload("tiny", "float64", ["morphjit", "jax"], 1, 0.01, 2)
    finally:
        impls.IMPLEMENTATIONS["jax"] = saved
    assert result["impls"]["jax"]["status"] == "missing"
    assert result["impls"]["morphjit"]["status"] == "ok"
    assert "tiny" in WORKLOADS


def test_transcendental_workload_hand_written_gradients_agree():
    # The NumPy step is checked against morphjit's; a mismatch would give status "wrong".
    sys.path.insert(0, str(ROOT))
    import perf.bench as bench
    for dtype in ("float32", "float64"):
        result = bench.run_workload("transcendental", dtype, ["morphjit", "numpy"], 1, 0.01, 2)
        assert {name: entry["status"] for name, entry in result["impls"].items()} == \
            {"morphjit": "ok", "numpy": "ok"}, result


def test_a_peer_with_its_own_venv_runs_in_a_second_process(monkeypatch):
    sys.path.insert(0, str(ROOT))
    import perf.bench as bench
    calls = []

    def fake_child(module, workload, dtype, args, env, python=sys.executable):
        impls = args[args.index("--impls") + 1].split(",")
        calls.append((python, impls))
        return dict(impls={i: dict(status="ok", note=f"{i} here") for i in impls}, versions=dict(numba="0.65.1"))

    monkeypatch.setenv("MORPHJIT_BENCH_PYTENSOR_PYTHON", "/elsewhere/bin/python")
    monkeypatch.setattr(bench, "spawn_child", fake_child)
    opts = bench.parse(["--only", "tiny", "--impls", "morphjit,numpy,pytensor", "--no-startup"])
    result = bench.spawn_workload("tiny", "float64", opts, {})
    assert calls == [(sys.executable, ["morphjit", "numpy"]), ("/elsewhere/bin/python", ["numpy", "pytensor"])]
    assert result["impls"]["pytensor"]["note"].startswith("pytensor here; own venv (numba 0.65.1)")
    assert result["impls"]["numpy"]["note"] == "numpy here"


def test_without_morphjit_the_numpy_step_checks_the_others():
    sys.path.insert(0, str(ROOT))
    import perf.bench as bench
    result = bench.run_workload("tiny", "float64", ["numpy", "numba.hand"], 1, 0.01, 2)
    assert result["impls"]["numpy"]["check"] == "reference"
    assert result["impls"]["numba.hand"]["status"] == "ok"   # "unchecked" had nothing checked it


@pytest.mark.parametrize("module", ["perf.bench", "perf.train_bench"])
@pytest.mark.parametrize("argv, published", [
    ([], True), (["--quick"], False), (["--only", "tiny"], False), (["--dtype", "float32"], False),
    (["--quick", "--markdown", "x.md"], None),
])
def test_only_a_full_run_replaces_the_published_results(module, argv, published):
    bench = importlib.import_module(module)
    opts = bench.parse(argv)
    if published is None:   # a path given is used
        assert opts.markdown == "x.md" and opts.json == ""
    else:
        assert (opts.json, opts.markdown) == ((bench.DEFAULT_JSON, bench.DEFAULT_MARKDOWN) if published else ("", ""))
