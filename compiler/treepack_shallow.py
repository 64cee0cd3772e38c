"""hcc.compiler.treepack_shallow — the second phase of a pack: the same rate over shallow trees.

Terms
- *depth* D of a packing: the deepest of its trees (treepack_master._depth; a route through
  switches is one level). A pipelined tree of depth d pays about (d - 1) chunk times of fill,
  and every tree sharing a link adds its messages to that link, so the schedule's loss grows
  with the depth and with the number of trees (issue 17: DGX-1's diameter is 2, yet its
  allgather trees were 7-deep chains).
- *eccentricity* of a root: the fewest levels any spanning tree from it needs (breadth-first
  over the rank closure); the largest over the roots is the least depth worth trying.
- *depth-bounded pricing* (:func:`bounded_parents`): a cheapest arborescence of depth <= D
  under the link duals is NP-hard to find in general (it contains the hop-constrained
  minimum spanning tree); here a heuristic gives it: the minimum arborescence itself when it
  is shallow enough, else a level-capped Prim greedy improved by re-parenting moves. A
  heuristic pricer can miss an improving tree, never add a wrong one: every column is a
  valid tree of depth <= D, and the phase accepts only a master whose LP rate meets the
  first phase's optimum.

Method (:func:`shallow_packing`): once the first phase has the optimal rate x*, one new
master holds the first phase's columns; a *probe* at depth D lets only columns <= D deep
take weight, adds the first phase's weighted trees cut down to D levels and a shallow tree
per root, and runs column generation with depth-bounded pricing until the LP rate meets x*
(relative _HOLD = 1e-11: then this packing is as optimal as the first), or no tree prices
in, or the rate stalls (it closed less than a quarter of its gap in 3 rounds). Probes run
at the largest eccentricity, then one deeper, then in doubling steps, and stop at the first
success, below the first phase's own depth, or after a fixed count of pricing rounds (a
count, not a clock: results depend on the input only); then the caller keeps the first
phase's packing. The packing found is then settled (:func:`_sparsify`): least link time at
rate x*, then fewer trees by reweighted l1. GLOP's answers are basic solutions, so a
packing uses at most as many trees as there are tight rows.
"""
from __future__ import annotations

import numpy as np

from . import progress
from .switches import Indexed
from .treepack_master import _EPS, _Col, _depth, _edmonds, _Master, _Pricer

_INF = np.inf
# the second phase meets and holds the first phase's rate to this relative tolerance, under a
# GLOP feasibility tolerance of _FEASIBILITY (capacities are scaled to <= 1): with GLOP's
# defaults (1e-9 held, links 7e-9 over) the packing came out 1e-8 below the first phase's
_HOLD = 1e-11
_FEASIBILITY = 1e-11
# reweighted-l1 rounds of _sparsify and its delta (relative to the rate)
_L1_ROUNDS = 3
_L1_DELTA = 1e-3
# a depth is given up when its LP rate closed less than _STALL_SHARE of the gap to the
# target over the last _STALL_ROUNDS pricing rounds (counts: results depend on the input only)
_STALL_ROUNDS = 3
_STALL_SHARE = 0.25
# re-parenting passes of the bounded pricer's local search, at most (each O(n^2) and it stops
# at the first pass that moves nothing); a cap on work, not a tuned figure
_IMPROVE_PASSES = 3


def bounded_parents(w: np.ndarray, root: int, depth: int) -> list[int] | None:
    """Parent list (``-1`` at ``root``) of a cheap spanning arborescence of depth <= ``depth``
    on the complete digraph with arc costs ``w`` (inf = absent), or None when no arborescence
    is that shallow (``depth`` below the root's eccentricity). The minimum arborescence when
    it is shallow enough (then optimal); else the cheaper of the minimum arborescence cut
    down to the cap (:func:`_repair`) and a greedy that attaches the cheapest reachable
    vertex to a parent above the cap, each followed by re-parenting moves that lower the
    cost and keep the cap; a breadth-first tree when both fail.

    >>> inf = float("inf")
    >>> w = np.array([[inf, 1, 5, 9], [inf, inf, 1, inf], [inf, inf, inf, 1], [inf] * 4])
    >>> bounded_parents(w, 0, 3), bounded_parents(w, 0, 2), bounded_parents(w, 0, 1)
    ([-1, 0, 1, 2], [-1, 0, 1, 0], [-1, 0, 0, 0])
    """
    got = _candidates(w, root, depth)
    return got[0] if got else None


def _candidates(w: np.ndarray, root: int, depth: int) -> list[list[int]]:
    """:func:`bounded_parents`' candidates, cheapest first: the minimum arborescence alone
    when it is shallow enough, else the repaired one and the greedy one (each improved)."""
    n = w.shape[0]
    if n == 1:
        return [[-1]]
    w = np.array(w, dtype=float)
    w[:, root] = _INF
    np.fill_diagonal(w, _INF)
    par = _edmonds(w, root)
    if par is not None:
        par = [int(p) for p in par]
        if _levels(par, root) <= depth:
            return [par]
    elif not np.isfinite(w[root]).any():
        return []
    # the local searches below read single arcs: on lists (numpy scalar reads were most of a
    # shallow probe's time at 16 ranks), the same comparisons in the same order
    rows = w.tolist()
    cols = w.T.tolist()
    out = []
    for cand in (_repair(w, par, root, depth, cols) if par is not None else None, _greedy(rows, root, depth)):
        if cand is None:
            continue
        _improve(cols, cand, root, depth)
        out.append((float(sum(rows[p][v] for v, p in enumerate(cand) if p >= 0)), len(out), cand))
    if not out:  # the greedy can fail near the eccentricity; a breadth-first tree cannot
        ecc = eccentricity(w, root)
        if ecc is not None and ecc <= depth:
            cand = _bfs_parents(w, root)
            _improve(cols, cand, root, depth)
            out.append((0.0, 0, cand))
    return [c for _, _, c in sorted(out)]


def _repair(w: np.ndarray, par: list[int], root: int, depth: int, cols: list[list[float]] | None = None
            ) -> list[int] | None:
    """The minimum arborescence cut down to ``depth`` levels: while some rank sits deeper,
    the shallowest such rank (the first of them) moves (with its subtree) to its cheapest
    parent above the cap (the first of them); None if some such rank has none. ``cols``:
    ``w``'s columns as lists, when the caller has them."""
    if cols is None:
        cols = w.T.tolist()
    lv = _level_list(par, root)
    n = len(par)
    kids: list[list[int]] = [[] for _ in range(n)]
    for v, p in enumerate(par):
        if p >= 0:
            kids[p].append(v)
    inf = _INF
    while True:
        deep = [(lv[x], x) for x in range(n) if lv[x] > depth]
        if not deep:
            return par
        v = min(deep)[1]
        col = cols[v]
        u, best = 0, inf
        for x in range(n):
            if lv[x] < depth and col[x] < best:
                u, best = x, col[x]
        if not best < inf:
            return None
        kids[par[v]].remove(v)
        kids[u].append(v)
        par[v] = u
        shift = lv[u] + 1 - lv[v]
        stack = [v]
        while stack:
            x = stack.pop()
            lv[x] += shift
            stack.extend(kids[x])


def _levels(par: list[int], root: int) -> int:
    lvl = _level_list(par, root)
    return max(lvl)


def _level_list(par: list[int], root: int) -> list[int]:
    n = len(par)
    lvl = [-1] * n
    lvl[root] = 0
    for v in range(n):
        chain = []
        u = v
        while lvl[u] < 0:
            chain.append(u)
            u = par[u]
        d = lvl[u]
        for x in reversed(chain):
            d += 1
            lvl[x] = d
    return lvl


def _greedy(rows: list[list[float]], root: int, depth: int) -> list[int] | None:
    """Prim with a level cap over the arc weights ``rows`` (the weight matrix's rows as
    lists): attach the cheapest outside vertex (the first of them) to an inside parent whose
    level is below ``depth`` (ties keep the parent found first, i.e. the shallower)."""
    n = len(rows)
    inf = _INF
    par = [-1] * n
    lvl = [-1] * n
    lvl[root] = 0
    inside = [False] * n
    inside[root] = True
    best = list(rows[root]) if depth >= 1 else [inf] * n
    best_par = [root] * n
    for _ in range(n - 1):
        v, m = 0, inf
        for x in range(n):
            if not inside[x] and best[x] < m:
                v, m = x, best[x]
        if not m < inf:
            return None
        u = best_par[v]
        par[v] = u
        lvl[v] = lvl[u] + 1
        inside[v] = True
        if lvl[v] < depth:
            row = rows[v]
            for x in range(n):
                if row[x] < best[x]:
                    best[x] = row[x]
                    best_par[x] = v
    return par


def _improve(cols: list[list[float]], par: list[int], root: int, depth: int) -> None:
    """Re-parent single vertices (with their subtrees), in vertex order, each to its cheapest
    parent (the first of them) that is cheaper than its own and keeps every level <=
    ``depth``; in place. ``cols``: the weight matrix's columns as lists."""
    n = len(par)
    for _ in range(_IMPROVE_PASSES):
        moved = False
        lvl = _level_list(par, root)
        kids: list[list[int]] = [[] for _ in range(n)]
        for v, p in enumerate(par):
            if p >= 0:
                kids[p].append(v)
        for v in range(n):
            if v == root:
                continue
            row = cols[v]
            cur = row[par[v]]
            if not min(row) < cur:
                continue
            # v's subtree: its vertices cannot become v's parent; its height bounds the move
            sub, stack, height = {v}, [v], 0
            while stack:
                x = stack.pop()
                height = max(height, lvl[x] - lvl[v])
                for c in kids[x]:
                    sub.add(c)
                    stack.append(c)
            best_u, best_c = -1, cur
            cap = depth - 1 - height
            for u in range(n):
                if row[u] < best_c and lvl[u] <= cap and u not in sub:
                    best_u, best_c = u, row[u]
            if best_u < 0:
                continue
            kids[par[v]].remove(v)
            kids[best_u].append(v)
            par[v] = best_u
            shift = lvl[best_u] + 1 - lvl[v]
            for x in sub:
                lvl[x] += shift
            moved = True
        if not moved:
            return


def _col(pricer: _Pricer, route, par: list[int], root: int, like: _Col | None = None) -> _Col:
    """The column of parent list ``par``: rank edges routed by ``route``, except those it
    shares with ``like``, which keep ``like``'s routes."""
    paths, use = [], {}
    for v, p in enumerate(par):
        if p == -1:
            paths.append(())
            continue
        path = like.paths[v] if like is not None and like.parent[v] == p else route(p, v)
        paths.append(path)
        for a, b in zip(path, path[1:]):
            li = pricer.link_of[(a, b)]
            use[li] = use.get(li, 0) + 1
    return _Col(root, tuple(par), tuple(paths), tuple(sorted(use.items())))


def _bfs_parents(w: np.ndarray, root: int) -> list[int]:
    """A breadth-first tree from ``root`` over the finite arcs of ``w`` (each rank hangs from
    its cheapest parent on the level above): depth = the root's eccentricity. Every rank
    must be reachable."""
    n = w.shape[0]
    par = [-1] * n
    seen = np.zeros(n, dtype=bool)
    seen[root] = True
    front = [root]
    while front:
        sub = w[front]
        nxt = np.flatnonzero(np.isfinite(sub).any(axis=0) & ~seen)
        for v in nxt:
            par[int(v)] = front[int(np.argmin(sub[:, v]))]
        seen[nxt] = True
        front = [int(v) for v in nxt]
    return par


def eccentricity(w: np.ndarray, root: int) -> int | None:
    """Levels of a breadth-first tree from ``root`` over the finite arcs of ``w``; None if a
    vertex is unreachable.

    >>> inf = float("inf")
    >>> eccentricity(np.array([[inf, 1, inf], [inf, inf, 1], [1, inf, inf]]), 0)
    2
    """
    n = w.shape[0]
    fin = np.isfinite(w)
    seen = np.zeros(n, dtype=bool)
    seen[root] = True
    front, d = np.array([root]), 0
    while not seen.all():
        nxt = fin[front].any(axis=0) & ~seen
        if not nxt.any():
            return None
        seen |= nxt
        front = np.flatnonzero(nxt)
        d += 1
    return d


def shallow_packing(ix: Indexed, pricer: _Pricer, roots: list[int], cols: list[_Col], weights: list[float],
                    target: float, scale: float, rounds: int, sym=None, at_depth: int | None = None):
    """Second phase: a packing of scaled rate >= ``target`` (_HOLD relative; the first phase's
    optimum: x per root with several roots, the total with one) whose trees are all at most
    D deep, for the least D this search finds below the first phase's deepest tree of
    positive weight (``cols`` with ``weights``). Depths are probed from the largest root
    eccentricity upward in doubling steps, then by bisection between the last depth that
    failed and the first that reached the rate; one master serves every probe, the columns
    deeper than the probe's D held at zero. Returns ``(weights, columns, rate, D)`` (scaled
    units, like treepack_master._colgen) or None when no shallower packing was found within
    ``rounds`` pricing rounds.

    With ``sym`` (a treepack_symmetry._Symmetry) the master is the symmetric one: ``roots``
    are its slots, ``cols`` representatives, each column standing for the tree and its
    images at one weight, one row per link orbit; the returned columns are representatives.

    With ``at_depth``: that depth alone, whatever the first phase's, and where the rate
    stalls below ``target`` the packing at the rate reached (its ``rate`` says which): the
    columns of a depth-capped search (compiler/packing_choice.py, where CP-SAT may still
    find the full rate over their edges). None below the roots' eccentricity."""
    capn = pricer.cap / scale
    w1, route1 = pricer.matrix(1.0 / capn)
    ecc = [eccentricity(w1, r) for r in roots]
    if any(e is None for e in ecc):
        return None
    top = max((_depth(c) for c, x in zip(cols, weights) if x > 1e-12), default=pricer.n - 1)
    lo = max(ecc)
    if at_depth is not None:
        if at_depth < lo:
            return None
        lo, top = at_depth, at_depth + 1
    if lo >= top:
        return None
    if sym is None:
        master = _Master(capn, roots, feasibility=_FEASIBILITY)
    else:
        from .treepack_symmetry import _orbit_caps, _orbit_usage

        master = _Master(_orbit_caps(capn, sym), roots, feasibility=_FEASIBILITY)
        lift = np.array(sym.weight, dtype=float)[list(sym.orbit)]
    depth: list[int] = []
    reps: list[_Col] = []  # the columns as priced (with sym: the representatives)

    def add(col: _Col, d: int | None = None) -> bool:
        row = col if sym is None else _Col(col.root, col.parent, col.paths, _orbit_usage(col, sym))
        if not master.add(row):
            return False
        depth.append(_depth(col) if d is None else d)
        reps.append(col)
        return True

    for c in cols:
        add(c)
    heavy = [c for c, x in zip(cols, weights) if x > 1e-12]
    budget = [rounds]

    def probe(D: int):
        """Column generation over trees <= D deep; the sparsified weights, or None."""
        # warm start: the first phase's weighted trees cut down to D levels (most of each
        # tree stays), and a shallow tree per root under 1/c costs, so every root has one
        for c in heavy:
            if _depth(c) > D:
                par = _repair(w1, list(c.parent), c.root, D)
                if par is not None:
                    add(_col(pricer, route1, par, c.root, like=c))
        for r in roots:
            par = bounded_parents(w1, r, D)
            if par is not None:
                add(_col(pricer, route1, par, r))
        master.release()
        master.allow([d <= D for d in depth])
        history: list[float] = []
        while budget[0] > 0:
            budget[0] -= 1
            progress.report("pack", f"shallow trees (depth {D})", rounds - budget[0], rounds)
            master.solve()
            obj = master.objective()
            if obj >= target * (1.0 - _HOLD):
                # least link time over the links themselves (with sym, a row is an orbit)
                return _sparsify(master, min(target, obj), [sum(m / capn[li] for li, m in c.usage) for c in reps])
            history.append(obj)
            # a depth whose rate gained less than _STALL_SHARE of its remaining gap over the
            # last _STALL_ROUNDS rounds is given up: the heuristic pricer crawls where the
            # depth is too small (MI250 mesh, depth 5: 3 rounds closed 9 % of the gap left at
            # 0.0994 of 0.1071), and closes in fast where it is not (depth 6: 83 % at 0.1053)
            if len(history) > _STALL_ROUNDS and obj - history[-1 - _STALL_ROUNDS] < _STALL_SHARE * (target - obj):
                return short(obj)
            y, z = master.duals()
            if sym is not None:  # a link's cost: its orbit's dual x |G| / |orbit|
                y = y[list(sym.orbit)] * lift
            w, route = pricer.matrix(y)
            added = False
            for r in roots:
                # the cheapest candidate only: adding both when both price in took 20
                # rounds at the mesh's depth-5 level instead of 17
                par = bounded_parents(w, r, D)
                if par is None:
                    continue
                col = _col(pricer, route, par, r)
                cost = sum(m * y[li] for li, m in col.usage)
                if cost < z[r] * (1.0 - _EPS) and add(col, D if _levels(par, r) <= D else None):
                    added = True
            if not added:
                return short(obj)
        return short(master.objective()) if budget[0] < rounds else None

    reached = [target]

    def short(obj: float):
        """Below the target: nothing, or with ``at_depth`` the packing at the rate reached."""
        if at_depth is None or obj <= 0:
            return None
        reached[0] = obj
        return _sparsify(master, obj, [sum(m / capn[li] for li, m in c.usage) for c in reps])

    step, D = 1, lo
    while D < top and budget[0] > 0:  # steps of 1, 1, 2, 4, ... up from the eccentricity
        got = probe(D)
        if got is not None:
            return got, reps, min(target, reached[0]), D
        D += step
        step *= 1 if D == lo + 1 else 2
    return None


def _sparsify(master: _Master, target: float, cost: list[float]) -> list[float]:
    """Among the packings of rate ``target`` over the master's columns: first the one of
    least link time (sum over links of load / capacity), so links off the binding cut keep
    slack for the schedule; then fewer trees by reweighted l1 (Candes, Wakin & Boyd 2008):
    minimise sum_T w_T / (w'_T + delta) with w' the previous solution, which drives small
    weights to zero. ``cost``: each column's link time per unit weight. Returns the weights
    of the solution with the fewest trees."""
    if not master.settle(target, cost, _HOLD):
        return master.weights()
    best = master.weights()
    tiny = target * 1e-9
    count = sum(1 for x in best if x > tiny)
    delta = target * _L1_DELTA
    for _ in range(_L1_ROUNDS):
        if not master.settle(target, [1.0 / (x + delta) for x in master.weights()], _HOLD):
            break
        got = master.weights()
        k = sum(1 for x in got if x > tiny)
        if k < count:
            best, count = got, k
    return best
