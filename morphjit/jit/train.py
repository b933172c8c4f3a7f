"""``mj.train_step``: the loss, its gradients and the optimiser update in one compiled call.

The training program is the joint program with the optimiser's update rule appended for each
parameter. Its outputs are the loss, the new parameters and the new optimiser state; the step
writes them over the arrays passed in, so a parameter's update runs as a loop over its gradient
right after that gradient is final, and no gradient array is ever handed back to Python.
"""
from __future__ import annotations

import bisect
import functools
import operator
from typing import NamedTuple

import numpy as np

from .. import api as A
from ..backend import can_write_in_place, make_plan, write_in_place
from ..ir import Program, TensorType, Var, is_float
from ..native import SliceOutOfRange
from ..runtime import NativeStep, fast_update, interp
from ..tracing import Trace, Tracer, current_trace
from ..util import DtypeError, TracingError, UnsupportedError, pytree, user_location
from . import pipeline
from .callsite import CallSite, CallStats, leaf_signature
from .captured import Captured, UsesCaptured
from .checks import arg_spec, argument_paths, check_plain, label_error
from .compiled import BACKENDS, CompiledLoss, name_hint
from .optim import Optimizer
from .shorter import Shortening, ShorterSlices
from .static_args import StaticArguments

STEP = "step"   # the state entry counting the updates done


def training_program(joint: Program, optimizer: Optimizer, n_params: int) -> Program:
    """Append the update of each differentiated input (the first ``n_params`` inputs).

    Inputs: the joint program's, then the optimiser state of each parameter (name by name), then
    the run-time scalars (f64[]). Outputs: the loss, the new parameters, the new state, then the
    aux values (the joint program's outputs after the gradients).
    """
    grads, aux = joint.outputs[1:1 + n_params], joint.outputs[1 + n_params:]
    params = joint.inputs[:len(grads)]
    t = Trace()
    t.bindings, t.consts = list(joint.bindings), list(joint.consts)
    state = {name: [Var(p.type) for p in params] for name in optimizer.state_names}
    scalars = [Var(TensorType((), np.float64)) for _ in optimizer.scalar_names]
    new_params, new_state = [], {name: [] for name in optimizer.state_names}
    for k, (p, g) in enumerate(zip(params, grads)):
        cast = tuple(A.astype(Tracer(t, s), p.dtype) for s in scalars)
        new_p, updated = optimizer.update(Tracer(t, p), Tracer(t, g),
                                          {name: Tracer(t, vs[k]) for name, vs in state.items()}, cast)
        new_params.append(new_p)
        for name in optimizer.state_names:
            new_state[name].append(updated[name])
    t.closed = True
    updated = new_params + [x for name in optimizer.state_names for x in new_state[name]]
    return joint.replace(
        inputs=joint.inputs + tuple(v for name in optimizer.state_names for v in state[name]) + tuple(scalars),
        bindings=tuple(t.bindings), outputs=(joint.outputs[0],) + tuple(t.operand(x, lift_literals=True)
                                                                         for x in updated) + aux,
        consts=tuple(t.consts))


def training_stages(optimizer: Optimizer, native: bool) -> tuple:
    """The pipeline of a training step: the optimiser update after the joint program's passes
    and, for the native backend, the in-place writes after the plan."""
    update = pipeline.Stage("update", "adding the optimiser update", "optimiser update",
                            functools.partial(update_stage, optimizer), "program")
    stages = pipeline.inserted_after(pipeline.NATIVE if native else pipeline.FRONT, "passes", update)
    if not native:
        return stages
    in_place = pipeline.Stage("write_in_place", "planning", "in-place updates",
                              functools.partial(in_place_stage, optimizer), "plan")
    return pipeline.inserted_after(stages, "plan", in_place)


def update_stage(optimizer: Optimizer, build: pipeline.Build) -> None:
    build.program = training_program(build.program, optimizer, len(build.spec.wrt))


def in_place_stage(optimizer: Optimizer, build: pipeline.Build) -> None:
    """Plan each new parameter and state array into the array it replaces. One the plan cannot
    write in place (a column sum accumulating in its output while it still reads the old value)
    is planned again: computed into the pool, then copied."""
    inputs, n_params = build.program.inputs, len(build.spec.wrt)
    end = len(inputs) - len(optimizer.scalar_names)
    updated = inputs[:n_params] + inputs[end - len(optimizer.state_names) * n_params:end]
    plan = build.plan
    copied = frozenset(id(v) for src, dst, v in zip(updated, plan.outputs[1:], plan.program.outputs[1:])
                       if not can_write_in_place(plan, src, dst))
    if copied:
        build.plan = make_plan(plan.program, copied)
    write_in_place(build.plan, zip(updated, build.plan.outputs[1:]))


class TrainStep(ShorterSlices, UsesCaptured):
    """``loss = step(params, state, *data)``: one optimiser step, updating params and state in place
    (``(loss, aux)`` for a loss function with ``has_aux``)."""

    def __init__(self, loss_fn, optimizer: Optimizer, backend="numba", cache=True, static_shapes=False,
                 has_aux=False, static_argnums=(), static_argnames=()):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must come from mj.optim (sgd, adam, adamw, rmsprop), "
                            f"got {type(optimizer).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if isinstance(loss_fn, CompiledLoss):   # its has_aux and static arguments hold here too
            has_aux = has_aux or loss_fn.has_aux
            static_argnums = tuple(loss_fn.static_argnums) + tuple(
                static_argnums if isinstance(static_argnums, (tuple, list)) else (static_argnums,))
        if isinstance(loss_fn, CompiledLoss):
            self.fn, self._captured = loss_fn.fn, loss_fn._captured
        else:
            self._captured = Captured.of(loss_fn)
            self.fn = loss_fn if self._captured is None else self._captured.function
        functools.update_wrapper(self, loss_fn.fn if isinstance(loss_fn, CompiledLoss) else loss_fn)
        self.optimizer, self.backend, self.cache, self.has_aux = optimizer, backend, cache, has_aux
        self.static_shapes = static_shapes
        self._site = CallSite(static_shapes)   # the compiled updates by call signature
        self._static = StaticArguments.of(self.fn, static_argnums, static_argnames)
        if self._static is not None:
            self._static.check_traced(0, "updated in place (it holds the parameters)")
        self._bound: dict = {}   # static values -> the training step of fn with them bound
        self._variants: dict = {}   # shorter slices -> the training step of fn traced with them
        self._shortening = Shortening()
        # The arrays of the last call's check (kept alive), their sorted (start, end, path) byte
        # ranges and the ids of the owners of their memory: one tuple, replaced at once, so that a
        # call in another thread never sees the ranges of one call's arrays with another's.
        self._written = WrittenArrays((), [], set())

    def init(self, params) -> dict:
        """Fresh optimiser state for ``params``: the step count and zeroed state arrays."""
        leaves, treedef = pytree.flatten(params, int_lists=True)
        for path, x in zip(pytree.leaf_paths(treedef, "params"), leaves):
            check_updatable(path, x)
        state = {STEP: np.zeros((), np.int64)}
        for name in self.optimizer.state_names:
            state[name] = pytree.unflatten(treedef, [np.zeros_like(x) for x in leaves])
        return state

    def __call__(self, params, state, *data, lr=None):
        """One step at the optimiser's learning rate (or ``lr``); returns the loss before it
        (with ``has_aux``, the loss and the aux values before it)."""
        if current_trace() is not None:
            raise UnsupportedError("a training step updates its arguments in place, so it cannot be called "
                                   "inside a traced function; call it from plain Python, once per step",
                                   user_location())
        if self._captured is not None:
            self._drop_stale_steps()
            data = data + (self._captured.current(),)
        if self._static is not None:
            key, (params, *data) = self._static.split((params,) + data)
            return self._with_static(key)(params, state, *data, lr=lr)
        rewind = self._rewinding(data)
        step_count = self._check_state(state)
        lr = self.optimizer.learning_rate(step_count, lr)
        scalars = self.optimizer.scalars(step_count, lr)
        args = (params, [state[name] for name in self.optimizer.state_names], data)
        site = self._site
        try:
            loss = None if site.fast is None else site.fast(args, scalars)
            if loss is None:
                loss = self._checked_call(args, scalars)
            else:
                site.hits.add()
        except SliceOutOfRange as error:
            variant = self._shorter_variant(error, rewind)
            if variant is None:
                raise
            return variant(params, state, *data, lr=lr)
        except ValueError as error:
            raise self._explained(error, args) from None
        state[STEP][...] = step_count + 1
        return loss

    def _with_static(self, key) -> TrainStep:
        """The training step of the function with the static values of ``key`` bound."""
        bound = self._bound.get(key)
        if bound is None:
            with self._site.compiling:
                bound = self._bound.get(key)
                if bound is None:
                    bound = self._bound[key] = TrainStep(self._static.bound(self.fn, key), self.optimizer,
                                                         self.backend, self.cache, self.static_shapes, self.has_aux)
        return bound

    def _checked_call(self, args, scalars):
        """The slow path: find (or compile) the step for the arguments' signature, check, run."""
        run, leaves = self._site.step(args, lambda leaves: self._run_for(*args))
        self._site.fast = run.fast
        updated = run.n_params + run.n_state
        written, data_leaves = leaves[:updated], leaves[updated:]
        self._check_aliasing(written, data_leaves, run)
        inputs = written[:run.n_params] + data_leaves + written[run.n_params:] + list(scalars)
        try:
            return run(inputs, written)
        except ValueError as error:
            raise run.label_error(inputs) or error from None

    def _explained(self, error: ValueError, args) -> ValueError:
        """``error``, raised by a step, or the failed class-label check it stands for with the
        argument, the value and its index."""
        run, leaves = self._site.find(args)
        if run is None:
            return error
        return run.label_error(leaves[:run.n_params] + leaves[run.n_params + run.n_state:]) or error

    def cache_info(self) -> CallStats:
        """As ``CompiledLoss.cache_info``: calls served without compiling, compiles, and the
        input types of each compiled step."""
        own = self._site.stats(lambda run: run.native and run.native.kernel)
        others = list(self._bound.values()) + list(self._variants.values())
        return CallStats.total([own] + [other.cache_info() for other in others])

    def steps(self) -> list["CompiledUpdate"]:
        """The compiled updates, each once (a polymorphic one serves several leaf signatures)."""
        return (self._site.steps() + [s for bound in list(self._bound.values()) for s in bound.steps()]
                + self._variant_steps())

    def _check_state(self, state) -> int:
        expected = {STEP, *self.optimizer.state_names}
        if not isinstance(state, dict) or set(state) != expected:
            raise TracingError(f"state must be the dict made by step.init(params), with keys "
                               f"{sorted(expected)}; got {type(state).__name__}"
                               f"{' with keys ' + str(sorted(state)) if isinstance(state, dict) else ''}")
        count = state[STEP]
        if not (isinstance(count, np.ndarray) and count.shape == () and count.dtype.kind == "i"):
            raise TracingError(f"state[{STEP!r}] must be the 0-d integer array made by step.init")
        return int(count)

    def _run_for(self, params, state_trees, data) -> "CompiledUpdate":
        """The compiled update for these arguments' signature (checked here, once per signature)."""
        args = (params,) + tuple(data)
        spec, leaves = arg_spec(self.fn, args, 0)
        paths, data_paths = self._check_signature(spec, leaves, state_trees)

        def compile(batched) -> CompiledUpdate:
            run = self._compile(args, spec, batched)
            run.paths, run.data_paths = paths, data_paths
            if run.native is not None:
                run.fast = self._fast_path(run, (params, state_trees, data), len(spec.wrt))
            return run
        return self._site.of_shapes(self.fn, spec, leaves, compile)

    def _fast_path(self, run: "CompiledUpdate", args, n_params: int):
        """The generated fast path of ``run``, taking ``args = (params, state trees, data)``."""
        leaves, treedef = pytree.flatten(args, int_lists=True)
        written = len(run.paths)
        batched = frozenset(k + written - n_params for k in run.batched)   # data come after the state
        return fast_update(treedef, [leaf_signature(x) for x in leaves], run.native, batched, written,
                           n_params, lambda w, d: self._check_aliasing(w, d, run), run.aux_tree)

    def _check_signature(self, spec, leaves, state_trees) -> tuple[list[str], list[str]]:
        """Check parameters and optimiser state; the paths of the arrays updated in place and of
        the data leaves."""
        n_params = spec.arg_treedef(0).num_leaves
        param_tree = spec.arg_treedef(0)
        every = argument_paths(self.fn, spec.treedef)
        paths, data_paths = every[:n_params], every[n_params:]
        for path, x in zip(paths, leaves[:n_params]):
            check_updatable(path, x)
        for name, tree in zip(self.optimizer.state_names, state_trees):
            state_leaves, state_tree = pytree.flatten(tree, int_lists=True)
            state_paths = pytree.leaf_paths(state_tree, f"state[{name!r}]")
            if state_tree != param_tree:
                raise TracingError(f"state[{name!r}] has the structure {state_tree}, but params has "
                                   f"{param_tree}; make the state with step.init(params)")
            for path, x, p in zip(state_paths, state_leaves, leaves[:n_params]):
                check_updatable(path, x)
                if x.shape != p.shape or x.dtype != p.dtype:
                    raise DtypeError(f"{path} is {x.dtype}{list(x.shape)} but its parameter is "
                                     f"{p.dtype}{list(p.shape)}; make the state with step.init(params)")
            paths = paths + state_paths
        return paths, data_paths

    def _compile(self, args, spec, batched) -> "CompiledUpdate":
        build = pipeline.Build(self.fn, args, spec, batched, name_hint(self.fn), self.cache, self.has_aux,
                               keeps_state=False)
        self._note_draws(args)
        with self._tracing_shorter():
            pipeline.run(training_stages(self.optimizer, native=self.backend != "interp"), build)
        n_params = len(spec.wrt)
        run = CompiledUpdate(build, n_params, len(self.optimizer.state_names) * n_params,
                             len(self.optimizer.scalar_names))
        run.batched = batched
        return run

    def _check_aliasing(self, written, data, run: "CompiledUpdate") -> None:
        """Refuse arrays updated in place that overlap each other or a data array.

        The written arrays' byte ranges are worked out when they change; a data array's range is
        compared only when it shares an owner of memory with one of them (a view of the same
        buffer), so the common case costs an attribute walk per data array.
        """
        known = self._written
        if len(written) != len(known.arrays) or not all(map(operator.is_, written, known.arrays)):
            known = self._written = self._remember_written(written, run.paths)
        for k, x in enumerate(data):
            # A non-contiguous data array is copied before the kernel runs, so it cannot alias.
            if type(x) is np.ndarray and id(memory_owner(x)) in known.owners and x.flags.c_contiguous:
                overlap = overlapping(known.bounds, x)
                if overlap is not None:
                    raise ValueError(f"{run.data_paths[k]} shares memory with {overlap}, which the step "
                                     f"updates in place; pass a copy")

    @staticmethod
    def _remember_written(written, paths) -> WrittenArrays:
        for path, x in zip(paths, written):
            check_updatable(path, x)
        bounds = sorted((start, start + x.nbytes, path) for path, x in zip(paths, written)
                        for start in (x.__array_interface__["data"][0],))
        for (_, end, first), (start, _, second) in zip(bounds, bounds[1:]):
            if start < end:
                raise ValueError(f"{first} and {second} share memory; each parameter and state "
                                 f"array is updated in place and must be an array of its own")
        return WrittenArrays(tuple(written), bounds, {id(memory_owner(x)) for x in written})


class WrittenArrays(NamedTuple):
    arrays: tuple    # the arrays a step updates in place
    bounds: list     # their sorted (start, end, path) byte ranges
    owners: set      # ids of the owners of their memory


def overlapping(bounds, x) -> str | None:
    """The path of the array in ``bounds`` whose bytes overlap ``x``'s, if any."""
    if not x.nbytes:
        return None
    start = x.__array_interface__["data"][0]
    i = bisect.bisect_right([b[0] for b in bounds], start + x.nbytes - 1) - 1
    return bounds[i][2] if i >= 0 and bounds[i][1] > start else None


def memory_owner(x: np.ndarray):
    """The object at the end of ``x``'s ``.base`` chain: the owner of its memory."""
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x if x.base is None else x.base


def check_updatable(path: str, x) -> None:
    check_plain(x, path)
    if not (isinstance(x, np.ndarray) and is_float(x.dtype)):
        raise DtypeError(f"{path} is updated in place, so it must be a float32 or float64 NumPy "
                         f"array; got {type(x).__name__}{'' if not hasattr(x, 'dtype') else ' of ' + str(x.dtype)}")
    if not (x.flags.c_contiguous and x.flags.writeable):
        raise DtypeError(f"{path} is updated in place, so it must be a writeable C-contiguous array "
                         f"(pass np.ascontiguousarray(...) once, before training)")


class CompiledUpdate:
    """One signature of a training step: ``run(inputs, written) -> loss`` (``(loss, aux)`` when
    it has an ``aux_tree``)."""

    paths: list[str]        # of the arrays updated in place
    data_paths: list[str]   # of the data leaves
    batched: frozenset      # the indices (among parameters and data) of the batched leaves
    fast = None             # the generated fast path

    def __init__(self, build: pipeline.Build, n_params: int, n_state: int, n_scalars: int):
        self.program, self.n_params, self.n_state, self.source = build.program, n_params, n_state, build.source
        self.aux_tree = build.out_tree if build.has_aux else None
        self.native = None if build.kernel is None else NativeStep(build.plan, build.kernel, build.arguments, n_scalars)

    def label_error(self, inputs: list) -> ValueError | None:
        """The error for an out-of-range class label among the parameters and data of ``inputs``."""
        n = self.n_params + len(self.data_paths)
        return label_error(self.program, self.paths[:self.n_params] + self.data_paths, inputs[:n])

    def __call__(self, inputs: list, written: list):
        if self.native is not None:
            outputs = self.native(*inputs, out=written)
        else:
            error = self.label_error(inputs)   # as the compiled step checks them
            if error is not None:
                raise error
            outputs = interp.run(self.program, *inputs)
            for target, value in zip(written, outputs[1:]):
                np.copyto(target, value)
        if self.aux_tree is None:
            return outputs[0][()]
        return outputs[0][()], pytree.unflatten(self.aux_tree, outputs[1 + len(written):])


def train_step(loss_fn, optimizer: Optimizer, *, has_aux=False, static_argnums=(), static_argnames=(),
               backend="numba", cache=True, static_shapes=False) -> TrainStep:
    """A training step for ``loss_fn(params, *data)`` (a function or a ``compile_loss`` of one):
    ``state = step.init(params)``, then ``loss = step(params, state, *data)`` computes the loss
    and gradients and applies ``optimizer``'s update to ``params`` and ``state`` in place. With
    ``has_aux=True``, ``loss_fn`` returns ``(loss, aux)`` and the step returns them. Static
    arguments (positions or names among ``loss_fn``'s, not the parameters) are baked in as for
    ``compile_loss``. Like ``compile_loss``, one compiled step serves every batch size unless
    ``static_shapes``."""
    return TrainStep(loss_fn, optimizer, backend, cache, static_shapes, has_aux, static_argnums, static_argnames)
