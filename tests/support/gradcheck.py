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

import functools
import operator
import warnings

import numpy as np

try:  # autograd is a test-only dependency
    import autograd
    import autograd.numpy as anp
    import autograd.scipy.special as asp
    from autograd.scipy.special import logsumexp as _ag_logsumexp
    import autograd.scipy.linalg as AG_SCIPY_LINALG
except ImportError:  # pragma: no cover
    autograd = anp = asp = _ag_logsumexp = AG_SCIPY_LINALG = None


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


def central_difference(f, w: np.ndarray, eps=1e-6) -> np.ndarray:
    """The gradient of the scalar function ``f`` at ``w``, element by element."""
    g = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        d = np.zeros_like(w)
        d[i] = eps
        g[i] = (f(w + d) - f(w - d)) / (2 * eps)
    return g


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
    """The subset of ``mj.*`` the tests use, implemented with autograd.numpy (and autograd.scipy)."""

    def __getattr__(self, name):
        return getattr(anp, name) if hasattr(anp, name) else getattr(asp, name)

    @staticmethod
    def ptp(x, axis=None):
        return anp.max(x, axis=axis) - anp.min(x, axis=axis)

    @staticmethod
    def prod(x, axis=None):
        """Factor by factor: autograd's own gradient of prod divides by each factor (NaN at a zero)."""
        axes = tuple(range(x.ndim)) if axis is None else tuple(np.atleast_1d(axis) % x.ndim)
        moved = anp.moveaxis(x, axes, tuple(range(len(axes))))
        factors = anp.reshape(moved, (-1,) + moved.shape[len(axes):])
        return functools.reduce(operator.mul, [factors[i] for i in range(len(factors))], anp.ones(factors.shape[1:]))

    @staticmethod
    def i0(x):
        """autograd's i0 has no gradient: ``iv(0, x)``."""
        return asp.iv(0.0, x)

    @staticmethod
    def kv(v, x):
        """autograd has no kv: ``pi/2 (I_-v - I_v) / sin(v pi)`` for a constant v that is not whole."""
        return np.pi / 2 * (asp.iv(-v, x) - asp.iv(v, x)) / np.sin(v * np.pi)

    @staticmethod
    def betaincc(a, b, x):
        """autograd has no betaincc: ``betainc(b, a, 1 - x)``."""
        return asp.betainc(b, a, 1.0 - x)

    @staticmethod
    def stdtr(df, t):
        """autograd has no stdtr: half the regularised beta function at ``df / (df + t^2)``."""
        half = 0.5 * asp.betainc(df / 2.0, 0.5, df / (df + t * t))
        return anp.where(t > 0, 1.0 - half, half)

    @staticmethod
    def nansum(x, axis=None):
        return anp.sum(anp.where(anp.isnan(x), 0.0, x), axis=axis)

    @classmethod
    def nanmean(cls, x, axis=None):
        return cls.nansum(x, axis) / anp.sum(~anp.isnan(x), axis=axis)

    @staticmethod
    def cumprod(x, axis=None):
        moved = anp.moveaxis(x, axis, 0)
        rows = [moved[0]]
        for row in moved[1:]:
            rows.append(rows[-1] * row)
        return anp.moveaxis(anp.stack(rows), 0, axis)

    @staticmethod
    def average(x, axis=None, weights=None):
        w = anp.reshape(weights, (-1,) + (1,) * (x.ndim - axis % x.ndim - 1))
        return anp.sum(x * w, axis=axis) / anp.sum(w * anp.ones_like(x), axis=axis)

    class Linalg:
        """autograd's linalg, with the norms it cannot differentiate written out."""

        def __getattr__(self, name):
            return getattr(anp.linalg, name)

        @staticmethod
        def norm(x, ord=None, axis=None):
            if x.ndim == 2 and axis is None and ord in (1, np.inf):
                return anp.max(anp.sum(anp.abs(x), axis=0 if ord == 1 else 1))
            if ord in (1, np.inf):
                reduce = anp.sum if ord == 1 else anp.max
                return reduce(anp.abs(x), axis=axis)
            return anp.linalg.norm(x, ord, axis)

    linalg = Linalg()

    @staticmethod
    def stop_gradient(x):
        return x._value if hasattr(x, "_value") else x

    @staticmethod
    def repeat(x, repeats, axis=None):
        if np.ndim(repeats) == 0:
            return anp.repeat(x, repeats, axis=axis)
        return anp.concatenate([anp.repeat(x[i:i + 1], r) for i, r in enumerate(repeats) if r])

    @staticmethod
    def pad(x, widths, mode="constant"):
        widths = [(w, w) if np.ndim(w) == 0 else w for w in np.broadcast_to(np.asarray(widths), (x.ndim, 2)).tolist()] \
            if np.ndim(widths) == 2 else [(widths, widths)] * x.ndim
        for axis, (lo, hi) in enumerate(widths):
            moved = anp.moveaxis(x, axis, 0)
            n = moved.shape[0]
            if mode == "constant":
                parts = [anp.zeros((lo,) + moved.shape[1:]), moved, anp.zeros((hi,) + moved.shape[1:])]
            elif mode == "edge":
                parts = [anp.stack([moved[0]] * lo) if lo else moved[:0], moved,
                         anp.stack([moved[-1]] * hi) if hi else moved[:0]]
            else:
                parts = [moved[lo:0:-1], moved, moved[n - 2:(n - 2 - hi if n - 2 - hi >= 0 else None):-1]]
            x = anp.moveaxis(anp.concatenate(parts), 0, axis)
        return x

    @staticmethod
    def split(x, sections, axis=0):
        return anp.split(x, sections, axis=axis)

    @staticmethod
    def array_split(x, sections, axis=0):
        return anp.array_split(x, sections, axis=axis)

    @staticmethod
    def roll(x, shift, axis=None):
        for s, a in zip(np.atleast_1d(shift), np.atleast_1d(axis)):
            x = anp.roll(x, int(s), axis=int(a))
        return x

    @staticmethod
    def tile(x, reps):
        return anp.tile(x, reps)

    @staticmethod
    def broadcast_arrays(*xs):
        shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
        return [x + np.zeros(shape) for x in xs]

    @staticmethod
    def meshgrid(x, y):
        return [x[None, :] + np.zeros((len(y), 1)), y[:, None] + np.zeros((1, len(x)))]

    @staticmethod
    def einsum(subscripts, *xs):
        """Repeated letters in one operand (diagonals) as products with identity matrices."""
        lhs, _, rhs = subscripts.partition("->")
        terms, extra = lhs.split(","), []
        if not _:
            letters = lhs.replace(",", "")
            rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
        fresh = iter(c for c in "ABCDEFGHIJ")
        for k, t in enumerate(terms):
            for c in set(t) - {'.'}:
                while t.count(c) > 1:
                    d = next(fresh)
                    i = t.index(c, t.index(c) + 1)
                    t = t[:i] + d + t[i + 1:]
                    extra.append((c + d, np.eye(np.shape(xs[k])[i])))
            terms[k] = t
        spec = ",".join(terms + [e for e, _ in extra]) + "->" + rhs
        return anp.einsum(spec, *xs, *(m for _, m in extra))

    @staticmethod
    def diagonal(x, offset=0, axis1=0, axis2=1):
        moved = anp.moveaxis(anp.moveaxis(x, axis1, -1), axis2 if axis2 < axis1 else axis2 - 1, -1)
        r0, c0 = max(0, -offset), max(0, offset)
        k = min(moved.shape[-2] - r0, moved.shape[-1] - c0)
        return anp.stack([moved[..., i + r0, i + c0] for i in range(k)], axis=-1)

    @classmethod
    def trace(cls, x, offset=0, axis1=0, axis2=1):
        return anp.sum(cls.diagonal(x, offset, axis1, axis2), axis=-1)

    @staticmethod
    def outer(a, b):
        return anp.ravel(a)[:, None] * anp.ravel(b)[None, :]

    @staticmethod
    def flip(x, axis=None):
        axes = range(x.ndim) if axis is None else [axis % x.ndim]
        return x[tuple(slice(None, None, -1) if k in axes else slice(None) for k in range(x.ndim))]

    @classmethod
    def fliplr(cls, x):
        return cls.flip(x, 1)

    @classmethod
    def flipud(cls, x):
        return cls.flip(x, 0)

    @classmethod
    def diag(cls, x, k=0):
        if x.ndim == 2:
            return cls.diagonal(x, k)
        n = x.shape[0] + abs(k)
        return np.eye(n, x.shape[0], -max(0, -k)) @ (x[:, None] * np.eye(x.shape[0], n, max(0, k)))

    @staticmethod
    def vdot(a, b):
        return anp.sum(anp.ravel(a) * anp.ravel(b))

    @staticmethod
    def kron(a, b):
        return anp.reshape(a[:, None, :, None] * b[None, :, None, :], (a.shape[0] * b.shape[0], -1))

    @staticmethod
    def trigamma(x):
        return asp.polygamma(1, x)

    @staticmethod
    def log_expit(x):
        return -anp.logaddexp(0.0, -x)

    @staticmethod
    def softplus(x):
        return anp.logaddexp(0.0, x)

    @staticmethod
    def ndtr(x):
        return 0.5 * asp.erfc(-x / np.sqrt(2.0))

    @classmethod
    def log_ndtr(cls, x):
        return anp.log(cls.ndtr(x))

    @staticmethod
    def xlogy(x, y):
        return x * anp.log(y)

    @staticmethod
    def xlog1py(x, y):
        return x * anp.log1p(y)

    @staticmethod
    def entr(x):
        return -x * anp.log(x)

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
    def cbrt(x):
        return anp.sign(x) * anp.abs(x) ** (1.0 / 3.0)

    @staticmethod
    def copysign(a, b):
        return anp.abs(a) * anp.where(b < 0, -1.0, 1.0)

    @staticmethod
    def fmod(a, b):
        return a - b * anp.trunc(a / b)

    @staticmethod
    def heaviside(x, h):
        return anp.where(x > 0, 1.0, anp.where(x == 0, h * 0.0, 0.0)) + 0.0 * x

    @staticmethod
    def float_power(a, b):
        return a ** b

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

    @staticmethod
    def sliding_window_view(x, k, axis):
        windows = np.arange(x.shape[axis] - k + 1)[:, None] + np.arange(k)
        return anp.moveaxis(anp.moveaxis(x, axis, -1)[..., windows], -2, axis)

    @classmethod
    def max_pool2d(cls, x, kernel_size):
        return _max_pool2d(cls.sliding_window_view, anp.max, x, kernel_size)


class NumpyNS:
    """Plain NumPy (with SciPy-free implementations of the composites; SciPy's special functions)."""

    def __getattr__(self, name):
        import scipy.special
        return getattr(np, name) if hasattr(np, name) else getattr(scipy.special, name)

    @staticmethod
    def stop_gradient(x):
        return x

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

    @staticmethod
    def sliding_window_view(x, k, axis):
        return np.lib.stride_tricks.sliding_window_view(x, k, axis=axis)

    @classmethod
    def max_pool2d(cls, x, kernel_size):
        return _max_pool2d(cls.sliding_window_view, np.max, x, kernel_size)


def _max_pool2d(sliding_window_view, amax, x, kernel_size):
    """Max pooling of an NCHW array with stride equal to the kernel, from sliding windows."""
    kh, kw = kernel_size
    rows = sliding_window_view(x, kh, 2)[:, :, ::kh]
    cells = sliding_window_view(rows, kw, 3)[:, :, :, ::kw]
    return amax(cells, axis=(-2, -1))


AG = AutogradNS()
NP = NumpyNS()
