"""Random generators a function draws from without taking them as arguments: a NumPy ``Generator``
or ``RandomState`` in its closure or among the globals it names, and NumPy's global generator
(``np.random.randn(...)``, ``np.random.normal(...)``).

Each is an argument the compiled function adds to every call, after the user's (``captured``, a
dict by name, ``'np.random'`` for the global one): the call takes a seed from the generator as it
is then (advancing it), as for a generator argument, and the step draws from that seed, so the
draws are new on every call and reproducible from the generator's seed. While traced, the function
runs as a copy of itself whose closure and globals hold the traced generators in their place, and
the global draws of ``np.random`` go to the traced global one (``morphjit.api.random``).
"""
from __future__ import annotations

import dis
import inspect
import types

import numpy as np

from ..api import GLOBAL_DRAWS
from ..native import GENERATORS
from ..tracing import tracer

GLOBAL = "np.random"
RESEEDING = frozenset({"seed", "set_state"})   # a function that seeds NumPy's generator draws the same each call



class CapturedGenerators:
    """The generators ``fn`` reaches from its closure and globals, and the function taking them."""

    def __init__(self, fn, cells: dict, global_names: tuple[str, ...], draws_globally: bool):
        self.fn, self.cells, self.global_names, self.draws_globally = fn, cells, global_names, draws_globally
        self.function = self._taking_them()

    @classmethod
    def of(cls, fn) -> CapturedGenerators | None:
        """The generators ``fn`` captures, or None when it captures none."""
        code = getattr(fn, "__code__", None)
        if code is None or not hasattr(fn, "__globals__"):
            return None
        cells = {name: cell for name, cell in zip(code.co_freevars, fn.__closure__ or ())
                 if isinstance(_contents(cell), GENERATORS)}
        loaded, draws_globally = _globals_and_global_draws(code, fn.__globals__)
        global_names = tuple(sorted(n for n in loaded if isinstance(fn.__globals__.get(n), GENERATORS)))
        if not (cells or global_names or draws_globally):
            return None
        return cls(fn, cells, global_names, draws_globally)

    def arguments(self, args, kwargs) -> tuple:
        """The call's arguments bound to ``fn``'s positional parameters, then the generators."""
        if kwargs:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args
        return tuple(args) + (self.current(),)

    def current(self) -> dict:
        """The generators as the function would draw from them now."""
        found = {name: cell.cell_contents for name, cell in self.cells.items()}
        found.update((name, self.fn.__globals__[name]) for name in self.global_names)
        if self.draws_globally:
            found[GLOBAL] = np.random.mtrand._rand
        return found

    def _taking_them(self):
        fn = self.fn

        def with_generators(*args):
            *user, captured = args
            t = tracer.current_trace()
            if t is None:
                return fn(*user)
            previous = t.global_generator
            t.global_generator = captured.get(GLOBAL)
            try:
                return self._rebuilt(captured)(*user)
            finally:
                t.global_generator = previous
        with_generators.__name__, with_generators.__qualname__ = fn.__name__, fn.__qualname__
        with_generators.__module__, with_generators.__doc__ = fn.__module__, fn.__doc__
        with_generators.__wrapped__ = fn   # errors about the function point at its definition
        parameters = [p.replace(default=p.empty) for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        with_generators.__signature__ = inspect.Signature(
            parameters + [inspect.Parameter("captured", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
        return with_generators

    def _rebuilt(self, captured: dict):
        """``fn`` with the traced generators in its closure and (in a copy of) its globals."""
        fn = self.fn
        closure = tuple(types.CellType(captured[name]) if name in self.cells else cell
                        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        namespace = dict(fn.__globals__)
        namespace.update((name, captured[name]) for name in self.global_names)
        copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, closure or None)
        copy.__kwdefaults__ = fn.__kwdefaults__
        return copy


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
