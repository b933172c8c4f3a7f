"""Random imperative programs of in-place writes (issue 32) against NumPy running them.

A program is the source of ``def f(P, idx, mask)``: ``P`` a float64 parameter, ``idx`` a 1-d
integer data argument (repeats allowed, values in [-2, 2), so valid on any axis of 2 or more),
``mask`` a boolean data argument of ``P``'s shape; ``idx`` has as many elements as ``P`` has rows
(data arguments share their leading extent: else morphjit reports a failed trace as their mismatch). It starts from a copy of ``P`` or a buffer made
inside (``np.zeros``, ``np.ones``, ``np.full``, ``np.empty`` filled at once, ``np.eye``,
``np.zeros_like``), then makes copies, views (basic keys with steps of both signs, ``.T``,
reshapes, which NumPy makes views or copies, ``[..., None]``, squeeze), aliases and advanced-index
copies, and writes through any of them: basic, integer-array (constant, with repeats, or ``idx``)
and mask keys with ``= += -= *=``, whole-array ``op=``, shifted self-assignments, ``np.add.at``
and ``out=``. It returns a sum over every name of ``(name * weights - 0.25) ** 2``, the weights
differing by position, so that each aliasing decision shows in the value.

The generator runs each statement it draws through NumPy at once and keeps only those NumPy runs
without a warning and with finite values of magnitude at most 1e3: the programs are polynomials,
``tanh`` and ``exp`` of ``P``, so the gradient is defined everywhere; integer-array keys are 1-d,
so the write that wins at a repeated index is NumPy's last one. A program that writes into ``P``
(or a view of it: memory NumPy shares with ``P``) must be refused with ``ArgumentWriteError``.
"""
from __future__ import annotations

import itertools
import linecache
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, settings, strategies as st

import morphjit as mj

from support.gradcheck import check_loss_grads_fd

SHAPES = [(3, 4), (4, 3), (2, 3), (3, 3)]
CONSTANTS = ["0.5", "-1.25", "2.0", "0.75", "-0.5"]
OPS = ["=", "+=", "-=", "*="]
MAX_ABS = 1e3
_counter = itertools.count()


class RandomChooser:
    """The generator's choices from a NumPy generator (the fixed, seeded programs)."""

    def __init__(self, rng):
        self.rng = rng

    def integer(self, lo, hi):
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, seq):
        return seq[self.integer(0, len(seq) - 1)]


class DrawChooser(RandomChooser):
    """The same choices drawn by hypothesis (which can then shrink them)."""

    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo, hi):
        return self.draw(st.integers(lo, hi))


class Program:
    def __init__(self, lines, P, idx, mask, refused):
        self.P, self.idx, self.mask, self.refused = P, idx, mask, refused
        self.source = "def f(P, idx, mask):\n" + "".join(f"    {line}\n" for line in lines)
        self.filename = f"<write-program-{next(_counter)}>"
        linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True), self.filename)

    def function(self):
        scope = {"np": np}
        exec(compile(self.source, self.filename, "exec"), scope)
        return scope["f"]

    def numpy(self, P):
        """NumPy runs the program on copies (so its writes cannot reach ``P``, ``idx``, ``mask``)."""
        with np.errstate(all="raise"), warnings.catch_warnings():
            warnings.simplefilter("error")
            return self.function()(np.array(P, copy=True), self.idx.copy(), self.mask.copy())

    def __repr__(self):
        return f"{self.source}\nP = {self.P!r}\nidx = {self.idx!r}\nmask = {self.mask!r}\nrefused: {self.refused}"


def broadcasts(shape, to):
    try:
        return np.broadcast_shapes(shape, to) == tuple(to)
    except ValueError:
        return False


def slice_text(c, d):
    """A non-empty slice of an axis of ``d``: bounds of either sign or left out, steps of both signs."""
    step = c.choice([None, 1, 2, 3, -1, -2])
    first = c.integer(0, d - 1)
    if step is None or step > 0:
        last = c.integer(first + 1, d)
        start = "" if first == 0 and c.integer(0, 1) else str(first - d * c.integer(0, 1))
        stop = "" if last == d and c.integer(0, 1) else str(last - d * (last < d and c.integer(0, 1)))
    else:   # from `first` down to just above `last` (-1: to the start)
        last = c.integer(-1, first - 1)
        start = "" if first == d - 1 and c.integer(0, 1) else str(first - d * c.integer(0, 1))
        stop = "" if last == -1 else str(last - d * c.integer(0, 1))
    return f"{start}:{stop}" + ("" if step is None else f":{step}")


def basic_key(c, shape):
    """Integers, slices, ``:``, None and ``...`` for some leading (or, after ``...``, trailing) axes."""
    if not shape:
        return "..."
    k = c.integer(1, len(shape))
    trailing = k < len(shape) and c.integer(0, 1)
    parts = ["..."] if trailing else []
    for d in (shape[len(shape) - k:] if trailing else shape[:k]):
        kind = c.choice(["slice", "slice", "int", "all"])
        parts.append(str(c.integer(-d, d - 1)) if kind == "int" else ":" if kind == "all" else slice_text(c, d))
        if c.integer(0, 7) == 0:
            parts.append("None")
    if not trailing and c.integer(0, 5) == 0:
        parts.append("...")
    return ", ".join(parts)


def int_array(c, shape):
    """``(axis, text)``: a 1-d integer array for axis 0 or 1, a constant list (repeats likely) or
    the argument idx (whose values need an axis of 2 or more)."""
    axis = c.integer(0, 1) if len(shape) >= 2 else 0
    if shape[axis] >= 2 and c.integer(0, 1):
        return axis, "idx"
    return axis, "[" + ", ".join(str(c.integer(-shape[axis], shape[axis] - 1)) for _ in range(c.integer(1, 4))) + "]"


def int_array_key(c, shape):
    axis, array = int_array(c, shape)
    return ":, " * axis + array


def reshape_text(c, shape):
    rest, dims = int(np.prod(shape)), []
    for _ in range(c.integer(0, 2)):
        d = c.choice([d for d in range(1, rest + 1) if rest % d == 0])
        dims.append(d)
        rest //= d
    dims.append(rest)
    if c.integer(0, 1):
        dims[c.integer(0, len(dims) - 1)] = -1
    return ", ".join(map(str, dims))


class Builder:
    def __init__(self, c, allow_refusal=True):
        self.c = c
        shape = c.choice(SHAPES)
        self.P = np.random.default_rng(c.integer(0, 2 ** 32 - 1)).uniform(-1.0, 1.0, shape)
        self.idx = np.array([c.integer(-2, 1) for _ in range(shape[0])])
        self.mask = np.array([c.integer(0, 1) for _ in range(self.P.size)], bool).reshape(shape)
        self.lines, self.names = [], []
        self.refuse, self.refused = allow_refusal and c.integer(0, 6) == 0, False
        self.env = self.run([])

    # -- the NumPy shadow run -------------------------------------------------------------------
    def run(self, lines):
        env = {"np": np, "P": self.P.copy(), "idx": self.idx.copy(), "mask": self.mask.copy()}
        with np.errstate(all="raise"), warnings.catch_warnings():
            warnings.simplefilter("error")
            exec("\n".join(lines), env)
        return env

    def accept(self, lines, kind, name=None, writes=None):
        try:
            env = self.run(self.lines + lines)
        except Exception:
            return False
        values = [np.asarray(env[n]) for n in self.names + ([name] if name else [])]
        if not all(np.all(np.isfinite(v)) and np.all(np.abs(v) <= MAX_ABS) for v in values):
            return False
        if writes is not None and self.into_P(writes):
            self.refused = True
        self.lines += lines
        self.names += [name] if name else []
        self.env = env
        return True

    def into_P(self, name):
        return isinstance(self.env[name], np.ndarray) and np.shares_memory(self.env[name], self.env["P"])

    def arrays(self, min_ndim=0):
        return [n for n in ["P"] + self.names if isinstance(self.env[n], np.ndarray) and self.env[n].ndim >= min_ndim]

    def fresh(self):
        return f"z{len(self.names)}"

    def shape(self, name):
        return np.shape(self.env[name])

    def region(self, target, key):
        scope = {"_t": np.empty(self.shape(target)), "idx": self.idx, "mask": self.mask}
        return np.shape(eval(f"_t[{key}]", scope))

    # -- right-hand sides -----------------------------------------------------------------------
    def rhs(self, shape, bare=True):
        """A value broadcasting to ``shape``; ``bare``: a name itself (which may overlap the target)."""
        c = self.c
        names = [n for n in ["P"] + self.names if broadcasts(self.shape(n), shape)]
        flipped = [n for n in self.arrays(2) if broadcasts(self.shape(n)[::-1], shape)]
        kind = c.choice(["const", "sum"] + ["name"] * 3 * bool(names) + ["flipped"] * bool(flipped))
        if kind == "const":
            return c.choice(CONSTANTS)
        if kind == "sum":
            return f"np.sum({c.choice(self.arrays())}) * 0.25"
        if kind == "flipped":
            return f"{c.choice(flipped)}.T" + ("" if bare and c.integer(0, 1) else f" * {c.choice(CONSTANTS)}")
        n = c.choice(names)
        return c.choice(([n] if bare else []) + [f"{n} * {c.choice(CONSTANTS)}", f"({n} + {c.choice(CONSTANTS)})",
                                                  f"np.tanh({n})"])

    # -- statements -----------------------------------------------------------------------------
    def start(self):
        return self.copy("P") if self.c.integer(0, 2) else self.buffer()

    def copy(self, src=None):
        c, n = self.c, self.fresh()
        s = src or c.choice(self.arrays())
        expr = c.choice([f"{s} * 1.0", f"{s}.copy()", f"np.copy({s})", f"np.array({s})", f"{s}.astype(np.float64)",
                         f"{s} + 0.0"])
        return self.accept([f"{n} = {expr}"], "copy", n)

    def buffer(self):
        c, n = self.c, self.fresh()
        shapes = [self.P.shape, self.P.shape[::-1]] + [self.shape(a) for a in self.arrays(1)]
        shape = c.choice(shapes)
        kind = c.choice(["zeros", "ones", "full", "empty", "eye", "zeros_like"])
        if kind == "empty":
            fill = c.choice(["...", ":"])
            return self.accept([f"{n} = np.empty({shape})", f"{n}[{fill}] = {self.rhs(shape)}"], "buffer", n)
        expr = {"zeros": f"np.zeros({shape})", "ones": f"np.ones({shape})",
                "full": f"np.full({shape}, {c.choice(CONSTANTS)})",
                "eye": f"np.eye({shape[0]}, {shape[-1]})" if len(shape) == 2 else f"np.zeros({shape})",
                "zeros_like": f"np.zeros_like({c.choice(self.arrays(1))})"}[kind]
        return self.accept([f"{n} = {expr}"], "buffer", n)

    def view(self):
        c, n = self.c, self.fresh()
        s = c.choice(self.arrays(1))
        shape = self.shape(s)
        expr = c.choice([f"{s}[{basic_key(c, shape)}]"] * 3 + [
            f"{s}.T", f"np.transpose({s})", f"{s}.reshape({reshape_text(c, shape)})", f"{s}[..., None]",
            f"{s}[None]", f"{s}.squeeze()"])
        return self.accept([f"{n} = {expr}"], "view", n)

    def alias(self):
        n = self.fresh()
        return self.accept([f"{n} = {self.c.choice(['P'] + self.names)}"], "alias", n)

    def advanced_read(self):
        c, n = self.c, self.fresh()
        s = c.choice(self.arrays(1))
        return self.accept([f"{n} = {s}[{int_array_key(c, self.shape(s))}]"], "copy", n)

    def write(self):
        c = self.c
        scalars = [n for n in self.names if not isinstance(self.env[n], np.ndarray)]
        arrays = self.arrays()
        if self.refuse and c.integer(0, 1):
            targets = [a for a in arrays if self.into_P(a)]
        else:   # half the time a name whose memory another name shares: where aliasing shows
            targets = [a for a in arrays if not self.into_P(a)]
            shared = [a for a in targets if any(b != a and np.shares_memory(self.env[a], self.env[b]) for b in arrays)]
            targets = shared if shared and c.integer(0, 1) else targets
        if scalars and (not targets or c.integer(0, 5) == 0):     # a NumPy scalar: op= rebinds it
            s = c.choice(scalars)
            return self.accept([f"{s} {c.choice(OPS[1:])} {c.choice(CONSTANTS)}"], "write")
        if not targets:
            return False
        t = c.choice(targets)
        shape, op = self.shape(t), c.choice(OPS)
        mask_keys = [m for m, s in [("mask", self.P.shape), ("~mask", self.P.shape), ("mask.T", self.P.shape[::-1]),
                                    ("mask[:, 0]", self.P.shape[:1]), ("~mask[0]", self.P.shape[1:])]
                     if len(shape) >= len(s) and shape[:len(s)] == s]
        forms = ["basic", "basic", "whole", "ufunc"] + ["int", "add.at"] * bool(shape) \
            + ["mask", "mask"] * bool(mask_keys) + ["shift"] * (bool(shape) and shape[0] >= 2)
        form = c.choice(forms)
        if form == "basic":
            key = basic_key(c, shape)
            line = f"{t}[{key}] {op} {self.rhs(self.region(t, key))}"
        elif form == "whole":
            line = f"{t}[{c.choice(['...', ':'] if shape else ['...'])}] = {self.rhs(shape)}" if op == "=" \
                else f"{t} {op} {self.rhs(shape)}"
        elif form == "int":
            key = int_array_key(c, shape)
            line = f"{t}[{key}] {op} {self.rhs(self.region(t, key))}"
        elif form == "add.at":   # its value a new array: ufunc.at documents nothing of overlaps
            axis, array = int_array(c, shape)
            region = self.region(t, ":, " * axis + array)
            key = f"(slice(None), {array})" if axis else array
            line = f"np.add.at({t}, {key}, {self.rhs(region, bare=False)})"
        elif form == "mask":
            m = c.choice(mask_keys)
            same = [n for n in ["P"] + self.names if self.shape(n) == shape]
            value = c.choice([c.choice(CONSTANTS), f"{c.choice(same)}[{m}] * {c.choice(CONSTANTS)}",
                              f"np.tanh({c.choice(same)}[{m}])"])
            line = f"{t}[{m}] {op} {value}"
        elif form == "shift":
            line = c.choice([f"{t}[1:] {op} {t}[:-1]", f"{t}[:-1] {op} {t}[1:] * {c.choice(CONSTANTS)}"])
        else:
            ufunc = c.choice(["np.add", "np.subtract", "np.multiply", "np.tanh", "np.exp"])
            if ufunc == "np.exp":
                if np.max(np.abs(self.env[t]), initial=0.0) > 2.0:
                    return False
                line = f"np.exp({t}, out={t})"
            elif ufunc == "np.tanh":
                line = f"np.tanh({self.rhs(shape)}, out={t})"
            else:
                line = f"{ufunc}({self.rhs(shape)}, {self.rhs(shape)}, out={t})"
            if c.integer(0, 2) == 0:     # the result is out itself: an alias
                n = self.fresh()
                return self.accept([f"{n} = {line}"], "write", n, writes=t)
        return self.accept([line], "write", writes=t)

    def loss_line(self):
        terms = []
        for k, n in enumerate(["P"] + self.names):
            shape = self.shape(n)
            weights = f"np.linspace({0.5 + 0.1 * (k % 5):.1f}, 1.5, {int(np.prod(shape))}).reshape({shape})"
            terms.append(f"np.sum(({n} * {weights} - 0.25) ** 2)")
        return "return (" + "\n            + ".join(terms) + ")"

    def build(self):
        c = self.c
        while not self.start():
            pass
        steps = [self.copy, self.buffer, self.alias, self.advanced_read] + [self.view] * 3 + [self.write] * 6
        for _ in range(c.integer(3, 10)):
            if self.refused:
                break
            for _attempt in range(5):
                if c.choice(steps)():
                    break
        return Program(self.lines + self.loss_line().split("\n"), self.P, self.idx, self.mask, self.refused)


@st.composite
def write_programs(draw, allow_refusal=True):
    return Builder(DrawChooser(draw), allow_refusal).build()


def seeded_program(seed, allow_refusal=False):
    return Builder(RandomChooser(np.random.default_rng(seed)), allow_refusal).build()


def check_program(program, backend, expected):
    step = mj.compile_loss(program.function(), backend=backend)
    P, idx, mask = program.P.copy(), program.idx.copy(), program.mask.copy()
    if program.refused:
        with pytest.raises(mj.UnsupportedError) as info:
            step(P, idx, mask)
        message = str(info.value)
        assert type(info.value).__name__ == "ArgumentWriteError", repr(info.value)
        assert re.search(r"\bP\b", message.splitlines()[0]) and "copy" in message, message
        return
    value, grad = step(P, idx, mask)
    for a, b in zip((P, idx, mask), (program.P, program.idx, program.mask)):
        np.testing.assert_array_equal(a, b, err_msg="the compiled loss modified its inputs")
    assert np.asarray(value).dtype == np.float64
    np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-10, err_msg=program.source)
    check_loss_grads_fd(lambda xs: program.numpy(xs[0]), [program.P], [grad], rng=np.random.default_rng(0),
                        eps=1e-6, rtol=1e-6, what=program.source)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(write_programs())
def test_random_write_programs_match_numpy_in_the_plan_interpreter(program):
    note(program.source)
    try:
        expected = program.numpy(program.P)
    except Exception:
        assume(False)
    check_program(program, "interp", expected)


# Programs whose value depends on a view or an alias being one (making it a copy changes the
# value) and that between them write at idx, through masks, out= and np.add.at, at repeated
# constant indices, and through transposes and reshapes (chosen among the first 200 seeds).
NUMBA_SEEDS = [18, 21, 55, 91, 105]


@pytest.mark.parametrize("seed", NUMBA_SEEDS)
def test_seeded_write_programs_match_numpy_on_numba(seed):
    program = seeded_program(seed)
    check_program(program, "numba", program.numpy(program.P))


def test_write_programs_reach_both_update_ops():
    """The programs above write by box (``update_slice``) and by index array or mask (``scatter``)."""
    seen = set()
    for seed in range(40):
        program = seeded_program(seed)
        seen |= {b.op for b in mj.trace(program.function(), program.P, program.idx, program.mask).bindings}
    assert {"update_slice", "scatter"} <= seen, sorted(seen)
