"""The compilation pipeline as data: named stages, run in order by one driver.

    trace -> vjp -> passes -> lower -> passes -> plan -> codegen -> load

A forward-only function (``mj.compile``) skips vjp (`FORWARD_NATIVE`). Each `Stage` reads the
`Build` of one compilation and fills in one of its fields. `run` times each stage
(``feedback.Timings``, shown by ``explain`` and the status line), prints what it made when
``MORPHJIT_DUMP`` names it, and verifies a program it made under ``MORPHJIT_VERIFY``. The interp
backend runs `FRONT` only; a training step inserts its own stages by name (``train.py``: the
optimiser update after the first passes, the in-place writes after plan) into the same list.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from ..backend import Plan, make_plan, render
from ..ir import Program
from ..runtime import load_kernel
from ..transforms import as_gemms, lower, optimize, vjp
from ..util import config
from . import feedback
from .traced import check_state, trace_outputs, traced_loss


@dataclass
class Build:
    """One compilation: what it starts from and what each stage makes."""

    fn: Callable | None = None
    args: tuple = ()
    spec: object = None                  # checks.ArgSpec: the differentiated leaves
    batched: frozenset = frozenset()     # the leaves whose leading extent is the batch size
    hint: str = "step"                   # the generated module's name
    cache: bool = True                   # load the module through the disk cache
    has_aux: bool = False                # the loss function returns (loss, aux)
    keeps_state: bool = True             # the caller writes the state outputs back (not a training step)
    out_tree: object = None              # trace: the tree of aux, or of a forward function's outputs
    state: object = None                 # trace: tracing.StateWrites, the last outputs' places
    forward: Program | None = None       # trace
    program: Program | None = None       # vjp, passes: the joint program (as a step shows it)
    lowered: Program | None = None       # lower, passes
    plan: Plan | None = None             # plan
    source: str | None = None            # codegen
    arguments: list | None = None        # codegen: the values the entry takes, in order
    kernel: object = None                # load: the entry's dispatcher


@dataclass(frozen=True)
class Stage:
    name: str                    # in Timings, MORPHJIT_DUMP and the reports
    title: str                   # the status line's words while it runs
    label: str                   # explain's timing table
    run: Callable[[Build], None]
    product: str                 # the Build field it makes


def run(stages, build: Build, timings: feedback.Timings = feedback.NO_TIMINGS) -> Build:
    """Run ``stages`` in order on ``build``, each timed, dumped and verified on request."""
    for stage in stages:
        with timings.stage(stage.name, stage.title):
            stage.run(build)
        product = getattr(build, stage.product)
        if config.dumped(stage.name):
            name = getattr(build.fn, "__name__", build.hint)
            print(f"--- {name}: after {stage.name}\n{product}", file=sys.stderr)
        if isinstance(product, Program) and config.verify():
            product.verify()
    return build


def position(stages: tuple, name: str) -> int:
    """The index of the first stage called ``name``."""
    found = next((k for k, stage in enumerate(stages) if stage.name == name), None)
    if found is None:
        raise ValueError(f"no stage {name!r} among {[stage.name for stage in stages]}")
    return found


def inserted_after(stages: tuple, name: str, stage: Stage) -> tuple:
    """``stages`` with ``stage`` right after the first stage called ``name``."""
    k = position(stages, name) + 1
    return stages[:k] + (stage,) + stages[k:]


def through(stages: tuple, name: str) -> tuple:
    """``stages`` up to and including the first stage called ``name``."""
    return stages[:position(stages, name) + 1]


# ---------------------------------------------------------------------------------------------
# The stages


def trace_stage(build: Build) -> None:
    build.forward, build.out_tree, build.state = traced_loss(build.fn, build.args, build.batched, build.has_aux)
    check_state(build.fn, build.state, build.spec.argnums, build.keeps_state)


def trace_outputs_stage(build: Build) -> None:
    build.forward, build.out_tree, build.state = trace_outputs(build.fn, build.args, build.batched)
    check_state(build.fn, build.state, (), build.keeps_state)
    build.program = as_gemms(build.forward)


def vjp_stage(build: Build) -> None:
    """The joint program: the loss, its gradients, then the aux values and the state (computed on
    the way).
    Pairwise distances become GEMMs first, so that their gradients are GEMMs too."""
    forward = as_gemms(build.forward)
    joint = vjp(forward.replace(outputs=forward.outputs[:1]), build.spec.wrt)
    build.program = joint.replace(outputs=joint.outputs + forward.outputs[1:])


def passes_stage(build: Build) -> None:
    build.program = optimize(build.program)


def lower_stage(build: Build) -> None:
    build.lowered = lower(build.program)


def lowered_passes_stage(build: Build) -> None:
    build.lowered = optimize(build.lowered)


def plan_stage(build: Build) -> None:
    build.plan = make_plan(build.lowered)


def codegen_stage(build: Build) -> None:
    build.source, build.arguments = render(build.plan)


def load_stage(build: Build) -> None:
    build.kernel = load_kernel(build.source, build.hint, build.cache)


TRACE = Stage("trace", "tracing", "trace (forward program)", trace_stage, "forward")
VJP = Stage("vjp", "reverse mode", "vjp (reverse mode)", vjp_stage, "program")
PASSES = Stage("passes", "optimising", "passes (simplify, CSE, DCE)", passes_stage, "program")
LOWER = Stage("lower", "lowering", "lower (composite ops)", lower_stage, "lowered")
LOWERED_PASSES = Stage("passes", "optimising", "passes (simplify, CSE, DCE)", lowered_passes_stage, "lowered")
PLAN = Stage("plan", "planning", "plan (fuse, loops, buffers)", plan_stage, "plan")
CODEGEN = Stage("codegen", "generating code", "codegen (source)", codegen_stage, "source")
LOAD = Stage("load", "loading the module", "module load", load_stage, "kernel")

TRACE_OUTPUTS = Stage("trace", "tracing", "trace (forward program)", trace_outputs_stage, "program")

FRONT = (TRACE, VJP, PASSES)                                      # to the joint program
BACK = (LOWER, LOWERED_PASSES, PLAN, CODEGEN, LOAD)               # from it to machine code
NATIVE = FRONT + BACK
FORWARD_FRONT = (TRACE_OUTPUTS, PASSES)                           # a forward-only function
FORWARD_NATIVE = FORWARD_FRONT + BACK


def compile_plan(joint: Program) -> Plan:
    """The replay plan of a joint program: composites lowered, optimised again, planned."""
    return run(through(BACK, "plan"), Build(program=joint)).plan
