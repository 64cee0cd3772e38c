"""hcc.compiler.schedule — the timed lowering: a compile-time list schedule imposed on each
rank's ports (``lower(schedule="timed")``, what the pipeline uses for the treepack candidates).

Terms
- port: the first link of a message's path, the link out of its sending rank (a rank's
  NVLink to a neighbour, its uplink to a switch). Only that rank sends on it.
- key of a message: when a fluid stream at its tree's packed rate would have sent the end
  of its chunk, ``(chunk end - span start) x itemsize / w_T``, less HOP_SLACK chunk
  periods per tree hop still ahead of the chunk. Serving the smallest key first is
  weighted fair queueing (Parekh & Gallager 1993): each tree gets its packed share of
  every link it crosses whatever the other trees do, and a chunk with hops still to go
  passes one that is nearly home.
- window: how many messages of one port may be in flight at once; message ``i`` of a port
  waits for the completion of message ``i - window`` (a credit window).

Why: a plan whose sends depend only on data lets the executor post every send the moment
its data is there. The roots' sends have no data dependency at all, so all of them are
posted at time zero and fill every link's queue ahead of the chunks the rank must forward;
the trees then advance at whatever share the arrival order gives them, not at their
packed rates, and the slow ones trail (DGX-1 allgather, 48 trees: links 100% busy until
5.4 ms, the bound, then idle while the last trees drain until 9.1 ms: 0.59 of the bound).
The timed lowering runs the cost model's own event rules (cost.py: per-hop α-β
reservations, per-message cost) with the WFQ choice at every port, and writes the order it
found into the plan: each send depends on the send ``window`` places before it on its
port. The plan then runs in that order on every backend and in cost.simulate (with a
window of 1 on direct links the simulated time equals the schedule's own, exactly).

Gated sends (PORT_GATE). With a window above 1 a send could go as soon as its data and its
window allow, and a switch hop would then be reserved in that order rather than the
schedule's. On a rank with a link to another rank the schedule therefore starts a send
only when one of the rank's ops completes, and the plan makes the send depend on that op:
it is posted exactly when scheduled, and on DGX-1's fragments (NVLinks plus PCIe switches)
the simulated time equals the schedule's own (tests/test_timed_split.py).

Exact replay (EXACT_GATE). Where some rank reaches the others only through switches (A100
servers, NVSwitch boxes), :meth:`_Timed.schedule_exact` starts every message after time 0 at
the completion of an op of its sender or its receiver, and the plan makes the message's Send
or Recv depend on that op; messages that start at one instant start in the order the
simulator pops them; every time is computed with the simulator's own floating-point
operations. The simulator then reserves every link, the switches' egress links included, in
the schedule's order, and the plan's simulated time is the schedule's makespan
(tests/test_schedule_ingress.py).

Cost. The list schedules' event loops run natively (compiler/_simcore.c's ``wfq`` and, over
switches, ``exact``; the Python loops kept as their references and fallbacks, each pair
equal message for message: tests/test_schedule_native.py); each job's messages per chunk are
one template repeated per chunk as arrays, and the templates of a set of trees are kept for
its next lowering (the chunk search lowers the same trees at several sizes). A schedule that
replays exactly (one hop per message over the sender's own link: :func:`_replays_exactly`)
is compared with the rival plain order before it is written out, and dropped unwritten where
it loses (:class:`Outrun`, lower.lower_priced).

Jobs. The scheduler moves *jobs*: a job reduces its chunks up one tree (its *up tree*) and
broadcasts them down another (its *down tree*), both rooted at the same rank. A tree kind's
jobs are its trees (up = down); the split allreduce (compiler/splitpack.py) pairs in-trees
packed for the reduction with out-trees packed for the broadcast, so the two directions of a
link are loaded by different trees. Each message carries its own tree's index into the plan,
so the simulator routes it over that tree's recorded path.
"""
from __future__ import annotations

from typing import Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Scale
from ..ir.topology import Topology
from .builder import _deps, _Lowering, split_by_rate
from .trees import TreeShape

try:
    from ._simcore import wfq as _wfq
except ImportError:  # not built (HCC_NO_NATIVE=1): the schedule runs its Python reference loop
    _wfq = None
try:
    from ._simcore import exact as _exact
except ImportError:  # not built, or built before it had the exact schedule: the Python loop
    _exact = None

__all__ = ["PORT_WINDOW", "TIMED_KINDS", "Outrun", "lower_timed", "lower_jobs"]

# 4 in flight per port when the collective's links include a switch: 1 holds a rank's
# uplink to a switch idle while its last message waits behind other senders at the switch
# (DGX-1 allgather through the PCIe switches: 0.59 of the bound with 1, 0.74 with 2,
# 0.76-0.82 with 4), more lets the executor reorder the schedule (0.54-0.80 with 8). Without
# switches every port is a direct link, where 1 costs nothing (a send completes when its
# link frees) and the plan runs exactly as scheduled (1 x MI250 allgather: 0.88 with 1,
# 0.84 with 4)
PORT_WINDOW = 4
# chunk periods of key credit per hop still ahead (0 pure WFQ): NVLink-only DGX-1 allgather
# at 2 MiB chunks 0.909 with 0, 0.917 with 0.25, 0.889 with 2
HOP_SLACK = 0.25
# gate the sends of ranks that have a link to another rank: with a window above 1 the plan
# lets a send go as soon as its data and window allow, and the simulator (and an executor)
# then reserves a switch hop in that order, not the schedule's; gated, such a send starts
# only when one of its rank's ops completes and depends on that op, so it is posted exactly
# when scheduled (the schedule's own time is then the simulated one on DGX-1 fragments).
# Allgather at 1 GB, 2 MiB chunks: DGX-1 0.861 -> 0.865, 2 x MI250 0.659 -> 0.775 of the
# bound; ranks reached only through switches (A100 nodes, samples/nvswitch.hcl) are not
# gated: their rarer completions idled their uplinks (2 x A100 0.653 -> 0.473, nvswitch
# 0.854 -> 0.658)
PORT_GATE = True
# the window of a port whose rank reaches the others only through switches (an A100's
# NVSwitch port and NIC; samples/nvswitch.hcl), for every kind but broadcast, with the
# receive gate below. Such a rank's completions are the ends of its own messages, which
# wait at the switch's egress links behind the other ranks' messages; with 4 in flight its
# 300 GB/s port idled while its NIC traffic queued (2 x A100 allgather at 1 GB, 4 MiB:
# the schedule's own time 0.745 of the bound, the plan 0.664). 16 in flight let the
# schedule reach 0.830 (and the plan 0.733 with the receive gate, 0.538 without: the extra
# sends in flight then reach the receivers' links out of the schedule's order); 8: 0.726,
# 32: 0.712. Broadcast lost with either (2 x A100 at 1 GB 0.802 -> 0.782), so it keeps
# PORT_WINDOW and no receive gate. Replayed exactly (EXACT_GATE), the window only limits the
# schedule: 2 x A100 at 1 GB, 4 MiB, 16 -> 32: reduce 0.889 -> 0.896, reduce-scatter
# 0.755 -> 0.772, allreduce 0.792 -> 0.812, allgather 0.829 either way; unlimited: reduce
# 0.823 (every leaf's chunks queued at once delay the root's).
SWITCH_ONLY_WINDOW = 32
# the receive gate (collectives with a switch, every kind but broadcast): a message's
# Recv depends on the Recv of the message the schedule ended last on the same last link
# (the receiver's link out of the switch) before this one started. The schedule met that
# dependency already, so it costs the schedule nothing; in the plan it keeps a message from
# being posted, and reserving the receiver's link, ahead of the ones the schedule put there
# first (2 x A100 at 1 GB, best chunk: allgather 0.664 -> 0.733, reduce 0.786 -> 0.899,
# reduce-scatter 0.666 -> 0.731, allreduce 0.651 -> 0.672; DGX-1 unchanged)
INGRESS_GATE = True
# exact replay (collectives with a switch, gated windows; Timed.schedule_exact): the gates
# above pin a port's order and a receiver link's last message, but a message posted early
# still reserves the links after the first in the order the simulator pops it, not the
# schedule's (2 x A100 allgather at 1 GB, 4 MiB chunks: 2 067 of 8 962 link reservations
# swapped with a neighbour, the plan 0.733 of the bound against the schedule's 0.830). The
# simulator reserves every hop of a message when it pops it, at the later of its Send's and
# Recv's posting; so a schedule whose every start is the completion of an op of the sender
# or the receiver (the plan depends on that op), whose same-instant starts follow the
# simulator's pop order, and whose times use the simulator's floating-point operations is
# replayed exactly: the plan's time is the schedule's (tests/test_schedule_ingress.py). A
# port that frees between completions starts its next message at the last completion
# before it frees (the port reservation then waits, as in the simulator). 2 x A100 at 1 GB,
# 4 MiB: allgather 0.733 -> 0.829, reduce-scatter 0.73 -> 0.755, allreduce 0.67 -> 0.79.
# Used where some rank reaches the others only through switches: where every rank has a
# link to another, PORT_GATE's plans replay their schedule already, and a little faster
# (DGX-1 at 1 GB, 2 MiB: allreduce 0.895 against 0.883, reduce-scatter 0.890 against 0.887)
EXACT_GATE = True
# a job that only broadcasts (broadcast, allgather) over a tree two levels deep or more sends
# the last chunk of its share as two half chunks (:func:`_tail_halved`). The plan's drain is
# the last chunks crossing every level below the link where they were last held up behind
# other trees' chunks, a chunk time per hop: halves cross them in half the time, for one more
# message per tree and link. 1 x MI250 allgather at 1 GiB (44 trees 5-6 deep, every link
# loaded to its packed rate): the best chunk's plan 0.912 -> 0.933 of the bound (and the
# reduce-scatter replayed from it, compiler/replay.py, as much); broadcasts gain a little
# (DGX-1 fragment 0.948 -> 0.951, the demo 0.770 -> 0.774). Jobs that reduce keep even
# chunks unless asked (lower_jobs ``halves``): for the allreduces the halves lost a little
# (split trees on a DGX-1 fragment 0.843 -> 0.842, bidir on a 4-rank mesh 0.912 -> 0.910), and
# for reduce and reduce-scatter they win on some graphs and lose on others (the last chunk
# climbs every level of the in-tree after the leaves send it, as a broadcast's descends them:
# DGX-1 gpu[0,2,4,6]'s reduce-scatter at 1 GiB 0.945 -> 0.963, gpu[0,3,4,5,7]'s at 256 MiB
# 0.976 -> 0.960), so lower.lower_priced prices both
TAIL_HALVES = True
# the smallest chunk of a thin tree, as a share of the chunk size (1: one size for every
# tree; see _job_chunks): scaling chunks by tree rate lost on 2 x A100 allgather at 1 GB
# (0.663 -> 0.584 at 4 MiB with 0.25) and on DGX-1 split allreduce, where the per-message
# cost of the thin trees' small chunks outweighs their shorter fill
TREE_MIN_CHUNK = 1.0
# rounds of share rebalancing after the first schedule (see _lower_timed), stopped early
# once every tree finishes within REBALANCE_TOLERANCE of its group's mean. 1% left 27 us of
# spread on a 2.7 ms broadcast, as much as the rounds gain: DGX-1 fragment gpu[0,1,2,4,5,6]
# at 256 MiB 0.884 -> 0.889 of the bound with 8 rounds to 0.05%, gpu[1..7] 0.888 -> 0.891
# (each extra round one more schedule; most stop after 3-5)
REBALANCE_ROUNDS = 8
REBALANCE_TOLERANCE = 0.0005
# ... and after this many rounds in a row that found no faster schedule (one MI250 node's
# allgather never settles within the tolerance, and its rounds past the first found nothing:
# its compile 0.17 CPU s with all 8, 0.14 with this stop, the same plan; with 2 the demo's
# broadcast lost 0.815 -> 0.809)
# Or, where the plan replays exactly and another order of the same trees is priced beside it
# (lower.lower_priced: the plain order), after the first round that finds nothing faster
# while that order is still ahead (:func:`_behind`): the rounds then chase a plan that is
# dropped. Over the 1042 such lowerings of benchmarks/auto_bench.py's cells no schedule
# behind the plain order at its first fruitless round overtook it later; on one MI250
# node's allgather (the plain order ahead at every chunk size, the rounds past the first
# each slower) it halves the rounds
REBALANCE_STALL = 3
# the schedule costs about 3x the plain lowering per message in Python (50-100 us per
# message on this loaded 2-core machine): above REBALANCE_MAX_MESSAGES one schedule, no
# rebalancing; above TIMED_MAX_MESSAGES (a 1024-rank allgather has 1.5 M messages per chunk
# round) the plain chunk-major order, so the timed lowering never dominates a compile
TIMED_MAX_MESSAGES = 400_000
REBALANCE_MAX_MESSAGES = 100_000
# the drain tree (broadcast): a max-rate packing loads every link it uses to the bound, so its
# deep trees cannot catch up on their fill, and at the end they drain for several chunk
# times through their last hops while the root's links and others lie idle (DGX-1 fragment
# gpu[0,1,2,4,5,6] at 256 MiB, 1.5 MiB chunks: the root's busiest link done at 2553 us, the
# last chunk in at 2712). One more tree, built from the rebalanced schedule
# (:func:`_drain_tree`: each rank fed by the neighbour that could forward a chunk to it
# first once the schedule has last used the link), takes a small share at the lowest
# priority (its keys come after every chunk of the packed trees), so its chunks go where a
# port would otherwise idle, mostly during that drain; the shares are rebalanced again with
# it, and it is kept only where the schedule gets faster by DRAIN_GAIN. DRAIN_SHARE scales
# its starting rate (1.0: the bytes its narrowest edge can carry after its last use, spread
# over the schedule); 0.5 and 1.5 were slower on the fragments, 2 kept none. Fragments
# gpu[0,1,2,4,5,6] / gpu[1..7] at 256 MiB: 0.889 -> 0.896 / 0.891 -> 0.892, at 1 GiB
# 0.941 -> 0.946 / 0.943 -> 0.944; the full DGX-1 at 256 MiB 0.836 -> 0.843
DRAIN_TREE = True
DRAIN_SHARE = 1.0
DRAIN_GAIN = 1e-3


def _msg_paths(topo: Topology, ranks: Sequence[str]):
    from .cost import _links

    try:
        links = _links(topo, tuple(ranks))
    except TypeError:
        from .cost import _Links

        links = _Links(topo, tuple(ranks))
    return links


def _has_relay(links, ranks: Sequence[str]) -> bool:
    names = set(ranks)
    return any(v not in names for _, v in links.ends)


class _Chunk:
    """The messages of one chunk of one job (``_Timed.template``), in the order they are
    numbered: ``src``/``dst`` ranks, ``down``, ``deps`` (indices among these messages),
    ``path`` (link ids), ``hops`` (the tree hops still ahead of the chunk, for the key),
    ``sender`` ((index, sending rank) of each up message); :meth:`freeze` adds the arrays
    :meth:`_Timed.fill` repeats per chunk, among them the dependents of each message in
    increasing order (``dcount``, ``didx``)."""

    def __init__(self):
        self.src: list[int] = []
        self.dst: list[int] = []
        self.down: list[bool] = []
        self.deps: list[tuple[int, ...]] = []
        self.path: list[tuple[int, ...]] = []
        self.hops: list[int] = []
        self.sender: list[tuple[int, int]] = []

    def freeze(self) -> "_Chunk":
        import numpy as np

        E = len(self.src)
        self.src_a = np.array(self.src, np.int64)
        self.dst_a = np.array(self.dst, np.int64)
        self.down_a = np.array(self.down, np.int8)
        self.hops_f = np.array(self.hops, np.float64)
        self.plen = np.array([len(p) for p in self.path], np.int64)
        self.plinks = np.array([e for p in self.path for e in p], np.int64)
        self.ndeps = np.array([len(d) for d in self.deps], np.int64)
        dependents: list[list[int]] = [[] for _ in range(E)]
        for j, ds in enumerate(self.deps):
            for d in ds:
                dependents[d].append(j)
        self.dcount = np.array([len(x) for x in dependents], np.int64)
        self.didx = np.array([j for x in dependents for j in x], np.int64)
        self.one_hop = all(len(p) == 1 for p in self.path)
        self._exact_locals = None
        return self

    def exact_locals(self):
        """Per message of the chunk (int64 arrays, -1 where none): ``rep``, for an up message
        the first up message into the same rank (the chunk's key of ``first_in``); ``up``, for
        a down message the up message its receiver sends (``upmsg``). For the native exact
        schedule (:meth:`_Timed._schedule_exact_native`)."""
        import numpy as np

        if self._exact_locals is None:
            first: dict[int, int] = {}
            rep = [-1 if dn else first.setdefault(d, j) for j, (d, dn) in enumerate(zip(self.dst, self.down))]
            sent = {r: i for i, r in self.sender}
            up = [sent.get(d, -1) if dn else -1 for d, dn in zip(self.dst, self.down)]
            self._exact_locals = (np.array(rep, np.int64), np.array(up, np.int64))
        return self._exact_locals


def _gather(starts, lens):
    """The indices ``starts[i] + j`` for ``j < lens[i]``, concatenated in order of ``i``."""
    import numpy as np

    total = int(lens.sum())
    first = np.cumsum(lens) - lens
    return np.repeat(starts - first, lens) + np.arange(total, dtype=np.int64)


class _Templates:
    """The jobs' chunk templates (``_Chunk``), made once per lowering, and their arrays
    concatenated in job order (:meth:`table`; per job its first entry ``off`` and size ``E``)."""

    def __init__(self, njobs: int):
        self.by_job: dict[int, _Chunk] = {}
        self.njobs = njobs
        self._table = None

    def need(self, t: int, make) -> None:
        if t not in self.by_job:
            self.by_job[t] = make()
            self._table = None

    def table(self):
        import numpy as np
        from types import SimpleNamespace

        if self._table is not None:
            return self._table
        cs = [self.by_job.get(t) for t in range(self.njobs)]
        have = [c for c in cs if c is not None]
        E = np.array([len(c.src) if c is not None else 0 for c in cs], np.int64)

        def cat(f: str, dt):
            return np.concatenate([getattr(c, f) for c in have]).astype(dt) if have else np.zeros(0, dt)

        plen, dcount = cat("plen", np.int64), cat("dcount", np.int64)
        # CSR starts: each message's first link and first dependent, its template's offset added
        pptr, dptr = np.cumsum(plen) - plen, np.cumsum(dcount) - dcount
        didx = cat("didx", np.int64)  # local to a chunk: fill adds the chunk's first message
        self._table = SimpleNamespace(
            E=E, off=np.cumsum(E) - E, src=cat("src_a", np.int64), dst=cat("dst_a", np.int64),
            down=cat("down_a", np.int8), hops=cat("hops_f", np.float64), plen=plen, pptr=pptr,
            plinks=cat("plinks", np.int64), ndeps=cat("ndeps", np.int64), dcount=dcount, dptr=dptr, didx=didx)
        return self._table


class _Timed:
    """Messages of a tree collective (one per job, chunk and tree edge) with their data
    dependencies, scheduled by :meth:`schedule` and emitted by :meth:`emit`. ``ush[j]`` /
    ``dsh[j]``: job ``j``'s up and down trees, ``utree[j]`` / ``dtree[j]`` their indices in
    the plan, ``rate[j]`` its bytes/s."""

    def __init__(self, L: _Lowering, ush: list[TreeShape], dsh: list[TreeShape], links, per_msg: float,
                 utree: Sequence[int], dtree: Sequence[int], rate: Sequence[float]):
        self.L, self.links, self.per_msg = L, links, per_msg
        self.ush, self.dsh, self.utree, self.dtree, self.rate = ush, dsh, utree, dtree, rate
        self.src: list[int] = []
        self.dst: list[int] = []
        self.tree: list[int] = []  # the job
        self.chunk: list[int] = []
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.down: list[bool] = []  # out-tree (broadcast) message, else in-tree (reduce)
        self.deps: list[tuple[int, ...]] = []
        self.path: list[tuple[int, ...]] = []
        self.key: list[float] = []
        self.itemsize = DTYPE_SIZES[L.spec.dtype]
        self.hop_s = HOP_SLACK
        self.lag = None  # per job, seconds added to its keys (a drain tree's: DRAIN_TREE)
        self.upsend: dict[tuple[int, int, int], int] = {}
        self.upmsg: dict[tuple[int, int, int], int] = {}  # (job, chunk, sender) -> up message
        self.rootrecv: dict[tuple[int, int], list[int]] = {}
        self.pieces: list[tuple[int, int, int]] = []
        # per job, the chunk number of its first chunk on its up / down tree (a tree's chunks
        # are numbered across the jobs that share it)
        self.ubase: list[int] = [0] * len(ush)
        self.dbase: list[int] = [0] * len(ush)

    def _path(self, verts: Sequence[str]) -> tuple[int, ...]:
        ids = self.links.id
        out = []
        for u, v in zip(verts, verts[1:]):
            i = ids.get((u, v))
            if i is None:
                raise KeyError((u, v))
            out.append(i)
        return tuple(out)

    def _maybe_path(self, verts: Sequence[str]) -> tuple[int, ...] | None:
        """The link path, or None when a hop is missing (an in-tree over one-way links has
        no path parent -> child; only the direction a message takes must exist)."""
        try:
            return self._path(verts)
        except KeyError:
            return None

    def template(self, t: int, up: bool, down: bool) -> "_Chunk":
        """The messages of one chunk of job ``t``: reduced to the root over its up tree
        (``up``), then (``down``) broadcast from it over its down tree. Raises KeyError
        when a message's direction of a tree path is not a link."""
        us, ds = self.ush[t], self.dsh[t]
        upaths, dpaths = self.shape_info[id(us)][0], self.shape_info[id(ds)][0]
        udepth = self.shape_info[id(us)][2]
        dheight = self.shape_info[id(ds)][1]
        below = dheight[ds.root] if down else 0
        c = _Chunk()
        into: dict[int, list[int]] = {}

        def add(s: int, d: int, dn: bool, deps, path, hops: int) -> int:
            if path is None:
                raise KeyError((s, d))
            c.src.append(s)
            c.dst.append(d)
            c.down.append(dn)
            c.deps.append(tuple(deps))
            c.path.append(path)
            c.hops.append(hops)
            return len(c.src) - 1

        if up:
            for r in reversed(us.order):
                if r == us.root:
                    continue
                p = us.parent[r]
                i = add(r, p, False, into.get(r, ()), upaths[r][1], udepth[r] + below)
                into.setdefault(p, []).append(i)
                c.sender.append((i, r))
        got: dict[int, tuple[int, ...]] = {ds.root: tuple(into.get(us.root, ()))}
        if down:
            for r in ds.order:
                for ch in ds.children[r]:
                    got[ch] = (add(r, ch, True, got[r], dpaths[ch][0], 1 + dheight[ch]),)
        return c.freeze()

    def fill(self, spans: list[tuple[int, int]], sizes: list[int], weight: list[float], up: bool, down: bool,
             chunks: "_Templates", tail: bool | str = False) -> None:
        """Every job's messages, chunk by chunk (``sizes``: each job's chunk in elements;
        with ``tail``, the last chunk of each job whose down tree is two levels deep or more
        as two halves: :func:`_tail_halved`; with ``tail = "ends"`` its first chunk too:
        :func:`_ends_halved`),
        as arrays (``self.a``); the per-message lists the Python loops read are made on
        demand (:meth:`lists`). Message ``m`` of chunk ``k`` of job ``t`` is number
        ``off_t + k x E_t + i`` for the ``i``-th message of the job's chunk template
        (``chunks``, made on a job's first chunk; KeyError where a path is not a link). Its
        key: when a fluid stream at the job's weight ends the chunk, ``(b - lo) x itemsize /
        w``, less HOP_SLACK chunk periods per tree hop ahead (``template``'s ``hops``)."""
        import numpy as np

        itemsize, hop_s = self.itemsize, self.hop_s
        count: dict[tuple[str, int], int] = {}
        K = []
        halved = self._halved(spans) if tail else [False] * len(spans)
        for t, (lo, hi) in enumerate(spans):
            cut = (_ends_halved if tail == "ends" else _tail_halved) if halved[t] else _even_chunks
            atoms = cut(lo, hi, sizes[t])
            self.pieces.extend((t, a, b) for a, b in atoms)
            self.ubase[t], self.dbase[t] = count.get(("u", self.utree[t]), 0), count.get(("d", self.dtree[t]), 0)
            count[("u", self.utree[t])] = self.ubase[t] + len(atoms)
            count[("d", self.dtree[t])] = self.dbase[t] + len(atoms)
            K.append(len(atoms))
            if atoms:
                chunks.need(t, lambda t=t: self.template(t, up, down))
        tab = chunks.table()
        Kv = np.array(K, np.int64)
        E = tab.E * (Kv > 0)
        job_r = np.repeat(np.arange(len(K), dtype=np.int64), Kv)  # per chunk row: its job
        R = len(job_r)
        pieces = np.array(self.pieces, np.int64).reshape(R, 3)
        a_r, b_r = pieces[:, 1], pieces[:, 2]
        k_r = np.arange(R, dtype=np.int64) - np.repeat(np.cumsum(Kv) - Kv, Kv)
        E_r = E[job_r]
        row_start = np.cumsum(E_r) - E_r
        nm = int(E_r.sum())
        row_m = np.repeat(np.arange(R, dtype=np.int64), E_r)
        tidx = tab.off[job_r][row_m] + (np.arange(nm, dtype=np.int64) - row_start[row_m])
        lo_r = np.array([lo for lo, _ in spans], np.int64)[job_r]
        w_r = np.array(weight, np.float64)[job_r]
        rr_r = np.array([r if r > 0 else 1.0 for r in self.rate], np.float64)[job_r]
        # the float operations of the key, in the order the reference wrote them
        kk = (b_r - lo_r) * itemsize / w_r
        dl = hop_s * (b_r - a_r) * itemsize / rr_r
        pl = tab.plen[tidx]
        dc = tab.dcount[tidx]
        self.a = {
            "src": tab.src[tidx], "dst": tab.dst[tidx], "down": tab.down[tidx], "tree": job_r[row_m],
            "chunk": k_r[row_m], "lo": a_r[row_m], "hi": b_r[row_m],
            "key": kk[row_m] - dl[row_m] * tab.hops[tidx] + (self.lag[job_r][row_m] if self.lag is not None else 0.0),
            "plen": pl, "plinks": tab.plinks[_gather(tab.pptr[tidx], pl)], "ndeps": tab.ndeps[tidx],
            "dcount": dc, "didx": tab.didx[_gather(tab.dptr[tidx], dc)] + np.repeat(row_start[row_m], dc),
        }
        self.nm = nm
        offs = (np.cumsum(Kv * E) - Kv * E).tolist()
        self.blocks = [(t, offs[t], chunks.by_job[t], K[t]) for t in range(len(K)) if K[t]]
        self._lists = False

    def _halved(self, spans: list[tuple[int, int]]) -> list[bool]:
        """Per job, whether its last chunk goes as two halves (TAIL_HALVES): where its down
        tree forwards a chunk again (two levels deep or more) and other jobs carry data too.
        A lone chain's last chunk follows the one before it hop by hop and is held up
        nowhere: there the halves' extra message is all they add (a 4-hop chain broadcast of
        4 MiB: 6.77 -> 6.80 ms at its best chunk)."""
        live = sum(1 for lo, hi in spans if hi > lo)
        return [live > 1 and hi > lo and self.shape_info[id(self.dsh[t])][1][self.dsh[t].root] >= 2
                for t, (lo, hi) in enumerate(spans)]

    def lists(self) -> None:
        """The per-message lists (``src``, ``dst``, ``tree``, ``chunk``, ``lo``, ``hi``,
        ``down``, ``deps``, ``path``, ``key``) and ``upmsg`` from the arrays of :meth:`fill`."""
        if self._lists:
            return
        a = self.a
        for f in ("src", "dst", "tree", "chunk", "lo", "hi", "key"):
            setattr(self, f, a[f].tolist())
        self.down = [bool(x) for x in a["down"].tolist()]
        deps: list[tuple[int, ...]] = []
        path: list[tuple[int, ...]] = []
        for t, off, c, K in self.blocks:
            E = len(c.src)
            path.extend(c.path * K)
            for k in range(K):
                o = off + k * E
                deps.extend(tuple(o + d for d in ds) if ds else () for ds in c.deps)
                for i, r in c.sender:
                    self.upmsg[(t, k, r)] = o + i
        self.deps, self.path = deps, path
        self._lists = True

    def prepare_paths(self) -> None:
        """Per distinct tree: its link paths (down, up) per rank, heights and depths."""
        ranks = self.L.spec.ranks
        self.shape_info: dict[int, tuple] = {}
        for sh in list(self.ush) + list(self.dsh):
            if id(sh) in self.shape_info:
                continue
            depth = [0] * len(ranks)
            for r in sh.order:
                for c in sh.children[r]:
                    depth[c] = depth[r] + 1
            height = [0] * len(ranks)
            for r in reversed(sh.order):
                if r != sh.root:
                    height[sh.parent[r]] = max(height[sh.parent[r]], height[r] + 1)
            per = [((), ())] * len(ranks)
            for c in range(len(ranks)):
                if c == sh.root:
                    continue
                verts = sh.paths[c] or (ranks[sh.parent[c]], ranks[c])
                per[c] = (self._maybe_path(verts), self._maybe_path(tuple(reversed(verts))))
            self.shape_info[id(sh)] = (per, height, depth)

    def gated_ranks(self) -> set[int]:
        """The ranks whose sends are gated (see PORT_GATE): those with a link to another rank."""
        rank_of = {v: i for i, v in enumerate(self.L.spec.ranks)}
        return {rank_of[u] for u, v in self.links.ends if u in rank_of and v in rank_of}

    def schedule(self, window: int, gate: bool = False, wide: bool = False) -> list[int]:
        """Messages in the order the WFQ list schedule starts them (see the section
        comment); also fills ``self.pred``: per message, the message ``window`` places
        earlier on its port (or -1), ``start``, ``end`` and ``makespan``. ``wide``: ports of
        ranks without a link to another rank take SWITCH_ONLY_WINDOW messages in flight (see
        there). The loop runs natively (compiler/_simcore.c's ``wfq``, the same order and
        bit-identical times) where it is built, else :meth:`_schedule_py`."""
        names = set(self.L.spec.ranks)
        relay = any(v not in names for _, v in self.links.ends)
        rank_of = {v: i for i, v in enumerate(self.L.spec.ranks)}
        ports = {c.path[i][0] for _, _, c, _ in self.blocks for i in range(len(c.path))}
        port_rank = {m_port: rank_of[self.links.ends[m_port][0]] for m_port in ports}
        # without a switch every port is a direct link with a window of 1: each send starts at
        # a completion already, and gating would only add dependencies
        self.gated = gated = self.gated_ranks() if gate and relay else set()
        self.relay = relay
        direct = self.gated_ranks() if relay and wide else set()
        wide_ports = {x for x, r in port_rank.items() if r not in direct} if relay and wide else set()
        wsize = {x: (max(window, SWITCH_ONLY_WINDOW) if x in wide_ports else window) if relay else 1
                 for x in port_rank}
        if _wfq is not None and self.nm:
            return self._schedule_native(port_rank, wsize, gate, gated)
        self.lists()
        return self._schedule_py(port_rank, wsize, gate, gated)

    def _schedule_native(self, port_rank: dict[int, int], wsize: dict[int, int], gate: bool,
                         gated: set[int]) -> list[int]:
        """:meth:`_schedule_py`'s loop in compiler/_simcore.c over :meth:`fill`'s arrays."""
        import numpy as np

        nm, nl, a = self.nm, len(self.links.cap), self.a
        path_ptr, port, dep_ptr, nbytes = self._message_arrays()
        prank, wsz, lat, cap = self._link_arrays(port_rank, wsize)
        gflag = np.zeros(nl, np.int8)
        for x, r in port_rank.items():
            gflag[x] = r in gated
        order = np.empty(nm, np.int64)
        pred = np.empty(nm, np.int64)
        start = np.zeros(nm, np.float64)
        end = np.zeros(nm, np.float64)
        done, self.makespan = _wfq(
            port, path_ptr, a["plinks"], nbytes, a["key"], a["down"], dep_ptr, a["didx"], a["ndeps"].copy(),
            a["src"], a["dst"], prank, wsz, gflag, lat, cap, self.per_msg, bool(gate), bool(gated), self.L.n,
            order, pred, start, end)
        self._check_done(done)
        self.pred, self.start, self.end = pred.tolist(), start.tolist(), end.tolist()
        return order.tolist()

    def _message_arrays(self):
        """Per message, from :meth:`fill`'s arrays: ``(path_ptr, port, dep_ptr, nbytes)`` —
        its links ``plinks[path_ptr[m]:path_ptr[m + 1]]``, its first link, its dependents
        ``didx[dep_ptr[m]:dep_ptr[m + 1]]``, its bytes (float64, exact)."""
        import numpy as np

        nm, a = self.nm, self.a
        path_ptr = np.zeros(nm + 1, np.int64)
        np.cumsum(a["plen"], out=path_ptr[1:])
        dep_ptr = np.zeros(nm + 1, np.int64)
        np.cumsum(a["dcount"], out=dep_ptr[1:])
        nbytes = (a["hi"] - a["lo"]).astype(np.float64) * self.itemsize
        return path_ptr, a["plinks"][path_ptr[:-1]], dep_ptr, nbytes

    def _link_arrays(self, port_rank: dict[int, int], wsize: dict[int, int]):
        """Per link: ``(prank, wsz, lat, cap)`` — its sending rank (-1 where no message starts
        on it), its window, its latency and capacity."""
        import numpy as np

        nl = len(self.links.cap)
        prank = np.full(nl, -1, np.int64)
        wsz = np.ones(nl, np.int64)
        for x, r in port_rank.items():
            prank[x], wsz[x] = r, wsize[x]
        return prank, wsz, np.array(self.links.lat, np.float64), np.array(self.links.cap, np.float64)

    def _check_done(self, done: int) -> None:
        if done != self.nm:
            raise PlanError("timed lowering: a message never became ready (a cycle in the trees)")

    def _schedule_py(self, port_rank: dict[int, int], wsize: dict[int, int], gate: bool,
                     gated: set[int]) -> list[int]:
        """The reference loop of :meth:`schedule`."""
        import heapq
        from collections import deque

        lat, cap, per_msg = self.links.lat, self.links.cap, self.per_msg
        nm = len(self.src)
        nbytes = [(self.hi[m] - self.lo[m]) * self.itemsize for m in range(nm)]
        link_free = [0.0] * len(cap)
        queue: dict[int, list] = {}
        nxt: dict[int, float] = {}  # port -> earliest time its window allows a start
        started: dict[int, deque] = {}  # port -> (message, end) of its last ``window`` starts
        self.pred = [-1] * nm
        self.end = [0.0] * nm
        self.start = [0.0] * nm
        self.makespan = 0.0
        order: list[int] = []
        ev: list = []  # (time, phase, seq, what): phase 0 done(message), 1 try(port)
        seq = 0
        key, path, down = self.key, self.path, self.down
        heappush, heappop = heapq.heappush, heapq.heappop

        def ready(m: int, t: float) -> None:
            nonlocal seq
            port = path[m][0]
            # ties: the later stage (broadcast after reduce) and the later-added (deeper)
            # message first, so a chunk already under way drains before new ones start
            heappush(queue.setdefault(port, []), (key[m], not down[m], -m, m))
            heappush(ev, (max(t, nxt.get(port, 0.0)), 1, seq, port))
            seq += 1

        comp: list[list[float]] = [[] for _ in range(self.L.n)]  # per rank: future completions
        for t, x in self._tries(ev, ready):
            q = queue.get(x)
            if not q or t < nxt.get(x, 0.0) - 1e-15:
                continue
            if gate and t > 0.0 and port_rank[x] in gated:
                # start only when an op of the sending rank completes (see emit's gate): the
                # plan can then post the send at exactly this time
                c = comp[port_rank[x]]
                while c and c[0] < t - 1e-12:
                    heappop(c)
                if c and c[0] > t + 1e-12:
                    heappush(ev, (c[0], 1, seq, x))
                    seq += 1
                    continue
            m = heappop(q)[3]
            win = started.setdefault(x, deque())
            w = wsize[x]
            self.pred[m] = win[0][0] if len(win) == w else -1
            nb = nbytes[m]
            hops = path[m]
            cmin = min(cap[e] for e in hops)
            stream = nb / cmin
            t_hop = t
            end = t + per_msg
            for e in hops:
                if link_free[e] > t_hop:
                    t_hop = link_free[e]
                link_free[e] = t_hop + lat[e] + per_msg + nb / cap[e]
                t_hop += lat[e]
                if t_hop + per_msg + stream > end:
                    end = t_hop + per_msg + stream
            order.append(m)
            self.start[m] = t
            self.end[m] = end
            if gated:
                heappush(comp[self.src[m]], end)
                heappush(comp[self.dst[m]], end)
            if len(win) == w:
                win.popleft()
            win.append((m, end))
            allow = win[0][1] if len(win) == w else 0.0
            nxt[x] = max(allow, link_free[x])
            heappush(ev, (end, 0, seq, m))
            seq += 1
            if end > self.makespan:
                self.makespan = end
            if q:
                heappush(ev, (nxt[x], 1, seq, x))
                seq += 1
        if len(order) != nm:
            raise PlanError("timed lowering: a message never became ready (a cycle in the trees)")
        return order

    def _tries(self, ev: list, ready):
        """The event loop both schedulers share: pops ``ev``'s (time, phase, seq, what)
        events in order; a completion (phase 0, a message) makes the messages waiting for it
        ``ready(m, t)``; every port try (phase 1) is yielded as ``(t, port)``. The messages
        without dependencies are made ready at 0 first."""
        import heapq

        remaining = [len(d) for d in self.deps]
        dependents: list[list[int]] = [[] for _ in range(len(remaining))]
        for m, ds in enumerate(self.deps):
            for d in ds:
                dependents[d].append(m)
        for m, r in enumerate(remaining):
            if r == 0:
                ready(m, 0.0)
        heappop = heapq.heappop
        while ev:
            t, phase, _, x = heappop(ev)
            if phase == 0:
                for d in dependents[x]:
                    remaining[d] -= 1
                    if remaining[d] == 0:
                        ready(d, t)
                continue
            yield t, x

    def schedule_exact(self, window: int, wide: bool) -> list[int]:
        """:meth:`schedule` for collectives with a switch, written so that the plan replays it
        exactly (see EXACT_GATE): every message starts at time 0 or at the completion of an
        op of its sender or its receiver (``self.gate_by[m]``: that message and the side, 0
        sender, 1 receiver), messages that start at one instant start in the order the
        simulator will pop them (:meth:`_sim_key`), and every time is computed with the
        simulator's own floating-point operations. Fills ``pred``, ``start``, ``end``,
        ``makespan`` like :meth:`schedule`, and ``pop`` (each message's start position),
        ``first_in`` and ``ungated`` (starts after 0 with no completion to gate them). The loop
        runs natively (compiler/_simcore.c's ``exact``: the same order, gates and bit-identical
        times) where it is built, else :meth:`_schedule_exact_py`."""
        if _exact is not None and self.nm:
            return self._schedule_exact_native(window, wide)
        self.lists()
        return self._schedule_exact_py(window, wide)

    def _exact_windows(self, ports, window: int, wide: bool):
        """(port -> sending rank, the wide ports, port -> window) of :meth:`schedule_exact`."""
        rank_of = {v: i for i, v in enumerate(self.L.spec.ranks)}
        port_rank = {x: rank_of[self.links.ends[x][0]] for x in ports}
        direct = self.gated_ranks() if wide else set()
        wide_ports = {x for x, r in port_rank.items() if r not in direct} if wide else set()
        wsize = {x: max(window, SWITCH_ONLY_WINDOW) if x in wide_ports else window for x in port_rank}
        return port_rank, wide_ports, wsize

    def _schedule_exact_native(self, window: int, wide: bool) -> list[int]:
        """:meth:`_schedule_exact_py`'s loop in compiler/_simcore.c over :meth:`fill`'s arrays."""
        import numpy as np

        nm, a = self.nm, self.a
        path_ptr, port, dep_ptr, nbytes = self._message_arrays()
        port_rank, _, wsize = self._exact_windows(np.unique(port).tolist(), window, wide)
        prank, wsz, lat, cap = self._link_arrays(port_rank, wsize)
        # first_in's and upmsg's keys as message numbers, chunk template by chunk template
        rep = np.full(nm, -1, np.int64)
        upz = np.full(nm, -1, np.int64)
        allreduce = self.L.spec.kind == "allreduce"
        for _, off, c, K in self.blocks:
            E = len(c.src)
            rl, ul = c.exact_locals()
            base = off + np.arange(K, dtype=np.int64)[:, None] * E
            rep[off:off + K * E] = np.where(rl >= 0, base + rl, -1).ravel()
            if allreduce:
                upz[off:off + K * E] = np.where(ul >= 0, base + ul, -1).ravel()
        avgroot = np.zeros(nm, np.int8)
        if allreduce and self.L.op == "avg" and self.L.n > 1:  # the root's Send waits for its Scale
            droot = np.array([sh.root for sh in self.dsh], np.int64)[a["tree"]]
            avgroot = ((a["down"] != 0) & (a["src"] == droot)).astype(np.int8)
        order, pred, pop, gate_z, first_in = (np.empty(nm, np.int64) for _ in range(5))
        start, end = np.zeros(nm, np.float64), np.zeros(nm, np.float64)
        gate_side = np.zeros(nm, np.int8)
        done, self.makespan, self.ungated = _exact(
            port, path_ptr, a["plinks"], nbytes, a["key"], a["down"], dep_ptr, a["didx"], a["ndeps"].copy(),
            a["src"], a["dst"], rep, upz, avgroot, prank, wsz, lat, cap, self.per_msg, self.L.n,
            order, pred, start, end, pop, gate_z, gate_side, first_in)
        self._check_done(done)
        self.pred, self.start, self.end, self.pop = pred.tolist(), start.tolist(), end.tolist(), pop.tolist()
        g = np.flatnonzero(gate_z >= 0)
        self.gate_by = dict(zip(g.tolist(), zip(gate_z[g].tolist(), gate_side[g].tolist())))
        f = np.flatnonzero(first_in >= 0)
        self.first_in = dict(zip(zip(a["dst"][f].tolist(), a["tree"][f].tolist(), a["chunk"][f].tolist()),
                                 first_in[f].tolist()))
        return order.tolist()

    def _schedule_exact_py(self, window: int, wide: bool) -> list[int]:
        """The reference loop of :meth:`schedule_exact`."""
        import bisect
        import heapq
        import itertools
        from collections import deque

        lat, cap, per_msg = self.links.lat, self.links.cap, self.per_msg
        fixed = [l + per_msg for l in lat]
        inv = [1.0 / c for c in cap]
        nm = len(self.src)
        src, dst, path, key, down = self.src, self.dst, self.path, self.key, self.down
        nbytes = [(self.hi[m] - self.lo[m]) * self.itemsize for m in range(nm)]
        cmin: dict[tuple[int, ...], float] = {}
        for pth in set(path):
            cmin[pth] = min(cap[e] for e in pth)
        stream = [nbytes[m] / cmin[path[m]] for m in range(nm)]
        port_rank, wide_ports, wsize = self._exact_windows({p[0] for p in path}, window, wide)
        link_free = [0.0] * len(cap)
        queue: dict[int, list] = {}
        allow: dict[int, float] = {}  # port -> when its window next allows a start
        started: dict[int, deque] = {}
        last: dict[int, float] = {}  # port -> its latest start (one start per port and instant)
        comp: list[list[tuple[float, int]]] = [[] for _ in range(self.L.n)]  # per rank, sorted
        self.pred = [-1] * nm
        self.end = [0.0] * nm
        self.start = [0.0] * nm
        self.pop = [-1] * nm  # position in the start order (the simulator's pop order)
        self.gate_by = {}
        self.first_in: dict[tuple[int, int, int], int] = {}  # (rank, job, chunk) -> first up message in
        self.makespan = 0.0
        self.ungated = 0
        order: list[int] = []
        ev: list = []  # (time, phase, seq, what): phase 0 done(message), 1 try(port)
        tick = itertools.count()  # seq: pushes at one time and phase pop in push order
        heappush, heappop = heapq.heappush, heapq.heappop
        inf = float("inf")

        def ready(m: int, t: float) -> None:
            x = path[m][0]
            heappush(queue.setdefault(x, []), (key[m], not down[m], -m, m))
            heappush(ev, (max(t, allow.get(x, 0.0)), 1, next(tick), x))

        bisect_left, bisect_right, insort = bisect.bisect_left, bisect.bisect_right, bisect.insort
        pred, pop, t_start, t_end, gate_by, first_in = self.pred, self.pop, self.start, self.end, self.gate_by, \
            self.first_in
        tree, chunk = self.tree, self.chunk

        def decide(x: int, m: int, t: float):
            """('go', gate or None) or ('wait', time)."""
            if t == 0.0 and x not in last:  # everything without dependencies is posted at 0
                return "go", None
            cs, cd = comp[port_rank[x]], comp[dst[m]]
            for c in (cs, cd):  # drop the completions before t
                if c and c[0][0] < t:
                    del c[:bisect_left(c, (t, -1))]
            now = None
            if last.get(x) != t:
                if cs and cs[0][0] == t:
                    now = (cs[0][1], 0)
                elif cd and cd[0][0] == t:
                    now = (cd[0][1], 1)
            # the latest completion after t while the port is still busy: a start there
            # reserves the port the moment it frees, and the order is committed as late as
            # it can be
            busy = (link_free[x], nm)
            later = -1.0
            for c in (cs, cd):
                i = bisect_right(c, busy) - 1
                if i >= 0 and c[i][0] > t and c[i][0] > later:
                    later = c[i][0]
            if later > t:
                return "wait", later
            if now is not None:
                return "go", now
            nxt = min(next((e for e, _ in cs if e > t), inf), next((e for e, _ in cd if e > t), inf))
            if nxt < inf:
                return "wait", nxt
            self.ungated += 1
            return "go", None

        def start(x: int, m: int, t: float, gate) -> None:
            heappop(queue[x])
            win = started.get(x)
            if win is None:
                win = started[x] = deque()
            w = wsize[x]
            full = len(win) == w
            if full:
                pred[m] = win.popleft()[0]
            if gate is not None:
                gate_by[m] = gate
            nb, st = nbytes[m], stream[m]
            t_hop = t
            end = t + per_msg
            for e in path[m]:  # cost.simulate's reservation, operation for operation
                if link_free[e] > t_hop:
                    t_hop = link_free[e]
                link_free[e] = t_hop + (fixed[e] + nb * inv[e])
                t_hop += lat[e]
                if t_hop + per_msg + st > end:
                    end = t_hop + per_msg + st
            pop[m] = len(order)
            order.append(m)
            if not down[m]:
                first_in.setdefault((dst[m], tree[m], chunk[m]), m)
            t_start[m], t_end[m] = t, end
            insort(comp[src[m]], (end, m))
            insort(comp[dst[m]], (end, m))
            last[x] = t
            win.append((m, end))
            allow[x] = win[0][1] if len(win) == w else 0.0
            heappush(ev, (end, 0, next(tick), m))
            if end > self.makespan:
                self.makespan = end
            if queue[x]:
                heappush(ev, (max(t, allow[x]), 1, next(tick), x))

        for t, x in self._tries(ev, ready):
            ports = {x}
            while ev and ev[0][0] == t and ev[0][1] == 1:
                ports.add(heappop(ev)[3])
            go = []
            for x in sorted(ports):
                q = queue.get(x)
                if not q or t < allow.get(x, 0.0):
                    continue
                m = q[0][3]
                what, arg = decide(x, m, t)
                if what == "go":
                    go.append((x, m, arg))
                else:
                    heappush(ev, (arg, 1, next(tick), x))
            if len(go) > 1:  # in the simulator's order among messages ready at one instant
                keyed = sorted((self._sim_key(x, m, g, started, window, wide_ports), x, m, g) for x, m, g in go)
                if keyed[0][0][0] < 0 and any(not down[m] for _, _, m, _ in keyed):
                    # an up message's key depends on which Copy the others' starts create
                    while keyed:
                        i = min(range(len(keyed)), key=lambda i: self._sim_key(*keyed[i][1:], started, window,
                                                                                wide_ports))
                        start(keyed[i][1], keyed[i][2], t, keyed[i][3])
                        keyed.pop(i)
                else:
                    for _, x, m, g in keyed:
                        start(x, m, t, g)
            elif go:
                start(go[0][0], go[0][1], t, go[0][2])
        if len(order) != nm:
            raise PlanError("timed lowering: a message never became ready (a cycle in the trees)")
        return order

    def _sim_key(self, x: int, m: int, gate, started, window: int, wide_ports) -> tuple:
        """Where cost.simulate puts message ``m`` among the messages ready at the same
        instant: it pushes a message when the later of its Send and Recv is posted, which
        happens while it processes the start of the latest-started message an op of either
        depends on (a Send's dependents before its Recv's), or, for ops without message
        dependencies, in the first pass over every rank's program (rank by rank). Returns
        ``(start position of that message, 0 send / 1 recv / 2 after a Scale, rank, copy)``."""
        pop, src, dst = self.pop, self.src, self.dst
        s, d, t, k = src[m], dst[m], self.tree[m], self.chunk[m]
        best = (-1, 0, s, 0)
        deps = self.deps[m]
        if deps:
            if self.down[m] and self.L.spec.kind == "allreduce" and self.L.op == "avg" and self.L.n > 1 \
                    and s == self.dsh[t].root:
                best = max(best, (max(pop[z] for z in deps), 2, 0, 0))
            else:
                best = max(best, max((pop[z], 1, 0, 0) for z in deps))
        win = started.get(x)
        w = max(window, SWITCH_ONLY_WINDOW) if x in wide_ports else window
        if win is not None and len(win) == w:
            best = max(best, (pop[win[0][0]], 0, 0, 0))
        if gate is not None and gate[1] == 0:
            z = gate[0]
            best = max(best, (pop[z], 0 if src[z] == s else 1, 0, 0))
        if self.down[m]:
            recv = (-1, 0, d, 0)
            if self.L.spec.kind == "allreduce":
                z = self.upmsg.get((t, k, d))
                if z is not None:
                    recv = (pop[z], 0, 0, 0)
        else:  # the receive depends on the Copy into its accumulator, made at its first use
            f = self.first_in.get((d, t, k))
            recv = (-1, 1, d, pop[f] if f is not None else len(pop))
        if gate is not None and gate[1] == 1:
            z = gate[0]
            recv = max(recv, (pop[z], 0 if src[z] == d else 1, 0, 0))
        return max(best, recv)

    def ingress_order(self, on: bool) -> None:
        """``self.ing``: per message, the message into the same last link (the receiver's
        link out of a switch) that the schedule ended last before this one started, or -1
        (all -1 unless ``on``): see INGRESS_GATE."""
        self.lists()
        import bisect

        nm = len(self.src)
        self.ing = [-1] * nm
        if not on:
            return
        per: dict[int, list[tuple[float, int]]] = {}
        for m in range(nm):
            per.setdefault(self.path[m][-1], []).append((self.end[m], m))
        for lst in per.values():
            lst.sort()
        for m in range(nm):
            lst = per[self.path[m][-1]]
            i = bisect.bisect_right(lst, (self.start[m] + 1e-15, nm)) - 1
            if i >= 0:
                self.ing[m] = lst[i][1]

    def _ingress(self, m: int, recv_op: list[int]) -> tuple[int, ...]:
        x = self.ing[m]
        return (recv_op[x],) if x >= 0 and recv_op[x] >= 0 else ()

    def emit(self, order: list[int], kind: str, dst_of, gate: bool = False) -> None:
        """Write the scheduled messages as ops, in schedule order (so every dependency,
        data or port window, names an earlier op). ``dst_of(r, t, a, b)``: the range rank
        ``r`` reduces chunk ``[a, b)`` of job ``t`` into (reducing kinds)."""
        self.lists()
        L, B = self.L, self.L.B
        ush, dsh = self.ush, self.dsh
        send_op = [-1] * len(self.src)
        recv_op = [-1] * len(self.src)
        copies: dict[tuple[int, int, int], int] = {}  # (rank, job, chunk) -> Copy into acc
        pending: dict[tuple[int, int], int] = {}  # (job, chunk) -> reductions into root left
        scaled: dict[tuple[int, int], int] = {}  # (job, chunk) -> root's Scale (avg)
        avg = L.op == "avg" and L.n > 1
        roots_copy = kind in ("broadcast", "allgather")
        if roots_copy:  # the root's own copy of every chunk: local, independent of the rest
            for t, a, b in self.pieces:
                root = dsh[t].root
                B.add(root, Copy(self._root_src(kind, root, a, b), ChunkRef("out", a, b - a)))
        else:  # a root without children (one rank) reduces nothing: its input is the result
            for t, a, b in self.pieces:
                root = ush[t].root
                if not ush[t].children[root]:
                    B.add(root, Copy(ChunkRef("in", a, b - a), dst_of(root, t, a, b)))
        import heapq

        pending_ops: list[list[tuple[float, int]]] = [[] for _ in range(L.n)]  # per rank: (end, op)
        last_done: list[tuple[float, int]] = [(-1.0, -1)] * L.n
        gated = self.gated if gate else set()
        port_last: dict[int, tuple[float, int]] = {}  # port -> the latest-ending dep of its last send
        for m in order:
            s, d, t, k, a, b = self.src[m], self.dst[m], self.tree[m], self.chunk[m], self.lo[m], self.hi[m]
            cnt = b - a
            deps = [recv_op[x] for x in self.deps[m]]
            if self.pred[m] >= 0:
                deps.append(send_op[self.pred[m]])
            gdep: tuple[int, ...] = ()  # the receive side's gate (EXACT_GATE)
            g = self.gate_by.get(m) if self.exact else None
            if g is not None:
                x, side = g
                r = s if side == 0 else d
                op = send_op[x] if self.src[x] == r else recv_op[x]
                if side == 0:
                    deps.append(op)
                else:
                    gdep = (op,)
            if gate and s in gated:
                # the rank's op that last completed before this send's scheduled start: the
                # send is then posted near that start, not as soon as its data and window allow
                q = pending_ops[s]
                while q and q[0][0] <= self.start[m] + 1e-15:
                    done = heapq.heappop(q)
                    if done > last_done[s]:
                        last_done[s] = done
                own = [(self.end[x], recv_op[x]) for x in self.deps[m]]
                if self.pred[m] >= 0:
                    own.append((self.end[self.pred[m]], send_op[self.pred[m]]))
                if last_done[s][1] >= 0:
                    own.append(last_done[s])
                port = self.path[m][0]
                if port in port_last:
                    own.append(port_last[port])
                if own:
                    latest = max(own)
                    port_last[port] = latest
                    deps.append(latest[1])
            if self.down[m]:
                sh = dsh[t]
                if s == sh.root:
                    if kind in ("broadcast", "allgather"):
                        src = self._root_src(kind, s, a, b)
                    else:  # allreduce: the root's reduced chunk
                        src = ChunkRef("out", a, cnt)
                        if avg:
                            deps = [scaled[(t, k)]] + deps[len(self.deps[m]):]
                else:
                    src = ChunkRef("out", a, cnt)
                rdeps: tuple[int, ...] = ()
                if kind == "allreduce":
                    up = self.upsend.get((t, k, d))
                    rdeps = (up,) if up is not None else ()
                sid, rid = B.message(s, d, src, ChunkRef("out", a, cnt), send_deps=_deps(*deps),
                                     recv_deps=rdeps + gdep + self._ingress(m, recv_op), tree=self.dtree[t],
                                     chunk=self.dbase[t] + k)
            else:
                sh = ush[t]
                src = ChunkRef("in", a, cnt) if not sh.children[s] else dst_of(s, t, a, b)
                acc = dst_of(d, t, a, b)
                ck = (d, t, k)
                if ck not in copies:
                    copies[ck] = B.add(d, Copy(ChunkRef("in", a, cnt), acc))
                sid, rid = B.message(s, d, src, acc, send_deps=_deps(*deps),
                                     recv_deps=(copies[ck],) + gdep + self._ingress(m, recv_op), reduce=True,
                                     tree=self.utree[t], chunk=self.ubase[t] + k)
                self.upsend[(t, k, s)] = sid
            send_op[m], recv_op[m] = sid, rid
            if gated:
                heapq.heappush(pending_ops[s], (self.end[m], sid))
                heapq.heappush(pending_ops[d], (self.end[m], rid))
            if not self.down[m] and d == sh.root:
                left = pending.get((t, k), len(sh.children[d])) - 1
                pending[(t, k)] = left
                self.rootrecv.setdefault((t, k), []).append(rid)
                if left == 0 and avg:
                    scaled[(t, k)] = B.add(d, Scale(dst_of(d, t, a, b), L.n, tuple(self.rootrecv[(t, k)])))

    def _root_src(self, kind: str, root: int, a: int, b: int) -> ChunkRef:
        if kind == "allgather":
            return ChunkRef("in", a - self.L.block(root)[0], b - a)
        return ChunkRef("in", a, b - a)


def _even_chunks(lo: int, hi: int, ce: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into the fewest chunks of at most ``ce`` elements, all of nearly one
    size: no short last chunk paying a whole message's fixed cost for a few bytes.

    >>> _even_chunks(0, 100, 30)
    [(0, 25), (25, 50), (50, 75), (75, 100)]
    >>> _even_chunks(0, 7, 3)
    [(0, 3), (3, 5), (5, 7)]
    """
    n = hi - lo
    if n <= 0:
        return []
    m = -(-n // ce)
    out, a = [], lo
    for i in range(m):
        b = a + n // m + (1 if i < n % m else 0)
        out.append((a, b))
        a = b
    return out


def _tail_halved(lo: int, hi: int, ce: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` as :func:`_even_chunks` cuts it, except that a span of at least two
    chunks sends its last ``ce`` elements as two half chunks (see TAIL_HALVES): every piece
    still holds between half a chunk and a chunk (bounds.EVEN_CHUNK_RATIO).

    >>> _tail_halved(0, 100, 30)
    [(0, 24), (24, 47), (47, 70), (70, 85), (85, 100)]
    >>> _tail_halved(0, 50, 30)
    [(0, 25), (25, 50)]
    """
    half = ce // 2
    if half < 1 or hi - lo < 2 * ce:
        return _even_chunks(lo, hi, ce)
    mid = hi - 2 * half
    return _even_chunks(lo, mid, ce) + [(mid, mid + half), (mid + half, hi)]


def _ends_halved(lo: int, hi: int, ce: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` as :func:`_tail_halved` cuts it, except that a span of at least three
    chunks also sends its first ``ce`` elements as two half chunks: every piece still holds
    between half a chunk and a chunk.

    >>> _ends_halved(0, 100, 30)
    [(0, 15), (15, 30), (30, 50), (50, 70), (70, 85), (85, 100)]
    >>> _ends_halved(0, 80, 30)
    [(0, 25), (25, 50), (50, 65), (65, 80)]
    """
    half = ce // 2
    if half < 1 or hi - lo < 3 * ce:
        return _tail_halved(lo, hi, ce)
    head, mid = lo + 2 * half, hi - 2 * half
    return [(lo, lo + half), (lo + half, head)] + _even_chunks(head, mid, ce) + [(mid, mid + half), (mid + half, hi)]


def narrow_factors(spec, ush: list[TreeShape], dsh: list[TreeShape], topo: Topology) -> list[float]:
    """Per job of collective ``spec`` (its ranks and kind), the capacity of the narrowest
    link its trees' messages cross (the up tree's routes walked backwards) over the widest
    such capacity among the jobs: the share of the chunk each job cuts at in the
    *narrow-link* form (:func:`lower_jobs` ``factors``).

    A message moves cut-through at its path's narrowest capacity, so a tree level over a
    12 GB/s PCIe route takes a 25 GB/s NVLink level's time twice over for the same chunk,
    and a job whose trees cross it fills and drains its pipeline that much slower; the
    schedule's rebalancing then moves bytes from it to the others, loading their links
    above the bound. Scaled, every job's level takes about one chunk time."""
    ranks = spec.ranks
    kind = spec.kind
    up = kind in ("reduce", "reduce_scatter", "allreduce")
    down = kind in ("broadcast", "allgather", "allreduce")
    links = _msg_paths(topo, ranks)

    def narrowest(sh: TreeShape, backwards: bool) -> float:
        low = float("inf")
        for c in range(len(ranks)):
            if c == sh.root:
                continue
            verts = sh.paths[c] or (ranks[sh.parent[c]], ranks[c])
            if backwards:
                verts = tuple(reversed(verts))
            for a, b in zip(verts, verts[1:]):
                i = links.id.get((a, b))
                if i is not None:
                    low = min(low, links.cap[i])
        return low

    low = [min(narrowest(ush[t], True) if up else float("inf"), narrowest(dsh[t], False) if down else float("inf"))
           for t in range(len(ush))]
    top = max((x for x in low if x < float("inf")), default=0.0)
    return [x / top if 0 < x < float("inf") and top > 0 else 1.0 for x in low]


def _job_chunks(ce: int, weight: Sequence[float], groups: dict[int, list[int]], min_chunk: float,
                factors: Sequence[float] | None = None) -> list[int]:
    """Per job, its chunk in elements: ``ce`` scaled by its weight over the heaviest of its
    group, at least ``min_chunk x ce`` (1: every job cuts at ``ce``). A job of 1/J of the
    links' rate under weighted fair queueing moves one chunk per J chunk times, so with one
    chunk size its pipeline fills and drains J times slower than the heaviest's; scaled,
    every job of a group cuts its share into about the same number of chunks and all fill
    and drain together.

    ``factors``: per job, its chunk's share of ``ce``, in place of that (:func:`narrow_factors`).

    >>> _job_chunks(100, [4.0, 1.0, 0.01], {0: [0, 1, 2]}, 0.1)
    [100, 25, 10]
    >>> _job_chunks(100, [4.0, 1.0], {0: [0, 1]}, 1.0, [1.0, 0.48])
    [100, 48]
    """
    if factors is not None:
        return [max(1, int(ce * f)) for f in factors]
    out = [ce] * len(weight)
    if min_chunk >= 1.0:
        return out
    for ts in groups.values():
        top = max(weight[t] for t in ts)
        for t in ts:
            out[t] = max(1, int(ce * max(min_chunk, weight[t] / top)))
    return out


TIMED_KINDS = frozenset({"broadcast", "reduce", "allreduce", "allgather", "reduce_scatter"})


# the trees' paths and chunk templates of the last few lowerings, kept for the next lowering
# of the same trees (a chunk search lowers them at 3-8 sizes; one MI250 node's allgather: 48
# trees, 4 sizes, the paths and templates a third of each timed lowering), up to this many
# template messages per entry (jobs x ranks)
MEMO_MAX_MESSAGES = 200_000
_MEMO_SIZE = 4
_memo: list = []


def _memo_get(links, ush, dsh, up: bool, down: bool):
    """The (shape_info, _Templates) of these very trees (compared by identity: the memo holds
    them, so no id is reused while an entry lives), or None."""
    for ent in _memo:
        l, u, d, uu, dd, got = ent
        if l is links and uu == up and dd == down and len(u) == len(ush) and len(d) == len(dsh) \
                and all(x is y for x, y in zip(u, ush)) and all(x is y for x, y in zip(d, dsh)):
            return got
    return None


def _memo_put(links, ush, dsh, up: bool, down: bool, got) -> None:
    _memo.insert(0, (links, tuple(ush), tuple(dsh), up, down, got))
    del _memo[_MEMO_SIZE:]


# a schedule that replays exactly is dropped for a rival plan only when its makespan is above
# the rival's by more than this: the two are computed with different floating-point sums
REPLAY_MARGIN = 1e-9


class Outrun(Exception):
    """The timed schedule lost to its rival (lower_jobs' ``rival``); ``args[0]``: the rival's time."""


def _replays_exactly(T: _Timed) -> bool:
    """Whether the plan emitted from ``T``'s schedule simulates to ``T.makespan``: every
    message one hop over its sender's own link, no switch, so a window of 1 on every port.
    A message then starts, in the schedule and in cost.simulate alike, when its data is
    there and its port's previous message has ended, and nothing else reserves its link."""
    return not T.relay and not T.exact and all(c.one_hop for _, _, c, _ in T.blocks)


def lower_timed(L: _Lowering, shapes: list[TreeShape], spans: list[tuple[int, int]], per_root: bool,
                topo: Topology, per_msg: float, window: int, rival=None,
                rival_ops: int = 0, narrow: Sequence[float] | None = None,
                halves: str | None = None) -> list[tuple[int, int]] | None:
    """Emit the tree kinds through the timed schedule and return the trees' spans; None
    (nothing emitted) when a tree path is not made of the collective's links (the plain
    lowering then routes it). Each tree is one job (its own up and down tree); the trees
    sharing one block form a group (allgather, reduce_scatter and per-root allreduce: one
    group per root; otherwise one group). ``narrow``: per tree, the share of the chunk it
    cuts at (:func:`narrow_factors`; None: by :func:`_job_chunks`' weights); ``halves``: see
    :func:`lower_jobs`."""
    kind = L.spec.kind
    grouped = kind in ("allgather", "reduce_scatter") or per_root
    groups: dict[int, list[int]] = {}
    for t, sh in enumerate(shapes):
        groups.setdefault(sh.root if grouped else 0, []).append(t)
    ids = list(range(len(shapes)))
    return lower_jobs(L, shapes, shapes, ids, ids, [sh.rate for sh in shapes], groups, spans, topo, per_msg, window,
                      TREE_MIN_CHUNK, rival, rival_ops, halves=halves, factors=narrow)


def _drain_tree(T: _Timed, L: _Lowering, links, per_msg: float, share: float):
    """The drain tree of broadcast schedule ``T`` (see DRAIN_TREE) and its starting rate:
    ``(TreeShape, bytes/s)``, or None where the ranks' direct links do not span them. Each
    rank's parent is the one from which a chunk sent after ``T``'s last use of every link
    arrives first (earliest arrival over the direct rank-to-rank links, a hop costing its
    latency, the per-message cost and a chunk over its capacity); the rate is
    ``share`` of the bytes its narrowest edge can carry between its last use and the
    schedule's end, spread over the schedule."""
    import heapq

    import numpy as np

    from .trees import PackedTree

    ranks = L.spec.ranks
    n, a = L.n, T.a
    if n < 2 or not T.nm:
        return None
    free = np.zeros(len(links.cap))  # per link, the end of the schedule's last message over it
    np.maximum.at(free, a["plinks"], np.repeat(np.asarray(T.end, np.float64), a["plen"]))
    rank_of = {v: i for i, v in enumerate(ranks)}
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for e, (u, v) in enumerate(links.ends):
        if u in rank_of and v in rank_of:
            out[rank_of[u]].append((rank_of[v], e))
    chunk = L.ce * T.itemsize
    root = T.dsh[0].root
    arrive = [float("inf")] * n
    parent = [(-1, -1)] * n
    arrive[root] = 0.0
    heap = [(0.0, root)]
    done = [False] * n
    while heap:
        t, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        for v, e in out[u]:
            got = max(t, free[e]) + links.lat[e] + per_msg + chunk / links.cap[e]
            if not done[v] and got < arrive[v]:
                arrive[v], parent[v] = got, (u, e)
                heapq.heappush(heap, (got, v))
    if not all(done):
        return None
    edges = [(ranks[parent[v][0]], ranks[v], (ranks[parent[v][0]], ranks[v])) for v in range(n) if v != root]
    room = min(links.cap[parent[v][1]] * max(0.0, T.makespan - free[parent[v][1]]) for v in range(n) if v != root)
    total = float(sum(T.rate))
    rate = share * room / T.makespan
    if not rate > total * 1e-6:
        return None
    tree = PackedTree(root=ranks[root], edges=tuple(edges), rate=rate)
    return TreeShape.of(tree, ranks, len(T.dsh)), rate


def _rebalanced(L: _Lowering, ush, dsh, utree, dtree, rates, groups, spans, links, per_msg: float, window: int,
                min_chunk: float, rounds: int, up: bool, down: bool, lag=None, memo: bool = True, weight=None,
                tail: bool | str = False, exact: bool = False, rival=None, rival_ops: int = 0, factors=None):
    """The fastest of up to ``rounds + 1`` schedules of the jobs, each job's share scaled
    between rounds by its group's mean finish time over its own (see :func:`lower_jobs`):
    ``(T, order, spans)``, or None when a tree path is not made of the collective's links.
    ``lag``: per job, seconds added to its keys (None: none); ``memo``: keep the trees'
    paths and templates for the next lowering of the same trees; ``weight``: the jobs'
    starting shares (by default their rates; the first schedule then takes ``spans``);
    ``tail``: the last chunks in halves (TAIL_HALVES), "ends" the first too; ``exact``: see
    :func:`lower_jobs`;
    ``rival``, ``rival_ops``: as :func:`lower_jobs` takes them, for the stop after
    REBALANCE_STALL; ``factors``: per job, its chunk's share of ``L.ce`` (None: by
    ``min_chunk``, :func:`_job_chunks`)."""
    import numpy as np

    kind = L.spec.kind
    bounds_of = {g: (min(spans[t][0] for t in ts), max(spans[t][1] for t in ts)) for g, ts in groups.items()}
    if weight is not None:
        weight = list(weight)
        for g, ts in groups.items():
            for t, sp in zip(ts, split_by_rate(*bounds_of[g], [weight[t] for t in ts])):
                spans[t] = sp
    else:
        weight = [r if r > 0 else 1.0 for r in rates]
    best = None
    info = None
    njobs = len(ush)
    chunks: _Templates | None = None  # per job, its chunk's messages (the same in every round)
    for rnd in range(rounds + 1):
        if rnd:
            spans = [(0, 0)] * njobs
            for g, ts in groups.items():
                for t, sp in zip(ts, split_by_rate(*bounds_of[g], [weight[t] for t in ts])):
                    spans[t] = sp
        T = _Timed(L, ush, dsh, links, per_msg, utree, dtree, rates)
        if info is None:  # the trees' paths do not change with the shares or the chunk size
            got = _memo_get(links, ush, dsh, up, down) if memo else None
            if got is None:
                try:
                    T.prepare_paths()
                except KeyError:
                    return None
                got = (T.shape_info, _Templates(njobs))
                if memo and njobs * L.n <= MEMO_MAX_MESSAGES:
                    _memo_put(links, ush, dsh, up, down, got)
            info, chunks = got
        T.shape_info = info
        T.lag = lag
        sizes = _job_chunks(L.ce, weight, groups, min_chunk, factors)
        try:
            T.fill(spans, sizes, weight, up, down, chunks, tail)
        except KeyError:  # a message's direction of a tree path is not a link
            return None
        gate = PORT_GATE and window > 1
        if gate and EXACT_GATE and _has_relay(links, L.spec.ranks) and (exact or len(T.gated_ranks()) < L.n):
            order = T.schedule_exact(window, wide=kind != "broadcast")
            T.relay, T.exact, T.gated = True, True, set()
        else:
            order = T.schedule(window, gate, wide=kind != "broadcast")
            T.exact = False
        if best is None or T.makespan < best[0].makespan * (1 - 1e-9):
            best = (T, order, list(spans))
            stall = 0
        else:
            stall += 1
            if stall >= REBALANCE_STALL or (rival is not None and _behind(best[0], L, rival, rival_ops)):
                break
        finish_a = np.zeros(njobs)
        if T.nm:
            np.maximum.at(finish_a, T.a["tree"], np.asarray(T.end, np.float64))
        finish = finish_a.tolist()
        moved = False
        for ts in groups.values():
            live = [t for t in ts if finish[t] > 0]
            if len(live) < 2:
                continue
            mean = sum(finish[t] for t in live) / len(live)
            for t in live:
                weight[t] *= mean / finish[t]
            moved = moved or max(finish[t] for t in live) > mean * (1 + REBALANCE_TOLERANCE)
        if not moved:
            break
    return best


def _behind(T: _Timed, L: _Lowering, rival, rival_ops: int) -> bool:
    """Whether schedule ``T`` replays exactly (:func:`_replays_exactly`), its plan has at most
    ``rival_ops`` ops and ``rival()`` (the other order's predicted time) is ahead of it."""
    return (_replays_exactly(T) and 2 * T.nm + (L.n + 2) * len(T.pieces) <= rival_ops
            and T.makespan > rival() * (1 + REPLAY_MARGIN))


def lower_jobs(L: _Lowering, ush: list[TreeShape], dsh: list[TreeShape], utree: Sequence[int],
               dtree: Sequence[int], rates: Sequence[float], groups: dict[int, list[int]],
               spans: list[tuple[int, int]], topo: Topology, per_msg: float,
               window: int, min_chunk: float = 1.0, rival=None,
               rival_ops: int = 0, exact: bool = False, halves: str | None = None,
               factors: Sequence[float] | None = None) -> list[tuple[int, int]] | None:
    """Schedule and emit the jobs (see the module docstring) over their ``spans``; return the
    spans used, or None (nothing emitted) when a tree path is not made of the collective's
    links or the plan would exceed TIMED_MAX_MESSAGES.

    The packing's rates ignore the per-message cost, which weighs more on some trees than
    on others (a tree over the 10 GB/s, 3 us socket link of a DGX-1 loses 4% at 1 MiB
    chunks, one over NVLink 9%), so the trees finish at different times. Up to
    REBALANCE_ROUNDS times, each job's share is scaled by the mean finish time of its
    group (the jobs sharing one block) over its own, and the fastest schedule is kept
    (:func:`_rebalanced`). A broadcast then tries one more, lowest-priority tree built from
    that schedule (DRAIN_TREE); where it is kept, its shape is left in ``L.drain_shapes``
    and its span is the last of those returned.

    ``rival``: a callable giving the predicted time of another plan of the same trees (the
    plain order of lower.lower_priced), asked only where the kept schedule replays exactly
    (:func:`_replays_exactly`) and its plan has at most ``rival_ops`` ops; where the rival is
    faster, nothing is emitted and :class:`Outrun` is raised.

    ``exact``: over switches, schedule with :meth:`_Timed.schedule_exact` even where every
    rank has a link to another (EXACT_GATE names where it is used otherwise); the split
    allreduce asks for it (compiler/splitpack.py SPLIT_EXACT).

    ``halves``: which of each job's chunks go as two halves where its down tree (its in-tree,
    where the jobs only reduce) is two levels deep or more (TAIL_HALVES): "none", "last", or
    "ends" (the first and the last); None: the last where the jobs only broadcast, none where
    they reduce.

    ``factors``: per job, the share of the chunk it cuts at (:func:`narrow_factors`; None:
    every job at the chunk)."""
    import numpy as np

    kind = L.spec.kind
    links = _msg_paths(topo, L.spec.ranks)
    up = kind in ("reduce", "reduce_scatter", "allreduce")
    down = kind in ("broadcast", "allgather", "allreduce")
    per_chunk = (L.n - 1) * (int(up) + int(down))
    cuts = factors or [1.0] * len(spans)
    messages = sum(-(-(hi - lo) // max(1, int(L.ce * f))) for (lo, hi), f in zip(spans, cuts)) * per_chunk
    if messages > TIMED_MAX_MESSAGES:
        return None
    rounds = REBALANCE_ROUNDS if messages <= REBALANCE_MAX_MESSAGES else 0
    # which chunks go in halves (TAIL_HALVES): unless asked, the last where the jobs only broadcast
    tail: bool | str = False
    if TAIL_HALVES and (down or halves is not None):
        tail = (not up) if halves is None else {"none": False, "last": True, "ends": "ends"}[halves]
    best = _rebalanced(L, ush, dsh, utree, dtree, rates, groups, spans, links, per_msg, window, min_chunk, rounds,
                       up, down, tail=tail, exact=exact, rival=rival, rival_ops=rival_ops, factors=factors)
    if best is None:
        return None
    if DRAIN_TREE and kind == "broadcast" and rounds and len(groups) == 1 and not best[0].exact:
        base, shares = best[0], [hi - lo for lo, hi in best[2]]  # the packed trees' rebalanced shares
        scale = sum(rates) / max(1, sum(shares))
        drain = _drain_tree(base, L, links, per_msg, DRAIN_SHARE)
        if drain is not None:
            shape, rate = drain
            j = len(ush)
            lag = np.zeros(j + 1)
            lag[j] = base.makespan  # after every chunk of the packed trees, at every port
            got = _rebalanced(L, ush + [shape], dsh + [shape], list(utree) + [j], list(dtree) + [j],
                              list(rates) + [rate], {g: ts + [j] for g, ts in groups.items()}, spans + [(0, 0)],
                              links, per_msg, window, min_chunk, rounds, up, down, lag, memo=False,
                              weight=[x * scale for x in shares] + [rate], tail=tail, exact=exact,
                              factors=None if factors is None else list(factors) + [1.0])
            if got is not None and got[0].makespan < base.makespan * (1 - DRAIN_GAIN):
                best = got
                L.drain_shapes = [shape]
    T, order, spans = best
    gate = PORT_GATE and window > 1
    if rival is not None and _behind(T, L, rival, rival_ops):
        # the plan would simulate to T.makespan; where another plan of these trees is
        # already faster, emitting this one is wasted (lower.lower_priced would drop it)
        raise Outrun(rival())
    if kind == "reduce_scatter":
        def dst_of(r: int, t: int, a: int, b: int) -> ChunkRef:
            j = ush[t].root
            return ChunkRef("out", a - L.block(j)[0], b - a) if r == j else ChunkRef("tmp", a, b - a)
    else:
        def dst_of(r: int, t: int, a: int, b: int) -> ChunkRef:
            return ChunkRef("out", a, b - a)
    T.ingress_order(INGRESS_GATE and T.relay and kind != "broadcast" and not T.exact)
    T.emit(order, kind, dst_of, gate=gate)
    L.timed_makespan = T.makespan  # the schedule's own time (tests compare it with cost.simulate)
    return spans
