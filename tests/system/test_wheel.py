"""The built wheel works: built from the checkout, installed (not editable) into a fresh virtual
environment, it runs the README's first example, and a second process loads the step from the
disk cache. The environment takes numba, NumPy and SciPy from the test environment's
site-packages (a path file), so nothing is downloaded but the build's own back end."""
import json
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from support.paths import ROOT
from support.readme import PYTHON_BLOCKS

FIRST_EXAMPLE = PYTHON_BLOCKS[0]
REPORT = """
import json, morphjit
stats = loss.cache_info()
print(json.dumps({"module": morphjit.__file__, "value": float(value), "misses": stats.misses, "disk_loads": stats.disk_loads}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)],
                   check=True, capture_output=True, text=True)
    (built,) = out.glob("morphjit-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_module_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "morphjit").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert not any(n.startswith(("tests/", "perf/", "examples/")) for n in names)


@pytest.mark.slow
def test_the_installed_wheel_runs_the_first_example_and_loads_it_from_the_disk_cache(wheel, tmp_path):
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True,
                   capture_output=True, text=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = tmp_path / "first_example.py"
    script.write_text(FIRST_EXAMPLE + REPORT)
    environment = {"MORPHJIT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    runs = [json.loads(subprocess.run([python, str(script)], cwd=tmp_path, env=environment, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1]) for _ in range(2)]
    for run in runs:
        assert run["module"].startswith(str(env_dir)), run["module"]   # the wheel's, not the checkout's
    assert runs[0]["value"] == runs[1]["value"]
    assert [run["misses"] for run in runs] == [1, 1] and [run["disk_loads"] for run in runs] == [0, 1]
