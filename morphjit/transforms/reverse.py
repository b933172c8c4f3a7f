"""Reverse mode on the SSA: append the backward bindings to the forward program.

The driver walks the forward bindings in reverse, asks each op's VJP rule (in the op table) for
the cotangents of its operands, sums them to the operands' shapes (undoing broadcasting, once,
here), and accumulates them. Only bindings on a path from a differentiated input to the loss
are differentiated.
"""
from __future__ import annotations

from typing import Sequence

from .. import api as A
from ..ir import OPS, Binding, Lit, NoDerivative, Program, TensorType, Var, is_float
from ..tracing import Trace, Tracer
from ..util import MorphjitError, UnsupportedError


class VJPError(MorphjitError):
    """A VJP rule broke its contract (a bug in the op table, not in user code)."""


def vjp(program: Program, wrt: Sequence[int]) -> Program:
    """The joint program: outputs are the loss, then the gradient of each ``inputs[i]``, i in wrt.

    ``program`` must have one float scalar output (the loss).
    """
    (loss,) = program.outputs
    t = Trace()
    t.bindings, t.consts = list(program.bindings), list(program.consts)
    grads = backward(t, program.bindings, loss, [program.inputs[i] for i in wrt])
    outputs = (loss,) + tuple(t.operand(g, lift_literals=True) for g in grads)
    return program.replace(bindings=tuple(t.bindings), outputs=outputs, consts=tuple(t.consts))


def backward(t: Trace, bindings: Sequence[Binding], loss, wrt: Sequence[Var]) -> list[Tracer]:
    """Append to ``t`` the reverse sweep over ``bindings`` (which compute the float scalar
    ``loss``, a value or a literal) and return the gradient of ``loss`` for each of ``wrt``.

    The backward bindings are traced ops like any others, so a program holding them can be
    differentiated again (``jit.second``)."""
    return backward_from(t, bindings, [(loss, Tracer(t, Lit(1.0, loss.dtype)))], wrt)


def backward_from(t: Trace, bindings: Sequence[Binding], seeds: Sequence[tuple], wrt: Sequence[Var],
                  origins: list | None = None) -> list[Tracer]:
    """`backward` from the cotangents ``seeds`` gives values (``(value, cotangent)`` pairs: a
    vector-Jacobian product of several outputs); a literal value has none. ``origins`` gets
    ``(index, binding)`` where the bindings of a forward binding's rule start in ``t``."""
    active = active_values(bindings, wrt)
    cotangents: dict[int, Tracer] = {}
    for value, g in seeds:
        if isinstance(value, Var):
            accumulate(cotangents, value, g)
    outer_loc = t.loc
    for b in reversed(bindings):
        g = cotangents.pop(id(b.out), None)
        if g is None or id(b.out) not in active:
            continue
        t.loc = b.loc
        if origins is not None:
            origins.append((len(t.bindings), b))
        grads = OPS[b.op].vjp(g, Tracer(t, b.out), *(Tracer(t, x) for x in b.inputs), **b.kwargs)
        if len(grads) != len(b.inputs):
            raise VJPError(f"the VJP rule of {b.op} returned {len(grads)} cotangents for {len(b.inputs)} inputs")
        for x, gx in zip(b.inputs, grads):
            if gx is None or not isinstance(x, Var) or id(x) not in active:
                continue
            if isinstance(gx, NoDerivative):
                raise UnsupportedError(f"the gradient in {gx.what} is not supported: it has no closed form; "
                                       f"wrap that argument in mj.stop_gradient to hold it constant", b.loc)
            accumulate(cotangents, x, fit_to(gx, x.type, b.op))
    t.loc = outer_loc
    return [cotangents[id(v)] if id(v) in cotangents else A.full(v.shape, 0, v.dtype, like=t)
            for v in wrt]


def active_values(bindings: Sequence[Binding], wrt: Sequence[Var]) -> set[int]:
    """Float values that depend on a differentiated input other than through ``stop_gradient``. A
    float op without a VJP rule on such a value is refused: taking its result as constant would
    give a silently wrong gradient (as would a `NoDerivative` for one, refused in `backward`)."""
    active = {id(v) for v in wrt}
    for b in bindings:
        if b.op == "stop_gradient":
            continue
        if is_float(b.out.dtype) and any(id(x) in active for x in b.inputs if isinstance(x, Var)):
            if not OPS[b.op].differentiable:
                raise UnsupportedError(f"{b.op} has no VJP rule, but its float result depends on a "
                                       f"differentiated value; wrap its operands in mj.stop_gradient if no "
                                       f"gradient should flow through it", b.loc)
            active.add(id(b.out))
    return active


def accumulate(cotangents: dict[int, Tracer], x: Var, g: Tracer) -> None:
    previous = cotangents.get(id(x))
    cotangents[id(x)] = g if previous is None else previous + g


def fit_to(g, target: TensorType, op: str):
    """Sum a cotangent over the axes its operand was broadcast along (or broadcast it up)."""
    if g.dtype != target.dtype:
        raise VJPError(f"the VJP rule of {op} gave a {g.dtype} cotangent for a {target.dtype} operand")
    shape = target.shape
    lead = g.ndim - len(shape)
    if lead >= 0:
        axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                          if d == 1 and g.shape[lead + i] != 1)
        if axes:
            g = A.sum(g, axis=axes, keepdims=True)
        g = A.reshape(g, g.shape[lead:])
    return A.broadcast_to(g, shape)
