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
5. Inside one machine: an allgather pack of 9 to 32 ranks over direct links whose rank
   graph has 2 to 64 automorphisms, none but the identity fixing a rank
   (treepack_symmetry._rank_symmetry: one MI250 node's mesh has 4), solves the same
   symmetric master over them, and its depth-bounded second phase too: 4 roots priced per
   round instead of 16 (the node's pack 0.6 -> 0.13 CPU s, same rate, depth 6).

Modules (this one is the entry: the two packs and their results)
- treepack_master.py: columns, the GLOP master, minimum-arborescence pricing, column generation;
- treepack_seeds.py: ring chains, greedy shallow trees and binary trees as first columns;
- treepack_few.py: the CP-SAT few-trees search;
- treepack_symmetry.py: the symmetric allgather master (host translations, rank automorphisms);
- treepack_shallow.py: the second phase of an allgather pack: the same rate over trees of
  bounded depth (DGX-1 7 -> 2 levels), then fewer trees by reweighted l1.

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
from . import bounds
from .switches import Indexed
from .treepack_few import _FEW_ALLGATHER_BUDGET_S, _FEW_BROADCAST_BUDGET_S, _FEW_MAX_ALLGATHER_RANKS, _few_trees
from .treepack_few import _quanta  # noqa: F401  (re-exported: tests check the quanta)
from .treepack_master import PackError, _Col, _colgen, _depth, _Pricer, min_arborescence
from .treepack_shallow import shallow_packing
from .treepack_seeds import _btree_columns, _ring_columns, _seed_columns
from .treepack_symmetry import _SYMMETRY_MIN_RANKS, _colgen_symmetric, _host_symmetry, _rank_symmetry, _translate
from .trees import PackedTree

__all__ = ["PackedTree", "Packing", "PackError", "pack_broadcast", "pack_allgather", "min_arborescence",
           "clear_cache"]

# wall-clock seconds after which a pack gives up whatever it has: a safety net only, far above
# normal times (the slowest sample packs in 1.3 s of CPU); when it fires ``method`` says so
_WALL_SAFETY_S = 120.0
# broadcast/reduce packs of more than _LARGE_BROADCAST_RANKS ranks stop column generation
# after _LARGE_BROADCAST_ROUNDS pricing rounds unless it converges first (the rate reached is
# reported with its gap): on 64 DGX-1s (512 ranks) a round costs 2 s idle, 6 s at load 26,
# and the rate climbs slowly (24 GB/s after 1 round, 33 after 15, of a 48 GB/s bound); the
# fat trees' chains meet their bound without any round
_LARGE_BROADCAST_RANKS = 128
_LARGE_BROADCAST_ROUNDS = 12
# allgather packs of at most this many ranks (not symmetric, converged) run the depth-bounded
# second phase (treepack_shallow.py) after the first phase's optimum: DGX-1 7 -> 2 levels,
# two A100 servers 8 -> 2, four 17 -> 2 (93 -> about 55 trees), one MI250 node 13 -> 5-6.
# A round prices every root, so its budget is a count of pricings: _SHALLOW_PHASE_PRICINGS / n
# rounds (40 at 16 ranks, 20 at 32, where a round took about 0.2 s of CPU on four A100s).
# Broadcast and reduce packs run it when asked for a depth cap (pack_broadcast's ``depth``:
# compiler/packing_choice.py prices them against the deep packing)
_SHALLOW_PHASE_MAX_RANKS = 32
_SHALLOW_PHASE_PRICINGS = 640


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
    """Forget memoised packings and the tree shapes lowered from them (benchmarks that time
    the solver call this first)."""
    from . import schedule, trees

    _pack_broadcast.cache_clear()
    _pack_allgather.cache_clear()
    trees._shape.cache_clear()
    schedule._memo.clear()


def pack_broadcast(topo: Topology, ranks, root: str, *, reverse: bool = False, few_trees: bool = True,
                   tolerance: float = 0.0, time_limit: float = _WALL_SAFETY_S,
                   few_trees_time: float = _FEW_BROADCAST_BUDGET_S, depth: int = 0,
                   probe: bool = False) -> Packing | None:
    """Pack out-trees rooted at ``root`` (in-trees for reduce with ``reverse=True``) spanning
    ``ranks``, maximising the total rate; then, with ``few_trees``, CP-SAT searches (for at
    most ``few_trees_time`` deterministic seconds, so results do not depend on machine load)
    for the fewest trees keeping rate >= (1 - tolerance) x the LP optimum. ``time_limit``
    (wall-clock seconds) is only a safety net over the whole call.

    ``depth``: 0, trees of any depth. Otherwise, up to _SHALLOW_PHASE_MAX_RANKS ranks, the
    same LP rate over trees of bounded depth (None where none was found): -1, the
    depth-bounded second phase's (treepack_shallow.py; ``method`` says "shallow(depth D)"),
    and CP-SAT's few trees no deeper; D > 0, that phase's columns and CP-SAT's few trees at
    most D levels deep (else the phase's own trees where they are no deeper). With ``probe``
    (D > 0) the columns are column generation's at depth D alone, at whatever rate it
    reaches there, and CP-SAT looks for the full rate over their edges (one MI250 node from
    GCD 0 at depth 10, where the column generation stalls at 0.88 of the rate).

    Results are memoised per arguments (Topology and Packing are frozen values): broadcast,
    scatter, reduce and gather of one program often ask for the same packing, and the same
    question then gets the same trees."""
    args = (topo, tuple(ranks), root, reverse, few_trees, float(tolerance), float(time_limit), float(few_trees_time),
            int(depth), bool(probe and depth > 0))
    return _memo(_pack_broadcast, args)


@functools.lru_cache(maxsize=64)
def _pack_broadcast(topo: Topology, ranks: tuple[str, ...], root: str, reverse: bool, few_trees: bool,
                    tolerance: float, time_limit: float, few_trees_time: float, depth: int,
                    probe: bool) -> Packing | None:
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
    method = f"colgen({stop})" if stop else "colgen"
    cap = found = None  # the depth bound of the trees and the second phase's depth (depth != 0)
    reached = obj  # the LP rate within the cap (below obj only where ``probe`` stalled)
    if depth:
        if len(ranks) > _SHALLOW_PHASE_MAX_RANKS or obj <= 0 or stop:
            return None
        # one root: a pricing a round, so the budget's pricings are its rounds
        got = shallow_packing(ix, pricer, [r], cols, weights, obj, scale, _SHALLOW_PHASE_PRICINGS,
                              at_depth=depth if probe else None)
        if got is None:
            return None
        weights, cols, reached, found = got
        cap = found if depth < 0 else depth
        phase = f"+probe(depth {depth}, {reached / obj:.3f} of the rate)" if probe else f"+shallow(depth {found})"
        method += phase
    pairs = [(c, w * scale) for c, w in zip(cols, weights) if w * scale > reached * scale * 1e-12]
    lp_trees = len(pairs)
    if few_trees and (lp_trees > 1 or reached < obj):
        got, note = _few_trees(ix, pricer, [r], cols, weights, (1.0 - tolerance) * lp_rate, None,
                               deadline, scale, few_trees_time, cap)
        if got is not None:
            pairs = got
            if cap is not None:
                note += phase
        method = note if got is not None else f"{method}+{note}"
    if cap is not None and (max(_depth(c) for c, _ in pairs) > cap
                            or sum(w for _, w in pairs) < (1.0 - tolerance) * lp_rate * (1 - 1e-9)):
        return None
    if depth > 0:
        method += f"+depth <= {cap}"
    pairs = _fit(pricer, pairs)
    rate = sum(w for _, w in pairs)
    trees = tuple(_to_tree(ix, c, w) for c, w in pairs)
    gap = 1.0 - rate / bound if bound > 0 and math.isfinite(bound) else 0.0
    return Packing((root,), trees, rate, bound, lp_rate, gap, time.perf_counter() - t0, method, lp_trees)


def _equalise(pairs, roots, x: float):
    """Trim each root's trees (largest first) to exactly rate x: the LP and CP-SAT may leave
    a root some slack, and the packing promises every root the same rate. A root short of x
    by at most 1e-6 relative (the second phase holds the rate to 1e-9) has its trees scaled
    up to x; :func:`_fit` then scales every rate down together if a link is overloaded."""
    per_root: dict[int, list[tuple[_Col, float]]] = {r: [] for r in roots}
    for c, w in pairs:
        per_root[c.root].append((c, w))
    out = []
    for r in roots:
        left = x
        mine = []
        for c, w in sorted(per_root[r], key=lambda p: -p[1]):
            take = min(w, left)
            if take > x * 1e-12:
                mine.append((c, take))
            left -= take
        if 0 < left <= x * 1e-6:
            up = x / (x - left)
            mine = [(c, w * up) for c, w in mine]
        out += mine
    return out


def pack_allgather(topo: Topology, ranks, *, reverse: bool = False, few_trees: bool = True,
                   tolerance: float = 0.0, time_limit: float = _WALL_SAFETY_S,
                   few_trees_time: float = _FEW_ALLGATHER_BUDGET_S, shallow: bool = True) -> Packing:
    """Out-trees rooted at every rank, every root the same rate x, sharing link capacity
    (ForestColl); ``reverse=True`` packs in-trees for reduce-scatter. ``Packing.rate`` is x.
    With ``few_trees`` (up to 8 ranks) CP-SAT looks, for at most ``few_trees_time``
    deterministic seconds, for fewer trees giving every root at least (1 - tolerance) x the
    LP's rate. With ``shallow`` (up to _SHALLOW_PHASE_MAX_RANKS ranks) a second phase looks
    for a packing of the same rate over shallower trees (treepack_shallow.py; ``method``
    says "shallow(depth D)" when it finds one). Memoised like
    :func:`pack_broadcast` (allreduce and allgather of one program share the packing)."""
    args = (topo, tuple(ranks), reverse, few_trees, float(tolerance), float(time_limit), float(few_trees_time),
            bool(shallow))
    return _memo(_pack_allgather, args)


@functools.lru_cache(maxsize=64)
def _pack_allgather(topo: Topology, ranks: tuple[str, ...], reverse: bool, few_trees: bool, tolerance: float,
                    time_limit: float, few_trees_time: float, shallow: bool) -> Packing:
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
    # a switchless graph of 9-32 ranks with a few automorphisms moving every rank (one MI250
    # node): both phases over the symmetric master (treepack_symmetry._rank_symmetry); up to
    # 8 ranks CP-SAT's few-trees search runs on the plain master's columns instead
    small = (_rank_symmetry(ix) if sym is None and shallow and _FEW_MAX_ALLGATHER_RANKS < n <= _SHALLOW_PHASE_MAX_RANKS
             and not ix.has_switches else None)
    shallow_depth = None  # the second phase's depth bound, when it found one
    if small is not None:
        slots = list(small.slots)
        weights, cols, obj, scale, stop = _colgen_symmetric(ix, pricer, small, deadline, bound,
                                                            _seed_columns(ix, pricer, slots), shallowest=False)
        method = f"colgen-symmetric x{len(small.vperm)}" + (f"({stop})" if stop else "")
        lp_x = obj * scale
        if obj > 0 and not stop:
            got = shallow_packing(ix, pricer, slots, cols, weights, obj, scale, max(1, _SHALLOW_PHASE_PRICINGS // n),
                                  sym=small)
            if got is not None:
                weights, cols, _, depth = got
                method += f"+shallow(depth {depth})"
                shallow_depth = depth
        kept = [(c, w * scale) for c, w in zip(cols, weights) if w * scale > lp_x * 1e-12]
        pairs = _equalise([(_translate(c, small, k), w) for c, w in kept for k in range(len(small.vperm))],
                          roots, lp_x)
    elif sym is not None:
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
        if shallow and n <= _SHALLOW_PHASE_MAX_RANKS and obj > 0 and not stop:
            got = shallow_packing(ix, pricer, roots, cols, weights, obj, scale, max(1, _SHALLOW_PHASE_PRICINGS // n))
            if got is not None:
                weights, cols, _, depth = got
                method += f"+shallow(depth {depth})"
                shallow_depth = depth
        pairs = _equalise([(c, w * scale) for c, w in zip(cols, weights) if w * scale > lp_x * 1e-12],
                          roots, lp_x)
    lp_trees = len(pairs)
    x = lp_x
    if few_trees and lp_trees > n:
        # the exact target when the LP met the cut bound (then x* is a known fraction)
        at_bound = exact is not None and lp_x >= bound * (1 - 1e-9)
        target = exact * Fraction(1.0 - tolerance) if at_bound else (1.0 - tolerance) * lp_x
        got, note = _few_trees(ix, pricer, roots, cols, weights, target, exact if at_bound else None,
                               deadline, scale, few_trees_time, shallow_depth)
        if got is not None and shallow_depth is not None:
            note += f"+shallow(depth {shallow_depth})"
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
