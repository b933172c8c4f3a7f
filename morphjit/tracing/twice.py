"""No value silently frozen at trace time: a function is traced twice, and the two programs must agree.

Arrays and Python numbers a loss computes without its arguments (a closure's array, ``np.arange``,
a mask built from shapes) enter the compiled step as constants, fixed when it is traced. That is
right only for values that would be the same if the function ran again. Tracing twice and comparing
the programs (ops, parameters, literals and the bytes of every constant) catches the others, such
as draws from a global random generator, a global the function updates in place or the time, and
names the line where the value entered. Draws from NumPy's or Python's global generator that leave
no trace in the program's values (a coin flip that came up the same twice) are caught by the
generator's state moving during the trace.
"""
from __future__ import annotations

import linecache
import os
import random as py_random
import sys
import sysconfig

import numpy as np

from ..ir import Binding, Lit, Program, Var
from ..util import SourceLoc, TracingError, inside_package
from .function import trace_with_tree

HINT = ("draw random numbers from a generator passed as an argument (loss(params, x, rng) with "
        "rng = np.random.default_rng(seed); see mj.random), and pass other values that change "
        "between calls (a global updated in place, the time) as arguments")


class FrozenValueError(TracingError):
    """A value computed while tracing would differ if the function were traced again."""


def trace_twice(fn, args, batched=frozenset()):
    """``trace_with_tree(fn, args, batched)`` (a program, its output tree and its state writes),
    checked by a second trace."""
    before = global_generator_states()
    program, out_tree, state = trace_with_tree(fn, args, batched)
    after = global_generator_states()
    again, _, _ = trace_with_tree(fn, args, batched)
    # A function that seeds the global generator itself draws the same numbers on every call.
    moved = after != before and global_generator_states() != after
    found = first_difference(program, again)
    name = getattr(fn, "__name__", "the function")
    if found is None and not moved:
        return program, out_tree, state
    # Where a global generator moved, the line that drew is more telling than where the value entered.
    loc = global_draw_location(lambda: trace_with_tree(fn, args, batched)) if moved else None
    if found is not None:
        binding, what = found
        raise FrozenValueError(f"{what} in {name} differs between two traces: the compiled step would reuse "
                               f"the value computed while tracing on every call. To fix it, {HINT}",
                               loc or binding.loc)
    raise FrozenValueError(f"{name} draws from NumPy's or Python's global random generator while it is "
                           f"traced; the compiled step would reuse the numbers drawn then. To fix it, {HINT}", loc)


# ---------------------------------------------------------------------------------------------
# Comparing two traces


def first_difference(a: Program, b: Program) -> tuple[Binding, str] | None:
    """The first binding of ``a`` whose counterpart in ``b`` differs, and what differs."""
    same = ValueMatcher(a, b)
    for k, ba in enumerate(a.bindings):
        if k >= len(b.bindings):
            return ba, "the program"
        bb = b.bindings[k]
        if ba.op != bb.op or repr(ba.params) != repr(bb.params) or len(ba.inputs) != len(bb.inputs):
            return ba, f"the {ba.op} at this line"
        for xa, xb in zip(ba.inputs, bb.inputs):
            what = same.operand(xa, xb)
            if what is not None:
                return ba, what
        same.bind(ba.out, bb.out)
    if len(b.bindings) > len(a.bindings):
        return b.bindings[len(a.bindings)], "the program"
    return None


class ValueMatcher:
    """Pairs the values of two traces by position: inputs, constant arrays of equal bytes (each
    compared once), then each binding's result; compares operands through the pairing."""

    def __init__(self, a: Program, b: Program):
        self.pairs = {id(x): y for x, y in zip(a.inputs, b.inputs)}
        self.pairs.update((id(x), y) for (x, xv), (y, yv) in zip(a.consts, b.consts) if same_bytes(xv, yv))
        self.consts = {id(v) for v, _ in a.consts}

    def bind(self, x: Var, y: Var) -> None:
        self.pairs[id(x)] = y

    def operand(self, x, y) -> str | None:
        """None where ``x`` (of the first trace) matches ``y`` (of the second), else what differs."""
        if isinstance(x, Lit) or isinstance(y, Lit):
            same = isinstance(x, Lit) and isinstance(y, Lit) and x.dtype == y.dtype and repr(x.value) == repr(y.value)
            return None if same else f"the number {x}" if isinstance(x, Lit) else "a value"
        if self.pairs.get(id(x)) is y:
            return None
        return f"a constant array ({x.type})" if id(x) in self.consts else "a value"


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


# ---------------------------------------------------------------------------------------------
# The global generators


def global_generator_states() -> tuple:
    """Where NumPy's global (legacy) generator and Python's ``random`` are in their sequences."""
    _, key, position, has_gauss, gauss = np.random.get_state()
    return key.tobytes(), position, has_gauss, gauss, py_random.getstate()


LIBRARIES = tuple(os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "purelib", "platlib"))


def is_user_code(filename: str) -> bool:
    """Not morphjit, NumPy, the standard library (frozen modules too), an installed package or
    generated code (a dataclass's ``__init__``); an IPython cell is the user's."""
    if filename.startswith("<"):
        return filename.startswith("<ipython-input")
    return not (inside_package(filename) or os.path.abspath(filename).startswith(LIBRARIES))


def global_draw_location(run) -> SourceLoc | None:
    """``run`` again, line by line in the user's code, comparing the global generators' states
    between lines: the line after which they first moved."""
    state, last, found = [global_generator_states()], [None], []

    def each_line(frame, event, arg):
        now = global_generator_states()
        if now != state[0] and last[0] is not None and not found:
            found.append(last[0])
        state[0] = now
        if event == "line":
            last[0] = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        return None if found else each_line

    sys.settrace(lambda frame, event, arg: each_line if is_user_code(frame.f_code.co_filename) else None)
    try:
        run()
    finally:
        sys.settrace(None)
    if not found:
        return None
    filename, lineno, function = found[0]
    return SourceLoc(filename, lineno, function, linecache.getline(filename, lineno).strip())
