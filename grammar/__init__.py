"""hcc.grammar — the HCL grammar (``hcl.lark``), its AST and the parser front door."""
from .diagnostics import HccError, Source, SourceError, Span

__all__ = ["HccError", "Source", "SourceError", "Span"]
