"""The reference executor: runs a program with NumPy, one binding at a time.

It is the oracle that the compiled backend is checked against, so it favours being obviously
correct over being fast: every result is checked against the type the binding declares.
"""
from __future__ import annotations

import numpy as np

from .ir import Lit, Program, format_binding, Namer
from .ops import OPS


def run(program: Program, *args) -> list[np.ndarray]:
    """Evaluate ``program`` on ``args`` (one array per program input); returns fresh arrays."""
    if len(args) != len(program.inputs):
        raise ValueError(f"program takes {len(program.inputs)} inputs, got {len(args)}")
    env = {id(v): np.asarray(a, v.dtype) for v, a in zip(program.inputs, args)}
    env.update((id(v), value) for v, value in program.consts)
    with np.errstate(all="ignore"):  # inf and nan flow through as in compiled code
        for b in program.bindings:
            operands = [np.asarray(x.value, x.dtype) if isinstance(x, Lit) else env[id(x)] for x in b.inputs]
            result = np.asarray(OPS[b.op].impl(*operands, **b.kwargs))
            if result.shape != b.out.shape or result.dtype != b.out.dtype:
                raise AssertionError(f"{format_binding(b, Namer())}: reference gave "
                                     f"{result.dtype}{list(result.shape)}")
            env[id(b.out)] = result
    return [np.array(env[id(v)], copy=True) for v in program.outputs]
