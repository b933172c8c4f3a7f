"""The singular value decomposition: its shape rule, reference implementation, VJP rule and op
table entry (the functions users call, ``np.linalg.svd``, ``svdvals`` and the matrix norms that
need singular values, are in ``morphjit.api.linalg`` and ``morphjit.api.reductions``).

``svd`` of ``a [..., m, n]`` (k = min(m, n)) packs ``U``, ``s`` and ``Vh`` into one array, which
views split (``morphjit.api.linalg.svd_parts``): the columns of ``U`` as rows, then ``s``, then
the rows of ``Vh``, each row padded with zeros to ``max(m, n)``. With ``full``, ``U`` and ``Vh``
are square (m and n rows); without, k each.

The VJP rule is Townsend's (2016) for the reduced decomposition (JAX's and PyTorch's): with
``F_ij = 1 / (s_j^2 - s_i^2)``,
``abar = U [(F o (U^T gU - gU^T U)) S + diag(gs) + S (F o (V^T gV - gV^T V))] V^T
+ (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T)``.
Where two singular values are equal (or one is zero in the last two terms) the gradient through
``U`` and ``V`` is not defined: a term whose numerator is exactly zero (the loss is stationary
under turning the vectors within that subspace, as a function of ``s`` alone is) is zero, any
other is inf or NaN, never a finite number that would be wrong. For the same reason, with ``full`` the gradient
through the columns of ``U`` (rows of ``Vh``) beyond k, an arbitrary basis of the complement, is
NaN wherever their cotangent is not zero.
"""
from __future__ import annotations

import numpy as np

from .. import api as A
from ..ir import LINALG, TensorType, defop, is_float
from ..util import DtypeError, ShapeError


def _svd_rule(types, full):
    (a,) = types
    if not is_float(a.dtype):
        raise DtypeError(f"svd: expected a float32 or float64 matrix, got {a.dtype}")
    if a.ndim < 2 or 0 in a.shape[-2:]:
        raise ShapeError(f"svd: expected non-empty matrices in the last two axes, got shape {a.shape}")
    m, n = a.shape[-2:]
    u_rows, v_rows = A.linalg.svd_rows(m, n, full)
    return TensorType(a.shape[:-2] + (u_rows + 1 + v_rows, max(m, n)), a.dtype)


def _svd(a, full):
    m, n = a.shape[-2:]
    u, s, vh = np.linalg.svd(a, full_matrices=full)
    rows = u.shape[-1]
    out = np.zeros(a.shape[:-2] + (rows + 1 + vh.shape[-2], max(m, n)), a.dtype)
    out[..., :rows, :m] = np.swapaxes(u, -1, -2)
    out[..., rows, :s.shape[-1]] = s
    out[..., rows + 1:, :n] = vh
    return out


def _quotient(num, den):
    """``num / den``, zero where ``num`` is exactly zero whatever ``den`` (inf or NaN only where a
    nonzero numerator meets a zero denominator). The denominator of an unused quotient is one, so
    that differentiating the rule again does not meet 0 / 0 either."""
    unused = num == 0.0
    return A.where(unused, 0.0, num / A.where(unused, 1.0, den))


def _undefined_where_used(*cotangents):
    """NaN for each matrix of the batch where one of ``cotangents`` is nonzero, else zero, shaped
    to add to a matrix."""
    used = sum(A.sum(A.astype(g != 0.0, g.dtype), axis=(-2, -1), keepdims=True) for g in cotangents)
    return A.where(used == 0.0, used, np.nan)


def _svd_vjp(g, ans, a, full):
    m, n = a.shape[-2:]
    k = min(m, n)
    u, s, vh = A.linalg.svd_parts(ans, m, n, full)
    gu, gs, gvh = A.linalg.svd_parts(g, m, n, full)
    penalty = 0.0
    if full and max(m, n) > k:
        penalty = _undefined_where_used(A.getitem(gu, (Ellipsis, slice(None), slice(k, None))),
                                        A.getitem(gvh, (Ellipsis, slice(k, None), slice(None))))
        u, gu = (A.getitem(x, (Ellipsis, slice(None), slice(0, k))) for x in (u, gu))
        vh, gvh = (A.getitem(x, (Ellipsis, slice(0, k), slice(None))) for x in (vh, gvh))
    v, gv = A.swap_last(vh), A.swap_last(gvh)
    utgu, vtgv = A.swap_last(u) @ gu, A.swap_last(v) @ gv
    s_j, s_i = A.expand_dims(s, -2), A.expand_dims(s, -1)
    gap = s_j * s_j - s_i * s_i
    inner = (_quotient(utgu - A.swap_last(utgu), gap) * s_j + s_i * _quotient(vtgv - A.swap_last(vtgv), gap)
             + A.expand_dims(gs, -1) * np.eye(k, dtype=a.dtype))
    ga = u @ inner @ vh
    if m > k:
        ga = ga + _quotient(gu - u @ utgu, s_j) @ vh
    if n > k:
        ga = ga + u @ A.swap_last(_quotient(gv - v @ vtgv, s_j))
    return (ga + penalty,)


defop("svd", LINALG, _svd_rule, _svd, _svd_vjp, core=(2, 2))
