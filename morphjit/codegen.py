"""Codegen: render a replay plan as the Python source of one numba function.

Loop nests carry their fused scalar expressions as loop bodies, GEMMs go through
``np.dot(a, b, out)`` into planned C-contiguous buffers (transposed operands as ``.T`` views,
which BLAS takes as flags), reductions are loops with accumulators. Values are named
``v0, v1, ...`` in order of definition, so a plan always renders to the same text. Arrays of
shape () are passed as one-element vectors.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
from pathlib import Path

import numpy as np

from . import kernels
from .indexing import IndexMap, broadcast_map, element, loop_vars
from .ir import BATCH, Constants, Namer, Var, literal
from .loopir import (Acc, Alias, Apply, Const, Gather, Gemm, Lapack, Load, Nest, OneHot, RangeCheck,
                     RowNest, ScatterAdd, batched_input, gather_indices, gathers, internal_shape, loop_axes)
from .ops import OPS
from .plan import Plan
from .runtime import OUT_OF_RANGE
from .source import Source

# No nnan/ninf: a NaN or inf in the data must reach the loss. `reassoc` lets LLVM vectorise
# reductions (4-12x on sums), `contract` allows fused multiply-add. No `nsz` either: with
# `reassoc` it licenses cancelling `x - x`, `x + -x` and `(x + y) - y`, which drops a NaN or inf.
FASTMATH = {"arcp", "contract", "afn", "reassoc"}
ENTRY = "step"


class Body:
    """Renders a loop-body expression DAG as local assignments, each subexpression once."""

    def __init__(self, out: Source, names: Namer, loop_vars: list[str]):
        self.out, self.names, self.loop_vars = out, names, loop_vars
        self.memo: dict = {}

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

    def load(self, e: Load) -> str:
        return element(self.names.name(e.var), e.imap, self.loop_vars)

    def gather(self, e: Gather) -> str:
        indices = gather_indices(e, self.loop_vars, lambda k, p: self.value(p))
        return f"{self.names.name(e.var)}[{', '.join(indices)}]"

    def one_hot(self, e: OneHot) -> str:
        (klass,) = e.klass.render(self.loop_vars)
        test = f"{self.value(e.labels)} == {klass}"
        return f"({test})" if e.dtype == np.bool_ else \
            f"({literal(1, e.dtype)} if {test} else {literal(0, e.dtype)})"

    def apply(self, e: Apply) -> str:
        args = [self.value(a) for a in e.args]
        return OPS[e.op].scalar(Constants(e.dtype), *args, **dict(e.params))


# How the body renders each kind of expression that is not a constant or an accumulator.
CODE = {Load: Body.load, Gather: Body.gather, OneHot: Body.one_hot, Apply: Body.apply}


def loop_invariants(ins: Nest) -> list:
    """The largest subexpressions of the nest's bodies that are the same on every iteration:
    reads of one element (a scalar buffer) of values the nest does not write, and arithmetic on
    them and on constants (``1 / B``). Computed once before the loops; read inside them, each
    load would be one LLVM must assume a store may change, which keeps it from vectorising."""
    outs = {id(v) for v in ins.outs}
    found: dict = {}

    def invariant(e) -> bool:
        rule = INVARIANT.get(type(e))  # other kinds (a one-hot, an accumulator) never are
        return rule is not None and rule(e, outs, invariant)

    def visit(e) -> None:
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
    into scalar code, since it cannot prove that the row does not overlap what the loop writes;
    with a run-time one it vectorises the loop behind an overlap check (2x on an embedding).
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


DECORATOR = ("@numba.njit(fastmath={" + ", ".join(map(repr, sorted(FASTMATH))) + "}, "
             "error_model='numpy', boundscheck=False, nogil=True)")


@functools.cache
def kernels_digest() -> str:
    """A digest of ``morphjit/lapack.py``, whose kernels a cached step has compiled in."""
    return hashlib.sha256((Path(__file__).parent / "lapack.py").read_bytes()).hexdigest()[:16]


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
                error = OUT_OF_RANGE[ins.error].__name__
                self.out.line(f"raise rt.{error}({ins.what!r}, {ins.low}, {ins.extent}, value, {', '.join(idx)})")

    def scatter(self, ins: ScatterAdd) -> None:
        body = Body(self.out, self.names, loop_vars(len(ins.domain)))
        exprs = [ins.expr, *ins.at.children()]
        domain = self.loop_extents([ins.expr, ins.at], ins.domain)
        with hoisting_loops(self.out, body, exprs, domain, list(range(len(ins.domain)))):
            value = body.value(ins.expr)
            self.out.line(f"{body.gather(ins.at)} += {value}")

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
            self.out.line(f"np.dot({operands[0]}, {operands[1]}, {target})")

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
                self.fill_loop(a.out, literal(OPS[a.op].init, a.out.dtype))
        outer = [k for k in (kept if in_registers else range(n)) if k >= bound]
        body = Body(out, self.names, idx)
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
                    out.line(f"{acc} = {literal(OPS[a.op].init, a.out.dtype)}")
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
            self.out.line(f"{element(self.names.name(s.out), s.out_map, idx)} = {v}")
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
            out.line(f"{names[id(a)]} = {literal(OPS[a.op].init, a.out.dtype)}")
        with loops(out, ins.prefix, idx):
            for part in ins.parts:
                if any(id(a) in names for a in part.accumulations):
                    inner = loop_vars(len(part.domain) - p, start=p)
                    with loops(out, part.domain[p:], inner):
                        body = Body(out, self.names, idx + inner)
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
         Nest: Writer.nest, RowNest: Writer.rownest, ScatterAdd: Writer.scatter}


class StepWriter(Writer):
    """Renders a plan as a module: the step function, calling each loop nest as a kernel of
    ``morphjit.kernels`` (compiled once per text, shared by every step that runs it)."""

    def __init__(self, plan: Plan):
        super().__init__(Source(), Namer())
        self.plan = plan
        self.batched = batched_input(plan.inputs)    # the step reads the batch size from it
        # the run-time extents a kernel's loops may need, passed along
        self.extents = [BATCH] if self.batched is not None else []

    def arguments(self) -> list[Var]:
        """Inputs, constants, the pooled buffers (as views) and the outputs, in that order."""
        plan = self.plan
        pooled = [v for i in plan.instructions for v in i.outs if id(v) in plan.slot_of]
        unique = list({id(v): v for v in pooled}.values())
        return list(plan.inputs) + [v for v, _ in plan.consts] + unique + list(plan.outputs)

    def source(self) -> str:
        out = self.out
        # An output written over an input is stored under the input's name, so LLVM sees one
        # array (the same pointer), not two it must check for overlap before vectorising.
        arg_names = [f"u{k}" if id(v) in self.plan.written_over else self.names.name(v)
                     for k, v in enumerate(self.arguments())]
        self.alias_outputs(self.names)
        counts = ", ".join(f"{n} {k}" for k, n in self.plan.counts().items())
        out.line(f"# morphjit step for program {self.plan.program.name!r}: {counts}; "
                 f"{len(self.plan.slots)} pool slots, {self.plan.workspace_bytes} workspace bytes")
        out.line(f"# inputs: {' '.join(str(v.type) for v in self.plan.inputs)}")
        out.line("import math")
        out.line("import numpy as np")
        out.line("import numba")
        out.line("from morphjit import kernels")
        out.line("from morphjit import vecmath as vm")
        if any(ins.kind == "check" for ins in self.plan.instructions):
            out.line("from morphjit import runtime as rt")
        if any(ins.kind == "lapack" for ins in self.plan.instructions):
            # The kernels' digest makes the text, and so the disk-cache key, change with them.
            out.line(f"import morphjit.lapack as lapack  # kernels {kernels_digest()}")
        calls = self.kernels()
        out.line("")
        out.line("")
        out.line(DECORATOR)
        out.line(f"def {ENTRY}({', '.join(arg_names)}):")
        with out.indent():
            if self.batched is not None:
                out.line(f"{BATCH} = {self.names.name(self.batched)}.shape[0]")
            for ins in self.plan.instructions:
                if id(ins) in calls:
                    out.line(calls[id(ins)])
                else:
                    self.write(ins)
            out.line("return 0")
        return out.text()

    def alias_outputs(self, names: Namer) -> None:
        outputs = {id(v): v for v in self.plan.outputs}
        for key, src in self.plan.written_over.items():
            names.same_as(outputs[key], src)
        for v, first in same_views(self.plan):
            names.same_as(v, first)

    def kernels(self) -> dict[int, str]:
        """Load a kernel per distinct loop nest text (``k0 = kernels.load(...)``); the calls to make,
        each a kernel's name and its arguments."""
        names: dict[str, str] = {}
        calls = {}
        for ins in self.plan.instructions:
            if not ins.nests():
                continue
            writer = KernelWriter()
            self.alias_outputs(writer.names)
            writer.write(ins)
            params = writer.names.order
            extents = self.extents + [f"n{k}" for k in range(len(writer.shapes))]
            text = kernel_source(writer.out.text(), params, extents)
            if text not in names:
                names[text] = f"k{len(names)}"
                self.out.line(f"{names[text]} = kernels.load(\'\'\'")
                self.out.block(text)
                self.out.line(f"\'\'\', {len(params)}, {len(extents)})")
            arguments = [f"{self.names.name(v)}.ctypes" for v in params] + self.extents + \
                [f"{self.names.name(v)}.shape[{axis}]" for v, axis in writer.shapes]
            calls[id(ins)] = f"{names[text]}({', '.join(arguments)})"
        return calls


class KernelWriter(Writer):
    """Renders one loop nest as a kernel's body: arrays named ``a0, a1, ...``, and each run-time
    extent it reads (see `run_time_extents`) a parameter ``n0, n1, ...`` the step passes."""

    def __init__(self):
        super().__init__(Source(), Namer("a"))
        self.shapes: list[tuple[Var, int]] = []   # the array and axis of each extent parameter

    def run_time_extent(self, v: Var, axis: int) -> str:
        self.shapes.append((v, axis))
        return f"n{len(self.shapes) - 1}"


class Extent(str):
    """An extent as source: ``B``, ``784*B`` or a number, spelled without quotes in a tuple."""

    def __repr__(self) -> str:
        return self


def kernel_source(body: str, params: list[Var], extents: list[str]) -> str:
    """A kernel's module text: each array a C-ordered view of its data pointer, then ``body``."""
    out = Source()
    out.line(DECORATOR)
    out.line(f"def {kernels.NAME}({', '.join([f'p{k}' for k in range(len(params))] + extents)}):")
    with out.indent():
        for k, v in enumerate(params):
            shape = tuple(Extent(e) for e in internal_shape(v.shape))
            out.line(f"a{k} = numba.carray(p{k}, {shape!r}, np.{np.dtype(v.dtype).type.__name__})")
        out.block(body)
        out.line("return 0")
    return out.text()


def same_views(plan: Plan):
    """Pooled values that are one view of one slot (same slot and type), each with the first such
    value. Named alike, a loop writing in place reads and writes one array in LLVM's eyes, not two
    whose overlap it checks at run time (the check fails, and the scalar loop runs)."""
    first: dict = {}
    for ins in plan.instructions:
        for v in ins.outs:
            if id(v) in plan.slot_of and first.setdefault((plan.slot_of[id(v)], v.type), v) is not v:
                yield v, first[(plan.slot_of[id(v)], v.type)]


def render(plan: Plan) -> tuple[str, list[Var]]:
    """The module source of the step and the order of its arguments."""
    writer = StepWriter(plan)
    return writer.source(), writer.arguments()
