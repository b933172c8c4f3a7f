"""Nested containers of arrays (dicts, lists, tuples, namedtuples) as flat leaf lists.

Dict keys are visited in sorted order, as JAX does, so the flat order does not depend on how
the user built the dict. ``None`` is a node without children, as in JAX: part of the structure
(a call's signature), not a leaf, and given back as ``None``.

With ``int_lists`` (the arguments of a call) more is structure:
- a flat list of Python ints is one leaf, an integer array of its length;
- a string (``bn_param['mode']``) is a node without children whose value is part of the structure;
- an object of a plain Python class (``vars(obj)`` holds its state) is a node whose children are its
  attributes, by name (`Attributes`); it is rebuilt as a new object of the class;
- a function, class or module is a node without children that holds it (`Held`): the same object
  is the same structure.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from .errors import DtypeError, ShapeError, TracingError, user_location


@dataclass(frozen=True)
class TreeDef:
    kind: object               # a container type, NONE, str, Held, an Attributes; None for a leaf
    keys: tuple = ()           # dict keys, or namedtuple field names
    children: tuple["TreeDef", ...] = ()

    @property
    def num_leaves(self) -> int:
        return 1 if self.kind is None else sum(c.num_leaves for c in self.children)

    def __str__(self) -> str:
        if self.kind is None:
            return "*"
        if self.kind is NONE:
            return "None"
        if self.kind is str or self.kind is Held:
            return repr(self.keys[0])
        if isinstance(self.kind, Attributes):
            return f"{self.kind}(" + ", ".join(f"{k}={c}" for k, c in self._labelled()) + ")"
        inner = ", ".join(f"{k!r}: {c}" if self.kind is dict else str(c) for k, c in self._labelled())
        return {dict: "{%s}", list: "[%s]"}.get(self.kind, "(%s)") % inner

    def _labelled(self):
        return zip(self.keys or range(len(self.children)), self.children)


LEAF = TreeDef(None)
NONE = type(None)


@dataclass(frozen=True)
class Attributes:
    """The node kind of an object taken apart by its attributes; its keys are their names."""
    cls: type

    def __str__(self) -> str:
        return self.cls.__qualname__


class Held:
    """The node kind of a function, class or module in the arguments: equal to another for the
    same object (a bound method: the same function of the same object)."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Held) and (self.value is other.value or (
            isinstance(self.value, types.MethodType) and self.value == other.value))

    def __hash__(self):
        if isinstance(self.value, types.MethodType):
            return hash((id(self.value.__self__), id(self.value.__func__)))
        return id(self.value)

    def __repr__(self):
        return getattr(self.value, "__qualname__", None) or getattr(self.value, "__name__", None) or repr(self.value)


_ARRAY_PROTOCOLS = ("__array__", "__array_interface__", "__array_ufunc__", "__array_function__")
_HEAP_TYPE = 1 << 9    # Py_TPFLAGS_HEAPTYPE: a class statement made it, not C code


def is_plain_object(x) -> bool:
    """Whether ``x`` is an object of a plain Python class, whose state is its ``__dict__``: not a
    container, array-like, extension type or class with a constructor of its own."""
    cls = type(x)
    return bool(cls.__flags__ & _HEAP_TYPE and cls.__new__ is object.__new__
                and isinstance(getattr(x, "__dict__", None), dict)
                and not any(hasattr(cls, name) for name in _ARRAY_PROTOCOLS))


def is_held(x) -> bool:
    """Whether ``x`` is held as structure in the arguments: a function, class or module."""
    return isinstance(x, (types.ModuleType, type)) or (callable(x) and not is_plain_object(x))


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def is_int_list(x) -> bool:
    """Whether ``x`` is a non-empty flat list of Python ints (bools are not)."""
    return type(x) is list and len(x) > 0 and all(type(i) is int for i in x)


def _children(tree, int_lists: bool = False) -> tuple[type, tuple, list] | None:
    if int_lists and is_int_list(tree):
        return None
    if tree is None:
        return NONE, (), []
    if isinstance(tree, dict):
        keys = tuple(sorted(tree))
        return dict, keys, [tree[k] for k in keys]
    if _is_namedtuple(tree):
        return type(tree), type(tree)._fields, list(tree)
    if isinstance(tree, (list, tuple)):
        return type(tree), (), list(tree)
    if not int_lists:
        return None
    if type(tree) is str:
        return str, (tree,), []
    if is_plain_object(tree):
        keys = tuple(sorted(vars(tree)))
        return Attributes(type(tree)), keys, [vars(tree)[k] for k in keys]
    if is_held(tree):
        return Held, (Held(tree),), []
    return None


def flatten(tree, int_lists: bool = False) -> tuple[list, TreeDef]:
    """The leaves of ``tree`` and its structure (with ``int_lists``, of a call's arguments)."""
    leaves: list = []
    return leaves, _flatten_into(tree, leaves, int_lists, ())


def _flatten_into(tree, leaves: list, int_lists: bool, objects: tuple) -> TreeDef:
    node = _children(tree, int_lists)
    if node is None:
        leaves.append(tree)
        return LEAF
    kind, keys, children = node
    if isinstance(kind, Attributes):
        if any(tree is o for o in objects):
            raise TracingError(f"an argument holds an object of class {kind} that contains itself through its "
                               f"attributes; a compiled step takes its arguments apart into arrays: pass an object "
                               f"that holds the arrays, not one that refers back to itself", user_location())
        objects += (tree,)
    return TreeDef(kind, keys, tuple(_flatten_into(c, leaves, int_lists, objects) for c in children))


def unflatten(treedef: TreeDef, leaves) -> Any:
    it = iter(leaves)
    result = builder(treedef)(it)
    if next(it, _END) is not _END:
        raise ValueError("too many leaves for the tree structure")
    return result


_END = object()


def builder(treedef: TreeDef) -> Callable[[Iterator], Any]:
    """A function that builds a tree of this structure from an iterator over its leaves."""
    if treedef.kind is None:
        return next
    children = [builder(c) for c in treedef.children]
    kind, keys = treedef.kind, treedef.keys
    if kind is NONE:
        return lambda it: None
    if kind is str:
        return lambda it: keys[0]
    if kind is Held:
        return lambda it: keys[0].value
    if kind is dict:
        return lambda it: {k: b(it) for k, b in zip(keys, children)}
    if isinstance(kind, Attributes):
        return lambda it: rebuilt(kind.cls, {k: b(it) for k, b in zip(keys, children)})
    if keys:  # namedtuple
        return lambda it: kind(*[b(it) for b in children])
    return lambda it: kind([b(it) for b in children])


def rebuilt(cls: type, attributes: dict):
    """A new object of ``cls`` with these attributes, its constructor not called."""
    obj = object.__new__(cls)
    vars(obj).update(attributes)
    return obj


def keyed_flatten(tree, leaves: list, leaf_key: Callable) -> tuple:
    """Append the leaves of the arguments ``tree`` to ``leaves`` (in ``flatten``'s order, with
    ``int_lists``) and return a hashable key of its structure and of ``leaf_key`` of each leaf: the
    fast path of a call."""
    kind = type(tree)
    if kind is dict:
        keys = sorted(tree)
        return dict, tuple(keys), tuple([keyed_flatten(tree[k], leaves, leaf_key) for k in keys])
    if kind is tuple or kind is list and not is_int_list(tree):
        return kind, tuple([keyed_flatten(c, leaves, leaf_key) for c in tree])
    node = _children(tree, int_lists=True)
    if node is None:
        leaves.append(tree)
        return leaf_key(tree)
    kind, keys, children = node
    if isinstance(kind, Attributes):    # flattened whole: `flatten` finds cycles
        found, treedef = flatten(tree, int_lists=True)
        leaves += found
        return treedef, tuple([leaf_key(x) for x in found])
    return kind, keys, tuple([keyed_flatten(c, leaves, leaf_key) for c in children])


def leaf_paths(treedef: TreeDef, root: str) -> list[str]:
    """Readable paths of the leaves, e.g. ``params['W1']`` or ``batch[0]``."""
    if treedef.kind is None:
        return [root]
    paths = []
    for key, child in treedef._labelled():
        label = f".{key}" if _is_field(treedef) else f"[{key!r}]"
        paths += leaf_paths(child, root + label)
    return paths


def _is_field(treedef: TreeDef) -> bool:
    return treedef.kind is not dict and bool(treedef.keys)


def ravel_pytree(tree, name: str = "tree") -> tuple:
    """``(vector, unravel)``: the float leaves of ``tree`` in one flat vector (a copy, in
    `flatten`'s order, each leaf in C order), and the function that takes such a vector back to a
    tree of views into it (JAX's ``ravel_pytree``). The leaves must share one float dtype; the
    error names the first that does not (``name`` is the tree's path in messages)."""
    leaves, treedef = flatten(tree)
    paths = leaf_paths(treedef, name)
    arrays = [np.asarray(x) for x in leaves]
    for path, x in zip(paths, arrays):
        if x.dtype.kind != "f" or x.dtype != arrays[0].dtype:
            expected = "a float array" if x.dtype.kind != "f" else f"{arrays[0].dtype} like {paths[0]}"
            raise DtypeError(f"{path} is {x.dtype}; a flat parameter vector needs every leaf {expected}")
    dtype = arrays[0].dtype if arrays else np.dtype(np.float64)
    vector = np.concatenate([x.ravel() for x in arrays]) if arrays else np.zeros(0, dtype)
    shapes = [x.shape for x in arrays]
    bounds = np.cumsum([0] + [x.size for x in arrays]).tolist()

    def unravel(flat):
        flat = np.asarray(flat, dtype)
        if flat.shape != vector.shape:
            raise ShapeError(f"the flat vector of {name} has shape {vector.shape}, got {flat.shape}")
        return unflatten(treedef, [flat[a:b].reshape(s) for a, b, s in zip(bounds, bounds[1:], shapes)])
    return vector, unravel
