"""hcc.compiler.progress — where a long compile is, told to whoever listens.

Terms
- *stage*: a pass of compiler/pipeline.py (``bounds``, ``pack``, ``lower``, ``verify``, ...).
- *step*: what the stage is doing now, in words (``treepack at 4 MiB chunks``), with how far
  it is as ``done`` of ``total`` when that is known (pricing rounds, chunk sizes, ops).
- *listener*: a callable ``(collective, stage, step, done, total)``. The library never prints
  (style.md); :func:`report` calls the listener of the current context, if any, and
  :class:`StderrProgress` is the one ``hcc compile`` installs.

Reporting costs one context-variable lookup when nobody listens, so the compiler reports
freely (once per pricing round, per chunk size, per verification phase: a few hundred calls
on the 1024-rank fat tree, never one per op).

>>> seen = []
>>> with listening(lambda *a: seen.append(a)):
...     report("pack", "pricing round", 3, 500)
>>> seen
[('', 'pack', 'pricing round', 3, 500)]
>>> report("pack", "nobody listens")   # no listener: nothing happens
"""
from __future__ import annotations

import contextvars
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

__all__ = ["Listener", "StderrProgress", "listening", "report", "collective"]

Listener = Callable[[str, str, str, "int | None", "int | None"], None]

_listener: contextvars.ContextVar[Listener | None] = contextvars.ContextVar("hcc_progress", default=None)
_collective: contextvars.ContextVar[str] = contextvars.ContextVar("hcc_progress_collective", default="")


def report(stage: str, step: str = "", done: int | None = None, total: int | None = None) -> None:
    """Tell the current listener (if any) that ``stage`` is at ``step``, ``done`` of ``total``."""
    fn = _listener.get()
    if fn is not None:
        fn(_collective.get(), stage, step, done, total)


@contextmanager
def listening(fn: Listener | None) -> Iterator[None]:
    """Send :func:`report` calls made inside the block to ``fn`` (None: to nobody)."""
    token = _listener.set(fn)
    try:
        yield
    finally:
        _listener.reset(token)


@contextmanager
def collective(name: str) -> Iterator[None]:
    """Name the collective the reports inside the block are about."""
    token = _collective.set(name)
    try:
        yield
    finally:
        _collective.reset(token)


class StderrProgress:
    """A listener that writes progress to a stream (stderr) once a compile has run longer
    than ``delay`` seconds (2 s: shorter compiles stay silent, as they were).

    On a terminal it rewrites one status line (carriage return, at most every ``tty_every``
    seconds) and clears it at :meth:`close`; otherwise (a pipe, a log file, CI) it writes plain
    lines, at most one per ``plain_every`` seconds unless the stage changes, so a log of a
    minute-long compile holds tens of lines, not thousands."""

    def __init__(self, stream: TextIO | None = None, *, delay: float = 2.0, tty_every: float = 0.2,
                 plain_every: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.delay = delay
        self.clock = clock
        self.start = clock()
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.every = tty_every if self.tty else plain_every
        self._last = -1e9
        self._stage = None
        self._width = 0

    def __call__(self, name: str, stage: str, step: str, done: int | None, total: int | None) -> None:
        now = self.clock()
        elapsed = now - self.start
        if elapsed < self.delay:
            self._stage = (name, stage)
            return
        if (name, stage) == self._stage and now - self._last < self.every:
            return
        self._stage, self._last = (name, stage), now
        where = f"{name}: " if name else ""
        how = f" {done}/{total}" if done is not None and total else (f" {done}" if done is not None else "")
        text = f"[{elapsed:6.1f} s] {where}{stage}{': ' + step if step else ''}{how}"
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the status line (terminal) so what follows starts on a clean line."""
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
