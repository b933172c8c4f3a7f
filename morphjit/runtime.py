"""Running a compiled step: the workspace pool, argument preparation and the native call."""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .loopir import batched_input, internal_shape
from .rng import GENERATORS, seed_of
from .ir import evaluate, is_symbolic
from .plan import Plan
from .pytree import TreeDef
from .source import Source


VIEWS_KEPT = 64   # batch sizes whose views a workspace keeps; the least recently used go first


@dataclass(frozen=True)
class Addresses:
    """A step argument: the data addresses (a uintp vector) of the pooled ``values`` that only
    kernels use, in place of one array argument each."""
    values: tuple


@dataclass(frozen=True)
class Frame:
    """The argument of a table step (``morphjit.table``) between its inputs and outputs: its
    frame, holding the data addresses of the constants and pooled ``values`` from place ``first``."""
    values: tuple
    first: int


class NativeStep:
    """Calls a compiled step: inputs in, fresh outputs back.

    A call borrows a workspace (the buffer pool, see `Workspace`) that no other call is using:
    an idle one, else a new one, and gives it back when the step returned. Calls from several
    threads therefore run in parallel (the machine code releases the GIL), each with its own
    workspace, and there is no lock: a call interrupted (Ctrl-C) anywhere merely drops the
    workspace it borrowed. A step keeps as many workspaces as it ever had calls running at once.
    """

    def __init__(self, plan: Plan, kernel, arguments, n_scalars: int = 0):
        self.kernel = kernel
        self.slots = plan.slots
        self.consts = {id(v): c.reshape(internal_shape(v.shape)) for v, c in plan.consts}
        n_in, n_out = len(plan.inputs), len(plan.outputs)
        self.workspace_values = [(v, plan.slot_of.get(id(v))) for v in arguments[n_in:len(arguments) - n_out]]
        self.slot_of = plan.slot_of
        self.table = any(isinstance(v, Frame) for v, _ in self.workspace_values)   # kernel: a table.Step
        self.input_dtypes = [v.dtype for v in plan.inputs]
        self.scalar_dtypes = self.input_dtypes[n_in - n_scalars:n_in]   # run-time scalars, the last inputs
        self.output_buffers = [(internal_shape(v.shape), v.dtype) for v in plan.outputs]
        self.output_shapes = [v.shape for v in plan.outputs]
        self.scalar_outputs = [i for i, v in enumerate(plan.outputs) if not v.shape]
        batched = batched_input(plan.inputs)
        self.batched = None if batched is None else plan.inputs.index(batched)
        self.idle: list[Workspace] = []   # workspaces no call is using
        self.call = self._first_call

    def workspace(self) -> Workspace:
        """A workspace for one call, to be given back with ``idle.append`` when it returned."""
        try:
            return self.idle.pop()
        except IndexError:
            return Workspace(self)

    def __call__(self, *leaves, out=None):
        """Run the step; ``out`` (checked by the caller) receives the outputs after the first (the
        gradients or the updated arrays); the others (aux values) are allocated."""
        inputs = [x if type(x) is np.ndarray and (x.dtype is dtype or x.dtype == dtype) and x.ndim
                  and x.flags.c_contiguous else prepare(x, dtype) for x, dtype in zip(leaves, self.input_dtypes)]
        batch = None if self.batched is None else inputs[self.batched].shape[0]
        given = [] if out is None else list(out)
        outputs = [np.empty(evaluate(shape, batch), dtype) for shape, dtype in self.output_buffers]
        outputs[1:1 + len(given)] = [o.reshape(shape) for o, (shape, _) in zip(given, self.output_buffers[1:])]
        workspace = self.workspace()
        fixed = workspace.fixed if batch is None else workspace.fixed_for(batch)
        self.call(*inputs, *fixed, *outputs)
        self.idle.append(workspace)   # not reached when the call raised: the workspace is dropped
        outputs[1:1 + len(given)] = given
        for i in self.scalar_outputs:
            outputs[i] = outputs[i].reshape(())
        return outputs

    def _first_call(self, *args):
        """Compile (or load) through the dispatcher, then call the machine code directly."""
        if self.table:   # its kernels are loaded: nothing to compile
            self.kernel.started()
            self.call = self.kernel.caller(len(self.input_dtypes))
            return self.call(*args)
        self.kernel(*args)
        # Arguments are always C-contiguous arrays of the same types, so the dispatcher's type
        # lookup can be skipped on later calls.
        signature = tuple(self.kernel.typeof_pyval(a) for a in args)
        self.call = self.kernel.overloads[signature].entry_point
        release_with_step(self.kernel)


def release_with_step(kernel) -> None:
    """Let ``kernel`` (a dispatcher) die with the step that calls it.

    Numba keeps the namespace of a compiled function's module alive as long as its machine code
    (for plain ``njit`` functions too); the kernel's own name in that namespace would keep the
    dispatcher, and all it refers to, alive forever. Its machine code is in hand, so the name goes.
    """
    namespace, name = kernel.py_func.__globals__, kernel.py_func.__name__
    if namespace.get(name) is kernel:
        namespace.pop(name, None)   # another thread's first call may have removed it meanwhile


class Workspace:
    """The buffers of one running call: the pool (allocated for the largest batch size this
    workspace has seen; a smaller batch uses views of it), the constants and views the kernel takes
    after the inputs for the last `VIEWS_KEPT` batch sizes, the loss and run-time scalar buffers."""

    __slots__ = ("step", "pool", "pool_batch", "views", "batch", "fixed", "loss", "scalars")

    def __init__(self, step: NativeStep):
        self.step = step
        self.pool, self.pool_batch, self.views = [], -1, OrderedDict()
        loss_shape, loss_dtype = step.output_buffers[0]
        self.loss = None if is_symbolic(loss_shape) else np.empty(loss_shape, loss_dtype)
        self.scalars = [np.empty(1, dtype) for dtype in step.scalar_dtypes]
        self.batch = self.fixed = None
        if step.batched is None:
            self.fixed_for(0)

    def fixed_for(self, batch: int) -> list[np.ndarray]:
        """The constants and workspace views the kernel takes after the inputs, at ``batch``;
        they become ``fixed``, the views of the batch size called last."""
        views = self.views.get(batch)
        if views is None:
            if batch > self.pool_batch:
                self.views.clear()   # views of the old pool would keep it alive
                self.pool = [np.empty(evaluate(slot.size, batch), slot.dtype) for slot in self.step.slots]
                self.pool_batch = batch
            views = self.views[batch] = [self._argument(v, slot, batch) for v, slot in self.step.workspace_values]
            if len(self.views) > VIEWS_KEPT:
                self.views.popitem(last=False)
        else:
            self.views.move_to_end(batch)
        self.batch, self.fixed = batch, views
        return views

    def _argument(self, v, slot: int | None, batch: int) -> np.ndarray:
        if isinstance(v, Addresses):   # views of the pool, which outlives this vector
            return np.array([self._address(u, batch) for u in v.values], np.uintp)
        if isinstance(v, Frame):
            return self.step.kernel.frame({v.first + k: self._address(u, batch) for k, u in enumerate(v.values)}, batch)
        return self.step.consts[id(v)] if slot is None else self._view(v, slot, batch)

    def _address(self, v, batch: int) -> int:
        """The data address of a constant or of a pooled value's view."""
        slot = self.step.slot_of.get(id(v))
        return (self.step.consts[id(v)] if slot is None else self._view(v, slot, batch)).ctypes.data

    def _view(self, v, slot: int, batch: int) -> np.ndarray:
        shape = internal_shape(evaluate(v.shape, batch))
        return self.pool[slot][:math.prod(shape)].reshape(shape)


class OutOfRange:
    """A value outside its range, raised by the compiled step with the numbers only (what, low,
    extent, value, position...): the message is formatted here, in Python."""

    def __str__(self) -> str:
        what, low, extent, value, *position = self.args
        return f"{what} must lie in [{low}, {extent}), got {value} at position ({', '.join(map(str, position))})"


class ValueOutOfRange(OutOfRange, ValueError):
    pass


class IndexOutOfRange(OutOfRange, IndexError):
    pass


OUT_OF_RANGE = {"ValueError": ValueOutOfRange, "IndexError": IndexOutOfRange}   # by RangeCheck.error


def prepare(x, dtype) -> np.ndarray:
    """The argument as the kernel takes it: C-contiguous, of the traced dtype, at least 1-D (a
    random generator: the seed of the call, drawn from it)."""
    if isinstance(x, GENERATORS):
        return seed_of(x)
    a = np.ascontiguousarray(x, dtype)
    return a.reshape(1) if a.ndim == 0 else a


# ---------------------------------------------------------------------------------------------
# The fast path of a call: one generated Python function per signature that checks the
# arguments against the signature and calls the machine code. It returns None where the
# arguments do not fit (another signature, an unusual array), and the caller takes the slow,
# fully checked path, which also raises the errors.

class FastPath(Source):
    """The source of a generated fast function and the globals it reads."""

    def __init__(self, step: NativeStep):
        super().__init__()
        self.step = step
        self.env = {"step": step, "pop": step.idle.pop, "put": step.idle.append, "Workspace": Workspace,
                    "ascontiguousarray": np.ascontiguousarray, "empty": np.empty, "ndarray": np.ndarray,
                    "evaluate": evaluate}
        self.batched = False
        self.generators: list[str] = []   # leaves whose seed is drawn once every check passed

    def bind(self, treedef, expr: str, prefix: str) -> list[str]:
        """Lines binding the leaves of the tree ``expr`` to names; returns the names."""
        names: list[str] = []
        self.line("try:")
        with self.indent():
            self.guard(treedef, expr, names, prefix, len(self.lines))
        self.line("except (KeyError, IndexError, TypeError):")
        with self.indent():
            self.line("return None")
        return names

    def guard(self, treedef, expr: str, leaves: list, prefix: str, start: int) -> None:
        """Lines binding each leaf of ``expr`` to a name (appended to ``leaves``), returning None on
        a structure mismatch; node names count the lines since ``start``."""
        if treedef.kind is None:
            leaves.append(f"{prefix}{len(leaves)}")
            self.line(f"{leaves[-1]} = {expr}")
            return
        node = f"{prefix}n{len(self.lines) - start}"
        kind = self.constant(treedef.kind)
        self.line(f"{node} = {expr}")
        self.line(f"if type({node}) is not {kind} or len({node}) != {len(treedef.children)}: return None")
        keys = treedef.keys if treedef.kind is dict else range(len(treedef.children))
        for key, child in zip(keys, treedef.children):
            if not isinstance(key, (str, int)):
                raise Unspellable
            self.guard(child, f"{node}[{key!r}]", leaves, prefix, start)

    def check_inputs(self, names, leaf_signatures, dtypes, batched, written=()) -> list[str]:
        """Check each input leaf (``written`` ones must be writeable arrays, updated in place);
        returns the names of the pool views the kernel takes after the inputs."""
        first = min(batched, default=None)
        for k, (name, signature, dtype) in enumerate(zip(names, leaf_signatures, dtypes)):
            self.leaf_check(name, signature, dtype, k,
                            None if k not in batched else "define" if k == first else "match", k in written)
        self.batched = bool(batched)
        return ["*F"]

    def leaf_check(self, name: str, signature, dtype, k: int, batch: str | None, written=False) -> None:
        """Lines checking one leaf; ``batch`` says whether its leading extent defines the batch
        size ``B``, must match it, or (None) is fixed. A ``written`` leaf (updated in place) must
        be a writeable C-contiguous array as it is."""
        self.env[f"D{k}"] = dtype
        if isinstance(signature, type) and issubclass(signature, GENERATORS):
            self.line(f"if type({name}) is not {self.constant(signature)}: return None")
            self.generators.append(name)
            return
        if not isinstance(signature, tuple):  # a Python scalar argument
            self.line(f"if type({name}) is not {signature.__name__}: return None")
            self.line(f"{name} = ascontiguousarray({name}, D{k}).reshape(1)")
            return
        shape, _ = signature
        if batch is None:
            self.env[f"P{k}"] = shape
            self.line(f"if type({name}) is not ndarray or {name}.shape != P{k} or {other_dtype(name, f'D{k}')}: return None")
        else:   # the trailing extents compared one by one: cheaper than slicing the shape
            trailing = "".join(f" or s[{i}] != {d}" for i, d in enumerate(shape[1:], 1))
            self.line(f"if type({name}) is not ndarray or {other_dtype(name, f'D{k}')}: return None")
            self.line(f"s = {name}.shape")
            self.line(f"if len(s) != {len(shape)}{trailing}: return None")
            if batch == "define":   # a batch of one has a step of its own (compiler.batched_leaves)
                self.line("B = s[0]")
                self.line("if B == 1: return None")
            else:
                self.line("if s[0] != B: return None")
        if written:
            self.line(f"if not ({name}.flags.c_contiguous and {name}.flags.writeable): return None")
        else:
            self.line(f"if not {name}.flags.c_contiguous: {name} = ascontiguousarray({name})")
        if not shape:
            self.line(f"{name} = {name}.reshape(1)")

    def call(self, arguments: list[str], before: list[str] = (), loss: bool = True) -> None:
        """The kernel call in a borrowed workspace (``ws``: its views ``F``, loss buffer ``o0``
        when there is a ``loss``), given back once the loss is read into ``loss``. No lock and no
        ``finally``: a call that raises or is interrupted drops its workspace, and no other call can
        see it half-updated."""
        views = "ws.fixed if ws.batch == B else ws.fixed_for(B)" if self.batched else "ws.fixed"
        reads = (["o0 = ws.loss"], ["loss = o0[0]"]) if loss else ([], [])
        self.env["seed_of"] = seed_of
        for name in self.generators:
            self.line(f"{name} = seed_of({name})")
        for line in ["try: ws = pop()", "except IndexError: ws = Workspace(step)", f"F = {views}",
                     *reads[0], *before, f"step.call({', '.join(arguments)})", *reads[1], "put(ws)"]:
            self.line(line)

    def allocate(self, outputs) -> list[str]:
        """Lines allocating the step's ``outputs`` (indices) as ``o<k>``, at the batch size ``B``
        where the shape has it; returns their names."""
        for k in outputs:
            shape, dtype = self.step.output_buffers[k]
            self.env[f"S{k}"], self.env[f"T{k}"] = shape, dtype
            self.line(f"o{k} = empty({f'evaluate(S{k}, B)' if is_symbolic(shape) else f'S{k}'}, T{k})")
        return [f"o{k}" for k in outputs]

    def scalars_as_arrays(self, outputs) -> None:
        """Lines giving the 0-d ones among ``outputs`` (indices) their shape ``()``."""
        for k in outputs:
            if k in self.step.scalar_outputs:
                self.line(f"o{k} = o{k}.reshape(())")

    def tree_expr(self, treedef, names) -> str:
        """Source building a tree of this structure from the names of its leaves."""
        if treedef.kind is None:
            return next(names)
        children = [self.tree_expr(c, names) for c in treedef.children]
        if treedef.kind is dict:
            if not all(isinstance(k, (str, int)) for k in treedef.keys):
                raise Unspellable
            return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(treedef.keys, children)) + "}"
        kind = self.constant(treedef.kind)
        if treedef.keys:  # namedtuple
            return f"{kind}({', '.join(children)})"
        return f"{kind}([{', '.join(children)}])"

    def constant(self, value) -> str:
        """A fresh name for ``value`` in the generated function's globals."""
        name = f"K{len(self.env)}"
        self.env[name] = value
        return name

    def function(self):
        exec("\n".join(self.lines), self.env)
        return self.env["fast"]


def other_dtype(name: str, dtype: str) -> str:
    """The expression: array ``name``'s dtype is not ``dtype``. Identity is the cheap test, but
    equal dtypes need not be one object: an unpickled array (multiprocessing, joblib, Dask's
    transfers) has a copy of its dtype, which must not lose the fast path."""
    return f"({name}.dtype is not {dtype} and {name}.dtype != {dtype})"


class Unspellable(Exception):
    """A tree the fast path cannot spell as source (a key that is not a str or int)."""


def fast_call(treedef, leaf_signatures, grad_treedefs, single: bool, step: NativeStep, batched=frozenset(),
              aux_tree=None):
    """``f(args, out=None) -> (loss, grads)``, or ``None`` when the arguments do not fit; with an
    ``aux_tree`` (the step's outputs after the gradients), ``((loss, aux), grads)``.

    The leading extent of the leaves in ``batched`` is the batch size: any, but the same for all.
    With ``out`` (a tree shaped like the gradients) the gradients are written there and ``out``
    is returned. Returns None (no fast path) for trees it cannot spell as source.
    """
    grad_tree = grad_treedefs[0] if single else TreeDef(tuple, (), tuple(grad_treedefs))
    src = FastPath(step)
    src.line("def fast(args, out=None):")
    n, end = len(step.output_buffers), 1 + grad_tree.num_leaves
    try:
        with src.indent():
            inputs = src.bind(treedef, "args", "x")
            fixed = src.check_inputs(inputs, leaf_signatures, step.input_dtypes, batched)
            grads = src.tree_expr(grad_tree, iter(f"o{k}" for k in range(1, end)))
            src.line("if out is None:")
            with src.indent():
                src.allocate(range(1, end))
            src.line("else:")
            with src.indent():
                targets = src.bind(grad_tree, "out", "g")
                check_out_arrays(src, inputs, targets)
            aux = src.allocate(range(end, n))
            src.call(inputs + fixed + [f"o{k}" for k in range(n)])
            src.scalars_as_arrays(range(end, n))
            value = "loss" if aux_tree is None else f"(loss, {src.tree_expr(aux_tree, iter(aux))})"
            src.line("if out is not None:")
            with src.indent():
                src.line(f"return {value}, out")
            src.scalars_as_arrays(range(1, end))
            src.line(f"return {value}, {grads}")
    except Unspellable:
        return None
    return src.function()


def fast_forward(treedef, leaf_signatures, out_tree, step: NativeStep, batched=frozenset()):
    """``f(args) -> outputs`` (a tree shaped ``out_tree``) for a forward-only step, or ``None``
    when the arguments do not fit; None (no fast path) for trees it cannot spell as source."""
    src = FastPath(step)
    src.line("def fast(args):")
    n = len(step.output_buffers)
    try:
        with src.indent():
            inputs = src.bind(treedef, "args", "x")
            fixed = src.check_inputs(inputs, leaf_signatures, step.input_dtypes, batched)
            outputs = src.allocate(range(n))
            src.call(inputs + fixed + outputs, loss=False)
            src.scalars_as_arrays(range(n))
            src.line(f"return {src.tree_expr(out_tree, iter(outputs))}")
    except Unspellable:
        return None
    return src.function()


def check_out_arrays(src: FastPath, inputs: list[str], targets: list[str]) -> None:
    """Lines checking each ``out=`` array (named in ``targets``) and using it as an output buffer."""
    step = src.step
    for k, (name, (shape, dtype)) in enumerate(zip(targets, step.output_buffers[1:]), 1):
        src.env[f"S{k}"], src.env[f"T{k}"], src.env[f"R{k}"] = shape, dtype, step.output_shapes[k]
        # An out array that owns its memory (base None) overlaps only itself, its views (whose
        # base it is) and no other out array; anything else takes the slow path, which checks
        # byte ranges and raises.
        aliased = "".join(f" or {x} is {name} or {x}.base is {name}" for x in inputs) + \
            "".join(f" or {name} is {g}" for g in targets[:k - 1])
        src.line(f"if type({name}) is not ndarray or {name}.shape != R{k} or {other_dtype(name, f'T{k}')} "
                 f"or not {name}.flags.c_contiguous or not {name}.flags.writeable or {name}.base is not None"
                 f"{aliased}: return None")
        src.line(f"o{k} = {name}.reshape(S{k})")


def fast_update(treedef, leaf_signatures, step: NativeStep, batched, n_written: int, n_params: int,
                check_aliasing, aux_tree=None):
    """``f(args, scalars) -> loss`` for a training step, or ``None`` when the arguments do not fit;
    with an ``aux_tree`` (the step's outputs after the updated arrays), ``(loss, aux)``.

    ``args`` is ``(params, state trees, data)``: its first ``n_written`` leaves (parameters, then
    optimiser state) are updated in place. The kernel takes parameters, data, state, then the
    run-time ``scalars``; ``check_aliasing(written, data)`` raises when arrays overlap.
    """
    src = FastPath(step)
    src.line("def fast(args, scalars):")
    n = len(step.output_buffers)
    try:
        with src.indent():
            leaves = src.bind(treedef, "args", "x")
            params, state, data = leaves[:n_params], leaves[n_params:n_written], leaves[n_written:]
            kernel = step.input_dtypes    # parameters, data, state, scalars
            n_data = len(data)
            dtypes = kernel[:n_params] + kernel[n_params + n_data:n_written + n_data] + kernel[n_params:n_params + n_data]
            fixed = src.check_inputs(leaves, leaf_signatures, dtypes, batched, range(n_written))
            src.env["check_aliasing"] = check_aliasing
            src.line(f"check_aliasing(({''.join(x + ', ' for x in leaves[:n_written])}), "
                     f"({''.join(x + ', ' for x in data)}))")
            scalars = [f"c{k}" for k in range(len(step.scalar_dtypes))]
            assign = [f"{''.join(c + ', ' for c in scalars)}= ws.scalars",
                      f"{''.join(c + '[0], ' for c in scalars)}= scalars"] if scalars else []
            aux = src.allocate(range(1 + n_written, n))
            src.call(params + data + state + scalars + fixed + ["o0"] + params + state + aux, before=assign)
            src.scalars_as_arrays(range(1 + n_written, n))
            src.line("return loss" if aux_tree is None else f"return loss, {src.tree_expr(aux_tree, iter(aux))}")
    except Unspellable:
        return None
    return src.function()
