"""No value silently frozen at trace time: values that would differ if the function were traced
again are refused when the step is compiled, naming the line; fixed constants are not."""
import inspect
import random
import time

import numpy as np
import pytest

import morphjit as mj
from morphjit.tracing.twice import first_difference
from morphjit.tracing import trace

RS = np.random.RandomState(0)
COUNTER = np.zeros(1)


def global_random_state(w):
    return np.sum(w * RS.randn(3))               # enters here


def numpy_global_draws(w):
    noise = np.random.randn(3)                    # enters here
    return np.sum(w * noise)


def the_time(w):
    return np.sum(w) * time.time()                # enters here


def global_updated_in_place(w):
    COUNTER[0] += 1
    return np.sum(w * COUNTER)


def numpy_coin_flip(w):
    return np.sum(w) * (2.0 if np.random.rand() < 2 else 3.0)   # enters here


def python_coin_flip(w):
    return np.sum(w) * (2.0 if random.random() < 2 else 3.0)    # enters here


@pytest.mark.parametrize("fn", [the_time, python_coin_flip])
@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_a_value_that_changes_between_traces_is_refused_at_its_line(fn, backend):
    with pytest.raises(mj.FrozenValueError) as caught:
        mj.compile_loss(fn, backend=backend)(np.ones(3))
    lines, start = inspect.getsourcelines(fn)
    expected = start + next(k for k, line in enumerate(lines) if "enters here" in line)
    assert caught.value.loc is not None and caught.value.loc.lineno == expected
    assert "generator passed as an argument" in str(caught.value)
    assert fn.__name__ in str(caught.value)


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_draws_from_captured_and_global_numpy_generators_are_made_in_the_step(backend):
    w = np.ones(3)
    for fn in (global_random_state, numpy_global_draws):
        loss = mj.compile_loss(fn, backend=backend)
        assert loss(w)[0] != loss(w)[0], fn.__name__
    assert mj.compile_loss(numpy_coin_flip, backend=backend)(w)[0] == 6.0


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_a_write_into_a_captured_array_is_refused_at_its_line(backend):
    with pytest.raises(mj.ArgumentWriteError, match="the array COUNTER, which the function captures") as caught:
        mj.compile_loss(global_updated_in_place, backend=backend)(np.ones(3))
    assert "COUNTER.copy()" in str(caught.value) and "COUNTER[0] += 1" in str(caught.value)
    assert COUNTER[0] == 0


def test_a_training_step_refuses_a_frozen_value_too():
    step = mj.train_step(the_time, mj.optim.sgd(0.1), backend="interp")
    w = np.ones(3)
    with pytest.raises(mj.FrozenValueError):
        step(w, step.init(w))


FIXED = np.linspace(0.0, 1.0, 3)


def fixed_constants(w, x):
    mask = np.arange(x.shape[1]) < 2                          # built from a shape
    np.random.seed(7)                                         # seeds itself: the same draw every call
    jitter = np.random.rand(3)
    return np.sum(np.where(mask, w * FIXED * jitter, 0.0) * x) + np.sum(np.eye(3) @ w)


def test_fixed_constants_are_not_refused():
    w, x = np.arange(3.0), np.ones((4, 3))
    np.random.seed(7)
    jitter = np.random.rand(3)
    expected = np.sum(np.where(np.arange(3) < 2, w * FIXED * jitter, 0.0) * x) + np.sum(w)
    for backend in ("interp", "numba"):
        value, _ = mj.compile_loss(fixed_constants, backend=backend)(w, x)
        np.testing.assert_allclose(value, expected)


def test_the_comparison_sees_each_kind_of_difference():
    w = np.ones(3)
    same = trace(fixed_constants, w, np.ones((2, 3)))
    assert first_difference(same, trace(fixed_constants, w, np.ones((2, 3)))) is None
    scale = [1.0]
    array = [np.ones(3)]
    programs = {"number": lambda w: np.sum(w) * scale[0], "constant array": lambda w: np.sum(w * array[0]),
                "program": lambda w: np.sum(w) if scale[0] == 1.0 else np.sum(w * w)}
    for what, fn in programs.items():
        first = trace(fn, w)
        scale[0], array[0] = 2.0, np.full(3, 2.0)
        binding, found = first_difference(first, trace(fn, w))
        scale[0], array[0] = 1.0, np.ones(3)
        assert what in found or found.startswith(f"the {binding.op}"), (what, found)
