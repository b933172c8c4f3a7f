"""Constants as source text: ``literal(value, dtype)`` keeps a float32 loop in float32, and
``Constants`` is the ``K`` the op table's scalar templates render their constants with. Here,
below the op record, because the templates of the op table and the printers of both IRs spell
constants with them."""
from __future__ import annotations

import math

import numpy as np

from .types import Sym


class Constants:
    """``K`` of a scalar template: ``K(0.5)`` renders a constant in the op's dtype, ``K.dtype``."""

    def __init__(self, dtype, render=None):
        self.dtype = np.dtype(dtype)
        self.render = render or literal

    def __call__(self, value) -> str:
        return self.render(value, self.dtype)


def literal(value, dtype) -> str:
    """A constant of ``dtype`` as source text (so float32 loops stay in float32)."""
    dtype = np.dtype(dtype)
    if isinstance(value, Sym):
        return f"np.{dtype.name}({value})"
    if dtype == np.bool_:
        return str(bool(value))
    if dtype.kind in "iu":
        return f"np.{dtype.name}({int(value)})"
    value = float(value)
    text = repr(value) if math.isfinite(value) else ("np.nan" if math.isnan(value) else
                                                     ("np.inf" if value > 0 else "-np.inf"))
    return text if dtype == np.float64 else f"np.{dtype.name}({text})"
