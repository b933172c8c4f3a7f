"""Program-to-program passes over the joint SSA program, run before fusion: simplification
(``rewrites``), common-subexpression elimination and dead-code elimination, run in turn by
`optimize` until a round changes nothing.

Every pass is a pure function from a program to a program that returns its argument itself when
it changes nothing, so the pipeline knows when it has reached a fixpoint. A rewrite always gives
a value of exactly the type (shape and dtype) of the one it replaces.
"""
from __future__ import annotations

import sys
from typing import Callable

from ..ir import Binding, Program, Var
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
# The pipeline

PIPELINE: tuple[tuple[str, Callable[[Program], Program]], ...] = (
    ("simplify", simplify),
    ("cse", cse),
    ("dce", dce),
)


def optimize(program: Program) -> Program:
    """Run the passes of ``PIPELINE`` in turn until a whole round changes nothing.

    ``MORPHJIT_DUMP=<pass>[,<pass>...]|all`` prints the program before and after those passes
    (to stderr); ``MORPHJIT_VERIFY=1`` (see ``util.config``) verifies the program after every pass.
    """
    check = config.verify()
    changed = True
    while changed:
        changed = False
        for name, run_pass in PIPELINE:
            shown = config.dumped(name)
            if shown:
                print(f"--- {program.name}: before {name}\n{program}", file=sys.stderr)
            result = run_pass(program)
            if shown:
                print(f"--- {program.name}: after {name}\n{result}", file=sys.stderr)
            if check:
                result.verify()
            changed |= result is not program
            program = result
    return program
