"""Tracing a function: its arguments become tracers, it runs on them (once per path through its
tests of traced values, `branches`), and the bindings it recorded become the forward program."""
from __future__ import annotations

from ..ir import Program
from ..util import pytree
from .branches import branched
from .tracer import Trace, argument_names, input_tracer, output_var, readable_path, recorded


def trace(fn, *args) -> Program:
    """Run ``fn`` on tracers standing for ``args`` and return the forward program.

    Every array leaf of the arguments is a program input; the program's outputs are the leaves
    of what ``fn`` returns.
    """
    program, _ = trace_with_tree(fn, args)
    return program


def trace_with_tree(fn, args, batched=frozenset()):
    """``trace`` that also returns the output tree structure. The leading extent of the leaves
    whose indices are in ``batched`` is the symbolic batch size."""
    leaves, treedef = pytree.flatten(tuple(args), int_lists=True)
    paths = pytree.leaf_paths(treedef, "")
    names = argument_names(fn, len(args))
    t = Trace()
    tracers = [input_tracer(t, leaf, readable_path(p, names), k in batched)
               for k, (leaf, p) in enumerate(zip(leaves, paths))]
    inputs = tuple(x.operand for x in tracers)
    t.paths.update((id(x), readable_path(p, names)) for x, p in zip(inputs, paths))

    def call_on(arguments):
        for x in arguments:
            if hasattr(x, "rewind"):   # a random generator: each path draws from its start
                x.rewind()
        return pytree.flatten(fn(*pytree.unflatten(treedef, arguments)))
    try:
        out_leaves, out_tree = recorded(t, bool(batched), lambda: branched(t, call_on, tracers))
        outputs = tuple(output_var(t, x) for x in out_leaves)
    finally:
        t.closed = True
    program = Program(inputs, tuple(t.bindings), outputs, tuple(t.consts),
                      getattr(fn, "__name__", "program"))
    return program, out_tree
