"""The disk cache under attack and damage: unsafe paths, swapped files, flipped bits, foreign
entries, read-only caches, interruptions."""

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import pytest

from morphjit.cache.store import CacheWarning
from morphjit.cache import cache_dir, load_module, loaded_from_disk, policy as disk_cache
from test_cache import PROGRAM, ROOT, numba_file, run_step

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")

# Loads argv[1]'s program, calls it, reports where its machine code came from and what warned.
CHILD = textwrap.dedent('''
    import json, pathlib, sys, warnings
    import numpy as np
    from morphjit.cache import load_module, loaded_from_disk

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = load_module(pathlib.Path(sys.argv[1]).read_text())
        a, b, out = np.arange(12.0).reshape(3, 4), np.ones((4, 2)), np.empty((3, 2))
        total = module.step(a, b, out)
    correct = np.allclose(out, 2.0 * (a @ b)) and np.isclose(total, out.sum())
    print(json.dumps({"from_disk": loaded_from_disk(module.step), "correct": bool(correct),
                      "in_cache": hasattr(module, "__file__"),
                      "warnings": [str(w.message) for w in caught]}))
''')


@pytest.fixture
def program(request):
    return PROGRAM.format(tag=request.node.name)


@pytest.fixture
def shared_tmp():
    """A directory under /tmp that other users can reach (pytest's tmp_path is private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="morphjit-test-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


def run_child(program_file, directory, *, user=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MORPHJIT_CACHE_DIR": str(directory)}
    result = subprocess.run([sys.executable, "-c", CHILD, str(program_file)], env=env, cwd="/",
                            capture_output=True, text=True, timeout=120, user=user, group=user,
                            extra_groups=None if user is None else [])
    assert result.returncode == 0, f"child died with {result.returncode}:\n{result.stderr}"
    return json.loads(result.stdout.splitlines()[-1])


def use_cache(monkeypatch, directory):
    monkeypatch.setenv("MORPHJIT_CACHE_DIR", str(directory))
    monkeypatch.delenv("MORPHJIT_CACHE", raising=False)


def snapshot(directory):
    return {path: (path.stat().st_mtime_ns, path.read_bytes())
            for path in sorted(directory.rglob("*")) if path.is_file()}


# ---------------------------------------------------------------- where the cache may live


@pytest.mark.parametrize("via_symlink", [False, True], ids=["ancestor", "symlink in ancestor"])
def test_ancestor_writable_by_others_is_refused(tmp_path, monkeypatch, program, via_symlink):
    shared = tmp_path / "shared"
    (shared / "project").mkdir(parents=True)
    shared.chmod(0o777)  # no sticky bit: anyone may rename `project` away
    if via_symlink:
        (tmp_path / "real").mkdir()
        (shared / "link").symlink_to(tmp_path / "real")
        use_cache(monkeypatch, shared / "link" / "cache")
    else:
        use_cache(monkeypatch, shared / "project" / "cache")
    with pytest.warns(CacheWarning, match=f"{shared} is writable by group or others"):
        module = load_module(program)
    assert not hasattr(module, "__file__")
    run_step(module)


def test_sticky_ancestor_is_accepted(tmp_path, monkeypatch, program):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others cannot rename what we own
    use_cache(monkeypatch, shared / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        module = load_module(program)
    assert module.__file__ == str(shared / "cache" / f"{module.__name__}.py")


def test_home_and_xdg_that_are_not_absolute_are_ignored(monkeypatch):
    import pwd
    monkeypatch.delenv("MORPHJIT_CACHE_DIR")
    monkeypatch.setenv("HOME", "")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert cache_dir() == Path(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "morphjit")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/cache")
    assert cache_dir() == Path("/somewhere/cache/morphjit")


# ---------------------------------------------------------------- swapped and damaged files


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def plant_pickles(cache, name, marker):
    """Replace entry `name`'s numba files with pickles that create `marker` when loaded."""
    for path in (cache / "__pycache__").glob(f"{name}.*"):
        path.write_bytes(pickle.dumps(_Evil(marker)))


@needs_root
def test_swap_by_another_user_is_never_unpickled(shared_tmp, monkeypatch, program):
    """Another user renames the victim's cache away between load and first call, puts their own."""
    shared = shared_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    use_cache(monkeypatch, shared / "cache")
    (shared / "cache").mkdir(mode=0o700)  # the victim's private cache inside a shared folder
    marker = shared_tmp / "pwned"
    with pytest.warns(CacheWarning, match="writable by group or others"):
        module = load_module(program.replace("test program", "victim program"))
    name = disk_cache._module_name(program.replace("test program", "victim program"), "step")
    index = (f"{name}.step-{module.step.py_func.__code__.co_firstlineno}"
             f".py{sys.version_info[0]}{sys.version_info[1]}{sys.abiflags}.nbi")
    pid = os.fork()
    if pid == 0:  # the attacker
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.rename(shared / "cache", shared / "old")
            (shared / "cache" / "__pycache__").mkdir(parents=True)
            (shared / "cache" / "__pycache__" / index).write_bytes(pickle.dumps(_Evil(marker)))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert (shared / "old").exists()  # the swap happened
    run_step(module)
    assert not marker.exists()


def test_files_swapped_after_loading_are_not_unpickled(tmp_path, monkeypatch, program):
    use_cache(monkeypatch, tmp_path / "cache")
    second = program
    run_step(load_module(second))  # writes its machine code
    module = load_module(second)  # checked now; the files are swapped before the first call
    marker = tmp_path / "pwned"
    plant_pickles(tmp_path / "cache", module.__name__, marker)
    with pytest.warns(CacheWarning, match="authentication code does not match"):
        step = run_step(module)
    assert not marker.exists() and not loaded_from_disk(step)


def flip_one_bit(path, rng):
    data = bytearray(path.read_bytes())
    offset = rng.randrange(len(data))
    data[offset] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return offset


@pytest.mark.slow
def test_a_flipped_bit_in_any_file_is_a_warned_rebuild(tmp_path, program):
    """Each file kind gets a flipped bit in turn; every process survives, warns, answers right."""
    program_file = tmp_path / "program.txt"
    program_file.write_text(program)
    directory = tmp_path / "cache"
    assert not run_child(program_file, directory)["from_disk"]
    entry = disk_cache._module_name(program, "step")
    files = {"index": lambda: numba_file(directory, entry, ".nbi"),
             "data": lambda: numba_file(directory, entry, ".1.nbc"),
             "module": lambda: directory / f"{entry}.py",
             "key": lambda: directory / "key"}
    fragments = {"index": ".nbi", "data": ".nbc", "module": f"{entry}.py is damaged",
                 "key": ".nbi"}  # a changed key fails the first file read, the index
    rng = random.Random(22)
    for kind, path in files.items():
        offset = flip_one_bit(path(), rng)
        damaged = run_child(program_file, directory)
        assert damaged["correct"] and damaged["in_cache"], (kind, offset, damaged)
        # Only this kind's damage is reported: the previous one was rebuilt.
        assert damaged["warnings"] and all("damaged" in w and fragments[kind] in w
                                           for w in damaged["warnings"]), (kind, offset, damaged)
    assert run_child(program_file, directory) == {
        "from_disk": True, "correct": True, "in_cache": True, "warnings": []}


# ---------------------------------------------------------------- foreign entries, read-only caches


@pytest.mark.parametrize("intruder", ["directory", "foreign file", "file as __pycache__"])
def test_entry_replaced_by_a_directory_or_foreign_file_is_healed(tmp_path, monkeypatch, program,
                                                                  intruder):
    use_cache(monkeypatch, tmp_path / "cache")
    name = disk_cache._module_name(program, "step")
    (tmp_path / "cache").mkdir(mode=0o700)
    module_path = tmp_path / "cache" / f"{name}.py"
    intruder_path = tmp_path / "cache" / "__pycache__" if "pycache" in intruder else module_path
    if intruder == "directory":
        (module_path / "inside").mkdir(parents=True)
    else:
        intruder_path.write_text("something else")
        os.chown(intruder_path, NOBODY, NOBODY)
    with pytest.warns(CacheWarning, match=f"removing {intruder_path}"):
        module = load_module(program)
    run_step(module)
    assert module_path.read_text() == program
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert loaded_from_disk(run_step(load_module(program)))


def as_nobody(function):
    """Run `function` in a forked child with the uid and gids of `nobody`; return what it returns.

    Forked rather than started: the interpreter may live where `nobody` cannot read (/root).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = {"value": function()}
            result["warnings"] = [str(w.message) for w in caught]
        except BaseException as exc:
            result = {"error": repr(exc)}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        output = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(output)


def load_and_run(source):
    module = load_module(source)
    step = run_step(module)
    return {"from_disk": loaded_from_disk(step), "in_cache": hasattr(module, "__file__")}


@pytest.mark.slow
@needs_root
def test_read_only_prewarmed_cache_is_loaded_without_writes(shared_tmp, monkeypatch, program):
    program_file = shared_tmp / "program.txt"
    program_file.write_text(program)
    directory = shared_tmp / "cache"
    assert not run_child(program_file, directory)["from_disk"]  # root pre-warms it ...
    subprocess.run(["chmod", "-R", "a+rX", str(shared_tmp)], check=True)  # ... for everyone
    use_cache(monkeypatch, directory)
    before = snapshot(directory)
    assert as_nobody(lambda: load_and_run(program)) == {
        "value": {"from_disk": True, "in_cache": True}, "warnings": []}
    missing = as_nobody(lambda: load_and_run(program.replace("test program", "other program")))
    assert missing["value"] == {"from_disk": False, "in_cache": False}  # compiled in memory
    assert any("read-only" in w for w in missing["warnings"])
    assert snapshot(directory) == before


# ---------------------------------------------------------------- interruptions

INTERRUPTED_CHILD = textwrap.dedent('''
    import json, pathlib, sys, warnings
    import numpy as np
    import numba.core.base, numba.core.compiler
    from morphjit.cache import load_module

    def interrupt_once(owner, name, exception):
        original = getattr(owner, name)
        def interrupted(*args, **kwargs):
            setattr(owner, name, original)
            raise exception
        setattr(owner, name, interrupted)

    # Ctrl-C while numba installs its registries on the first call; then numba fails inside.
    interrupt_once(numba.core.base.BaseContext, "refresh", KeyboardInterrupt)
    module = load_module(pathlib.Path(sys.argv[1]).read_text())
    a, b, out = np.arange(12.0).reshape(3, 4), np.ones((4, 2)), np.empty((3, 2))
    outcomes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for attempt in range(3):
            if attempt == 1:
                interrupt_once(numba.core.compiler.CompileResult, "_rebuild",
                               KeyError("a registration lost to the interruption"))
            try:
                module.step(a, b, out)
                outcomes.append("ok")
            except KeyboardInterrupt:
                outcomes.append("interrupted")
            except Exception as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"outcomes": outcomes, "warnings": [str(w.message) for w in caught]}))
''')


@pytest.mark.slow
def test_interrupted_first_call_leaves_the_cache_alone(tmp_path, program):
    program_file = tmp_path / "program.txt"
    program_file.write_text(program)
    directory = tmp_path / "cache"
    run_child(program_file, directory)
    before = snapshot(directory / "__pycache__")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MORPHJIT_CACHE_DIR": str(directory)}
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_CHILD, str(program_file)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    interrupted, failed, recovered = report["outcomes"]
    assert interrupted == "interrupted" and recovered == "ok"
    assert failed.startswith("RuntimeError") and "restart the process" in failed
    assert report["warnings"] == []
    assert snapshot(directory / "__pycache__") == before


@pytest.mark.parametrize("damage", ["truncated", "a directory"])
def test_unusable_key_is_replaced(tmp_path, monkeypatch, program, damage):
    use_cache(monkeypatch, tmp_path / "cache")
    run_step(load_module(program))
    key = tmp_path / "cache" / "key"
    if damage == "truncated":
        key.write_bytes(key.read_bytes()[:5])
    else:
        key.unlink()
        key.mkdir()
    second = program.replace("test program", "second program")
    with pytest.warns(CacheWarning, match="key .* is unusable"):
        run_step(load_module(second))
    assert len(key.read_bytes()) == 32
