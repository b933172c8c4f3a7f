"""``stop_gradient``: the identity, with no gradient flowing back through it; ``identity``: the
point a derivative inside a traced function is taken at (``morphjit.jit.nest``), a value of its
own, expanded away after differentiation; ``branch_gate``: the
identity of an input on one path through the tests of traced values, with the gradient where that
path is the one taken (``morphjit.tracing.branches``). (The ops of ``custom_vjp`` functions are
declared by ``morphjit.api.custom`` as each function gets its rule.)"""
from __future__ import annotations

import numpy as np

from .. import api as A
from ..ir import ANY, ELEMENTWISE, FLOAT, TensorType, defop, elementwise_rule
from ..util import DtypeError
from .elementwise import elementwise

elementwise("stop_gradient", lambda x: x, lambda K, x: x, lambda g, ans, x: (None,), kinds=ANY)
defop("identity", ELEMENTWISE, elementwise_rule("identity", FLOAT), lambda x: x, lambda g, ans, x: (g,),
      scalar=lambda K, x: x, lower=lambda x: x)


def _gate_rule(types):
    x, taken = types
    if taken.dtype != np.bool_ or taken.shape != ():
        raise DtypeError(f"branch_gate: whether the path is taken must be a boolean scalar, got {taken}")
    return TensorType(x.shape, x.dtype)


defop("branch_gate", ELEMENTWISE, _gate_rule, lambda x, taken: x,
      lambda g, ans, x, taken: (A.where(taken, g, 0.0), None),
      scalar=lambda K, x, taken: x, lower=lambda x, taken: x)
