"""The replay plan: instructions over buffers, with fused loop bodies and a liveness-planned pool.

Instruction selection follows the fusion decisions: every materialised value becomes one
instruction (a GEMM, a loop nest, a reshape alias, or the loop nests of a structural op) whose
loop body is the composed scalar expression of the values inlined into it, each reading its
buffer through a resolved index map. Two rewrites then save passes over memory: adjacent loop
nests over the same domain merge into one nest with several outputs (an activation and the
column sums of its gradient, a maximum and a picked logit), and an element-wise finish of a
reduction (the ``/ n`` of a mean) runs on its accumulator. The planner gives each buffer a pool
slot by liveness over the linear schedule; a nest whose input dies at it and is read at the very
element it writes (a GEMM epilogue, for instance) writes in place over that input.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .fusion import Fusion, blas_transpose_source
from .indexing import (IndexMap, broadcast_map, element, is_unit_reshape, loop_vars, slice_map,
                       transpose_map, unit_reshape_map)
from .ir import Lit, Namer, Program, Sym, TensorType, Var, degree, literal, magnitude, upper_bound
from .ops import COMPOSITE, ELEMENTWISE, MATMUL, OPS, REDUCE, SOURCE, VIEW

# ---------------------------------------------------------------------------------------------
# Loop-body expressions


@dataclass(frozen=True)
class Load:
    var: Var
    imap: IndexMap


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: np.dtype


@dataclass(frozen=True)
class Apply:
    op: str
    args: tuple
    params: tuple
    dtype: np.dtype


@dataclass(frozen=True)
class OneHot:
    """``labels == class index`` where the class index is an affine function of the loop."""
    labels: object
    klass: IndexMap   # one row: loop indices -> class index
    dtype: np.dtype


@dataclass(frozen=True)
class Acc:
    """The accumulator of a reduction, in the expression that finishes it."""


def loads(expr) -> list[Load]:
    if isinstance(expr, Load):
        return [expr]
    if isinstance(expr, Apply):
        return [x for a in expr.args for x in loads(a)]
    if isinstance(expr, OneHot):
        return loads(expr.labels)
    return []


# ---------------------------------------------------------------------------------------------
# Instructions


@dataclass(frozen=True, eq=False)
class Gemm:
    """out[batch] = op(a[batch]) @ op(b[batch]); op is a transpose where the flag says so."""
    out: Var
    a: Var
    b: Var
    a_transposed: bool
    b_transposed: bool

    @property
    def outs(self) -> list[Var]:
        return [self.out]

    def reads(self):
        return [self.a, self.b]


@dataclass(frozen=True)
class Store:
    """out[out_map(i)] = expr(i)."""
    out: Var
    out_map: IndexMap
    expr: object


@dataclass(frozen=True)
class Accumulate:
    """out[kept(i)] = finish(combine over the reduced axes of expr(i))."""
    out: Var
    op: str
    axes: tuple[int, ...]
    expr: object
    finish: object = Acc()


@dataclass(frozen=True, eq=False)
class Nest:
    """One loop nest over ``domain`` computing several stores and reductions per element."""
    domain: tuple[int, ...]
    stores: tuple[Store, ...] = ()
    accumulations: tuple[Accumulate, ...] = ()

    @property
    def outs(self) -> list[Var]:
        return [s.out for s in self.stores] + [a.out for a in self.accumulations]

    def loads(self) -> list[Load]:
        """Every array read of the nest's bodies and finishes."""
        exprs = [s.expr for s in self.stores] + [e for a in self.accumulations for e in (a.expr, a.finish)]
        return [x for e in exprs for x in loads(e)]

    def reads(self):
        mine = {id(v) for v in self.outs}
        return [x.var for x in self.loads() if id(x.var) not in mine]


@dataclass(frozen=True, eq=False)
class RowNest:
    """Nests sharing their outer loops: for each index of ``prefix``, the parts run in order.

    A part reads what an earlier part computed for the same outer index only, so a row-wise
    chain (softmax: maximum, then exponentials and their sum, then the loss) is one pass over
    the rows while each row is in cache. A part whose domain is the prefix itself may reduce
    over all of it (the loss summed over the rows).
    """
    prefix: tuple[int, ...]
    parts: tuple[Nest, ...]

    @property
    def outs(self) -> list[Var]:
        return [v for part in self.parts for v in part.outs]

    def reads(self):
        mine = {id(v) for v in self.outs}
        return [v for part in self.parts for v in part.reads() if id(v) not in mine]


@dataclass(frozen=True, eq=False)
class LabelCheck:
    """Raise if a class label read by a one-hot is outside ``[0, depth)``: compiled code compares
    labels rather than indexing with them, so a bad label would otherwise pass unnoticed."""
    labels: Var
    depth: int

    outs = property(lambda self: [])

    def reads(self):
        return [self.labels]

    @property
    def message(self) -> str:
        return f"class labels must lie in [0, {self.depth})"


@dataclass(frozen=True, eq=False)
class Alias:
    """out is src reshaped: a view of src's buffer, no code beyond the reshape."""
    out: Var
    src: Var

    @property
    def outs(self) -> list[Var]:
        return [self.out]

    def reads(self):
        return [self.src]


# ---------------------------------------------------------------------------------------------
# Selection


class Selector:
    """Turns materialised bindings into instructions with composed loop bodies."""

    def __init__(self, program: Program):
        self.fusion = Fusion(program)
        self.producer = self.fusion.producer

    def expr(self, v, imap: IndexMap):
        """The scalar expression of ``v`` at the loop point ``imap`` addresses."""
        if isinstance(v, Lit):
            return Const(v.value, v.dtype)
        if self.fusion.is_root(v):
            return Load(v, imap)
        return self.binding_expr(self.producer[id(v)], imap)

    def binding_expr(self, b, imap: IndexMap):
        op = OPS[b.op]
        if b.op == "fill":
            return Const(b.kwargs["value"], b.out.dtype)
        if b.op == "one_hot":
            n = len(imap.offsets)
            rows = IndexMap(imap.offsets[:n - 1], imap.coeffs[:n - 1])
            klass = IndexMap(imap.offsets[n - 1:], imap.coeffs[n - 1:])
            return OneHot(self.expr(b.inputs[0], rows), klass, b.out.dtype)
        if op.kind == VIEW:
            return self.expr(b.inputs[0], imap.then(view_map(b)))
        args = tuple(self.expr(x, imap.then(broadcast_map(x.shape, b.out.shape)) if isinstance(x, Var) else imap)
                     for x in b.inputs)
        return Apply(b.op, args, b.params, b.out.dtype)

    def instructions(self) -> list:
        result = []
        for b in self.fusion.program.bindings:
            if self.fusion.is_root(b.out):
                result += self.select(b)
        nests = inline_private_stores(merge_nests(fold_finishes(result, self.fusion.outputs)), self.fusion.outputs)
        return fuse_rows(nests)

    def select(self, b) -> list:
        kind, out = OPS[b.op].kind, b.out
        if kind == MATMUL:
            return [self.gemm(b)]
        if kind == REDUCE:
            x = b.inputs[0]
            body = self.expr(x, IndexMap.identity(x.ndim))
            return [Nest(x.shape, accumulations=(Accumulate(out, b.op, b.kwargs["axes"], body),))]
        if self.fusion.is_alias(out):
            return [Alias(out, b.inputs[0])]
        if b.op == "concatenate":
            return self.concatenate(b)
        if b.op == "unslice":
            return self.unslice(b)
        assert kind in (ELEMENTWISE, VIEW, SOURCE), b.op
        return [loop(out, self.binding_expr(b, IndexMap.identity(out.ndim)))]

    def gemm(self, b) -> Gemm:
        operands = []
        for x in b.inputs:
            source = None if self.fusion.is_root(x) else blas_transpose_source(self.producer[id(x)])
            operands.append((x, False) if source is None else (source, True))
        (a, ta), (bb, tb) = operands
        return Gemm(b.out, a, bb, ta, tb)

    def concatenate(self, b) -> list:
        axis, start, parts = b.kwargs["axis"], 0, []
        for x in b.inputs:
            offsets = tuple(start if k == axis else 0 for k in range(x.ndim))
            out_map = IndexMap(offsets, IndexMap.identity(x.ndim).coeffs)
            parts.append(Nest(x.shape, (Store(b.out, out_map, self.expr(x, IndexMap.identity(x.ndim))),)))
            start += x.shape[axis]
        return parts

    def unslice(self, b) -> list:
        g, kw = b.inputs[0], b.kwargs
        scatter = Store(b.out, slice_map(kw["starts"], kw["steps"]), self.expr(g, IndexMap.identity(g.ndim)))
        return [loop(b.out, Const(0, b.out.dtype)), Nest(g.shape, (scatter,))]


def view_map(b) -> IndexMap:
    """The index map by which a view binding reads its operand."""
    x, kw = b.inputs[0], b.kwargs
    if b.op == "transpose":
        return transpose_map(kw["perm"])
    if b.op == "broadcast_to":
        return broadcast_map(x.shape, b.out.shape)
    if b.op == "slice":
        return slice_map(kw["starts"], kw["steps"])
    assert b.op == "reshape" and is_unit_reshape(x.shape, b.out.shape), b.op
    return unit_reshape_map(x.shape, b.out.shape)


def loop(out: Var, expr) -> Nest:
    """A nest computing ``out`` element by element."""
    return Nest(out.shape, (Store(out, IndexMap.identity(out.ndim), expr),))


def elementwise_store(ins) -> Store | None:
    """The single store of a nest writing every element of its output in order, if it is one."""
    if not isinstance(ins, Nest) or ins.accumulations or len(ins.stores) != 1:
        return None
    store = ins.stores[0]
    return store if store.out_map.is_identity() and ins.domain == store.out.shape else None


def fold_finishes(instructions: list, outputs: set[int]) -> list:
    """Run an element-wise nest that only finishes a reduction on the reduction's accumulator."""
    result = []
    for ins in instructions:
        prev = result[-1] if result else None
        store = elementwise_store(ins)
        acc = prev.accumulations[-1] if isinstance(prev, Nest) and prev.accumulations else None
        if store is None or acc is None or id(acc.out) in outputs or store.out.shape != acc.out.shape:
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


def replace_loads(expr, var, by):
    """``expr`` with every load of ``var`` replaced by ``by`` (an accumulator stays itself)."""
    if isinstance(expr, Load):
        return by if expr.var is var else expr
    if isinstance(expr, Apply):
        return Apply(expr.op, tuple(replace_loads(a, var, by) for a in expr.args), expr.params, expr.dtype)
    if isinstance(expr, OneHot):
        return OneHot(replace_loads(expr.labels, var, by), expr.klass, expr.dtype)
    return expr


def merge_nests(instructions: list) -> list:
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
    """A store only its own nest reads (merging made it so) becomes a value of the loop body."""
    read_elsewhere = {id(v) for ins in instructions for v in ins.reads()} | outputs
    result = []
    for ins in instructions:
        if not isinstance(ins, Nest) or not ins.domain:
            result.append(ins)
            continue
        stores, accumulations = list(ins.stores), list(ins.accumulations)
        while private := next((s for s in stores if id(s.out) not in read_elsewhere), None):
            stores = [Store(s.out, s.out_map, replace_loads(s.expr, private.out, private.expr))
                      for s in stores if s is not private]
            accumulations = [Accumulate(a.out, a.op, a.axes, replace_loads(a.expr, private.out, private.expr),
                                        replace_loads(a.finish, private.out, private.expr)) for a in accumulations]
        result.append(Nest(ins.domain, tuple(stores), tuple(accumulations)))
    return result


def fuse_rows(instructions: list) -> list:
    """Run adjacent nests that share outer loops, and read each other only row by row, as parts
    of one row nest."""
    result = []
    for ins in instructions:
        prev = result[-1] if result else None
        fused = row_fusion(prev, ins) if isinstance(ins, Nest) and isinstance(prev, (Nest, RowNest)) else None
        if fused is None:
            result.append(ins)
        else:
            result[-1] = fused
    return result


def row_fusion(prev, ins: Nest) -> RowNest | None:
    """``prev`` and ``ins`` as one row nest, over the longest outer prefix that allows it."""
    parts = (prev.parts if isinstance(prev, RowNest) else (prev,)) + (ins,)
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


def same_row(imap: IndexMap, p: int) -> bool:
    """The first ``p`` axes are read at the outer loop indices, and no other axis depends on them."""
    if len(imap.offsets) < p:
        return False
    outer = all(imap.offsets[k] == 0 and tuple(imap.coeffs[k]) == tuple(int(j == k) for j in range(imap.loop_ndim))
                for k in range(p))
    return outer and all(not any(row[:p]) for row in imap.coeffs[p:])


# ---------------------------------------------------------------------------------------------
# The plan and its buffers


@dataclass(frozen=True)
class Slot:
    dtype: np.dtype
    size: int | Sym     # elements

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


@dataclass(eq=False)
class Plan:
    program: Program                      # the lowered, optimised program the plan computes
    inputs: tuple[Var, ...]
    consts: tuple[tuple[Var, np.ndarray], ...]
    outputs: tuple[Var, ...]
    instructions: list
    slots: list[Slot] = field(default_factory=list)
    slot_of: dict[int, int] = field(default_factory=dict)    # id(buffer var) -> slot
    in_place: set[int] = field(default_factory=set)          # ids of instructions writing in place
    written_over: dict[int, Var] = field(default_factory=dict)  # id(output) -> the input it overwrites

    def __post_init__(self):
        self._alias_src = {id(i.out): i.src for i in self.instructions if isinstance(i, Alias)}

    def buffer_of(self, v: Var) -> Var:
        """The value owning the memory ``v`` lives in (aliases are views of it)."""
        while id(v) in self._alias_src:
            v = self._alias_src[id(v)]
        return v

    @property
    def workspace_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots)

    @property
    def naive_bytes(self) -> int:
        """A buffer per computed value, as an unplanned executor would allocate."""
        outs = {id(v) for v in self.outputs}
        return sum(b.out.type.nbytes for b in self.program.bindings
                   if OPS[b.op].kind != VIEW and id(b.out) not in outs)

    def counts(self) -> dict[str, int]:
        nests = [i for i in self.instructions if isinstance(i, (Nest, RowNest))]
        reduces = [any(p.accumulations for p in getattr(i, "parts", (i,))) for i in nests]
        return {"gemm": sum(isinstance(i, Gemm) for i in self.instructions),
                "loop": reduces.count(False), "reduce": reduces.count(True),
                "alias": sum(isinstance(i, Alias) for i in self.instructions)}

    def __str__(self) -> str:
        return describe_plan(self)


def make_plan(program: Program) -> Plan:
    """Select instructions for ``program`` (lowered and optimised) and plan their buffers."""
    composite = sorted({b.op for b in program.bindings if OPS[b.op].kind == COMPOSITE})
    if composite:
        raise ValueError(f"make_plan needs a lowered program; {', '.join(composite)} must be lowered first")
    selector = Selector(program)
    instructions = selector.instructions()
    outputs, copies = private_outputs(program, selector.fusion.aliases)
    plan = Plan(program, program.inputs, program.consts, outputs, with_label_checks(program, instructions) + copies)
    assign_slots(plan)
    return plan


def with_label_checks(program: Program, instructions: list) -> list:
    """``instructions`` with a range check of the class labels of each one-hot: first for labels
    that are inputs, else right after the instruction that writes them (fusion gives them a
    buffer), so before any instruction reads them."""
    wanted = {(id(b.inputs[0]), b.kwargs["depth"]): b.inputs[0] for b in program.bindings if b.op == "one_hot"}
    checks = [LabelCheck(labels, depth) for (_, depth), labels in wanted.items()]
    written = {id(v) for ins in instructions for v in ins.outs}
    result = [c for c in checks if id(c.labels) not in written]
    for ins in instructions:
        outs = {id(v) for v in ins.outs}
        result += [ins] + [c for c in checks if id(c.labels) in outs]
    return result


def private_outputs(program: Program, aliases: set[int]) -> tuple[tuple[Var, ...], list]:
    """Outputs get buffers of their own: copy those that are inputs, aliases or repeated."""
    external = {id(v) for v in program.inputs} | {id(v) for v, _ in program.consts}
    seen, outputs, copies = set(), [], []
    for v in program.outputs:
        if id(v) in external or id(v) in aliases or id(v) in seen:
            copy = Var(v.type)
            copies.append(loop(copy, Load(v, IndexMap.identity(v.ndim))))
            v = copy
        seen.add(id(v))
        outputs.append(v)
    return tuple(outputs), copies


def assign_slots(plan: Plan) -> None:
    """Linear-scan assignment of pool slots by liveness; inputs and outputs are not pooled."""
    fixed = {id(v) for v in plan.inputs} | {id(v) for v, _ in plan.consts} | {id(v) for v in plan.outputs}
    dies_at = last_touches(plan)
    free: list[int] = []
    for t, ins in enumerate(plan.instructions):
        donors: list[Var] = []
        for out in ins.outs:
            if isinstance(ins, Alias) or id(out) in fixed or id(out) in plan.slot_of:
                continue
            candidates = [v for v in dies_at[t] if v not in donors and v not in ins.outs]
            donor = in_place_donor(ins, out, candidates, plan)
            if donor is not None:
                donors.append(donor)
                plan.slot_of[id(out)] = plan.slot_of[id(donor)]
                plan.in_place.add(id(ins))
            else:
                plan.slot_of[id(out)] = take_slot(plan.slots, free, out.type)
        kept = {id(v) for v in ins.outs + donors}
        free += [plan.slot_of[id(v)] for v in dies_at[t] if id(v) in plan.slot_of and id(v) not in kept]


def last_touches(plan: Plan) -> list[list[Var]]:
    """For each instruction, the buffers read or written for the last time there."""
    last: dict[int, tuple[int, Var]] = {}
    for t, ins in enumerate(plan.instructions):
        for v in ins.reads() + ins.outs:
            owner = plan.buffer_of(v)
            last[id(owner)] = (t, owner)
    dies_at: list[list[Var]] = [[] for _ in plan.instructions]
    for t, v in last.values():
        dies_at[t].append(v)
    return dies_at


def in_place_donor(ins, out: Var, dying: list[Var], plan: Plan) -> Var | None:
    """An input that dies here and is read only at the element ``out`` is written (and, in a row
    nest, only in the same row and not after the part writing ``out``)."""
    parts = ins.parts if isinstance(ins, RowNest) else (ins,) if isinstance(ins, Nest) else ()
    writer = next((k for k, part in enumerate(parts) if any(s.out is out and s.out_map.is_identity()
                                                           and part.domain == out.shape for s in part.stores)), None)
    if writer is None:
        return None
    p = len(ins.prefix) if isinstance(ins, RowNest) else len(out.shape)
    for v in dying:
        if id(v) not in plan.slot_of or v.type != out.type:
            continue
        reads = [(k, x) for k, part in enumerate(parts) for x in part.loads() if x.var is v]
        if (any(k == writer for k, _ in reads)
                and all(k < writer and same_row(x.imap, p) or k == writer and x.imap.is_identity()
                        for k, x in reads)):
            return v
    return None


def write_in_place(plan: Plan, pairs) -> None:
    """Let each ``(input, output)`` pair share memory (a parameter updated in place), after
    checking that the output is written by a loop nest (or a part of a row nest) that reads the
    input only at the element it writes (earlier parts of a row nest: only in the same row), and
    that nothing later reads the input."""
    for src, dst in pairs:
        writer = next(t for t, ins in enumerate(plan.instructions) if dst in ins.outs)
        ins = plan.instructions[writer]
        later = [plan.buffer_of(v) for i in plan.instructions[writer + 1:] for v in i.reads()]
        parts = ins.parts if isinstance(ins, RowNest) else (ins,) if isinstance(ins, Nest) else ()
        p = len(ins.prefix) if isinstance(ins, RowNest) else 0
        reads = [(k, x) for k, part in enumerate(parts) for x in part.loads() if plan.buffer_of(x.var) is src]
        safe = any(all(s.out_map.is_identity() for s in part.stores if s.out is dst) and dst in part.outs
                   and all(x.imap.is_identity_on(part.domain) if k == w else k < w and same_row(x.imap, p)
                           for k, x in reads)
                   for w, part in enumerate(parts))
        if any(v is src for v in later) or not safe:
            raise AssertionError(f"the plan cannot update {src} in place:\n{describe_plan(plan)}")
        plan.written_over[id(dst)] = src


def take_slot(slots: list[Slot], free: list[int], type: TensorType) -> int:
    """A free slot of the dtype (the smallest that fits, else the largest, grown), or a new one."""
    size = type.size if isinstance(type.size, Sym) else max(type.size, 1)
    fitting = [i for i in free if slots[i].dtype == type.dtype and degree(slots[i].size) == degree(size)]
    if not fitting:
        slots.append(Slot(type.dtype, size))
        return len(slots) - 1
    big_enough = [i for i in fitting if upper_bound(slots[i].size, size) == slots[i].size]
    choice = (min(big_enough, key=lambda i: magnitude(slots[i].size)) if big_enough
              else max(fitting, key=lambda i: magnitude(slots[i].size)))
    slots[choice] = Slot(type.dtype, upper_bound(size, slots[choice].size))
    free.remove(choice)
    return choice


# ---------------------------------------------------------------------------------------------
# The plan's text form (as the code is rendered: the same index and constant spelling)


def describe_plan(plan: Plan) -> str:
    names = Namer()
    for v in list(plan.inputs) + [v for v, _ in plan.consts]:
        names.name(v)
    counts = ", ".join(f"{n} {k}" for k, n in plan.counts().items())
    lines = [f"plan: {len(plan.instructions)} instructions ({counts}); {len(plan.slots)} slots, "
             f"workspace {plan.workspace_bytes} B (naive {plan.naive_bytes} B)",
             "in " + " ".join(names.declare(v) for v in plan.inputs)]
    declared: set[int] = set()

    def target(v: Var) -> str:
        first = id(v) not in declared
        declared.add(id(v))
        slot = f" [s{plan.slot_of[id(v)]}]" if id(v) in plan.slot_of else ""
        return (names.declare(v) if first else names.name(v)) + slot

    for ins in plan.instructions:
        flag = " in-place" if id(ins) in plan.in_place else ""
        if isinstance(ins, Gemm):
            a = names.use(ins.a) + (".T" if ins.a_transposed else "")
            b = names.use(ins.b) + (".T" if ins.b_transposed else "")
            lines.append(f"  gemm {target(ins.out)} = {a} @ {b}")
        elif isinstance(ins, Alias):
            lines.append(f"  alias {target(ins.out)} = reshape {names.use(ins.src)}")
        elif isinstance(ins, LabelCheck):
            lines.append(f"  check 0 <= {names.use(ins.labels)} < {ins.depth}")
        elif isinstance(ins, RowNest):
            lines.append(f"  rows over {list(ins.prefix)}{flag}")
            for part in ins.parts:
                lines.append(f"    nest over {list(part.domain)}")
                lines += ["  " + line for line in describe_nest(part, names, target)]
        else:
            lines.append(f"  nest over {list(ins.domain)}{flag}")
            lines += describe_nest(ins, names, target)
    lines.append("out " + " ".join(names.use(v) for v in plan.outputs))
    return "\n".join(lines) + "\n"


def describe_nest(ins: Nest, names: Namer, target) -> list[str]:
    idx = loop_vars(len(ins.domain))
    lines = []
    for s in ins.stores:
        where = "" if s.out_map.is_identity() else f"[{', '.join(s.out_map.render(idx))}] "
        lines.append(f"    {target(s.out)} {where}= {describe_expr(s.expr, names, idx)}")
    kept = [k for k in range(len(ins.domain)) if not ins.accumulations or k not in ins.accumulations[0].axes]
    for a in ins.accumulations:
        over = ",".join(idx[k] for k in a.axes)
        total = f"{a.op}[{over}] {describe_expr(a.expr, names, idx)}"
        finish = describe_expr(a.finish, names, [idx[k] for k in kept]).replace("acc", f"({total})") \
            if a.finish != Acc() else total
        lines.append(f"    {target(a.out)} = {finish}")
    return lines


def describe_expr(e, names: Namer, idx) -> str:
    if isinstance(e, Acc):
        return "acc"
    if isinstance(e, Const):
        return literal(e.value, e.dtype).replace("np.", "")
    if isinstance(e, Load):
        return element(names.use(e.var), e.imap, idx)
    if isinstance(e, OneHot):
        return f"({describe_expr(e.labels, names, idx)} == {e.klass.render(idx)[0]})"
    params = "".join(f" {k}={v}" for k, v in e.params)
    return f"{e.op}({', '.join(describe_expr(a, names, idx) for a in e.args)}{params})"
