"""Linear (ridge) and logistic regression trained by gradient descent, checked against exact solutions.

What it shows:
  * two classic convex losses written in NumPy style and compiled with ``mj.compile_loss``;
  * a numerically stable binary cross-entropy: log(1 + exp(z)) - y*z written as
    ``max(z, 0) + log1p(exp(-|z|)) - y*z``, which never overflows however large |z| gets;
  * plain gradient descent reaching the closed-form ridge solution and scikit-learn's logistic
    regression (the same objective, solved by L-BFGS), with the difference printed at the end.

Run:  python examples/regression.py        (needs scikit-learn: pip install -e '.[examples]')
"""
import argparse

import numpy as np
from sklearn.linear_model import LogisticRegression

import morphjit as mj
from _common import Progress


def ridge_loss(params, x, t, lam):
    """Mean squared error plus an L2 penalty on the weights (not on the intercept)."""
    residual = x @ params["w"] + params["b"] - t
    return mj.mean(residual ** 2) + lam * mj.sum(params["w"] ** 2)


def logistic_loss(params, x, y, lam):
    """Mean binary cross-entropy of sigmoid(x w + b) against labels y in {0, 1}, plus an L2 penalty."""
    z = x @ params["w"] + params["b"]
    bce = mj.maximum(z, 0) + mj.log1p(mj.exp(-mj.abs(z))) - y * z      # = -y log p - (1-y) log(1-p)
    return mj.mean(bce) + lam * mj.sum(params["w"] ** 2)


def make_data(rng, n=400, features=8):
    """Standardised features, a linear target with noise, and binary labels from a noisy logit."""
    x = rng.normal(size=(n, features))
    x[:, 1] += 0.8 * x[:, 0]                       # correlated features make it less trivial
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    w_true = rng.normal(size=features)
    t = x @ w_true + 0.5 + rng.normal(scale=0.3, size=n)
    labels = (x @ w_true - 0.3 + rng.logistic(size=n) > 0).astype(np.float64)
    return x, t, labels


def gradient_descent(step, params, data, steps, lr, label):
    """Full-batch gradient descent; the update is plain NumPy."""
    progress = Progress(steps, label=label)
    first = None
    for i in range(steps):
        value, grads = step(params, *data)
        first = float(value) if first is None else first
        for k in params:
            params[k] -= lr * grads[k]
        progress.update(i, value)
    progress.close()
    return first, float(value)


def ridge_closed_form(x, t, lam):
    """Set the gradient to zero: (A^T A / n + P) theta = A^T t / n with A = [x, 1], P = diag(lam, ..., 0)."""
    n, p = x.shape
    a = np.hstack([x, np.ones((n, 1))])
    penalty = np.diag([lam] * p + [0.0])
    theta = np.linalg.solve(a.T @ a / n + penalty, a.T @ t / n)
    return theta[:p], theta[p]


def logistic_sklearn(x, labels, lam):
    """scikit-learn minimises C * sum(bce) + w.w / 2; with C = 1 / (2 n lam) that is our loss times 1/(2 lam)."""
    model = LogisticRegression(C=1 / (2 * len(x) * lam), tol=1e-12, max_iter=10_000)
    model.fit(x, labels)
    return model.coef_[0], model.intercept_[0]


def main(steps=300, lam=0.01, seed=0):
    """Fit both models; returns the largest parameter difference to the exact solution for each."""
    rng = np.random.default_rng(seed)
    x, t, labels = make_data(rng)
    features = x.shape[1]
    results = {}

    # lam is passed as a Python float: it becomes an input of the compiled step, not a constant.
    print("== ridge regression: mean squared error + lam * |w|^2 ==")
    ridge = mj.compile_loss(ridge_loss)
    params = {"w": np.zeros(features), "b": np.zeros(())}
    first, last = gradient_descent(ridge, params, (x, t, lam), steps, lr=0.2, label="ridge")
    w, b = ridge_closed_form(x, t, lam)
    diff = max(np.abs(params["w"] - w).max(), abs(params["b"] - b))
    print(f"loss {first:.4f} -> {last:.4f}; largest difference to the closed-form solution {diff:.2e}")
    results["ridge"] = {"initial_loss": first, "final_loss": last, "diff": float(diff)}

    print("\n== logistic regression: stable binary cross-entropy + lam * |w|^2 ==")
    logistic = mj.compile_loss(logistic_loss)
    params = {"w": np.zeros(features), "b": np.zeros(())}
    first, last = gradient_descent(logistic, params, (x, labels, lam), steps, lr=2.0, label="logistic")
    w, b = logistic_sklearn(x, labels, lam)
    diff = max(np.abs(params["w"] - w).max(), abs(params["b"] - b))
    train_acc = np.mean(((x @ params["w"] + params["b"]) > 0) == labels)
    print(f"loss {first:.4f} -> {last:.4f}; training accuracy {train_acc:.3f}; "
          f"largest difference to scikit-learn's solution {diff:.2e}")
    results["logistic"] = {"initial_loss": first, "final_loss": last, "diff": float(diff)}
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    main(steps=parser.parse_args().steps)
