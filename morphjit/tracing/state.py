"""State kept between calls: what the traced function writes into the dicts, lists and objects
of its arguments (``bn_param['running_mean'] = ...``, ``cache.append(h)``, ``layer.cache = x``).

The function runs on containers built afresh from the argument tree; after it returns, each is
compared with what it was built with (`changes`). A changed entry becomes a `Write`: its value is
the argument value it was bound to (`Same`), a traced value the step computes (`Computed`, an
extra output of the program) or a value known when tracing (`Known`, copied each call). After
each call of the compiled step, `StateWrites.apply` leaves the user's containers as NumPy would
have left them.
"""
from __future__ import annotations

import copy
import inspect
import types
from dataclasses import dataclass

import numpy as np

from ..util import TracingError, pytree, user_location
from .tracer import Tracer


@dataclass(frozen=True)
class Same:
    """The value found at ``path`` of the arguments when the call began."""
    path: tuple


@dataclass(frozen=True)
class Computed:
    """The step's ``index``-th state output."""
    index: int


@dataclass(frozen=True)
class Known:
    """A value known when tracing; arrays are copied on each call, as each run would make one."""
    value: object

    def __eq__(self, other):
        return isinstance(other, Known) and same_known(self.value, other.value)

    def __hash__(self):
        return hash(type(self.value))


@dataclass(frozen=True)
class Tree:
    """A container the function made: its tree and the value of each leaf."""
    treedef: pytree.TreeDef
    leaves: tuple


@dataclass(frozen=True)
class Attr:
    """An object's attribute as a key of a path (other keys index a container)."""
    name: str


@dataclass(frozen=True)
class Write:
    """``container[key] = value`` for the container at ``path`` (``value`` None: ``del``); a list
    whose length changed is written whole (``key`` None: ``container[:] = value``)."""
    path: tuple
    key: object
    value: object

    def label(self) -> str:
        """The written place as a path into the argument tuple, e.g. ``[1]['running_mean']``."""
        keys = self.path + (() if self.key is None else (self.key,))
        return "".join(f".{k.name}" if isinstance(k, Attr) else f"[{k!r}]" for k in keys)


@dataclass(frozen=True)
class StateWrites:
    """The writes of one trace into the argument containers, and the labels of their paths."""
    writes: tuple[Write, ...] = ()
    outputs: int = 0
    labels: tuple[str, ...] = ()

    def __bool__(self):
        return bool(self.writes)

    def apply(self, args, outputs) -> None:
        """Write the values of one call (``outputs``: its state outputs) into ``args``' containers;
        every value is found before the first write, so a write never sees another's result."""
        values = [self._value(w.value, args, outputs) for w in self.writes]
        for write, value in zip(self.writes, values):
            container = at(args, write.path)
            if write.key is None:
                container[:] = value
            elif isinstance(write.key, Attr):
                if write.value is None:
                    delattr(container, write.key.name)
                else:
                    setattr(container, write.key.name, value)
            elif write.value is None:
                del container[write.key]
            else:
                container[write.key] = value

    def _value(self, ref, args, outputs):
        if ref is None:
            return None
        if isinstance(ref, Same):
            return at(args, ref.path)
        if isinstance(ref, Computed):
            value = outputs[ref.index]
            return value[()] if value.ndim == 0 else value   # a NumPy scalar, as NumPy's arithmetic gives
        if isinstance(ref, Known):
            return copy.deepcopy(ref.value)
        if isinstance(ref, Tree):
            return pytree.unflatten(ref.treedef, [self._value(v, args, outputs) for v in ref.leaves])
        return [self._value(v, args, outputs) for v in ref]   # a whole list


def at(tree, path: tuple):
    for key in path:
        tree = getattr(tree, key.name) if isinstance(key, Attr) else tree[key]
    return tree


def _same(key):
    return key


def same_known(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype
                and a.tobytes() == b.tobytes())
    return type(a) is type(b) and a == b


class Built:
    """The argument tree as the function gets it (``tree``), with each container's and object's
    original entries, so that `changes` can find what the function wrote."""

    def __init__(self, treedef: pytree.TreeDef, leaves):
        self.containers: list[tuple[tuple, object, dict]] = []
        self.origin: dict[int, tuple] = {}       # id of a built object -> its path
        self.tree = self._build(treedef, iter(leaves), ())

    def _build(self, treedef, leaves, path):
        if treedef.kind is None:
            leaf = next(leaves)
            self.origin[id(leaf)] = path
            return leaf
        is_object = isinstance(treedef.kind, pytree.Attributes)
        keys = treedef.keys if treedef.kind is dict or is_object else range(len(treedef.children))
        children = {k: self._build(c, leaves, path + (Attr(k) if is_object else k,))
                    for k, c in zip(keys, treedef.children)}
        node = pytree.unflatten(pytree.TreeDef(treedef.kind, treedef.keys, tuple(pytree.LEAF for _ in children)),
                                list(children.values())) if treedef.kind is not pytree.NONE else None
        if treedef.kind in (dict, list) or is_object:
            self.containers.append((path, node, children))
        if node is not None:
            self.origin[id(node)] = path
        return node

    def changes(self) -> tuple[list[Write], list[Tracer]]:
        """The writes the function made into the argument containers, and the traced values
        they store (the step's state outputs, in `Computed` order)."""
        computed: list[Tracer] = []
        writes = []
        for path, node, before in self.containers:
            if type(node) is not list:
                entries, key = (node, _same) if type(node) is dict else (vars(node), Attr)
                writes += [Write(path, key(k), self._ref(v, computed)) for k, v in entries.items()
                           if k not in before or v is not before[k]]
                writes += [Write(path, key(k), None) for k in before if k not in entries]
            elif len(node) == len(before):
                writes += [Write(path, k, self._ref(v, computed)) for k, v in enumerate(node) if v is not before[k]]
            else:
                writes.append(Write(path, None, tuple(self._ref(v, computed) for v in node)))
        return writes, computed

    def _ref(self, value, computed: list):
        path = self.origin.get(id(value))
        if path is not None:
            return Same(path)
        if isinstance(value, Tracer):
            if value.concrete() is not None:
                return Known(np.array(value.concrete()))
            found = next((k for k, x in enumerate(computed) if x is value), None)
            if found is None:
                computed.append(value)
                found = len(computed) - 1
            return Computed(found)
        if pytree.is_int_list(value):
            return Known(list(value))
        leaves, treedef = pytree.flatten(value, int_lists=True)
        if treedef.kind is not None:
            return Tree(treedef, tuple(self._ref(v, computed) for v in leaves))
        if isinstance(value, (np.ndarray, np.generic, bool, int, float, complex, bytes)):
            return Known(np.array(value) if isinstance(value, np.ndarray) else value)
        raise TracingError(f"the function stores a {type(value).__name__} in an argument container, which a "
                           f"compiled step cannot keep between calls; store arrays, numbers, or containers or "
                           f"objects of them", user_location())


def check_no_escape(fn, t) -> None:
    """Refuse a traced value of trace ``t`` left where no compiled step can update it between
    calls: in a global the function names, its closure or the object it is a method of."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    places = [("self", fn.__self__)] if hasattr(fn, "__self__") else []
    if code is not None:
        cells = zip(code.co_freevars, fn.__closure__ or ())
        places += [(f"the closure variable {name}", cell.cell_contents) for name, cell in cells
                   if _filled(cell)]
        globals_ = getattr(fn, "__globals__", {})
        places += [(f"the global {name}", globals_[name]) for name in code.co_names if name in globals_]
    for where, value in places:
        found = _tracer_in(value, t, where, set(), depth=4)
        if found is not None:
            tracer, path = found
            loc = next((b.loc for b in t.bindings if b.out is tracer.operand), None) or user_location()
            raise TracingError(f"{getattr(fn, '__name__', 'the function')} leaves a traced value in {path} when "
                               f"it returns; a compiled step cannot update it between calls: return it (has_aux=True) "
                               f"or keep it in a dict or an object passed as an argument, which is written back after "
                               f"each call",
                               loc)


SCANNED = 10_000   # the entries of a container looked at, the last ones (where appends go)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _tracer_in(value, t, path: str, seen: set, depth: int):
    """The first tracer of trace ``t`` inside ``value`` (through dicts, lists, tuples and objects'
    attributes, ``depth`` levels down) and its path, or None."""
    if isinstance(value, Tracer):
        return (value, path) if value.trace is t else None
    if (depth == 0 or id(value) in seen or callable(value)
            or isinstance(value, (np.ndarray, np.generic, str, bytes, int, float, types.ModuleType))):
        return None
    seen.add(id(value))
    if isinstance(value, dict):
        items = [(f"{path}[{k!r}]", v) for k, v in list(value.items())[-SCANNED:]]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}[{k}]", v) for k, v in list(enumerate(value))[-SCANNED:]]
    else:
        items = [(f"{path}.{k}", v) for k, v in list(getattr(value, "__dict__", {}).items())]
    for where, child in items:
        found = _tracer_in(child, t, where, seen, depth - 1)
        if found is not None:
            return found
    return None
