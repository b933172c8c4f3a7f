"""Library functions replaced while traces run.

Some functions never reach a traced array's dispatch: ``np.arange(n)`` of a symbolic batch size
(an integer-like, not an array), and SciPy's distributions, which turn their arguments into NumPy
arrays before computing. While a trace runs, such an attribute is replaced, in every thread and
until the last such trace ends, by a substitute that handles traced arguments and passes every
other call on to the original (which the module defining the substitute keeps).
"""
from __future__ import annotations

import contextlib
import threading


class Substitutes:
    """Attributes replaced while at least one trace of some kind runs."""

    def __init__(self):
        self._wanted: dict[tuple[object, str], object] = {}
        self._own: dict[tuple[object, str], object] = {}
        self._running = 0
        self._lock = threading.Lock()

    def register(self, owner, name: str, substitute) -> None:
        """While active, ``owner.name`` is ``substitute`` (a module's function or a class's method)."""
        self._wanted[(owner, name)] = substitute

    @contextlib.contextmanager
    def active(self):
        self._count(+1)
        try:
            yield
        finally:
            self._count(-1)

    def _count(self, change: int) -> None:
        with self._lock:
            self._running += change
            if change > 0 and self._running == 1:
                for (owner, name), substitute in self._wanted.items():
                    self._own[(owner, name)] = vars(owner)[name]
                    setattr(owner, name, substitute)
            elif self._running == 0:
                for (owner, name), original in self._own.items():
                    setattr(owner, name, original)
                self._own.clear()


SYMBOLIC_EXTENT = Substitutes()   # while a trace with a symbolic batch size runs
ANY_TRACE = Substitutes()         # while any trace runs
