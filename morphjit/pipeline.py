"""The compilation pipeline as data: named stages, run in order by one driver.

    trace -> vjp -> passes -> lower -> passes -> plan -> codegen -> load

Each `Stage` reads the `Build` of one compilation and fills in one of its fields. `run` times each
stage (``feedback.Timings``, shown by ``explain`` and the status line), prints what it made when
``MORPHJIT_DUMP`` names it, and verifies a program it made under ``MORPHJIT_VERIFY``. The interp
backend runs `FRONT` only; a training step inserts its own stages (``train.py``: the optimiser
update after the first passes, the in-place writes after plan) into the same list.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import cache as disk_cache
from . import codegen, config, feedback, kernels, passes
from .errors import DtypeError, ShapeError, TracingError
from .ir import Program, is_float
from .lower import lower
from .plan import Plan, make_plan
from .trace import argument_names, trace_with_tree
from .vjp import vjp


@dataclass
class Build:
    """One compilation: what it starts from and what each stage makes."""

    fn: Callable | None = None
    args: tuple = ()
    spec: object = None                  # compiler.ArgSpec: the differentiated leaves
    batched: frozenset = frozenset()     # the leaves whose leading extent is the batch size
    hint: str = "step"                   # the generated module's name
    cache: bool = True                   # load the module through the disk cache
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


def inserted(stages: tuple, after: Stage, stage: Stage) -> tuple:
    """``stages`` with ``stage`` right after ``after``."""
    k = stages.index(after) + 1
    return stages[:k] + (stage,) + stages[k:]


# ---------------------------------------------------------------------------------------------
# The stages

def trace_stage(build: Build) -> None:
    build.forward = trace_loss(build.fn, build.args, build.spec, build.batched)


def vjp_stage(build: Build) -> None:
    build.program = vjp(build.forward, build.spec.wrt)


def passes_stage(build: Build) -> None:
    build.program = passes.optimize(build.program)


def lower_stage(build: Build) -> None:
    build.lowered = lower(build.program)


def lowered_passes_stage(build: Build) -> None:
    build.lowered = passes.optimize(build.lowered)


def plan_stage(build: Build) -> None:
    build.plan = make_plan(build.lowered)


def codegen_stage(build: Build) -> None:
    build.source, build.arguments = codegen.render(build.plan)


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

FRONT = (TRACE, VJP, PASSES)                                      # to the joint program
BACK = (LOWER, LOWERED_PASSES, PLAN, CODEGEN, LOAD)               # from it to machine code
NATIVE = FRONT + BACK


def compile_plan(joint: Program) -> Plan:
    """The replay plan of a joint program: composites lowered, optimised again, planned."""
    return run(BACK[:BACK.index(PLAN) + 1], Build(program=joint)).plan


# ---------------------------------------------------------------------------------------------
# Tracing the loss

def trace_loss(fn, args, spec, batched=frozenset()) -> Program:
    """The forward program of ``fn``, checked to return one float scalar; the leading extent of
    the leaves in ``batched`` is the symbolic batch size."""
    try:
        program, out_tree = trace_with_tree(fn, args, batched)
    except TracingError as error:
        sequences = [found for name, arg in zip(argument_names(fn, len(args)), args)
                     for found in number_sequences(arg, name)]
        if not sequences:
            raise
        path, kind = sequences[0]
        raise TracingError(f"{error.message}. Note: {path} is a Python {kind}, whose numbers are traced "
                           f"one by one; to use it as an array, pass np.asarray({path})", error.loc) from None
    if out_tree.num_leaves != 1:
        raise TracingError(f"{fn.__name__} must return one scalar loss, but returned {out_tree} "
                           f"({out_tree.num_leaves} arrays)")
    (loss,) = program.outputs
    loc = next((b.loc for b in program.bindings if b.out is loss), None)
    if loss.shape != ():
        raise ShapeError(f"{fn.__name__} must return a scalar loss, but returned {loss.type}; "
                         f"reduce it, for example with .mean() or .sum()", loc)
    if not is_float(loss.dtype):
        raise DtypeError(f"{fn.__name__} must return a float loss, but returned {loss.type}", loc)
    return program


def number_sequences(tree, path: str) -> list[tuple[str, str]]:
    """The paths (and kinds) of the lists and tuples in ``tree`` that hold only numbers, nested
    or not: arrays written as Python sequences, whose numbers would be leaves of their own."""
    if type(tree) in (list, tuple) and is_numbers(tree):
        return [(path, type(tree).__name__)]
    if type(tree) is dict:
        return [found for k in sorted(tree) for found in number_sequences(tree[k], f"{path}[{k!r}]")]
    if type(tree) in (list, tuple):
        return [found for k, child in enumerate(tree) for found in number_sequences(child, f"{path}[{k}]")]
    return []


def is_numbers(x) -> bool:
    if type(x) in (list, tuple):
        return len(x) > 0 and all(map(is_numbers, x))
    return isinstance(x, (int, float, np.number)) and not isinstance(x, bool)


# ---------------------------------------------------------------------------------------------
# Loading the generated module

RECENT_KERNELS = 16   # disk-cached kernels kept in memory after the last step calling them is gone
_recent_kernels: OrderedDict = OrderedDict()   # (source, hint) -> dispatcher, the last used at the end
_recent_lock = threading.Lock()


def load_kernel(source: str, hint: str, cache: bool):
    """The entry dispatcher of the module ``source``. With ``cache``, one of the `RECENT_KERNELS`
    loaded last is reused with its machine code (a re-run notebook cell starts at once); the others
    are released with the last step that calls them, and come back from the disk cache."""
    key = (source, hint)
    if cache:
        with _recent_lock:
            kernel = _recent_kernels.get(key)
            if kernel is not None:
                _recent_kernels.move_to_end(key)
                return kernel
    with kernels.caching(cache):   # the loop-nest kernels the module loads as it runs
        kernel = getattr(disk_cache.load_module(source, name_hint=hint, cache=cache), codegen.ENTRY)
    if cache:
        with _recent_lock:
            _recent_kernels[key] = kernel
            while len(_recent_kernels) > RECENT_KERNELS:
                _recent_kernels.popitem(last=False)
    return kernel
