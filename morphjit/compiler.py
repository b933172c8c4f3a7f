"""The pipeline (trace -> vjp -> passes -> backend) and the ``@compile_loss`` decorator."""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import cache as disk_cache
from . import codegen, feedback, interp, passes, pytree
from .errors import DtypeError, ShapeError, TracingError
from .ir import Program, is_float
from .lower import lower
from .plan import make_plan
from .runtime import NativeStep, fast_call
from .trace import argument_names, trace_with_tree
from .tracebacks import trimmed
from .vjp import vjp

BACKENDS = ("numba", "interp")


@dataclass(frozen=True)
class ArgSpec:
    """How a call's arguments flatten, and which leaves are differentiated."""

    treedef: pytree.TreeDef
    argnums: tuple[int, ...]
    wrt: tuple[int, ...]            # indices of differentiated leaves

    def arg_treedef(self, argnum: int) -> pytree.TreeDef:
        return self.treedef.children[argnum]


def arg_spec(fn, args, argnums) -> tuple[ArgSpec, list]:
    argnums_t = normalize_argnums(argnums, len(args))
    leaves, treedef = pytree.flatten(tuple(args))
    names = argument_names(fn, len(args))
    paths, ranges, start = [], [], 0
    for i, child in enumerate(treedef.children):
        paths += pytree.leaf_paths(child, names[i])
        ranges.append(range(start, start + child.num_leaves))
        start += child.num_leaves
    wrt = tuple(j for i in argnums_t for j in ranges[i])
    for j in wrt:
        check_differentiable(leaves[j], paths[j])
    return ArgSpec(treedef, argnums_t, wrt), leaves


def normalize_argnums(argnums, nargs: int) -> tuple[int, ...]:
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    for n in nums:
        if not isinstance(n, int) or isinstance(n, bool) or not -nargs <= n < nargs:
            raise TracingError(f"argnums={argnums!r} does not fit a call with {nargs} positional "
                               f"argument{'s' if nargs != 1 else ''}")
    return tuple(n % nargs for n in nums)


def check_differentiable(leaf, path: str) -> None:
    if not isinstance(leaf, (np.ndarray, np.generic)):
        raise DtypeError(f"{path} is differentiated but is a {type(leaf).__name__}; differentiated "
                         f"arguments must hold float32 or float64 NumPy arrays")
    if not is_float(leaf.dtype):
        raise DtypeError(f"{path} is differentiated but is a {leaf.dtype} array; only float32 and "
                         f"float64 arrays have gradients (pass labels and masks as data arguments, "
                         f"or choose the differentiated arguments with argnums)")


def trace_loss(fn, args, spec: ArgSpec) -> Program:
    """The forward program of ``fn``, checked to return one float scalar."""
    program, out_tree = trace_with_tree(fn, args)
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


def joint_program(forward: Program, wrt, timings=feedback.NO_TIMINGS) -> Program:
    """Forward and backward in one program: outputs are the loss and one gradient per ``wrt``."""
    with timings.stage("vjp"):
        joint = vjp(forward, wrt)
    with timings.stage("passes"):
        return passes.optimize(joint)


def compile_plan(joint: Program, timings=feedback.NO_TIMINGS):
    """The replay plan of a joint program: composites lowered, optimised again, fused, planned."""
    with timings.stage("plan"):
        return make_plan(passes.optimize(lower(joint)))


def native_step(plan, hint: str, cache: bool, timings=feedback.NO_TIMINGS) -> tuple[NativeStep, str]:
    """Render a plan, load its module (from the disk cache when ``cache``) and wrap its entry."""
    with timings.stage("codegen"):
        source, arguments = codegen.render(plan)
    with timings.stage("load"):
        module = disk_cache.load_module(source, name_hint=hint, cache=cache)
    return NativeStep(plan, getattr(module, codegen.ENTRY), arguments), source


def name_hint(fn) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in getattr(fn, "__name__", "step"))
    return name[:40] or "step"


def grad_program(fn, *args, argnums=0) -> Program:
    """The joint forward+backward program of ``fn`` at ``args``, for printing."""
    spec, _ = arg_spec(fn, args, argnums)
    return joint_program(trace_loss(fn, args, spec), spec.wrt)


# ---------------------------------------------------------------------------------------------
# The decorator

def leaf_signature(leaf):
    """What a compiled step depends on in an argument leaf: shape and dtype, or the scalar type."""
    if isinstance(leaf, (np.ndarray, np.generic)):
        return leaf.shape, leaf.dtype
    return type(leaf)


@dataclass(frozen=True)
class CacheInfo:
    hits: int                       # calls served by a step already in memory
    misses: int                     # calls that traced a new signature
    signatures: tuple[str, ...]     # the input types of each signature held
    disk_loads: int = 0             # steps whose machine code came from the disk cache


@dataclass
class Step:
    """One compiled signature: its spec, its joint program and the function that runs it."""

    spec: ArgSpec
    program: Program
    run: Callable
    source: str | None = None    # the generated module (numba backend)
    fast: Callable | None = None  # args -> (loss, grads) or None: the checked fast path
    forward: Program | None = None   # the traced forward program
    plan: object = None              # the replay plan (numba backend)
    timings: feedback.Timings | None = None  # seconds per compilation stage, origin of the code

    def __post_init__(self):
        self._builders = [pytree.builder(self.spec.arg_treedef(i)) for i in self.spec.argnums]

    def gradient_trees(self, grads):
        """The gradients in the structure of the differentiated arguments."""
        it = iter(grads)
        return [build(it) for build in self._builders]

    def run_into(self, leaves, out: list) -> np.ndarray:
        """Run with the gradients written into ``out``; returns the loss."""
        if isinstance(self.run, NativeStep):
            return self.run(*leaves, out=out)[0]
        outputs = self.run(*leaves)
        for target, value in zip(out, outputs[1:]):
            np.copyto(target, value)
        return outputs[0]

    def check_out(self, out, single: bool, leaves) -> list:
        """The arrays of an ``out=`` tree, checked against the gradients they will receive."""
        arrays, treedef = pytree.flatten(out)
        children = tuple(self.spec.arg_treedef(i) for i in self.spec.argnums)
        expected = children[0] if single else pytree.TreeDef(tuple, (), children)
        if treedef != expected:
            raise TracingError(f"out= must have the structure of the gradients, {expected}; got {treedef}")
        paths = pytree.leaf_paths(treedef, "out")
        inputs = {id(x) for x in leaves}
        for path, array, v in zip(paths, arrays, self.program.outputs[1:]):
            if not (isinstance(array, np.ndarray) and array.shape == v.shape and array.dtype == v.dtype
                    and array.flags.c_contiguous and array.flags.writeable):
                raise DtypeError(f"{path} must be a writeable C-contiguous {v.dtype} array of shape {v.shape}")
            if id(array) in inputs:
                raise TracingError(f"{path} is also an argument of the call; gradients cannot overwrite inputs")
        return arrays


class CompiledLoss:
    """A loss function compiled, per input signature, into a step returning (loss, gradients)."""

    def __init__(self, fn, argnums=0, backend="numba", cache=True):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        functools.update_wrapper(self, fn)
        self.fn, self.argnums, self.backend, self.cache = fn, argnums, backend, cache
        self._single = not isinstance(argnums, (tuple, list))
        self._steps: dict = {}
        self._hits = self._misses = 0
        self._fast = None  # the generated fast path of the signature called last

    def __call__(self, *args, out=None, **kwargs):
        """``(loss, grads)``; with ``out=`` (a tree shaped like ``grads``) the gradients are written
        there and ``out`` is returned, so a steady-state call allocates no gradient arrays.
        Keyword arguments are bound to the function's positional parameters."""
        __tracebackhide__ = True  # noqa: F841 (IPython and pytest hide this frame)
        if kwargs:
            args = self._positional(args, kwargs)
        if out is None and self._fast is not None:
            result = self._fast(args)
            if result is not None:
                self._hits += 1
                return result
        step, leaves = self._step(args)
        self._fast = step.fast
        if out is not None:
            return step.run_into(leaves, step.check_out(out, self._single, leaves))[()], out
        outputs = step.run(*leaves)
        trees = step.gradient_trees(outputs[1:])
        return outputs[0][()], trees[0] if self._single else tuple(trees)

    def _positional(self, args, kwargs) -> tuple:
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.__name__}: {e}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise TypeError(f"{self.__name__}: keyword-only or **kwargs parameters cannot be traced "
                            f"({', '.join(bound.kwargs)}); make them positional")
        return bound.args

    def _step(self, args, count=True):
        leaves = []
        key = pytree.keyed_flatten(args, leaves, leaf_signature)
        step = self._steps.get(key)
        if step is None:
            __tracebackhide__ = True  # noqa: F841
            self._misses += count
            timings = feedback.Timings()
            status = feedback.Status(self.__name__, timings)  # "compiling..." if it takes long
            status.start()
            try:
                step = self._compile(args, timings, status)
            except BaseException as error:
                status.finish(failed=True)
                raise trimmed(error)  # morphjit's frames left out; MORPHJIT_TRACEBACK=full shows them
            if step.plan is not None:
                status.pause()  # numba compiles or loads at the first call, which resumes it
            else:
                status.finish()
            self._steps[key] = step
        else:
            self._hits += count
        return step, leaves

    def _compile(self, args, timings=feedback.NO_TIMINGS, status=None) -> Step:
        spec, leaves = arg_spec(self.fn, args, self.argnums)
        with timings.stage("trace"):
            forward = trace_loss(self.fn, args, spec)
        program = joint_program(forward, spec.wrt, timings)
        if self.backend == "interp":
            return Step(spec, program, functools.partial(interp.run, program), forward=forward, timings=timings)
        plan = compile_plan(program, timings)
        native, source = native_step(plan, name_hint(self.fn), self.cache, timings)
        feedback.watch_first_call(native, timings, status)
        fast = fast_call(spec.treedef, [leaf_signature(x) for x in leaves],
                         [spec.arg_treedef(i) for i in spec.argnums], self._single, native)
        return Step(spec, program, native, source, fast, forward, plan, timings)

    def cache_info(self) -> CacheInfo:
        sigs = tuple(" ".join(str(v.type) for v in s.program.inputs) for s in self._steps.values())
        loads = sum(isinstance(s.run, NativeStep) and disk_cache.loaded_from_disk(s.run.kernel)
                    for s in self._steps.values())
        return CacheInfo(self._hits, self._misses, sigs, loads)

    def program(self, *args) -> Program:
        """The joint program that runs for ``args``."""
        return self._step(args, count=False)[0].program

    def source(self, *args) -> str:
        """The generated source of the step that runs for ``args`` (numba backend)."""
        step = self._step(args, count=False)[0]
        if step.source is None:
            raise ValueError(f"backend={self.backend!r} generates no source; use backend='numba'")
        return step.source

    def explain(self, *args, **kwargs):
        """A report on the step that runs for ``args``: its programs, fusion groups, buffer plan,
        generated source and the time each compilation stage took. It renders as text (``print``)
        and as HTML in a notebook. The step is compiled (or loaded) and run once if it was not yet."""
        __tracebackhide__ = True  # noqa: F841
        from .explain import explain
        if kwargs:
            args = self._positional(args, kwargs)
        return explain(self, args)

    def __repr__(self) -> str:
        from .explain import summary
        return f"<compiled loss {self.__name__!r}: {summary(self)}>"


def compile_loss(fn=None, *, argnums=0, backend="numba", cache=True):
    """Compile ``fn(params, *data) -> scalar loss`` into a step returning ``(loss, grads)``.

    Usable as ``@compile_loss``, ``@compile_loss(argnums=..., backend=...)`` or
    ``compile_loss(fn, ...)``. ``grads`` mirrors the structure of the differentiated
    argument(s) (a tuple of them when ``argnums`` is a tuple).
    """
    if fn is None:
        return lambda f: CompiledLoss(f, argnums, backend, cache)
    return CompiledLoss(fn, argnums, backend, cache)
