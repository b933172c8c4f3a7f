"""Convolutions and pooling, over the window views of ``morphjit.api.stride_tricks``.

A convolution is a window view followed by a contraction, in one of two forms chosen per shape:
``gemm`` copies the windows into an im2col buffer and multiplies it with the weights by one GEMM
(the bias and activation then run over its result), ``direct`` multiplies and sums inside one
loop nest that reads ``x`` through the window map (no copy; small channel counts, depthwise).
The plan (``loss.explain``) shows which: a ``gemm`` reading the copied windows, or a ``reduce``
nest. Max pooling is the op ``window_max`` (the maximum over the window axes, in
``morphjit.ops.windows``) whose gradient goes to the first maximal element of each window in
row-major order, as in PyTorch.
"""
from __future__ import annotations

import math

import numpy as np

from ..util import ShapeError, UnsupportedError, user_location
from . import core as A
from .contractions import einsum
from .indexing import getitem
from .stride_tricks import unwindow, window, window_values, windows

# ---------------------------------------------------------------------------------------------
# Argument helpers


def _per_axis(values, spatial, ndim: int) -> tuple[int, ...]:
    """Per-spatial-axis ``values`` as one value per axis of an ``ndim``-axis array (1 elsewhere)."""
    return tuple(values[spatial.index(a)] if a in spatial else 1 for a in range(ndim))


def _merge_groups(out, at: int):
    """Axes ``at`` (groups) and ``at + 1`` (channels per group) as one channel axis."""
    return A.reshape(out, out.shape[:at] + (out.shape[at] * out.shape[at + 1],) + out.shape[at + 2:])


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _ints(op: str, name: str, value, count: int, least: int) -> tuple[int, ...]:
    """``value`` (an int, or ``count`` of them) as ``count`` ints, each at least ``least``, as
    PyTorch's convolutions and poolings check their arguments."""
    values = (value,) * count if _is_int(value) else tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(values) != count or not all(_is_int(v) for v in values):
        raise ShapeError(f"{op}: {name} must be an int or {count} ints, got {value!r}", user_location())
    if any(v < least for v in values):
        raise ShapeError(f"{op}: {name} must be at least {least} (as in PyTorch), got {value!r}", user_location())
    return tuple(int(v) for v in values)


def _groups(op: str, groups, **channels: int) -> int:
    """``groups``: a positive int dividing the counts of ``channels`` (input, output)."""
    if not _is_int(groups) or groups < 1:
        raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}", user_location())
    if any(n % groups for n in channels.values()):
        counts = " and ".join(f"{n} {kind}" for kind, n in channels.items())
        raise ShapeError(f"{op}: groups={groups} must divide the {counts} channels", user_location())
    return int(groups)


def _kernel(op: str, sizes) -> tuple[int, ...]:
    if any(k < 1 for k in sizes):
        raise ShapeError(f"{op}: the kernel size {tuple(sizes)} must be at least 1 along every axis", user_location())
    return tuple(sizes)


def _check_fits(op: str, extents, pads, sizes, dilation) -> None:
    """Every window (``dilation`` apart taps of ``sizes``) fits the padded input: an output of at
    least one element per axis."""
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(extents, pads))
    if any(n < d * (k - 1) + 1 for n, k, d in zip(padded, sizes, dilation)):
        raise ShapeError(f"{op}: a kernel of size {tuple(sizes)} with dilation {tuple(dilation)} does not fit the "
                         f"input of spatial size {tuple(extents)} padded to {padded}: the output would be empty",
                         user_location())


def _bias(op: str, b, channels: int):
    b = A.as_array(b)
    if b.shape != (channels,):
        raise ShapeError(f"{op}: the bias must have shape ({channels},) (one per output channel), got {b.shape}",
                         user_location())
    return b


# ---------------------------------------------------------------------------------------------
# Convolutions


LAYOUTS = {"NCW": 1, "NCHW": 2, "NCDHW": 3, "NWC": 1, "NHWC": 2, "NDHWC": 3}


def _spatial_axes(layout: str, nd: int, op: str) -> tuple[int, tuple[int, ...]]:
    """The channel axis and the spatial axes of ``layout`` (channels first or last)."""
    if LAYOUTS.get(layout) != nd:
        options = ", ".join(k for k, v in LAYOUTS.items() if v == nd)
        raise ShapeError(f"{op}: layout {layout!r} is not one of {options}", user_location())
    return (1, tuple(range(2, 2 + nd))) if layout[1] == "C" else (nd + 1, tuple(range(1, 1 + nd)))


def _padding(padding, nd: int, sizes, dilation, stride, op: str) -> list[tuple[int, int]]:
    """``padding`` as (before, after) per spatial axis: 'valid', 'same' (PyTorch's split: the
    extra element after), an int, ints per axis, or pairs per axis."""
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":
        if any(s != 1 for s in stride):
            raise UnsupportedError(f"{op}: padding='same' needs stride 1 (as in PyTorch)", user_location())
        return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(sizes, dilation)]
    pads = [padding] * nd if _is_int(padding) else list(padding) if isinstance(padding, (tuple, list)) else []
    pairs = [(p, p) if _is_int(p) else tuple(p) if isinstance(p, (tuple, list)) else () for p in pads]
    if len(pairs) != nd or not all(len(p) == 2 and all(_is_int(e) for e in p) for p in pairs):
        raise ShapeError(f"{op}: padding must be 'valid', 'same', an int, {nd} ints or {nd} (before, after) pairs, "
                         f"got {padding!r}", user_location())
    if any(e < 0 for p in pairs for e in p):
        raise ShapeError(f"{op}: padding must be at least 0 (as in PyTorch), got {padding!r}", user_location())
    return [(int(lo), int(hi)) for lo, hi in pairs]


def padded(x, spatial, pads, fill=0.0):
    """``x`` inside a border of ``fill``: one copy into zeros (its gradient is a slice, a view),
    and for another fill a ``where`` that fuses into the reader."""
    if not any(lo or hi for lo, hi in pads):
        return x
    widths = [(0, 0)] * x.ndim
    for a, p in zip(spatial, pads):
        widths[a] = p
    shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, widths))
    stops = tuple(lo + n for n, (lo, _) in zip(x.shape, widths))
    out = A.unslice(x, shape, tuple(lo for lo, _ in widths), stops, (1,) * x.ndim)
    if fill == 0.0:
        return out
    inside = np.zeros(tuple(shape[a] for a in spatial), bool)
    inside[tuple(slice(lo, n + lo) for (lo, _), n in zip(pads, (x.shape[a] for a in spatial)))] = True
    inside = inside.reshape(inside.shape + (1,) * (x.ndim - 1 - spatial[-1]))
    return A.where(inside, out, fill)


def choose_method(in_per_group: int, out_per_group: int) -> str:
    """A direct loop nest where both channel counts per group are small (depthwise: 1 and 1),
    where a GEMM would have a tiny dimension; im2col + GEMM otherwise."""
    return "direct" if in_per_group * out_per_group <= 4 else "gemm"


def conv(x, w, b=None, *, nd, stride=1, padding=0, dilation=1, groups=1, layout=None, method="auto"):
    """N-d convolution (cross-correlation, as in PyTorch): ``x`` in ``layout``, ``w`` of shape
    ``(out channels, in channels // groups, *kernel)``, ``b`` of shape ``(out channels,)``."""
    op = f"conv{nd}d"
    x, w = A.as_array(x), A.as_array(w)
    layout = layout or ("NCW", "NCHW", "NCDHW")[nd - 1]
    channel, spatial = _spatial_axes(layout, nd, op)
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        raise ShapeError(f"{op}: expected input and weight of {nd + 2} dimensions, got {x.shape} and {w.shape}",
                         user_location())
    sizes, stride = _kernel(op, w.shape[2:]), _ints(op, "stride", stride, nd, 1)
    dilation = _ints(op, "dilation", dilation, nd, 1)
    c_in, c_out = x.shape[channel], w.shape[0]
    groups = _groups(op, groups, input=c_in, output=c_out)
    if w.shape[1] != c_in // groups:
        raise ShapeError(f"{op}: input of {c_in} channels, weight of shape {w.shape} and groups={groups} "
                         f"do not match (the weight's second axis is in channels // groups)", user_location())
    if method == "auto":
        method = choose_method(c_in // groups, c_out // groups)
    if method not in ("gemm", "direct"):
        raise ValueError(f"{op}: method must be 'auto', 'gemm' or 'direct', got {method!r}")
    pads = _padding(padding, nd, sizes, dilation, stride, op)
    _check_fits(op, tuple(x.shape[a] for a in spatial), pads, sizes, dilation)
    b = None if b is None else _bias(op, b, c_out)
    if groups > 1:   # channels split into (groups, channels per group): a view of x's buffer
        x = A.reshape(x, x.shape[:channel] + (groups, c_in // groups) + x.shape[channel + 1:])
        w = A.reshape(w, (groups, c_out // groups) + w.shape[1:])
        spatial = tuple(a + (a > channel) for a in spatial)
    x = padded(x, spatial, pads)
    steps = _per_axis(stride, spatial, x.ndim)
    xw = window(x, *windows(x.shape, spatial, sizes, steps, dilation))
    out = _contract(xw, w, nd, channel == 1, groups > 1, method)
    if b is not None:
        out = A.add(out, A.reshape(b, (c_out,) + (1,) * nd if channel == 1 else (c_out,)))
    return out


def _contract(xw, w, nd: int, channels_first: bool, grouped: bool, method: str):
    """``out[n, o, p...] = sum_{c, k...} xw[n, c, p..., k...] w[o, c, k...]`` (per group ``g``
    where ``grouped``), channels first or last as in ``xw``; groups merge back into channels."""
    p, k, g = "HWD"[:nd], "ijk"[:nd], "g" if grouped else ""
    x_letters = ("n" + g + "c" + p if channels_first else "n" + p + g + "c") + k
    out_letters = "n" + g + "o" + p if channels_first else "n" + p + g + "o"
    contract = _gemm if method == "gemm" else _direct
    out = contract(xw, x_letters, w, g + "oc" + k, out_letters)
    return _merge_groups(out, out_letters.index("g")) if grouped else out


def _gemm(xw, x_letters, w, w_letters, out_letters):
    """im2col + GEMM: the windows copied as a matrix (rows: the contracted letters), the weights
    as the left operand (a view of their buffer), the product read back in the output layout."""
    sizes = dict(zip(x_letters, xw.shape)) | dict(zip(w_letters, w.shape))
    g = "g" if "g" in x_letters else ""
    summed = "".join(c for c in w_letters if c not in out_letters)
    kept = "".join(c for c in x_letters if c in out_letters and c != "g")
    extent = lambda letters: math.prod(sizes[c] for c in letters)   # noqa: E731
    col = A.reshape(A.transpose(xw, tuple(x_letters.index(c) for c in g + summed + kept)),
                    tuple(sizes[c] for c in g) + (extent(summed), extent(kept)))
    w2 = A.reshape(A.transpose(w, tuple(w_letters.index(c) for c in g + "o" + summed)),
                   tuple(sizes[c] for c in g) + (sizes["o"], extent(summed)))
    product = A.matmul(w2, col)                               # [g,] o, kept
    product_letters = g + "o" + kept
    product = A.reshape(product, tuple(sizes[c] for c in product_letters))
    return A.transpose(product, tuple(product_letters.index(c) for c in out_letters))


def _direct(xw, x_letters, w, w_letters, out_letters):
    """One loop nest: the product of the windows and the weights summed over the contracted
    letters, which come last (innermost, accumulated in a register)."""
    summed = "".join(c for c in w_letters if c not in out_letters)
    full = out_letters + summed
    sizes = dict(zip(x_letters, xw.shape)) | dict(zip(w_letters, w.shape))

    def spread(x, letters):
        present = "".join(c for c in full if c in letters)
        moved = A.transpose(x, tuple(letters.index(c) for c in present))
        return A.reshape(moved, tuple(sizes[c] if c in letters else 1 for c in full))

    product = A.multiply(spread(xw, x_letters), spread(w, w_letters))
    return A.sum(product, axis=tuple(range(len(out_letters), len(full))))


def conv1d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCW", method="auto", *, b=None):
    """1-D convolution as PyTorch's ``conv1d``: ``x`` NCW (or NWC), ``w`` (O, C // groups, k)."""
    return conv(x, w, _bias_argument(bias, b, "conv1d"), nd=1, stride=stride, padding=padding, dilation=dilation,
                groups=groups, layout=layout, method=method)


def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", method="auto", *, b=None):
    """2-D convolution as PyTorch's ``conv2d``: ``x`` NCHW (or NHWC), ``w`` (O, C // groups, kh, kw)."""
    return conv(x, w, _bias_argument(bias, b, "conv2d"), nd=2, stride=stride, padding=padding, dilation=dilation,
                groups=groups, layout=layout, method=method)


def conv3d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCDHW", method="auto", *, b=None):
    """3-D convolution as PyTorch's ``conv3d``: ``x`` NCDHW (or NDHWC), ``w`` (O, C // groups, kd, kh, kw)."""
    return conv(x, w, _bias_argument(bias, b, "conv3d"), nd=3, stride=stride, padding=padding, dilation=dilation,
                groups=groups, layout=layout, method=method)


def _bias_argument(bias, b, op: str):
    """The bias, given as PyTorch's ``bias=`` or morphjit's earlier ``b=``."""
    if bias is not None and b is not None:
        raise TypeError(f"{op}: both bias= and b= given; they are one argument (bias=, as in PyTorch)")
    return b if bias is None else bias


def conv_transpose2d(x, w, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, layout="NCHW",
                     *, b=None):
    """PyTorch's ``conv_transpose2d`` (the gradient of ``conv2d`` with respect to its input): ``w``
    of shape (C, O // groups, kh, kw). Each input element spreads ``w`` over its window of the
    output: a GEMM, then a scatter-add over the windows, then the padding cropped."""
    op, nd = "conv_transpose2d", 2
    b = _bias_argument(bias, b, op)
    x, w = A.as_array(x), A.as_array(w)
    channel, spatial = _spatial_axes(layout, nd, op)
    if x.ndim != 4 or w.ndim != 4 or x.shape[channel] != w.shape[0]:
        raise ShapeError(f"{op}: input {x.shape} ({layout}) and weight {w.shape} (in channels, out channels // "
                         f"groups, kh, kw) do not match", user_location())
    groups = _groups(op, groups, input=w.shape[0])
    sizes = _kernel(op, w.shape[2:])
    stride, dilation = _ints(op, "stride", stride, nd, 1), _ints(op, "dilation", dilation, nd, 1)
    pads, extra = _ints(op, "padding", padding, nd, 0), _ints(op, "output_padding", output_padding, nd, 0)
    if any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
        raise ShapeError(f"{op}: output_padding {extra} must be smaller than stride or dilation", user_location())
    full_sizes = [(x.shape[a] - 1) * s + d * (kk - 1) + 1 + e
                  for a, s, d, kk, e in zip(spatial, stride, dilation, sizes, extra)]
    if any(n - 2 * p < 1 for n, p in zip(full_sizes, pads)):
        raise ShapeError(f"{op}: padding {pads} crops the output of spatial size {tuple(full_sizes)} to nothing",
                         user_location())
    b = None if b is None else _bias(op, b, w.shape[1] * groups)
    first = channel == 1
    p, k = "HW", "ij"
    g = "g" if groups > 1 else ""
    x_letters = "n" + g + "c" + p if first else "n" + p + g + "c"
    cols_letters = ("n" + g + "o" + p if first else "n" + p + g + "o") + k
    if groups > 1:
        x = A.reshape(x, x.shape[:channel] + (groups, x.shape[channel] // groups) + x.shape[channel + 1:])
        w = A.reshape(w, (groups, w.shape[0] // groups) + w.shape[1:])
    cols = einsum(f"{x_letters},{g}co{k}->{cols_letters}", x, w)
    if groups > 1:
        cols = _merge_groups(cols, cols_letters.index("g"))
    full = list(cols.shape[:nd + 2])
    for a, n in zip(spatial, full_sizes):
        full[a] = n
    steps = _per_axis(stride, spatial, nd + 2)
    shape, coeffs = windows(tuple(full), spatial, sizes, steps, dilation)
    out = unwindow(cols, full, coeffs)
    if any(pads):
        key = tuple(slice(pads[spatial.index(a)], full[a] - pads[spatial.index(a)]) if a in spatial else slice(None)
                    for a in range(nd + 2))
        out = getitem(out, key)
    if b is not None:
        c_out = out.shape[channel]
        out = A.add(out, A.reshape(b, (c_out, 1, 1) if first else (c_out,)))
    return out


# ---------------------------------------------------------------------------------------------
# Pooling


def _pool_windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout, op, fill):
    """``x`` padded (on the right also by what ``ceil_mode`` adds: windows starting inside the
    input or its left padding, as in PyTorch), its windows, spatial axes, paddings and what
    ``ceil_mode`` added per spatial axis."""
    nd = 2
    _, spatial = _spatial_axes(layout, nd, op)
    x = A.as_array(x)
    if x.ndim != 4:
        raise ShapeError(f"{op}: expected a 4-d input ({layout}), got shape {x.shape}", user_location())
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise ShapeError(f"{op}: ceil_mode must be True or False, got {ceil_mode!r}", user_location())
    sizes = _ints(op, "kernel_size", kernel_size, nd, 1)
    stride = sizes if stride is None else _ints(op, "stride", stride, nd, 1)
    pads = _ints(op, "padding", padding, nd, 0)
    dilation = _ints(op, "dilation", dilation, nd, 1)
    if any(2 * p > d * (k - 1) + 1 for p, k, d in zip(pads, sizes, dilation)):
        raise ShapeError(f"{op}: padding {pads} must be at most half the kernel size {sizes} (with dilation "
                         f"{dilation}: as in PyTorch)", user_location())
    extents = tuple(x.shape[a] for a in spatial)
    _check_fits(op, extents, [(p, p) for p in pads], sizes, dilation)
    extra = [_ceil_extra(n, k, s, p, d) if ceil_mode else 0
             for n, k, s, p, d in zip(extents, sizes, stride, pads, dilation)]
    x = padded(x, spatial, [(p, p + e) for p, e in zip(pads, extra)], fill)
    steps = _per_axis(stride, spatial, x.ndim)
    shape, coeffs = windows(x.shape, spatial, sizes, steps, dilation)
    return x, shape, coeffs, spatial, pads, extra


def _ceil_extra(n: int, k: int, s: int, p: int, d: int) -> int:
    """The elements past the padded input the last window of PyTorch's ``ceil_mode`` reads: the
    output extent is rounded up, but the last window must start inside the input or the left
    padding."""
    span = d * (k - 1) + 1
    out = -(-(n + 2 * p - span) // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return max(0, (out - 1) * s + span - (n + 2 * p))


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False,
               layout="NCHW"):
    """PyTorch's ``max_pool2d`` (padding reads as -inf; ``ceil_mode`` rounds the output extent up,
    the last windows reading only what they overlap). The gradient of each window goes to its
    first maximal element in row-major order (a NaN counts as maximal), as in PyTorch."""
    if return_indices:
        raise UnsupportedError("max_pool2d: return_indices=True is not supported (the gradient already goes to each "
                               "window's first maximum); leave it out", user_location())
    x, shape, coeffs, *_ = _pool_windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout, "max_pool2d",
                                         -np.inf)
    axes = tuple(range(x.ndim, len(shape)))
    if A.trace_of([x]) is None:
        return np.max(window_values(x, shape, coeffs), axis=axes)
    return A.bind("window_max", [x], shape=shape, coeffs=coeffs, axes=axes)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None, layout="NCHW"):
    """PyTorch's ``avg_pool2d``: the sum of each window over its count, padding counted as zeros
    (with ``count_include_pad=False``, left out of the count; what ``ceil_mode`` adds past the
    padding never counts), or over ``divisor_override``."""
    x, shape, coeffs, spatial, pads, extra = _pool_windows(x, kernel_size, stride, padding, 1, ceil_mode, layout,
                                                           "avg_pool2d", 0.0)
    axes = tuple(range(x.ndim, len(shape)))
    total = A.sum(window(x, shape, coeffs), axis=axes)
    if divisor_override is not None:
        if not _is_int(divisor_override) or divisor_override < 1:
            raise ShapeError(f"avg_pool2d: divisor_override must be a positive int, got {divisor_override!r}",
                             user_location())
        return A.multiply(total, 1.0 / int(divisor_override))
    if not any(extra) and (count_include_pad or not any(pads)):
        return A.multiply(total, 1.0 / math.prod(shape[a] for a in axes))
    inside = np.zeros(tuple(x.shape[a] for a in spatial))
    counted = (0, 0) if count_include_pad else pads
    inside[tuple(slice(c, n - e - c) for c, n, e in zip(counted, inside.shape, extra))] = 1.0
    spatial_shape, spatial_coeffs = windows(inside.shape, (0, 1), tuple(shape[a] for a in axes),
                                            tuple(coeffs[a][a] for a in spatial))
    counts = window_values(inside, spatial_shape, spatial_coeffs).sum(axis=(2, 3))
    counts = counts.reshape(counts.shape + (1,)) if spatial[0] == 1 else counts
    return A.divide(total, counts.astype(A.dtype_of(x)))
