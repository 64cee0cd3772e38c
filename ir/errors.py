"""hcc.ir.errors — typed errors of the IR level (style.md habit 2: raise, never print)."""
from __future__ import annotations

from ..grammar.errors import HccError


class PlanError(HccError):
    """A plan file or plan value is malformed, of another version, or inconsistent."""

    def __init__(self, message: str, source: str = "<plan>"):
        super().__init__(f"{source}: error: {message}")
        self.source = source
        self.message = message


class VerifyError(PlanError):
    """Symbolic execution found a plan that does not do what its collective requires, has a
    Send without its Recv (or the reverse), or can deadlock. ``rank``/``op`` locate it."""

    def __init__(self, message: str, source: str = "<plan>", rank: int = -1, op: int = -1):
        super().__init__(message, source)
        self.rank = rank
        self.op = op
