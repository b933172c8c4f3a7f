"""Sliding windows, convolutions and pooling: values against NumPy references written here (loops
over the taps, sharing no code with morphjit), gradients against finite differences of those
references, on both backends. Many options go into one loss so that one compile covers them."""
import re

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided, sliding_window_view

import morphjit as mj

from support.gradcheck import check_vjp_fd

BACKENDS = ["interp", "numba"]


# ---------------------------------------------------------------------------------------------
# NumPy references

def ref_conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, channels_last=False):
    """N-d cross-correlation (PyTorch's conv) by a loop over the kernel taps."""
    nd = w.ndim - 2
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    stride, dilation = (np.broadcast_to(v, (nd,)).tolist() for v in (stride, dilation))
    if padding == "same":
        padding = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(w.shape[2:], dilation)]
    pads = [(p, p) if np.ndim(p) == 0 else tuple(p) for p in
            (padding if isinstance(padding, (list, tuple)) else [padding] * nd)]
    x = np.pad(x, [(0, 0), (0, 0)] + pads)
    o, cg = w.shape[:2]
    out_sizes = [(n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(x.shape[2:], w.shape[2:], stride, dilation)]
    out = np.zeros((x.shape[0], o, *out_sizes))
    og = o // groups
    for tap in np.ndindex(*w.shape[2:]):
        window = tuple(slice(t * d, t * d + s * (m - 1) + 1, s) for t, d, s, m in zip(tap, dilation, stride, out_sizes))
        for gi in range(groups):
            patch = x[(slice(None), slice(gi * cg, (gi + 1) * cg)) + window]
            out[:, gi * og:(gi + 1) * og] += np.einsum("nc...,oc->no...", patch, w[gi * og:(gi + 1) * og, :, *tap])
    if b is not None:
        out += b.reshape((-1,) + (1,) * nd)
    return np.moveaxis(out, 1, -1) if channels_last else out


def ref_conv_transpose2d(x, w, stride, padding, output_padding, dilation):
    """Each input element spreads the kernel over the output, then the padding is cropped."""
    n, c, h, wd = x.shape
    sizes = [(m - 1) * s + d * (k - 1) + 1 + e for m, s, d, k, e in
             zip((h, wd), stride, dilation, w.shape[2:], output_padding)]
    out = np.zeros((n, w.shape[1], *sizes))
    for i, j in np.ndindex(*w.shape[2:]):
        rows = slice(i * dilation[0], i * dilation[0] + stride[0] * (h - 1) + 1, stride[0])
        cols = slice(j * dilation[1], j * dilation[1] + stride[1] * (wd - 1) + 1, stride[1])
        out[:, :, rows, cols] += np.einsum("nchw,co->nohw", x, w[:, :, i, j])
    return out[:, :, padding[0]:sizes[0] - padding[0], padding[1]:sizes[1] - padding[1]]


def ref_pool(x, k, stride, pad, reduce, fill):
    xp = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)], constant_values=fill)
    oh, ow = ((n - k) // stride + 1 for n in xp.shape[2:])
    out = np.empty(x.shape[:2] + (oh, ow))
    for i, j in np.ndindex(oh, ow):
        out[:, :, i, j] = reduce(xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k], axis=(2, 3))
    return out


def ref_max_pool_grad(x, k, stride, pad, u):
    """PyTorch's rule: the first maximal element of each window (row-major) takes the cotangent."""
    xp = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)], constant_values=-np.inf)
    g = np.zeros_like(xp)
    for n, c, i, j in np.ndindex(*u.shape):
        win = xp[n, c, i * stride:i * stride + k, j * stride:j * stride + k]
        a, b = divmod(int(np.argmax(win)), k)
        g[n, c, i * stride + a, j * stride + b] += u[n, c, i, j]
    return g[:, :, pad:pad + x.shape[2], pad:pad + x.shape[3]]


def compile_both(fn, argnums=0):
    return {backend: mj.compile_loss(fn, argnums=argnums, backend=backend, static_shapes=True) for backend in BACKENDS}


# ---------------------------------------------------------------------------------------------
# Window views

WINDOW_CASES = [  # (window_shape, axis) on an array of shape (4, 5, 6)
    ((2, 3, 1), None), (3, -1), ((2, 2), (1, 2)), ((2, 3), (2, 2)), ((4,), 0),
]


def window_terms(np_or_mj, x, us):
    swv = sliding_window_view if np_or_mj is np else mj.sliding_window_view
    return sum(np.sum(swv(x, shape, axis) * u) for (shape, axis), u in zip(WINDOW_CASES, us))


def test_sliding_window_view_values_and_gradients():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5, 6))
    us = [rng.normal(size=sliding_window_view(x, s, a).shape) for s, a in WINDOW_CASES]
    for backend, step in compile_both(lambda x, us: window_terms(mj, x, us)).items():
        value, grad = step(x, us)
        np.testing.assert_allclose(value, window_terms(np, x, us), rtol=1e-12, err_msg=backend)
        check_vjp_fd(lambda xs: window_terms(np, xs[0], us), [x], np.float64(1.0), [grad], rng=rng, what=backend)
    # Eagerly on NumPy arrays: NumPy's own view.
    np.testing.assert_array_equal(mj.sliding_window_view(x, 3, -1), sliding_window_view(x, 3, -1))


def test_a_window_view_fuses_into_its_consumer():
    """No copy of the windows: one reduction loop reads x through the window map."""
    step = mj.compile_loss(lambda x: np.sum(np.max(sliding_window_view(x, (3, 3)), axis=(2, 3)) ** 2))
    plan = step.explain(np.ones((8, 8))).plan_text()
    assert "(0 gemm, 1 loop, 1 reduce, 0 alias)" in plan
    assert "max[i2,i3] v0[i0 + i2, i1 + i3]" in plan                 # the max reads x through the map
    assert "scatter over [6, 6, 3, 3]" in plan and "v4[i0 + i2, i1 + i3] +=" in plan    # col2im


def test_as_strided_window_views_and_refusals():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 6))
    s0, s1 = x.strides
    forms = [((3, 4, 2, 3), (s0, s1, s0, s1)),          # 2x3 windows
             ((2, 6), (2 * s0, s1)),                    # every other row
             ((4, 3), (s1, 2 * s1)),                    # overlapping rows of the flat array
             ((3, 2, 6), (s0, 0, s1))]                  # a broadcast axis
    us = [rng.normal(size=shape) for shape, _ in forms]

    def loss(p, us, strided):
        return sum(np.sum(strided(p, shape, strides) * u) for (shape, strides), u in zip(forms, us))

    for backend, step in compile_both(lambda p, us: loss(p, us, mj.as_strided)).items():
        value, grad = step(x, us)
        np.testing.assert_allclose(value, loss(x, us, as_strided), rtol=1e-12, err_msg=backend)
        check_vjp_fd(lambda xs: loss(xs[0], us, as_strided), [x], np.float64(1.0), [grad], rng=rng, what=backend)
    for shape, strides in [((3,), (s1 // 2,)), ((4, 2), (s0, 2 * s0)), ((7, 6), (s0, s1)), ((2,), (-s1,))]:
        with pytest.raises(mj.UnsupportedError, match="as_strided"):
            mj.trace(lambda p: np.sum(mj.as_strided(p, shape, strides)), x)
    with pytest.raises(mj.UnsupportedError, match="mj.as_strided"):
        mj.trace(lambda p: np.sum(as_strided(p, (2, 6), (s0, s1))), x)
    assert mj.trace(lambda p: np.sum(mj.as_strided(p, (2, 2), p.strides)), x).outputs


# ---------------------------------------------------------------------------------------------
# Convolutions: every option in one loss

CONV_CASES = [  # (name, input shape, weight shape, options, channels_last)
    ("plain", (2, 3, 6, 5), (4, 3, 3, 2), dict(), False),
    ("stride-pad", (2, 3, 7, 6), (4, 3, 3, 3), dict(stride=2, padding=1), False),
    ("dilation-same", (2, 3, 7, 6), (2, 3, 3, 2), dict(padding="same", dilation=(2, 1)), False),
    ("groups-pairs", (2, 4, 6, 5), (6, 2, 2, 2), dict(groups=2, padding=((1, 0), (0, 2))), False),
    ("depthwise", (2, 4, 6, 5), (4, 1, 3, 3), dict(groups=4, padding=1), False),
    ("nhwc", (2, 6, 5, 3), (4, 3, 2, 3), dict(stride=(1, 2), padding=(1, 1)), True),
    ("nhwc-depthwise", (2, 6, 5, 3), (3, 1, 3, 3), dict(groups=3, dilation=2, padding=2), True),
]
METHODS = ["gemm", "direct"]


def conv_loss(p, us, conv2d, conv1d, conv3d, picks=None):
    """The conv cases with each method (forced where ``conv2d`` takes one), conv1d and conv3d;
    ``picks`` (case index, method index) restricts the conv2d terms (numba compiles small programs)."""
    total = 0.0
    for k, (name, _, _, options, last) in enumerate(CONV_CASES):
        for m, method in enumerate(METHODS):
            if picks is not None and (k, m) not in picks:
                continue
            kw = dict(options, layout="NHWC" if last else "NCHW", method=method) if conv2d is mj.conv2d else \
                dict(options, channels_last=last)
            out = conv2d(p[f"x{k}"], p[f"w{k}"], p[f"b{k}"], **kw)
            total = total + np.sum(out * us[2 * k + m])
    if picks is not None and "nd" not in picks:
        return total
    total = total + np.sum(conv1d(p["x1d"], p["w1d"], None, stride=2, padding=1) * us[-2])
    return total + np.sum(conv3d(p["x3d"], p["w3d"], p["b3d"], padding=(0, 1, 1)) * us[-1])


def conv_params(rng):
    p = {}
    for k, (_, xs, ws, _, _) in enumerate(CONV_CASES):
        p[f"x{k}"], p[f"w{k}"], p[f"b{k}"] = rng.normal(size=xs), rng.normal(size=ws), rng.normal(size=ws[0])
    p.update(x1d=rng.normal(size=(2, 3, 9)), w1d=rng.normal(size=(2, 3, 3)),
             x3d=rng.normal(size=(1, 2, 4, 3, 3)), w3d=rng.normal(size=(2, 2, 2, 2, 2)), b3d=rng.normal(size=2))
    return p


def ref_conv_nd(x, w, b=None, **kw):
    kw.pop("method", None)
    return ref_conv(x, w, b, **kw)


def conv_setup():
    rng = np.random.default_rng(2)
    p = conv_params(rng)
    outs = [ref_conv(p[f"x{k}"], p[f"w{k}"], p[f"b{k}"], channels_last=case[4], **case[3])
            for k, case in enumerate(CONV_CASES)]
    us = [rng.normal(size=o.shape) for o in outs for _ in METHODS]
    us += [rng.normal(size=ref_conv(p["x1d"], p["w1d"], stride=2, padding=1).shape),
           rng.normal(size=ref_conv(p["x3d"], p["w3d"], padding=(0, 1, 1)).shape)]
    return rng, p, us


REFS = (ref_conv_nd, ref_conv_nd, ref_conv_nd)
# numba's compile time grows faster than a program's size: it compiles a few small programs that
# cover each layout, method, stride, padding, dilation and grouping at least once.
NUMBA_PICKS = [((1, 0), (4, 1)), ((5, 0), (3, 1)), ((2, 0), (6, 1), "nd")]


@pytest.mark.parametrize("picks", [None] + NUMBA_PICKS, ids=["interp-all"] + [f"numba-{k}" for k in range(3)])
def test_conv_every_option_values_and_gradients(picks):
    rng, p, us = conv_setup()
    keys = sorted(p)
    backend = "interp" if picks is None else "numba"
    step = mj.compile_loss(lambda p, us: conv_loss(p, us, mj.conv2d, mj.conv1d, mj.conv3d, picks), backend=backend,
                           static_shapes=True)
    value, grads = step(p, us)
    np.testing.assert_allclose(value, conv_loss(p, us, *REFS, picks), rtol=1e-12, err_msg=backend)
    check_vjp_fd(lambda xs: conv_loss(dict(zip(keys, xs)), us, *REFS, picks), [p[k] for k in keys], np.float64(1.0),
                 [grads[k] for k in keys], rng=rng, what=backend)


def test_conv_float32_matches_float64():
    rng = np.random.default_rng(3)
    x, w, b = rng.normal(size=(3, 2, 6, 6)), rng.normal(size=(5, 2, 3, 3)), rng.normal(size=5)
    loss = mj.compile_loss(lambda p, x: np.sum(np.tanh(mj.conv2d(x, p["w"], p["b"], padding=1))), argnums=(0, 1))
    v64, g64 = loss({"w": w, "b": b}, x)
    v32, g32 = loss({"w": w.astype(np.float32), "b": b.astype(np.float32)}, x.astype(np.float32))
    assert v32.dtype == np.float32 and g32[1].dtype == np.float32
    np.testing.assert_allclose(v32, v64, rtol=1e-5)
    np.testing.assert_allclose(g32[0]["w"], g64[0]["w"], rtol=1e-4, atol=1e-4)


def test_conv_transpose2d_and_pooling_values_and_gradients():
    rng = np.random.default_rng(4)
    p = {"x": rng.normal(size=(2, 4, 4, 3)), "w": rng.normal(size=(4, 3, 3, 2)),
         "xg": rng.normal(size=(1, 4, 3, 3)), "wg": rng.normal(size=(4, 1, 2, 2)),
         "xp": rng.normal(size=(2, 3, 7, 6)), "xn": rng.normal(size=(2, 6, 7, 3))}
    opts = dict(stride=(2, 1), padding=(1, 0), output_padding=(1, 0), dilation=(1, 2))

    def loss(p, us, ns, picked=range(7)):
        terms = [ns.conv_transpose2d(p["x"], p["w"], **opts),
                 ns.conv_transpose2d(p["xg"], p["wg"], stride=2, groups=2),
                 ns.max_pool2d(p["xp"], 3, 2, 1), ns.avg_pool2d(p["xp"], 2, 1, 1),
                 ns.avg_pool2d(p["xp"], 3, 2, 1, count_include_pad=False), ns.max_pool2d(p["xn"], 2, 2, 0, layout="NHWC"),
                 ns.avg_pool2d(p["xn"], 3, 2, 1, count_include_pad=False, layout="NHWC")]
        return sum(np.sum(t * u) for k, (t, u) in enumerate(zip(terms, us)) if k in picked)

    class Ref:
        @staticmethod
        def conv_transpose2d(x, w, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
            pair = lambda v: (v, v) if np.ndim(v) == 0 else v   # noqa: E731
            if groups > 1:
                halves = [Ref.conv_transpose2d(x[:, k * 2:(k + 1) * 2], w[k * 2:(k + 1) * 2], stride)
                          for k in range(groups)]
                return np.concatenate(halves, axis=1)
            return ref_conv_transpose2d(x, w, pair(stride), pair(padding), pair(output_padding), pair(dilation))

        @staticmethod
        def max_pool2d(x, k, s, pad, layout="NCHW"):
            last = layout == "NHWC"
            out = ref_pool(np.moveaxis(x, -1, 1) if last else x, k, s, pad, np.max, -np.inf)
            return np.moveaxis(out, 1, -1) if last else out

        @staticmethod
        def avg_pool2d(x, k, s, pad, count_include_pad=True, layout="NCHW"):
            last = layout == "NHWC"
            x = np.moveaxis(x, -1, 1) if last else x
            out = ref_pool(x, k, s, pad, np.sum, 0.0)
            count = k * k if count_include_pad else ref_pool(np.ones_like(x), k, s, pad, np.sum, 0.0)
            return np.moveaxis(out / count, 1, -1) if last else out / count

    shapes = [np.shape(t) for t in (ref_conv_transpose2d(p["x"], p["w"], *(opts[k] for k in (
        "stride", "padding", "output_padding", "dilation"))), Ref.conv_transpose2d(p["xg"], p["wg"], 2, groups=2),
        Ref.max_pool2d(p["xp"], 3, 2, 1), Ref.avg_pool2d(p["xp"], 2, 1, 1), Ref.avg_pool2d(p["xp"], 3, 2, 1, False),
        Ref.max_pool2d(p["xn"], 2, 2, 0, "NHWC"), Ref.avg_pool2d(p["xn"], 3, 2, 1, False, "NHWC"))]
    us = [rng.normal(size=s) for s in shapes]
    keys = sorted(p)
    for backend, picked in [("interp", range(7)), ("numba", (0, 2, 6))]:   # small numba programs compile fast
        step = mj.compile_loss(lambda p, us: loss(p, us, mj, picked), backend=backend, static_shapes=True)
        value, grads = step(p, us)
        np.testing.assert_allclose(value, loss(p, us, Ref, picked), rtol=1e-12, err_msg=backend)
        check_vjp_fd(lambda xs: loss(dict(zip(keys, xs)), us, Ref, picked), [p[k] for k in keys], np.float64(1.0),
                     [grads[k] for k in keys], rng=rng, what=backend, retries=1)


def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    rng = np.random.default_rng(5)
    x, w, z = rng.normal(size=(2, 4, 4, 3)), rng.normal(size=(4, 3, 3, 3)), rng.normal(size=(2, 3, 8, 5))
    y = mj.conv_transpose2d(x, w, stride=2, padding=1, output_padding=(1, 0))
    assert y.shape == z.shape
    np.testing.assert_allclose(np.sum(y * z), np.sum(x * mj.conv2d(z, w, stride=2, padding=1)), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool_ties_go_to_the_first_maximum_like_pytorch(backend):
    """Overlapping windows (a scatter-add) and windows tiling the input (a store per element)."""
    rng = np.random.default_rng(6)
    x = rng.integers(-1, 2, size=(2, 2, 6, 6)).astype(np.float64)   # many ties
    x[0, 0, 1, 1] = np.nan                                        # a NaN is maximal (and wins)
    pools = [(3, 2, 1), (2, 2, 0)]
    us = [rng.normal(size=ref_pool(x, *pool, np.max, -np.inf).shape) for pool in pools]
    step = mj.compile_loss(lambda x, us: sum(np.sum(mj.max_pool2d(x, *pool) * u) for pool, u in zip(pools, us)),
                           backend=backend)
    value, grad = step(x, us)
    assert np.isnan(value)
    expected = sum(ref_max_pool_grad(np.where(np.isnan(x), np.inf, x), *pool, u) for pool, u in zip(pools, us))
    np.testing.assert_array_equal(grad, expected)
    assert np.sum(grad) == pytest.approx(sum(np.sum(u) for u in us))   # each cotangent goes to one element
    value, _ = step(np.ones_like(x), us)
    assert value == pytest.approx(sum(np.sum(u) for u in us))
    if backend == "numba":
        plan = step.explain(x, us).plan_text()
        assert plan.count("scatter over") == 1       # the tiling pool's gradient is stored, not scattered


def test_the_method_shows_in_the_plan():
    x, w = np.ones((2, 3, 6, 6)), np.ones((4, 3, 3, 3))
    gemm = mj.compile_loss(lambda w, x: np.sum(mj.conv2d(x, w, method="gemm")))
    direct = mj.compile_loss(lambda w, x: np.sum(mj.conv2d(x, w, method="direct")))
    gemm_plan, direct_plan = gemm.explain(w, x).plan_text(), direct.explain(w, x).plan_text()
    assert "  gemm " in gemm_plan and "  gemm " not in direct_plan
    assert "sum[i4,i5,i6]" in direct.explain(w, x).plan_text()    # channels and taps summed innermost
    depthwise = mj.compile_loss(lambda w, x: np.sum(mj.conv2d(x, w, groups=3)))
    assert "  gemm " not in depthwise.explain(np.ones((3, 1, 3, 3)), x).plan_text()   # auto: direct


def test_conv_errors_name_the_problem():
    x, w = np.ones((2, 3, 6, 6)), np.ones((4, 3, 3, 3))
    cases = [(lambda x: mj.conv2d(x, np.ones((4, 2, 3, 3))), "groups"),
             (lambda x: mj.conv2d(x, w, layout="CHWN"), "layout"),
             (lambda x: mj.conv2d(x, w, stride=2, padding="same"), "stride 1"),
             (lambda x: mj.conv2d(x, np.ones((4, 3, 9, 3))), "do not fit"),
             (lambda x: mj.conv2d(x, w, padding=(1, 2, 3)), "padding"),
             (lambda x: mj.max_pool2d(x, 2, padding=2), "half the kernel"),
             (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), stride=2, output_padding=2), "output_padding")]
    for fn, message in cases:
        with pytest.raises((mj.ShapeError, mj.UnsupportedError), match=message):
            mj.trace(lambda x: np.sum(fn(x)), x)


X4, W4 = np.ones((2, 3, 6, 6)), np.ones((4, 3, 3, 3))
BAD_ARGUMENTS = [   # (call on x of shape (2, 3, 6, 6), the function and the argument its error names)
    (lambda x: mj.conv2d(x, W4, stride=0), "conv2d: stride"),
    (lambda x: mj.conv2d(x, W4, stride=-1), "conv2d: stride"),
    (lambda x: mj.conv2d(x, W4, stride=(1, 0)), "conv2d: stride"),
    (lambda x: mj.conv2d(x, W4, stride=(1,)), "conv2d: stride must be an int or 2 ints"),
    (lambda x: mj.conv2d(x, W4, stride=1.5), "conv2d: stride must be an int"),
    (lambda x: mj.conv2d(x, W4, stride=True), "conv2d: stride must be an int"),
    (lambda x: mj.conv2d(x, W4, dilation=0), "conv2d: dilation"),
    (lambda x: mj.conv2d(x, W4, dilation=(1, -1)), "conv2d: dilation"),
    (lambda x: mj.conv2d(x, W4, padding=-1), "conv2d: padding must be at least 0"),
    (lambda x: mj.conv2d(x, W4, padding=((0, 1), (-1, 0))), "conv2d: padding must be at least 0"),
    (lambda x: mj.conv2d(x, W4, padding=1.5), "conv2d: padding must be"),
    (lambda x: mj.conv2d(x, W4, padding="full"), "conv2d: padding must be"),
    (lambda x: mj.conv2d(x, W4, groups=0), "conv2d: groups"),
    (lambda x: mj.conv2d(x, np.ones((4, 1, 3, 3)), groups=2), "conv2d: groups=2 must divide"),
    (lambda x: mj.conv2d(x, W4, groups=1.0), "conv2d: groups"),
    (lambda x: mj.conv2d(x, np.ones((4, 3, 0, 3))), "conv2d: the kernel size"),
    (lambda x: mj.conv2d(x, np.ones((4, 3, 7, 3))), "conv2d: a kernel of size .* does not fit"),
    (lambda x: mj.conv2d(x, W4, dilation=3), "conv2d: a kernel of size .* dilation"),
    (lambda x: mj.conv2d(x, W4, np.ones((2, 2))), "conv2d: the bias"),
    (lambda x: mj.conv1d(x[:, :, 0], np.ones((4, 3, 3)), stride=0), "conv1d: stride"),
    (lambda x: mj.conv3d(x[..., None], np.ones((4, 3, 3, 3, 1)), dilation=0), "conv3d: dilation"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), stride=0), "conv_transpose2d: stride"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), padding=-1), "conv_transpose2d: padding"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), output_padding=-1), "conv_transpose2d: output_padding"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), dilation=0), "conv_transpose2d: dilation"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), groups=0), "conv_transpose2d: groups"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), groups=2), "conv_transpose2d: groups=2"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), padding=4), "conv_transpose2d: padding .* nothing"),
    (lambda x: mj.conv_transpose2d(x, np.ones((3, 2, 3, 3)), np.ones(3)), "conv_transpose2d: the bias"),
    (lambda x: mj.max_pool2d(x, 0), "max_pool2d: kernel_size"),
    (lambda x: mj.max_pool2d(x, (2,)), "max_pool2d: kernel_size"),
    (lambda x: mj.max_pool2d(x, 2.0), "max_pool2d: kernel_size"),
    (lambda x: mj.max_pool2d(x, 2, stride=0), "max_pool2d: stride"),
    (lambda x: mj.max_pool2d(x, 2, padding=-1), "max_pool2d: padding"),
    (lambda x: mj.max_pool2d(x, 2, dilation=0), "max_pool2d: dilation"),
    (lambda x: mj.max_pool2d(x, 7), "max_pool2d: a kernel of size"),
    (lambda x: mj.avg_pool2d(x, 0), "avg_pool2d: kernel_size"),
    (lambda x: mj.avg_pool2d(x, 2, stride=(0, 1)), "avg_pool2d: stride"),
    (lambda x: mj.avg_pool2d(x, 3, padding=2), "avg_pool2d: padding .* half the kernel"),
]


@pytest.mark.parametrize("call, message", BAD_ARGUMENTS, ids=[m for _, m in BAD_ARGUMENTS])
def test_every_convolution_and_pooling_argument_is_checked_as_in_pytorch(call, message):
    with pytest.raises(mj.ShapeError) as error:
        mj.trace(lambda x: np.sum(call(x)), X4)
    assert re.match(message, error.value.message), error.value.message   # (the user's line shows the message too)
    assert error.value.loc.filename == __file__


def test_the_smallest_valid_arguments_are_accepted():
    """Stride and dilation 1, padding 0 and half the (dilated) pooling window, output of one element."""
    x = np.random.default_rng(6).normal(size=(1, 2, 3, 3))
    program = mj.trace(lambda x: [mj.conv2d(x, np.ones((2, 2, 3, 3)), padding=0, stride=(1, 1), dilation=1),
                                  mj.max_pool2d(x, 2, padding=1, dilation=2), mj.avg_pool2d(x, 3, stride=3),
                                  mj.conv_transpose2d(x, np.eye(2).reshape(2, 2, 1, 1), padding=1)], x)
    conv, pool, avg, transposed = mj.run(program, x)
    assert conv.shape == (1, 2, 1, 1) and pool.shape == (1, 2, 2, 2) and avg.shape == (1, 2, 1, 1)
    np.testing.assert_allclose(transposed, x[:, :, 1:2, 1:2])


# ---------------------------------------------------------------------------------------------
# SciPy's convolutions

SIGNAL_SHAPES = [((7,), (3,)), ((7,), (4,)), ((3,), (6,)), ((5, 6), (2, 3)), ((2, 3), (4, 5)), ((9, 10), (9, 8))]


def signal_terms(a, b, fns, modes=("full", "same", "valid")):
    """Every function and mode on one pair (the 2-D ones only on 2-D arrays)."""
    return [f(a, b, mode) for k, f in enumerate(fns) if k < 2 or a.ndim == 2 for mode in modes]


def test_signal_functions_match_scipy_in_every_mode():
    import scipy.signal as ss
    rng = np.random.default_rng(8)
    mine = (mj.signal.convolve, mj.signal.correlate, mj.signal.convolve2d, mj.signal.correlate2d)
    theirs = (ss.convolve, ss.correlate, ss.convolve2d, ss.correlate2d)
    for sa, sb in SIGNAL_SHAPES:
        a, b = rng.normal(size=sa), rng.normal(size=sb)
        program = mj.trace(lambda a, b: signal_terms(a, b, mine), a, b)
        for out, expected in zip(mj.run(program, a, b), signal_terms(a, b, theirs)):
            np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mj.signal.correlate2d(a, b, "same", fillvalue=2.0),
                               ss.correlate2d(a, b, "same", fillvalue=2.0))
    fill = mj.trace(lambda a, b: mj.signal.convolve2d(a, b, "same", fillvalue=-1.5), a, b)
    np.testing.assert_allclose(mj.run(fill, a, b)[0], ss.convolve2d(a, b, "same", fillvalue=-1.5), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_signal_gradients(backend):
    import scipy.signal as ss
    rng = np.random.default_rng(9)
    a1, b1, a2, b2 = (rng.normal(size=s) for s in ((9,), (4,), (6, 5), (3, 2)))
    big = rng.normal(size=(9, 10))   # a kernel of 90 elements: im2col + GEMM

    def loss(xs, us, sig):
        a1, b1, a2, b2, big = xs
        terms = [sig.convolve(a1, b1), sig.correlate(b1, a1, "valid"), sig.convolve2d(a2, b2, "same"),
                 sig.correlate2d(a2, b2, "full", fillvalue=0.5), sig.correlate(big, big[::2, ::3], "same")]
        return sum(np.sum(t * u) for t, u in zip(terms, us))

    xs = [a1, b1, a2, b2, big]
    us = [rng.normal(size=np.shape(t)) for t in (ss.convolve(a1, b1), ss.correlate(b1, a1, "valid"),
                                                 ss.convolve2d(a2, b2, "same"), ss.correlate2d(a2, b2),
                                                 ss.correlate(big, big[::2, ::3], "same"))]
    value, grads = mj.compile_loss(lambda xs, us: loss(xs, us, mj.signal), backend=backend, static_shapes=True)(xs, us)
    np.testing.assert_allclose(value, loss(xs, us, ss), rtol=1e-12)
    check_vjp_fd(lambda xs: loss(xs, us, ss), xs, np.float64(1.0), list(grads), rng=rng, what=backend)


def test_signal_errors():
    import scipy.signal as ss
    with pytest.raises(mj.UnsupportedError, match="call mj.signal.convolve instead") as error:
        mj.trace(lambda a: np.sum(ss.convolve(a, np.ones(3))), np.ones(5))
    assert error.value.loc.filename == __file__ and "ss.convolve(a" in error.value.loc.code   # the user's line
    from numpy.lib.stride_tricks import as_strided   # NumPy's own, taken before the trace replaces it
    with pytest.raises(mj.UnsupportedError, match="call mj.as_strided") as error:
        mj.trace(lambda a: np.sum(as_strided(a, (2, 2), (8, 8))), np.ones(5))
    assert error.value.loc.filename == __file__ and "as_strided(a" in error.value.loc.code
    with pytest.raises(mj.ShapeError, match="at least as large"):
        mj.trace(lambda a: np.sum(mj.signal.convolve(a, np.ones((3, 1)), "valid")), np.ones((2, 4)))
    with pytest.raises(mj.UnsupportedError, match="boundary='wrap'"):
        mj.trace(lambda a: np.sum(mj.signal.convolve2d(a, np.ones((2, 2)), boundary="wrap")), np.ones((3, 3)))
    for bad in (dict(method="bogus"), dict(mode="bogus")):   # SciPy's errors
        with pytest.raises(ValueError):
            ss.convolve(np.ones(5), np.ones(3), **bad)
        for function in (mj.signal.convolve, mj.signal.correlate):
            with pytest.raises(ValueError):
                mj.trace(lambda a: np.sum(function(a, np.ones(3), **bad)), np.ones(5))


# ---------------------------------------------------------------------------------------------
# PyTorch, where it is importable (not in the test environment; the bench environment has it)

TORCH_CASES = [  # (name, morphjit function, PyTorch function given F, input shapes, integer inputs for ties)
    ("conv2d-same-dilation", lambda x, w, b: mj.conv2d(x, w, b, padding="same", dilation=(2, 1)),
     lambda F, x, w, b: F.conv2d(x, w, b, padding="same", dilation=(2, 1)), [(2, 3, 7, 6), (4, 3, 2, 4), (4,)], False),
    ("conv2d-nhwc-depthwise", lambda x, w: mj.conv2d(x, w, groups=3, padding=1, layout="NHWC"),
     lambda F, x, w: F.conv2d(x.permute(0, 3, 1, 2), w, groups=3, padding=1).permute(0, 2, 3, 1),
     [(2, 6, 5, 3), (3, 1, 3, 3)], False),
    ("conv_transpose2d", lambda x, w: mj.conv_transpose2d(x, w, stride=(2, 1), padding=(1, 0), output_padding=(1, 0),
                                                            dilation=(1, 2)),
     lambda F, x, w: F.conv_transpose2d(x, w, stride=(2, 1), padding=(1, 0), output_padding=(1, 0), dilation=(1, 2)),
     [(2, 4, 4, 3), (4, 3, 3, 2)], False),
    ("max_pool2d-ties", lambda x: mj.max_pool2d(x, 3, 2, 1), lambda F, x: F.max_pool2d(x, 3, 2, 1), [(2, 2, 7, 6)], True),
    ("avg_pool2d", lambda x: mj.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
     lambda F, x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [(2, 2, 7, 6)], False),
]


@pytest.mark.parametrize("name,mine,theirs,shapes,ties", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_against_pytorch(name, mine, theirs, shapes, ties):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(10)
    xs = [rng.integers(-2, 3, size=s).astype(float) if ties else rng.normal(size=s) for s in shapes]
    u = rng.normal(size=mine(*xs).shape)
    value, grads = mj.compile_loss(lambda *a: np.sum(mine(*a) * u), argnums=tuple(range(len(xs))),
                                   backend="interp")(*xs)
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    out = (theirs(F, *ts) * torch.tensor(u)).sum()
    out.backward()
    np.testing.assert_allclose(value, out.item(), rtol=1e-12)
    for g, t in zip(grads, ts):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12, atol=1e-12)


def ref_torch_pool(x, k, s, pad, kind, ceil_mode=False, count_include_pad=True, divisor_override=None):
    """PyTorch's CPU pooling kernels written out: the output extent and, per output element, the
    window clipped to the input (its padding for the average's count)."""
    n, c, h, w = x.shape

    def extent(size):
        out = (size + 2 * pad - k + ((s - 1) if ceil_mode else 0)) // s + 1
        return out - 1 if ceil_mode and (out - 1) * s >= size + pad else out
    oh, ow = extent(h), extent(w)
    out = np.zeros((n, c, oh, ow))
    for i, j in np.ndindex(oh, ow):
        h0, w0 = i * s - pad, j * s - pad
        h1, w1 = min(h0 + k, h + pad), min(w0 + k, w + pad)
        pool_size = (h1 - h0) * (w1 - w0)
        h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)
        patch = x[:, :, h0:h1, w0:w1]
        if kind == "max":
            out[:, :, i, j] = patch.max(axis=(2, 3))
        else:
            divisor = divisor_override or (pool_size if count_include_pad else (h1 - h0) * (w1 - w0))
            out[:, :, i, j] = patch.sum(axis=(2, 3)) / divisor
    return out


POOLS = [("max", dict(k=2, s=2, pad=0, ceil_mode=True)),
         ("max", dict(k=3, s=2, pad=1, ceil_mode=True)),
         ("avg", dict(k=2, s=2, pad=1, ceil_mode=True)),    # the last window would start in the padding: dropped
         ("avg", dict(k=3, s=2, pad=1, ceil_mode=True, count_include_pad=False)),
         ("avg", dict(k=3, s=2, pad=0, ceil_mode=True, divisor_override=4)),
         ("avg", dict(k=2, s=3, pad=0, ceil_mode=False, divisor_override=3))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ceil_mode_and_divisor_override_pool_as_pytorch_does(backend):
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, 2, 7, 8))

    def mj_pool(x, kind, o):
        keywords = {key: v for key, v in o.items() if key not in ("k", "s", "pad")}
        pool = mj.max_pool2d if kind == "max" else mj.avg_pool2d
        return pool(x, o["k"], o["s"], o["pad"], **keywords)
    us = [rng.normal(size=ref_torch_pool(x, kind=kind, **o).shape) for kind, o in POOLS]
    floor = [ref_torch_pool(x, kind=kind, **{**o, "ceil_mode": False}).shape for kind, o in POOLS]
    assert [u.shape != f for u, f in zip(us, floor)] == [True, True, False, True, True, False]
    step = mj.compile_loss(lambda x, us: sum(np.sum(mj_pool(x, kind, o) * u) for (kind, o), u in zip(POOLS, us)),
                           backend=backend)
    value, grad = step(x, us)

    def reference(x):
        return sum(np.sum(ref_torch_pool(x, kind=kind, **o) * u) for (kind, o), u in zip(POOLS, us))
    np.testing.assert_allclose(value, reference(x), rtol=1e-12)
    check_vjp_fd(lambda xs: reference(xs[0]), [x], np.float64(1.0), [grad], rng=rng, what=backend, retries=1)


def test_pooling_takes_pytorchs_positional_order_and_conv_takes_bias():
    rng = np.random.default_rng(9)
    x, w, b = rng.normal(size=(1, 2, 5, 5)), rng.normal(size=(3, 2, 3, 3)), rng.normal(size=3)
    np.testing.assert_allclose(mj.avg_pool2d(x, 2, 2, 0, True), ref_torch_pool(x, 2, 2, 0, "avg", ceil_mode=True))
    np.testing.assert_allclose(mj.max_pool2d(x, 2, 2, 0, 1, True), ref_torch_pool(x, 2, 2, 0, "max", ceil_mode=True))
    np.testing.assert_allclose(mj.conv2d(x, w, bias=b), ref_conv(x, w, b), rtol=1e-12)
    np.testing.assert_allclose(mj.conv2d(x, w, b=b), ref_conv(x, w, b), rtol=1e-12)
    with pytest.raises(TypeError, match="both bias= and b="):
        mj.conv2d(x, w, b=b, bias=b)
    with pytest.raises(mj.UnsupportedError, match="return_indices"):
        mj.max_pool2d(x, 2, return_indices=True)
    with pytest.raises(mj.ShapeError, match="ceil_mode must be True or False"):
        mj.max_pool2d(x, 2, ceil_mode="yes")
    with pytest.raises(mj.ShapeError, match="divisor_override must be a positive int"):
        mj.avg_pool2d(x, 2, divisor_override=0)
