"""Tests of traced values: Python's ``if``, ``while``, ``and``, ``or``, ``not``, builtin ``min`` and
``max`` on a traced scalar, each a branch point.

The function is run once per path through its branch points (`explore`): a run takes the outcomes
of its path's prefix and then the true one, and every branch point it meets beyond the prefix adds
the path that takes the false one there. Each path's outputs are then computed again from the
inputs passed through ``branch_gate``, the identity whose gradient is the cotangent where the path
is the one taken and exactly zero elsewhere: a path not taken gives no gradient, even where its own
derivatives are NaN or infinite (``sqrt`` or ``log`` of what its test excluded). The outputs are
merged with one ``where`` per leaf. Paths agree on what they return (tree, shapes, dtypes) or are
refused at the test where they part; a function tests at most `MAX_BRANCH_POINTS` traced values.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import Lit, Sym, Var
from ..util import (MorphjitError, ShapeError, SourceLoc, TracingError, UnsupportedError, describe_location,
                    user_location)
from .tracer import NotAnArray, Tracer

MAX_BRANCH_POINTS = 8


@dataclass
class Point:
    """A test of a traced value: its truth as a traced boolean scalar, and where it was made."""
    truth: Var
    loc: SourceLoc | None


@dataclass
class Path:
    """One run's outcomes: ``prefix`` given, then true at each further test."""
    prefix: tuple[bool, ...]
    points: list[Point] = field(default_factory=list)
    outcomes: list[bool] = field(default_factory=list)

    def parted_from(self, other: "Path") -> tuple[SourceLoc | None, bool]:
        """The test at which this path and ``other`` take different outcomes, and this path's there."""
        k = next(k for k, (a, b) in enumerate(zip(self.outcomes, other.outcomes)) if a != b)
        return self.points[k].loc, self.outcomes[k]


class Exploration:
    """The paths of one trace: `decide` answers a test for the run under way."""

    def __init__(self, trace):
        self.trace = trace
        self.path: Path | None = None
        self.replaying = False
        self.tests = 0   # branch points met so far, over all runs

    def decide(self, x) -> bool:
        """The outcome of ``bool(x)`` on this run's path."""
        path, k = self.path, len(self.path.outcomes)
        loc = user_location()
        if k < len(path.prefix):
            outcome = path.prefix[k]
        elif self.replaying:
            raise unsteady_error(loc)
        else:
            self.tests += 1
            if self.tests > MAX_BRANCH_POINTS:
                raise UnsupportedError(
                    f"this is test number {self.tests} of a traced value, beyond the {MAX_BRANCH_POINTS} that "
                    f"morphjit traces both outcomes of (a `while` loop or a loop of `if`s on traced values makes "
                    f"one per iteration); write the choice with np.where(cond, a, b), or test values that "
                    f"are not traced", loc)
            outcome = True
        path.points.append(Point(truth_of(x, loc), loc))
        path.outcomes.append(outcome)
        return outcome

    def run(self, call, prefix: tuple[bool, ...], replay: bool = False):
        """``call()`` on the path ``prefix``: its result (`Raised` where the function raised a
        ValueError of its own), and the path it took."""
        self.path, self.replaying = Path(prefix), replay
        try:
            result = call()
            if len(self.path.outcomes) < len(prefix):
                raise unsteady_error(user_location())
            return result, self.path
        except MorphjitError:
            raise
        except ValueError as error:
            return Raised(error), self.path
        finally:
            self.path = None


def unsteady_error(loc) -> TracingError:
    return TracingError("the function tested a traced value on one run but not on another run of the same "
                        "path: its tests must depend on its arguments only", loc)


class Raised:
    """A path on which the function raises ``error``: the compiled step raises it where the path
    is taken (as a ValueError; its message names the line)."""

    def __init__(self, error: ValueError):
        self.error = error
        tb = error.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        self.loc = user_location(tb.tb_frame)

    def message(self) -> str:
        where = f" (raised at {describe_location(self.loc)})" if self.loc else ""
        return f"{type(self.error).__name__}: {self.error}{where}"


def truth_of(x, loc) -> Var:
    """``x``'s truth as NumPy's ``bool(x)`` has it, as a traced boolean scalar."""
    if any(isinstance(d, Sym) for d in x.shape):
        raise ShapeError("the truth value of an array whose size depends on the batch size is ambiguous: "
                         "test a scalar (np.any(...), np.all(...) or a reduction)", loc)
    if x.size != 1:
        try:
            bool(np.zeros(x.shape, x.dtype))
        except ValueError as e:
            raise ShapeError(str(e), loc) from None
    t = x.trace
    scalar = t.bind("reshape", (x,), shape=()) if x.ndim else x
    if scalar.dtype != np.bool_:
        scalar = t.bind("ne", (scalar, Lit(0, scalar.dtype)))
    return scalar.operand


def explore(t, call):
    """The paths ``call()`` (the user's function on ``t``'s inputs) takes: ``[(result, path)]``,
    one run each, in the order their outcomes sort (true first)."""
    exploration = t.exploration = Exploration(t)
    try:
        runs, pending = [], [()]
        while pending:
            result, path = exploration.run(call, pending.pop())
            pending.extend(tuple(path.outcomes[:k]) + (False,) for k in range(len(path.prefix), len(path.outcomes)))
            runs.append((result, path))
        return runs
    finally:
        t.exploration = None


def taken(t, path: Path):
    """Whether ``path`` is the one taken, as a traced boolean scalar."""
    truth = None
    for point, outcome in zip(path.points, path.outcomes):
        term = Tracer(t, point.truth) if outcome else t.bind("not", (Tracer(t, point.truth),))
        truth = term if truth is None else t.bind("and", (truth, term))
    return truth


def replayed(t, call_on, inputs, runs):
    """Each path's result computed again from its gated inputs (``call_on(inputs)``), with the
    traced boolean scalar of whether it is the path taken: ``[(result, taken, path)]``."""
    exploration = t.exploration = Exploration(t)
    try:
        out = []
        for first, path in runs:
            truth = taken(t, path)
            if isinstance(first, Raised):
                out.append((first, truth, path))
                continue
            gated = [gate(t, x, truth) for x in inputs]
            result, _ = exploration.run(lambda: call_on(gated), tuple(path.outcomes), replay=True)
            out.append((result, truth, path))
        return out
    finally:
        t.exploration = None


def gate(t, x, truth):
    """Input ``x`` of one path: itself, with its gradient where the path is taken (float arrays)."""
    if not isinstance(x, Tracer) or x.dtype.kind != "f":
        return x
    y = Tracer(t, t.record("branch_gate", [x.operand, truth.operand], {}), weak=x.weak)
    y.layout = x.layout
    if x.storage is not None:
        y.own_storage(x.storage.origin)
    t.paths[id(y.operand)] = t.paths.get(id(x.operand))
    return y


def merged(t, results):
    """The leaves and tree of the paths' results ``[((leaves, tree), taken, path)]``, one ``where``
    per leaf that differs between paths."""
    (leaves, tree), _, first = results[0]
    for (other_leaves, other_tree), _, path in results[1:]:
        if other_tree != tree:
            loc, outcome = first.parted_from(path)
            raise TracingError(f"the outcomes of this test of a traced value return different structures: {tree} "
                               f"where it is {outcome} and {other_tree} where it is {not outcome}; morphjit "
                               f"compiles both, which must return alike", loc)
    return [merged_leaf(t, [(r[0][0][k], r[1], r[2]) for r in results]) for k in range(len(leaves))], tree


def merged_leaf(t, options):
    """One output leaf over the paths ``[(value, taken, path)]``: the last path's where no other is taken."""
    values = [v for v, _, _ in options]
    if any(isinstance(v, NotAnArray) for v in values):
        return next(v for v in values if isinstance(v, NotAnArray))
    if all(not isinstance(v, Tracer) for v in values) and all(same_constant(v, values[0]) for v in values):
        return values[0]
    shape, dtype = agreed_type(options)
    value, _, _ = options[-1]
    out = as_operand(value, dtype)
    for v, truth, _ in reversed(options[:-1]):
        out = t.bind("where", (truth, as_operand(v, dtype), out))
    return out


def same_constant(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.all((a == b) | (a != a) & (b != b)))


def agreed_type(options):
    """The shape and dtype the paths' values of one leaf share; Python numbers take the arrays' dtype
    (as NumPy's promotion has them), where they fit it."""
    kinds = [described(v) for v, _, _ in options]
    strong = [k for k, (_, _, weak) in enumerate(kinds) if not weak]
    dtype = kinds[strong[0]][1] if strong else np.result_type(*[d for _, d, _ in kinds])
    first = options[0][2]
    for (shape, own, weak), (_, _, path) in zip(kinds, options):
        if shape != kinds[0][0] or np.result_type(dtype, own if not weak else SAMPLES[own.kind]) != dtype:
            other = path if path is not first else options[strong[0]][2]
            parts = " and ".join(f"{np.dtype(d).name}{list(s)}" for s, d, _ in kinds)
            raise TracingError(f"the outcomes of this test of a traced value return arrays of different shapes or "
                               f"dtypes ({parts}); morphjit compiles both, which must return alike",
                               first.parted_from(other)[0])
    return kinds[0][0], dtype


SAMPLES = {"b": True, "i": 0, "u": 0, "f": 0.0}   # a Python number of each kind, promoting as one (NEP 50)


def described(v) -> tuple:
    """A path's value of a leaf: its shape, dtype, and whether it is a Python number."""
    if isinstance(v, Tracer):
        return tuple(v.shape), v.dtype, v.weak
    return tuple(np.shape(v)), np.result_type(v), type(v) in (bool, int, float)


def as_operand(v, dtype):
    """A path's value of a leaf as an operand of ``where``: a traced array, or a NumPy constant."""
    if isinstance(v, Tracer):
        return v if v.dtype == dtype else v.trace.bind("cast", (v,), dtype=np.dtype(dtype).name)
    return np.asarray(v, dtype)


def branched(t, call_on, inputs):
    """``call_on(inputs)``'s leaves and tree, over every path of its tests of traced values."""
    runs = explore(t, lambda: call_on(inputs))
    returned = [run for run in runs if not isinstance(run[0], Raised)]
    if not returned:
        raise runs[0][0].error
    if len(runs) == 1:
        return runs[0][0]
    results = replayed(t, call_on, inputs, runs)
    leaves, tree = merged(t, [r for r in results if not isinstance(r[0], Raised)])
    for raised, truth, _ in (r for r in results if isinstance(r[0], Raised)):
        leaves[0] = checked(t, leaves[0], truth, raised.message())
    return leaves, tree


def checked(t, value, truth, message: str):
    """``value``, with the compiled step raising ``message`` (a ValueError) where ``truth`` holds."""
    value = value if isinstance(value, Tracer) else Tracer(t, t.operand(np.asarray(value), lift_literals=True))
    refused = t.bind("broadcast_to", (truth,), shape=tuple(value.shape)) if value.ndim else truth
    return t.bind("check_parameter", (value, refused), what=message, error="ParameterValueError")
