"""hcc.compiler.maxflow — a collective's restricted topology as an integer digraph for
repeated max-flows (the cut bounds of compiler/bounds.py and the cuts that name them).

Terms
- B⁺(S): the capacity of the links leaving a vertex set S (:meth:`FlowNet.out_of`).
- scaled capacity: OR-Tools' SimpleMaxFlow takes integer capacities. Capacities that are whole
  bytes/s (every unit of docs/language.md gives whole bytes/s above 1 B/s) are used as they
  are, so the figures are exact; other capacities are scaled to about 2^40 (relative error
  < 1e-12); ``FlowNet.scale`` converts back.
- parametric rate: the ForestColl per-root rate x* = min over S missing some sink of
  B⁺(S) / |S ∩ ranks|, by Newton's method on max-flows (:meth:`FlowNet.parametric_cut`).
"""
from __future__ import annotations

from fractions import Fraction
from typing import Iterable

import numpy as np
from ortools.graph.python import max_flow

from ..ir.topology import Topology

__all__ = ["FlowNet"]

# 2^40: scaled capacities keep 12 significant digits and sums of 256 ranks' worth of
# links (and the x N factor of the parametric flow) stay far below 2^63.
_SCALE_TARGET = float(2**40)


class FlowNet:
    """The restricted topology as an integer-capacity digraph for repeated max-flows."""

    def __init__(self, topo: Topology, ranks: tuple[str, ...], reverse: bool = False):
        sub = topo.restricted(tuple(ranks))
        g = sub.graph()
        self.ranks = tuple(ranks)
        missing = [r for r in self.ranks if r not in g]
        if missing:
            raise ValueError(f"ranks not in topology {topo.name!r}: {missing}")
        self.vertices = tuple(g.nodes)
        self.index = {v: i for i, v in enumerate(self.vertices)}
        arcs = []
        for u, v, d in g.edges(data=True):
            a, b = (v, u) if reverse else (u, v)
            if d["capacity"] > 0:
                arcs.append((self.index[a], self.index[b], float(d["capacity"])))
        caps = [c for _, _, c in arcs]
        integral = all(float(c).is_integer() for c in caps) and (max(caps, default=0) < 2**50)
        self.scale = 1.0 if integral or not caps else _SCALE_TARGET / max(caps)
        self.arcs = [(a, b, int(round(c * self.scale))) for a, b, c in arcs]
        self.out_cap = [0] * len(self.vertices)
        self.in_cap = [0] * len(self.vertices)
        for a, b, c in self.arcs:
            self.out_cap[a] += c
            self.in_cap[b] += c
        self.rank_idx = [self.index[r] for r in self.ranks]
        # the arcs as int64 arrays: SimpleMaxFlow takes them in one call, 20x faster than
        # one Python call per arc on the 256-rank fat tree's 1,024 arcs
        self._tails = np.array([a for a, _, _ in self.arcs], dtype=np.int64)
        self._heads = np.array([b for _, b, _ in self.arcs], dtype=np.int64)
        self._caps = np.array([c for _, _, c in self.arcs], dtype=np.int64)

    def _flow(self, factor: int = 1):
        f = max_flow.SimpleMaxFlow()
        if len(self.arcs):
            f.add_arcs_with_capacity(self._tails, self._heads, self._caps * factor)
        return f

    def out_of(self, s: Iterable[int]) -> int:
        """B⁺(S) in scaled integer capacity."""
        inside = set(s)
        return sum(c for a, b, c in self.arcs if a in inside and b not in inside)

    def maxflow(self, src: int, dst: int) -> int:
        f = self._flow()
        if f.solve(src, dst) != f.OPTIMAL:
            raise ArithmeticError("max-flow did not reach optimality")
        return f.optimal_flow()

    def solved_cut_between(self, side: set[int], other: set[int]):
        """The solved max-flow from a super source feeding ``side`` to a super sink fed by
        ``other`` (the super source is vertex index ``len(self.vertices)``)."""
        n = len(self.vertices)
        s, t = n, n + 1
        f = self._flow()
        big = sum(c for _, _, c in self.arcs) + 1
        for v in side:
            f.add_arc_with_capacity(s, v, big)
        for v in other:
            f.add_arc_with_capacity(v, t, big)
        if f.solve(s, t) != f.OPTIMAL:
            raise ArithmeticError("max-flow did not reach optimality")
        return f

    def min_cut_between(self, side: set[int], other: set[int]) -> int:
        """Least B⁺(S) over S ⊇ side, S ∩ other = ∅ (switches and the rest placed freely)."""
        return self.solved_cut_between(side, other).optimal_flow()

    def min_cut(self, src: int, dst: int) -> tuple[int, frozenset[int]]:
        """maxflow(src, dst) and the source side of a minimum cut (vertex indices)."""
        value, side, _ = self.min_cut_sides(src, dst)
        return value, side

    def min_cut_sides(self, src: int, dst: int) -> tuple[int, frozenset[int], frozenset[int]]:
        """maxflow(src, dst), the least source side of a minimum cut and the least sink side
        (vertex indices): every minimum cut's source side holds the first and misses the
        second."""
        f = self._flow()
        if f.solve(src, dst) != f.OPTIMAL:
            raise ArithmeticError("max-flow did not reach optimality")
        return f.optimal_flow(), frozenset(f.get_source_side_min_cut()), frozenset(f.get_sink_side_min_cut())

    def parametric_rate(self, sinks: list[int]) -> Fraction:
        """x* = min B⁺(S)/|S ∩ R| over S that miss some rank of ``sinks`` (scaled units)."""
        return self.parametric_cut(sinks)[0]

    def parametric_cut(self, sinks: list[int]) -> tuple[Fraction, frozenset[int]]:
        """x* and a vertex set S attaining it (B⁺(S) = x*·|S ∩ R|, S missing a sink).

        Newton iteration on the ForestColl condition maxflow_x(s, v) >= (N-1)·x for v in sinks.
        """
        n = len(self.vertices)
        # S = {r} for a rank r that is not the only sink gives the starting ratio B⁺({r})/1.
        starts = [(self.out_cap[r], r) for r in self.rank_idx if not (len(sinks) == 1 and r == sinks[0])]
        cap0, r0 = min(starts)
        x = Fraction(cap0)
        best_side = frozenset({r0})
        if x == 0:
            return x, best_side
        s = n
        for _ in range(4 * n + 8):  # Newton steps; each strictly lowers x, few in practice
            lowered = False
            for v in sinks:
                p, q = x.numerator, x.denominator
                f = self._flow(q)
                for r in self.rank_idx:
                    if r != v:
                        f.add_arc_with_capacity(s, r, p)
                if f.solve(s, v) != f.OPTIMAL:
                    raise ArithmeticError("max-flow did not reach optimality")
                need = (len(self.ranks) - 1) * p
                if f.optimal_flow() < need:
                    side = set(f.get_source_side_min_cut()) - {s}
                    k = sum(1 for r in self.rank_idx if r in side)
                    ratio = Fraction(self.out_of(side), k)
                    if ratio < x:
                        x = ratio
                        best_side = frozenset(side)
                        lowered = True
                        if x == 0:
                            return x, best_side
            if not lowered:
                return x, best_side
        raise ArithmeticError("parametric max-flow did not converge")
