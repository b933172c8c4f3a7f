"""Running a compiled step: the workspace pool, argument preparation and the native call."""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from ..backend import Addresses, Frame, Plan, check_not_empty, empty_reductions
from ..ir import batched_input, evaluate, internal_shape, is_symbolic
from ..native import GENERATORS, seed_of
from . import kernels


VIEWS_KEPT = 64   # batch sizes whose views a workspace keeps; the least recently used go first


class NativeStep:
    """Calls a compiled step: inputs in, fresh outputs back.

    A call borrows a workspace (the buffer pool, see `Workspace`) that no other call is using:
    an idle one, else a new one, and gives it back when the step returned. Calls from several
    threads therefore run in parallel (the machine code releases the GIL), each with its own
    workspace, and there is no lock: a call interrupted (Ctrl-C) anywhere merely drops the
    workspace it borrowed. A step keeps as many workspaces as it ever had calls running at once.
    """

    def __init__(self, plan: Plan, kernel, arguments, n_scalars: int = 0):
        self.kernel = kernel
        self.slots = plan.slots
        # Machine code reads a constant's buffer in row-major order, whatever made the program.
        self.consts = {id(v): np.ascontiguousarray(c).reshape(internal_shape(v.shape)) for v, c in plan.consts}
        n_in, n_out = len(plan.inputs), len(plan.outputs)
        self.workspace_values = [(v, plan.slot_of.get(id(v))) for v in arguments[n_in:len(arguments) - n_out]]
        self.slot_of = plan.slot_of
        self.table = any(isinstance(v, Frame) for v, _ in self.workspace_values)   # kernel: a table.Step
        self.input_dtypes = [v.dtype for v in plan.inputs]
        self.scalar_dtypes = self.input_dtypes[n_in - n_scalars:n_in]   # run-time scalars, the last inputs
        self.output_buffers = [(internal_shape(v.shape), v.dtype) for v in plan.outputs]
        self.output_shapes = [v.shape for v in plan.outputs]
        self.scalar_outputs = [i for i, v in enumerate(plan.outputs) if not v.shape]
        batched = batched_input(plan.inputs)
        self.batched = None if batched is None else plan.inputs.index(batched)
        self.empty_reductions = empty_reductions(plan.program)
        self.idle: list[Workspace] = []   # workspaces no call is using
        self.call = self._first_call

    def workspace(self) -> Workspace:
        """A workspace for one call, to be given back with ``idle.append`` when it returned."""
        try:
            return self.idle.pop()
        except IndexError:
            return Workspace(self)

    def __call__(self, *leaves, out=None):
        """Run the step; ``out`` (checked by the caller) receives the outputs after the first (the
        gradients or the updated arrays); the others (aux values) are allocated."""
        inputs = [x if type(x) is np.ndarray and (x.dtype is dtype or x.dtype == dtype) and x.ndim
                  and x.flags.c_contiguous else prepare(x, dtype) for x, dtype in zip(leaves, self.input_dtypes)]
        batch = None if self.batched is None else inputs[self.batched].shape[0]
        given = [] if out is None else list(out)
        outputs = [np.empty(evaluate(shape, batch), dtype) for shape, dtype in self.output_buffers]
        outputs[1:1 + len(given)] = [o.reshape(shape) for o, (shape, _) in zip(given, self.output_buffers[1:])]
        workspace = self.workspace()
        fixed = workspace.fixed if batch is None else workspace.fixed_for(batch)
        self.call(*inputs, *fixed, *outputs)
        self.idle.append(workspace)   # not reached when the call raised: the workspace is dropped
        outputs[1:1 + len(given)] = given
        for i in self.scalar_outputs:
            outputs[i] = outputs[i].reshape(())
        return outputs

    def _first_call(self, *args):
        """Compile (or load) through the dispatcher, then call the machine code directly."""
        if self.table:   # its kernels are loaded: nothing to compile
            self.kernel.started()
            self.call = self.kernel.caller(len(self.input_dtypes))
            return self.call(*args)
        self.kernel(*args)
        # Arguments are always C-contiguous arrays of the same types, so the dispatcher's type
        # lookup can be skipped on later calls.
        signature = tuple(self.kernel.typeof_pyval(a) for a in args)
        self.call = self.kernel.overloads[signature].entry_point
        kernels.release_with_holder(self.kernel)


class Workspace:
    """The buffers of one running call: the pool (allocated for the largest batch size this
    workspace has seen; a smaller batch uses views of it), the constants and views the kernel takes
    after the inputs for the last `VIEWS_KEPT` batch sizes, the loss and run-time scalar buffers."""

    __slots__ = ("step", "pool", "pool_batch", "views", "batch", "fixed", "loss", "scalars")

    def __init__(self, step: NativeStep):
        self.step = step
        self.pool, self.pool_batch, self.views = [], -1, OrderedDict()
        loss_shape, loss_dtype = step.output_buffers[0]
        self.loss = None if is_symbolic(loss_shape) else np.empty(loss_shape, loss_dtype)
        self.scalars = [np.empty(1, dtype) for dtype in step.scalar_dtypes]
        self.batch = self.fixed = None
        if step.batched is None:
            self.fixed_for(0)

    def fixed_for(self, batch: int) -> list[np.ndarray]:
        """The constants and workspace views the kernel takes after the inputs, at ``batch``;
        they become ``fixed``, the views of the batch size called last."""
        views = self.views.get(batch)
        if views is None:
            check_not_empty(self.step.empty_reductions, batch)
            if batch > self.pool_batch:
                self.views.clear()   # views of the old pool would keep it alive
                self.pool = [np.empty(evaluate(slot.size, batch), slot.dtype) for slot in self.step.slots]
                self.pool_batch = batch
            views = self.views[batch] = [self._argument(v, slot, batch) for v, slot in self.step.workspace_values]
            if len(self.views) > VIEWS_KEPT:
                self.views.popitem(last=False)
        else:
            self.views.move_to_end(batch)
        self.batch, self.fixed = batch, views
        return views

    def _argument(self, v, slot: int | None, batch: int) -> np.ndarray:
        if isinstance(v, Addresses):   # views of the pool, which outlives this vector
            return np.array([self._address(u, batch) for u in v.values], np.uintp)
        if isinstance(v, Frame):
            return self.step.kernel.frame({v.first + k: self._address(u, batch) for k, u in enumerate(v.values)}, batch)
        return self.step.consts[id(v)] if slot is None else self._view(v, slot, batch)

    def _address(self, v, batch: int) -> int:
        """The data address of a constant or of a pooled value's view."""
        slot = self.step.slot_of.get(id(v))
        return (self.step.consts[id(v)] if slot is None else self._view(v, slot, batch)).ctypes.data

    def _view(self, v, slot: int, batch: int) -> np.ndarray:
        shape = internal_shape(evaluate(v.shape, batch))
        return self.pool[slot][:math.prod(shape)].reshape(shape)


def prepare(x, dtype) -> np.ndarray:
    """The argument as the kernel takes it: C-contiguous, of the traced dtype, at least 1-D (a
    random generator: the seed of the call, drawn from it)."""
    if isinstance(x, GENERATORS):
        return seed_of(x)
    a = np.ascontiguousarray(x, dtype)
    return a.reshape(1) if a.ndim == 0 else a
