"""hcc.compiler.cost — the α-β event-driven simulator that prices every plan.

Terms (design.md "Cost model")
- message: one Send matched with its Recv/RecvReduce (same ordered rank pair and tag).
  Its *wire bytes* are ``count x itemsize``, or the codec's size when the plan compresses:
  fp16 = 2 B/element, int8 = 1 B/element + an 8 B (min, max) header per message.
- path: the topology links a message crosses. A message moving along a packed tree edge
  uses the tree's recorded vertex path (``Tree.paths``; reversed for leaf→root phases);
  any other message takes the cheapest route in the collective's sub-topology (its ranks and
  the switches, language.md), cheapest meaning least ``α(e) + 1 MiB / c(e)``.
- α-β cost, cut-through: a message of ``b`` bytes that starts at ``t`` on a path ``e1..ek``
  ends at ``t + Σ α(ei) + per_message_s + b / min c(ei)``. Cut-through (the bytes stream
  through the hops; no hop waits for the whole message) is what NVLink, PCIe switches and
  TCP forwarding inside a rank's executor all do at the chunk sizes hcc picks; store-and-
  forward would charge ``k x b/c`` and wrongly punish the switch paths of NVSwitch and ToR
  topologies, where every message has two hops.
- link sharing: each link is a FIFO of reservations. A message starts when it is ready (both
  its Send and its Recv were posted: their ``deps`` completed in simulated time — the
  rendezvous protocol MPI uses above its eager limit); hop ``i`` of its path starts when
  link ``i`` has served the messages queued before it and the message's head has crossed
  hop ``i-1`` (``α`` later), so a message waits at a switch for a busy link the way a
  buffering switch or a forwarding rank does, instead of waiting for every link of its path
  to be free at one instant (that circuit rule left links idle behind one busy hop: DGX-1's
  allgather, whose trees use the PCIe switches, was predicted at 0.40 of its bound, the
  32-rank cluster's at 0.21, against 0.54 and 0.49 per hop). It ends when its bytes have
  streamed through the last hop at the path's bottleneck rate, and never before any of its
  reservations; uncontended, that is the cut-through time above. Each hop holds link
  ``e`` for ``α(e) + per_message_s + b / c(e)``: the classic per-chunk, per-hop α-β
  charge, which is what makes the chunk size a trade-off (a pipeline of k chunks over d
  hops costs ``(k + d − 1)(α + b/c)``, least at ``k = sqrt((d−1) M / (c α))``) instead
  of "smaller is always better". A slower hop of a cut-through path is reserved only for
  its own ``b / c(e)`` share, so a 12.5 GB/s ToR hop does not block a 150 GB/s NVSwitch
  port for the ToR's time. FIFO and fair sharing give a
  link the same throughput (both are work-conserving), so a pipelined plan's steady state is
  the same under both; FIFO costs O(log m) per message where max-min fair sharing must
  recompute every flow's rate at every event (O(flows) each), too slow for the 65 280
  messages of a 256-rank allgather.
- local ops (Copy, Reduce, Scale, and the combine of a RecvReduce) are free by default
  (``reduce_Bps = copy_Bps = 0``); give them a rate to charge ``bytes / rate``.

Two implementations of one loop: :func:`_simulate_py`, the reference in Python (the trace of
``detail=True`` and every error message come from it), and the same loop in C over the plan's
flat arrays (compiler/compact.py, compiler/_simcore.c), which :func:`simulate` runs when it is
built: the same events in the same order and the same floating-point operations, so both give
bit-identical simulations (tests/test_compact.py) at a fraction of the cost (the 1024-rank ring
allgather's 2 million ops: 40 s in Python, 6 s native, most of it reading the op objects).

Why the bound stays a bound in this model: every link carries at most ``c(e)`` bytes per
second (reservations are at least ``b / c(e)`` long and never overlap) and every message
ends no earlier than the end of each of its reservations, each of which includes its link's
latency after the last reserved byte, so the simulated time of any plan is at least
``M / R* + min α`` for a cut of capacity ``R*`` that ``M`` bytes must cross (see
:func:`least_latency`).

>>> from hcc.ir.topology import Topology, Link
>>> from hcc.ir.plan import Plan, Send, Recv, ChunkRef
>>> topo = Topology("pair", ("a", "b"), links=(Link("a", "b", 1e9, 1e-6), Link("b", "a", 1e9, 1e-6)))
>>> send, recv = Send(1, 0, ChunkRef("in", 0, 250)), Recv(0, 0, ChunkRef("out", 0, 250))
>>> plan = Plan("p", "broadcast", ("a", "b"), 0, 1000, "float32", None, "direct", 1000, (),
...             ((send,), (recv,)), (0, 0), topo)
>>> round(simulate(plan, model=CostModel(per_message_s=0.0)).time * 1e6, 3)   # 1 us + 1000 B / 1 GB/s
2.0
"""
from __future__ import annotations

import contextlib
import functools
import gc
import heapq
from dataclasses import dataclass
from typing import Sequence

from ..ir.errors import PlanError
from ..ir.plan import Copy, Plan, Recv, RecvReduce, Reduce, Scale, Send

# A reference message size for routing: 1 MiB sits inside the chunk range hcc picks
# (4 KiB .. tens of MiB), so routes prefer bandwidth for big chunks without ignoring α.
_ROUTE_BYTES = float(1 << 20)


@dataclass(frozen=True)
class CostModel:
    """Knobs of the simulator. ``per_message_s`` is the software cost of issuing one
    message: 1 us is the order of an MPI/NCCL per-message launch, and it keeps the chunk
    search from choosing 4 KiB chunks on topologies declared with zero latency."""

    per_message_s: float = 1e-6
    reduce_Bps: float = 0.0  # 0 = reductions are free
    copy_Bps: float = 0.0  # 0 = local copies are free

    def __post_init__(self) -> None:
        # a NaN cost made every prediction 0.0 s and a negative one a false "deadlock"
        import numbers

        from ..ir.errors import ArgumentTypeError, ArgumentValueError

        for f in ("per_message_s", "reduce_Bps", "copy_Bps"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ArgumentTypeError(f"CostModel: {f} must be a number, got {type(v).__name__} {v!r}")
            if not (0 <= v < float("inf")):
                raise ArgumentValueError(f"CostModel: {f} must be a finite number >= 0, got {v!r}")


DEFAULT_MODEL = CostModel()


def model_with(base: CostModel = DEFAULT_MODEL, *, per_message_us: float | None = None,
               reduce_GBps: float | None = None, copy_GBps: float | None = None) -> CostModel:
    """``base`` with the knobs a user set (``hcc compile|simulate|run --per-message-us
    --reduce-GBps --copy-GBps``; None keeps ``base``'s value), in the units users quote.

    >>> model_with(per_message_us=100).per_message_s, model_with(reduce_GBps=2.5).reduce_Bps
    (0.0001, 2500000000.0)
    """
    for label, v in (("per-message cost", per_message_us), ("reduce rate", reduce_GBps), ("copy rate", copy_GBps)):
        if v is not None and not (v >= 0 and v < float("inf")):
            from ..ir.errors import ArgumentValueError

            raise ArgumentValueError(f"{label} must be a finite number >= 0, not {v}")
    return CostModel(
        per_message_s=base.per_message_s if per_message_us is None else per_message_us / 1e6,
        reduce_Bps=base.reduce_Bps if reduce_GBps is None else reduce_GBps * 1e9,
        copy_Bps=base.copy_Bps if copy_GBps is None else copy_GBps * 1e9,
    )


def describe_model(model: CostModel) -> str:
    """One line for tables: ``1 us per message, reductions free, copies free``.

    >>> describe_model(CostModel(per_message_s=1e-4, reduce_Bps=2e9))
    '100 us per message, reduce 2 GB/s, copies free'
    """
    reduce = f"reduce {model.reduce_Bps / 1e9:g} GB/s" if model.reduce_Bps > 0 else "reductions free"
    copy = f"copy {model.copy_Bps / 1e9:g} GB/s" if model.copy_Bps > 0 else "copies free"
    return f"{model.per_message_s * 1e6:g} us per message, {reduce}, {copy}"


@dataclass(frozen=True)
class Transfer:
    """One chunk crossing one link (a trace-event of the timeline)."""

    src: int  # sending rank
    dst: int  # receiving rank
    link: tuple[str, str]
    tree: int
    chunk: int
    bytes: int
    start: float
    end: float


@dataclass(frozen=True)
class LinkUse:
    src: str
    dst: str
    capacity: float
    bytes: int  # wire bytes that crossed the link
    busy_s: float  # Σ over messages of the reservation α + per-message cost + bytes / capacity
    utilisation: float  # busy_s / simulated time
    first_s: float = 0.0  # start of the link's first reservation
    last_s: float = 0.0  # end of its last reservation (reservations are FIFO: the latest end)


@dataclass(frozen=True)
class Simulation:
    time: float  # seconds until the last op of any rank completes
    rank_finish: tuple[float, ...]  # per rank, when its last op completes
    links: tuple[LinkUse, ...]  # every link some message crossed, busiest first
    messages: int
    wire_bytes: int  # Σ over messages of the bytes injected (each counted once, not per hop)
    events: tuple[Transfer, ...] = ()  # detail=True only, in start order

    def link(self, src: str, dst: str) -> LinkUse:
        for l in self.links:
            if l.src == src and l.dst == dst:
                return l
        raise KeyError((src, dst))

    def digest(self, limit: int = 8) -> "SimulationDigest":
        """A bounded view for printing (``hcc simulate`` on 1024 ranks and 3 072 links):
        every rank and link when there are at most ``2 x limit``, else quantiles and the
        ``limit`` extremes."""
        return SimulationDigest.of(self, limit)


# utilisation buckets of :class:`SimulationDigest` (upper edges): busy links in a pipelined
# plan sit near 100%, idle-ish ones under 25%
_UTIL_EDGES = (0.25, 0.5, 0.75, 0.9, 1.0)


@dataclass(frozen=True)
class SimulationDigest:
    """What ``hcc simulate`` prints at any scale, in rows bounded by ``limit``.

    ``ranks``: (rank, finish seconds) of every rank, or, above ``2 x limit`` ranks, the
    ``limit`` latest to finish (latest first). ``finish_quantiles``: (label, seconds) for min,
    median, p90 and max. ``links``: the ``limit`` busiest links (all if few), busiest first.
    ``utilisation``: (upper edge, count) of links whose utilisation falls in each bucket
    of :data:`_UTIL_EDGES` (edges are inclusive above; the last counts everything above
    0.9). ``by_capacity``: per distinct link capacity, (capacity, links, mean
    utilisation, max utilisation), widest first: on a fat tree, the node and the spine
    links."""

    time: float
    n_ranks: int
    n_links: int
    ranks: tuple[tuple[int, float], ...]
    finish_quantiles: tuple[tuple[str, float], ...]
    links: tuple[LinkUse, ...]
    utilisation: tuple[tuple[float, int], ...]
    by_capacity: tuple[tuple[float, int, float, float], ...]
    truncated: bool

    @staticmethod
    def of(sim: "Simulation", limit: int = 8) -> "SimulationDigest":
        fin = list(enumerate(sim.rank_finish))
        n = len(fin)
        truncated = n > 2 * limit or len(sim.links) > 2 * limit
        ranks = tuple(fin) if n <= 2 * limit else tuple(sorted(fin, key=lambda rt: (-rt[1], rt[0]))[:limit])
        times = sorted(t for _, t in fin)
        q = (lambda f: times[min(n - 1, int(f * (n - 1) + 0.5))]) if n else (lambda f: 0.0)
        quant = (("min", q(0.0)), ("median", q(0.5)), ("p90", q(0.9)), ("max", q(1.0))) if n else ()
        links = sim.links if len(sim.links) <= 2 * limit else sim.links[:limit]
        counts = [0] * len(_UTIL_EDGES)
        for l in sim.links:
            k = next((i for i, e in enumerate(_UTIL_EDGES) if l.utilisation <= e), len(_UTIL_EDGES) - 1)
            counts[k] += 1
        groups: dict[float, list[float]] = {}
        for l in sim.links:
            groups.setdefault(l.capacity, []).append(l.utilisation)
        by_cap = tuple((c, len(u), sum(u) / len(u), max(u)) for c, u in sorted(groups.items(), key=lambda cu: -cu[0]))
        return SimulationDigest(sim.time, n, len(sim.links), ranks, quant, tuple(links),
                                tuple(zip(_UTIL_EDGES, counts)), by_cap, truncated)


def wire_bytes_of(count: int, itemsize: int, compress: str, dtype: str = "float32") -> int:
    """Bytes one message of ``count`` elements puts on the wire (the wire format's size,
    ir/wire.py, when the plan compresses).

    >>> wire_bytes_of(1000, 4, "none"), wire_bytes_of(1000, 4, "fp16"), wire_bytes_of(1000, 4, "int8")
    (4000, 2000, 1008)
    """
    if compress == "none":
        return count * itemsize
    from ..ir.wire import wire_nbytes

    return wire_nbytes(compress, dtype, count)


class _Links:
    """Links of one collective's sub-topology as integer ids, with cheapest routes computed
    once per source and kept: a value per (topology, ranks), shared by every simulation of
    that collective (the chunk search simulates each candidate several times; a 1024-rank
    ring needs a Dijkstra from each of its 1024 ranks, 3 s a time in Python)."""

    def __init__(self, topology, ranks: tuple[str, ...]):
        topo = topology.restricted(ranks)
        self.cap: list[float] = []
        self.lat: list[float] = []
        self.ends: list[tuple[str, str]] = []
        self.id: dict[tuple[str, str], int] = {}
        for l in topo.links:
            key = (l.src, l.dst)
            if key in self.id:  # parallel declarations add up (Topology.graph does the same)
                i = self.id[key]
                self.cap[i] += l.capacity
                self.lat[i] = max(self.lat[i], l.latency)
            else:
                self.id[key] = len(self.cap)
                self.cap.append(l.capacity)
                self.lat.append(l.latency)
                self.ends.append(key)
        self.adj: dict[str, list[tuple[str, int]]] = {}
        for (u, v), i in self.id.items():
            self.adj.setdefault(u, []).append((v, i))
        self.routes: dict[str, dict[str, tuple[int, ...]]] = {}
        self.prev: dict[str, dict[str, tuple[str, int]]] = {}  # per source: Dijkstra's tree


@functools.lru_cache(maxsize=8)
def _links(topology, ranks: tuple[str, ...]) -> _Links:
    return _Links(topology, ranks)


class _Network:
    """A plan's links (shared :class:`_Links`) with its tree paths."""

    def __init__(self, plan: Plan):
        try:
            links = _links(plan.topology, tuple(plan.ranks))
        except TypeError:  # an unhashable Topology (lists for tuples): no sharing
            links = _Links(plan.topology, tuple(plan.ranks))
        self.links = links
        self.cap, self.lat, self.ends, self.id, self.adj = links.cap, links.lat, links.ends, links.id, links.adj
        self._routes = links.routes
        self._prev = links.prev
        self.names = plan.ranks
        self.trees = plan.trees
        self._cache: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self._by_verts: dict[tuple[str, ...], tuple[int, ...]] = {}

    def _vertex_path(self, verts: Sequence[str]) -> tuple[int, ...] | None:
        # one link-id path per distinct vertex path: a 1024-rank allgather's 1472 trees name
        # about 3 000 distinct routes in their million edges
        hit = self._by_verts.get(verts)
        if hit is not None:
            return hit
        out = []
        for u, v in zip(verts, verts[1:]):
            i = self.id.get((u, v))
            if i is None:
                return None
            out.append(i)
        found = self._by_verts[tuple(verts)] = tuple(out)
        return found

    def _route(self, a: str, b: str) -> tuple[int, ...]:
        if a not in self._routes:  # one Dijkstra per source, every target at once
            dist: dict[str, float] = {a: 0.0}
            prev: dict[str, tuple[str, int]] = {}
            heap = [(0.0, a)]
            while heap:
                d, u = heapq.heappop(heap)
                if d > dist[u]:
                    continue
                for v, i in self.adj.get(u, ()):
                    nd = d + self.lat[i] + _ROUTE_BYTES / self.cap[i]
                    if nd < dist.get(v, float("inf")):
                        dist[v] = nd
                        prev[v] = (u, i)
                        heapq.heappush(heap, (nd, v))
            # each target's path is read off ``prev`` when first asked for: a ring asks one
            # target per source, and walking back all 1072 vertices' paths from each source
            # was a third of the 1024-rank fat tree ring's routing (6.3 s -> 4.0 s)
            self._routes[a] = {a: ()}
            self._prev[a] = prev
        paths = self._routes[a]
        path = paths.get(b)
        if path is None:
            prev = self._prev[a]
            if b not in prev:
                raise PlanError(f"no route from {a} to {b} in the collective's sub-topology")
            hops, w = [], b
            while w != a:
                u, i = prev[w]
                hops.append(i)
                w = u
            path = paths[b] = tuple(reversed(hops))
        return path

    def path(self, a: int, b: int, tree: int) -> tuple[int, ...]:
        key = (a, b, tree)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        found = None
        if 0 <= tree < len(self.trees):
            t = self.trees[tree]
            paths = t.paths
            if b < len(t.parent) and t.parent[b] == a and b < len(paths) and len(paths[b]) >= 2:
                found = self._vertex_path(paths[b])
            elif a < len(t.parent) and t.parent[a] == b and a < len(paths) and len(paths[a]) >= 2:
                found = self._vertex_path(tuple(reversed(paths[a])))
        if found is None:
            found = self._route(self.names[a], self.names[b])
        if not found and a != b:
            raise PlanError(f"ranks {a} and {b} are the same vertex {self.names[a]!r}")
        self._cache[key] = found
        return found


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector off for the block, as it was after: simulating, lowering
    and verifying allocate many small acyclic objects and free few until they return, and the
    collector would rescan them all again and again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def simulate(plan: Plan, *, detail: bool = False, model: CostModel = DEFAULT_MODEL) -> Simulation:
    """Run the plan's per-rank programs in simulated time; see the module docstring.

    Raises :class:`PlanError` when a Send has no matching Recv (or the reverse) or when the
    programs cannot all complete (a dependency cycle through messages: a deadlock)."""
    # the simulation allocates a few objects per op and frees none until it returns: with the
    # collector on, a third of the time at 65 k ops
    with gc_paused():
        if not detail:
            from . import compact

            if compact.available():
                try:
                    return _simulate_native(plan, model)
                except compact.Unsupported:
                    pass  # the reference loop reports the plan's error in its own words
        return _simulate_py(plan, detail, model)


def simulate_columns(plan: Plan, tab, *, model: CostModel = DEFAULT_MODEL) -> Simulation:
    """:func:`simulate` of ``plan`` whose ops are the op columns ``tab`` (ir/opscan.OpTable),
    built by its lowering without op objects (``plan.programs`` may be empty), on the native
    loop only: raises compact.Unsupported where that loop cannot run it."""
    with gc_paused():
        return _simulate_native(plan, model, tab)


def _simulate_native(plan: Plan, model: CostModel, tab=None) -> Simulation:
    """:func:`_simulate_py`'s loop run natively over the plan's arrays (compiler/compact.py):
    the same events in the same order, bit for bit the same figures, without the trace."""
    from . import compact

    net = _Network(plan)
    done, base, lk, messages, wire = compact.run(plan, net, model, tab)
    done_l = done.tolist()
    rank_finish = tuple(max(done_l[base[r]:base[r + 1]], default=0.0) for r in range(len(base) - 1))
    time = max(rank_finish, default=0.0)
    free, busy, nbytes, first = (lk[k].tolist() for k in ("free", "busy", "bytes", "first"))
    links = [
        LinkUse(net.ends[e][0], net.ends[e][1], net.cap[e], nbytes[e], busy[e],
                busy[e] / time if time > 0 else 0.0, first[e], free[e])
        for e in range(len(net.cap)) if nbytes[e] > 0
    ]
    links.sort(key=lambda l: (-l.busy_s, l.src, l.dst))
    return Simulation(time, rank_finish, tuple(links), messages, wire, ())


def _simulate_py(plan: Plan, detail: bool, model: CostModel) -> Simulation:
    """The reference simulator (module docstring), in Python: every op as an object, every
    event in a Python loop; the trace (``detail``) and every error message come from here."""
    net = _Network(plan)
    itemsize = plan.itemsize
    if plan.compress == "none":
        codec_bytes = None
    else:
        from functools import partial

        from ..ir.wire import wire_nbytes

        codec_bytes = partial(wire_nbytes, plan.compress, plan.dtype)
    progs = plan.programs
    base = [0] * (len(progs) + 1)
    for r, prog in enumerate(progs):
        base[r + 1] = base[r] + len(prog)
    total = base[-1]
    ops = [op for prog in progs for op in prog]
    rank_of = [r for r, prog in enumerate(progs) for _ in prog]
    remaining = [0] * total
    dependents: list[list[int]] = [[] for _ in range(total)]
    for r, prog in enumerate(progs):
        b = base[r]
        for i, op in enumerate(prog):
            remaining[b + i] = len(op.deps)
            for d in op.deps:
                if not 0 <= d < i:
                    raise PlanError(f"rank {r} op {i}: dependency {d} is not an earlier op")
                dependents[b + d].append(b + i)

    # match messages: (sender, receiver, tag) -> op id on each side, keyed by one int per
    # message ((a * n + b) << 32 | tag): tuple keys cost ~150 bytes more per message, 600 MB
    # for the 2 million messages of a 1024-rank ring allreduce (a tag outside 32 bits, only
    # in a broken plan, keeps its tuple)
    nr = len(progs)

    def pack(a: int, b: int, tag: int):
        return ((a * nr + b) << 32) | tag if 0 <= tag < 1 << 32 else (a, b, tag)

    def unpack(key) -> tuple[int, int, int]:
        if isinstance(key, tuple):
            return key
        a, b = divmod(key >> 32, nr)
        return a, b, key & 0xFFFFFFFF

    sends: dict = {}
    recvs: dict = {}
    for g, op in enumerate(ops):
        t = type(op)
        if t is Send:
            key = pack(rank_of[g], op.peer, op.tag)
            if key in sends:
                a, b, tag = unpack(key)
                raise PlanError(f"rank {a}: two sends to rank {b} with tag {tag}")
            sends[key] = g
        elif t is Recv or t is RecvReduce:
            key = pack(op.peer, rank_of[g], op.tag)
            if key in recvs:
                a, b, tag = unpack(key)
                raise PlanError(f"rank {b}: two receives from rank {a} with tag {tag}")
            recvs[key] = g
    partner = [-1] * total
    for key, g in sends.items():
        h = recvs.get(key)
        if h is None:
            a, b, tag = unpack(key)
            raise PlanError(f"rank {a}: send to rank {b} tag {tag} has no matching receive")
        partner[g], partner[h] = h, g
    if len(recvs) != len(sends):
        for key, h in recvs.items():
            if key not in sends:
                a, b, tag = unpack(key)
                raise PlanError(f"rank {b}: receive from rank {a} tag {tag} has no matching send")
    del sends, recvs

    cap, lat = net.cap, net.lat
    link_free = [0.0] * len(cap)
    link_busy = [0.0] * len(cap)
    link_bytes = [0] * len(cap)
    link_first = [-1.0] * len(cap)
    posted = [-1.0] * total  # time an op's deps completed (-1: not yet)
    ready_at = [0.0] * total
    done = [-1.0] * total
    heap: list[tuple[float, int, int]] = []  # (ready time, sequence, send op id)
    seq = 0
    work = [g for g in range(total) if remaining[g] == 0]
    reduce_Bps, copy_Bps, per_msg = model.reduce_Bps, model.copy_Bps, model.per_message_s
    # per op: 0 send, 1 recv, 2 recv-reduce, 3 local; and the local op's duration
    code = [0] * total
    local_s = [0.0] * total
    for g, op in enumerate(ops):
        t = type(op)
        if t is Send:
            continue
        if t is Recv:
            code[g] = 1
        elif t is RecvReduce:
            code[g] = 2
            if reduce_Bps > 0:
                local_s[g] = op.dst.count * itemsize / reduce_Bps
        elif t is Copy or t is Reduce or t is Scale:
            code[g] = 3
            rate = copy_Bps if t is Copy else reduce_Bps
            if rate > 0:
                local_s[g] = op.dst.count * itemsize / rate
        else:
            raise PlanError(f"rank {rank_of[g]}: unknown op {t.__name__}")
    events: list[Transfer] = []
    messages = 0
    wire_total = 0
    routes: dict[tuple[int, int, int], tuple] = {}
    by_path: dict[tuple[int, ...], tuple] = {}  # one route value per distinct link path
    hop_start: list[float] = []  # detail only: when each hop of the current message starts
    heappush, heappop = heapq.heappush, heapq.heappop

    def finish(g: int, t: float) -> None:
        """Op ``g`` completes at ``t``: its dependents may start no earlier, and the ones
        with no dependency left join the work list."""
        done[g] = t
        for d in dependents[g]:
            if t > ready_at[d]:
                ready_at[d] = t
            remaining[d] -= 1
            if remaining[d] == 0:
                work.append(d)

    # ops that become ready together are posted in program order (a FIFO, not a stack), as
    # the executors post a completed op's dependents (backends/executor.py): a plan that
    # orders its sends on a link gets that order among sends that are ready at one instant
    head = 0
    while True:
        while head < len(work):
            g = work[head]
            head += 1
            t = ready_at[g]
            c = code[g]
            if c == 3:  # a local op: done after its own duration, then wake its dependents
                finish(g, t + local_s[g])
                continue
            posted[g] = t
            p = partner[g]
            tp = posted[p]
            if tp >= 0.0:
                heappush(heap, (t if t > tp else tp, seq, g if c == 0 else p))
                seq += 1
        work.clear()
        head = 0
        if not heap:
            break
        ready, _, s = heappop(heap)
        r = partner[s]
        sop, rop = ops[s], ops[r]
        a, b = rank_of[s], rank_of[r]
        count = sop.src.count
        if count != rop.dst.count:
            raise PlanError(
                f"rank {a} -> rank {b} tag {sop.tag}: send of {count} elements "
                f"but receive of {rop.dst.count}"
            )
        nbytes = codec_bytes(count) if codec_bytes else count * itemsize
        key = (a, b, sop.tree)
        route = routes.get(key)
        if route is None:
            path = net.path(a, b, sop.tree)
            route = by_path.get(path)
            if route is None:
                route = (path, sum(lat[e] for e in path), min((cap[e] for e in path), default=float("inf")),
                         tuple((e, lat[e] + per_msg, 1.0 / cap[e]) for e in path))
                by_path[path] = route
            routes[key] = route
        path, _, cmin, hops = route
        stream = nbytes / cmin if path else 0.0
        # per-hop reservations (module docstring, "link sharing"): hop i starts once the
        # message's head has crossed hop i-1 (its latency later) and link i has served the
        # messages queued before it; the message ends when its bytes have streamed through
        # the last hop at the path's bottleneck rate, and never before any hop's reservation
        t_hop = ready
        start = -1.0
        end = ready + per_msg
        for e, fixed, inv in hops:
            if link_free[e] > t_hop:
                t_hop = link_free[e]
            if start < 0.0:
                start = t_hop
            if detail:
                hop_start.append(t_hop)
            hold = fixed + nbytes * inv
            if link_first[e] < 0.0:
                link_first[e] = t_hop
            link_free[e] = t_hop + hold
            link_busy[e] += hold
            link_bytes[e] += nbytes
            t_hop += lat[e]
            if t_hop + per_msg + stream > end:
                end = t_hop + per_msg + stream
        if start < 0.0:
            start = ready
        if detail:
            for e, t0 in zip(path, hop_start):
                t1 = t0 + lat[e] + per_msg + stream
                events.append(Transfer(a, b, net.ends[e], sop.tree, sop.chunk, nbytes, t0, t1))
            hop_start.clear()
        messages += 1
        wire_total += nbytes
        finish(s, end)
        finish(r, end + local_s[r])

    stuck = [g for g in range(total) if done[g] < 0.0]
    if stuck:
        g = stuck[0]
        raise PlanError(
            f"the plan cannot complete: rank {rank_of[g]} op {g - base[rank_of[g]]} "
            f"({type(ops[g]).__name__}) and {len(stuck) - 1} other ops never run (deadlock)"
        )
    rank_finish = tuple(max(done[base[r]:base[r + 1]], default=0.0) for r in range(len(progs)))
    time = max(rank_finish, default=0.0)
    links = [
        LinkUse(net.ends[e][0], net.ends[e][1], cap[e], link_bytes[e], link_busy[e],
                link_busy[e] / time if time > 0 else 0.0, link_first[e], link_free[e])
        for e in range(len(cap)) if link_bytes[e] > 0
    ]
    links.sort(key=lambda l: (-l.busy_s, l.src, l.dst))
    if detail:
        events.sort(key=lambda ev: (ev.start, ev.link))
    return Simulation(time, rank_finish, tuple(links), messages, wire_total, tuple(events))


def completion_times(plan: Plan, model: CostModel = DEFAULT_MODEL):
    """``(done, base)``: when op ``i`` of rank ``r`` completes in the simulated ``plan`` is
    ``done[base[r] + i]`` (the native loop's per-op times, what replaying a schedule
    backwards needs: levels.py, replay.py); None where that loop is not built."""
    from . import compact

    if not compact.available():
        return None
    with gc_paused():
        done, base, *_ = compact.run(plan, _Network(plan), model)
    return done, base


def least_latency(plan_or_topo, ranks: Sequence[str] | None = None) -> float:
    """The smallest link latency of a collective's sub-topology: every byte that moves
    crosses at least one link, after its last reserved byte, so a cut bound ``M / R*`` plus
    this stays a lower bound of :func:`simulate` (0 when no link declares a latency)."""
    if isinstance(plan_or_topo, Plan):
        topo, ranks = plan_or_topo.topology, plan_or_topo.ranks
    else:
        topo = plan_or_topo
    sub = topo.restricted(tuple(ranks or topo.nodes))
    return min((l.latency for l in sub.links), default=0.0)
