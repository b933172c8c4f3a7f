"""The fast path of a call: one generated Python function per signature that checks the
arguments against the signature and calls the machine code. It returns None where the arguments
do not fit (another signature, an unusual array), and the caller takes the slow, fully checked
path, which also raises the errors."""
from __future__ import annotations

import numpy as np

from ..ir import evaluate, is_symbolic
from ..native import GENERATORS, seed_of
from ..util import Source, TreeDef, pytree
from .step import NativeStep, Workspace


class FastPath(Source):
    """The source of a generated fast function and the globals it reads."""

    def __init__(self, step: NativeStep):
        super().__init__()
        self.step = step
        self.env = {"step": step, "pop": step.idle.pop, "put": step.idle.append, "Workspace": Workspace,
                    "ascontiguousarray": np.ascontiguousarray, "empty": np.empty, "ndarray": np.ndarray,
                    "evaluate": evaluate, "int_array": int_array, "Held": pytree.Held}
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
        if treedef.kind is type(None):     # None is structure (``util.pytree``), not a leaf
            self.line(f"if {expr} is not None: return None")
            return
        if treedef.kind is str:            # a string argument's value is structure too
            self.line(f"if type({expr}) is not str or {expr} != {self.constant(treedef.keys[0])}: return None")
            return
        if treedef.kind is pytree.Held:           # so are a function's, a class's or a module's identity
            self.line(f"if {self.constant(treedef.keys[0])} != Held({expr}): return None")
            return
        node = f"{prefix}n{len(self.lines) - start}"
        self.line(f"{node} = {expr}")
        if isinstance(treedef.kind, pytree.Attributes):   # an object: its attributes
            self.line(f"if type({node}) is not {self.constant(treedef.kind.cls)}: return None")
            self.line(f"{node} = {node}.__dict__")
            kind, keys = "dict", treedef.keys
        else:
            kind = self.constant(treedef.kind)
            keys = treedef.keys if treedef.kind is dict else range(len(treedef.children))
        self.line(f"if type({node}) is not {kind} or len({node}) != {len(treedef.children)}: return None")
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
        if isinstance(signature, tuple) and signature[0] is list:   # a list of ints: an int64 array
            self.line(f"if type({name}) is not list or len({name}) != {signature[1]}: return None")
            self.line(f"{name} = int_array({name})")
            self.line(f"if {name} is None: return None")
            return
        if not isinstance(signature, tuple):  # a Python scalar argument
            self.line(f"if type({name}) is not {signature.__name__}: return None")
            self.line(f"{name} = ascontiguousarray({name}, D{k}).reshape(1)")
            return
        shape, _, *layout = signature
        if batch is None:
            self.env[f"P{k}"] = shape
            self.line(f"if type({name}) is not ndarray or {name}.shape != P{k} or {other_dtype(name, f'D{k}')}: return None")
        else:   # the trailing extents compared one by one: cheaper than slicing the shape
            trailing = "".join(f" or s[{i}] != {d}" for i, d in enumerate(shape[1:], 1))
            self.line(f"if type({name}) is not ndarray or {other_dtype(name, f'D{k}')}: return None")
            self.line(f"s = {name}.shape")
            self.line(f"if len(s) != {len(shape)}{trailing}: return None")
            if batch == "define":   # a batch of one has a step of its own (jit.callsite.batched_leaves)
                self.line("B = s[0]")
                self.line("if B == 1: return None")
            else:
                self.line("if s[0] != B: return None")
        if written:
            self.line(f"if not ({name}.flags.c_contiguous and {name}.flags.writeable): return None")
        else:
            if len(shape) >= 2:   # another layout is another signature (jit.callsite.layout_tag)
                self.line(f"if {other_layout(name, layout[0] if layout else 'C')}: return None")
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
        if treedef.kind in (pytree.Held, type(None), str):   # structure without leaves
            return self.constant(pytree.unflatten(treedef, []))
        if isinstance(treedef.kind, pytree.Attributes):
            attributes = ", ".join(f"{k!r}: {c}" for k, c in zip(treedef.keys, children))
            return f"{self.constant(pytree.rebuilt)}({self.constant(treedef.kind.cls)}, {{{attributes}}})"
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


def other_layout(name: str, layout: str) -> str:
    """The expression: array ``name`` (of two dimensions or more) is not of ``layout`` (see
    ``tracing.storage.layout_of``)."""
    c, f = f"{name}.flags.c_contiguous", f"{name}.flags.f_contiguous"
    return {"C": f"not {c}", "F": f"{c} or not {f}"}.get(layout, f"{c} or {f}")


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


def int_array(values: list) -> np.ndarray | None:
    """A list of Python ints as the int64 array the step takes; None if it holds anything else."""
    return np.array(values, np.int64) if all(type(v) is int for v in values) else None
