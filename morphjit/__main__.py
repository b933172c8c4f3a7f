"""Command line: ``python -m morphjit info`` and ``python -m morphjit cache info|prune|clear``."""

from __future__ import annotations

import argparse

from .cache import cache_dir, cache_info, cache_max_size, clear_cache, parse_size, prune_cache
from .jit import show_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m morphjit",
                                     description="Utilities for the morphjit compiler.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="what this process compiles with: versions, CPU, vector math, BLAS, "
                                     "threads, the cache and the MORPHJIT_* settings (for a bug report)"
                        ).set_defaults(run=show_config)
    cache_parser = commands.add_parser("cache",
                                       help="inspect, prune or clear the on-disk compile cache",
                                       description=f"Cache directory: {cache_dir()}")
    actions = cache_parser.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="list the cached programs and their size").set_defaults(
        run=print_info)
    prune_parser = actions.add_parser(
        "prune", help="delete the least recently used programs down to the size bound",
        description="Entries that a process is loading or compiling are skipped.")
    prune_parser.add_argument("--max-size", metavar="SIZE", type=_size,
                              help="bound such as 500M or 2G (default: MORPHJIT_CACHE_MAX_SIZE, "
                                   "else 1G)")
    prune_parser.set_defaults(run=prune)
    actions.add_parser("clear", help="delete every cached program").set_defaults(run=clear)
    arguments = vars(parser.parse_args(argv))
    run = arguments.pop("run")
    run(**{key: value for key, value in arguments.items() if key not in ("command", "action")})


def print_info() -> None:
    info = cache_info()
    print(f"morphjit cache: {info.directory}")
    print(f"{_entries(info.entries)}, {_human_bytes(info.total_bytes)}")
    for entry in info.per_entry:
        print(f"  {entry.name}  {_human_bytes(entry.bytes)}")


def prune(max_size: int | None) -> None:
    max_bytes = cache_max_size() if max_size is None else max_size
    evicted = prune_cache(max_bytes)
    info = cache_info()
    print(f"removed {_entries(len(evicted))} ({_human_bytes(sum(e.bytes for e in evicted))}) "
          f"from {info.directory}; {_entries(info.entries)}, {_human_bytes(info.total_bytes)} left "
          f"(bound {_human_bytes(max_bytes)})")


def clear() -> None:
    before = cache_info()
    removed = clear_cache()
    print(f"removed {_entries(removed)} ({_human_bytes(before.total_bytes)}) "
          f"from {before.directory}")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _entries(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


def _human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


if __name__ == "__main__":
    main()
