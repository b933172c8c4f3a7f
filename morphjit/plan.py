"""The replay plan: instructions over buffers, with fused loop bodies and a liveness-planned pool.

Instruction selection follows the fusion decisions: every materialised value becomes one
instruction (a GEMM, a loop nest, a reduction, a reshape alias, or the loops of a structural
op) whose loop body is the composed scalar expression of the values inlined into it, each
reading its buffer through a resolved index map. The planner then gives each buffer a pool slot
by liveness over the linear schedule; a loop whose input dies at it and is read at the very
element it writes (a GEMM epilogue, for instance) writes in place over that input.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .fusion import Fusion, blas_transpose_source, is_alias
from .indexing import (IndexMap, broadcast_map, drop_axes_map, is_unit_reshape, slice_map,
                       transpose_map, unit_reshape_map)
from .ir import Lit, Program, TensorType, Var
from .ops import ELEMENTWISE, MATMUL, OPS, REDUCE, SOURCE, VIEW

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

    def reads(self):
        return [self.a, self.b]


@dataclass(frozen=True, eq=False)
class Loop:
    """for i in domain: out[out_map(i)] = body(i)."""
    out: Var
    domain: tuple[int, ...]
    out_map: IndexMap
    body: object

    def reads(self):
        return [x.var for x in loads(self.body)]


@dataclass(frozen=True, eq=False)
class Reduce:
    """out[kept(i)] = combine over the reduced axes of body(i), for i in domain."""
    out: Var
    op: str
    domain: tuple[int, ...]
    axes: tuple[int, ...]
    body: object

    def reads(self):
        return [x.var for x in loads(self.body)]


@dataclass(frozen=True, eq=False)
class Alias:
    """out is src reshaped: a view of src's buffer, no code beyond the reshape."""
    out: Var
    src: Var

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
        return result

    def select(self, b) -> list:
        kind, out = OPS[b.op].kind, b.out
        if kind == MATMUL:
            return [self.gemm(b)]
        if kind == REDUCE:
            x = b.inputs[0]
            return [Reduce(out, b.op, x.shape, b.kwargs["axes"], self.expr(x, IndexMap.identity(x.ndim)))]
        if is_alias(b):
            return [Alias(out, b.inputs[0])]
        if b.op == "concatenate":
            return self.concatenate(b)
        if b.op == "unslice":
            return self.unslice(b)
        assert kind in (ELEMENTWISE, VIEW, SOURCE), b.op
        return [Loop(out, out.shape, IndexMap.identity(out.ndim), self.binding_expr(b, IndexMap.identity(out.ndim)))]

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
            parts.append(Loop(b.out, x.shape, out_map, self.expr(x, IndexMap.identity(x.ndim))))
            start += x.shape[axis]
        return parts

    def unslice(self, b) -> list:
        g, kw = b.inputs[0], b.kwargs
        zeros = Loop(b.out, b.out.shape, IndexMap.identity(b.out.ndim), Const(0, b.out.dtype))
        scatter = Loop(b.out, g.shape, slice_map(kw["starts"], kw["steps"]), self.expr(g, IndexMap.identity(g.ndim)))
        return [zeros, scatter]


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


# ---------------------------------------------------------------------------------------------
# The plan and its buffers


@dataclass(frozen=True)
class Slot:
    dtype: np.dtype
    size: int       # elements

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
        kinds = {"gemm": Gemm, "loop": Loop, "reduce": Reduce, "alias": Alias}
        return {name: sum(isinstance(i, cls) for i in self.instructions) for name, cls in kinds.items()}

    def __str__(self) -> str:
        from .codegen import describe_plan  # the readable form shares the code renderer
        return describe_plan(self)


def make_plan(program: Program) -> Plan:
    """Select instructions for ``program`` (lowered and optimised) and plan their buffers."""
    instructions = Selector(program).instructions()
    outputs, copies = private_outputs(program)
    plan = Plan(program, program.inputs, program.consts, outputs, instructions + copies)
    assign_slots(plan)
    return plan


def private_outputs(program: Program) -> tuple[tuple[Var, ...], list]:
    """Outputs get buffers of their own: copy those that are inputs, aliases or repeated."""
    external = {id(v) for v in program.inputs} | {id(v) for v, _ in program.consts}
    aliases = {id(b.out) for b in program.bindings if is_alias(b)}
    seen, outputs, copies = set(), [], []
    for v in program.outputs:
        if id(v) in external or id(v) in aliases or id(v) in seen:
            copy = Var(v.type)
            copies.append(Loop(copy, v.shape, IndexMap.identity(v.ndim), Load(v, IndexMap.identity(v.ndim))))
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
        out, donor = ins.out, None
        if not isinstance(ins, Alias) and id(out) not in fixed and id(out) not in plan.slot_of:
            donor = in_place_donor(ins, dies_at[t], plan)
            if donor is not None:
                plan.slot_of[id(out)] = plan.slot_of[id(donor)]
                plan.in_place.add(id(ins))
            else:
                plan.slot_of[id(out)] = take_slot(plan.slots, free, out.type)
        free += [plan.slot_of[id(v)] for v in dies_at[t]
                 if id(v) in plan.slot_of and v is not out and v is not donor]


def last_touches(plan: Plan) -> list[list[Var]]:
    """For each instruction, the buffers read or written for the last time there."""
    last: dict[int, tuple[int, Var]] = {}
    for t, ins in enumerate(plan.instructions):
        for v in ins.reads() + [ins.out]:
            owner = plan.buffer_of(v)
            last[id(owner)] = (t, owner)
    dies_at: list[list[Var]] = [[] for _ in plan.instructions]
    for t, v in last.values():
        dies_at[t].append(v)
    return dies_at


def in_place_donor(ins, dying: list[Var], plan: Plan) -> Var | None:
    """An input of a loop that dies here and is read only at the element being written."""
    if not isinstance(ins, Loop) or not ins.out_map.is_identity() or ins.domain != ins.out.shape:
        return None
    body_loads = loads(ins.body)
    for v in dying:
        if (id(v) in plan.slot_of and v.type == ins.out.type
                and all(x.imap.is_identity() for x in body_loads if x.var is v)
                and any(x.var is v for x in body_loads)):
            return v
    return None


def take_slot(slots: list[Slot], free: list[int], type: TensorType) -> int:
    """A free slot of the dtype (the smallest that fits, else the largest, grown), or a new one."""
    size = max(type.size, 1)
    fitting = [i for i in free if slots[i].dtype == type.dtype]
    if not fitting:
        slots.append(Slot(type.dtype, size))
        return len(slots) - 1
    big_enough = [i for i in fitting if slots[i].size >= size]
    choice = min(big_enough, key=lambda i: slots[i].size) if big_enough else max(fitting, key=lambda i: slots[i].size)
    slots[choice] = Slot(type.dtype, max(size, slots[choice].size))
    free.remove(choice)
    return choice
