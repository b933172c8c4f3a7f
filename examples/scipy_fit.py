"""Fit a regularised logistic regression with scipy.optimize.minimize on compiled steps.

What it shows:
  * ``mj.scipy_objective``: the loss over one flat float64 vector, as SciPy wants it, with
    ``fun(x) -> (value, gradient)`` and ``hessp(x, p) -> H p`` each one compiled step;
  * L-BFGS-B (gradients only) next to trust-ncg (Hessian-vector products): on correlated features
    the Newton-type method needs far fewer iterations;
  * the same two fits through autograd (if installed): the same optimum, and the wall time of each;
  * standard errors of the coefficients from the dense Hessian (``mj.hessian``), the Laplace
    approximation of the posterior.

Run:  python examples/scipy_fit.py
"""
import argparse
import time

import numpy as np
import scipy.optimize

import morphjit as mj

L2 = 1e-3


def loss(params, x, y):
    """Mean logistic loss (labels y in {0, 1}) plus an L2 penalty on the weights."""
    z = x @ params["w"] + params["b"]
    return mj.mean(mj.logaddexp(0.0, z) - y * z) + L2 * mj.sum(params["w"] ** 2)


def make_data(rng, n, d):
    """Features with correlated columns (an ill-conditioned problem), labels from a true model."""
    mixing = np.eye(d) + 0.9 * rng.normal(size=(d, d)) / np.sqrt(d)
    x = rng.normal(size=(n, d)) @ mixing
    w_true = rng.normal(size=d)
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ w_true + 0.5)))).astype(np.float64)
    return x, y


def fit(method, fun, hessp, x0, maxiter):
    """One minimize call; returns the result and its wall time."""
    extra = {"hessp": hessp} if method == "trust-ncg" else {}
    start = time.perf_counter()
    result = scipy.optimize.minimize(fun, x0, jac=True, method=method, options={"maxiter": maxiter}, **extra)
    return result, time.perf_counter() - start


def autograd_objective(x, y, unravel_like):
    """The same loss through autograd: fun(x) -> (value, gradient) and hessp(x, p)."""
    import autograd
    import autograd.numpy as anp

    def flat_loss(w):
        params = unravel_like(w)
        z = x @ params["w"] + params["b"]
        return anp.mean(anp.logaddexp(0.0, z) - y * z) + L2 * anp.sum(params["w"] ** 2)

    value_and_grad = autograd.value_and_grad(flat_loss)
    hvp = autograd.hessian_vector_product(flat_loss)
    return value_and_grad, lambda w, p: hvp(w, p)


def main(n=20_000, d=40, maxiter=200, seed=0):
    rng = np.random.default_rng(seed)
    x, y = make_data(rng, n, d)
    params = {"b": np.array(0.0), "w": np.zeros(d)}
    objective = mj.scipy_objective(loss, params, x, y)
    objective.fun(objective.x0)                       # compile (or load) the steps before timing
    objective.hessp(objective.x0, objective.x0)

    print(f"logistic regression, {n} samples, {d} correlated features, {objective.x0.size} parameters")
    results = {}
    for method in ("L-BFGS-B", "trust-ncg"):
        result, seconds = fit(method, objective.fun, objective.hessp, objective.x0, maxiter)
        results[method] = {"x": result.x, "loss": float(result.fun), "iterations": int(result.nit),
                           "seconds": seconds}
        print(f"  {method:9s} morphjit: loss {result.fun:.8f} in {result.nit:3d} iterations, {seconds * 1e3:7.1f} ms")

    try:
        value_and_grad, hessp = autograd_objective(x, y, lambda w: {"b": w[0], "w": w[1:]})
    except ImportError:
        print("  (autograd is not installed: pip install autograd for the comparison)")
    else:
        for method in ("L-BFGS-B", "trust-ncg"):
            result, seconds = fit(method, value_and_grad, hessp, objective.x0, maxiter)
            mine = results[method]
            mine.update(autograd_x=result.x, autograd_seconds=seconds,
                        autograd_diff=float(np.max(np.abs(result.x - mine["x"]))))
            print(f"  {method:9s} autograd: loss {result.fun:.8f} in {result.nit:3d} iterations, "
                  f"{seconds * 1e3:7.1f} ms ({seconds / mine['seconds']:.1f}x morphjit's time; "
                  f"largest parameter difference {mine['autograd_diff']:.1e})")

    # The Laplace approximation: the posterior covariance is the inverse Hessian of the total
    # negative log-likelihood (n times the mean loss) at the optimum.
    best = results["trust-ncg"]["x"]
    hessian = objective.hess(best)
    errors = np.sqrt(np.diag(np.linalg.inv(n * hessian)))
    fitted = objective.unravel(best)
    print(f"intercept {float(fitted['b']):+.3f} +- {errors[0]:.3f}; first weights "
          + ", ".join(f"{w:+.3f} +- {e:.3f}" for w, e in zip(fitted["w"][:3], errors[1:4])))
    return {"results": results, "hessian": hessian, "standard_errors": errors, "x": x, "y": y,
            "objective": objective}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--maxiter", type=int, default=200)
    args = parser.parse_args()
    main(n=args.samples, maxiter=args.maxiter)
