"""State kept between calls: what a compiled function writes into the dicts and lists of its
arguments is written back after each call, as NumPy would have left it. The oracle is the same
function run by NumPy on plain containers; gradients are checked by central differences."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import morphjit as mj
from morphjit.util import TracingError
from support.gradcheck import central_difference

BACKENDS = ["interp", "numba"]


def batchnorm_loss(w, x, bn_param):
    """CS231n's batch normalisation, with its running averages kept in ``bn_param``."""
    mode = bn_param["mode"]
    eps, momentum = bn_param.get("eps", 1e-5), bn_param.get("momentum", 0.9)
    running_mean = bn_param.get("running_mean", np.zeros(w.shape[1]))
    running_var = bn_param.get("running_var", np.zeros(w.shape[1]))
    h = x @ w
    if mode == "train":
        mean, var = h.mean(axis=0), h.var(axis=0)
        out = (h - mean) / np.sqrt(var + eps)
        bn_param["running_mean"] = momentum * running_mean + (1 - momentum) * mean
        bn_param["running_var"] = momentum * running_var + (1 - momentum) * var
    else:
        out = (h - running_mean) / np.sqrt(running_var + eps)
    return np.sum(out ** 2 * np.arange(w.shape[1]))


def assert_same_state(got, expected):
    assert type(got) is type(expected)
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected)
        for k in expected:
            assert_same_state(got[k], expected[k])
    elif isinstance(expected, list):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_same_state(a, b)
    elif isinstance(expected, (str, bool)):
        assert got == expected
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_running_averages_are_kept_as_numpy_keeps_them(backend):
    rng = np.random.default_rng(0)
    w, x = rng.normal(size=(3, 4)), rng.normal(size=(8, 3))
    step = mj.compile_loss(batchnorm_loss, backend=backend)
    expected, got = {"mode": "train"}, {"mode": "train"}
    for i in range(4):
        loss, grad = step(w, x + i, got)
        assert loss == pytest.approx(batchnorm_loss(w, x + i, expected), rel=1e-12)
        assert_same_state(got, expected)
        fd = central_difference(lambda v: batchnorm_loss(v, x + i, copy.deepcopy(expected)), w)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    expected["mode"] = got["mode"] = "test"   # a string's value is part of the call's signature
    assert step(w, x, got)[0] == pytest.approx(batchnorm_loss(w, x, expected), rel=1e-12)
    assert_same_state(got, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_arrays_of_one_call_are_not_changed_by_the_next(backend):
    def f(w, x, state):
        state["h"] = np.tanh(x @ w)
        state["count"] = state["count"] + 1
        return np.sum(state["h"])
    step = mj.compile_loss(f, backend=backend)
    w, x = np.ones((2, 3)), np.arange(8.0).reshape(4, 2) / 8
    state = {"count": 0}
    step(w, x, state)
    first = state["h"]
    kept = first.copy()
    step(w, 2 * x, state)
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(state["h"], np.tanh(2 * x @ w))
    assert state["count"] == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_lists_known_values_aliases_and_deletions_are_written_back(backend):
    def f(w, x, state):
        state["history"].append(np.sum(x @ w))
        state["first"] = x                   # the argument itself, as NumPy binds it
        state["seen"] = True
        state["buffer"] = np.zeros(2)
        del state["scratch"]
        state["pair"] = (x[0] * 2, {"w": w})
        return np.sum((x @ w) ** 2)
    step = mj.value_and_grad(f, backend=backend)
    w, x = np.ones((2, 3)), np.arange(8.0).reshape(4, 2)
    got = {"history": [], "scratch": 1.0}
    expected = copy.deepcopy(got)
    step(w, x, got)
    f(w, x, expected)
    assert got["first"] is x
    assert got["pair"][1]["w"] is w
    assert_same_state(got["history"], expected["history"])
    assert "scratch" not in got and got["seen"] is True
    got["buffer"][0] = 5.0   # each call gives a buffer of its own
    got["scratch"] = 1.0
    step(w, x, got)
    assert got["buffer"][0] == 0.0 and len(got["history"]) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forward_function_keeps_state_too(backend):
    def predict(x, cache):
        cache[0] = np.exp(x)
        return cache[0] + 1
    forward = mj.compile(predict, backend=backend)
    x = np.linspace(0, 1, 5)
    cache = [None, "keep"]
    out = forward(x, cache)
    np.testing.assert_allclose(out, np.exp(x) + 1)
    np.testing.assert_allclose(cache[0], np.exp(x))
    assert cache[1] == "keep"


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_written_on_both_sides_of_a_branch_takes_the_side_taken(backend):
    def f(w, state):
        if np.sum(w) > 0:
            state["m"] = np.mean(w)
        else:
            state["m"] = -np.sum(w ** 2)
        return np.sum(w ** 2)
    step = mj.compile_loss(f, backend=backend)
    for w in (np.array([1.0, 2.0]), np.array([-1.0, -3.0])):
        got, expected = {}, {}
        step(w, got)
        f(w, expected)
        assert_same_state(got, expected)


def test_a_write_into_a_differentiated_argument_is_refused_with_its_path():
    def f(params, x):
        params["b"] = params["w"] * 2
        return np.sum(params["w"] * x)
    with pytest.raises(TracingError, match=r"params\['b'\], which is differentiated"):
        mj.compile_loss(f, backend="interp")({"w": np.ones(3)}, np.ones(3))


def test_a_training_step_refuses_state_rather_than_dropping_it():
    def f(w, x, state):
        state["last"] = np.sum(x * w)
        return np.sum((x * w) ** 2)
    step = mj.train_step(f, mj.optim.sgd(0.1), backend="interp")
    w = np.ones(3)
    with pytest.raises(TracingError, match=r"state\['last'\]"):
        step(w, step.init(w), np.ones((2, 3)), {})


def test_paths_that_write_different_entries_are_refused():
    def f(w, state):
        if np.sum(w) > 0:
            state["a"] = w * 2
        return np.sum(w ** 2)
    with pytest.raises(TracingError, match="write different entries"):
        mj.compile_loss(f, backend="interp")(np.ones(2), {})


OPS = st.lists(st.tuples(st.sampled_from(["set", "scale", "delete", "const", "append"]),
                         st.sampled_from(["a", "b", "c"]), st.floats(-2, 2)), max_size=6)


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_random_sequences_of_writes_leave_what_numpy_leaves(ops):
    def f(w, state):
        for op, key, c in ops:
            if op == "set":
                state[key] = w * c
            elif op == "scale" and key in state and not isinstance(state[key], list):
                state[key] = state[key] * c + w
            elif op == "delete" and key in state:
                del state[key]
            elif op == "const":
                state[key] = c
            elif op == "append":
                state.setdefault("log", []).append(np.sum(w) * c)
        return np.sum(w ** 2)
    w = np.array([0.5, -1.5])
    got, expected = {"a": np.ones(2)}, {"a": np.ones(2)}
    for _ in range(2):
        mj.compile_loss(f, backend="interp")(w, got)
        f(w, expected)
        assert_same_state(got, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_string_in_the_arguments_selects_its_own_step_on_every_call(backend):
    def f(w, options):
        return np.sum(w ** 2) if options["mode"] == "square" else np.sum(np.abs(w))
    step = mj.compile_loss(f, backend=backend)
    w = np.array([1.0, -2.0, 3.0])
    for mode in ["square", "square", "abs", "abs", "square", "abs"]:
        loss, grad = step(w, {"mode": mode})
        assert loss == f(w, {"mode": mode})
        np.testing.assert_allclose(grad, 2 * w if mode == "square" else np.sign(w))
    assert step.cache_info().misses == 2
