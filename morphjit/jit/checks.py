"""The checks a call runs on its arguments before anything is traced or run, each error naming
the argument by its path (``params['W1']``): how the arguments flatten and which leaves are
differentiated (`arg_spec`), the array subclasses refused, Python lists of numbers, the arrays of
``out=`` and, after a step refused a class label, which argument held it (`label_error`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Program, batch_size, evaluate, is_float
from ..tracing import Tracer, argument_names
from ..util import DtypeError, TracingError, UnsupportedError, pytree, user_location


@dataclass(frozen=True)
class ArgSpec:
    """How a call's arguments flatten, and which leaves are differentiated."""

    treedef: pytree.TreeDef
    argnums: tuple[int, ...]
    wrt: tuple[int, ...]            # indices of differentiated leaves
    params: frozenset = frozenset()  # indices of the leaves that are not data (no batch axis)

    def arg_treedef(self, argnum: int) -> pytree.TreeDef:
        return self.treedef.children[argnum]


def argument_paths(fn, treedef) -> list[str]:
    """Readable paths of the leaves of ``fn``'s argument tuple: ``params['W1']``, ``x``."""
    names = argument_names(fn, len(treedef.children))
    return [p for name, child in zip(names, treedef.children) for p in pytree.leaf_paths(child, name)]


def arg_spec(fn, args, argnums) -> tuple[ArgSpec, list]:
    captured = bool(getattr(fn, "takes_captured", False))   # the last argument: what fn captures (`jit.captured`)
    argnums_t = normalize_argnums(argnums, len(args) - captured)
    leaves, treedef = pytree.flatten(tuple(args), int_lists=True)
    paths = argument_paths(fn, treedef)
    ranges, start = [], 0
    for child in treedef.children:
        ranges.append(range(start, start + child.num_leaves))
        start += child.num_leaves
    names = argument_names(fn, len(args))
    for i in argnums_t:
        sequences = number_sequences(args[i], names[i])
        if sequences:
            path, kind = sequences[0]
            raise DtypeError(f"{path} is differentiated but is a Python {kind} of numbers; differentiated "
                             f"arguments must hold float32 or float64 NumPy arrays: pass np.asarray({path})")
    wrt = tuple(j for i in argnums_t for j in ranges[i])
    for leaf, path in zip(leaves, paths):
        check_untraced(leaf, path)
        check_plain(leaf, path)
    for j in wrt:
        check_differentiable(leaves[j], paths[j])
    # The first of several arguments holds the parameters: no batch axis even when not differentiated;
    # nor have captured arrays
    params = frozenset(wrt) | frozenset(ranges[0] if len(args) - captured > 1 else ())
    params |= frozenset(ranges[-1] if captured else ())
    return ArgSpec(treedef, argnums_t, wrt, params), leaves


def floats_as_arrays(args: tuple, argnums) -> tuple:
    """``args`` with the Python floats among the differentiated arguments as float64 0-d arrays
    (``grad(f)(1.0)``, as JAX and autograd take it)."""
    n = len(args)
    nums = [i for i in (argnums if isinstance(argnums, (tuple, list)) else (argnums,))
            if type(i) is int and -n <= i < n]     # argnums that do not fit are refused later
    if not any(type(args[i]) is float for i in nums):
        return args
    chosen = {i % n for i in nums}
    return tuple(np.asarray(a) if i in chosen and type(a) is float else a for i, a in enumerate(args))


def normalize_argnums(argnums, nargs: int) -> tuple[int, ...]:
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    for n in nums:
        if not isinstance(n, int) or isinstance(n, bool) or not -nargs <= n < nargs:
            raise TracingError(f"argnums={argnums!r} does not fit a call with {nargs} positional "
                               f"argument{'s' if nargs != 1 else ''}")
    return tuple(n % nargs for n in nums)


# ndarray subclasses that hold plain data, taken as arrays. Any other subclass is refused: the
# compiled step would see its data only (a masked array's mask, np.matrix's `*`, units).
PLAIN_SUBCLASSES = (np.memmap,)


def is_plain_array(x) -> bool:
    return type(x) is np.ndarray or isinstance(x, PLAIN_SUBCLASSES)


def check_plain(leaf, path: str) -> None:
    """Refuse an ndarray subclass whose meaning the step would lose, saying what to pass instead."""
    if not isinstance(leaf, np.ndarray) or is_plain_array(leaf):
        return
    kind = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
    if isinstance(leaf, np.ma.MaskedArray):
        hint = (f"its mask would be ignored; pass {path}.filled(value), or np.asarray({path}) and "
                f"the mask as a data argument (mj.where(mask, ..., 0.0))")
    elif isinstance(leaf, np.matrix):
        hint = f"`*` and `**` would not mean what they mean for a matrix; pass np.asarray({path})"
    else:
        hint = f"only its data would be used; pass np.asarray({path}) if that is what you mean"
    raise DtypeError(f"{path} is a {kind}: {hint}")


def check_untraced(leaf, path: str) -> None:
    """Refuse a traced value where a step is compiled or run: one kept past its trace, or one of a
    function being traced handed to what compiles (``explain``, ``program``, ``source``)."""
    if not isinstance(leaf, Tracer):
        return
    if leaf.trace.closed:
        raise UnsupportedError(f"{path} is a traced value of a function morphjit traced earlier, kept past its "
                               f"trace (in a global, an attribute or a closure): pass arrays, not traced values "
                               f"(return them from the function, or through has_aux)", user_location())
    raise UnsupportedError(f"{path} is a value of a function morphjit is tracing: explain, program, source and "
                           f"step_for compile a step of their own, so they cannot be called inside a traced "
                           f"function (mj.grad, compile_loss, mj.hvp and mj.compile can: they trace into it); "
                           f"call them outside, on arrays", user_location())


def check_differentiable(leaf, path: str) -> None:
    if not isinstance(leaf, (np.ndarray, np.generic)):
        raise DtypeError(f"{path} is differentiated but is a {type(leaf).__name__}; differentiated "
                         f"arguments must hold float32 or float64 NumPy arrays")
    if not is_float(leaf.dtype):
        raise DtypeError(f"{path} is differentiated but is a {leaf.dtype} array; only float32 and "
                         f"float64 arrays have gradients (pass labels and masks as data arguments, "
                         f"or choose the differentiated arguments with argnums)")


def number_sequences(tree, path: str, int_lists: bool = False) -> list[tuple[str, str]]:
    """The paths (and kinds) of the lists and tuples in ``tree`` that hold only numbers, nested
    or not: arrays written as Python sequences, whose numbers would be leaves of their own (with
    ``int_lists``, not the flat lists of ints, which are one leaf in a call's arguments)."""
    if int_lists and pytree.is_int_list(tree):
        return []
    if type(tree) in (list, tuple) and is_numbers(tree):
        return [(path, type(tree).__name__)]
    if type(tree) is dict:
        return [found for k in sorted(tree) for found in number_sequences(tree[k], f"{path}[{k!r}]", int_lists)]
    if type(tree) in (list, tuple):
        return [found for k, child in enumerate(tree) for found in number_sequences(child, f"{path}[{k}]", int_lists)]
    return []


def is_numbers(x) -> bool:
    if type(x) in (list, tuple):
        return len(x) > 0 and all(map(is_numbers, x))
    return isinstance(x, (int, float, np.number)) and not isinstance(x, bool)


def out_arrays(step, out, single: bool, leaves, leaf_paths) -> list:
    """The arrays of an ``out=`` tree for ``step``, checked against the gradients they will receive and
    against the call's arguments (``leaves``, named by ``leaf_paths``) and each other: an
    array written while arguments or other gradients are still being read must not share
    memory with them."""
    arrays, treedef = pytree.flatten(out)
    children = tuple(step.spec.arg_treedef(i) for i in step.spec.argnums)
    expected = children[0] if single else pytree.TreeDef(tuple, (), children)
    if treedef != expected:
        raise TracingError(f"out= must have the structure of the gradients, {expected}; got {treedef}")
    paths = pytree.leaf_paths(treedef, "out")
    for k, (path, array, v) in enumerate(zip(paths, arrays, step.program.outputs[1:])):
        if not (is_plain_array(array) and array.shape == v.shape and array.dtype == v.dtype
                and array.flags.c_contiguous and array.flags.writeable):
            got = (f"a {type(array).__name__} of {array.dtype} and shape {array.shape}"
                   if isinstance(array, np.ndarray) else f"a {type(array).__name__}")
            raise DtypeError(f"{path} must be a writeable C-contiguous {v.dtype} array of shape {v.shape} "
                             f"(a NumPy ndarray, not a subclass), got {got}")
        argument = sharing_memory(array, leaf_paths, leaves)
        if argument is not None:
            raise TracingError(f"{path} shares memory with {argument}, an argument of the call; "
                               f"gradients cannot overwrite inputs (pass an array of its own)")
        other = sharing_memory(array, paths[:k], arrays[:k])
        if other is not None:
            raise TracingError(f"{path} shares memory with {other}; each gradient needs an array of its own")
    return arrays


def sharing_memory(x: np.ndarray, paths, arrays) -> str | None:
    """The path of the first of ``arrays`` whose elements share memory with ``x``, if any."""
    return next((path for path, a in zip(paths, arrays)
                 if isinstance(a, np.ndarray) and np.may_share_memory(x, a) and np.shares_memory(x, a)), None)


def label_error(program: Program, paths, leaves) -> ValueError | None:
    """The error for the first argument that ``program`` reads as class labels (of ``one_hot``
    or ``softmax_cross_entropy``) and that holds a label outside ``[0, classes)``: its path, the
    first offending value and its index. ``leaves`` (named by ``paths``) are the program's
    first inputs."""
    inputs = program.inputs[:len(leaves)]
    position = {id(v): k for k, v in enumerate(inputs)}
    for b in program.bindings:
        if b.op == "one_hot":
            labels, classes = b.inputs[0], b.kwargs["depth"]
        elif b.op == "softmax_cross_entropy" and b.inputs[1].dtype.kind in "iu":
            labels, classes = b.inputs[1], evaluate(b.inputs[0].shape[-1], batch_size(inputs, leaves))
        else:
            continue
        k = position.get(id(labels))
        values = np.asarray(leaves[k]) if k is not None else None
        outside = None if values is None else np.flatnonzero((values < 0) | (values >= classes))
        if outside is not None and outside.size:
            index = "".join(f"[{i}]" for i in np.unravel_index(outside[0], values.shape))
            return ValueError(f"{paths[k]}{index} is {values.flat[outside[0]]}, but class labels must lie "
                              f"in [0, {classes}) ({outside.size} of the {values.size} labels are outside)")
    return None
