"""Reductions (axes normalised and sorted; the output drops them): ``sum``, ``max``, ``min`` and
``prod``, and the rules reductions share."""
from __future__ import annotations

import numpy as np

from .. import api as A
from ..api import prod_op
from ..ir import OPS, REDUCE, TensorType, check_axes, defop, keepdims_shape, reduced_shape


def reduction_rule(name):
    def infer(types, axes, empty=None):
        (x,) = types
        check_axes(name, axes, x.ndim)
        return TensorType(reduced_shape(x.shape, axes), x.dtype)
    return infer


def expand_back(g, axes, shape):
    """Broadcast a reduced cotangent back over the reduced axes."""
    return A.broadcast_to(A.reshape(g, keepdims_shape(shape, axes)), shape)


def extremum_vjp(g, ans, x, axes, empty=None):
    """Gradient of max/min: shared equally among the elements that attain the extremum."""
    hit = A.astype(x == expand_back(ans, axes, x.shape), x.dtype)
    count = A.sum(hit, axis=axes, keepdims=True)
    return (expand_back(g, axes, x.shape) * hit / count,)


defop("sum", REDUCE, reduction_rule("sum"), lambda x, axes: np.sum(x, axis=axes, dtype=x.dtype),
            lambda g, ans, x, axes: (expand_back(g, axes, x.shape),),
      init=0.0, combine=lambda acc, x: f"{acc} + {x}")


def _extremum_impl(name: str, reduce):
    """NumPy's ``reduce`` from the compiled loops' start value (an empty reduction's result)."""
    return lambda x, axes, empty=None: reduce(x, axis=axes, initial=OPS[name].start(x.dtype))


# NaN-propagating extrema (`native.select`): reductions the loop vectoriser takes, 8-11x faster.
defop("max", REDUCE, reduction_rule("max"), _extremum_impl("max", np.max), extremum_vjp,
      init=-np.inf, combine=lambda acc, x: f"nanmaximum({acc}, {x})")
defop("min", REDUCE, reduction_rule("min"), _extremum_impl("min", np.min), extremum_vjp,
      init=np.inf, combine=lambda acc, x: f"nanminimum({acc}, {x})")


def _prod_vjp(g, ans, x, axes):
    """The product of the other elements: ans / x without zeros; with one zero, the product of the
    rest at the zero; with two or more, 0."""
    zero = x == 0
    others = A.sum(A.astype(zero, x.dtype), axis=axes, keepdims=True)
    nonzero_product = expand_back(prod_op(A.where(zero, 1.0, x), axes), axes, x.shape)
    g = expand_back(g, axes, x.shape)
    no_zero = g * nonzero_product / A.where(zero, 1.0, x)
    return (A.where(others == 0, no_zero, A.where(zero & (others == 1), g * nonzero_product, 0.0)),)


defop("prod", REDUCE, reduction_rule("prod"), lambda x, axes: np.prod(x, axis=axes, dtype=x.dtype), _prod_vjp,
      init=1.0, combine=lambda acc, x: f"{acc} * {x}")
