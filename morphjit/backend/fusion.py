"""Fusion: decide which values get a buffer; every other value is recomputed in its consumers.

A value that is not materialised is inlined, through its index function, into the loop of each
consumer (MoA psi-composition), so a connected region of element-wise ops and views becomes one
loop nest, across forward and backward alike, and the element-wise producers of a reduction run
inside the reduction loop.

Cost rule for a value computed more than once per element (it has several consumers, or a
consumer reads it through a broadcast): it is recomputed while its inlined expression is cheap
(at most ``RECOMPUTE_LIMIT`` arithmetic ops; each op's ``cost`` in the op table says what it
counts: a transcendental function or a division counts ``ir.EXPENSIVE``), and materialised once
otherwise. Broadcast reads along inner loops are loop invariants that LLVM hoists, so cheap ones
cost little. An inlined expression is at most half ``ir.DEPTH_LIMIT`` ops deep (a builtin ``sum``
of 10,000 terms is a chain of adds): deeper, a value gets a buffer (the rest of the limit is for
what the loop rewrites compose, `selection.inline_private_stores`).
"""
from __future__ import annotations

from collections import defaultdict

from ..ir import (DEPTH_LIMIT, ELEMENTWISE, LINALG, MATMUL, OPS, REDUCE, SOURCE, STRUCTURAL, Binding, Program,
                  Var, is_unit_reshape, magnitude)

RECOMPUTE_LIMIT = 4
KERNELS = (MATMUL, REDUCE, STRUCTURAL, LINALG)


def regroups_axes(b: Binding) -> bool:
    """A reshape that is not an index map (it merges or splits axes)."""
    return b.op == "reshape" and not is_unit_reshape(b.inputs[0].shape, b.out.shape)


def blas_transpose_source(b: Binding | None) -> Var | None:
    """If ``b`` swaps the last two axes (a transpose BLAS takes as a flag), the value it reads."""
    if b is None or b.op != "transpose":
        return None
    perm = b.kwargs["perm"]
    n = len(perm)
    swapped = n >= 2 and tuple(perm) == tuple(range(n - 2)) + (n - 1, n - 2)
    return b.inputs[0] if swapped else None


class Fusion:
    """The materialisation decisions for one (lowered) program."""

    def __init__(self, program: Program):
        self.program = program
        self.producer = {id(b.out): b for b in program.bindings}
        self.consumers: dict[int, list[Binding]] = defaultdict(list)
        for b in program.bindings:
            for x in b.inputs:
                if isinstance(x, Var):
                    self.consumers[id(x)].append(b)
        self.outputs = {id(v) for v in program.outputs}
        self.roots = {id(v) for v in program.inputs} | {id(v) for v, _ in program.consts} | self.outputs
        # Reshapes that become free views of their operand's (contiguous) buffer.
        self.aliases = {id(b.out) for b in program.bindings if regroups_axes(b)}
        self.roots |= {id(b.out) for b in program.bindings if OPS[b.op].kind in KERNELS} | self.aliases
        # Class labels get a buffer, which the plan range-checks before a one-hot reads it.
        self.roots |= {id(b.inputs[0]) for b in program.bindings if b.op == "one_hot"}
        self._facts: dict[int, tuple[bool, int, int]] = {}   # id(value) -> (reads buffers, cost, depth)
        while self._grow_roots():
            pass

    def is_root(self, v: Var) -> bool:
        return id(v) in self.roots

    def is_alias(self, v: Var) -> bool:
        return id(v) in self.aliases

    def _grow_roots(self) -> bool:
        before = len(self.roots)
        for b in self.program.bindings:
            for x in self._needed_buffers(b):
                source = self.producer.get(id(x))
                if source is not None and source.op == "reshape" and not self.is_root(x):
                    self.aliases.add(id(x))  # a reshaped BLAS operand: view it, do not copy it
                    self._add_root(source.inputs[0])
                self._add_root(x)
            if id(b.out) not in self.roots and (self._worth_materialising(b) or self._depth(b.out) > DEPTH_LIMIT // 2):
                self._add_root(b.out)
        return len(self.roots) != before

    def _add_root(self, v: Var) -> None:
        if id(v) not in self.roots:
            self.roots.add(id(v))
            self._facts.clear()

    def _needed_buffers(self, b: Binding) -> list[Var]:
        """Operands that must be arrays: BLAS and LAPACK operands, the source of an alias, what an op
        reads from buffers (a gather's source and index arrays), the arithmetic operands of an exact
        comparison of two values (so that every loop reading them sees the same bits)."""
        if self.is_alias(b.out):
            return [b.inputs[0]]
        if OPS[b.op].kind == LINALG:
            return [x for x in b.inputs if isinstance(x, Var)]
        if OPS[b.op].exact and all(isinstance(x, Var) for x in b.inputs):
            return [self.beneath_views(x) for x in b.inputs if self.cost(x) > 0]
        if OPS[b.op].buffered is not None:
            return [x for x in OPS[b.op].buffered(b, self.producer) if isinstance(x, Var)]
        if OPS[b.op].kind != MATMUL:
            return []
        needed = []
        for x in b.inputs:
            source = None if self.is_root(x) else blas_transpose_source(self.producer.get(id(x)))
            needed.append(source if source is not None else x)
        return needed

    def _worth_materialising(self, b: Binding) -> bool:
        kind = OPS[b.op].kind
        if kind not in (ELEMENTWISE, SOURCE):
            return False
        if not self.reads_buffers(b.out):
            return False  # a constant expression (1 / the batch size): hoisted out of any loop
        users = self.consumers[id(b.out)]
        repeated = len(users) > 1 or any(magnitude(u.out.type.size) > magnitude(b.out.type.size) for u in users)
        return repeated and self.cost(b.out) > RECOMPUTE_LIMIT

    def beneath_views(self, v: Var) -> Var:
        """The value the views that make ``v`` read (``v`` itself when it is not a view): storing
        it fixes ``v``'s bits without copying, say, every window of a pooling."""
        b = self.producer.get(id(v))
        while b is not None and OPS[b.op].index_map is not None and not self.is_root(v):
            v = b.inputs[0]
            b = self.producer.get(id(v))
        return v

    def reads_buffers(self, v: Var) -> bool:
        """Whether recomputing ``v`` reads a buffer (else it is a constant expression)."""
        return self._facts_of(v)[0]

    def cost(self, v: Var) -> int:
        """Arithmetic ops needed to recompute one element of ``v`` from buffers."""
        return self._facts_of(v)[1]

    def _depth(self, v: Var) -> int:
        """How many ops deep ``v``'s inlined expression is."""
        return self._facts_of(v)[2]

    def _facts_of(self, v: Var) -> tuple[bool, int, int]:
        """`reads_buffers`, `cost` and `_depth` of ``v``, found without recursion (memoised until
        the roots change)."""
        facts, stack = self._facts, [v]
        while stack:
            x = stack[-1]
            if id(x) in facts:
                stack.pop()
            elif self.is_root(x):
                facts[id(x)] = (True, 0, 0)
            else:
                b = self.producer[id(x)]
                inputs = [i for i in b.inputs if isinstance(i, Var)]
                missing = [i for i in inputs if id(i) not in facts]
                if missing:
                    stack.extend(missing)
                    continue
                own = OPS[b.op].cost if OPS[b.op].kind == ELEMENTWISE else 0
                found = [facts[id(i)] for i in inputs]
                facts[id(x)] = (OPS[b.op].kind != SOURCE and any(f[0] for f in found),
                                own + sum(f[1] for f in found), 1 + max((f[2] for f in found), default=0))
        return facts[id(v)]
