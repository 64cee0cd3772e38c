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


class ArgumentError(HccError):
    """A public function was called with an argument of the wrong type or value (the caller's
    mistake, reported before any work: ``hcc.compile(program, 123)``, ``CostModel(per_message_s=
    float("nan"))``, an unknown keyword). Catch it as :class:`HccError`, or as the built-in
    ``TypeError``/``ValueError`` its two kinds also are."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type, or an unknown keyword argument."""


class ArgumentValueError(ArgumentError, ValueError):
    """An argument of the right type with a value outside its domain (negative, NaN, ...)."""
