"""hcc.compiler.treepack_master — the tree-packing master LP (GLOP) and its pricing.

Terms
- *column*: one spanning arborescence over the ranks (:class:`_Col`): a parent per rank
  position, each rank edge routed parent .. child through switches only, and its *usage*,
  how many times it crosses each link.
- *master*: the LP over the columns found so far (:class:`_Master`). Broadcast: max sum_T w_T
  s.t. sum_T usage_T(e) w_T <= c(e). Allgather (ForestColl): max x s.t. the same link rows
  and sum_{T rooted at r} w_T >= x for every root r. Split allreduce (``balance``,
  compiler/splitpack.py): columns are out-trees or in-trees, max sum_{T out} w_T s.t. the
  same link rows and sum_{T out at r} w_T - sum_{T in at r} w_T <= 0 for every root r.
- *pricing*: the link duals y(e) (and per-root duals z_r) price a new column as a
  minimum-cost arborescence (Chu-Liu 1965 / Edmonds 1967, :func:`min_arborescence`) on the
  rank closure under y (:class:`_Pricer`); it enters when it costs less than z_r (1 for a
  single root). When none does, LP duality proves the master optimal (:func:`_colgen`).
- *depth*: the levels of a column, the longest parent chain from a rank to its root
  (:func:`_depth`); a route through switches is one level.

The same master serves the host-symmetric packing (treepack_symmetry.py), the
depth-bounded second phase (treepack_shallow.py), the bidirectional packing
(bidir.solve_master) and the split allreduce (splitpack.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from . import progress
from .switches import Indexed

__all__ = ["PackError", "min_arborescence"]

_INF = math.inf
# relative reduced-cost tolerance of column generation (capacities are scaled to <= 1)
_EPS = 1e-9
# column generation stops after this many pricing rounds (a count, not a clock, so results
# depend on the input only); the samples converge within 30 (32-rank cluster broadcast)
_MAX_ROUNDS = 500
# extra improving columns per single-root pricing round (see _more_columns)
_EXTRA_COLUMNS = 3
# matrices up to this many vertices run Chu-Liu/Edmonds on Python lists of columns (faster
# than numpy below it on random matrices: 0.6 against 1.2 ms a call at 16 vertices, 2.2 against
# 4.2 at 32, 1.9-3.6 against 5.8-6.8 at 40; at 48 numpy wins)
_LIST_EDMONDS_MAX = 40

try:  # the same steps natively (compiler/_simcore.c's ``arborescence``): a tenth of the time
    from ._simcore import arborescence as _arborescence
except ImportError:  # not built (HCC_NO_NATIVE=1), or built before it had it: the Python code
    _arborescence = None


class PackError(ValueError):
    """No spanning tree exists (a rank unreachable from a root through the collective's
    ranks and switches), or the solver failed."""




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


def _contract(par: list[int]) -> tuple[list[int], list[int], int, list[list[int]]] | None:
    """The cycles of the cheapest in-arcs ``par`` (-1 at the root), contracted: per vertex
    its cycle's index or -1 (``cyc_id``), its group (a vertex off every cycle is a group of
    its own, numbered first; each cycle is one group), the group count and each group's
    members. None when ``par`` has no cycle (it is then the arborescence)."""
    n = len(par)
    color = [-1] * n
    cyc_id = [-1] * n
    cycles: list[list[int]] = []
    for s in range(n):
        v = s
        while v != -1 and color[v] == -1:
            color[v] = s
            v = par[v]
        if v != -1 and color[v] == s:
            cyc, u = [], v
            while True:
                cyc.append(u)
                cyc_id[u] = len(cycles)
                u = par[u]
                if u == v:
                    break
            cycles.append(cyc)
    if not cycles:
        return None
    group = [0] * n
    gid = 0
    for v in range(n):
        if cyc_id[v] == -1:
            group[v] = gid
            gid += 1
    for cyc in cycles:
        for v in cyc:
            group[v] = gid
        gid += 1
    members: list[list[int]] = [[] for _ in range(gid)]
    for v in range(n):
        members[group[v]].append(v)
    return cyc_id, group, gid, members


def _expand(par: list[int], sub: list[int], root: int, members: list[list[int]], arc) -> list[int]:
    """The arborescence of the contracted graph ``sub`` (a parent group per group) expanded:
    ``par`` (every vertex's cheapest in-arc) with, per group b entered from group a, the arc
    ``arc(members[a], members[b])`` -> (u, v) replacing v's in-arc."""
    result = list(par)
    for b, a in enumerate(sub):
        if a == -1:
            continue
        u, v = arc(members[a], members[b])
        result[v] = u
    result[root] = -1
    return result


def _edmonds_cols(cols: list[list[float]], root: int) -> list[int] | None:
    """:func:`_edmonds` on nested lists of in-arc costs (``cols[v][u]`` = cost of u -> v), the
    same steps and the same tie-breaks (first minimum in row order), for small matrices: at
    16 ranks each numpy call's overhead outweighs its O(n^2) work. Columns let C do the
    scans (``min``, ``index``, ``itemgetter``): random 16-vertex matrices took 550 us a call
    with the numpy code, 240 us with row loops in Python, half that here."""
    n = len(cols)
    inf = _INF
    par = [-1] * n
    inw = [0.0] * n
    for v in range(n):
        if v == root:
            continue
        col = cols[v]
        m = min(col)
        if m == inf:
            return None
        par[v], inw[v] = col.index(m), m
    contracted = _contract(par)
    if contracted is None:
        return par
    _, group, gid, members = contracted
    # the columns of the contracted graph: arcs into a cycle discounted by the cycle arc they
    # replace, arcs inside a group dropped (the diagonal is inf already), per group the cheapest
    adj = cols
    small = []
    pick = itemgetter(*[m[0] for m in members])  # gid >= 2: the root is never on a cycle
    multi = [(g, m) for g, m in enumerate(members) if len(m) > 1]
    for mb in members:
        if len(mb) == 1:
            merged = cols[mb[0]]
        else:
            if adj is cols:
                adj = list(cols)
            merged = None
            for v in mb:
                d = inw[v]
                c = [x - d for x in cols[v]]
                for u in mb:
                    c[u] = inf
                adj[v] = c
                merged = c if merged is None else list(map(min, merged, c))
        row = list(pick(merged))
        for g, m in multi:
            row[g] = min([merged[u] for u in m])
        small.append(row)
    sub = _edmonds_cols(small, group[root])
    if sub is None:
        return None

    def arc(ma: list[int], mb: list[int]) -> tuple[int, int]:
        best, bu, bv = inf, ma[0], mb[0]  # every arc inf: the first pair, as argmin takes
        for u in ma:
            for v in mb:
                if adj[v][u] < best:
                    best, bu, bv = adj[v][u], u, v
        return bu, bv

    return _expand(par, sub, root, members, arc)


def _edmonds(w: np.ndarray, root: int) -> list[int] | None:
    """Chu-Liu/Edmonds on a dense matrix whose column ``root`` and diagonal are inf: every
    vertex takes its cheapest in-arc; each cycle of those arcs contracts to one vertex, arcs
    into it discounted by the cycle arc they would replace; recurse; expand. The Python
    loops run on lists (numpy scalar indexing made it most of a pack's time), the O(n^2)
    contraction on arrays; up to _LIST_EDMONDS_MAX vertices all of it on
    lists (:func:`_edmonds_cols`); natively where that is built, the same steps and
    tie-breaks (tests/test_treepack_edmonds.py compares the three)."""
    n = w.shape[0]
    if _arborescence is not None:
        par_out = np.empty(n, np.int64)
        if not _arborescence(np.ascontiguousarray(w, dtype=np.float64), root, par_out):
            return None
        return par_out.tolist()
    return _edmonds_py(w, root)


def _edmonds_py(w: np.ndarray, root: int) -> list[int] | None:
    """:func:`_edmonds` in Python (the reference of the native code)."""
    n = w.shape[0]
    if n <= _LIST_EDMONDS_MAX:
        return _edmonds_cols(w.T.tolist(), root)
    par_a = np.argmin(w, axis=0)
    inw = w[par_a, np.arange(n)]
    inw[root] = 0.0
    if not np.isfinite(inw).all():
        return None
    par = par_a.tolist()
    par[root] = -1
    contracted = _contract(par)
    if contracted is None:
        return par
    cyc_id, group, gid, members = contracted
    g = np.array(group)
    on_cycle = np.array(cyc_id) >= 0
    adj = w - np.where(on_cycle, inw, 0.0)[None, :]
    adj[g[:, None] == g[None, :]] = _INF
    order = np.argsort(g, kind="stable")
    starts = np.searchsorted(g[order], np.arange(gid))
    small = np.minimum.reduceat(np.minimum.reduceat(adj[order][:, order], starts, axis=0), starts, axis=1)
    sub = _edmonds_py(small, group[root])
    if sub is None:
        return None

    def arc(ma: list[int], mb: list[int]) -> tuple[int, int]:
        if len(ma) == 1 and len(mb) == 1:  # most groups are single vertices: no search
            return ma[0], mb[0]
        i, j = divmod(int(np.argmin(adj[np.ix_(ma, mb)])), len(mb))
        return ma[i], mb[j]

    return _expand(par, sub, root, members, arc)


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


def _round_end(added: bool, deadline: float) -> str | None:
    """Why column generation stops after a pricing round: "" when no column priced in (the
    master is optimal), "wall-clock safety net" past ``deadline``, None to go on."""
    if not added:
        return ""
    if time.perf_counter() > deadline:
        return "wall-clock safety net"
    return None


def _root_tree(ix: Indexed, pricer: _Pricer, w, route, root: int) -> _Col:
    """The cheapest tree from ``root`` under the closure matrix ``w`` (:meth:`_Pricer.tree`);
    PackError naming the ranks it cannot reach when there is none."""
    col = pricer.tree(w, route, root)
    if col is None:
        raise _unreachable(ix, pricer, root)
    return col


def _bare_trees(ix: Indexed, pricer: _Pricer, roots, have, capn: np.ndarray) -> list[_Col]:
    """A first column for every root of ``roots`` without one in ``have``: its cheapest tree
    under link costs 1 / capacity (capacities ``capn`` scaled to <= 1)."""
    bare = [r for r in roots if not any(c.root == r for c in have)]
    if not bare:
        return []
    w0, p0 = pricer.matrix(1.0 / capn)
    return [_root_tree(ix, pricer, w0, p0, r) for r in bare]


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
    link rows and x - sum_{T rooted at r} w_T <= 0 for every root r. ``balance`` (the split
    allreduce): every column is an out-tree or an in-tree (:meth:`add`'s ``out``), max
    sum_{T out} w_T s.t. the link rows and sum_{T out at r} w_T - sum_{T in at r} w_T <= 0
    for every root r (a rank broadcasts no more than it reduced); the root duals z_r price
    an out-tree against 1 - z_r and an in-tree against z_r. Capacities are divided by the
    largest one, so every coefficient is a small integer and every bound is <= 1.
    """

    def __init__(self, capn: np.ndarray, roots: list[int], *, presolve: bool = False,
                 feasibility: float | None = None, balance: bool = False):
        self.capn = capn
        self.roots = roots
        self.balance = balance
        self.presolve = presolve  # GLOP's presolve: only for masters built cold per solve
        # GLOP's primal feasibility tolerance when given (its default let a link carry 7e-9
        # above its capacity, which the result then gives back in rate)
        self.feasibility = feasibility
        self.equal = len(roots) > 1 and not balance
        self.cols: list[_Col] = []
        self.outs: list[bool] = []  # per column: an out-tree (balance: False for an in-tree)
        self.allowed: list[bool] = []  # per column: may take weight (see allow)
        self.keys: set = set()
        self._build()

    def _build(self) -> None:
        from ortools.linear_solver import pywraplp

        solver = pywraplp.Solver.CreateSolver("GLOP")
        if solver is None:
            raise PackError("OR-Tools GLOP is not available")
        # presolve on warm re-solves of these degenerate masters ended ABNORMAL 20 times in
        # 170 rounds on the 32-rank cluster; without it, twice (bidir.solve_master builds
        # its master cold per solve and keeps presolve, whose optimal vertex it was tuned on)
        params = [] if self.presolve else ["use_preprocessing: false"]
        if self.feasibility is not None:
            params.append(f"primal_feasibility_tolerance: {self.feasibility:g}")
        if params:
            solver.SetSolverSpecificParametersAsString(" ".join(params))
        inf = solver.infinity()
        self.solver = solver
        self.rows = [solver.Constraint(-inf, float(c)) for c in self.capn]
        self.x = solver.NumVar(0.0, inf, "x") if self.equal else None
        self.root_rows = {}
        self.obj = solver.Objective()
        self.obj.SetMaximization()
        if self.equal:
            self.obj.SetCoefficient(self.x, 1.0)
        if self.equal or self.balance:
            for r in self.roots:
                ct = solver.Constraint(-inf, 0.0)
                if self.equal:
                    ct.SetCoefficient(self.x, 1.0)
                self.root_rows[r] = ct
        self.rate_row = None  # no x: sum_{T out} w_T >= a held rate (see settle)
        self.vars = []
        for col, out in zip(self.cols, self.outs):
            self._var(col, out)

    def allow(self, mask) -> None:
        """Let only the columns whose ``mask`` entry is true take weight (the others are held
        at zero until allowed again); columns added later are allowed."""
        self.allowed = [bool(m) for m in mask]
        for v, ok in zip(self.vars, self.allowed):
            v.SetUb(self.solver.infinity() if ok else 0.0)

    def _var(self, col: _Col, out: bool = True) -> None:
        k = len(self.vars)
        ok = k >= len(self.allowed) or self.allowed[k]
        v = self.solver.NumVar(0.0, self.solver.infinity() if ok else 0.0, "")
        for li, k in col.usage:
            self.rows[li].SetCoefficient(v, float(k))
        if self.equal:
            self.root_rows[col.root].SetCoefficient(v, -1.0)
        else:
            if self.balance:
                self.root_rows[col.root].SetCoefficient(v, 1.0 if out else -1.0)
            if out:
                self.obj.SetCoefficient(v, 1.0)
                if self.rate_row is not None:
                    self.rate_row.SetCoefficient(v, 1.0)
        self.vars.append(v)

    def add(self, col: _Col, *, out: bool = True) -> bool:
        """Add ``col`` unless the master has it; ``out=False`` adds it as an in-tree (only
        with ``balance``)."""
        if not out and not self.balance:
            raise ValueError("in-tree columns need a balance master")
        key = (out, col.root, col.parent, col.paths)
        if key in self.keys:
            return False
        self.keys.add(key)
        self.cols.append(col)
        self.outs.append(out)
        self._var(col, out)
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
        """``(y, z)``: the link duals and the root duals per root (one root: z = 1)."""
        y = np.array([max(0.0, abs(ct.dual_value())) for ct in self.rows])
        if self.equal or self.balance:
            return y, {r: abs(self.root_rows[r].dual_value()) for r in self.roots}
        return y, {self.roots[0]: 1.0}

    def weights(self) -> list[float]:
        return [max(0.0, v.solution_value()) for v in self.vars]

    def objective(self) -> float:
        if self.equal:
            return self.x.solution_value()
        if self.balance:
            return self.obj.Value()
        return sum(self.weights())

    def settle(self, rate: float, cost, slack: float = 1e-9) -> bool:
        """Among the packings over these columns of rate >= ``rate`` (``slack`` relative; x per
        root with several roots, the total with one, the out-trees' total with ``balance``),
        one of least sum_T cost[T] w_T, by a warm GLOP re-solve. True when solved; otherwise
        the master is back at its own maximum-rate solution and False. The rate stays held
        until :meth:`release`."""
        from ortools.linear_solver import pywraplp

        if rate <= 0:
            return False
        held = rate * (1.0 - slack)
        if self.equal:
            self.x.SetLb(held)
        else:
            if self.rate_row is None:
                self.rate_row = self.solver.Constraint(held, self.solver.infinity())
                for v, out in zip(self.vars, self.outs):
                    if out:
                        self.rate_row.SetCoefficient(v, 1.0)
            self.rate_row.SetLb(held)
        self.obj.Clear()
        self.obj.SetMinimization()
        for v, c in zip(self.vars, cost):
            self.obj.SetCoefficient(v, float(c))
        if self.solver.Solve() == pywraplp.Solver.OPTIMAL:
            return True
        self.release()
        self.solve()
        return False

    def release(self) -> None:
        """Back to the maximum-rate objective with no rate held (after :meth:`settle`)."""
        self.obj.Clear()
        self.obj.SetMaximization()
        if self.equal:
            self.x.SetLb(0.0)
            self.obj.SetCoefficient(self.x, 1.0)
        else:
            if self.rate_row is not None:
                self.rate_row.SetLb(-self.solver.infinity())
            for v, out in zip(self.vars, self.outs):
                if out:
                    self.obj.SetCoefficient(v, 1.0)


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
    for col in _bare_trees(ix, pricer, roots, seeds, capn):
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
            col = _root_tree(ix, pricer, w, paths, r)
            cost = sum(k * y[li] for li, k in col.usage)
            if cost < z[r] * (1.0 - _EPS) and master.add(col):
                added = True
                if len(roots) == 1:
                    _more_columns(pricer, master, y, col, z[r])
            if added and time.perf_counter() > deadline:
                break  # safety net only: a round that outlasts it stops mid-round
        end = _round_end(added, deadline)
        if end is not None:
            stop = end
            break
    else:
        master.solve()  # the last round's columns enter the LP
        return master.weights(), master.cols, master.objective(), scale, stop
    if stop:
        master.solve()
    return master.weights(), master.cols, master.objective(), scale, stop


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


def _shallowest(master: _Master, depth: list[int], x: float) -> None:
    """Second phase: among the packings of rate >= x (1e-9 relative) over the master's
    columns, the one of least sum_T depth(T) w_T. The LP's first optimum is any vertex of
    the optimal face, and at 512-1024 ranks that is mostly ring chains, whose pipeline
    fill (depth x one share per hop) costs more than the bandwidth term when each share is
    one chunk; the binary-tree seeds reach the same rate 10 levels deep. Keeps the first
    solution if GLOP fails here."""
    if x > 0 and master.equal:
        master.settle(x, depth)
