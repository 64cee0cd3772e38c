"""hcc.backends.repair — pure functions that repair a plan's trees around dead and late ranks.

Nothing here does I/O: the adaptive executor (backends/adaptive.py) calls these functions with
the dead set and arrival order every survivor agreed on (backends/agreement.py), so every
survivor computes the same repaired trees without another message.

Terms
- parent array: ``parent[r]`` is the parent rank of ``r`` in a tree over ``n`` ranks, ``-1``
  for the root and for ranks the tree does not span (ir/plan.py :class:`~hcc.ir.plan.Tree`).
- repair (Hoplite, SIGCOMM 2021, sec. 4.3 "fault tolerance"): the children of a dead rank
  re-attach to their nearest *live ancestor*; every other edge is kept, so a survivor whose
  parent lives keeps its parent and the chunks it already holds. When the root itself is dead
  and the collective has no fixed root (allreduce), the orphan that comes first in the tree's
  breadth-first order is *promoted* to root and the other orphans of the root attach to it;
  a rooted collective (broadcast, reduce, gather) cannot be repaired then (:class:`RootLost`).
- arrival tree (Hoplite sec. 4.2, late arrivals): the ranks in the order they became ready,
  the root first, laid out as a ``k``-ary heap: position ``i``'s parent is position
  ``(i-1)//k``. Ranks that arrive first take the interior positions; late ranks are leaves.
- relay tree (late arrivals in a star allreduce): a block's owner sends the result to each
  other rank directly (a star), except that a child ``y`` may relay it to some of the others
  when the owner's link is the busier one (:func:`relay_parents`).
- claim, share-out (who owns a star allreduce's sub-blocks): before the last arrival a rank
  claims sub-blocks while its link, were the last rank to arrive now, would carry no more
  than an early owner's (:func:`claim_count`); at the last arrival the unclaimed ones go to
  the ranks whose links would finish first (:func:`share_by_load`), a load model in bytes
  after the last arrival built from the arrival clocks and the plan's link capacities.
- both directions: a link is full duplex, so its load after the last arrival is
  ``max(out / uplink, in / downlink)`` — out its pieces and the copies of what it owns, in
  the pieces still to come to it and the results of what it does not own (the arithmetic:
  docs/fault-tolerance.md, "Both directions of a link").

>>> repair_parents((-1, 0, 1, 1, 0), 0, {1})
(-1, -1, 0, 0, 0)
>>> arrival_parents((3, 0, 2, 1), 4, fanout=2)
(3, 0, 3, -1)
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from ..ir.errors import PlanError
from ..ir.plan import Tree

__all__ = [
    "claim_count", "share_by_load",
    "RootLost", "repair_parents", "repair_tree", "arrival_parents", "subtree", "bfs_order",
    "ancestors", "relay_parents",
]


class RootLost(PlanError):
    """The root of a rooted collective is dead: no repair can deliver its data."""


def bfs_order(parent: Sequence[int], root: int) -> list[int]:
    """Ranks reachable from ``root`` through ``parent``, parents before children (ties by rank)."""
    kids: dict[int, list[int]] = {}
    for c, p in enumerate(parent):
        if p >= 0:
            kids.setdefault(p, []).append(c)
    order, i = [root], 0
    seen = {root}
    while i < len(order):
        for c in kids.get(order[i], ()):
            if c not in seen:
                seen.add(c)
                order.append(c)
        i += 1
    return order


def ancestors(parent: Sequence[int], r: int) -> list[int]:
    """``r``'s ancestors, nearest first (bounded by n steps, so a cycle cannot hang)."""
    out, v = [], parent[r]
    while v >= 0 and len(out) <= len(parent):
        out.append(v)
        v = parent[v]
    return out


def repair_parents(parent: Sequence[int], root: int, dead: Iterable[int], *,
                   promote: bool = False) -> tuple[int, ...]:
    """The parent array with every dead rank removed and its orphans re-attached to their
    nearest live ancestor. The result's root is ``parent.index(-1)`` among spanned ranks;
    use :func:`bfs_order` to read it. ``promote``: when ``root`` is dead, promote its first
    orphan (breadth-first) instead of raising :class:`RootLost`."""
    dead = set(dead)
    n = len(parent)
    spanned = set(bfs_order(parent, root))
    new = [-1] * n
    new_root = root
    if root in dead:
        if not promote:
            raise RootLost(f"the root, rank {root}, is dead")
        live = [r for r in bfs_order(parent, root) if r not in dead]
        if not live:
            return tuple(new)
        new_root = live[0]
    for r in range(n):
        if r in dead or r not in spanned or r == new_root:
            continue
        up = next((a for a in ancestors(parent, r) if a not in dead), None)
        new[r] = new_root if up is None or up == r else up
    return tuple(new)


def repair_tree(tree: Tree, dead: Iterable[int], *, promote: bool = False) -> Tree:
    """:func:`repair_parents` applied to an ir :class:`Tree` (its paths become direct hops)."""
    dead = set(dead)
    parent = repair_parents(tree.parent, tree.root, dead, promote=promote)
    root = tree.root
    if root in dead:
        spanned = [r for r in bfs_order(tree.parent, tree.root) if r not in dead]
        root = spanned[0] if spanned else -1
    paths = tuple(() if p < 0 else (tree.paths[c] if c < len(tree.paths) and tree.parent[c] == p else ())
                  for c, p in enumerate(parent)) if tree.paths else ()
    return replace(tree, root=root, parent=parent, paths=paths)


def arrival_parents(order: Sequence[int], n: int, fanout: int = 2) -> tuple[int, ...]:
    """Heap layout of ``order`` (root first, then ranks in arrival order) over ``n`` ranks;
    ranks not in ``order`` get ``-1``."""
    if fanout < 1:
        raise ValueError(f"fanout must be at least 1, not {fanout}")
    parent = [-1] * n
    for i, r in enumerate(order):
        if i:
            parent[r] = order[(i - 1) // fanout]
    return tuple(parent)


def subtree(parent: Sequence[int], r: int) -> frozenset[int]:
    """``r`` and every rank below it."""
    kids: dict[int, list[int]] = {}
    for c, p in enumerate(parent):
        if p >= 0:
            kids.setdefault(p, []).append(c)
    out, stack = set(), [r]
    while stack:
        v = stack.pop()
        if v not in out:
            out.add(v)
            stack.extend(kids.get(v, ()))
    return frozenset(out)


def relay_parents(roots: Sequence[int], sizes: Sequence[float], uplink: Sequence[float],
                  arrived_at: dict, live: Sequence[int], n: int,
                  late_owned: Sequence[bool] | None = None) -> list[tuple[int, ...] | None]:
    """Down trees for star blocks ``i`` (owner ``roots[i]``, ``sizes[i]`` bytes) once every
    rank of ``live`` has arrived (``arrived_at[r]``: its clock, seconds): ``None`` where the
    star stays, else a parent array in which some children receive the block from a relay.

    Each rank's link gets a load, in seconds after the last arrival: what it still had to
    push then (the bytes of its pieces of the blocks it does not own over ``uplink[r]``,
    less the time since it arrived — except for the blocks ``late_owned[i]``, whose owner
    was decided only at the last arrival (the star allreduce's share-out): none of their
    pieces could leave before it, so all of them count), plus one block per direct child.
    Without that exception an early rank looked idle and was made a relay while it still
    pushed its pieces of the shared-out blocks: in a seed-42 trace (8 ranks, 64 MiB, 20 MB/s)
    23 of 56 sub-blocks were shared out, and the two earliest ranks each relayed 18 MB on
    top of 31 MB of such pieces and 67 MB of their own results — their uplinks ended last,
    0.9 s after every other link.

    While an owner has a direct child ``y`` with no piece left to push (load 0 before any
    relay) whose load after taking one more child stays half a block below the owner's,
    another of the owner's leaf children moves under ``y``: one copy of the block leaves the
    owner's link for ``y``'s. Most loaded owners first; bounded by n² x blocks moves. A rank
    still pushing pieces never relays, however light its load looks: with nobody late the
    rank that owns nothing pushes n-1 pieces, and every owner's results wait for them:

    >>> relay_parents([0, 1, 2], [100, 100, 100], [100.0] * 4, {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0},
    ...               [0, 1, 2, 3], 4)
    [None, None, None]

    Ranks 2 and 3 arrive 3 s after 0 and 1: owner 2 still has 2 s of pieces to push, so rank
    0, idle by then, relays its block to rank 3:

    >>> relay_parents([0, 1, 2], [100, 100, 100], [100.0] * 4, {0: 0.0, 1: 0.0, 2: 3.0, 3: 3.0},
    ...               [0, 1, 2, 3], 4)
    [None, None, (2, 2, -1, 0)]
    """
    blocks = range(len(roots))
    late = [bool(late_owned[i]) if late_owned is not None else False for i in blocks]
    load = {}
    last = max(arrived_at[r] for r in live)
    for r in live:
        push = sum(sizes[i] for i in blocks if roots[i] != r and not late[i]) / uplink[r]
        after = sum(sizes[i] for i in blocks if roots[i] != r and late[i]) / uplink[r]
        load[r] = max(0.0, push - (last - arrived_at[r])) + after
    # only a rank with no piece left to push may relay: every owner's results wait for the
    # pieces, and a relayed copy takes its fair share of the relay's uplink from them. In a
    # seed-42 trace the last rank (67 MB of pieces) and the one before it relayed 9.6 and
    # 8.4 MB: the last piece landed 3.9 s after the last arrival instead of ~3.4 s
    # (docs/fault-tolerance.md, "Where the time after the last arrival went")
    idle = {r for r in live if load[r] <= 0.0}
    parent = [{k: roots[i] for k in live if k != roots[i]} for i in blocks]
    for i in blocks:
        load[roots[i]] += len(parent[i]) * sizes[i] / uplink[roots[i]]
    for _ in range(n * n * max(1, len(roots))):
        moved = False
        for o in sorted(set(roots), key=lambda r: (-load[r], r)):
            for i in (j for j in blocks if roots[j] == o):
                par = parent[i]
                direct = [k for k, p in par.items() if p == o]
                relays = {p for p in par.values() if p != o}
                if len(direct) < 2:
                    continue
                idle_direct = [k for k in direct if k in idle]
                if not idle_direct:
                    continue
                y = min(idle_direct, key=lambda r: (load[r], r))
                leaves = [k for k in direct if k not in relays and k != y]
                if not leaves or load[y] + sizes[i] / uplink[y] > load[o] - sizes[i] / uplink[o] / 2:
                    continue
                x = max(leaves, key=lambda r: (load[r], r))
                par[x] = y
                load[o] -= sizes[i] / uplink[o]
                load[y] += sizes[i] / uplink[y]
                moved = True
                break
            if moved:
                break
        if not moved:
            break
    return [tuple(parent[i].get(r, -1) for r in range(n)) if any(p != roots[i] for p in parent[i].values())
            else None for i in blocks]


def claim_count(free: Sequence[int], owned: int, push: int, backlog: int, present: int, n: int,
                cap: float, speed: float = 1.0, *, total: int | None = None,
                speed_in: float | None = None) -> int:
    """How many of the unowned star sub-blocks ``free`` (bytes each, in flow order) a rank
    may claim now, before the last arrival (the *claim rule* of the star allreduce).

    The model: if the last rank arrived now, this rank's link would still have to carry, in
    each direction (full duplex, so the slower direction sets the time):

    - out: ``push`` bytes of its own pieces (queued, or owed to known owners) plus ``n-1``
      copies of every sub-block it owns;
    - in (when ``total``, the bytes of all star sub-blocks, is given): ``backlog`` — the
      pieces the ``present`` ranks still owe it — plus one piece from each of the ``n -
      present`` absent ranks for every byte it owns, plus the results of everything it does
      not own (``total - owned``).

    A claim is allowed while each direction stays within ``(n-1) x cap`` — the load of a rank
    that owns ``cap`` bytes and had pushed everything, i.e. what an early owner's link
    carries out after the last arrival — and while the rank owns at most ``cap``. Owning
    ``s`` more bytes adds ``(n-1) s`` out and ``(n - present - 1) s`` in: while two or more
    ranks are absent the incoming side bounds a claim before the outgoing one does, since
    every absent rank may arrive last and send its pieces into this link then.
    ``speed`` / ``speed_in``: this rank's link out / in over the fastest rank link of the
    plan (<= 1): a slower link gets a budget that takes it as long to drain.
    So a rank that arrives shortly before the last, with most of its input still to push,
    claims little (on a slower link nothing) and ends like the last rank: pieces up, results
    down. Pacing: at most about one sub-block of pieces (from the ``present`` ranks) may be
    on its way in (``backlog``), so what a rank cannot absorb before the last arrival stays
    unowned and is shared by load then (:func:`share_by_load`).

    Eight ranks, 56 sub-blocks of 1 unit, cap 10 units (1.25 equal shares): an early rank
    with nothing queued takes two at once; one with 50 units of pieces still queued on a link
    half as fast as the fastest takes none (50 + 7 > 7 x 10 x 0.5):

    >>> claim_count([1] * 20, owned=0, push=0, backlog=0, present=3, n=8, cap=10)
    2
    >>> claim_count([1] * 20, owned=0, push=50, backlog=0, present=8, n=8, cap=10, speed=0.5)
    0

    The incoming side: four of eight ranks present, one owning 4 units of 56: out it would
    carry 7 x 5 = 35 <= 70 units with one more, but in 4 x 5 (the absent ranks' pieces) + 51
    (results) = 71 > 70 — it waits until another rank arrives:

    >>> claim_count([1] * 20, owned=4, push=0, backlog=0, present=4, n=8, cap=10)
    2
    >>> claim_count([1] * 20, owned=4, push=0, backlog=0, present=4, n=8, cap=10, total=56)
    0
    """
    per = max(1, present - 1)
    budget = (n - 1) * cap * speed
    budget_in = (n - 1) * cap * (speed if speed_in is None else speed_in)
    absent = max(0, n - present)
    m, mine = 0, owned
    for size in free:
        if mine + size > cap or push + (n - 1) * (mine + size) > budget:
            break
        if total is not None and backlog + absent * (mine + size) + (total - mine - size) > budget_in:
            break
        if backlog + m * per * size > per * size:
            break
        m += 1
        mine += size
    return m


def share_by_load(flows: Sequence[tuple[int, int, int]], live: Sequence[int], arrived_at: dict,
                  uplink: Sequence[float], n: int,
                  downlink: Sequence[float] | None = None) -> dict[int, int]:
    """Owners for the star sub-blocks nobody claimed, at the last arrival: ``flows`` is
    ``(flow id, bytes, owner or -1)`` in flow order, ``live`` the live ranks in arrival order,
    ``arrived_at[r]`` rank r's clock at arrival (s), ``uplink[r]`` / ``downlink[r]`` its
    link's bytes/s out / in (``downlink`` defaults to ``uplink``).

    Each rank's link gets two loads in bytes after the last arrival (time L), one per
    direction of its full-duplex link; the slower to drain sets when it finishes:

    - out: the pieces it still had to push to the owners known before L (``rem[r]``: their
      bytes less what its link moved since it arrived), every piece of the unowned
      sub-blocks, and ``n-1`` copies of each sub-block it owns;
    - in: the results of every sub-block it does not own, plus the part of every other
      rank's ``rem[k]`` that goes to it — ``rem[k]`` split over the known owners in
      proportion to what they own (rank k pushes to all of them at once, TCP sharing its
      link fairly). This is the term the out-only model missed: early owners at the claim
      cap, with four ranks arriving in the last 0.82 s, take those ranks' pieces *and* the
      results in (1.54 hops in seed 7's worst rep).

    Owning a sub-block of ``s`` bytes adds ``(n-2) s`` to both directions (``n-1`` copies out
    but its own piece no longer goes up; ``n-1`` pieces in but its result no longer comes
    down), so each unowned sub-block goes to the rank whose link would then finish first,
    ``max(out / uplink, in / downlink)`` (ties: the earlier arrival). Returns ``{flow id:
    owner}`` for the unowned flows only (a flow whose owner is not in ``live`` keeps it: its
    heir is decided elsewhere). Nobody late and nothing claimed: every rank gets an equal
    share, the last one included (2(n-1)/n of a hop on every link, a direct reduce-scatter +
    allgather):

    >>> share_by_load([(i, 1, -1) for i in range(6)], [2, 0, 1], {0: 0.0, 1: 0.0, 2: 0.0}, [1.0] * 3, 3)
    {0: 2, 1: 0, 2: 1, 3: 2, 4: 0, 5: 1}

    Rank 1 arrives 3 s after 0 and 2, which claimed 2 units each and pushed their pieces:
    rank 1's 4 units of pieces still fill its link, so the rest goes to the early ranks:

    >>> share_by_load([(0, 1, 0), (1, 1, 0), (2, 1, 2), (3, 1, 2), (4, 1, -1), (5, 1, -1)],
    ...               [0, 2, 1], {0: 0.0, 2: 0.0, 1: 3.0}, [1.0] * 3, 3)
    {4: 0, 5: 2}
    """
    live = list(live)
    if not live:
        return {}
    down = uplink if downlink is None else downlink
    last = max(arrived_at.get(r, float("-inf")) for r in live)
    if last == float("-inf"):
        last = 0.0
    owned = {r: 0 for r in live}
    for _, size, o in flows:
        if o in owned:
            owned[o] += size
    known = sum(owned.values())
    free = sum(size for _, size, o in flows if o < 0)
    total = known + free
    rem = {}
    for r in live:
        since = last - arrived_at.get(r, last)
        rem[r] = max(0.0, (known - owned[r]) - uplink[r] * since)
    out_load, in_load = {}, {}
    for r in live:
        out_load[r] = rem[r] + free + (n - 1) * owned[r]
        late = sum(rem[k] * owned[r] / (known - owned[k]) for k in live if k != r and known - owned[k] > 0)
        in_load[r] = (total - owned[r]) + late
    rank_pos = {r: i for i, r in enumerate(live)}

    def finish(x: int, add: float) -> float:
        return max((out_load[x] + add) / uplink[x], (in_load[x] + add) / down[x])

    out = {}
    for fid, size, o in flows:
        if o >= 0:
            continue
        r = min(live, key=lambda x: (finish(x, (n - 2) * size), rank_pos[x]))
        out_load[r] += (n - 2) * size
        in_load[r] += (n - 2) * size
        out[fid] = r
    return out
