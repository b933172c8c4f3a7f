"""``mj.show_config()`` and ``python -m morphjit info``: what a bug report needs, read from the
libraries themselves (the oracle is each library's own version and setting)."""
import io
import os
import re
import subprocess
import sys

import llvmlite
import numba
import numpy as np
import pytest
import scipy

import morphjit as mj
from morphjit.__main__ import main
from morphjit.jit import config_report


def test_the_report_names_the_versions_the_process_runs_with():
    versions = config_report()["versions"]
    assert versions["morphjit"] == mj.__version__
    assert (versions["numpy"], versions["scipy"], versions["numba"], versions["llvmlite"]) == (
        np.__version__, scipy.__version__, numba.__version__, llvmlite.__version__)
    assert versions["python"] == "{}.{}.{}".format(*sys.version_info[:3])


def test_the_report_says_the_settings_threads_and_cache_in_force(monkeypatch, tmp_path):
    monkeypatch.setenv("MORPHJIT_QUIET", "1")
    monkeypatch.setenv("MORPHJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    report = config_report()
    assert report["settings"]["MORPHJIT_QUIET"] == "1"
    assert report["settings"]["MORPHJIT_CACHE_DIR"] == str(tmp_path)
    assert report["blas and threads"]["OPENBLAS_NUM_THREADS"] == "3"
    assert report["cache"]["directory"] == str(tmp_path) and report["cache"]["entries"] == "0"
    monkeypatch.setenv("MORPHJIT_CACHE", "0")
    assert config_report()["cache"] == {"disk cache": "off (MORPHJIT_CACHE)"}
    monkeypatch.setenv("MORPHJIT_VECMATH", "off")
    assert config_report()["cpu"]["vector math"].startswith(("scalar calls (MORPHJIT_VECMATH is off)", "glibc"))


def test_show_config_prints_every_section_and_the_command_line_prints_the_same(capsys):
    out = io.StringIO()
    mj.show_config(file=out)
    printed = out.getvalue()
    for section, items in config_report().items():
        assert f"{section}:" in printed
        assert all(item in printed for item in items)
    main(["info"])
    assert capsys.readouterr().out.splitlines()[:4] == printed.splitlines()[:4]


@pytest.mark.slow
def test_python_dash_m_morphjit_info_runs_in_a_fresh_process():
    result = subprocess.run([sys.executable, "-m", "morphjit", "info"], capture_output=True, text=True,
                            env={**os.environ, "MORPHJIT_QUIET": "1"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert re.search(rf"^  numba +{re.escape(numba.__version__)}$", result.stdout, re.M)
    assert re.search(r"^  MORPHJIT_QUIET +1$", result.stdout, re.M)
