"""Sliding windows, convolutions and pooling.

A window view is an affine index map: ``window(x, shape, coeffs)`` reads ``x`` at
``sum_j coeffs[a][j] * i[j]`` along each axis ``a`` of ``x`` (``np.lib.stride_tricks``'s
``sliding_window_view``, and ``as_strided`` where the strides are multiples of ``x``'s own, with
stride and dilation folded into the coefficients). It owns no buffer: a consumer reads ``x``
through the composed map (MoA's psi-composition). Its transpose ``unwindow`` adds every element of
the cotangent into zeros at the position the view read it from (a scatter loop: col2im).

A convolution is a window view followed by a contraction, in one of two forms chosen per shape:
``gemm`` copies the windows into an im2col buffer and multiplies it with the weights by one GEMM
(the bias and activation then run over its result), ``direct`` multiplies and sums inside one
loop nest that reads ``x`` through the window map (no copy; small channel counts, depthwise).
The plan (``loss.explain``) shows which: a ``gemm`` reading the copied windows, or a ``reduce``
nest. Max pooling is the op ``window_max`` (the maximum over the window axes) whose gradient goes
to the first maximal element of each window in row-major order, as in PyTorch.
Loading this module registers the ops and ``np.lib.stride_tricks.sliding_window_view``.
"""
from __future__ import annotations

import math

import numpy as np

from . import array_api as A
from .errors import ShapeError, UnsupportedError, user_location
from .indexing import IndexMap
from .ir import Sym, TensorType
from .loopir import Const, Gather, Load, Nest, ScatterAdd, Store, loads, loop
from .einsum import einsum
from .ops import COMPOSITE, STRUCTURAL, VIEW, defop, reduced_shape

# ---------------------------------------------------------------------------------------------
# The ops: window (a view), unwindow (its transpose, a scatter-add), window_max (max pooling)


def _check_window(op: str, x_shape, shape, coeffs) -> None:
    """Every index the map reaches lies inside ``x_shape``; an axis read one to one needs no test
    (its extent may be the symbolic batch size)."""
    if len(coeffs) != len(x_shape) or any(len(row) != len(shape) for row in coeffs):
        raise ShapeError(f"{op}: coefficients {coeffs} do not map a view of {len(shape)} axes onto "
                         f"an array of {len(x_shape)}")
    if any(c < 0 for row in coeffs for c in row):
        raise ShapeError(f"{op}: negative coefficients in {coeffs}")
    if any(not isinstance(d, Sym) and d < 1 for d in shape):
        raise ShapeError(f"{op}: empty windows (view shape {tuple(shape)})")
    for n, row in zip(x_shape, coeffs):
        used = [(c, d) for c, d in zip(row, shape) if c]
        if used == [(1, n)]:
            continue
        if sum(c * (d - 1) for c, d in used) >= n:
            raise ShapeError(f"{op}: a window view of shape {tuple(shape)} reads past an axis of {n}")


def _window_rule(types, shape, coeffs):
    (x,) = types
    _check_window("window", x.shape, shape, coeffs)
    return TensorType(shape, x.dtype)


def _unwindow_rule(types, shape, coeffs):
    (g,) = types
    _check_window("unwindow", shape, g.shape, coeffs)
    return TensorType(shape, g.dtype)


def _window_impl(x, shape, coeffs):
    x = np.ascontiguousarray(x)
    strides = [sum(c * s for c, s in zip(column, x.strides)) for column in zip(*coeffs)]
    return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False).copy()


def _unwindow_impl(g, shape, coeffs):
    out = np.zeros(shape, g.dtype)
    np.add.at(out, tuple(np.einsum("aj,j...->a...", np.asarray(coeffs), np.indices(g.shape))), g)
    return out


def window_map(x_shape, out_shape, shape, coeffs) -> IndexMap:
    return IndexMap((0,) * len(coeffs), tuple(tuple(row) for row in coeffs))


def _unwindow_nests(expr, b) -> list:
    """Zeros, then every element of the cotangent added where the view read it (col2im); where
    the windows tile the output exactly (pooling with stride = kernel), one store per element.
    The loops run in the order of the buffer the cotangent is read from (contiguous reads)."""
    (g,) = b.inputs
    order = _read_order(expr(g, IndexMap.identity(g.ndim)), g.ndim)
    loops = IndexMap((0,) * g.ndim, tuple(tuple(int(a == k) for k in order) for a in range(g.ndim)))
    domain = tuple(g.shape[a] for a in order)
    imap = loops.then(window_map(b.out.shape, g.shape, **b.kwargs))
    if tiles(b.out.shape, g.shape, b.kwargs["coeffs"]):
        return [Nest(domain, (Store(b.out, imap, expr(g, loops)),))]
    at = Gather(b.out, imap, (None,) * b.out.ndim)
    return [loop(b.out, Const(0, b.out.dtype)), ScatterAdd(domain, at, expr(g, loops))]


def _read_order(body, ndim: int) -> tuple[int, ...]:
    """The axes of the loop domain in the order of the buffer ``body`` reads (where it reads one
    buffer through a transpose, as col2im reads the GEMM's result), else in their own order."""
    reads = loads(body)
    if len(reads) == 1 and isinstance(reads[0], Load) and len(reads[0].imap.coeffs) == ndim:
        rows = reads[0].imap.coeffs
        if not any(reads[0].imap.offsets) and all(sorted(row) == [0] * (ndim - 1) + [1] for row in rows):
            order = tuple(row.index(1) for row in rows)
            if sorted(order) == list(range(ndim)):
                return order
    return tuple(range(ndim))


def tiles(x_shape, shape, coeffs) -> bool:
    """Does the window map send the view's elements one to one onto all of ``x_shape``? Along
    each axis the steps must be the place values of a mixed radix whose digits are the extents."""
    for n, row in zip(x_shape, coeffs):
        place = 1
        for c, d in sorted((c, d) for c, d in zip(row, shape) if c and d != 1):
            if c != place:
                return False
            place *= d
        if place != n:
            return False
    return True


def _window_max_rule(types, shape, coeffs, axes):
    _window_rule(types, shape, coeffs)
    return TensorType(reduced_shape(shape, axes), types[0].dtype)


def _window_max_vjp(g, ans, x, shape, coeffs, axes):
    """The first maximal element of each window (row-major; a NaN counts as maximal) takes the
    cotangent, as PyTorch's max pooling does."""
    xw = window(x, shape, coeffs)
    keep = tuple(1 if k in axes else d for k, d in enumerate(shape))
    top = A.reshape(ans, keep)
    position = np.arange(math.prod(shape[k] for k in axes), dtype=x.dtype).reshape(
        tuple(shape[k] if k in axes else 1 for k in range(len(shape))))
    hit = A.logical_or(A.equal(xw, top), A.not_equal(xw, xw))
    first = A.min(A.where(hit, position, np.inf), axis=axes, keepdims=True)
    routed = A.where(A.equal(position, first), A.reshape(g, keep), 0.0)
    return (unwindow(routed, x.shape, coeffs),)


defop("window", VIEW, _window_rule, _window_impl,
      lambda g, ans, x, shape, coeffs: (unwindow(g, x.shape, coeffs),), index_map=window_map)
defop("unwindow", STRUCTURAL, _unwindow_rule, _unwindow_impl,
      lambda g, ans, x, shape, coeffs: (window(g, x.shape, coeffs),), nests=_unwindow_nests)
defop("window_max", COMPOSITE, _window_max_rule,
      lambda x, shape, coeffs, axes: np.max(_window_impl(x, shape, coeffs), axis=axes), _window_max_vjp,
      lower=lambda x, shape, coeffs, axes: A.max(window(x, shape, coeffs), axis=axes))


def window(x, shape, coeffs):
    return A.bind("window", [x], shape=tuple(shape), coeffs=coeffs)


def unwindow(g, shape, coeffs):
    return A.bind("unwindow", [g], shape=tuple(shape), coeffs=coeffs)


# ---------------------------------------------------------------------------------------------
# Window geometry


def windows(x_shape, axes, sizes, steps=None, dilations=None) -> tuple[tuple, tuple]:
    """The shape and coefficients of the view of windows of ``sizes`` along ``axes`` (an axis may
    repeat, as in NumPy), positions ``steps`` apart (per axis of ``x``), taps ``dilations`` apart
    (per window): positions first, then one axis per window."""
    n = len(x_shape)
    steps = steps or (1,) * n
    dilations = dilations or (1,) * len(axes)
    spans = [0] * n
    for a, k, d in zip(axes, sizes, dilations):
        spans[a] += d * (k - 1)
    positions = []
    for a, extent in enumerate(x_shape):
        if not spans[a] and steps[a] == 1:
            positions.append(extent)
            continue
        if extent <= spans[a]:
            raise ShapeError(f"windows of size {tuple(sizes)} (dilation {tuple(dilations)}) do not fit an axis of "
                             f"{extent}", user_location())
        positions.append((extent - spans[a] - 1) // steps[a] + 1)
    coeffs = tuple(tuple([steps[a] * (j == a) for j in range(n)] + [d * (e == a) for e, d in zip(axes, dilations)])
                   for a in range(n))
    return tuple(positions) + tuple(sizes), coeffs


def _per_axis(values, spatial, ndim: int) -> tuple[int, ...]:
    """Per-spatial-axis ``values`` as one value per axis of an ``ndim``-axis array (1 elsewhere)."""
    return tuple(values[spatial.index(a)] if a in spatial else 1 for a in range(ndim))


def _merge_groups(out, at: int):
    """Axes ``at`` (groups) and ``at + 1`` (channels per group) as one channel axis."""
    return A.reshape(out, out.shape[:at] + (out.shape[at] * out.shape[at + 1],) + out.shape[at + 2:])


def _ints(name: str, value, count: int) -> tuple[int, ...]:
    values = (value,) * count if isinstance(value, (int, np.integer)) else tuple(value)
    if len(values) != count or not all(isinstance(v, (int, np.integer)) for v in values):
        raise ShapeError(f"{name} must be an int or {count} ints, got {value!r}", user_location())
    return tuple(int(v) for v in values)


# ---------------------------------------------------------------------------------------------
# NumPy's window views


def sliding_window_view(x, window_shape, axis=None, *, subok=False, writeable=False):
    """``np.lib.stride_tricks.sliding_window_view`` as a view (windows appended as last axes)."""
    x = A.as_array(x)
    sizes = (window_shape,) if isinstance(window_shape, (int, np.integer)) else tuple(window_shape)
    if writeable:
        raise UnsupportedError("sliding_window_view: writeable=True (a traced array cannot be written)",
                               user_location())
    if A.trace_of([x]) is None:
        return np.lib.stride_tricks.sliding_window_view(x, sizes, axis)
    axes = tuple(range(x.ndim)) if axis is None else \
        (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if len(axes) != len(sizes):
        raise ValueError(f"sliding_window_view: {len(sizes)} window sizes for {len(axes)} axes")
    if any(k < 0 for k in sizes):
        raise ValueError("sliding_window_view: window_shape cannot contain negative values")
    axes = tuple(A.normalize_axes("sliding_window_view", a, x.ndim)[0] for a in axes)
    return window(x, *windows(x.shape, axes, sizes))


def as_strided(x, shape=None, strides=None, subok=False, writeable=True):
    """``np.lib.stride_tricks.as_strided`` on a traced array, where it is a window view: strides
    that are non-negative multiples of the item size and read inside the array. They are read as
    multiples of the array's own strides where they can be (an index map over its axes), else over
    its elements in order (a view of the flattened array); others are refused."""
    x = A.as_array(x)
    if A.trace_of([x]) is None:
        return np.lib.stride_tricks.as_strided(x, shape, strides, subok, writeable)
    shape = tuple(x.shape if shape is None else shape)
    strides = x.strides if strides is None else tuple(strides)
    if len(strides) != len(shape):
        raise ShapeError(f"as_strided: {len(strides)} strides for a shape of {len(shape)} axes", user_location())
    for source in (x, A.reshape(x, (-1,))):
        columns = [_decompose(s, source.strides, source.shape) for s in strides]
        if None not in columns:
            try:
                return window(source, shape, tuple(tuple(column[a] for column in columns) for a in range(source.ndim)))
            except ShapeError:
                pass
    raise UnsupportedError(f"as_strided: shape {shape} with strides {strides} is not a window view of an array of "
                           f"shape {x.shape} (C strides {x.strides}): it reads outside it or between its elements; "
                           f"use np.lib.stride_tricks.sliding_window_view, slicing or broadcasting", user_location())


def _decompose(stride: int, own, shape) -> tuple | None:
    """``stride`` as non-negative multiples of the array's strides, largest first, each multiple
    below its axis's extent (the digits of the stride in the array's mixed radix)."""
    counts, rest = [], int(stride)
    if rest < 0:
        return None
    for k, (s, n) in enumerate(zip(own, shape)):
        c, rest = divmod(rest, s)
        if k and c >= n:
            return None
        counts.append(c)
    return tuple(counts) if rest == 0 else None


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
    if isinstance(padding, (int, np.integer)):
        return [(int(padding), int(padding))] * nd
    pads = list(padding)
    if len(pads) == nd and all(isinstance(p, (int, np.integer)) for p in pads):
        return [(int(p), int(p)) for p in pads]
    if len(pads) == nd and all(len(p) == 2 for p in pads):
        return [(int(lo), int(hi)) for lo, hi in pads]
    raise ShapeError(f"{op}: padding must be 'valid', 'same', an int, {nd} ints or {nd} (before, after) pairs, "
                     f"got {padding!r}", user_location())


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
    sizes, stride, dilation = w.shape[2:], _ints("stride", stride, nd), _ints("dilation", dilation, nd)
    c_in, c_out = x.shape[channel], w.shape[0]
    if groups < 1 or c_in % groups or c_out % groups or w.shape[1] != c_in // groups:
        raise ShapeError(f"{op}: input of {c_in} channels, weight of shape {w.shape} and groups={groups} "
                         f"do not match (the weight's second axis is in channels // groups)", user_location())
    if method == "auto":
        method = choose_method(c_in // groups, c_out // groups)
    if method not in ("gemm", "direct"):
        raise ValueError(f"{op}: method must be 'auto', 'gemm' or 'direct', got {method!r}")
    pads = _padding(padding, nd, sizes, dilation, stride, op)
    if groups > 1:   # channels split into (groups, channels per group): a view of x's buffer
        x = A.reshape(x, x.shape[:channel] + (groups, c_in // groups) + x.shape[channel + 1:])
        w = A.reshape(w, (groups, c_out // groups) + w.shape[1:])
        spatial = tuple(a + (a > channel) for a in spatial)
    x = padded(x, spatial, pads)
    steps = _per_axis(stride, spatial, x.ndim)
    xw = window(x, *windows(x.shape, spatial, sizes, steps, dilation))
    out = _contract(xw, w, nd, channel == 1, groups > 1, method)
    if b is not None:
        out = A.add(out, A.reshape(A.as_array(b), (c_out,) + (1,) * nd if channel == 1 else (c_out,)))
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


def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, layout="NCW", method="auto"):
    return conv(x, w, b, nd=1, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout,
                method=method)


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", method="auto"):
    """2-D convolution as PyTorch's ``conv2d``: ``x`` NCHW (or NHWC), ``w`` (O, C // groups, kh, kw)."""
    return conv(x, w, b, nd=2, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout,
                method=method)


def conv3d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, layout="NCDHW", method="auto"):
    return conv(x, w, b, nd=3, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout,
                method=method)


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, layout="NCHW"):
    """PyTorch's ``conv_transpose2d`` (the gradient of ``conv2d`` with respect to its input): ``w``
    of shape (C, O // groups, kh, kw). Each input element spreads ``w`` over its window of the
    output: a GEMM, then a scatter-add over the windows, then the padding cropped."""
    op, nd = "conv_transpose2d", 2
    x, w = A.as_array(x), A.as_array(w)
    channel, spatial = _spatial_axes(layout, nd, op)
    if x.ndim != 4 or w.ndim != 4 or x.shape[channel] != w.shape[0] or w.shape[0] % groups:
        raise ShapeError(f"{op}: input {x.shape} ({layout}) and weight {w.shape} (in channels, out channels // "
                         f"groups, kh, kw) do not match with groups={groups}", user_location())
    sizes = w.shape[2:]
    stride, dilation = _ints("stride", stride, nd), _ints("dilation", dilation, nd)
    pads, extra = _ints("padding", padding, nd), _ints("output_padding", output_padding, nd)
    if any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
        raise ShapeError(f"{op}: output_padding {extra} must be smaller than stride or dilation", user_location())
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
    for a, s, d, kk, e in zip(spatial, stride, dilation, sizes, extra):
        full[a] = (full[a] - 1) * s + d * (kk - 1) + 1 + e
    steps = _per_axis(stride, spatial, nd + 2)
    shape, coeffs = windows(tuple(full), spatial, sizes, steps, dilation)
    out = unwindow(cols, full, coeffs)
    if any(pads):
        key = tuple(slice(pads[spatial.index(a)], full[a] - pads[spatial.index(a)]) if a in spatial else slice(None)
                    for a in range(nd + 2))
        out = A.getitem(out, key)
    if b is not None:
        c_out = out.shape[channel]
        out = A.add(out, A.reshape(A.as_array(b), (c_out, 1, 1) if first else (c_out,)))
    return out


# ---------------------------------------------------------------------------------------------
# Pooling


def _pool_windows(x, kernel_size, stride, padding, dilation, layout, op, fill):
    nd = 2
    _, spatial = _spatial_axes(layout, nd, op)
    x = A.as_array(x)
    if x.ndim != 4:
        raise ShapeError(f"{op}: expected a 4-d input ({layout}), got shape {x.shape}", user_location())
    sizes = _ints("kernel_size", kernel_size, nd)
    stride = sizes if stride is None else _ints("stride", stride, nd)
    pads = _ints("padding", padding, nd)
    dilation = _ints("dilation", dilation, nd)
    if any(2 * p > k for p, k in zip(pads, sizes)):
        raise ShapeError(f"{op}: padding {pads} must be at most half the kernel size {sizes} (as in PyTorch)",
                         user_location())
    x = padded(x, spatial, [(p, p) for p in pads], fill)
    steps = _per_axis(stride, spatial, x.ndim)
    shape, coeffs = windows(x.shape, spatial, sizes, steps, dilation)
    return x, shape, coeffs, spatial, pads


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, layout="NCHW"):
    """PyTorch's ``max_pool2d`` (padding reads as -inf). The gradient of each window goes to its
    first maximal element in row-major order (a NaN counts as maximal), as in PyTorch."""
    x, shape, coeffs, _, _ = _pool_windows(x, kernel_size, stride, padding, dilation, layout, "max_pool2d", -np.inf)
    axes = tuple(range(x.ndim, len(shape)))
    if A.trace_of([x]) is None:
        return np.max(_window_impl(x, shape, coeffs), axis=axes)
    return A.bind("window_max", [x], shape=shape, coeffs=coeffs, axes=axes)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True, layout="NCHW"):
    """PyTorch's ``avg_pool2d``: the mean of each window, padding counted as zeros (or, with
    ``count_include_pad=False``, left out of the count)."""
    x, shape, coeffs, spatial, pads = _pool_windows(x, kernel_size, stride, padding, 1, layout, "avg_pool2d", 0.0)
    axes = tuple(range(x.ndim, len(shape)))
    total = A.sum(window(x, shape, coeffs), axis=axes)
    if count_include_pad or not any(pads):
        return A.multiply(total, 1.0 / math.prod(shape[a] for a in axes))
    inside = np.zeros(tuple(x.shape[a] for a in spatial))
    inside[tuple(slice(p, n - p) for p, n in zip(pads, inside.shape))] = 1.0
    spatial_shape, spatial_coeffs = windows(inside.shape, (0, 1), tuple(shape[a] for a in axes),
                                            tuple(coeffs[a][a] for a in spatial))
    counts = _window_impl(inside, spatial_shape, spatial_coeffs).sum(axis=(2, 3))
    counts = counts.reshape(counts.shape + (1,)) if spatial[0] == 1 else counts
    return A.divide(total, counts.astype(A.dtype_of(x)))


A.FUNCTIONS.update({np.lib.stride_tricks.sliding_window_view: sliding_window_view})
