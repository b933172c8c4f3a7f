"""What a function reaches without taking it as an argument: values in its closure, among the
globals it loads and, for a bound method, in its object (``self``), one level into the dicts, lists,
tuples and objects found there (``params['W']``, ``self.W``); and NumPy's global generator
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
itself whose closure, globals and object hold the traced values in place of the originals (copies
of the containers that hold them; a write into such a copy is refused), and the global draws of
``np.random`` go to the traced global generator (``morphjit.api.random``).
"""
from __future__ import annotations

import copy
import dis
import inspect
import sys
import types
import warnings
from dataclasses import dataclass

import numpy as np

from ..api import GLOBAL_DRAWS
from ..native import GENERATORS
from ..tracing import SUPPORTED_DTYPES, Tracer, is_user_code, tracer
from ..util import RecompileWarning, TracingError, inside_package, pytree, user_location

GLOBAL = "np.random"
RESEEDING = frozenset({"seed", "set_state"})   # a function that seeds NumPy's generator draws the same each call
ENTRIES = 256     # the entries of a captured container looked into, at most
MISSING = object()
SCALARS = (bool, int, float, complex, str, bytes, type(None))


@dataclass(frozen=True)
class Place:
    """Where the function finds a captured value: a root (a closure variable, a global, ``self``)
    or an entry of one (a dict's key, a list's index, an object's attribute)."""
    root: str
    key: object = None     # None: the root itself
    attr: bool = False

    def __str__(self) -> str:
        if self.key is None:
            return self.root
        return f"{self.root}.{self.key}" if self.attr else f"{self.root}[{self.key!r}]"

    def fetch(self, roots: dict):
        """The value at this place, ``roots`` being the roots' values now (MISSING if there is none)."""
        return self.entry(roots.get(self.root, MISSING))

    def entry(self, value):
        """The value at this place, ``value`` being its root's."""
        if self.key is None or value is MISSING:
            return value
        if self.attr:
            return getattr(value, "__dict__", {}).get(self.key, MISSING)
        if type(value) is dict:
            return value.get(self.key, MISSING)
        if type(value) in (list, tuple) and self.key < len(value):
            return value[self.key]
        return MISSING


class Captured:
    """The values ``fn`` reaches from its closure, globals and object, and the function traced in
    its place (taking the generators and arrays as a last argument)."""

    def __init__(self, fn, cells: dict, global_names: tuple[str, ...], draws_globally: bool):
        self.fn, self.cells, self.global_names, self.draws_globally = fn, cells, global_names, draws_globally
        self.owner = getattr(fn, "__self__", None)
        roots = self._roots()
        self.places = {str(p): p for p in _places(roots)}
        self._getters = [(label, self._getter(place)) for label, place in self.places.items()]
        self.generators = frozenset(label for label, p in self.places.items() if isinstance(p.fetch(roots), GENERATORS))
        self.takes_generators = bool(self.generators) or draws_globally
        self.read: dict[Place, np.ndarray] = {}   # arrays whose contents a trace computed with -> a copy of them
        self.constants: dict[Place, object] = {}  # numbers and strings, as the steps hold them
        self.version = 0   # counted up when what a step holds for changes: steps compiled before are stale
        self._guards: list = []
        self.function = self._traced_in_place()

    @classmethod
    def of(cls, fn) -> Captured | None:
        """What ``fn`` captures, or None when it captures nothing of these."""
        code = getattr(fn, "__code__", None)
        if code is None or not hasattr(fn, "__globals__") or inside_package(code.co_filename):
            return None    # morphjit's own wrappers capture nothing of the user's
        cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
        loaded, draws_globally = _globals_and_global_draws(code, fn.__globals__)
        global_names = tuple(sorted(n for n in loaded if n in fn.__globals__))
        found = cls(fn, cells, global_names, draws_globally)
        return found if found.places or draws_globally else None

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
            if _captures(value):
                found[label] = value
        if self.draws_globally:
            found[GLOBAL] = np.random.mtrand._rand
        return found

    def refresh(self, user: str) -> int:
        """The `version` of what the steps hold for: counted up (with a warning naming ``user``, the
        compiled function) where a place holds another constant, or an array whose contents a
        trace computed with holds others."""
        stale = [place for place, get, seen in self._guards if get() is not seen and not (
            _same_contents if place in self.read else _same_constant)(get(), seen)]
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
        if place.root == "self" and self.owner is not None:
            owner = self.owner
            return lambda: place.entry(owner)
        if place.root in self.cells:
            cell = self.cells[place.root]
            return lambda: place.entry(_contents(cell))
        namespace = self.fn.__globals__
        return lambda: place.entry(namespace.get(place.root, MISSING))

    def _guard(self) -> None:
        """The checks `refresh` makes: ``(place, getter, what a step holds for)``."""
        getters = {self.places[label]: get for label, get in self._getters}
        self._guards = [(place, getters[place], seen) for place, seen in (*self.read.items(), *self.constants.items())]

    def _roots(self) -> dict:
        found = {name: _contents(cell) for name, cell in self.cells.items()}
        namespace = self.fn.__globals__
        found.update((name, namespace.get(name, MISSING)) for name in self.global_names)
        if self.owner is not None:
            found["self"] = self.owner
        return found

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
            try:
                result = function(*user)
            finally:
                t.global_generator = previous
            self._check_unwritten(copies)
            self._note_held(t)
            return result
        traced.__name__, traced.__qualname__ = fn.__name__, fn.__qualname__
        traced.__module__, traced.__doc__ = fn.__module__, fn.__doc__
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
        """``fn`` with the traced generators and arrays of ``t`` in (copies of) its closure, globals
        and object, and the copies of containers made, with their originals."""
        roots = self._roots()
        replaced: dict[str, object] = {}   # root -> what the function finds there
        entries: dict[str, dict] = {}      # root -> {key: traced value} of its entries
        for label, value in captured.items():
            place = self.places.get(label)
            if place is None:        # NumPy's global generator
                continue
            traced = value if label in self.generators else Tracer.captured(t, label, place.fetch(roots), value)
            if place.key is None:
                replaced[place.root] = traced
            else:
                entries.setdefault(place.root, {})[place.key] = traced
        copies = [(root, roots[root], _with_entries(roots[root], found), found) for root, found in entries.items()]
        replaced.update((root, made) for root, _, made, _ in copies)
        func = getattr(self.fn, "__func__", self.fn)
        closure = tuple(types.CellType(replaced[name]) if name in replaced else cell
                        for name, cell in zip(func.__code__.co_freevars, func.__closure__ or ()))
        namespace = dict(func.__globals__)
        namespace.update((name, replaced[name]) for name in self.global_names if name in replaced)
        function = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__, closure or None)
        function.__kwdefaults__ = func.__kwdefaults__
        if self.owner is not None:
            function = types.MethodType(function, replaced.get("self", self.owner))
        return function, copies

    def _check_unwritten(self, copies) -> None:
        """Refuse a write into a copy the function ran on: it would be lost."""
        for root, original, made, found in copies:
            key = _written_entry(original, made, found)
            if key is not MISSING:
                raise TracingError(f"{getattr(self.fn, '__name__', 'the function')} writes into "
                                   f"{Place(root, key, not isinstance(original, (dict, list, tuple)))}, which it "
                                   f"captures; a compiled step cannot keep that between calls: "
                                   f"{_as_argument(self.fn, root)}", user_location())

    def _note_held(self, t) -> None:
        """Note what the trace's step holds for: the contents of the arrays it computed with, and
        the numbers and strings at the places."""
        roots = self._roots()
        for label in t.contents_read:
            place = self.places[label]
            self.read.setdefault(place, np.array(place.fetch(roots), copy=True))
        for place in self.places.values():
            value = place.fetch(roots)
            if _constant(value):
                self.constants.setdefault(place, np.array(value) if type(value) is np.ndarray else value)
        self._guard()


def _as_argument(fn, root: str) -> str:
    """How to pass ``root`` as an argument of ``fn`` instead, so that its writes are kept."""
    if root == "self" and hasattr(fn, "__self__"):
        method = f"{type(fn.__self__).__name__}.{fn.__name__}"
        return (f"compile {method}, which takes the object as its first argument (mj.compile({method}), called "
                f"with the object), and what it writes into the object is written back after each call")
    return (f"pass {root} as an argument; what the function writes into an argument's dicts, lists and objects "
            f"is written back after each call")


def _places(roots: dict) -> list[Place]:
    """The places of the arrays, generators, numbers and strings among ``roots``' values and their
    entries."""
    found = []
    for root, value in roots.items():
        if _captures(value) or _constant(value):
            found.append(Place(root))
            continue
        for key, entry, attr in _entries(value):
            if _captures(entry) or _constant(entry):
                found.append(Place(root, key, attr))
    return found


def _entries(value) -> list[tuple]:
    """``(key, entry, is attribute)`` of a dict (string and int keys), list, tuple or plain
    object of a class of the user's (a library's objects keep their state their own way) of at most
    `ENTRIES` entries; none of anything else."""
    if type(value) is dict:
        items = [(k, v, False) for k, v in value.items() if type(k) in (str, int)]
    elif type(value) in (list, tuple):
        items = [(k, v, False) for k, v in enumerate(value)]
    elif pytree.is_plain_object(value) and _users(type(value)):
        items = [(k, v, True) for k, v in vars(value).items()]
    else:
        return []
    return items if len(items) <= ENTRIES else []


def _users(cls: type) -> bool:
    filename = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return filename is None or is_user_code(filename)   # no file: __main__ of ``python -c``, a notebook


def _with_entries(value, found: dict):
    """A copy of the container ``value`` with the entries ``found`` in place of its own."""
    if type(value) in (list, tuple):
        return type(value)(found.get(k, v) for k, v in enumerate(value))
    made = copy.copy(value)
    (made if type(value) is dict else vars(made)).update(found)
    return made


def _written_entry(original, made, found: dict):
    """The key of the first entry the function changed in ``made``, the copy of ``original`` with
    the entries ``found``; MISSING if it changed none."""
    if type(original) is tuple:
        return MISSING
    if type(original) is list:
        if len(made) != len(original):
            return len(original)
        return next((k for k, v in enumerate(made) if v is not found.get(k, original[k])), MISSING)
    before, after = (original, made) if type(original) is dict else (vars(original), vars(made))
    return next((k for k in before.keys() | after.keys()
                 if after.get(k, MISSING) is not found.get(k, before.get(k, MISSING))), MISSING)


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


def _same_contents(value, seen: np.ndarray) -> bool:
    return (isinstance(value, np.ndarray) and value.shape == seen.shape and value.dtype == seen.dtype
            and np.array_equal(value, seen, equal_nan=value.dtype.kind == "f"))


def _constant(value) -> bool:
    """Whether a captured value is a constant of the step: a number, string, 0-d array or tuple of
    them."""
    if type(value) is tuple:
        return len(value) <= ENTRIES and all(map(_constant, value))
    return type(value) in SCALARS or isinstance(value, np.generic) or type(value) is np.ndarray and value.ndim == 0


def _same_constant(value, seen) -> bool:
    if type(seen) is np.ndarray:
        return _same_contents(value, seen)
    return value is seen or type(value) is type(seen) and bool(value == seen)


def _captures(value) -> bool:
    if type(value) is np.ndarray:
        return value.ndim >= 1 and value.dtype in SUPPORTED_DTYPES
    return isinstance(value, GENERATORS)


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:   # a cell not yet bound
        return None


def _globals_and_global_draws(code, namespace: dict) -> tuple[set[str], bool]:
    """The global names ``code`` and the functions defined in it load, and whether they draw from
    NumPy's global generator (``np.random.randn``, ``npr.randn``) without seeding it."""
    loaded, draws, seeds, stack = set(), False, False, [code]
    while stack:
        c = stack.pop()
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        before = previous = None
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                loaded.add(ins.argval)
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and _is_np_random(before, previous, namespace):
                draws |= ins.argval in GLOBAL_DRAWS
                seeds |= ins.argval in RESEEDING
            before, previous = previous, ins
    return loaded, draws and not seeds


def _is_np_random(before, ins, namespace: dict) -> bool:
    """Whether instruction ``ins`` (after ``before``) loads NumPy's ``random`` module: ``np.random``,
    or a global bound to it."""
    def loads(i, module):
        return i is not None and i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and namespace.get(i.argval) is module
    if ins is not None and ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == "random":
        return loads(before, np)
    return loads(ins, np.random)
