"""Program-to-program passes over the joint SSA program, run before fusion: simplification
(``rewrites``), common-subexpression elimination, dead-code elimination and the scheduling of
updates after the other readers of what they update; `optimize` runs the first three in turn
until a round changes nothing, then schedules the updates.

Every pass is a pure function from a program to a program that returns its argument itself when
it changes nothing, so the pipeline knows when it has reached a fixpoint. A rewrite always gives
a value of exactly the type (shape and dtype) of the one it replaces.
"""
from __future__ import annotations

import sys
from typing import Callable

from ..ir import OPS, VIEW, Binding, Program, Var
from ..util import config
from .rewrites import exact, operand_key, rebuild, simplify, substitute


def dce(program: Program) -> Program:
    """Drop bindings (and constants) that no output depends on."""
    live = {id(v) for v in program.outputs}
    kept = []
    for b in reversed(program.bindings):
        if id(b.out) in live:
            kept.append(b)
            live.update(id(x) for x in b.inputs if isinstance(x, Var))
    consts = tuple((v, c) for v, c in program.consts if id(v) in live)
    if len(kept) == len(program.bindings) and len(consts) == len(program.consts):
        return program
    return program.replace(bindings=tuple(reversed(kept)), consts=consts)


# ---------------------------------------------------------------------------------------------
# Common-subexpression elimination

COMMUTATIVE = {"add", "mul", "eq", "ne", "and", "or"}  # exactly, under IEEE too


def binding_key(b: Binding):
    keys = [operand_key(x) for x in b.inputs]
    if b.op in COMMUTATIVE:
        keys.sort(key=repr)
    return b.op, tuple(keys), exact(b.params)


def cse(program: Program) -> Program:
    """Merge bindings of the same op on the same operands with the same parameters."""
    first: dict = {}
    rename: dict[int, Var] = {}
    bindings = []
    for b in program.bindings:
        b = substitute(b, rename)
        key = binding_key(b)
        if key in first:
            rename[id(b.out)] = first[key]
        else:
            first[key] = b.out
            bindings.append(b)
    return rebuild(program, bindings, rename)


# ---------------------------------------------------------------------------------------------
# Updates last: an array dies at its update, which the planner then makes in place

UPDATES = ("update_slice", "scatter")   # ops whose first operand is the array they update


def sink_updates(program: Program) -> Program:
    """Move each update (``update_slice``, ``scatter``) below the later readers of the array it
    updates that do not depend on it, with what they need: the array then dies at the update.
    (A backward pass reads the cotangent it zeroes a box of; a forward pass, rarely.)"""
    bindings = list(program.bindings)
    moved = False
    for b in [b for b in bindings if b.op in UPDATES]:
        at = next(i for i, c in enumerate(bindings) if c is b)
        before = _readers_first(bindings[at + 1:], b)
        if before is not None:
            rest = [c for c in bindings[at + 1:] if id(c) not in before]
            bindings[at:] = [c for c in bindings[at + 1:] if id(c) in before] + [b] + rest
            moved = True
    return program.replace(bindings=tuple(bindings)) if moved else program


def _readers_first(later: list[Binding], update: Binding) -> set[int] | None:
    """The ids of the bindings of ``later`` to schedule before ``update``: the readers of its old
    array (or of a view of it) that do not depend on it, and what they need from ``later``; None
    if there are none."""
    old, depends = update.inputs[0], {id(update.out)}
    viewed = {id(old)}   # the old array and views of it, which loops read through to the array
    for c in later:
        if any(id(x) in depends for x in c.inputs):
            depends.add(id(c.out))
        elif OPS[c.op].kind == VIEW and id(c.inputs[0]) in viewed:
            viewed.add(id(c.out))
    readers = [c for c in later if any(id(x) in viewed for x in c.inputs) and id(c.out) not in depends
               and not (c.op in UPDATES and c.inputs[0] is old)]  # two updates of one array: one copies
    if not readers:
        return None
    producer = {id(c.out): c for c in later}
    needed, stack = set(), list(readers)
    while stack:
        c = stack.pop()
        if id(c) not in needed:
            needed.add(id(c))
            stack += [producer[id(x)] for x in c.inputs if id(x) in producer]
    return needed


# ---------------------------------------------------------------------------------------------
# The pipeline

PIPELINE: tuple[tuple[str, Callable[[Program], Program]], ...] = (
    ("simplify", simplify),
    ("cse", cse),
    ("dce", dce),
)


def optimize(program: Program) -> Program:
    """Run the passes of ``PIPELINE`` in turn until a whole round changes nothing, then schedule
    the updates (`sink_updates`, once: it reorders, so no other pass gains from it).

    ``MORPHJIT_DUMP=<pass>[,<pass>...]|all`` prints the program before and after those passes
    (to stderr); ``MORPHJIT_VERIFY=1`` (see ``util.config``) verifies the program after every pass.
    """
    changed = True
    while changed:
        changed = False
        for name, run_pass in PIPELINE:
            result = _run(name, run_pass, program)
            changed |= result is not program
            program = result
    return _run("sink_updates", sink_updates, program)


def _run(name: str, run_pass: Callable[[Program], Program], program: Program) -> Program:
    shown = config.dumped(name)
    if shown:
        print(f"--- {program.name}: before {name}\n{program}", file=sys.stderr)
    result = run_pass(program)
    if shown:
        print(f"--- {program.name}: after {name}\n{result}", file=sys.stderr)
    if config.verify():
        result.verify()
    return result
