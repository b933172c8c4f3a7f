"""SciPy's Bessel functions of real argument, element-wise ops whose templates call SciPy's own
kernels: of the first and second kinds ``j0``, ``j1``, ``y0``, ``y1``, the modified ones ``i0``,
``i1``, and of real order ``v`` ``iv`` (first kind, modified) and ``kv`` (second kind, modified).
Their gradients in x are the recurrences (DLMF 10.6, 10.29); in the order v there is no closed
form, and the gradient is refused where v is differentiated.
"""
from __future__ import annotations

import scipy.special as sp

from .. import api as A
from ..api import i0, i1, iv, j0, j1, kv, y0, y1
from ..ir import EXPENSIVE
from .elementwise import elementwise
from .special import kernel_template, no_derivative


def _order_one_vjp(order_zero, order_one):
    """``f1' = f0 - f1 / x`` (j1, i1), 1/2 at x = 0, its limit there."""
    def vjp(g, ans, x):
        nonzero = x != 0.0
        safe = A.where(nonzero, x, 1.0)
        return (g * A.where(nonzero, order_zero(x) - order_one(safe) / safe, 0.5),)
    return vjp


def _order_v_vjp(name, fn, sign):
    """``f_v' = sign (f_{v-1} + f_{v+1}) / 2`` (iv: +1, kv: -1); none in v."""
    return lambda g, ans, v, x: (no_derivative(name, "order v"), sign * 0.5 * g * (fn(v - 1.0, x) + fn(v + 1.0, x)))


for _name, _impl, _vjp in [
        ("j0", sp.j0, lambda g, ans, x: (-g * j1(x),)),
        ("j1", sp.j1, _order_one_vjp(j0, j1)),
        ("y0", sp.y0, lambda g, ans, x: (-g * y1(x),)),
        ("y1", sp.y1, lambda g, ans, x: (g * (y0(x) - y1(x) / x),)),
        ("i0", sp.i0, lambda g, ans, x: (g * i1(x),)),
        ("i1", sp.i1, _order_one_vjp(i0, i1)),
        ("iv", sp.iv, _order_v_vjp("iv", iv, 1.0)),
        ("kv", sp.kv, _order_v_vjp("kv", kv, -1.0))]:
    elementwise(_name, _impl, kernel_template(_name), _vjp, cost=EXPENSIVE)
