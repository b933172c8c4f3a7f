"""What a function reaches without taking it as an argument: random generators and NumPy arrays in
its closure or among the globals it loads, and NumPy's global generator (``np.random.randn(...)``).

Generators (a ``Generator`` or ``RandomState``; ``'np.random'`` for the global one) are an argument
the compiled function adds to every call, after the user's (``captured``, a dict by name): the call
takes a seed from each as it is then (advancing it), as for a generator argument, and the step
draws from that seed, so the draws are new on every call and reproducible from the generator's
seed. Arrays are buffers of the trace that NumPy computes with until traced values meet them, as a
buffer the function makes is (``Tracer.buffer``), so that traced keys index them (``X[i * n:(i +
1) * n]``); a write into one is refused. While traced, the function runs as a copy of itself whose
closure and globals hold these in place of the originals, and the global draws of ``np.random``
go to the traced global generator (``morphjit.api.random``).
"""
from __future__ import annotations

import dis
import inspect
import types

import numpy as np

from ..api import GLOBAL_DRAWS
from ..native import GENERATORS
from ..tracing import SUPPORTED_DTYPES, Tracer, tracer

GLOBAL = "np.random"
RESEEDING = frozenset({"seed", "set_state"})   # a function that seeds NumPy's generator draws the same each call


class Captured:
    """The generators and arrays ``fn`` reaches from its closure and globals, and the function
    traced in its place (taking the generators as a last argument, if any)."""

    def __init__(self, fn, cells: dict, global_names: tuple[str, ...], draws_globally: bool):
        self.fn, self.cells, self.global_names, self.draws_globally = fn, cells, global_names, draws_globally
        self.generators = tuple(name for name, value in self._values().items() if isinstance(value, GENERATORS))
        self.takes_generators = bool(self.generators) or draws_globally
        self.function = self._traced_in_place()

    @classmethod
    def of(cls, fn) -> Captured | None:
        """What ``fn`` captures, or None when it captures neither generators nor arrays."""
        code = getattr(fn, "__code__", None)
        if code is None or not hasattr(fn, "__globals__"):
            return None
        cells = {name: cell for name, cell in zip(code.co_freevars, fn.__closure__ or ())
                 if _captures(_contents(cell))}
        loaded, draws_globally = _globals_and_global_draws(code, fn.__globals__)
        global_names = tuple(sorted(n for n in loaded if _captures(fn.__globals__.get(n))))
        if not (cells or global_names or draws_globally):
            return None
        return cls(fn, cells, global_names, draws_globally)

    def arguments(self, args, kwargs) -> tuple[tuple, dict]:
        """The call's arguments, with the generators after the user's (bound to ``fn``'s positional
        parameters) where the function takes them."""
        if not self.takes_generators:
            return args, kwargs
        if kwargs:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args
        return tuple(args) + (self.current(),), {}

    def current(self) -> dict:
        """The generators as the function would draw from them now."""
        values = self._values()
        found = {name: values[name] for name in self.generators}
        if self.draws_globally:
            found[GLOBAL] = np.random.mtrand._rand
        return found

    def _values(self) -> dict:
        found = {name: cell.cell_contents for name, cell in self.cells.items()}
        found.update((name, self.fn.__globals__[name]) for name in self.global_names)
        return found

    def _traced_in_place(self):
        fn, takes_generators = self.fn, self.takes_generators

        def traced(*args):
            t = tracer.current_trace()
            user, generators = (args[:-1], args[-1]) if takes_generators else (args, {})
            if t is None:
                return fn(*user)
            previous = t.global_generator
            t.global_generator = generators.get(GLOBAL)
            try:
                return self._rebuilt(t, generators)(*user)
            finally:
                t.global_generator = previous
        traced.__name__, traced.__qualname__ = fn.__name__, fn.__qualname__
        traced.__module__, traced.__doc__ = fn.__module__, fn.__doc__
        traced.__wrapped__ = fn   # errors about the function point at its definition
        parameters = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if takes_generators:   # no defaults: the generators come last (`arguments` fills the defaults in)
            parameters = [p.replace(default=p.empty) for p in parameters] + [
                inspect.Parameter("captured", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        traced.__signature__ = inspect.Signature(parameters)
        return traced

    def _rebuilt(self, t, generators: dict):
        """``fn`` with the traced generators and the arrays as buffers of ``t`` in its closure and
        (in a copy of) its globals."""
        fn, values = self.fn, self._values()
        replaced = {name: generators[name] if name in generators else captured_buffer(t, name, values[name])
                    for name in values if name in generators or isinstance(values[name], np.ndarray)}
        closure = tuple(types.CellType(replaced[name]) if name in replaced and name in self.cells else cell
                        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        namespace = dict(fn.__globals__)
        namespace.update((name, replaced[name]) for name in self.global_names if name in replaced)
        copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, closure or None)
        copy.__kwdefaults__ = fn.__kwdefaults__
        return copy


def captured_buffer(t, name: str, array: np.ndarray) -> Tracer:
    """A captured array as a buffer of the trace: NumPy's until traced values meet it; not writable."""
    return Tracer.buffer(t, array, origin=f"the array {name}, which the function captures")


def _captures(value) -> bool:
    return isinstance(value, GENERATORS) or (
        type(value) is np.ndarray and value.ndim >= 1 and value.dtype in SUPPORTED_DTYPES)


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
