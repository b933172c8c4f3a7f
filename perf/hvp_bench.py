"""Second derivatives against JAX: a Hessian-vector product on the MLP workloads, and a trust-ncg
fit through ``scipy.optimize.minimize`` (the same SciPy driver, only the objective differs).

* HVP: ``mj.hvp`` (reverse over reverse, one compiled step) against ``jax.jit`` of
  ``jvp(grad(loss))`` (forward over reverse, JAX's recommended HVP) on the tiny and small MLP
  workloads of ``perf/workloads.py``, float32 and float64; each implementation's gradient step is
  timed beside it, so "HVP / gradient" says what the second pass costs. Each framework's cases are
  timed in a group of their own (interleaved with numba calls, every JAX call paid a wake-up of
  XLA's worker thread, milliseconds on a loaded machine, which a JAX loop does not pay); the groups
  take turns for three rounds, and each case keeps its best round.
* Fit: the regularised logistic regression of ``examples/scipy_fit.py`` fitted with trust-ncg
  (``mj.scipy_objective``'s ``fun``/``hessp`` against ``jit(value_and_grad)`` and
  ``jit(jvp(grad))`` converted to NumPy at the boundary), a fixed number of iterations, float64.

Every implementation is checked against morphjit's result before it is timed.

Run:  python -m perf.hvp_bench [--budget 3]   (JAX: run in a venv that has it)
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import scipy.optimize

import morphjit as mj
from perf.impls import JaxOps, named_loss
from perf.timing import measure
from perf.workloads import WORKLOADS

HVP_WORKLOADS = ("tiny", "small")
FIT = dict(n=20_000, d=40, maxiter=30, l2=1e-3)


def direction(params, seed=1):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in params.items()}


# ---------------------------------------------------------------- HVP

def morphjit_hvp_cases(wl, params, data, v):
    loss = named_loss(wl, mj)
    hvp, grad = mj.hvp(loss), mj.compile_loss(loss)
    return {"morphjit hvp": lambda: hvp(params, v, *data), "morphjit grad": lambda: grad(params, *data)}


def jax_hvp_cases(wl, params, data, v):
    import jax
    jax.config.update("jax_enable_x64", True)     # float64 inputs stay float64; float32 ones float32
    loss = named_loss(wl, JaxOps())
    hvp = jax.jit(lambda p, t, *d: jax.jvp(lambda q: jax.grad(loss)(q, *d), (p,), (t,))[1])
    grad = jax.jit(jax.value_and_grad(loss))
    jp, jv = ({k: jax.device_put(a) for k, a in tree.items()} for tree in (params, v))
    jd = [jax.device_put(d) for d in data]
    return {"jax hvp": lambda: jax.block_until_ready(hvp(jp, jv, *jd)),
            "jax grad": lambda: jax.block_until_ready(grad(jp, *jd))}


def check_hvp(cases, reference, dtype):
    tol = 1e-4 if dtype == "float32" else 1e-9
    got = {k: np.asarray(a) for k, a in cases["jax hvp"]().items()}
    scale = max(np.max(np.abs(a)) for a in reference.values())
    for k, a in reference.items():
        assert np.allclose(got[k], a, rtol=0, atol=tol * scale), (k, np.max(np.abs(got[k] - a)), scale)


def best_of_rounds(groups, budget_s, rounds=3) -> dict:
    """Each group timed in turn, ``rounds`` times; per case, the round with the lowest median
    (the one least disturbed by the rest of a shared machine)."""
    best = {}
    for _ in range(rounds):
        for group in groups:
            for k, s in measure(group, budget_s=budget_s / rounds, min_samples=7).items():
                if k not in best or s.median_s < best[k]["median_s"]:
                    best[k] = s.as_dict()
    return best


def run_hvp(budget_s):
    results = {}
    for name in HVP_WORKLOADS:
        wl = WORKLOADS[name]
        for dtype in ("float32", "float64"):
            params, data = wl.make(dtype)
            v = direction(params)
            groups = [morphjit_hvp_cases(wl, params, data, v)]
            reference = groups[0]["morphjit hvp"]()
            try:
                groups.append(jax_hvp_cases(wl, params, data, v))
                check_hvp(groups[1], reference, dtype)
            except ImportError:
                pass
            results[f"{name} {dtype}"] = best_of_rounds(groups, budget_s)
    return results


# ---------------------------------------------------------------- trust-ncg fit

def fit_problem():
    rng = np.random.default_rng(0)
    n, d = FIT["n"], FIT["d"]
    mixing = np.eye(d) + 0.9 * rng.normal(size=(d, d)) / np.sqrt(d)
    x = rng.normal(size=(n, d)) @ mixing
    w_true = rng.normal(size=d)
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ w_true + 0.5)))).astype(np.float64)
    return x, y


def logistic(ns, w, x, y):
    """Over the flat vector w = (intercept, weights): both implementations see the same function."""
    z = x @ w[1:] + w[0]
    return ns.mean(ns.logaddexp(0.0, z) - y * z) + FIT["l2"] * ns.sum(w[1:] ** 2)


def morphjit_objective(x, y):
    objective = mj.scipy_objective(lambda w, x, y: logistic(mj, w, x, y), np.zeros(FIT["d"] + 1), x, y)
    return objective.fun, objective.hessp


def jax_objective(x, y):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    loss = lambda w, x, y: logistic(jnp, w, x, y)  # noqa: E731
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    hvp = jax.jit(lambda w, p, x, y: jax.jvp(lambda q: jax.grad(loss)(q, x, y), (w,), (p,))[1])
    jx, jy = jax.device_put(x), jax.device_put(y)

    def fun(w):
        value, grad = value_and_grad(w, jx, jy)
        return float(value), np.asarray(grad)
    return fun, lambda w, p: np.asarray(hvp(w, p, jx, jy))


def fit(fun, hessp):
    return scipy.optimize.minimize(fun, np.zeros(FIT["d"] + 1), jac=True, hessp=hessp, method="trust-ncg",
                                   options={"maxiter": FIT["maxiter"], "gtol": 1e-12})


def run_fit(budget_s):
    x, y = fit_problem()
    objectives = {"morphjit": morphjit_objective(x, y)}
    try:
        objectives["jax"] = jax_objective(x, y)
    except ImportError:
        pass
    first = {name: fit(*o) for name, o in objectives.items()}     # compiles, and the reference
    for name, result in first.items():
        assert result.nit == first["morphjit"].nit and np.allclose(result.x, first["morphjit"].x, atol=1e-8), name
    evaluations = {name: (r.nfev, r.nhev) for name, r in first.items()}
    stats = measure({name: (lambda o=o: fit(*o)) for name, o in objectives.items()}, budget_s=budget_s,
                    min_samples=5, min_sample_s=0)
    return {"iterations": int(first["morphjit"].nit), "evaluations": evaluations,
            "fits": {k: s.as_dict() for k, s in stats.items()}}


def report(hvp: dict, fitted: dict) -> str:
    lines = ["Hessian-vector product (median us, IQR); ratios to morphjit's HVP", ""]
    for case, stats in hvp.items():
        ours = stats["morphjit hvp"]["median_s"]
        lines.append(case)
        for name, s in stats.items():
            lines.append(f"  {name:>14}  {s['median_s'] * 1e6:10.1f} us ({s['iqr_s'] * 1e6:.1f})  x{s['median_s'] / ours:5.2f}")
    lines += ["", f"trust-ncg fit, logistic regression {FIT['n']} x {FIT['d']}, {fitted['iterations']} iterations, "
              f"evaluations (fun, hessp) {fitted['evaluations']}; median ms (IQR), ratio to morphjit"]
    ours = fitted["fits"]["morphjit"]["median_s"]
    for name, s in fitted["fits"].items():
        lines.append(f"  {name:>14}  {s['median_s'] * 1e3:10.1f} ms ({s['iqr_s'] * 1e3:.1f})  x{s['median_s'] / ours:5.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timing per case group")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    hvp_results, fit_results = run_hvp(args.budget), run_fit(args.budget)
    print(f"# {started}\n" + report(hvp_results, fit_results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hvp": hvp_results, "fit": fit_results}, f, indent=1)
