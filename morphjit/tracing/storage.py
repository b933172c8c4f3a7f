"""NumPy's memory model under tracing: arrays, views of them, and writes that every view sees.

A traced array that has been viewed or written is a *view* of a `Storage`: the storage holds the
SSA value of its latest version, and the view the steps (``reshape``, ``transpose``, ``slice``,
``broadcast_to``, ``diagonal`` bindings, as NumPy took them) from the storage to the array. A
write makes a new version: the written view's new value is walked back through its steps into a
new value of the whole storage (a slice step becomes an ``update_slice``, a reshape or transpose
its inverse), and every view re-reads the storage when its version has moved. Values nothing
viewed or wrote need no storage: they are their SSA value, as before.

Whether a reshape is a view follows NumPy's rule, decided on a *layout proxy*: an array with the
view's shape and strides over one byte, which NumPy reshapes without touching memory. Storages are
C-contiguous (the call site makes arguments so); a value computed from a view that is not has a
layout morphjit does not follow, and a reshape of it that would be a view for a C array is marked
ambiguous: a write that could show the difference is refused (`LayoutError`).
"""
from __future__ import annotations

import builtins
import contextlib
import weakref

import numpy as np

from ..ir import OPS, Sym, evaluate, is_unit_reshape
from ..util import ArgumentWriteError, LayoutError, UnsupportedError, user_location

WRITABLE = ("reshape", "transpose", "slice")   # the other views (broadcasts, diagonals, windows) are read-only
STAND_IN = 7   # a symbolic (batch) extent, for deciding view or copy


class Step(tuple):
    """One view step: ``(op, params, source shape, ambiguous)``."""
    __slots__ = ()
    op = property(lambda self: self[0])
    params = property(lambda self: self[1])
    source_shape = property(lambda self: self[2])
    ambiguous = property(lambda self: self[3])


class Storage:
    """The memory of one NumPy array: its latest value (``value``, a ``Var`` or ``Lit`` of the
    storage's shape), a version counted up per write, and where it came from: ``origin`` is
    None for an array the function made, else what a write into it is refused as."""

    __slots__ = ("trace", "value", "known", "version", "origin", "layout", "views", "unwritten", "made",
                 "captured", "__weakref__")

    def __init__(self, trace, value, origin: str | None = None, layout: str = "C", known: np.ndarray | None = None,
                 captured: frozenset[str] | None = None):
        self.trace, self.value, self.version, self.origin, self.made = trace, value, 0, origin, None
        self.known = known   # a buffer's NumPy array, until a traced value is written into it
        # The names of the arrays the function captures that a known buffer is computed from: ``value``
        # is then the traced value read on each call, ``known`` its contents when traced (Python
        # reading them is noted: `Tracer.concrete`).
        self.captured = captured
        self.layout = layout   # "C", "F", or "unknown": NumPy made it in an order morphjit does not follow
        self.views = weakref.WeakSet()   # the tracers reading this storage through an ambiguous step
        self.unwritten = None     # np.empty's: True where never written (concrete shapes only)

    @property
    def shape(self) -> tuple:
        return self.known.shape if self.known is not None else self.value.type.shape

    def read(self, view: tuple):
        """The value of the view ``view`` at the latest version (a constant while it is known, but for
        a captured array, read on each call)."""
        if self.known is not None and self.captured is None:
            return self.trace.operand(np.array(concrete_view(self.known, view)), lift_literals=False)
        value = self.value
        for step in view:
            value = self.trace.record(step.op, [value], dict(step.params))
        return value

    def write(self, view: tuple, value) -> None:
        """Make ``value`` (the view's new value, of its shape and the storage's dtype) the view's
        contents: a new version of the whole storage."""
        if self.known is not None:      # a traced value written into a buffer: it is traced from now on
            if self.captured is None:
                self.value = self.trace.operand(np.array(self.known), lift_literals=False)
            self.known = None
        for k in reversed(range(len(view))):
            value = self._unstep(view, k, value)
        self.value = value
        self.version += 1

    def _unstep(self, view: tuple, k: int, value):
        step, record = view[k], self.trace.record
        params = dict(step.params)
        if step.op == "reshape":
            return record("reshape", [value], {"shape": step.source_shape})
        if step.op == "transpose":
            return record("transpose", [value], {"perm": tuple(int(p) for p in np.argsort(params["perm"]))})
        assert step.op == "slice", step.op
        return record("update_slice", [self.read(view[:k]), value], params)

    def write_known(self, view: tuple, key, value) -> None:
        """NumPy's ``view[key] = value`` into a buffer that is still known, with concrete ``value`` (a
        buffer computed from captured arrays is then a constant: its contents count as read)."""
        if self.captured is not None:
            self.trace.contents_read.update(self.captured)
            self.captured = None
        concrete_view(self.known, view)[key] = value
        self.version += 1

    def check_written(self, view: tuple) -> None:
        """Refuse a read of elements of ``np.empty``'s array that were never written."""
        if self.unwritten is None:
            return
        seen = concrete_view(self.unwritten, view)
        if seen.any():
            first = tuple(int(i) for i in np.argwhere(seen)[0])
            raise UnsupportedError(f"a read of elements of the array made by np.empty{self.origin_text()} that "
                                   f"were never written (index {first} of the read is the first): np.empty "
                                   f"leaves them undefined; write them first, or make the array with np.zeros",
                                   user_location())

    @contextlib.contextmanager
    def writing(self, view: tuple, key):
        """While a write into ``view[key]`` computes its update, which reads the old contents of
        the whole storage: no read of never-written elements is refused; after it, they are written."""
        unwritten, self.unwritten = self.unwritten, None
        try:
            yield
        finally:
            if unwritten is not None:
                try:
                    concrete_view(unwritten, view)[key] = False
                except (IndexError, TypeError, ValueError):   # a traced key: the whole view, as far as known
                    concrete_view(unwritten, view)[...] = False
                self.unwritten = unwritten if unwritten.any() else None

    def origin_text(self) -> str:
        return f" at {self.made}" if self.made else ""


def layout_of(array) -> str:
    """The layout NumPy's operations on ``array`` follow: "C", "F", or "unknown" (strided). Arrays
    of one dimension or none, and those both orders describe, count as C: NumPy treats them alike."""
    if np.ndim(array) <= 1 or array.flags.c_contiguous:
        return "C"
    return "F" if array.flags.f_contiguous else "unknown"


def concrete_view(array: np.ndarray, view: tuple) -> np.ndarray:
    """NumPy's view ``view`` of ``array`` (a concrete array of the storage's shape); through a
    read-only step, its value."""
    for step in view:
        params = dict(step.params)
        if step.op == "slice":
            bounds = zip(params["starts"], concrete_shape(params["stops"]), params["steps"])
            array = array[tuple(slice(a, b if b >= 0 else None, s) for a, b, s in bounds)]
        elif step.op == "reshape":
            array = array.reshape(concrete_shape(params["shape"]))
        elif step.op == "transpose":
            array = array.transpose(params["perm"])
        else:   # a read-only view (writes through it are refused): the op's NumPy value
            array = OPS[step.op].impl(array, **{k: concrete_shape(v) if k == "shape" else v for k, v in params.items()})
    return array


def concrete_shape(shape) -> tuple[int, ...]:
    """``shape`` with a symbolic extent standing for the batch size at `STAND_IN`."""
    return tuple(evaluate(d, STAND_IN) if isinstance(d, Sym) else int(d) for d in shape)


def proxy(shape, view: tuple, layout: str = "C") -> np.ndarray | None:
    """An array with the layout of the view ``view`` of a storage of ``shape`` in ``layout`` (C or
    F order), over one byte (never read: only NumPy's metadata functions touch it); None where a
    step is a view whose layout is not modelled (a window)."""
    shape = concrete_shape(shape)
    order = range(len(shape)) if layout != "F" else range(len(shape) - 1, -1, -1)
    strides, step = [0] * len(shape), 1
    for k in reversed(list(order)):
        strides[k], step = step, step * builtins.max(shape[k], 1)
    array = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape, strides)
    for step in view:
        params = dict(step.params)
        if step.op == "reshape":
            array = array.reshape(concrete_shape(params["shape"]), copy=False)
        elif step.op == "broadcast_to":
            array = np.broadcast_to(array, concrete_shape(params["shape"]))
        elif step.op == "diagonal":
            array = np.diagonal(array, params["offset"], params["axis1"], params["axis2"])
        elif step.op in WRITABLE:
            array = concrete_view(array, (step,))
        else:
            return None
    return array


def reshape_is_view(store: Storage, view: tuple, new_shape) -> bool:
    """Whether NumPy's reshape of the view ``view`` of ``store`` to ``new_shape`` returns a view
    (else it copies)."""
    layout = proxy(store.shape, view, store.layout)
    try:
        return layout is not None and layout.reshape(concrete_shape(new_shape), copy=False) is not None
    except ValueError:
        return False


def contiguous(store: Storage, view: tuple, order: str) -> bool:
    """Whether NumPy's view ``view`` of ``store`` is C- (or F-) contiguous."""
    layout = proxy(store.shape, view, store.layout)
    return layout is not None and (layout.flags.c_contiguous if order == "C" else layout.flags.f_contiguous)


def make_view(source, out, op_name: str, params) -> None:
    """Make ``out``, the result of the view op ``op_name`` on the tracer ``source``, NumPy's view of
    source's storage; a reshape NumPy would copy leaves ``out`` an array of its own."""
    store = source.own_storage()
    ambiguous = False
    if op_name == "reshape":
        shape = dict(params)["shape"]
        if not reshape_is_view(store, source.steps, shape):
            return
        ambiguous = store.layout == "unknown" and not is_unit_reshape(source.shape, shape)
    out.storage, out.seen = store, store.version
    out.steps = source.steps + (Step((op_name, params, source.shape, ambiguous)),)
    if ambiguous or any(step.ambiguous for step in source.steps):
        store.views.add(out)


def assign(x, value) -> None:
    """Make ``value`` (an IR value of ``x``'s shape and dtype) the contents of the array ``x``, as
    NumPy's in-place write would: every view of its storage sees it."""
    store = x.storage
    if store is None:
        x._operand = value
        return
    check_writable(x)
    store.write(x.steps, value)


def check_writable(x) -> None:
    """Refuse a write into ``x`` that NumPy refuses, or that would change an argument or show a
    layout morphjit does not follow."""
    store = x.storage
    if store is None:
        return
    if store.origin is not None:
        via = f" (through a view of it, {x.shape})" if x.steps else ""
        name = store.origin.split(' ')[2].rstrip(',') if store.origin.startswith("the array") else \
            store.origin.split(' ', 1)[-1]
        raise ArgumentWriteError(f"this line writes into {store.origin}{via}; a compiled function never changes "
                                 f"its arguments or the arrays it captures (NumPy would change the caller's "
                                 f"array): copy it first, a = {name}.copy(), and write into the copy",
                                 user_location())
    read_only = next((step.op for step in x.steps if step.op not in WRITABLE), None)
    if read_only is not None:
        raise ValueError(f"assignment destination is read-only: this array is a {read_only} view (np.broadcast_to, "
                         f"np.diagonal and sliding_window_view return read-only views, and NumPy refuses this write "
                         f"too; a traced as_strided view is read-only, as its elements may overlap); write into a copy (.copy()) or into the array it views\n  at {user_location()}")
    if any(step.ambiguous for step in x.steps) or any(v is not x for v in store.views):
        raise LayoutError("whether a reshape of this array is a view or a copy depends on the memory order NumPy "
                          "gives an array computed from a transposed or strided view, which morphjit does not "
                          "follow, and this write would show the difference: make it explicit with "
                          "np.ascontiguousarray(...) before the reshape, or .copy() after it", user_location())
