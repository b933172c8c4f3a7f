"""A Python source builder with scoped indentation (used by codegen; general enough for any
generated module).

    src = Source()
    src.line("def f(x):")
    with src.indent():
        src.line("return x")
    src.text()  ->  "def f(x):\\n    return x\\n"
"""
from __future__ import annotations

import contextlib
from typing import Iterator

UNIT = "    "


class Source:
    """Lines of source; each line is indented by the depth of the ``indent`` scopes around it."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def line(self, text: str) -> None:
        self.lines.append(UNIT * self.depth + text)

    def block(self, text: str) -> None:
        """Add the lines of ``text`` (indented relative to each other) at the current depth."""
        for line in text.splitlines():
            self.line(line)

    @contextlib.contextmanager
    def indent(self, levels: int = 1) -> Iterator[None]:
        self.depth += levels
        try:
            yield
        finally:
            self.depth -= levels

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
