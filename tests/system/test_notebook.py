"""morphjit in a real Jupyter kernel: the quickstart notebook runs, a re-run cell does not compile
again, and errors point at the cell.

Each kernel gets a fresh MORPHJIT_CACHE_DIR, so the first compilation is a real numba compile.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from support.paths import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.slow   # every test talks to a Jupyter kernel in a process of its own

QUICKSTART = ROOT / "examples" / "quickstart.ipynb"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
KERNEL_ENV_DROP = ("MORPHJIT_QUIET", "MORPHJIT_TRACEBACK", "MORPHJIT_CACHE", "MORPHJIT_DUMP")


def kernel_env(cache_dir) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV_DROP}
    env["MORPHJIT_CACHE_DIR"] = str(cache_dir)
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return env


# ---------------------------------------------------------------------------------------------
# The quickstart notebook


def test_quickstart_is_stored_without_outputs():
    nb = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_quickstart_runs(tmp_path, monkeypatch):
    for key, value in kernel_env(tmp_path / "cache").items():
        monkeypatch.setenv(key, value)
    for key in KERNEL_ENV_DROP:
        monkeypatch.delenv(key, raising=False)
    nb = nbformat.read(QUICKSTART, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on an error cell

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout")
    final_loss = float(re.search(r"final training loss: ([\d.]+)", text).group(1))
    accuracy = float(re.search(r"test accuracy: ([\d.]+)", text).group(1))
    assert final_loss < 0.2 and accuracy > 0.85, text
    assert any("image/png" in o.get("data", {}) for o in outputs), "no loss curve plotted"

    results = [o.data for o in outputs if o.output_type == "execute_result"]
    summary = re.compile(r"<compiled loss 'loss': 1 signature, \d+ instructions, cached on disk>")
    assert any(summary.fullmatch(r["text/plain"]) for r in results), results
    explained = next(r for r in results if "text/html" in r and "morphjit-explain" in r["text/html"])
    assert explained["text/plain"].startswith("morphjit step for 'loss' at (f64[64,32], ")
    assert "machine code  compiled by numba" in explained["text/plain"]
    page = explained["text/html"]
    assert page.count("<details>") == 6 and "fusion groups" in page and "numba compile" in page


# ---------------------------------------------------------------------------------------------
# Cells executed one by one in a kernel


SETUP = """
import json, time
import numpy as np
import morphjit as mj

rng = np.random.default_rng(0)
params = {"W": rng.normal(size=(8, 4)), "b": np.zeros(4)}
x, y = rng.normal(size=(16, 8)), rng.integers(0, 4, 16)

def report(loss, seconds):
    r = loss.explain(params, x, y)
    fn = loss.__wrapped__
    print(json.dumps({"origin": r.origin, "disk_loads": loss.cache_info().disk_loads, "seconds": seconds,
                      "file": fn.__code__.co_filename, "line": fn.__code__.co_firstlineno,
                      "leaks": fn.__code__.co_filename in r.source or "ipykernel" in r.source}))
"""

CELL = """
@mj.compile_loss
def loss(params, x, y):
    return mj.mean(mj.softmax_cross_entropy(x @ params["W"] + params["b"], y))

start = time.perf_counter()
value, grads = loss(params, x, y)
report(loss, time.perf_counter() - start)
"""

CHANGED = CELL.replace("x @ params", "mj.tanh(x) @ params")

BROKEN = """
@mj.compile_loss
def broken(params, x, y):
    h = x @ params["W"]
    return mj.mean(h + x)

broken(params, x, y)
"""


class Kernel:
    def __init__(self, env):
        self.km, self.kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", env=env,
                                                                   startup_timeout=120)

    def run(self, code: str) -> tuple[str, dict]:
        """Execute one cell; its stdout and the execute reply's content."""
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=240)
        return "".join(out), reply["content"]

    def report(self, code: str) -> dict:
        out, reply = self.run(code)
        assert reply["status"] == "ok", "\n".join(reply.get("traceback", []))
        return json.loads(out.strip().splitlines()[-1])

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kernel-cache")


@pytest.fixture(scope="module")
def kernel(cache_dir):
    k = Kernel(kernel_env(cache_dir))
    k.report(SETUP + "\nprint(json.dumps({}))")
    yield k
    k.close()


def test_rerun_cell_does_not_compile_again(kernel, cache_dir):
    first = kernel.report(CELL)
    assert first["origin"] == "compiled" and not first["leaks"]

    again = kernel.report(CELL)                                      # the same cell, run again
    moved = kernel.report("# the same function, two lines down\n\n" + CELL)  # another cell, other lines
    assert moved["file"] != first["file"] and moved["line"] > first["line"]
    for rerun in (again, moved):
        assert rerun["origin"] == "memory", rerun                    # no numba compile, no disk load
        assert not rerun["leaks"]

    changed = kernel.report(CHANGED)
    assert changed["origin"] == "compiled"

    # A restarted kernel (a re-run notebook) loads both programs from the disk cache.
    fresh = Kernel(kernel_env(cache_dir))
    try:
        fresh.report(SETUP + "\nprint(json.dumps({}))")
        loaded = [fresh.report(cell) for cell in (CELL, CHANGED)]
    finally:
        fresh.close()
    for entry in loaded:
        assert entry["origin"] == "disk" and entry["disk_loads"] == 1, entry
    disk = " and ".join(f"{entry['seconds']:.2f}" for entry in loaded)
    print(f"\nfirst call: compiled {first['seconds']:.2f} s; re-run cell {again['seconds'] * 1e3:.1f} ms, "
          f"moved cell {moved['seconds'] * 1e3:.1f} ms; restarted kernel (disk) {disk} s")


def test_errors_point_at_the_cell(kernel):
    out, reply = kernel.run(BROKEN)
    assert reply["status"] == "error" and reply["ename"] == "ShapeError"
    tb = ANSI.sub("", "\n".join(reply["traceback"]))
    assert "return mj.mean(h + x)" in tb and "broken(params, x, y)" in tb
    assert re.search(r"Cell In\[\d+\], line 4", tb), tb                 # the offending line of the cell
    for internal in ("api/core.py", "tracing/tracer.py", "jit/compiled.py", "site-packages/numpy"):
        assert internal not in tb, f"{internal} shown in:\n{tb}"
    assert "skipping hidden 2 frame" in tb
    assert re.search(r"at Cell In\[\d+\], line 4 in broken: return mj.mean\(h \+ x\)", reply["evalue"]), reply["evalue"]
