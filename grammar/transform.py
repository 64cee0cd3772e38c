"""hcc.grammar.transform — the lark parse tree of ``hcl.lark`` to the AST of ``ast.py``.

A separate module from the grammar and the parser front door (style.md habit 4, after lark's
``examples/composition``). Spans come from lark's token positions and, for rules, from
``propagate_positions``; lark columns are 1-based and ``end_column`` is exclusive, as
:class:`Span` expects.
"""
from __future__ import annotations

import re

from lark import Token, Transformer, v_args

from . import ast
from .diagnostics import Source, SourceError, Span

# A QUANTITY token is "<number>[ \t]*<unit>"; this splits it (the grammar guarantees a match).
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)([ \t]*)(.*)")


@v_args(meta=True)
class ToAst(Transformer):
    """Builds :mod:`ast` nodes; one instance per source (it stamps spans with that source)."""

    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    # ---- positions -------------------------------------------------------------------
    def _tok(self, t: Token) -> Span:
        return Span(self.source, t.line, t.column, t.end_line, t.end_column)

    def _meta(self, meta) -> Span:
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    # ---- references ------------------------------------------------------------------
    @staticmethod
    def _int(digits: str, span: Span, what: str, most: int) -> int:
        """A digit string as an int, refused with a caret above ``most`` (checked on its length
        first: converting 10**5000 digits costs time, and Python refuses past 4300)."""
        text = digits.lstrip("0") or "0"
        if len(text) > len(str(most)) or int(text) > most:
            shown = text if len(text) <= 20 else f"{text[:8]}… ({len(text)} digits)"
            raise SourceError(span, f"{what} {shown} is too large: at most {most}")
        return int(text)

    def index(self, meta, children):
        lo, hi = children[0], children[-1]
        lo_v = self._int(str(lo), self._tok(lo), "index", ast.MAX_INDEX)
        hi_v = self._int(str(hi), self._tok(hi), "index", ast.MAX_INDEX)
        return ast.Index(lo_v, hi_v, self._meta(meta))
        return ast.Index(lo, hi, self._meta(meta))

    def part(self, meta, children):
        name = children[0]
        indices = tuple(children[1:]) if len(children) > 1 else None
        return ast.Part(str(name), indices, self._meta(meta))

    def ref(self, meta, children):
        if len(children) == 2:
            return ast.Ref(children[0], children[1], self._meta(meta))
        return ast.Ref(None, children[0], self._meta(meta))

    # ---- quantities ------------------------------------------------------------------
    def _quantity(self, t: Token) -> ast.Quantity:
        m = _QUANTITY.fullmatch(str(t))
        number, gap, unit = m.group(1), m.group(2), m.group(3)
        line, col = t.line, t.column
        number_span = Span(self.source, line, col, line, col + len(number))
        unit_span = None
        if unit:
            ucol = col + len(number) + len(gap)
            unit_span = Span(self.source, line, ucol, line, ucol + len(unit))
        return ast.Quantity(number, unit, self._tok(t), number_span, unit_span)

    # ---- topology --------------------------------------------------------------------
    def decl(self, meta, children):
        return ast.Decl(str(children[0]), tuple(children[1:]), self._meta(meta))

    def class_decl(self, meta, children):
        name = children[0]
        bw = self._quantity(children[1])
        lat = self._quantity(children[2]) if len(children) > 2 else None
        return ast.ClassDecl(str(name), self._tok(name), bw, lat, self._meta(meta))

    def class_ref(self, meta, children):
        return ast.ClassRef(str(children[0]), self._tok(children[0]))

    def link_spec(self, meta, children):
        bw = children[0]
        if isinstance(bw, Token):
            bw = self._quantity(bw)
        mult = mult_span = lat = None
        for c in children[1:]:
            if isinstance(c, Token) and c.type == "MULT":
                mult_span = self._tok(c)
                mult = self._int(str(c)[1:], mult_span, "link multiplicity", ast.MAX_MULT)
            else:
                lat = self._quantity(c)
        return ast.LinkSpec(bw, mult, mult_span, lat, self._meta(meta))

    def link(self, meta, children):
        src, arrow, dst, spec = children
        return ast.Link(src, str(arrow), self._tok(arrow), dst, spec, self._meta(meta))

    def host(self, meta, children):
        return ast.Host(children[0], tuple(children[1:]), self._meta(meta))

    def topology(self, meta, children):
        name = children[0]
        return ast.TopologyDecl(str(name), self._tok(name), tuple(children[1:]), self._meta(meta))

    # ---- collectives -----------------------------------------------------------------
    def quantity_value(self, meta, children):
        return self._quantity(children[0])

    def refs_value(self, meta, children):
        return tuple(children)

    def setting(self, meta, children):
        key, value = children
        if isinstance(value, ast.Quantity):
            vspan = value.span
        else:
            first, last = value[0].span, value[-1].span
            vspan = Span(self.source, first.line, first.col, last.end_line, last.end_col)
        return ast.Setting(str(key), self._tok(key), value, vspan, self._meta(meta))

    def collective(self, meta, children):
        name, kind, topo = children[:3]
        return ast.CollectiveDecl(
            str(name), self._tok(name), str(kind), self._tok(kind), str(topo), self._tok(topo),
            tuple(children[3:]), self._meta(meta),
        )

    def start(self, meta, children):
        return ast.Module(self.source, tuple(children))
