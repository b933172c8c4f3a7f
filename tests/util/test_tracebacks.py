"""Errors raised while a loss is traced carry tracebacks through the user's code only.

The trimmed traceback keeps the caller, the compiler frame that re-raises (which IPython and pytest
hide through ``__tracebackhide__``) and the user's line; tracing internals and NumPy's dispatch are
left out. Internal failures keep their full traceback, and ``MORPHJIT_TRACEBACK=full`` keeps it
for every error. The notebook side is tested in a real kernel in test_notebook.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import traceback

import numpy as np
import pytest

import morphjit as mj
from morphjit.jit import pipeline

HERE = os.path.abspath(__file__)
PACKAGE = os.path.dirname(os.path.abspath(mj.__file__))


def bad_broadcast(params, x):
    y = x[:, :2]
    return mj.sum(params["w"] * (x + y))  # <- error


def missing_key(params, x):
    return mj.sum(params["v"] * x)  # <- error


def frames_of(error):
    return [(os.path.abspath(f.filename), f.name) for f in traceback.extract_tb(error.__traceback__)]


def marked_line(fn) -> int:
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return next(start + i for i, line in enumerate(lines) if "# <- error" in line)


ARGS = ({"w": np.ones((4, 3))}, np.ones((4, 3)))


@pytest.mark.parametrize("fn, error", [(bad_broadcast, mj.ShapeError), (missing_key, KeyError)])
def test_trimmed_to_the_users_frames(fn, error):
    with pytest.raises(error) as info:
        mj.compile_loss(fn)(*ARGS)
    frames = frames_of(info.value)
    internal = [(f, name) for f, name in frames if f.startswith(PACKAGE)]
    assert internal == [(os.path.join(PACKAGE, "jit", "compiled.py"), "__call__"),
                        (os.path.join(PACKAGE, "jit", "compiled.py"), "_step")]
    assert frames[-1] == (HERE, fn.__name__)
    assert traceback.extract_tb(info.value.__traceback__)[-1].lineno == marked_line(fn)
    assert not any("numpy" in f for f, _ in frames)


def test_errors_before_tracing_point_at_the_call():
    loss = mj.compile_loss(bad_broadcast)
    with pytest.raises(mj.DtypeError) as info:
        loss({"w": np.ones((4, 3), np.int64)}, np.ones((4, 3)))
    assert [name for _, name in frames_of(info.value)] == ["test_errors_before_tracing_point_at_the_call",
                                                           "__call__", "_step"]


def test_other_entry_points_are_trimmed_too():
    loss = mj.compile_loss(bad_broadcast)
    for method in (loss.explain, loss.source, loss.program):
        with pytest.raises(mj.ShapeError) as info:
            method(*ARGS)
        assert frames_of(info.value)[-1] == (HERE, "bad_broadcast")
        assert not any(f.endswith(("tracing/tracer.py", "api/core.py")) for f, _ in frames_of(info.value))


def test_full_tracebacks_on_request(monkeypatch):
    monkeypatch.setenv("MORPHJIT_TRACEBACK", "full")
    with pytest.raises(mj.ShapeError) as info:
        mj.compile_loss(bad_broadcast)(*ARGS)
    files = [os.path.basename(f) for f, _ in frames_of(info.value)]
    assert "tracer.py" in files and "core.py" in files


def test_internal_failures_keep_their_traceback(monkeypatch):
    from morphjit.backend import plan
    monkeypatch.setattr(pipeline, "make_plan", lambda program: plan.make_plan(None))
    with pytest.raises(AttributeError) as info:
        mj.compile_loss(lambda p: mj.sum(p * p))(np.ones(3))
    names = [name for _, name in frames_of(info.value)]
    assert "_compile" in names and "plan_stage" in names and names[-1] == "make_plan"


SCRIPT = textwrap.dedent("""\
    import numpy as np
    import morphjit as mj

    @mj.compile_loss
    def loss(params, x):
        y = x[:, :2]
        return mj.sum(params["w"] * (x + y))

    loss({"w": np.ones((4, 3))}, np.ones((4, 3)))
""")


@pytest.mark.slow
@pytest.mark.parametrize("full", [False, True])
def test_plain_python_traceback(tmp_path, full):
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, MORPHJIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("MORPHJIT_TRACEBACK", None)
    if full:
        env["MORPHJIT_TRACEBACK"] = "full"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    err = done.stderr
    assert err.startswith("Traceback (most recent call last):")
    assert f'File "{script}", line 9, in <module>' in err
    assert f'File "{script}", line 7, in loss' in err
    assert "morphjit.util.errors.ShapeError: add: cannot broadcast shapes (4, 3) and (4, 2)" in err
    assert f"at {script}:7 in loss" in err
    assert ("api/core.py" in err) == full and ("tracing/tracer.py" in err) == full
    if not full:
        assert err.count('File "') == 4  # the call, __call__, _step (the re-raise), the user's line
        assert "MORPHJIT_TRACEBACK=full" in err  # the re-raising line says how to see everything
