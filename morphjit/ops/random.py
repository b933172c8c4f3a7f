"""The ops of random draws: ``random`` (a standard normal or uniform array of the counter-based
generator, ``morphjit.native.random``: a source fused into the loops that read it, recomputed
in the forward and the backward loop alike) and ``check_parameter`` (a traced parameter of a draw
passed on unchanged, its refused elements computed into a buffer the step checks, see
``morphjit.api.draw_checks``)."""
from __future__ import annotations

import math

import numpy as np

from ..ir import DTYPES_BY_NAME, ELEMENTWISE, SOURCE, IndexMap, Random, TensorType, defop
from ..native import draw


def _random_rule(types, shape, dtype, dist, stream):
    (seed,) = types
    assert seed.dtype == np.int64 and seed.shape == (), seed
    return TensorType(shape, DTYPES_BY_NAME[dtype])


def _random_impl(seed, shape, dtype, dist, stream):
    counter = np.arange(math.prod(shape), dtype=np.uint64).reshape(shape)
    return draw(seed, stream, dist, DTYPES_BY_NAME[dtype], counter)


def flat_counter(imap: IndexMap, shape) -> IndexMap:
    """The flat (C-order) index in an array of ``shape`` of the element ``imap`` addresses."""
    strides, stride = [], 1
    for extent in reversed(shape):
        strides.insert(0, stride)
        stride = stride * extent
    offset = sum((s * o for s, o in zip(strides, imap.offsets)), 0)
    row = tuple(sum((s * row[j] for s, row in zip(strides, imap.coeffs)), 0) for j in range(imap.loop_ndim))
    return IndexMap((offset,), (row,))


def _random_body(expr, b, imap: IndexMap) -> Random:
    kw = b.kwargs
    seed = expr(b.inputs[0], IndexMap((), ()))
    return Random(seed, kw["stream"], kw["dist"], flat_counter(imap, b.out.shape), b.out.dtype)


defop("random", SOURCE, _random_rule, _random_impl, body=_random_body)


def _check_parameter_rule(types, what, error):
    value, refused = types
    if value.shape != refused.shape or refused.dtype != np.bool_:
        raise AssertionError(f"check_parameter: {value} and a boolean mask of its shape, got {refused}")
    return TensorType(value.shape, value.dtype)


# The value passed on, its mask of refused elements computed into a buffer the step checks.
defop("check_parameter", ELEMENTWISE, _check_parameter_rule, lambda value, refused, what, error: value,
      lambda g, ans, value, refused, what, error: (g, None), scalar=lambda K, value, refused, what, error: value,
      buffered=lambda b, producer: [b.inputs[1]])
