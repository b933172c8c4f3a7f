"""Composites: the numerically stable row-wise ops (``logsumexp``, ``softmax``, ``log_softmax``,
``softmax_cross_entropy``), with stable forward formulas, the textbook backward ones, and their
lowering into simpler ops for the loop backends."""
from __future__ import annotations

import numpy as np

from .. import api as A
from ..ir import COMPOSITE, TensorType, check_axes, defop, reduced_shape, require_float
from ..util import DtypeError, ShapeError
from .reductions import expand_back


def _row_rule(name, keep):
    def infer(types, axes):
        (x,) = types
        require_float(name, x)
        check_axes(name, axes, x.ndim)
        return TensorType(x.shape if keep else reduced_shape(x.shape, axes), x.dtype)
    return infer


def _stable_max(x, axes):
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    return np.where(np.isfinite(m), m, 0).astype(x.dtype)


def _logsumexp(x, axes, keepdims=False):
    m = _stable_max(x, axes)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axes)


def _softmax(x, axes):
    e = np.exp(x - _stable_max(x, axes))
    return e / np.sum(e, axis=axes, keepdims=True)


def _softmax_vjp(g, ans, x, axes):
    return (ans * (g - A.sum(g * ans, axis=axes, keepdims=True)),)


def _log_softmax_vjp(g, ans, x, axes):
    return (g - A.exp(ans) * A.sum(g, axis=axes, keepdims=True),)


def _sce_rule(types):
    logits, labels = types
    require_float("softmax_cross_entropy", logits)
    if labels.dtype.kind not in "iu":
        raise DtypeError(f"softmax_cross_entropy: labels must be integer class indices, got {labels.dtype}")
    if logits.ndim < 1 or labels.shape != logits.shape[:-1]:
        raise ShapeError(f"softmax_cross_entropy: labels of shape {labels.shape} do not index the rows "
                         f"of logits of shape {logits.shape} (expected labels of shape {logits.shape[:-1]})")
    return TensorType(labels.shape, logits.dtype)


def _sce_impl(logits, labels):
    classes = logits.shape[-1]
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"softmax_cross_entropy: labels must lie in [0, {classes}), "
                         f"got values from {labels.min()} to {labels.max()}")
    picked = np.take_along_axis(logits, labels[..., None].astype(np.intp), axis=-1)[..., 0]
    return _logsumexp(logits, (logits.ndim - 1,)) - picked


def _sce_vjp(g, ans, logits, labels):
    last = (logits.ndim - 1,)
    onehot = A.one_hot(labels, logits.shape[-1], logits.dtype)
    return A.expand_dims(g, -1) * (A.softmax(logits, axis=last) - onehot), None


def _finite_max(x, axes):
    """The shift that keeps exp from overflowing (0 where the maximum is infinite)."""
    m = A.extremum("max", x, axes, keepdims=True)
    return A.where(A.abs(m) != np.inf, m, 0.0)


def _logsumexp_keepdims(x, axes):
    m = _finite_max(x, axes)
    return A.log(A.sum(A.exp(x - m), axis=axes, keepdims=True)) + m


def _softmax_lower(x, axes):
    e = A.exp(x - _finite_max(x, axes))
    return e / A.sum(e, axis=axes, keepdims=True)


def _sce_lower(logits, labels):
    last = (logits.ndim - 1,)
    picked = A.sum(A.where(A.one_hot(labels, logits.shape[-1], np.bool_), logits, 0.0), axis=last)
    return A.squeeze(_logsumexp_keepdims(logits, last), last) - picked


defop("logsumexp", COMPOSITE, _row_rule("logsumexp", keep=False), _logsumexp,
            lambda g, ans, x, axes: (expand_back(g, axes, x.shape) * A.exp(x - expand_back(ans, axes, x.shape)),),
      lower=lambda x, axes: A.squeeze(_logsumexp_keepdims(x, axes), axes))
defop("softmax", COMPOSITE, _row_rule("softmax", keep=True), _softmax, _softmax_vjp, lower=_softmax_lower)
defop("log_softmax", COMPOSITE, _row_rule("log_softmax", keep=True),
      lambda x, axes: x - _logsumexp(x, axes, keepdims=True), _log_softmax_vjp,
      lower=lambda x, axes: x - _logsumexp_keepdims(x, axes))
defop("softmax_cross_entropy", COMPOSITE, _sce_rule, _sce_impl, _sce_vjp, lower=_sce_lower)
