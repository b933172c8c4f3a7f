"""Running a compiled step: the workspace pool, argument preparation and the native call."""
from __future__ import annotations

import threading

import numpy as np

from .codegen import internal_shape
from .plan import Plan


class NativeStep:
    """Calls a compiled step: inputs in, fresh outputs back; the pool is allocated once.

    Calls from several threads take turns: they would share the pool.
    """

    def __init__(self, plan: Plan, kernel, arguments):
        self.kernel = kernel
        self.lock = threading.Lock()
        self.pool = [np.empty(slot.size, slot.dtype) for slot in plan.slots]
        fixed = {id(v): c.reshape(internal_shape(v.shape)) for v, c in plan.consts}
        for v in arguments:
            if id(v) in plan.slot_of:
                shape = internal_shape(v.shape)
                fixed[id(v)] = self.pool[plan.slot_of[id(v)]][:int(np.prod(shape))].reshape(shape)
        n_in, n_out = len(plan.inputs), len(plan.outputs)
        self.fixed = [fixed[id(v)] for v in arguments[n_in:len(arguments) - n_out]]
        self.input_dtypes = [v.dtype for v in plan.inputs]
        self.output_buffers = [(internal_shape(v.shape), v.dtype) for v in plan.outputs]
        self.scalar_outputs = [i for i, v in enumerate(plan.outputs) if not v.shape]
        self.call = self._first_call

    def __call__(self, *leaves, out=None):
        """Run the step; ``out`` (checked by the caller) receives the outputs after the first."""
        inputs = [x if type(x) is np.ndarray and x.dtype is dtype and x.ndim and x.flags.c_contiguous
                  else prepare(x, dtype) for x, dtype in zip(leaves, self.input_dtypes)]
        if out is None:
            outputs = [np.empty(shape, dtype) for shape, dtype in self.output_buffers]
        else:
            outputs = [np.empty(*self.output_buffers[0])] + [o.reshape(shape) for o, (shape, _) in
                                                             zip(out, self.output_buffers[1:])]
        with self.lock:
            self.call(*inputs, *self.fixed, *outputs)
        if out is not None:
            return [outputs[0].reshape(())] + list(out)
        for i in self.scalar_outputs:
            outputs[i] = outputs[i].reshape(())
        return outputs

    def _first_call(self, *args):
        """Compile (or load) through the dispatcher, then call the machine code directly."""
        self.kernel(*args)
        # Arguments are always C-contiguous arrays of the same types, so the dispatcher's type
        # lookup can be skipped on later calls.
        signature = tuple(self.kernel.typeof_pyval(a) for a in args)
        self.call = self.kernel.overloads[signature].entry_point


def prepare(x, dtype) -> np.ndarray:
    """The argument as the kernel takes it: C-contiguous, of the traced dtype, at least 1-D."""
    a = np.ascontiguousarray(x, dtype)
    return a.reshape(1) if a.ndim == 0 else a


# ---------------------------------------------------------------------------------------------
# The fast path of a call: one generated Python function per signature that checks the
# arguments against the signature, allocates the gradients and calls the machine code.

def fast_call(treedef, leaf_signatures, grad_treedefs, single: bool, step: NativeStep):
    """``f(args) -> (loss, grads)``, or ``None`` when ``args`` do not match this signature.

    Returns None (no fast path) for argument trees it cannot spell as source (unusual dict keys).
    """
    env = {"step": step, "ascontiguousarray": np.ascontiguousarray, "empty": np.empty, "ndarray": np.ndarray}
    lines, leaves = [], []
    try:
        _guard(treedef, "args", lines, leaves, env)
        grads = _tree_expr(grad_treedefs[0] if single else _tuple_of(grad_treedefs),
                           iter(f"o{k}" for k in range(1, len(step.output_buffers))), env)
    except _Unspellable:
        return None
    body = ["def fast(args):", "    try:"] + [f"        {line}" for line in lines]
    body += ["    except (KeyError, IndexError, TypeError):", "        return None"]
    for k, (name, signature) in enumerate(zip(leaves, leaf_signatures)):
        body += _leaf_check(name, signature, step.input_dtypes[k], env, k)
    env.update((f"f{k}", a) for k, a in enumerate(step.fixed))
    for k, (shape, dtype) in enumerate(step.output_buffers):
        env[f"S{k}"], env[f"T{k}"] = shape, dtype
        body.append(f"    o{k} = empty(S{k}, T{k})")
    arguments = leaves + [f"f{k}" for k in range(len(step.fixed))] + [f"o{k}" for k in range(len(step.output_buffers))]
    body.append("    with step.lock:")
    body.append(f"        step.call({', '.join(arguments)})")
    body += [f"    o{k} = o{k}.reshape(())" for k in step.scalar_outputs if k]
    body.append(f"    return o0[0], {grads}")
    exec("\n".join(body), env)
    return env["fast"]


class _Unspellable(Exception):
    pass


def _guard(treedef, expr: str, lines: list, leaves: list, env: dict) -> None:
    """Lines binding each leaf of ``expr`` to a name, raising (caught) on structure mismatch."""
    if treedef.kind is None:
        leaves.append(f"x{len(leaves)}")
        lines.append(f"{leaves[-1]} = {expr}")
        return
    node = f"n{len(lines)}"
    kind = _constant(env, treedef.kind)
    lines.append(f"{node} = {expr}")
    lines.append(f"if type({node}) is not {kind} or len({node}) != {len(treedef.children)}: return None")
    keys = treedef.keys if treedef.kind is dict else range(len(treedef.children))
    for key, child in zip(keys, treedef.children):
        if not isinstance(key, (str, int)):
            raise _Unspellable
        _guard(child, f"{node}[{key!r}]", lines, leaves, env)


def _leaf_check(name: str, signature, dtype, env: dict, k: int) -> list[str]:
    env[f"D{k}"] = dtype
    if not isinstance(signature, tuple):  # a Python scalar argument
        return [f"    if type({name}) is not {signature.__name__}: return None",
                f"    {name} = ascontiguousarray({name}, D{k}).reshape(1)"]
    shape, _ = signature
    env[f"P{k}"] = shape
    lines = [f"    if type({name}) is not ndarray or {name}.shape != P{k} or {name}.dtype != D{k}: return None",
             f"    if not {name}.flags.c_contiguous: {name} = ascontiguousarray({name})"]
    if not shape:
        lines.append(f"    {name} = {name}.reshape(1)")
    return lines


def _tuple_of(treedefs):
    from .pytree import TreeDef
    return TreeDef(tuple, (), tuple(treedefs))


def _tree_expr(treedef, names, env: dict) -> str:
    """Source building a tree of this structure from the names of its leaves."""
    if treedef.kind is None:
        return next(names)
    children = [_tree_expr(c, names, env) for c in treedef.children]
    if treedef.kind is dict:
        if not all(isinstance(k, (str, int)) for k in treedef.keys):
            raise _Unspellable
        return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(treedef.keys, children)) + "}"
    kind = _constant(env, treedef.kind)
    if treedef.keys:  # namedtuple
        return f"{kind}({', '.join(children)})"
    return f"{kind}([{', '.join(children)}])"


def _constant(env: dict, value) -> str:
    """A fresh name for ``value`` in the generated function's globals."""
    name = f"K{len(env)}"
    env[name] = value
    return name
