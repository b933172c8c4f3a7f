"""Optimiser hyperparameters and learning rates are finite numbers in range, checked where they
are given (construction, a schedule's value, a per-call ``lr=``), with an error naming them."""
import numpy as np
import pytest

import morphjit as mj

BAD = [float("nan"), np.float32("nan"), float("inf"), -0.5, True, "0.1", None]


@pytest.mark.parametrize("value", BAD, ids=repr)
@pytest.mark.parametrize("make, name", [
    (lambda v: mj.optim.sgd(v), "lr"),
    (lambda v: mj.optim.sgd(0.1, momentum=v), "momentum"),
    (lambda v: mj.optim.adam(v), "lr"),
    (lambda v: mj.optim.adam(b1=v), "b1"),
    (lambda v: mj.optim.adam(eps=v), "eps"),
    (lambda v: mj.optim.adamw(weight_decay=v), "weight_decay"),
    (lambda v: mj.optim.rmsprop(alpha=v), "alpha"),
])
def test_bad_hyperparameters_are_refused_at_construction(make, name, value):
    with pytest.raises(ValueError, match=f"^{name} must be a finite number >= 0, got"):
        make(value)


@pytest.mark.parametrize("value", [1.0, 1.5])
def test_decay_rates_must_be_below_one(value):
    with pytest.raises(ValueError, match=r"b2 must be in \[0, 1\)"):
        mj.optim.adam(b2=value)


@pytest.mark.parametrize("value", [np.float32(0.1), np.float64(0.1), 1, np.int64(1)], ids=repr)
def test_numpy_and_integer_numbers_are_accepted(value):
    assert mj.optim.sgd(value, momentum=value).learning_rate(0) == float(value)


def quadratic(p):
    return mj.sum(p["w"] ** 2)


@pytest.mark.parametrize("backend", ["numba", "interp"])
@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1.0], ids=repr)
def test_a_bad_learning_rate_per_call_is_refused_before_the_update(backend, lr):
    step = mj.train_step(quadratic, mj.optim.sgd(0.1), backend=backend)
    params = {"w": np.ones(3)}
    state = step.init(params)
    step(params, state)     # compiled; the next call takes the fast path
    with pytest.raises(ValueError, match=r"^lr must be a finite number >= 0, got"):
        step(params, state, lr=lr)
    np.testing.assert_array_equal(params["w"], np.full(3, 0.8))
    assert state["step"] == 1


def test_a_schedule_giving_nan_is_refused_naming_the_step():
    step = mj.train_step(quadratic, mj.optim.sgd(lambda t: 0.1 if t < 1 else float("nan")))
    params = {"w": np.ones(3)}
    state = step.init(params)
    step(params, state)
    with pytest.raises(ValueError, match=r"schedule's lr\(1\) must be a finite number >= 0, got nan"):
        step(params, state)
    np.testing.assert_array_equal(params["w"], np.full(3, 0.8))
