"""Instruction selection: the materialised values of a lowered program become loop-IR instructions.

Selection follows the fusion decisions: every materialised value becomes one instruction (a GEMM,
a loop nest, a reshape alias, or the loop nests of a structural op) whose loop body is the composed
scalar expression of the values inlined into it, each reading its buffer through a resolved index
map. The rewrites of ``REWRITES`` then save passes over memory (after the first, which spends one
to run vectorisable calls over short rows as one loop over the block): an element-wise finish of a
reduction (the ``/ n`` of a mean) runs on its accumulator, adjacent loop nests over the same domain
merge into one nest with several outputs (an activation and the column sums of its gradient, a
maximum and a picked logit), a store only its own nest reads becomes a value of the body, and
nests that read each other row by row run inside shared outer loops.
"""
from __future__ import annotations

import sys
from typing import Callable

from ..ir import (DEPTH_LIMIT, ELEMENTWISE, LINALG, MATMUL, OPS, REDUCE, SOURCE, VIEW, Accumulate, Alias, Apply, Const,
                  Gemm, IndexMap, Lapack, Lit, Load, Namer, Nest, Program, RowNest, Store, TensorType, Var,
                  broadcast_map, depth, describe_instructions, loads, loop, replace_loads, same_row)
from ..native import vecmath
from ..util import config
from .fusion import Fusion, blas_transpose_source


class Selector:
    """Turns materialised bindings into instructions with composed loop bodies."""

    def __init__(self, program: Program):
        self.fusion = Fusion(program)
        self.producer = self.fusion.producer
        self.built: dict = {}

    def expr(self, v, imap: IndexMap):
        """The scalar expression of ``v`` at the loop point ``imap`` addresses; one node for each,
        however many consumers read it (a body is a DAG, not a tree of copies)."""
        if isinstance(v, Lit):
            return Const(v.value, v.dtype)
        if self.fusion.is_root(v):
            return Load(v, imap)
        key = (id(v), imap)
        if key not in self.built:
            self.built[key] = self.binding_expr(self.producer[id(v)], imap)
        return self.built[key]

    def binding_expr(self, b, imap: IndexMap):
        op = OPS[b.op]
        if op.body is not None:
            return op.body(self.expr, b, imap)
        if op.kind == VIEW:
            x = b.inputs[0]
            return self.expr(x, imap.then(op.index_map(x.shape, b.out.shape, **b.kwargs)))
        args = tuple(self.expr(x, imap.then(broadcast_map(x.shape, b.out.shape)) if isinstance(x, Var) else imap)
                     for x in b.inputs)
        return Apply(b.op, args, b.params, b.out.dtype)

    def instructions(self, read_later: set[int] = frozenset()) -> list:
        """The selected instructions in program order, rewritten by ``REWRITES``; the values whose
        ids are ``read_later`` (by range checks placed afterwards) stay buffers, as outputs do."""
        result = []
        for b in self.fusion.program.bindings:
            if self.fusion.is_root(b.out):
                result += self.select(b)
        return rewrite(result, self.fusion.outputs | read_later, self.fusion.program.name)

    def select(self, b) -> list:
        op, out = OPS[b.op], b.out
        kind = op.kind
        if kind == MATMUL:
            return [self.gemm(b)]
        if kind == LINALG:
            return [Lapack(out, b.op, tuple(b.inputs), b.params, op.core)]
        if kind == REDUCE:
            x = b.inputs[0]
            body = self.expr(x, IndexMap.identity(x.ndim))
            return [Nest(x.shape, accumulations=(Accumulate(out, b.op, b.kwargs["axes"], body),))]
        if self.fusion.is_alias(out):
            return [Alias(out, b.inputs[0])]
        if op.nests is not None:
            return op.nests(self.expr, b)
        assert kind in (ELEMENTWISE, VIEW, SOURCE), b.op
        return [loop(out, self.binding_expr(b, IndexMap.identity(out.ndim)))]

    def gemm(self, b) -> Gemm:
        operands = []
        for x in b.inputs:
            source = None if self.fusion.is_root(x) else blas_transpose_source(self.producer[id(x)])
            operands.append((x, False) if source is None else (source, True))
        (a, ta), (bb, tb) = operands
        return Gemm(b.out, a, bb, ta, tb)


# ---------------------------------------------------------------------------------------------
# The rewrites, in order; each maps the instruction list (and the ids of the program's outputs,
# which must stay stored) to a new list.


def elementwise_store(ins) -> Store | None:
    """The single store of a nest writing every element of its output in order, if it is one."""
    if not isinstance(ins, Nest) or ins.accumulations or len(ins.stores) != 1:
        return None
    store = ins.stores[0]
    return store if store.out_map.is_identity() and ins.domain == store.out.shape else None


SHORT_ROW = 16   # innermost extents below this leave the vector units of a vectorised row idle


def flatten_short_rows(instructions: list, outputs: set[int]) -> list:
    """Run a vectorisable call (``exp``, ``log``, ...) over short rows (a softmax over 10 classes)
    as one loop over the whole block: its argument is stored first, row by row, and the call runs
    over that block as a flat array, which LLVM vectorises where a 10-element row does not. The
    call is the whole body of the nest's one output: a store, or a reduction of the calls."""
    result = []
    for ins in instructions:
        if not isinstance(ins, Nest) or not short_rows(ins.domain) or len(ins.outs) != 1 or id(ins.outs[0]) in outputs:
            result.append(ins)
        elif (store := elementwise_store(ins)) is not None and unary_vector_call(store.expr):
            result += flat_call(store.expr, store.out)
        elif ins.accumulations and unary_vector_call((acc := ins.accumulations[0]).expr):
            values = Var(TensorType(ins.domain, acc.expr.dtype))
            reduced = Accumulate(acc.out, acc.op, acc.axes, Load(values, IndexMap.identity(len(ins.domain))), acc.finish)
            result += flat_call(acc.expr, values) + [Nest(ins.domain, accumulations=(reduced,))]
        else:
            result.append(ins)
    return result


def short_rows(domain: tuple) -> bool:
    return len(domain) >= 2 and isinstance(domain[-1], int) and domain[-1] < SHORT_ROW


def unary_vector_call(expr) -> bool:
    return isinstance(expr, Apply) and expr.op in vecmath.FUNCTIONS and len(expr.args) == 1


def flat_call(call: Apply, out: Var) -> list:
    """``out = call(argument)`` as: the argument stored (unless it is a whole buffer already, every
    buffer being C-contiguous), viewed flat, the call over it, viewed as ``out``."""
    (arg,) = call.args
    whole = isinstance(arg, Load) and arg.imap.is_identity() and arg.var.shape == out.shape
    argument = arg.var if whole else Var(out.type)
    flat = TensorType((out.type.size,), out.dtype)
    flat_argument, flat_out = Var(TensorType(flat.shape, argument.dtype)), Var(flat)
    each = IndexMap.identity(1)
    return ([] if whole else [loop(argument, arg)]) + [
        Alias(flat_argument, argument), loop(flat_out, call.rebuild((Load(flat_argument, each),))), Alias(out, flat_out)]


def fold_finishes(instructions: list, outputs: set[int]) -> list:
    """Run an element-wise nest that only finishes a reduction on the reduction's accumulator."""
    result = []
    for ins in instructions:
        prev = result[-1] if result else None
        store = elementwise_store(ins)
        acc = prev.accumulations[-1] if isinstance(prev, Nest) and prev.accumulations else None
        # The accumulator takes the dtype of the value it finishes into: a finish that casts
        # (argmax's float position to int) stays a nest of its own.
        if (store is None or acc is None or id(acc.out) in outputs or store.out.shape != acc.out.shape
                or store.out.dtype != acc.out.dtype):
            result.append(ins)
            continue
        reads = [x for x in loads(store.expr) if x.var is acc.out]
        others_read_it = any(acc.out in i.reads() for i in instructions if i is not ins and i is not prev)
        if not reads or others_read_it or not all(x.imap.is_identity() for x in reads):
            result.append(ins)
            continue
        finish = replace_loads(store.expr, acc.out, acc.finish)
        folded = Accumulate(store.out, acc.op, acc.axes, acc.expr, finish)
        result[-1] = Nest(prev.domain, prev.stores, prev.accumulations[:-1] + (folded,))
    return result


def merge_nests(instructions: list, outputs: set[int]) -> list:
    """Merge adjacent nests over one domain into one nest with several outputs."""
    result = []
    for ins in instructions:
        prev = result[-1] if result else None
        if isinstance(prev, Nest) and isinstance(ins, Nest) and can_merge(prev, ins):
            result[-1] = Nest(prev.domain, prev.stores + ins.stores, prev.accumulations + ins.accumulations)
        else:
            result.append(ins)
    return result


def can_merge(first: Nest, second: Nest) -> bool:
    """Same domain, element-wise stores, one set of reduced axes, and ``second`` reads only the
    elements ``first`` stores in the same iteration (never a reduction ``first`` is still doing)."""
    if first.domain != second.domain or not first.domain:
        return False
    stores = first.stores + second.stores
    if not all(s.out_map.is_identity() and s.out.shape == first.domain for s in stores):
        return False
    if len({a.axes for a in first.accumulations + second.accumulations}) > 1:
        return False
    reduced = {id(a.out) for a in first.accumulations}
    stored = {id(s.out) for s in first.stores}
    for x in second.loads():
        if id(x.var) in reduced or (id(x.var) in stored and not x.imap.is_identity()):
            return False
    return True


def inline_private_stores(instructions: list, outputs: set[int]) -> list:
    """A store only its own nest reads (merging made it so) becomes a value of the loop body;
    not an array stored twice (an update's copy and box, merged), whose last store wins, nor one
    whose readers would be more than `ir.DEPTH_LIMIT` deep."""
    read_elsewhere = {id(v) for ins in instructions for v in ins.reads()} | outputs
    for ins in instructions:
        if isinstance(ins, Nest):
            written = [id(s.out) for s in ins.stores]
            read_elsewhere |= {v for v in written if written.count(v) > 1}
    result = []
    for ins in instructions:
        if not isinstance(ins, Nest) or not ins.domain:
            result.append(ins)
            continue
        stores, accumulations, depths = list(ins.stores), list(ins.accumulations), {}
        while private := next((s for s in stores if id(s.out) not in read_elsewhere
                               and _inlined_depth(s, stores, accumulations, depths) <= DEPTH_LIMIT), None):
            stores = [Store(s.out, s.out_map, replace_loads(s.expr, private.out, private.expr))
                      for s in stores if s is not private]
            accumulations = [Accumulate(a.out, a.op, a.axes, replace_loads(a.expr, private.out, private.expr),
                                        replace_loads(a.finish, private.out, private.expr)) for a in accumulations]
        result.append(Nest(ins.domain, tuple(stores), tuple(accumulations)))
    return result


def _inlined_depth(private: Store, stores: list, accumulations: list, memo: dict) -> int:
    """How deep, at most, the nest's expressions would be with ``private`` inlined (``memo``: the
    depths of the nest's expressions found so far, by id, with the expression kept alive)."""
    exprs = [s.expr for s in stores] + [e for a in accumulations for e in (a.expr, a.finish)]
    for e in exprs:
        if id(e) not in memo:
            memo[id(e)] = (e, depth(e))
    return memo[id(private.expr)][1] + max(memo[id(e)][1] for e in exprs)


def fuse_rows(instructions: list, outputs: set[int]) -> list:
    """Run adjacent nests that share outer loops, and read each other only row by row, as parts
    of one row nest."""
    result = []
    for ins in instructions:
        prev = result[-1] if result else None
        fused = row_fusion(prev, ins) if isinstance(ins, Nest) and prev is not None and prev.nests() else None
        if fused is None:
            result.append(ins)
        else:
            result[-1] = fused
    return result


def row_fusion(prev, ins: Nest) -> RowNest | None:
    """``prev`` (a nest or a row nest) and ``ins`` as one row nest, over the longest outer prefix
    that allows it."""
    parts = prev.nests() + (ins,)
    if isinstance(prev, RowNest):
        candidates = [prev.prefix]
    else:
        shared = shared_prefix(prev.domain, ins.domain)
        candidates = [shared[:p] for p in range(len(shared), 0, -1)]
    for prefix in candidates:
        p = len(prefix)
        if ins.domain[:p] == prefix and all(row_part(part, p) for part in parts) \
                and reads_by_row(parts[:-1], ins, p):
            return RowNest(prefix, parts)
    return None


def shared_prefix(a, b) -> tuple[int, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return tuple(a[:n])


def row_part(part: Nest, p: int) -> bool:
    """Can ``part`` run inside ``p`` shared outer loops? Its stores write whole rows, and it
    reduces inner axes only (innermost), or all axes (accumulating across the rows)."""
    if not all(s.out_map.is_identity() and s.out.shape == part.domain for s in part.stores):
        return False
    n = len(part.domain)
    return all(a.axes == tuple(range(n - len(a.axes), n)) and min(a.axes) >= p
               or (a.axes == tuple(range(n)) and not part.stores)
               for a in part.accumulations)


def reads_by_row(parts, later: Nest, p: int) -> bool:
    """Does ``later`` read what ``parts`` compute only within the same outer index (and never a
    reduction over the rows)?"""
    row_wide = {id(a.out) for part in parts for a in part.accumulations if min(a.axes) < p}
    produced = {id(v) for part in parts for v in part.outs}
    for x in later.loads():
        if id(x.var) in row_wide:
            return False
        if id(x.var) in produced and not same_row(x.imap, p):
            return False
    return True


REWRITES: tuple[tuple[str, Callable[[list, set], list]], ...] = (
    ("flatten_short_rows", flatten_short_rows),
    ("fold_finishes", fold_finishes),
    ("merge_nests", merge_nests),
    ("inline_private_stores", inline_private_stores),
    ("fuse_rows", fuse_rows),
)


def rewrite(instructions: list, outputs: set[int], name: str = "program") -> list:
    """Run the rewrites of ``REWRITES`` in order, once each.

    ``MORPHJIT_DUMP=<rewrite>[,...]|all`` prints the instructions before and after those rewrites
    (to stderr), as ``passes.optimize`` does for the passes.
    """
    for rewrite_name, run in REWRITES:
        shown = config.dumped(rewrite_name)
        if shown:
            print(f"--- {name}: before {rewrite_name}\n{dump_text(instructions)}", file=sys.stderr)
        instructions = run(instructions, outputs)
        if shown:
            print(f"--- {name}: after {rewrite_name}\n{dump_text(instructions)}", file=sys.stderr)
    return instructions


def dump_text(instructions: list) -> str:
    names = Namer()
    for ins in instructions:
        for v in ins.reads() + ins.outs:
            names.name(v)
    return "\n".join(describe_instructions(instructions, names, names.name)) + "\n"
