"""The disk cache's size bound: least recently used entries go first, locked entries stay."""

import fcntl
import os
import time

import pytest

from morphjit.cache import cache_info, load_module, policy as disk_cache, prune_cache, store as cache_store
from morphjit.__main__ import main
from test_cache import PROGRAM, run_step


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("MORPHJIT_CACHE_DIR", str(directory))
    monkeypatch.delenv("MORPHJIT_CACHE", raising=False)
    monkeypatch.delenv("MORPHJIT_CACHE_MAX_SIZE", raising=False)
    return directory


def entries(request, count):
    """`count` entries (module files only), used in order (the first least recently)."""
    names = [load_module(PROGRAM.format(tag=f"{request.node.name} {index}")).__name__
             for index in range(count)]
    for age, name in enumerate(reversed(names)):
        stamp = time.time() - 100 * (age + 1)
        for path in cache_store.entry_files(disk_cache.cache_dir(), name):
            os.utime(path, (stamp, stamp))
    return names


def sizes():
    return {entry.name: entry.bytes for entry in cache_info().per_entry}


def test_prune_evicts_least_recently_used_and_skips_locked(cache_dir, request):
    oldest, middle, newest = entries(request, 3)
    size = sizes()
    lock = os.open(cache_dir / f"{oldest}.lock", os.O_RDWR)  # a process loading `oldest`
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        evicted = prune_cache(size[oldest] + size[newest])
    finally:
        os.close(lock)
    assert [entry.name for entry in evicted] == [middle]
    assert sorted(sizes()) == sorted([oldest, newest])
    assert not (cache_dir / f"{middle}.lock").exists()
    assert [entry.name for entry in prune_cache(size[newest])] == [oldest]
    assert list(sizes()) == [newest]


def test_loading_an_entry_makes_it_recent(cache_dir, request):
    oldest, newest = entries(request, 2)
    size = sizes()
    load_module(PROGRAM.format(tag=f"{request.node.name} 0"))
    assert [entry.name for entry in prune_cache(size[oldest])] == [newest]


def test_saving_machine_code_keeps_the_cache_under_its_bound(cache_dir, request, monkeypatch):
    older, = entries(request, 1)
    monkeypatch.setenv("MORPHJIT_CACHE_MAX_SIZE", "1K")  # smaller than any entry
    module = load_module(PROGRAM.format(tag=f"{request.node.name} new"))
    run_step(module)
    assert list(sizes()) == [module.__name__]  # the older entry went; the new one stays


def test_bad_bound_names_the_variable(cache_dir, monkeypatch, request):
    monkeypatch.setenv("MORPHJIT_CACHE_MAX_SIZE", "lots")
    with pytest.raises(ValueError, match="MORPHJIT_CACHE_MAX_SIZE: .*'lots'"):
        load_module(PROGRAM.format(tag=request.node.name))


def test_cli_prunes_to_the_given_bound(cache_dir, request, capsys):
    entries(request, 2)
    main(["cache", "prune", "--max-size", "0"])
    out = capsys.readouterr().out
    assert "removed 2 entries" in out and "0 entries, 0 B left" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["cache", "prune", "--max-size", "big"])
    assert exit_info.value.code == 2 and "expected a size" in capsys.readouterr().err


def test_one_listing_finds_the_files_of_every_entry(cache_dir, request):
    names = entries(request, 2)
    run_step(load_module(PROGRAM.format(tag=f"{request.node.name} compiled")))   # numba's files too
    (cache_dir / "__pycache__" / f"{names[0]}.orphan.nbi").write_bytes(b"")   # machine code alone
    (cache_dir / f"{names[0]}.py").unlink()
    found = cache_store.entries(cache_dir)
    assert len(found) == 3 and any(len(paths) > 2 for paths in found.values())
    assert found == {name: cache_store.entry_files(cache_dir, name) for name in cache_store.entry_names(cache_dir)}
