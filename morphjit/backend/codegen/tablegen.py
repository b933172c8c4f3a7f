"""The table writer: a large plan's step as a table (see ``morphjit.runtime.table``), whose module
loads its kernels and lists its calls as rows, arrays named by the frame places of their data
addresses. `render` picks the step's form: a table from `TABLE_FROM` instructions on, else the
unrolled step of the step writer.
"""
from __future__ import annotations

import numpy as np

from ...ir import Var
from ...util import config
from ..plan import Plan
from .arguments import HEADER, RECORD, Frame
from .kernel import KernelWriter, kernel_source
from .step import ENTRY, StepWriter, in_kernel

# Instructions from which a step is a table (see `table_form`). A table call costs about 0.4 us
# more than an unrolled step's (a ctypes call; 6% of the tiny MLP's 6 us) and saves numba's compile
# of the step (about 10 ms per instruction, growing with the arguments). From 48 instructions a
# call makes 48 kernel calls and takes tens of microseconds, so the 0.4 us is about 1%, while the
# unrolled step would cost half a second of compile and more; the benchmarks' programs (at most 22
# instructions) stay unrolled.
TABLE_FROM = 48


class TableWriter(StepWriter):
    """Renders a large plan as a table step (see ``morphjit.runtime.table``): its kernels, then a row per
    kernel call or range check, arrays named by the frame places of their data addresses."""

    LOAD = "table.kernel"

    def arguments(self) -> list:
        """Inputs, the `Frame` (with the constants' and pooled buffers' addresses), outputs."""
        plan = self.plan
        pooled = {id(v): v for i in plan.instructions for v in i.outs if id(v) in plan.slot_of and self.root(v) is v}
        first = HEADER + len(plan.inputs) + 1 + len(plan.outputs)
        return [*plan.inputs, Frame((*(v for v, _ in plan.consts), *pooled.values()), first), *plan.outputs]

    def address(self, v: Var) -> str:
        return self.names.name(v)

    def source(self) -> str:
        out, plan = self.out, self.plan
        self.alias_outputs(self.names)
        for ins in plan.instructions:   # a reshaped array has the same address
            if ins.kind == "alias":
                self.names.same_as(ins.out, ins.src)
        arguments = self.arguments()
        frame = arguments[len(plan.inputs)]
        counts = ", ".join(f"{n} {k}" for k, n in plan.counts().items())
        out.line(f"# morphjit step for program {plan.program.name!r}: {counts}; "
                 f"{len(plan.slots)} pool slots, {plan.workspace_bytes} workspace bytes; a table of calls")
        out.line(f"# inputs: {' '.join(str(v.type) for v in plan.inputs)}")
        out.line("from morphjit.runtime import table")
        taken: set[str] = set()
        n_in = len(plan.inputs)
        groups = [(HEADER, arguments[:n_in], "inputs"),
                  (HEADER + n_in + 1, arguments[n_in + 1:], f"outputs (the frame's own is {HEADER + n_in})"),
                  (frame.first, frame.values, "constants and pooled buffers")]
        names = [[self.place(v, taken) for v in values] for _, values, _ in groups]
        calls = {**self.kernels(), **self.checks()}
        out.line("")
        out.line("# the frame places of the arrays' data addresses")
        for (first, _, what), group in zip(groups, names):
            if group:
                out.line(f"{', '.join(group)}, = range({first}, {first + len(group)})   # {what}")
        out.line(f"E = {frame.first + len(frame.values)}   # the error record of range checks")
        out.line("B = table.B")
        out.line("")
        out.line(f"{ENTRY} = table.Step(E, [")
        with out.indent():
            for ins in plan.instructions:
                if id(ins) in calls:
                    out.line(calls[id(ins)] + ",")
        out.line("], globals())")
        return out.text()

    def place(self, v: Var, taken: set[str]) -> str:
        """The name of ``v``'s place, or ``_`` where ``v`` takes another's name (an output written
        over an input)."""
        name = self.names.name(v)
        if name in taken:
            return "_"
        taken.add(name)
        return name

    def checks(self) -> dict[int, str]:
        """Load a range-check kernel per check (``c0 = table.check(...)``); the rows to run."""
        calls = {}
        for ins in self.plan.instructions:
            if ins.kind != "check":
                continue
            writer = KernelWriter()
            writer.rangecheck(ins)
            params = writer.names.order
            extents = self.extents + writer.parameters()
            text = kernel_source(writer.out.text(), params, writer.array_shapes(ins, params), extents, record=True)
            name = f"c{len(calls)}"
            self.out.line(f"{name} = table.check(\'\'\'")
            self.out.block(text)
            self.out.line(f"\'\'\', {len(params) + 1}, {len(extents)}, {ins.what!r}, {ins.error!r}, "
                          f"{ins.low}, {ins.extent}, {ins.values.ndim})")
            calls[id(ins)] = f"{name}({', '.join(self.call_arguments(writer, [*map(self.address, params), 'E']))})"
        return calls


def table_form(plan: Plan) -> bool:
    """Whether the step of ``plan`` is a table (see ``morphjit.runtime.table``): from
    ``MORPHJIT_TABLE_STEP`` instructions on, when every instruction is a kernel, a range check of
    integers (whose position the error record holds) or an alias."""
    return len(plan.instructions) >= config.table_step(TABLE_FROM) and all(
        in_kernel(ins) or ins.kind == "alias"
        or ins.kind == "check" and np.issubdtype(ins.values.dtype, np.integer) and ins.values.ndim < RECORD
        for ins in plan.instructions)


def render(plan: Plan) -> tuple[str, list[Var]]:
    """The module source of the step (a table or unrolled) and the order of its arguments."""
    writer = (TableWriter if table_form(plan) else StepWriter)(plan)
    return writer.source(), writer.arguments()
