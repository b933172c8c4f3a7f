"""The step writer: a replay plan as the module of one numba function, the step, which calls
each loop nest as a kernel (``k0 = kernels.load(...)``: a kernel's text is the kernel writer's,
compiled once per text and shared, ``morphjit.runtime.kernels``) and runs the other instructions
itself. `render` gives the module's source and the order of its arguments."""
from __future__ import annotations

from ...ir import BATCH, Namer, Var, batched_input, internal_shape
from ...native import imports
from ...util import Source
from ..memory import writes_reach_one_pointer
from ..plan import Plan
from .arguments import Addresses
from .kernel import KernelWriter, kernel_source
from .writer import JIT, Writer

ENTRY = "step"   # the function a step's module defines
DECORATOR = f"@numba.njit({JIT})"


class StepWriter(Writer):
    """Renders a plan as a module: the step function, calling each loop nest as a kernel of
    ``morphjit.runtime.kernels`` (compiled once per text, shared by every step that runs it)."""

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
        out.line(imports.VECMATH)
        out.line(imports.NPYMATH)
        out.line(imports.SPECIAL)
        out.line(imports.SELECT)
        if any(ins.kind == "check" for ins in self.plan.instructions):
            out.line(imports.STEP_ERRORS)
        if any(ins.kind == "lapack" for ins in self.plan.instructions):
            out.line(imports.LAPACK)
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


def same_views(plan: Plan):
    """Pooled values that are one view of one slot (same slot and type), each with the first such
    value. Named alike, a loop writing in place reads and writes one array, one pointer of its
    kernel: the kernel's pointers are marked noalias (``runtime.kernels.NoAliasCompiler``)."""
    first: dict = {}
    for ins in plan.instructions:
        for v in ins.outs:
            if id(v) in plan.slot_of and first.setdefault((plan.slot_of[id(v)], v.type), v) is not v:
                yield v, first[(plan.slot_of[id(v)], v.type)]


def render(plan: Plan) -> tuple[str, list[Var]]:
    """The module source of the unrolled step and the order of its arguments."""
    writer = StepWriter(plan)
    return writer.source(), writer.arguments()
