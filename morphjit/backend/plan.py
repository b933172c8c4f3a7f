"""The replay plan: loop-IR instructions over buffers, with fused loop bodies and a liveness-planned
pool.

``make_plan`` runs the two halves: instruction selection with its rewrites (``selection``) and the
memory plan (``memory``: pool slots by liveness, writes in place). The instructions and their text
form are the loop IR (``ir.loops``, ``ir.looptext``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..ir import (COMPOSITE, OPS, VIEW, Alias, IndexMap, Instruction, Load, Namer, Program, RangeCheck, Sym, Var,
                  describe_instructions, empty_reduction_error, evaluate, loop)
from ..native import SliceOutOfRange
from ..ops import in_range, index_operands, picked_extents
from ..util import SourceLoc
from .memory import Slot, assign_slots
from .selection import Selector


@dataclass(eq=False)
class Plan:
    program: Program                      # the lowered, optimised program the plan computes
    inputs: tuple[Var, ...]
    consts: tuple[tuple[Var, np.ndarray], ...]
    outputs: tuple[Var, ...]
    instructions: list[Instruction]
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
        kinds = [i.kind for i in self.instructions]
        return {kind: kinds.count(kind) for kind in ("gemm", "loop", "reduce", "alias")}

    def __str__(self) -> str:
        return describe_plan(self)


def make_plan(program: Program, copied: frozenset[int] = frozenset()) -> Plan:
    """Select instructions for ``program`` (lowered and optimised) and plan their buffers; the
    outputs whose ids are ``copied`` are computed into a buffer of the pool, then copied."""
    composite = sorted({b.op for b in program.bindings if OPS[b.op].kind == COMPOSITE})
    if composite:
        raise ValueError(f"make_plan needs a lowered program; {', '.join(composite)} must be lowered first")
    checks = range_checks(program)
    selector = Selector(program)
    instructions = selector.instructions(read_later={id(c.values) for c in checks})
    outputs, copies = private_outputs(program, selector.fusion.aliases | copied)
    plan = Plan(program, program.inputs, program.consts, outputs, with_range_checks(checks, instructions) + copies)
    assign_slots(plan)
    return plan


def range_checks(program: Program) -> list[RangeCheck]:
    """A range check of the class labels one-hot reads (inputs, or computed into a buffer by
    fusion), of the mask of the elements NumPy refuses in a traced parameter of a draw (all
    False: below 1), and of each index array of a gather, scatter-add or scatter that is not a constant
    (those are checked as they are traced; the others are inputs or computed into buffers, see
    ``Op.buffered``) or an iota no longer than its axis (``ops.gathers.in_range``)."""
    consts = {id(v) for v, _ in program.consts}
    producer = {id(b.out): b for b in program.bindings}
    checks = {}
    for b in program.bindings:
        if b.op == "one_hot":
            labels = b.inputs[0]
            checks[(id(labels), b.kwargs["depth"])] = RangeCheck(labels, b.kwargs["depth"], "class labels")
        if b.op == "check_parameter":
            refused = b.inputs[1]
            checks[(id(refused), 1)] = RangeCheck(refused, 1, b.kwargs["what"] + where(b), b.kwargs["error"])
        if b.op in ("gather", "scatter_add", "scatter"):
            names = b.kwargs.get("names") or ("",) * len(index_operands(b))
            for index, name, extent in zip(index_operands(b), names, picked_extents(b)):
                if in_range(index, extent, producer):
                    continue
                if id(index) not in consts or isinstance(extent, Sym):
                    checks.setdefault((id(index), extent), index_check(b, index, name, extent))
    return list(checks.values())


def index_check(b, index, name: str, extent) -> RangeCheck:
    """The range check of an index array of the gather or scatter-add ``b``; that of a slice with
    traced bounds (``slice_length``) refuses the positions NumPy's slice lacks (one past the axis)."""
    length = b.kwargs.get("slice_length")
    if length:
        what = SliceOutOfRange.what(SourceLoc.at(b.loc), length, b.kwargs.get("slice_nth", 0))
        return RangeCheck(index, extent, what, "slice")
    what = f"{f'index argument {name}' if name else 'computed indices'}{where(b)}"
    return RangeCheck(index, extent, what, "IndexError", negative=True)


def empty_reductions(program: Program) -> list[tuple]:
    """``(count, error)`` of each max or min of the user's (``empty`` names the function) whose
    number of elements reduced depends on the batch size: at a batch size where it is 0 the step
    raises ``error``, NumPy's."""
    return [(math.prod(b.inputs[0].shape[a] for a in b.kwargs["axes"]),
             f"{empty_reduction_error(b.kwargs['empty'])}{where(b)}")
            for b in program.bindings if b.kwargs.get("empty")]


def check_not_empty(reductions: list[tuple], batch: int) -> None:
    """Raise the error of the first of ``empty_reductions`` over no element at ``batch``."""
    for count, error in reductions:
        if evaluate(count, batch) == 0:
            raise ValueError(error)


def where(b) -> str:
    return SourceLoc.at(b.loc)


def with_range_checks(pending: list[RangeCheck], instructions: list) -> list:
    """The instructions with each range check as early as possible: before all of them for an
    input, right after the last instruction writing a computed value (a concatenation is written
    by one instruction per part)."""
    written = {id(c): k for k, ins in enumerate(instructions) for c in pending if c.values in ins.outs}
    result = [c for c in pending if id(c) not in written]
    for k, ins in enumerate(instructions):
        result.append(ins)
        result += [c for c in pending if written.get(id(c)) == k]
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


def describe_plan(plan: Plan) -> str:
    """The plan's text form: its instructions, each written value with its pool slot."""
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

    lines += describe_instructions(plan.instructions, names, target, plan.in_place)
    lines.append("out " + " ".join(names.use(v) for v in plan.outputs))
    return "\n".join(lines) + "\n"
