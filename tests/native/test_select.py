"""``native.select``: choices without branches, against NumPy's ``where``, ``maximum`` and ``minimum``."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from morphjit.native.select import nanmaximum, nanminimum, select


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


@numba.njit
def _extrema(a, b, high, low):
    for i in range(a.size):
        high[i] = nanmaximum(a[i], b[i])
        low[i] = nanminimum(a[i], b[i])


@numba.njit(fastmath={"reassoc"})
def _reduced(a):
    high, low = -np.inf, np.inf
    for i in range(a.size):
        high, low = nanmaximum(high, a[i]), nanminimum(low, a[i])
    return high, low


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8, np.bool_])
def test_extrema_are_numpys_maximum_and_minimum(dtype):
    rng = np.random.default_rng(3)
    if np.dtype(dtype).kind == "f":
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], dtype)
        a = np.concatenate([np.repeat(specials, 6), rng.standard_normal(20).astype(dtype)])
        b = np.concatenate([np.tile(specials, 6), rng.standard_normal(20).astype(dtype)])
    else:
        a, b = (rng.integers(0, 2 if dtype is np.bool_ else 200, 56).astype(dtype) for _ in range(2))
    high, low = np.empty_like(a), np.empty_like(a)
    _extrema(a, b, high, low)
    np.testing.assert_array_equal(high, np.maximum(a, b))   # equal counts -0.0 as 0.0
    np.testing.assert_array_equal(low, np.minimum(a, b))


@pytest.mark.parametrize("nan_at", [None, 0, 517, 999])
def test_a_reduction_with_extrema_is_numpys_and_keeps_a_nan(nan_at):
    a = np.random.default_rng(5).standard_normal(1000)
    if nan_at is not None:
        a[nan_at] = np.nan
    high, low = _reduced(a)
    np.testing.assert_array_equal([high, low], [np.max(a), np.min(a)])
