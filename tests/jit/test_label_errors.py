"""An out-of-range class label is refused on both backends, by compile_loss and train_step, on
the first call and on the fast path, with the argument's path, the first offending value and its
index; nothing is updated."""
import numpy as np
import pytest

import morphjit as mj

BACKENDS = ["numba", "interp"]


def sce(params, batch):
    return mj.mean(mj.softmax_cross_entropy(batch["x"] @ params["W"], batch["y"]))


def one_hot(params, batch):
    return mj.sum(mj.one_hot(batch["y"], 4, params["W"].dtype) * (batch["x"] @ params["W"]))


def problem(labels):
    rng = np.random.default_rng(0)
    return {"W": rng.normal(size=(3, 4))}, {"x": rng.normal(size=(len(labels), 3)), "y": np.array(labels)}


BAD = {"too large": ([0, 1, 3, 7, 2, 9], r"batch\['y'\]\[3\] is 7, but class labels must lie in \[0, 4\) "
                                         r"\(2 of the 6 labels are outside\)"),
       "negative": ([0, -1, 3, 2, 2, 1], r"batch\['y'\]\[1\] is -1, but class labels must lie in \[0, 4\) "
                                         r"\(1 of the 6 labels are outside\)")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", [sce, one_hot])
@pytest.mark.parametrize("bad", list(BAD))
def test_compile_loss_names_the_label(backend, loss, bad):
    labels, message = BAD[bad]
    params, batch = problem([0, 1, 2, 3, 0, 1])
    step = mj.compile_loss(loss, backend=backend)
    step(params, batch)
    for _ in range(2):   # the fast path, then the slow one after the failure
        with pytest.raises(ValueError, match=message):
            step(params, {"x": batch["x"], "y": np.array(labels)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_loss_names_the_index_of_a_2d_label_array(backend):
    loss = lambda w, x, y: mj.mean(mj.softmax_cross_entropy(x @ w, y))
    w, x = np.ones((3, 4)), np.ones((2, 5, 3))
    y = np.zeros((2, 5), np.int64)
    y[1, 3] = 4
    with pytest.raises(ValueError, match=r"^y\[1\]\[3\] is 4, but class labels must lie in \[0, 4\)"):
        mj.compile_loss(loss, backend=backend)(w, x, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", [sce, one_hot])
def test_train_step_names_the_label_and_updates_nothing(backend, loss):
    labels, message = BAD["too large"]
    params, batch = problem([0, 1, 2, 3, 0, 1])
    step = mj.train_step(loss, mj.optim.adam(0.1), backend=backend)
    state = step.init(params)
    step(params, state, batch)
    before = params["W"].copy(), state["m"]["W"].copy(), int(state["step"])
    for _ in range(2):
        with pytest.raises(ValueError, match=message):
            step(params, state, {"x": batch["x"], "y": np.array(labels)})
    np.testing.assert_array_equal(params["W"], before[0])
    np.testing.assert_array_equal(state["m"]["W"], before[1])
    assert int(state["step"]) == before[2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_number_of_classes_may_be_the_batch_size(backend):
    """Logits of shape (B,): the classes are the batch axis, whose extent is known at run time."""
    fn = lambda w, logits, y: mj.softmax_cross_entropy(logits * w, y)
    step = mj.compile_loss(fn, backend=backend)
    value, _ = step(np.ones(()), np.zeros(3), np.array(2))
    np.testing.assert_allclose(value, np.log(3))
    with pytest.raises(ValueError, match=r"^y is 3, but class labels must lie in \[0, 3\)"):
        step(np.ones(()), np.zeros(3), np.array(3))


COMPUTED = {
    "a column": (lambda b: b["y"][:, 0], lambda y: np.stack([y, np.zeros_like(y)], axis=1)),
    "a raveled column": (lambda b: b["y"].ravel(), lambda y: y[:, None]),
    "one-based": (lambda b: b["y"] - 1, lambda y: y + 1),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(COMPUTED))
def test_labels_computed_in_the_loss_are_checked_too(backend, name):
    """Labels read through a view or computed from the data: the compiled step gave a loss."""
    select, encode = COMPUTED[name]
    loss = lambda p, b: mj.mean(mj.softmax_cross_entropy(b["x"] @ p["W"], select(b)))
    params, batch = problem([0, 1, 2, 3, 0, 1])
    reference, _ = mj.compile_loss(loss, backend="interp")(params, {"x": batch["x"], "y": encode(batch["y"])})
    step = mj.train_step(loss, mj.optim.sgd(0.1), backend=backend)
    state = step.init(params)
    assert step(params, state, {"x": batch["x"], "y": encode(batch["y"])}) == pytest.approx(reference)
    before = params["W"].copy()
    for _ in range(2):
        with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
            step(params, state, {"x": batch["x"], "y": encode(np.array([0, 1, 3, 7, 2, 9]))})
    np.testing.assert_array_equal(params["W"], before)
