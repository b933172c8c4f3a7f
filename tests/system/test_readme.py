"""Every code block of the README runs as written: the Python blocks in order, in one namespace
(as a reader would type them into one session), and the shell commands that start with
``python`` (the ``make`` targets are what CI itself runs; a line marked "not run by the tests"
is skipped)."""
import re
import subprocess
import sys

import pytest
from support.paths import ROOT
from support.readme import PYTHON_BLOCKS, README
SHELL_LINES = [line.strip() for block in re.findall(r"```sh\n(.*?)```", README, flags=re.S)
               for line in block.splitlines() if line.strip().startswith("python ")
               and "not run by the tests" not in line]


def test_readme_has_examples():
    assert len(PYTHON_BLOCKS) >= 5 and SHELL_LINES


@pytest.mark.slow   # a Dask cluster's worker processes
def test_python_blocks_run_in_order(capsys):
    namespace = {}
    for index, block in enumerate(PYTHON_BLOCKS):
        exec(compile(block, f"README.md block {index}", "exec"), namespace)
    assert set(namespace["grads"]) == set(namespace["params"])
    assert namespace["loss"].cache_info().misses == 1          # every batch size: one compile
    assert namespace["bag_of_embeddings"].cache_info().misses == 1   # the pick's arange too
    out = capsys.readouterr().out
    assert "matmul" in out and "at README.md block" in out     # the error names the user's line
    assert "<compiled loss 'loss': 1 signature" in out
    assert "index argument tokens (at README.md" in out and "must lie in [-20, 20)" in out and set(namespace["emb_grads"]) == {"E", "W"}


@pytest.mark.slow
@pytest.mark.parametrize("line", SHELL_LINES)
def test_shell_commands_run(line):
    command = [sys.executable] + line.split("#")[0].split()[1:]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
