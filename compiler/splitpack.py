"""hcc.compiler.splitpack — allreduce over split trees: in-trees packed for the reduction,
out-trees packed for the broadcast, one LP over both (the pipeline's ``treepack-split``).

Terms
- *in-tree* rooted at ``r``: a spanning tree whose edges carry data child -> parent, along
  the original links of its route walked backwards (a reduce packing's tree,
  compiler/treepack.py with ``reverse=True``); *out-tree*: parent -> child (a broadcast's).
- *job*: a share of the buffer reduced into ``r`` over one in-tree, then broadcast from ``r``
  over one out-tree, chunk by chunk (compiler/schedule.py moves jobs).

Why. Every other tree allreduce ties the two directions together: Blink's reduce+broadcast
reverses the broadcast trees (the reduction then loads each link's reverse with the same
pattern), reduce-scatter + allgather reverses the allgather trees, and the bidirectional
packing (algorithms.bidir_packing) uses each tree both ways. On a graph whose two directions
differ (random heterogeneous graphs: 1-8 GB/s per direction) a reversed tree runs over the
slow direction, and on DGX-1 fragments the allgather trees used both ways load every link
twice (RS+AG is capped at 2 x the allgather time: 0.62 of the allreduce floor on
gpu[0,3,4,5,7]). Here the reduction and the broadcast choose their trees jointly:

    maximise  sum_{T out} b_T
    s.t.      sum_{T in} a_T use_T(e) + sum_{T out} b_T use_T(e) <= c(e)   for every link e
              sum_{T out at r} b_T - sum_{T in at r} a_T <= 0               for every rank r

(a rank broadcasts no more than it has reduced). Each of the three forms above is a feasible
point of this LP, so its optimum is at least theirs, and it is at most the allreduce floor
(bounds.allreduce_floor), which holds for every schedule. The LP is
compiler/treepack_master.py's master with its ``balance`` rows, and the column generation is
as there: with link duals y and root duals z, an out-tree at ``r`` enters
when its cost under y is below 1 - z_r, an in-tree when below z_r (each a minimum-cost
arborescence of the rank closure, the in-tree on the reversed graph); it stops when none
does (LP duality: optimal), when the floor is met, or after SPLIT_MAX_ROUNDS rounds. Trees
under SPLIT_MIN_SHARE of the rate are dropped and the LP is solved again over the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..ir.errors import PlanError
from ..ir.plan import Plan
from ..ir.topology import Topology

__all__ = ["SPLIT_MAX_RANKS", "SplitPacking", "pack_split", "split_jobs", "split_plan"]

# the pipeline offers the split allreduce up to this many ranks: at 16 (1 x MI250, 2 x A100,
# 1 GB) its packing and chunk search added 12 s to the compile and reached 0.75 / 0.63 of the
# bound, behind the plans auto already had (0.81 / 0.66)
SPLIT_MAX_RANKS = 8
# pricing rounds of the column generation (a count, so the result depends on the input only):
# DGX-1 fragments and 6-rank random graphs converge in 10-40
SPLIT_MAX_ROUNDS = 200
# trees under this share of the rate are dropped (each costs a message per chunk on its own):
# the LP's optimum has many tiny columns on the fragments
SPLIT_MIN_SHARE = 0.02


@dataclass(frozen=True)
class SplitPacking:
    """``ins`` / ``outs``: treepack.PackedTree values (in-trees in the reduce packing's
    convention: edges parent -> child, data flowing child -> parent); ``rate``: the allreduce
    rate in bytes/s of the buffer (sum of the out-trees' rates); ``bound``: the floor's rate."""

    ins: tuple
    outs: tuple
    rate: float
    bound: float
    rounds: int

    @property
    def trees(self) -> tuple:
        return tuple(self.ins) + tuple(self.outs)


def _solve(capn, cols, nroots):
    """The master LP over ``cols`` = [(is_out, _Col)], compiler/treepack_master.py's with
    ``balance`` rows: (weights, link duals, root duals, objective). Built cold per solve
    without presolve: the column generation below was tuned on the vertices a cold GLOP
    solve returns, and a warm master may return another optimal vertex of these degenerate
    LPs (other duals, other columns, other plans)."""
    from .treepack_master import PackError, _Master

    master = _Master(capn, list(range(nroots)), balance=True)
    for is_out, col in cols:
        master.add(col, out=is_out)
    try:
        master.solve()
    except PackError as e:
        raise PlanError(f"GLOP did not solve the split-tree allreduce LP ({e})") from e
    y, z = master.duals()
    return master.weights(), y, z, master.objective()


def pack_split(topo: Topology, ranks: Sequence[str], *, max_rounds: int = SPLIT_MAX_ROUNDS) -> SplitPacking | None:
    """The split-tree packing of the module docstring; None for fewer than 2 ranks or when a
    rank cannot reach another.

    >>> from hcc.ir.topology import Link
    >>> ring = Topology("r", ("a", "b", "c"), links=tuple(Link(x, y, c) for x, y, c in
    ...     [("a", "b", 4.0), ("b", "c", 4.0), ("c", "a", 4.0), ("b", "a", 1.0), ("c", "b", 1.0), ("a", "c", 1.0)]))
    >>> p = pack_split(ring, ("a", "b", "c"))
    >>> round(p.rate, 6), round(p.bound, 6)   # the floor 2(n-1)M / (3 x 5 B/s) is met
    (3.75, 3.75)
    """
    from .bounds import allreduce_floor
    from .switches import Indexed
    from .treepack import _Pricer, _to_tree

    ranks = tuple(ranks)
    n = len(ranks)
    if n < 2:
        return None
    fwd = Indexed.build(topo, ranks)
    rev = Indexed.build(topo, ranks, reverse=True)
    pf, pr = _Pricer(fwd), _Pricer(rev)
    if len(pf.cap) == 0:
        return None
    scale = float(pf.cap.max())
    capn = pf.cap / scale
    floor = allreduce_floor(topo, ranks, 1.0)
    bound = 1.0 / floor if floor > 0 else float("inf")
    cols: list[tuple[bool, Any]] = []
    keys: set = set()

    def add(is_out: bool, col) -> bool:
        key = (is_out, col.root, col.parent, col.paths)
        if key in keys:
            return False
        keys.add(key)
        cols.append((is_out, col))
        return True

    for p, is_out in ((pf, True), (pr, False)):
        w0, route = p.matrix(1.0 / capn)
        for r in range(n):
            col = p.tree(w0, route, r)
            if col is None:
                return None
            add(is_out, col)
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        w, y, z, objective = _solve(capn, cols, n)
        if objective * scale >= bound * (1 - 1e-9):
            break
        added = False
        for p, is_out in ((pf, True), (pr, False)):
            mat, route = p.matrix(y)
            for r in range(n):
                col = p.tree(mat, route, r)
                if col is None:
                    return None
                cost = sum(k * y[li] for li, k in col.usage)
                limit = 1.0 - z[r] if is_out else z[r]
                if cost < limit * (1 - 1e-9) and add(is_out, col):
                    added = True
        if not added:
            break
    w, y, z, objective = _solve(capn, cols, n)
    keep = [c for c, x in zip(cols, w) if x > SPLIT_MIN_SHARE * objective]
    if keep:
        w2, _, _, obj2 = _solve(capn, keep, n)
        if obj2 >= objective * (1 - 2 * SPLIT_MIN_SHARE):
            cols, w, objective = keep, w2, obj2
    ins, outs = [], []
    for (is_out, col), x in zip(cols, w):
        if x <= 1e-12 * max(objective, 1e-30):
            continue
        if is_out:
            outs.append(_to_tree(fwd, col, x * scale))
        else:
            ins.append(_to_tree(rev, col, x * scale))
    return SplitPacking(tuple(ins), tuple(outs), sum(t.rate for t in outs), bound, rounds)


def split_jobs(ranks: Sequence[str], ins: Sequence[Any], outs: Sequence[Any]) -> list[tuple[int, int, float]]:
    """``(in-tree, out-tree, rate)`` jobs: per root, its out-trees' rates laid end to end
    over ``[0, x_r)`` and its in-trees' over the same range (scaled to ``x_r`` = the
    out-trees' total), intersected. A tree's jobs are consecutive, so in the order returned
    every tree carries one contiguous range of the buffer.

    >>> class T:
    ...     def __init__(self, root, rate): self.root, self.rate = root, rate
    >>> split_jobs(("a", "b"), [T("a", 3.0), T("a", 1.0)], [T("a", 2.0), T("a", 2.0)])
    [(0, 0, 2.0), (0, 1, 1.0), (1, 1, 1.0)]
    """
    jobs = []
    for r in ranks:
        o = [(j, t.rate) for j, t in enumerate(outs) if t.root == r and t.rate > 0]
        i = [(j, t.rate) for j, t in enumerate(ins) if t.root == r and t.rate > 0]
        xo = sum(x for _, x in o)
        xi = sum(x for _, x in i)
        if xo <= 0 or xi <= 0:
            continue
        i = [(j, x * xo / xi) for j, x in i]
        a = b = 0
        pos, ea, eb = 0.0, i[0][1], o[0][1]
        while a < len(i) and b < len(o):
            end = min(ea, eb)
            if end - pos > 1e-12 * xo:
                jobs.append((i[a][0], o[b][0], end - pos))
            pos = end
            if ea <= end * (1 + 1e-12):
                a += 1
                ea += i[a][1] if a < len(i) else 0.0
            if eb <= end * (1 + 1e-12):
                b += 1
                eb += o[b][1] if b < len(o) else 0.0
    return jobs


def split_plan(spec: Any, topo: Topology, packing: SplitPacking, chunk_bytes: int, *, model: Any = None,
               port_window: int | None = None, min_chunk: float = 1.0) -> Plan:
    """The allreduce plan over ``packing``'s jobs, scheduled by compiler/schedule.py (each
    job's share of the buffer proportional to its rate, rebalanced by finish time)."""
    from .cost import DEFAULT_MODEL
    from .lower import assemble, chunk_elems
    from .builder import _Lowering, split_by_rate
    from .schedule import PORT_WINDOW, lower_jobs
    from .trees import TreeShape

    if spec.kind != "allreduce":
        raise PlanError(f"split trees lower allreduce only, not {spec.kind}")
    ce = chunk_elems(chunk_bytes, spec.dtype)
    L = _Lowering(spec, ce)
    ins = [TreeShape.of(t, spec.ranks, i) for i, t in enumerate(packing.ins)]
    outs = [TreeShape.of(t, spec.ranks, len(ins) + i) for i, t in enumerate(packing.outs)]
    jobs = split_jobs(spec.ranks, packing.ins, packing.outs)
    if not jobs:
        raise PlanError(f"allreduce {spec.name!r}: the split packing has no trees")
    rates = [x for _, _, x in jobs]
    spans = split_by_rate(0, L.E, rates)
    got = lower_jobs(L, [ins[i] for i, _, _ in jobs], [outs[o] for _, o, _ in jobs],
                     [i for i, _, _ in jobs], [len(ins) + o for _, o, _ in jobs], rates,
                     {0: list(range(len(jobs)))}, spans, topo, (model or DEFAULT_MODEL).per_message_s,
                     port_window or PORT_WINDOW, min_chunk)
    if got is None:
        raise PlanError(f"allreduce {spec.name!r}: the split-tree schedule cannot lower at {chunk_bytes} B "
                        f"chunks (a tree hop outside the collective's links, or too many messages)")
    cover: dict[int, tuple[int, int]] = {}
    for (i, o, _), (a, b) in zip(jobs, got):
        for t in (i, len(ins) + o):
            lo, hi = cover.get(t, (b, a))
            cover[t] = (min(lo, a), max(hi, b))
    shapes = ins + outs
    trees = tuple(sh.to_tree(t, cover.get(t, (0, 0))) for t, sh in enumerate(shapes))
    return assemble(spec, topo, L.B, trees, "treepack-split", ce)
