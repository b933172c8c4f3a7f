"""Linear algebra: the LAPACK-backed ops, their VJP rules and the functions users call.

``mj.linalg.cholesky``, ``solve``, ``inv``, ``det``, ``slogdet``, ``eigh``, ``eigvalsh``, ``qr``,
``lstsq`` and ``pinv`` (full rank, through QR), also reached by plain ``np.linalg.*`` calls on
traced arrays; ``solve_triangular``, ``cho_factor`` and ``cho_solve`` with SciPy's signatures;
``triangular_matmul`` (BLAS ``trmm``). Each op works on the last two axes (the core) and batches
over the leading ones, broadcast between operands as NumPy does. Selection makes each one a
``Lapack`` instruction: one LAPACK call per batch element, like a GEMM.

The VJP rules are the published matrix-calculus results written with traced ops, so they fuse and
plan like every other rule: Cholesky by Murray (2016), the solves and inverses by Giles (2008),
eigh by the F-matrix form (a zero where two eigenvalues are exactly equal, so the gradient stays
finite; it is the gradient of a function that does not rotate within the repeated eigenspace),
reduced QR (m >= n) by Walter, Lehmann and Lamour (2012). ``eigh`` and ``qr`` return two arrays
and ``slogdet`` two numbers: their op packs both into one array, which views split.

Errors: a matrix that is not positive definite (cholesky) or is singular (solve, inv, a zero on a
triangular diagonal) raises ``numpy.linalg.LinAlgError`` from the call, on both backends, as
NumPy does; NaN input gives NaN results, as in NumPy.
"""
from __future__ import annotations

import sys
from collections import namedtuple

import numpy as np
import scipy.linalg

from . import array_api as A
from .errors import DtypeError, ShapeError, UnsupportedError, user_location
from .ir import TensorType, is_float
from .numpy_index import getitem
from .ops import LINALG, OPS, broadcast_shapes, defop, same_dtype
from .trace import TWIN_NAMESPACES, Tracer

SlogdetResult = namedtuple("SlogdetResult", "sign logabsdet")
EighResult = namedtuple("EighResult", "eigenvalues eigenvectors")
QRResult = namedtuple("QRResult", "Q R")


# ---------------------------------------------------------------------------------------------
# Shape rules: the core is the last two axes (one for a vector right-hand side); the rest batch.

def _square(op: str, t: TensorType) -> int:
    if not is_float(t.dtype):
        raise DtypeError(f"{op}: expected a float32 or float64 matrix, got {t.dtype}")
    if t.ndim < 2 or t.shape[-1] != t.shape[-2]:
        raise ShapeError(f"{op}: expected square matrices in the last two axes, got shape {t.shape}")
    return t.shape[-1]


def _square_rule(op: str, out_core):
    """One square operand; the output's core shape is ``out_core(n)``."""
    def infer(types, **params):
        (a,) = types
        n = _square(op, a)
        return TensorType(a.shape[:-2] + out_core(n), a.dtype)
    return infer


def _system_rule(op: str):
    """A square system ``a [..., n, n]`` and right-hand sides ``b [..., n, k]``."""
    def infer(types, **params):
        a, b = types
        n = _square(op, a)
        dtype = same_dtype(op, types)
        if b.ndim < 2 or b.shape[-2] != n:
            raise ShapeError(f"{op}: right-hand sides of shape {b.shape} do not fit matrices of shape {a.shape}")
        batch = broadcast_shapes(op, a.shape[:-2], b.shape[:-2])
        return TensorType(batch + b.shape[-2:], dtype)
    return infer


def _qr_rule(types):
    (a,) = types
    if not is_float(a.dtype) or a.ndim < 2:
        raise ShapeError(f"qr: expected float matrices in the last two axes, got {a}")
    m, n = a.shape[-2:]
    if m < n:
        raise ShapeError(f"qr: the gradient of QR needs at least as many rows as columns, got shape {a.shape}")
    return TensorType(a.shape[:-2] + (n, m + n), a.dtype)


# ---------------------------------------------------------------------------------------------
# Reference implementations (the interp backend, and eager calls on NumPy arrays)

def _batched(fn, *arrays):
    """``fn`` applied to each batch element of the matrices ``arrays`` (broadcast over the
    leading axes)."""
    batch = np.broadcast_shapes(*(x.shape[:-2] for x in arrays))
    arrays = [np.broadcast_to(x, batch + x.shape[-2:]) for x in arrays]
    results = [fn(*(x[i] for x in arrays)) for i in np.ndindex(*batch)]
    return np.stack(results).reshape(batch + results[0].shape) if batch else results[0]


def _solve_triangular(a, b, lower, trans):
    return _batched(lambda a, b: scipy.linalg.solve_triangular(a, b, lower=lower, trans=int(trans),
                                                               check_finite=False), a, b)


def _triangular_matmul(a, b, lower, trans):
    t = np.tril(a) if lower else np.triu(a)
    return np.matmul(np.swapaxes(t, -1, -2) if trans else t, b)


def _slogdet(a):
    sign, logdet = np.linalg.slogdet(a)
    return np.stack([sign, logdet], axis=-1).astype(a.dtype)


def _eigh(a):
    w, v = np.linalg.eigh(a)
    return np.concatenate([w[..., None, :], v], axis=-2)


def _qr(a):
    q, r = np.linalg.qr(a)
    return np.concatenate([np.swapaxes(q, -1, -2), r], axis=-1)


# ---------------------------------------------------------------------------------------------
# VJP rules

def _tril_mask(n: int, k: int = 0) -> np.ndarray:
    return np.tril(np.ones((n, n), bool), k)


def _tril(x, k=0):
    return A.where(_tril_mask(x.shape[-1], k), x, 0.0)


def _triu(x, k=0):
    return A.where(_tril_mask(x.shape[-1], k - 1), 0.0, x)


def _sym(x):
    return (x + A.swap_last(x)) * 0.5


def _cholesky_vjp(g, L, a):
    """Murray (2016): abar = sym(L^-T Phi(L^T g) L^-1), Phi = lower triangle, diagonal halved."""
    halve_diagonal = 1.0 - 0.5 * np.eye(L.shape[-1], dtype=L.dtype)
    phi = _tril(_apply("triangular_matmul", [L, g], lower=True, trans=True)) * halve_diagonal
    right = A.swap_last(solve_triangular(L, A.swap_last(phi), lower=True, trans="T"))
    return (_sym(solve_triangular(L, right, lower=True, trans="T")),)


def _solve_triangular_vjp(g, x, a, b, lower, trans):
    gb = _apply("solve_triangular", [a, g], lower=lower, trans=not trans)
    ga = -(x @ A.swap_last(gb)) if trans else -(gb @ A.swap_last(x))
    return (_tril(ga) if lower else _triu(ga)), gb


def _triangular_matmul_vjp(g, ans, a, b, lower, trans):
    gb = _apply("triangular_matmul", [a, g], lower=lower, trans=not trans)
    ga = b @ A.swap_last(g) if trans else g @ A.swap_last(b)
    return (_tril(ga) if lower else _triu(ga)), gb


def _solve_vjp(g, x, a, b):
    gb = _apply("solve", [A.swap_last(a), g])
    return -(gb @ A.swap_last(x)), gb


def _inv_vjp(g, ans, a):
    t = A.swap_last(ans)
    return (-(t @ g @ t),)


def _det_vjp(g, ans, a):
    return (A.expand_dims(A.expand_dims(g * ans, -1), -1) * A.swap_last(inv(a)),)


def _slogdet_vjp(g, ans, a):
    glog = getitem(g, (Ellipsis, slice(1, 2), None))   # the sign is piecewise constant
    return (glog * A.swap_last(inv(a)),)


def _eigh_vjp(g, ans, a):
    """abar = V (diag(gw) + F * (V^T gV)) V^T, F_ij = 1 / (w_j - w_i) off the diagonal (0 where
    they are equal); then symmetrised (eigh reads one triangle of a symmetric matrix)."""
    n = a.shape[-1]
    w, v = getitem(ans, (Ellipsis, 0, slice(None))), getitem(ans, (Ellipsis, slice(1, None), slice(None)))
    gw, gv = getitem(g, (Ellipsis, 0, slice(None))), getitem(g, (Ellipsis, slice(1, None), slice(None)))
    gap = A.expand_dims(w, -2) - A.expand_dims(w, -1)
    f = A.where(gap == 0.0, 0.0, 1.0 / A.where(gap == 0.0, 1.0, gap))
    inner = A.expand_dims(gw, -1) * np.eye(n, dtype=a.dtype) + f * (A.swap_last(v) @ gv)
    return (_sym(v @ inner @ A.swap_last(v)),)


def _qr_vjp(g, ans, a):
    """Reduced QR, m >= n: abar = (gQ + Q copyltu(M)) R^-T, M = R gR^T - gQ^T Q."""
    m, n = a.shape[-2:]
    q = A.swap_last(getitem(ans, (Ellipsis, slice(None), slice(0, m))))
    r = getitem(ans, (Ellipsis, slice(None), slice(m, m + n)))
    gq = A.swap_last(getitem(g, (Ellipsis, slice(None), slice(0, m))))
    gr = getitem(g, (Ellipsis, slice(None), slice(m, m + n)))
    mm = r @ A.swap_last(gr) - A.swap_last(gq) @ q
    copyltu = _tril(mm) + A.swap_last(_tril(mm, -1))
    rhs = gq + q @ copyltu
    return (A.swap_last(solve_triangular(r, A.swap_last(rhs), lower=False)),)


# ---------------------------------------------------------------------------------------------
# The op table entries (core: the core rank of each operand, then of the output)

defop("cholesky", LINALG, _square_rule("cholesky", lambda n: (n, n)), np.linalg.cholesky,
      _cholesky_vjp, core=(2, 2))
defop("solve_triangular", LINALG, _system_rule("solve_triangular"), _solve_triangular,
      _solve_triangular_vjp, core=(2, 2, 2))
defop("triangular_matmul", LINALG, _system_rule("triangular_matmul"), _triangular_matmul,
      _triangular_matmul_vjp, core=(2, 2, 2))
defop("solve", LINALG, _system_rule("solve"), np.linalg.solve, _solve_vjp, core=(2, 2, 2))
defop("inv", LINALG, _square_rule("inv", lambda n: (n, n)), np.linalg.inv, _inv_vjp, core=(2, 2))
defop("det", LINALG, _square_rule("det", lambda n: ()), np.linalg.det, _det_vjp, core=(2, 0))
defop("slogdet", LINALG, _square_rule("slogdet", lambda n: (2,)), _slogdet, _slogdet_vjp, core=(2, 1))
defop("eigh", LINALG, _square_rule("eigh", lambda n: (n + 1, n)), _eigh, _eigh_vjp, core=(2, 2))
defop("qr", LINALG, _qr_rule, _qr, _qr_vjp, core=(2, 2))


# ---------------------------------------------------------------------------------------------
# The functions users call

def _apply(op_name: str, operands, **params):
    """Bind on traced operands, or compute with the reference implementation."""
    traced = next((x for x in operands if isinstance(x, Tracer)), None)
    if traced is not None:
        return traced.trace.bind(op_name, operands, **params)
    return np.asarray(OPS[op_name].impl(*operands, **params))


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


def cholesky(a, upper=False):
    """The lower Cholesky factor ``L`` of ``a = L @ L.T`` (``upper=True``: ``L.T``). Reads the
    lower triangle of ``a``; raises ``LinAlgError`` unless ``a`` is positive definite."""
    L = _apply("cholesky", [_matrix("cholesky", a)])
    return A.swap_last(L) if upper else L


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False,
                     check_finite=True):
    """``scipy.linalg.solve_triangular``: solve ``op(a) x = b`` for triangular ``a`` (``trans``
    0/'N', 1/'T' or 2/'C'), reading only the ``lower`` or upper triangle."""
    if unit_diagonal:
        raise UnsupportedError("solve_triangular(unit_diagonal=True) is not supported", user_location())
    transposed = {0: False, 1: True, 2: True, "N": False, "T": True, "C": True}.get(trans)
    if transposed is None:
        raise ValueError(f"solve_triangular: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}")
    a, b, vector = _system("solve_triangular", a, b)
    return _column_back(_apply("solve_triangular", [a, b], lower=bool(lower), trans=transposed), vector)


def triangular_matmul(a, b, lower=False, trans=False):
    """``op(a) @ b`` reading only the ``lower`` or upper triangle of ``a`` (BLAS ``trmm``: half
    the work of a matrix product); ``op`` is a transpose where ``trans``."""
    a, b, vector = _system("triangular_matmul", a, b)
    return _column_back(_apply("triangular_matmul", [a, b], lower=bool(lower), trans=bool(trans)), vector)


def cho_factor(a, lower=False, overwrite_a=False, check_finite=True):
    """``scipy.linalg.cho_factor``: ``(c, lower)``, the Cholesky factor in the triangle
    ``lower`` names (the other triangle is zero, where SciPy leaves garbage)."""
    return cholesky(a, upper=not lower), bool(lower)


def cho_solve(c_and_lower, b, overwrite_b=False, check_finite=True):
    """``scipy.linalg.cho_solve``: solve ``a x = b`` given ``cho_factor(a)``: two triangular solves."""
    c, lower = c_and_lower
    c, b, vector = _system("cho_solve", c, b)
    lower = bool(lower)
    y = _apply("solve_triangular", [c, b], lower=lower, trans=not lower)
    return _column_back(_apply("solve_triangular", [c, y], lower=lower, trans=lower), vector)


def solve(a, b):
    """``np.linalg.solve``: ``x`` with ``a @ x = b`` (LU with partial pivoting). A 1-D ``b`` is
    one right-hand side; raises ``LinAlgError`` when ``a`` is singular."""
    a, b, vector = _system("solve", a, b)
    return _column_back(_apply("solve", [a, b]), vector)


def inv(a):
    """``np.linalg.inv``; raises ``LinAlgError`` when ``a`` is singular."""
    return _apply("inv", [_matrix("inv", a)])


def det(a):
    """``np.linalg.det`` (its gradient uses the inverse: prefer ``slogdet``)."""
    return _apply("det", [_matrix("det", a)])


def slogdet(a):
    """``np.linalg.slogdet``: ``(sign, logabsdet)``, differentiable in ``logabsdet``."""
    packed = _apply("slogdet", [_matrix("slogdet", a)])
    return SlogdetResult(getitem(packed, (Ellipsis, 0)), getitem(packed, (Ellipsis, 1)))


def eigh(a, UPLO="L"):
    """``np.linalg.eigh``: ascending eigenvalues and eigenvectors (columns) of symmetric ``a``."""
    if UPLO != "L":
        raise UnsupportedError("eigh(UPLO='U') is not supported: pass the symmetric matrix", user_location())
    packed = _apply("eigh", [_matrix("eigh", a)])
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
    packed = _apply("qr", [a])
    m, n = a.shape[-2:]
    return QRResult(A.swap_last(getitem(packed, (Ellipsis, slice(None), slice(0, m)))),
                    getitem(packed, (Ellipsis, slice(None), slice(m, m + n))))


def lstsq(a, b, rcond=None):
    """``np.linalg.lstsq`` for ``a`` of full column rank (m >= n), by reduced QR:
    ``(x, residuals, rank, s)``, ``rank`` being ``n`` and ``s`` the singular values (from the
    eigenvalues of ``R^T R``). A rank-deficient ``a`` is outside its contract."""
    a, b, vector = _system_rectangular("lstsq", a, b)
    q, r = qr(a)
    x = _apply("solve_triangular", [r, A.swap_last(q) @ b], lower=False, trans=False)
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


def pinv(a, rcond=None, hermitian=False):
    """``np.linalg.pinv`` for ``a`` of full rank, by reduced QR of ``a`` (or of its transpose
    when it has fewer rows than columns)."""
    a = _matrix("pinv", a)
    wide = a.shape[-2] < a.shape[-1]
    q, r = qr(A.swap_last(a) if wide else a)
    result = _apply("solve_triangular", [r, A.swap_last(q)], lower=False, trans=False)
    return A.swap_last(result) if wide else result


A.FUNCTIONS.update({
    np.linalg.cholesky: cholesky, np.linalg.solve: solve, np.linalg.inv: inv, np.linalg.det: det,
    np.linalg.slogdet: slogdet, np.linalg.eigh: eigh, np.linalg.eigvalsh: eigvalsh, np.linalg.qr: qr,
    np.linalg.lstsq: lstsq, np.linalg.pinv: pinv,
})


TWIN_NAMESPACES["scipy.linalg"] = ("mj.linalg", sys.modules[__name__])
