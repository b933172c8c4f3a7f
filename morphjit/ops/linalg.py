"""The linear-algebra ops: shape rules, reference implementations, VJP rules and op table entries.

Each op works on the last two axes (the core) and batches over the leading ones, broadcast
between operands as NumPy does. Selection makes each one a ``Lapack`` instruction: one LAPACK
call per batch element, like a GEMM; the reference implementations serve the interp backend.

The VJP rules are the published matrix-calculus results written with traced ops, so they fuse and
plan like every other rule: Cholesky by Murray (2016), the solves and inverses by Giles (2008),
eigh by the F-matrix form (a zero where two eigenvalues are exactly equal, so the gradient stays
finite; it is the gradient of a function that does not rotate within the repeated eigenspace),
reduced QR (m >= n) by Walter, Lehmann and Lamour (2012). ``eigh`` and ``qr`` return two arrays
and ``slogdet`` two numbers: their op packs both into one array, which views split.

Three rules see structure that the general ones would spend cubic work on: ``cho_solve`` of a
matrix with its own factor (``x = a^-1 b``) sends its gradient to the matrix through ``a^-1``,
not back through the factor; a Cholesky cotangent that is diagonal by construction (the factor
read on its diagonal, as in a log-determinant) takes Murray's rule in closed form; and
``factored_slogdet`` and ``factored_inv`` of a matrix with its own factor are NumPy's ``slogdet``
and ``inv`` of the whole matrix, from the factor where the matrix is symmetric to rounding (a
test at run time, per matrix) and by LU otherwise, so their gradients are NumPy's.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from .. import api as A
from ..api import getitem
from ..ir import LINALG, Lit, TensorType, broadcast_shapes, defop, is_float, same_dtype
from ..util import DtypeError, ShapeError


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


def _factored_system_rule(types, lower):
    """``a [..., n, n]``, its Cholesky factor ``c`` (same shape) and right-hand sides ``b``."""
    a, c, b = types
    if a.shape != c.shape:
        raise ShapeError(f"cho_solve: a factor of shape {c.shape} does not fit matrices of shape {a.shape}")
    return _system_rule("cho_solve")([c, b])


def _factored_square_rule(op: str, out_core):
    """A square ``a [..., n, n]`` and its Cholesky factor ``c`` (same shape)."""
    infer = _square_rule(op, out_core)

    def infer_factored(types, **params):
        a, c = types
        if a.shape != c.shape or a.dtype != c.dtype:
            raise ShapeError(f"{op}: a factor {c} does not fit matrices {a}")
        return infer([a])
    return infer_factored


def _weighted_gram_rule(types):
    """A lower-triangular ``w [..., n, n]`` and weights ``e [..., n]``."""
    w, e = types
    n = _square("weighted_gram", w)
    dtype = same_dtype("weighted_gram", types)
    if e.ndim < 1 or e.shape[-1] != n:
        raise ShapeError(f"weighted_gram: weights of shape {e.shape} do not fit matrices of shape {w.shape}")
    return TensorType(broadcast_shapes("weighted_gram", w.shape[:-2], e.shape[:-1]) + (n, n), dtype)


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


def _triangular_inverse(a, lower):
    eye = np.eye(a.shape[-1], dtype=a.dtype)
    return _solve_triangular(a, np.broadcast_to(eye, a.shape), lower, False)


def _weighted_gram(w, e):
    lower = np.tril(w)
    return np.swapaxes(lower, -1, -2) @ (e[..., None] * lower)


def _cho_solve(a, c, b, lower):
    y = _solve_triangular(c, b, lower, not lower)
    return _solve_triangular(c, y, lower, lower)


def _slogdet(a):
    sign, logdet = np.linalg.slogdet(a)
    return np.stack([sign, logdet], axis=-1).astype(a.dtype)


def _symmetric_to_rounding(a) -> bool:
    """Whether the finite matrix ``a`` is symmetric up to the backward error of its Cholesky
    factorisation: ``|a_ij - a_ji| <= n eps sqrt(a_ii a_jj)`` (what a GEMM building ``x @ x.T``
    may leave; the factor of either triangle is then one of ``a`` as accurate as LU's). The
    numba kernels apply the same test."""
    n = a.shape[-1]
    scale = np.sqrt(np.abs(np.diagonal(a)))
    bound = n * np.finfo(a.dtype).eps * (scale[:, None] * scale[None, :])
    return bool(np.all(np.isfinite(a)) and np.all(np.abs(a - a.T) <= bound))


def _where_symmetric(from_factor, by_lu):
    """The reference of an op of matrices ``a`` and their lower Cholesky factors ``c``:
    ``from_factor(c)`` for each matrix symmetric to rounding, ``by_lu(a)`` for the others."""
    return lambda a, c: _batched(lambda a, c: from_factor(c) if _symmetric_to_rounding(a) else by_lu(a), a, c)


def _slogdet_from_factor(c):
    return np.array([1.0, 2.0 * np.sum(np.log(np.diagonal(c)))], c.dtype)


def _inv_from_factor(c):
    w = _triangular_inverse(c, True)
    return w.T @ w


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


def _read_from_lower(g):
    """The gradient ``g`` of a function of a symmetric matrix, as a function of the lower triangle
    it is read from (cholesky, eigh, cho_solve read nothing else): each off-diagonal cotangent of
    the upper triangle goes to its mirror in the lower one, the upper triangle gets none."""
    return _tril(g + A.swap_last(g), -1) + g * np.eye(g.shape[-1], dtype=g.dtype)


def _cholesky_vjp(g, L, a):
    """Murray (2016): abar = L^-T Phi(L^T g) L^-1 read from the lower triangle, Phi = lower
    triangle, diagonal halved."""
    if _zero_off_diagonal(g):
        return (_read_from_lower(_diagonal_cholesky_vjp(g, L)),)
    halve_diagonal = 1.0 - 0.5 * np.eye(L.shape[-1], dtype=L.dtype)
    phi = _tril(A.bind("triangular_matmul", [L, g], lower=True, trans=True)) * halve_diagonal
    right = A.swap_last(A.bind("solve_triangular", [L, A.swap_last(phi)], lower=True, trans=True))
    return (_read_from_lower(A.bind("solve_triangular", [L, right], lower=True, trans=True)),)


def _diagonal_cholesky_vjp(g, L):
    """Murray's rule for a diagonal ``g`` (the factor read on its diagonal, as in a log-determinant):
    Phi(L^T g) = diag(e) / 2 with e = diag(g) diag(L), so abar = W^T diag(e) W / 2 with W = L^-1:
    a trtri and a lauum (n^3 / 3 each) where the general rule needs a trmm and two solves (3 n^3)."""
    eye = np.eye(L.shape[-1], dtype=L.dtype)
    e = A.sum(g * L * eye, axis=-1) * 0.5
    return A.bind("weighted_gram", [A.bind("triangular_inverse", [L], lower=True), e])


def _zero_off_diagonal(x) -> bool:
    """Whether the traced matrix ``x`` is zero off the diagonal of its last two axes by
    construction: a captured array that is, a product with such a value, a sum or matrix product
    of such values (the cotangent of a read of a diagonal: ``L * eye``, ``np.diag(L)``)."""
    made = {id(b.out): b for b in x.trace.bindings}
    captured = {id(var): array for var, array in x.trace.consts}
    n = x.shape[-1]

    def diagonal(v) -> bool:
        if isinstance(v, Lit):
            return v.value == 0
        if v.shape[-2:] != (n, n):   # a smaller operand would broadcast off the diagonal
            return False
        if id(v) in captured:
            return not np.any(captured[id(v)] * (1 - np.eye(n)))
        b = made.get(id(v))
        if b is None:
            return False
        if b.op == "mul":
            return any(diagonal(u) for u in b.inputs)
        if b.op in ("add", "sub", "matmul"):
            return all(diagonal(u) for u in b.inputs)
        if b.op == "neg":
            return diagonal(b.inputs[0])
        return False

    return diagonal(x.operand)


def _cho_solve_vjp(g, x, a, c, b, lower):
    """x = a^-1 b, ``c`` being the Cholesky factor of ``a`` (of its lower triangle): abar =
    -bbar x^T read from the lower triangle, bbar = a^-1 g (Giles 2008). The factor gets no
    cotangent: its dependence on ``a`` is accounted for here, so reverse mode does not go through
    the factorisation for this use."""
    gb = A.bind("cho_solve", [a, c, g], lower=lower)
    return -_read_from_lower(gb @ A.swap_last(x)), None, gb


def _solve_triangular_vjp(g, x, a, b, lower, trans):
    gb = A.bind("solve_triangular", [a, g], lower=lower, trans=not trans)
    ga = -(x @ A.swap_last(gb)) if trans else -(gb @ A.swap_last(x))
    return (_tril(ga) if lower else _triu(ga)), gb


def _triangular_matmul_vjp(g, ans, a, b, lower, trans):
    gb = A.bind("triangular_matmul", [a, g], lower=lower, trans=not trans)
    ga = b @ A.swap_last(g) if trans else g @ A.swap_last(b)
    return (_tril(ga) if lower else _triu(ga)), gb


def _triangular_inverse_vjp(g, w, a, lower):
    """w = a^-1: abar = -w^T g w^T, masked to the triangle read."""
    gw = A.bind("triangular_matmul", [w, g], lower=lower, trans=True)
    ga = -A.swap_last(A.bind("triangular_matmul", [w, A.swap_last(gw)], lower=lower, trans=False))
    return ((_tril(ga) if lower else _triu(ga)),)


def _weighted_gram_vjp(g, ans, w, e):
    """G = W^T diag(e) W, W = tril(w): wbar = tril(diag(e) W (g + g^T)), ebar_k = (W g W^T)_kk."""
    lower = _tril(w)
    return _tril(A.expand_dims(e, -1) * (lower @ (g + A.swap_last(g)))), A.sum((lower @ g) * lower, axis=-1)


def _solve_vjp(g, x, a, b):
    gb = A.bind("solve", [A.swap_last(a), g])
    return -(gb @ A.swap_last(x)), gb


def _inv_vjp(g, ans, a):
    t = A.swap_last(ans)
    return (-(t @ g @ t),)


def _det_vjp(g, ans, a):
    return (A.expand_dims(A.expand_dims(g * ans, -1), -1) * A.swap_last(A.bind("inv", [a])),)


def _slogdet_vjp(g, ans, a):
    return (_logabsdet_cotangent(g) * A.swap_last(A.bind("inv", [a])),)


def _logabsdet_cotangent(g):
    """The cotangent of ``logabsdet`` in a packed ``(sign, logabsdet)``, shaped to scale a matrix
    (the sign is piecewise constant)."""
    return getitem(g, (Ellipsis, slice(1, 2), None))


def _factored_slogdet_vjp(g, ans, a, c):
    """NumPy's ``slogdet`` rule, the inverse from the factor where it can be; the factor gets no
    cotangent (the value is a function of ``a`` alone)."""
    return _logabsdet_cotangent(g) * A.swap_last(A.bind("factored_inv", [a, c])), None


def _factored_inv_vjp(g, ans, a, c):
    return _inv_vjp(g, ans, a)[0], None


def _eigh_vjp(g, ans, a):
    """abar = V (diag(gw) + F * (V^T gV)) V^T, F_ij = 1 / (w_j - w_i) off the diagonal (0 where
    they are equal), read from the lower triangle (all that eigh reads)."""
    n = a.shape[-1]
    w, v = getitem(ans, (Ellipsis, 0, slice(None))), getitem(ans, (Ellipsis, slice(1, None), slice(None)))
    gw, gv = getitem(g, (Ellipsis, 0, slice(None))), getitem(g, (Ellipsis, slice(1, None), slice(None)))
    gap = A.expand_dims(w, -2) - A.expand_dims(w, -1)
    f = A.where(gap == 0.0, 0.0, 1.0 / A.where(gap == 0.0, 1.0, gap))
    inner = A.expand_dims(gw, -1) * np.eye(n, dtype=a.dtype) + f * (A.swap_last(v) @ gv)
    return (_read_from_lower(v @ inner @ A.swap_last(v)),)


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
    return (A.swap_last(A.bind("solve_triangular", [r, A.swap_last(rhs)], lower=False, trans=False)),)


# ---------------------------------------------------------------------------------------------
# The op table entries (core: the core rank of each operand, then of the output)

defop("cholesky", LINALG, _square_rule("cholesky", lambda n: (n, n)), np.linalg.cholesky,
      _cholesky_vjp, core=(2, 2))
defop("solve_triangular", LINALG, _system_rule("solve_triangular"), _solve_triangular,
      _solve_triangular_vjp, core=(2, 2, 2))
defop("cho_solve", LINALG, _factored_system_rule, _cho_solve, _cho_solve_vjp, core=(2, 2, 2, 2))
defop("triangular_matmul", LINALG, _system_rule("triangular_matmul"), _triangular_matmul,
      _triangular_matmul_vjp, core=(2, 2, 2))
defop("triangular_inverse", LINALG, _square_rule("triangular_inverse", lambda n: (n, n)), _triangular_inverse,
      _triangular_inverse_vjp, core=(2, 2))
defop("weighted_gram", LINALG, _weighted_gram_rule, _weighted_gram, _weighted_gram_vjp, core=(2, 1, 2))
defop("solve", LINALG, _system_rule("solve"), np.linalg.solve, _solve_vjp, core=(2, 2, 2))
defop("inv", LINALG, _square_rule("inv", lambda n: (n, n)), np.linalg.inv, _inv_vjp, core=(2, 2))
defop("det", LINALG, _square_rule("det", lambda n: ()), np.linalg.det, _det_vjp, core=(2, 0))
defop("slogdet", LINALG, _square_rule("slogdet", lambda n: (2,)), _slogdet, _slogdet_vjp, core=(2, 1))
defop("factored_inv", LINALG, _factored_square_rule("factored_inv", lambda n: (n, n)),
      _where_symmetric(_inv_from_factor, np.linalg.inv), _factored_inv_vjp, core=(2, 2, 2))
defop("factored_slogdet", LINALG, _factored_square_rule("factored_slogdet", lambda n: (2,)),
      _where_symmetric(_slogdet_from_factor, _slogdet), _factored_slogdet_vjp, core=(2, 2, 1))
defop("eigh", LINALG, _square_rule("eigh", lambda n: (n + 1, n)), _eigh, _eigh_vjp, core=(2, 2))
defop("qr", LINALG, _qr_rule, _qr, _qr_vjp, core=(2, 2))
