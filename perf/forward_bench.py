"""The forward pass alone (issue 23): ``mj.compile`` of a workload's loss against JAX's jitted
forward and PyTorch under ``torch.no_grad()``, beside the full steps (``compile_loss``,
``jax.jit(value_and_grad)``, PyTorch's ``backward()``) measured in the same interleaved run, so
that the forward ratios can be read against the training-step ratios.

    PYTHONPATH=$PWD /work/wt/benchvenv/bin/python perf/forward_bench.py [--workloads tiny small]
        [--dtypes float32] [--budget 1.5] [--markdown perf/results/FORWARD_RESULTS.md]

Every forward value is checked against NumPy's before timing. BLAS and peer threads are held to
one, as perf/bench.py holds them (the variables are set before NumPy loads).
"""
from __future__ import annotations

import argparse
import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import morphjit as mj  # noqa: E402
from perf import timing  # noqa: E402
from perf.bench import hold_threads  # noqa: E402
from perf.impls import JaxOps, TorchOps, named_loss  # noqa: E402
from perf.workloads import WORKLOADS  # noqa: E402

MLP_WORKLOADS = ("tiny", "small", "medium")


def morphjit_cases(wl, params, data) -> dict:
    forward = mj.compile(named_loss(wl, mj))
    step = mj.compile_loss(named_loss(wl, mj))
    return {"morphjit forward": lambda: forward(params, *data), "morphjit step": lambda: step(params, *data)}


def jax_cases(wl, params, data) -> dict:
    import jax
    jax.config.update("jax_enable_x64", True)
    loss = named_loss(wl, JaxOps())
    forward, step = jax.jit(loss), jax.jit(jax.value_and_grad(loss))
    jparams = {k: jax.device_put(v) for k, v in params.items()}
    jdata = [jax.device_put(d) for d in data]
    return {"jax forward": lambda: jax.block_until_ready(forward(jparams, *jdata)),
            "jax step": lambda: jax.block_until_ready(step(jparams, *jdata))}


def torch_cases(wl, params, data) -> dict:
    import torch
    loss = named_loss(wl, TorchOps())
    tparams = {k: torch.from_numpy(np.array(v)).requires_grad_(True) for k, v in params.items()}
    tdata = [torch.from_numpy(d) for d in data]

    def forward():
        with torch.no_grad():
            return loss(tparams, *tdata)

    def step():
        for p in tparams.values():
            p.grad = None
        value = loss(tparams, *tdata)
        value.backward()
        return value

    return {"torch forward": forward, "torch step": step}


def value_of(result) -> float:
    result = result[0] if isinstance(result, tuple) else result
    return float(result.detach().numpy() if hasattr(result, "detach") else np.asarray(result))


def bench(name: str, dtype: str, budget: float) -> dict:
    wl = WORKLOADS[name]
    params, data = wl.make(np.dtype(dtype))
    want = float(wl.numpy_step(params, *data)[0])
    cases = {}
    for make in (morphjit_cases, jax_cases, torch_cases):
        try:
            cases.update(make(wl, params, data))
        except ImportError as e:
            print(f"  skipped {make.__name__}: {e}", file=sys.stderr)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    for case, call in cases.items():
        got = value_of(call())
        assert abs(got - want) <= rtol * abs(want), (case, got, want)
    return timing.measure(cases, budget_s=budget)


def ratios(stats: dict) -> dict:
    """Peer time / morphjit time, for the forward pass and for the step."""
    out = {}
    for kind in ("forward", "step"):
        ours = stats[f"morphjit {kind}"].median_s
        for peer in ("jax", "torch"):
            if f"{peer} {kind}" in stats:
                out[f"{peer} {kind}"] = stats[f"{peer} {kind}"].median_s / ours
    return out


def markdown(rows) -> str:
    lines = ["| workload | dtype | morphjit fwd (us) | jax fwd / mj | torch no_grad / mj | morphjit step (us) "
             "| jax step / mj | torch step / mj |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, dtype, stats in rows:
        r = ratios(stats)
        lines.append(f"| {name} | {dtype} | {stats['morphjit forward'].median_s * 1e6:.1f} "
                     f"| {r.get('jax forward', float('nan')):.2f} | {r.get('torch forward', float('nan')):.2f} "
                     f"| {stats['morphjit step'].median_s * 1e6:.1f} | {r.get('jax step', float('nan')):.2f} "
                     f"| {r.get('torch step', float('nan')):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(MLP_WORKLOADS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--budget", type=float, default=1.5, help="seconds of timing per workload and dtype")
    parser.add_argument("--markdown", help="write the table here too")
    args = parser.parse_args(argv)
    hold_threads(1, ["jax", "torch"])
    rows = []
    for name in args.workloads:
        for dtype in args.dtypes:
            rows.append((name, dtype, bench(name, dtype, args.budget)))
            print(f"{name} {dtype}: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios(rows[-1][2]).items()),
                  flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
