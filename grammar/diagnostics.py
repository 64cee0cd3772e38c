"""hcc.grammar.diagnostics — source spans and the one error type for bad input.

Every fault in a user's program is a :class:`SourceError` carrying a :class:`Span`; it
renders as ``file:line:col: error: message``, the source line, and a caret under the fault
(style.md habit 5). Lines and columns are 1-based. The CLI prints ``render()`` and exits 2.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    path: str  # what the user named, or "<string>"
    text: str

    def line(self, lineno: int) -> str:
        lines = self.text.splitlines()
        return lines[lineno - 1] if 1 <= lineno <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    source: Source
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0  # exclusive; 0 = one character

    @property
    def path(self) -> str:
        return self.source.path


class HccError(Exception):
    """Base of every error hcc raises on purpose (bad input, bad plan, failed run)."""


class SourceError(HccError):
    """Bad input at a place in a source file."""

    def __init__(self, span: Span, message: str, hint: str = ""):
        super().__init__(message)
        self.span = span
        self.message = message
        self.hint = hint

    def render(self) -> str:
        s = self.span
        text = s.source.line(s.line).rstrip("\n").expandtabs(1)
        width = 1
        if s.end_line in (0, s.line) and s.end_col > s.col:
            width = s.end_col - s.col
        caret = " " * (s.col - 1) + "^" * max(1, min(width, max(1, len(text) - s.col + 1)))
        out = f"{s.path}:{s.line}:{s.col}: error: {self.message}\n    {text}\n    {caret}"
        if self.hint:
            out += f"\n    {self.hint}"
        return out

    def __str__(self) -> str:
        return self.render()
