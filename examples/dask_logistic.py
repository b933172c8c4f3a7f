"""Scaling out with Dask: a logistic regression on 10 million rows held as a Dask array, fitted
with scipy's L-BFGS through ``mj.dask``; then the digits MLP trained data-parallel on 2 workers.

What it shows:
  * ``mj.dask.dataset_loss``: the loss and gradients over the whole data set, each chunk run by
    the compiled step on the worker that holds it, the chunk results added on the workers;
    ``scipy_objective`` turns it into the ``fun(x) -> (loss, gradient)`` that
    ``scipy.optimize.minimize(..., jac=True)`` takes;
  * the same fit in one process (the same numbers, to rounding), and dask-ml's
    ``LogisticRegression`` (dask-glm's L-BFGS) on the same cluster, minimising the same objective;
  * ``mj.dask.data_parallel``: each worker holds half of the digits and a replica of the
    parameters; every step averages the gradients of both workers' minibatches and both replicas
    apply the same SGD update.

Run:  python examples/dask_logistic.py [--rows 10000000]
Needs: pip install -e '.[dask,examples]' (and dask-ml for its comparison, optional).
"""
import argparse
import time

import dask.array as da
import numpy as np
import scipy.optimize
from distributed import Client, LocalCluster

import morphjit as mj
from mlp_digits import accuracy, init_params, load_data

C = 1.0   # dask-ml's inverse regularisation strength: the penalty is (1 / C) * |beta|^2 / 2 on the summed loss


def make_logistic_loss(rows):
    """Mean negative log-likelihood (labels in {0, 1}) plus dask-ml's L2 penalty, divided by the
    rows as the whole loss is: the same minimiser as dask-ml's summed objective."""
    penalty = 0.5 / (C * rows)

    def logistic_loss(params, x, y):
        z = x @ params["w"] + params["b"]
        nll = mj.mean(z + mj.log1p(mj.exp(-z)) - y * z)
        return nll + penalty * (mj.sum(params["w"] ** 2) + params["b"] ** 2)
    return logistic_loss


def mlp_loss(params, x, y):
    """The digits MLP of mlp_digits.py (defined here, so it is shipped to the workers by value)."""
    h = mj.relu(x @ params["W1"] + params["b1"])
    return mj.mean(mj.softmax_cross_entropy(h @ params["W2"] + params["b2"], y))


def synthetic(rows, features, chunk, seed=0):
    """Made on the workers (by mj.dask.dataset_loss, which keeps them there)."""
    rng = da.random.default_rng(seed)
    x = rng.standard_normal((rows, features), chunks=(chunk, features))
    true_w = np.linspace(-1, 1, features)
    y = (rng.random(rows, chunks=chunk) < 1 / (1 + da.exp(-(x @ true_w + 0.5)))).astype(np.float64)
    return x, y


def lbfgs(objective, x0):
    """scipy's L-BFGS-B to a tight tolerance."""
    start = time.perf_counter()
    fit = scipy.optimize.minimize(objective, x0, jac=True, method="L-BFGS-B",
                                  options={"gtol": 1e-8, "ftol": 1e-12, "maxiter": 200})
    return fit, time.perf_counter() - start


def fit_logistic(client, rows, features, chunk, compare_dask_ml):
    x, y = synthetic(rows, features, chunk)
    loss_fn = make_logistic_loss(rows)
    start = {"w": np.zeros(features), "b": np.zeros(())}
    full = mj.dask.dataset_loss(loss_fn, x, y)          # x, y computed into the workers' memory
    objective = full.scipy_objective(start)
    fit, dask_s = lbfgs(objective, objective.x0)
    fitted = objective.params(fit.x)
    print(f"mj.dask, {len(client.scheduler_info()['workers'])} workers: {fit.nit} L-BFGS iterations, "
          f"{fit.nfev} evaluations, {dask_s:.2f} s ({dask_s / fit.nfev * 1e3:.0f} ms per evaluation), "
          f"loss {fit.fun:.6f}")

    local_x, local_y = (a.compute() for a in full.arrays())   # only for the one-process comparison
    local_loss = mj.compile_loss(loss_fn)
    flat = mj.dask.FlatParams(start)

    def local_objective(v):
        value, grads = local_loss(flat.tree(v), local_x, local_y)
        return float(value), flat.vector(grads)

    local_fit, local_s = lbfgs(local_objective, flat.x0)
    diff = float(np.abs(fit.x - local_fit.x).max())
    print(f"one process:       {local_fit.nit} L-BFGS iterations, {local_fit.nfev} evaluations, {local_s:.2f} s "
          f"({local_s / local_fit.nfev * 1e3:.0f} ms per evaluation); largest coefficient difference {diff:.1e}")
    result = {"w": fitted["w"], "b": float(fitted["b"]), "local_diff": diff, "evaluations": fit.nfev,
              "dask_s_per_eval": dask_s / fit.nfev, "local_s_per_eval": local_s / local_fit.nfev}
    if compare_dask_ml:
        result.update(fit_dask_ml(*full.arrays(), fitted))     # the same chunks, held once
    return result


def fit_dask_ml(x, y, fitted):
    try:
        from dask_ml.linear_model import LogisticRegression
    except ImportError:
        print("dask-ml is not installed (pip install dask-ml): its comparison is left out")
        return {}
    start = time.perf_counter()
    # normalize=False: dask-glm would otherwise standardise the columns, which changes what the
    # penalty acts on; without it the two minimise the same objective.
    model = LogisticRegression(solver="lbfgs", C=C, max_iter=200, solver_kwargs={"normalize": False}).fit(x, y)
    seconds = time.perf_counter() - start
    diff = max(float(np.abs(model.coef_ - fitted["w"]).max()), abs(model.intercept_ - float(fitted["b"])))
    print(f"dask-ml LogisticRegression(solver='lbfgs'): {seconds:.2f} s; largest coefficient difference "
          f"from mj.dask {diff:.1e}")
    return {"dask_ml_s": seconds, "dask_ml_diff": diff}


def train_digits(client, steps, batch_per_worker=32):
    x_train, y_train, x_test, y_test = load_data()
    params = init_params(np.random.default_rng(0), (x_train.shape[1], 64, 10))
    trainer = mj.dask.data_parallel(mlp_loss, mj.optim.sgd(0.05, momentum=0.9), params,
                                    da.from_array(x_train), da.from_array(y_train), batch_size=batch_per_worker,
                                    checkpoint_every=50)
    start = time.perf_counter()
    losses = trainer.run(steps)           # the steps submitted together (trainer.step() does one)
    seconds = time.perf_counter() - start
    trained = trainer.params              # fetched from every replica, checked to be identical
    test_acc = accuracy(trained, x_test, y_test)
    print(f"digits MLP, data-parallel on {len(trainer.shards)} workers ({batch_per_worker} rows each per step): "
          f"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}, test accuracy {test_acc:.3f}, "
          f"{seconds / steps * 1e3:.1f} ms per step")
    return {"initial_loss": float(np.mean(losses[:10])), "final_loss": float(np.mean(losses[-10:])),
            "test_accuracy": test_acc}


def main(rows=10_000_000, features=16, chunk=1_000_000, workers=2, digits_steps=300, compare_dask_ml=True):
    """Fit and train on a fresh LocalCluster; returns the numbers printed (the tests check them)."""
    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        logistic = fit_logistic(client, rows, features, chunk, compare_dask_ml)
        digits = train_digits(client, digits_steps)
    return {"logistic": logistic, "digits": digits}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--digits-steps", type=int, default=300)
    parser.add_argument("--no-dask-ml", action="store_true", help="leave out the dask-ml comparison")
    args = parser.parse_args()
    main(rows=args.rows, chunk=args.chunk, digits_steps=args.digits_steps, compare_dask_ml=not args.no_dask_ml)
