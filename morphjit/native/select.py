"""Choices without branches: ``select(c, a, b)``, ``a if c else b`` as one LLVM ``select``;
``nanmaximum`` and ``nanminimum``, NaN-propagating extrema the loop vectoriser reduces with.

A Python conditional expression is a branch in bytecode, and numba rebuilds SSA form once per
variable assigned on more than one path, each time walking every block of the function: a kernel
with hundreds of conditional expressions (masks, ``where``, the edge cases of special functions)
took seconds in that pass alone. The element-wise templates choose with ``select`` instead. Both
operands are evaluated, as NumPy's ``where`` evaluates both arrays; the templates pass it only
operands that are safe to evaluate everywhere.

A ``max`` reduction's ``select`` on ``x > acc or x != x`` is not a recurrence LLVM's vectoriser
knows, so the loop around it (a softmax's row) ran one element at a time; ``llvm.maximum`` is.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _unified(typingctx, a, b):
    """The type two operands are computed in (NumPy's promotion, as numba's), literals as their types."""
    return typingctx.unify_pairs(types.unliteral(a), types.unliteral(b))


def _cast(context, builder, values, value_types, to) -> list:
    return [context.cast(builder, v, t, to) for v, t in zip(values, value_types)]


@intrinsic
def select(typingctx, condition, a, b):
    chosen = _unified(typingctx, a, b)
    if not isinstance(chosen, (types.Number, types.Boolean)):
        return None

    def codegen(context, builder, signature, args):
        test = context.is_true(builder, signature.args[0], args[0])
        x, y = _cast(context, builder, args[1:], signature.args[1:], chosen)
        return builder.select(test, x, y)
    return chosen(condition, a, b), codegen


def _extremum(name: str, order: str):
    """``llvm.maximum``/``llvm.minimum`` of two floats (NaN if either is NaN), which the loop
    vectoriser takes as a reduction; integers and booleans by the comparison ``order``."""
    @intrinsic
    def extremum(typingctx, a, b):
        chosen = _unified(typingctx, a, b)
        if not isinstance(chosen, (types.Float, types.Integer, types.Boolean)):
            return None

        def codegen(context, builder, signature, args):
            x, y = _cast(context, builder, args, signature.args, chosen)
            if isinstance(chosen, types.Float):
                ty = context.get_value_type(chosen)
                return builder.call(builder.module.declare_intrinsic(name, [ty], ir.FunctionType(ty, [ty, ty])), [x, y])
            signed = isinstance(chosen, types.Integer) and chosen.signed
            return builder.select((builder.icmp_signed if signed else builder.icmp_unsigned)(order, x, y), x, y)
        return chosen(a, b), codegen
    return extremum


nanmaximum = _extremum("llvm.maximum", ">")
nanminimum = _extremum("llvm.minimum", "<")
