"""Table steps: the step of a large program as a table of kernel calls, run by one generic loop.

Numba's compile time of a step grows with its statements and, quadratically, with its array
arguments; a table step has neither. Its module (rendered by ``backend.codegen``) loads the program's
kernels and lists its calls as rows, ``k3(v5, v10, v4, v11, B)``: a kernel, the places of its
arrays' data addresses in the *frame*, then its integers (extents, offsets; polynomials in the batch
size ``B``). The step runs them with `run`, native code that is the same for every program (a few
lines of LLVM IR, built once per process): it writes the data addresses of the step's arrays into
the frame, then calls each row's kernel through its uniform entry ``i64 entry(i64* frame, i64*
row)``, a trampoline per kernel that loads the kernel's arguments and calls its C entry.

The frame (an int64 vector per workspace and batch size, see `Step.frame`) holds, in order: the
header (offset and end of the rows, the batch size), the data addresses of the step's arguments
(written at each call), those of the constants and pooled buffers, the error record of range
checks, then the rows, each ``[entry address, count, arguments...]``. Addresses are found in this
process (kernels' entries, buffers), never stored in the module text, which the disk cache keeps.

A range check is a kernel that returns 1 after writing the offending value and its position to the
error record; `run` returns the failing row, and `Step.call` raises the error in Python.
"""
from __future__ import annotations

import ctypes
import functools
import weakref
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import cpu_target

from ..backend import HEADER, RECORD
from ..ir import BATCH_SIZE, evaluate
from ..native import OUT_OF_RANGE
from . import kernels

B = BATCH_SIZE   # the batch size in the rows' integers

# CPython's and NumPy's object layouts, as their C macros read them (PyTuple_GET_SIZE,
# PyTuple_GET_ITEM, PyArray_DATA): ob_size follows the object header, the items follow the tuple
# header, an array's data pointer follows the object header.
SIZE_AT, ITEMS_AT, DATA_AT = object.__basicsize__, tuple.__basicsize__, object.__basicsize__

i64, i8 = ir.IntType(64), ir.IntType(8)
ENTRY = ir.FunctionType(i64, [i64.as_pointer(), i64.as_pointer()])   # a kernel's uniform entry


@dataclass(frozen=True)
class Row:
    """One call: ``kernel`` on the frame places ``pointers`` and the ``integers``."""
    kernel: "Kernel"
    pointers: tuple[int, ...]
    integers: tuple

    def words(self, batch: int) -> list[int]:
        args = [*self.pointers, *(evaluate(x, batch) for x in self.integers)]
        return [self.kernel.entry, len(args), *args]


@dataclass(frozen=True)
class Statistics:
    """Cache statistics, as a numba dispatcher keeps them."""
    cache_hits: dict
    cache_misses: dict


@dataclass(frozen=True)
class Check:
    """What a range-check kernel reports: ``what`` must lie in ``[low, extent)`` (both may be
    polynomials in ``B``); the error record holds the value and its ``ndim`` indices."""
    what: str
    error: str
    low: object
    extent: object
    ndim: int


class Kernel:
    """A kernel as a table calls it: ``k(pointers..., integers...)`` makes a row."""

    def __init__(self, source: str, pointers: int, extents: int, check: Check | None = None):
        loaded, self.origin = kernels.loaded(source, pointers, extents)
        self.pointers, self.check, self.function = pointers, check, loaded.function
        self.entry = entry_of(loaded, pointers, extents)

    def __call__(self, *args) -> Row:
        return Row(self, tuple(args[:self.pointers]), tuple(args[self.pointers:]))


def kernel(source: str, pointers: int, extents: int) -> Kernel:
    """The kernel ``source`` (see `kernels.load`) for rows of a table."""
    return Kernel(source, pointers, extents)


def check(source: str, pointers: int, extents: int, what: str, error: str, low, extent, ndim: int) -> Kernel:
    """A range-check kernel: its last pointer is the error record, its result 1 on failure."""
    return Kernel(source, pointers, extents, Check(what, error, low, extent, ndim))


class Step:
    """A program's table: the ``rows`` to run, after the frame places of the arrays' addresses
    (from `HEADER` to ``record_at``: the step's arguments, the constants and pooled buffers) and
    the error record (its address at ``record_at``, then its words)."""

    def __init__(self, record_at: int, rows: list[Row], namespace: dict):
        self.record_at, self.rows = record_at, rows
        self.namespace = namespace   # of its module, as a numba function's ``__globals__``
        self.rows_at = record_at + 1 + RECORD
        offsets = np.cumsum([self.rows_at] + [2 + len(r.pointers) + len(r.integers) for r in rows])
        self.row_at = {int(o): r for o, r in zip(offsets, rows)}
        self.stats = Statistics({}, {})

    def started(self) -> None:
        """Count the kernels this step's module compiled and loaded from disk as a dispatcher's
        cache misses and hits of its first call (which ``feedback`` reports as the step's)."""
        distinct = {id(row.kernel): row.kernel for row in self.rows}.values()
        for origin, counts in (("compiled", self.stats.cache_misses), ("disk", self.stats.cache_hits)):
            n = sum(k.origin == origin for k in distinct)
            if n:
                counts["kernels"] = n

    def frame(self, addresses: dict[int, int], batch: int) -> np.ndarray:
        """The frame at ``batch``, with the data ``addresses`` of the constants and pooled buffers
        (by frame place); the arguments' are written by each call."""
        words = [w for row in self.rows for w in row.words(batch)]
        frame = np.zeros(self.rows_at + len(words), np.int64)
        frame[:HEADER] = self.rows_at, len(frame), batch
        for place, address in addresses.items():
            frame[place] = address
        frame[self.record_at] = frame.ctypes.data + 8 * (self.record_at + 1)
        frame[self.rows_at:] = words
        return frame

    def caller(self, frame_at: int):
        """``call(*arrays)``: the step on the arrays it takes (the frame among them, at
        ``frame_at``), one native call; raises the error of a failed range check. The arrays
        must be NumPy arrays (the runtime's calls pass nothing else): their addresses are read
        from the objects."""
        native = run()

        def call(*arrays):
            failed = native(arrays, frame_at)
            if failed >= 0:
                raise self.error(arrays[frame_at], failed)
        return call

    def error(self, frame: np.ndarray, offset: int) -> Exception:
        """The error of the range check at row ``offset``, from the error record."""
        check = self.row_at[offset].kernel.check
        batch = int(frame[2])
        value, *position = frame[self.record_at + 1:self.record_at + 2 + check.ndim].tolist()
        return OUT_OF_RANGE[check.error](check.what, evaluate(check.low, batch), evaluate(check.extent, batch),
                                         value, *position)


# ---------------------------------------------------------------------------------------------
# The native code: the generic loop and the kernels' trampolines

_libraries: list = []   # the machine code, alive as long as the process


def compiled(module: ir.Module, name: str) -> int:
    """The address of function ``name`` of ``module``, compiled by numba's code generator (whose
    symbol table knows the kernels' C entries)."""
    with global_compiler_lock:
        library = cpu_target.target_context.codegen().create_library(name)
        library.add_ir_module(module)
        library.finalize()
        _libraries.append(library)
        return library.get_pointer_to_function(name)


_entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # loaded kernel -> its entry


def entry_of(loaded: kernels.Loaded, pointers: int, extents: int) -> int:
    """The uniform entry of a loaded kernel (a trampoline of its own: a kernel compiled again
    after it was released has another address)."""
    entry = _entries.get(loaded)
    if entry is None:
        entry = _entries[loaded] = trampoline(loaded.symbol, pointers, extents)
    return entry


def trampoline(symbol: str, pointers: int, extents: int) -> int:
    """The uniform entry of the kernel ``symbol`` taking ``pointers`` data pointers then
    ``extents`` integers: it loads them (a pointer from the frame place the row names, an integer
    from the row) and calls the kernel. Pointers are declared as integers, as the unrolled step
    passes them (the same machine type)."""
    count = pointers + extents
    module = ir.Module(f"{symbol}_entry")
    target = ir.Function(module, ir.FunctionType(i64, [i64] * count), symbol)
    entry = ir.Function(module, ENTRY, f"{symbol}_entry")
    frame, row = entry.args
    b = ir.IRBuilder(entry.append_basic_block())
    args = []
    for k in range(count):
        word = b.load(b.gep(row, [ir.Constant(i64, k)]))
        args.append(b.load(b.gep(frame, [word])) if k < pointers else word)
    b.ret(b.call(target, args))
    return compiled(module, entry.name)


@functools.cache
def run():
    """The generic step, ``run(arrays: tuple, frame_at: int) -> int``: the data address of each
    of ``arrays`` into the frame (``arrays[frame_at]``), then every row in order; the offset of
    the row whose kernel failed, or -1. Called through ctypes, which releases the GIL."""
    module = ir.Module("morphjit_table")
    fn = ir.Function(module, ir.FunctionType(i64, [i8.as_pointer(), i64]), "morphjit_table_run")
    arrays, frame_at = fn.args
    b = ir.IRBuilder(fn.append_basic_block("start"))

    def word(obj, at: int):
        return b.load(b.bitcast(b.gep(obj, [ir.Constant(i64, at)]), i64.as_pointer()))

    def item(k):   # the k-th object of the tuple
        items = b.bitcast(b.gep(arrays, [ir.Constant(i64, ITEMS_AT)]), i8.as_pointer().as_pointer())
        return b.load(b.gep(items, [k]))

    count = word(arrays, SIZE_AT)
    frame = b.inttoptr(word(item(frame_at), DATA_AT), i64.as_pointer())
    start = b.block
    gather, rows = fn.append_basic_block("gather"), fn.append_basic_block("rows")
    b.cbranch(b.icmp_signed(">", count, ir.Constant(i64, 0)), gather, rows)
    b.position_at_end(gather)
    k = b.phi(i64)
    k.add_incoming(ir.Constant(i64, 0), start)
    b.store(word(item(k), DATA_AT), b.gep(frame, [b.add(k, ir.Constant(i64, HEADER))]))
    k1 = b.add(k, ir.Constant(i64, 1))
    k.add_incoming(k1, gather)
    b.cbranch(b.icmp_signed("<", k1, count), gather, rows)

    b.position_at_end(rows)
    end = b.load(b.gep(frame, [ir.Constant(i64, 1)]))
    loop, call, failed, done = (fn.append_basic_block(n) for n in ("loop", "call", "failed", "done"))
    first = b.load(frame)
    b.branch(loop)
    b.position_at_end(loop)
    at = b.phi(i64)
    at.add_incoming(first, rows)
    b.cbranch(b.icmp_signed("<", at, end), call, done)
    b.position_at_end(call)
    entry = b.inttoptr(b.load(b.gep(frame, [at])), ENTRY.as_pointer())
    n = b.load(b.gep(frame, [b.add(at, ir.Constant(i64, 1))]))
    status = b.call(entry, [frame, b.gep(frame, [b.add(at, ir.Constant(i64, 2))])])
    at.add_incoming(b.add(at, b.add(n, ir.Constant(i64, 2))), call)
    b.cbranch(b.icmp_signed("!=", status, ir.Constant(i64, 0)), failed, loop)
    b.position_at_end(failed)
    b.ret(at)
    b.position_at_end(done)
    b.ret(ir.Constant(i64, -1))
    address = compiled(module, fn.name)
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.py_object, ctypes.c_int64)(address)
