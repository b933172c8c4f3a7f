"""Lowering: replace composite ops by their definitions in simpler ops (from the op table).

The loop backends only know element-wise ops, views, reductions, matmul and the structural
ops; the softmax family is expanded here, after differentiation, so its backward keeps the
textbook formulas and the expansions of forward and backward share work through CSE.
"""
from __future__ import annotations

from ..ir import OPS, Program, Var
from ..tracing import Trace, Tracer


def lower(program: Program) -> Program:
    t = Trace()
    t.consts = list(program.consts)
    env = {id(v): v for v in program.inputs}
    env.update((id(v), v) for v, _ in program.consts)
    for b in program.bindings:
        operands = [Tracer(t, env[id(x)] if isinstance(x, Var) else x) for x in b.inputs]
        t.loc = b.loc
        rule = OPS[b.op].lower
        out = rule(*operands, **b.kwargs) if rule else t.bind(b.op, operands, **b.kwargs)
        env[id(b.out)] = out.operand
    outputs = tuple(t.operand(Tracer(t, env[id(v)]), lift_literals=True) for v in program.outputs)
    return program.replace(bindings=tuple(t.bindings), outputs=outputs, consts=tuple(t.consts))
