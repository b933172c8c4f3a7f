"""Values a compiled function reaches without taking them as arguments (its closure, the globals it
loads, ``self`` of a bound method, one level into the dicts, lists and objects there) are seen as
they are at each call, as NumPy sees them: arrays are read on each call, and a step that holds for
values (numbers, or an array's contents NumPy computed with while tracing) compiles again, with a
`RecompileWarning`, when they change. The oracle is the same function run by NumPy."""
import copy
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import morphjit as mj
from morphjit.util import TracingError
from support.gradcheck import central_difference

BACKENDS = ["interp", "numba"]

WEIGHTS = np.ones((3, 2))
REG = 0.5
PARAMS = {"W": np.ones((3, 2)), "scale": np.float64(2.0)}
LABELS = np.array([0, 2, 1, 2])


def global_loss(w, x):
    return np.sum((x @ (WEIGHTS * w)) ** 2) + REG * np.sum(w ** 2)


@pytest.fixture
def restore_globals():
    """The module's globals as they were, whatever a test changed in place or rebound."""
    saved = {k: globals()[k] for k in ("WEIGHTS", "REG", "LABELS")}
    contents = {"LABELS": LABELS.copy(), "PARAMS": copy.deepcopy(PARAMS)}
    yield
    globals().update(saved)
    LABELS[:] = contents["LABELS"]
    PARAMS.clear()
    PARAMS.update(contents["PARAMS"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_global_array_changed_in_place_or_rebound_is_read_on_the_next_call(backend, restore_globals):
    global WEIGHTS
    w, x = np.array([[1.0, -2.0]]).repeat(3, 0), np.arange(12.0).reshape(4, 3) / 10
    step = mj.compile_loss(global_loss, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mj.RecompileWarning)   # nothing here needs a new compile
        for change in ("none", "in place", "element", "rebound"):
            if change == "in place":
                WEIGHTS *= 3.0
            elif change == "element":
                WEIGHTS[1, 0] = -4.0
            elif change == "rebound":
                WEIGHTS = np.arange(6.0).reshape(3, 2)
            loss, grad = step(w, x)
            assert loss == pytest.approx(global_loss(w, x), rel=1e-12)
            np.testing.assert_allclose(grad, central_difference(lambda v: global_loss(v, x), w), rtol=1e-6, atol=1e-6)
    assert step.cache_info().misses == 1
    WEIGHTS = np.ones((3, 3))          # another shape: another signature
    w = np.ones((3, 3))
    assert step(w, x)[0] == pytest.approx(global_loss(w, x), rel=1e-12)
    assert step.cache_info().misses == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closure_array_and_a_bound_methods_attributes_are_read_on_each_call(backend):
    def make():
        table = np.arange(8.0)

        def lookup(i):
            return np.sum(table[i:i + 3] ** 2)
        return lookup, table

    lookup, table = make()
    step = mj.compile(lookup, backend=backend)
    for scale in (1.0, 2.0, -1.0):
        table *= scale
        assert step(2) == pytest.approx(lookup(2), rel=1e-12)

    class Model:
        def __init__(self):
            self.W, self.b = np.ones((3, 2)), np.zeros(2)

        def predict(self, x):
            return np.sum(np.tanh(x @ self.W + self.b))

    model, x = Model(), np.linspace(-1, 1, 12).reshape(4, 3)
    predict = mj.compile(model.predict, backend=backend)
    for _ in range(3):
        assert predict(x) == pytest.approx(model.predict(x), rel=1e-12)
        model.W -= 0.1 * x[:3, :2]     # a training loop updates the weights between predictions
        model.b = model.b + 0.5
    assert predict.cache_info().misses == 1


def test_a_dict_of_arrays_and_numbers_among_the_globals_is_followed(restore_globals):
    def loss(x):
        return np.sum((x @ PARAMS["W"]) ** 2) * PARAMS["scale"] + REG
    global REG
    x = np.ones((4, 3))
    step = mj.compile(loss, backend="interp")
    assert step(x) == loss(x)
    PARAMS["W"] = PARAMS["W"] * 3
    PARAMS["W"][0, 0] = 5.0
    assert step(x) == loss(x)
    for change in ("scale", "reg"):
        if change == "scale":
            PARAMS["scale"] = 1.0
        else:
            REG = 1.5
        with pytest.warns(mj.RecompileWarning, match=r"PARAMS\['scale'\]" if change == "scale" else "REG"):
            assert step(x) == loss(x)
    assert step.cache_info().misses == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_array_whose_values_the_trace_computed_with_compiles_again_when_they_change(backend, restore_globals):
    def loss(w, x):
        classes = int(LABELS.max()) + 1          # Python computes with the contents while tracing
        onehot = np.eye(classes)[LABELS]
        return np.sum((x @ w[:, :classes] - onehot) ** 2)
    w, x = np.linspace(-1, 1, 12).reshape(3, 4), np.ones((4, 3))
    step = mj.compile_loss(loss, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mj.RecompileWarning)
        assert step(w, x)[0] == pytest.approx(loss(w, x), rel=1e-12)
        assert step(w, x)[0] == pytest.approx(loss(w, x), rel=1e-12)
    LABELS[0] = 3
    with pytest.warns(mj.RecompileWarning, match="LABELS, which it captures, changed") as record:
        value, grad = step(w, x)
    assert record[0].filename == __file__    # the warning names the call's line
    assert value == pytest.approx(loss(w, x), rel=1e-12)
    np.testing.assert_allclose(grad, central_difference(lambda v: loss(v, x), w), rtol=1e-6, atol=1e-6)
    assert step.cache_info().misses == 2


def test_a_training_step_reads_a_captured_array_on_every_step():
    target = np.zeros(3)

    def loss(w, x):
        return np.sum((x @ w - target) ** 2)
    step = mj.train_step(loss, mj.optim.sgd(0.1), backend="interp")
    w, x = np.zeros(2), np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    state = step.init(w)
    for k in range(3):
        target[:] = k + 1.0            # changed in place between steps
        before = w.copy()
        assert step(w, state, x) == pytest.approx(loss(before, x), rel=1e-12)   # the loss before the step
        np.testing.assert_allclose(w, before - 0.1 * 2 * x.T @ (x @ before - target), rtol=1e-12)


def test_writes_into_a_captured_container_are_refused_not_lost():
    cache = {"W": np.ones(2), "n": 0}

    def counting(x):
        cache["n"] = cache["n"] + 1
        return np.sum(x * cache["W"])
    with pytest.raises(TracingError, match=r"writes into cache\['n'\], which it captures.*pass cache as an argument"):
        mj.compile(counting, backend="interp")(np.ones(2))


GLOBAL_STATE = {"A": np.ones(3), "B": np.ones(3)}
COEFFICIENT = 1.0
EVENTS = st.lists(st.tuples(st.sampled_from(["scale", "rebind", "element", "coefficient", "entry", "none"]),
                            st.floats(-2, 2).filter(lambda c: abs(c) > 0.1)), min_size=1, max_size=6)


def _property_loss(x):
    a = float(np.min(GLOBAL_STATE["A"]))     # Python computes with the contents while tracing
    return np.sum(x * GLOBAL_STATE["B"]) * COEFFICIENT + a * np.sum(x ** 2)


@pytest.mark.filterwarnings("ignore::morphjit.RecompileWarning")
@settings(max_examples=30, deadline=None)
@given(EVENTS)
def test_random_changes_between_calls_are_seen_as_numpy_sees_them(events):
    global COEFFICIENT
    GLOBAL_STATE.update(A=np.ones(3), B=np.ones(3))
    COEFFICIENT = 1.0
    step = mj.compile(_property_loss, backend="interp")
    x = np.array([0.5, -1.0, 2.0])
    for event, c in events:
        if event == "scale":
            GLOBAL_STATE["A"] *= c
        elif event == "rebind":
            GLOBAL_STATE["B"] = GLOBAL_STATE["B"] + c
        elif event == "element":
            GLOBAL_STATE["B"][1] = c
        elif event == "coefficient":
            COEFFICIENT = c
        elif event == "entry":
            GLOBAL_STATE["A"][0] = c
        assert step(x) == pytest.approx(_property_loss(x), rel=1e-12)
    COEFFICIENT = 1.0


def test_a_zero_dimensional_array_changed_in_place_compiles_again():
    temperature = np.array(2.0)

    def loss(x):
        return np.sum(x / temperature)
    step = mj.compile(loss, backend="interp")
    assert step(np.ones(3)) == 1.5
    temperature[...] = 4.0
    with pytest.warns(mj.RecompileWarning, match="temperature"):
        assert step(np.ones(3)) == 0.75
