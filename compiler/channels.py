"""hcc.compiler.channels — NCCL's multi-channel rings: the channel search and its schedule.

Terms
- channel: one ring over every rank (:class:`RingChannel`: its order, the rate it may use on
  every link it crosses, and the route of each hop). NCCL's graph search (src/graph/search.cc)
  picks a per-channel bandwidth from high to low and, at each, looks for as many rings as it
  can, every ring consuming that bandwidth on every link it crosses (a path through a switch
  consumes it on each hop), until the channels' total stops improving; the data is then split
  over the channels.
- :func:`ring_channels` does the same on any hcc topology: per-channel rates ``c / k`` for each
  link capacity ``c`` of a rank and ``k = 1..8``, highest first; at each, Hamiltonian cycles
  found one at a time by a bounded depth-first search (direct links widest first, then switch
  routes to ranks nearby in rank order, as NCCL orders GPUs; on hosts of equal size a ring
  visits all of a host's ranks before it leaves, crossing each server once as NCCL's rings
  do), subtracting each ring's rate from the links it uses; the best total wins (fewer
  channels on a tie). A rate at which the links that can carry it do not connect the ranks
  is not searched (no ring could use it). The search stops early once the total reaches ``min(least capacity into
  or out of a rank, narrowest cut between ranks)``, which no set of rings can exceed (every
  ring leaves every rank and crosses every cut). On DGX-1's NVLinks it finds NCCL's six rings
  of 25 GB/s; on two 8-GPU NVSwitch servers with 8 x 25 GB/s NICs, eight rings of 25 GB/s
  (one per NIC pair).
- :func:`rings_plan` (the ``rings`` baseline, compiler/registry.py): each kind runs per channel
  on a share of the buffer proportional to the channel's rate: the ring allreduce
  (baselines.py), the n-1-step ring allgather / reduce-scatter (a chain per rank along the
  ring), and a chain from (into) the root for broadcast and scatter (reduce and gather).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, Plan, Tree
from ..ir.topology import Topology
from . import compact
from .lower import ProgramBuilder, assemble, chunk_elems, lower, plan_op, split_by_rate
from .routes import shortest_preds
from .trees import PackedTree

__all__ = ["RingChannel", "ring_channels", "ring_channels_memo", "rings_plan", "rings_priced", "ring_priced", "ring_allreduce_columns", "ring_columns", "columns_allowed", "columns_wanted",
           "MAX_CHANNELS"]

# NCCL searches at most MAXCHANNELS/2 = 16 ring channels (it then duplicates them, which adds
# no bandwidth); the same cap here
MAX_CHANNELS = 16
# per-channel rates tried: c / k for k = 1 .. 8 (NCCL's speed arrays step down in about as
# many steps per link type)
_SPEED_DIVISORS = 8
# a ring may use up to this many shortest switch routes per rank pair (a fat tree's spines)
_ROUTES_PER_PAIR = 8
# depth-first search budget, in extensions: per ring 50 000 (DGX-1's rings are found in
# dozens), at least 20 per rank on large topologies; 2 000 000 for the whole search (a few
# seconds of CPython), after which the best channels found so far are used
_RING_BUDGET = 50_000
_TOTAL_BUDGET = 2_000_000
# up to 64 ranks the rings of one rate are searched together, backtracking across rings
# (K4 with unit links: six half-rate rings reach 3 GB/s where whole-link rings stop at 2), at
# most this many extensions per rate
_PACK_BUDGET = 5_000
# a lower per-channel rate is searched only if its most channels could beat the best total by
# this much: DGX-1's six NVLink rings (150 GB/s) against thirteen of 12 GB/s that would need
# every GPU's PCIe too (156 GB/s, and not what NCCL builds); NCCL also stops at "good enough"
_IMPROVE = 1.05
# switch-route candidates tried per rank visit on topologies above 64 ranks (nearest in rank
# order first): a ring over 1024 ranks cannot afford every rank at every step
_FAR_CANDIDATES = 24
_SMALL = 64


@dataclass(frozen=True)
class RingChannel:
    """One ring channel: ``order`` (rank positions, the ring's direction), its ``rate``
    (bytes/s it may use on every link it crosses) and ``paths[i]``, the topology vertices from
    ``order[i]`` to ``order[i + 1 mod n]``."""

    order: tuple[int, ...]
    rate: float
    paths: tuple[tuple[str, ...], ...]


class _Search:
    def __init__(self, topo: Topology, ranks: Sequence[str]):
        self.ranks = tuple(ranks)
        self.n = len(self.ranks)
        sub = topo.restricted(self.ranks)
        self.switches = set(sub.switches)
        self.cap: dict[tuple[str, str], float] = {}
        for l in sub.links:
            if l.src != l.dst:
                self.cap[(l.src, l.dst)] = self.cap.get((l.src, l.dst), 0.0) + l.capacity
        self.out: dict[str, list[str]] = {}
        for (u, v) in sorted(self.cap):
            self.out.setdefault(u, []).append(v)
        self.pos = {v: i for i, v in enumerate(self.ranks)}
        self._routes: dict[tuple[int, int], tuple[tuple[str, ...], ...]] = {}
        self._bfs: dict[str, dict[str, list[str]]] = {}
        self.direct: list[list[int]] = []
        for i, name in enumerate(self.ranks):
            nb = [(self.cap[(name, y)], self.pos[y]) for y in self.out.get(name, ()) if y in self.pos]
            nb.sort(key=lambda cv: (-cv[0], (cv[1] - i) % self.n))
            self.direct.append([v for _, v in nb])
        self.spent = 0

    def routes(self, u: int, v: int) -> tuple[tuple[str, ...], ...]:
        """The direct link, else up to :data:`_ROUTES_PER_PAIR` shortest switch-only routes."""
        key = (u, v)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        a, b = self.ranks[u], self.ranks[v]
        if (a, b) in self.cap:
            found: tuple[tuple[str, ...], ...] = ((a, b),)
        else:
            found = self._switch_routes(a, b)
        self._routes[key] = found
        return found

    def _switch_routes(self, a: str, b: str) -> tuple[tuple[str, ...], ...]:
        preds = self._bfs.get(a)
        if preds is None:  # once per source: the 512-rank DGX-1 cluster's fabric is 1 500
            # vertices, and a search per rank pair took 38 s per ring
            preds = self._bfs[a] = shortest_preds(self.out, self.switches, a)
        if b not in preds:
            return ()
        out: list[tuple[str, ...]] = []
        stack: list[tuple[str, tuple[str, ...]]] = [(b, (b,))]
        while stack and len(out) < _ROUTES_PER_PAIR:
            x, tail = stack.pop()
            if x == a:
                out.append(tail)
                continue
            for p in reversed(preds[x]):
                stack.append((p, (p,) + tail))
        return tuple(out)

    def connected_at(self, rate: float) -> bool:
        """Whether every rank reaches every other over links of at least ``rate`` (through
        any vertices): a ring at ``rate`` crosses only such links and passes every rank, so
        none exists otherwise. On two A100 servers every rate above a NIC's 25 GB/s fails
        this, and the ring searches at those rates (0.4 s, each spending its whole budget
        before giving up) are not run."""
        fwd: dict[str, list[str]] = {}
        back: dict[str, list[str]] = {}
        for (u, v), c in self.cap.items():
            if c >= rate * (1 - 1e-9):
                fwd.setdefault(u, []).append(v)
                back.setdefault(v, []).append(u)
        for adj in (fwd, back):
            seen = {self.ranks[0]}
            todo = [self.ranks[0]]
            while todo:
                for y in adj.get(todo.pop(), ()):
                    if y not in seen:
                        seen.add(y)
                        todo.append(y)
            if not all(r in seen for r in self.ranks):
                return False
        return True

    def set_hosts(self, topo: Topology) -> bool:
        """Keep each ring inside a host until it has visited all of the host's ranks, as
        NCCL's rings cross each server once (it chains the GPUs of a node between one NIC in
        and one out): only where every rank is on a host and the hosts are the same size."""
        host = dict(topo.hosts)
        hs = [host.get(v) for v in self.ranks]
        if any(h is None for h in hs):
            return False
        sizes: dict[str, int] = {}
        for h in hs:
            sizes[h] = sizes.get(h, 0) + 1
        if len(sizes) < 2 or len(set(sizes.values())) != 1:
            return False
        self.host_of = hs
        self.host_size = next(iter(sizes.values()))
        return True

    host_of: list | None = None
    host_size = 0

    def candidates(self, u: int, used: list[bool]):
        if self.host_of is not None:
            yield from self._host_candidates(u, used)
            return
        seen = set()
        for v in self.direct[u]:
            if not used[v]:
                seen.add(v)
                yield v
        limit = self.n if self.n <= _SMALL else _FAR_CANDIDATES
        tried = 0
        for d in range(1, self.n):
            v = (u + d) % self.n
            if used[v] or v in seen:
                continue
            yield v
            tried += 1
            if tried >= limit:
                return

    def _host_candidates(self, u: int, used: list[bool]):
        """Unvisited ranks of u's host while there are any (direct links first, then rank
        order), else the ranks of other hosts not yet entered, nearest in rank order."""
        h = self.host_of[u]
        same = [v for v in self.direct[u] if not used[v] and self.host_of[v] == h]
        seen = set(same)
        same += [v for v in ((u + d) % self.n for d in range(1, self.n))
                 if not used[v] and v not in seen and self.host_of[v] == h]
        if same:
            yield from same
            return
        entered = {self.host_of[v] for v in range(self.n) if used[v]}
        tried = 0
        limit = self.n if self.n <= _SMALL else _FAR_CANDIDATES
        for d in range(1, self.n):
            v = (u + d) % self.n
            if not used[v] and self.host_of[v] not in entered:
                yield v
                tried += 1
                if tried >= limit:
                    return

    def usable(self, u: int, v: int, rate: float, res: dict) -> tuple[str, ...] | None:
        for path in self.routes(u, v):
            if all(res[(x, y)] >= rate * (1 - 1e-9) for x, y in zip(path, path[1:])):
                return path
        return None

    def closable_start(self, first: int, rate: float, res: dict) -> int:
        """A rank to start a ring at on a large topology, from ``first`` on in rank order
        (spreading the rings' starts): the first one some rank not directly linked to it can
        still reach, so that the ring, which leaves the start's neighbourhood at once and
        ends far away, can close (a DGX-1 server whose NIC into the start's PCIe switch is
        already full of rings cannot)."""
        for k in range(min(self.n, _FAR_CANDIDATES)):
            v = (first + k) % self.n
            near = set(self.direct[v])
            for d in range(1, min(self.n, _FAR_CANDIDATES) + 1):
                u = (v - d) % self.n
                if u not in near and u != v and self.usable(u, v, rate, res) is not None:
                    return v
        return first

    def options(self, cur: int, used: list[bool], rate: float, res: dict, onward: bool) -> list:
        """The hops usable from ``cur`` at ``rate``, as (rank, path), in the order to try:
        hops with room for more rings first (NCCL stays on NVLink/NVSwitch inside a server
        and crosses the network once per server: a NIC with room for one ring is the last
        resort), then, with ``onward``, Warnsdorff's rule (the rank with the fewest ways on
        first, so a server's one GPU whose NIC is still free is kept for the exit), then the
        search order (direct links widest first, then nearest in rank order)."""
        found = []
        for i, v in enumerate(self.candidates(cur, used)):
            self.spent += 1
            path = self.usable(cur, v, rate, res)
            if path is not None:
                room = min(res[(x, y)] for x, y in zip(path, path[1:])) / rate
                found.append((-min(2, int(room + 1e-9)), i, v, path))
        if onward:
            found = [(k, self._onward(v, used, rate, res, cur), i, v, p) for k, i, v, p in found]
        found.sort(key=lambda t: t[:-2])
        return [(t[-2], t[-1]) for t in found]

    def ring(self, rate: float, res: dict, start: int, budget: int) -> list[tuple[int, tuple[str, ...]]] | None:
        """A Hamiltonian cycle from ``start`` of hops usable at ``rate`` (taking it from
        ``res`` as it goes, so one ring never over-books a link), or None."""
        n = self.n
        used = [False] * n
        used[start] = True
        hops: list[tuple[int, tuple[str, ...]]] = []  # (next rank, path) per hop taken
        stack = [iter(self.options(start, used, rate, res, False))]
        cur = start

        def take(path, sign):
            for x, y in zip(path, path[1:]):
                res[(x, y)] -= sign * rate

        while stack:
            if self.spent >= _TOTAL_BUDGET or budget <= 0:
                break
            if len(hops) == n - 1:
                close = self.usable(cur, start, rate, res)
                if close is not None:
                    take(close, 1)
                    return hops + [(start, close)]
            else:
                found = None
                for v, path in stack[-1]:
                    budget -= 1
                    if not used[v] and self.usable(cur, v, rate, res) is not None:
                        found = (v, path)
                        break
                if found is not None:
                    v, path = found
                    take(path, 1)
                    used[v] = True
                    hops.append((v, path))
                    cur = v
                    stack.append(iter(self.options(v, used, rate, res, False)))
                    continue
            # dead end: undo the last hop
            stack.pop()
            if not hops:
                break
            v, path = hops.pop()
            take(path, -1)
            used[v] = False
            cur = hops[-1][0] if hops else start
        for _, path in hops:
            take(path, -1)
        return None


    def cycles(self, rate: float, res: dict, start: int, limit: int):
        """Every Hamiltonian cycle from ``start`` usable at ``rate``, lazily (recursive: for
        at most :data:`_SMALL` ranks); while a yielded cycle is held its rate is taken from
        ``res``, and given back when the generator resumes."""
        n = self.n
        used = [False] * n
        used[start] = True
        hops: list[tuple[int, tuple[str, ...]]] = []

        def take(path, sign):
            for x, y in zip(path, path[1:]):
                res[(x, y)] -= sign * rate

        def rec(cur: int):
            if len(hops) == n - 1:
                close = self.usable(cur, start, rate, res)
                if close is not None:
                    take(close, 1)
                    hops.append((start, close))
                    yield list(hops)
                    hops.pop()
                    take(close, -1)
                return
            options = self.options(cur, used, rate, res, True)
            if self.spent >= limit:
                return
            for v, path in options:
                if used[v] or self.usable(cur, v, rate, res) is None:
                    continue
                take(path, 1)
                used[v] = True
                hops.append((v, path))
                yield from rec(v)
                hops.pop()
                used[v] = False
                take(path, -1)

        yield from rec(start)

    def _onward(self, v: int, used: list[bool], rate: float, res: dict, cur: int, cap: int = 16) -> int:
        """How many unvisited ranks ``v`` could go on to (counted up to ``cap``)."""
        k = 0
        used[v] = True
        for w in self.candidates(v, used):
            if w != cur and self.usable(v, w, rate, res) is not None:
                k += 1
                if k >= cap:
                    break
        used[v] = False
        return k

    def pack(self, rate: float, most: int, budget: int) -> list[list[tuple[int, tuple[str, ...]]]]:
        """Up to ``most`` rings at ``rate``, backtracking over earlier rings when a later one
        cannot be found (NCCL's search backtracks across channels too), within ``budget``
        extensions; the most rings found."""
        res = dict(self.cap)
        limit = min(_TOTAL_BUDGET, self.spent + budget)
        chosen: list[list[tuple[int, tuple[str, ...]]]] = []
        best: list[list[tuple[int, tuple[str, ...]]]] = []

        def rec() -> bool:
            nonlocal best
            if len(chosen) > len(best):
                best = list(chosen)
            if len(chosen) == most or self.spent >= limit:
                return True
            # start where the ring can most easily close: the rank with the most usable hops
            # into it (two A100 servers: a GPU whose NIC still has room to receive)
            ins = [0] * self.n
            for u in range(self.n):
                for v in range(self.n):
                    if u != v and self.usable(u, v, rate, res) is not None:
                        ins[v] += 1
            start = max(range(self.n), key=lambda r: (ins[r], -r))
            for hops in self.cycles(rate, res, start, limit):
                chosen.append([(start, ())] + hops)
                if rec():
                    return True
                chosen.pop()
            return self.spent >= limit

        rec()
        return best


def _upper(s: _Search, topo: Topology) -> float:
    """No set of rings carries more than the least capacity out of (into) a rank, or than the
    narrowest cut between ranks: each ring leaves every rank and crosses every cut."""
    from .bounds import min_rank_cut_rate

    outs = {v: 0.0 for v in s.ranks}
    ins = {v: 0.0 for v in s.ranks}
    for (a, b), c in s.cap.items():
        if a in outs:
            outs[a] += c
        if b in ins:
            ins[b] += c
    return min(min(outs.values()), min(ins.values()), min_rank_cut_rate(topo, s.ranks))


def ring_channels(topo: Topology, ranks: Sequence[str], max_channels: int = MAX_CHANNELS
                  ) -> tuple[RingChannel, ...]:
    """NCCL-style ring channels over ``ranks`` (see the module docstring): the channels of the
    best total rate found, or () when no ring exists (fewer than 2 ranks, or no Hamiltonian
    cycle within the search budget).

    >>> from hcc.ir.topology import Link
    >>> sq = Topology("sq", ("a", "b", "c", "d"), links=tuple(Link(x, y, 1.0) for x, y in
    ...     ["ab", "ba", "bc", "cb", "cd", "dc", "da", "ad"]))
    >>> [(c.order, c.rate) for c in ring_channels(sq, ("a", "b", "c", "d"))]
    [((0, 1, 2, 3), 1.0), ((0, 3, 2, 1), 1.0)]
    """
    ranks = tuple(ranks)
    n = len(ranks)
    if n < 2:
        return ()
    s = _Search(topo, ranks)
    upper = _upper(s, topo)
    if not upper > 0:
        return ()
    if s.set_hosts(topo):
        found = _channels(s, n, upper, max_channels)
        if found:
            return found
        s.host_of = None  # no ring crosses each host once: search without hosts
    return _channels(s, n, upper, max_channels)


@functools.lru_cache(maxsize=32)
def ring_channels_memo(topo: Topology, ranks: tuple[str, ...]) -> tuple[RingChannel, ...]:
    """:func:`ring_channels` kept per topology and ranks: the ``rings`` baseline and
    ringfill.py search the same channels in one compile (0.4-1 CPU s on DGX-1 and its
    fragments). ``cache_clear`` empties it."""
    return ring_channels(topo, tuple(ranks))


def _channels(s: _Search, n: int, upper: float, max_channels: int) -> tuple[RingChannel, ...]:
    """The best-total channels over the per-channel rates (module docstring)."""
    caps = sorted({c for (a, b), c in s.cap.items() if a in s.pos or b in s.pos}, reverse=True)
    speeds: list[float] = []
    for c in caps:
        for k in range(1, _SPEED_DIVISORS + 1):
            b = c / k
            if b <= upper * (1 + 1e-9) and b * max_channels >= upper * 1e-3:
                speeds.append(b)
    speeds = sorted(set(speeds), reverse=True)
    best: tuple[float, list[RingChannel]] = (0.0, [])
    budget = _RING_BUDGET if n <= _SMALL else max(20 * n, 4 * _RING_BUDGET // 10)
    for b in speeds:
        most = min(max_channels, int(upper / b * (1 + 1e-9)))
        if most * b <= best[0] * _IMPROVE:
            continue
        if not s.connected_at(b):
            continue  # no ring at this rate: its search could only fail (after its budget)
        if s.spent >= _TOTAL_BUDGET:
            break
        rings: list[tuple[int, list]] = []  # (start, hops)
        if n <= _SMALL:
            rings = [(h[0][0], h[1:]) for h in s.pack(b, most, _PACK_BUDGET)]
        else:
            res = dict(s.cap)
            for k in range(most):
                start = s.closable_start((k * max(1, n // most)) % n, b, res)
                hops = s.ring(b, res, start, budget)
                if hops is None:
                    break
                rings.append((start, hops))
        found: list[RingChannel] = []
        for start, hops in rings:
            order = [start] + [v for v, _ in hops[:-1]]
            paths = [p for _, p in hops]
            # rotate so the ring begins at rank 0 (a canonical form)
            i = order.index(0)
            found.append(RingChannel(tuple(order[i:] + order[:i]), b, tuple(paths[i:] + paths[:i])))
        total = len(found) * b
        if total > best[0] * (1 + 1e-9):
            best = (total, found)
        if best[0] >= upper * (1 - 1e-9):
            break
    return tuple(best[1])


# -- plans over the channels -----------------------------------------------------------------------
def _chain_from(ch: RingChannel, at: int) -> PackedTree:
    """Along the ring from rank ``at``: data flows in the ring's direction."""
    n = len(ch.order)
    i = ch.order.index(at)
    edges = []
    for k in range(n - 1):
        a, b = ch.order[(i + k) % n], ch.order[(i + k + 1) % n]
        edges.append((a, b, ch.paths[(i + k) % n]))
    return PackedTree(at, tuple(edges), ch.rate)


def _chain_into(ch: RingChannel, at: int) -> PackedTree:
    """Along the ring into rank ``at`` (the ring's direction, ending at ``at``): an in-tree,
    whose path from parent to child is the data's route reversed (ir/plan.py ``Tree``)."""
    n = len(ch.order)
    i = ch.order.index(at)
    edges = []
    for k in range(1, n):
        child, parent = ch.order[(i + k) % n], ch.order[(i + k + 1) % n]
        edges.append((parent, child, tuple(reversed(ch.paths[(i + k) % n]))))
    return PackedTree(at, tuple(edges), ch.rate)


def rings_plan(spec: Any, topo: Topology, channels: Sequence[RingChannel], chunk_bytes: int) -> Plan:
    """The NCCL multi-channel ring schedule of ``spec`` over ``channels``."""
    kind, n = spec.kind, len(spec.ranks)
    if not channels:
        raise PlanError(f"no ring channels for {spec.name!r}")
    if kind == "allreduce":
        return _rings_allreduce(spec, topo, channels, chunk_bytes)
    if kind in ("broadcast", "scatter"):
        trees = [_chain_from(c, spec.root) for c in channels]
    elif kind in ("reduce", "gather"):
        trees = [_chain_into(c, spec.root) for c in channels]
    elif kind == "allgather":
        trees = [_chain_from(c, j) for c in channels for j in range(n)]
    elif kind == "reduce_scatter":
        trees = [_chain_into(c, j) for c in channels for j in range(n)]
    else:
        raise PlanError(f"no ring form for collective kind {kind!r}")
    return lower(spec, topo, trees, chunk_bytes, algorithm="rings")


def _rings_allreduce(spec: Any, topo: Topology, channels: Sequence[RingChannel], chunk_bytes: int,
                     ops: bool = True) -> Plan:
    """A ring allreduce per channel on its rate share; its messages carry the channel's
    routes: tree 2c is the chain order[0] -> ... -> order[n-1] of channel c, tree 2c + 1 its
    closing hop order[n-1] -> order[0]. ``ops=False``: the plan without its ops (empty
    programs; :func:`rings_priced` prices their columns)."""
    from .baselines import ring_allreduce_ops

    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    ce = chunk_elems(chunk_bytes, spec.dtype)
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    trees: list[Tree] = []
    for c, (ch, (lo, hi)) in enumerate(zip(channels, split_by_rate(0, E, [ch.rate for ch in channels]))):
        order = list(ch.order)
        parent = [-1] * n
        paths: list[tuple[str, ...]] = [()] * n
        for i in range(n - 1):
            parent[order[i + 1]] = order[i]
            paths[order[i + 1]] = ch.paths[i]
        trees.append(Tree(2 * c, order[0], tuple(parent), ch.rate, (lo, hi), tuple(paths)))
        close_parent = [-1] * n
        close_paths: list[tuple[str, ...]] = [()] * n
        close_parent[order[0]] = order[-1]
        close_paths[order[0]] = ch.paths[n - 1]
        trees.append(Tree(2 * c + 1, order[-1], tuple(close_parent), ch.rate, (lo, lo), tuple(close_paths)))
        if hi > lo and ops:
            ring_allreduce_ops(B, order, lo, hi, ce, avg,
                                hop_tree=lambda i, c=c: 2 * c + (1 if i == n - 1 else 0))
    return assemble(spec, topo, B, tuple(trees), "rings", ce)


# -- the ring allreduce as op columns ------------------------------------------------------------
# a ring allreduce over the channels estimated above this many ops is priced from op columns
# built here with numpy, its programs left empty (pipeline.Lower lowers it again as objects if
# it is selected): the 512-rank DGX-1 cluster's four rings are 5.2 million ops, 16 CPU s as op
# objects plus 4 s to read them back for the simulator. At least chunks.MAX_SEARCH_OPS, so the
# chunk search, which never prices a second size past that many ops, takes the same sizes.
COLUMN_OPS = 1_000_000


def rings_priced(spec: Any, topo: Topology, channels: Sequence[RingChannel], chunk_bytes: int,
                 model: Any = None):
    """:func:`rings_plan`, or, for an allreduce of more than :data:`COLUMN_OPS` ops where the
    native simulator runs, ``(plan, simulation)``: the plan with its trees and empty programs,
    and the simulation of its ops built as columns (:func:`ring_allreduce_columns`; the same
    columns ir/opscan.py reads from :func:`rings_plan`'s ops, so the same simulated time).
    Only inside :func:`columns_allowed`; elsewhere always the plan of op objects."""
    from .cost import DEFAULT_MODEL, simulate_columns

    if not columns_wanted(spec, [ch.rate for ch in channels], chunk_bytes):
        return rings_plan(spec, topo, channels, chunk_bytes)
    got = ring_allreduce_columns(spec, channels, chunk_bytes)
    if got is None:  # an empty piece: the object lowering's skips are not mirrored here
        return rings_plan(spec, topo, channels, chunk_bytes)
    plan = _rings_allreduce(spec, topo, channels, chunk_bytes, ops=False)
    try:
        return plan, simulate_columns(plan, got, model=model or DEFAULT_MODEL)
    except compact.Unsupported:  # a plan the native loop cannot run (32 768 ranks and more)
        return rings_plan(spec, topo, channels, chunk_bytes)


_COLUMNS = [False]


def columns_wanted(spec: Any, rates: Sequence[float], chunk_bytes: int) -> bool:
    """Whether a ring allreduce over rings of ``rates`` is priced from op columns here (inside
    :func:`columns_allowed`, above :data:`COLUMN_OPS` ops, the native simulator built)."""
    return (spec.kind == "allreduce" and _COLUMNS[0] and compact.available() and len(spec.ranks) >= 2
            and bool(rates) and _estimate_ops(spec, rates, chunk_bytes) > COLUMN_OPS)


class columns_allowed:
    """``with columns_allowed():`` :func:`rings_priced` may price op columns (pipeline.Lower,
    which lowers a selected plan again as op objects); outside it always lowers op objects."""

    def __enter__(self):
        self.prev = _COLUMNS[0]
        _COLUMNS[0] = True

    def __exit__(self, *exc):
        _COLUMNS[0] = self.prev


def _estimate_ops(spec: Any, rates: Sequence[float], chunk_bytes: int) -> int:
    """Ops of the ring allreduce over rings of ``rates``: per ring and piece n(n-1) copies,
    4 n(n-1) message ops."""
    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    ce = chunk_elems(chunk_bytes, spec.dtype)
    ops = 0
    for lo, hi in split_by_rate(0, E, rates):
        if hi > lo:
            longest = -(-(hi - lo) // n)
            ops += max(1, -(-longest // ce)) * 5 * n * (n - 1)
    return ops


def ring_allreduce_columns(spec: Any, channels: Sequence[RingChannel], chunk_bytes: int):
    """The op columns (ir/opscan.OpTable) of :func:`rings_plan`'s allreduce, computed with
    numpy in the order baselines.ring_allreduce_ops appends the ops, without op objects; None
    when some piece of a segment is empty (the object lowering skips those ops)."""
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    spans = split_by_rate(0, E, [ch.rate for ch in channels])
    return _columns(spec, [(ch.order, lo, hi, True) for ch, (lo, hi) in zip(channels, spans)], chunk_bytes)


def ring_columns(spec: Any, order: Sequence[int], chunk_bytes: int):
    """The same for baselines.ring_plan's single ring allreduce along ``order`` (its messages
    on the cheapest routes, tree -1)."""
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    return _columns(spec, [(order, 0, E, False)], chunk_bytes)


def _columns(spec: Any, rings, chunk_bytes: int):
    """The op columns of a ring allreduce per ``(order, lo, hi, routed)`` of ``rings``, in
    order (ring c's messages on trees 2c and 2c + 1 where ``routed``, else -1)."""
    from ..ir.opscan import OpTable
    from ..ir.plan import block_range

    n = len(spec.ranks)
    ce = chunk_elems(chunk_bytes, spec.dtype)
    avg = plan_op(spec.kind, spec.op) == "avg"
    pos = np.arange(n, dtype=np.int64)
    nxt = (pos + 1) % n
    prv = (pos - 1) % n
    # one (channel, piece) block's ops, relative ids in append order: copies (position i, every
    # segment k != i), the reduce-scatter's n - 1 steps of n messages (send, then receive), the
    # scales (avg), the allgather's steps; a message m of a step block is ops 2m and 2m + 1
    nc = n * (n - 1)
    c_i = np.repeat(pos, n - 1)
    c_k = np.tile(np.arange(n - 1, dtype=np.int64), n)
    c_k += c_k >= c_i  # k skips i

    def copy_id(i, k):
        return i * (n - 1) + np.where(k < i, k, k - 1)

    s_ = np.repeat(np.arange(n - 1, dtype=np.int64), n)
    i_ = np.tile(pos, n - 1)
    rs0 = nc
    nsc = n if avg else 0
    sc0 = rs0 + 2 * nc
    ag0 = sc0 + nsc
    per_block = ag0 + 2 * nc
    rs_k = (i_ - s_) % n
    ag_k = (i_ + 1 - s_) % n
    rs_recv = lambda s, i: rs0 + 2 * (s * n + i) + 1  # noqa: E731
    final = sc0 + pos if avg else rs_recv(n - 2, prv)
    # per op of a block: position (-> rank), code, peer position, segment, source buffer and
    # destination buffer (-1 none), the op it depends on (-1 none), extra
    pos_b = np.concatenate([c_i, np.stack([i_, nxt[i_]], 1).ravel(), pos[:nsc], np.stack([i_, nxt[i_]], 1).ravel()])
    code_b = np.concatenate([np.full(nc, 3), np.tile([0, 2], nc), np.full(nsc, 5), np.tile([0, 1], nc)])
    peer_b = np.concatenate([np.full(nc, -1), np.stack([nxt[i_], i_], 1).ravel(), np.full(nsc, -1),
                             np.stack([nxt[i_], i_], 1).ravel()])
    seg_b = np.concatenate([c_k, np.repeat(rs_k, 2), nxt[:nsc], np.repeat(ag_k, 2)])
    sbuf_b = np.concatenate([np.zeros(nc), np.stack([np.where(s_ == 0, 0, 1), np.full(nc, -1)], 1).ravel(),
                             np.full(nsc, -1), np.tile([1, -1], nc)])
    dbuf_b = np.concatenate([np.ones(nc), np.tile([-1, 1], nc), np.ones(nsc), np.tile([-1, 1], nc)])
    rs_send_dep = np.where(s_ == 0, -1, rs_recv(s_ - 1, prv[i_]))
    rs_recv_dep = copy_id(nxt[i_], rs_k)
    ag_send_dep = np.where(s_ == 0, final[i_], ag0 + 2 * ((s_ - 1) * n + prv[i_]) + 1)
    ag_recv_dep = rs0 + 2 * (s_ * n + nxt[i_])  # position j sent segment k at step s
    dep_b = np.concatenate([np.full(nc, -1), np.stack([rs_send_dep, rs_recv_dep], 1).ravel(),
                            rs_recv(n - 2, prv)[:nsc], np.stack([ag_send_dep, ag_recv_dep], 1).ravel()])
    extra_b = np.concatenate([np.zeros(nc), np.zeros(2 * nc), np.full(nsc, n), np.zeros(2 * nc)])
    hop_b = np.concatenate([np.full(nc, -1), np.repeat(i_, 2), np.full(nsc, -1), np.repeat(i_, 2)])
    msg = code_b <= 2
    # the blocks, channel by channel, piece by piece
    blocks = []  # (tree of the ring's chain or -1, order, segment starts, segment lengths)
    for c, (order, lo, hi, routed) in enumerate(rings):
        if hi <= lo:
            continue
        segs = np.array([block_range(hi - lo, n, k) for k in range(n)], dtype=np.int64) + lo
        sa, sb = segs[:, 0], segs[:, 1]
        C = max(1, -(-int((sb - sa).max()) // ce))
        for q in range(C):
            a = sa + q * (sb - sa) // C
            b = sa + (q + 1) * (sb - sa) // C
            if (b <= a).any():
                return None
            blocks.append((2 * c if routed else -1, np.asarray(order, dtype=np.int64), a, b - a))
    G = per_block * len(blocks)
    rank = np.empty(G, dtype=np.int64)
    peer = np.empty(G, dtype=np.int64)
    off = np.empty(G, dtype=np.int64)
    cnt = np.empty(G, dtype=np.int64)
    dep = np.empty(G, dtype=np.int64)
    tree = np.empty(G, dtype=np.int64)
    for x, (t0, order, a, ln) in enumerate(blocks):
        sl = slice(x * per_block, (x + 1) * per_block)
        rank[sl] = order[pos_b]
        peer[sl] = np.where(peer_b >= 0, order[np.maximum(peer_b, 0)], -1)
        off[sl] = a[seg_b]
        cnt[sl] = ln[seg_b]
        dep[sl] = np.where(dep_b >= 0, dep_b + x * per_block, -1)
        tree[sl] = np.where(hop_b >= 0, t0 + (hop_b == n - 1), -1) if t0 >= 0 else -1
    code = np.tile(code_b, len(blocks))
    is_msg = np.tile(msg, len(blocks))
    # tags: per ordered (sender, receiver) pair, the messages in append order from 0
    sends = np.flatnonzero(code == 0)
    pair = rank[sends] * n + peer[sends]
    by = np.argsort(pair, kind="stable")
    ps = pair[by]
    first = np.flatnonzero(np.r_[True, ps[1:] != ps[:-1]])
    run = np.repeat(first, np.diff(np.r_[first, ps.size]))
    tag = np.full(G, -1, dtype=np.int64)
    tag[sends[by]] = np.arange(ps.size) - run
    tag[sends + 1] = tag[sends]
    # rank-major order (ir/opscan.py's op ids) and each op's index in its rank's program
    perm = np.argsort(rank, kind="stable")
    counts = np.bincount(rank, minlength=n)
    base = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=base[1:])
    local = np.empty(G, dtype=np.int64)
    local[perm] = np.arange(G) - base[rank[perm]]
    has = dep[perm] >= 0
    ndeps = has.astype(np.int64)
    deps = local[dep[perm][has]]
    owner = np.flatnonzero(has)
    sbuf = np.tile(sbuf_b, len(blocks)).astype(np.int8)[perm]
    dbuf = np.tile(dbuf_b, len(blocks)).astype(np.int8)[perm]
    off, cnt = off[perm], cnt[perm]
    return OpTable(base.tolist(), code[perm].astype(np.int8), rank[perm], ndeps, deps, owner,
                   peer[perm], tag[perm], np.where(is_msg, tree, -1)[perm],
                   sbuf, np.where(sbuf >= 0, off, 0), np.where(sbuf >= 0, cnt, 0),
                   dbuf, np.where(dbuf >= 0, off, 0), np.where(dbuf >= 0, cnt, 0),
                   np.tile(extra_b, len(blocks)).astype(np.int64)[perm])


def ring_priced(spec: Any, topo: Topology, chunk_bytes: int, model: Any = None):
    """baselines.ring_plan, or, for an allreduce large enough (:func:`columns_wanted`: only
    inside pipeline.Lower), ``(plan, simulation)``: the plan without its ops and the
    simulation of its op columns (:func:`ring_columns`: the same columns as the op objects'),
    on the cost model ``model``."""
    from .baselines import ring_plan
    from .cost import DEFAULT_MODEL, simulate_columns
    from .routes import ring_order

    if not columns_wanted(spec, [1.0], chunk_bytes):
        return ring_plan(spec, topo, chunk_bytes)
    order = ring_order(topo, spec.ranks)
    tab = ring_columns(spec, order, chunk_bytes)
    if tab is None:
        return ring_plan(spec, topo, chunk_bytes)
    plan = assemble(spec, topo, ProgramBuilder(len(spec.ranks)), (), "ring", chunk_elems(chunk_bytes, spec.dtype))
    try:
        return plan, simulate_columns(plan, tab, model=model or DEFAULT_MODEL)
    except compact.Unsupported:  # as in rings_priced
        return ring_plan(spec, topo, chunk_bytes)
