"""SciPy's linear algebra on traced arrays: ``scipy.linalg.cholesky``, ``cho_factor``,
``cho_solve``, ``solve_triangular``, ``solve``, ``inv``, ``det``, ``svd`` and ``svdvals``, with SciPy's arguments and
meaning (``cholesky``'s default is the upper factor), batched over leading axes as SciPy's are.

While a trace runs (``substitutes.ANY_TRACE``; this module is loaded by the first trace once
``scipy.linalg`` is imported) each of these attributes of ``scipy.linalg`` is a function that
computes its twin below when an argument is traced and calls SciPy's own otherwise. A function
taken from the module before the trace (``from scipy.linalg import cho_solve``) stays SciPy's
own, which refuses traced arrays and names the spellings that trace (``morphjit.api.conversions``).

``overwrite_a``, ``overwrite_b`` and ``check_finite`` are accepted and ignored: nothing the caller
passes is written, and NaN input gives NaN (or ``LinAlgError``) as the ops do. On float32 input
``det`` stays float32 (SciPy's is float64), as everywhere in a trace. ``assume_a`` names the
structure read: the general matrix; the symmetric (or Hermitian: real here) or positive definite
one in the triangle ``lower`` names (its gradient goes to that triangle); the diagonal, the three
diagonals of a tridiagonal matrix, or a triangle. ``None``, where SciPy picks a solver from the
values, is the general one: the same value, and the gradient of ``a^-1 b`` in all of ``a``.
``'banded'`` is refused. ``inv(assume_a='diagonal')`` is the inverse of the diagonal matrix
(SciPy 1.17's result keeps the other elements of ``a``).
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.linalg

from ...tracing import ANY_TRACE, Tracer
from ...util import UnsupportedError, user_location
from .. import core as A, linalg as la

SOLVE_STRUCTURES = {None: "general", "general": "general", "gen": "general", "diagonal": "diagonal",
                    "tridiagonal": "tridiagonal", "upper triangular": "upper", "lower triangular": "lower",
                    "pos": "pos", "positive definite": "pos", "sym": "sym", "symmetric": "sym", "her": "sym",
                    "hermitian": "sym"}
INV_STRUCTURES = {None: "general", "general": "general", "gen": "general", "diagonal": "diagonal",
                  "upper triangular": "upper", "lower triangular": "lower", "pos": "pos", "sym": "sym", "her": "sym"}


def cholesky(a, lower=False, overwrite_a=False, check_finite=True):
    """The Cholesky factor of ``a``: upper (``a = U^T U``, read from the upper triangle) unless ``lower``."""
    return la.cholesky(a, lower=bool(lower))


def cho_factor(a, lower=False, overwrite_a=False, check_finite=True):
    """``(c, lower)`` for `cho_solve`: the factor in the triangle ``lower`` names, the other zero."""
    return la.cho_factor(a, lower=lower)


def cho_solve(c_and_lower, b, overwrite_b=False, check_finite=True):
    """``a^-1 b`` from ``(c, lower)``, reading only the triangle ``lower`` names of ``c``."""
    return la.cho_solve(c_and_lower, b)


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False, check_finite=True):
    """``op(a)^-1 b`` for the triangle of ``a`` that ``lower`` names."""
    return la.solve_triangular(a, b, trans=trans, lower=lower, unit_diagonal=unit_diagonal)


def solve(a, b, lower=False, overwrite_a=False, overwrite_b=False, check_finite=True, assume_a=None,
          transposed=False):
    """``x`` with ``a @ x = b`` (``a.T @ x = b`` where ``transposed``), ``a`` of the structure
    ``assume_a`` names."""
    structure = _structure("solve", SOLVE_STRUCTURES, assume_a)
    a = _as_array(a)
    if structure in ("upper", "lower"):
        return la.solve_triangular(a, b, trans=int(bool(transposed)), lower=structure == "lower")
    if structure == "diagonal":
        return la.solve_triangular(_diagonal_part(a), b, lower=True)
    if structure == "pos":
        return la.cho_solve(la.cho_factor(a, lower=lower), b)
    if structure == "sym":
        return la.solve(_symmetric_from(a, lower), b)
    if structure == "tridiagonal":
        a = A.where(_band_mask(a.shape[-1]), a, 0.0)
    return la.solve(A.swap_last(a) if transposed else a, b)


def inv(a, overwrite_a=False, check_finite=True, *, assume_a=None, lower=False):
    """The inverse of ``a``, of the structure ``assume_a`` names."""
    structure = _structure("inv", INV_STRUCTURES, assume_a)
    a = _as_array(a)
    if structure in ("upper", "lower"):
        return la.triangular_inverse(a, lower=structure == "lower")
    if structure == "diagonal":
        return la.triangular_inverse(_diagonal_part(a), lower=True)
    if structure == "pos":   # the inverse from the factor of an exactly symmetric matrix
        symmetric = _symmetric_from(a, lower)
        return A.bind("factored_inv", [symmetric, la.cholesky(symmetric)])
    return la.inv(_symmetric_from(a, lower) if structure == "sym" else a)


def det(a, overwrite_a=False, check_finite=True):
    """The determinant of ``a`` (its gradient uses the inverse)."""
    return la.det(a)


def svd(a, full_matrices=True, compute_uv=True, overwrite_a=False, check_finite=True, lapack_driver="gesdd"):
    """``(U, s, Vh)`` (``s`` alone unless ``compute_uv``), as ``np.linalg.svd``; either LAPACK
    driver gives the same decomposition up to the vectors' signs."""
    if lapack_driver not in ("gesdd", "gesvd"):
        raise ValueError(f'lapack_driver must be "gesdd" or "gesvd", not "{lapack_driver}"')
    result = la.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)
    return tuple(result) if compute_uv else result


def svdvals(a, overwrite_a=False, check_finite=True):
    """The singular values of ``a``, descending."""
    return la.svdvals(a)


def _structure(function: str, structures: dict, assume_a) -> str:
    if assume_a in structures:
        return structures[assume_a]
    if assume_a == "banded":
        raise UnsupportedError(f"scipy.linalg.{function}(assume_a={assume_a!r}) is not supported on traced arrays "
                               f"(assume_a={', '.join(repr(s) for s in structures if s)} or None are)",
                               user_location())
    raise ValueError(f"{assume_a} is not a recognized matrix structure")


def _as_array(a):
    a = a if isinstance(a, Tracer) else np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        a = A.astype(a, np.float64)
    return a


def _symmetric_from(a, lower: bool):
    """The symmetric matrix in the ``lower`` or upper triangle of ``a`` (the other one mirrored)."""
    read = np.tri(a.shape[-1], dtype=bool)
    return A.where(read if lower else read.T, a, A.swap_last(a))


def _diagonal_part(a):
    return A.where(np.eye(a.shape[-1], dtype=bool), a, 0.0)


def _band_mask(n: int) -> np.ndarray:
    """Where a tridiagonal matrix has its elements."""
    i, j = np.indices((n, n))
    return np.abs(i - j) <= 1


def _traced(args, kwargs) -> bool:
    """Whether an argument, or an element of a tuple argument (``cho_solve``'s), is traced (a buffer
    that is still NumPy's, a captured array, is not: SciPy computes with it)."""
    values = [*args, *kwargs.values()]
    values += [x for v in values if isinstance(v, (tuple, list)) for x in v]
    return A.trace_of([v for v in values if not (isinstance(v, Tracer) and v.concrete() is not None)]) is not None


def _substitute(original, twin):
    @functools.wraps(original)
    def function(*args, **kwargs):
        return twin(*args, **kwargs) if _traced(args, kwargs) else original(*args, **kwargs)
    return function


TWINS = {"cholesky": cholesky, "cho_factor": cho_factor, "cho_solve": cho_solve,
         "solve_triangular": solve_triangular, "solve": solve, "inv": inv, "det": det, "svd": svd, "svdvals": svdvals}

for _name, _twin in TWINS.items():
    ANY_TRACE.register(scipy.linalg, _name, _substitute(getattr(scipy.linalg, _name), _twin))
