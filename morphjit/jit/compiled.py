"""The call site: argument checks, the signature cache shared with ``train_step`` (`CallSite`,
`StepsByShape`) and the ``@compile_loss`` decorator; the stages themselves are in ``pipeline.py``.

Over 450 lines because the argument checks (paths, subclasses, ``out=``, class labels) live here
with the call they guard; they are the next thing to move out (a ``checks`` module) if it grows.
"""
from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..cache import policy as disk_cache
from . import feedback
from ..runtime import interp
from . import pipeline
from ..util import pytree
from ..util.errors import DtypeError, MorphjitError, ShapeError, TracingError
from ..runtime.fastpath import fast_call, fast_forward
from ..ir.program import Program, Specialize, batch_size, evaluate, is_float
from .pipeline import number_sequences
from ..runtime.step import NativeStep
from .static_args import StaticArguments
from ..tracing.tracer import argument_names
from ..util.tracebacks import trimmed

BACKENDS = ("numba", "interp")
SPECIALISED = "specialised"   # a signature whose program needs the concrete batch size


@dataclass(frozen=True)
class ArgSpec:
    """How a call's arguments flatten, and which leaves are differentiated."""

    treedef: pytree.TreeDef
    argnums: tuple[int, ...]
    wrt: tuple[int, ...]            # indices of differentiated leaves
    params: frozenset = frozenset()  # indices of the leaves that are not data (no batch axis)

    def arg_treedef(self, argnum: int) -> pytree.TreeDef:
        return self.treedef.children[argnum]


def argument_paths(fn, treedef) -> list[str]:
    """Readable paths of the leaves of ``fn``'s argument tuple: ``params['W1']``, ``x``."""
    names = argument_names(fn, len(treedef.children))
    return [p for name, child in zip(names, treedef.children) for p in pytree.leaf_paths(child, name)]


def arg_spec(fn, args, argnums) -> tuple[ArgSpec, list]:
    argnums_t = normalize_argnums(argnums, len(args))
    leaves, treedef = pytree.flatten(tuple(args))
    paths = argument_paths(fn, treedef)
    ranges, start = [], 0
    for child in treedef.children:
        ranges.append(range(start, start + child.num_leaves))
        start += child.num_leaves
    names = argument_names(fn, len(args))
    for i in argnums_t:
        sequences = number_sequences(args[i], names[i])
        if sequences:
            path, kind = sequences[0]
            raise DtypeError(f"{path} is differentiated but is a Python {kind} of numbers; differentiated "
                             f"arguments must hold float32 or float64 NumPy arrays: pass np.asarray({path})")
    wrt = tuple(j for i in argnums_t for j in ranges[i])
    for leaf, path in zip(leaves, paths):
        check_plain(leaf, path)
    for j in wrt:
        check_differentiable(leaves[j], paths[j])
    # The first of several arguments holds the parameters: no batch axis even when not differentiated
    params = frozenset(wrt) | frozenset(ranges[0] if len(args) > 1 else ())
    return ArgSpec(treedef, argnums_t, wrt, params), leaves


def normalize_argnums(argnums, nargs: int) -> tuple[int, ...]:
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    for n in nums:
        if not isinstance(n, int) or isinstance(n, bool) or not -nargs <= n < nargs:
            raise TracingError(f"argnums={argnums!r} does not fit a call with {nargs} positional "
                               f"argument{'s' if nargs != 1 else ''}")
    return tuple(n % nargs for n in nums)


# ndarray subclasses that hold plain data, taken as arrays. Any other subclass is refused: the
# compiled step would see its data only (a masked array's mask, np.matrix's `*`, units).
PLAIN_SUBCLASSES = (np.memmap,)


def is_plain_array(x) -> bool:
    return type(x) is np.ndarray or isinstance(x, PLAIN_SUBCLASSES)


def check_plain(leaf, path: str) -> None:
    """Refuse an ndarray subclass whose meaning the step would lose, saying what to pass instead."""
    if not isinstance(leaf, np.ndarray) or is_plain_array(leaf):
        return
    kind = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
    if isinstance(leaf, np.ma.MaskedArray):
        hint = (f"its mask would be ignored; pass {path}.filled(value), or np.asarray({path}) and "
                f"the mask as a data argument (mj.where(mask, ..., 0.0))")
    elif isinstance(leaf, np.matrix):
        hint = f"`*` and `**` would not mean what they mean for a matrix; pass np.asarray({path})"
    else:
        hint = f"only its data would be used; pass np.asarray({path}) if that is what you mean"
    raise DtypeError(f"{path} is a {kind}: {hint}")


def check_differentiable(leaf, path: str) -> None:
    if not isinstance(leaf, (np.ndarray, np.generic)):
        raise DtypeError(f"{path} is differentiated but is a {type(leaf).__name__}; differentiated "
                         f"arguments must hold float32 or float64 NumPy arrays")
    if not is_float(leaf.dtype):
        raise DtypeError(f"{path} is differentiated but is a {leaf.dtype} array; only float32 and "
                         f"float64 arrays have gradients (pass labels and masks as data arguments, "
                         f"or choose the differentiated arguments with argnums)")


def named(fn):
    """``fn``, or for a callable without a ``__name__`` (a ``functools.partial``, an object with
    ``__call__``) a function calling it, named after what it calls, with its signature."""
    if hasattr(fn, "__name__"):
        return fn
    inner = fn.func if isinstance(fn, functools.partial) else type(fn)

    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(inner, "__name__", "step")
    call.__doc__, call.__module__ = getattr(inner, "__doc__", None), getattr(inner, "__module__", None)
    call.__signature__ = inspect.signature(fn)
    return call


def name_hint(fn) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in getattr(fn, "__name__", "step"))
    return name[:40] or "step"


def data_arrays(leaves, params) -> list[int]:
    """The indices of the leaves that are data arrays with a leading axis (not ``params``)."""
    return [k for k, x in enumerate(leaves) if k not in params and isinstance(x, np.ndarray) and x.ndim]


def batched_leaves(leaves, params) -> frozenset[int]:
    """The data leaves whose leading extent is the batch size: that of the first data array.
    A data array with another leading extent keeps it concrete. A batch of one is traced with
    concrete shapes: NumPy gives an extent of 1 a meaning of its own (``squeeze()`` drops it,
    broadcasting stretches it), which a symbolic batch size, taken to be another, would lose."""
    data = data_arrays(leaves, params)
    if not data or leaves[data[0]].shape[0] == 1:
        return frozenset()
    batch = leaves[data[0]].shape[0]
    return frozenset(k for k in data if leaves[k].shape[0] == batch)


def shape_key(treedef, leaves, batched) -> tuple:
    """A call's signature with the batch size left out: the key of a polymorphic step."""
    return treedef, tuple((None,) + x.shape[1:] + (x.dtype,) if k in batched else leaf_signature(x)
                          for k, x in enumerate(leaves))


def batch_mismatch(fn, spec: ArgSpec, leaves) -> ShapeError | None:
    """The error to raise when data arguments disagree on their leading (batch) extent."""
    paths = argument_paths(fn, spec.treedef)
    data = [(paths[k], leaves[k].shape[0]) for k in data_arrays(leaves, spec.params)]
    other = next(((p, n) for p, n in data if n != data[0][1]), None)
    if other is None:
        return None
    return ShapeError(f"{data[0][0]} has {data[0][1]} rows but {other[0]} has {other[1]}: data "
                      f"arguments share their leading (batch) dimension")


class StepsByShape:
    """Compiled steps by call signature without the batch size. A polymorphic step serves every
    batch size; a signature whose program needs the concrete size is marked SPECIALISED, and
    each of its concrete signatures gets a step of its own."""

    def __init__(self, static_shapes: bool):
        self.static_shapes = static_shapes
        self.steps: dict = {}

    def batched(self, spec: ArgSpec, leaves) -> frozenset[int]:
        return frozenset() if self.static_shapes else batched_leaves(leaves, spec.params)

    def find(self, spec: ArgSpec, leaves, batched):
        step = self.steps.get(shape_key(spec.treedef, leaves, batched))
        return None if step is SPECIALISED else step

    def build(self, fn, spec: ArgSpec, leaves, batched, compile):
        """``compile(batched)``: polymorphic where the program allows, else specialised."""
        key = shape_key(spec.treedef, leaves, batched)
        if batched and self.steps.get(key) is not SPECIALISED:
            try:
                step = self.steps[key] = compile(batched)
                return step
            except (Specialize, MorphjitError):
                self.steps[key] = SPECIALISED
        try:
            return compile(frozenset())
        except MorphjitError as error:
            mismatch = batch_mismatch(fn, spec, leaves)
            if mismatch is None:
                raise
            raise mismatch from error


class CallSite:
    """The compiled steps of one function by call signature, shared by `CompiledLoss` and
    `train.TrainStep`: steps by leaf signature (several may share a polymorphic step, see
    `StepsByShape`), the lock under which one thread compiles a new signature while the others
    calling with it wait, the call statistics, and the generated fast path of the step called last."""

    def __init__(self, static_shapes: bool):
        self.by_leaves: dict = {}       # a call's leaf signatures -> its step
        self.shapes = StepsByShape(static_shapes)
        self.hits, self.misses = Tally(), Tally()
        self.fast = None                # the fast path of the step called last, or None
        self.compiling = threading.RLock()

    def find(self, args):
        """The step of ``args``' leaf signature (None if there is none yet) and their leaves."""
        leaves = []
        return self.by_leaves.get(pytree.keyed_flatten(args, leaves, leaf_signature)), leaves

    def step(self, args, new, count=True):
        """The step for ``args`` and their leaves; a new leaf signature gets ``new(leaves)``
        (which uses `of_shapes`), called by one thread while the others wait for its step."""
        leaves = []
        key = pytree.keyed_flatten(args, leaves, leaf_signature)
        step = self.by_leaves.get(key)
        if step is None:
            with self.compiling:
                step = self.by_leaves.get(key)
                if step is None:
                    step = self.by_leaves[key] = new(leaves)
                    return step, leaves
        self.hits.add(count)
        return step, leaves

    def of_shapes(self, fn, spec: ArgSpec, leaves, compile, count=True, on_miss=lambda: None):
        """The step for a new leaf signature: the polymorphic step that serves it at another batch
        size (a hit), or ``compile(batched)`` (a miss; see `StepsByShape.build`)."""
        batched = self.shapes.batched(spec, leaves)
        step = self.shapes.find(spec, leaves, batched)
        if step is not None:
            self.hits.add(count)
            return step
        self.misses.add(count)
        on_miss()
        return self.shapes.build(fn, spec, leaves, batched, compile)

    def steps(self) -> list:
        """The compiled steps, each once (a polymorphic step serves several leaf signatures)."""
        return list({id(s): s for s in list(self.by_leaves.values())}.values())   # a snapshot: others may add

    def stats(self, kernel_of) -> CallStats:
        """The call statistics; ``kernel_of(step)`` is its dispatcher, or None (interp)."""
        steps = self.steps()
        signatures = tuple(" ".join(str(v.type) for v in s.program.inputs) for s in steps)
        loads = sum(k is not None and disk_cache.loaded_from_disk(k) for k in map(kernel_of, steps))
        return CallStats(self.hits.value, self.misses.value, signatures, loads)


class Tally:
    """A count that threads add to without a lock and without losing an addition: each thread
    adds to a cell of its own (``+=`` on a shared int is a read and a write another thread's
    addition can fall between); the value is the sum of the cells."""

    __slots__ = ("local", "cells")

    def __init__(self):
        self.local = threading.local()
        self.cells: list[list[int]] = []

    def add(self, n: int = 1) -> None:
        try:
            self.local.cell[0] += n
        except AttributeError:   # this thread's first addition
            cell = self.local.cell = [n]
            self.cells.append(cell)   # list.append is atomic

    @property
    def value(self) -> int:
        return sum(cell[0] for cell in list(self.cells))


def grad_program(fn, *args, argnums=0) -> Program:
    """The joint forward+backward program of ``fn`` at ``args``, for printing."""
    spec, _ = arg_spec(fn, args, argnums)
    return pipeline.run(pipeline.FRONT, pipeline.Build(fn, args, spec)).program


# ---------------------------------------------------------------------------------------------
# The decorator

def leaf_signature(leaf):
    """What a compiled step depends on in an argument leaf: shape and dtype, or the scalar type.
    An ndarray subclass that is refused has a signature of its own, so it is never served by the
    step of a plain array (``arg_spec`` refuses it)."""
    if isinstance(leaf, np.generic) or is_plain_array(leaf):
        return leaf.shape, leaf.dtype
    if isinstance(leaf, np.ndarray):
        return type(leaf), leaf.shape, leaf.dtype
    return type(leaf)


@dataclass(frozen=True)
class CallStats:
    """What ``cache_info()`` of a compiled loss or training step reports (the disk cache's own
    summary is ``cache.CacheInfo``, from ``mj.cache_info()``)."""

    hits: int                       # calls served by a step already in memory
    misses: int                     # calls that traced a new signature
    signatures: tuple[str, ...]     # the input types of each signature held
    disk_loads: int = 0             # steps whose machine code came from the disk cache

    @staticmethod
    def total(stats) -> CallStats:
        """The statistics of several call sites (one per value of the static arguments) as one."""
        return CallStats(sum(s.hits for s in stats), sum(s.misses for s in stats),
                         tuple(sig for s in stats for sig in s.signatures), sum(s.disk_loads for s in stats))


@dataclass
class Step:
    """One compiled signature: its spec, its joint program and the function that runs it."""

    spec: ArgSpec
    program: Program
    run: Callable
    source: str | None = None    # the generated module (numba backend)
    fast: Callable | None = None  # args -> the call's result, or None: the checked fast path
    forward: Program | None = None   # the traced forward program
    plan: object = None              # the replay plan (numba backend)
    timings: feedback.Timings | None = None  # seconds per compilation stage, origin of the code
    out_tree: pytree.TreeDef | None = None   # of aux (a loss with has_aux), or of the outputs

    def __post_init__(self):
        self._builders = [pytree.builder(self.spec.arg_treedef(i)) for i in self.spec.argnums]

    def gradient_trees(self, grads):
        """The gradients in the structure of the differentiated arguments."""
        it = iter(grads)
        return [build(it) for build in self._builders]

    def run_into(self, leaves, out: list) -> list:
        """Run with the gradients written into ``out``; returns all the outputs."""
        if isinstance(self.run, NativeStep):
            return self.run(*leaves, out=out)
        outputs = self.run(*leaves)
        for target, value in zip(out, outputs[1:]):
            np.copyto(target, value)
        return outputs

    def check_out(self, out, single: bool, leaves, leaf_paths) -> list:
        """The arrays of an ``out=`` tree, checked against the gradients they will receive and
        against the call's arguments (``leaves``, named by ``leaf_paths``) and each other: an
        array written while arguments or other gradients are still being read must not share
        memory with them."""
        arrays, treedef = pytree.flatten(out)
        children = tuple(self.spec.arg_treedef(i) for i in self.spec.argnums)
        expected = children[0] if single else pytree.TreeDef(tuple, (), children)
        if treedef != expected:
            raise TracingError(f"out= must have the structure of the gradients, {expected}; got {treedef}")
        paths = pytree.leaf_paths(treedef, "out")
        for k, (path, array, v) in enumerate(zip(paths, arrays, self.program.outputs[1:])):
            if not (is_plain_array(array) and array.shape == v.shape and array.dtype == v.dtype
                    and array.flags.c_contiguous and array.flags.writeable):
                got = (f"a {type(array).__name__} of {array.dtype} and shape {array.shape}"
                       if isinstance(array, np.ndarray) else f"a {type(array).__name__}")
                raise DtypeError(f"{path} must be a writeable C-contiguous {v.dtype} array of shape {v.shape} "
                                 f"(a NumPy ndarray, not a subclass), got {got}")
            argument = sharing_memory(array, leaf_paths, leaves)
            if argument is not None:
                raise TracingError(f"{path} shares memory with {argument}, an argument of the call; "
                                   f"gradients cannot overwrite inputs (pass an array of its own)")
            other = sharing_memory(array, paths[:k], arrays[:k])
            if other is not None:
                raise TracingError(f"{path} shares memory with {other}; each gradient needs an array of its own")
        return arrays


def label_error(program: Program, paths, leaves) -> ValueError | None:
    """The error for the first argument that ``program`` reads as class labels (of ``one_hot``
    or ``softmax_cross_entropy``) and that holds a label outside ``[0, classes)``: its path, the
    first offending value and its index. ``leaves`` (named by ``paths``) are the program's
    first inputs."""
    inputs = program.inputs[:len(leaves)]
    position = {id(v): k for k, v in enumerate(inputs)}
    for b in program.bindings:
        if b.op == "one_hot":
            labels, classes = b.inputs[0], b.kwargs["depth"]
        elif b.op == "softmax_cross_entropy" and b.inputs[1].dtype.kind in "iu":
            labels, classes = b.inputs[1], evaluate(b.inputs[0].shape[-1], batch_size(inputs, leaves))
        else:
            continue
        k = position.get(id(labels))
        values = np.asarray(leaves[k]) if k is not None else None
        outside = None if values is None else np.flatnonzero((values < 0) | (values >= classes))
        if outside is not None and outside.size:
            index = "".join(f"[{i}]" for i in np.unravel_index(outside[0], values.shape))
            return ValueError(f"{paths[k]}{index} is {values.flat[outside[0]]}, but class labels must lie "
                              f"in [0, {classes}) ({outside.size} of the {values.size} labels are outside)")
    return None


def run_reference(program: Program, paths, *leaves) -> list[np.ndarray]:
    """The reference executor, refusing out-of-range class labels as the compiled step does."""
    error = label_error(program, paths, leaves)
    if error is not None:
        raise error
    return interp.run(program, *leaves)


def sharing_memory(x: np.ndarray, paths, arrays) -> str | None:
    """The path of the first of ``arrays`` whose elements share memory with ``x``, if any."""
    return next((path for path, a in zip(paths, arrays)
                 if isinstance(a, np.ndarray) and np.may_share_memory(x, a) and np.shares_memory(x, a)), None)


class Compiled:
    """What a compiled loss and a compiled forward function share: the compiled steps by call
    signature (`CallSite`), static arguments (a step of their own per value), the reports."""

    has_aux = False
    argnums: int | tuple = ()
    front, native = pipeline.FRONT, pipeline.NATIVE   # the stages of the two backends

    def __init__(self, fn, backend, cache, static_shapes, static_argnums, static_argnames):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        fn = named(fn)
        functools.update_wrapper(self, fn)
        self.fn, self.backend, self.cache, self.static_shapes = fn, backend, cache, static_shapes
        self._site = CallSite(static_shapes)
        self._static = StaticArguments.of(fn, static_argnums, static_argnames)
        self._bound: dict = {}   # static values -> the same compiled kind of fn with them bound

    @property
    def static_argnums(self) -> tuple[int, ...]:
        """The positions of the static arguments (those named by static_argnames included)."""
        return () if self._static is None else self._static.positions

    def _options(self) -> dict:
        return dict(backend=self.backend, cache=self.cache, static_shapes=self.static_shapes)

    def _with_static(self, args, kwargs):
        """The compiled function for the static values among the call's arguments, and the
        others."""
        if kwargs:
            args = self._positional(args, kwargs)
        key, dynamic = self._static.split(args)
        compiled = self._bound.get(key)
        if compiled is None:
            with self._site.compiling:
                compiled = self._bound.get(key)
                if compiled is None:
                    compiled = self._bound[key] = self._bind(self._static.bound(self.fn, key))
        return compiled, dynamic

    def _explained(self, error: ValueError, args) -> ValueError:
        """``error``, raised by a step, or the failed class-label check it stands for with the
        argument, the value and its index."""
        step, leaves = self._step(args, count=False)
        return label_error(step.program, argument_paths(self.fn, step.spec.treedef), leaves) or error

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
        __tracebackhide__ = True  # noqa: F841
        try:
            return self._site.step(args, lambda leaves: self._step_of_shapes(args, leaves, count), count)
        except BaseException as error:
            raise trimmed(error)  # morphjit's frames left out; MORPHJIT_TRACEBACK=full shows them

    def _step_of_shapes(self, args, leaves, count) -> Step:
        """The step for a new leaf signature: the polymorphic step that serves it at another batch
        size, or a new one (specialised to the call's shapes where the program needs them)."""
        timings = feedback.Timings()
        status = feedback.Status(self.__name__, timings)  # "compiling..." if it takes long
        try:
            spec, _ = arg_spec(self.fn, args, self.argnums)
            step = self._site.of_shapes(self.fn, spec, leaves, count=count, on_miss=status.start,
                                        compile=lambda batched: self._compile(args, leaves, spec, batched,
                                                                              timings, status))
        except BaseException:
            status.finish(failed=True)
            raise
        if step.plan is not None:
            status.pause()  # numba compiles or loads at the first call, which resumes it
        else:
            status.finish()
        return step

    def _compile(self, args, leaves, spec, batched, timings=feedback.NO_TIMINGS, status=None) -> Step:
        build = pipeline.Build(self.fn, args, spec, batched, name_hint(self.fn), self.cache, self.has_aux)
        if self.backend == "interp":
            pipeline.run(self.front, build, timings)
            run = functools.partial(run_reference, build.program, argument_paths(self.fn, spec.treedef))
            return Step(spec, build.program, run, forward=build.forward, timings=timings, out_tree=build.out_tree)
        pipeline.run(self.native, build, timings)
        native = NativeStep(build.plan, build.kernel, build.arguments)
        feedback.watch_first_call(native, timings, status)
        fast = self._fast_path(spec, [leaf_signature(x) for x in leaves], native, batched, build.out_tree)
        return Step(spec, build.program, native, build.source, fast, build.forward, build.plan, timings,
                    build.out_tree)

    def steps(self) -> list[Step]:
        """The compiled steps, each once (a polymorphic step serves several leaf signatures)."""
        return self._site.steps() + [s for bound in list(self._bound.values()) for s in bound.steps()]

    def cache_info(self) -> CallStats:
        own = self._site.stats(lambda s: s.run.kernel if isinstance(s.run, NativeStep) else None)
        return CallStats.total([own] + [bound.cache_info() for bound in list(self._bound.values())])

    def step_for(self, *args, **kwargs) -> tuple[Step, list]:
        """The step that runs for ``args`` (compiled now if it was not yet; not counted as a call)
        and the leaves of ``args`` it takes."""
        if self._static is not None:
            compiled, dynamic = self._with_static(args, kwargs)
            return compiled.step_for(*dynamic)
        if kwargs:
            args = self._positional(args, kwargs)
        return self._step(args, count=False)

    def program(self, *args, **kwargs) -> Program:
        """The program that runs for ``args`` (for a loss, the joint forward+backward program)."""
        return self.step_for(*args, **kwargs)[0].program

    def source(self, *args, **kwargs) -> str:
        """The generated source of the step that runs for ``args`` (numba backend)."""
        step = self.step_for(*args, **kwargs)[0]
        if step.source is None:
            raise ValueError(f"backend={self.backend!r} generates no source; use backend='numba'")
        return step.source

    def explain(self, *args, **kwargs):
        """A report on the step that runs for ``args``: its programs, fusion groups, buffer plan,
        generated source and the time each compilation stage took. It renders as text (``print``)
        and as HTML in a notebook. The step is compiled (or loaded) and run once if it was not yet."""
        __tracebackhide__ = True  # noqa: F841
        from .explain import explain
        if self._static is not None:
            compiled, dynamic = self._with_static(args, kwargs)
            return compiled.explain(*dynamic)
        if kwargs:
            args = self._positional(args, kwargs)
        return explain(self, args)

    def __repr__(self) -> str:
        from .explain import summary
        return f"<{self.kind} {self.__name__!r}: {summary(self)}>"


class CompiledLoss(Compiled):
    """A loss function compiled, per input signature, into a step returning (loss, gradients);
    with ``has_aux``, the function returns ``(loss, aux)`` and the step ``((loss, aux), gradients)``."""

    kind = "compiled loss"

    def __init__(self, fn, argnums=0, backend="numba", cache=True, static_shapes=False, has_aux=False,
                 static_argnums=(), static_argnames=()):
        super().__init__(fn, backend, cache, static_shapes, static_argnums, static_argnames)
        self.argnums, self.has_aux = argnums, has_aux
        self._single = not isinstance(argnums, (tuple, list))
        if self._static is not None:
            self._static.check_traced(argnums, "differentiated")

    def _bind(self, fn) -> CompiledLoss:
        argnums = self._static.dynamic_argnums(self.argnums)
        return CompiledLoss(fn, argnums, has_aux=self.has_aux, **self._options())

    def __call__(self, *args, out=None, **kwargs):
        """``(loss, grads)`` (``((loss, aux), grads)`` with ``has_aux``); with ``out=`` (a tree shaped
        like ``grads``) the gradients are written there and ``out`` is returned, so a steady-state
        call allocates no gradient arrays. Keyword arguments are bound to the function's positional
        parameters."""
        __tracebackhide__ = True  # noqa: F841 (IPython and pytest hide this frame)
        if self._static is not None:
            compiled, args = self._with_static(args, kwargs)
            return compiled(*args, out=out)
        if kwargs:
            args = self._positional(args, kwargs)
        site = self._site
        if site.fast is not None:
            try:
                result = site.fast(args, out)
            except ValueError as error:
                raise self._explained(error, args) from None
            if result is not None:
                site.hits.add()
                return result
        step, leaves = self._step(args)
        site.fast = step.fast
        paths = argument_paths(self.fn, step.spec.treedef)
        try:
            if out is not None:
                outputs = step.run_into(leaves, step.check_out(out, self._single, leaves, paths))
            else:
                outputs = step.run(*leaves)
        except ValueError as error:
            raise label_error(step.program, paths, leaves) or error from None
        end = 1 + len(step.spec.wrt)
        value = outputs[0][()]
        if self.has_aux:
            value = value, pytree.unflatten(step.out_tree, outputs[end:])
        if out is not None:
            return value, out
        trees = step.gradient_trees(outputs[1:end])
        return value, trees[0] if self._single else tuple(trees)

    def _fast_path(self, spec, leaf_signatures, native, batched, out_tree):
        return fast_call(spec.treedef, leaf_signatures, [spec.arg_treedef(i) for i in spec.argnums],
                         self._single, native, batched, out_tree)


def compile_loss(fn=None, *, argnums=0, has_aux=False, static_argnums=(), static_argnames=(),
                 backend="numba", cache=True, static_shapes=False):
    """Compile ``fn(params, *data) -> scalar loss`` into a step returning ``(loss, grads)``.

    Usable as ``@compile_loss``, ``@compile_loss(argnums=..., backend=...)`` or
    ``compile_loss(fn, ...)``. ``grads`` mirrors the structure of the differentiated
    argument(s) (a tuple of them when ``argnums`` is a tuple). With ``has_aux=True``, ``fn``
    returns ``(loss, aux)``, aux a tree of arrays or numbers computed in the same step, and the
    step returns ``((loss, aux), grads)``. The arguments named by ``static_argnums`` (positions)
    or ``static_argnames`` are hashable Python values baked into the step: each new value
    compiles a step of its own. The leading (batch) extent of the data arguments (those after
    the first, not differentiated) is symbolic, so one compiled step serves every batch size,
    unless ``static_shapes=True`` or the program needs the concrete size.
    """
    def compiled(f):
        return CompiledLoss(f, argnums, backend, cache, static_shapes, has_aux, static_argnums, static_argnames)
    return compiled if fn is None else compiled(fn)


class CompiledGrad(CompiledLoss):
    """``mj.grad``: a compiled loss whose call returns the gradients only (``(grads, aux)`` with
    ``has_aux``), as JAX's ``grad`` does; the same step computes (and drops) the value."""

    kind = "compiled gradient"

    def __call__(self, *args, out=None, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        value, grads = super().__call__(*args, out=out, **kwargs)
        return (grads, value[1]) if self.has_aux else grads


def value_and_grad(fn, argnums=0, has_aux=False, *, static_argnums=(), static_argnames=(), backend="numba",
                   cache=True, static_shapes=False) -> CompiledLoss:
    """JAX's spelling of `compile_loss`: ``value_and_grad(fn)(*args)`` returns ``(value, grads)``
    (``((value, aux), grads)`` with ``has_aux``). ``argnums`` (an int or a tuple) may name data
    arguments too: ``argnums=1`` gives the gradient with respect to the inputs (saliency)."""
    return CompiledLoss(fn, argnums, backend, cache, static_shapes, has_aux, static_argnums, static_argnames)


def grad(fn, argnums=0, has_aux=False, *, static_argnums=(), static_argnames=(), backend="numba",
         cache=True, static_shapes=False) -> CompiledGrad:
    """JAX's ``grad``: ``grad(fn)(*args)`` returns the gradients of ``fn``'s scalar value with
    respect to the arguments ``argnums`` (``(grads, aux)`` with ``has_aux``); one compiled step,
    as `compile_loss` makes, with its cache, ``out=`` and ``explain``."""
    return CompiledGrad(fn, argnums, backend, cache, static_shapes, has_aux, static_argnums, static_argnames)


class CompiledFunction(Compiled):
    """A function compiled forward-only, per input signature, into a step returning what it
    returns (any tree of arrays; 0-d results as 0-d arrays): no gradient work."""

    kind = "compiled function"
    front, native = pipeline.FORWARD_FRONT, pipeline.FORWARD_NATIVE

    def __init__(self, fn, backend="numba", cache=True, static_shapes=False, static_argnums=(), static_argnames=()):
        super().__init__(fn, backend, cache, static_shapes, static_argnums, static_argnames)

    def _bind(self, fn) -> CompiledFunction:
        return CompiledFunction(fn, **self._options())

    def __call__(self, *args, **kwargs):
        """What ``fn(*args)`` returns, computed by the compiled step. Keyword arguments are bound
        to the function's positional parameters."""
        __tracebackhide__ = True  # noqa: F841
        if self._static is not None:
            compiled, args = self._with_static(args, kwargs)
            return compiled(*args)
        if kwargs:
            args = self._positional(args, kwargs)
        site = self._site
        if site.fast is not None:
            try:
                result = site.fast(args)
            except ValueError as error:
                raise self._explained(error, args) from None
            if result is not None:
                site.hits.add()
                return result
        step, leaves = self._step(args)
        site.fast = step.fast
        try:
            outputs = step.run(*leaves)
        except ValueError as error:
            raise label_error(step.program, argument_paths(self.fn, step.spec.treedef), leaves) or error from None
        return pytree.unflatten(step.out_tree, [np.asarray(o) for o in outputs])

    def _fast_path(self, spec, leaf_signatures, native, batched, out_tree):
        return fast_forward(spec.treedef, leaf_signatures, out_tree, native, batched)


def compile(fn=None, *, static_argnums=(), static_argnames=(), backend="numba", cache=True, static_shapes=False):
    """Compile ``fn(*args) -> outputs`` (any tree of arrays) forward-only: ``predict =
    mj.compile(model)``. As `compile_loss` does, one step serves every batch size (the leading
    extent of the data arguments: all but the first of several, which holds the parameters),
    steps are cached in memory and on disk, and static arguments are baked in; no gradient is
    computed. Usable as ``@compile`` or ``@compile(backend=...)``."""
    def compiled(f):
        return CompiledFunction(f, backend, cache, static_shapes, static_argnums, static_argnames)
    return compiled if fn is None else compiled(fn)
