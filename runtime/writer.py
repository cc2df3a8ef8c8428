"""A small indenting writer for generated source."""
from __future__ import annotations

from contextlib import contextmanager


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0
        self._tmp = 0

    def line(self, text: str = "") -> None:
        self.lines.append("    " * self.depth + text if text else "")

    @contextmanager
    def block(self, header: str):
        self.line(header)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def temp(self, base: str) -> str:
        self._tmp += 1
        return f"{base}{self._tmp}"

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
