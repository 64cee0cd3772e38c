"""hcc.compiler.units — the unit families of HCL and exact conversion to SI base values.

Terms (language.md "Units")
- family: what a quantity measures — ``size`` (bytes), ``bandwidth`` (bytes per second) or
  ``time`` (seconds). Each place in a program that takes a number takes one family.
- sizes: ``B KB MB GB TB`` are powers of 1000 and ``KiB MiB GiB TiB`` powers of 1024, so
  ``1 MB`` = 1 000 000 B and ``1 MiB`` = 1 048 576 B.
- bandwidth: ``B/s KB/s MB/s GB/s`` (and ``TB/s``, ``KiB/s``…) count bytes; ``Kbit/s Mbit/s
  Gbit/s`` (aliases ``Kbps Mbps Gbps``) count bits, so ``100 Gbit/s`` = 12.5 GB/s.
- time: ``ns us ms s``.

Conversions are exact (:class:`fractions.Fraction`), so ``1.5 KB`` is exactly 1500 bytes and a
size that is not a whole number of bytes is caught rather than rounded.

>>> SIZE["MiB"], SIZE["MB"], BANDWIDTH["Gbit/s"], BANDWIDTH["GB/s"]
(1048576, 1000000, Fraction(125000000, 1), Fraction(1000000000, 1))
"""
from __future__ import annotations

import difflib
import re
from fractions import Fraction

from ..grammar.ast import Quantity
from ..grammar.diagnostics import SourceError

SIZE: dict[str, int] = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

BANDWIDTH: dict[str, Fraction] = {f"{u}/s": Fraction(f) for u, f in SIZE.items()}
for _prefix, _bits in (("K", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12)):
    BANDWIDTH[f"{_prefix}bit/s"] = Fraction(_bits, 8)  # 8 bits a byte
    BANDWIDTH[f"{_prefix}bps"] = Fraction(_bits, 8)

TIME: dict[str, Fraction] = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "ms": Fraction(1, 10**3),
    "s": Fraction(1),
}

FAMILIES: dict[str, dict] = {"size": SIZE, "bandwidth": BANDWIDTH, "time": TIME}
EXAMPLES = {"size": "256 MB", "bandwidth": "25 GB/s", "time": "5 us"}


def family_of(unit: str) -> str | None:
    """``"GB/s"`` -> ``"bandwidth"``; None for a unit HCL does not know."""
    for fam, table in FAMILIES.items():
        if unit in table:
            return fam
    return None


def _suggest(unit: str, family: str) -> str:
    """A did-you-mean for an unknown unit, within the family the place expects."""
    m = re.fullmatch(r"([KMGT])b(?:/s|ps)", unit)
    if m and family == "bandwidth":  # "Gb/s" is gigabits; GB/s would be 8x more
        return f"{m.group(1)}bit/s"
    table = FAMILIES[family]
    for u in table:
        if u.lower() == unit.lower():
            return u
    close = difflib.get_close_matches(unit, list(table), n=1, cutoff=0.5)
    return close[0] if close else ""


def convert(q: Quantity, family: str) -> Fraction:
    """The value of ``q`` in the base unit of ``family`` (bytes, bytes/s, seconds), exactly.

    Raises :class:`SourceError` at the number when the unit is missing, and at the unit when
    it is unknown or of another family ("expected a bandwidth like 25 GB/s")."""
    example = EXAMPLES[family]
    if not q.unit:
        raise SourceError(
            q.number_span,
            f"a {family} needs a unit: expected a {family} like {example}",
            hint="units: " + " ".join(FAMILIES[family]),
        )
    got = family_of(q.unit)
    if got is None:
        if re.fullmatch(r"x[0-9]+", q.unit):
            raise SourceError(
                q.number_span,
                f"a {family} needs a unit: expected a {family} like {example} "
                f"(the multiplicity {q.unit} comes after it)",
            )
        sugg = _suggest(q.unit, family)
        raise SourceError(
            q.unit_span,
            f"unknown unit '{q.unit}'; expected a {family} like {example}"
            + (f" (did you mean {sugg}?)" if sugg else ""),
            hint="units: " + " ".join(FAMILIES[family]),
        )
    if got != family:
        raise SourceError(
            q.unit_span,
            f"'{q.unit}' is a {got} unit; expected a {family} like {example}",
        )
    return q.value * FAMILIES[family][q.unit]


def format_bytes(n: float) -> str:
    """A size for messages: ``format_bytes(500_000_000) == '500 MB'``."""
    for unit in ("TB", "GB", "MB", "KB"):
        if n >= SIZE[unit] and n % SIZE[unit] == 0:
            return f"{n // SIZE[unit]:g} {unit}"
    return f"{n:g} B"
