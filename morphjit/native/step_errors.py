"""The errors a compiled step raises where a range check fails (generated code imports this
module as ``rt``; a table step's runtime raises them from its error record): the step passes the
numbers only (what, low, extent, value, position...), and the message is formatted here, in
Python. `OUT_OF_RANGE` names them by ``RangeCheck.error``."""
from __future__ import annotations


class OutOfRange:
    """A value outside its range, raised by the compiled step with the numbers only (what, low,
    extent, value, position...): the message is formatted here, in Python."""

    def __str__(self) -> str:
        what, low, extent, value, *position = self.args
        return f"{what} must lie in [{low}, {extent}), got {value} at position ({', '.join(map(str, position))})"


class ValueOutOfRange(OutOfRange, ValueError):
    pass


class IndexOutOfRange(OutOfRange, IndexError):
    pass


class SliceOutOfRange(OutOfRange, IndexError):
    """A slice with traced bounds that NumPy's slice at the bounds of this call does not fill: an
    element of it has no position (its index is the axis length)."""

    def __str__(self) -> str:
        what, _, extent, _, element = self.args
        return (f"{what} lacks its element {element} in NumPy's slice at this call's bounds (on an axis of "
                f"{extent}): a slice with traced bounds keeps the length it was traced with, so its start and "
                f"stop must lie inside the axis (both negative, or both non-negative); for minibatches, use a "
                f"batch size that divides the data, or leave out the last, shorter batch")


class RefusedParameter(OutOfRange):
    """A traced parameter of a draw that NumPy refuses (a negative scale), found by the compiled
    step: ``what`` says which and why, the position is that of the first element refused."""

    def __str__(self) -> str:
        what, low, extent, value, *position = self.args
        return f"{what}, at position ({', '.join(map(str, position))})" if position else what


class RefusedValue(RefusedParameter, ValueError):
    pass


class RefusedRange(RefusedParameter, OverflowError):
    pass


OUT_OF_RANGE = {"ValueError": ValueOutOfRange, "IndexError": IndexOutOfRange,   # by RangeCheck.error
                "ParameterValueError": RefusedValue, "ParameterOverflowError": RefusedRange, "slice": SliceOutOfRange}
