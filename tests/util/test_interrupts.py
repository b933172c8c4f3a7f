"""Ctrl-C leaves nothing behind: during a steady-state call (an interrupt storm over compiled
calls, then calls that must return the values of a reference step), and while a trace starts or
ends (a SIGINT at each point where Python checks for one, then a storm), which replaces library
functions and puts them back. Each runs in a child process, so that a hang fails the test instead
of blocking the suite."""
import json
import subprocess
import sys
import textwrap

import pytest

from support.paths import TESTS

# Each interrupt is raised at most once per arming: armed just before a call, disarmed by the
# handler when it raises, so that one never lands in the handling of the last. Ctrl-C comes from
# another process (STORM, started with this one's pid), so it arrives at any moment, also while
# this one holds the GIL.
ARMED = """
armed = False

def interrupt(signum, frame):
    global armed
    if armed:
        armed = False
        raise KeyboardInterrupt

signal.signal(signal.SIGINT, interrupt)
STORM = ("import os, random, signal, sys, time\\n"
         "while os.getppid() == int(sys.argv[1]):\\n"
         "    time.sleep(random.uniform(0, 2e-4)); os.kill(int(sys.argv[1]), signal.SIGINT)")
"""

CHILD = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    import numpy as np
    import morphjit as mj
    sys.path.insert(0, {tests!r})
    from support.models import MODELS

    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=64)
    loss = mj.compile_loss(fn)
    train = mj.train_step(fn, mj.optim.adam(1e-2))
    sizes = (64, 8, 33)

    def train_three_steps(step):
        p = {{k: v.copy() for k, v in params.items()}}
        state = step.init(p)
        return [step(p, state, x[:n], y[:n]) for n in sizes], p

""") + ARMED + textwrap.dedent("""
    p = {{k: v.copy() for k, v in params.items()}}
    state = train.init(p)
    loss(params, x, y), train(p, state, x, y)   # compiled before the storm
    out = {{k: np.empty_like(v) for k, v in params.items()}}
    storming = subprocess.Popen([sys.executable, "-c", STORM, str(os.getpid())])
    calls = interrupted = 0
    deadline = time.monotonic() + {seconds}
    while time.monotonic() < deadline:
        n = sizes[calls % 3]
        try:
            armed = True
            if calls % 3 == 0:
                loss(params, x[:n], y[:n])
            elif calls % 3 == 1:
                loss(params, x[:n], y[:n], out=out)
            else:
                train(p, state, x[:n], y[:n])
            armed = False
        except KeyboardInterrupt:
            interrupted += 1
        calls += 1
    armed = False
    storming.kill()
    storming.wait()

    reference = mj.compile_loss(fn, cache=False)
    for n in sizes:
        got, want = loss(params, x[:n], y[:n]), reference(params, x[:n], y[:n])
        assert got[0] == want[0] and all((got[1][k] == want[1][k]).all() for k in params), n
    assert train_three_steps(train)[0] == train_three_steps(mj.train_step(fn, mj.optim.adam(1e-2), cache=False))[0]
    print(json.dumps(dict(calls=calls, interrupted=interrupted)))
""")


@pytest.mark.slow
def test_calls_after_an_interrupt_storm_return_the_right_values():
    code = CHILD.format(tests=str(TESTS), seconds=3)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["interrupted"] > 0, result   # the storm did interrupt calls


# Starting and ending a trace replaces library functions and puts them back (morphjit.substitutes),
# and makes the trace the thread's current one; Ctrl-C at any point must leave neither half done.
TRACING = textwrap.dedent("""
    import importlib, json, os, random, signal, subprocess, sys, time
    import numpy as np
    import scipy.stats
    trace, function, substitutes = (importlib.import_module(f"morphjit.tracing.{{m}}")
                                    for m in ("tracer", "function", "substitutes"))

    x = np.ones((4, 2))
    # The first trace loads the substitutes for scipy.stats
    function.trace_with_tree(lambda x: scipy.stats.norm.logpdf(x) + np.arange(x.shape[0])[:, None], (x,), {{0}})
    ORIGINALS = {{(owner, name): vars(owner)[name] for kind in (substitutes.ANY_TRACE, substitutes.SYMBOLIC_EXTENT)
                 for owner, name in kind.attributes()}}
    HANDLER = signal.getsignal(signal.SIGINT)
    missing = []   # substitutes that a trace ran without

    def traced(x):
        missing.extend(k for k, original in ORIGINALS.items() if vars(k[0])[k[1]] is original)
        function.trace_with_tree(lambda y: y, (np.ones(2),))   # a trace within a trace
        return x

    def trace_once():
        function.trace_with_tree(traced, (x,), {{0}})

    def left_behind() -> list:
        found = [f"{{owner.__name__}}.{{name}} replaced" for (owner, name), original in ORIGINALS.items()
                 if vars(owner)[name] is not original]
        found += ["a current trace"] * (trace.current_trace() is not None)
        found += ["another SIGINT handler"] * (signal.getsignal(signal.SIGINT) is not HANDLER)
        return found
""")

SWEEP = TRACING + textwrap.dedent("""
    def interrupted_at(k):
        '''Trace once with a SIGINT arriving at the k-th point outside this script where Python
        checks for signals (a function starts, a call returns), running the handler in place as a
        real one would; whether KeyboardInterrupt came out, and how many points there were.'''
        seen = 0
        def profile(frame, event, arg):
            nonlocal seen
            if event != "c_call" and frame.f_code.co_filename != "<string>":
                seen += 1
                if seen == k:
                    signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
        sys.setprofile(profile)
        try:
            trace_once()
            return False, seen
        except KeyboardInterrupt:
            return True, seen
        finally:
            sys.setprofile(None)

    failures, k = [], 1
    while True:
        interrupted, seen = interrupted_at(k)
        if k > seen:
            break
        problems = left_behind() + ["no KeyboardInterrupt"] * (not interrupted)
        del missing[:]
        trace_once()   # the next trace has its substitutes
        problems += ["the next trace lacked substitutes"] * bool(missing) + left_behind()
        if problems:
            failures.append((k, problems))
        k += 1
    print(json.dumps(dict(points=k - 1, failures=failures[:5], failed=len(failures))))
""")

TRACE_STORM = TRACING + ARMED + textwrap.dedent("""
    HANDLER = interrupt
    storming = subprocess.Popen([sys.executable, "-c", STORM, str(os.getpid())])
    traces = interrupted = leaks = 0
    deadline = time.monotonic() + {seconds}
    while time.monotonic() < deadline:
        del missing[:]
        try:
            armed = True
            trace_once()
            armed = False
        except KeyboardInterrupt:
            interrupted += 1
        armed = False
        traces += 1
        if left_behind() or missing:
            leaks += 1
            break   # what is left behind stays: the next traces would count it again
    storming.kill()
    storming.wait()
    print(json.dumps(dict(traces=traces, interrupted=interrupted, leaks=leaks, left=left_behind())))
""")


def run_child(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_interrupt_anywhere_in_starting_or_ending_a_trace_leaves_nothing_behind():
    """A SIGINT at each point of a trace (nested, with a symbolic batch size) where Python checks
    for signals, one per trace: KeyboardInterrupt comes out, every replaced function is NumPy's or
    SciPy's own again, no trace is current, the handler is the one before, and the next trace has
    its substitutes."""
    result = run_child(SWEEP.format())
    assert result["points"] > 100 and result["failed"] == 0, result


@pytest.mark.slow
def test_an_interrupt_storm_over_traces_leaves_nothing_behind():
    result = run_child(TRACE_STORM.format(seconds=2))
    assert result["interrupted"] > 100 and result["leaks"] == 0, result
