"""Running a compiled step: the workspace pool, argument preparation and the native call."""
from __future__ import annotations

import numpy as np

from .codegen import internal_shape
from .plan import Plan


class NativeStep:
    """Calls a compiled step: inputs in, fresh outputs back; the pool is allocated once."""

    def __init__(self, plan: Plan, kernel, arguments):
        self.kernel = kernel
        self.pool = [np.empty(slot.size, slot.dtype) for slot in plan.slots]
        fixed = {id(v): c.reshape(internal_shape(v.shape)) for v, c in plan.consts}
        for v in arguments:
            if id(v) in plan.slot_of:
                fixed[id(v)] = self.pool[plan.slot_of[id(v)]][:max(v.type.size, 1)].reshape(internal_shape(v.shape))
        n_in, n_out = len(plan.inputs), len(plan.outputs)
        self.fixed = [fixed[id(v)] for v in arguments[n_in:len(arguments) - n_out]]
        self.input_dtypes = [v.dtype for v in plan.inputs]
        self.output_buffers = [(internal_shape(v.shape), v.dtype) for v in plan.outputs]
        self.scalar_outputs = [i for i, v in enumerate(plan.outputs) if not v.shape]
        self.call = self._first_call

    def __call__(self, *leaves, out=None):
        """Run the step; ``out`` (checked by the caller) receives the outputs after the first."""
        inputs = [x if type(x) is np.ndarray and x.dtype is dtype and x.ndim and x.flags.c_contiguous
                  else prepare(x, dtype) for x, dtype in zip(leaves, self.input_dtypes)]
        if out is None:
            outputs = [np.empty(shape, dtype) for shape, dtype in self.output_buffers]
        else:
            outputs = [np.empty(*self.output_buffers[0])] + [o.reshape(shape) for o, (shape, _) in
                                                             zip(out, self.output_buffers[1:])]
        self.call(*inputs, *self.fixed, *outputs)
        if out is not None:
            return [outputs[0].reshape(())] + list(out)
        for i in self.scalar_outputs:
            outputs[i] = outputs[i].reshape(())
        return outputs

    def _first_call(self, *args):
        """Compile (or load) through the dispatcher, then call the machine code directly."""
        self.kernel(*args)
        # Arguments are always C-contiguous arrays of fixed types: one overload, so the
        # dispatcher's type lookup can be skipped on later calls.
        (overload,) = self.kernel.overloads.values()
        self.call = overload.entry_point


def prepare(x, dtype) -> np.ndarray:
    """The argument as the kernel takes it: C-contiguous, of the traced dtype, at least 1-D."""
    a = np.ascontiguousarray(x, dtype)
    return a.reshape(1) if a.ndim == 0 else a
