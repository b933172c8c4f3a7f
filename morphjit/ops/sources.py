"""Sources: ops that create data from their parameters (``fill``) or from labels alone
(``one_hot``)."""
from __future__ import annotations

import numpy as np

from ..ir import DTYPES_BY_NAME, ELEMENTWISE, SOURCE, Const, IndexMap, OneHot, TensorType, defop
from ..util import DtypeError


def _fill_rule(types, shape, dtype, value):
    return TensorType(shape, DTYPES_BY_NAME[dtype])


def _one_hot_rule(types, depth, dtype):
    (labels,) = types
    if labels.dtype.kind not in "iu":
        raise DtypeError(f"one_hot: labels must be integers, got {labels.dtype}")
    return TensorType(labels.shape + (depth,), DTYPES_BY_NAME[dtype])


def _one_hot_body(expr, b, imap: IndexMap) -> OneHot:
    """The labels read at the leading loop indices, compared with the last one."""
    n = len(imap.offsets)
    rows = IndexMap(imap.offsets[:n - 1], imap.coeffs[:n - 1])
    klass = IndexMap(imap.offsets[n - 1:], imap.coeffs[n - 1:])
    return OneHot(expr(b.inputs[0], rows), klass, b.out.dtype)


defop("fill", SOURCE, _fill_rule, lambda shape, dtype, value: np.full(shape, value, DTYPES_BY_NAME[dtype]),
      body=lambda expr, b, imap: Const(b.kwargs["value"], b.out.dtype))
defop("one_hot", ELEMENTWISE, _one_hot_rule,
      lambda labels, depth, dtype: (labels[..., None] == np.arange(depth)).astype(DTYPES_BY_NAME[dtype]),
      body=_one_hot_body)

