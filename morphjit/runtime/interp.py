"""The reference executor: runs a program with NumPy, one binding at a time.

It is the oracle that the compiled backend is checked against, so it favours being obviously
correct over being fast: every result is checked against the type the binding declares.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..backend import check_not_empty, empty_reductions, range_checks
from ..ir import (OPS, Acc, Alias, Apply, Const, Gather, Gemm, IndexMap, Lapack, Lit, Load, Namer, Nest, OneHot,
                  Position, Program, Random, RangeCheck, RowNest, Scatter, batch_size, evaluate, format_binding)
from ..native import OUT_OF_RANGE, random as rng


def run(program: Program, *args) -> list[np.ndarray]:
    """Evaluate ``program`` on ``args`` (one array per program input); returns fresh arrays."""
    if len(args) != len(program.inputs):
        raise ValueError(f"program takes {len(program.inputs)} inputs, got {len(args)}")
    env = {id(v): rng.as_input(a, v.dtype) for v, a in zip(program.inputs, args)}
    env.update((id(v), value) for v, value in program.consts)
    batch = batch_size(program.inputs, [env[id(v)] for v in program.inputs])
    check_not_empty(empty_reductions(program), batch)
    checks = range_checks(program)   # the compiled step's, with its messages
    for check in checks:
        if id(check.values) in env:
            check_range(env[id(check.values)], check, batch)
    with np.errstate(all="ignore"):  # inf and nan flow through as in compiled code
        for b in program.bindings:
            operands = [np.asarray(x.value, x.dtype) if isinstance(x, Lit) else env[id(x)] for x in b.inputs]
            result = np.asarray(OPS[b.op].impl(*operands, **evaluate(b.kwargs, batch)))
            if result.shape != evaluate(b.out.shape, batch) or result.dtype != b.out.dtype:
                raise AssertionError(f"{format_binding(b, Namer())}: reference gave "
                                     f"{result.dtype}{list(result.shape)}")
            env[id(b.out)] = result
            for check in checks:
                if check.values is b.out:
                    check_range(result, check, batch)
    return [np.array(env[id(v)], copy=True) for v in program.outputs]


# ---------------------------------------------------------------------------------------------
# The replay plan, executed with NumPy over the planned pool (so slot sharing is exercised)


def run_plan(plan, *args) -> list[np.ndarray]:
    """Execute a replay plan's instructions in order, every pooled value in its planned slot."""
    memory = {id(v): rng.as_input(a, v.dtype) for v, a in zip(plan.inputs, args)}
    batch = batch_size(plan.inputs, [memory[id(v)] for v in plan.inputs])
    pool = [np.zeros(evaluate(slot.size, batch), slot.dtype) for slot in plan.slots]
    memory.update((id(v), value) for v, value in plan.consts)
    memory.update((id(v), np.empty(evaluate(v.shape, batch), v.dtype)) for v in plan.outputs)

    def buffer(v):
        if id(v) not in memory:
            shape = evaluate(v.shape, batch)
            memory[id(v)] = pool[plan.slot_of[id(v)]][:math.prod(shape)].reshape(shape)
        return memory[id(v)]

    machine = Machine(memory, buffer, batch)
    with np.errstate(all="ignore"):
        for ins in plan.instructions:
            RUN[type(ins)](machine, ins)
    return [np.array(memory[id(v)], copy=True) for v in plan.outputs]


@dataclass
class Machine:
    """The state instructions run on: the arrays by value id, and the batch size."""
    memory: dict
    buffer: Callable
    batch: int | None


def _check_range(m: Machine, ins: RangeCheck) -> None:
    check_range(m.buffer(ins.values), ins, m.batch)


def check_range(values: np.ndarray, ins: RangeCheck, batch) -> None:
    """Raise the range check's error (naming the argument, as the compiled step does) for the
    first value of ``values`` outside its range."""
    extent = evaluate(ins.extent, batch)
    low = -extent if ins.negative else 0
    bad = np.argwhere((values < low) | (values >= extent))
    if len(bad):
        raise OUT_OF_RANGE[ins.error](ins.what, low, extent, values[tuple(bad[0])], *(int(i) for i in bad[0]))


def _scatter(m: Machine, ins: Scatter) -> None:
    domain = evaluate(ins.domain, m.batch)
    values = _evaluate(ins.expr, domain, m.buffer, {}, m.batch)
    index = _gather_index(ins.at, domain, m.buffer, m.batch)
    if ins.accumulate:
        np.add.at(m.buffer(ins.at.var), index, values)
    else:
        m.buffer(ins.at.var)[index] = values     # C order: the last point written to a position wins


def _alias(m: Machine, ins: Alias) -> None:
    m.memory[id(ins.out)] = m.buffer(ins.src).reshape(evaluate(ins.out.shape, m.batch))


def _gemm(m: Machine, ins: Gemm) -> None:
    a = _swap_last(m.buffer(ins.a)) if ins.a_transposed else m.buffer(ins.a)
    b = _swap_last(m.buffer(ins.b)) if ins.b_transposed else m.buffer(ins.b)
    m.buffer(ins.out)[...] = np.matmul(a, b)


def _lapack(m: Machine, ins: Lapack) -> None:
    m.buffer(ins.out)[...] = OPS[ins.routine].impl(*map(m.buffer, ins.inputs), **dict(ins.params))


def _nests(m: Machine, ins) -> None:
    """A nest, or a row nest's parts in order: they read earlier parts row by row, so whole parts
    in order agree."""
    for nest in ins.nests():
        _run_nest(nest, m.buffer, m.batch)


RUN = {RangeCheck: _check_range, Alias: _alias, Gemm: _gemm, Lapack: _lapack, Nest: _nests, RowNest: _nests,
       Scatter: _scatter}


def _run_nest(nest, buffer, batch) -> None:
    """Every value of the nest over the whole domain first, then the stores and the reductions."""
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
    if expr not in known:   # each node of the body's DAG once
        known[expr] = EVALUATE[type(expr)](expr, domain, buffer, known, batch, acc)
    return known[expr]


def _load(expr: Load, domain, buffer, known, batch, acc) -> np.ndarray:
    index = tuple(_affine(expr.imap, domain))
    return buffer(expr.var)[index] if index else np.full(domain, buffer(expr.var)[()])


def _gather_index(e: Gather, domain, buffer, batch) -> tuple:
    """The positions a gather addresses at every point of the domain."""
    affine = _affine(e.imap, domain)
    return tuple(np.broadcast_to(affine[k], domain) if p is None else
                 _evaluate(p, domain, buffer, {}, batch).astype(np.intp) for k, p in enumerate(e.picks))


def _gather(expr: Gather, domain, buffer, known, batch, acc) -> np.ndarray:
    return buffer(expr.var)[_gather_index(expr, domain, buffer, batch)]


def _one_hot(expr: OneHot, domain, buffer, known, batch, acc) -> np.ndarray:
    labels = _evaluate(expr.labels, domain, buffer, known, batch)
    (klass,) = _affine(expr.klass, domain)
    return (labels == klass).astype(expr.dtype)


def _position(expr: Position, domain, buffer, known, batch, acc) -> np.ndarray:
    (position,) = _affine(expr.imap, domain)
    return position.astype(expr.dtype)


def _apply(expr: Apply, domain, buffer, known, batch, acc) -> np.ndarray:
    args = [_evaluate(a, domain, buffer, known, batch, acc) for a in expr.args]
    return np.asarray(OPS[expr.op].impl(*args, **dict(expr.params)), expr.dtype)


def _random(expr: Random, domain, buffer, known, batch, acc) -> np.ndarray:
    seed = _evaluate(expr.seed, domain, buffer, known, batch)
    counter = IndexMap(evaluate(expr.counter.offsets, batch), evaluate(expr.counter.coeffs, batch))
    return rng.draw(seed, expr.stream, expr.dist, expr.dtype, _affine(counter, domain)[0])


EVALUATE = {
    Acc: lambda expr, domain, buffer, known, batch, acc: acc,
    Const: lambda expr, domain, buffer, known, batch, acc: np.full(domain, evaluate(expr.value, batch), expr.dtype),
    Load: _load,
    Gather: _gather,
    OneHot: _one_hot,
    Position: _position,
    Apply: _apply,
    Random: _random,
}
