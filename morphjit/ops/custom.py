"""``stop_gradient``: the identity, with no gradient flowing back through it. (The ops of
``custom_vjp`` functions are declared by ``morphjit.api.custom`` as each function gets its rule.)"""
from __future__ import annotations

from ..ir import ANY
from .elementwise import elementwise

elementwise("stop_gradient", lambda x: x, lambda K, x: x, lambda g, ans, x: (None,), kinds=ANY)
