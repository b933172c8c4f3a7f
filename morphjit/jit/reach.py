"""What a function reaches without taking it as an argument, and the same function reaching other
values there.

A function's roots are its closure variables, the globals it loads, for a bound method its object
(``self``; a callable object is its ``__call__``), for a ``functools.partial`` the arguments it
binds, and the same of the functions of the user's it calls through those (its helpers,
followed to `HELPERS` functions). A place is a root or an entry in one, followed `DEPTH` containers
down through dicts, lists, tuples, objects of the user's classes and the user's modules
(``params['W']``, ``self.layers[0].W``, ``settings.W``). `Reach.rebuilt` is the function (and its helpers) finding other values at
some places: copies of the containers on the way, in copies of the closure cells and globals.
"""
from __future__ import annotations

import copy
import dis
import functools
import sys
import types
from dataclasses import dataclass

import numpy as np

from ..api import GLOBAL_DRAWS
from ..native import GENERATORS
from ..tracing import SUPPORTED_DTYPES, is_user_code
from ..util import pytree

MISSING = object()
ENTRIES = 256    # the entries of a container looked into, at most
DEPTH = 6        # containers followed into containers, at most
LOOKED_AT = 4096  # the entries looked at below a root, at most
HELPERS = 64     # functions of the user's followed, at most
RESEEDING = frozenset({"seed", "set_state"})   # a function that seeds NumPy's generator draws the same each call
SCALARS = (bool, int, float, complex, str, bytes, type(None))


@dataclass(frozen=True)
class Place:
    """Where the function finds a value: a root, then a path of entries in containers, each a key
    and whether it names an attribute."""
    root: str
    path: tuple = ()

    def __str__(self) -> str:
        return self.root + "".join(f".{key}" if attr else f"[{key!r}]" for key, attr in self.path)

    def fetch(self, roots: dict):
        """The value at this place, ``roots`` being the roots' values now (MISSING if there is none)."""
        return self.entry(roots.get(self.root, MISSING))

    def entry(self, value):
        """The value at this place, ``value`` being its root's."""
        for key, attr in self.path:
            value = _entry(value, key, attr)
        return value


def _entry(value, key, attr: bool):
    if value is MISSING:
        return MISSING
    if attr:
        return getattr(value, "__dict__", {}).get(key, MISSING)
    if type(value) is dict:
        return value.get(key, MISSING)
    if type(value) in (list, tuple) and key < len(value):
        return value[key]
    return MISSING


@dataclass(frozen=True)
class Copied:
    """A container the rebuilt function finds in place of ``original`` at ``place``: ``made``, a
    copy with the entries ``found`` in place of its own."""
    place: Place
    original: object
    made: object
    found: dict

    def written(self):
        """``(key, is attribute)`` of the first entry the function changed in the copy; None if none."""
        original, made = self.original, self.made
        if type(original) is tuple:
            return None
        if type(original) is list:
            if len(made) != len(original):
                return len(original), False
            return next(((k, False) for k, v in enumerate(made) if v is not self.found.get(k, original[k])), None)
        attr = type(original) is not dict
        before, after = (vars(original), vars(made)) if attr else (original, made)
        return next(((k, attr) for k in before.keys() | after.keys()
                     if after.get(k, MISSING) is not self.found.get(k, before.get(k, MISSING))), None)


class Reach:
    """The roots ``fn`` and its helpers reach (`getters`, by label), and what is needed to rebuild
    them finding other values."""

    def __init__(self, fn):
        self.fn = fn
        self.partial = fn if isinstance(fn, functools.partial) else None
        inner = fn.func if self.partial is not None else fn
        self.owner = getattr(inner, "__self__", None)
        self.top = getattr(inner, "__func__", inner)
        self.getters: dict[str, object] = {}      # root label -> a function giving its value now
        self._keys: dict[str, tuple] = {}         # root label -> what it is (to tell roots apart)
        self.cells: dict[int, dict[str, str]] = {}           # function id -> {free variable: label}
        self.namespaces: dict[int, tuple[dict, dict]] = {}   # globals id -> (globals, {name: label})
        self.functions: list[types.FunctionType] = []        # the function, then its helpers
        if self.owner is not None:
            self._label("self", "self", ("self",), lambda: self.owner)
        self.bound = self._bound_by_partial()
        draws = seeds = False
        todo = [self.top] if isinstance(self.top, types.FunctionType) else []
        while todo and len(self.functions) < HELPERS:
            f = todo.pop(0)
            if any(f is g for g in self.functions):
                continue
            self.functions.append(f)
            loaded, d, s = _globals_and_global_draws(f.__code__, f.__globals__)
            draws, seeds = draws or d, seeds or s
            todo.extend(h for h in map(_helper, self._add_roots(f, loaded)) if h is not None)
        self.draws_globally = draws and not seeds

    def roots(self) -> dict:
        """The roots' values now, by label."""
        return {label: get() for label, get in self.getters.items()}

    def places(self) -> list[Place]:
        """The places of the arrays, generators, numbers and strings the roots hold."""
        found = []
        for label, value in self.roots().items():
            _collect(Place(label), value, found, (), DEPTH, [LOOKED_AT])
        return found

    def rebuilt(self, values: dict) -> tuple[object, list[Copied]]:
        """The function finding ``values`` (by place) where it finds what the places hold now, and
        the containers copied for that."""
        roots, copies = self.roots(), []
        replaced = {}
        for root, found in _by_root(values).items():
            replaced[root] = _with_values(Place(root), roots[root], found, copies)
        namespaces = {key: dict(ns) for key, (ns, _) in self.namespaces.items()}
        made, cells = {}, {}
        for f in self.functions:
            made[id(f)] = _function(f, namespaces[id(f.__globals__)], self._closure(f, replaced, cells))
        for cell, helper in cells.values():
            if helper is not None:
                cell.cell_contents = _remade(helper, made)
        for key, (ns, names) in self.namespaces.items():
            for name, label in names.items():
                value = ns.get(name, MISSING)
                if label in replaced:
                    namespaces[key][name] = replaced[label]
                elif _helper(value) is not None and id(_helper(value)) in made:
                    namespaces[key][name] = _remade(value, made)   # ids are their own: `functions` holds them
        function = made.get(id(self.top), self.top)
        if self.owner is not None:
            function = types.MethodType(function, replaced.get("self", self.owner))
        if self.partial is not None:
            args = [replaced.get(label, value) for label, value in zip(self.bound[0], self.partial.args)]
            keywords = {k: replaced.get(self.bound[1][k], v) for k, v in self.partial.keywords.items()}
            function = functools.partial(function, *args, **keywords)
        return function, copies

    def _bound_by_partial(self) -> tuple[list[str], dict[str, str]]:
        """Label the arguments a ``functools.partial`` binds (by keyword name, or position): their
        labels."""
        if self.partial is None:
            return [], {}
        bound = self.partial
        args = [self._label(f"partial argument {i}", f"partial argument {i}", ("partial", i), lambda i=i: bound.args[i])
                for i in range(len(bound.args))]
        keywords = {k: self._label(k, f"partial's {k}", ("partial", k), lambda k=k: bound.keywords.get(k, MISSING))
                    for k in bound.keywords}
        return args, keywords

    def _closure(self, f, replaced: dict, cells: dict):
        """``f``'s closure in the rebuilt functions: a new cell for a root given another value or
        holding a helper (filled once the helpers are made), one per cell."""
        if not f.__closure__:
            return None
        labels = self.cells[id(f)]
        closure = []
        for name, cell in zip(f.__code__.co_freevars, f.__closure__):
            value, label = _contents(cell), labels[name]
            if id(cell) not in cells:
                if label in replaced:
                    cells[id(cell)] = (types.CellType(replaced[label]), None)
                elif _helper(value) is not None and any(_helper(value) is g for g in self.functions):
                    cells[id(cell)] = (types.CellType(), value)
                else:
                    cells[id(cell)] = (cell, None)
            closure.append(cells[id(cell)][0])
        return tuple(closure)

    def _add_roots(self, f, loaded: set) -> list:
        """Label ``f``'s closure cells and the globals it loads; their values."""
        values = []
        helper = f is not self.top
        labels = self.cells.setdefault(id(f), {})
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            labels[name] = self._label(name, f"{f.__name__}'s {name}" if helper else name, ("cell", id(cell)),
                                       lambda cell=cell: _contents(cell))
            values.append(_contents(cell))
        ns = f.__globals__
        _, names = self.namespaces.setdefault(id(ns), (ns, {}))
        module = ns.get("__name__", "?")
        for name in sorted(loaded):
            if name in ns and name not in names:
                qualified = f"{module}.{name}"
                names[name] = self._label(name if ns is self.top.__globals__ else qualified, qualified,
                                          ("global", id(ns), name), lambda name=name: ns.get(name, MISSING))
                values.append(ns[name])
        return values

    def _label(self, label: str, alternative: str, key: tuple, getter) -> str:
        """The label of the root ``key``: ``label``, or ``alternative`` where another root has it."""
        for candidate in (label, alternative, *(f"{alternative}#{n}" for n in range(2, 99))):
            if self._keys.setdefault(candidate, key) == key:
                self.getters.setdefault(candidate, getter)
                return candidate
        raise AssertionError("no label left")


def _helper(value):
    """The function of the user's that calling ``value`` runs while a function is traced: ``value``
    itself, or what a transformation (``mj.grad(f)``, a compiled loss, ``mj.hvp(f)``) traces; else None."""
    value = getattr(value, "traced_function", value)
    return value if _is_users_function(value) else None


def _remade(value, made: dict):
    """``value`` (a helper or a transformation of one) finding what the rebuilt helpers find."""
    if isinstance(value, types.FunctionType):
        return made[id(value)]
    return value.rebound(made[id(value.traced_function)])


def _is_users_function(value) -> bool:
    """Whether ``value`` is a plain function of the user's (not a library's, not morphjit's)."""
    if not isinstance(value, types.FunctionType):
        return False
    filename = value.__code__.co_filename
    return is_user_code(filename) or filename.startswith("<") and not filename.startswith("<frozen")


def _function(f, namespace: dict, closure):
    made = types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__, closure)
    made.__kwdefaults__, made.__qualname__ = f.__kwdefaults__, f.__qualname__
    made.__dict__.update(f.__dict__)
    return made


def _by_root(values: dict) -> dict:
    """``{root: {path: value}}`` of values by place."""
    found: dict = {}
    for place, value in values.items():
        found.setdefault(place.root, {})[place.path] = value
    return found


def _with_values(place: Place, value, found: dict, copies: list):
    """``value`` (at ``place``) with the values ``found`` (by path below it) in place of what its
    entries hold: a copy of each container on the way (noted in ``copies``)."""
    if () in found:
        return found[()]
    entries: dict = {}
    for path, v in found.items():
        entries.setdefault(path[0], {})[path[1:]] = v
    replaced = {key: _with_values(Place(place.root, place.path + ((key, attr),)), _entry(value, key, attr), below, copies)
                for (key, attr), below in entries.items()}
    if type(value) in (list, tuple):
        made = type(value)(replaced.get(k, v) for k, v in enumerate(value))
    elif isinstance(value, types.ModuleType):
        made = types.ModuleType(value.__name__)
        vars(made).update({**vars(value), **replaced})
    else:
        made = copy.copy(value)
        (made if type(value) is dict else vars(made)).update(replaced)
    copies.append(Copied(place, value, made, replaced))
    return made


def _collect(place: Place, value, found: list, within: tuple, depth: int, budget: list) -> None:
    """Add the places of the arrays, generators, numbers and strings at and below ``place``
    (``within`` being the containers it is in), looking at ``budget[0]`` entries at most."""
    if captures(value) or constant(value):
        found.append(place)
    elif depth and not any(value is c for c in within):
        for key, entry, attr in _entries(value):
            budget[0] -= 1
            if budget[0] < 0:
                return
            _collect(Place(place.root, place.path + ((key, attr),)), entry, found, within + (value,), depth - 1, budget)


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
    elif isinstance(value, types.ModuleType) and _users_module(value):
        items = [(k, v, True) for k, v in vars(value).items() if not k.startswith("__")]
    else:
        return []
    return items if len(items) <= ENTRIES else []


def _users(cls: type) -> bool:
    filename = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return filename is None or is_user_code(filename)   # no file: __main__ of ``python -c``, a notebook


def _users_module(module: types.ModuleType) -> bool:
    """A module of the user's, with a file (``import settings``, then ``settings.W``)."""
    filename = getattr(module, "__file__", None)
    return filename is not None and is_user_code(filename)


def constant(value) -> bool:
    """Whether a captured value is a constant of the step: a number, string, 0-d array or tuple of
    them."""
    if type(value) is tuple:
        return len(value) <= ENTRIES and all(map(constant, value))
    return type(value) in SCALARS or isinstance(value, np.generic) or type(value) is np.ndarray and value.ndim == 0


def captures(value) -> bool:
    """Whether a captured value is an input of the step: an array or a generator."""
    if type(value) is np.ndarray:
        return value.ndim >= 1 and value.dtype in SUPPORTED_DTYPES
    return isinstance(value, GENERATORS)


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:   # a cell not yet bound
        return None


def _globals_and_global_draws(code, namespace: dict) -> tuple[set[str], bool, bool]:
    """The global names ``code`` and the functions defined in it load, whether they draw from
    NumPy's global generator (``np.random.randn``, ``npr.randn``) and whether they seed it."""
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
    return loaded, draws, seeds


def _is_np_random(before, ins, namespace: dict) -> bool:
    """Whether instruction ``ins`` (after ``before``) loads NumPy's ``random`` module: ``np.random``,
    or a global bound to it."""
    def loads(i, module):
        return i is not None and i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and namespace.get(i.argval) is module
    if ins is not None and ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == "random":
        return loads(before, np)
    return loads(ins, np.random)

