"""Linear algebra end to end: the compiled (numba) step against the reference executor, batched
and in both float dtypes; batched gradients against finite differences; the errors NumPy raises.

Each op's value and gradient against NumPy, SciPy and autograd are in test_ops.py and
test_grad.py; here one program uses every function, so numba compiles few steps.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg as sl

import morphjit as mj
from morphjit.api import linalg as la
from morphjit.ir import LINALG, OPS

from support.gradcheck import check_loss_grads_fd
from support.paths import ROOT



def spd(x):
    """An SPD matrix (stack) from a free one: perturbing ``x`` keeps it SPD."""
    n = x.shape[-1]
    return x @ np.swapaxes(x, -1, -2) / n + np.eye(n, dtype=x.dtype)


def read_from_lower(g):
    """The gradient of a function of a symmetric matrix ``g`` (its own gradient, symmetric) as a
    function of the lower triangle the matrix is read from, as cholesky reads it."""
    return np.tril(g + g.T, -1) + np.diag(np.diag(g))


def everything(x, y):
    """Every linear-algebra function, batched over x's leading axis; y broadcasts."""
    k = spd(x)
    L = np.linalg.cholesky(k)
    alpha = la.cho_solve((L, True), y)
    upper = la.cho_solve(la.cho_factor(k), y)
    tri = la.solve_triangular(L, y, lower=True, trans="T")
    log_diagonal = np.log(np.diagonal(np.linalg.cholesky(k), axis1=-2, axis2=-1))   # read on its diagonal only
    w, v = np.linalg.eigh(k)
    well = x + 2.0 * np.eye(x.shape[-1], dtype=x.dtype)
    q, r = np.linalg.qr(well)
    fitted, residuals, _, singular = la.lstsq(well[:, :, :3], y)    # NumPy does not batch lstsq
    terms = [np.sum(y * alpha), np.sum(upper * tri), np.linalg.slogdet(k)[1].sum() + np.linalg.slogdet(well)[1].sum(), np.linalg.det(k).sum(),
             np.sum(np.linalg.solve(k, y) ** 2), np.sum(np.linalg.inv(k) * x), np.sum(w * w),
             np.sum(v ** 2 * x), np.sum(q ** 2 * x), np.sum(r ** 2), np.sum(np.linalg.eigvalsh(k)),
             np.sum(fitted ** 2) + np.sum(residuals) + np.sum(singular), np.sum(np.linalg.pinv(well) * x),
             np.sum(log_diagonal * y[:, 0]), np.sum(la.triangular_inverse(well) * x), _svd_terms(well[:, :, :3], x)]
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _svd_terms(tall, x):
    """Terms free of the singular vectors' signs, of a full SVD (U's extra column unused) and of
    the matrix norms from singular values."""
    u, s, vh = np.linalg.svd(tall)
    return (np.sum(vh ** 2 * x[:, :3, :3]) + np.sum(u[:, :, :3] ** 2 * x[:, :, :3]) + np.sum(s * s)
            + np.sum(np.linalg.norm(tall, "nuc", axis=(-2, -1))) + np.sum(np.linalg.svdvals(tall)[:, -1]))


def inputs(dtype, batch=3, n=4, rhs=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, n, n)).astype(dtype), rng.standard_normal((n, rhs)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_compiled_step_matches_the_reference_executor(dtype):
    x, y = inputs(dtype)
    compiled = mj.compile_loss(everything, argnums=(0, 1))
    reference = mj.compile_loss(everything, argnums=(0, 1), backend="interp")
    (value, grads), (ref_value, ref_grads) = compiled(x, y), reference(x, y)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    assert value.dtype == dtype and all(g.dtype == dtype for g in grads)
    np.testing.assert_allclose(value, ref_value, rtol=rtol)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * np.abs(r).max())
    assert "lapack" in str(compiled.explain(x, y))
    used = {b.op for b in compiled.program(x, y).bindings}
    assert {name for name, op in OPS.items() if op.kind == LINALG} <= used, "a linear-algebra op is not exercised"


def batch_of_systems(log_noise, ks, ys):
    k = ks + np.exp(log_noise) * np.eye(ks.shape[-1])
    alpha = la.cho_solve((np.linalg.cholesky(k), True), ys[..., None])
    return np.sum(alpha) + np.sum(np.linalg.slogdet(k)[1])


def test_one_compiled_step_serves_every_batch_of_matrices():
    compiled = mj.compile_loss(batch_of_systems)
    reference = mj.compile_loss(batch_of_systems, backend="interp")
    rng = np.random.default_rng(4)
    for batch in (3, 5):
        x = rng.standard_normal((batch, 4, 4))
        args = (np.array(0.1), x @ np.swapaxes(x, 1, 2), rng.standard_normal((batch, 4)))
        (value, grad), (ref_value, ref_grad) = compiled(*args), reference(*args)
        np.testing.assert_allclose(value, ref_value, rtol=1e-10)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-10)
    assert compiled.cache_info().misses == 1


FRESH_PROCESS = """
import numpy as np, morphjit as mj
from morphjit import linalg as la

def loss(log_noise, k, y):
    L = np.linalg.cholesky(k + np.exp(log_noise) * np.eye(3))
    return np.sum(la.cho_solve((L, True), y)) + np.linalg.slogdet(k)[1]

step = mj.compile_loss(loss)
value, grad = step(np.array(0.5), np.diag([1.0, 2.0, 3.0]), np.ones(3))
print(repr(float(value)), repr(float(grad)), step.cache_info().disk_loads)
"""


@pytest.mark.slow
def test_a_step_calling_lapack_loads_from_the_disk_cache_in_a_fresh_process(tmp_path):
    """The kernels' BLAS/LAPACK routines are symbols registered at import, so machine code that
    calls them loads from disk in another process."""
    env = dict(os.environ, MORPHJIT_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    runs = [subprocess.run([sys.executable, "-c", FRESH_PROCESS], env=env, capture_output=True, text=True,
                           timeout=600) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    (value, grad, first_loads), (value2, grad2, second_loads) = (r.stdout.split() for r in runs)
    assert (first_loads, second_loads) == ("0", "1")
    assert (value, grad) == (value2, grad2)
    noise = np.exp(0.5)
    assert float(value) == pytest.approx(sum(1 / (d + noise) for d in (1, 2, 3)) + np.log(6.0))


def test_batched_gradients_agree_with_finite_differences():
    x, y = inputs(np.float64, batch=2, n=3, seed=1)
    _, grads = mj.compile_loss(everything, argnums=(0, 1), backend="interp")(x, y)
    check_loss_grads_fd(lambda xs: everything(*xs), [x, y], list(grads), rng=np.random.default_rng(2))


@pytest.mark.parametrize("condition", [1e1, 1e4, 1e8])
def test_cholesky_gradients_hold_over_a_spread_of_condition_numbers(condition):
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    k = (q * np.geomspace(1.0, 1.0 / condition, 5)) @ q.T
    y = rng.standard_normal(5)

    def nll(k, y):
        L = np.linalg.cholesky(k)
        return 0.5 * np.sum(y * la.cho_solve((L, True), y)) + np.linalg.slogdet(k)[1]

    _, (gk, gy) = mj.compile_loss(nll, argnums=(0, 1), backend="interp")(k, y)
    kinv = np.linalg.inv(k)
    alpha = kinv @ y
    # cho_solve reads the lower triangle; slogdet all of k (its gradient: NumPy's, inv(k).T)
    np.testing.assert_allclose(gk, read_from_lower(-0.5 * np.outer(alpha, alpha)) + kinv.T, rtol=1e-7 * condition,
                               atol=1e-9)
    np.testing.assert_allclose(gy, alpha, rtol=1e-7 * condition)


def gp_nll(k, y):
    """A GP's negative log likelihood as users write it: the factor is read by ``cho_solve`` and on
    its diagonal only, so the gradient goes through ``k^-1`` and never back through ``L``."""
    L = np.linalg.cholesky(k)
    return 0.5 * np.sum(y * la.cho_solve((L, True), y)) + np.sum(np.log(np.diagonal(L, axis1=-2, axis2=-1)))


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_gradients_through_the_inverse_hold_over_a_spread_of_condition_numbers(backend):
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    y = rng.standard_normal(5)
    step = mj.compile_loss(gp_nll, argnums=(0, 1), backend=backend)
    for condition in (1e1, 1e4, 1e8):
        k = (q * np.geomspace(1.0, 1.0 / condition, 5)) @ q.T
        _, (gk, gy) = step(k, y)
        kinv = np.linalg.inv(k)
        alpha = kinv @ y
        np.testing.assert_allclose(gk, read_from_lower(0.5 * (kinv - np.outer(alpha, alpha))), rtol=1e-7 * condition,
                                   atol=1e-9)
        np.testing.assert_allclose(gy, alpha, rtol=1e-7 * condition)


def test_the_gradient_of_a_factored_solve_and_log_determinant_does_not_go_back_through_the_factor():
    program = mj.compile_loss(gp_nll, argnums=(0, 1)).program(spd(np.eye(4)), np.ones(4))
    ops = [b.op for b in program.bindings]
    assert ops.count("cho_solve") == 2 and "solve_triangular" not in ops   # Murray's rule: two solves
    assert ops.count("triangular_inverse") == 1 and ops.count("weighted_gram") == 1 and "triangular_matmul" not in ops


def test_cho_solve_on_a_factor_the_trace_did_not_make_is_two_triangular_solves():
    program = mj.trace(lambda L, b: np.sum(la.cho_solve((L, True), b)), np.eye(3), np.ones(3))
    assert [b.op for b in program.bindings].count("solve_triangular") == 2


def test_eigh_gradients_stay_finite_for_repeated_eigenvalues():
    def loss(a):
        w, v = np.linalg.eigh(a)
        return np.sum(w ** 2) + np.sum(v ** 2 * a)

    _, g = mj.compile_loss(loss, backend="interp")(np.eye(3))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(np.diag(g), 2.0 + 1.0)   # d sum(w^2) = 2 I; v = I reads the diagonal


def test_slogdet_of_a_factored_matrix_is_given_the_factor():
    def loss(k):
        L = np.linalg.cholesky(k)
        sign, logabsdet = np.linalg.slogdet(k)
        return np.sum(L) + np.sum(sign * logabsdet)

    ops = [b.op for b in mj.compile_loss(loss).program(spd(np.ones((2, 3, 3)))).bindings]
    assert "slogdet" not in ops and "inv" not in ops and ops.count("cholesky") == 1
    assert ops.count("factored_slogdet") == 1 and ops.count("factored_inv") == 1


def test_slogdet_of_a_factored_matrix_has_numpys_sign_for_nan_input():
    def signs(k):
        np.linalg.cholesky(k)
        return np.sum(np.linalg.slogdet(k)[0])

    k = np.stack([spd(np.ones((3, 3))), np.full((3, 3), np.nan)])
    value, _ = mj.compile_loss(signs, backend="interp")(k)
    assert value == np.sum(np.linalg.slogdet(k)[0]) == 2.0


def test_numpy_linalg_calls_on_traced_arrays_are_the_same_ops():
    program = mj.trace(lambda a: np.linalg.slogdet(a)[1] + np.linalg.det(a), np.eye(2))
    assert {"slogdet", "det"} <= {b.op for b in program.bindings}


def failing(k, y):
    return np.sum(np.linalg.solve(k, y)) + np.sum(la.cho_solve((np.linalg.cholesky(k), True), y))


@pytest.mark.parametrize("backend", ["numba", "interp"])
@pytest.mark.parametrize("bad", ["indefinite", "singular"])
def test_failures_raise_linalgerror_as_numpy_does(backend, bad):
    k = {"indefinite": np.diag([1.0, -1.0]), "singular": np.zeros((2, 2))}[bad]
    y = np.ones(2)
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(k)
    step = mj.compile_loss(failing, argnums=(0, 1), backend=backend)
    with pytest.raises(np.linalg.LinAlgError):
        step(k, y)
    value, _ = step(np.eye(2), y)   # the step still works after a failure
    assert value == pytest.approx(4.0)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_nan_flows_through_to_the_loss_as_in_numpy(backend):
    k = np.array([[np.nan, 0.0], [0.0, 1.0]])
    assert np.isnan(np.linalg.cholesky(k)).any()   # NumPy (and LAPACK) do not raise on NaN
    value, grads = mj.compile_loss(failing, argnums=(0, 1), backend=backend)(k, np.ones(2))
    assert np.isnan(value)


def test_a_singular_triangular_system_raises():
    step = mj.compile_loss(lambda a, b: np.sum(la.solve_triangular(a, b, lower=True)), argnums=(1,))
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        step(np.tril(np.ones((3, 3))) - np.eye(3), np.ones(3))


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_inverting_a_singular_triangular_matrix_raises(backend):
    step = mj.compile_loss(lambda a: np.sum(la.triangular_inverse(a, lower=True)), backend=backend)
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        step(np.tril(np.ones((3, 3))) - np.eye(3))


def test_a_scipy_linalg_function_without_a_twin_points_to_mj_linalg():
    import scipy.linalg

    with pytest.raises(mj.UnsupportedError, match=r"scipy.linalg.eigh .* call mj.linalg.eigh"):
        mj.trace(lambda a: np.sum(scipy.linalg.eigh(a)[0]), np.eye(2))


def test_shape_errors_name_the_problem():
    with pytest.raises(mj.ShapeError, match="square matrices"):
        mj.trace(lambda a: np.linalg.cholesky(a), np.ones((2, 3)))
    with pytest.raises(mj.ShapeError, match="do not fit"):
        mj.trace(lambda a, b: np.linalg.solve(a, b), np.eye(3), np.ones(2))


def test_cholesky_takes_scipys_lower_and_refuses_a_contradiction():
    k = spd(np.arange(9.0).reshape(3, 3))
    np.testing.assert_allclose(la.cholesky(k, lower=False), np.linalg.cholesky(k).T)
    with pytest.raises(ValueError, match="contradict"):
        la.cholesky(k, upper=True, lower=True)


# ---------------------------------------------------------------------------------------------
# Functions that read one triangle of a matrix: on a matrix that is not symmetric, NumPy's and
# SciPy's values, and the gradient of what they read (the other triangle gets none), against
# central differences in random directions that are not symmetric either.

TRIANGLE_READERS = {  # name: (the triangle read, mj function of (a, b), NumPy/SciPy reference)
    "np.linalg.cholesky": ("L", lambda a, b: np.linalg.cholesky(a), lambda a, b: np.linalg.cholesky(a)),
    "np.linalg.cholesky(upper=True)": ("U", lambda a, b: np.linalg.cholesky(a, upper=True),
                                       lambda a, b: np.linalg.cholesky(a, upper=True)),
    "cholesky(lower=True)": ("L", lambda a, b: la.cholesky(a, lower=True), lambda a, b: sl.cholesky(a, lower=True)),
    "cholesky(lower=False)": ("U", lambda a, b: la.cholesky(a, lower=False), lambda a, b: sl.cholesky(a, lower=False)),
    "eigvalsh": ("L", lambda a, b: np.linalg.eigvalsh(a), lambda a, b: np.linalg.eigvalsh(a)),
    "eigvalsh(UPLO='U')": ("U", lambda a, b: np.linalg.eigvalsh(a, UPLO="U"), lambda a, b: np.linalg.eigvalsh(a, "U")),
    "eigh": ("L", lambda a, b: _eigh_terms(np, a, "L"), lambda a, b: _eigh_terms(np, a, "L")),
    "eigh(UPLO='U')": ("U", lambda a, b: _eigh_terms(np, a, "U"), lambda a, b: _eigh_terms(np, a, "U")),
    "cho_solve(cho_factor(lower=True))": ("L", lambda a, b: la.cho_solve(la.cho_factor(a, lower=True), b),
                                          lambda a, b: sl.cho_solve(sl.cho_factor(a, lower=True), b)),
    "cho_solve(cho_factor(lower=False))": ("U", lambda a, b: la.cho_solve(la.cho_factor(a, lower=False), b),
                                           lambda a, b: sl.cho_solve(sl.cho_factor(a, lower=False), b)),
    "cho_solve((cholesky, True))": ("L", lambda a, b: la.cho_solve((np.linalg.cholesky(a), True), b),
                                    lambda a, b: sl.cho_solve((np.linalg.cholesky(a), True), b)),
    "log-determinant from the factor": ("L", lambda a, b: np.sum(np.log(np.diagonal(np.linalg.cholesky(a)))),
                                        lambda a, b: np.sum(np.log(np.diagonal(np.linalg.cholesky(a))))),
    "solve_triangular(lower=True)": ("L", lambda a, b: la.solve_triangular(a, b, lower=True),
                                     lambda a, b: sl.solve_triangular(a, b, lower=True)),
    "solve_triangular(lower=False, trans=1)": ("U", lambda a, b: la.solve_triangular(a, b, lower=False, trans=1),
                                               lambda a, b: sl.solve_triangular(a, b, lower=False, trans=1)),
    "triangular_matmul(lower=True, trans=True)": ("L", lambda a, b: la.triangular_matmul(a, b, lower=True, trans=True),
                                                  lambda a, b: np.tril(a).T @ b),
    "triangular_inverse(lower=False)": ("U", lambda a, b: la.triangular_inverse(a, lower=False),
                                        lambda a, b: np.linalg.inv(np.triu(a))),
}


def _eigh_terms(ns, a, uplo):
    """Eigenvalues and the squares of the eigenvectors (free of their signs)."""
    w, v = ns.linalg.eigh(a, UPLO=uplo)
    return ns.concatenate([w[None, :], v * v], axis=0)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_functions_reading_one_triangle_have_the_gradient_of_that_triangle(backend):
    rng = np.random.default_rng(11)
    n = 4
    a = spd(rng.standard_normal((n, n))) + 0.3 * rng.standard_normal((n, n))   # not symmetric
    b = rng.standard_normal((n, 2))
    names = list(TRIANGLE_READERS)
    weights = {name: rng.standard_normal(np.shape(TRIANGLE_READERS[name][2](a, b))) for name in names}

    def loss(matrices, b):   # each function its own copy of the matrix, and so its own gradient
        values = [TRIANGLE_READERS[name][1](m, b) for name, m in zip(names, matrices)]
        return sum(np.sum(v * weights[name]) for name, v in zip(names, values)), values

    (_, values), (grads,) = mj.compile_loss(loss, argnums=(0,), has_aux=True, backend=backend)([a] * len(names), b)
    for name, value, grad in zip(names, values, grads):
        triangle, _, reference = TRIANGLE_READERS[name]
        np.testing.assert_allclose(value, reference(a, b), rtol=1e-10, atol=1e-12, err_msg=name)
        unread = np.triu(grad, 1) if triangle == "L" else np.tril(grad, -1)
        assert not unread.any(), f"{name}: a gradient in the triangle it does not read\n{grad}"
        check_loss_grads_fd(lambda xs, name=name: np.sum(TRIANGLE_READERS[name][2](xs[0], b) * weights[name]),
                            [a], [grad], rng=rng)


def test_eigh_refuses_an_uplo_that_is_neither_triangle():
    with pytest.raises(ValueError, match="UPLO must be 'L' or 'U'"):
        mj.trace(lambda a: np.linalg.eigvalsh(a, UPLO="X"), np.eye(2))


# ---------------------------------------------------------------------------------------------
# slogdet of a matrix the function also factors is NumPy's slogdet of the whole matrix (LU reads
# all of it) and has its gradient, inv(a).T, for a matrix that is symmetric, symmetric but for
# the rounding of the GEMM that built it, or not symmetric; the factor serves only the first two.

def _signed_logdet_after(factor, a):
    """``sign * logabsdet`` of ``a`` once ``factor``, a Cholesky factor of it, is made."""
    sign, logabsdet = np.linalg.slogdet(a)
    return sign * logabsdet


def _gp_terms(ns, a, y):
    alpha = ns.cho_solve((np.linalg.cholesky(a), True), y[..., None])
    return 0.5 * np.sum(y[..., None] * alpha, axis=(-2, -1)) + np.linalg.slogdet(a)[1]


FACTORED_LOG_DETERMINANTS = {   # name: fn(ns, a, y), ns being mj.linalg or scipy.linalg
    "np.linalg.cholesky": lambda ns, a, y: _signed_logdet_after(np.linalg.cholesky(a), a),
    "np.linalg.cholesky(upper=True)": lambda ns, a, y: _signed_logdet_after(np.linalg.cholesky(a, upper=True), a),
    "cho_factor (upper)": lambda ns, a, y: _signed_logdet_after(ns.cho_factor(a), a),
    "cho_solve and slogdet": _gp_terms,
}


def _per_matrix(fn, a, y):
    """NumPy and SciPy running ``fn`` on each matrix of the stack (SciPy's functions do not batch)."""
    return np.stack([fn(sl, a_i, y_i) for a_i, y_i in zip(a, y)])


def _kinds_of_matrices(dtype, rng, n=5):
    """A stack of a symmetric positive-definite matrix, one asymmetric in its last bits (a GEMM
    of a scaled copy, in ``dtype``) and one not symmetric whose lower triangle is positive definite."""
    x = rng.standard_normal((3, n, n))
    k = spd(x)
    symmetric = np.asarray((k[0] + k[0].T) / 2, dtype)
    rows, weights = x[1].astype(dtype), rng.uniform(0.5, 2.0, n).astype(dtype)
    rounded = (rows * weights) @ rows.T / dtype(n) + np.eye(n, dtype=dtype)
    assert np.any(rounded != rounded.T) and np.allclose(rounded, rounded.T, rtol=10 * np.finfo(dtype).eps)
    not_symmetric = np.asarray(k[2] + 0.3 * rng.standard_normal((n, n)), dtype)
    return np.stack([symmetric, rounded, not_symmetric])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_slogdet_of_a_factored_matrix_is_numpys_of_the_whole_matrix(backend, dtype):
    rng = np.random.default_rng(21)
    a = _kinds_of_matrices(dtype, rng)
    y = rng.standard_normal(a.shape[:-1]).astype(dtype)
    names = list(FACTORED_LOG_DETERMINANTS)
    weights = {name: rng.standard_normal(a.shape[0]) for name in names}

    def loss(matrices, y):   # each spelling its own copy of the matrices, and so its own gradient
        values = [FACTORED_LOG_DETERMINANTS[name](la, m, y) for name, m in zip(names, matrices)]
        return sum(np.sum(v * weights[name].astype(dtype)) for name, v in zip(names, values)), values

    (_, values), (grads,) = mj.compile_loss(loss, argnums=(0,), has_aux=True, backend=backend)([a] * len(names), y)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    a64, y64 = a.astype(np.float64), y.astype(np.float64)   # the oracles in float64
    for name, value, grad in zip(names, values, grads):
        fn = FACTORED_LOG_DETERMINANTS[name]
        assert value.dtype == grad.dtype == dtype
        np.testing.assert_allclose(value, _per_matrix(fn, a64, y64), rtol=tol, atol=tol, err_msg=name)
        if "cho_solve" not in name:   # the gradient of sign * logabsdet: sign * inv(a).T
            expected = (weights[name] * np.linalg.slogdet(a64)[0])[:, None, None] * np.swapaxes(np.linalg.inv(a64), -1, -2)
            np.testing.assert_allclose(grad, expected, rtol=tol, atol=tol * np.abs(expected).max(), err_msg=name)
        check_loss_grads_fd(lambda xs, fn=fn, w=weights[name]: np.sum(_per_matrix(fn, xs[0], y64) * w),
                            [a64], [grad.astype(np.float64)], rng=rng, rtol=10 * tol, what=name)


def _factored_slogdet(a):
    np.linalg.cholesky(a)
    return np.linalg.slogdet(a)[1]


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_the_factor_serves_a_matrix_symmetric_to_rounding_and_lu_the_others(backend):
    """A matrix asymmetric by more than rounding (1e-9, where the factor's log-determinant is
    off by 8e-10) has LU's on both backends. On the reference backend the factor's is
    2 sum log diag(cholesky(a)) to the bit and LU's np.linalg.slogdet's: a matrix asymmetric in
    its last bits takes the factor."""
    rng = np.random.default_rng(22)
    a = _kinds_of_matrices(np.float64, rng)
    slightly = a[0] + 1e-9 * np.triu(rng.standard_normal(a[0].shape), 1)
    a = np.concatenate([a, slightly[None]])
    step = mj.compile_loss(lambda a: (np.sum(_factored_slogdet(a)), _factored_slogdet(a)), has_aux=True,
                           backend=backend)
    (_, values), _ = step(a)
    from_factor = 2.0 * np.sum(np.log(np.diagonal(np.linalg.cholesky(a), axis1=-2, axis2=-1)), axis=-1)
    by_lu = np.linalg.slogdet(a)[1]
    assert abs(from_factor[3] - by_lu[3]) > 1e-10
    np.testing.assert_allclose(values[2:], by_lu[2:], rtol=1e-14)
    if backend == "interp":
        np.testing.assert_array_equal(values, [from_factor[0], from_factor[1], by_lu[2], by_lu[3]])


def test_the_gradient_of_a_matrix_symmetric_to_rounding_is_the_inverse_from_its_factor():
    """The compiled step's inverse from the factor is exactly symmetric (LU's of a matrix
    asymmetric in its last bits is not); a matrix that is not symmetric gets LU's."""
    rng = np.random.default_rng(23)
    a = _kinds_of_matrices(np.float64, rng)
    _, grad = mj.compile_loss(lambda a: np.sum(_factored_slogdet(a)))(a)
    assert np.array_equal(grad[1], grad[1].T)
    np.testing.assert_allclose(grad, np.swapaxes(np.linalg.inv(a), -1, -2), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_second_derivatives_of_a_factored_slogdet_are_numpys(backend):
    """H v of logabsdet(a) is -(a^-1 v a^-1)^T, for symmetric and non-symmetric matrices alike."""
    rng = np.random.default_rng(24)
    hvp = mj.hvp(_factored_slogdet, backend=backend)
    for a in _kinds_of_matrices(np.float64, rng):
        v = rng.standard_normal(a.shape)
        inverse = np.linalg.inv(a)
        np.testing.assert_allclose(hvp(a, v), -(inverse @ v @ inverse).T, rtol=1e-10, atol=1e-12)
