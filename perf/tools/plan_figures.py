"""Derives the structural figures of issue 4's report: bindings, instructions and buffers of the plans.

For four test models: the joint program's bindings before and after the passes, the lowered
program, the plan's instructions, loop nests, GEMMs and slots, and its workspace against the naive
plan (one buffer per value). A tool, since the program before the passes is internal.

Run: .venv/bin/python -m perf.tools.plan_figures
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

import morphjit as mj  # noqa: E402
from morphjit.transforms import passes, vjp  # noqa: E402
from morphjit.jit.checks import arg_spec  # noqa: E402
from morphjit.jit.pipeline import compile_plan  # noqa: E402
from morphjit.jit.traced import trace_loss  # noqa: E402
from models import MODELS  # noqa: E402

ROWS = {"(a) 2-layer relu MLP, softmax CE": "mlp2", "(b) 3-layer tanh MLP, MSE": "mlp3_tanh_mse",
        "(c) layer norm": "layernorm", "(d) attention block": "attention"}


def figures(name: str) -> dict:
    fn, args = MODELS[name](np.float64)
    spec, _ = arg_spec(fn, args, 0)
    raw = passes.dce(vjp(trace_loss(fn, args, spec), spec.wrt))
    joint = mj.grad_program(fn, *args)
    plan = compile_plan(joint)
    counts = plan.counts()
    return dict(before=len(raw.bindings), after=len(joint.bindings), lowered=len(plan.program.bindings),
                instructions=len(plan.instructions), loops=counts["loop"] + counts["reduce"], gemms=counts["gemm"],
                reductions=counts["reduce"], slots=len(plan.slots), workspace=plan.workspace_bytes, naive=plan.naive_bytes)


def main():
    header = ("model", "bindings before", "after passes", "lowered", "instructions", "loop nests",
              "of which reduce", "GEMMs", "slots", "workspace B", "naive B", "ratio")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, name in ROWS.items():
        f = figures(name)
        print(f"| {label} | {f['before']} | {f['after']} | {f['lowered']} | {f['instructions']} | {f['loops']} | "
              f"{f['reductions']} | {f['gemms']} | {f['slots']} | {f['workspace']} | {f['naive']} | "
              f"{f['workspace'] / f['naive']:.2f} |")


if __name__ == "__main__":
    main()
