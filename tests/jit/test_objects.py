"""Objects of plain Python classes as arguments: taken apart by their attributes, differentiated
like dicts, and written back after each call as NumPy would have left them (``layer.cache = x``).
The oracle is the same function run by NumPy on plain objects; gradients are checked by central
differences."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import morphjit as mj
from morphjit.tracing import Tracer
from morphjit.util import TracingError
from support.gradcheck import central_difference

BACKENDS = ["interp", "numba"]


class Affine:
    def __init__(self, W, b):
        self.W, self.b, self.cache = W, b, None

    def forward(self, x):
        self.cache = (x, self.W)          # CS231n's layers keep what their backward pass needs
        return x @ self.W + self.b


class Relu:
    def forward(self, x):
        self.mask = x > 0
        return np.maximum(x, 0)


class Net:
    def __init__(self, layers):
        self.layers, self.calls, self.name = layers, 0, "mlp"


def net_loss(w, x, net):
    h = x * w
    for layer in net.layers:
        h = layer.forward(h)
    net.calls = net.calls + 1
    return np.sum(h ** 2)


def make_net(rng):
    return Net([Affine(rng.normal(size=(3, 4)), np.zeros(4)), Relu(), Affine(rng.normal(size=(4, 2)), np.ones(2))])


def assert_same_object(got, expected):
    assert type(got) is type(expected)
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_same_object(a, b)
    elif isinstance(expected, (str, type(None))):
        assert got == expected
    elif isinstance(expected, (np.ndarray, float, int)):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
        assert np.asarray(got).dtype == np.asarray(expected).dtype
    else:
        assert sorted(vars(got)) == sorted(vars(expected))
        for k in vars(expected):
            assert_same_object(getattr(got, k), getattr(expected, k))


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_caches_and_counters_are_left_as_numpy_leaves_them(backend):
    rng = np.random.default_rng(0)
    net = make_net(rng)
    expected = copy.deepcopy(net)
    w, x = np.array([1.0, -0.5, 2.0]), rng.normal(size=(5, 3))
    step = mj.compile_loss(net_loss, backend=backend)
    for i in range(3):
        loss, grad = step(w, x + i, net)
        assert loss == pytest.approx(net_loss(w, x + i, expected), rel=1e-12)
        np.testing.assert_allclose(net.calls, expected.calls)
        net.calls = int(net.calls)   # a 0-d result comes back as a NumPy scalar, as for dicts
        assert_same_object(net, expected)
        assert net.layers[0].cache[1] is net.layers[0].W     # an argument value is stored as itself
        fd = central_difference(lambda v: net_loss(v, x + i, copy.deepcopy(expected)), w)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    assert step.cache_info().misses == 2   # the caches are None on the first call, tuples after it


class BatchNorm:
    def __init__(self, d, momentum=0.9):
        self.mode, self.momentum = "train", momentum
        self.running_mean, self.running_var = np.zeros(d), np.ones(d)

    def __call__(self, h):
        if self.mode == "train":
            mean, var = h.mean(axis=0), h.var(axis=0)
            self.running_mean = self.momentum * self.running_mean + (1 - self.momentum) * mean
            self.running_var = self.momentum * self.running_var + (1 - self.momentum) * var
        else:
            mean, var = self.running_mean, self.running_var
        return (h - mean) / np.sqrt(var + 1e-5)


def bn_loss(w, x, bn):
    return np.sum(bn(x @ w) ** 2 * np.arange(1.0, 1.0 + w.shape[1]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batchnorm_object_keeps_its_running_averages_and_its_mode_selects_the_step(backend):
    rng = np.random.default_rng(1)
    w, x = rng.normal(size=(3, 4)), rng.normal(size=(8, 3))
    got, expected = BatchNorm(4), BatchNorm(4)
    step = mj.compile_loss(bn_loss, backend=backend)
    for i in range(3):
        loss, grad = step(w, x * (i + 1), got)
        assert loss == pytest.approx(bn_loss(w, x * (i + 1), expected), rel=1e-12)
        assert_same_object(got, expected)
        fd = central_difference(lambda v: bn_loss(v, x * (i + 1), copy.deepcopy(expected)), w)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    got.mode = expected.mode = "test"
    assert step(w, x, got)[0] == pytest.approx(bn_loss(w, x, expected), rel=1e-12)
    assert_same_object(got, expected)
    assert step.cache_info().misses == 2


class Dense:
    def __init__(self, W, b, act):
        self.W, self.b, self.act, self.name = W, b, act, "dense"

    def __call__(self, x):
        return self.act(x @ self.W + self.b)


def dense_loss(layer, x):
    return np.sum(layer(x) ** 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gradient_of_an_object_is_an_object_of_its_class(backend):
    rng = np.random.default_rng(2)
    layer, x = Dense(rng.normal(size=(3, 4)), rng.normal(size=4), np.tanh), rng.normal(size=(6, 3))
    step = mj.value_and_grad(dense_loss, backend=backend)
    for _ in range(2):   # the second call takes the fast path
        value, grad = step(layer, x)
        assert value == pytest.approx(dense_loss(layer, x), rel=1e-12)
        assert type(grad) is Dense and grad.act is np.tanh and grad.name == "dense"
        for name in ("W", "b"):
            def at(v, name=name):
                other = copy.copy(layer)
                setattr(other, name, v)
                return dense_loss(other, x)
            np.testing.assert_allclose(getattr(grad, name), central_difference(at, getattr(layer, name)),
                                       rtol=1e-5, atol=1e-6)
    assert step.cache_info().hits >= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_function_held_by_an_object_is_part_of_the_signature(backend):
    rng = np.random.default_rng(3)
    W, b, x = rng.normal(size=(3, 2)), np.zeros(2), rng.normal(size=(4, 3))
    step = mj.compile(dense_loss, backend=backend)
    for act in (np.tanh, np.sin, np.tanh, np.sin):
        assert step(Dense(W, b, act), x) == pytest.approx(dense_loss(Dense(W, b, act), x), rel=1e-12)
    assert step.cache_info().misses == 2


def test_a_training_step_updates_an_object_of_parameters_in_place():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 3))
    params = Dense(rng.normal(size=(3, 2)), rng.normal(size=2), lambda z: z)
    W, b = params.W.copy(), params.b.copy()
    step = mj.train_step(dense_loss, mj.optim.sgd(0.01), backend="interp")
    state = step.init(params)
    assert type(state["m"] if "m" in state else params) is Dense
    for _ in range(3):
        loss = step(params, state, x)
        r = x @ W + b
        assert loss == pytest.approx(np.sum(r ** 2), rel=1e-12)
        W, b = W - 0.01 * 2 * x.T @ r, b - 0.01 * 2 * r.sum(axis=0)   # by hand: d/dW sum(r^2) = 2 x^T r
        np.testing.assert_allclose(params.W, W, rtol=1e-12)
        np.testing.assert_allclose(params.b, b, rtol=1e-12)


def test_objects_made_in_the_function_and_deleted_attributes_are_written_back():
    class Record:
        def __init__(self, value):
            self.value = value

    class State:
        pass

    def f(w, s):
        s.best = Record(np.sum(w) * 2)
        del s.old
        s.history.append(np.max(w))
        return np.sum(w ** 2)
    got, expected = State(), State()
    for s in (got, expected):
        s.old, s.history = 1.0, []
    step = mj.compile_loss(f, backend="interp")
    for w in (np.array([1.0, 2.0]), np.array([0.5, -3.0])):
        step(w, got)
        f(w, expected)
        got.old = expected.old = 0.0
        assert type(got.best) is Record and got.best.value == pytest.approx(expected.best.value)
        np.testing.assert_allclose(got.history, expected.history)


def test_objects_that_contain_themselves_or_hold_what_cannot_be_traced_are_refused():
    class Node:
        pass
    node = Node()
    node.me, node.w = node, np.ones(2)
    with pytest.raises(TracingError, match="contains itself"):
        mj.compile_loss(lambda w, n: np.sum(w * n.w), backend="interp")(np.ones(2), node)
    node = Node()
    node.tags = {"a", "b"}
    with pytest.raises(TracingError, match=r"argument n\.tags is a set"):
        mj.compile_loss(lambda w, n: np.sum(w), backend="interp")(np.ones(2), node)


def test_a_traced_value_left_in_a_bound_methods_object_is_refused_with_the_hint():
    class Model:
        def __init__(self):
            self.W = np.ones((3, 2))

        def loss(self, x):
            self.cache = x @ self.W
            return np.sum(self.cache)
    with pytest.raises(TracingError, match=r"self\.cache, which it captures.*compile Model\.loss, which takes "
                                           r"the object as its first argument"):
        mj.compile(Model().loss, backend="interp")(np.ones((2, 3)))
    model = Model()
    assert mj.compile(Model.loss, backend="interp")(model, np.ones((2, 3))) == 12.0
    np.testing.assert_array_equal(model.cache, np.full((2, 2), 3.0))


class Bag:
    pass


OPS = st.lists(st.tuples(st.sampled_from(["set", "scale", "delete", "const", "append", "nest"]),
                         st.sampled_from(["a", "b", "c"]), st.floats(-2, 2)), max_size=6)


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_random_sequences_of_attribute_writes_leave_what_numpy_leaves(ops):
    def f(w, bag):
        for op, key, c in ops:
            if op == "set":
                setattr(bag, key, w * c)
            elif op == "scale" and isinstance(getattr(bag, key, None), np.ndarray | Tracer):
                setattr(bag, key, getattr(bag, key) * c + w)
            elif op == "delete" and hasattr(bag, key):
                delattr(bag, key)
            elif op == "const":
                setattr(bag, key, c)
            elif op == "append":
                bag.log.append(np.sum(w) * c)
            elif op == "nest":
                bag.inner.x = bag.inner.x + c * w
        return np.sum(w ** 2)
    w = np.array([0.5, -1.5])
    got, expected = Bag(), Bag()
    for bag in (got, expected):
        bag.a, bag.log, bag.inner = np.ones(2), [], Bag()
        bag.inner.x = np.zeros(2)
    for _ in range(2):
        mj.compile_loss(f, backend="interp")(w, got)
        f(w, expected)
        assert sorted(vars(got)) == sorted(vars(expected))
        for k in vars(expected):
            if k != "inner":
                np.testing.assert_allclose(getattr(got, k), getattr(expected, k), rtol=1e-12)
        np.testing.assert_allclose(got.inner.x, expected.inner.x, rtol=1e-12)
