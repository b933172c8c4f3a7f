"""The memory of a replay plan: pool slots by liveness, and the nests that write in place (an
update's copy of the array it updates, written in place, is dropped).

The planner gives each buffer a pool slot by liveness over the linear schedule; a nest whose input
dies at it and is read at the very element it writes (a GEMM epilogue, for instance) writes in
place over that input. Works on a ``plan.Plan`` (its instructions, inputs, outputs and the maps it
fills: ``slots``, ``slot_of``, ``in_place``, ``written_over``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Alias, Load, Nest, RowNest, Sym, TensorType, Var, degree, magnitude, same_row, upper_bound


@dataclass(frozen=True)
class Slot:
    dtype: np.dtype
    size: int | Sym     # elements

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def assign_slots(plan) -> None:
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
    plan.instructions[:] = [ins for ins in plan.instructions if not self_copy(plan, ins)]


def self_copy(plan, ins) -> bool:
    """Whether ``ins`` only copies arrays onto themselves: an update's copy of the array it
    updates, written in place (the array died there and gave the result its slot)."""
    return (isinstance(ins, Nest) and id(ins) in plan.in_place and not ins.accumulations and bool(ins.stores)
            and all(copies_onto_itself(plan, s) for s in ins.stores))


def copies_onto_itself(plan, store) -> bool:
    """Whether ``store`` copies an array element by element into the slot it is in."""
    source = store.expr
    return (store.out_map.is_identity() and isinstance(source, Load) and source.imap.is_identity()
            and source.var.type == store.out.type and plan.slot_of.get(id(source.var)) == plan.slot_of[id(store.out)])


def last_touches(plan) -> list[list[Var]]:
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


def in_place_donor(ins, out: Var, dying: list[Var], plan) -> Var | None:
    """An input that dies here and is read only at the element ``out`` is written (and, in a row
    nest, only in the same row and not after the part writing ``out``)."""
    parts = ins.nests()
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


def can_write_in_place(plan, src: Var, dst: Var) -> bool:
    """Whether ``dst`` can be written over ``src``: it is written by a loop nest (or a part of a
    row nest) that reads ``src`` only at the element it writes (earlier parts of a row nest: only
    in the same row), and nothing later reads ``src``."""
    writer = next(t for t, ins in enumerate(plan.instructions) if dst in ins.outs)
    ins = plan.instructions[writer]
    later = [plan.buffer_of(v) for i in plan.instructions[writer + 1:] for v in i.reads()]
    parts = ins.nests()
    p = len(ins.prefix) if isinstance(ins, RowNest) else 0
    reads = [(k, x) for k, part in enumerate(parts) for x in part.loads() if plan.buffer_of(x.var) is src]
    safe = any(all(s.out_map.is_identity() for s in part.stores if s.out is dst) and dst in part.outs
               and all(x.imap.is_identity_on(part.domain) if k == w else k < w and same_row(x.imap, p)
                       for k, x in reads)
               for w, part in enumerate(parts))
    return safe and not any(v is src for v in later)


def write_in_place(plan, pairs) -> None:
    """Let each ``(input, output)`` pair share memory (a parameter updated in place)."""
    for src, dst in pairs:
        if not can_write_in_place(plan, src, dst):
            raise AssertionError(f"the plan cannot update {src} in place:\n{plan}")
        plan.written_over[id(dst)] = src


def storage(plan, v: Var) -> tuple:
    """The memory ``v`` lives in: its pool slot, or the array of its own (an input, constant or
    output; an output written over an input is the input's)."""
    owner = plan.buffer_of(v)
    if id(owner) in plan.slot_of:
        return ("slot", plan.slot_of[id(owner)])
    return ("array", id(plan.written_over.get(id(owner), owner)))


def writes_reach_one_pointer(plan, ins, arrays: list[Var]) -> bool:
    """Whether each buffer ``ins`` writes is only one of ``arrays`` (the distinct arrays of its
    kernel, each a pointer marked ``noalias``). Values sharing a slot at one instruction are an
    input written in place and its output, which codegen names alike (``same_views``);
    ``out=`` arrays and arrays a training step updates are refused when they overlap another
    argument."""
    places = [storage(plan, v) for v in arrays]
    return all(places.count(storage(plan, v)) <= 1 for v in ins.outs)


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
