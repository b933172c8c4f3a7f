"""Derives TANH_P, TANH_Q and TANH_LIMIT of ``morphjit/ops/elementwise.py``: the rational float32 ``tanh``.

C libraries compute ``tanhf`` one element at a time (about 19 ns here), which keeps a loop from
vectorising; NumPy's float32 ``tanh`` is SIMD code. morphjit's float32 template instead evaluates
``x * P(x^2) / Q(x^2)`` in float64 — plain arithmetic that LLVM vectorises (under 1 ns an element)
— and saturates to +-1 beyond ``|x| >= 9``, where float32 ``tanh`` rounds to 1 anyway.

This script fits P (degree 6 in x^2) and Q (degree 3, constant 1, coefficients >= 0 so Q has no
root) by least squares on the relative error, then reweights toward the worst points (a Lawson
iteration) to approach the minimax fit; it prints the coefficients for ``morphjit/ops/elementwise.py`` and the
error of the resulting float32 function against float64 ``tanh``, measured in float32 ulps.

    python -m perf.tools.fit_tanh
"""
import numpy as np
from numpy.polynomial import polynomial
from scipy.optimize import least_squares

LIMIT = 9.0       # |x| beyond which float32 tanh is +-1
P_DEGREE, Q_DEGREE = 6, 3


def rational(theta, x):
    s = x * x
    p, q = theta[:P_DEGREE + 1], np.concatenate([[1.0], theta[P_DEGREE + 1:]])
    return x * polynomial.polyval(s, p) / polynomial.polyval(s, q)


def fit() -> np.ndarray:
    x = np.concatenate([np.linspace(0, LIMIT, 40001)[1:], np.geomspace(1e-5, 1, 4000)])
    t = np.tanh(x)
    theta = np.zeros(P_DEGREE + 1 + Q_DEGREE)
    theta[0] = 1.0
    lower = np.full_like(theta, -np.inf)
    lower[P_DEGREE + 1:] = 0.0
    weights = np.ones_like(x)
    for _ in range(40):
        theta = least_squares(lambda th: weights * (rational(th, x) - t) / t, theta, bounds=(lower, np.inf),
                              x_scale="jac", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=2000).x
        error = np.abs(rational(theta, x) - t) / t
        weights *= np.sqrt(error / error.max() + 1e-2)
        weights /= weights.mean()
    return theta


def tanh32(theta, x: np.ndarray) -> np.ndarray:
    """The float32 template's arithmetic, vectorised in NumPy."""
    v = x.astype(np.float64)
    return np.where(np.abs(v) >= LIMIT, np.copysign(1.0, v), rational(theta, np.clip(v, -LIMIT, LIMIT))).astype(np.float32)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)


def main():
    theta = fit()
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-12, 12, 2_000_000), np.geomspace(1e-8, 12, 200_000),
                        -np.geomspace(1e-8, 12, 200_000)]).astype(np.float32)
    exact = np.tanh(x.astype(np.float64))
    print("TANH_P =", tuple(float(c) for c in theta[:P_DEGREE + 1]))
    print("TANH_Q =", (1.0,) + tuple(float(c) for c in theta[P_DEGREE + 1:]))
    print(f"template: max {ulps(tanh32(theta, x), exact).max():.2f} ulp from tanh; "
          f"NumPy float32 tanh: max {ulps(np.tanh(x), exact).max():.2f} ulp")


if __name__ == "__main__":
    main()
