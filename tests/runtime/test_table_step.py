"""Table steps (morphjit.table): a large program's step as rows of kernel calls run by one generic
native loop. Forced on small programs with MORPHJIT_TABLE_STEP=1 and checked against the unrolled
step: values and gradients, range-check errors, batch sizes, threads, the disk cache across
processes, and train_step's in-place updates."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import morphjit as mj
from support.gradcheck import check_loss_grads_fd, flat_leaves, unflatten_like
from support.models import MODELS
from support.threads import run_threads
from support.paths import TESTS

TABLE, UNROLLED = "1", "1000000"


def compiled(form, monkeypatch, fn, args):
    """``fn`` compiled for ``args`` (now: the form is chosen when the step compiles)."""
    monkeypatch.setenv("MORPHJIT_TABLE_STEP", form)
    loss = mj.compile_loss(fn, cache=False)
    loss.step_for(*args)
    return loss


def embedding_loss(params, idx, y):
    """A gather (its indices range-checked) into a small MLP with labels (range-checked too)."""
    h = mj.tanh(params["E"][idx].sum(axis=1) @ params["W"])
    return mj.mean(mj.softmax_cross_entropy(h, y))


def embedding_args(batch=6):
    rng = np.random.default_rng(3)
    params = {"E": rng.normal(size=(9, 4)), "W": rng.normal(size=(4, 3))}
    return params, rng.integers(0, 9, (batch, 2)), rng.integers(0, 3, batch)


def test_the_table_step_computes_what_the_unrolled_step_does(monkeypatch):
    fn, args = MODELS["mlp2"](np.float64)
    table, unrolled = compiled(TABLE, monkeypatch, fn, args), compiled(UNROLLED, monkeypatch, fn, args)
    source = table.source(*args)
    assert "table.Step(E, [" in source and "    k0(" in source and "def step(" not in source
    assert "def step(" in unrolled.source(*args)
    for batch in (16, 5, 16, 7):   # batch-polymorphic: frames per batch size, reused
        x, y = args[1][:batch], args[2][:batch]
        (value, grads), (expected, expected_grads) = table(args[0], x, y), unrolled(args[0], x, y)
        assert value == expected
        for k in expected_grads:
            np.testing.assert_array_equal(grads[k], expected_grads[k])
    params, x, y = args
    _, grads = table(*args)
    check_loss_grads_fd(lambda leaves: table(unflatten_like(params, leaves), x, y)[0], flat_leaves(params),
                        flat_leaves(grads), rng=np.random.default_rng(0), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("position, bad, error, fragment", [
    ("labels", 3, ValueError, "y[4] is 3"),
    ("indices", -10, IndexError, "-10"),
])
def test_a_range_check_fails_as_in_the_unrolled_step(monkeypatch, position, bad, error, fragment):
    params, idx, y = embedding_args()
    if position == "labels":
        y[4] = bad
    else:
        idx[4, 1] = bad
    good = embedding_args()
    table = compiled(TABLE, monkeypatch, embedding_loss, good)
    unrolled = compiled(UNROLLED, monkeypatch, embedding_loss, good)
    assert "table.check(" in table.source(*embedding_args())
    with pytest.raises(error) as raised:
        table(params, idx, y)
    with pytest.raises(error) as expected:
        unrolled(params, idx, y)
    assert str(raised.value) == str(expected.value) and fragment in str(raised.value)
    value, _ = table(*good)   # the step runs on after an error
    assert value == unrolled(*good)[0]


def test_a_slice_with_traced_bounds_numpy_does_not_fill_fails_as_in_the_unrolled_step(monkeypatch):
    def loss(E, t):
        return mj.sum(mj.tanh(E[t:t + 2] @ E.T) ** 2)

    E = np.random.default_rng(4).normal(size=(5, 2))
    table, unrolled = compiled(TABLE, monkeypatch, loss, (E, 0)), compiled(UNROLLED, monkeypatch, loss, (E, 0))
    with pytest.raises(IndexError, match="lacks its element") as raised:   # x[-2:0] is empty
        table(E, -2)
    with pytest.raises(IndexError) as expected:
        unrolled(E, -2)
    assert str(raised.value) == str(expected.value)
    for t in (-4, 4):   # x[4:6] is one row: a step of its own, of the form the variable names
        monkeypatch.setenv("MORPHJIT_TABLE_STEP", TABLE)
        value = table(E, t)[0]
        monkeypatch.setenv("MORPHJIT_TABLE_STEP", UNROLLED)
        assert value == unrolled(E, t)[0] == pytest.approx(np.sum(np.tanh(E[t:t + 2] @ E.T) ** 2), rel=1e-12)


def test_a_nan_reaches_the_loss(monkeypatch):
    fn, args = MODELS["mlp2"](np.float64)
    params = dict(args[0], W1=args[0]["W1"].copy())
    params["W1"][0, 0] = np.nan
    value, grads = compiled(TABLE, monkeypatch, fn, args)(params, *args[1:])
    assert np.isnan(value) and np.isnan(grads["W1"]).any()


def test_two_threads_call_one_table_step(monkeypatch):
    fn, args = MODELS["mlp2"](np.float64)
    table = compiled(TABLE, monkeypatch, fn, args)
    expected = {batch: table(args[0], args[1][:batch], args[2][:batch]) for batch in (16, 9)}
    results = []

    def work(i):
        batch = (16, 9)[i % 2]
        for _ in range(50):
            results.append((batch, table(args[0], args[1][:batch], args[2][:batch])))

    run_threads(work, n=2)
    for batch, (value, grads) in results:
        assert value == expected[batch][0]
        assert all(np.array_equal(grads[k], expected[batch][1][k]) for k in grads)


def test_train_step_updates_in_place_through_a_table(monkeypatch):
    fn, args = MODELS["mlp2"](np.float64)
    results = {}
    for form in (TABLE, UNROLLED):
        monkeypatch.setenv("MORPHJIT_TABLE_STEP", form)
        step = mj.train_step(fn, mj.optim.sgd(0.1), cache=False)
        params = {k: v.copy() for k, v in args[0].items()}
        state = step.init(params)
        losses = [step(params, state, *args[1:]) for _ in range(3)]
        assert ("table.Step" in step.steps()[0].source) == (form == TABLE)
        results[form] = losses, params
    assert results[TABLE][0] == results[UNROLLED][0]
    for k in args[0]:
        np.testing.assert_array_equal(results[TABLE][1][k], results[UNROLLED][1][k])


def test_explain_shows_the_table(monkeypatch):
    fn, args = MODELS["mlp2"](np.float64)
    text = str(compiled(TABLE, monkeypatch, fn, args).explain(*args))
    assert "table.Step(E, [" in text


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import morphjit as mj
    from morphjit.runtime import kernels
    sys.path.insert(0, {tests!r})
    from support.models import MODELS
    fn, args = MODELS["mlp2"](np.float64)
    step = mj.compile_loss(fn)
    value, grads = step(*args)
    print(json.dumps(dict(value=float(value), table="table.Step" in step.source(*args),
                          disk_loads=step.cache_info().disk_loads, kernels=kernels.statistics())))
""")


@pytest.mark.slow
def test_a_fresh_process_loads_a_table_step_from_disk(tmp_path):
    env = dict(os.environ, MORPHJIT_CACHE_DIR=str(tmp_path), MORPHJIT_TABLE_STEP=TABLE)
    code = CHILD.format(tests=str(TESTS))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["table"] and warm["table"] and warm["value"] == cold["value"]
    assert cold["kernels"]["compiled"] > 0 and cold["disk_loads"] == 0
    assert warm["kernels"] == {"compiled": 0, "disk": cold["kernels"]["compiled"], "reused": 0}
    assert warm["disk_loads"] == 1


def test_the_threshold_must_be_a_number(monkeypatch):
    fn, args = MODELS["mlp2"](np.float64)
    monkeypatch.setenv("MORPHJIT_TABLE_STEP", "many")
    with pytest.raises(ValueError, match="MORPHJIT_TABLE_STEP must be a number of instructions, got 'many'"):
        mj.compile_loss(fn, cache=False)(*args)
