"""The on-disk cache: warm starts in fresh processes, races, damaged entries, unsafe directories."""

import json
import os
import stat
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from morphjit.cache.store import CacheWarning
from morphjit.cache import cache_info, clear_cache, load_module, loaded_from_disk
from support.paths import ROOT


# Shaped like codegen output: lazy njit functions, a GEMM through np.dot and a fused loop.
PROGRAM = '''\
# morphjit cache test program: {tag}
import numba
import numpy as np


@numba.njit
def scale(x):
    return x * 2.0


@numba.njit
def step(a, b, out):
    np.dot(a, b, out)
    total = 0.0
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = scale(out[i, j])
            total += out[i, j]
    return total
'''

# Loads the program given as argv[1] and reports whether numba compiled or read the disk.
CHILD = textwrap.dedent('''
    import json, sys
    import numpy as np
    from morphjit.cache import load_module, loaded_from_disk

    module = load_module(open(sys.argv[1]).read())
    a, b, out = np.arange(12.0).reshape(3, 4), np.ones((4, 2)), np.empty((3, 2))
    total = module.step(a, b, out)
    correct = np.allclose(out, 2.0 * (a @ b)) and np.isclose(total, out.sum())
    print(json.dumps({"from_disk": loaded_from_disk(module.step), "correct": bool(correct)}))
''')


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("MORPHJIT_CACHE_DIR", str(directory))
    monkeypatch.delenv("MORPHJIT_CACHE", raising=False)
    return directory


@pytest.fixture
def program(request):
    """A program no other test renders, so no test sees another's modules."""
    return PROGRAM.format(tag=request.node.name)


@pytest.fixture
def start_child(tmp_path, cache_dir, program):
    """Start a fresh interpreter that runs `program` with the test's cache directory."""
    source_file = tmp_path / "program.txt"
    source_file.write_text(program)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start():
        return subprocess.Popen([sys.executable, "-c", CHILD, str(source_file)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return start


def report(child):
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def run_step(module):
    a, b, out = np.arange(12.0).reshape(3, 4), np.ones((4, 2)), np.empty((3, 2))
    total = module.step(a, b, out)
    np.testing.assert_allclose(out, 2.0 * (a @ b))
    assert total == pytest.approx(out.sum())
    return module.step


def numba_file(cache_dir, module_name, suffix):
    [path] = (cache_dir / "__pycache__").glob(f"{module_name}.step-*{suffix}")
    return path


def truncate_to_half(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def run_cli(*args):
    result = subprocess.run([sys.executable, "-m", "morphjit", *args], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_round_trip_stores_one_private_entry(cache_dir, program):
    module = load_module(program)
    run_step(module)
    info = cache_info()
    assert info.directory == cache_dir and info.entries == 1
    [entry] = info.per_entry
    assert entry.name == module.__name__
    assert entry.bytes == info.total_bytes > len(program)  # numba's machine code is counted
    assert (cache_dir / f"{module.__name__}.py").read_text() == program
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    run_step(load_module(program))
    assert cache_info().entries == 1


@pytest.mark.slow
def test_fresh_process_loads_machine_code_from_disk(cache_dir, program, start_child):
    first = run_step(load_module(program))
    assert not loaded_from_disk(first) and first.stats.cache_misses
    assert report(start_child()) == {"from_disk": True, "correct": True}


@pytest.mark.slow
def test_concurrent_first_compiles_leave_one_entry(cache_dir, start_child):
    racers = [start_child(), start_child()]
    reports = [report(child) for child in racers]
    assert all(r["correct"] for r in reports)
    # The entry lock is held across compile and save, so the later process reads the earlier's.
    assert sorted(r["from_disk"] for r in reports) == [False, True]
    assert cache_info().entries == 1
    assert report(start_child())["from_disk"]


@pytest.mark.slow
def test_damaged_module_file_is_rebuilt(cache_dir, program, start_child):
    assert not report(start_child())["from_disk"]
    [entry] = cache_info().per_entry
    truncate_to_half(cache_dir / f"{entry.name}.py")
    with pytest.warns(CacheWarning, match="damaged"):
        module = load_module(program)
    run_step(module)
    assert (cache_dir / f"{entry.name}.py").read_text() == program
    assert report(start_child()) == {"from_disk": True, "correct": True}


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".nbi", ".1.nbc"], ids=["index", "data"])
def test_damaged_numba_file_is_rebuilt(cache_dir, program, start_child, suffix):
    assert not report(start_child())["from_disk"]
    [entry] = cache_info().per_entry
    truncate_to_half(numba_file(cache_dir, entry.name, suffix))
    with pytest.warns(CacheWarning, match="damaged numba cache"):
        step = run_step(load_module(program))
    assert not loaded_from_disk(step)
    assert report(start_child()) == {"from_disk": True, "correct": True}


def test_unwritable_directory_warns_once_per_process(tmp_path, monkeypatch, program):
    (tmp_path / "afile").write_text("")  # root ignores mode bits; a file in the path stops mkdir
    monkeypatch.setenv("MORPHJIT_CACHE_DIR", str(tmp_path / "afile" / "cache"))
    with pytest.warns(CacheWarning, match="cannot use the morphjit cache"):
        run_step(load_module(program))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        run_step(load_module(program.replace("test program", "second program")))


@pytest.mark.slow
def test_directory_writable_by_others_is_not_used(cache_dir, program, start_child):
    assert not report(start_child())["from_disk"]
    cache_dir.chmod(0o777)
    with pytest.warns(CacheWarning, match="writable by group or others"):
        module = load_module(program)
    assert not loaded_from_disk(run_step(module))
    assert not hasattr(module, "__file__")  # built in memory, not from the cache directory


@pytest.mark.slow
def test_numba_file_writable_by_others_is_not_loaded_but_rebuilt(cache_dir, program, start_child):
    assert not report(start_child())["from_disk"]
    [entry] = cache_info().per_entry
    numba_file(cache_dir, entry.name, ".nbi").chmod(0o666)
    with pytest.warns(CacheWarning, match="writable by group or others"):
        assert not loaded_from_disk(run_step(load_module(program)))
    assert stat.S_IMODE(numba_file(cache_dir, entry.name, ".nbi").stat().st_mode) == 0o600
    assert report(start_child()) == {"from_disk": True, "correct": True}


def test_cache_off_writes_nothing(cache_dir, program, monkeypatch):
    run_step(load_module(program, cache=False))
    monkeypatch.setenv("MORPHJIT_CACHE", "0")
    run_step(load_module(program))
    assert not cache_dir.exists()


def test_clear_cache_removes_modules_and_machine_code(cache_dir, program):
    run_step(load_module(program))
    assert clear_cache() == 1
    assert cache_info().entries == 0
    assert sorted(cache_dir.iterdir()) == [cache_dir / "__pycache__", cache_dir / "key"]
    assert list((cache_dir / "__pycache__").iterdir()) == []


@pytest.mark.slow
def test_cli_reports_and_clears(cache_dir, program):
    module = load_module(program)  # never called: the entry holds only the module file
    info = run_cli("cache", "info")
    assert str(cache_dir) in info and "1 entry" in info and module.__name__ in info
    assert f"removed 1 entry ({len(program)} B)" in run_cli("cache", "clear")
    assert "0 entries, 0 B" in run_cli("cache", "info")
    assert "cache" in run_cli("--help")


def test_name_hint_must_be_an_identifier_fragment(cache_dir, program):
    with pytest.raises(ValueError, match="name_hint"):
        load_module(program, name_hint="../step")


# A loss reading constants that are not C-contiguous (a transposed view, a Fortran-ordered array).
CONSTANTS_CHILD = textwrap.dedent('''
    import json
    import numpy as np
    import morphjit as mj

    rng = np.random.default_rng(0)
    W, M, x = rng.standard_normal((4, 3)), np.asfortranarray(rng.standard_normal((5, 3))), rng.standard_normal((5, 3))
    step = mj.compile_loss(lambda x: np.sum((x @ W.T) ** 2) + np.sum(x * M))
    value, grad = step(x)
    correct = np.isclose(value, np.sum((x @ W.T) ** 2) + np.sum(x * M), rtol=1e-12) and \\
        np.allclose(grad, 2 * (x @ W.T) @ W + M, rtol=1e-12)
    print(json.dumps({"disk_loads": step.cache_info().disk_loads, "correct": bool(correct)}))
''')


@pytest.mark.slow
def test_a_fresh_process_reads_constants_of_any_layout_right_from_the_disk_cache(cache_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def child():
        done = subprocess.run([sys.executable, "-c", CONSTANTS_CHILD], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    assert child() == {"disk_loads": 0, "correct": True}
    assert child() == {"disk_loads": 1, "correct": True}
