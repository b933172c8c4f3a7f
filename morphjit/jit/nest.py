"""Transformations called inside a traced function: ``mj.grad`` of an inner function, a compiled
loss, ``mj.hvp`` and ``mj.compile`` called on traced values record into the trace being recorded
instead of compiling a step of their own.

A derivative is taken at fresh points: each differentiated leaf becomes a new value, bound to the
leaf by an ``identity`` op, so that the inner sweep tells the point from the outer value it
stands for (``lambda y: x * y`` called at ``x``). The function runs on the points, and the reverse
sweep (`transforms.backward`) is appended over what it recorded (the region). Values defined
before the region (closures over outer traced values, arguments not differentiated) are constant
to the inner sweep; the outer transformation later differentiates every binding, the inner
sweep's included, as ordinary traced code.
"""
from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..ir import is_float
from ..tracing import Trace, Tracer, argument_names, current_trace
from ..transforms import backward
from ..util import (DtypeError, MorphjitError, ShapeError, SourceLoc, TracingError, UnsupportedError, pytree,
                    user_location)
from .checks import normalize_argnums


def enclosing_trace(args, kwargs) -> Trace | None:
    """The trace a call with these arguments records into: None outside tracing (where the call
    runs a compiled step), else the trace of a traced value among them or the current one."""
    t = current_trace()
    if t is None:
        return None
    return _trace_among((tuple(args), kwargs)) or t


def _trace_among(tree) -> Trace | None:
    """The trace of a traced value recording among the tuples, lists and dicts of ``tree``."""
    if isinstance(tree, Tracer):
        return None if tree.trace.closed else tree.trace
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (tuple, list)):
        return next((t for t in map(_trace_among, tree) if t is not None), None)
    return None


def positional(fn, name: str, args, kwargs) -> tuple:
    """``args`` and ``kwargs`` bound to ``fn``'s positional parameters."""
    if not kwargs:
        return tuple(args)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(f"{name}: keyword-only or **kwargs parameters cannot be traced "
                        f"({', '.join(bound.kwargs)}); make them positional")
    return bound.args


@dataclass(frozen=True)
class Transformation:
    """One transformation being traced inside another: what errors raised in it are prefixed with."""

    name: str            # "mj.grad"
    function: str        # the name of the function it transforms
    arguments: str       # "argument y (argnums=0)"
    loc: SourceLoc | None

    def __str__(self) -> str:
        where = f", called at {self.loc.filename.rsplit('/', 1)[-1]}:{self.loc.lineno}" if self.loc else ""
        return f"{self.name} of {self.function} ({self.arguments}){where}"


_active = threading.local()


@contextmanager
def transformation(name: str, fn, arguments: str, loc: SourceLoc | None):
    """Errors raised while ``fn`` is transformed (called at ``loc``) say which transformations were
    being traced, innermost first, and where each was called."""
    stack = _active.__dict__.setdefault("stack", [])
    stack.append(Transformation(name, getattr(fn, "__name__", "the function"), arguments, loc))
    try:
        yield
    except MorphjitError as error:
        if not getattr(error, "nested_in", None):
            error.nested_in = list(reversed(stack))
            chain = ", inside ".join(str(s) for s in error.nested_in)
            error.message = f"in {chain}:\n  {error.message}"
            error.args = (error.message,)
        raise
    finally:
        stack.pop()


def point(t: Trace, leaf, path: str, what: str) -> Tracer:
    """A new value equal to ``leaf``: what an inner transformation differentiates with respect to."""
    weak = isinstance(leaf, float) and not isinstance(leaf, np.generic)
    if isinstance(leaf, Tracer):
        x = leaf.recorded()
    elif weak or isinstance(leaf, (np.ndarray, np.generic)):
        x = np.asarray(leaf)
    else:
        raise DtypeError(f"{what}: {path} is differentiated but is a {type(leaf).__name__}; differentiated "
                         f"arguments must hold float32 or float64 values", user_location())
    if not is_float(x.dtype):
        raise DtypeError(f"{what}: {path} is differentiated but is {x.dtype}; only float32 and float64 values "
                         f"have derivatives: pass it as an argument that is not differentiated (choose "
                         f"argnums), or cast it", user_location())
    made = t.bind("identity", [x])
    made.weak = weak
    return made


def with_points(t: Trace, fn, args: tuple, argnums, what: str) -> tuple[list, list, list]:
    """``args`` with each leaf of the differentiated arguments replaced by a point, the points and
    the tree of each differentiated argument."""
    names = argument_names(fn, len(args))
    args = list(args)
    points, trees = [], []
    for i in normalize_argnums(argnums, len(args)):
        leaves, treedef = pytree.flatten(args[i])
        made = [point(t, leaf, path, what) for leaf, path in zip(leaves, pytree.leaf_paths(treedef, names[i]))]
        args[i] = pytree.unflatten(treedef, made)
        points += made
        trees.append(treedef)
    return args, points, trees


def argnums_text(fn, args, argnums) -> str:
    names = argument_names(fn, len(args))
    nums = normalize_argnums(argnums, len(args))
    which = ", ".join(names[i] for i in nums)
    return f"argument{'s' if len(nums) != 1 else ''} {which} (argnums={argnums!r})"


def value_and_grad(t: Trace, fn, args: tuple, argnums, has_aux: bool, what: str):
    """``(value, grads)`` (``((value, aux), grads)`` with ``has_aux``) of ``fn(*args)``, traced into
    ``t``: the gradients with respect to ``args[argnums]``, as traced values."""
    with transformation(what, fn, argnums_text(fn, args, argnums), user_location()):
        args, points, trees = with_points(t, fn, args, argnums, what)
        wrt = [p.operand for p in points]     # before fn runs: a write into a point makes a new value
        start = len(t.bindings)
        out = fn(*args)
        value, aux = split_aux(fn, out, has_aux)
        loss = scalar_loss(fn, value)
        grads = backward(t, t.bindings[start:], t.operand(loss, lift_literals=True), wrt)
    per_argument, at = [], 0
    for treedef in trees:
        per_argument.append(pytree.unflatten(treedef, grads[at:at + treedef.num_leaves]))
        at += treedef.num_leaves
    grads = tuple(per_argument) if isinstance(argnums, (tuple, list)) else per_argument[0]
    return ((value, aux) if has_aux else value), grads


def split_aux(fn, out, has_aux: bool):
    """``(loss, aux)`` of what ``fn`` returned (aux None without ``has_aux``)."""
    if not has_aux:
        return out, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        name = getattr(fn, "__name__", "the function")
        raise TracingError(f"{name} is differentiated with has_aux=True, so it must return (loss, aux); "
                           f"it returned a {type(out).__name__}", user_location())
    return out[0], out[1]


def scalar_loss(fn, out):
    """``out`` checked to be what a loss returns: one float scalar."""
    name = getattr(fn, "__name__", "the function")
    if not isinstance(out, (Tracer, np.ndarray, np.generic, float)):
        raise TracingError(f"{name} must return one scalar loss, but returned a {type(out).__name__}",
                           user_location())
    out = out if isinstance(out, Tracer) else np.asarray(out)
    if out.shape != ():
        raise ShapeError(f"{name} must return a scalar loss, but returned shape {out.shape}; reduce "
                         f"it, for example with .mean() or .sum() (for the gradient of each row with "
                         f"respect to its inputs, differentiate the sum)", user_location())
    if not is_float(out.dtype):
        raise DtypeError(f"{name} must return a float loss, but returned {out.dtype}", user_location())
    return out


def refuse_out(what: str, out) -> None:
    if out is not None:
        raise UnsupportedError(f"{what} is called inside a traced function, where it gives traced values: "
                               f"out= has no arrays to write; drop it", user_location())
