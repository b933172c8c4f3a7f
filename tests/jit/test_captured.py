"""Random generators a loss draws from without taking them as arguments: in its closure, among its
globals, NumPy's global one. Each call draws anew from a seed taken from the generator (which
advances), so results are reproducible from the generator's seed; gradients are those of the draws
made."""
import subprocess
import sys
import textwrap

import numpy as np
import numpy.random as npr
import pytest

import morphjit as mj

BACKENDS = ["interp", "numba"]
GLOBAL_GENERATOR = np.random.default_rng(11)


def black_box_objective(seed):
    """autograd's black-box variational inference: a RandomState in the closure."""
    rs = npr.RandomState(seed)

    def objective(params, t):
        mean, log_std = params[:2], params[2:]
        samples = rs.randn(64, 2) * np.exp(log_std) + mean
        return -np.mean(np.sum(-0.5 * samples ** 2, axis=1)) - np.sum(log_std) + 0 * t
    return objective, rs


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closure_generator_draws_anew_each_call_reproducibly_from_its_seed(backend):
    objective, rs = black_box_objective(0)
    step = mj.value_and_grad(objective, backend=backend)
    params = np.array([0.5, -0.2, 0.1, -0.3])
    before = rs.get_state()[1].copy()
    first, second = step(params, 0)[0], step(params, 1)[0]
    assert first != second
    assert not np.array_equal(rs.get_state()[1], before)   # the generator advanced
    again, _ = black_box_objective(0)
    assert mj.value_and_grad(again, backend=backend)(params, 0)[0] == first


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_are_those_of_the_draws_made(backend):
    objective, rs = black_box_objective(3)
    step, forward = mj.value_and_grad(objective, backend=backend), mj.compile(objective, backend=backend)
    params = np.array([0.5, -0.2, 0.1, -0.3])
    state = rs.get_state()
    _, grad = step(params, 0)
    eps, expected = 1e-6, []
    for e in np.eye(params.size):
        values = []
        for sign in (1, -1):
            rs.set_state(state)
            values.append(forward(params + sign * eps * e, 0))
        expected.append((values[0] - values[1]) / (2 * eps))
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-8)


def test_numpys_global_draws_follow_np_random_seed():
    def noisy(x):
        return np.sum(np.random.randn(4) * x + np.random.uniform(0, 1, size=4))
    compiled = mj.compile(noisy)
    np.random.seed(3)
    first, second = compiled(np.ones(4)), compiled(np.ones(4))
    np.random.seed(3)
    assert compiled(np.ones(4)) == first and first != second


def test_a_generator_among_the_globals_and_its_draws_statistics():
    def draws(scale):
        return GLOBAL_GENERATOR.normal(size=20000) * scale
    z = mj.compile(draws)(2.0)
    assert abs(z.mean()) < 4 * 2.0 / np.sqrt(z.size) and abs(z.std() - 2.0) < 0.05
    assert not np.array_equal(z, mj.compile(draws)(2.0))


def test_the_generator_is_read_each_call_so_a_rebound_one_is_followed():
    rs = npr.RandomState(0)

    def loss(x):
        return np.sum(rs.rand(3) * x)
    compiled = mj.compile(loss)
    compiled(np.ones(3))
    rs = npr.RandomState(5)   # noqa: F841 (the closure's cell)
    expected_rs = npr.RandomState(5)
    got = compiled(np.ones(3))
    assert got == mj.compile(lambda x: np.sum(expected_rs.rand(3) * x))(np.ones(3))


def test_a_train_step_draws_from_a_closure_generator_on_every_step():
    objective, rs = black_box_objective(0)
    params = np.array([0.5, -0.2, 0.1, -0.3])
    train = mj.train_step(objective, mj.optim.sgd(0.01))
    state = train.init(params)
    losses = [float(train(params, state, t)) for t in range(3)]
    assert len(set(losses)) == 3


@pytest.mark.slow
def test_two_processes_seeded_alike_draw_alike(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, numpy.random as npr, morphjit as mj
        rs = npr.RandomState(42)
        loss = mj.value_and_grad(lambda p: np.sum((rs.randn(8) - p) ** 2))
        print(repr(float(loss(np.zeros(8))[0])), repr(float(loss(np.zeros(8))[0])))
    """)
    outputs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
               for _ in range(2)]
    assert outputs[0] == outputs[1] and len(set(outputs[0].split())) == 2
