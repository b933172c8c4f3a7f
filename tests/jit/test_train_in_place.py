"""Parameters updated in place by train_step, whatever their shape: axes of extent 1 included."""
import numpy as np
import pytest

import morphjit as mj

BACKENDS = ["numba", "interp"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(3, 1), (1, 3), (1, 1), (2, 1, 3)])
def test_a_parameter_with_unit_axes_is_updated_in_place(shape, backend):
    step = mj.train_step(lambda p, x: mj.sum((p["w"] * x) ** 2), mj.optim.sgd(0.1), backend=backend)
    w = np.arange(1.0, 1.0 + np.prod(shape)).reshape(shape)
    x = np.full(shape, 2.0)
    params = {"w": w.copy()}
    loss = step(params, step.init(params), x)
    np.testing.assert_allclose(loss, np.sum((w * x) ** 2))
    np.testing.assert_allclose(params["w"], w - 0.1 * 2 * w * x * x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_nest_that_reads_the_parameter_before_updating_it(backend):
    """std over a length-1 axis: the update is fused with loops that read the same row first."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3))
    fn = lambda p: mj.sum(mj.std(p["w"], axis=1)) + mj.sum(p["w"] ** 2)
    _, grad = mj.compile_loss(fn, backend="interp")({"w": w})
    step = mj.train_step(fn, mj.optim.sgd(0.1), backend=backend)
    params = {"w": w.copy()}
    step(params, step.init(params))
    np.testing.assert_allclose(params["w"], w - 0.1 * grad["w"], rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_update_summed_over_the_batch_that_reads_the_parameter(backend):
    """The gradient of w (3,) is a sum over the rows of x (4, 3) that reads w itself: the nest
    accumulates in its output, so the update cannot be written over w as it runs; it is
    computed aside and copied."""
    x = np.arange(12.0).reshape(4, 3) / 10
    step = mj.train_step(lambda w, x: mj.sum((x * w) ** 2), mj.optim.sgd(0.01), backend=backend)
    w = np.ones(3)
    state = step.init(w)
    expected = np.ones(3)
    for _ in range(2):
        loss = step(w, state, x)
        np.testing.assert_allclose(loss, np.sum((x * expected) ** 2), rtol=1e-12)
        expected = expected - 0.01 * np.sum(2 * x * x * expected, axis=0)
        np.testing.assert_allclose(w, expected, rtol=1e-12)
