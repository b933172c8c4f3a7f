"""The arguments of a step that are not arrays of the program, as the writers lay them out and
the runtime fills them at each call: `Addresses` (the data addresses of pooled buffers only
kernels use) and `Frame` (a table step's frame, ``morphjit.runtime.table``), with the layout of
the frame: `HEADER` words, then the arguments' addresses, then the rest, and an error record of
`RECORD` words."""
from __future__ import annotations

from dataclasses import dataclass

HEADER = 3       # frame[0:3]: offset of the first row, end of the rows, batch size
RECORD = 8       # int64 words of the error record: the value, then its position


@dataclass(frozen=True)
class Addresses:
    """A step argument: the data addresses (a uintp vector) of the pooled ``values`` that only
    kernels use, in place of one array argument each."""
    values: tuple


@dataclass(frozen=True)
class Frame:
    """The argument of a table step (``morphjit.runtime.table``) between its inputs and outputs: its
    frame, holding the data addresses of the constants and pooled ``values`` from place ``first``."""
    values: tuple
    first: int
