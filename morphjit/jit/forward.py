"""Forward mode and Jacobians, with JAX's signatures: `jvp`, `vjp`, `jacfwd`, `jacrev` and
`jacobian`.

Inside a traced function each traces into it at fresh points (``nest``); outside, each compiles a
forward step of the same traced computation (one per function, shapes static). Forward mode is
reverse mode transposed: the reverse sweep from a cotangent seed ``g`` of the outputs (a traced
zero) is linear in ``g``, so the gradient of ``<vjp(g), u>`` with respect to ``g`` is ``J u``, and
the passes drop what it no longer needs of the first sweep. A backward rule that is not linear in
its cotangent (a ``custom_vjp`` that clips it) has no forward mode and is refused.
"""
from __future__ import annotations

import weakref
from collections import deque

import numpy as np

from .. import api as A
from ..ir import Specialize, Sym, Var, is_float
from ..tracing import Tracer
from ..transforms import backward, backward_from
from ..util import DtypeError, ShapeError, TracingError, UnsupportedError, pytree, user_location
from . import nest
from .compiled import CompiledFunction

class NotLinearError(UnsupportedError):
    """Forward mode through a backward rule that is not linear in its cotangent."""


MAX_BASIS = 256   # sweeps a Jacobian unrolls: one per element of the inputs (jacfwd) or outputs (jacrev)


class Region:
    """``fn`` traced at fresh points of the arguments ``argnums``: its output and what the sweeps
    over it need."""

    def __init__(self, t, fn, args, argnums, what: str):
        self.t, self.what = t, what
        args, self.points, self.trees = nest.with_points(t, fn, tuple(args), argnums, what)
        self.wrt = [p.operand for p in self.points]
        self.start = len(t.bindings)
        self.out = fn(*args)
        self.origins: list = []   # where the rule of each forward binding starts in the sweeps
        self.seeded = len(t.bindings)   # where the cotangent seeds of a pushforward start

    def traced(self, x, dtype=None) -> Tracer:
        """``x`` as a traced value (an array or number as a constant)."""
        if isinstance(x, Tracer):
            return x
        return Tracer(self.t, self.t.operand(np.asarray(x, dtype), lift_literals=True))

    def outputs(self, out) -> tuple[list, pytree.TreeDef]:
        """The output's leaves (traced values) and its tree."""
        leaves, tree = pytree.flatten(out)
        return [self.traced(x) for x in leaves], tree

    def pullback(self, outs: list, cotangents: list) -> list:
        """The cotangents of the points, from those of ``outs`` (reverse mode; None: none)."""
        t = self.t
        seeds = [(x.operand, self.traced(g, x.dtype)) for x, g in zip(outs, cotangents)
                 if g is not None and is_float(x.dtype)]
        return backward_from(t, t.bindings[self.start:], seeds, self.wrt, self.origins)

    def pushforward(self, outs: list):
        """A function of tangents of the points giving those of ``outs`` (forward mode, reverse mode
        transposed: see the module's docstring)."""
        t = self.t
        floats = [i for i, x in enumerate(outs) if is_float(x.dtype)]
        self.seeded = len(t.bindings)
        seeds = {i: A.full(outs[i].shape, 0, outs[i].dtype, like=t) for i in floats}
        sweep = len(t.bindings)      # the sweep from the seeds (which the second one differentiates by)
        cotangents = self.pullback(outs, [seeds.get(i) for i in range(len(outs))])
        gs = [seeds[i].operand for i in floats]

        def apply(tangents: list) -> list:
            terms = [A.sum(c * u) for c, u in zip(cotangents, tangents)]
            pushed = {}
            if terms and gs:
                loss = t.operand(sum(terms[1:], terms[0]), lift_literals=True)
                pushed = dict(zip(floats, backward(t, t.bindings[sweep:], loss, gs)))
                self.check_linear(list(pushed.values()), gs)
            return [pushed[i] if i in pushed else A.full(x.shape, 0, x.dtype, like=t) for i, x in enumerate(outs)]
        return apply

    def check_linear(self, tangents: list, seeds: list[Var]) -> None:
        """Refuse tangents that read a cotangent seed: a backward rule that is not linear in it
        (named: the rule that bound the first value on the way that depends on a seed)."""
        depends = {id(g) for g in seeds}
        for b in self.t.bindings[self.seeded:]:
            if any(id(x) in depends for x in b.inputs):
                depends.add(id(b.out))
        todo, seen = deque(x.operand for x in tangents), set()
        while todo:
            v = todo.popleft()
            if not isinstance(v, Var) or id(v) in seen:
                continue
            seen.add(id(v))
            b = self.t.producers.get(id(v))
            if b is None:
                continue
            if id(v) in depends:
                raise NotLinearError(f"{self.what}: the backward rule of {self.rule_of(b)} tests or clips its "
                                       f"cotangent (it is not linear in it), so forward mode through it is not "
                                       f"defined by it; differentiate it in reverse mode (mj.grad, mj.vjp, mj.jacrev)",
                                       b.loc)
            todo.extend(b.inputs)

    def rule_of(self, made) -> str:
        """The op of the region whose backward rule bound ``made``."""
        index = next(i for i, b in enumerate(self.t.bindings) if b is made)
        owners = [b for start, b in self.origins if start <= index]
        return A.op_label(owners[-1].op) if owners else "an op"


def traced_jvp(t, fun, primals, tangents, has_aux: bool, what: str = "mj.jvp"):
    """``(outputs, tangents of the outputs[, aux])`` of ``fun(*primals)``, traced into ``t``."""
    primals, tangents = _sequences(primals, tangents)
    argnums = tuple(range(len(primals)))
    with nest.transformation(what, fun, nest.argnums_text(fun, primals, argnums), user_location()):
        _check_tangents(primals, tangents)
        region = Region(t, fun, primals, argnums, what)
        out, aux = nest.split_aux(fun, region.out, has_aux)
        outs, tree = region.outputs(out)
        pushed = region.pushforward(outs)(pytree.flatten(tuple(tangents))[0])
    result = (out, pytree.unflatten(tree, pushed))
    return result + (aux,) if has_aux else result


def traced_vjp(t, fun, primals, has_aux: bool):
    """``(outputs, vjp_fn[, aux])`` of ``fun(*primals)``, traced into ``t``."""
    argnums = tuple(range(len(primals)))
    with nest.transformation("mj.vjp", fun, nest.argnums_text(fun, primals, argnums), user_location()):
        region = Region(t, fun, primals, argnums, "mj.vjp")
        out, aux = nest.split_aux(fun, region.out, has_aux)
        outs, tree = region.outputs(out)

    def vjp_fn(cotangent):
        """The cotangents of the primals (a tuple, one per primal) from one of the outputs."""
        leaves, ct_tree = pytree.flatten(cotangent)
        if ct_tree != tree:
            raise TracingError(f"mj.vjp: the cotangent must have the structure of the output, {tree}; got "
                               f"{ct_tree}", user_location())
        for i, (x, c) in enumerate(zip(outs, leaves)):
            if (tuple(x.shape), x.dtype) != (tuple(np.shape(c)), _dtype(c)):
                raise ShapeError(f"mj.vjp: cotangent leaf {i} is {_dtype(c)}{list(np.shape(c))}, but the output "
                                 f"it is for is {x.dtype}{list(x.shape)}", user_location())
        grads = region.pullback(outs, leaves)
        return tuple(_per_argument(region.trees, grads))
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def traced_jacobian(t, fun, args, argnums, has_aux: bool, mode: str, max_basis: int):
    """The Jacobian of ``fun`` at ``args`` (``out.shape + in.shape`` per output and argument),
    traced into ``t`` by one sweep per input element (``jacfwd``) or output element (``jacrev``)."""
    what = f"mj.{mode}"
    with nest.transformation(what, fun, nest.argnums_text(fun, args, argnums), user_location()):
        region = Region(t, fun, args, argnums, what)
        out, aux = nest.split_aux(fun, region.out, has_aux)
        outs, tree = region.outputs(out)
        ins = region.points
        basis = ins if mode == "jacfwd" else outs
        _check_basis(what, basis, max_basis)
        if mode == "jacfwd":
            push = region.pushforward(outs)
            columns = [push(tangents) for tangents in _unit_vectors(ins)]    # [in element][out leaf]
            blocks = [[_stacked([c[o] for c in columns[a:b]], x.shape, outs[o].shape) for a, b, x in _spans(ins)]
                      for o in range(len(outs))]
        else:
            rows = [region.pullback(outs, seeds) for seeds in _unit_vectors(outs)]    # [out element][in leaf]
            blocks = [[_stacked([r[i] for r in rows[a:b]], x.shape, ins[i].shape, leading=True)
                       for i in range(len(ins))] for a, b, x in _spans(outs)]
    per_output = [_per_argument(region.trees, row) for row in blocks]
    single = not isinstance(argnums, (tuple, list))
    jac = pytree.unflatten(tree, [p[0] if single else tuple(p) for p in per_output])
    return (jac, aux) if has_aux else jac


def _stacked(vectors: list, basis_shape, other_shape, leading: bool = False):
    """The block of one output and one input: ``out.shape + in.shape``; ``vectors`` are one per
    element of the basis leaf (shaped ``other_shape``)."""
    stack = A.stack(vectors, axis=0)
    if leading:     # rows of jacrev: basis (the output) first
        return A.reshape(stack, tuple(basis_shape) + tuple(other_shape))
    moved = A.moveaxis(stack, 0, -1)
    return A.reshape(moved, tuple(other_shape) + tuple(basis_shape))


def _spans(leaves):
    at = 0
    for x in leaves:
        n = int(np.prod(x.shape, dtype=np.int64))
        yield at, at + n, x
        at += n


def _unit_vectors(leaves):
    """One list of arrays shaped like ``leaves`` per element of them, each with a single 1."""
    for k, x in enumerate(leaves):
        for j in range(int(np.prod(x.shape, dtype=np.int64))):
            unit = [np.zeros(y.shape, y.dtype) for y in leaves]
            unit[k].flat[j] = 1
            yield unit


def _check_basis(what: str, leaves, max_basis: int) -> None:
    if any(isinstance(d, Sym) for x in leaves for d in x.shape):
        raise Specialize("a Jacobian's basis over the batch extent")
    n = sum(int(np.prod(x.shape, dtype=np.int64)) for x in leaves)
    if n > max_basis:
        raise ShapeError(f"{what}: the Jacobian needs {n} sweeps (one per element), above max_basis={max_basis}: "
                         f"the program would be {n} sweeps long. For each row's derivatives use the rows' "
                         f"structure (mj.grad of a sum, mj.jvp along a direction tiled over the rows); for H v "
                         f"use mj.hvp; pass max_basis= to raise the bound", user_location())


def _per_argument(trees, leaves) -> list:
    out, at = [], 0
    for treedef in trees:
        out.append(pytree.unflatten(treedef, leaves[at:at + treedef.num_leaves]))
        at += treedef.num_leaves
    return out


def _sequences(primals, tangents) -> tuple[tuple, tuple]:
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError(f"mj.jvp takes the primals and the tangents as tuples or lists (one entry per argument "
                        f"of the function), got {type(primals).__name__} and {type(tangents).__name__}")
    if len(primals) != len(tangents):
        raise TypeError(f"mj.jvp: {len(primals)} primals but {len(tangents)} tangents")
    return tuple(primals), tuple(tangents)


def _check_tangents(primals: tuple, tangents: tuple) -> None:
    p_leaves, p_tree = pytree.flatten(primals)
    t_leaves, t_tree = pytree.flatten(tangents)
    if p_tree != t_tree:
        raise TracingError(f"mj.jvp: the tangents must have the structure of the primals, {p_tree}; got {t_tree}",
                           user_location())
    for path, p, u in zip(pytree.leaf_paths(t_tree, "tangents"), p_leaves, t_leaves):
        if tuple(np.shape(p)) != tuple(np.shape(u)):
            raise ShapeError(f"mj.jvp: {path} has shape {np.shape(u)}, but its primal has {np.shape(p)}",
                             user_location())
        if _dtype(p) != _dtype(u):
            raise DtypeError(f"mj.jvp: {path} is {_dtype(u)}, but its primal is {_dtype(p)}", user_location())


def _dtype(x) -> np.dtype:
    return x.dtype if isinstance(x, (Tracer, np.ndarray, np.generic)) else np.result_type(type(x))


# Outside a traced function: one compiled forward step per function and settings.

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compiled(fun, key, make):
    """The compiled forward step for ``fun`` and ``key`` (made by ``make(fun)`` once)."""
    try:
        by_key = _COMPILED.setdefault(fun, {})
    except TypeError:            # not weakly referable: compiled for this call only
        return make(fun)
    if key not in by_key:
        by_key[key] = make(fun)
    return by_key[key]


def _wrapper(fun, body):
    """``body(fun)`` as a compiled forward step that captures what ``fun`` captures."""
    def make(f):
        step = body(f)
        step.__name__ = step.__qualname__ = getattr(f, "__name__", "fun")
        step.traces = (f, make)
        return step
    return CompiledFunction(make(fun), static_shapes=True)


def jvp(fun, primals, tangents, has_aux=False):
    """JAX's ``jvp``: ``(fun(*primals), J tangents)`` (with ``has_aux``, ``fun`` returns ``(out,
    aux)`` and the result is ``(out, tangents_out, aux)``); ``tangents`` shaped like ``primals`` (the
    same tree, shapes and dtypes). Inside a traced function it traces into it; outside it runs a
    compiled step (one per function)."""
    __tracebackhide__ = True  # noqa: F841
    primals, tangents = _sequences(primals, tangents)
    t = nest.enclosing_trace((primals, tangents), {})
    if t is not None:
        return traced_jvp(t, fun, primals, tangents, has_aux)
    step = _compiled(fun, ("jvp", has_aux), lambda f: _wrapper(f, lambda g: lambda primals, tangents: traced_jvp(
        nest.enclosing_trace((primals,), {}), g, primals, tangents, has_aux)))
    return step(primals, tangents)


def vjp(fun, *primals, has_aux=False):
    """JAX's ``vjp``: ``(fun(*primals), vjp_fn)`` (``(out, vjp_fn, aux)`` with ``has_aux``), where
    ``vjp_fn(cotangent)`` is the tuple of cotangents of the primals for a cotangent shaped like the
    output. Outside a traced function the output and each ``vjp_fn`` call are compiled steps, the
    latter computing the forward again."""
    __tracebackhide__ = True  # noqa: F841
    t = nest.enclosing_trace(primals, {})
    if t is not None:
        return traced_vjp(t, fun, primals, has_aux)
    forward = _compiled(fun, ("vjp-forward",), lambda f: CompiledFunction(f, static_shapes=True))
    pulled = _compiled(fun, ("vjp", has_aux), lambda f: _wrapper(f, lambda g: lambda primals, ct: traced_vjp(
        nest.enclosing_trace((primals,), {}), g, primals, has_aux)[1](ct)))
    out = forward(*primals)
    value, aux = nest.split_aux(fun, out, has_aux)

    def vjp_fn(cotangent):
        return pulled(tuple(primals), cotangent)
    return (value, vjp_fn, aux) if has_aux else (value, vjp_fn)


def _jacobian_of(mode: str):
    def make_jacobian(fun, argnums=0, has_aux=False, *, max_basis=MAX_BASIS):
        def jacobian_fn(*args):
            __tracebackhide__ = True  # noqa: F841
            t = nest.enclosing_trace(args, {})
            if t is not None:
                return traced_jacobian(t, fun, args, argnums, has_aux, mode, max_basis)
            key = (mode, argnums, has_aux, max_basis)
            step = _compiled(fun, key, lambda f: _wrapper(f, lambda g: lambda *a: traced_jacobian(
                nest.enclosing_trace(a, {}), g, a, argnums, has_aux, mode, max_basis)))
            return step(*args)
        jacobian_fn.__name__ = f"{mode}_{getattr(fun, '__name__', 'fun')}"
        return jacobian_fn
    return make_jacobian


jacfwd = _jacobian_of("jacfwd")
jacfwd.__name__ = jacfwd.__qualname__ = "jacfwd"
jacfwd.__doc__ = """JAX's ``jacfwd``: ``jacfwd(fun, argnums=0)(*args)`` is the Jacobian of ``fun`` with
respect to ``args[argnums]``, shaped ``out.shape + in.shape`` for each output and argument (a tuple
over argnums when it is a tuple), by one forward sweep per input element (at most ``max_basis``).
Inside a traced function it traces into it; outside it runs a compiled step."""
jacrev = _jacobian_of("jacrev")
jacrev.__name__ = jacrev.__qualname__ = "jacrev"
jacrev.__doc__ = """JAX's ``jacrev``: as `jacfwd`, by one reverse sweep per output element."""
jacobian = jacrev
