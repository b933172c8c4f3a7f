"""The API around compile_loss (issue 23, first half): has_aux, mj.compile, mj.grad and
mj.value_and_grad, static arguments, and call statistics under threads; each on both backends."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import morphjit as mj

BACKENDS = ["interp", "numba"]
HERE = __file__.rsplit("/", 1)[-1]


def line_of(fragment: str) -> int:
    """The line number of the (unique) source line of this file containing ``fragment``."""
    lines = inspect.getsource(inspect.getmodule(line_of)).splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if fragment in line and "line_of" not in line]
    assert len(hits) == 1, (fragment, hits)
    return hits[0]


def model(params, x):
    return np.tanh(x @ params["W"] + params["b"])


def loss_with_metrics(params, x, labels):
    logits = model(params, x)
    loss = np.mean(mj.softmax_cross_entropy(logits, labels))
    return loss, {"accuracy": np.mean(np.argmax(logits, axis=1) == labels), "logits": logits,
                  "terms": (np.sum(params["W"] ** 2), 2.0)}


def plain_loss(params, x, labels):
    return loss_with_metrics(params, x, labels)[0]


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
    return params, rng.standard_normal((9, 4)), rng.integers(0, 3, 9)


def expected_aux(params, x, labels):
    """The aux values evaluated by NumPy, without morphjit."""
    logits = np.tanh(x @ params["W"] + params["b"])
    return {"accuracy": np.mean(np.argmax(logits, axis=1) == labels), "logits": logits,
            "terms": (np.sum(params["W"] ** 2), 2.0)}


def assert_trees_close(got, want, rtol=1e-12):
    got_leaves, got_tree = mj.pytree.flatten(got)
    want_leaves, want_tree = mj.pytree.flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        assert isinstance(g, np.ndarray | np.generic) and np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# has_aux


@pytest.mark.parametrize("backend", BACKENDS)
def test_has_aux_returns_the_values_of_an_uncompiled_evaluation_at_every_batch_size(problem, backend):
    params, x, labels = problem
    step = mj.compile_loss(loss_with_metrics, has_aux=True, backend=backend)
    reference = mj.compile_loss(plain_loss, backend=backend)
    out = {k: np.empty_like(v) for k, v in params.items()}
    for n in (9, 5):
        (value, aux), grads = step(params, x[:n], labels[:n])
        want_value, want_grads = reference(params, x[:n], labels[:n])
        assert value == pytest.approx(want_value, rel=1e-12)
        assert_trees_close(grads, want_grads)
        assert_trees_close(aux, expected_aux(params, x[:n], labels[:n]))
        (value_out, aux_out), written = step(params, x[:n], labels[:n], out=out)
        assert written is out and value_out == value
        assert_trees_close(out, want_grads)
        assert_trees_close(aux_out, aux)
    assert step.cache_info().misses == 1   # one step, polymorphic in the batch size
    joint = step.program(params, x, labels)
    assert len(joint.outputs) == 1 + 2 + 4   # loss, two gradients, four aux leaves: one program


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_step_with_aux_returns_the_loss_and_aux_before_the_update(problem, backend):
    params, x, labels = problem
    p = {k: v.copy() for k, v in params.items()}
    step = mj.train_step(loss_with_metrics, mj.optim.sgd(0.1), has_aux=True, backend=backend)
    state = step.init(p)
    for n in (9, 6, 9):
        before = {k: v.copy() for k, v in p.items()}
        value, aux = step(p, state, x[:n], labels[:n])
        want = loss_with_metrics(before, x[:n], labels[:n])
        assert value == pytest.approx(want[0], rel=1e-12)
        assert_trees_close(aux, expected_aux(before, x[:n], labels[:n]))
        assert not np.array_equal(p["W"], before["W"])
    assert step.cache_info().misses == 1
    compiled = mj.train_step(mj.compile_loss(loss_with_metrics, has_aux=True), mj.optim.sgd(0.1), backend=backend)
    assert compiled.has_aux   # taken from the compiled loss


def test_has_aux_is_in_explain(problem):
    params, x, labels = problem
    report = mj.compile_loss(loss_with_metrics, has_aux=True).explain(params, x, labels)
    assert len(report.forward.outputs) == 1 + 4 and len(report.joint.outputs) == 1 + 2 + 4
    forward_out = next(line for line in str(report).splitlines() if line.startswith("out "))
    assert len(forward_out.split()) == 1 + 1 + 4   # the printed forward program returns aux too


def test_has_aux_refuses_a_function_that_does_not_return_a_pair(problem):
    params, x, labels = problem

    def single(params, x, labels):  # the definition line the error points at
        return plain_loss(params, x, labels)

    with pytest.raises(mj.TracingError) as info:
        mj.compile_loss(single, has_aux=True, backend="interp")(params, x, labels)
    message = str(info.value)
    assert "has_aux=True" in message and "(loss, aux)" in message and "returned a float64" not in message
    assert f"{HERE}:{line_of('def single(params, x, labels):')}" in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_has_aux_refuses_aux_holding_something_other_than_arrays(problem, backend):
    params, x, labels = problem

    def named(params, x, labels):  # the definition line the error points at
        return plain_loss(params, x, labels), {"name": "accuracy", "value": np.mean(x)}

    with pytest.raises(mj.TracingError) as info:
        mj.compile_loss(named, has_aux=True, backend=backend)(params, x, labels)
    assert "aux['name']" in str(info.value) and "is a str" in str(info.value)
    assert f"{HERE}:{line_of('def named(params, x, labels):')}" in str(info.value)
