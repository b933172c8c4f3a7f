"""Matmul: ``[..., m, k] @ [..., k, n]`` with broadcast batch dimensions (a GEMM per batch
element)."""
from __future__ import annotations

import numpy as np

from .. import api as A
from ..ir import MATMUL, TensorType, broadcast_shapes, defop, require_float, same_dtype
from ..util import ShapeError


def _matmul_rule(types):
    a, b = types
    dtype = same_dtype("matmul", types)
    require_float("matmul", a)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} are not aligned")
    try:
        batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    except ShapeError:
        raise ShapeError(f"matmul: the batch dimensions of shapes {a.shape} and {b.shape} do not broadcast") from None
    return TensorType(batch + (a.shape[-2], b.shape[-1]), dtype)


defop("matmul", MATMUL, _matmul_rule, np.matmul,
            lambda g, ans, a, b: (g @ A.swap_last(b), A.swap_last(a) @ g))

