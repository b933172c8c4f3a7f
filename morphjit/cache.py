"""On-disk cache of generated step modules and of their numba machine code.

`load_module` turns the source text rendered by codegen into a module. With caching on, the text is
stored as ``<cache dir>/mj_<hint>_<hash>.py`` (the hash covers the text and the versions of morphjit,
numba, numpy, llvmlite and Python), executed under a module name (registered in ``sys.modules``
only while it runs and while its dispatchers compile, so that it is released with them), and every
numba dispatcher it defines keeps its machine code beside it in ``__pycache__``. A fresh process
that renders the same text loads that machine code instead of compiling.

Security model. Loading numba's files unpickles them, which can run code, so:

- every directory on the way to the cache (symlinks followed one by one) must belong to root or to
  the current user and be writable by nobody else (a sticky directory such as /tmp, or a group
  holding only the user, excepted); otherwise the cache is bypassed with a warning;
- each numba file carries an HMAC-SHA256 of its name and bytes under a random per-cache key
  (``<cache dir>/key``, mode 0600), read once when the module is loaded. A file is read once
  through a descriptor opened without following symlinks, checked (regular, owner, mode), verified,
  and only those bytes are unpickled; a file that fails is a miss, rebuilt with one warning;
- ``source`` itself is executed, never the copy on disk, which must equal it byte for byte.

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
import fcntl
import functools
import grp
import hashlib
import hmac
import importlib.metadata
import io
import linecache
import os
import pickle
import pwd
import re
import secrets
import shutil
import stat
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
from numba.core.caching import (CompileResultCacheImpl, FunctionCache, IndexDataCacheFile,
                                InTreeCacheLocator)
from numba.core.compiler_lock import global_compiler_lock
from numba.core.dispatcher import Dispatcher

from . import config, vecmath

_PREFIX = "mj_"
_ENTRY_NAME = re.compile(r"(mj_[A-Za-z0-9_]{1,40}_[0-9a-f]{16})\.")
_TEMP_PREFIX = ".tmp-"
_KEY_FILE = "key"
_KEY_BYTES = 32
_MAC_BYTES = 32  # HMAC-SHA256
_FORMAT = 2  # of the files; part of every entry's name
_DEFAULT_MAX_SIZE = "1G"
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


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
    back to an in-memory module (with a `CacheWarning`) when the cache directory cannot be used
    safely or written, or, read only, does not hold the program.
    """
    name = _module_name(source, name_hint)
    if not (cache and config.caching()):
        return _module_in_memory(source, name)
    directory = cache_dir()
    max_bytes = cache_max_size()
    try:
        store = _open_store(directory, max_bytes)
        module = _load_cached(source, name, store)
    except _NotPrivate as refusal:
        _warn_once(("not private", str(refusal)),
                   f"not using the morphjit cache: {refusal}; compiling in memory")
    except OSError as exc:
        _warn_once(("unwritable", directory),
                   f"cannot use the morphjit cache {directory} ({exc}); compiling in memory")
    else:
        if module is not None:
            return module
        _warn_once(("read only", directory),
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
            _remove_entry(directory, name, lock.path)
    _remove_files([*directory.glob(_TEMP_PREFIX + "*"),
                   *directory.glob(f"__pycache__/{_TEMP_PREFIX}*")])
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
    return f"{_PREFIX}{name_hint}_{digest[:16]}"


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


# ---------------------------------------------------------------- the store: directory and key


@dataclasses.dataclass(frozen=True)
class _Store:
    """A checked cache directory, its MAC key (read once, kept in memory) and its size bound."""

    directory: Path
    key: bytes
    owner: int
    writable: bool
    max_bytes: int

    def mac(self, path: Path, payload: bytes) -> bytes:
        return hmac.new(self.key, path.name.encode() + b"\0" + payload, hashlib.sha256).digest()

    def write(self, path: Path, payload: bytes) -> None:
        """Store `payload` at `path` behind its MAC."""
        _write_atomically(path, self.mac(path, payload) + payload)

    def read(self, path: Path) -> bytes | None:
        """The payload stored at `path` if its MAC verifies, None if there is no file.

        Raises _Damaged for anything else: the bytes checked are the bytes returned.
        """
        try:
            data = _read_regular_file(path, self.owner)
        except FileNotFoundError:
            return None
        except (_NotPrivate, OSError) as exc:
            raise _Damaged(path, str(exc)) from exc
        tag, payload = data[:_MAC_BYTES], data[_MAC_BYTES:]
        if not hmac.compare_digest(tag, self.mac(path, payload)):
            raise _Damaged(path, "its authentication code does not match its bytes")
        return payload


def _open_store(directory: Path, max_bytes: int) -> _Store:
    """Check the path to `directory`, create it if missing, and read (or make) its key."""
    _check_path(directory)
    if not directory.is_dir():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_path(directory)
    owner = directory.stat().st_uid
    if owner == os.geteuid() and os.access(directory, os.W_OK):
        _require_private(directory)
        return _Store(directory, _read_or_make_key(directory), owner, True, max_bytes)
    key_path = directory / _KEY_FILE
    key = _read_regular_file(key_path, owner)
    if len(key) != _KEY_BYTES:
        raise _NotPrivate(f"the key file {key_path} of this read-only cache is damaged")
    return _Store(directory, key, owner, False, max_bytes)


def _read_or_make_key(directory: Path) -> bytes:
    path = directory / _KEY_FILE
    if not os.path.lexists(path):
        _create_key(path)
    try:
        key = _read_regular_file(path, os.geteuid())
        problem = None if len(key) == _KEY_BYTES else f"it holds {len(key)} bytes, not {_KEY_BYTES}"
    except (_NotPrivate, OSError) as exc:  # e.g. a symlink (O_NOFOLLOW) or a directory
        problem = str(exc)
    if problem is None:
        return key
    warnings.warn(f"morphjit cache key {path} is unusable ({problem}); making a new one, so every "
                  "entry will be rebuilt", CacheWarning, stacklevel=5)
    _remove_any(path)
    _create_key(path)
    return _read_regular_file(path, os.geteuid())


def _create_key(path: Path) -> None:
    """Write a new random key at `path` unless a concurrent process wrote one first."""
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as temp:
            temp.write(secrets.token_bytes(_KEY_BYTES))
            temp.flush()
            os.fsync(temp.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temp_name, path)
    finally:
        os.unlink(temp_name)


# ---------------------------------------------------------------- loading


def _module_in_memory(source: str, name: str) -> types.ModuleType:
    filename = f"<morphjit {name}>"
    # Lets tracebacks and numba's error messages quote the generated lines, while the module lives.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    weakref.finalize(module, linecache.cache.pop, filename, None)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _load_cached(source: str, name: str, store: _Store) -> types.ModuleType | None:
    """The module of `source` backed by cache entry `name`; None if a read-only store lacks it."""
    path = store.directory / f"{name}.py"
    lock = _entry_lock(store.directory, name) if store.writable else contextlib.nullcontext()
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
    for path in [directory / "__pycache__", *_entry_files(directory, name)]:
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            continue
        expected = stat.S_ISDIR if path.name == "__pycache__" else stat.S_ISREG
        if expected(status.st_mode) and status.st_uid == os.geteuid():
            continue
        _warn_once(("healed", path), f"removing {path} from the morphjit cache: it is not a "
                   f"{'directory' if expected is stat.S_ISDIR else 'regular file'} owned by uid "
                   f"{os.geteuid()}")
        _remove_any(path)
    _make_private_dir(directory / "__pycache__")


def _holds_source(path: Path, source: str, owner: int) -> bool:
    try:
        return _read_regular_file(path, owner) == source.encode()
    except (OSError, _NotPrivate):
        return False


def _store_source(path: Path, source: str) -> None:
    """Write `source` to `path` unless an identical copy is there; a differing copy is damaged."""
    data = source.encode()
    try:
        if _read_regular_file(path, os.geteuid()) == data:
            return
    except FileNotFoundError:
        pass
    else:
        warnings.warn(f"morphjit cache entry {path} is damaged (its text differs from the program); "
                      "rebuilding it", CacheWarning, stacklevel=5)
        _remove_files(_entry_files(path.parent, path.stem))
    _write_atomically(path, data)


def _execute_registered(source: str, name: str, path: Path, lock,
                        store: _Store) -> types.ModuleType:
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


def _enable_disk_caching(dispatcher: Dispatcher, lock, store: _Store) -> None:
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


class _Damaged(Exception):
    """A cache file could not be read, is not a regular file of the cache's owner, or does not
    verify."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path


class _VerifiedCacheFile(IndexDataCacheFile):
    """numba's index and data files, each behind a MAC, read once and verified before unpickling."""

    def __init__(self, cache_path, filename_base, source_stamp, store: _Store):
        super().__init__(cache_path, filename_base, source_stamp)
        self._store = store

    def save(self, key, data):
        try:
            super().save(key, data)
        except _Damaged as damage:  # damaged since this process loaded it: start the index afresh
            _remove_files([damage.path])
            super().save(key, data)

    def _load_index(self):
        payload = self._store.read(Path(self._index_path))
        if payload is None:
            return {}
        stream = io.BytesIO(payload)
        if pickle.load(stream) != self._version:
            return {}
        stamp, overloads = pickle.loads(stream.read())
        return overloads if stamp == self._source_stamp else {}

    def _save_index(self, overloads):
        payload = pickle.dumps(self._version, protocol=-1) + self._dump((self._source_stamp,
                                                                          overloads))
        self._store.write(Path(self._index_path), payload)

    def _load_data(self, name):
        payload = self._store.read(Path(self._data_path(name)))
        if payload is None:
            raise FileNotFoundError(self._data_path(name))  # numba: the index outlived the data
        return pickle.loads(payload)

    def _save_data(self, name, data):
        self._store.write(Path(self._data_path(name)), self._dump(data))


class _VerifiedCache(FunctionCache):
    """numba's per-function disk cache over verified files: a file that fails verification is a
    miss (warned once, rebuilt); any other failure is numba's and leaves the files alone."""

    _impl_class = _InTreeCacheImpl

    def __init__(self, py_func, store: _Store):
        super().__init__(py_func)
        self._store = store
        plain = self._cache_file
        self._cache_file = _VerifiedCacheFile(self._cache_path, self._impl.filename_base,
                                              plain._source_stamp, store)

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except _Damaged as damage:
            rebuild = "rebuilding it" if self._store.writable else "compiling in memory"
            _warn_once(("damaged", damage.path),
                       f"damaged numba cache for {self._py_func.__qualname__} ({damage}); "
                       f"{rebuild}")
            if self._store.writable:
                _remove_files(Path(self.cache_path).glob(f"{self._impl.filename_base}.*"))
            return None

    def save_overload(self, sig, data):
        if not self._store.writable:
            return
        try:
            super().save_overload(sig, data)
        except OSError as exc:
            _warn_once(("unwritable", self.cache_path),
                       f"cannot save machine code to {self.cache_path} ({exc})")
            return
        _prune(self._store.directory, self._store.max_bytes, keep=self._py_func.__module__)


# ---------------------------------------------------------------- size bound


def _prune(directory: Path, max_bytes: int, keep: str | None) -> list[CacheEntry]:
    """Evict least recently used entries, never `keep` nor a locked one, down to `max_bytes`."""
    entries = [CacheEntry(name, _total_size(_entry_files(directory, name)))
               for name in _entry_names(directory)]
    total = sum(entry.bytes for entry in entries)
    evicted = []
    for entry in sorted(entries, key=lambda e: _last_used(directory, e.name)):
        if total <= max_bytes:
            break
        if entry.name != keep and _remove_unless_locked(directory, entry.name):
            total -= entry.bytes
            evicted.append(entry)
    return evicted


def _last_used(directory: Path, name: str) -> float:
    times = [path.stat().st_mtime for path in _entry_files(directory, name) if path.exists()]
    return max(times, default=0.0)


def _remove_unless_locked(directory: Path, name: str) -> bool:
    lock_path = directory / f"{name}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        _remove_entry(directory, name, lock_path)
    finally:
        os.close(fd)
    return True


def _remove_entry(directory: Path, name: str, lock_path: Path) -> None:
    """Remove entry `name`; the caller holds its lock, whose file goes last."""
    _remove_files([*_entry_files(directory, name), lock_path])


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
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
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


# ---------------------------------------------------------------- files and permissions


class _NotPrivate(Exception):
    """A cache path is not owned by the current user (or root) or is writable by others."""


def _check_path(path: Path) -> None:
    """Refuse `path` if a directory on the way to it lets another user replace what it holds.

    Symlinks are followed one at a time, so the directories holding them are checked too; the
    walk stops at the first missing component (the rest is created by this user).
    """
    pending = list(path.parts[1:])
    current = Path(path.anchor)
    _require_safe_directory(current, os.stat(current))
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        candidate = current.parent if part == ".." else current / part
        try:
            status = os.lstat(candidate)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(status.st_mode):
            _require_trusted_owner(candidate, status)
            hops += 1
            if hops > 40:
                raise _NotPrivate(f"too many symbolic links on the way to {path}")
            target = Path(os.readlink(candidate))
            if target.is_absolute():
                current = Path(target.anchor)
            pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
            continue
        _require_safe_directory(candidate, status)
        current = candidate


def _require_safe_directory(path: Path, status: os.stat_result) -> None:
    if not stat.S_ISDIR(status.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    _require_trusted_owner(path, status)
    if _writable_by_others(status) and not status.st_mode & stat.S_ISVTX:
        raise _NotPrivate(f"{path} is writable by group or others (mode "
                          f"{status.st_mode & 0o7777:o}, no sticky bit), so another user could "
                          "replace what it holds")


def _require_trusted_owner(path: Path, status: os.stat_result) -> None:
    if status.st_uid not in (0, os.geteuid()):
        raise _NotPrivate(f"{path} is owned by uid {status.st_uid}, not by uid {os.geteuid()} "
                          "or root")


def _writable_by_others(status: os.stat_result) -> bool:
    if status.st_mode & stat.S_IWOTH:
        return True
    return bool(status.st_mode & stat.S_IWGRP) and not _group_is_private(status.st_gid)


@functools.cache
def _group_is_private(gid: int) -> bool:
    """True for the current user's own group (user private groups, umask 002)."""
    try:
        user, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(gid)
    except KeyError:
        return False
    return (gid == user.pw_gid and group.gr_name == user.pw_name
            and set(group.gr_mem) <= {user.pw_name})


def _make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _require_private(path: Path) -> None:
    status = os.stat(path)
    if status.st_uid != os.geteuid():
        raise _NotPrivate(f"{path} is owned by uid {status.st_uid}, not by uid {os.geteuid()}")
    if _writable_by_others(status):
        raise _NotPrivate(f"{path} is writable by group or others "
                          f"(mode {status.st_mode & 0o777:o})")


def _read_regular_file(path: Path, owner: int) -> bytes:
    """The bytes of `path`, read through one descriptor: a regular file (not a symlink) owned by
    `owner` and writable by nobody else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise _NotPrivate(f"{path} is not a regular file")
        if status.st_uid != owner:
            raise _NotPrivate(f"{path} is owned by uid {status.st_uid}, not by uid {owner}")
        if _writable_by_others(status):
            raise _NotPrivate(f"{path} is writable by group or others "
                              f"(mode {status.st_mode & 0o777:o})")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read()
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
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
    """Entries with a module file, and machine code left without one (e.g. by an eviction)."""
    names = {path.stem for path in directory.glob(f"{_PREFIX}*.py")}
    for path in directory.glob(f"__pycache__/{_PREFIX}*"):
        if match := _ENTRY_NAME.match(path.name):
            names.add(match[1])
    return sorted(names)


def _entry_files(directory: Path, name: str) -> list[Path]:
    """The module file of entry `name` and numba's files for its functions."""
    module = directory / f"{name}.py"
    numba_files = sorted((directory / "__pycache__").glob(f"{name}.*"))
    return [module, *numba_files] if os.path.lexists(module) else numba_files


def _total_size(paths) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            total += path.lstat().st_size
    return total


def _remove_files(paths) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def _remove_any(path: Path) -> None:
    """Remove `path`, a directory tree included (OSError if that is not possible)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        path.unlink()


_warned: set = set()


def _warn_once(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, CacheWarning, stacklevel=3)
