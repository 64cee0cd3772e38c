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

Shallow trees (SPLIT_DEPTH_SLACK). The LP's optimum is degenerate, and the minimum
arborescences it prices in are often chains: on DGX-1 fragments a job (an in-tree and its
out-tree) was 5-8 levels deep, and every level is a chunk time of pipeline fill at each end
of the schedule. :func:`pack_split` therefore probes depth caps from the roots' largest
eccentricity up (the column generation as above with compiler/treepack_shallow.py's
depth-bounded pricer, a route through switches one level) and keeps the first whose rate
is within SPLIT_DEPTH_SLACK of the unbounded LP's: on the fragments, 2 levels each way at
0.995-1.001 of its rate.

Chunk-aware capacities (SPLIT_CHUNK_AWARE). The LP above spends every link's capacity on
bytes, but with chunks of c bytes a message holds a link e for c / cap(e) + lat(e) + the
per-message cost, so a 50 GB/s NVLink pair at 1.5 MiB chunks keeps 6 % of its time for
messages, a 12 GB/s PCIe hop 2 %: the links the LP filled to the same bound finish at
different times, and the schedule's rebalancing then loads some above it. :func:`split_plan`
packs again for its chunk size over the capacities c / (c / cap(e) + lat(e) + per-message),
so every link's reservations, messages included, fit the same time.

Measured (DGX-1, allreduce, `hcc compile` bound / predicted at 256 MiB / 1 GiB, the split
form alone): gpu[0..3] 0.869 / 0.902 -> 0.892 / 0.941; gpu[0,1,2,4,5,6] 0.792 / 0.882 ->
0.896 / 0.930; gpu[1..7] 0.762 / 0.817 -> 0.836 / 0.893 (with SPLIT_EXACT, below).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..ir.errors import PlanError
from ..ir.plan import Plan
from ..ir.topology import Topology

__all__ = ["SPLIT_MAX_RANKS", "SplitPacking", "pack_split", "split_jobs", "split_plan", "split_priced"]

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
# the shallowest depth cap whose LP rate is within this share of the unbounded LP's is kept
# (module docstring). DGX-1 fragments, capacities net of 1 MiB messages, depth 2 against
# unbounded: gpu[0..3] 0.922 / 0.921 of the bound, gpu[0,1,2,4,5,6] 0.921 / 0.926, gpu[1..7]
# 0.903 / 0.904; depth 1 (stars through the PCIe switches) 0.84, 0.07, 0.06
SPLIT_DEPTH_SLACK = 0.01
# split_plan packs again for its chunk size over capacities net of the per-message hold
# (module docstring); without it, on the fragments above, 0.894 / 0.935, 0.878 / 0.924,
# 0.831 / 0.885 (with it 0.892 / 0.941, 0.896 / 0.930, 0.836 / 0.893)
SPLIT_CHUNK_AWARE = True
# split_plan's jobs are scheduled with schedule.lower_jobs(exact=True) over switches: a send
# through a switch then starts at the last completion of its rank before its port frees
# (the reservation waits, as in the simulator) instead of at the first one after (gated:
# gpu[0..3] at 1 GiB, 2 MiB chunks, its PCIe ports idle with a message ready 3-9 % of the
# time). Without it, on the fragments above: 0.893 / 0.936, 0.890 / 0.925, 0.834 / 0.885
SPLIT_EXACT = True
# split_priced lowers the jobs with each job's chunks whole, its last chunk in halves and its
# first and last in halves (compiler/schedule.py TAIL_HALVES), and keeps the fastest by
# simulation: halves shorten the drain of a job's last chunk up its in-tree and down its
# out-tree (and the first, the wait before its root can broadcast), and cost a message more
# per job each. DGX-1 fragments at 1 GiB, the last in halves alone: gpu[0..3] 0.941 -> 0.949,
# gpu[1..7] 0.893 -> 0.907, but gpu[0..3] at 64 MiB 0.836 -> 0.814; both ends alone:
# gpu[0,1,2,5,6,7] 0.948 -> 0.950, gpu[0..3] 0.949 -> 0.947. The schedule's own makespan
# does not always pick the faster plan
SPLIT_HALVES = ("none", "last", "ends")
# split_priced also lowers the fastest of those forms with each job's chunk scaled by the
# narrowest link its trees cross over the widest such among the jobs (compiler/schedule.py
# narrow_factors), and keeps it where it simulates faster: a job over a 12 GB/s PCIe route
# takes an NVLink job's level time twice over per chunk, fills and drains that much slower,
# and the rebalancing moved its bytes onto the NVLinks (gpu[0..3] at 1 GiB: its PCIe links
# 91 % busy, gpu2->gpu0 3.8 % above the bound). gpu[0..3] at 256 MiB / 1 GiB: 0.905 / 0.949
# -> 0.915 / 0.954; the scaled form alone lost on 46 of the 144 DGX-1 allocation figures
SPLIT_NARROW = True


@dataclass(frozen=True)
class SplitPacking:
    """``ins`` / ``outs``: treepack.PackedTree values (in-trees in the reduce packing's
    convention: edges parent -> child, data flowing child -> parent); ``rate``: the allreduce
    rate in bytes/s of the buffer (sum of the out-trees' rates); ``bound``: the floor's rate;
    ``depth``: the deepest tree's levels (a route through switches one level)."""

    ins: tuple
    outs: tuple
    rate: float
    bound: float
    rounds: int
    depth: int = 0

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


def pack_split(topo: Topology, ranks: Sequence[str], *, max_rounds: int = SPLIT_MAX_ROUNDS,
               chunk_bytes: float = 0.0, per_msg: float = 0.0, depth: int | None = None) -> SplitPacking | None:
    """The split-tree packing of the module docstring; None for fewer than 2 ranks or when a
    rank cannot reach another. ``chunk_bytes`` > 0: each link's capacity net of the
    per-message hold of chunks that size (its latency + ``per_msg`` per message); ``depth``:
    every tree at most that many levels (0: unbounded; None: the shallowest cap within
    SPLIT_DEPTH_SLACK of the unbounded rate, see the module docstring).

    >>> from hcc.ir.topology import Link
    >>> ring = Topology("r", ("a", "b", "c"), links=tuple(Link(x, y, c) for x, y, c in
    ...     [("a", "b", 4.0), ("b", "c", 4.0), ("c", "a", 4.0), ("b", "a", 1.0), ("c", "b", 1.0), ("a", "c", 1.0)]))
    >>> p = pack_split(ring, ("a", "b", "c"))
    >>> round(p.rate, 6), round(p.bound, 6)   # the floor 2(n-1)M / (3 x 5 B/s) is met
    (3.75, 3.75)
    """
    import numpy as np

    from .bounds import allreduce_floor
    from .switches import Indexed
    from .treepack import _Pricer, _to_tree
    from .treepack_master import _depth
    from .treepack_shallow import eccentricity

    ranks = tuple(ranks)
    n = len(ranks)
    if n < 2:
        return None
    fwd = Indexed.build(topo, ranks)
    rev = Indexed.build(topo, ranks, reverse=True)
    pf, pr = _Pricer(fwd), _Pricer(rev)
    if len(pf.cap) == 0:
        return None
    cap = pf.cap
    if chunk_bytes > 0:
        g = topo.restricted(ranks).graph()
        lat = np.array([g[fwd.vertices[a]][fwd.vertices[b]]["latency"] for a, b, _ in fwd.links])
        cap = chunk_bytes / (chunk_bytes / cap + lat + per_msg)
    scale = float(cap.max())
    capn = cap / scale
    floor = allreduce_floor(topo, ranks, 1.0)
    bound = 1.0 / floor if floor > 0 else float("inf")

    def packed(cap_depth: int):
        got = _pack(pf, pr, n, capn, scale, bound, max_rounds, cap_depth)
        if got is None:
            return None
        cols, w, objective, rounds = got
        ins, outs = [], []
        for (is_out, col), x in zip(cols, w):
            if x <= 1e-12 * max(objective, 1e-30):
                continue
            if is_out:
                outs.append((_to_tree(fwd, col, x * scale), col))
            else:
                ins.append((_to_tree(rev, col, x * scale), col))
        levels = max((_depth(c) for _, c in ins + outs), default=0)
        return SplitPacking(tuple(t for t, _ in ins), tuple(t for t, _ in outs), sum(t.rate for t, _ in outs),
                            bound, rounds, levels)

    if depth is not None:
        return packed(depth)
    full = packed(0)
    if full is None:
        return None
    ecc = 0
    for p in (pf, pr):
        w0, _ = p.matrix(1.0 / capn)
        for r in range(n):
            e = eccentricity(w0, r)
            if e is None:
                return full
            ecc = max(ecc, e)
    for d in range(max(ecc, 1), full.depth):
        got = packed(d)
        if got is not None and got.rate >= (1 - SPLIT_DEPTH_SLACK) * full.rate:
            return got
    return full

def _pack(pf, pr, n: int, capn, scale: float, bound: float, max_rounds: int, depth: int):
    """The column generation of :func:`pack_split` over link capacities ``capn`` (scaled by
    ``scale``), every tree at most ``depth`` levels (0: unbounded): ``(columns as (is_out,
    _Col), weights, objective, pricing rounds)``, or None when a rank cannot reach another."""
    from .treepack_shallow import _col, bounded_parents

    cols: list[tuple[bool, Any]] = []
    keys: set = set()

    def add(is_out: bool, col) -> bool:
        key = (is_out, col.root, col.parent, col.paths)
        if key in keys:
            return False
        keys.add(key)
        cols.append((is_out, col))
        return True

    def tree(p, mat, route, r):
        if not depth:
            return p.tree(mat, route, r)
        par = bounded_parents(mat, r, depth)
        return None if par is None else _col(p, route, par, r)

    for p, is_out in ((pf, True), (pr, False)):
        w0, route = p.matrix(1.0 / capn)
        for r in range(n):
            col = tree(p, w0, route, r)
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
                col = tree(p, mat, route, r)
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
    return cols, w, objective, rounds


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
               port_window: int | None = None, min_chunk: float = 1.0, halves: str = "none",
               narrow: bool = False) -> Plan:
    """The allreduce plan over ``packing``'s jobs, scheduled by compiler/schedule.py (each
    job's share of the buffer proportional to its rate, rebalanced by finish time). With
    SPLIT_CHUNK_AWARE the trees are packed again for ``chunk_bytes`` chunks, no deeper than
    ``packing``'s (module docstring), ``packing`` kept only where that packing fails.
    ``halves``: "none", "last" (each job's last chunk as two halves) or "ends" (its first
    and last): compiler/schedule.py TAIL_HALVES. ``narrow``: each job's chunk scaled by the
    narrowest link its trees cross (SPLIT_NARROW)."""
    jobs = _SplitJobs.at(spec, topo, packing, chunk_bytes, model)
    return jobs.lower(port_window, min_chunk, halves, narrow and jobs.narrow is not None)


def split_priced(spec: Any, topo: Topology, packing: SplitPacking, chunk_bytes: int, *, model: Any = None,
                 port_window: int | None = None, min_chunk: float = 1.0) -> tuple[Plan, Any]:
    """The fastest of :func:`split_plan`'s plans with each form of SPLIT_HALVES, and of the
    fastest of those in its narrow-link form (SPLIT_NARROW), with its simulation (the trees
    packed once for the chunk size, every form lowered over them)."""
    from .cost import DEFAULT_MODEL, simulate

    jobs = _SplitJobs.at(spec, topo, packing, chunk_bytes, model)
    got = []
    for halves in SPLIT_HALVES or ("none",):
        plan = jobs.lower(port_window, min_chunk, halves)
        got.append((plan, simulate(plan, model=model or DEFAULT_MODEL), halves))
    best = min(got, key=lambda x: x[1].time)
    if SPLIT_NARROW and jobs.narrow is not None:
        plan = jobs.lower(port_window, min_chunk, best[2], narrow=True)
        sim = simulate(plan, model=model or DEFAULT_MODEL)
        if sim.time < best[1].time:
            return plan, sim
    return best[0], best[1]


@dataclass(frozen=True)
class _SplitJobs:
    """The split allreduce's jobs at one chunk size, ready to lower: the collective, its
    topology, the chunk in bytes and in elements, the per-message cost, the in- and out-tree shapes and
    the jobs (in-tree, out-tree, rate) of :func:`split_jobs`, and per job the share of the
    chunk it cuts at in the narrow-link form (compiler/schedule.py narrow_factors; None where
    every job's is 1)."""

    spec: Any
    topo: Topology
    chunk_bytes: int
    ce: int
    per_msg: float
    ins: list
    outs: list
    jobs: list
    narrow: list | None = None

    @staticmethod
    def at(spec: Any, topo: Topology, packing: SplitPacking, chunk_bytes: int, model: Any) -> "_SplitJobs":
        """The jobs over ``packing``, packed again for ``chunk_bytes`` chunks (SPLIT_CHUNK_AWARE)."""
        from .cost import DEFAULT_MODEL
        from .lower import chunk_elems
        from .trees import TreeShape
        from ..ir.plan import DTYPE_SIZES

        if spec.kind != "allreduce":
            raise PlanError(f"split trees lower allreduce only, not {spec.kind}")
        ce = chunk_elems(chunk_bytes, spec.dtype)
        per_msg = (model or DEFAULT_MODEL).per_message_s
        if SPLIT_CHUNK_AWARE:
            # at the depth cap of ``packing`` (pack_split chose it): probing again per chunk size
            # tripled the packing's share of the compile
            again = pack_split(topo, spec.ranks, chunk_bytes=ce * DTYPE_SIZES[spec.dtype], per_msg=per_msg,
                               depth=packing.depth)
            if again is not None and again.outs:
                packing = again
        ins = [TreeShape.of(t, spec.ranks, i) for i, t in enumerate(packing.ins)]
        outs = [TreeShape.of(t, spec.ranks, len(ins) + i) for i, t in enumerate(packing.outs)]
        jobs = split_jobs(spec.ranks, packing.ins, packing.outs)
        if not jobs:
            raise PlanError(f"allreduce {spec.name!r}: the split packing has no trees")
        from .schedule import narrow_factors

        narrow = narrow_factors(spec, [ins[i] for i, _, _ in jobs], [outs[o] for _, o, _ in jobs], topo)
        return _SplitJobs(spec, topo, chunk_bytes, ce, per_msg, ins, outs, jobs,
                          narrow if min(narrow) < 1.0 else None)

    def lower(self, port_window: int | None, min_chunk: float, halves: str, narrow: bool = False) -> Plan:
        """The plan of these jobs, their chunks cut as ``halves`` says (:func:`split_plan`);
        ``narrow``: each job's chunk scaled by :attr:`narrow` (SPLIT_NARROW)."""
        from .builder import _Lowering, split_by_rate
        from .lower import assemble
        from .schedule import PORT_WINDOW, lower_jobs

        spec, ins, outs, jobs = self.spec, self.ins, self.outs, self.jobs
        rates = [x for _, _, x in jobs]
        L = _Lowering(spec, self.ce)
        got = lower_jobs(L, [ins[i] for i, _, _ in jobs], [outs[o] for _, o, _ in jobs],
                         [i for i, _, _ in jobs], [len(ins) + o for _, o, _ in jobs], rates,
                         {0: list(range(len(jobs)))}, split_by_rate(0, L.E, rates), self.topo, self.per_msg,
                         port_window or PORT_WINDOW, min_chunk, exact=SPLIT_EXACT, halves=halves,
                         factors=self.narrow if narrow else None)
        if got is None:
            raise PlanError(f"allreduce {spec.name!r}: the split-tree schedule cannot lower at {self.chunk_bytes} B "
                            f"chunks (a tree hop outside the collective's links, or too many messages)")
        cover: dict[int, tuple[int, int]] = {}
        for (i, o, _), (a, b) in zip(jobs, got):
            for t in (i, len(ins) + o):
                lo, hi = cover.get(t, (b, a))
                cover[t] = (min(lo, a), max(hi, b))
        trees = tuple(sh.to_tree(t, cover.get(t, (0, 0))) for t, sh in enumerate(ins + outs))
        return assemble(spec, self.topo, L.B, trees, "treepack-split", self.ce)
