"""NaN and inf in the data reach the loss and the gradients, on both backends, as in NumPy.

The compiled step is built with fast-math flags that let LLVM vectorise reductions; none of them
may license a fold that drops a NaN or an inf (``x - x -> 0``, ``(x + y) - y -> x``,
``x * 0 -> 0``). Algebraic identities are checked one by one, and every op of the op table is
run on arguments with NaN and inf sprinkled in (driven by the cases of tests/ops/test_ops.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sp

import morphjit as mj
from morphjit.api.custom import is_user_op
from morphjit.ir import LINALG, OPS

from support import limits
import test_ops

BACKENDS = ["numba", "interp"]
NONFINITE = [np.nan, np.inf, -np.inf]

# Identities that hold for finite numbers and not for NaN or inf: f(x, y) written with mj and np.
IDENTITIES = {
    "x - x": lambda m, x, y: x - x,
    "x + -x": lambda m, x, y: x + -x,
    "(x + y) - y": lambda m, x, y: (x + y) - y,
    "(y + x) - y": lambda m, x, y: (y + x) - y,
    "x * 0": lambda m, x, y: x * 0.0,
    "0 * log(x)": lambda m, x, y: 0.0 * m.log(m.abs(x)),
    "x / x": lambda m, x, y: x / x,
    "y * x / x": lambda m, x, y: y * x / x,
    "max(x, x) - x": lambda m, x, y: m.maximum(x, x) - x,
    "min(x, y) - min(x, y)": lambda m, x, y: m.minimum(x, y) - m.minimum(x, y),
    "sum(x - x)": lambda m, x, y: m.sum(x - x) + y,
    "sum(x) - sum(x)": lambda m, x, y: m.sum(x) - m.sum(x) + y,
    "mean(x) * 0": lambda m, x, y: m.mean(x, axis=-1, keepdims=True) * 0.0 + y,
    "exp(x - x)": lambda m, x, y: m.exp(x - x),
    "sqrt(x*x) - abs(x)": lambda m, x, y: m.sqrt(x * x) - m.abs(x),
}


def identity_loss(f):
    """Loss of parameter ``w`` and data ``x, y``: the identity's value weighted by ``w`` (so its
    gradient with respect to ``w`` is the identity's value, element by element), plus a sum."""
    return lambda w, x, y: mj.sum(w * f(mj, x, y)) + mj.sum(y)


def with_nonfinite(rng, shape, value, count=3):
    x = rng.normal(size=shape)
    x.flat[rng.choice(x.size, size=count, replace=False)] = value
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", list(IDENTITIES))
@pytest.mark.parametrize("where", ["x", "y"])
def test_identities_keep_nan_and_inf(name, value, backend, where):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 16)), rng.normal(size=(64, 16))
    (x if where == "x" else y).flat[[3, 70, 500]] = value
    f = IDENTITIES[name]
    with np.errstate(all="ignore"):
        expected = f(np, x, y) * np.ones((64, 16))
        expected_loss = np.sum(expected) + np.sum(y)
    loss, grad = mj.compile_loss(identity_loss(f), backend=backend)(np.ones((64, 16)), x, y)
    np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-12)


def test_a_cancelled_difference_does_not_hide_a_nan_in_a_reduction():
    """The issue's case: ``sum(z - z) + sum(w)`` with a NaN in ``z``."""
    z, w = np.arange(8.0), np.ones(8)
    z[3] = np.nan
    for backend in BACKENDS:
        loss, grad = mj.compile_loss(lambda p, z, w: mj.sum(z - z) + mj.sum(w * p), backend=backend)(w, z, w)
        assert np.isnan(loss), backend
        np.testing.assert_array_equal(grad, w)


# ---------------------------------------------------------------------------------------------
# Every op of the op table, with NaN and inf in its float arguments

def first_case_of_each_op():
    """One case of tests/ops/test_ops.py per op; its float arguments are the ones NaN and inf go in."""
    cases = {}
    for case in test_ops.CASES:
        cases.setdefault(case.op, case)
    library_ops = {name for name in OPS if not is_user_op(name)}   # not those a test's custom_vjp adds
    assert set(cases) == library_ops, f"ops without a case: {library_ops - set(cases)}"
    return list(cases.values())


def sprinkle(rng, a):
    """``a`` with about a third of its elements replaced by NaN, inf or -inf (floats only)."""
    a = np.array(a)
    if a.dtype.kind != "f" or a.size == 0:
        return a
    hit = rng.random(a.shape) < 0.34
    return np.where(hit, rng.choice(NONFINITE, size=a.shape), a).astype(a.dtype)


def nonfinite_args(case, seed=0):
    args, kw = test_ops._args(case, np.float64, seed)
    rng = np.random.default_rng(seed)
    return tuple(sprinkle(rng, a) for a in args), kw


def elementwise_nan_cases():
    """The ops whose NaN pattern is NumPy's element by element. A factorisation or solve spreads a
    NaN where its LAPACK implementation does (NumPy's, SciPy's and numba's differ); that NaN input
    gives NaN output and reaches the loss is tested in test_linalg.py."""
    return [c for c in first_case_of_each_op() if OPS[c.op].kind != LINALG]


@pytest.mark.parametrize("case", elementwise_nan_cases(), ids=lambda c: c.op)
def test_every_op_propagates_nan_and_inf_like_numpy(case):
    """Both backends compute the op's value on NaN/inf inputs as NumPy does: the op's result is
    the gradient of ``sum(w * op(*args))`` with respect to ``w``."""
    args, kw = nonfinite_args(case)
    with np.errstate(all="ignore"):
        expected = np.asarray(case.ref(*args, **kw))
    if expected.dtype.kind != "f":  # comparisons and logic on NaN: their truth values as floats
        expected = expected.astype(np.float64)
    loss_fn = lambda w, *data: mj.sum(w * mj.astype(case.fn(*data, **kw), w.dtype))
    w = np.ones(expected.shape, expected.dtype)
    for backend in BACKENDS:
        step = mj.compile_loss(loss_fn, backend=backend, static_shapes=True)
        loss, grad = step(w, *args)
        test_ops.assert_like_numpy(grad, expected, rtol=1e-12, scale=test_ops.magnitude(*args))
        with np.errstate(all="ignore"):
            np.testing.assert_allclose(loss, np.sum(expected), rtol=1e-12)


# The operands whose gradient an op refuses (an order or a shape; see
# tests/api/test_scipy_special_kernels.py): not differentiated here.
NO_DERIVATIVE = {"gammainc": (0,), "gammaincc": (0,), "iv": (0,), "kv": (0,), "betainc": (0, 1), "betaincc": (0, 1),
                 "stdtr": (0,)}


def float_args(case) -> list[int]:
    return [k for k, a in enumerate(test_ops._args(case, np.float64, 0)[0])
            if np.asarray(a).dtype.kind == "f" and k not in NO_DERIVATIVE.get(case.op, ())]


@pytest.mark.parametrize("case", [c for c in elementwise_nan_cases() if float_args(c)], ids=lambda c: c.op)
def test_every_op_has_the_same_nonfinite_gradients_on_both_backends(case):
    args, kw = nonfinite_args(case, seed=1)
    argnums = tuple(float_args(case))

    def loss_fn(*a):
        out = case.fn(*a, **kw)
        return mj.sum(out) if out.dtype.kind == "f" else mj.sum(a[argnums[0]])

    grads = [mj.compile_loss(loss_fn, argnums=argnums, backend=b, static_shapes=True)(*args)
             for b in BACKENDS]
    (value, grad), (ref_value, ref_grad) = grads
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    for g, r in zip(grad, ref_grad):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Gradients at singular points: one answer on both backends (NaN, as in JAX and PyTorch)

STD_AT_ZERO_SPREAD = {
    "constant vector": (lambda w: mj.std(w), np.full(8, 2.5)),
    "constant rows": (lambda w: mj.sum(mj.std(w, axis=-1, keepdims=True)), np.full((4, 8), -1.0)),
    "constant columns": (lambda w: mj.sum(np.std(w, axis=0, ddof=1)), np.full((4, 2), 3.0)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(STD_AT_ZERO_SPREAD))
def test_std_gradient_at_zero_spread_is_nan(name, backend):
    """d std / dx = (x - mean) / (n std) is 0 / 0 where the values along the axis (more than one)
    are all equal: std is not differentiable there."""
    fn, w = STD_AT_ZERO_SPREAD[name]
    loss, grad = mj.compile_loss(fn, backend=backend)(w)
    assert loss == 0.0
    assert np.isnan(grad).all(), grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_std_at_zero_spread_turns_a_trained_parameter_into_nan(backend):
    step = mj.train_step(lambda p: mj.std(p["w"]), mj.optim.adam(0.1), backend=backend)
    params = {"w": np.full(8, 2.5)}
    step(params, step.init(params))
    assert np.isnan(params["w"]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_std_gradient_matches_finite_differences_where_defined(backend):
    from support.gradcheck import check_loss_grads_fd
    rng = np.random.default_rng(3)
    w = rng.normal(size=(5, 7))
    fn = lambda w: mj.sum(mj.std(w, axis=1) * np.arange(1.0, 6.0)) + mj.std(w)
    _, grad = mj.compile_loss(fn, backend=backend)(w)
    check_loss_grads_fd(lambda xs: fn(xs[0]), [w], [grad], rng=rng)


STD_OF_ONE_ELEMENT = {   # (the call on x, NumPy's or autograd's module, or None for the method), x's shape
    "axis=1": (lambda ns, x: ns.std(x, axis=1), (4, 1)),
    "keepdims": (lambda ns, x: ns.std(x, axis=-1, keepdims=True), (4, 1)),
    "axis tuple": (lambda ns, x: ns.std(x, axis=(0, 1)), (1, 1, 3)),
    "all of a (1,)": (lambda ns, x: ns.std(x), (1,)),
    "0-d": (lambda ns, x: ns.std(x), ()),
    "batch of one": (lambda ns, x: ns.std(x, axis=0), (1, 3)),
    "ddof=-1": (lambda ns, x: ns.std(x, axis=1, ddof=-1), (4, 1)),
    "method": (lambda ns, x: x.std(axis=1), (4, 1)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(STD_OF_ONE_ELEMENT))
def test_std_over_one_element_is_zero_and_so_is_its_gradient(name, backend):
    """The standard deviation of one element is 0 whatever it is: its gradient is 0 (autograd's),
    and its value NumPy's (NaN where the element is not finite)."""
    import autograd
    import autograd.numpy as anp

    call, shape = STD_OF_ONE_ELEMENT[name]
    x = np.random.default_rng(5).normal(size=shape)
    for ns in (np, mj):
        loss = mj.compile_loss(lambda x: ns.sum(call(ns, x) * 1.5), backend=backend)
        value, grad = loss(x)
        assert value == 0.0
        np.testing.assert_array_equal(grad, autograd.grad(lambda x: anp.sum(call(anp, x) * 1.5))(x))
        assert not grad.any()
    if x.size:
        bad = np.full(shape, np.inf)
        with np.errstate(invalid="ignore"):
            assert np.isnan(mj.compile_loss(lambda x: np.sum(call(np, x)), backend=backend)(bad)[0])
            assert np.isnan(np.sum(call(np, bad)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_std_of_one_element_without_a_degree_of_freedom_is_nan(backend):
    """ddof=1 over one element: NumPy's NaN (0 / 0), a NaN gradient."""
    value, grad = mj.compile_loss(lambda x: np.sum(np.std(x, axis=1, ddof=1)), backend=backend)(np.ones((3, 1)))
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        assert np.isnan(np.std(np.ones((3, 1)), axis=1, ddof=1)).all()
    assert np.isnan(value) and np.isnan(grad).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_std_over_a_length_1_axis_leaves_a_trained_parameter_as_it_is(backend):
    step = mj.train_step(lambda p: mj.sum(mj.std(p["w"], axis=1)) + mj.sum(p["w"] * 0.5), mj.optim.sgd(0.1),
                         backend=backend)
    params = {"w": np.arange(3.0).reshape(3, 1)}
    step(params, step.init(params))
    np.testing.assert_array_equal(params["w"], np.arange(3.0).reshape(3, 1) - 0.05)


# ---------------------------------------------------------------------------------------------
# At +-inf and at the ends of their domains, SciPy's special functions and NumPy's ufuncs with a
# limit there have the gradients that are the limits of their derivatives (tests/support/limits.py), as
# JAX gives them: 0 where the function is flat at an infinity, not 0 * inf = NaN.

INF = np.inf
BOTH_INFINITIES = [(-INF, 0), (INF, 0)]
UNARY_EDGES = {  # (point, approach): +1 from above, -1 from below, 0 for an infinity
    sp.expit: BOTH_INFINITIES, sp.log_expit: BOTH_INFINITIES, sp.softplus: BOTH_INFINITIES, sp.erf: BOTH_INFINITIES,
    sp.erfc: BOTH_INFINITIES, sp.ndtr: BOTH_INFINITIES, sp.log_ndtr: BOTH_INFINITIES,
    sp.logit: [(0.0, 1), (1.0, -1)], sp.erfinv: [(-1.0, 1), (1.0, -1)],
    sp.gammaln: [(0.0, 1), (-0.0, -1), (INF, 0)], sp.digamma: [(0.0, 1), (-0.0, -1), (INF, 0)], sp.psi: [(INF, 0)],
    sp.entr: [(0.0, 1), (INF, 0), (-1.0, 0)],
    np.exp: [(-INF, 0)], np.expm1: [(-INF, 0)], np.exp2: [(-INF, 0)], np.tanh: BOTH_INFINITIES,
    np.arctan: BOTH_INFINITIES, np.arcsinh: BOTH_INFINITIES, np.sqrt: [(0.0, 1), (INF, 0)],
    np.log: [(0.0, 1), (INF, 0)], np.log2: [(0.0, 1), (INF, 0)], np.log10: [(0.0, 1), (INF, 0)],
    np.log1p: [(-1.0, 1), (INF, 0)], np.cbrt: [(0.0, 1), (-0.0, -1)] + BOTH_INFINITIES,
    np.arcsin: [(-1.0, 1), (1.0, -1)], np.arccos: [(-1.0, 1), (1.0, -1)], np.arctanh: [(-1.0, 1), (1.0, -1)],
    np.arccosh: [(1.0, 1), (INF, 0)], np.reciprocal: [(0.0, 1), (-0.0, -1)] + BOTH_INFINITIES,
}
BINARY_EDGES = {  # ((x, y), (approach of x, of y))
    np.logaddexp: [((a, b), (0, 0)) for a, b in [(-INF, 1.0), (1.0, -INF), (INF, 1.0), (1.0, INF), (INF, -INF), (-INF, INF)]],
    np.logaddexp2: [((a, b), (0, 0)) for a, b in [(-INF, 1.0), (1.0, -INF), (INF, 1.0), (1.0, INF), (INF, -INF)]],
    np.hypot: [((a, b), (0, 0)) for a, b in [(INF, 1.0), (-INF, 1.0), (2.0, INF), (2.0, -INF)]],
    np.arctan2: [((a, b), (0, 0)) for a, b in [(INF, 1.0), (-INF, 1.0), (1.0, INF), (1.0, -INF), (-1.0, -INF)]],
    sp.xlogy: [((0.0, 2.0), (0, 0)), ((0.0, 2.0), (1, 0)), ((1.0, 0.0), (0, 1)), ((0.0, 0.0), (0, 1))],
    sp.xlog1py: [((0.0, 1.0), (0, 0)), ((1.0, -1.0), (0, 1)), ((0.0, -1.0), (0, 1))],
}
GROUPS = {np.logaddexp: (0, 0), np.logaddexp2: (0, 0), np.hypot: (0, 0)}   # steps that follow the larger operand


def _scipy_special_functions():
    from morphjit.api.core import UFUNCS
    return {f for f in UFUNCS if getattr(sp, f.__name__, None) is f} | {sp.softplus}


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_functions_and_ufuncs_at_infinity_and_the_ends_of_their_domains(backend):
    missing = _scipy_special_functions() - set(UNARY_EDGES) - set(BINARY_EDGES)
    assert not missing, f"SciPy functions without edges here: {sorted(f.__name__ for f in missing)}"
    cases = [(f, limits.edge((p,), (a,))) for f, edges in UNARY_EDGES.items() for p, a in edges]
    cases += [(f, limits.edge(p, a, groups=GROUPS.get(f))) for f, edges in BINARY_EDGES.items() for p, a in edges]
    arguments = [[np.array(p) for p in e.point] for _, e in cases]

    def loss(arguments):
        values = [f(*args) for (f, _), args in zip(cases, arguments)]
        return sum(np.sum(v) for v in values), values

    (_, values), grads = mj.compile_loss(loss, has_aux=True, backend=backend)(arguments)
    failures = []
    for (f, e), value, grad in zip(cases, values, grads):
        with np.errstate(all="ignore"):
            expected = f(*e.point)
        if not np.allclose(value, expected, rtol=1e-12, atol=0, equal_nan=True):
            failures.append(f"{f.__name__}{e.point}: value {value!r}, the reference's {expected!r}")
        misses = limits.gradient_misses_limits(grad, limits.derivative_limits(f, e))
        failures += [f"{f.__name__}{e.point} from {e.approach}: {m}" for m in misses]
    assert not failures, "\n".join(failures)


def test_the_edges_in_float32_have_the_float64_gradients():
    cases = [(f, (p,)) for f, edges in UNARY_EDGES.items() for p, _ in edges]
    cases += [(f, p) for f, edges in BINARY_EDGES.items() for p, _ in edges]

    def loss(arguments):
        return sum(np.sum(f(*args)) for (f, _), args in zip(cases, arguments))

    grads = {dtype: mj.compile_loss(loss, backend="interp")([[np.array(v, dtype) for v in p] for _, p in cases])[1]
             for dtype in (np.float32, np.float64)}
    for (f, p), g32, g64 in zip(cases, grads[np.float32], grads[np.float64]):
        for a, b in zip(g32, g64):
            assert a.dtype == np.float32
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"{f.__name__}{p}")
