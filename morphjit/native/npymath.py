"""NumPy's division routines as numba functions, for the generated step (imported there as ``npm``).

numba's ``floor_divide`` and ``remainder`` disagree with NumPy's at the edges: a finite number
floor-divided by an infinity of the other sign (NumPy: -1, numba: -0.0), the sign of a zero
remainder, and the most negative integer divided by -1 (where C's division traps and the process
dies). These are NumPy's own algorithms (``npy_divmod`` in ``npy_math_internal.h``, and the
integer loops), one function per dtype so that every constant has the operands' dtype. They are
compiled without fast-math flags, said explicitly (a function numba compiles for a caller
otherwise takes the caller's): with ``arcp``, ``0 / 5e-324`` becomes ``0 * inf``, NaN.
"""
from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

# Plain Python functions (tests/ops/test_templates.py runs the templates on NumPy scalars), which
# numba compiles where the generated step calls them.
jit = register_jitable(error_model="numpy", fastmath=False, nogil=True)


def _float_floor_divmod(dtype):
    zero, half, one = dtype(0), dtype(0.5), dtype(1)

    @jit
    def floor_divmod(a, b):
        """``npy_divmod``: the remainder from C's fmod, the quotient snapped to the nearest integer."""
        mod = np.fmod(a, b)
        if b == zero:
            return a / b, mod
        div = (a - mod) / b    # very nearly an integer multiple of b
        if mod != zero:        # NaN too
            if (b < zero) != (mod < zero):   # Python's convention: the remainder has b's sign
                mod += b
                div -= one
        else:
            mod = np.copysign(zero, b)
        if div != zero:
            floor = np.floor(div)
            if div - floor > half:
                floor += one
        else:
            floor = np.copysign(zero, a / b)
        return floor, mod
    return floor_divmod


def _integer_floor_divmod(dtype):
    zero, minus_one = dtype(0), dtype(-1)

    @jit
    def floor_divmod(a, b):
        """``(0, 0)`` for a zero divisor; ``(-a, 0)`` for -1, wrapping around for the most negative
        value as NumPy's does. numba computes in int64: the results are cast back."""
        if b == zero:
            return zero, zero
        if b == minus_one:
            return dtype(zero - a), zero
        return dtype(a // b), dtype(a % b)
    return floor_divmod


def _integer_fmod(dtype):
    zero, minus_one = dtype(0), dtype(-1)

    @jit
    def fmod(a, b):
        """C's truncated remainder (the dividend's sign); 0 for a zero divisor, as NumPy gives."""
        if b == zero or b == minus_one:
            return zero
        r = dtype(a % b)   # floored: the divisor's sign
        return dtype(r - b) if r != zero and (r < zero) != (a < zero) else r
    return fmod


def _parts(floor_divmod):
    @jit
    def floor_divide(a, b):
        return floor_divmod(a, b)[0]

    @jit
    def remainder(a, b):
        return floor_divmod(a, b)[1]
    return floor_divide, remainder


floor_divide_float32, remainder_float32 = _parts(_float_floor_divmod(np.float32))
floor_divide_float64, remainder_float64 = _parts(_float_floor_divmod(np.float64))
floor_divide_int32, remainder_int32 = _parts(_integer_floor_divmod(np.int32))
floor_divide_int64, remainder_int64 = _parts(_integer_floor_divmod(np.int64))
fmod_int32, fmod_int64 = _integer_fmod(np.int32), _integer_fmod(np.int64)
