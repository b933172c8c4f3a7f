"""``native.select``: ``a if c else b`` without a branch, against NumPy's ``where``."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from morphjit.native.select import select


@numba.njit
def _select_each(c, a, b, out):
    for i in range(c.size):
        out[i] = select(c[i], a[i], b[i])


@numba.njit
def _with_constants(c, x):
    return select(c, 1, x), select(c, x, np.nan), select(c, True, False)


CONDITIONS = [np.bool_, np.float64, np.int64]
VALUES = [np.float32, np.float64, np.int64, np.bool_]


@pytest.mark.parametrize("c_dtype", CONDITIONS)
@pytest.mark.parametrize("a_dtype", VALUES)
@pytest.mark.parametrize("b_dtype", VALUES)
def test_select_is_numpys_where_in_the_promoted_type(c_dtype, a_dtype, b_dtype):
    rng = np.random.default_rng(7)
    c = np.array([0, 1, 2, -1, np.nan, 0.5] if c_dtype is np.float64 else [0, 1, 2, -1, 0, 3]).astype(c_dtype)
    a = (rng.standard_normal(6) * 4).astype(a_dtype)
    b = (rng.standard_normal(6) * 4).astype(b_dtype)
    want = np.where(c, a, b)
    got = np.empty(6, np.result_type(a_dtype, b_dtype))
    _select_each(c, a, b, got)
    np.testing.assert_array_equal(got, want)   # NaN is true, as in NumPy


def test_select_of_constants_and_nan():
    assert _with_constants(True, 2.5) == (1.0, 2.5, True)
    one, nan, false = _with_constants(False, 2.5)
    assert one == 2.5 and np.isnan(nan) and false is False
