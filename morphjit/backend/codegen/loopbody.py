"""Loop bodies in the generated source: the scalar expression of each loop-IR node (one handler
per kind in ``CODE``), loop-invariant hoisting and the loops around a body. The writers write
the instructions and the step around them."""
from __future__ import annotations

import contextlib

import numpy as np

from ...ir import (OPS, Apply, Const, Constants, Gather, Load, Namer, Nest, OneHot, Position, Random, element,
                   gather_indices, gathers, literal, loop_axes)
from ...native import random as rng, vecmath
from ...util import Source


class Body:
    """Renders a loop-body expression DAG as local assignments, each subexpression once.
    ``offsets`` spells a load's index map (a kernel's may name its offsets as parameters)."""

    def __init__(self, out: Source, names: Namer, loop_vars: list[str], offsets=lambda imap: imap):
        self.out, self.names, self.loop_vars, self.offsets = out, names, loop_vars, offsets
        self.memo: dict = {}
        self.steps = 0

    def value(self, e) -> str:
        if isinstance(e, Const):
            return literal(e.value, e.dtype)
        if e in self.memo:
            return self.memo[e]
        code = self.code(e)
        name = self.memo[e] = f"t{len(self.memo)}"
        self.out.line(f"{name} = {code}")
        return name

    def code(self, e) -> str:
        return CODE[type(e)](self, e)

    def bind(self, code: str) -> str:
        """A new local holding ``code``: one step of an expression rendered in several statements."""
        self.steps += 1
        self.out.line(f"r{self.steps} = {code}")
        return f"r{self.steps}"

    def load(self, e: Load) -> str:
        return element(self.names.name(e.var), self.offsets(e.imap), self.loop_vars)

    def gather(self, e: Gather) -> str:
        indices = gather_indices(e, self.loop_vars, lambda k, p: self.value(p))
        return f"{self.names.name(e.var)}[{', '.join(indices)}]"

    def one_hot(self, e: OneHot) -> str:
        (klass,) = e.klass.render(self.loop_vars)
        test = f"{self.value(e.labels)} == {klass}"
        return f"({test})" if e.dtype == np.bool_ else \
            f"select({test}, {literal(1, e.dtype)}, {literal(0, e.dtype)})"

    def position(self, e: Position) -> str:
        (position,) = e.imap.render(self.loop_vars)
        return f"np.{e.dtype.name}({position})"

    def apply(self, e: Apply) -> str:
        args = [self.value(a) for a in e.args]
        return OPS[e.op].scalar(Constants(e.dtype), *args, **dict(e.params))

    def random(self, e: Random) -> str:
        (counter,) = e.counter.render(self.loop_vars)
        return rng.render(self.bind, self.value(e.seed), e.stream, e.dist, e.dtype, counter, vecmath.call)


# How the body renders each kind of expression that is not a constant or an accumulator.
CODE = {Load: Body.load, Gather: Body.gather, OneHot: Body.one_hot, Position: Body.position, Apply: Body.apply,
        Random: Body.random}


def loop_invariants(ins: Nest) -> list:
    """The largest subexpressions of the nest's bodies that are the same on every iteration:
    reads of one element (a scalar buffer) of values the nest does not write, and arithmetic on
    them and on constants (``1 / B``). Computed once before the loops; read inside them, each
    load would be one LLVM must assume a store may change, which keeps it from vectorising."""
    outs = {id(v) for v in ins.outs}
    found: dict = {}
    # by identity: a body is a DAG (a Newton step reads its input several times), walked as a
    # tree it takes exponential time
    known: dict[int, bool] = {}
    visited: set[int] = set()

    def invariant(e) -> bool:
        if id(e) not in known:
            rule = INVARIANT.get(type(e))  # other kinds (a one-hot, an accumulator) never are
            known[id(e)] = rule is not None and rule(e, outs, invariant)
        return known[id(e)]

    def visit(e) -> None:
        if id(e) in visited:
            return
        visited.add(id(e))
        if invariant(e):
            if not isinstance(e, Const):
                found[e] = None
        else:
            for a in e.children():
                visit(a)

    for e in [s.expr for s in ins.stores] + [a.expr for a in ins.accumulations]:
        visit(e)
    return list(found)


# Which expressions are the same on every iteration of a nest writing ``outs``.
INVARIANT = {
    Const: lambda e, outs, invariant: True,
    Load: lambda e, outs, invariant: id(e.var) not in outs and not any(any(row) for row in e.imap.coeffs),
    Apply: lambda e, outs, invariant: all([invariant(a) for a in e.args]),
}


@contextlib.contextmanager
def loops(out: Source, domain, names: list[str]):
    """Nested ``for`` loops over ``domain``; what is written inside the scope is their body."""
    with contextlib.ExitStack() as scopes:
        for name, extent in zip(names, domain):
            out.line(f"for {name} in range({extent}):")
            scopes.enter_context(out.indent())
        yield


def run_time_extents(exprs, domain, spell) -> list:
    """``domain`` with the extent of each loop that walks along a gathered (or scattered) row
    spelled as that array's run-time extent. With a constant trip count LLVM unrolls such a loop
    into scalar code; with a run-time one it vectorises the loop (2x on an embedding).
    ``spell(var, axis)`` is the source of that extent."""
    extents = list(domain)
    for g in [g for e in exprs for g in gathers(e)]:
        for axis, (pick, offset, row) in enumerate(zip(g.picks, g.imap.offsets, g.imap.coeffs)):
            steps = [j for j, c in enumerate(row) if c]
            if pick is None and offset == 0 and len(steps) == 1 and row[steps[0]] == 1 \
                    and isinstance(domain[steps[0]], int) and g.var.shape[axis] == domain[steps[0]]:
                extents[steps[0]] = spell(g.var, axis)
    return extents


@contextlib.contextmanager
def hoisting_loops(out: Source, body: Body, exprs, domain, order: list[int], opened=()):
    """Nested loops over the axes ``order`` of ``domain`` (outermost first; the axes ``opened`` are
    open already). Where loops remain inside, the largest subexpressions of ``exprs`` that depend
    only on the open loops are computed first (a gathered row's index, once per row rather than
    once per element: LLVM would not hoist it itself, as a store in the loop might change it)."""
    opened = list(opened)
    with contextlib.ExitStack() as scopes:
        for k in [None] + list(order):
            if k is not None:
                out.line(f"for {body.loop_vars[k]} in range({domain[k]}):")
                scopes.enter_context(out.indent())
                opened.append(k)
            if opened and len(opened) < len(domain):
                for e in exprs:
                    hoist(body, e, frozenset(opened))
        yield


def hoist(body: Body, e, opened: frozenset) -> None:
    """Compute ``e`` now if it depends only on the ``opened`` loops, else its largest parts that do."""
    axes = loop_axes(e)
    if axes is not None and axes <= opened:
        body.value(e)
    else:
        for child in e.children():
            hoist(body, child, opened)
