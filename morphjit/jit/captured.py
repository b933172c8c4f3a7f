"""What a function reaches without taking it as an argument (`reach`: its closure, the globals it
loads, ``self`` of a bound method, the same of the functions of the user's it calls, and entries of
the containers there, ``params['W']``, ``self.layers[0].W``) and NumPy's global generator
(``np.random.randn(...)``). Each call sees them as they are then, as NumPy would:

- generators (a ``Generator`` or ``RandomState``; ``'np.random'`` for the global one) and arrays are
  an argument the compiled function adds to every call, after the user's (``captured``, a dict by
  place). The call takes a seed from a generator (advancing it), as for a generator argument, so
  draws are new on every call and reproducible from the generator's seed. An array is an input of
  the step, read on each call (rebound or changed in place between calls, it is seen). While
  traced, it is also a buffer NumPy computes with until traced values meet it (``Tracer.captured``),
  so that traced keys index it (``X[i * n:(i + 1) * n]``) and Python can test its values; a write
  into it is refused. Where the trace computed with its contents, the step holds for those only.
- numbers, strings and tuples of them are constants of the step, which holds for those values.

Each call compares what a step holds for with what the places hold now; a difference compiles the
function again, with a warning (`Captured.refresh`). While traced, the function runs as a copy of
itself (and of its helpers) whose closure, globals and object hold the traced values in place of the
originals (`Reach.rebuilt`; a write into a container copied for that is refused), and the global draws of
``np.random`` go to the traced global generator (``morphjit.api.random``).
"""
from __future__ import annotations

import functools
import inspect
import sys
import types
import warnings

import numpy as np

from ..native import GENERATORS
from ..tracing import Tracer, tracer
from ..util import RecompileWarning, TracingError, inside_package, user_location
from .reach import Place, Reach, captures, constant

GLOBAL = "np.random"


class Captured:
    """The values ``fn`` reaches from its closure, globals and object, and the function traced in
    its place (taking the generators and arrays as a last argument)."""

    def __init__(self, fn, reach: Reach, rewrap=None):
        self.fn, self.reach = fn, reach
        self.rewrap = rewrap   # for a wrapper of morphjit's: the same wrapper of another function
        self.draws_globally = reach.draws_globally
        roots = reach.roots()
        self.places = {str(p): p for p in reach.places()}
        self._getters = [(label, self._getter(place)) for label, place in self.places.items()]
        self.generators = frozenset(label for label, p in self.places.items() if isinstance(p.fetch(roots), GENERATORS))
        self.takes_generators = bool(self.generators) or self.draws_globally
        self.read: dict[Place, np.ndarray] = {}   # arrays whose contents a trace computed with -> a copy of them
        self.constants: dict[Place, object] = {}  # numbers and strings, as the steps hold them
        self.version = 0   # counted up when what a step holds for changes: steps compiled before are stale
        self._guards: list = []
        self.function = self._traced_in_place()

    @classmethod
    def of(cls, fn) -> Captured | None:
        """What ``fn`` (a function, a bound method, a ``functools.partial`` of one, or an object of
        a class of the user's with ``__call__``) captures, or None when it captures nothing of these.
        A wrapper of morphjit's around a function of the user's (``fn.traces``: the function, and
        how to wrap another) captures what the function does, and runs wrapped around its copy."""
        traces = getattr(fn, "traces", None)
        user = _users_callable(fn if traces is None else traces[0])
        if user is None:
            return None
        found = cls(user, Reach(user)) if traces is None else cls(fn, Reach(user), traces[1])
        return found if found.places or found.draws_globally else None

    def arguments(self, args, kwargs) -> tuple[tuple, dict]:
        """The call's arguments with the captured values after the user's (bound to ``fn``'s
        positional parameters)."""
        if kwargs:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args
        return tuple(args) + (self.current(),), {}

    def current(self) -> dict:
        """The generators and arrays as the function would use them now."""
        found = {}
        for label, get in self._getters:
            value = get()
            if captures(value):
                found[label] = value
        if self.draws_globally:
            found[GLOBAL] = np.random.mtrand._rand
        return found

    def refresh(self, user: str) -> int:
        """The `version` of what the steps hold for: counted up (with a warning naming ``user``, the
        compiled function) where a place holds another constant, or an array whose contents a
        trace computed with holds others."""
        stale = [place for place, get, seen, same in self._guards if not _unchanged(get(), seen, same)]
        if stale:
            for place in stale:
                self.read.pop(place, None)
                self.constants.pop(place, None)
            self._guard()
            self.version += 1
            names = ", ".join(map(str, stale))
            warnings.warn(f"{user} compiles again: {names}, which it captures, changed since it was compiled, "
                          f"and the compiled step holds for the values the function computed with then (a "
                          f"number is a constant of the step; an array's values count where NumPy computed "
                          f"with them while tracing); pass {'it' if len(stale) == 1 else 'them'} as an "
                          f"argument to compile once", RecompileWarning, stacklevel=_caller_level())
        return self.version

    def _getter(self, place: Place):
        """A function giving the value at ``place`` now."""
        get = self.reach.getters[place.root]
        return lambda: place.entry(get())

    def _guard(self) -> None:
        """The checks `refresh` makes: ``(place, getter, what a step holds for, how to compare)``."""
        getters = {self.places[label]: get for label, get in self._getters}
        self._guards = [(place, getters[place], seen, _same_contents) for place, seen in self.read.items()] + [
            (place, getters[place], seen, _same_constant) for place, seen in self.constants.items()]

    def _traced_in_place(self):
        fn = self.fn

        def traced(*args):
            t = tracer.current_trace()
            user, captured = args[:-1], args[-1]
            if t is None:
                return fn(*user)
            previous = t.global_generator
            t.global_generator = captured.get(GLOBAL)
            function, copies = self._rebuilt(t, captured)
            if self.rewrap is not None:
                function = self.rewrap(function)
            try:
                result = function(*user)
            finally:
                t.global_generator = previous
            self._check_unwritten(copies)
            self._note_held(t)
            return result
        inner = fn.func if isinstance(fn, functools.partial) else fn
        traced.__name__, traced.__qualname__ = inner.__name__, inner.__qualname__
        traced.__module__, traced.__doc__ = inner.__module__, inner.__doc__
        traced.__wrapped__ = fn   # errors about the function point at its definition
        traced.takes_captured = True   # its last argument is `current()` (never batched: `jit.checks.arg_spec`)
        parameters = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        # no defaults: the captured values come last (`arguments` fills the defaults in)
        parameters = [p.replace(default=p.empty) for p in parameters] + [
            inspect.Parameter("captured", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        traced.__signature__ = inspect.Signature(parameters)
        return traced

    def _rebuilt(self, t, captured: dict):
        """``fn`` with the traced generators and arrays of ``t`` at their places (`Reach.rebuilt`)."""
        roots = self.reach.roots()
        values = {}
        for label, value in captured.items():
            place = self.places.get(label)
            if place is not None:        # None: NumPy's global generator
                values[place] = value if label in self.generators else Tracer.captured(t, label, place.fetch(roots), value)
        return self.reach.rebuilt(values)

    def _check_unwritten(self, copies) -> None:
        """Refuse a write into a copy the function ran on: it would be lost."""
        for made in copies:
            written = made.written()
            if written is not None:
                raise TracingError(f"{getattr(self.fn, '__name__', 'the function')} writes into "
                                   f"{Place(made.place.root, made.place.path + (written,))}, which it "
                                   f"captures; a compiled step cannot keep that between calls: "
                                   f"{_as_argument(self.fn, made.place.root)}", user_location())

    def _note_held(self, t) -> None:
        """Note what the trace's step holds for: the contents of the arrays it computed with, and
        the numbers and strings at the places."""
        roots = self.reach.roots()
        for label in t.contents_read:
            place = self.places[label]
            self.read.setdefault(place, np.array(place.fetch(roots), copy=True))
        for place in self.places.values():
            value = place.fetch(roots)
            if constant(value):
                self.constants.setdefault(place, np.array(value) if type(value) is np.ndarray else value)
        self._guard()


def _users_callable(fn):
    """``fn`` as a function, bound method or ``functools.partial`` of the user's (an object with
    ``__call__`` as its bound method); None for one of morphjit's or of no source."""
    if not isinstance(fn, (types.FunctionType, types.MethodType, functools.partial)) and callable(fn):
        call = getattr(type(fn), "__call__", None)
        if not isinstance(call, types.FunctionType):
            return None
        fn = types.MethodType(call, fn)
    inner = fn.func if isinstance(fn, functools.partial) else fn
    code = getattr(getattr(inner, "__func__", inner), "__code__", None)
    return None if code is None or inside_package(code.co_filename) else fn


def _as_argument(fn, root: str) -> str:
    """How to pass ``root`` as an argument of ``fn`` instead, so that its writes are kept."""
    if root == "self" and hasattr(fn, "__self__"):
        method = f"{type(fn.__self__).__name__}.{fn.__name__}"
        return (f"compile {method}, which takes the object as its first argument (mj.compile({method}), called "
                f"with the object), and what it writes into the object is written back after each call")
    return (f"pass {root} as an argument; what the function writes into an argument's dicts, lists and objects "
            f"is written back after each call")


class UsesCaptured:
    """What a compiled function that captures values (``_captured``, or None) does on each call."""

    _captured: Captured | None
    _captured_version = 0   # the `Captured.version` its steps were compiled at

    def _drop_stale_steps(self) -> None:
        """Drop every compiled step (``_site``, ``_bound``, ``_variants``) where the captured contents
        one computed with have changed."""
        version = self._captured.refresh(self.__name__)
        if version != self._captured_version:
            self._site.forget()
            self._bound.clear()
            self._variants.clear()
            self._captured_version = version


def _caller_level() -> int:
    """The ``stacklevel`` of a warning that names the user's line calling into morphjit."""
    frame, level = sys._getframe(1), 1
    while frame is not None and inside_package(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def _unchanged(value, seen, same) -> bool:
    return value is seen or same(value, seen)


def _same_contents(value, seen: np.ndarray) -> bool:
    return (isinstance(value, np.ndarray) and value.shape == seen.shape and value.dtype == seen.dtype
            and np.array_equal(value, seen, equal_nan=value.dtype.kind == "f"))


def _same_constant(value, seen) -> bool:
    if type(seen) is np.ndarray:
        return _same_contents(value, seen)
    return value is seen or type(value) is type(seen) and bool(value == seen)


