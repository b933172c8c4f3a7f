"""Errors that point at the user's code, not at morphjit's internals, and the source locations
they point at. A leaf module: every other module may import it."""
from __future__ import annotations

import importlib.util
import linecache
import os
import sys
from dataclasses import dataclass

import numpy as np

# Frames in these directories are not the user's code (NumPy dispatches to our tracers, SciPy's
# array-API functions call morphjit's array namespace), found without importing SciPy.
_SKIPPED_DIRS = tuple(os.path.dirname(os.path.abspath(path)) + os.sep
                      for path in (os.path.dirname(os.path.abspath(__file__)), np.__file__,
                                   importlib.util.find_spec("scipy").origin))


@dataclass(frozen=True, eq=False)
class SourceLoc:
    """Where in the user's code a binding was traced."""

    filename: str
    lineno: int
    function: str
    code: str = ""

    def __str__(self) -> str:
        text = f"{self.filename}:{self.lineno} in {self.function}"
        return f"{text}: {self.code}" if self.code else text

    @staticmethod
    def at(loc: "SourceLoc | None") -> str:
        """`` (at file.py:12)``, as messages of compiled steps place a line; '' for no location."""
        return f" (at {os.path.basename(loc.filename)}:{loc.lineno})" if loc else ""


class MorphjitError(Exception):
    """Base of morphjit's errors; ``loc`` is where in the user's code the problem arose."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc

    def __str__(self) -> str:
        return f"{self.message}\n  at {describe_location(self.loc)}" if self.loc else self.message


class ShapeError(MorphjitError, ValueError):
    """Operand shapes do not fit the op (broadcasting, matmul, axes, reshape)."""


class DtypeError(MorphjitError, TypeError):
    """An operand's dtype is not one the op accepts."""


class TracingError(MorphjitError, TypeError):
    """Python asked a traced value for something only a concrete array has."""


class IndexingError(MorphjitError, IndexError):
    """An index is out of bounds or not an integer array."""


class UnsupportedError(MorphjitError, NotImplementedError):
    """A NumPy function or construct that morphjit has no rule for."""


class RecompileWarning(UserWarning):
    """A compiled function compiles again for a reason the user may want to remove."""


class ArgumentWriteError(UnsupportedError):
    """A write, inside the traced function, into an argument or a NumPy array from outside it:
    a compiled function never changes what it was given."""


class LayoutError(UnsupportedError):
    """A write whose result would depend on a memory layout morphjit does not follow."""


class ArgumentError(MorphjitError, ValueError):
    """An argument's value is one NumPy refuses with a ValueError (a negative scale, a bound
    outside its dtype, a size the parameters of a draw do not broadcast to)."""


class ArgumentOverflowError(MorphjitError, OverflowError):
    """An argument NumPy refuses with an OverflowError (the range of a uniform draw is not finite)."""


def user_location(frame=None) -> SourceLoc | None:
    """The innermost stack frame outside the morphjit package (from ``frame`` outwards, or from
    the caller's)."""
    frame = frame or sys._getframe(1)
    while frame is not None and inside_package(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    code = linecache.getline(filename, lineno).strip()
    return SourceLoc(filename, lineno, frame.f_code.co_name, code)


def inside_package(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_SKIPPED_DIRS)


def describe_location(loc: SourceLoc) -> str:
    """``loc`` as text; a notebook or IPython cell is named as IPython does (``Cell In[3], line 5``)."""
    cell = _ipython_cell(loc.filename)
    if cell is None:
        return str(loc)
    text = f"{cell}, line {loc.lineno} in {loc.function}"
    return f"{text}: {loc.code}" if loc.code else text


def _ipython_cell(filename: str) -> str | None:
    ipython = sys.modules.get("IPython")  # only when IPython is already running
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        label = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # an IPython without format_code_name, or a replaced compiler
        return None
    return " ".join(label) if label else None
