"""Gradient oracles for the tests.

* Finite differences in a random direction, in the form ``<J^T u, v> == <u, J v>``: a
  reverse-mode result ``J^T u`` (the gradient of ``sum(f(x) * u)``) is checked against a central
  difference ``J v ~ (f(x + eps v) - f(x - eps v)) / 2 eps`` of the forward function alone, so
  the oracle shares no code with the VJP rules.
* An independent autodiff library (autograd, used by the tests only).

Functions here take and return flat lists of NumPy arrays; pytrees are flattened by the caller
(``flat_leaves`` / ``unflatten_like``).
"""
from __future__ import annotations

import warnings

import numpy as np

try:  # autograd is a test-only dependency
    import autograd
    import autograd.numpy as anp
    from autograd.scipy.special import logsumexp as _ag_logsumexp
    import autograd.scipy.linalg as AG_SCIPY_LINALG
except ImportError:  # pragma: no cover
    autograd = anp = _ag_logsumexp = AG_SCIPY_LINALG = None


# ---------------------------------------------------------------------------------------------
# Pytree helpers (independent of morphjit.pytree, so the tests do not trust what they test)

def flat_leaves(tree) -> list:
    """Leaves in the order morphjit documents: dict keys sorted, sequences in order."""
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in flat_leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [leaf for child in tree for leaf in flat_leaves(child)]
    return [tree]


def unflatten_like(tree, leaves):
    """Rebuild ``tree``'s structure (dicts, lists, tuples, namedtuples) around ``leaves``."""
    it = iter(leaves)

    def build(t):
        if isinstance(t, dict):
            built = {k: build(t[k]) for k in sorted(t)}
            return {k: built[k] for k in t}
        if isinstance(t, tuple) and hasattr(type(t), "_fields"):
            return type(t)(*(build(c) for c in t))
        if isinstance(t, (list, tuple)):
            return type(t)(build(c) for c in t)
        return next(it)

    out = build(tree)
    assert next(it, None) is None, "too many leaves"
    return out


def assert_same_structure(a, b, path="grads"):
    """``a`` and ``b`` have the same container types, keys and leaf shapes/dtypes."""
    if isinstance(b, dict):
        assert type(a) is dict, f"{path}: expected a dict, got {type(a).__name__}"
        assert list(a) == list(b) or sorted(a) == sorted(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in b:
            assert_same_structure(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b), f"{path}: expected {type(b).__name__}, got {type(a).__name__}"
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_structure(x, y, f"{path}[{i}]")
    else:
        assert isinstance(a, np.ndarray), f"{path}: expected an ndarray, got {type(a).__name__}"
        assert a.shape == np.shape(b), f"{path}: shape {a.shape} != {np.shape(b)}"
        assert a.dtype == np.asarray(b).dtype, f"{path}: dtype {a.dtype} != {np.asarray(b).dtype}"


# ---------------------------------------------------------------------------------------------
# Random directions

def random_like(rng: np.random.Generator, x, scale=1.0) -> np.ndarray:
    x = np.asarray(x)
    return (scale * rng.standard_normal(x.shape)).astype(x.dtype)


def inner(a, b) -> float:
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


# ---------------------------------------------------------------------------------------------
# Finite differences

def fd_jvp(fun, primals, tangents, eps=1e-5) -> np.ndarray:
    """``J v`` by central differences: ``fun`` maps a list of arrays to one array."""
    plus = [np.asarray(p + eps * t, np.asarray(p).dtype) for p, t in zip(primals, tangents)]
    minus = [np.asarray(p - eps * t, np.asarray(p).dtype) for p, t in zip(primals, tangents)]
    # The perturbation actually applied (it differs from eps * t after rounding to float32).
    with np.errstate(all="ignore"):
        hi = np.asarray(fun(plus), np.float64)
        lo = np.asarray(fun(minus), np.float64)
    return (hi - lo) / (2 * eps)


def check_vjp_fd(fun, primals, cotangent, vjps, *, rng, eps=1e-5, rtol=1e-6, atol=1e-9,
                 what="gradient", retries=0):
    """Check ``vjps == J^T u`` through ``<J^T u, v> == <u, J v>`` for a random direction ``v``.

    ``fun(list_of_arrays) -> array`` is the forward function (NumPy only), ``primals`` the point,
    ``cotangent`` the output cotangent ``u`` and ``vjps`` the claimed ``J^T u``, one per primal.
    The tolerance scales with the size of the terms of both inner products.

    ``retries``: for functions with kinks (relu, abs, max, ...) placed at random, a kink closer
    than ``eps`` to the point spoils one central difference; the check is then repeated with a
    ten times smaller step (same direction), at most ``retries`` times. A wrong gradient fails
    at every step size.
    """
    assert len(vjps) == len(primals)
    for p, g in zip(primals, vjps):
        assert np.shape(g) == np.shape(p), f"{what}: shape {np.shape(g)} != primal shape {np.shape(p)}"
    tangents = [random_like(rng, p) for p in primals]
    lhs = sum(inner(g, v) for g, v in zip(vjps, tangents))
    first_error = None
    for attempt in range(retries + 1):
        step = eps / 10 ** attempt
        jv = fd_jvp(fun, primals, tangents, step)
        rhs = inner(cotangent, jv)
        scale = sum(float(np.sum(np.abs(np.asarray(g, np.float64) * v))) for g, v in zip(vjps, tangents))
        scale += float(np.sum(np.abs(np.asarray(cotangent, np.float64) * jv)))
        if np.isfinite(lhs) and np.isfinite(rhs) and abs(lhs - rhs) <= atol + rtol * scale:
            return
        first_error = first_error or (
            f"{what}: <J^T u, v> = {lhs!r} but finite differences (step {step:g}) give "
            f"<u, J v> = {rhs!r} (difference {abs(lhs - rhs):.3g}, allowed {atol + rtol * scale:.3g})")
        rtol *= 10  # a smaller step has more rounding error
    raise AssertionError(first_error)


def check_loss_grads_fd(loss_fn, primals, grads, *, rng, **kw):
    """The gradient of a scalar loss: the case ``u = 1``."""
    check_vjp_fd(lambda xs: loss_fn(xs), primals, np.float64(1.0), grads, rng=rng, **kw)


# ---------------------------------------------------------------------------------------------
# Autograd

def autograd_value_and_grads(fun, primals):
    """``fun(list_of_arrays) -> scalar`` written with autograd.numpy: value and gradients."""
    n = len(primals)

    def flat(*xs):
        return fun(list(xs))

    value = fun([np.asarray(p) for p in primals])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Output seems independent of input")
        grads = autograd.grad(flat, argnum=tuple(range(n)))(*primals) if n else ()
    return value, [np.asarray(g) for g in grads]


def assert_close(actual, expected, rtol, atol, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=rtol, atol=atol, err_msg=what)


def check_against_autograd(ag_fun, primals, value, grads, *, rtol=1e-9, atol=1e-11, what="loss"):
    """Compare a value and its gradients (flat lists) with autograd's on the same function."""
    ref_value, ref_grads = autograd_value_and_grads(ag_fun, primals)
    assert_close(value, ref_value, rtol, atol, f"{what}: value against autograd")
    assert len(grads) == len(ref_grads)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(g, r, rtol, atol, f"{what}: gradient {i} against autograd")


# ---------------------------------------------------------------------------------------------
# Array namespaces: the same model code runs on morphjit, autograd.numpy or plain NumPy

class AutogradNS:
    """The subset of ``mj.*`` the tests use, implemented with autograd.numpy."""

    def __getattr__(self, name):
        return getattr(anp, name)

    @staticmethod
    def where(cond, a, b):
        # autograd's where does not sum cotangents back over broadcast axes: broadcast first.
        zeros = np.zeros(np.broadcast_shapes(np.shape(cond), np.shape(a), np.shape(b)))
        return anp.where(cond, a + zeros, b + zeros)

    @staticmethod
    def broadcast_to(x, shape):
        return x + np.zeros(shape)  # autograd's broadcast_to cannot add leading axes

    @staticmethod
    def clip(x, lo, hi):
        return anp.minimum(anp.maximum(x, lo), hi)  # autograd's clip has no bound gradients

    @staticmethod
    def relu(x):
        return anp.maximum(x, 0.0) * (x > 0)

    @staticmethod
    def sigmoid(x):
        return 1.0 / (1.0 + anp.exp(-x))

    @staticmethod
    def logsumexp(x, axis=None, keepdims=False):
        return _ag_logsumexp(x, axis=axis, keepdims=keepdims)

    @staticmethod
    def log_softmax(x, axis=-1):
        return x - _ag_logsumexp(x, axis=axis, keepdims=True)

    @staticmethod
    def softmax(x, axis=-1):
        return anp.exp(x - _ag_logsumexp(x, axis=axis, keepdims=True))

    @staticmethod
    def softmax_cross_entropy(logits, labels):
        onehot = labels[..., None] == np.arange(logits.shape[-1])
        return _ag_logsumexp(logits, axis=-1) - anp.sum(logits * onehot, axis=-1)

    @staticmethod
    def astype(x, dtype):
        return x  # autograd computes in float64; casts are checked with looser tolerances

    @staticmethod
    def one_hot(labels, depth, dtype=np.float64):
        return (labels[..., None] == np.arange(depth)).astype(dtype)


class NumpyNS:
    """Plain NumPy (with SciPy-free implementations of the composites)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def relu(x):
        return np.maximum(x, 0)

    @staticmethod
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    @staticmethod
    def logsumexp(x, axis=None, keepdims=False):
        m = np.max(x, axis=axis, keepdims=True)
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
        return out if keepdims else np.squeeze(out, axis=axis)

    @classmethod
    def log_softmax(cls, x, axis=-1):
        return x - cls.logsumexp(x, axis=axis, keepdims=True)

    @classmethod
    def softmax(cls, x, axis=-1):
        return np.exp(cls.log_softmax(x, axis))

    @classmethod
    def softmax_cross_entropy(cls, logits, labels):
        onehot = labels[..., None] == np.arange(logits.shape[-1])
        return cls.logsumexp(logits, axis=-1) - np.sum(logits * onehot, axis=-1)

    @staticmethod
    def astype(x, dtype):
        return np.asarray(x).astype(dtype)


AG = AutogradNS()
NP = NumpyNS()
