"""hcc.grammar — the HCL grammar (``hcl.lark``), its AST and the parser front door.

``parse(text, path) -> ast.Module`` lives in :mod:`.parser`; it is imported lazily here so that
importing :mod:`hcc` does not load lark until a program is parsed (style.md habit 10)."""
from .diagnostics import Source, SourceError, Span
from .errors import HccError

__all__ = ["HccError", "Source", "SourceError", "Span", "parse"]


def __getattr__(name: str):
    if name == "parse":
        from .parser import parse

        return parse
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
