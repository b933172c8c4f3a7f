"""Fit the kernel hyperparameters of a Gaussian process by maximising its log marginal likelihood.

What it shows:
  * a loss built on linear algebra: ``np.linalg.cholesky`` and ``mj.linalg.cho_solve`` (two
    triangular solves), compiled with its gradient into one step, LAPACK called in the step;
  * the step as SciPy's objective: ``scipy.optimize.minimize(step, jac=True)`` wants exactly the
    (value, gradient) pair a compiled loss returns;
  * the optimum next to scikit-learn's ``GaussianProcessRegressor`` on the same data, kernel
    (amplitude * RBF + white noise) and starting point.

Run:  python examples/gp_regression.py
"""
import argparse

import numpy as np
import scipy.optimize

import morphjit as mj

JITTER = 1e-10                      # scikit-learn's default `alpha`, added to the diagonal
START = np.zeros(3)                 # log amplitude, log length scale, log noise level: all 1.0
BOUNDS = [(np.log(1e-5), np.log(1e5))] * 3   # scikit-learn's default hyperparameter bounds


def negative_log_marginal_likelihood(theta, sqdist, y):
    """-log p(y | X, theta) for k(x, x') = a exp(-|x - x'|^2 / 2 l^2) + s [x = x']; theta = log(a, l, s)."""
    n = y.shape[0]
    eye = np.eye(n)
    amplitude, length, noise = np.exp(theta[0]), np.exp(theta[1]), np.exp(theta[2])
    k = amplitude * np.exp(-0.5 * sqdist / length ** 2) + (noise + JITTER) * eye
    L = np.linalg.cholesky(k)
    alpha = mj.linalg.cho_solve((L, True), y)
    log_det = 2.0 * np.sum(np.log(np.sum(L * eye, axis=1)))     # the diagonal of L, by a mask
    return 0.5 * np.sum(y * alpha) + 0.5 * log_det + 0.5 * n * np.log(2 * np.pi)


def make_data(rng, n):
    x = np.sort(rng.uniform(0, 5, n))
    y = np.sin(3 * x) + 0.5 * x + rng.normal(scale=0.2, size=n)
    return x, y


def fit(step, sqdist, y):
    result = scipy.optimize.minimize(step, START, args=(sqdist, y), jac=True, method="L-BFGS-B",
                                     bounds=BOUNDS, options={"gtol": 1e-10, "ftol": 1e-15})
    return result.x, -result.fun


def sklearn_fit(x, y):
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    kernel = ConstantKernel(1.0) * RBF(1.0) + WhiteKernel(1.0)
    gpr = GaussianProcessRegressor(kernel, alpha=JITTER, random_state=0).fit(x[:, None], y)
    return gpr.kernel_.theta, gpr.log_marginal_likelihood_value_


def main(n=60, seed=0):
    """Fit with the compiled step and with scikit-learn; returns both optima."""
    rng = np.random.default_rng(seed)
    x, y = make_data(rng, n)
    sqdist = (x[:, None] - x[None, :]) ** 2
    step = mj.compile_loss(negative_log_marginal_likelihood)
    theta, lml = fit(step, sqdist, y)
    theta_sk, lml_sk = sklearn_fit(x, y)
    print("                 amplitude  length  noise    log marginal likelihood")
    for name, t, v in [("morphjit", theta, lml), ("scikit-learn", theta_sk, lml_sk)]:
        a, l, s = np.exp(t)
        print(f"{name:>14}   {a:9.4f} {l:7.4f} {s:7.4f}   {v:.10f}")
    print(f"relative difference of the optima: {abs(lml - lml_sk) / abs(lml_sk):.1e}")
    return {"theta": theta, "lml": lml, "sklearn_theta": theta_sk, "sklearn_lml": lml_sk}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60)
    main(n=parser.parse_args().n)
