"""A slice with traced bounds that a call finds shorter (the last minibatch of data its size does
not divide) follows NumPy: a step of its own for that length, compiled when a call needs it. The
oracle is NumPy running the same function on the same arrays, and central differences."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import morphjit as mj

BACKENDS = ["numba", "interp"]
DATA = np.random.default_rng(11).normal(size=(10, 3))   # captured by the objectives below
TARGETS = np.random.default_rng(12).normal(size=10)


def epoch_loss(w, it):
    """autograd's neural_net example: 10 rows in batches of 4, so the third batch has 2 rows."""
    idx = it % 3
    rows = DATA[idx * 4:(idx + 1) * 4]
    targets = TARGETS[idx * 4:(idx + 1) * 4]
    return np.mean((np.tanh(rows @ w) - targets) ** 2)


def central_differences(f, w, *args, h=1e-6):
    grad = np.zeros_like(w)
    for k in range(w.size):
        e = np.zeros_like(w)
        e.flat[k] = h
        grad.flat[k] = (f(w + e, *args) - f(w - e, *args)) / (2 * h)
    return grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_last_shorter_minibatch_of_an_epoch_follows_numpy(backend):
    step = mj.compile_loss(epoch_loss, backend=backend)
    w = np.array([0.3, -0.7, 1.1])
    for it in range(7):
        value, grad = step(w, it)
        assert value == pytest.approx(epoch_loss(w, it), rel=1e-12), it
        np.testing.assert_allclose(grad, central_differences(epoch_loss, w, it), rtol=1e-6, atol=1e-9)
    stats = step.cache_info()
    assert stats.misses == 2   # the 4-row step and the 2-row one, each compiled once


def test_each_shorter_length_has_a_step_and_none_serves_another():
    step = mj.compile_loss(lambda w, i: np.sum(np.sin(DATA[i:i + 4] @ w) ** 2))
    w = np.array([0.5, 0.25, -1.0])
    starts = [0, 8, 9, 7, 9, 8, 6, 7]   # 4, 2, 1, 3, 1, 2, 4, 3 rows
    for i in starts:
        value, grad = step(w, i)
        assert value == pytest.approx(np.sum(np.sin(DATA[i:i + 4] @ w) ** 2), rel=1e-12), i
        rows = DATA[i:i + 4]
        np.testing.assert_allclose(grad, rows.T @ (2 * np.sin(rows @ w) * np.cos(rows @ w)), rtol=1e-10)
    assert step.cache_info().misses == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shorter_slice_of_a_differentiated_argument_has_its_gradient(backend):
    def loss(w, i):
        return np.sum(np.sin(w[i:i + 3]) ** 2)
    step = mj.compile_loss(loss, backend=backend)
    w = np.linspace(-1.0, 1.0, 5)
    for i in [0, 3, 4, 1, 4]:
        value, grad = step(w, i)
        assert value == pytest.approx(loss(w, i), rel=1e-12)
        np.testing.assert_allclose(grad, central_differences(loss, w, i), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_and_grad_serve_shorter_slices(backend):
    forward = mj.compile(lambda x, i: x[i:i + 4] * 2.0, backend=backend)
    x = np.arange(6.0)
    for i in [0, 4, 5, 2, 5]:
        np.testing.assert_array_equal(forward(x, i), x[i:i + 4] * 2.0)
    grad = mj.grad(epoch_loss, backend=backend)
    w = np.array([0.3, -0.7, 1.1])
    np.testing.assert_allclose(grad(w, 2), central_differences(epoch_loss, w, 2), rtol=1e-6, atol=1e-9)


def test_a_training_step_updates_as_numpy_would_on_the_shorter_batch():
    step = mj.train_step(epoch_loss, mj.optim.sgd(0.1))
    w = np.array([0.3, -0.7, 1.1])
    state = step.init(w)
    for it in range(4):
        before = w.copy()
        loss = step(w, state, it)
        assert loss == pytest.approx(epoch_loss(before, it), rel=1e-12)
        np.testing.assert_allclose(w, before - 0.1 * central_differences(epoch_loss, before, it), rtol=1e-6, atol=1e-9)
    assert int(state["step"]) == 4   # the refused call did not count as a step


def test_a_captured_generator_gives_one_seed_per_call_also_when_the_call_is_retried():
    def objective(seed, its):
        rs = np.random.RandomState(seed)

        def loss(w, it):
            return np.sum(np.tanh(DATA[it * 4:(it + 1) * 4] @ w)) + 0.1 * rs.randn()
        step = mj.compile_loss(loss)
        values = [step(np.ones(3), it)[0] for it in its]
        return values, rs.randint(1 << 30)
    ragged, after_ragged = objective(5, [0, 2, 1])   # the second call is retried for 2 rows
    full, after_full = objective(5, [0, 1, 1])
    assert after_ragged == after_full
    assert ragged[0] == full[0] and ragged[2] == full[2]


def test_an_empty_slice_is_refused():
    step = mj.compile_loss(lambda w, i: np.sum(DATA[i:i + 4] @ w))
    with pytest.raises(IndexError, match=r"of 4 elements, lacks its element 0 .*not for an empty slice"):
        step(np.ones(3), 10)


def test_slices_on_one_line_get_their_own_lengths():
    def loss(w, i, j):
        return np.sum(DATA[i:i + 4] @ w) + 2 * np.sum(DATA[j:j + 4] @ w)
    step = mj.compile_loss(loss)
    w = np.array([0.5, -1.0, 0.25])
    pairs = [(0, 0), (8, 0), (8, 7), (0, 7), (7, 8), (9, 9), (8, 8), (0, 0)]
    for i, j in pairs:
        assert step(w, i, j)[0] == pytest.approx(loss(w, i, j), rel=1e-12), (i, j)
    # Lengths (i's, j's) compiled: (4, 4), (2, 4), (2, 3), (4, 3), (3, 4) and (3, 2), (1, 4) and
    # (1, 1), (2, 2): a call whose two slices are both shorter goes through the variant for the first.
    assert step.cache_info().misses == 9
    with pytest.raises(IndexError, match=r"\(at test_shorter_slices.py:\d+\), the 2nd there, of 4 elements, "
                                         r"lacks its element 0"):
        step(w, 0, 10)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 9), extent=st.integers(1, 5), stride=st.integers(1, 3),
       starts=st.lists(st.integers(-12, 12), min_size=1, max_size=5))
def test_traced_slices_follow_numpy_at_every_start(size, extent, stride, starts):
    """Any slice ``x[t:t + extent:stride]`` of any axis, at any start: NumPy's values and
    gradients, or (NumPy's slice empty while the traced one is not) an IndexError."""
    x = np.random.default_rng(size).normal(size=size)

    def loss(x, t):
        return np.sum(np.sin(x[t:t + extent:stride]) * 1.5)
    step = mj.compile_loss(loss, backend="interp")
    for t in starts:
        picked = x[t:t + extent:stride]
        if picked.size == 0:
            with pytest.raises(IndexError, match="lacks its element 0"):
                step(x, t)
            continue
        value, grad = step(x, t)
        assert value == pytest.approx(np.sum(np.sin(picked) * 1.5), rel=1e-12)
        expected = np.zeros(size)
        expected[np.arange(size)[t:t + extent:stride]] = 1.5 * np.cos(picked)
        np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-15)


def test_a_generator_argument_gives_one_seed_per_call_also_when_the_call_is_retried():
    def loss(w, it, rng):
        return np.sum(np.tanh(DATA[it * 4:(it + 1) * 4] @ w)) + 0.1 * rng.normal()
    ragged, full = np.random.default_rng(3), np.random.default_rng(3)
    step = mj.compile_loss(loss)
    values = [step(np.ones(3), it, ragged)[0] for it in [0, 2, 1]]
    expected = [step(np.ones(3), it, full)[0] for it in [0, 1, 1]]
    assert ragged.integers(1 << 30) == full.integers(1 << 30)
    assert values[0] == expected[0] and values[2] == expected[2]
