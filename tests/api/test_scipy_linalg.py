"""SciPy's linear algebra as written (``scipy.linalg.cholesky``, ``cho_factor``, ``cho_solve``,
``solve_triangular``, ``solve``, ``inv``, ``det``, ``svd``, ``svdvals``) on traced arrays: SciPy's values on a batch of
matrices that are not symmetric (so that reading the wrong triangle shows), the gradient against
central differences of SciPy's own function (so that a gradient in a triangle SciPy does not read
shows), on both backends, float64 and float32; SciPy's own functions outside traces; the refusals."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from scipy.linalg import _basic, _decomp_cholesky, _decomp_svd

import morphjit as mj

from support.gradcheck import check_loss_grads_fd

BACKENDS = ["interp", "numba"]

CASES = {   # name: fn(a, b), a [2, 4, 4] (its triangles and the matrix positive definite), b [4, 2]
    "cholesky": lambda a, b: sl.cholesky(a),
    "cholesky(lower=True)": lambda a, b: sl.cholesky(a, True),
    "cho_solve(cho_factor)": lambda a, b: sl.cho_solve(sl.cho_factor(a), b),
    "cho_solve(cho_factor(lower=True))": lambda a, b: sl.cho_solve(sl.cho_factor(a, lower=True), b[:, 0]),
    "cho_solve((c, True)) of a c not triangular": lambda a, b: sl.cho_solve((a, True), b),
    "cho_solve((c, False)) of a c not triangular": lambda a, b: sl.cho_solve((a, False), b[:, 0]),
    "solve_triangular": lambda a, b: sl.solve_triangular(a, b),
    "solve_triangular(lower, trans=1, unit_diagonal)": lambda a, b: sl.solve_triangular(
        a, b, trans=1, lower=True, unit_diagonal=True, check_finite=False),
    "solve_triangular(trans='C')": lambda a, b: sl.solve_triangular(a, b[:, 1], trans="C", overwrite_b=True),
    "solve": lambda a, b: sl.solve(a, b),
    "solve(transposed=True)": lambda a, b: sl.solve(a, b[:, 0], transposed=True, overwrite_a=True),
    "solve(assume_a='pos')": lambda a, b: sl.solve(a, b, assume_a="pos"),
    "solve(assume_a='positive definite', lower=True)": lambda a, b: sl.solve(a, b, assume_a="positive definite",
                                                                             lower=True),
    "solve(assume_a='sym', lower=True)": lambda a, b: sl.solve(a, b, assume_a="sym", lower=True),
    "solve(assume_a='her')": lambda a, b: sl.solve(a, b, assume_a="her"),
    "solve(assume_a='gen')": lambda a, b: sl.solve(a, b, assume_a="gen"),
    "solve(assume_a='diagonal')": lambda a, b: sl.solve(a, b, assume_a="diagonal"),
    "solve(assume_a='tridiagonal')": lambda a, b: sl.solve(a, b, assume_a="tridiagonal"),
    "solve(assume_a='lower triangular', transposed=True)": lambda a, b: sl.solve(
        a, b, assume_a="lower triangular", transposed=True),
    "solve(assume_a='upper triangular')": lambda a, b: sl.solve(a, b, assume_a="upper triangular"),
    "inv": lambda a, b: sl.inv(a),
    "inv(assume_a='pos')": lambda a, b: sl.inv(a, assume_a="pos"),
    "inv(assume_a='pos', lower=True)": lambda a, b: sl.inv(a, assume_a="pos", lower=True),
    "inv(assume_a='sym', lower=True)": lambda a, b: sl.inv(a, assume_a="sym", lower=True),
    "inv(assume_a='upper triangular')": lambda a, b: sl.inv(a, assume_a="upper triangular"),
    "inv(assume_a='lower triangular')": lambda a, b: sl.inv(a, assume_a="lower triangular"),
    # SciPy leaves a's elements off the diagonal in its result; morphjit's is the inverse of the diagonal
    "inv(assume_a='diagonal')": lambda a, b: sl.inv(a, assume_a="diagonal") * np.eye(4, dtype=a.dtype),
    "det": lambda a, b: sl.det(a),
    "svd (U S Vh)": lambda a, b: _reconstruction(sl.svd(a[..., :3], lapack_driver="gesvd")),
    "svd (U squared)": lambda a, b: sl.svd(a, full_matrices=False)[0] ** 2,
    "svd(compute_uv=False)": lambda a, b: sl.svd(a[..., :3, :], compute_uv=False),
    "svdvals": lambda a, b: sl.svdvals(a),
}


def _reconstruction(usv):
    u, s, vh = usv
    return (u[..., :, :s.shape[-1]] * s[..., None, :]) @ vh


def _matrices(rng, dtype, n=4):
    """Two matrices that are not symmetric, each triangle of which (mirrored) is positive definite."""
    x = rng.standard_normal((2, n, n))
    k = x @ np.swapaxes(x, -1, -2) / n + 2.0 * np.eye(n)
    return np.asarray(k + 0.2 * rng.standard_normal((2, n, n)), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", BACKENDS)
def test_scipy_linalg_functions_trace_with_scipys_values_and_gradients(backend, dtype):
    rng = np.random.default_rng(31)
    a, b = _matrices(rng, dtype), rng.standard_normal((4, 2)).astype(dtype)
    names = list(CASES)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)   # the oracles: SciPy's own, in float64
    expected = {name: CASES[name](a64, b64) for name in names}
    weights = {name: rng.standard_normal(np.shape(expected[name])) for name in names}

    def loss(matrices, b):   # each function its own copy of the matrices, and so its own gradient
        values = [CASES[name](m, b) for name, m in zip(names, matrices)]
        return sum(np.sum(v * weights[name].astype(dtype)) for name, v in zip(names, values)), values

    (_, values), (grads,) = mj.compile_loss(loss, argnums=(0,), has_aux=True, backend=backend)([a] * len(names), b)
    tol = 2e-4 if dtype == np.float32 else 1e-10
    for name, value, grad in zip(names, values, grads):
        assert value.dtype == grad.dtype == dtype, name
        np.testing.assert_allclose(value, expected[name], rtol=tol, atol=tol * np.abs(expected[name]).max(),
                                   err_msg=name)
        check_loss_grads_fd(lambda xs, name=name: np.sum(CASES[name](xs[0], b64) * weights[name]),
                            [a64], [grad.astype(np.float64)], rng=rng, rtol=10 * tol if dtype == np.float32 else 1e-6,
                            what=name)


def test_the_gradient_stays_in_the_triangle_scipy_reads():
    rng = np.random.default_rng(32)
    a, b = _matrices(rng, np.float64)[0], rng.standard_normal(4)
    readers = {"upper": [lambda a: sl.cholesky(a), lambda a: sl.solve(a, b, assume_a="pos"),
                         lambda a: sl.inv(a, assume_a="sym"), lambda a: sl.solve_triangular(a, b),
                         lambda a: sl.cho_solve((a, False), b)],
               "lower": [lambda a: sl.cho_solve(sl.cho_factor(a, lower=True), b), lambda a: sl.cho_solve((a, 1), b),
                         lambda a: sl.solve(a, b, assume_a="sym", lower=True),
                         lambda a: sl.inv(a, assume_a="lower triangular")],
               "diagonal": [lambda a: sl.inv(a, assume_a="diagonal"), lambda a: sl.solve(a, b, assume_a="diagonal")]}
    for triangle, functions in readers.items():
        for fn in functions:
            grad = mj.grad(lambda a: np.sum(fn(a) ** 2))(a)
            unread = {"upper": np.tril(grad, -1), "lower": np.triu(grad, 1),
                      "diagonal": grad - np.diag(np.diag(grad))}[triangle]
            assert not unread.any() and np.abs(grad).max() > 0


def test_outside_traces_scipys_functions_are_scipys_own():
    mj.compile_loss(lambda a: np.sum(sl.cholesky(a)))(np.eye(2))   # a trace has run and ended
    originals = {"cholesky": _decomp_cholesky.cholesky, "cho_factor": _decomp_cholesky.cho_factor,
                 "cho_solve": _decomp_cholesky.cho_solve, "solve_triangular": _basic.solve_triangular,
                 "solve": _basic.solve, "inv": _basic.inv, "det": _basic.det, "svd": _decomp_svd.svd,
                 "svdvals": _decomp_svd.svdvals}
    assert all(getattr(sl, name) is function for name, function in originals.items())


def test_inside_a_trace_scipys_functions_of_arrays_are_scipys_own():
    seen = {}
    k = np.array([[4.0, 2.0], [2.0, 3.0]])

    def loss(x):
        seen["replaced"] = sl.cholesky is not _decomp_cholesky.cholesky
        seen["factor"] = sl.cholesky(k)   # no traced argument: SciPy's function, SciPy's array
        return np.sum(x * seen["factor"])

    value, grad = mj.compile_loss(loss)(np.ones((2, 2)))
    assert seen["replaced"] and type(seen["factor"]) is np.ndarray
    np.testing.assert_array_equal(seen["factor"], _decomp_cholesky.cholesky(k))
    np.testing.assert_array_equal(grad, seen["factor"])


def test_a_function_imported_before_the_trace_names_the_spellings_that_trace():
    cho_solve = _decomp_cholesky.cho_solve   # as `from scipy.linalg import cho_solve` holds it
    with pytest.raises(mj.UnsupportedError, match=r"from scipy.linalg import cho_solve.*write "
                                                  r"scipy.linalg.cho_solve\(...\) or mj.linalg.cho_solve"):
        mj.trace(lambda a, b: np.sum(cho_solve((a, True), b)), np.eye(2), np.ones(2))


def test_what_morphjit_cannot_honour_is_refused():
    with pytest.raises(mj.UnsupportedError, match=r"scipy.linalg.solve\(assume_a='banded'\) is not supported"):
        mj.trace(lambda a, b: np.sum(sl.solve(a, b, assume_a="banded")), np.eye(2), np.ones(2))
    with pytest.raises(ValueError, match="not a recognized matrix structure"):
        mj.trace(lambda a, b: np.sum(sl.solve(a, b, assume_a="unknown")), np.eye(2), np.ones(2))
    with pytest.raises(ValueError, match="not a recognized matrix structure"):
        mj.trace(lambda a: np.sum(sl.inv(a, assume_a="tridiagonal")), np.eye(2))
    with pytest.raises(ValueError, match="lapack_driver"):
        mj.trace(lambda a: np.sum(sl.svd(a, lapack_driver="gejsv")[1]), np.eye(2))
    with pytest.raises(TypeError):   # an argument SciPy does not take
        mj.trace(lambda a: np.sum(sl.cholesky(a, upper=True)), np.eye(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_failures_raise_linalgerror_as_scipy_does(backend):
    indefinite, singular = np.diag([1.0, -1.0]), np.zeros((2, 2))
    failing = {"cholesky": (lambda a: sl.cholesky(a), indefinite),
               "solve(assume_a='pos')": (lambda a: sl.solve(a, np.ones(2), assume_a="pos"), indefinite),
               "solve": (lambda a: sl.solve(a, np.ones(2)), singular),
               "inv": (lambda a: sl.inv(a), singular),
               "solve_triangular": (lambda a: sl.solve_triangular(a, np.ones(2)), singular)}
    for name, (fn, a) in failing.items():
        with pytest.raises(np.linalg.LinAlgError):
            fn(a)
        with pytest.raises(np.linalg.LinAlgError):
            mj.compile_loss(lambda a: np.sum(fn(a)), backend=backend)(a)


def test_nothing_the_caller_passes_is_written():
    rng = np.random.default_rng(33)
    a, b = _matrices(rng, np.float64)[0], rng.standard_normal((4, 2))
    before = a.copy(), b.copy()
    mj.compile_loss(lambda a, b: np.sum(sl.solve(a, b, overwrite_a=True, overwrite_b=True))
                    + np.sum(sl.cho_solve(sl.cho_factor(a, overwrite_a=True), b, overwrite_b=True)),
                    argnums=(0, 1), backend="interp")(a, b)
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])


def _gp_nll(linalg, k, y):
    factor = linalg.cho_factor(k, lower=True)
    return 0.5 * np.sum(y * linalg.cho_solve(factor, y)) + np.sum(np.log(np.diagonal(factor[0])))


def test_a_gp_likelihood_spelled_with_scipy_is_the_program_spelled_with_mj_linalg():
    """The factor's gradient goes to the kernel matrix through its inverse, not back through the
    factorisation, whichever spelling made it."""
    rng = np.random.default_rng(34)
    k, y = _matrices(rng, np.float64)[0], rng.standard_normal(4)
    k = (k + k.T) / 2
    scipy_program = mj.compile_loss(lambda k, y: _gp_nll(sl, k, y), argnums=(0, 1)).program(k, y)
    mj_program = mj.compile_loss(lambda k, y: _gp_nll(mj.linalg, k, y), argnums=(0, 1)).program(k, y)
    assert [b.op for b in scipy_program.bindings] == [b.op for b in mj_program.bindings]
    assert "cho_solve" in {b.op for b in scipy_program.bindings}


def test_cho_solve_reads_only_its_triangle_of_scipys_own_factor():
    """SciPy's cho_factor leaves garbage in the other triangle: cho_solve of it and of a traced
    right-hand side is SciPy's."""
    rng = np.random.default_rng(35)
    a, b = _matrices(rng, np.float64)[0], rng.standard_normal(4)
    for lower in (True, False):
        factor = sl.cho_factor(a, lower=lower)
        value, grad = mj.compile_loss(lambda b: (np.sum(sl.cho_solve(factor, b) ** 2), sl.cho_solve(factor, b)),
                                      has_aux=True, backend="interp")(b)
        np.testing.assert_allclose(value[1], sl.cho_solve(factor, b), rtol=1e-12)
        np.testing.assert_allclose(grad, 2 * sl.cho_solve(factor, sl.cho_solve(factor, b)), rtol=1e-10)
