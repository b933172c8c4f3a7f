"""On-disk cache of generated step modules and of their numba machine code.

`load_module` turns the source text rendered by codegen into a module. With caching on, the text is
stored as ``<cache dir>/mj_<hint>_<hash>.py`` (the hash covers the text and the versions of morphjit,
numba, numpy, llvmlite and Python), executed under a module name (registered in ``sys.modules``
only while it runs and while its dispatchers compile, so that it is released with them), and every
numba dispatcher it defines keeps its machine code beside it in ``__pycache__``. A fresh process
that renders the same text loads that machine code instead of compiling. How the files are
checked, verified and locked is ``store``'s (its docstring gives the security model).

A cache directory the user cannot write (owned by root or by the user, e.g. pre-warmed in a
container) is read only: entries that verify are loaded, nothing is written, and a program it lacks
compiles in memory. The cache is bounded (least recently loaded entries go first, never one locked
by a process loading or compiling it).

Environment, read at every call: ``MORPHJIT_CACHE_DIR`` (else ``$XDG_CACHE_HOME/morphjit`` if that
is absolute, else ``$HOME/.cache/morphjit``, else the user's home from the password database),
``MORPHJIT_CACHE=0`` to compile in memory only, ``MORPHJIT_CACHE_MAX_SIZE`` (bytes, or with a
K/M/G suffix; default 1G).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import linecache
import os
import pwd
import re
import stat
import sys
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

from ..native import vecmath
from ..util import config
from .store import (PREFIX, TEMP_PREFIX, CacheWarning, Damaged, NotPrivate, Store, VerifiedCacheFile, entries,
                    entry_files, entry_lock, entry_names, make_private_dir, open_store, read_regular_file,
                    remove_any, remove_entry, remove_files, remove_unless_locked, total_size, warn_once,
                    write_atomically)

_FORMAT = 3  # of the files and the module paths they import; part of every entry's name
_DEFAULT_MAX_SIZE = "1G"
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


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
    back to an in-memory module (with a `CacheWarning`) when the cache directory cannot be used
    safely or written, or, read only, does not hold the program.
    """
    name = _module_name(source, name_hint)
    if not (cache and config.caching()):
        return _module_in_memory(source, name)
    directory = cache_dir()
    max_bytes = cache_max_size()
    try:
        store = open_store(directory, max_bytes)
        module = _load_cached(source, name, store)
    except NotPrivate as refusal:
        warn_once(("not private", str(refusal)),
                   f"not using the morphjit cache: {refusal}; compiling in memory")
    except OSError as exc:
        warn_once(("unwritable", directory),
                   f"cannot use the morphjit cache {directory} ({exc}); compiling in memory")
    else:
        if module is not None:
            return module
        warn_once(("read only", directory),
                   f"the read-only morphjit cache {directory} does not hold this program; "
                   "compiling in memory")
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
    explicit = config.cache_dir()
    if explicit:
        return Path(os.path.abspath(os.path.expanduser(explicit)))
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec: a relative path is invalid and ignored
        return Path(os.path.normpath(xdg), "morphjit")
    return Path(_home(), ".cache", "morphjit")


def cache_max_size() -> int:
    """The bound on the cache's bytes, from ``MORPHJIT_CACHE_MAX_SIZE`` (default 1G)."""
    text = config.cache_max_size() or _DEFAULT_MAX_SIZE
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"MORPHJIT_CACHE_MAX_SIZE: {exc}") from None


def parse_size(text: str) -> int:
    """Bytes in `text`: a number with an optional K, M, G or T suffix (powers of 1024)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not match:
        raise ValueError(f"expected a size such as 500M, 2G or 1048576 (bytes), got {text!r}")
    return int(float(match[1]) * _SIZE_UNITS[match[2].upper()])


def cache_info() -> CacheInfo:
    """Count the cached programs and their bytes, numba's files included."""
    directory = cache_dir()
    per_entry = tuple(CacheEntry(name, total_size(files)) for name, files in entries(directory).items())
    return CacheInfo(directory, len(per_entry), sum(e.bytes for e in per_entry), per_entry)


def clear_cache() -> int:
    """Delete every cached program (and leftover temporary files); return how many were deleted.

    Modules already loaded in this process keep working.
    """
    directory = cache_dir()
    names = entry_names(directory)
    for name in names:
        lock = entry_lock(directory, name)
        with lock:
            remove_entry(directory, name, lock.path)
    remove_files([*directory.glob(TEMP_PREFIX + "*"),
                   *directory.glob(f"__pycache__/{TEMP_PREFIX}*")])
    return len(names)


def prune_cache(max_bytes: int | None = None) -> list[CacheEntry]:
    """Evict the least recently loaded entries until the cache holds at most `max_bytes`.

    `max_bytes` defaults to `cache_max_size()`. Entries locked by a process loading or compiling
    them are skipped. Returns the evicted entries.
    """
    return _prune(cache_dir(), cache_max_size() if max_bytes is None else max_bytes, keep=None)


# ---------------------------------------------------------------- naming and environment


def _module_name(source: str, name_hint: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_]{1,40}", name_hint):
        raise ValueError(f"name_hint must be 1-40 letters, digits or underscores, got {name_hint!r}")
    digest = hashlib.sha256(f"{_versions()}\0{source}".encode()).hexdigest()
    return f"{PREFIX}{name_hint}_{digest[:16]}"


@functools.cache
def _versions() -> str:
    try:
        morphjit_version = importlib.metadata.version("morphjit")
    except importlib.metadata.PackageNotFoundError:
        morphjit_version = "uninstalled"
    return (f"cache format={_FORMAT} morphjit={morphjit_version} numba={numba.__version__} "
            f"numpy={numpy.__version__} llvmlite={llvmlite.__version__} python={sys.version} "
            f"{vecmath.cache_key()}")


def _home() -> str:
    """$HOME if it is an absolute path, else the home directory in the password database."""
    home = os.environ.get("HOME", "")
    if os.path.isabs(home):
        return os.path.normpath(home)
    return pwd.getpwuid(os.geteuid()).pw_dir


# ---------------------------------------------------------------- loading


def _module_in_memory(source: str, name: str) -> types.ModuleType:
    filename = f"<morphjit {name}>"
    # Lets tracebacks and numba's error messages quote the generated lines, while the module lives.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    weakref.finalize(module, linecache.cache.pop, filename, None)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _load_cached(source: str, name: str, store: Store) -> types.ModuleType | None:
    """The module of `source` backed by cache entry `name`; None if a read-only store lacks it."""
    path = store.directory / f"{name}.py"
    lock = entry_lock(store.directory, name) if store.writable else contextlib.nullcontext()
    with lock:
        loaded = sys.modules.get(name)
        if getattr(loaded, "__file__", None) == str(path):
            return loaded
        if store.writable:
            _heal_entry(store.directory, name)
            _store_source(path, source)
            os.utime(path)  # marks the entry as recently used for pruning
        elif not _holds_source(path, source, store.owner):
            return None
        return _execute_registered(source, name, path, lock, store)


def _heal_entry(directory: Path, name: str) -> None:
    """Remove what stands in place of an entry's files but is not a regular file of ours."""
    for path in [directory / "__pycache__", *entry_files(directory, name)]:
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            continue
        expected = stat.S_ISDIR if path.name == "__pycache__" else stat.S_ISREG
        if expected(status.st_mode) and status.st_uid == os.geteuid():
            continue
        warn_once(("healed", path), f"removing {path} from the morphjit cache: it is not a "
                   f"{'directory' if expected is stat.S_ISDIR else 'regular file'} owned by uid "
                   f"{os.geteuid()}")
        remove_any(path)
    make_private_dir(directory / "__pycache__")


def _holds_source(path: Path, source: str, owner: int) -> bool:
    try:
        return read_regular_file(path, owner) == source.encode()
    except (OSError, NotPrivate):
        return False


def _store_source(path: Path, source: str) -> None:
    """Write `source` to `path` unless an identical copy is there; a differing copy is damaged."""
    data = source.encode()
    try:
        if read_regular_file(path, os.geteuid()) == data:
            return
    except FileNotFoundError:
        pass
    else:
        warnings.warn(f"morphjit cache entry {path} is damaged (its text differs from the program); "
                      "rebuilding it", CacheWarning, stacklevel=5)
        remove_files(entry_files(path.parent, path.stem))
    write_atomically(path, data)


def _execute_registered(source: str, name: str, path: Path, lock,
                        store: Store) -> types.ModuleType:
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
            _enable_disk_caching(dispatcher, lock, store)
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


def _enable_disk_caching(dispatcher: Dispatcher, lock, store: Store) -> None:
    """Give `dispatcher` a disk cache and serialise its compilations with other processes.

    This is what ``njit(cache=True)`` does (``Dispatcher.enable_caching``), with a cache that
    verifies what it reads; it must happen before the first compilation, which is why the
    generated decorators must be lazy (no explicit signatures).
    """
    if dispatcher.overloads:
        warnings.warn(f"{dispatcher.__name__} was compiled while its module ran (explicit "
                      "signature?), so it cannot be cached on disk", CacheWarning, stacklevel=5)
        return
    dispatcher._cache = _VerifiedCache(dispatcher.py_func, store)
    compile_unlocked = dispatcher.compile

    @functools.wraps(compile_unlocked)
    def compile_locked(sig):
        # Held across load, compile and save: a concurrent process waits, then loads our result.
        with lock:
            return _with_restart_hint(compile_unlocked, sig)

    dispatcher.compile = compile_locked


_numba_interrupted = False


def _with_restart_hint(compile_unlocked, sig):
    """Compile; after an interrupted compilation, say that numba's failures need a restart.

    numba installs its extensions and registries on the first compilation of a process; an
    interruption there (Ctrl-C) leaves it half initialised, and later compilations fail inside
    numba. That is no damage to the cache, whose files are left alone.
    """
    global _numba_interrupted
    try:
        return compile_unlocked(sig)
    except Exception as exc:
        if _numba_interrupted:
            raise RuntimeError(
                "numba failed after an earlier compilation in this process was interrupted "
                f"({type(exc).__name__}: {exc}); numba cannot recover from an interruption "
                "while it initialises: restart the process (the disk cache is intact)") from exc
        raise
    except BaseException:
        _numba_interrupted = True
        raise


class _InTreeLocator(InTreeCacheLocator):
    """numba's locator for ``__pycache__`` beside the module, without its writability probe
    (the store has checked the directory, and a read-only store is never written)."""

    @classmethod
    def from_function(cls, py_func, py_file):
        return cls(py_func, py_file) if os.path.exists(py_file) else None


class _InTreeCacheImpl(CompileResultCacheImpl):
    # Only beside the module, so the machine code stays in the checked directory even when
    # NUMBA_CACHE_DIR is set.
    _locator_classes = [_InTreeLocator]


class _VerifiedCache(FunctionCache):
    """numba's per-function disk cache over verified files: a file that fails verification is a
    miss (warned once, rebuilt); any other failure is numba's and leaves the files alone."""

    _impl_class = _InTreeCacheImpl

    def __init__(self, py_func, store: Store):
        super().__init__(py_func)
        self._store = store
        plain = self._cache_file
        self._cache_file = VerifiedCacheFile(self._cache_path, self._impl.filename_base,
                                              plain._source_stamp, store)

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except Damaged as damage:
            rebuild = "rebuilding it" if self._store.writable else "compiling in memory"
            warn_once(("damaged", damage.path),
                       f"damaged numba cache for {self._py_func.__qualname__} ({damage}); "
                       f"{rebuild}")
            if self._store.writable:
                remove_files(Path(self.cache_path).glob(f"{self._impl.filename_base}.*"))
            return None

    def save_overload(self, sig, data):
        if not self._store.writable:
            return
        try:
            super().save_overload(sig, data)
        except OSError as exc:
            warn_once(("unwritable", self.cache_path),
                       f"cannot save machine code to {self.cache_path} ({exc})")
            return
        _prune(self._store.directory, self._store.max_bytes, keep=self._py_func.__module__)


# ---------------------------------------------------------------- size bound


def _prune(directory: Path, max_bytes: int, keep: str | None) -> list[CacheEntry]:
    """Evict least recently used entries, never `keep` nor a locked one, down to `max_bytes`."""
    files = entries(directory)
    sizes = {name: total_size(paths) for name, paths in files.items()}
    total = sum(sizes.values())
    if total <= max_bytes:
        return []
    evicted = []
    for name in sorted(files, key=lambda name: _last_used(files[name])):
        if total <= max_bytes:
            break
        if name != keep and remove_unless_locked(directory, name):
            total -= sizes[name]
            evicted.append(CacheEntry(name, sizes[name]))
    return evicted


def _last_used(paths) -> float:
    return max([path.stat().st_mtime for path in paths if path.exists()], default=0.0)
