"""SciPy's convolutions on traced arrays: ``mj.signal.convolve``, ``correlate``, ``convolve2d``
and ``correlate2d``, with SciPy's modes ('full', 'valid', 'same') and results.

SciPy's own functions turn their arguments into NumPy arrays, which a traced array cannot become;
called on one they raise an error naming these. Each is a window view of the (padded) first
array contracted with the (flipped) second: a loop nest for small kernels, im2col + GEMM for
larger ones (``morphjit.api.conv``). On NumPy arrays they call SciPy.
"""
from __future__ import annotations

import math

import scipy.signal

from ...util import ShapeError, UnsupportedError, user_location
from .. import core as A
from ..contractions import einsum
from ..conv import padded
from ..indexing import getitem
from ..stride_tricks import window, windows

DIRECT_LIMIT = 64   # kernels of at most this many elements are contracted inside one loop nest


def _correlate_valid(a, kernel):
    """``out[p] = sum_k a[p + k] kernel[k]`` over every position where the kernel fits."""
    nd = a.ndim
    xw = window(a, *windows(a.shape, tuple(range(nd)), kernel.shape))
    if math.prod(kernel.shape) <= DIRECT_LIMIT:
        return A.sum(A.multiply(xw, kernel), axis=tuple(range(nd, 2 * nd)))
    letters = "abcdefgh"[:nd]
    return einsum(f"{letters}{letters.upper()},{letters.upper()}->{letters}", xw, kernel)


def _operands(name: str, in1, in2):
    a, b = A.as_array(in1), A.as_array(in2)
    if a.ndim != b.ndim:
        raise ShapeError(f"{name}: in1 and in2 should have the same dimensionality, got shapes {a.shape} and "
                         f"{b.shape}", user_location())
    _, (a, b) = A.promote([a, b])
    return a, b


def _swapped_for_valid(name: str, a, b):
    """'valid' mode: the larger array (in every dimension) slides the smaller, as in SciPy."""
    if all(m >= n for m, n in zip(a.shape, b.shape)):
        return a, b
    if all(n >= m for m, n in zip(a.shape, b.shape)):
        return b, a
    raise ShapeError(f"{name}: for 'valid' mode, one must be at least as large as the other in every dimension "
                     f"(got shapes {a.shape} and {b.shape})", user_location())


def _pads(mode: str, name: str, kernel_shape, same_start):
    """(before, after) per axis for SciPy's modes; 'same' keeps the full result from ``same_start``."""
    if mode == "full":
        return [(m - 1, m - 1) for m in kernel_shape]
    if mode == "same":
        return [(m - 1 - same_start(m), same_start(m)) for m in kernel_shape]
    if mode == "valid":
        return [(0, 0)] * len(kernel_shape)
    raise ValueError(f"{name}: mode must be 'full', 'valid' or 'same', got {mode!r}")


def _sliding(name, a, b, mode, flip_kernel: bool, same_start, fill=0.0):
    if mode == "valid":
        a, b = _swapped_for_valid(name, a, b)
    pads = _pads(mode, name, b.shape, same_start)
    kernel = getitem(b, (slice(None, None, -1),) * b.ndim) if flip_kernel else b
    return _correlate_valid(padded(a, tuple(range(a.ndim)), pads, fill), kernel)


def _centred(m: int) -> int:
    return (m - 1) // 2


def _centred_2d(m: int) -> int:
    return m // 2


def _method(method: str) -> None:
    if method not in ("auto", "direct", "fft"):
        raise ValueError(f"Acceptable method flags are 'auto', 'direct', or 'fft', got {method!r}")


def convolve(in1, in2, mode="full", method="auto"):
    """``scipy.signal.convolve`` (any method gives the direct sum's result)."""
    if A.trace_of([in1, in2]) is None:
        return scipy.signal.convolve(in1, in2, mode, method)
    _method(method)
    a, b = _operands("convolve", in1, in2)
    return _sliding("convolve", a, b, mode, True, _centred)


def correlate(in1, in2, mode="full", method="auto"):
    """``scipy.signal.correlate`` (real arrays)."""
    if A.trace_of([in1, in2]) is None:
        return scipy.signal.correlate(in1, in2, mode, method)
    _method(method)
    a, b = _operands("correlate", in1, in2)
    if mode == "valid" and not all(m >= n for m, n in zip(a.shape, b.shape)):
        # SciPy slides the larger array and reverses the result: the same as correlating with a flip.
        return _sliding("correlate", a, getitem(b, (slice(None, None, -1),) * b.ndim), mode, True, _centred)
    return _sliding("correlate", a, b, mode, False, _centred)


def _boundary(name: str, boundary: str, fillvalue):
    if boundary != "fill":
        raise UnsupportedError(f"{name}: boundary={boundary!r} is not supported on traced arrays (boundary='fill' "
                               f"with a fillvalue is)", user_location())
    return float(fillvalue)


def convolve2d(in1, in2, mode="full", boundary="fill", fillvalue=0):
    """``scipy.signal.convolve2d`` with ``boundary='fill'``."""
    if A.trace_of([in1, in2]) is None:
        return scipy.signal.convolve2d(in1, in2, mode, boundary, fillvalue)
    a, b = _operands("convolve2d", in1, in2)
    if a.ndim != 2:
        raise ShapeError(f"convolve2d: inputs must be 2-D, got shape {a.shape}", user_location())
    return _sliding("convolve2d", a, b, mode, True, _centred, _boundary("convolve2d", boundary, fillvalue))


def correlate2d(in1, in2, mode="full", boundary="fill", fillvalue=0):
    """``scipy.signal.correlate2d`` with ``boundary='fill'`` ('same' centres an even kernel as SciPy's
    correlate2d does, one element later than ``correlate``)."""
    if A.trace_of([in1, in2]) is None:
        return scipy.signal.correlate2d(in1, in2, mode, boundary, fillvalue)
    a, b = _operands("correlate2d", in1, in2)
    if a.ndim != 2:
        raise ShapeError(f"correlate2d: inputs must be 2-D, got shape {a.shape}", user_location())
    fill = _boundary("correlate2d", boundary, fillvalue)
    if mode == "valid" and not all(m >= n for m, n in zip(a.shape, b.shape)):
        return _sliding("correlate2d", a, getitem(b, (slice(None, None, -1),) * b.ndim), mode, True, _centred, fill)
    return _sliding("correlate2d", a, b, mode, False, _centred_2d, fill)

