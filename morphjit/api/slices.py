"""Slices with traced bounds (``x[i * n:(i + 1) * n]``): the positions they read, with NumPy's
reading of the bounds, and their length: ``stop - start`` when tracing, or the shorter length of
NumPy's slice at a call where it reaches past the end of the axis (`shorter_slices`; the jit
compiles a variant of the step for it when a call needs it)."""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
from dataclasses import dataclass, field

import numpy as np

from ..ir import Lit, Specialize, Sym
from ..native import SliceOutOfRange
from ..tracing import Tracer, static_hint
from ..util import SourceLoc, UnsupportedError, user_location
from . import core as A


def is_dynamic_slice(k) -> bool:
    return isinstance(k, slice) and (isinstance(k.start, Tracer) or isinstance(k.stop, Tracer))


def slice_positions(k: slice, size):
    """The positions a slice with traced bounds reads along an axis of ``size``, their count (that
    of ``stop - start``, or the shorter length `shorter_slices` gives it) and its place among the
    slices of that count traced on its line."""
    step = 1 if k.step is None else k.step
    extent = _fixed_extent(k)
    # NumPy's slice of a negative extent is empty or not depending on the signs of the bounds.
    if isinstance(step, Tracer) or extent is None or extent < 0 or step <= 0:
        raise UnsupportedError(
            "a slice with traced bounds needs an extent known when tracing (a positive integer "
            "step, stop - start at least 0 and not depending on traced values, as in "
            f"x[i * n:(i + 1) * n]){static_hint([b for b in (k.start, k.stop, k.step) if isinstance(b, Tracer)])}", user_location())
    if isinstance(size, Sym):
        raise Specialize("a slice with traced bounds along the batch axis reads positions of the concrete batch")
    count = len(range(0, extent, step))
    trace = A.trace_of([k.start, k.stop])
    shortening, length, nth = _SHORTENING.get(), count, 0
    if shortening is not None:
        location = SourceLoc.at(trace.loc or user_location())
        key = (_expression(trace, k.start), _expression(trace, k.stop), step, size)
        length = shortening.lengths.get(key, count)
        nth = shortening.nth(location, length, key)
    start, stop = _slice_bound(k.start, size), _slice_bound(k.stop, size)
    positions = start + np.arange(0, length * step, step)
    inside = positions < stop
    if length < count:   # NumPy's slice must end there too: else no element has a position
        inside = inside & (start + length * step >= stop)
    return A.where(inside, positions, size), length, nth


@dataclass
class Shortening:
    """The lengths of the slices with traced bounds a trace gives them where shorter than
    ``stop - start`` (keyed by their bounds' expressions, the step and the axis length, which
    fix NumPy's length at any call), and the slices its traces met: the ``what`` of a slice's
    range check (`SliceOutOfRange`) -> its key."""

    lengths: dict = field(default_factory=dict)
    seen: dict = field(default_factory=dict)
    _lines: dict = field(default_factory=dict)   # (location, length) -> the keys traced there, in order

    def nth(self, location: str, length: int, key) -> int:
        """The place of the slice ``key`` among those of ``length`` traced at ``location``."""
        keys = self._lines.setdefault((location, length), [])
        if key not in keys:
            keys.append(key)
        nth = keys.index(key)
        self.seen[SliceOutOfRange.what(location, length, nth)] = key
        return nth


_SHORTENING: contextvars.ContextVar[Shortening | None] = contextvars.ContextVar("shortening", default=None)


@contextlib.contextmanager
def shorter_slices(shortening: Shortening):
    """Trace with the slices with traced bounds at the lengths of ``shortening`` (the length of
    NumPy's slice at a call whose slice reaches past the end of the axis), recording there the
    slices traced."""
    token = _SHORTENING.set(shortening)
    try:
        yield
    finally:
        _SHORTENING.reset(token)


def _expression(trace, x) -> str:
    """A traced integer (or a bound given as a number) as the text of its computation, the same
    in every trace of the function (`value_texts`)."""
    return repr(None if x is None else int(x)) if not isinstance(x, Tracer) else value_texts(trace)(x.operand)


def value_texts(trace):
    """A function naming a value of ``trace`` by the text of its computation from the arguments
    (by path), the constants (by place) and literals: the same for values computed alike, and in
    every trace of the function. A long text is replaced by its digest."""
    names = {id(v): f"const{k}" for k, (v, _) in enumerate(trace.consts)}
    names.update(trace.paths)

    def text(v) -> str:
        if isinstance(v, Lit):
            return repr(v.value)
        if id(v) not in names:
            b = trace.producers.get(id(v))
            if b is None:
                return f"?{id(v)}"
            written = f"{b.op}({', '.join(map(text, b.inputs))}{''.join(f', {k}={p}' for k, p in b.params)})"
            names[id(v)] = written if len(written) < 200 else hashlib.sha1(written.encode()).hexdigest()
        return names[id(v)]
    return text


def _slice_bound(bound, size: int):
    """A traced start or stop of a slice with a positive step as NumPy reads it: from the end if
    negative, then clipped to ``[0, size]``."""
    return A.clip(A.where(bound < 0, bound + size, bound), 0, size)


def _fixed_extent(k) -> int | None:
    """``stop - start`` of a slice with traced bounds, when it is the same for all traced values."""
    trace = A.trace_of([k.start, k.stop])
    difference = _polynomial(trace, k.stop, -1) if k.stop is not None else None
    if difference is None or k.start is None:
        return None
    start = _polynomial(trace, k.start, 1)
    if start is None:
        return None
    for term, c in start.items():
        difference[term] = difference.get(term, 0) + c
    difference = {t: c for t, c in difference.items() if c}
    return -difference.get((), 0) if set(difference) <= {()} else None


def _polynomial(trace, x, sign: int) -> dict | None:
    """``sign * x`` as a polynomial over the traced values it is computed from by +, -, * and
    integer literals (monomials are sorted tuples of the other values, by `value_texts`, so that
    two computed alike are one), or None where a float literal enters."""
    if not isinstance(x, Tracer):
        return {(): sign * int(x)}
    text = value_texts(trace)

    def poly(v) -> dict | None:
        if isinstance(v, Lit):
            return {(): v.value} if v.dtype.kind in "iu" else None
        b = trace.producers.get(id(v))
        if b is None or b.op not in ("add", "sub", "mul", "neg"):
            return {(text(v),): 1}   # an input, or a value computed otherwise (i % n): a variable
        args = [poly(u) for u in b.inputs]
        if None in args:
            return None
        if b.op == "neg":
            return {t: -c for t, c in args[0].items()}
        if b.op == "mul":
            product: dict = {}
            for t1, c1 in args[0].items():
                for t2, c2 in args[1].items():
                    t = tuple(sorted(t1 + t2))
                    product[t] = product.get(t, 0) + c1 * c2
            return product
        total = dict(args[0])
        for t, c in args[1].items():
            total[t] = total.get(t, 0) + (c if b.op == "add" else -c)
        return total

    found = poly(x.operand)
    return None if found is None else {t: sign * c for t, c in found.items()}
