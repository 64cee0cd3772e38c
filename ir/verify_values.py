"""hcc.ir.verify_values — the values ir/verify.py's symbolic executor computes with, and the
buffers that hold them.

Terms (ir/verify.py's docstring defines them in full)
- value: ``(groups, divisor)``, ``groups = ((shift, rank mask), ...)`` sorted by shift: the
  set of input elements an element holds, combined with the plan's reduction; ``None``: an
  element never written.
- segment map (:class:`_Segs`): runs ``[start, next start)`` of one buffer with one value
  each; :class:`_Slots`: the same keyed by range start, for buffers whose ranges are laminar
  (pairwise equal or disjoint); :class:`_Input`: a rank's read-only ``in``.
- required runs (:func:`_required`): buffer_layout's final ``out`` of a rank as runs.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from .plan import Plan, block_range

Value = Any  # None | tuple[tuple[tuple[int, int], ...], int]: ((shift, rank mask), ...), divisor


class _Segs:
    """Runs ``[starts[i], starts[i+1])`` of one buffer, each with one value."""

    __slots__ = ("starts", "vals", "length")

    def __init__(self, length: int, val: Any):
        self.starts = [0]
        self.vals = [val]
        self.length = length

    def _cut(self, x: int) -> int:
        """Ensure a run starts at ``x``; return its index (``len`` when ``x`` is the end)."""
        if x >= self.length:
            return len(self.starts)
        i = bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            i += 1
            self.starts.insert(i, x)
            self.vals.insert(i, self.vals[i - 1])
        return i

    def pieces(self, a: int, b: int) -> list[tuple[int, int, Any]]:
        i = bisect_right(self.starts, a) - 1
        out = []
        starts, vals, n = self.starts, self.vals, len(self.starts)
        while i < n and starts[i] < b:
            e = starts[i + 1] if i + 1 < n else self.length
            out.append((max(a, starts[i]), min(b, e), vals[i]))
            i += 1
        return out

    def assign(self, a: int, b: int, pieces: list[tuple[int, int, Any]]) -> None:
        i = self._cut(a)
        j = self._cut(b)
        self.starts[i:j] = [p[0] for p in pieces]
        self.vals[i:j] = [p[2] for p in pieces]
        # merge equal neighbours at the two seams so maps stay as small as the data's runs
        k = i + len(pieces)
        if k < len(self.starts) and k > 0 and self.vals[k] == self.vals[k - 1]:
            del self.starts[k], self.vals[k]
        if i > 0 and i < len(self.starts) and self.vals[i] == self.vals[i - 1]:
            del self.starts[i], self.vals[i]


class _Slots:
    """A buffer whose ranges are laminar (see the module docstring): ``slots[start] = (end,
    runs)`` for every range written so far, ``runs`` as :meth:`_Segs.pieces` returns them.
    Any range the rank's ops name is either a key or untouched, so :meth:`pieces` of such a
    range is one lookup; :meth:`runs` serves any other range (the final check's blocks)."""

    __slots__ = ("slots", "length")

    def __init__(self, length: int):
        self.slots: dict[int, tuple[int, list]] = {}
        self.length = length

    def pieces(self, a: int, b: int) -> list[tuple[int, int, Any]]:
        hit = self.slots.get(a)
        if hit is not None and hit[0] == b:
            return hit[1]
        return self.runs(a, b)

    def assign(self, a: int, b: int, pieces: list[tuple[int, int, Any]]) -> None:
        self.slots[a] = (b, pieces)

    def runs(self, a: int, b: int) -> list[tuple[int, int, Any]]:
        """Runs covering ``[a, b)`` in order, gaps as ``None`` (never written)."""
        keys = sorted(self.slots)
        out, pos = [], a
        for k in keys[max(0, bisect_left(keys, a) - 1):]:
            if k >= b:
                break
            end, runs = self.slots[k]
            if end <= pos:
                continue
            for s, e, v in runs:
                s, e = max(s, pos), min(e, b)
                if e <= s:
                    continue
                if s > pos:
                    out.append((pos, s, None))
                out.append((s, e, v))
                pos = e
        if pos < b:
            out.append((pos, b, None))
        return out


class _Input:
    """Rank ``r``'s ``in``: every element ``x`` holds ``(r, x)``, i.e. the term ``(r, 0)``."""

    __slots__ = ("value", "length")

    def __init__(self, length: int, r: int):
        self.value = (((0, 1 << r),), 1)
        self.length = length

    def pieces(self, a: int, b: int) -> list[tuple[int, int, Any]]:
        return [(a, b, self.value)]


def _laminar(ranges: set[tuple[int, int]]) -> bool:
    """Whether the ranges are pairwise equal or disjoint (a set holds each range once).

    >>> _laminar({(0, 4), (4, 8)}), _laminar({(0, 4), (2, 6)}), _laminar({(0, 4), (0, 2)})
    (True, False, False)
    """
    last = -1
    for a, b in sorted(ranges):
        if a < last:
            return False
        last = b
    return True


def _shift(val: Value, delta: int) -> Value:
    if val is None or delta == 0:
        return val
    groups, div = val
    return tuple((s + delta, m) for s, m in groups), div


def _union(a: Value, b: Value) -> tuple[Value, str]:
    """Combine two values with the reduction; returns ``(value, "")`` or ``(None, why)``."""
    if a is None or b is None:
        return None, "combines elements that were never written"
    if a[1] != 1 or b[1] != 1:
        return None, "reduces a value that was already scaled"
    ga, gb = a[0], b[0]
    if len(ga) == 1 and len(gb) == 1 and ga[0][0] == gb[0][0]:  # the common case: one shift
        s, ma = ga[0]
        mb = gb[0][1]
        if ma & mb:
            return None, _twice(ma & mb)
        return (((s, ma | mb),), 1), ""
    merged = dict(ga)
    for s, mb in gb:
        ma = merged.get(s, 0)
        if ma & mb:
            return None, _twice(ma & mb)
        merged[s] = ma | mb
    return (tuple(sorted(merged.items())), 1), ""


def _twice(both: int) -> str:
    q = (both & -both).bit_length() - 1
    return f"counts rank {q}'s input twice (double-counted reduction)"


def _required(plan: Plan, r: int) -> list[tuple[int, int, Value]] | None:
    """Required runs of rank ``r``'s ``out`` (buffer_layout's table), or None: unspecified."""
    n, E, kind, root = plan.n, plan.elems, plan.kind, plan.root
    div = n if plan.op == "avg" else 1
    everyone = (1 << n) - 1
    if kind == "broadcast":
        return [(0, E, (((0, 1 << root),), 1))]
    if kind in ("reduce", "allreduce"):
        if kind == "reduce" and r != root:
            return None
        return [(0, E, (((0, everyone),), div))]
    if kind in ("allgather", "gather"):
        if kind == "gather" and r != root:
            return None
        return [(lo, hi, (((-lo, 1 << j),), 1)) for j in range(n) for lo, hi in [block_range(E, n, j)]]
    lo, hi = block_range(E, n, r)
    if kind == "reduce_scatter":
        return [(0, hi - lo, (((lo, everyone),), div))]
    if kind == "scatter":
        return [(0, hi - lo, (((lo, 1 << root),), 1))]
    if kind == "alltoall":
        w = E // n
        return [(j * w, (j + 1) * w, ((((r - j) * w, 1 << j),), 1)) for j in range(n)]
    raise ValueError(kind)


def _bits(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first.

    >>> _bits(0b10110)
    [1, 2, 4]
    """
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _show(val: Value, s: int, e: int) -> str:
    if val is None:
        return "never written"
    groups, div = val
    count = sum(bin(m).count("1") for _, m in groups)
    if count == 1:
        sh, m = groups[0]
        txt = f"rank {_bits(m)[0]}'s in[{s + sh}:{e + sh}]"
    else:
        qs = sorted({q for _, m in groups for q in _bits(m)})
        shown = ", ".join(map(str, qs[:8])) + (", ..." if len(qs) > 8 else "")
        same = len(groups) == 1
        txt = f"the reduction of {count} inputs (ranks {shown}{'' if same else ', at differing offsets'})"
    return txt + (f" / {div}" if div != 1 else "")


def _runs(out: Any, lo: int, hi: int) -> list[tuple[int, int, Value]]:
    return out.runs(lo, hi) if isinstance(out, _Slots) else out.pieces(lo, hi)
