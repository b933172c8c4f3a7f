"""Autodiff helpers users expect from JAX: ``stop_gradient`` and ``custom_vjp``.

``stop_gradient`` binds an identity op whose VJP is zero (``morphjit.ops.custom``). A
``custom_vjp`` function becomes an op of its own (a composite, declared here when the function
gets its rule): its shape rule traces the function, its reference runs it on NumPy arrays, its
lowering traces it into the caller's program, and its VJP is the user's backward rule, traced
into the same program as everything else.
"""
from __future__ import annotations

import functools
import itertools

from ..ir import COMPOSITE, Var, defop
from ..tracing import Trace, Tracer
from ..util import TracingError, user_location
from . import core as A


def stop_gradient(x):
    """``x``, with no gradient flowing back through it."""
    return A.bind("stop_gradient", [A.as_array(x)])


_numbers = itertools.count()
USER_OP_PREFIX = "custom_vjp_"


def is_user_op(name: str) -> bool:
    """Ops that ``custom_vjp`` functions register (the op-table coverage tests skip them)."""
    return name.startswith(USER_OP_PREFIX)


def op_label(name: str) -> str:
    """How messages name the op ``name``: a ``custom_vjp``'s by its function."""
    if not is_user_op(name):
        return name
    return f"{name[len(USER_OP_PREFIX):].rsplit('_', 1)[0]} (a custom_vjp)"


class custom_vjp:
    """A function with a user-written backward rule (JAX's ``jax.custom_vjp``)::

        @mj.custom_vjp
        def clip_gradient(x):
            return x

        def fwd(x):
            return x, None                   # the output and the residuals bwd needs

        def bwd(residuals, g):
            return (np.clip(g, -1, 1),)       # one cotangent per argument

        clip_gradient.defvjp(fwd, bwd)

    The arguments are arrays (all differentiable) and the result is one array.
    """

    def __init__(self, fun):
        self.fun = fun
        self.op_name = None
        functools.update_wrapper(self, fun)

    def defvjp(self, fwd, bwd):
        self.op_name = f"{USER_OP_PREFIX}{getattr(self.fun, '__name__', 'fn')}_{next(_numbers)}"

        def vjp(g, ans, *xs):
            _, residuals = fwd(*xs)
            grads = tuple(bwd(residuals, g))
            if len(grads) != len(xs):
                raise TracingError(f"{self.__name__}: the backward rule returned {len(grads)} cotangents for "
                                   f"{len(xs)} arguments", user_location())
            return grads

        defop(self.op_name, COMPOSITE, self._infer, self.fun, vjp, lower=self.fun)
        return self

    def _infer(self, types):
        t = Trace()
        out = self.fun(*(Tracer(t, Var(tp)) for tp in types))
        if not isinstance(out, Tracer):
            raise TracingError(f"{self.__name__}: a custom_vjp function must return one array",
                               user_location())
        return out.type

    def __call__(self, *args):
        if self.op_name is None:
            raise TracingError(f"{self.__name__}: call defvjp(fwd, bwd) before using a custom_vjp function",
                               user_location())
        operands = [A.as_array(a) for a in args]
        if A.trace_of(operands) is None:
            return self.fun(*operands)
        return A.bind(self.op_name, operands)
