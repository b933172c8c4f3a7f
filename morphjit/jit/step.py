"""A compiled signature (`Step`): its spec, its joint program, what runs it (the native step or
the reference executor, `run_reference`) and what it writes back into the arguments."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir import Program
from ..runtime import NativeStep, interp
from ..tracing import StateWrites
from ..util import pytree
from . import feedback
from .checks import ArgSpec, label_error


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
    state: StateWrites = StateWrites()       # what the function writes into its arguments (the last outputs)

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

    def kept(self, args, outputs) -> list:
        """``outputs`` without the state ones, which are written into ``args``' containers."""
        if not self.state:
            return outputs
        end = len(outputs) - self.state.outputs
        self.state.apply(args, outputs[end:])
        return outputs[:end]


def run_reference(program: Program, paths, *leaves) -> list[np.ndarray]:
    """The reference executor, refusing out-of-range class labels as the compiled step does."""
    error = label_error(program, paths, leaves)
    if error is not None:
        raise error
    return interp.run(program, *leaves)
