"""hcc.compiler.tree_floor — a lower bound on a tree packing's plans at a chunk size.

Terms
- *share* of a tree: the bytes it carries. Every tree plan of a packing (lower.lower_priced:
  the timed schedule, whatever shares its rebalancing gives the trees, and the plain order)
  splits each *group*'s bytes between the group's trees — the whole buffer among the trees
  of a broadcast or reduce, each root's block among that root's trees for allgather and
  reduce-scatter (and allreduce where every rank roots a tree) — and moves a tree's share
  over every edge of the tree in messages of at most the chunk size ``s``, each hop over the
  links of the edge's path (walked backwards for the in-trees of reduce and
  reduce-scatter, both ways for allreduce).
- *effective capacity* ``c'(e) = c(e) s / (s + c(e) k(e))``, ``k(e) = α(e) +
  per_message_s`` (bounds.effective_capacity): a link busy for ``k(e) + b / c(e)`` per
  message of ``b <= s`` bytes moves at most ``c'(e)`` bytes per second (compiler/
  chunk_floor.py derives it).

The floor (:func:`tree_floor`): with shares ``f_T`` of their groups, link ``e`` is busy at
least ``busy(e) = sum_T m_T(e) f_T B_g / c'(e)`` (``m_T(e)`` the tree's hops over ``e``,
``B_g`` the group's bytes), and the plan lasts at least ``max_e busy(e)``. The least of that
over every split of the groups is an LP; any link weights ``y >= 0`` summing to 1 bound it
from below (weak duality): ``max_e busy(e) >= sum_e y(e) busy(e) >= sum_g B_g min_{T in g}
sum_e y(e) m_T(e) / c'(e)``. GLOP's duals give the ``y``, and the bound is evaluated from
them here, so it holds whatever the solver's tolerance. It is the chunk floor restricted to
the packing's own trees, and tighter where the trees crowd fast links, whose effective
capacity drops most at small chunks: on one MI250 node the allgather trees' floor at 1 MiB
chunks is 1.18x the cut bound (the cut floor 1.125x), above the multi-channel rings' 1.148x,
so that size, the costliest of the trees' chunk search, is not lowered.

The reduce-scatter + allgather trees (``treepack-rsag``, :func:`rsag_floor`) take weights
spread evenly over the links busiest at the packed shares instead of the LP's (no solve over
hundreds of trees), and price every chunk above the largest block at the block, since no
message of a per-root tree carries more than its root's block.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .bounds import effective_capacity, merged_arcs

__all__ = ["tree_floor", "rsag_floor", "packing_floor", "with_trees", "egress_floor", "candidate_floor"]

# the kinds whose tree plans move each tree's share once over every tree edge
_FORWARD = frozenset({"broadcast", "allgather"})
_BACKWARD = frozenset({"reduce", "reduce_scatter"})


def tree_floor(trees, topo: Any, kind: str, ranks, size_bytes: int, itemsize: int,
               per_message_s: float) -> "_TreeFloor | None":
    """``T(s)`` (module docstring) for the tree plans of ``trees`` (PackedTree values of a
    ``kind`` packing over ``ranks``), or None where it does not apply (another kind, a path
    off the topology's links)."""
    if kind not in _FORWARD and kind not in _BACKWARD and kind != "allreduce" or not trees:
        return None
    arcs = merged_arcs(topo)
    index: dict[tuple[str, str], int] = {}
    use: dict[tuple[int, int], int] = {}
    # allreduce moves each tree's share up every edge (reduce) and down it (broadcast)
    ways = (True, False) if kind == "allreduce" else (kind in _BACKWARD,)
    for t, tree in enumerate(trees):
        for parent, child, *rest in tree.edges:
            path = tuple(rest[0]) if rest else (parent, child)
            for back in ways:
                for hop in (zip(path[1:], path) if back else zip(path, path[1:])):
                    if hop not in arcs:
                        return None
                    a = index.setdefault(hop, len(index))
                    use[(t, a)] = use.get((t, a), 0) + 1
    keys = list(index)
    m = np.zeros((len(trees), len(keys)))
    for (t, a), k in use.items():
        m[t, a] = k
    return _floor_of(m, keys, arcs, trees, kind, ranks, size_bytes, itemsize, per_message_s,
                     solve_once=kind == "allreduce")


def _floor_of(m: np.ndarray, keys, arcs, trees, kind: str, ranks, size_bytes: int, itemsize: int,
              per_message_s: float, solve_once: bool = False, tight: bool = False) -> "_TreeFloor | None":
    """The :class:`_TreeFloor` of hop counts ``m`` (tree x arc ``keys``): the groups, each
    tree's packed share of its group, the group bytes and the largest message."""
    cap = np.array([arcs[k][0] for k in keys])
    cost = np.array([arcs[k][1] + per_message_s for k in keys])
    elems = size_bytes // itemsize
    per_root = kind in ("allgather", "reduce_scatter")
    if kind == "allreduce":  # lower.py's per_root: reduce-scatter + allgather when every rank roots a tree
        per_root = {t.root for t in trees} == set(ranks)
    if per_root:
        group_of = {r: g for g, r in enumerate(ranks)}
        block = (elems // len(ranks)) * itemsize  # the smallest block: the floor stays below
        most = -(-elems // len(ranks)) * itemsize  # the largest: no message carries more
        groups = [group_of.get(t.root) for t in trees]
        if any(g is None for g in groups):
            return None
    else:
        block = most = elems * itemsize
        groups = [0] * len(trees)
    members: dict[int, list[int]] = {}
    for t, g in enumerate(groups):
        members.setdefault(g, []).append(t)
    rate = np.array([max(0.0, float(t.rate)) for t in trees])
    share = np.zeros(len(trees))  # each tree's packed share of its group
    for ts in members.values():
        total = float(rate[ts].sum())
        share[ts] = rate[ts] / total if total > 0 else 1.0 / len(ts)
    return _TreeFloor(m, cap, cost, block, members, share, solve_once=solve_once,
                      most=most if tight else None, tight=tight)


def rsag_floor(trees, topo: Any, ranks, size_bytes: int, itemsize: int,
               per_message_s: float) -> "_TreeFloor | None":
    """``T(s)`` of the reduce-scatter + allgather trees of an allreduce (``trees`` rooted at
    every rank, each share up and down every edge), as :func:`tree_floor` gives it, with two
    changes that keep it a lower bound and make it cheap where there are hundreds of trees:

    - the link weights are not the LP's duals but even over the links busiest at the packed
      shares (``_TreeFloor.tight``; weak duality holds for any weights), so no GLOP solve
      (2.7 s on the 512-rank allreduce's 896 trees);
    - no message carries more than one root's block (lower.py cuts each tree's span of its
      root's block into chunks), so a chunk size above the largest block prices the links'
      effective capacity at the block: on the 512-rank DGX-1 cluster (blocks of 512 KiB, a NIC's
      5 + 1 us per message at 12.5 GB/s) that is 0.875 of its capacity, and the floor rises
      above the two-level plan before any of these trees is lowered;
    - the hop counts are summed per distinct path with numpy, not per hop in a dict.

    None where the trees do not root at every rank or a path leaves the topology's links."""
    if not trees or {t.root for t in trees} != set(ranks):
        return None
    arcs = merged_arcs(topo)
    path_id: dict[tuple[str, ...], int] = {}
    tree_col, path_col = [], []
    for t, tree in enumerate(trees):
        for parent, child, *rest in tree.edges:
            path = tuple(rest[0]) if rest else (parent, child)
            p = path_id.get(path)
            if p is None:
                p = path_id[path] = len(path_id)
            tree_col.append(t)
            path_col.append(p)
    index: dict[tuple[str, str], int] = {}
    hop_arc: list[int] = []
    hops = np.zeros(len(path_id), dtype=np.int64)
    for path, p in path_id.items():  # up (reduce) and down (broadcast) every edge
        for hop in list(zip(path[1:], path)) + list(zip(path, path[1:])):
            if hop not in arcs:
                return None
            hop_arc.append(index.setdefault(hop, len(index)))
        hops[p] = 2 * (len(path) - 1)
    T, P, A = len(trees), len(path_id), len(index)
    pairs, count = np.unique(np.array(tree_col, dtype=np.int64) * P + np.array(path_col, dtype=np.int64),
                             return_counts=True)
    tree_of, path_of = pairs // P, pairs % P
    start = np.concatenate([[0], np.cumsum(hops)[:-1]])
    lens = hops[path_of]
    pos = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(start[path_of], lens)
    arc = np.array(hop_arc, dtype=np.int64)[pos]
    m = np.bincount(np.repeat(tree_of, lens) * A + arc, weights=np.repeat(count, lens).astype(float),
                    minlength=T * A).reshape(T, A)
    return _floor_of(m, list(index), arcs, trees, "allreduce", ranks, size_bytes, itemsize, per_message_s,
                     tight=True)


class _TreeFloor:
    """``T(s)`` of one packing (call it); :meth:`upper` is the busiest link at the packed
    shares, an upper bound of the LP (so of ``T(s)``) without solving it."""

    def __init__(self, m: np.ndarray, cap: np.ndarray, cost: np.ndarray, block: float,
                 members: dict[int, list[int]], share: np.ndarray, solve_once: bool = False,
                 most: float | None = None, tight: bool = False):
        self.m, self.cap, self.cost, self.block = m, cap, cost, block
        self.members, self.share = members, share
        # weak duality holds for any weights: ``solve_once`` keeps the first solve's and
        # evaluates every later size with them (the 512-rank allreduce's 896 trees, both ways:
        # 2.7 s per GLOP solve, at every size of the chunk search otherwise)
        self.solve_once = solve_once
        # ``most``: no message carries more bytes (a group's bytes), so no chunk above it
        # changes a link's effective capacity; ``tight``: the weights are not the LP's but
        # spread evenly over the links busiest at the packed shares (its value is a lower
        # bound all the same; no GLOP solve)
        self.most, self.tight = most, tight
        self._y: np.ndarray | None = None

    def _busy(self, s: int) -> np.ndarray:
        """Seconds per unit share, per (tree, link), at chunks of ``s`` bytes."""
        if self.most is not None:
            s = min(s, self.most)
        inv = 1.0 / np.array([effective_capacity(c, k, s) for c, k in zip(self.cap, self.cost)])
        return self.m * (self.block * inv)

    def upper(self, s: int) -> float:
        return float((self.share @ self._busy(s)).max())

    def __call__(self, s: int) -> float:
        busy = self._busy(s)
        if self.tight:
            load = self.share @ busy
            y = (load >= load.max() * (1 - TIGHT)).astype(float)
            y /= y.sum()
        else:
            y = self._y if self.solve_once and self._y is not None else _link_weights(busy, self.members)
            if self.solve_once and self._y is None:
                self._y = y
        if y is None:
            return 0.0
        per_tree = busy @ y
        # less a hair for the rounding of these sums (the bound itself is exact)
        return float(sum(per_tree[ts].min() for ts in self.members.values())) * (1 - 1e-9)


# the links within this fraction of the busiest at the packed shares carry the weights of the
# rsag trees' floor (:func:`rsag_floor`); on the 512-rank DGX-1 cluster they are the NICs'
TIGHT = 1e-3


def _link_weights(busy: np.ndarray, members: dict[int, list[int]]) -> np.ndarray | None:
    """Link weights (>= 0, summing to 1) from the duals of ``min t`` s.t. ``sum_T busy[T, e]
    f_T <= t`` on every link and every group's shares summing to 1; None if GLOP fails."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        return None
    norm = float(busy.max())
    if norm <= 0:
        return None
    a = busy / norm  # coefficients near 1: GLOP drops entries below its tolerance
    inf = solver.infinity()
    f = [solver.NumVar(0.0, inf, "") for _ in range(a.shape[0])]
    t = solver.NumVar(0.0, inf, "t")
    rows = []
    for e in range(a.shape[1]):
        ct = solver.Constraint(-inf, 0.0)
        for k in np.flatnonzero(a[:, e]):
            ct.SetCoefficient(f[int(k)], float(a[k, e]))
        ct.SetCoefficient(t, -1.0)
        rows.append(ct)
    for ts in members.values():
        ct = solver.Constraint(1.0, 1.0)
        for k in ts:
            ct.SetCoefficient(f[k], 1.0)
    solver.Minimize(t)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    y = np.array([abs(ct.dual_value()) for ct in rows])
    total = float(y.sum())
    return y / total if total > 0 else None


def packing_floor(u: Any, algorithm: str) -> "_TreeFloor | None":
    """The tree floor of pipeline unit ``u``'s ``algorithm`` candidate: ``treepack`` (its
    plans are lower.lower_priced over the packing's trees; an allreduce moves each tree's
    share up and down every edge), uncompressed, of the four kinds above and allreduce, by
    :func:`tree_floor`; ``treepack-rsag`` (the same lowering over per-root trees) by
    :func:`rsag_floor`; None elsewhere."""
    from ..ir.plan import DTYPE_SIZES

    spec = u.spec
    if algorithm not in ("treepack", "treepack-rsag") or spec.compress != "none" or len(spec.ranks) < 2:
        return None
    packing = u.packing("trees" if algorithm == "treepack" else "rsag")
    if packing is None:
        return None
    if algorithm == "treepack-rsag":
        return rsag_floor(packing.trees, u.topology, spec.ranks, spec.size_bytes, DTYPE_SIZES[spec.dtype],
                          u.model.per_message_s)
    return tree_floor(packing.trees, u.topology, spec.kind, spec.ranks, spec.size_bytes,
                      DTYPE_SIZES[spec.dtype], u.model.per_message_s)


def with_trees(floor: Callable[[int], float] | None, u: Any, algorithm: str,
               incumbent: float) -> Callable[[int], float] | None:
    """``floor`` (the cut's chunk floor, or None) raised to ``algorithm``'s tree floor where
    it alone would not exceed ``incumbent``; the tree floor's LP is solved only then, and
    only at sizes where the trees at their packed shares would exceed ``incumbent`` too
    (elsewhere the LP's optimum, below that, cannot prune)."""
    if not incumbent < float("inf"):
        return floor
    made: list = []

    def both(s: int) -> float:
        base = floor(s) if floor is not None else 0.0
        if base > incumbent:
            return base
        if not made:
            made.append(packing_floor(u, algorithm))
        if made[0] is None or made[0].upper(s) <= incumbent:
            return base
        return max(base, made[0](s))

    return both


# rank-to-rank sends per element of a tree plan: each non-root rank receives (out-trees) or
# sends (in-trees) every element of its tree's share once; allreduce does both
_SENDS_PER_ELEMENT = {"broadcast": 1, "reduce": 1, "allgather": 1, "reduce_scatter": 1, "allreduce": 2}


def egress_floor(u: Any, algorithm: str) -> Callable[[int], float] | None:
    """A lower bound at chunk size ``s`` on every plan of ``algorithm`` (``treepack`` of the
    kinds of :data:`_SENDS_PER_ELEMENT`, ``treepack-rsag``) from what the ranks must send:

    - every element of the buffer leaves a rank ``p(n-1)`` times (``p`` sends per element and
      non-root rank: 2 for allreduce, reduce then broadcast or reduce-scatter then
      allgather), so the ranks send ``D = p (n-1) M`` bytes in all;
    - a group's bytes ``B_g`` (the buffer; for the groups of one root, its block) are split
      among its trees, each tree's share cut into chunks of at most ``s`` bytes, and every
      chunk crosses each of its tree's ``n - 1`` edges as one message, so the ranks send at
      least ``p (n-1) sum_g ceil(B_g / s)`` messages (``sum_T ceil(x_T) >= ceil(sum_T x_T)``);
    - a message leaves its sender over one of the sender's out-links ``e``, holding it for
      ``k(e) + b / c(e)``; every reservation lies inside the plan's time ``T``, so
      ``T sum_R c(e) >= sum_R c(e) busy(e) >= D + messages x min_R c(e) k(e)`` over the
      links ``R`` that leave ranks.

    On the 1024-rank fat tree (one 12.5 GB/s link per rank, 2 us per message) the allreduce
    over 1024 per-root groups at one chunk per block floors at 42.9 + 4.1 ms, which the
    reduce-scatter + allgather trees (1472 trees, 7 million ops) cannot beat, so a faster
    plan found first spares their lowering. None for other algorithms or kinds, compression
    (wire bytes are not the buffer's) or fewer than 2 ranks."""
    from ..ir.plan import DTYPE_SIZES, block_range

    spec = u.spec
    kind, n = spec.kind, len(spec.ranks)
    if spec.compress != "none" or n < 2 or kind not in _SENDS_PER_ELEMENT:
        return None
    if algorithm == "treepack-rsag":
        if kind != "allreduce":
            return None
        per_root = True
    elif algorithm == "treepack":
        per_root = kind in ("allgather", "reduce_scatter")
    else:
        return None
    ranks = set(spec.ranks)
    out = [(c, a + u.model.per_message_s) for (src, _), (c, a) in merged_arcs(u.topology).items()
           if src in ranks and c > 0]
    if not out:
        return None
    total_cap = sum(c for c, _ in out)
    fixed = min(c * k for c, k in out)  # bytes' worth of link time one message costs, at least
    itemsize = DTYPE_SIZES[spec.dtype]
    elems = spec.size_bytes // itemsize
    groups = [b - a for a, b in (block_range(elems, n, j) for j in range(n))] if per_root else [elems]
    p = _SENDS_PER_ELEMENT[kind]
    data = p * (n - 1) * elems * itemsize

    def floor(s: int) -> float:
        ce = max(1, s // itemsize)  # a chunk of s bytes holds this many whole elements
        messages = p * (n - 1) * sum(-(-g // ce) for g in groups)
        return (data + messages * fixed) / total_cap * (1 - 1e-12)

    return floor


def candidate_floor(floor: Callable[[int], float] | None, u: Any, algorithm: str,
                    incumbent: float) -> Callable[[int], float] | None:
    """The largest of the lower bounds known for ``algorithm``'s plans at a chunk size: the
    cut's chunk floor ``floor``, the tree floor (:func:`with_trees`, solved only where it
    could prune) and the egress floor (:func:`egress_floor`)."""
    trees = with_trees(floor, u, algorithm, incumbent)
    egress = egress_floor(u, algorithm)
    if egress is None:
        return trees
    if trees is None:
        return egress

    def both(s: int) -> float:
        e = egress(s)
        return e if e > incumbent else max(e, trees(s))

    return both
