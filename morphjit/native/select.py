"""``select(c, a, b)``: ``a if c else b`` as one LLVM ``select``, without a branch.

A Python conditional expression is a branch in bytecode, and numba rebuilds SSA form once per
variable assigned on more than one path, each time walking every block of the function: a kernel
with hundreds of conditional expressions (masks, ``where``, the edge cases of special functions)
took seconds in that pass alone. The element-wise templates choose with ``select`` instead. Both
operands are evaluated, as NumPy's ``where`` evaluates both arrays; the templates pass it only
operands that are safe to evaluate everywhere.
"""
from __future__ import annotations

from numba import types
from numba.extending import intrinsic


@intrinsic
def select(typingctx, condition, a, b):
    chosen = typingctx.unify_pairs(types.unliteral(a), types.unliteral(b))
    if chosen is None or not isinstance(chosen, (types.Number, types.Boolean)):
        return None

    def codegen(context, builder, signature, args):
        test, x, y = args
        test = context.is_true(builder, signature.args[0], test)
        x = context.cast(builder, x, signature.args[1], chosen)
        y = context.cast(builder, y, signature.args[2], chosen)
        return builder.select(test, x, y)
    return chosen(condition, a, b), codegen
