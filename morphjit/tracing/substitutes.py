"""Library functions replaced while traces run.

Some functions never reach a traced array's dispatch: ``np.arange(n)`` of a symbolic batch size
(an integer-like, not an array), and SciPy's distributions, which turn their arguments into NumPy
arrays before computing. While a trace runs, such an attribute is replaced, in every thread and
until the last such trace ends, by a substitute that handles traced arguments and passes every
other call on to the original (which the module defining the substitute keeps). A trace enters
and leaves them as sections of `interrupts.guarded`, which Ctrl-C does not cut in half.

A module whose substitutes serve a library the user may never import (``morphjit.stats`` for
``scipy.stats``) is loaded by the first trace that starts once that library is imported.
"""
from __future__ import annotations

import importlib
import sys
import threading


class Substitutes:
    """Attributes replaced while at least one trace of some kind runs."""

    def __init__(self):
        self._wanted: dict[tuple[object, str], object] = {}
        self._own: dict[tuple[object, str], object] = {}
        self._providers: dict[str, str] = {}
        self._running = 0
        self._lock = threading.Lock()

    def register(self, owner, name: str, substitute) -> None:
        """While active, ``owner.name`` is ``substitute`` (a module's function or a class's method)."""
        self._wanted[(owner, name)] = substitute

    def provided_by(self, library: str, module: str) -> None:
        """Once ``library`` is imported, the next trace to start imports ``module``, which registers
        the substitutes for it."""
        self._providers[library] = module

    def pending(self, library: str) -> bool:
        """Whether ``library`` has substitutes that no trace has loaded yet."""
        return library in self._providers

    def attributes(self) -> list[tuple[object, str]]:
        """The ``(owner, name)`` of each attribute replaced while active."""
        return list(self._wanted)

    def enter(self) -> None:
        """Count a trace in: at the first, the substitutes replace what they stand for (and those of
        a provider loaded since, at a later one). A section of `interrupts.guarded`."""
        with self._lock:
            self._running += 1
            try:
                self._load_providers()
                self._install_missing()
            except BaseException:
                self._count_out()
                raise

    def leave(self) -> None:
        """Count a trace out: at the last, put back what the substitutes replaced."""
        with self._lock:
            self._count_out()

    def _load_providers(self) -> None:
        for library in [name for name in self._providers if name in sys.modules]:
            importlib.import_module(self._providers[library])
            del self._providers[library]

    def _install_missing(self) -> None:
        for (owner, name), substitute in self._wanted.items():
            if (owner, name) not in self._own:
                self._own[(owner, name)] = vars(owner)[name]
                setattr(owner, name, substitute)

    def _count_out(self) -> None:
        self._running -= 1
        if self._running == 0:
            for (owner, name), original in self._own.items():
                setattr(owner, name, original)
            self._own.clear()


SYMBOLIC_EXTENT = Substitutes()   # while a trace with a symbolic batch size runs
ANY_TRACE = Substitutes()         # while any trace runs
