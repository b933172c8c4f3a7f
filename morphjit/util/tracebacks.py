"""Tracebacks that show the user's code, not morphjit's.

An error raised while a loss is traced travels through the compiler, the tracer and NumPy's
dispatch before it reaches the user. `trimmed` drops those frames from its traceback and keeps the
user's own (the cell or file, and the line in the loss function), so a notebook or a terminal shows
where the problem is. The frame that re-raises sets ``__tracebackhide__``, which IPython and pytest
honour, so there the compiler's frames vanish entirely.

Only errors that are the user's are trimmed: morphjit's own errors (which carry ``loc``), and any
exception raised in the user's code. An exception raised inside morphjit, NumPy or numba that is not
a `MorphjitError` is an internal failure and keeps its full traceback. ``MORPHJIT_TRACEBACK=full``
turns trimming off.
"""
from __future__ import annotations

import os
import types

from . import config
from .errors import MorphjitError, inside_package


def trimmed(error: BaseException) -> BaseException:
    """``error`` with morphjit's and NumPy's frames removed from its traceback, if it is the user's
    error (see the module docstring); returned for ``raise``."""
    tb = error.__traceback__
    if tb is None or config.full_tracebacks() or not _is_users(error, tb):
        return error
    kept = []
    while tb is not None:
        if not inside_package(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    new = None
    for entry in reversed(kept):
        new = types.TracebackType(new, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return error.with_traceback(new)


def _is_users(error: BaseException, tb: types.TracebackType) -> bool:
    if isinstance(error, MorphjitError):
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    return not (inside_package(filename) or _inside_numba(filename))


def _inside_numba(filename: str) -> bool:
    return f"{os.sep}numba{os.sep}" in filename or f"{os.sep}llvmlite{os.sep}" in filename
