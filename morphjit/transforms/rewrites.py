"""Algebraic simplification of a program (the ``simplify`` pass): rewrite rules by op (`RULES`),
each looking at one binding and the bindings that define its operands; and the helpers passes
rebuild programs with (`substitute`, `rebuild`).

The rewrites keep every value, NaN and infinities included (``x * 0`` is never folded), with one
allowance: the sign of a zero. ``x + 0 -> x``, ``x - 0 -> x`` and ``sum`` over a size-1 axis
``-> reshape`` can give ``-0.0`` where the original gives ``+0.0`` (``-0.0 + 0.0 == +0.0``); the
two compare equal, and only a division by that zero could tell them apart. The default rules of
every element-wise op are added when this module loads, from the op table (complete by then:
``ops`` comes before ``transforms`` in the layer order).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from ..ir import (ELEMENTWISE, OPS, Binding, Lit, Namer, Program, Sym, TensorType, Var, broadcast_shapes,
                  dtype_name, format_binding, params_of)


# ---------------------------------------------------------------------------------------------
# Renaming values and comparing operands (shared by the passes)


def substitute(b: Binding, rename: dict[int, Var]) -> Binding:
    """``b`` reading renamed operands; ``b`` itself when none of its operands is renamed."""
    inputs = tuple(rename.get(id(x), x) if isinstance(x, Var) else x for x in b.inputs)
    if all(x is y for x, y in zip(inputs, b.inputs)):
        return b
    return Binding(b.out, b.op, inputs, b.params, b.loc)


def rebuild(program: Program, bindings: list[Binding], rename: dict[int, Var]) -> Program:
    """``program`` with new bindings and renamed outputs; ``program`` itself if nothing changed.

    A renamed value's binding is always dropped, so equal lengths mean nothing was renamed.
    """
    if len(bindings) == len(program.bindings) and all(x is y for x, y in zip(bindings, program.bindings)):
        return program
    outputs = tuple(rename.get(id(v), v) for v in program.outputs)
    return program.replace(bindings=tuple(bindings), outputs=outputs)


def exact(value):
    """A hashable key equal only for identical values: 0.0 and -0.0 differ, NaN equals NaN."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, tuple):
        return tuple(exact(v) for v in value)
    return value


def operand_key(x):
    return ("var", id(x)) if isinstance(x, Var) else ("lit", x.dtype.str, exact(x.value))


# ---------------------------------------------------------------------------------------------
# Algebraic simplification
#
# A rule looks at one binding (whose operands are already simplified) and the bindings that
# define its operands, and returns None (no match), an existing value of the binding's type
# (the binding is dropped and its readers read that value) or an Expr computing the binding's
# value another way.


class Expr(NamedTuple):
    op: str
    inputs: tuple
    params: dict = {}


Producer = Callable[[object], Binding | None]   # the binding defining an operand, if any
Rule = Callable[[Binding, Producer], Var | Expr | None]


def fill_of(x, producer: Producer) -> Binding | None:
    b = producer(x)
    return b if b is not None and b.op == "fill" else None


def constant(x, producer: Producer) -> Lit | None:
    """The scalar that ``x`` holds everywhere, if it is a literal or a fill."""
    if isinstance(x, Lit):
        return x
    fill = fill_of(x, producer)
    if fill is None or isinstance(fill.kwargs["value"], Sym):  # a batch size is no literal
        return None
    return Lit(fill.kwargs["value"], x.dtype)


def holds(x, value, producer: Producer) -> bool:
    """Whether ``x`` is ``value`` everywhere (a zero of either sign counts as 0)."""
    known = constant(x, producer)
    return known is not None and known.value == value


def fill(t: TensorType, value) -> Expr:
    return Expr("fill", (), dict(shape=t.shape, dtype=dtype_name(t.dtype), value=value))


def as_type(x, t: TensorType) -> Var | Expr:
    """``x`` (a value broadcast by an op giving ``t``) as a value of type ``t``."""
    if isinstance(x, Lit):
        return fill(t, x.value)
    return x if x.type == t else Expr("broadcast_to", (x,), dict(shape=t.shape))


# Element-wise ops (every scalar one first tries `literal_fills`, `fold_constants` and
# `absorb_broadcasts`)


def rewrite_operands(b: Binding, replacement) -> Expr | None:
    """Replace operands by ``replacement(operand)`` where that keeps the op's output shape."""
    inputs = list(b.inputs)
    for i, x in enumerate(inputs):
        new = replacement(x)
        others = [y.type.shape for j, y in enumerate(inputs) if j != i]
        if new is not None and broadcast_shapes(b.op, new.type.shape, *others) == b.out.shape:
            inputs[i] = new
    if all(x is y for x, y in zip(inputs, b.inputs)):
        return None
    return Expr(b.op, tuple(inputs), b.kwargs)


def literal_fills(b, producer):
    """A fill operand becomes a literal (when the other operands give the output shape)."""
    return rewrite_operands(b, lambda x: constant(x, producer) if fill_of(x, producer) else None)


def absorb_broadcasts(b, producer):
    """An operand broadcast to a shape the op broadcasts it to anyway is read unbroadcast."""
    def source(x):
        p = producer(x)
        return p.inputs[0] if p is not None and p.op == "broadcast_to" else None
    return rewrite_operands(b, source)


def fold_constants(b, producer):
    """An element-wise op on constants is a fill of its (NumPy-computed) value."""
    values = [constant(x, producer) for x in b.inputs]
    if any(v is None for v in values):
        return None
    with np.errstate(all="ignore"):
        result = OPS[b.op].impl(*(np.asarray(v.value, v.dtype) for v in values), **b.kwargs)
    return fill(b.out.type, b.out.dtype.type(result).item())


def drop_identity(b: Binding, value, producer: Producer, commutative=True) -> Var | Expr | None:
    """``x op value`` (and ``value op x`` if the op commutes) is ``x``, brought to the output type."""
    x, y = b.inputs
    if holds(y, value, producer):
        return as_type(x, b.out.type)
    if commutative and holds(x, value, producer):
        return as_type(y, b.out.type)
    return None


def add_zero(b, producer):
    """``x + 0`` and ``0 + x`` are ``x`` (up to the sign of a zero: see the module docstring)."""
    return drop_identity(b, 0, producer)


def sub_zero(b, producer):
    """``x - 0`` is ``x`` (up to the sign of a zero)."""
    return drop_identity(b, 0, producer, commutative=False)


def mul_one(b, producer):
    """``x * 1`` and ``1 * x`` are ``x``."""
    return drop_identity(b, 1, producer)


def pow_one(b, producer):
    """``x ** 1`` is ``x``."""
    return drop_identity(b, 1, producer, commutative=False)


def pow_zero(b, producer):
    """``x ** 0`` is 1, for every ``x`` (NaN and infinities too, as in IEEE and NumPy): the second
    derivative of ``x ** 2`` before ``pow_two`` sees it."""
    return fill(b.out.type, 1.0) if holds(b.inputs[1], 0, producer) else None


def pow_two(b, producer):
    """``x ** 2`` is ``square x``."""
    x, y = b.inputs
    return Expr("square", (x,)) if holds(y, 2, producer) and x.type == b.out.type else None


def negated(x, producer) -> Var | None:
    """``y`` when ``x`` is ``neg y``."""
    b = producer(x)
    return b.inputs[0] if b is not None and b.op == "neg" else None


def add_neg(b, producer):
    """``a + (-c)`` and ``(-c) + a`` are ``a - c``."""
    x, y = b.inputs
    for a, c in ((x, negated(y, producer)), (y, negated(x, producer))):
        if c is not None:
            return Expr("sub", (a, c))
    return None


def sub_neg(b, producer):
    """``a - (-c)`` is ``a + c``."""
    x, y = b.inputs
    c = negated(y, producer)
    return None if c is None else Expr("add", (x, c))


def double_neg(b, producer):
    """``-(-x)`` is ``x``."""
    return negated(b.inputs[0], producer)


def div_power_of_two(b, producer):
    """``x / 2**k`` is ``x * 2**-k``, exactly (both round the same real number once)."""
    x, y = b.inputs
    if not isinstance(y, Lit) or not math.isfinite(y.value) or math.frexp(y.value)[0] not in (0.5, -0.5):
        return None
    with np.errstate(all="ignore"):
        reciprocal = y.dtype.type(1) / y.dtype.type(y.value)
    if not np.isfinite(reciprocal):
        return None
    return Expr("mul", (x, Lit(reciprocal.item(), y.dtype)))


def cast_same(b, producer):
    """A cast to the operand's own dtype changes nothing."""
    (x,) = b.inputs
    return x if x.type == b.out.type else None


def where_known(b, producer):
    """``where`` with a constant condition is the operand it picks."""
    c, x, y = b.inputs
    known = constant(c, producer)
    return None if known is None else as_type(x if known.value else y, b.out.type)


def where_same(b, producer):
    """``where(c, x, x)`` is ``x``."""
    _, x, y = b.inputs
    return as_type(x, b.out.type) if operand_key(x) == operand_key(y) else None


# Views and reductions


def view_of_fill(b, producer):
    """A view of a fill is a fill of the view's shape."""
    source = fill_of(b.inputs[0], producer)
    return None if source is None else fill(b.out.type, source.kwargs["value"])


def same_shape(b, producer):
    """A reshape or broadcast to the operand's own shape changes nothing."""
    (x,) = b.inputs
    return x if x.type == b.out.type else None


def identity_transpose(b, producer):
    """A transpose by the identity permutation changes nothing."""
    (x,) = b.inputs
    return x if b.kwargs["perm"] == tuple(range(len(x.shape))) else None


def transpose_transpose(b, producer):
    """Two transposes are one, with the composed permutation."""
    inner = producer(b.inputs[0])
    if inner is None or inner.op != "transpose":
        return None
    first = inner.kwargs["perm"]
    return Expr("transpose", inner.inputs, dict(perm=tuple(first[p] for p in b.kwargs["perm"])))


def view_of_same_view(b, producer):
    """A reshape of a reshape (a broadcast of a broadcast) is one reshape (broadcast)."""
    inner = producer(b.inputs[0])
    if inner is None or inner.op != b.op:
        return None
    return Expr(b.op, inner.inputs, b.kwargs)


def reduce_unit_axes(b, producer):
    """Reducing only axes of size 1 is a reshape."""
    (x,) = b.inputs
    if any(x.shape[a] != 1 for a in b.kwargs["axes"]):
        return None
    return Expr("reshape", (x,), dict(shape=b.out.shape))


RULES: dict[str, tuple[Rule, ...]] = {
    "add": (add_zero, add_neg),
    "sub": (sub_zero, sub_neg),
    "neg": (double_neg,),
    "mul": (mul_one,),
    "div": (div_power_of_two,),
    "pow": (pow_zero, pow_one, pow_two),
    "cast": (cast_same,),
    "where": (where_known, where_same),
    "reshape": (view_of_fill, same_shape, view_of_same_view),
    "broadcast_to": (view_of_fill, same_shape, view_of_same_view),
    "transpose": (view_of_fill, identity_transpose, transpose_transpose),
    "slice": (view_of_fill,),
    "sum": (reduce_unit_axes,),
    "max": (reduce_unit_axes,),
    "min": (reduce_unit_axes,),
}
for _name, _op in OPS.items():
    if _op.kind == ELEMENTWISE and _op.scalar is not None:
        RULES[_name] = (literal_fills, fold_constants, absorb_broadcasts) + RULES.get(_name, ())


def simplify_binding(b: Binding, producer: Producer) -> Binding | Var:
    """Rewrite ``b`` until no rule applies: the final binding, or the value replacing it."""
    while True:
        for rule in RULES.get(b.op, ()):
            result = rule(b, producer)
            if result is not None:
                break
        else:
            return b
        if isinstance(result, Var):
            check_type(rule, b, result.type)
            return result
        rewritten = Binding(b.out, result.op, result.inputs, params_of(result.params), b.loc)
        check_type(rule, b, OPS[rewritten.op].infer([x.type for x in rewritten.inputs], **rewritten.kwargs))
        b = rewritten


def check_type(rule: Rule, b: Binding, t: TensorType) -> None:
    if t != b.out.type:
        raise AssertionError(f"simplify: {rule.__name__} rewrote {format_binding(b, Namer())} "
                             f"into a value of type {t}")


def uniform_consts(program: Program) -> dict[int, Binding]:
    """The constants that hold one value everywhere, as the fills they equal (by id)."""
    fills = {}
    for v, value in program.consts:
        if value.size and value.tobytes() == np.full_like(value, value.flat[0]).tobytes():
            params = dict(shape=v.shape, dtype=dtype_name(v.dtype), value=value.flat[0].item())
            fills[id(v)] = Binding(v, "fill", (), params_of(params))
    return fills


def simplify(program: Program) -> Program:
    """Apply the rewrites of ``RULES`` to a fixpoint.

    Rules look only at the producers of a binding's operands, which are final by the time the
    binding is visited (bindings are in topological order), so one sweep reaches the fixpoint.
    Replaced bindings are left for ``dce``.
    """
    rename: dict[int, Var] = {}
    defs: dict[int, Binding] = uniform_consts(program)

    def producer(x) -> Binding | None:
        return defs.get(id(x)) if isinstance(x, Var) else None

    bindings = []
    for b in program.bindings:
        result = simplify_binding(substitute(b, rename), producer)
        if isinstance(result, Var):
            rename[id(b.out)] = result
        else:
            defs[id(result.out)] = result
            bindings.append(result)
    return rebuild(program, bindings, rename)

