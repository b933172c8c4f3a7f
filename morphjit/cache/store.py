"""The files of the disk cache (`cache` decides what goes in it): the checked directory and its
MAC key (`Store`), numba's index and data files behind MACs (`VerifiedCacheFile`), the locks on
entries, and an entry's files.

Security model. Loading numba's files unpickles them, which can run code, so:

- every directory on the way to the cache (symlinks followed one by one) must belong to root or to
  the current user and be writable by nobody else (a sticky directory such as /tmp, or a group
  holding only the user, excepted); otherwise the cache is bypassed with a warning;
- each numba file carries an HMAC-SHA256 of its name and bytes under a random per-cache key
  (``<cache dir>/key``, mode 0600), read once when the module is loaded. A file is read once
  through a descriptor opened without following symlinks, checked (regular, owner, mode), verified,
  and only those bytes are unpickled; a file that fails is a miss, rebuilt with one warning;
- ``source`` itself is executed, never the copy on disk, which must equal it byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import grp
import hashlib
import hmac
import io
import os
import pickle
import pwd
import re
import secrets
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from numba.core.caching import IndexDataCacheFile

PREFIX = "mj_"
_ENTRY_NAME = re.compile(r"(mj_[A-Za-z0-9_]{1,40}_[0-9a-f]{16})\.")
TEMP_PREFIX = ".tmp-"
_KEY_FILE = "key"
_KEY_BYTES = 32
_MAC_BYTES = 32  # HMAC-SHA256


class CacheWarning(UserWarning):
    """The disk cache was bypassed, or a damaged entry was rebuilt."""


_warned: set = set()


def warn_once(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, CacheWarning, stacklevel=3)


# ---------------------------------------------------------------- the store and its verified files


@dataclasses.dataclass(frozen=True)
class Store:
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
        write_atomically(path, self.mac(path, payload) + payload)

    def read(self, path: Path) -> bytes | None:
        """The payload stored at `path` if its MAC verifies, None if there is no file.

        Raises Damaged for anything else: the bytes checked are the bytes returned.
        """
        try:
            data = read_regular_file(path, self.owner)
        except FileNotFoundError:
            return None
        except (NotPrivate, OSError) as exc:
            raise Damaged(path, str(exc)) from exc
        tag, payload = data[:_MAC_BYTES], data[_MAC_BYTES:]
        if not hmac.compare_digest(tag, self.mac(path, payload)):
            raise Damaged(path, "its authentication code does not match its bytes")
        return payload


def open_store(directory: Path, max_bytes: int) -> Store:
    """Check the path to `directory`, create it if missing, and read (or make) its key."""
    _check_path(directory)
    if not directory.is_dir():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_path(directory)
    owner = directory.stat().st_uid
    if owner == os.geteuid() and os.access(directory, os.W_OK):
        _require_private(directory)
        return Store(directory, _read_or_make_key(directory), owner, True, max_bytes)
    key_path = directory / _KEY_FILE
    key = read_regular_file(key_path, owner)
    if len(key) != _KEY_BYTES:
        raise NotPrivate(f"the key file {key_path} of this read-only cache is damaged")
    return Store(directory, key, owner, False, max_bytes)


def _read_or_make_key(directory: Path) -> bytes:
    path = directory / _KEY_FILE
    if not os.path.lexists(path):
        _create_key(path)
    try:
        key = read_regular_file(path, os.geteuid())
        problem = None if len(key) == _KEY_BYTES else f"it holds {len(key)} bytes, not {_KEY_BYTES}"
    except (NotPrivate, OSError) as exc:  # e.g. a symlink (O_NOFOLLOW) or a directory
        problem = str(exc)
    if problem is None:
        return key
    warnings.warn(f"morphjit cache key {path} is unusable ({problem}); making a new one, so every "
                  "entry will be rebuilt", CacheWarning, stacklevel=5)
    remove_any(path)
    _create_key(path)
    return read_regular_file(path, os.geteuid())


def _create_key(path: Path) -> None:
    """Write a new random key at `path` unless a concurrent process wrote one first."""
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as temp:
            temp.write(secrets.token_bytes(_KEY_BYTES))
            temp.flush()
            os.fsync(temp.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temp_name, path)
    finally:
        os.unlink(temp_name)


class Damaged(Exception):
    """A cache file could not be read, is not a regular file of the cache's owner, or does not
    verify."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path


class VerifiedCacheFile(IndexDataCacheFile):
    """numba's index and data files, each behind a MAC, read once and verified before unpickling."""

    def __init__(self, cache_path, filename_base, source_stamp, store: Store):
        super().__init__(cache_path, filename_base, source_stamp)
        self._store = store

    def save(self, key, data):
        try:
            super().save(key, data)
        except Damaged as damage:  # damaged since this process loaded it: start the index afresh
            remove_files([damage.path])
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
                warn_once(("unwritable", self.path.parent),
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


def entry_lock(directory: Path, name: str) -> _EntryLock:
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


def remove_unless_locked(directory: Path, name: str) -> bool:
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
        remove_entry(directory, name, lock_path)
    finally:
        os.close(fd)
    return True


def remove_entry(directory: Path, name: str, lock_path: Path) -> None:
    """Remove entry `name`; the caller holds its lock, whose file goes last."""
    remove_files([*entry_files(directory, name), lock_path])


# ---------------------------------------------------------------- files and permissions


class NotPrivate(Exception):
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
                raise NotPrivate(f"too many symbolic links on the way to {path}")
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
        raise NotPrivate(f"{path} is writable by group or others (mode "
                          f"{status.st_mode & 0o7777:o}, no sticky bit), so another user could "
                          "replace what it holds")


def _require_trusted_owner(path: Path, status: os.stat_result) -> None:
    if status.st_uid not in (0, os.geteuid()):
        raise NotPrivate(f"{path} is owned by uid {status.st_uid}, not by uid {os.geteuid()} "
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


def make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _require_private(path: Path) -> None:
    status = os.stat(path)
    if status.st_uid != os.geteuid():
        raise NotPrivate(f"{path} is owned by uid {status.st_uid}, not by uid {os.geteuid()}")
    if _writable_by_others(status):
        raise NotPrivate(f"{path} is writable by group or others "
                          f"(mode {status.st_mode & 0o777:o})")


def read_regular_file(path: Path, owner: int) -> bytes:
    """The bytes of `path`, read through one descriptor: a regular file (not a symlink) owned by
    `owner` and writable by nobody else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise NotPrivate(f"{path} is not a regular file")
        if status.st_uid != owner:
            raise NotPrivate(f"{path} is owned by uid {status.st_uid}, not by uid {owner}")
        if _writable_by_others(status):
            raise NotPrivate(f"{path} is writable by group or others "
                              f"(mode {status.st_mode & 0o777:o})")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read()
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
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


def entry_names(directory: Path) -> list[str]:
    """Entries with a module file, and machine code left without one (e.g. by an eviction)."""
    return list(entries(directory))


def entries(directory: Path) -> dict[str, list[Path]]:
    """Each entry's files (as `entry_files` lists them) by name, from one listing of each
    directory: a glob per entry made each save quadratic in the number of cached kernels."""
    modules = {path.stem: path for path in directory.glob(f"{PREFIX}*.py")}
    numba_files: dict[str, list[Path]] = {}
    for path in sorted(directory.glob(f"__pycache__/{PREFIX}*")):
        if match := _ENTRY_NAME.match(path.name):
            numba_files.setdefault(match[1], []).append(path)
    return {name: ([modules[name]] if name in modules else []) + numba_files.get(name, [])
            for name in sorted(modules.keys() | numba_files.keys())}


def entry_files(directory: Path, name: str) -> list[Path]:
    """The module file of entry `name` and numba's files for its functions."""
    module = directory / f"{name}.py"
    numba_files = sorted((directory / "__pycache__").glob(f"{name}.*"))
    return [module, *numba_files] if os.path.lexists(module) else numba_files


def total_size(paths) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            total += path.lstat().st_size
    return total


def remove_files(paths) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def remove_any(path: Path) -> None:
    """Remove `path`, a directory tree included (OSError if that is not possible)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        path.unlink()
