"""Ctrl-C during a steady-state call leaves nothing behind: an interrupt storm over compiled
calls (in a child process, so that a hang fails the test instead of blocking the suite), then
calls that must return the values of a reference step."""
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    import numpy as np
    import morphjit as mj
    sys.path.insert(0, {tests!r})
    from models import MODELS

    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=64)
    loss = mj.compile_loss(fn)
    train = mj.train_step(fn, mj.optim.adam(1e-2))
    sizes = (64, 8, 33)

    def train_three_steps(step):
        p = {{k: v.copy() for k, v in params.items()}}
        state = step.init(p)
        return [step(p, state, x[:n], y[:n]) for n in sizes], p

    # Each interrupt is raised at most once per arming: armed just before a call, disarmed by the
    # handler when it raises, so that one never lands in the handling of the last.
    armed = False

    def interrupt(signum, frame):
        global armed
        if armed:
            armed = False
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    # Ctrl-C from another process arrives at any moment, also while this one holds the GIL.
    STORM = ("import os, random, signal, sys, time\\n"
             "while os.getppid() == int(sys.argv[1]):\\n"
             "    time.sleep(random.uniform(0, 2e-4)); os.kill(int(sys.argv[1]), signal.SIGINT)")

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


def test_calls_after_an_interrupt_storm_return_the_right_values():
    code = CHILD.format(tests=os.path.dirname(__file__), seconds=3)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["interrupted"] > 0, result   # the storm did interrupt calls
