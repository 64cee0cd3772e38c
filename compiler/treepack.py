"""hcc.compiler.treepack — fractional packing of spanning trees, then few trees (OR-Tools).

Terms
- *arborescence* rooted at r: a rank-level tree with every edge directed away from r and every
  rank reached exactly once. Its edges are routed through switches only
  (compiler/switches.py); a tree of rate w puts w x (edges routed over the link) on a link.
- *packing*: trees with rates w_T such that on every link e, sum_T load_T(e) <= c(e).
- *broadcast packing* (Blink, MLSys 2020): maximise sum_T w_T over trees rooted at the root;
  by Edmonds (1973, "Edge-disjoint branchings") the optimum on a topology without switches
  equals min over ranks v of maxflow(root, v) — bounds.broadcast_rate_bound.
- *allgather packing* (ForestColl, Zhao et al. 2024): trees rooted at every rank, every root
  the same rate x, all sharing link capacity; maximise x. Its bound is
  bounds.allgather_rate_bound, reached on every topology without switches (Edmonds on the
  graph plus a source with an arc of capacity x to every rank) and, through edge splitting,
  on Eulerian ones with switches.
- reduce / reduce-scatter pack the same trees on the reversed graph (``reverse=True``): the
  rank tree is still reported parent -> child with the path listed parent .. child, and data
  flows child -> parent over the original links of that path walked backwards.

Method
1. *Column generation*, exact: GLOP solves the master LP over the trees found so far; the link
   duals y(e) (and, for allgather, the per-root duals z_r) price a new tree as a
   minimum-cost arborescence (Chu-Liu / Edmonds' algorithm, here over numpy matrices) on the
   rank closure under y; a tree enters when its cost is below 1 (broadcast) or z_r
   (allgather). When none does, LP duality proves the packing optimal. Capacities are scaled
   to at most 1, so the stopping test 1 - 1e-9 is a relative tolerance.
2. *Few trees* (broadcast/reduce): many trees mean many small chunks and more latency. CP-SAT
   searches K tree slots, each an arborescence of binary edge variables with single-commodity
   flow connectivity, an integer weight in units of a rate quantum q (gcd of the capacities,
   then q/2, q/4) and per-link capacity rows, minimising the trees used subject to
   rate >= (1 - tolerance) x the LP optimum. It builds its own trees: on DGX-1 the LP's columns
   need 20 trees where 4 suffice. Allgather (up to 8 ranks) uses one joint model over every
   root's slots, with q dividing the exact cut-bound rate x* (150/7 GB/s on DGX-1 gives
   q = 25/7 GB/s). The search gets a budget in deterministic seconds and one worker, so a
   program compiles to the same trees on an idle laptop and on a loaded CI machine. If
   CP-SAT is out of budget or finds no fewer trees, the LP's trees are kept and
   ``Packing.method`` says so.
3. Large instances: every pack starts from seed columns: *ring chains* (per root, the path
   along a depth-first order of the ranks in both directions, each hop routed through
   switches), or from 17 to 64 ranks greedy *shallow trees* (:func:`_shallow_columns`), and
   column generation stops as soon as the LP meets the cut bound, which proves optimality
   without a pricing round: on a full-bisection fat tree the chains are already optimal, so
   256 ranks pack in about 1-2 s. Otherwise generation stops after a fixed number of
   pricing rounds (a count, never a clock: results are a function of the input) and the
   LP's (feasible) rate is returned with ``method`` "colgen(round limit)" and its gap to the
   cut bound in ``Packing.gap``. ``time_limit`` is only a wall-clock safety net far above
   normal times; "safety net" in ``method`` says when it fired. CP-SAT few-trees runs up to
   16 ranks (broadcast) and 8 ranks (allgather: one joint model over every root's tree
   slots, skipped above 48 candidate edges).
4. Past one machine (issue 6): when the hosts of the topology are translates of one another
   (switches.host_translation: 32 racks of a fat tree, 64 DGX-1s), an allgather pack of
   more than 128 ranks solves the *host-symmetric* master (:func:`_colgen_symmetric`):
   a column is a tree rooted in the first host plus its translates to every other host at
   one weight, one LP row per orbit of links, one root per host slot priced per round. The
   LP is invariant under the translations, so its optimum is the full master's (an optimal
   packing averaged over the group is symmetric). Seeds are ring chains and binary trees
   (:func:`_btree_columns`, log2(n) deep); once the rate is optimal a second LP keeps it
   (to 1e-9) and minimises sum depth(T) w_T (:func:`_shallowest`), since a one-chunk share
   down a 1023-deep chain costs more than its bandwidth. The 1024-rank fat tree and 64
   DGX-1s pack at their cut bound (gap 1e-9), 1472 and 896 trees, in 37 s and 72 s of
   wall time on 2 cores at load 20. Broadcast/reduce packs of more
   than 128 ranks stop after 12 pricing rounds (``method`` "colgen(round limit)", the gap
   reported): on 64 DGX-1s a round costs seconds and the rate climbs slowly.

>>> from hcc.ir.topology import Topology, Link
>>> tri = Topology("tri", ("a", "b", "c"),
...     links=tuple(Link(x, y, 10.0) for x in "abc" for y in "abc" if x != y))
>>> p = pack_broadcast(tri, ("a", "b", "c"), "a")
>>> round(p.rate, 6), round(p.bound, 6), p.gap < 1e-9
(20.0, 20.0, True)
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..ir.topology import Topology
from . import bounds, progress
from .switches import Indexed

__all__ = ["PackedTree", "Packing", "PackError", "pack_broadcast", "pack_allgather", "min_arborescence",
           "clear_cache"]

_INF = math.inf
# relative reduced-cost tolerance of column generation (capacities are scaled to <= 1)
_EPS = 1e-9
# CP-SAT few-trees search is tried up to this many ranks and tree slots (model size)
# (at 32 ranks, the 4x8 cluster, CP-SAT found no solution within 6 s even when restricted
# to the LP's edges)
_FEW_MAX_RANKS = 16
_FEW_MAX_SLOTS = 8
# joint allgather search (N roots x slots x edges booleans): DGX-1's 8 ranks is the size
# that still answers within its 0.3 s budget
_FEW_MAX_ALLGATHER_RANKS = 8
# CP-SAT budgets in *deterministic* seconds (OR-Tools' work measure, about a second of an
# idle core; at load average 10 on this 2-core machine one took 5.5 s of wall time).
# Allgather: the joint model on DGX-1's NVLinks finds 14 trees (LP: 31) within 0.1 (13 within
# 0.25); with the PCIe switches it finds none even in 3 (nor with a 1 GB/s quantum and the
# rate rounded down), so a larger budget only costs time: 0.1
_FEW_ALLGATHER_BUDGET_S = 0.1
# ... and the joint model is skipped above this many candidate rank edges: DGX-1's NVLinks
# give 32 (solved), with its PCIe switches 67 (never solved), the 5-rank samples fewer
_FEW_MAX_ALLGATHER_EDGES = 48
# Broadcast/reduce: DGX-1 proves 4 trees optimal in 0.016, with its PCIe switches (quantum
# 1 GB/s) 5 trees in 0.10-0.14; 0.5 keeps every sample's search finishing, so deterministic
_FEW_BROADCAST_BUDGET_S = 0.5
# column generation stops after this many pricing rounds (a count, not a clock, so results
# depend on the input only); the samples converge within 30 (32-rank cluster broadcast)
_MAX_ROUNDS = 500
# wall-clock seconds after which a pack gives up whatever it has: a safety net only, far above
# normal times (the slowest sample packs in 1.3 s of CPU); when it fires ``method`` says so
_WALL_SAFETY_S = 120.0
# packs of more than _SHALLOW_MIN_RANKS and at most _SHALLOW_MAX_RANKS ranks seed their LP
# with greedy shallow trees (an O(n^3) construction), the others with ring chains. Measured
# (efficiency with chains -> with shallow seeds): 32-rank cluster allgather 0.488 -> 0.541,
# broadcast 0.283 -> 0.318; but on DGX-1 (8 ranks, where the LP and CP-SAT reshape the trees
# anyway) reduce_scatter 0.439 -> 0.373, so small packs keep the chains
_SHALLOW_MIN_RANKS = 16
_SHALLOW_MAX_RANKS = 64
# the greedy charges a parent's depth like this many uses of the widest link (16: the
# 32-rank cluster's seeds are 3-5 deep and give 0.541; 4 gave 0.535 and 1 gave 0.527)
_DEPTH_COST = 16.0
# extra improving columns per single-root pricing round (see _more_columns)
_EXTRA_COLUMNS = 3
# broadcast/reduce packs of more than _LARGE_BROADCAST_RANKS ranks stop column generation
# after _LARGE_BROADCAST_ROUNDS pricing rounds unless it converges first (the rate reached is
# reported with its gap): on 64 DGX-1s (512 ranks) a round costs 2 s idle, 6 s at load 26,
# and the rate climbs slowly (24 GB/s after 1 round, 33 after 15, of a 48 GB/s bound); the
# fat trees' chains meet their bound without any round
_LARGE_BROADCAST_RANKS = 128
_LARGE_BROADCAST_ROUNDS = 12
# allgather packs of more than this many ranks whose hosts are translates of one another
# solve the host-symmetric master (:func:`_colgen_symmetric`): one root per host slot is
# priced per round, 8 on 64 DGX-1s instead of 512 (the plain master took 77 s per round
# there); the samples up to the 128-rank fat tree keep the plain master and their trees
_SYMMETRY_MIN_RANKS = 129


class PackError(ValueError):
    """No spanning tree exists (a rank unreachable from a root through the collective's
    ranks and switches), or the solver failed."""


@dataclass(frozen=True)
class PackedTree:
    root: str
    # (parent_rank, child_rank, vertex path parent..child through switches only), parents first
    edges: tuple[tuple[str, str, tuple[str, ...]], ...]
    rate: float  # bytes/s this tree carries


@dataclass(frozen=True)
class Packing:
    roots: tuple[str, ...]  # one root (broadcast/reduce) or every rank (allgather-like)
    trees: tuple[PackedTree, ...]
    rate: float  # broadcast: total bytes/s; allgather: per-root bytes/s (each root's rate)
    bound: float  # the same quantity's upper bound from bounds.py
    lp_rate: float  # LP optimum (before the few-trees step)
    gap: float  # 1 - rate/bound
    solve_s: float
    method: str = ""  # how the trees were obtained, e.g. "colgen+cpsat(optimal)"
    lp_trees: int = 0  # trees in the LP solution before the few-trees step


# ----------------------------------------------------------------------------------------
# minimum-cost arborescence (Chu-Liu 1965 / Edmonds 1967) on a dense cost matrix


def min_arborescence(cost, root: int) -> list[int] | None:
    """Parent list of a minimum-cost spanning arborescence of the complete digraph whose arc
    ``u -> v`` costs ``cost[u][v]`` (inf = absent); ``parent[root] = -1``. None if some vertex
    is unreachable.

    >>> min_arborescence([[0, 1, 5], [9, 0, 1], [1, 1, 0]], 0)
    [-1, 0, 1]
    """
    w = np.array(cost, dtype=float)
    n = w.shape[0]
    if n == 1:
        return [-1]
    w[:, root] = _INF
    np.fill_diagonal(w, _INF)
    par = _edmonds(w, root)
    return None if par is None else [int(p) for p in par]


def _edmonds(w: np.ndarray, root: int):
    n = w.shape[0]
    par = np.argmin(w, axis=0)
    inw = w[par, np.arange(n)]
    par[root] = -1
    inw[root] = 0.0
    if not np.all(np.isfinite(inw)):
        return None
    color = [-1] * n
    cyc_id = np.full(n, -1)
    cycles: list[list[int]] = []
    for s in range(n):
        v, seen = s, []
        while v != -1 and color[v] == -1:
            color[v] = s
            seen.append(v)
            v = int(par[v])
        if v != -1 and color[v] == s:
            cyc, u = [], v
            while True:
                cyc.append(u)
                cyc_id[u] = len(cycles)
                u = int(par[u])
                if u == v:
                    break
            cycles.append(cyc)
    if not cycles:
        return par
    group = np.empty(n, dtype=int)
    gid = 0
    for v in range(n):
        if cyc_id[v] == -1:
            group[v] = gid
            gid += 1
    for cyc in cycles:
        for v in cyc:
            group[v] = gid
        gid += 1
    members = [[] for _ in range(gid)]
    for v in range(n):
        members[group[v]].append(v)
    adj = w - np.where(cyc_id >= 0, inw, 0.0)[None, :]
    adj[group[:, None] == group[None, :]] = _INF
    order = np.argsort(group, kind="stable")
    starts = np.searchsorted(group[order], np.arange(gid))
    small = np.minimum.reduceat(np.minimum.reduceat(adj[order][:, order], starts, axis=0), starts, axis=1)
    sub = _edmonds(small, int(group[root]))
    if sub is None:
        return None
    result = par.copy()
    for b in range(gid):
        a = int(sub[b])
        if a == -1:
            continue
        ma, mb = members[a], members[b]
        if len(ma) == 1 and len(mb) == 1:  # most groups are single vertices: no search
            result[mb[0]] = ma[0]
        elif len(ma) == 1:
            result[mb[int(np.argmin(adj[ma[0], mb]))]] = ma[0]
        elif len(mb) == 1:
            result[mb[0]] = ma[int(np.argmin(adj[ma, mb[0]]))]
        else:
            block = adj[ma][:, mb]
            i, j = divmod(int(np.argmin(block)), len(mb))
            result[mb[j]] = ma[i]
    result[root] = -1
    return result


# ----------------------------------------------------------------------------------------
# trees as columns


@dataclass(frozen=True)
class _Col:
    root: int  # rank position
    parent: tuple[int, ...]  # rank positions, -1 at the root
    paths: tuple[tuple[int, ...], ...]  # per rank position: vertex path parent..child (() at root)
    usage: tuple[tuple[int, int], ...]  # (link index, times used)

    def load(self, nlinks: int) -> np.ndarray:
        u = np.zeros(nlinks)
        for li, k in self.usage:
            u[li] += k
        return u


class _Pricer:
    """Prices trees on the rank closure of one Indexed topology."""

    def __init__(self, ix: Indexed):
        self.ix = ix
        self.n = len(ix.ranks)
        self.link_of = ix.link_of()
        self.direct = not ix.has_switches
        self.cap = np.array([c for _, _, c in ix.links], dtype=float)

    def matrix(self, y: np.ndarray):
        """``(w, route)``: the n x n closure cost matrix under link costs y and
        ``route(i, j)``, the vertex path of a cheapest route from rank i to rank j."""
        ix, n = self.ix, self.n
        y = np.asarray(y, dtype=float)
        if self.direct:
            w = np.full((n, n), _INF)
            pos = {v: j for j, v in enumerate(ix.ranks)}
            for li, (a, b, _) in enumerate(ix.links):
                if a in pos and b in pos:
                    w[pos[a], pos[b]] = min(w[pos[a], pos[b]], y[li])
            ranks = ix.ranks
            return w, lambda i, j: (ranks[i], ranks[j]) if math.isfinite(w[i, j]) else None
        # a hop costs at least 1e-9 of the dearest link, so routes through zero-dual links
        # never take detours; the 1e-9 is within the pricing test's relative tolerance
        top = float(y.max()) if len(y) and y.max() > 0 else 1.0
        return ix.closure_matrix(y + 1e-9 * top)

    def tree(self, w, route, root: int) -> _Col | None:
        par = min_arborescence(w, root)
        if par is None:
            return None
        tpaths, use = [], {}
        for v, p in enumerate(par):
            if p == -1:
                tpaths.append(())
                continue
            path = route(p, v)
            tpaths.append(path)
            for a, b in zip(path, path[1:]):
                li = self.link_of[(a, b)]
                use[li] = use.get(li, 0) + 1
        return _Col(root, tuple(par), tuple(tpaths), tuple(sorted(use.items())))


def _unreachable(ix: Indexed, pricer: _Pricer, root: int) -> PackError:
    w, _ = pricer.matrix(np.ones(len(ix.links)))
    seen, stack = {root}, [root]
    while stack:
        u = stack.pop()
        for v in range(pricer.n):
            if v not in seen and math.isfinite(w[u, v]):
                seen.add(v)
                stack.append(v)
    lost = [ix.vertices[ix.ranks[v]] for v in range(pricer.n) if v not in seen]
    name = ix.vertices[ix.ranks[root]]
    way = "to" if ix.reverse else "from"
    return PackError(f"ranks {lost} cannot be reached {way} {name!r} through the collective's ranks and switches")


# ----------------------------------------------------------------------------------------
# column generation


class _Master:
    """The restricted master LP over the columns so far (GLOP), rebuilt cold when needed.

    Broadcast: max sum_T w_T s.t. sum_T load_T(e) w_T <= c(e). Allgather: max x s.t. the same
    link rows and x - sum_{T rooted at r} w_T <= 0 for every root r. Capacities are divided
    by the largest one, so every coefficient is a small integer and every bound is <= 1.
    """

    def __init__(self, capn: np.ndarray, roots: list[int]):
        self.capn = capn
        self.roots = roots
        self.equal = len(roots) > 1
        self.cols: list[_Col] = []
        self.keys: set = set()
        self._build()

    def _build(self) -> None:
        from ortools.linear_solver import pywraplp

        solver = pywraplp.Solver.CreateSolver("GLOP")
        if solver is None:
            raise PackError("OR-Tools GLOP is not available")
        # presolve on warm re-solves of these degenerate masters ended ABNORMAL 20 times in
        # 170 rounds on the 32-rank cluster; without it, twice
        solver.SetSolverSpecificParametersAsString("use_preprocessing: false")
        inf = solver.infinity()
        self.solver = solver
        self.rows = [solver.Constraint(-inf, float(c)) for c in self.capn]
        self.x = solver.NumVar(0.0, inf, "x") if self.equal else None
        self.root_rows = {}
        self.obj = solver.Objective()
        self.obj.SetMaximization()
        if self.equal:
            self.obj.SetCoefficient(self.x, 1.0)
            for r in self.roots:
                ct = solver.Constraint(-inf, 0.0)
                ct.SetCoefficient(self.x, 1.0)
                self.root_rows[r] = ct
        self.vars = []
        for col in self.cols:
            self._var(col)

    def _var(self, col: _Col) -> None:
        v = self.solver.NumVar(0.0, self.solver.infinity(), "")
        for li, k in col.usage:
            self.rows[li].SetCoefficient(v, float(k))
        if self.equal:
            self.root_rows[col.root].SetCoefficient(v, -1.0)
        else:
            self.obj.SetCoefficient(v, 1.0)
        self.vars.append(v)

    def add(self, col: _Col) -> bool:
        key = (col.root, col.parent, col.paths)
        if key in self.keys:
            return False
        self.keys.add(key)
        self.cols.append(col)
        self._var(col)
        return True

    def solve(self) -> None:
        from ortools.linear_solver import pywraplp

        status = self.solver.Solve()
        if status == pywraplp.Solver.ABNORMAL:
            # GLOP's warm re-solve after added columns can end ABNORMAL on these degenerate
            # masters (seen on the 32-rank cluster after 97 columns); a cold model recovers
            self._build()
            status = self.solver.Solve()
        if status != pywraplp.Solver.OPTIMAL:
            raise PackError(f"GLOP did not solve the tree packing master LP (status {status})")

    def duals(self):
        y = np.array([max(0.0, abs(ct.dual_value())) for ct in self.rows])
        if self.equal:
            return y, {r: abs(self.root_rows[r].dual_value()) for r in self.roots}
        return y, {self.roots[0]: 1.0}

    def weights(self) -> list[float]:
        return [max(0.0, v.solution_value()) for v in self.vars]

    def objective(self) -> float:
        return self.x.solution_value() if self.equal else sum(self.weights())


def _more_columns(pricer: _Pricer, master: _Master, y: np.ndarray, col: _Col, threshold: float) -> None:
    """Add up to _EXTRA_COLUMNS more improving trees in this round: price again with the
    links of the trees just found made dearer, keep a tree only if its reduced cost under the
    true duals y is still below the threshold (so every column is a valid improving one).
    A single-root master gains one column per LP solve otherwise: 162 rounds on a 256-rank
    torus in 8 s, each a 15 ms LP."""
    bump = float(y.max()) if y.max() > 0 else 1.0
    load = col.load(len(y))
    for _ in range(_EXTRA_COLUMNS):
        w, route = pricer.matrix(y + bump * load / pricer.cap * pricer.cap.max())
        nxt = pricer.tree(w, route, col.root)
        if nxt is None:
            return
        load = load + nxt.load(len(y))
        if sum(k * y[li] for li, k in nxt.usage) < threshold * (1.0 - _EPS):
            master.add(nxt)


def _colgen(ix: Indexed, pricer: _Pricer, roots: list[int], deadline: float, bound: float,
            seeds: list[_Col] = (), max_rounds: int = 0):
    """Exact column generation. Returns (weights per column in scaled units, columns,
    objective in scaled units, scale in bytes/s, stop) where ``stop`` is "" when converged,
    "round limit" or "wall-clock safety net".

    Stops when no tree prices below its threshold (LP duality: optimal) or as soon as the
    objective meets the cut ``bound`` (bytes/s) to 1e-9 relative, which proves it optimal too.
    Otherwise after ``max_rounds`` pricing rounds (default :data:`_MAX_ROUNDS`): a count, so
    the columns, and everything built on them, depend on the input only. The wall-clock
    ``deadline`` is a safety net far above normal times; when it fires, ``stop`` says so.
    """
    scale = float(pricer.cap.max())
    capn = pricer.cap / scale
    master = _Master(capn, roots)
    for col in seeds:
        master.add(col)
    bare = [r for r in roots if not any(c.root == r for c in seeds)]
    w0, p0 = pricer.matrix(1.0 / capn) if bare else (None, None)
    for r in bare:
        col = pricer.tree(w0, p0, r)
        if col is None:
            raise _unreachable(ix, pricer, r)
        master.add(col)
    stop = "round limit"
    limit = max_rounds or _MAX_ROUNDS
    for k in range(limit):  # each round adds >= 1 column
        progress.report("pack", "pricing round", k + 1, limit)
        master.solve()
        if master.objective() * scale >= bound * (1.0 - 1e-9):
            stop = ""
            break
        y, z = master.duals()
        w, paths = pricer.matrix(y)
        added = False
        for r in roots:
            col = pricer.tree(w, paths, r)
            if col is None:
                raise _unreachable(ix, pricer, r)
            cost = sum(k * y[li] for li, k in col.usage)
            if cost < z[r] * (1.0 - _EPS) and master.add(col):
                added = True
                if len(roots) == 1:
                    _more_columns(pricer, master, y, col, z[r])
            if added and time.perf_counter() > deadline:
                break  # safety net only: a round that outlasts it stops mid-round
        if not added:
            stop = ""
            break
        if time.perf_counter() > deadline:
            stop = "wall-clock safety net"
            break
    else:
        master.solve()  # the last round's columns enter the LP
        return master.weights(), master.cols, master.objective(), scale, stop
    if stop:
        master.solve()
    return master.weights(), master.cols, master.objective(), scale, stop


# ----------------------------------------------------------------------------------------
# few trees with CP-SAT


def _frac_gcd(a: Fraction, b: Fraction) -> Fraction:
    return Fraction(math.gcd(a.numerator * b.denominator, b.numerator * a.denominator),
                    a.denominator * b.denominator)


def _quanta(cap: np.ndarray, rate: Fraction | None = None) -> list[Fraction]:
    """Rate quanta to try, in bytes/s: the largest q dividing every whole-byte capacity (and
    the exact target ``rate`` when given), then q/2 and q/4. DGX-1 broadcast needs only
    q = 25 GB/s; its allgather rate 150/7 GB/s gives q = 25/7 GB/s."""
    if not (all(float(c).is_integer() for c in cap) and cap.max() < 2**62):
        return []
    g = Fraction(0)
    for c in cap:
        g = _frac_gcd(g, Fraction(int(c)))
    if rate is not None:
        g = _frac_gcd(g, rate)
    return [g / d for d in (1, 2, 4)]


def _few_trees(ix: Indexed, pricer: _Pricer, roots: list[int], cols, weights, target_rate: float,
               exact_rate: Fraction | None, deadline: float, scale: float, budget: float):
    """CP-SAT: the fewest arborescences (of its own making) such that every root in ``roots``
    gets at least ``target_rate`` bytes/s (one root: broadcast; every rank: allgather).

    Each root has tree slots; slot k is a set of binary rank edges with in-degree 1 at every
    non-root rank and a single-commodity flow from the root (so it is a spanning arborescence
    when used), with an integer weight in quanta; link rows bound the summed weights.
    Returns ``([(col, rate bytes/s), ...], method)`` or ``(None, reason)``.
    """
    from ortools.sat.python import cp_model

    n = pricer.n
    lp_count = {r: 0 for r in roots}
    for c, w in zip(cols, weights):
        if w > 1e-12:
            lp_count[c.root] += 1
    used_lp = sum(lp_count.values())
    if n > _FEW_MAX_RANKS or (len(roots) > 1 and n > _FEW_MAX_ALLGATHER_RANKS):
        return None, f"lp(cpsat skipped: {n} ranks)"
    if used_lp <= len(roots):
        return None, "lp(already one tree per root)"
    quanta = _quanta(pricer.cap, exact_rate)
    if not quanta:
        return None, "lp(cpsat skipped: capacities not whole bytes/s)"
    # candidate rank edges: every routed edge of a column the LP generated (weighted or not).
    # Adding each pair's fewest-hop route as well doubled the search: DGX-1 broadcast proved
    # 5 trees optimal in 0.119 deterministic s with them, 0.055 without, and the 16-rank
    # two-host broadcast needed 0.67 with them, 0.19 without, for the same 8 trees
    cand: dict[tuple[int, int, tuple[int, ...]], None] = {}
    for c, w in zip(cols, weights):
        for v, p in enumerate(c.parent):
            if p != -1:
                cand[(p, v, c.paths[v])] = None
    if len(roots) > 1 and len(cand) > _FEW_MAX_ALLGATHER_EDGES:
        return None, f"lp(cpsat skipped: {len(cand)} candidate edges)"
    reason = "lp(cpsat found no fewer trees)"
    spent = 0.0  # deterministic seconds used by earlier quanta
    for q in quanta:
        remaining = deadline - time.perf_counter()
        if remaining <= 0.005:
            return None, "lp(cpsat stopped by the wall-clock safety net)"
        if budget - spent <= 1e-3:
            return None, "lp(cpsat out of budget)"
        units = [int(Fraction(int(c)) / q) for c in pricer.cap]
        if isinstance(target_rate, Fraction):
            target = math.ceil(target_rate / q)
        else:
            target = math.ceil(target_rate / float(q) - 1e-9)
        wmax = max(1, min(target, max(units)))
        m = cp_model.CpModel()
        slots = []  # (root, used, weight, edge list, edge bools)
        loads: dict[int, list] = {}
        for r in roots:
            edges = [e for e in cand if e[1] != r]
            k_r = min(lp_count[r] if len(roots) > 1 else lp_count[r] - 1, _FEW_MAX_SLOTS)
            # hint: the root's heaviest LP trees, weights rounded to quanta (not feasible in
            # general, but it steers the first solution: on DGX-1 with PCIe switches and a
            # 1 GB/s quantum, CP-SAT found none within 1 s without it)
            heavy = sorted(((w, c) for c, w in zip(cols, weights) if c.root == r and w > 1e-12),
                           key=lambda p: -p[0])
            prev = None
            wsum = []
            for k in range(max(1, k_r)):
                used = m.NewBoolVar("")
                wt = m.NewIntVar(0, wmax, "")
                xs = [m.NewBoolVar("") for _ in edges]
                fl = [m.NewIntVar(0, n - 1, "") for _ in edges]
                m.Add(wt <= wmax * used)
                m.Add(wt >= used)
                into: list[list[int]] = [[] for _ in range(n)]
                outof: list[list[int]] = [[] for _ in range(n)]
                for i, (a, b, path) in enumerate(edges):
                    m.Add(fl[i] <= (n - 1) * xs[i])
                    m.AddImplication(xs[i], used)
                    into[b].append(i)
                    outof[a].append(i)
                    y = m.NewIntVar(0, wmax, "")
                    m.Add(y == wt).OnlyEnforceIf(xs[i])
                    m.Add(y == 0).OnlyEnforceIf(xs[i].Not())
                    for a2, b2 in zip(path, path[1:]):
                        loads.setdefault(pricer.link_of[(a2, b2)], []).append(y)
                for v in range(n):
                    if v == r:
                        m.Add(sum(fl[i] for i in outof[v]) - sum(fl[i] for i in into[v]) == (n - 1) * used)
                    else:
                        m.Add(sum(xs[i] for i in into[v]) == used)
                        m.Add(sum(fl[i] for i in into[v]) - sum(fl[i] for i in outof[v]) == used)
                if prev is not None:  # a root's slots are interchangeable: order them
                    m.Add(used <= prev[0])
                    m.Add(wt <= prev[1])
                prev = (used, wt)
                wsum.append(wt)
                slots.append((r, used, wt, edges, xs))
                if k < len(heavy):
                    w_lp, c_lp = heavy[k]
                    mine = {(c_lp.parent[v], v, c_lp.paths[v]) for v in range(n) if c_lp.parent[v] != -1}
                    m.AddHint(used, True)
                    m.AddHint(wt, max(1, min(wmax, round(w_lp * scale / float(q)))))
                    for i, e in enumerate(edges):
                        m.AddHint(xs[i], e in mine)
                else:
                    m.AddHint(used, False)
            m.Add(sum(wsum) >= target)
        for li, ys in loads.items():
            m.Add(sum(ys) <= units[li])
        m.Minimize(sum(s[1] for s in slots))
        solver = cp_model.CpSolver()
        # a *deterministic* work budget, one worker and a fixed seed: the same program gets
        # the same trees whatever the machine's load (golden tests compare tree counts). The
        # wall-clock limit is only a safety net (the whole pack's time_limit, 120 s by
        # default, against 0.5 s budgets that take 0.4-5.5 s of wall time even at load 10);
        # when it fires the method says so, since the result then depends on the machine
        progress.report("pack", f"few trees (CP-SAT, quantum {float(q):.6g} B/s)")
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 1
        solver.parameters.max_deterministic_time = budget - spent
        solver.parameters.max_time_in_seconds = max(0.005, remaining)
        st = solver.Solve(m)
        spent += solver.deterministic_time
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if st == cp_model.UNKNOWN:
                if time.perf_counter() >= deadline - 0.005:
                    return None, "lp(cpsat stopped by the wall-clock safety net)"
                reason = "lp(cpsat out of budget)"
            continue
        count = sum(solver.Value(s[1]) for s in slots)
        if count >= used_lp:
            return None, reason
        status = "optimal" if st == cp_model.OPTIMAL else "best within budget"
        out = []
        for r, used, wt, edges, xs in slots:
            if not solver.Value(used):
                continue
            par, paths, use = [-1] * n, [()] * n, {}
            for i, (a, b, path) in enumerate(edges):
                if solver.Value(xs[i]):
                    par[b], paths[b] = a, path
                    for a2, b2 in zip(path, path[1:]):
                        li = pricer.link_of[(a2, b2)]
                        use[li] = use.get(li, 0) + 1
            col = _Col(r, tuple(par), tuple(paths), tuple(sorted(use.items())))
            out.append((col, solver.Value(wt) * float(q)))
        return out, f"colgen+cpsat({status}, quantum {float(q):.6g} B/s)"
    return None, reason


# ----------------------------------------------------------------------------------------
# results


def _to_tree(ix: Indexed, col: _Col, rate: float) -> PackedTree:
    from operator import itemgetter

    names = ix.vertices
    rank_name = [names[v] for v in ix.ranks]
    par = col.parent
    kids: list[list[int]] = [[] for _ in par]
    for v, p in enumerate(par):
        if p != -1:
            kids[p].append(v)
    order = [col.root]  # breadth first: parents before children
    for u in order:
        order.extend(kids[u])
    # itemgetter maps a whole path at C speed (a path has >= 2 vertices, so it gives a
    # tuple): 512-rank allgather packings have 262 144 edges
    edges = tuple((rank_name[par[v]], rank_name[v], itemgetter(*col.paths[v])(names)) for v in order[1:])
    return PackedTree(root=rank_name[col.root], edges=edges, rate=rate)


def _fit(pricer: _Pricer, pairs):
    """Scale every rate by the same factor <= 1 so no link is loaded above its capacity:
    GLOP's feasibility tolerance (1e-7 on capacities scaled to 1) could otherwise overload a
    link by a hair. A factor below 1 - 1e-6 would mean a wrong packing, not rounding."""
    load = np.zeros(len(pricer.cap))
    for col, rate in pairs:
        load += col.load(len(pricer.cap)) * rate
    busy = load > 0
    worst = float(np.max(load[busy] / pricer.cap[busy])) if busy.any() else 0.0
    if worst > 1.0 + 1e-6:
        raise PackError(f"internal: packed trees load a link to {worst:.6g}x its capacity")
    if worst <= 1.0:
        return pairs
    return [(c, r / worst) for c, r in pairs]


def _memo(fn, args):
    try:
        hash(args)
    except TypeError:  # a Topology built with lists instead of tuples: solve, do not memoise
        return fn.__wrapped__(*args)
    return fn(*args)


def clear_cache() -> None:
    """Forget memoised packings (benchmarks that time the solver call this first)."""
    _pack_broadcast.cache_clear()
    _pack_allgather.cache_clear()


def pack_broadcast(topo: Topology, ranks, root: str, *, reverse: bool = False, few_trees: bool = True,
                   tolerance: float = 0.0, time_limit: float = _WALL_SAFETY_S,
                   few_trees_time: float = _FEW_BROADCAST_BUDGET_S) -> Packing:
    """Pack out-trees rooted at ``root`` (in-trees for reduce with ``reverse=True``) spanning
    ``ranks``, maximising the total rate; then, with ``few_trees``, CP-SAT searches (for at
    most ``few_trees_time`` deterministic seconds, so results do not depend on machine load)
    for the fewest trees keeping rate >= (1 - tolerance) x the LP optimum. ``time_limit``
    (wall-clock seconds) is only a safety net over the whole call.

    Results are memoised per arguments (Topology and Packing are frozen values): broadcast,
    scatter, reduce and gather of one program often ask for the same packing, and the same
    question then gets the same trees."""
    args = (topo, tuple(ranks), root, reverse, few_trees, float(tolerance), float(time_limit), float(few_trees_time))
    return _memo(_pack_broadcast, args)


@functools.lru_cache(maxsize=64)
def _pack_broadcast(topo: Topology, ranks: tuple[str, ...], root: str, reverse: bool, few_trees: bool,
                    tolerance: float, time_limit: float, few_trees_time: float) -> Packing:
    t0 = time.perf_counter()
    if root not in ranks:
        raise PackError(f"root {root!r} is not one of the ranks")
    ix = Indexed.build(topo, ranks, reverse=reverse)
    bound = (bounds.reduce_rate_bound if reverse else bounds.broadcast_rate_bound)(topo, ranks, root)
    r = ranks.index(root)
    if len(ranks) == 1:
        tree = PackedTree(root=root, edges=(), rate=math.inf)
        return Packing((root,), (tree,), math.inf, math.inf, math.inf, 0.0, time.perf_counter() - t0, "trivial", 1)
    if not ix.links:
        raise PackError(f"no links among the ranks {list(ranks)}")
    pricer = _Pricer(ix)
    deadline = t0 + time_limit
    seeds = _seed_columns(ix, pricer, [r])
    rounds = _LARGE_BROADCAST_ROUNDS if len(ranks) > _LARGE_BROADCAST_RANKS else 0
    weights, cols, obj, scale, stop = _colgen(ix, pricer, [r], deadline, bound, seeds, rounds)
    lp_rate = obj * scale
    pairs = [(c, w * scale) for c, w in zip(cols, weights) if w * scale > lp_rate * 1e-12]
    method = f"colgen({stop})" if stop else "colgen"
    lp_trees = len(pairs)
    if few_trees and lp_trees > 1:
        got, note = _few_trees(ix, pricer, [r], cols, weights, (1.0 - tolerance) * lp_rate, None,
                               deadline, scale, few_trees_time)
        if got is not None:
            pairs = got
        method = note if got is not None else f"{method}+{note}"
    pairs = _fit(pricer, pairs)
    rate = sum(w for _, w in pairs)
    trees = tuple(_to_tree(ix, c, w) for c, w in pairs)
    gap = 1.0 - rate / bound if bound > 0 and math.isfinite(bound) else 0.0
    return Packing((root,), trees, rate, bound, lp_rate, gap, time.perf_counter() - t0, method, lp_trees)


def _seed_columns(ix: Indexed, pricer: _Pricer, roots: list[int]) -> list[_Col]:
    """The first columns of a pack: greedy shallow trees (:func:`_shallow_columns`) for
    ``_SHALLOW_MIN_RANKS < n <= _SHALLOW_MAX_RANKS`` ranks, ring chains otherwise."""
    if _SHALLOW_MIN_RANKS < pricer.n <= _SHALLOW_MAX_RANKS:
        return _shallow_columns(ix, pricer, roots)
    return _ring_columns(ix, pricer, roots)


def _shallow_columns(ix: Indexed, pricer: _Pricer, roots: list[int]) -> list[_Col]:
    """Per root, a greedy shallow tree (Prim-like): repeatedly attach the rank whose route
    from a rank already in the tree is cheapest, pricing a route at ``sum (uses + 1) / c(e)``
    over its links (uses by this tree and by the seeds of earlier roots, so later roots
    avoid loaded links: every root of an allgather carries the same rate) plus
    ``_DEPTH_COST / max c`` per level of its parent. On the 32-rank cluster a root reaches its
    host's ranks through the NVSwitch and other hosts through several NICs, 3-5 levels deep
    (its ring chains were 31). Routes are the fewest-hop widest ones; prices only grow, so a
    stale heap entry is re-priced when popped."""
    import heapq

    n = pricer.n
    cap = pricer.cap
    _, route = pricer.matrix(1.0 / (cap / cap.max()) + 1e-3)
    link_of = pricer.link_of
    hop: list[list[tuple[tuple[int, ...], tuple[int, ...]] | None]] = [[None] * n for _ in range(n)]
    for u in range(n):
        for v in range(n):
            if u != v:
                path = route(u, v)
                if path is not None:
                    hop[u][v] = (tuple(path), tuple(link_of[(a, b)] for a, b in zip(path, path[1:])))
    load = np.zeros(len(cap))
    depth_cost = _DEPTH_COST / float(cap.max())
    cols = []
    for r in roots:
        depth = {r: 0}
        par, tp = [-1] * n, [()] * n
        use: dict[int, int] = {}
        heap: list[tuple[float, int, float, int, int, int]] = []
        seq = 0

        def price(u: int, v: int) -> tuple[float, int, float]:
            k = sum((load[e] + 1.0) / cap[e] for e in hop[u][v][1])
            return (k + depth_cost * depth[u], depth[u], k)

        def offer(u: int) -> None:
            nonlocal seq
            for v in range(n):
                if v not in depth and hop[u][v] is not None:
                    heapq.heappush(heap, (*price(u, v), seq, v, u))
                    seq += 1

        offer(r)
        while heap and len(depth) < n:
            *k, _, v, u = heapq.heappop(heap)
            if v in depth:
                continue
            k2 = price(u, v)
            if k2 > tuple(k):  # its links were loaded since this offer
                heapq.heappush(heap, (*k2, seq, v, u))
                seq += 1
                continue
            path, links = hop[u][v]
            depth[v], par[v], tp[v] = depth[u] + 1, u, path
            for e in links:
                load[e] += 1.0
                use[e] = use.get(e, 0) + 1
            offer(v)
        if len(depth) == n:
            cols.append(_Col(r, tuple(par), tuple(tp), tuple(sorted(use.items()))))
    return cols


def _ring_order(ix: Indexed) -> list[int]:
    """Rank positions in depth-first order over the undirected topology (ranks that share a
    switch or host end up adjacent, so a ring over them crosses few uplinks)."""
    nbr: dict[int, set[int]] = {}
    for a, b, _ in ix.links:
        nbr.setdefault(a, set()).add(b)
        nbr.setdefault(b, set()).add(a)
    pos = {v: j for j, v in enumerate(ix.ranks)}
    order, seen, stack = [], set(), [ix.ranks[0]]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u in pos:
            order.append(pos[u])
        stack.extend(sorted(nbr.get(u, ()), key=lambda v: (-(v in pos), -v)))
    order += [j for j in range(len(ix.ranks)) if j not in set(order)]
    return order


def _ring_columns(ix: Indexed, pricer: _Pricer, roots: list[int] | None = None) -> list[_Col]:
    """Per root, the chain along the ring order in each direction, each hop routed by the
    fewest-hop, widest switch-only path. The chain rooted at order[s] is the ring minus the
    hop into order[s], so each ring hop is routed once: O(n) routes, not O(n^2)."""
    n = pricer.n
    want = set(range(n) if roots is None else roots)
    _, route = pricer.matrix(1.0 / (pricer.cap / pricer.cap.max()) + 1e-3)
    cols = []
    for order in (_ring_order(ix), list(reversed(_ring_order(ix)))):
        hops = [route(order[i], order[(i + 1) % n]) for i in range(n)]
        if any(h is None for h in hops):
            continue
        hop_use = []
        total: dict[int, int] = {}
        for h in hops:
            u: dict[int, int] = {}
            for x, y in zip(h, h[1:]):
                li = pricer.link_of[(x, y)]
                u[li] = u.get(li, 0) + 1
                total[li] = total.get(li, 0) + 1
            hop_use.append(u)
        parent_of = {order[(i + 1) % n]: (order[i], hops[i], hop_use[i]) for i in range(n)}
        for s_ in range(n):
            r = order[s_]
            if r not in want:
                continue
            par, tp = [-1] * n, [()] * n
            for v, (u, h, _) in parent_of.items():
                if v != r:
                    par[v], tp[v] = u, h
            use = dict(total)
            for li, k in parent_of[r][2].items():
                use[li] -= k
            cols.append(_Col(r, tuple(par), tuple(tp), tuple(sorted((li, k) for li, k in use.items() if k))))
    return cols


def _btree_columns(ix: Indexed, pricer: _Pricer, roots: list[int]) -> list[_Col]:
    """Per root, the "lowest set bit" binary tree (NCCL's double-binary-tree shape) over the
    ring order rotated to start at the root, in both directions: position p > 0 hangs from
    (p xor b) | (b << 1), b the lowest set bit of p (p xor b when that is past the end), so
    a parent's children sit near it in the order (same host or rack) and the depth is
    log2(n): 10 levels for 1024 ranks where a chain has 1023."""
    n = pricer.n
    _, route = pricer.matrix(1.0 / (pricer.cap / pricer.cap.max()) + 1e-3)
    up = [-1] * n
    for q in range(1, n):
        b = q & -q
        up[q] = (q ^ b) | (b << 1) if ((q ^ b) | (b << 1)) < n else q ^ b
    cols = []
    for order in (_ring_order(ix), list(reversed(_ring_order(ix)))):
        where = {v: i for i, v in enumerate(order)}
        for r in roots:
            s = where[r]
            rot = order[s:] + order[:s]
            par, tp, use = [-1] * n, [()] * n, {}
            for q in range(1, n):
                a, v = rot[up[q]], rot[q]
                path = route(a, v)
                if path is None:
                    break
                par[v], tp[v] = a, path
                for x, y in zip(path, path[1:]):
                    li = pricer.link_of[(x, y)]
                    use[li] = use.get(li, 0) + 1
            else:
                cols.append(_Col(r, tuple(par), tuple(tp), tuple(sorted(use.items()))))
    return cols


def _depth(col: _Col) -> int:
    """Levels of a tree: the longest parent chain from a rank to the root."""
    memo = {col.root: 0}

    def level(v: int) -> int:
        chain = []
        while v not in memo:
            chain.append(v)
            v = col.parent[v]
        d = memo[v]
        for u in reversed(chain):
            d += 1
            memo[u] = d
        return d

    return max(level(v) for v in range(len(col.parent)))


def _equalise(pairs, roots, x: float):
    """Trim each root's trees (largest first) to exactly rate x: the LP and CP-SAT may leave
    a root some slack, and the packing promises every root the same rate."""
    per_root: dict[int, list[tuple[_Col, float]]] = {r: [] for r in roots}
    for c, w in pairs:
        per_root[c.root].append((c, w))
    out = []
    for r in roots:
        left = x
        for c, w in sorted(per_root[r], key=lambda p: -p[1]):
            take = min(w, left)
            if take > x * 1e-12:
                out.append((c, take))
            left -= take
    return out


def pack_allgather(topo: Topology, ranks, *, reverse: bool = False, few_trees: bool = True,
                   tolerance: float = 0.0, time_limit: float = _WALL_SAFETY_S,
                   few_trees_time: float = _FEW_ALLGATHER_BUDGET_S) -> Packing:
    """Out-trees rooted at every rank, every root the same rate x, sharing link capacity
    (ForestColl); ``reverse=True`` packs in-trees for reduce-scatter. ``Packing.rate`` is x.
    With ``few_trees`` (up to 8 ranks) CP-SAT looks, for at most ``few_trees_time``
    deterministic seconds, for fewer trees giving every root at least (1 - tolerance) x the
    LP's rate. Memoised like
    :func:`pack_broadcast` (allreduce and allgather of one program share the packing)."""
    args = (topo, tuple(ranks), reverse, few_trees, float(tolerance), float(time_limit), float(few_trees_time))
    return _memo(_pack_allgather, args)


@functools.lru_cache(maxsize=64)
def _pack_allgather(topo: Topology, ranks: tuple[str, ...], reverse: bool, few_trees: bool, tolerance: float,
                    time_limit: float, few_trees_time: float) -> Packing:
    t0 = time.perf_counter()
    ix = Indexed.build(topo, ranks, reverse=reverse)
    n = len(ranks)
    exact = bounds.allgather_rate_exact(topo, ranks, reverse=reverse) if n > 1 else None
    bound = float(exact) if exact is not None else bounds.allgather_rate_bound(topo, ranks, reverse=reverse)
    if n == 1:
        tree = PackedTree(root=ranks[0], edges=(), rate=math.inf)
        return Packing(ranks, (tree,), math.inf, math.inf, math.inf, 0.0, time.perf_counter() - t0, "trivial", 1)
    if not ix.links:
        raise PackError(f"no links among the ranks {list(ranks)}")
    pricer = _Pricer(ix)
    roots = list(range(n))
    deadline = t0 + time_limit
    sym = _host_symmetry(topo, ranks, ix) if n >= _SYMMETRY_MIN_RANKS else None
    if sym is not None:
        slots = list(sym.slots)
        seeds = _ring_columns(ix, pricer, slots) + _btree_columns(ix, pricer, slots)
        weights, cols, obj, scale, stop = _colgen_symmetric(ix, pricer, sym, deadline, bound, seeds)
        lp_x = obj * scale
        kept = [(c, w * scale) for c, w in zip(cols, weights) if w * scale > lp_x * 1e-12]
        pairs = _equalise([(_translate(c, sym, k), w) for c, w in kept for k in range(len(sym.vperm))],
                          roots, lp_x)
        method = f"colgen-symmetric x{len(sym.vperm)}" + (f"({stop})" if stop else "")
    else:
        seeds = _seed_columns(ix, pricer, roots)
        weights, cols, obj, scale, stop = _colgen(ix, pricer, roots, deadline, bound, seeds)
        method = f"colgen({stop})" if stop else "colgen"
        lp_x = obj * scale
        pairs = _equalise([(c, w * scale) for c, w in zip(cols, weights) if w * scale > lp_x * 1e-12],
                          roots, lp_x)
    lp_trees = len(pairs)
    x = lp_x
    if few_trees and lp_trees > n:
        # the exact target when the LP met the cut bound (then x* is a known fraction)
        at_bound = exact is not None and lp_x >= bound * (1 - 1e-9)
        target = exact * Fraction(1.0 - tolerance) if at_bound else (1.0 - tolerance) * lp_x
        got, note = _few_trees(ix, pricer, roots, cols, weights, target, exact if at_bound else None,
                               deadline, scale, few_trees_time)
        if got is not None:
            x = min(sum(w for c, w in got if c.root == r) for r in roots)
            pairs = _equalise(got, roots, x)
        method = note if got is not None else f"{method}+{note}"
    shrink = _fit(pricer, pairs)
    if shrink is not pairs:
        x *= shrink[0][1] / pairs[0][1]
        pairs = shrink
    trees = tuple(_to_tree(ix, c, w) for c, w in pairs)
    gap = 1.0 - x / bound if bound > 0 and math.isfinite(bound) else 0.0
    return Packing(ranks, trees, x, bound, lp_x, gap, time.perf_counter() - t0, method, lp_trees)


# ----------------------------------------------------------------------------------------
# symmetric allgather packing (hosts that are translates of one another)


@dataclass(frozen=True)
class _Symmetry:
    """The cyclic group of host translations: ``sigma`` maps vertex ``h_i.x`` to ``h_{i+1}.x``
    (hosts in order of first appearance, the last back to the first) and fixes vertices
    outside hosts. Only built when it is an automorphism of the indexed graph (every link
    maps to a link of the same capacity) that maps ranks to ranks."""

    vperm: tuple[tuple[int, ...], ...]  # per power k: vertex index -> vertex index
    rperm: tuple[tuple[int, ...], ...]  # per power k: rank position -> rank position
    lperm: tuple[tuple[int, ...], ...]  # per power k: link index -> link index
    slots: tuple[int, ...]  # rank positions of the first host: one root per orbit
    orbit: tuple[int, ...]  # link index -> link orbit (a row of the symmetric master)
    weight: tuple[int, ...]  # per orbit: H / |orbit|


def _host_symmetry(topo: Topology, ranks: tuple[str, ...], ix: Indexed) -> _Symmetry | None:
    """The host translations of :func:`switches.host_translation` in ``ix``'s indices."""
    from .switches import host_translation

    found = host_translation(topo, ranks)
    if found is None:
        return None
    names, H = found
    index = {v: i for i, v in enumerate(ix.vertices)}
    sigma = [index[names[v]] for v in ix.vertices]
    link_of = ix.link_of()
    pi = [link_of[(sigma[a], sigma[b])] for a, b, _ in ix.links]
    vperm, lperm = [tuple(range(len(sigma)))], [tuple(range(len(pi)))]
    for _ in range(H - 1):
        vperm.append(tuple(sigma[v] for v in vperm[-1]))
        lperm.append(tuple(pi[l] for l in lperm[-1]))
    rpos = {v: j for j, v in enumerate(ix.ranks)}
    rperm = tuple(tuple(rpos[vp[r]] for r in ix.ranks) for vp in vperm)
    orbit = [-1] * len(pi)
    sizes = []
    for li in range(len(pi)):
        if orbit[li] >= 0:
            continue
        k, size = li, 0
        while orbit[k] < 0:
            orbit[k] = len(sizes)
            size += 1
            k = pi[k]
        sizes.append(size)
    host_of = dict(topo.hosts)
    slots = tuple(j for j, v in enumerate(ranks) if host_of[v] == host_of[ranks[0]])
    return _Symmetry(tuple(vperm), rperm, tuple(lperm), slots, tuple(orbit), tuple(H // s for s in sizes))


def _translate(col: _Col, sym: _Symmetry, k: int) -> _Col:
    """The tree ``col`` moved k hosts on."""
    if k == 0:
        return col
    from operator import itemgetter

    rp, vp, lp = sym.rperm[k], sym.vperm[k], sym.lperm[k]
    n = len(col.parent)
    par, paths = [-1] * n, [()] * n
    for v, p in enumerate(col.parent):
        par[rp[v]] = -1 if p == -1 else rp[p]
        if p != -1:
            paths[rp[v]] = itemgetter(*col.paths[v])(vp)
    return _Col(rp[col.root], tuple(par), tuple(paths), tuple(sorted((lp[li], m) for li, m in col.usage)))


def _colgen_symmetric(ix: Indexed, pricer: _Pricer, sym: _Symmetry, deadline: float, bound: float,
                      seeds: list[_Col], max_rounds: int = 0):
    """Column generation of the allgather packing restricted to host-symmetric packings: a
    column is a tree T rooted at a rank of the first host together with its H translates,
    all at one weight. The LP is invariant under the translations, so averaging any optimal
    packing over them gives a symmetric one of the same rate: this master has the same
    optimum as the full one (and is proved optimal the same ways: no column prices below
    z, or the cut bound is met). Translated columns load translated links equally, so the
    link rows of one orbit are the same constraint and the master keeps one per orbit: row
    L of T's column is (H / |L|) x T's uses of L's links. Pricing is the ordinary tree
    pricing under the link costs y(e) = (H / |L(e)|) x the dual of e's orbit, for one root
    per host slot: 8 minimum arborescences per round on 64 DGX-1s instead of 512.

    Returns (weights, columns, objective, scale, stop) like :func:`_colgen`; the columns are
    the representatives (expand with :func:`_translate`)."""
    orbit, weight = np.array(sym.orbit), np.array(sym.weight, dtype=float)
    scale = float(pricer.cap.max())
    rows = len(sym.weight)
    rep = np.zeros(rows, dtype=int)
    rep[orbit[::-1]] = np.arange(len(orbit))[::-1]  # first link of each orbit
    master = _Master(pricer.cap[rep] / scale, list(sym.slots))
    trees: list[_Col] = []

    def add(col: _Col) -> bool:
        use: dict[int, float] = {}
        for li, m in col.usage:
            o = int(orbit[li])
            use[o] = use.get(o, 0.0) + m * weight[o]
        if master.add(_Col(col.root, col.parent, col.paths, tuple(sorted(use.items())))):
            trees.append(col)
            return True
        return False

    for col in seeds:
        if col.root in sym.slots:
            add(col)
    bare = [r for r in sym.slots if not any(c.root == r for c in trees)]
    w0, p0 = pricer.matrix(1.0 / (pricer.cap / scale)) if bare else (None, None)
    for r in bare:
        col = pricer.tree(w0, p0, r)
        if col is None:
            raise _unreachable(ix, pricer, r)
        add(col)
    stop = "round limit"
    limit = max_rounds or _MAX_ROUNDS
    for k in range(limit):
        progress.report("pack", f"symmetric pricing round ({len(sym.vperm)} hosts)", k + 1, limit)
        master.solve()
        if master.objective() * scale >= bound * (1.0 - 1e-9):
            stop = ""
            break
        ybar, z = master.duals()
        y = ybar[orbit] * weight[orbit]
        w, route = pricer.matrix(y)
        added = False
        for r in sym.slots:
            col = pricer.tree(w, route, r)
            if col is None:
                raise _unreachable(ix, pricer, r)
            if sum(m * y[li] for li, m in col.usage) < z[r] * (1.0 - _EPS) and add(col):
                added = True
        if not added:
            stop = ""
            break
        if time.perf_counter() > deadline:
            stop = "wall-clock safety net"
            break
    master.solve()
    _shallowest(master, [_depth(c) for c in trees], master.objective())
    # x after the second phase: every root's weights sum to at least it (its root row)
    return master.weights(), trees, master.objective(), scale, stop


def _shallowest(master: _Master, depth: list[int], x: float) -> None:
    """Second phase: among the packings of rate >= x (1e-9 relative) over the master's
    columns, the one of least sum_T depth(T) w_T. The LP's first optimum is any vertex of
    the optimal face, and at 512-1024 ranks that is mostly ring chains, whose pipeline
    fill (depth x one share per hop) costs more than the bandwidth term when each share is
    one chunk; the binary-tree seeds reach the same rate 10 levels deep. Keeps the first
    solution if GLOP fails here."""
    from ortools.linear_solver import pywraplp

    if x <= 0 or master.x is None:
        return
    master.x.SetLb(x * (1.0 - 1e-9))
    master.obj.Clear()
    master.obj.SetMinimization()
    for v, d in zip(master.vars, depth):
        master.obj.SetCoefficient(v, float(d))
    if master.solver.Solve() != pywraplp.Solver.OPTIMAL:
        master.x.SetLb(0.0)
        master.obj.Clear()
        master.obj.SetMaximization()
        master.obj.SetCoefficient(master.x, 1.0)
        master.solve()
