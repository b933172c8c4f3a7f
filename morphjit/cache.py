"""On-disk cache of generated step modules and of their numba machine code.

`load_module` turns the source text rendered by codegen into a module. With caching on, the text is
stored as ``<cache dir>/mj_<hint>_<hash>.py`` (the hash covers the text and the versions of morphjit,
numba, numpy, llvmlite and Python), executed under a module name (registered in ``sys.modules``
only while it runs and while its dispatchers compile, so that it is released with them), and every
numba dispatcher it defines keeps its machine code beside it in ``__pycache__``. A fresh process
that renders the same text loads that machine code instead of compiling.

Loading an entry unpickles numba's files, which can run code, so the directory must belong to the
current user and be writable by nobody else; otherwise the cache is bypassed with a warning. Only
``source`` itself is ever executed, never the copy on disk.

Environment: ``MORPHJIT_CACHE_DIR`` (else ``$XDG_CACHE_HOME/morphjit``, else ``~/.cache/morphjit``)
and ``MORPHJIT_CACHE=0`` to compile in memory only. Both are read at every call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib.metadata
import linecache
import os
import re
import sys
import tempfile
import threading
import types
import warnings
import weakref
from pathlib import Path

import llvmlite
import numba
import numpy
from numba.core.caching import CompileResultCacheImpl, FunctionCache, InTreeCacheLocator
from numba.core.compiler_lock import global_compiler_lock
from numba.core.dispatcher import Dispatcher

_PREFIX = "mj_"
_TEMP_PREFIX = ".tmp-"
_OFF_VALUES = {"0", "false", "no", "off"}


class CacheWarning(UserWarning):
    """The disk cache was bypassed, or a damaged entry was rebuilt."""


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One cached program: its module name and its bytes on disk (source plus machine code)."""

    name: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What `cache_info` found in the cache directory."""

    directory: Path
    entries: int
    total_bytes: int
    per_entry: tuple[CacheEntry, ...]


# ---------------------------------------------------------------- public API


def load_module(source: str, *, name_hint: str = "step", cache: bool = True) -> types.ModuleType:
    """Execute generated `source` as a module; with `cache`, reuse machine code stored on disk.

    The source's ``@numba.njit`` decorators must be lazy (no explicit signature) for their machine
    code to be cached; `loaded_from_disk` tells, after a call, whether a dispatcher compiled. The
    same source loaded again is executed again (its machine code then comes from the disk). Falls
    back to an in-memory module (with a `CacheWarning`) when the cache directory cannot be written
    or is not private to the current user.
    """
    name = _module_name(source, name_hint)
    if not (cache and _caching_enabled_by_env()):
        return _module_in_memory(source, name)
    directory = cache_dir()
    try:
        return _load_cached(source, name, directory)
    except _NotPrivate as refusal:
        _warn_once(("not private", str(refusal)),
                   f"not using the morphjit cache: {refusal}; compiling in memory")
    except OSError as exc:
        _warn_once(("unwritable", directory),
                   f"cannot use the morphjit cache {directory} ({exc}); compiling in memory")
    return _module_in_memory(source, name)


def loaded_from_disk(dispatcher: Dispatcher) -> bool:
    """True if every signature `dispatcher` has compiled so far came from the disk cache.

    False before the first call, and for a dispatcher that compiled anything itself (numba counts a
    miss for each compilation, cached or not).
    """
    stats = dispatcher.stats
    return bool(stats.cache_hits) and not stats.cache_misses


def cache_dir() -> Path:
    """The cache directory named by the environment right now."""
    explicit = os.environ.get("MORPHJIT_CACHE_DIR")
    if explicit:
        return Path(os.path.abspath(os.path.expanduser(explicit)))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.path.abspath(base), "morphjit")


def cache_info() -> CacheInfo:
    """Count the cached programs and their bytes, numba's files included."""
    directory = cache_dir()
    per_entry = tuple(CacheEntry(name, _total_size(_entry_files(directory, name)))
                      for name in _entry_names(directory))
    return CacheInfo(directory, len(per_entry), sum(e.bytes for e in per_entry), per_entry)


def clear_cache() -> int:
    """Delete every cached program (and leftover temporary files); return how many were deleted.

    Modules already loaded in this process keep working.
    """
    directory = cache_dir()
    names = _entry_names(directory)
    for name in names:
        lock = _entry_lock(directory, name)
        with lock:
            _remove_files([*_entry_files(directory, name), lock.path])
    _remove_files(directory.glob(_TEMP_PREFIX + "*"))
    return len(names)


# ---------------------------------------------------------------- naming and environment


def _module_name(source: str, name_hint: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_]{1,40}", name_hint):
        raise ValueError(f"name_hint must be 1-40 letters, digits or underscores, got {name_hint!r}")
    digest = hashlib.sha256(f"{_versions()}\0{source}".encode()).hexdigest()
    return f"{_PREFIX}{name_hint}_{digest[:16]}"


@functools.cache
def _versions() -> str:
    try:
        morphjit_version = importlib.metadata.version("morphjit")
    except importlib.metadata.PackageNotFoundError:
        morphjit_version = "uninstalled"
    return (f"morphjit={morphjit_version} numba={numba.__version__} numpy={numpy.__version__} "
            f"llvmlite={llvmlite.__version__} python={sys.version}")


def _caching_enabled_by_env() -> bool:
    return os.environ.get("MORPHJIT_CACHE", "1").strip().lower() not in _OFF_VALUES


# ---------------------------------------------------------------- loading


def _module_in_memory(source: str, name: str) -> types.ModuleType:
    filename = f"<morphjit {name}>"
    # Lets tracebacks and numba's error messages quote the generated lines, while the module lives.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    weakref.finalize(module, linecache.cache.pop, filename, None)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _load_cached(source: str, name: str, directory: Path) -> types.ModuleType:
    path = directory / f"{name}.py"
    _make_private_dir(directory)
    _require_private(directory, follow_symlinks=True)
    lock = _entry_lock(directory, name)
    with lock:
        loaded = sys.modules.get(name)
        if getattr(loaded, "__file__", None) == str(path):
            return loaded
        _make_private_dir(directory / "__pycache__")
        for entry_path in [directory / "__pycache__", *_entry_files(directory, name)]:
            _require_private(entry_path, follow_symlinks=False)
        _store_source(path, source)
        return _execute_registered(source, name, path, lock)


def _store_source(path: Path, source: str) -> None:
    """Write `source` to `path` unless an identical copy is there; a differing copy is damaged."""
    data = source.encode()
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    else:
        warnings.warn(f"morphjit cache entry {path} is damaged (its text differs from the program); "
                      "rebuilding it", CacheWarning, stacklevel=4)
        _remove_files(_entry_files(path.parent, path.stem))
    _write_atomically(path, data)


def _execute_registered(source: str, name: str, path: Path, lock: _EntryLock) -> types.ModuleType:
    """Run `source` as module `name` backed by `path`, with disk caching on for its dispatchers.

    Numba, compiling or loading machine code, looks the module up by name (to rebuild the
    function's globals), so the module is in ``sys.modules`` while it runs and while one of its
    dispatchers compiles, and only then: nothing keeps a module alive that its user dropped.
    """
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
        for dispatcher in _dispatchers_defined_in(module):
            _registered_while_compiling(dispatcher, module)
            _enable_disk_caching(dispatcher, lock)
    finally:
        del sys.modules[name]
    return module


def _registered_while_compiling(dispatcher: Dispatcher, module: types.ModuleType) -> None:
    """Register ``module`` in ``sys.modules`` while ``dispatcher`` compiles (under numba's compiler
    lock, so that no other thread's compilation unregisters it meanwhile)."""
    compile_unregistered = dispatcher.compile

    @functools.wraps(compile_unregistered)
    def compile_registered(sig):
        with global_compiler_lock:
            if sys.modules.get(module.__name__) is module:   # a compilation nested in another
                return compile_unregistered(sig)
            sys.modules[module.__name__] = module
            try:
                return compile_unregistered(sig)
            finally:
                del sys.modules[module.__name__]

    dispatcher.compile = compile_registered


def _dispatchers_defined_in(module: types.ModuleType) -> list[Dispatcher]:
    return [value for value in vars(module).values()
            if isinstance(value, Dispatcher) and value.py_func.__globals__ is vars(module)]


def _enable_disk_caching(dispatcher: Dispatcher, lock: _EntryLock) -> None:
    """Give `dispatcher` a disk cache and serialise its compilations with other processes.

    This is what ``njit(cache=True)`` does (``Dispatcher.enable_caching``), with a cache that
    survives damaged files; it must happen before the first compilation, which is why the
    generated decorators must be lazy (no explicit signatures).
    """
    if dispatcher.overloads:
        warnings.warn(f"{dispatcher.__name__} was compiled while its module ran (explicit "
                      "signature?), so it cannot be cached on disk", CacheWarning, stacklevel=5)
        return
    try:
        dispatcher._cache = _SelfHealingCache(dispatcher.py_func)
    except RuntimeError as exc:  # numba raises this when __pycache__ is not writable
        raise OSError(str(exc)) from exc
    compile_unlocked = dispatcher.compile

    @functools.wraps(compile_unlocked)
    def compile_locked(sig):
        # Held across load, compile and save: a concurrent process waits, then loads our result.
        with lock:
            return compile_unlocked(sig)

    dispatcher.compile = compile_locked


class _InTreeCacheImpl(CompileResultCacheImpl):
    # Only beside the module, so the machine code stays in the private, checked directory even when
    # NUMBA_CACHE_DIR is set.
    _locator_classes = [InTreeCacheLocator]


class _SelfHealingCache(FunctionCache):
    """numba's per-function disk cache, where unreadable files count as a miss and are removed."""

    _impl_class = _InTreeCacheImpl

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:
            warnings.warn(f"damaged numba cache for {self._py_func.__qualname__} in "
                          f"{self.cache_path} ({exc!r}); recompiling", CacheWarning)
            base = self._impl.filename_base
            _remove_files(Path(self.cache_path).glob(f"{base}.*"))
            return None

    def save_overload(self, sig, data):
        try:
            super().save_overload(sig, data)
        except OSError as exc:
            _warn_once(("unwritable", self.cache_path),
                       f"cannot save machine code to {self.cache_path} ({exc})")


# ---------------------------------------------------------------- locking


class _EntryLock:
    """A re-entrant lock on one entry, shared by this process's threads and, via flock on a lock
    file, by other processes."""

    def __init__(self, path: Path):
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    def __enter__(self) -> _EntryLock:
        self._thread_lock.acquire()
        if self._depth == 0:
            try:
                self._fd = _open_locked(self.path)
            except OSError as exc:
                _warn_once(("unwritable", self.path.parent),
                           f"cannot lock {self.path} ({exc}); other processes are not excluded")
            except BaseException:  # e.g. Ctrl-C while another process compiles
                self._thread_lock.release()
                raise
        self._depth += 1
        return self

    def __exit__(self, *exc_info) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
        self._thread_lock.release()


_entry_locks: dict[Path, _EntryLock] = {}
_entry_locks_guard = threading.Lock()


def _entry_lock(directory: Path, name: str) -> _EntryLock:
    path = directory / f"{name}.lock"
    with _entry_locks_guard:
        return _entry_locks.setdefault(path, _EntryLock(path))


def _open_locked(path: Path) -> int:
    """Open and flock `path`, starting over if clear_cache unlinked it while we waited."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


# ---------------------------------------------------------------- files


class _NotPrivate(Exception):
    """A cache path is not owned by the current user or is writable by others."""


def _make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _require_private(path: Path, *, follow_symlinks: bool) -> None:
    status = os.stat(path, follow_symlinks=follow_symlinks)
    if status.st_uid != os.geteuid():
        raise _NotPrivate(f"{path} is owned by uid {status.st_uid}, not by uid {os.geteuid()}")
    if status.st_mode & 0o022:
        raise _NotPrivate(f"{path} is writable by group or others "
                          f"(mode {status.st_mode & 0o777:o})")


def _write_atomically(path: Path, data: bytes) -> None:
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX, suffix=".py")
    try:
        with os.fdopen(fd, "wb") as temp:
            temp.write(data)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise


def _entry_names(directory: Path) -> list[str]:
    return sorted(path.stem for path in directory.glob(f"{_PREFIX}*.py"))


def _entry_files(directory: Path, name: str) -> list[Path]:
    """The module file of entry `name` and numba's files for its functions."""
    module = directory / f"{name}.py"
    numba_files = sorted((directory / "__pycache__").glob(f"{name}.*"))
    return [module, *numba_files] if module.exists() else numba_files


def _total_size(paths) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def _remove_files(paths) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


_warned: set = set()


def _warn_once(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, CacheWarning, stacklevel=3)
