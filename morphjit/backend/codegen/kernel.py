"""The kernel writer: one loop nest (or scatter, GEMM, range check) as the text of a kernel, a
numba function of its own compiled once per text and shared by every step that calls it
(``morphjit.runtime.kernels``): its arrays come in as data pointers, the run-time extents and
offsets it reads as integer parameters, so that the nests of repeated layers and time steps share
a text."""
from __future__ import annotations

import numpy as np

from ...ir import IndexMap, Namer, RangeCheck, Var, internal_shape
from ...native import imports, vecmath
from ...util import Source
from .arguments import RECORD
from .writer import JIT, Writer

KERNEL = "kernel"   # the function a kernel's source defines
# The kernel's module provides the compiler class (``morphjit.runtime.kernels.NoAliasCompiler``).
KERNEL_DECORATOR = f"@numba.njit({JIT}, no_cpython_wrapper=True, pipeline_class=NoAliasCompiler)"


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
        record, and 1 returned (see ``morphjit.runtime.table``)."""
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
    ``morphjit.native.lapack`` if ``lapack``)."""
    out = Source()
    if lapack:
        out.line(imports.LAPACK)
    out.line(KERNEL_DECORATOR)
    pointers = [f"p{k}" for k in range(len(params) + record)]
    out.line(f"def {KERNEL}({', '.join(pointers + extents)}):")
    with out.indent():
        for k, (v, shape) in enumerate(zip(params, shapes)):
            out.line(f"a{k} = numba.carray(p{k}, {shape!r}, np.{np.dtype(v.dtype).type.__name__})")
        if record:
            out.line(f"record = numba.carray({pointers[-1]}, ({RECORD},), np.int64)")
        out.block(vecmath.pair_sin_cos(body))
        out.line("return 0")
    return out.text()
