"""The compiled objects users get: ``compile_loss`` (and JAX's spellings ``value_and_grad`` and
``grad``) and ``compile`` (forward only), each keeping its steps by call signature
(``callsite``), running the pipeline (``pipeline``) for a new one and calling the step, through
the generated fast path (``runtime.fastpath``) where the arguments fit the step called last."""
from __future__ import annotations

import copy
import functools
import inspect

import numpy as np

from ..ir import Program
from ..native import SliceOutOfRange
from ..runtime import NativeStep, fast_call, fast_forward
from ..tracing import current_trace
from ..util import pytree, trimmed
from . import feedback, nest, pipeline
from .callsite import CallSite, CallStats, leaf_signature
from .checks import arg_spec, argument_paths, floats_as_arrays, label_error, out_arrays
from .captured import Captured, UsesCaptured
from .shorter import Shortening, ShorterSlices
from .static_args import StaticArguments
from .step import Step, run_reference

BACKENDS = ("numba", "interp")


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


def grad_program(fn, *args, argnums=0) -> Program:
    """The joint forward+backward program of ``fn`` at ``args``, for printing."""
    spec, _ = arg_spec(fn, args, argnums)
    return pipeline.run(pipeline.FRONT, pipeline.Build(fn, args, spec)).program


class Compiled(ShorterSlices, UsesCaptured):
    """What a compiled loss and a compiled forward function share: the compiled steps by call
    signature (`CallSite`), static arguments (a step of their own per value), variants for
    slices a call finds shorter (`ShorterSlices`), the reports."""

    has_aux = False
    argnums: int | tuple = ()
    front, native = pipeline.FRONT, pipeline.NATIVE   # the stages of the two backends

    def __init__(self, fn, backend, cache, static_shapes, static_argnums, static_argnames):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self._captured = Captured.of(fn)
        fn = named(fn)
        functools.update_wrapper(self, fn)
        if self._captured is not None:
            fn = self._captured.function
        self.fn, self.backend, self.cache, self.static_shapes = fn, backend, cache, static_shapes
        self._site = CallSite(static_shapes)
        self._static = StaticArguments.of(fn, static_argnums, static_argnames)
        self._bound: dict = {}   # static values -> the same compiled kind of fn with them bound
        self._variants: dict = {}   # shorter slices -> the same compiled kind of fn traced with them
        self._shortening = Shortening()

    @property
    def traced_function(self):
        """The function as the user wrote it (not the copy that takes what it captures): what a call
        inside a traced function traces."""
        return self.fn if self._captured is None else self._captured.fn

    def rebound(self, fn) -> Compiled:
        """This transformation of ``fn`` for calls inside a traced function (`jit.reach` rebuilds a
        traced function's helpers to find what it captures as traced values)."""
        made = copy.copy(self)
        made.fn, made._captured = fn, None
        return made

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

    def _by_fast_path(self, args, *more):
        """The result of the call by the fast path of the step called last (a hit), None where the
        arguments do not fit that step, or the error to raise: the step's, or the failed
        class-label check it stands for (`_explained`)."""
        fast = self._site.fast
        if fast is None:
            return None
        try:
            result = fast(args, *more)
        except ValueError as error:
            return self._explained(error, args)
        if result is not None:
            self._site.hits.add()
        return result

    def _explained(self, error: ValueError, args) -> ValueError:
        """``error``, raised by a step, or the failed class-label check it stands for with the
        argument, the value and its index."""
        step, leaves = self._step(args, count=False)
        return label_error(step.program, argument_paths(self.fn, step.spec.treedef), leaves) or error

    def _passed(self, args, kwargs) -> tuple[tuple, dict]:
        """The call's arguments, the generators and arrays the function captures after them
        (`captured`); every step is dropped where the contents of one it computed with changed."""
        if self._captured is None:
            return args, kwargs
        self._drop_stale_steps()
        return self._captured.arguments(args, kwargs)

    def _positional(self, args, kwargs) -> tuple:
        return nest.positional(self.fn, self.__name__, args, kwargs)

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
        self._note_draws(args)
        if self.backend == "interp":
            with self._tracing_shorter():
                pipeline.run(self.front, build, timings)
            run = functools.partial(run_reference, build.program, argument_paths(self.fn, spec.treedef))
            return Step(spec, build.program, run, forward=build.forward, timings=timings, out_tree=build.out_tree,
                        state=build.state)
        with self._tracing_shorter():
            pipeline.run(self.native, build, timings)
        native = NativeStep(build.plan, build.kernel, build.arguments)
        feedback.watch_first_call(native, timings, status)
        fast = None if build.state else self._fast_path(spec, [leaf_signature(x) for x in leaves], native,
                                                        batched, build.out_tree)
        return Step(spec, build.program, native, build.source, fast, build.forward, build.plan, timings,
                    build.out_tree, build.state)

    def steps(self) -> list[Step]:
        """The compiled steps, each once (a polymorphic step serves several leaf signatures)."""
        return (self._site.steps() + [s for bound in list(self._bound.values()) for s in bound.steps()]
                + self._variant_steps())

    def cache_info(self) -> CallStats:
        own = self._site.stats(lambda s: s.run.kernel if isinstance(s.run, NativeStep) else None)
        others = list(self._bound.values()) + list(self._variants.values())
        return CallStats.total([own] + [other.cache_info() for other in others])

    def step_for(self, *args, **kwargs) -> tuple[Step, list]:
        """The step that runs for ``args`` (compiled now if it was not yet; not counted as a call)
        and the leaves of ``args`` it takes."""
        args, kwargs = self._passed(args, kwargs)
        return self._step_for(args, kwargs)

    def _step_for(self, args, kwargs) -> tuple[Step, list]:
        if self._static is not None:
            compiled, dynamic = self._with_static(args, kwargs)
            return compiled._step_for(dynamic, {})
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
        args, kwargs = self._passed(args, kwargs)
        if self._static is not None:
            compiled, dynamic = self._with_static(args, kwargs)
            return explain(compiled, dynamic)
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
    transformation = "compile_loss"

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
        if current_trace() is not None:
            t = nest.enclosing_trace(args, kwargs)
            nest.refuse_out(self.transformation, out)
            fn = self.traced_function
            return nest.value_and_grad(t, fn, nest.positional(fn, self.__name__, args, kwargs), self.argnums,
                                       self.has_aux, self.transformation)
        args, kwargs = self._passed(args, kwargs)
        passed, passed_kwargs, rewind = args, kwargs, self._rewinding(args)
        try:
            if self._static is not None:
                compiled, args = self._with_static(args, kwargs)
                return compiled(*args, out=out)
            if kwargs:
                args = self._positional(args, kwargs)
            args = floats_as_arrays(args, self.argnums)
            result = self._by_fast_path(args, out)
            if isinstance(result, ValueError):
                raise result from None
            if result is not None:
                return result
            step, leaves = self._step(args)
            self._site.fast = step.fast
            paths = argument_paths(self.fn, step.spec.treedef)
            try:
                if out is not None:
                    outputs = step.run_into(leaves, out_arrays(step, out, self._single, leaves, paths))
                else:
                    outputs = step.run(*leaves)
            except ValueError as error:
                raise label_error(step.program, paths, leaves) or error from None
            outputs = step.kept(args, outputs)
            end = 1 + len(step.spec.wrt)
            value = outputs[0][()]
            if self.has_aux:
                value = value, pytree.unflatten(step.out_tree, outputs[end:])
            if out is not None:
                return value, out
            trees = step.gradient_trees(outputs[1:end])
            return value, trees[0] if self._single else tuple(trees)
        except SliceOutOfRange as error:
            variant = self._shorter_variant(error, rewind)
            if variant is None:
                raise
        return CompiledLoss.__call__(variant, *passed, out=out, **passed_kwargs)   # a CompiledGrad's too

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
    transformation = "mj.grad"

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
        to the function's positional parameters. Inside a traced function it is the function's
        call, traced there."""
        __tracebackhide__ = True  # noqa: F841
        if current_trace() is not None:
            return self.traced_function(*args, **kwargs)
        args, kwargs = self._passed(args, kwargs)
        passed, passed_kwargs, rewind = args, kwargs, self._rewinding(args)
        try:
            if self._static is not None:
                compiled, args = self._with_static(args, kwargs)
                return compiled(*args)
            if kwargs:
                args = self._positional(args, kwargs)
            result = self._by_fast_path(args)
            if isinstance(result, ValueError):
                raise result from None
            if result is not None:
                return result
            step, leaves = self._step(args)
            self._site.fast = step.fast
            try:
                outputs = step.run(*leaves)
            except ValueError as error:
                raise label_error(step.program, argument_paths(self.fn, step.spec.treedef), leaves) or error from None
            return pytree.unflatten(step.out_tree, [np.asarray(o) for o in step.kept(args, outputs)])
        except SliceOutOfRange as error:
            variant = self._shorter_variant(error, rewind)
            if variant is None:
                raise
        return variant(*passed, **passed_kwargs)

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
