"""Codegen: render a replay plan as the Python source of one numba function.

Loop nests carry their fused scalar expressions as loop bodies, GEMMs go through
``lapack.gemm(a, b, out)`` (BLAS) into planned C-contiguous buffers (transposed operands as ``.T``
views, which BLAS takes as flags), reductions are loops with accumulators. Values are named
``v0, v1, ...`` in order of definition, so a plan always renders to the same text. Arrays of
shape () are passed as one-element vectors.
"""
from __future__ import annotations

import numpy as np

from ...runtime import kernels
from ...runtime import table
from ...native import vecmath
from ...ir.index import IndexMap, broadcast_map, element, loop_vars
from ...ir.program import BATCH, Namer, Var, literal
from .loopbody import Body, hoisting_loops, loop_invariants, loops, run_time_extents
from ...ir.loop import (Acc, Alias, Gemm, Lapack, Load, Nest, RangeCheck, RowNest, ScatterAdd, batched_input,
    internal_shape)
from ..memory import writes_reach_one_pointer
from ...ops.core import OPS
from ..plan import Plan
from ...runtime.step import OUT_OF_RANGE, Addresses
from ...util.source import Source

# No nnan/ninf: a NaN or inf in the data must reach the loss. `reassoc` lets LLVM vectorise
# reductions (4-12x on sums), `contract` allows fused multiply-add. No `nsz` either: with
# `reassoc` it licenses cancelling `x - x`, `x + -x` and `(x + y) - y`, which drops a NaN or inf.
FASTMATH = {"arcp", "contract", "afn", "reassoc"}
ENTRY = "step"
# The digest makes the text, and so the disk-cache key, change with the module's kernels.
LAPACK_IMPORT = f"from morphjit.native import lapack  # kernels {kernels.source_digest('lapack')}"
JIT = "fastmath={" + ", ".join(map(repr, sorted(FASTMATH))) + "}, error_model='numpy', boundscheck=False, nogil=True"
DECORATOR = f"@numba.njit({JIT})"
KERNEL_DECORATOR = f"@numba.njit({JIT}, no_cpython_wrapper=True, pipeline_class=NoAliasCompiler)"   # see kernels.NoAliasCompiler


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

    def scatter(self, ins: ScatterAdd) -> None:
        body = Body(self.out, self.names, loop_vars(len(ins.domain)), self.offsets)
        exprs = [ins.expr, *ins.at.children()]
        domain = self.loop_extents([ins.expr, ins.at], ins.domain)
        with hoisting_loops(self.out, body, exprs, domain, list(range(len(ins.domain)))):
            value = body.value(ins.expr)
            self.out.line(f"{body.gather(ins.at)} += {value}")

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
         Nest: Writer.nest, RowNest: Writer.rownest, ScatterAdd: Writer.scatter}


class StepWriter(Writer):
    """Renders a plan as a module: the step function, calling each loop nest as a kernel of
    ``morphjit.kernels`` (compiled once per text, shared by every step that runs it)."""

    LOAD = "kernels.load"   # what loads a kernel in the module

    def __init__(self, plan: Plan):
        super().__init__(Source(), Namer())
        self.plan = plan
        self.batched = batched_input(plan.inputs)    # the step reads the batch size from it
        # the run-time extents a kernel's loops may need, passed along
        self.extents = [BATCH] if self.batched is not None else []
        self.views = {id(v): first for v, first in same_views(plan)}
        outputs = {id(v): v for v in plan.outputs}
        # computed once: a kernel's names take them too
        self.same_names = {**{id(outputs[key]): src for key, src in plan.written_over.items()}, **self.views}
        self.arrays = self.step_arrays()
        self.addresses: set[str] = set()   # names that hold a data address, not an array

    def arguments(self) -> list:
        """Inputs, constants, the pooled buffers the step itself reads as arrays (as views), the
        `Addresses` of those only kernels read, and the outputs, in that order. One argument per
        pooled buffer made numba's compile time grow with their number squared."""
        plan = self.plan
        pooled = [v for i in plan.instructions for v in i.outs if id(v) in plan.slot_of]
        unique = list({id(v): v for v in pooled}.values())
        arrays = [v for v in unique if id(self.root(v)) in self.arrays]
        addressed = [v for v in unique if id(self.root(v)) not in self.arrays and self.root(v) is v]
        return list(plan.inputs) + [v for v, _ in plan.consts] + arrays + \
            ([Addresses(tuple(addressed))] if addressed else []) + list(plan.outputs)

    def root(self, v: Var) -> Var:
        """The pooled value whose name ``v`` takes (see `same_views`)."""
        return self.views.get(id(v), v)

    def step_arrays(self) -> set[int]:
        """The pooled values (by their roots) that the step's own statements read or write as
        arrays, and the sources of aliases they read; kernels need only their data addresses."""
        needed: set[int] = set()
        for ins in reversed(self.plan.instructions):
            if in_kernel(ins):
                continue
            if ins.kind == "alias":
                if id(self.root(ins.out)) in needed:
                    needed.add(id(self.root(ins.src)))
                continue
            needed |= {id(self.root(v)) for v in ins.reads() + ins.outs}
        return needed

    def source(self) -> str:
        out = self.out
        # An output written over an input is stored under the input's name: one array (one
        # pointer) to LLVM, as a kernel's noalias pointers require (kernels.NoAliasCompiler).
        arguments = self.arguments()
        arg_names = ["P" if isinstance(v, Addresses) else f"u{k}" if id(v) in self.plan.written_over
                     else self.names.name(v) for k, v in enumerate(arguments)]
        addressed = arguments[arg_names.index("P")].values if "P" in arg_names else ()
        self.addresses = {self.names.name(v) for v in addressed}
        self.alias_outputs(self.names)
        for ins in self.plan.instructions:   # a view of an addressed buffer is the same address
            if ins.kind == "alias" and self.names.name(ins.src) in self.addresses:
                self.names.same_as(ins.out, ins.src)
        counts = ", ".join(f"{n} {k}" for k, n in self.plan.counts().items())
        out.line(f"# morphjit step for program {self.plan.program.name!r}: {counts}; "
                 f"{len(self.plan.slots)} pool slots, {self.plan.workspace_bytes} workspace bytes")
        out.line(f"# inputs: {' '.join(str(v.type) for v in self.plan.inputs)}")
        out.line("import math")
        out.line("import numpy as np")
        out.line("import numba")
        out.line("from morphjit.runtime import kernels")
        out.line("from morphjit.native import vecmath as vm")
        out.line(f"from morphjit.native import npymath as npm  # {kernels.source_digest('npymath')}")
        if any(ins.kind == "check" for ins in self.plan.instructions):
            out.line("from morphjit.runtime import step as rt")
        if any(ins.kind == "lapack" for ins in self.plan.instructions):
            out.line(LAPACK_IMPORT)
        calls = self.kernels()
        out.line("")
        out.line("")
        out.line(DECORATOR)
        out.line(f"def {ENTRY}({', '.join(arg_names)}):")
        with out.indent():
            if self.batched is not None:
                out.line(f"{BATCH} = {self.names.name(self.batched)}.shape[0]")
            if addressed:
                out.line("# the data addresses of the pooled buffers only kernels use")
            for k, v in enumerate(addressed):
                out.line(f"{self.names.name(v)} = P[{k}]")
            for ins in self.plan.instructions:
                if id(ins) in calls:
                    out.line(calls[id(ins)])
                elif not (ins.kind == "alias" and self.names.name(ins.out) in self.addresses):
                    self.write(ins)
            out.line("return 0")
        return out.text()

    def alias_outputs(self, names: Namer) -> None:
        """Name each output written over an input as the input, each view as its slot's first."""
        names.aliases.update(self.same_names)

    def kernels(self) -> dict[int, str]:
        """Load a kernel per distinct loop nest text (``k0 = kernels.load(...)``); the calls to make,
        each a kernel's name and its arguments."""
        names: dict[str, str] = {}
        calls = {}
        for ins in self.plan.instructions:
            if not in_kernel(ins):
                continue
            writer = KernelWriter()
            self.alias_outputs(writer.names)
            writer.write(ins)
            params = writer.names.order
            if not writes_reach_one_pointer(self.plan, ins, params):
                raise AssertionError(f"a kernel would write memory it reaches through two pointers: {ins}")
            shapes = writer.array_shapes(ins, params)
            extents = self.extents + writer.parameters()
            text = kernel_source(writer.out.text(), params, shapes, extents, ins.kind == "gemm")
            if text not in names:
                names[text] = f"k{len(names)}"
                self.out.line(f"{names[text]} = {self.LOAD}(\'\'\'")
                self.out.block(text)
                self.out.line(f"\'\'\', {len(params)}, {len(extents)})")
            arguments = self.call_arguments(writer, [self.address(v) for v in params])
            calls[id(ins)] = f"{names[text]}({', '.join(arguments)})"
        return calls

    def call_arguments(self, writer: KernelWriter, pointers: list[str]) -> list[str]:
        """A kernel call's arguments: ``pointers``, the step's extents, the values of the
        kernel's extent and offset parameters."""
        return pointers + self.extents + [str(internal_shape(v.shape)[axis]) for v, axis in writer.shapes] + \
            list(map(str, writer.offset_values))

    def address(self, v: Var) -> str:
        name = self.names.name(v)
        return name if name in self.addresses else f"{name}.ctypes.data"


def in_kernel(ins) -> bool:
    """Whether the step calls ``ins`` as a kernel (loop nests, scatters and GEMMs) or writes it
    itself."""
    return bool(ins.nests()) or ins.kind in ("gemm", "scatter")


class KernelWriter(Writer):
    """Renders one loop nest as a kernel's body: arrays named ``a0, a1, ...``, each run-time
    extent it reads (see `run_time_extents`) a parameter ``n0, n1, ...`` and each nonzero offset
    of a load or store (a slice's start: the time step of an unrolled loop) a parameter ``o0, o1,
    ...``, all passed by the step, so that the nests of repeated layers and time steps share a text."""

    def __init__(self):
        super().__init__(Source(), Namer("a"))
        self.shapes: list[tuple[Var, int]] = []   # the array and axis of each extent parameter
        self.offset_values: list[int] = []        # the value of each offset parameter

    def run_time_extent(self, v: Var, axis: int) -> str:
        self.shapes.append((v, axis))
        return f"n{len(self.shapes) - 1}"

    def out_of_range(self, ins: RangeCheck, idx: list[str]) -> None:
        """A range check's failure in a table step: the value and its position into the error
        record, and 1 returned (see ``morphjit.table``)."""
        for k, x in enumerate(["value", *idx]):
            self.out.line(f"record[{k}] = {x}")
        self.out.line("return 1")

    def offsets(self, imap: IndexMap) -> IndexMap:
        return IndexMap(tuple(self.offset_parameter(o) if type(o) is int and o else o for o in imap.offsets),
                        imap.coeffs)

    def offset_parameter(self, value: int) -> str:
        self.offset_values.append(value)
        return f"o{len(self.offset_values) - 1}"

    def array_shapes(self, ins, params: list[Var]) -> list[tuple]:
        """The shape of each array in the kernel's text. A GEMM of matrices takes every extent as
        a parameter: one kernel per dtype and transposition serves all of them (numba takes longer
        over ``np.dot`` than over any loop nest)."""
        if ins.kind == "gemm" and not ins.out.shape[:-2]:
            return [tuple(Extent(self.run_time_extent(v, axis)) for axis in range(len(v.shape))) for v in params]
        return [tuple(Extent(e) for e in internal_shape(v.shape)) for v in params]

    def parameters(self) -> list[str]:
        """The kernel's integer parameters after the step's own extents."""
        return [f"n{k}" for k in range(len(self.shapes))] + [f"o{k}" for k in range(len(self.offset_values))]


class Extent(str):
    """An extent as source: ``B``, ``784*B`` or a number, spelled without quotes in a tuple."""

    def __repr__(self) -> str:
        return self


def kernel_source(body: str, params: list[Var], shapes: list[tuple], extents: list[str], lapack: bool = False,
                  record: bool = False) -> str:
    """A kernel's module text: each array a C-ordered view of its data pointer (with ``record``,
    the last pointer is a range check's error record), then ``body`` (which calls
    ``morphjit.lapack`` if ``lapack``)."""
    out = Source()
    if lapack:
        out.line(LAPACK_IMPORT)
    out.line(KERNEL_DECORATOR)
    pointers = [f"p{k}" for k in range(len(params) + record)]
    out.line(f"def {kernels.NAME}({', '.join(pointers + extents)}):")
    with out.indent():
        for k, (v, shape) in enumerate(zip(params, shapes)):
            out.line(f"a{k} = numba.carray(p{k}, {shape!r}, np.{np.dtype(v.dtype).type.__name__})")
        if record:
            out.line(f"record = numba.carray({pointers[-1]}, ({table.RECORD},), np.int64)")
        out.block(vecmath.pair_sin_cos(body))
        out.line("return 0")
    return out.text()


def same_views(plan: Plan):
    """Pooled values that are one view of one slot (same slot and type), each with the first such
    value. Named alike, a loop writing in place reads and writes one array, one pointer of its
    kernel: the kernel's pointers are marked noalias (``kernels.NoAliasCompiler``)."""
    first: dict = {}
    for ins in plan.instructions:
        for v in ins.outs:
            if id(v) in plan.slot_of and first.setdefault((plan.slot_of[id(v)], v.type), v) is not v:
                yield v, first[(plan.slot_of[id(v)], v.type)]


def render(plan: Plan) -> tuple[str, list[Var]]:
    """The module source of the unrolled step and the order of its arguments."""
    writer = StepWriter(plan)
    return writer.source(), writer.arguments()
