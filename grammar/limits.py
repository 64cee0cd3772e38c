"""hcc.grammar.limits — the bounds every input is held to (docs/language.md "Limits").

One table, read by the parser (numbers and indices), the front end (vertices, hosts, links,
bandwidths, latencies, sizes; ``compiler/frontend.py``) and the plan-file reader
(``ir/serialize.py``), so a program and a plan file are refused at the same limits. Each is
checked on a count *before* anything is built — a clique over 65536 vertices is refused after
one multiplication, not after 4e9 arcs — and each message names the limit.

Why these values
- 65536 vertices per topology (and names per range or reference): 64x the 1024-rank fat tree
  of the benchmarks.
- 65536 hosts per topology: a host groups at least one vertex in any useful topology.
- 2**20 arcs per topology: a 1024-vertex clique; the Link values alone take ~200 MB, and the
  compiler's graphs several times that.
- bandwidth 1 B/s .. 10**18 B/s (a million TB/s), latency at most 3600 s, sizes and chunks at
  most 2**50 B (1 PiB): beyond these a float64 time or an int64 element count loses meaning
  long before any real network does.
- an index has at most 9 digits, a multiplicity `x k` at most 65536, a number at most 100
  digits (17 already exhaust a float64) and a magnitude a float64 can hold (about 1.8e308).
"""
from __future__ import annotations

from fractions import Fraction

MAX_VERTICES = 1 << 16
MAX_RANGE = MAX_VERTICES
MAX_HOSTS = 1 << 16
MAX_LINKS = 1 << 20
MIN_BANDWIDTH = Fraction(1)  # B/s
MAX_BANDWIDTH = Fraction(10**18)  # B/s
MAX_LATENCY = Fraction(3600)  # s
MAX_BYTES = 1 << 50  # size and chunk
MAX_INDEX = 10**9 - 1
MAX_MULT = 1 << 16
MAX_DIGITS = 100
