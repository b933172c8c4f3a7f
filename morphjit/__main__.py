"""Command line: ``python -m morphjit cache info`` and ``python -m morphjit cache clear``."""

from __future__ import annotations

import argparse

from morphjit import cache


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m morphjit",
                                     description="Utilities for the morphjit compiler.")
    commands = parser.add_subparsers(dest="command", required=True)
    cache_parser = commands.add_parser("cache", help="inspect or clear the on-disk compile cache",
                                       description=f"Cache directory: {cache.cache_dir()}")
    actions = cache_parser.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="list the cached programs and their size").set_defaults(
        run=print_info)
    actions.add_parser("clear", help="delete every cached program").set_defaults(run=clear)
    parser.parse_args(argv).run()


def print_info() -> None:
    info = cache.cache_info()
    print(f"morphjit cache: {info.directory}")
    print(f"{_entries(info.entries)}, {_human_bytes(info.total_bytes)}")
    for entry in info.per_entry:
        print(f"  {entry.name}  {_human_bytes(entry.bytes)}")


def clear() -> None:
    before = cache.cache_info()
    removed = cache.clear_cache()
    print(f"removed {_entries(removed)} ({_human_bytes(before.total_bytes)}) "
          f"from {before.directory}")


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
