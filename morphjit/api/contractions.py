"""Contractions: einsum and the NumPy functions that are einsums (tensordot, inner, outer, vdot,
kron, trace), with diagonal (a view op, in ``morphjit.ops.shapes``) and the triangles (tril, triu).

``einsum`` parses its subscripts here and lowers to existing ops, so it plans like everything
else: repeated letters in one operand become diagonals (views), letters only one operand has and
the output drops are summed first, then operands are contracted pairwise, each pair transposed and
reshaped into one batched GEMM (float operands) or a broadcast product and a sum (integers).
`FUNCTIONS` is this family's entries of the NumPy dispatch.
"""
from __future__ import annotations

import math
import string

import numpy as np

from ..util import ShapeError, user_location
from . import core as A


def diagonal(a, offset=0, axis1=0, axis2=1):
    a = A.as_array(a)
    axis1, axis2 = (A.normalize_axes("diagonal", ax, a.ndim)[0] for ax in (axis1, axis2))
    return A.bind("diagonal", [a], axis1=axis1, axis2=axis2, offset=int(offset))


def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    return A.sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype, out=out)


def diag(v, k=0):
    """The diagonal of a matrix, or the matrix with ``v`` on its ``k``-th diagonal."""
    v = A.as_array(v)
    if v.ndim == 2:
        return diagonal(v, k)
    if v.ndim != 1:
        raise ShapeError(f"diag: input must be 1-D or 2-D, got {v.ndim}-D", user_location())
    n = v.shape[0] + abs(k)
    rows = np.eye(n, v.shape[0], -max(0, -k), dtype=A.dtype_of(v))
    cols = np.eye(v.shape[0], n, max(0, k), dtype=A.dtype_of(v))
    if A.dtype_of(v).kind != "f":
        return A.sum(A.multiply(A.reshape(rows, (n, -1, 1)), A.multiply(A.expand_dims(v, -1), cols)), axis=1,
                     dtype=A.dtype_of(v))
    return A.matmul(rows, A.multiply(A.expand_dims(v, -1), cols))


def _triangle(name, keep_lower: bool):
    def fn(m, k=0):
        m = A.as_array(m)
        if m.ndim < 2:
            raise ShapeError(f"{name}: input must be at least 2-D", user_location())
        lower = np.tri(m.shape[-2], m.shape[-1], k if keep_lower else k - 1, dtype=bool)
        return A.where(lower if keep_lower else ~lower, m, 0)
    fn.__name__ = name
    return fn


tril, triu = _triangle("tril", True), _triangle("triu", False)


# ---------------------------------------------------------------------------------------------
# einsum


def _parse(subscripts: str, ndims) -> tuple[list[str], str]:
    """Subscripts with ``...`` expanded into fresh letters, and the explicit output."""
    subscripts = subscripts.replace(" ", "")
    lhs, arrow, rhs = subscripts.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise ShapeError(f"einsum: {len(terms)} operand subscripts for {len(ndims)} operands", user_location())
    used = set(subscripts) - set(".,->")
    fresh = [c for c in string.ascii_letters if c not in used]
    widest = max((n - len(t.replace("...", "")) for t, n in zip(terms, ndims) if "..." in t), default=0)
    ellipsis = "".join(fresh[:widest])
    inputs = []
    for t, n in zip(terms, ndims):
        if "..." in t:
            t = t.replace("...", ellipsis[widest - (n - len(t.replace("...", ""))):])
        if len(t) != n or not all(c in string.ascii_letters for c in t):
            raise ShapeError(f"einsum: subscripts {t!r} do not fit an operand of {n} dimensions", user_location())
        inputs.append(t)
    if arrow:
        output = rhs.replace("...", ellipsis)
        unknown = set(output) - set("".join(inputs))
        if unknown:
            raise ShapeError(f"einsum: output subscripts {''.join(sorted(unknown))} appear in no operand",
                             user_location())
    else:
        letters = "".join(inputs)
        output = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis))
    return inputs, output


def _take_diagonals(x, letters: str):
    """Repeated letters in one operand: keep their diagonal (the letter moves last)."""
    while len(set(letters)) < len(letters):
        c = next(c for c in letters if letters.count(c) > 1)
        i = letters.index(c)
        j = letters.index(c, i + 1)
        x = diagonal(x, 0, i, j)
        letters = letters[:i] + letters[i + 1:j] + letters[j + 1:] + c
    return x, letters


def _sum_letters(x, letters: str, drop: set):
    axes = tuple(k for k, c in enumerate(letters) if c in drop)
    if not axes:
        return x, letters
    return A.sum(x, axis=axes, dtype=A.dtype_of(x)), "".join(c for c in letters if c not in drop)


def _arrange(x, letters: str, order: str):
    return A.transpose(x, tuple(letters.index(c) for c in order)) if letters != order else x


def _contract(a, la: str, b, lb: str, keep: set, sizes: dict):
    """One pairwise contraction; the result's letters are ``batch + a_only + b_only``."""
    batch = "".join(c for c in la if c in lb and c in keep)
    summed = "".join(c for c in la if c in lb and c not in keep)
    a_only = "".join(c for c in la if c not in lb)
    b_only = "".join(c for c in lb if c not in la)
    extent = lambda letters: math.prod(sizes[c] for c in letters)
    out_shape = tuple(sizes[c] for c in batch + a_only + b_only)
    if A.dtype_of(a).kind == "f":
        a2 = A.reshape(_arrange(a, la, batch + a_only + summed),
                       tuple(sizes[c] for c in batch) + (extent(a_only), extent(summed)))
        b2 = A.reshape(_arrange(b, lb, batch + summed + b_only),
                       tuple(sizes[c] for c in batch) + (extent(summed), extent(b_only)))
        return A.reshape(A.matmul(a2, b2), out_shape), batch + a_only + b_only
    # Integers: a broadcast product over every letter, then the sum.
    full = batch + a_only + b_only + summed
    expand = lambda x, l: A.reshape(_arrange(x, l, "".join(c for c in full if c in l)),
                                    tuple(sizes[c] if c in l else 1 for c in full))
    product = A.multiply(expand(a, la), expand(b, lb))
    return _sum_letters(product, full, set(summed))


def einsum(subscripts, *operands, out=None, optimize=False, dtype=None, order="K", casting="safe"):
    """NumPy's einsum: explicit or implicit output, ``...``, several operands, traces and diagonals;
    with ``dtype``, the operands are converted to it as ``casting`` allows (``order`` is the
    layout of the result, which a traced array does not have)."""
    A.no_out("einsum", out)
    if not isinstance(subscripts, str):
        subscripts, operands = _from_sublists((subscripts,) + operands)
    if order not in ("C", "F", "A", "K"):
        raise ValueError(f"einsum: order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
    operands = [A.as_array(x) if dtype is None else A.astype(A.as_array(x), dtype, casting) for x in operands]
    _, operands = A.promote(operands)
    inputs, output = _parse(subscripts, [x.ndim for x in operands])
    sizes = _letter_sizes(operands, inputs)
    terms = []
    for k, (x, letters) in enumerate(zip(operands, inputs)):
        x = A.broadcast_to(x, tuple(sizes[c] for c in letters))   # size-1 letters broadcast (NumPy)
        x, letters = _take_diagonals(x, letters)
        elsewhere = set(output).union(*(set(l) for j, l in enumerate(inputs) if j != k))
        terms.append(_sum_letters(x, letters, set(letters) - elsewhere))
    x, letters = terms[0]
    for k, (y, y_letters) in enumerate(terms[1:], start=1):
        later = set(output).union(*(set(l) for _, l in terms[k + 1:]))
        x, letters = _contract(x, letters, y, y_letters, later, sizes)
    x, letters = _sum_letters(x, letters, set(letters) - set(output))
    return _arrange(x, letters, output)


def _from_sublists(arguments) -> tuple[str, list]:
    """NumPy's sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` as a subscripts string and the
    operands: labels 0-25 are ``A``-``Z``, 26-51 ``a``-``z``, ``Ellipsis`` is ``...``."""
    pairs = arguments[:len(arguments) - len(arguments) % 2]
    output = "->" + _sublist_letters(arguments[-1]) if len(arguments) % 2 else ""
    return ",".join(_sublist_letters(s) for s in pairs[1::2]) + output, list(pairs[0::2])


def _sublist_letters(sublist) -> str:
    letters = []
    for label in sublist:
        if label is Ellipsis:
            letters.append("...")
        elif isinstance(label, (int, np.integer)) and not isinstance(label, bool) and 0 <= label < 52:
            letters.append(string.ascii_uppercase[label] if label < 26 else string.ascii_lowercase[label - 26])
        else:
            raise ValueError(f"einsum: subscript {label!r} is not within the valid range [0, 52) (nor Ellipsis)")
    return "".join(letters)


def _letter_sizes(operands, inputs) -> dict:
    sizes = {}
    for x, letters in zip(operands, inputs):
        for c, d in zip(letters, x.shape):
            if sizes.get(c, 1) not in (1, d) and d != 1:
                raise ShapeError(f"einsum: letter {c!r} has sizes {sizes[c]} and {d}", user_location())
            sizes[c] = d if sizes.get(c, 1) == 1 else sizes[c]
    return sizes


# ---------------------------------------------------------------------------------------------
# The einsums NumPy names

LETTERS = string.ascii_lowercase


def tensordot(a, b, axes=2):
    a, b = A.as_array(a), A.as_array(b)
    if isinstance(axes, (int, np.integer)):
        a_axes, b_axes = list(range(a.ndim - axes, a.ndim)), list(range(axes))
    else:
        a_axes, b_axes = ([ax] if isinstance(ax, (int, np.integer)) else list(ax) for ax in axes)
    a_axes = [k % a.ndim for k in a_axes]
    b_axes = [k % b.ndim for k in b_axes]
    la = LETTERS[:a.ndim]
    lb = list(LETTERS[a.ndim:a.ndim + b.ndim])
    for i, j in zip(a_axes, b_axes):
        lb[j] = la[i]
    lb = "".join(lb)
    out = "".join(c for k, c in enumerate(la) if k not in a_axes) + "".join(c for k, c in enumerate(lb) if k not in b_axes)
    return einsum(f"{la},{lb}->{out}", a, b)


def inner(a, b):
    a, b = A.as_array(a), A.as_array(b)
    if a.ndim == 0 or b.ndim == 0:
        return A.multiply(a, b)
    return tensordot(a, b, ([-1], [-1]))


def outer(a, b, out=None):
    A.no_out("outer", out)
    return A.multiply(A.reshape(A.ravel(a), (-1, 1)), A.reshape(A.ravel(b), (1, -1)))


def vdot(a, b):
    return A.sum(A.multiply(A.ravel(a), A.ravel(b)))


def kron(a, b):
    a, b = A.as_array(a), A.as_array(b)
    ndim = max(a.ndim, b.ndim)
    a = A.reshape(a, (1,) * (ndim - a.ndim) + a.shape)
    b = A.reshape(b, (1,) * (ndim - b.ndim) + b.shape)
    interleaved = A.multiply(A.reshape(a, tuple(d for n in a.shape for d in (n, 1))),
                             A.reshape(b, tuple(d for n in b.shape for d in (1, n))))
    return A.reshape(interleaved, tuple(m * n for m, n in zip(a.shape, b.shape)))


FUNCTIONS = {
    np.einsum: einsum, np.tensordot: tensordot, np.inner: inner, np.outer: outer, np.vdot: vdot,
    np.kron: kron, np.trace: trace, np.diag: diag, np.diagonal: diagonal, np.tril: tril, np.triu: triu,
}
