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

    def __reduce__(self):
        """Pickle as the same error with the same message and attributes. The default
        (``type(self)(*self.args)``) calls ``__init__`` with the rendered message alone, which
        fails or garbles for the subclasses whose constructors take other arguments
        (SourceError's span, PeerFailed's ranks): an error raised in a worker process, a Ray
        task or a multiprocessing pool then reached the caller as a pickling failure."""
        return _rebuilt, (type(self), self.args, self.__dict__.copy())


def _rebuilt(cls: type, args: tuple, state: dict) -> HccError:
    """The error of :meth:`HccError.__reduce__`: made without its ``__init__``, as it was."""
    err = cls.__new__(cls, *args)  # BaseException.__new__ keeps args
    err.__dict__.update(state)
    return err
