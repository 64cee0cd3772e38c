"""hcc.grammar.errors — :class:`HccError`, the base of every error hcc raises on purpose.

One module, imported by every stage (grammar, compiler, ir, backends) and by the ``hcc``
package, so that ``except hcc.HccError`` catches bad input, bad plans and failed runs alike.

Why here: the stages import one way (grammar → compiler → ir ← backends), and the grammar is
the first stage, the one that may import no other; a base that the grammar's own
:class:`~hcc.grammar.diagnostics.SourceError` derives from can therefore live nowhere later.
It is its own module, apart from the source spans and caret rendering of
``diagnostics.py``, so that the IR and the backends depend on this one class only.
"""
from __future__ import annotations

__all__ = ["HccError"]


class HccError(Exception):
    """Base of every error hcc raises on purpose (bad input, bad plan, failed run)."""
