"""mj.train_step: the fused loss + gradient + optimiser update, checked step by step against the
optimisers' published formulas written out in NumPy (gradients from the reference executor)."""
import re

import numpy as np
import pytest

import morphjit as mj

BACKENDS = ["numba", "interp"]


def mlp(params, x, y):
    h = np.tanh(x @ params["W1"] + params["b1"])
    return mj.mean(mj.softmax_cross_entropy(h @ params["W2"] + params["b2"], y))


def make_params(dtype, seed=1):
    rng = np.random.default_rng(seed)
    return {"W1": (rng.normal(size=(12, 16)) * 0.3).astype(dtype), "b1": np.zeros(16, dtype),
            "W2": (rng.normal(size=(16, 5)) * 0.3).astype(dtype), "b2": rng.normal(size=5).astype(dtype)}


def make_data(n=24, seed=2):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 12)), rng.integers(0, 5, n)


# ---------------------------------------------------------------------------------------------
# The reference optimisers, transcribed from PyTorch's documented algorithms


def ref_sgd(lr, momentum=0.0, nesterov=False, weight_decay=0.0):
    def update(p, g, state, t):
        if weight_decay:
            g = g + weight_decay * p
        if momentum:
            buf = g.copy() if t == 1 else momentum * state["momentum"] + g
            state["momentum"] = buf
            g = g + momentum * buf if nesterov else buf
        return p - lr * g
    return update


def ref_adam(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False):
    def update(p, g, state, t):
        if weight_decay and decoupled:
            p = p * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * p
        state["m"] = state["m"] + (1 - b1) * (g - state["m"])
        state["v"] = b2 * state["v"] + (1 - b2) * g * g
        step_size = lr / (1 - b1 ** t)
        denom = np.sqrt(state["v"]) / np.sqrt(1 - b2 ** t) + eps
        return p - step_size * state["m"] / denom
    return update


def ref_rmsprop(lr, alpha=0.99, eps=1e-8, momentum=0.0, weight_decay=0.0, centered=False):
    def update(p, g, state, t):
        if weight_decay:
            g = g + weight_decay * p
        state["square_avg"] = alpha * state["square_avg"] + (1 - alpha) * g * g
        avg = state["square_avg"]
        if centered:
            state["grad_avg"] = alpha * state["grad_avg"] + (1 - alpha) * g
            avg = avg - state["grad_avg"] ** 2
        avg = np.sqrt(avg) + eps
        if momentum:
            state["momentum"] = momentum * state["momentum"] + g / avg
            return p - lr * state["momentum"]
        return p - lr * g / avg
    return update


CASES = [
    ("sgd", dict(lr=0.3)),
    ("sgd", dict(lr=0.1, momentum=0.9)),
    ("sgd", dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-2)),
    ("adam", dict(lr=1e-2)),
    ("adam", dict(lr=1e-2, b1=0.8, b2=0.99, eps=1e-6, weight_decay=1e-2)),
    ("adam", dict(lr=1e-2, weight_decay=0.1, decoupled=True)),
    ("rmsprop", dict(lr=1e-2)),
    ("rmsprop", dict(lr=1e-2, alpha=0.9, momentum=0.5, weight_decay=1e-3, centered=True)),
]
REFERENCES = {"sgd": ref_sgd, "adam": ref_adam, "rmsprop": ref_rmsprop}


def reference_run(name, hyper, params, data, steps):
    """Losses and final params of ``steps`` updates: gradients from the reference executor,
    the update from the formulas above."""
    grad = mj.compile_loss(mlp, backend="interp")
    update = REFERENCES[name](**hyper)
    params = {k: v.copy() for k, v in params.items()}
    states = {k: {s: np.zeros_like(v) for s in ("momentum", "m", "v", "square_avg", "grad_avg")}
              for k, v in params.items()}
    losses = []
    for t in range(1, steps + 1):
        loss, grads = grad(params, *data)
        losses.append(loss)
        params = {k: update(params[k], grads[k], states[k], t) for k in params}
    return losses, params


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,hyper", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_steps_match_the_published_formulas(name, hyper, dtype, backend):
    data = make_data()
    want_losses, want = reference_run(name, hyper, make_params(dtype), data, steps=6)
    params = make_params(dtype)
    step = mj.train_step(mlp, getattr(mj.optim, name)(**hyper), backend=backend)
    state = step.init(params)
    losses = [step(params, state, *data) for _ in range(6)]
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    np.testing.assert_allclose(losses, want_losses, rtol=rtol)
    for k in params:
        assert params[k].dtype == dtype
        np.testing.assert_allclose(params[k], want[k], rtol=rtol, atol=rtol * 1e-2, err_msg=k)
    assert int(state["step"]) == 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_adamw_is_adam_with_decoupled_decay(backend):
    data, a, b = make_data(), make_params(np.float64), make_params(np.float64)
    one = mj.train_step(mlp, mj.optim.adamw(1e-2, weight_decay=0.05), backend=backend)
    two = mj.train_step(mlp, mj.optim.adam(1e-2, weight_decay=0.05, decoupled=True), backend=backend)
    sa, sb = one.init(a), two.init(b)
    for _ in range(3):
        assert one(a, sa, *data) == two(b, sb, *data)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_the_update_is_fused_into_the_compiled_step():
    """No gradient leaves the step: its outputs are the loss and the updated arrays, and every
    update loop writes over its parameter."""
    params, data = make_params(np.float64), make_data()
    step = mj.train_step(mlp, mj.optim.adam(1e-3))
    state = step.init(params)
    step(params, state, *data)
    (run,) = step.steps()
    assert len(run.program.outputs) == 1 + 3 * len(params)
    assert "def step(" in run.source and ": 5 gemm, " in run.source.splitlines()[0]
    # every update is stored under its parameter's (or slot's) own name: the output parameters
    # u0, u1, ... (the same arrays) are never used, so LLVM sees one array per update
    header = next(line for line in run.source.splitlines() if line.startswith("def step("))
    unused = [name for name in header[9:-2].split(", ") if name.startswith("u")]
    assert len(unused) == 3 * len(params)
    body = run.source.split(header, 1)[1]
    assert not any(re.search(rf"\b{name}\b", body) for name in unused)


def test_learning_rate_changes_without_recompiling():
    params, data = make_params(np.float64), make_data()
    schedule = mj.optim.sgd(lambda t: 0.5 / (1 + t))
    step = mj.train_step(mlp, schedule)
    state = step.init(params)
    reference = make_params(np.float64)
    grad = mj.compile_loss(mlp, backend="interp")
    for t in range(4):
        step(params, state, *data)
        _, g = grad(reference, *data)
        reference = {k: reference[k] - 0.5 / (1 + t) * g[k] for k in reference}
    step(params, state, *data, lr=0.0)          # a per-call override: no change at all
    for k in params:
        np.testing.assert_allclose(params[k], reference[k], rtol=1e-12)
    assert len(step.steps()) == 1 and step.cache_info().misses == 1


def test_data_is_never_written_and_params_are_updated_in_place():
    params, (x, y) = make_params(np.float32), make_data()
    x0, y0 = x.copy(), y.copy()
    ids = {k: id(v) for k, v in params.items()}
    before = {k: v.copy() for k, v in params.items()}
    step = mj.train_step(mlp, mj.optim.sgd(0.1, momentum=0.9))
    state = step.init(params)
    step(params, state, x, y)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    assert {k: id(v) for k, v in params.items()} == ids
    assert all(not np.array_equal(params[k], before[k]) for k in params)
    assert all(np.any(state["momentum"][k]) for k in params)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_compiled_step_serves_every_batch_size(backend):
    params, reference = make_params(np.float64), make_params(np.float64)
    step = mj.train_step(mlp, mj.optim.adam(1e-2), backend=backend)
    want = mj.train_step(mlp, mj.optim.adam(1e-2), backend="interp", static_shapes=True)
    state, want_state = step.init(params), want.init(reference)
    for n in (24, 7, 1, 24):
        assert step(params, state, *make_data(n)) == pytest.approx(want(reference, want_state, *make_data(n)),
                                                                  rel=1e-12)
    for k in params:
        np.testing.assert_allclose(params[k], reference[k], rtol=1e-12)
    assert int(state["step"]) == 4
    # 24 and 7 share the polymorphic step; a batch of one has its own (compiler.batched_leaves)
    assert len(step.steps()) == 2 and len(want.steps()) == 3


class TestRefusals:
    def setup_method(self):
        self.params, self.data = make_params(np.float64), make_data()
        self.step = mj.train_step(mlp, mj.optim.adam(1e-2))
        self.state = self.step.init(self.params)

    def test_a_parameter_passed_as_data(self):
        x = np.zeros((24, 12))
        params = dict(self.params, W1=x.reshape(-1)[:12 * 16].reshape(12, 16))
        state = self.step.init(params)
        with pytest.raises(ValueError, match=r"x shares memory with params\['W1'\]"):
            self.step(params, state, x, self.data[1])

    def test_aliasing_is_caught_after_the_first_call_too(self):
        x, y = self.data
        self.step(self.params, self.state, x, y)                  # compiled; later calls take the fast path
        self.step(self.params, self.state, x, y)
        data = self.params["W1"].reshape(-1)[:24].reshape(2, 12)  # a view of a parameter as data
        with pytest.raises(ValueError, match=r"x shares memory with params\['W1'\]"):
            self.step(self.params, self.state, data, y[:2])
        other = np.zeros(1000)                                    # same owner, no overlap: accepted
        self.params["b2"] = other[:5]
        self.step(self.params, self.step.init(self.params), other[100:124].reshape(2, 12), y[:2])

    def test_two_parameters_sharing_memory(self):
        self.params["b1"] = self.params["W1"][0]
        with pytest.raises(ValueError, match=r"params\['(W1|b1)'\] and params\['(W1|b1)'\] share memory"):
            self.step(self.params, self.step.init(self.params), *self.data)

    def test_state_sharing_memory_with_a_parameter(self):
        self.state["m"]["W2"] = self.params["W2"]
        with pytest.raises(ValueError, match=r"share memory"):
            self.step(self.params, self.state, *self.data)

    def test_data_of_disagreeing_batch_sizes(self):
        x, y = self.data
        with pytest.raises(mj.ShapeError, match="x has 24 rows but y has 23"):
            self.step(self.params, self.state, x, y[:-1])

    def test_state_of_other_params(self):
        state = self.step.init({"W1": self.params["W1"]})
        with pytest.raises(mj.TracingError, match="make the state with step.init"):
            self.step(self.params, state, *self.data)

    def test_something_else_as_state(self):
        with pytest.raises(mj.TracingError, match="state must be the dict made by step.init"):
            self.step(self.params, {"m": 0}, *self.data)

    def test_a_parameter_that_cannot_be_written(self):
        self.params["W1"] = np.asfortranarray(self.params["W1"])
        with pytest.raises(mj.DtypeError, match=r"params\['W1'\] is updated in place.*C-contiguous"):
            self.step.init(self.params)

    def test_an_integer_parameter(self):
        with pytest.raises(mj.DtypeError, match=r"params\['b'\] is updated in place"):
            self.step.init({"b": np.zeros(3, np.int64)})

    def test_not_an_optimizer(self):
        with pytest.raises(TypeError, match="mj.optim"):
            mj.train_step(mlp, "adam")

    @pytest.mark.parametrize("make", [lambda: mj.optim.adam(1e-3, b1=1.0), lambda: mj.optim.sgd(-1.0),
                                      lambda: mj.optim.sgd(0.1, nesterov=True),
                                      lambda: mj.optim.rmsprop(float("nan"))])
    def test_bad_hyperparameters(self, make):
        with pytest.raises(ValueError):
            make()


def test_deep_models_whose_nests_repeat_update_in_place_too():
    """Repeated loop nests become one shared kernel; the in-place updates inside it must name
    the parameter itself."""
    def deep(params, x, y):
        h = x
        for k in range(3):
            h = np.tanh(h @ params[f"W{k}"] + params[f"b{k}"])
        return mj.mean(mj.softmax_cross_entropy(h @ params["out"], y))

    rng = np.random.default_rng(5)
    params = {**{f"W{k}": rng.normal(size=(16, 16)) * 0.3 for k in range(3)},
              **{f"b{k}": np.zeros(16) for k in range(3)}, "out": rng.normal(size=(16, 4)) * 0.3}
    reference = {k: v.copy() for k, v in params.items()}
    x, y = rng.normal(size=(32, 16)), rng.integers(0, 4, 32)
    step = mj.train_step(deep, mj.optim.adam(1e-2))
    want = mj.train_step(deep, mj.optim.adam(1e-2), backend="interp")
    state, want_state = step.init(params), want.init(reference)
    for _ in range(3):
        assert step(params, state, x, y) == pytest.approx(want(reference, want_state, x, y), rel=1e-12)
    for k in params:
        np.testing.assert_allclose(params[k], reference[k], rtol=1e-11)
    (run,) = step.steps()
    assert "k0 = kernels.load(" in run.source
