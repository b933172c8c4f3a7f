"""Values a compiled function reaches without taking them as arguments (its closure, the globals it
loads, ``self`` of a bound method, one level into the dicts, lists and objects there) are seen as
they are at each call, as NumPy sees them: arrays are read on each call, and a step that holds for
values (numbers, or an array's contents NumPy computed with while tracing) compiles again, with a
`RecompileWarning`, when they change. The oracle is the same function run by NumPy."""
import copy
import functools
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


CENTRES = np.array([[0.0, 1.0], [1.0, 0.0]])
NESTED = {"layers": [{"W": np.ones((2, 2))}, {"W": np.eye(2)}], "bias": np.zeros(2)}


def _distances(x):
    """A helper of the loss that reads a global the loss does not name."""
    return np.sum((x[:, None, :] - CENTRES[None]) ** 2, axis=-1)


def _helper_loss(w, x):
    return np.sum(_softmin(w * _distances(x)))


def _softmin(d):
    return -np.log(np.sum(np.exp(-d), axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_globals_of_the_functions_a_function_calls_are_read_on_each_call(backend):
    global CENTRES
    saved = CENTRES
    x, w = np.linspace(-1, 1, 8).reshape(4, 2), np.array([[1.0, 2.0]])
    step = mj.compile_loss(_helper_loss, backend=backend)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", mj.RecompileWarning)
            for change in ("none", "in place", "rebound"):
                if change == "in place":
                    CENTRES *= -2.0
                elif change == "rebound":
                    CENTRES = np.array([[3.0, -1.0], [0.5, 0.5]])
                value, grad = step(w, x)
                assert value == pytest.approx(_helper_loss(w, x), rel=1e-12)
                np.testing.assert_allclose(grad, central_difference(lambda v: _helper_loss(v, x), w), rtol=1e-6, atol=1e-6)
        assert step.cache_info().misses == 1
    finally:
        CENTRES = saved
        CENTRES[:] = [[0.0, 1.0], [1.0, 0.0]]


def test_a_helper_in_the_closure_and_its_own_closure_are_followed_and_names_kept_apart():
    table = np.arange(4.0)          # a global of this name would be another value: kept apart

    def make(scale):
        table = np.full(4, scale)   # the helper's own closure variable, not the loss's

        def helper(x):
            return x * table

        def loss(x):
            return np.sum(helper(x)) + np.sum(x * outer)
        return loss, table
    outer = np.ones(4)
    loss, inner = make(2.0)
    step = mj.compile(loss, backend="interp")
    x = np.array([1.0, -1.0, 0.5, 2.0])
    assert step(x) == loss(x)
    inner[1] = 10.0
    outer[2] = -3.0
    assert step(x) == pytest.approx(loss(x), rel=1e-12)
    assert table[0] == 0.0 and step.cache_info().misses == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_arrays_deeper_in_containers_and_objects_are_read_on_each_call(backend):
    class Dense:
        def __init__(self, n):
            self.W = np.eye(n) * 0.5

    class Net:
        def __init__(self):
            self.layers = [Dense(2), Dense(2)]
            self.config = {"shift": np.ones(2)}

        def predict(self, x):
            for layer in self.layers:
                x = np.tanh(x @ layer.W)
            return np.sum(x + self.config["shift"]) + np.sum(NESTED["layers"][1]["W"])

    net, x = Net(), np.linspace(-1, 1, 6).reshape(3, 2)
    predict = mj.compile(net.predict, backend=backend)
    for k in range(3):
        assert predict(x) == pytest.approx(net.predict(x), rel=1e-12)
        net.layers[1].W -= 0.25              # two containers down: changed in place
        net.config["shift"] = net.config["shift"] * 2
        NESTED["layers"][1]["W"] = np.full((2, 2), float(k))
    assert predict.cache_info().misses == 1
    NESTED["layers"][1]["W"] = np.eye(2)


def test_a_helper_drawing_from_numpys_global_generator_draws_anew_each_call():
    def noise(n):
        return np.random.randn(n)

    def loss(x):
        return np.sum(x * noise(3))
    step = mj.compile(loss, backend="interp")
    np.random.seed(1)
    first = step(np.ones(3))
    second = step(np.ones(3))
    np.random.seed(1)
    assert step(np.ones(3)) == first and first != second


def test_a_write_into_a_container_a_helper_captures_is_refused():
    memo = {"runs": [np.zeros(2)]}

    def remember(x):
        memo["runs"][0] = x
        return x

    def loss(x):
        return np.sum(remember(x) ** 2)
    with pytest.raises(TracingError, match=r"writes into memo\['runs'\]\[0\], which it captures"):
        mj.compile(loss, backend="interp")(np.ones(2))


class _Holder:
    pass


def _nested(kinds, leaf):
    """A container of the ``kinds`` (outermost first) with ``leaf`` at its entry 0 (or ``"v"``)."""
    for kind in reversed(kinds):
        if kind == "dict":
            leaf = {"v": leaf, "other": 1.0}
        elif kind == "list":
            leaf = [leaf, np.zeros(1)]
        else:
            holder = _Holder()
            holder.v = leaf
            leaf = holder
    return leaf


def _leaf(value, kinds):
    for kind in kinds:
        value = value["v"] if kind == "dict" else value[0] if kind == "list" else value.v
    return value


@pytest.mark.filterwarnings("ignore::morphjit.RecompileWarning")
@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["dict", "list", "object"]), min_size=0, max_size=3),
       st.lists(st.tuples(st.sampled_from(["in place", "rebind leaf", "rebind root", "element"]),
                          st.floats(-2, 2).filter(lambda c: abs(c) > 0.1)), min_size=1, max_size=5),
       st.booleans())
def test_random_nestings_and_changes_are_seen_as_numpy_sees_them(kinds, events, through_helper):
    box = [_nested(kinds, np.arange(1.0, 4.0))]

    def read():
        return _leaf(box[0], kinds)

    def loss(x):
        return np.sum(x * (read() if through_helper else _leaf(box[0], kinds)))
    step = mj.compile(loss, backend="interp")
    x = np.array([0.5, -1.0, 2.0])
    for event, c in events:
        if event == "in place":
            _leaf(box[0], kinds)[...] *= c
        elif event == "element":
            _leaf(box[0], kinds)[1] = c
        elif event == "rebind root":
            box[0] = _nested(kinds, np.full(3, c))
        elif kinds:
            parent = _leaf(box[0], kinds[:-1])
            if kinds[-1] == "object":
                parent.v = np.full(3, c)
            else:
                parent[0 if kinds[-1] == "list" else "v"] = np.full(3, c)
        else:
            box[0] = np.full(3, c)
        assert step(x) == pytest.approx(loss(x), rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_numpy_computes_from_a_captured_array_alone_is_read_on_each_call(backend):
    data = np.linspace(0.0, 1.0, 6).reshape(3, 2)

    def loss(w, write):
        centred = data - np.mean(data, axis=0)    # NumPy's arrays while traced, recomputed on each call
        scaled = centred.T * 2.0
        if write:
            scaled[0] = 1.0      # known values written into such an array: the step holds for its contents
        return np.sum((centred @ w) ** 2) + np.sum(scaled[1:] * w[0]) + np.sum(scaled[0])
    w = np.array([0.5, -1.0])
    for write in (False, True):
        step = mj.compile_loss(loss, backend=backend, static_argnums=1)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always", mj.RecompileWarning)
            for k in range(3):
                value, grad = step(w, write)
                assert value == pytest.approx(loss(w, write), rel=1e-12)
                np.testing.assert_allclose(grad, central_difference(lambda v: loss(v, write), w), rtol=1e-6, atol=1e-6)
                data[:, 1] *= k + 2.0
        assert len([r for r in record if r.category is mj.RecompileWarning]) == (2 if write else 0)


def test_a_value_python_reads_from_an_array_computed_from_a_captured_one_compiles_again():
    data = np.array([1.0, 3.0, 2.0])

    def loss(x):
        top = int(np.argmax(data * 2.0))          # Python reads a value NumPy computed from it
        return np.sum(x[top:] * data[top:])
    step = mj.compile(loss, backend="interp")
    x = np.array([1.0, 2.0, 4.0])
    assert step(x) == loss(x)
    data[2] = 9.0
    with pytest.warns(mj.RecompileWarning, match="data, which it captures"):
        assert step(x) == loss(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_arrays_a_partial_binds_and_a_callable_objects_attributes_are_read_on_each_call(backend):
    def loss(X, w, y, reg):
        return np.sum((X @ w - y) ** 2) + reg * np.sum(w ** 2)

    class Objective:
        def __init__(self, X, y):
            self.X, self.y = X, y

        def __call__(self, w):
            return loss(self.X, w, self.y, 0.0)
    rng = np.random.default_rng(0)
    X, y, w = rng.normal(size=(5, 3)), rng.normal(size=5), rng.normal(size=3)
    objective = Objective(X.copy(), y.copy())
    bound = functools.partial(loss, X, reg=0.5)           # an array bound by position, a number by name
    steps = {"partial": (mj.compile_loss(bound, backend=backend), lambda: (w, y)),
             "object": (mj.compile_loss(objective, backend=backend), lambda: (w,))}
    with warnings.catch_warnings():
        warnings.simplefilter("error", mj.RecompileWarning)
        for k in range(3):
            for name, (step, args) in steps.items():
                oracle = bound if name == "partial" else objective
                value, grad = step(*args())
                assert value == pytest.approx(oracle(*args()), rel=1e-12), (name, k)
                np.testing.assert_allclose(grad, central_difference(lambda v: oracle(v, *args()[1:]), w),
                                           rtol=1e-6, atol=1e-6)
            X[k] *= -2.0                                   # changed in place
            objective.X = objective.X + 1.0                # rebound
    bound.keywords["reg"] = 2.0                            # a partial's bound number, changed
    with pytest.warns(mj.RecompileWarning, match="reg, which it captures"):
        assert steps["partial"][0](w, y)[0] == pytest.approx(bound(w, y), rel=1e-12)


def test_arrays_and_numbers_of_a_module_of_the_users_are_followed(tmp_path, monkeypatch):
    (tmp_path / "user_settings.py").write_text("import numpy as np\nW = np.ones(3)\nscale = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_settings as S
    namespace = {"np": np, "S": S}
    exec("def loss(x):\n    return np.sum(x * S.W) * S.scale\n", namespace)
    loss = namespace["loss"]
    step, x = mj.compile(loss, backend="interp"), np.arange(3.0)
    assert step(x) == loss(x)
    S.W *= 3.0
    assert step(x) == loss(x)
    S.W = np.full(3, -1.0)
    assert step(x) == loss(x)
    S.scale = 5.0
    with pytest.warns(mj.RecompileWarning, match=r"S\.scale, which it captures"):
        assert step(x) == loss(x)
