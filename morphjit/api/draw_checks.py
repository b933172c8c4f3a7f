"""The arguments of a random draw, checked as NumPy checks them (for ``random.py``'s traced
generators and ``mj.random``): sizes, dtypes, integer bounds, and the parameters' shapes and
values. A parameter known when the loss is traced is checked then, with NumPy's error type and a
message naming the method, the argument and the user's line. A traced parameter is checked by
the compiled step on every call: the ``check_parameter`` op (``morphjit.ops.random``) passes it on
unchanged and has the step raise (``backend.plan.range_checks``) where NumPy would, at the first element
NumPy refuses.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir import Sym, broadcast_shapes
from ..tracing import SUPPORTED_DTYPES, Tracer
from ..util import (ArgumentError, ArgumentOverflowError, DtypeError, ShapeError, TracingError, UnsupportedError,
                    user_location)
from . import core as A

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
UNIFORM_INTEGERS = 2 ** 53   # integers are floor(low + u * n), u of 53 bits: exact for n up to this


# ---------------------------------------------------------------------------------------------
# Sizes and dtypes


def shape_of_size(size, method: str) -> tuple | None:
    """``size`` as a shape (None stays None): an integer, or a sequence or 1-d array of them (the
    symbolic batch size among them), none negative."""
    if size is None:
        return None
    dims = size if isinstance(size, (tuple, list)) or isinstance(size, np.ndarray) and size.ndim == 1 else (size,)
    return tuple(dimension(d, method, size) for d in dims)


def dimension(d, method: str, size=None):
    """One extent of a shape: a non-negative integer (not a bool, as NumPy has it) or the batch size."""
    if isinstance(d, Sym):
        return d
    if isinstance(d, Tracer):
        raise TracingError(f"{method}: a size must be known when the loss is traced, got a traced value",
                           user_location())
    try:
        if isinstance(d, (bool, np.bool_)):
            raise TypeError
        d = operator.index(d)
    except TypeError:
        raise DtypeError(f"{method}: a size must be integers, got {size if size is not None else d!r}",
                         user_location()) from None
    if d < 0:
        raise ArgumentError(f"{method}: negative dimensions are not allowed, got size "
                            f"{size if size is not None else d!r}", user_location())
    return d


def float_dtype(dtype, method: str) -> np.dtype:
    """``dtype`` of a float draw: float32 or float64."""
    dtype = np.dtype(dtype)
    if dtype not in FLOATS:
        raise DtypeError(f"{method}: unsupported dtype {dtype} (float32 or float64)", user_location())
    return dtype


def draw_shape(method: str, size: tuple | None, **params) -> tuple:
    """The shape of a draw: ``size``, which the parameters (by name) must broadcast to (NumPy's
    rule: one draw per element, never one reused across a batch), or else their broadcast shape."""
    shapes = {name: A.shape_of(p) for name, p in params.items()}
    broadcast = _broadcast(method, *shapes.values())
    if broadcast is None:
        named = " and ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ArgumentError(f"{method}: the shapes of {named} do not broadcast together", user_location())
    if size is None:
        return broadcast
    if _broadcast(method, size, broadcast) != size:
        raise ArgumentError(f"{method}: size {size} is not compatible with the broadcast shape {broadcast} of "
                            f"{', '.join(params)} (they must broadcast to size: one draw per element)", user_location())
    return size


def _broadcast(method: str, *shapes) -> tuple | None:
    try:
        return broadcast_shapes(method, *shapes)
    except ShapeError:
        return None


# ---------------------------------------------------------------------------------------------
# Parameter values


@dataclass(frozen=True)
class Constraint:
    """What NumPy requires of a parameter: ``refused(x)`` marks the elements it refuses (the
    same function of a NumPy array and of a traced value), ``message`` names the problem (with
    ``{name}``), ``error`` is NumPy's exception."""
    message: str
    refused: Callable
    error: type = ArgumentError


def _negative(x):
    return (np.copysign(1.0, x) < 0) & np.logical_not(np.isnan(x))   # NumPy refuses -0.0 too


NON_NEGATIVE = Constraint("{name} < 0", _negative)
PROBABILITY = Constraint("{name} < 0, {name} > 1 or {name} is NaN", lambda x: np.logical_not((x >= 0) & (x <= 1)))
KEEP_RATE = Constraint("{name} must lie in [0, 1)", lambda x: np.logical_not((x >= 0) & (x < 1)))
FINITE = Constraint("{name} range exceeds valid bounds (it is not finite)", lambda x: np.logical_not(np.isfinite(x)),
                    ArgumentOverflowError)
ORDERED = Constraint("{name} < 0", lambda x: x < 0)
RUN_TIME_ERRORS = {ArgumentError: "ParameterValueError", ArgumentOverflowError: "ParameterOverflowError"}


def checked(value, method: str, name: str, *constraints: Constraint):
    """Parameter ``name`` of ``method`` as the draw uses it (traced, a Python number, or a float64
    array converted as NumPy converts it), checked against ``constraints``: now if it is known,
    else by the compiled step each time it runs."""
    value = _parameter(value, method, name)
    for constraint in constraints:
        message = f"{method}: {constraint.message.format(name=name)}"
        if isinstance(value, Tracer):
            value = A.bind("check_parameter", [value, constraint.refused(value)], what=message,
                           error=RUN_TIME_ERRORS[constraint.error])
            continue
        array = np.asarray(value, np.float64)
        refused = np.flatnonzero(constraint.refused(array))
        if refused.size:
            index = "".join(f"[{i}]" for i in np.unravel_index(refused[0], array.shape))
            raise constraint.error(f"{message} ({name}{index} is {array.flat[refused[0]]})", user_location())
    return value


def _parameter(value, method: str, name: str):
    if isinstance(value, Tracer) and value.concrete() is not None:   # a buffer the function made with NumPy
        value = value.concrete()
    if isinstance(value, Tracer) or type(value) in (int, float):
        return value
    try:
        return np.asarray(value, np.float64)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{method}: {name} must be a float or an array of floats: {error}") from None


# ---------------------------------------------------------------------------------------------
# Integer draws


def integer_bound(value, method: str, name: str) -> int:
    """A bound of an integer draw, as NumPy converts a scalar one (``int()``: 2.7 is 2)."""
    if isinstance(value, Tracer):
        raise UnsupportedError(f"{method}: {name} must be known when the loss is traced, got a traced value",
                               user_location())
    array = np.asarray(value)
    if array.ndim:
        raise UnsupportedError(f"{method}: {name} must be a scalar inside a compiled loss, got shape {array.shape}",
                               user_location())
    try:
        return int(array)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{method}: {name} must be an integer, got {value!r}") from None


def integer_dtype(dtype, method: str) -> np.dtype:
    """``dtype`` of an integer draw: NumPy's integer and bool dtypes, of which a compiled loss has
    int32, int64 and bool."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biu":
        raise DtypeError(f"{method}: unsupported dtype {dtype} (an integer or bool dtype)", user_location())
    if dtype not in SUPPORTED_DTYPES:
        raise DtypeError(f"{method}: dtype {dtype} is not supported inside a compiled loss (int32, int64 or bool)",
                         user_location())
    return dtype


def integer_range(low, high, dtype: np.dtype, closed: bool, method: str) -> tuple[int, int]:
    """``(low, count)``: the first value and how many there are, checked as NumPy checks them
    (bounds inside the dtype, ``low < high``, or ``low <= high`` when ``closed``)."""
    smallest, largest = (0, 1) if dtype.kind == "b" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    if low < smallest:
        raise ArgumentError(f"{method}: low is out of bounds for {dtype} (low={low})", user_location())
    if high > largest + (not closed):
        raise ArgumentError(f"{method}: high is out of bounds for {dtype} (high={high})", user_location())
    count = high - low + closed
    if count <= 0:
        raise ArgumentError(f"{method}: low {'>' if closed else '>='} high ({low}, {high})", user_location())
    if count > UNIFORM_INTEGERS:
        raise UnsupportedError(f"{method}: a range of {count} integers is drawn uniformly only up to 2**53 values "
                               f"inside a compiled loss", user_location())
    return low, count
