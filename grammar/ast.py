"""hcc.grammar.ast — the syntax tree of an HCL file, before any name is resolved.

Every node is a frozen dataclass carrying the :class:`~hcc.grammar.diagnostics.Span` of the
text it came from, so the front end (``compiler/frontend.py``) can point a caret at the exact
token at fault (style.md habit 5). Nothing here checks meaning: names are unresolved, ranges
unexpanded, numbers and units kept as written.

Terms
- part: one name with an optional index list, ``gpu`` or ``gpu[0,3,5..6]``.
- ref: a vertex reference, ``part`` or ``host_part.part`` (``h[0..3].nvs``); it names one
  vertex when neither part has an index list, otherwise the vertices of the expansion.
- quantity: a number and its unit as written (``25 GB/s``; the unit may be missing, which the
  front end reports when the place needs one).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

from .diagnostics import Source, SourceError, Span
from .limits import MAX_DIGITS, MAX_INDEX, MAX_MULT  # noqa: F401  (the parser's bounds)

_NUMBER = re.compile(r"[+-]?([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")
_FLOAT_MAX = Fraction(sys.float_info.max)


@dataclass(frozen=True)
class Index:
    """``lo`` or ``lo..hi`` inside brackets (``lo == hi`` for a single index)."""

    lo: int
    hi: int
    span: Span


@dataclass(frozen=True)
class Part:
    name: str
    indices: tuple[Index, ...] | None  # None: no brackets
    span: Span

    @property
    def is_single(self) -> bool:
        return self.indices is None

    def text(self) -> str:
        if self.indices is None:
            return self.name
        items = ",".join(f"{i.lo}" if i.lo == i.hi else f"{i.lo}..{i.hi}" for i in self.indices)
        return f"{self.name}[{items}]"


@dataclass(frozen=True)
class Ref:
    host: Part | None  # the part before the dot, when qualified
    vertex: Part
    span: Span

    @property
    def is_single(self) -> bool:
        return self.vertex.is_single and (self.host is None or self.host.is_single)

    @property
    def is_plain_name(self) -> bool:
        """A bare identifier: what enumerated settings (``dtype = float32``) take."""
        return self.host is None and self.vertex.indices is None

    def text(self) -> str:
        return self.vertex.text() if self.host is None else f"{self.host.text()}.{self.vertex.text()}"


@dataclass(frozen=True)
class Quantity:
    number: str  # as written, sign included
    unit: str  # "" when none was written
    span: Span  # the whole token
    number_span: Span
    unit_span: Span | None  # None when no unit

    @property
    def value(self) -> Fraction:
        """The number exactly (``Fraction("12.5")``), before the unit is applied.

        Bounded work whatever is written: the digits and the exponent are measured before any
        arithmetic (``Fraction("1e999999999")`` would build a billion-digit integer). A number
        with more than :data:`MAX_DIGITS` digits, or beyond the largest finite float (about
        1.8e308: it could not become a float64 capacity or time), raises :class:`SourceError`
        at the number; one below the smallest float's scale (``1e-400``) is 0, as in float.

        >>> Quantity("1.5e3", "B", *(None,) * 3).value
        Fraction(1500, 1)
        """
        m = _NUMBER.fullmatch(self.number)
        if m is None:  # the grammar's QUANTITY guarantees the form; keep the error typed anyway
            raise SourceError(self.number_span, f"'{self.number}' is not a number")
        whole, frac, exp = m.group(1) or "", m.group(2) or "", m.group(3) or "0"
        if len(whole) + len(frac) > MAX_DIGITS:
            raise SourceError(self.number_span, f"a number of {len(whole) + len(frac)} digits; "
                                                f"at most {MAX_DIGITS} are read")
        digits = (whole + frac).lstrip("0")
        if not digits:
            return Fraction(0)
        e = int(exp) if len(exp.lstrip("+-")) <= 6 else (10**7 if exp[0] != "-" else -10**7)
        # the value lies in [10**(order-1), 10**order)
        order = len(digits) - len(frac) + e
        if order < -330:  # below float's smallest subnormal (4.9e-324): zero, as a float has it
            return Fraction(0)
        v = Fraction(self.number) if order <= 310 else None
        if v is None or abs(v) > _FLOAT_MAX:
            raise SourceError(self.number_span, f"number {self.number} is too large: "
                                                "beyond the largest finite float (about 1.8e308)")
        return v

    def text(self) -> str:
        return f"{self.number} {self.unit}" if self.unit else self.number


@dataclass(frozen=True)
class Decl:
    kind: str  # "node" | "switch"
    refs: tuple[Ref, ...]
    span: Span


@dataclass(frozen=True)
class ClassDecl:
    name: str
    name_span: Span
    bandwidth: Quantity
    latency: Quantity | None
    span: Span


@dataclass(frozen=True)
class ClassRef:
    name: str
    span: Span


@dataclass(frozen=True)
class LinkSpec:
    bandwidth: ClassRef | Quantity
    mult: int | None  # ``x2`` -> 2; None when not written
    mult_span: Span | None
    latency: Quantity | None
    span: Span


@dataclass(frozen=True)
class Link:
    src: Ref
    arrow: str  # "<->" | "->"
    arrow_span: Span
    dst: Ref
    spec: LinkSpec
    span: Span


@dataclass(frozen=True)
class Host:
    part: Part  # ``h[0..3]``: the host names
    body: tuple[Union[Decl, Link], ...]
    span: Span


TopoStmt = Union[Decl, ClassDecl, Link, Host]


@dataclass(frozen=True)
class TopologyDecl:
    name: str
    name_span: Span
    body: tuple[TopoStmt, ...]
    span: Span


SettingValue = Union[Quantity, tuple[Ref, ...]]


@dataclass(frozen=True)
class Setting:
    key: str
    key_span: Span
    value: SettingValue  # a Quantity, or a comma-separated list of refs (one for a plain name)
    value_span: Span
    span: Span


@dataclass(frozen=True)
class CollectiveDecl:
    name: str
    name_span: Span
    kind: str
    kind_span: Span
    topology: str
    topology_span: Span
    settings: tuple[Setting, ...]
    span: Span


@dataclass(frozen=True)
class Module:
    source: Source
    items: tuple[Union[TopologyDecl, CollectiveDecl], ...]

    @property
    def topologies(self) -> tuple[TopologyDecl, ...]:
        return tuple(i for i in self.items if isinstance(i, TopologyDecl))

    @property
    def collectives(self) -> tuple[CollectiveDecl, ...]:
        return tuple(i for i in self.items if isinstance(i, CollectiveDecl))
