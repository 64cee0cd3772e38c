"""hcc.grammar.diagnostics — source spans and the one error type for bad input.

Every fault in a user's program is a :class:`SourceError` carrying a :class:`Span`; it
renders as ``file:line:col: error: message``, the source line, and a caret under the fault
(style.md habit 5). Lines and columns are 1-based. The CLI prints ``render()`` and exits 2.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import HccError

SHOWN_COLUMNS = 120  # a longer source line is shown as a window of this many columns


@dataclass(frozen=True)
class Source:
    path: str  # what the user named, or "<string>"
    text: str

    def line(self, lineno: int) -> str:
        r"""Line ``lineno`` as the parser counts lines: ended by ``\n`` only. ``str.splitlines``
        also ends a line at a form feed, ``\v``, ``\x1c``-``\x1e``, ``\x85``, U+2028 and
        U+2029, so it would show a different line from the one lark's line number names."""
        lines = self.text.split("\n")
        return lines[lineno - 1].rstrip("\r") if 1 <= lineno <= len(lines) else ""


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


class SourceError(HccError):
    """Bad input at a place in a source file."""

    def __init__(self, span: Span, message: str, hint: str = ""):
        super().__init__(message)
        self.span = span
        self.message = message
        self.hint = hint

    def render(self) -> str:
        s = self.span
        # one printable character per column, so the caret stays under the fault: a tab or a
        # control character (form feed, U+2028 ...) is one column for lark, shown as a space
        text = "".join(ch if ch.isprintable() else " " for ch in s.source.line(s.line))
        width = 1
        if s.end_line in (0, s.line) and s.end_col > s.col:
            width = s.end_col - s.col
        col, tail = s.col, ""
        if len(text) > SHOWN_COLUMNS:  # a window of the line around the fault, not all of it
            start = max(0, col - 1 - SHOWN_COLUMNS // 3)
            head = "…" if start else ""
            tail = "…" if start + SHOWN_COLUMNS < len(text) else ""
            text = head + text[start:start + SHOWN_COLUMNS]
            col = col - start + len(head)
        caret = " " * (col - 1) + "^" * max(1, min(width, len(text) - col + 1))
        text += tail
        out = f"{s.path}:{s.line}:{s.col}: error: {self.message}\n    {text}\n    {caret}"
        if self.hint:
            out += f"\n    {self.hint}"
        return out

    def __str__(self) -> str:
        return self.render()
