"""The forward program of a compiled function: the function traced (twice, ``trace_twice``) and
checked to return what its kind needs: one float scalar loss, with ``has_aux`` a pair ``(loss,
aux)``, or (forward only) a tree of arrays and numbers. Each refusal names the function and
points at the line it is defined on or at the value's."""
from __future__ import annotations

import functools
import inspect
import linecache

import numpy as np

from ..ir import Program, is_float
from ..tracing import FrozenValueError, NotAnArray, StateWrites, Tracer, argument_names, trace_twice
from ..util import DtypeError, ShapeError, SourceLoc, TracingError, pytree
from .checks import number_sequences


def trace_loss(fn, args, spec=None, batched=frozenset()) -> Program:
    """The forward program of ``fn``, checked to return one float scalar."""
    return traced_loss(fn, args, batched)[0]


def traced_loss(fn, args, batched=frozenset(), has_aux=False) -> tuple[Program, object, StateWrites]:
    """The forward program of ``fn``, checked to return one float scalar (with ``has_aux``: a
    pair ``(loss, aux)``, aux's leaves the program's further outputs), aux's tree and the state
    the function writes into its arguments (the outputs after aux's). The leading extent of the
    leaves in ``batched`` is the symbolic batch size."""
    traced = aux_checked(fn) if has_aux else fn
    program, out_tree, state = traced_program(traced, args, batched)
    loss_tree, aux_tree = out_tree.children if has_aux else (out_tree, None)
    if loss_tree.num_leaves != 1:
        raise TracingError(f"{fn.__name__} must return one scalar loss, but returned {loss_tree} "
                           f"({loss_tree.num_leaves} arrays)", function_location(fn))
    loss = program.outputs[0]
    loc = next((b.loc for b in program.bindings if b.out is loss), None)
    if loss.shape != ():
        raise ShapeError(f"{fn.__name__} must return a scalar loss, but returned {loss.type}; "
                         f"reduce it, for example with .mean() or .sum()", loc)
    if not is_float(loss.dtype):
        raise DtypeError(f"{fn.__name__} must return a float loss, but returned {loss.type}", loc)
    return program, aux_tree, state


def trace_outputs(fn, args, batched=frozenset()) -> tuple[Program, object, StateWrites]:
    """The program of a forward-only function, whose outputs are the leaves of what it returns
    (a tree of arrays and numbers) and then the state it writes into its arguments, their tree
    and that state."""
    checked = functools.wraps(fn)(lambda *a: check_leaves(fn, fn(*a), "output"))
    program, out_tree, state = traced_program(checked, args, batched)
    if not out_tree.num_leaves:
        raise TracingError(f"{fn.__name__} returned {out_tree}, which holds no arrays", function_location(fn))
    return program, out_tree, state


def check_state(fn, state: StateWrites, differentiated, kept: bool = True) -> None:
    """Refuse state a step cannot keep: any where it is not written back (``kept`` false, a
    training step), and a write into the containers of a differentiated argument, whose gradient
    is of the value passed in and which an optimiser updates."""
    name = getattr(fn, "__name__", "the function")
    if state and not kept:
        raise TracingError(f"{name} writes into {state.labels[0]}; a training step does not keep state written "
                           f"into its arguments: compile the loss with mj.compile_loss, which writes it back after "
                           f"each call, and update the parameters with its gradients")
    for write, label in zip(state.writes, state.labels):
        if write.path[0] in differentiated:
            raise TracingError(f"{name} writes into {label}, which is differentiated; keep state that the function "
                               f"updates in an argument that is not differentiated (a dict of running averages "
                               f"beside the parameters)")


def traced_program(fn, args, batched):
    """``trace_twice``, its error extended when an argument holds Python lists of numbers."""
    try:
        return trace_twice(fn, args, batched)
    except FrozenValueError:
        raise
    except TracingError as error:
        sequences = [found for name, arg in zip(argument_names(fn, len(args)), args)
                     for found in number_sequences(arg, name, int_lists=True)]
        if not sequences:
            raise
        path, kind = sequences[0]
        raise TracingError(f"{error.message}. Note: {path} is a Python {kind}, whose numbers are traced "
                           f"one by one; to use it as an array, pass np.asarray({path})", error.loc) from None


def aux_checked(fn):
    """``fn``, checked to return a pair ``(loss, aux)`` whose aux holds arrays and numbers."""
    @functools.wraps(fn)
    def checked(*args):
        result = fn(*args)
        if type(result) not in (tuple, list) or len(result) != 2:
            got = (f"a {type(result).__name__} of {len(result)}" if type(result) in (tuple, list)
                   else f"a {type(result).__name__}")
            raise TracingError(f"{fn.__name__} is compiled with has_aux=True, so it must return a pair "
                               f"(loss, aux), but it returned {got}", function_location(fn))
        check_leaves(fn, result[1], "aux")
        return result
    return checked


def check_leaves(fn, tree, root: str):
    """``tree``, refused (naming the leaf's path) unless its leaves are arrays or numbers."""
    leaves, treedef = pytree.flatten(tree)
    for path, leaf in zip(pytree.leaf_paths(treedef, root), leaves):
        if not isinstance(leaf, (Tracer, NotAnArray, np.ndarray, np.generic, bool, int, float)):
            raise TracingError(f"{path} returned by {fn.__name__} is a {type(leaf).__name__}; "
                               f"{root} must hold arrays or numbers", function_location(fn))
    return tree


def function_location(fn) -> SourceLoc | None:
    """Where ``fn`` is defined: the line an error about what it returns points at."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return None
    line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    return SourceLoc(code.co_filename, code.co_firstlineno, code.co_name, line)
