"""The suite's setup: compiled steps cached inside the checkout, and the ``slow`` marker.

Tests live in folders that mirror ``morphjit/``; what they share is the ``support`` package. A
test that starts a process (an interpreter, a Jupyter kernel, a Dask cluster) is marked ``slow``,
so that ``pytest -m "not slow"`` is an edit loop of a few minutes; an unmarked one that tries is
stopped with an error that says so.
"""
import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pytest

# Compiled steps go to a cache inside the checkout, never the user's own cache; re-runs reuse it.
os.environ.setdefault("MORPHJIT_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "morphjit"))


@pytest.fixture(autouse=True)
def processes_only_in_slow_tests(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        return

    def refused(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.slow")
    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refused)
