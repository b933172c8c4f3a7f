"""Python asking a traced value for its value (``bool()``, ``int()``, a shape NumPy needs): the
error, naming the arguments the value is computed from and how to compile for each of their values.
"""
from __future__ import annotations

from ..ir import Var
from ..util import TracingError, user_location


def concrete_value_error(what: str, hint: str, x=None) -> TracingError:
    """The error of Python asking the traced ``x`` for its value."""
    return TracingError(f"{what} needs a concrete value, but this array is traced: its value is only "
                        f"known when the compiled step runs; {hint}{static_hint([x])}", user_location())


def static_hint(values) -> str:
    """How to compile a step for each value of the few arguments the tracers ``values`` (None
    among them ignored) are computed from ("" where there are none or many)."""
    arguments = sorted(set().union(*(argument_sources(x) for x in values if x is not None)))
    if not arguments or len(arguments) > 3:
        return ""
    static = repr(arguments[0]) if len(arguments) == 1 else repr(tuple(arguments))
    how = (f"mark {'it' if len(arguments) == 1 else 'them'} static (static_argnames={static})"
           if all(a.isidentifier() for a in arguments)
           else "pass it as an argument of its own, marked static (static_argnames=...)")
    return (f"; or, as it is computed from the argument{'s' * (len(arguments) > 1)} {', '.join(arguments)}, "
            f"{how} to compile a step for each value")


def argument_sources(x, limit: int = 256) -> set[str]:
    """The paths of the arguments the traced ``x`` is computed from (looking at ``limit`` values)."""
    t, found, seen, todo = x.trace, set(), set(), [x.operand]
    while todo and len(seen) < limit:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if t.paths.get(id(v)):
            found.add(t.paths[id(v)])
        elif id(v) in t.producers:
            todo.extend(i for i in t.producers[id(v)].inputs if isinstance(i, Var))
    return found
