"""Codegen: the writers that render a replay plan as Python source for numba. `Writer` renders
the instructions (one handler per instruction kind in `WRITE`) into a ``Source``; the step writer
(``step``) renders the module of the step that calls the kernels, the kernel writer (``kernel``)
one loop nest as a kernel's text, the table writer (``tablegen``) a large plan's step as a table.

Loop nests carry their fused scalar expressions as loop bodies (``loopbody``), GEMMs go through
``lapack.gemm(a, b, out)`` (BLAS) into planned C-contiguous buffers (transposed operands as ``.T``
views, which BLAS takes as flags), reductions are loops with accumulators. Values are named
``v0, v1, ...`` in order of definition, so a plan always renders to the same text. Arrays of
shape () are passed as one-element vectors.
"""
from __future__ import annotations

from ...ir import (OPS, Acc, Alias, Gemm, IndexMap, Lapack, Load, Namer, Nest, RangeCheck, RowNest, Scatter,
                   Var, broadcast_map, element, internal_shape, literal, loop_vars)
from ...native import OUT_OF_RANGE
from ...util import Source
from .loopbody import Body, hoisting_loops, loop_invariants, loops, run_time_extents

# No nnan/ninf: a NaN or inf in the data must reach the loss. `reassoc` lets LLVM vectorise
# reductions (4-12x on sums), `contract` allows fused multiply-add. No `nsz` either: with
# `reassoc` it licenses cancelling `x - x`, `x + -x` and `(x + y) - y`, which drops a NaN or inf.
FASTMATH = {"arcp", "contract", "afn", "reassoc"}
JIT = "fastmath={" + ", ".join(map(repr, sorted(FASTMATH))) + "}, error_model='numpy', boundscheck=False, nogil=True"


class Writer:
    """Renders instructions as statements into ``out``, naming arrays with ``names``."""

    def __init__(self, out: Source, names: Namer):
        self.out, self.names = out, names

    def write(self, ins) -> None:
        WRITE[type(ins)](self, ins)

    def rangecheck(self, ins: RangeCheck) -> None:
        idx = loop_vars(ins.values.ndim)
        with loops(self.out, ins.values.shape, idx):
            self.out.line(f"value = {element(self.names.name(ins.values), IndexMap.identity(len(idx)), idx)}")
            self.out.line(f"if value < {ins.low} or value >= {ins.extent}:")
            with self.out.indent():
                # The message is formatted in Python when the error is raised: str() of numbers in
                # compiled code costs numba a second of typing in a fresh process.
                self.out_of_range(ins, idx)

    def out_of_range(self, ins: RangeCheck, idx: list[str]) -> None:
        error = OUT_OF_RANGE[ins.error].__name__
        self.out.line(f"raise rt.{error}({ins.what!r}, {ins.low}, {ins.extent}, value, {', '.join(idx)})")

    def scatter(self, ins: Scatter) -> None:
        body = Body(self.out, self.names, loop_vars(len(ins.domain)), self.offsets)
        exprs = [ins.expr, *ins.at.children()]
        domain = self.loop_extents([ins.expr, ins.at], ins.domain)
        with hoisting_loops(self.out, body, exprs, domain, list(range(len(ins.domain)))):
            value = body.value(ins.expr)
            self.out.line(f"{body.gather(ins.at)} {'+=' if ins.accumulate else '='} {value}")

    def offsets(self, imap: IndexMap) -> IndexMap:
        """How a load or store spells ``imap``: here with its offsets as numbers."""
        return imap

    def loop_extents(self, exprs, domain) -> list:
        return run_time_extents(exprs, domain, self.run_time_extent)

    def run_time_extent(self, v: Var, axis: int) -> str:
        return f"{self.names.name(v)}.shape[{axis}]"

    def alias(self, ins: Alias) -> None:
        shape = internal_shape(ins.out.shape)
        self.out.line(f"{self.names.name(ins.out)} = {self.names.name(ins.src)}.reshape({shape!r})")

    def gemm(self, ins: Gemm) -> None:
        batch = ins.out.shape[:-2]
        idx = loop_vars(len(batch))
        operands = [self.operand(v, t, batch, idx) for v, t in ((ins.a, ins.a_transposed), (ins.b, ins.b_transposed))]
        target = self.names.name(ins.out) + (f"[{', '.join(idx)}]" if idx else "")
        with loops(self.out, batch, idx):
            self.out.line(f"lapack.gemm({operands[0]}, {operands[1]}, {target})")

    def operand(self, v: Var, transposed: bool, batch, idx) -> str:
        name = self.names.name(v)
        if len(v.shape) > 2:
            rows = broadcast_map(v.shape[:-2], batch).render(idx)
            name = f"{name}[{', '.join(rows)}]"
        return name + (".T" if transposed else "")

    def lapack(self, ins: Lapack) -> None:
        """A kernel of ``morphjit.lapack`` per batch element, on each operand's core."""
        batch = ins.batch
        idx = loop_vars(len(batch))
        args = [self.core(v, core, batch, idx) for v, core in zip(ins.inputs + (ins.out,), ins.core)]
        args += [f"{k}={v!r}" for k, v in ins.params]
        with loops(self.out, batch, idx):
            self.out.line(f"lapack.{ins.routine}({', '.join(args)})")

    def core(self, v: Var, core: int, batch, idx) -> str:
        """``v`` at the batch point ``idx``; a scalar result as a one-element slice."""
        name = self.names.name(v)
        rows = broadcast_map(v.shape[:len(v.shape) - core], batch).render(idx) if batch else []
        if core == 0 and rows:
            rows[-1] = f"{rows[-1]}:{rows[-1]} + 1"
        return f"{name}[{', '.join(rows)}]" if rows else name

    def nest(self, ins: Nest, bound: int = 0) -> None:
        """One loop nest: every value of the body first, then the stores, then the reductions.

        The loops of the first ``bound`` axes are already open (the rows of a row nest).
        """
        out, n, accs = self.out, len(ins.domain), ins.accumulations
        idx = loop_vars(n)
        axes = accs[0].axes if accs else ()
        kept = [k for k in range(n) if k not in axes]
        in_registers = kept == list(range(len(kept)))  # reduced axes innermost
        assert in_registers or not bound, "a row nest part accumulates in registers"
        targets = [element(self.names.name(a.out), IndexMap.identity(len(kept)), [idx[k] for k in kept])
                   for a in accs]
        if not in_registers:
            for a in accs:
                self.fill_loop(a.out, literal(OPS[a.op].start(a.out.dtype), a.out.dtype))
        outer = [k for k in (kept if in_registers else range(n)) if k >= bound]
        body = Body(out, self.names, idx, self.offsets)
        for e in loop_invariants(ins):
            body.value(e)
        accumulators = [f"acc{k}" if in_registers else targets[k] for k in range(len(accs))]
        exprs = [s.expr for s in ins.stores] + [a.expr for a in accs]
        domain = self.loop_extents(exprs, ins.domain)
        with hoisting_loops(out, body, exprs, domain, outer, range(bound)):
            if not in_registers:
                self.iteration(ins, body, idx, accumulators)
            else:
                for acc, a in zip(accumulators, accs):
                    out.line(f"{acc} = {literal(OPS[a.op].start(a.out.dtype), a.out.dtype)}")
                with hoisting_loops(out, body, exprs, domain, list(axes), outer + list(range(bound))):
                    self.iteration(ins, body, idx, accumulators)
                for acc, a, target in zip(accumulators, accs, targets):
                    out.line(f"{target} = {self.finished(a, acc, [idx[k] for k in kept])}")
        if not in_registers:
            for a in accs:
                if a.finish != Acc():
                    self.finish_loop(a)

    def iteration(self, ins: Nest, body: Body, idx: list[str], accumulators: list[str]) -> None:
        """The innermost body of a nest: every value, then the stores, then the accumulations."""
        values = []
        for s in ins.stores:
            values.append(body.value(s.expr))
            body.memo[Load(s.out, IndexMap.identity(len(ins.domain)))] = values[-1]
        terms = [body.value(a.expr) for a in ins.accumulations]
        for s, v in zip(ins.stores, values):
            self.out.line(f"{element(self.names.name(s.out), self.offsets(s.out_map), idx)} = {v}")
        for acc, a, x in zip(accumulators, ins.accumulations, terms):
            self.out.line(f"{acc} = {OPS[a.op].combine(acc, x)}")

    def rownest(self, ins: RowNest) -> None:
        """Shared outer loops; inside, each part's inner loops in order. A part over the rows
        alone that reduces them accumulates across the outer loops."""
        out, p = self.out, len(ins.prefix)
        idx = loop_vars(p)
        across = [a for part in ins.parts for a in part.accumulations if min(a.axes) < p]
        names = {id(a): f"racc{k}" for k, a in enumerate(across)}
        for a in across:
            out.line(f"{names[id(a)]} = {literal(OPS[a.op].start(a.out.dtype), a.out.dtype)}")
        with loops(out, ins.prefix, idx):
            for part in ins.parts:
                if any(id(a) in names for a in part.accumulations):
                    inner = loop_vars(len(part.domain) - p, start=p)
                    with loops(out, part.domain[p:], inner):
                        body = Body(out, self.names, idx + inner, self.offsets)
                        for a in part.accumulations:
                            x = body.value(a.expr)
                            out.line(f"{names[id(a)]} = {OPS[a.op].combine(names[id(a)], x)}")
                else:
                    self.nest(part, bound=p)
        for a in across:
            out.line(f"{element(self.names.name(a.out), IndexMap.identity(0), [])} = "
                     f"{self.finished(a, names[id(a)], [])}")

    def fill_loop(self, v: Var, value: str) -> None:
        idx = loop_vars(len(v.shape))
        with loops(self.out, v.shape, idx):
            self.out.line(f"{element(self.names.name(v), IndexMap.identity(len(idx)), idx)} = {value}")

    def finish_loop(self, a) -> None:
        idx = loop_vars(len(a.out.shape))
        target = element(self.names.name(a.out), IndexMap.identity(len(idx)), idx)
        with loops(self.out, a.out.shape, idx):
            self.out.line(f"{target} = {self.finished(a, target, idx)}")

    def finished(self, a, acc: str, idx: list[str]) -> str:
        """The finish expression of a reduction applied to its accumulator ``acc``."""
        body = Body(self.out, self.names, idx)
        body.memo[Acc()] = acc
        return body.value(a.finish)


WRITE = {RangeCheck: Writer.rangecheck, Alias: Writer.alias, Gemm: Writer.gemm, Lapack: Writer.lapack,
         Nest: Writer.nest, RowNest: Writer.rownest, Scatter: Writer.scatter}
