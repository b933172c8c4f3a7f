"""``out=`` of a compiled loss: arrays that share memory with an argument or with each other are
refused (the gradients would be written over values the step still reads), on both backends and
on the generated fast path as on the first call."""
import numpy as np
import pytest

import morphjit as mj

BACKENDS = ["numba", "interp"]


def loss(params, x):
    return mj.sum(mj.tanh(x @ params["W"] + params["b"]) ** 2)


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    return {"W": rng.normal(size=(3, 4)), "b": rng.normal(size=4)}, rng.normal(size=(5, 3))


def fresh_out(params):
    return {k: np.empty_like(v) for k, v in params.items()}


def overlapping_outs(params, x):
    """``out=`` trees whose ``out['W']`` overlaps something, and the path named in the error."""
    big = np.zeros(40)
    flat_x = x.reshape(-1)
    return {
        "a parameter": (params["W"], "params\\['W'\\]"),
        "a view of a parameter": (params["W"][:, :], "params\\['W'\\]"),
        "a data array": (flat_x[:12].reshape(3, 4), "x"),
        "a view of a data array": (x.reshape(-1)[3:15].reshape(3, 4), "x"),
        "the other out array": (big[:12].reshape(3, 4), "out\\['W'\\]"),
    }, big


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["a parameter", "a view of a parameter", "a data array",
                                  "a view of a data array", "the other out array"])
def test_out_sharing_memory_is_refused(problem, backend, case):
    params, x = problem
    step = mj.compile_loss(loss, backend=backend)
    step(params, x, out=fresh_out(params))      # compiled; the fast path serves the next calls
    step(params, x, out=fresh_out(params))
    cases, big = overlapping_outs(params, x)
    target, named = cases[case]
    out = {"W": target, "b": big[8:12] if case == "the other out array" else np.empty(4)}
    before = [a.copy() for a in (params["W"], params["b"], x)]
    with pytest.raises(mj.TracingError, match=f"out\\[.*\\] shares memory with {named}"):
        step(params, x, out=out)
    for a, b in zip((params["W"], params["b"], x), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_arrays_that_are_views_of_one_buffer_without_overlap_are_accepted(problem, backend):
    params, x = problem
    step = mj.compile_loss(loss, backend=backend)
    value, grads = step(params, x)
    flat = np.full(16, np.nan)
    for _ in range(2):
        out = {"W": flat[:12].reshape(3, 4), "b": flat[12:]}
        assert step(params, x, out=out) == (value, out)
        np.testing.assert_array_equal(flat, np.concatenate([grads["W"].ravel(), grads["b"]]))
