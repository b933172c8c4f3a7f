"""Program-to-program passes over the joint SSA program."""
from __future__ import annotations

from .ir import Program, Var


def dce(program: Program) -> Program:
    """Drop bindings (and constants) that no output depends on."""
    live = {id(v) for v in program.outputs}
    kept = []
    for b in reversed(program.bindings):
        if id(b.out) in live:
            kept.append(b)
            live.update(id(x) for x in b.inputs if isinstance(x, Var))
    consts = tuple((v, c) for v, c in program.consts if id(v) in live)
    return program.replace(bindings=tuple(reversed(kept)), consts=consts)
