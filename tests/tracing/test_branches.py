"""Tests of traced values (`if`, `and`, `or`, `not`, builtin `min`/`max`, a raise on one outcome):
NumPy's values on each path, gradients of the path taken (central finite differences of the same
code run by NumPy), exactly zero from a path not taken, on both backends."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import morphjit as mj

BACKENDS = ["interp", "numba"]


def line_fit_prior(theta):
    """emcee's line fit: a flat prior on a box, -inf outside."""
    m, b = theta
    if not (-5 < m < 0.5 and 0 < b < 10):
        return -np.inf
    return -0.5 * (m ** 2 + b ** 2)


def positive_log_likelihood(theta):
    if np.any(theta < 0):
        return -np.inf
    return np.sum(np.log(theta) - theta)


def piecewise(x):
    s = np.sum(x)
    return s ** 2 if s > 1 else (np.sqrt(s) if s > 0 else -s)


def builtin_choices(x):
    return max(np.sum(x), 1.0) + min(x[0], x[1]) + abs(x[2] - 1) + (x[0] > 0 or x[1] > 0) * x[1]


def sqrt_where_excluded(x):
    """The path not taken has an infinite derivative (sqrt at 0) and NaN values (log of negatives)."""
    if np.min(x) > 0:
        return np.sum(np.sqrt(x) + np.log(x))
    return np.sum(x ** 2)


def early_exit_helper(x):
    def clipped(v):
        if v > 2:
            return 2.0 + 0 * v
        return v
    return clipped(np.sum(x)) * np.mean(x)


CASES = [
    (line_fit_prior, [[0.1, 2.0], [-6.0, 2.0], [0.1, 11.0], [-1.0, 9.0]]),
    (positive_log_likelihood, [[0.5, 2.0, 1.5], [0.5, -2.0, 1.5]]),
    (piecewise, [[0.5, 1.0], [0.2, 0.3], [-0.5, -1.0]]),
    (builtin_choices, [[1.0, 2.0, -3.0], [-1.0, -2.0, 3.0], [-1.0, 0.5, 0.2]]),
    (sqrt_where_excluded, [[1.0, 4.0], [-0.5, 4.0], [-1.0, 4.0]]),
    (early_exit_helper, [[0.5, 0.25], [2.0, 3.0]]),
]


def central_differences(f, x, eps):
    return np.array([(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in np.eye(x.size, dtype=x.dtype)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, points", CASES, ids=[c[0].__name__ for c in CASES])
def test_each_path_gives_numpys_value_and_its_own_gradient(fn, points, backend):
    step = mj.value_and_grad(fn, backend=backend)
    for point in points:
        x = np.array(point)
        value, grad = step(x)
        assert value == pytest.approx(fn(x.copy()), rel=1e-12)
        expected = central_differences(fn, x, 1e-6)
        finite = np.isfinite(expected)
        np.testing.assert_allclose(grad[finite], expected[finite], rtol=1e-6, atol=1e-8)
        if not np.isfinite(value):
            np.testing.assert_array_equal(grad, 0.0)
        assert np.all(np.isfinite(grad)), f"{fn.__name__} at {point}: {grad}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_path_not_taken_gives_exactly_zero_even_where_its_derivative_is_nan(backend):
    grad = mj.grad(sqrt_where_excluded, backend=backend)(np.array([0.0, 4.0]))
    np.testing.assert_array_equal(grad, [0.0, 8.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_stays_float32_and_python_numbers_take_its_dtype(backend):
    value, grad = mj.value_and_grad(line_fit_prior, backend=backend)(np.array([0.1, 2.0], np.float32))
    assert value.dtype == np.float32 and grad.dtype == np.float32
    assert value == pytest.approx(line_fit_prior(np.array([0.1, 2.0], np.float32)), rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_path_that_raises_a_value_error_raises_it_where_it_is_taken(backend):
    def loss(x):
        if np.any(x <= 0):
            raise ValueError("x must be positive")
        return np.sum(np.log(x))
    step = mj.value_and_grad(loss, backend=backend)
    value, grad = step(np.array([1.0, 2.0]))
    assert value == pytest.approx(np.log(2.0)) and grad == pytest.approx([1.0, 0.5])
    with pytest.raises(ValueError, match="x must be positive") as info:
        step(np.array([1.0, -2.0]))
    assert "raise ValueError" in str(info.value)


def test_a_function_that_raises_on_every_path_raises_while_traced():
    def loss(x):
        if np.sum(x) > 0:
            raise ValueError("positive")
        raise ValueError("negative")
    with pytest.raises(ValueError, match="positive"):
        mj.value_and_grad(loss)(np.ones(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_functions_and_aux_merge_every_leaf(backend):
    def forward(x):
        if x[0] > 0:
            return {"y": x * 2, "n": np.sum(x)}
        return {"y": x * 3, "n": 0.0}
    compiled = mj.compile(forward, backend=backend)
    for point in ([1.0, 2.0], [-1.0, 2.0]):
        x = np.array(point)
        got, want = compiled(x), forward(x)
        np.testing.assert_allclose(got["y"], want["y"])
        assert got["n"] == pytest.approx(want["n"])

    def with_aux(x):
        loss = np.sum(x ** 2)
        return (loss, loss > 1) if loss < 10 else (10.0 + 0 * loss, np.bool_(True))
    (value, big), grad = mj.value_and_grad(with_aux, has_aux=True, backend=backend)(np.array([1.0, 0.5]))
    assert value == pytest.approx(1.25) and bool(big) and grad == pytest.approx([2.0, 1.0])


def test_every_path_draws_the_same_numbers_from_a_generator_argument():
    def branched(x, rng):
        z = rng.normal(size=3)
        if np.sum(x) > 0:
            return np.sum(z * x)
        return np.sum(z)

    def plain(x, rng):
        return np.sum(rng.normal(size=3) * x)
    x = np.array([1.0, 2.0, 3.0])
    got = mj.compile(branched)(x, np.random.default_rng(5))
    assert got == pytest.approx(mj.compile(plain)(x, np.random.default_rng(5)), rel=1e-12)


def test_a_program_without_tests_has_no_gates_and_one_with_tests_gates_its_inputs():
    plain = mj.trace(lambda x: np.sum(x ** 2), np.ones(3))
    assert "branch_gate" not in str(plain)
    branched = mj.trace(piecewise, np.ones(3))
    assert str(branched).count("branch_gate") == 3   # one input, three paths


def test_a_test_met_on_one_run_of_a_path_but_not_on_another_is_refused():
    calls = []

    def unsteady(x):
        calls.append(1)
        if len(calls) in (1, 3) and np.sum(x) > 0:
            return np.sum(x)
        return np.sum(x) * 2
    with pytest.raises(mj.TracingError, match="one run but not on another"):
        mj.trace(unsteady, np.ones(2))


def test_branch_points_are_bounded_and_the_refusal_names_the_line():
    def bisect(x):
        lo, hi = 0.0, 4.0
        for _ in range(12):
            mid = (lo + hi) / 2
            if np.sum(x) > mid:
                lo = mid + 0 * x[0]
            else:
                hi = mid + 0 * x[0]
        return lo
    with pytest.raises(mj.UnsupportedError, match="beyond the 8") as info:
        mj.grad(bisect)(np.ones(2))
    assert "if np.sum(x) > mid" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Random programs with tests: NumPy's value and finite differences of the same code

UNARY = {
    "tanh": np.tanh, "square": np.square, "softplus": lambda v: np.log1p(np.exp(v)),
    "sin": np.sin, "scaled": lambda v: 0.5 * v - 1.0, "sqrtabs": lambda v: np.sqrt(v * v + 1.0),
}
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "first": lambda v: v[0]}

step = st.tuples(st.sampled_from(sorted(UNARY)), st.sampled_from(sorted(UNARY)),
                 st.sampled_from(sorted(REDUCE)), st.floats(-1.5, 1.5), st.booleans())


def random_program(steps):
    """Each step: ``if reduce(x) > c`` (or ``<``), x = f(x) else x = g(x); then the loss."""
    def loss(x, thresholds=None):
        for f, g, reduce, c, greater in steps:
            tested = REDUCE[reduce](x)
            if thresholds is not None:
                thresholds.append(float(tested) - c)
            if (tested > c) if greater else (tested < c):
                x = UNARY[f](x)
            else:
                x = UNARY[g](x)
        return np.sum(x * x)
    return loss


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=3),
       x=st.lists(st.floats(-2.0, 2.0), min_size=2, max_size=2).map(np.array))
def test_random_programs_with_tests_agree_with_numpy(steps, x):
    loss = random_program(steps)
    margins = []
    loss(x.copy(), margins)
    assume(all(abs(m) > 1e-3 for m in margins))   # finite differences stay on one path
    value, grad = mj.value_and_grad(lambda v: loss(v), backend="interp")(x)
    assert value == pytest.approx(loss(x.copy()), rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(grad, central_differences(loss, x, 1e-7), rtol=1e-4, atol=1e-6)
