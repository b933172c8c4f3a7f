"""The compilation pipeline as data: named stages, run in order by one driver.

    trace -> vjp -> passes -> lower -> passes -> plan -> codegen -> load

A forward-only function (``mj.compile``) skips vjp (`FORWARD_NATIVE`). Each `Stage` reads the
`Build` of one compilation and fills in one of its fields. `run` times each stage
(``feedback.Timings``, shown by ``explain`` and the status line), prints what it made when
``MORPHJIT_DUMP`` names it, and verifies a program it made under ``MORPHJIT_VERIFY``. The interp
backend runs `FRONT` only; a training step inserts its own stages (``train.py``: the optimiser
update after the first passes, the in-place writes after plan) into the same list.
"""
from __future__ import annotations

import functools
import inspect
import linecache
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..cache import policy as disk_cache
from ..backend.codegen import writer as codegen
from ..util import config
from ..transforms import distances
from . import feedback
from ..runtime import kernels
from ..transforms import passes
from ..util import pytree
from ..backend.codegen import tablegen
from ..util.errors import DtypeError, ShapeError, SourceLoc, TracingError
from ..tracing.twice import FrozenValueError, trace_twice
from ..ir.program import Program, is_float
from ..transforms.expand import lower
from ..backend.plan import Plan, make_plan
from ..tracing.tracer import NotAnArray, Tracer, argument_names
from ..transforms.vjp import vjp


@dataclass
class Build:
    """One compilation: what it starts from and what each stage makes."""

    fn: Callable | None = None
    args: tuple = ()
    spec: object = None                  # compiler.ArgSpec: the differentiated leaves
    batched: frozenset = frozenset()     # the leaves whose leading extent is the batch size
    hint: str = "step"                   # the generated module's name
    cache: bool = True                   # load the module through the disk cache
    has_aux: bool = False                # the loss function returns (loss, aux)
    out_tree: object = None              # trace: the tree of aux, or of a forward function's outputs
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
    build.forward, build.out_tree = traced_loss(build.fn, build.args, build.batched, build.has_aux)


def trace_outputs_stage(build: Build) -> None:
    build.forward, build.out_tree = trace_outputs(build.fn, build.args, build.batched)
    build.program = distances.as_gemms(build.forward)


def vjp_stage(build: Build) -> None:
    """The joint program: the loss, its gradients, then the aux values (computed on the way).
    Pairwise distances become GEMMs first, so that their gradients are GEMMs too."""
    forward = distances.as_gemms(build.forward)
    joint = vjp(forward.replace(outputs=forward.outputs[:1]), build.spec.wrt)
    build.program = joint.replace(outputs=joint.outputs + forward.outputs[1:])


def passes_stage(build: Build) -> None:
    build.program = passes.optimize(build.program)


def lower_stage(build: Build) -> None:
    build.lowered = lower(build.program)


def lowered_passes_stage(build: Build) -> None:
    build.lowered = passes.optimize(build.lowered)


def plan_stage(build: Build) -> None:
    build.plan = make_plan(build.lowered)


def codegen_stage(build: Build) -> None:
    build.source, build.arguments = tablegen.render(build.plan)


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
    return run(BACK[:BACK.index(PLAN) + 1], Build(program=joint)).plan


# ---------------------------------------------------------------------------------------------
# Tracing the loss

def trace_loss(fn, args, spec=None, batched=frozenset()) -> Program:
    """The forward program of ``fn``, checked to return one float scalar."""
    return traced_loss(fn, args, batched)[0]


def traced_loss(fn, args, batched=frozenset(), has_aux=False) -> tuple[Program, object]:
    """The forward program of ``fn``, checked to return one float scalar (with ``has_aux``: a
    pair ``(loss, aux)``, aux's leaves the program's further outputs), and aux's tree. The
    leading extent of the leaves in ``batched`` is the symbolic batch size."""
    traced = aux_checked(fn) if has_aux else fn
    program, out_tree = traced_program(traced, args, batched)
    loss_tree, aux_tree = out_tree.children if has_aux else (out_tree, None)
    if loss_tree.num_leaves != 1:
        raise TracingError(f"{fn.__name__} must return one scalar loss, but returned {loss_tree} "
                           f"({loss_tree.num_leaves} arrays)", function_location(fn))
    loss = program.outputs[0]
    loc = next((b.loc for b in program.bindings if b.out is loss), None)
    if loss.shape != ():
        raise ShapeError(f"{fn.__name__} must return a scalar loss, but returned {loss.type}; "
                         f"reduce it, for example with .mean() or .sum()", loc)
    if not is_float(loss.dtype):
        raise DtypeError(f"{fn.__name__} must return a float loss, but returned {loss.type}", loc)
    return program, aux_tree


def trace_outputs(fn, args, batched=frozenset()) -> tuple[Program, object]:
    """The program of a forward-only function, whose outputs are the leaves of what it returns
    (a tree of arrays and numbers), and their tree."""
    checked = functools.wraps(fn)(lambda *a: check_leaves(fn, fn(*a), "output"))
    program, out_tree = traced_program(checked, args, batched)
    if not out_tree.num_leaves:
        raise TracingError(f"{fn.__name__} returned {out_tree}, which holds no arrays", function_location(fn))
    return program, out_tree


def traced_program(fn, args, batched):
    """``trace_twice``, its error extended when an argument holds Python lists of numbers."""
    try:
        return trace_twice(fn, args, batched)
    except FrozenValueError:
        raise
    except TracingError as error:
        sequences = [found for name, arg in zip(argument_names(fn, len(args)), args)
                     for found in number_sequences(arg, name)]
        if not sequences:
            raise
        path, kind = sequences[0]
        raise TracingError(f"{error.message}. Note: {path} is a Python {kind}, whose numbers are traced "
                           f"one by one; to use it as an array, pass np.asarray({path})", error.loc) from None


def aux_checked(fn):
    """``fn``, checked to return a pair ``(loss, aux)`` whose aux holds arrays and numbers."""
    @functools.wraps(fn)
    def checked(*args):
        result = fn(*args)
        if type(result) not in (tuple, list) or len(result) != 2:
            got = (f"a {type(result).__name__} of {len(result)}" if type(result) in (tuple, list)
                   else f"a {type(result).__name__}")
            raise TracingError(f"{fn.__name__} is compiled with has_aux=True, so it must return a pair "
                               f"(loss, aux), but it returned {got}", function_location(fn))
        check_leaves(fn, result[1], "aux")
        return result
    return checked


def check_leaves(fn, tree, root: str):
    """``tree``, refused (naming the leaf's path) unless its leaves are arrays or numbers."""
    leaves, treedef = pytree.flatten(tree)
    for path, leaf in zip(pytree.leaf_paths(treedef, root), leaves):
        if not isinstance(leaf, (Tracer, NotAnArray, np.ndarray, np.generic, bool, int, float)):
            raise TracingError(f"{path} returned by {fn.__name__} is a {type(leaf).__name__}; "
                               f"{root} must hold arrays or numbers", function_location(fn))
    return tree


def function_location(fn) -> SourceLoc | None:
    """Where ``fn`` is defined: the line an error about what it returns points at."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return None
    line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    return SourceLoc(code.co_filename, code.co_firstlineno, code.co_name, line)


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
    with kernels.loading(cache) as taken:   # the loop-nest kernels the module loads as it runs
        module = disk_cache.load_module(source, name_hint=hint, cache=cache)
    kernels.hold(vars(module), taken)
    kernel = getattr(module, codegen.ENTRY)
    if cache:
        with _recent_lock:
            _recent_kernels[key] = kernel
            while len(_recent_kernels) > RECENT_KERNELS:
                _recent_kernels.popitem(last=False)
    return kernel
