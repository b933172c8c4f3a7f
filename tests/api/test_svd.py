"""``np.linalg.svd``, ``svdvals`` and the matrix norms from singular values on traced arrays:
NumPy's singular values and reconstructions (the vectors' signs are LAPACK's choice), gradients of
functions free of those signs against central differences of NumPy's own, on both backends,
float64 and float32, single and batched, tall, wide and square; what happens where the gradient
is not defined (repeated singular values, the extra columns of a full U); the refusals."""
from __future__ import annotations

import numpy as np
import pytest

import morphjit as mj

from support.gradcheck import check_loss_grads_fd

BACKENDS = ["interp", "numba"]
SHAPES = [(3, 3), (5, 3), (3, 5), (2, 4, 3), (2, 2, 4)]


def _parts(a, full):
    """NumPy's or the traced svd, as the sign-free pieces compared: s, U S Vh, U^T U, Vh Vh^T."""
    u, s, vh = np.linalg.svd(a, full_matrices=full)
    k = s.shape[-1]
    reconstruction = (u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :]
    return [s, reconstruction, np.swapaxes(u, -1, -2) @ u, vh @ np.swapaxes(vh, -1, -2)]


def _matrices(rng, dtype):
    return [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", BACKENDS)
def test_values_are_numpys(backend, dtype):
    rng = np.random.default_rng(41)
    matrices = _matrices(rng, dtype)

    def loss(matrices):
        pieces = [(_parts(a, full), np.linalg.svdvals(a), np.linalg.svd(a, compute_uv=False),
                   [np.linalg.norm(a, ord, axis=(-2, -1)) for ord in ("nuc", 2, -2)])
                  for a in matrices for full in (True, False)]
        return np.sum(matrices[0]), pieces

    (_, pieces), _ = mj.compile_loss(loss, has_aux=True, backend=backend)(matrices)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    expected = iter(p for a in matrices for full in (True, False) for p in _parts(a, full))
    for a, (parts, svdvals, values, norms) in zip([m for m in matrices for _ in (0, 1)], pieces):
        s = np.linalg.svdvals(a)
        for actual in [*parts, svdvals, values, *norms]:
            assert actual.dtype == dtype
        for actual, reference in zip(parts, expected):
            assert actual.shape == reference.shape
            np.testing.assert_allclose(actual, reference, rtol=tol, atol=10 * tol)
        for actual in (svdvals, values):
            np.testing.assert_allclose(actual, s, rtol=tol)
        np.testing.assert_allclose(norms, [s.sum(-1), s.max(-1), s.min(-1)], rtol=tol)


SIGN_FREE = {   # name: fn(a, w), w of a's shape: functions of a through U, s and Vh free of their signs
    "s": lambda a, w: np.sum(np.linalg.svd(a, compute_uv=False) * w[..., 0, :1]),
    "U squared": lambda a, w: np.sum(np.linalg.svd(a, full_matrices=False)[0] ** 2 * w[..., :, :min(a.shape[-2:])]),
    "Vh squared": lambda a, w: np.sum(np.linalg.svd(a, full_matrices=False)[2] ** 2 * w[..., :min(a.shape[-2:]), :]),
    "U S Vh": lambda a, w: np.sum(_parts(a, False)[1] * w),
    "full Vh of a tall matrix": lambda a, w: np.sum(np.linalg.svd(a)[2][..., :1, :] ** 2 * w[..., :1, :]),
    "svdvals": lambda a, w: np.sum(np.linalg.svdvals(a) ** 2 * w[..., 0, :1]),
    "nuclear norm": lambda a, w: np.sum(np.linalg.norm(a * w, "nuc", axis=(-2, -1))),
    "spectral norm": lambda a, w: np.sum(np.linalg.norm(a * w, 2, axis=(-1, -2))),
    "smallest singular value": lambda a, w: np.sum(np.linalg.norm(a + w, -2, axis=(-2, -1), keepdims=True)),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_agree_with_finite_differences_of_numpys_svd(backend, dtype):
    rng = np.random.default_rng(42)
    matrices = _matrices(rng, dtype)
    weights = [rng.standard_normal(a.shape) for a in matrices]
    names = list(SIGN_FREE)

    def loss(copies):   # each function its own copy of the matrices, and so its own gradient
        return sum(SIGN_FREE[name](a, w.astype(dtype)) for name, row in zip(names, copies)
                   for a, w in zip(row, weights))

    (grads,) = mj.compile_loss(loss, backend=backend)([matrices] * len(names))[1:]
    tol = 1e-6 if dtype == np.float64 else 1e-3
    for name, row in zip(names, grads):
        for a, w, grad in zip(matrices, weights, row):
            assert grad.dtype == dtype and np.all(np.isfinite(grad)), name
            check_loss_grads_fd(lambda xs, name=name, w=w: SIGN_FREE[name](xs[0], w), [a.astype(np.float64)],
                                [grad.astype(np.float64)], rng=rng, rtol=tol, what=f"{name} {a.shape}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_singular_values_repeat_only_the_vectors_gradient_is_undefined(backend):
    """At the identity every singular value is 1: the gradient of a function of s is finite (of
    their sum, U V^T = I), that through U or V is not defined and not finite."""
    eye = np.eye(3)
    nuclear = mj.compile_loss(lambda a: np.linalg.norm(a, "nuc"), backend=backend)
    np.testing.assert_allclose(nuclear(eye)[1], eye, atol=1e-15)
    _, through_u = mj.compile_loss(lambda a: np.sum(np.linalg.svd(a)[0] * np.triu(np.ones((3, 3)))),
                                   backend=backend)(eye)
    assert not np.all(np.isfinite(through_u))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_extra_columns_of_a_full_u_have_a_gradient_only_where_unused(backend):
    """Beyond min(m, n) a full U is any orthonormal basis of the complement: a loss that reads
    them has a NaN gradient, one that does not has the reduced decomposition's."""
    a = np.random.default_rng(43).standard_normal((5, 3))

    def first_columns(a, full):
        u, s, vh = np.linalg.svd(a, full_matrices=full)
        return np.sum(u[:, :3] ** 2 * np.arange(3.0)) + np.sum(s)

    full = mj.compile_loss(lambda a: first_columns(a, True), backend=backend)(a)[1]
    reduced = mj.compile_loss(lambda a: first_columns(a, False), backend=backend)(a)[1]
    np.testing.assert_allclose(full, reduced, rtol=1e-12)
    _, extra = mj.compile_loss(lambda a: np.sum(np.linalg.svd(a)[0][:, 3:] ** 2 * a[:, :2]), backend=backend)(a)
    assert np.all(np.isnan(extra))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_input_raises_linalgerror_as_numpy_does(backend):
    a = np.array([[1.0, np.nan], [0.0, 1.0]])
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.svd(a)
    with pytest.raises(np.linalg.LinAlgError, match="SVD did not converge"):
        mj.compile_loss(lambda a: np.sum(np.linalg.svdvals(a)), backend=backend)(a)


def test_what_is_not_supported_is_refused():
    with pytest.raises(mj.UnsupportedError, match=r"svd\(hermitian=True\) is not supported"):
        mj.trace(lambda a: np.sum(np.linalg.svd(a, hermitian=True)[1]), np.eye(2))
    with pytest.raises(mj.UnsupportedError, match="np.linalg.matrix_rank is not supported"):
        mj.trace(lambda a: np.linalg.matrix_rank(a) * np.sum(a), np.eye(2))
    with pytest.raises(ValueError, match="invalid norm order 3 for matrices"):
        mj.trace(lambda a: np.linalg.norm(a, 3), np.eye(2))
    with pytest.raises(mj.ShapeError, match="non-empty matrices"):
        mj.trace(lambda a: np.sum(np.linalg.svdvals(a)), np.ones((0, 3)))
