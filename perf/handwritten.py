"""Hand-written numba target for an MLP classification step.

The code generator's goal: forward, softmax cross-entropy (mean over the batch) and backward of an
MLP as ONE njit function, with explicit fused loops for element-wise work and `np.dot(a, b, out)`
into preallocated buffers for GEMMs. Also a plain NumPy reference and a GEMM-only floor.

Layout: layer l maps (B, n_l) -> (B, n_{l+1}) with W_l of shape (n_l, n_{l+1}) and b_l (n_{l+1},).
Buffers are tuples of arrays indexed by layer (numba UniTuples, indexable at run time).
"""
import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import njit

# Fast-math without nnan/ninf: NaN and inf still propagate to the loss (see tools/facts_handwritten.py).
FASTMATH = frozenset({"nsz", "arcp", "contract", "afn", "reassoc"})
ACTIVATIONS = ("relu", "tanh")
MODELS = {
    "tiny": ((64, 32, 10), 32, "tanh"),
    "small": ((784, 128, 10), 64, "relu"),
    "medium": ((784, 512, 512, 10), 256, "relu"),
}


class Workspace(NamedTuple):
    """Preallocated step buffers: outputs (gWs, gbs) and temporaries (hs, ds)."""

    hs: tuple  # hs[l]: layer l output after activation (B, n_{l+1}); hs[-1] holds the logits
    ds: tuple  # ds[l]: dloss/dz_l (B, n_{l+1})
    gWs: tuple
    gbs: tuple


class Problem(NamedTuple):
    """An MLP step instance: params (Ws, bs), data (x, y), workspace, activation name."""

    params: tuple
    data: tuple
    work: Workspace
    activation: str


def make_problem(sizes, batch, activation, dtype, seed=0, workspace=True):
    """Random params and data for an MLP with layer widths `sizes`, plus its workspace.

    With workspace=False the problem's `work` is None (see `problem_for`).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}")
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    pairs = list(zip(sizes[:-1], sizes[1:]))
    Ws = tuple((rng.standard_normal((m, n)) / math.sqrt(m)).astype(dt) for m, n in pairs)
    bs = tuple((0.1 * rng.standard_normal(n)).astype(dt) for _, n in pairs)
    x = rng.standard_normal((batch, sizes[0])).astype(dt)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    if not workspace:
        return Problem((Ws, bs), (x, y), None, activation)
    return problem_for(Ws, bs, x, y, activation)


def problem_for(Ws, bs, x, y, activation):
    """The problem of given params and data, with a fresh workspace."""
    Ws, bs = tuple(Ws), tuple(bs)
    batch, dt = x.shape[0], x.dtype

    def buffers(shape_of):
        return tuple(np.zeros(shape_of(*W.shape), dt) for W in Ws)

    work = Workspace(
        hs=buffers(lambda m, n: (batch, n)),
        ds=buffers(lambda m, n: (batch, n)),
        gWs=buffers(lambda m, n: (m, n)),
        gbs=buffers(lambda m, n: (n,)),
    )
    return Problem((Ws, bs), (x, y), work, activation)


def build_step(activation, dtype, fastmath=FASTMATH, error_model="numpy", boundscheck=False):
    """Compile-on-first-call njit step for one activation and dtype; returns the dispatcher.

    step(x, y, Ws, bs, hs, ds, gWs, gbs) -> loss; writes gWs, gbs (and hs, ds as temporaries).
    The loss is accumulated over the batch in float64.
    """
    DT = np.dtype(dtype).type
    TANH = activation == "tanh"

    def step(x, y, Ws, bs, hs, ds, gWs, gbs):
        L = len(Ws)
        B = x.shape[0]
        zero = DT(0.0)
        one = DT(1.0)
        inv_b = one / DT(B)
        # forward: GEMM, then bias + activation fused in place over its output
        for l in range(L - 1):
            h = hs[l]
            b = bs[l]
            np.dot(x if l == 0 else hs[l - 1], Ws[l], h)
            for i in range(B):
                for j in range(h.shape[1]):
                    v = h[i, j] + b[j]
                    if TANH:
                        h[i, j] = math.tanh(v)
                    else:
                        h[i, j] = zero if v < zero else v  # keeps NaN, like np.maximum
        # logits bias + softmax + cross-entropy + its gradient (softmax - onehot) / B, per row
        z = hs[L - 1]
        g = ds[L - 1]
        b = bs[L - 1]
        gb = gbs[L - 1]
        np.dot(x if L == 1 else hs[L - 2], Ws[L - 1], z)
        for j in range(z.shape[1]):
            gb[j] = zero
        loss = 0.0
        for i in range(B):
            m = z[i, 0] + b[0]
            for j in range(z.shape[1]):
                v = z[i, j] + b[j]
                z[i, j] = v
                m = max(m, v)
            s = zero
            for j in range(z.shape[1]):
                e = math.exp(z[i, j] - m)
                g[i, j] = e
                s += e
            yi = y[i]
            loss += math.log(s) + m - z[i, yi]
            r = inv_b / s
            for j in range(z.shape[1]):
                v = g[i, j] * r
                if j == yi:
                    v -= inv_b
                g[i, j] = v
                gb[j] += v
        # backward: weight-gradient GEMM, input-gradient GEMM, then activation'
        # fused with the previous layer's bias gradient (column sums)
        for l in range(L - 1, -1, -1):
            d = ds[l]
            np.dot((x if l == 0 else hs[l - 1]).T, d, gWs[l])
            if l > 0:
                dp = ds[l - 1]
                h = hs[l - 1]
                gbp = gbs[l - 1]
                np.dot(d, Ws[l].T, dp)
                for j in range(dp.shape[1]):
                    gbp[j] = zero
                for i in range(B):
                    for j in range(dp.shape[1]):
                        hv = h[i, j]
                        if TANH:
                            v = dp[i, j] * (one - hv * hv)
                        else:
                            v = dp[i, j] if hv > zero else zero
                        dp[i, j] = v
                        gbp[j] += v
        return loss / B

    fastmath = fastmath if isinstance(fastmath, bool) else set(fastmath)
    return njit(fastmath=fastmath, error_model=error_model, boundscheck=boundscheck)(step)


@lru_cache(maxsize=None)
def step_for(activation, dtype):
    """The default-option step dispatcher for (activation, dtype), built once per process."""
    return build_step(activation, np.dtype(dtype))


def run_step(p):
    """Run the numba step on a problem; returns the loss (gradients land in p.work)."""
    step = step_for(p.activation, p.data[0].dtype)
    (Ws, bs), (x, y), w = p.params, p.data, p.work
    return step(x, y, Ws, bs, w.hs, w.ds, w.gWs, w.gbs)


@njit
def gemm_floor(x, Ws, hs, ds, gWs):
    """The step's GEMMs alone (forward, weight grads, input grads) into preallocated buffers."""
    L = len(Ws)
    for l in range(L):
        np.dot(x if l == 0 else hs[l - 1], Ws[l], hs[l])
    for l in range(L - 1, -1, -1):
        np.dot((x if l == 0 else hs[l - 1]).T, ds[l], gWs[l])
        if l > 0:
            np.dot(ds[l], Ws[l].T, ds[l - 1])


def run_gemm_floor(p):
    """Run the GEMM floor on a problem's buffers."""
    gemm_floor(p.data[0], p.params[0], p.work.hs, p.work.ds, p.work.gWs)


def numpy_step(x, y, Ws, bs, activation):
    """Plain NumPy forward + backward; returns (loss, gWs, gbs) as new arrays."""
    hs = [x]
    for W, b in zip(Ws[:-1], bs[:-1]):
        z = hs[-1] @ W + b
        hs.append(np.tanh(z) if activation == "tanh" else np.maximum(z, 0))
    z = hs[-1] @ Ws[-1] + bs[-1]
    batch = np.arange(len(y))
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True)
    loss = np.mean(np.log(s[:, 0]) + m[:, 0] - z[batch, y])
    d = e / s
    d[batch, y] -= 1
    d /= len(y)
    gWs, gbs = [], []
    for l in range(len(Ws) - 1, -1, -1):
        gWs.append(hs[l].T @ d)
        gbs.append(d.sum(axis=0))
        if l > 0:
            dh = d @ Ws[l].T
            h = hs[l]
            d = dh * (1 - h * h) if activation == "tanh" else dh * (h > 0)
    return loss, gWs[::-1], gbs[::-1]


def run_numpy(p):
    """Run the NumPy reference on a problem."""
    return numpy_step(*p.data, *p.params, p.activation)


def _assert_close(name, got, want, rtol):
    atol = rtol * max(1e-3, float(np.max(np.abs(want))))
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        raise AssertionError(f"{name}: max abs err {np.max(np.abs(got - want)):.3g}")


def _check_reference(p, rtol):
    loss = run_step(p)
    ref_loss, ref_gWs, ref_gbs = run_numpy(p)
    _assert_close("loss", loss, ref_loss, rtol)
    for l, (gW, gb) in enumerate(zip(ref_gWs, ref_gbs)):
        _assert_close(f"gW{l}", p.work.gWs[l], gW, rtol)
        _assert_close(f"gb{l}", p.work.gbs[l], gb, rtol)


def _check_finite_differences(p, n_coords=4, eps=1e-6, rtol=1e-5, seed=1):
    """Central differences of the numba loss on a few coordinates of every parameter (f64)."""
    rng = np.random.default_rng(seed)
    run_step(p)
    grads = [g.copy() for g in p.work.gWs + p.work.gbs]
    for arr, grad in zip(p.params[0] + p.params[1], grads):
        for _ in range(n_coords):
            k = np.unravel_index(rng.integers(arr.size), arr.shape)
            old = arr[k]
            arr[k] = old + eps
            up = run_step(p)
            arr[k] = old - eps
            down = run_step(p)
            arr[k] = old
            fd = (up - down) / (2 * eps)
            if abs(fd - grad[k]) > rtol * max(1.0, abs(fd)) + 1e-8:
                raise AssertionError(f"finite difference at {k}: {fd} vs {grad[k]}")


def check(models=MODELS):
    """Compare the numba step with the NumPy reference (f32, f64) and finite differences (f64)."""
    for name, (sizes, batch, act) in models.items():
        for dtype, rtol in ((np.float64, 1e-5), (np.float32, 1e-3)):
            _check_reference(make_problem(sizes, batch, act, dtype), rtol)
        _check_finite_differences(make_problem(sizes, batch, act, np.float64))
        print(f"{name}: ok")


if __name__ == "__main__":
    check()
