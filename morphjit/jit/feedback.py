"""What a compilation tells its user while and after it happens: stage timings and a status line.

`Timings` records how long each stage of building one step took (trace, vjp, passes, plan,
codegen, module load, then numba's compile or cache load at the first call) and where the machine
code came from. It is kept on the compiled step and shown by ``loss.explain(...)``.

`Status` is the "compiling..." line: a timer thread that shows it only if the compilation is still
running after `STATUS_DELAY` seconds, updates it with the elapsed time, and ends it with how the
step was obtained (compiled, or loaded from the disk cache). It writes to stderr on a terminal or
in a terminal IPython, and to an updating display in a Jupyter notebook. It never writes when
output is not interactive (stderr not a tty and not inside IPython), or when ``MORPHJIT_QUIET``
is set to anything but ``0``/``false``/``no``/``off`` (read at every compilation).
"""
from __future__ import annotations

import contextlib
import html
import sys
import threading
import time

from ..util import config

STATUS_DELAY = 1.0      # seconds a compilation runs before the status line appears
STATUS_PERIOD = 1.0     # seconds between updates of the elapsed time

# How the machine code of a step was obtained at its first call.
COMPILED = "compiled"   # numba compiled it (and stored it on disk if the cache is on)
DISK = "disk"           # loaded from the disk cache
MEMORY = "memory"       # the same program was already compiled in this process (a re-run cell)

ORIGIN_TEXT = {COMPILED: "compiled by numba", DISK: "loaded from the disk cache",
               MEMORY: "reused from memory (same program compiled earlier in this process)"}


class Timings:
    """Seconds per stage, in the order the stages ran, and the origin of the machine code."""

    def __init__(self):
        self.stages: dict[str, float] = {}
        self.origin: str | None = None   # COMPILED, DISK, MEMORY; None until the first call (or interp)
        self.current: str | None = None  # the title of the stage running now

    @contextlib.contextmanager
    def stage(self, name: str, title: str | None = None):
        self.current = title or name
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - start
            self.current = None

    @property
    def total(self) -> float:
        return sum(self.stages.values())

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v * 1e3:.1f}ms" for k, v in self.stages.items())
        return f"Timings({parts}, origin={self.origin})"


class _NoTimings(Timings):
    """Records nothing (the default of the pipeline functions)."""

    @contextlib.contextmanager
    def stage(self, name: str, title: str | None = None):
        yield


NO_TIMINGS = _NoTimings()


# ---------------------------------------------------------------------------------------------
# The status line


def _ipython_shell():
    ipython = sys.modules.get("IPython")  # never import IPython just to look for it
    get = getattr(ipython, "get_ipython", None)
    try:
        return get() if get is not None else None
    except Exception:
        return None


def output_mode() -> str | None:
    """Where a status line goes: ``"display"`` (a Jupyter kernel), ``"stderr"`` (a terminal or a
    terminal IPython), or None (quiet, or output is not interactive)."""
    if config.quiet():
        return None
    shell = _ipython_shell()
    if shell is not None:
        return "display" if getattr(shell, "kernel", None) is not None else "stderr"
    stream = sys.stderr
    try:
        return "stderr" if stream is not None and stream.isatty() else None
    except (AttributeError, ValueError):  # a replaced or closed stream
        return None


class Status:
    """The status line of one compilation; silent unless it runs longer than `STATUS_DELAY`.

    ``start()`` and ``pause()`` bracket each part of the compilation (building the module, then
    numba at the first call), ``finish(origin)`` ends it. Only the parts count towards the delay.
    """

    def __init__(self, name: str, timings: Timings | None = None, mode: str | None = "auto"):
        self.name = name
        self.timings = timings
        self.mode = output_mode() if mode == "auto" else mode
        self.shown = False
        self.finished = False
        self._elapsed = 0.0           # seconds of the parts already paused
        self._started: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._handle = None           # the IPython display handle

    def elapsed(self) -> float:
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self._elapsed + running

    def start(self) -> None:
        if self.mode is None or self.finished or self._started is not None:
            return
        self._started = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="morphjit-status", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        if self._started is None:
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self._elapsed += time.perf_counter() - self._started
        self._started = None

    def finish(self, origin: str | None = None, failed: bool = False) -> None:
        """End the line (if it was shown) with how the step was obtained."""
        self.pause()
        if self.finished:
            return
        self.finished = True
        if not self.shown:
            return
        if failed:
            text = f"morphjit: compiling {self.name!r} failed after {self.elapsed():.1f} s"
        elif origin == DISK:
            text = f"morphjit: loaded {self.name!r} from the disk cache in {self.elapsed():.1f} s"
        elif origin == MEMORY:
            text = f"morphjit: prepared {self.name!r} in {self.elapsed():.1f} s (machine code already in memory)"
        else:
            text = f"morphjit: compiled {self.name!r} in {self.elapsed():.1f} s"
        self._write(text, final=True)

    # -- the watcher thread

    def _watch(self) -> None:
        stop = self._stop
        if not self.shown and stop.wait(max(0.0, STATUS_DELAY - self._elapsed)):
            return
        while True:
            self._write(self._running_text(), final=False)
            if stop.wait(STATUS_PERIOD):
                return

    def _running_text(self) -> str:
        stage = self.timings.current if self.timings is not None else None
        what = f"{stage}, " if stage else ""
        return f"morphjit: compiling {self.name!r} ({what}{self.elapsed():.0f} s) ..."

    def _write(self, text: str, final: bool) -> None:
        with self._lock:
            try:
                if self.mode == "display":
                    self._display(text)
                else:
                    stream = sys.stderr
                    stream.write("\r\x1b[K" + text + ("\n" if final else ""))
                    stream.flush()
                self.shown = True
            except Exception:  # a status line must never break a compilation
                self.mode = None

    def _display(self, text: str) -> None:
        from IPython.display import display, update_display

        bundle = {"text/plain": text, "text/html": f"<code style='opacity:0.75'>{html.escape(text)}</code>"}
        if self._handle is None:
            self._handle = f"morphjit-status-{id(self):x}-{time.monotonic_ns():x}"
            display(bundle, raw=True, display_id=self._handle)
        else:
            update_display(bundle, raw=True, display_id=self._handle)


# ---------------------------------------------------------------------------------------------
# The first call of a native step, where numba compiles or loads the machine code


def _dispatcher_counts(kernel) -> tuple[int, int]:
    stats = kernel.stats
    return sum(stats.cache_hits.values()), sum(stats.cache_misses.values())


def watch_first_call(native, timings: Timings, status: Status | None = None) -> None:
    """Time the first call of ``native`` (a `runtime.NativeStep`) as the ``numba`` stage, record
    whether the dispatcher compiled, loaded from disk or already had the machine code, and end
    ``status``. Later calls go straight to the machine code, as before."""
    first = native.call
    status = status if status is not None else Status("", mode=None)

    def call(*args):
        hits, misses = _dispatcher_counts(native.kernel)
        status.start()
        ok = False
        try:
            with timings.stage("numba"):
                result = first(*args)
            ok = True
            return result
        finally:
            new_hits, new_misses = _dispatcher_counts(native.kernel)
            if timings.origin is None and (ok or new_misses > misses or new_hits > hits):
                timings.origin = (COMPILED if new_misses > misses else DISK if new_hits > hits else MEMORY)
            status.finish(timings.origin, failed=not ok and timings.origin is None)
            if native.call is call:  # the first call failed: later calls start over, untimed
                native.call = first

    native.call = call
