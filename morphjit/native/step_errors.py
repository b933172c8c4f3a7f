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
    element of it has no position (its index is the axis length). ``length`` is the length of
    NumPy's slice, the first element it lacks (its positions are a run from the start)."""

    @staticmethod
    def what(location: str, length: int, nth: int = 0) -> str:
        """What the range check of a slice traced at ``location`` (`SourceLoc.at`) names: the
        ``nth`` (from 0) of those of ``length`` traced there, each with bounds of its own."""
        there = f", the {ordinal(nth + 1)} there" if nth else ""
        return f"the slice with traced bounds{location}{there}, of {length} elements,"

    @property
    def length(self) -> int:
        return self.args[4]

    def __str__(self) -> str:
        what, _, extent, _, element = self.args
        return (f"{what} lacks its element {element} in NumPy's slice at this call's bounds (on an axis of "
                f"{extent}): a slice with traced bounds keeps the length it was traced with, but where NumPy's "
                f"slice is shorter (a last minibatch at the end of the axis) a step compiled for that length runs; "
                f"not for an empty slice")


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


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
