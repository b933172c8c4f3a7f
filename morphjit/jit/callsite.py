"""The compiled steps of one function by call signature (`CallSite`, shared by compiled losses,
functions and training steps): a signature's step is found by its leaves' shapes and dtypes, a
polymorphic step serves every batch size (`StepsByShape`), one thread compiles a new signature
while the others wait, and the calls are counted without a lock (`Tally`, `CallStats`)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..cache import loaded_from_disk
from ..ir import Specialize
from ..tracing import storage
from ..util import MorphjitError, ShapeError, pytree
from .checks import ArgSpec, argument_paths, is_plain_array

SPECIALISED = "specialised"   # a signature whose program needs the concrete batch size


def data_arrays(leaves, params) -> list[int]:
    """The indices of the leaves that are data arrays with a leading axis (not ``params``)."""
    return [k for k, x in enumerate(leaves) if k not in params and isinstance(x, np.ndarray) and x.ndim]


def batched_leaves(leaves, params) -> frozenset[int]:
    """The data leaves whose leading extent is the batch size: that of the first data array.
    A data array with another leading extent keeps it concrete. A batch of one is traced with
    concrete shapes: NumPy gives an extent of 1 a meaning of its own (``squeeze()`` drops it,
    broadcasting stretches it), which a symbolic batch size, taken to be another, would lose."""
    data = data_arrays(leaves, params)
    if not data or leaves[data[0]].shape[0] == 1:
        return frozenset()
    batch = leaves[data[0]].shape[0]
    return frozenset(k for k in data if leaves[k].shape[0] == batch)


def shape_key(treedef, leaves, batched) -> tuple:
    """A call's signature with the batch size left out: the key of a polymorphic step."""
    return treedef, tuple((None,) + x.shape[1:] + (x.dtype,) + layout_tag(x) if k in batched else leaf_signature(x)
                          for k, x in enumerate(leaves))


def layout_tag(leaf) -> tuple:
    """``()`` for an array NumPy treats as C-ordered, else ``("F",)`` or ``("unknown",)``: NumPy's
    results (``x * 1.0``, ``np.copy``) keep an input's order, which decides whether a later
    reshape is a view, so a traced step holds for one layout."""
    layout = storage.layout_of(leaf)
    return () if layout == "C" else (layout,)


def batch_mismatch(fn, spec: ArgSpec, leaves) -> ShapeError | None:
    """The error to raise when data arguments disagree on their leading (batch) extent."""
    paths = argument_paths(fn, spec.treedef)
    data = [(paths[k], leaves[k].shape[0]) for k in data_arrays(leaves, spec.params)]
    other = next(((p, n) for p, n in data if n != data[0][1]), None)
    if other is None:
        return None
    return ShapeError(f"{data[0][0]} has {data[0][1]} rows but {other[0]} has {other[1]}: data "
                      f"arguments share their leading (batch) dimension")


class StepsByShape:
    """Compiled steps by call signature without the batch size. A polymorphic step serves every
    batch size; a signature whose program needs the concrete size is marked SPECIALISED, and
    each of its concrete signatures gets a step of its own."""

    def __init__(self, static_shapes: bool):
        self.static_shapes = static_shapes
        self.steps: dict = {}

    def batched(self, spec: ArgSpec, leaves) -> frozenset[int]:
        return frozenset() if self.static_shapes else batched_leaves(leaves, spec.params)

    def find(self, spec: ArgSpec, leaves, batched):
        step = self.steps.get(shape_key(spec.treedef, leaves, batched))
        return None if step is SPECIALISED else step

    def build(self, fn, spec: ArgSpec, leaves, batched, compile):
        """``compile(batched)``: polymorphic where the program allows, else specialised."""
        key = shape_key(spec.treedef, leaves, batched)
        if batched and self.steps.get(key) is not SPECIALISED:
            try:
                step = self.steps[key] = compile(batched)
                return step
            except (Specialize, MorphjitError):
                self.steps[key] = SPECIALISED
        try:
            return compile(frozenset())
        except MorphjitError as error:
            mismatch = batch_mismatch(fn, spec, leaves)
            if mismatch is None:
                raise
            raise mismatch from error


class CallSite:
    """The compiled steps of one function by call signature, shared by `CompiledLoss` and
    `train.TrainStep`: steps by leaf signature (several may share a polymorphic step, see
    `StepsByShape`), the lock under which one thread compiles a new signature while the others
    calling with it wait, the call statistics, and the generated fast path of the step called last."""

    def __init__(self, static_shapes: bool):
        self.by_leaves: dict = {}       # a call's leaf signatures -> its step
        self.shapes = StepsByShape(static_shapes)
        self.hits, self.misses = Tally(), Tally()
        self.fast = None                # the fast path of the step called last, or None
        self.compiling = threading.RLock()

    def forget(self) -> None:
        """Drop every compiled step (the next call of each signature compiles); statistics stay."""
        with self.compiling:
            self.by_leaves, self.shapes, self.fast = {}, StepsByShape(self.shapes.static_shapes), None

    def find(self, args):
        """The step of ``args``' leaf signature (None if there is none yet) and their leaves."""
        leaves = []
        return self.by_leaves.get(pytree.keyed_flatten(args, leaves, leaf_signature)), leaves

    def step(self, args, new, count=True):
        """The step for ``args`` and their leaves; a new leaf signature gets ``new(leaves)``
        (which uses `of_shapes`), called by one thread while the others wait for its step."""
        leaves = []
        key = pytree.keyed_flatten(args, leaves, leaf_signature)
        step = self.by_leaves.get(key)
        if step is None:
            with self.compiling:
                step = self.by_leaves.get(key)
                if step is None:
                    step = self.by_leaves[key] = new(leaves)
                    return step, leaves
        self.hits.add(count)
        return step, leaves

    def of_shapes(self, fn, spec: ArgSpec, leaves, compile, count=True, on_miss=lambda: None):
        """The step for a new leaf signature: the polymorphic step that serves it at another batch
        size (a hit), or ``compile(batched)`` (a miss; see `StepsByShape.build`)."""
        batched = self.shapes.batched(spec, leaves)
        step = self.shapes.find(spec, leaves, batched)
        if step is not None:
            self.hits.add(count)
            return step
        self.misses.add(count)
        on_miss()
        return self.shapes.build(fn, spec, leaves, batched, compile)

    def steps(self) -> list:
        """The compiled steps, each once (a polymorphic step serves several leaf signatures)."""
        return list({id(s): s for s in list(self.by_leaves.values())}.values())   # a snapshot: others may add

    def stats(self, kernel_of) -> CallStats:
        """The call statistics; ``kernel_of(step)`` is its dispatcher, or None (interp)."""
        steps = self.steps()
        signatures = tuple(" ".join(str(v.type) for v in s.program.inputs) for s in steps)
        loads = sum(k is not None and loaded_from_disk(k) for k in map(kernel_of, steps))
        return CallStats(self.hits.value, self.misses.value, signatures, loads)


class Tally:
    """A count that threads add to without a lock and without losing an addition: each thread
    adds to a cell of its own (``+=`` on a shared int is a read and a write another thread's
    addition can fall between); the value is the sum of the cells."""

    __slots__ = ("local", "cells")

    def __init__(self):
        self.local = threading.local()
        self.cells: list[list[int]] = []

    def add(self, n: int = 1) -> None:
        try:
            self.local.cell[0] += n
        except AttributeError:   # this thread's first addition
            cell = self.local.cell = [n]
            self.cells.append(cell)   # list.append is atomic

    @property
    def value(self) -> int:
        return sum(cell[0] for cell in list(self.cells))


def leaf_signature(leaf):
    """What a compiled step depends on in an argument leaf: shape, dtype and layout (`layout_tag`),
    or the scalar type; a list of ints (``pytree.is_int_list``), its length.
    An ndarray subclass that is refused has a signature of its own, so it is never served by the
    step of a plain array (``arg_spec`` refuses it)."""
    if isinstance(leaf, np.generic) or is_plain_array(leaf):
        return (leaf.shape, leaf.dtype) + layout_tag(leaf)
    if isinstance(leaf, np.ndarray):
        return type(leaf), leaf.shape, leaf.dtype
    if type(leaf) is list:
        return list, len(leaf)
    return type(leaf)


@dataclass(frozen=True)
class CallStats:
    """What ``cache_info()`` of a compiled loss or training step reports (the disk cache's own
    summary is ``cache.CacheInfo``, from ``mj.cache_info()``)."""

    hits: int                       # calls served by a step already in memory
    misses: int                     # calls that traced a new signature
    signatures: tuple[str, ...]     # the input types of each signature held
    disk_loads: int = 0             # steps whose machine code came from the disk cache

    @staticmethod
    def total(stats) -> CallStats:
        """The statistics of several call sites (one per value of the static arguments) as one."""
        return CallStats(sum(s.hits for s in stats), sum(s.misses for s in stats),
                         tuple(sig for s in stats for sig in s.signatures), sum(s.disk_loads for s in stats))
