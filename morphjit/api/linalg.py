"""Linear algebra: the functions users call (the ops they bind are in ``morphjit.ops.linalg``).

``mj.linalg.cholesky``, ``solve``, ``inv``, ``det``, ``slogdet``, ``eigh``, ``eigvalsh``, ``qr``,
``svd``, ``svdvals``, ``lstsq`` and ``pinv`` (full rank, through QR), also reached by plain
``np.linalg.*`` calls on traced arrays; ``solve_triangular``, ``cho_factor`` and ``cho_solve`` with SciPy's signatures;
``triangular_matmul`` (BLAS ``trmm``) and ``triangular_inverse`` (LAPACK ``trtri``). Each works
on the last two axes and batches over the leading ones, broadcast between operands as NumPy does.
``cho_solve`` on a factor the trace made itself binds an op of the factored matrix, so that the
gradient goes to the matrix directly; ``slogdet`` of a matrix the trace factored binds an op that
reads the factor where the matrix is symmetric (decided as the step runs) and LU otherwise.

Errors: a matrix that is not positive definite (cholesky) or is singular (solve, inv, a zero on a
triangular diagonal) raises ``numpy.linalg.LinAlgError`` from the call, on both backends, as
NumPy does; NaN input gives NaN results, as in NumPy. `FUNCTIONS` is this family's entries of the
NumPy dispatch.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from ..ir import is_float
from ..tracing import Tracer
from ..util import ShapeError, UnsupportedError, user_location
from . import core as A
from .indexing import getitem

SlogdetResult = namedtuple("SlogdetResult", "sign logabsdet")
EighResult = namedtuple("EighResult", "eigenvalues eigenvectors")
QRResult = namedtuple("QRResult", "Q R")
SVDResult = namedtuple("SVDResult", "U S Vh")


def _array(x):
    return x if isinstance(x, Tracer) else np.asarray(x)


def _matrix(op: str, x):
    x = _array(x)
    if not is_float(x.dtype):
        x = A.astype(x, np.float64)
    if x.ndim < 2:
        raise ShapeError(f"{op}: expected a matrix (or a stack of them), got an array of shape {x.shape}",
                         user_location())
    return x


def _system(op: str, a, b):
    """``a`` and ``b`` in one float dtype; a 1-D ``b`` as one column (and the result back to 1-D)."""
    a, b = _matrix(op, a), _array(b)
    dtype = np.result_type(a.dtype, b.dtype)
    a, b = A.astype(a, dtype), A.astype(b, dtype)
    vector = b.ndim == 1
    return a, (A.expand_dims(b, -1) if vector else b), vector


def _column_back(x, vector: bool):
    return A.squeeze(x, -1) if vector else x


def cholesky(a, *, upper=False, lower=None, overwrite_a=False, check_finite=True):
    """The lower Cholesky factor ``L`` of ``a = L @ L.T``, read from the lower triangle of ``a``;
    with ``upper=True`` (or SciPy's ``lower=False``) the upper factor ``U`` of ``a = U.T @ U``,
    read from the upper triangle, as NumPy and SciPy do. Without either, NumPy's default: the
    lower factor (SciPy's is the upper one). Raises ``LinAlgError`` unless ``a`` is positive
    definite."""
    if lower is not None:
        if upper and lower:
            raise ValueError("cholesky: upper=True and lower=True contradict each other")
        upper = not lower
    a = _matrix("cholesky", a)
    if upper:   # the upper triangle of a is the lower one of a.T
        return A.swap_last(A.bind("cholesky", [A.swap_last(a)]))
    return A.bind("cholesky", [a])


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False,
                     check_finite=True):
    """``scipy.linalg.solve_triangular``: solve ``op(a) x = b`` for triangular ``a`` (``trans``
    0/'N', 1/'T' or 2/'C'), reading only the ``lower`` or upper triangle (without its diagonal,
    taken as ones, where ``unit_diagonal``)."""
    transposed = {0: False, 1: True, 2: True, "N": False, "T": True, "C": True}.get(trans)
    if transposed is None:
        raise ValueError(f"solve_triangular: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}")
    a, b, vector = _system("solve_triangular", a, b)
    if unit_diagonal:
        a = A.where(np.eye(a.shape[-1], dtype=bool), 1.0, a)
    return _column_back(A.bind("solve_triangular", [a, b], lower=bool(lower), trans=transposed), vector)


def triangular_matmul(a, b, lower=False, trans=False):
    """``op(a) @ b`` reading only the ``lower`` or upper triangle of ``a`` (BLAS ``trmm``: half
    the work of a matrix product); ``op`` is a transpose where ``trans``."""
    a, b, vector = _system("triangular_matmul", a, b)
    return _column_back(A.bind("triangular_matmul", [a, b], lower=bool(lower), trans=bool(trans)), vector)


def triangular_inverse(a, lower=False):
    """The inverse of the triangular matrix in the ``lower`` or upper triangle of ``a`` (LAPACK
    ``trtri``: a third of the work of a triangular solve against the identity). Raises
    ``LinAlgError`` where a diagonal element is zero."""
    return A.bind("triangular_inverse", [_matrix("triangular_inverse", a)], lower=bool(lower))


def cho_factor(a, lower=False, overwrite_a=False, check_finite=True):
    """``scipy.linalg.cho_factor``: ``(c, lower)``, the Cholesky factor in the triangle
    ``lower`` names (the other triangle is zero, where SciPy leaves garbage)."""
    return cholesky(a, upper=not lower), bool(lower)


def cho_solve(c_and_lower, b, overwrite_b=False, check_finite=True):
    """``scipy.linalg.cho_solve``: solve ``a x = b`` given ``cho_factor(a)``: two triangular solves.
    Where the trace factored ``a`` itself, the solve is an op of ``a`` (its gradient goes to ``a``
    directly, through ``a^-1``, instead of back through the factorisation)."""
    c, lower = c_and_lower
    c, b, vector = _system("cho_solve", c, b)
    lower = bool(lower)
    a = _factored_matrix(c, lower)
    if a is not None:
        return _column_back(A.bind("cho_solve", [a, c, b], lower=lower), vector)
    y = A.bind("solve_triangular", [c, b], lower=lower, trans=not lower)
    return _column_back(A.bind("solve_triangular", [c, y], lower=lower, trans=lower), vector)


def _factored_matrix(c, lower: bool):
    """The traced matrix whose Cholesky factor ``c`` is, when the trace made ``c`` by ``cholesky``
    (``lower``) or as the transpose of that (upper); else None."""
    made = _producer(c)
    if made is not None and not lower and _swaps_last_axes(made):
        made, lower = _producer(Tracer(c.trace, made.inputs[0])), True
    if made is None or made.op != "cholesky" or not lower:
        return None
    return Tracer(c.trace, made.inputs[0])


def _swaps_last_axes(b) -> bool:
    """Whether the binding ``b`` transposes the last two axes (and only those)."""
    if b.op != "transpose":
        return False
    perm = b.kwargs["perm"]
    return perm == tuple(range(len(perm) - 2)) + (len(perm) - 1, len(perm) - 2)


def _producer(x):
    """The binding that made the traced value ``x`` (None for an input, a constant or an array)."""
    if not isinstance(x, Tracer):
        return None
    return next((b for b in reversed(x.trace.bindings) if b.out is x.operand), None)


def solve(a, b):
    """``np.linalg.solve``: ``x`` with ``a @ x = b`` (LU with partial pivoting). A 1-D ``b`` is
    one right-hand side; raises ``LinAlgError`` when ``a`` is singular."""
    a, b, vector = _system("solve", a, b)
    return _column_back(A.bind("solve", [a, b]), vector)


def inv(a):
    """``np.linalg.inv``; raises ``LinAlgError`` when ``a`` is singular."""
    return A.bind("inv", [_matrix("inv", a)])


def det(a):
    """``np.linalg.det`` (its gradient uses the inverse: prefer ``slogdet``)."""
    return A.bind("det", [_matrix("det", a)])


def slogdet(a):
    """``np.linalg.slogdet``: ``(sign, logabsdet)`` of all of ``a``, differentiable in
    ``logabsdet``. Of a matrix the trace has already factored by ``cholesky`` (either triangle),
    an op that takes the factor's diagonal, and for the gradient the inverse from the factor,
    where the step finds ``a`` symmetric to rounding, and LU otherwise."""
    a = _matrix("slogdet", a)
    factor = _cholesky_factor_of(a)
    packed = A.bind("slogdet", [a]) if factor is None else A.bind("factored_slogdet", [a, factor])
    return SlogdetResult(getitem(packed, (Ellipsis, 0)), getitem(packed, (Ellipsis, 1)))


def _cholesky_factor_of(a):
    """The lower Cholesky factor the trace has made of the traced matrix ``a`` or of its
    transpose (``cholesky(a, upper=True)``, ``cho_factor(a)``); else None."""
    if not isinstance(a, Tracer):
        return None
    transposes = {id(b.out) for b in a.trace.bindings if _swaps_last_axes(b) and b.inputs[0] is a.operand}
    made = next((b for b in a.trace.bindings if b.op == "cholesky"
                 and (b.inputs[0] is a.operand or id(b.inputs[0]) in transposes)), None)
    return None if made is None else Tracer(a.trace, made.out)


def eigh(a, UPLO="L"):
    """``np.linalg.eigh``: ascending eigenvalues and eigenvectors (columns) of the symmetric
    matrix in the lower (``UPLO='L'``) or upper (``'U'``) triangle of ``a``."""
    uplo = str(UPLO).upper()
    if uplo not in ("L", "U"):
        raise ValueError(f"eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    a = _matrix("eigh", a)
    if uplo == "U":   # the upper triangle of a is the lower one of a.T
        a = A.swap_last(a)
    packed = A.bind("eigh", [a])
    return EighResult(getitem(packed, (Ellipsis, 0, slice(None))),
                      getitem(packed, (Ellipsis, slice(1, None), slice(None))))


def eigvalsh(a, UPLO="L"):
    """``np.linalg.eigvalsh``: the ascending eigenvalues of symmetric ``a``."""
    return eigh(a, UPLO).eigenvalues


def qr(a, mode="reduced"):
    """``np.linalg.qr`` in its reduced mode, for matrices with at least as many rows as columns."""
    if mode != "reduced":
        raise UnsupportedError(f"qr(mode={mode!r}) is not supported (mode='reduced' is)", user_location())
    a = _matrix("qr", a)
    packed = A.bind("qr", [a])
    m, n = a.shape[-2:]
    return QRResult(A.swap_last(getitem(packed, (Ellipsis, slice(None), slice(0, m)))),
                    getitem(packed, (Ellipsis, slice(None), slice(m, m + n))))


def lstsq(a, b, rcond=None):
    """``np.linalg.lstsq`` for ``a`` of full column rank (m >= n), by reduced QR:
    ``(x, residuals, rank, s)``, ``rank`` being ``n`` and ``s`` the singular values (from the
    eigenvalues of ``R^T R``). A rank-deficient ``a`` is outside its contract."""
    a, b, vector = _system_rectangular("lstsq", a, b)
    q, r = qr(a)
    x = A.bind("solve_triangular", [r, A.swap_last(q) @ b], lower=False, trans=False)
    m, n = a.shape[-2:]
    residuals = A.sum((a @ x - b) ** 2, axis=-2) if m > n else np.zeros((0,), a.dtype)
    s = A.sqrt(getitem(eigvalsh(A.swap_last(r) @ r), (Ellipsis, slice(None, None, -1))))
    return _column_back(x, vector), residuals, n, s


def _system_rectangular(op: str, a, b):
    a, b = _matrix(op, a), _array(b)
    dtype = np.result_type(a.dtype, b.dtype)
    a, b = A.astype(a, dtype), A.astype(b, dtype)
    if a.shape[-2] < a.shape[-1]:
        raise ShapeError(f"{op}: needs at least as many rows as columns (full column rank), got shape {a.shape}",
                         user_location())
    vector = b.ndim == 1
    return a, (A.expand_dims(b, -1) if vector else b), vector


def pinv(a, rcond=None, hermitian=False, *, rtol=A.NOT_GIVEN):
    """``np.linalg.pinv`` for ``a`` of full rank, by reduced QR of ``a`` (or of its transpose
    when it has fewer rows than columns): no singular value is cut, whatever ``rcond`` (or its
    array-API name ``rtol``) says."""
    if rcond is not None and rtol is not A.NOT_GIVEN:
        raise ValueError("pinv: `rtol` and `rcond` can't be both set.")
    a = _matrix("pinv", a)
    wide = a.shape[-2] < a.shape[-1]
    q, r = qr(A.swap_last(a) if wide else a)
    result = A.bind("solve_triangular", [r, A.swap_last(q)], lower=False, trans=False)
    return A.swap_last(result) if wide else result


def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """``np.linalg.svd``: ``(U, S, Vh)`` with ``a = U @ (S[..., None] * Vh)`` and descending ``S``;
    of ``k = min(m, n)`` columns of ``U`` and rows of ``Vh`` unless ``full_matrices`` (square ones);
    ``S`` alone unless ``compute_uv`` (the op computes ``U`` and ``Vh`` all the same: the gradient
    needs them). The gradient through ``U`` and ``V`` is undefined where
    singular values repeat, and through the columns of a full ``U`` (rows of ``Vh``) beyond k: it
    is then NaN or inf, see ``morphjit.ops.svd``."""
    if hermitian:
        raise UnsupportedError("svd(hermitian=True) is not supported (hermitian=False is; np.linalg.eigh "
                               "decomposes a symmetric matrix)", user_location())
    a = _matrix("svd", a)
    m, n = a.shape[-2:]
    full = bool(full_matrices) and bool(compute_uv) and m != n
    u, s, vh = svd_parts(A.bind("svd", [a], full=full), m, n, full)
    return SVDResult(u, s, vh) if compute_uv else s


def svdvals(x, /):
    """``np.linalg.svdvals``: the singular values of ``x``, descending."""
    return svd(x, compute_uv=False)


def svd_rows(m: int, n: int, full: bool) -> tuple[int, int]:
    """The number of columns of ``U`` and of rows of ``Vh`` in the ``svd`` op's output."""
    return (m, n) if full else (min(m, n), min(m, n))


def svd_parts(packed, m: int, n: int, full: bool):
    """``(U, s, Vh)`` of the ``svd`` op's packed output (or of a cotangent of it)."""
    u_rows, _ = svd_rows(m, n, full)
    u = A.swap_last(getitem(packed, (Ellipsis, slice(0, u_rows), slice(0, m))))
    s = getitem(packed, (Ellipsis, u_rows, slice(0, min(m, n))))
    return u, s, getitem(packed, (Ellipsis, slice(u_rows + 1, None), slice(0, n)))


FUNCTIONS = {
    np.linalg.cholesky: cholesky, np.linalg.solve: solve, np.linalg.inv: inv, np.linalg.det: det,
    np.linalg.slogdet: slogdet, np.linalg.eigh: eigh, np.linalg.eigvalsh: eigvalsh, np.linalg.qr: qr,
    np.linalg.lstsq: lstsq, np.linalg.pinv: pinv, np.linalg.svd: svd, np.linalg.svdvals: svdvals,
}

