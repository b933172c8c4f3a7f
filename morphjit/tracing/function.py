"""Tracing a function: its arguments become tracers, it runs on them (once per path through its
tests of traced values, `branches`), and the bindings it recorded become the forward program;
what it wrote into its arguments' dicts and lists (`state`) becomes its last outputs."""
from __future__ import annotations

from ..ir import Program
from ..util import TracingError, pytree, user_location
from .branches import branched
from .state import Built, StateWrites, check_no_escape
from .tracer import Trace, argument_names, input_tracer, output_var, readable_path, recorded


def trace(fn, *args) -> Program:
    """Run ``fn`` on tracers standing for ``args`` and return the forward program.

    Every array leaf of the arguments is a program input; the program's outputs are the leaves
    of what ``fn`` returns.
    """
    program, _, _ = trace_with_tree(fn, args)
    return program


def trace_with_tree(fn, args, batched=frozenset()):
    """``trace`` that also returns the output tree structure and the `StateWrites` (the
    program's outputs after the tree's leaves are the values they store). The leading extent of
    the leaves whose indices are in ``batched`` is the symbolic batch size."""
    leaves, treedef = pytree.flatten(tuple(args), int_lists=True)
    paths = pytree.leaf_paths(treedef, "")
    names = argument_names(fn, len(args))
    t = Trace()
    tracers = [input_tracer(t, leaf, readable_path(p, names), k in batched)
               for k, (leaf, p) in enumerate(zip(leaves, paths))]
    inputs = tuple(x.operand for x in tracers)
    t.paths.update((id(x), readable_path(p, names)) for x, p in zip(inputs, paths))

    writes = []   # of each path

    def call_on(arguments):
        for x in arguments:
            if hasattr(x, "rewind"):   # a random generator: each path draws from its start
                x.rewind()
        built = Built(treedef, arguments)
        result = fn(*built.tree)
        changed, stored = built.changes()
        if writes and changed != writes[0]:
            raise TracingError("the paths through the function's tests of traced values write different "
                               "entries of its arguments' dicts and lists; write the same entries on every path",
                               user_location())
        writes.append(changed)
        return pytree.flatten((result, tuple(stored)))
    try:
        out_leaves, out_tree = recorded(t, bool(batched), lambda: branched(t, call_on, tracers))
        outputs = tuple(output_var(t, x) for x in out_leaves)
        check_no_escape(fn, t)
    finally:
        t.closed = True
    program = Program(inputs, tuple(t.bindings), outputs, tuple(t.consts),
                      getattr(fn, "__name__", "program"))
    result_tree, stored_tree = out_tree.children
    labels = tuple(readable_path(w.label(), names) for w in writes[0])
    return program, result_tree, StateWrites(tuple(writes[0]), stored_tree.num_leaves, labels)
