"""The reference executor: runs a program with NumPy, one binding at a time.

It is the oracle that the compiled backend is checked against, so it favours being obviously
correct over being fast: every result is checked against the type the binding declares.
"""
from __future__ import annotations

import math

import numpy as np

from .ir import Lit, Namer, Program, batch_size, evaluate, format_binding
from .ops import OPS


def run(program: Program, *args) -> list[np.ndarray]:
    """Evaluate ``program`` on ``args`` (one array per program input); returns fresh arrays."""
    if len(args) != len(program.inputs):
        raise ValueError(f"program takes {len(program.inputs)} inputs, got {len(args)}")
    env = {id(v): np.asarray(a, v.dtype) for v, a in zip(program.inputs, args)}
    env.update((id(v), value) for v, value in program.consts)
    batch = batch_size(program.inputs, [env[id(v)] for v in program.inputs])
    with np.errstate(all="ignore"):  # inf and nan flow through as in compiled code
        for b in program.bindings:
            operands = [np.asarray(x.value, x.dtype) if isinstance(x, Lit) else env[id(x)] for x in b.inputs]
            result = np.asarray(OPS[b.op].impl(*operands, **evaluate(b.kwargs, batch)))
            if result.shape != evaluate(b.out.shape, batch) or result.dtype != b.out.dtype:
                raise AssertionError(f"{format_binding(b, Namer())}: reference gave "
                                     f"{result.dtype}{list(result.shape)}")
            env[id(b.out)] = result
    return [np.array(env[id(v)], copy=True) for v in program.outputs]


# ---------------------------------------------------------------------------------------------
# The replay plan, executed with NumPy over the planned pool (so slot sharing is exercised)

def run_plan(plan, *args) -> list[np.ndarray]:
    """Execute a replay plan's instructions in order, every pooled value in its planned slot."""
    from .plan import Alias, Gemm, LabelCheck  # the plan stage comes after this executor

    memory = {id(v): np.asarray(a, v.dtype) for v, a in zip(plan.inputs, args)}
    batch = batch_size(plan.inputs, [memory[id(v)] for v in plan.inputs])
    pool = [np.zeros(evaluate(slot.size, batch), slot.dtype) for slot in plan.slots]
    memory.update((id(v), value) for v, value in plan.consts)
    memory.update((id(v), np.empty(evaluate(v.shape, batch), v.dtype)) for v in plan.outputs)

    def buffer(v):
        if id(v) not in memory:
            shape = evaluate(v.shape, batch)
            memory[id(v)] = pool[plan.slot_of[id(v)]][:math.prod(shape)].reshape(shape)
        return memory[id(v)]

    with np.errstate(all="ignore"):
        for ins in plan.instructions:
            if isinstance(ins, LabelCheck):
                labels = buffer(ins.labels)
                if labels.size and (labels.min() < 0 or labels.max() >= ins.depth):
                    raise ValueError(ins.message)
            elif isinstance(ins, Alias):
                memory[id(ins.out)] = buffer(ins.src).reshape(evaluate(ins.out.shape, batch))
            elif isinstance(ins, Gemm):
                a = _swap_last(buffer(ins.a)) if ins.a_transposed else buffer(ins.a)
                b = _swap_last(buffer(ins.b)) if ins.b_transposed else buffer(ins.b)
                buffer(ins.out)[...] = np.matmul(a, b)
            else:  # a row nest's parts read earlier parts row by row: whole parts in order agree
                for nest in getattr(ins, "parts", (ins,)):
                    _run_nest(nest, buffer, batch)
    return [np.array(memory[id(v)], copy=True) for v in plan.outputs]


def _run_nest(nest, buffer, batch) -> None:
    """Every value of the nest over the whole domain first, then the stores and the reductions."""
    from .indexing import IndexMap
    from .plan import Load

    known, domain = {}, evaluate(nest.domain, batch)
    for s in nest.stores:
        known[Load(s.out, IndexMap.identity(len(domain)))] = _evaluate(s.expr, domain, buffer, known, batch)
    terms = [_evaluate(a.expr, domain, buffer, known, batch) for a in nest.accumulations]
    for s in nest.stores:
        target = tuple(np.broadcast_to(i, domain) for i in _affine(s.out_map, domain))
        buffer(s.out)[target] = known[Load(s.out, IndexMap.identity(len(domain)))]
    for a, values in zip(nest.accumulations, terms):
        total = np.asarray(OPS[a.op].impl(values, axes=a.axes))
        buffer(a.out)[...] = _evaluate(a.finish, evaluate(a.out.shape, batch), buffer, {}, batch, acc=total)


def _swap_last(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


def _affine(imap, domain) -> list[np.ndarray]:
    """The array indices an index map gives at every point of the loop domain."""
    grid = np.indices(domain, dtype=np.intp) if domain else np.zeros((0,), np.intp)
    return [o + sum((c * grid[j] for j, c in enumerate(row) if c), np.zeros(domain, np.intp))
            for o, row in zip(imap.offsets, imap.coeffs)]


def _evaluate(expr, domain, buffer, known, batch, acc=None) -> np.ndarray:
    """A loop body evaluated at every point of the domain at once."""
    from .plan import Acc, Apply, Const, Load, OneHot

    if expr in known:
        return known[expr]
    if isinstance(expr, Acc):
        return acc
    if isinstance(expr, Const):
        return np.full(domain, evaluate(expr.value, batch), expr.dtype)
    if isinstance(expr, Load):
        index = tuple(_affine(expr.imap, domain))
        return buffer(expr.var)[index] if index else np.full(domain, buffer(expr.var)[()])
    if isinstance(expr, OneHot):
        labels = _evaluate(expr.labels, domain, buffer, known, batch)
        (klass,) = _affine(expr.klass, domain)
        return (labels == klass).astype(expr.dtype)
    assert isinstance(expr, Apply)
    args = [_evaluate(a, domain, buffer, known, batch, acc) for a in expr.args]
    return np.asarray(OPS[expr.op].impl(*args, **dict(expr.params)), expr.dtype)
