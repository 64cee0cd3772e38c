"""hcc.backends.adaptive — the dynamic, tree-based executor: late ranks and dead ranks do not
stall the others (Hoplite, SIGCOMM 2021; design.md "Adaptive hooks").

Where backends/executor.py interprets a plan's flattened per-rank programs, this executor runs
from the plan's *trees* and decides at run time who sends which chunk to whom, so it can
re-attach the children of a dead rank to a live ancestor (backends/repair.py) and give the
interior positions of a tree to the ranks that are ready first.

Terms
- flow: one tree's worth of work: a root rank, the ranks it spans, an element span of the
  output split into chunks, and a direction: *down* (the root's data to every member:
  broadcast, allgather's per-rank trees, gather's owner→root hops, allreduce's second half)
  and/or *up* (a reduction of the members' inputs to the root: reduce, allreduce's first half).
- shape: ``static`` (adaptive off) takes each flow's parent array from ``Plan.trees``;
  ``arrival`` (adaptive on) lays the flow's members out in the order they entered the run,
  the root first, so ready ranks are interior and late ranks are leaves
  (repair.arrival_parents): a chain for broadcast, a binary heap for reduce, allgather and
  gather. An allreduce in arrival order runs *star* flows over 8(n-1) sub-blocks (a direct
  reduce-scatter + allgather: every rank sends a sub-block's owner its piece, the owner sends
  back the sum). A sub-block is owned by the rank that *claimed* it through the log before
  the last arrival — a rank claims while its link, were the last rank to arrive now, would
  carry no more than CLAIM_CAP (1.5) hops in either direction (out: its own pieces still queued
  plus n-1 copies of what it owns; in: the pieces the absent ranks would send it plus the results
  of the rest: repair.claim_count) — and the sub-blocks nobody claimed go, at the last
  arrival, to the ranks whose links would finish first (repair.share_by_load). Early ranks
  thus own most of the buffer and a rank that arrives just before the last, its input still to push, owns
  little or nothing; owners reduce the pieces of early ranks while they wait for the late
  ones. Either shape is then repaired for the agreed dead set. Plans without usable trees
  and adaptive off get heaps in rank order (allreduce: n flows, flow ``i`` rooted at rank
  ``i``).
- default and fast path: ``adaptive`` unsaid (``Plan.adaptive`` None) is on for sockets and
  ray (:func:`adaptive_on`). With ``on_failure = abort`` and no quorum, a run first decides on
  one store counter whether every rank arrived before any rank declared the run late
  (:meth:`_Run.decide`, 30 ms): if so it runs the plan's flattened program
  (backends/executor.py) — nobody late pays 3 store round trips, the log is not touched.
- log, generation: the agreed event log of backends/agreement.py (arrivals, deaths, done,
  and the star allreduce's claims).
  Generation ``g`` = the number of deaths in the log so far; every message's tag carries
  ``g mod 16``, so a message of an older generation never matches a receive of this one.
- valid chunk (down): a chunk of ``out`` that holds its final value. For broadcast, allgather
  and gather every received chunk stays valid (the root's input never changes). For allreduce a
  final chunk is valid only while the set of ranks it reduced equals the current contributors:
  when a contributor dies, the chunks that already included its input become invalid and are
  recomputed from the survivors' inputs (inputs are never written, so they are all still there).
- partial (up): chunk ``c`` of this rank's input (op) its up-children's partials of chunk ``c``,
  with the set of ranks it covers. After a death a partial is reused only if it covers exactly
  the rank's new subtree (it is *clean*); otherwise it is recomputed. So only the chunks the
  dead rank touched on the way up are redone; the others resume.

Protocol per generation, per flow (messages over the data transport, tags below):
- down: each member sends ``HAVE(bitmap of valid chunks)`` to its parent and posts receives for
  the chunks it lacks; a parent sends a child every chunk the child lacks as soon as it holds
  it (so a repaired child resumes from what it already has: no restart from byte 0).
- up: the root computes which final chunks it lacks and sends ``NEED(bitmap)`` to its children;
  every rank reuses its clean partials, resets the others to its input, and forwards
  ``NEED`` to its own children; partials flow up as soon as they are complete.
- in the run's first generation HAVE and NEED are implied (nobody holds a chunk it does not
  root, every root needs everything) and not sent; only generations after a death send them.
- ``on_failure = continue`` (or a quorum): a rank appends ``done(run, g)`` to the log once its
  own output is complete in generation g, and keeps serving its children until the log shows
  every live rank done (agreement.py): every survivor reports the same contributors.
  ``abort``: a rank that has served its part adds 1 to one store counter and returns when it
  holds every rank's 1 (:meth:`_Run.finish_abort_mode`); a death before that raises.

Tags (32 bits; the sockets frame carries 32): 1 (bit 31: never a static plan's tag, which is
< 2**24) | ``run mod 32`` (5) | ``g mod 16`` (4) | phase (2: down, up, control) | flow (6) |
chunk (14). Hence at most 64 flows and 16384 chunks per flow; the chunk size grows to respect
that.

``on_failure = abort``: the first death in the log makes every rank raise :class:`RankFailed`
(:class:`RootFailed` when the collective's root died). ``continue``: survivors complete; a dead
root of a rooted collective raises :class:`RootFailed` on every survivor.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from ..ir.plan import FLOAT_DTYPES, ROOTED_KINDS, Plan, block_range
from .agreement import EventLog, Tail, log_group
from .base import CollectiveTimeout, RankFailed, RootFailed, RuntimeFault, Transport
from .kernels import STAGING, reduce_into, scale_into
from .repair import (arrival_parents, bfs_order, claim_count, relay_parents, repair_parents, share_by_load,
                     subtree)

__all__ = ["AdaptiveResult", "run", "wants", "adaptive_on", "KINDS", "DEFAULT_ON", "close_session",
           "AdaptiveUnsupported"]

KINDS = frozenset({"broadcast", "reduce", "allreduce", "allgather", "gather"})
# transports on which ``adaptive`` defaults to on (a plan whose source does not say; issue 4):
# task-based systems, where ranks enter collectives at different times
DEFAULT_ON = frozenset({"sockets", "ray"})
PH_DOWN, PH_UP, PH_CTRL = 0, 1, 2
CTRL_HAVE, CTRL_NEED = 0, 1
HELLO_TAG = 0xFFFFFFFF
HOP_TAG = 0xFFFFFFFE  # the local harness's one-hop transfer (run_local, engine "hop")
MAX_FLOWS, MAX_CHUNKS = 64, 1 << 14
# 256 KiB..1 MiB chunks: below 256 KiB the per-chunk Python cost (~30 us) shows on loopback;
# above 1 MiB a tree of depth 3 waits several ms to fill (Hoplite used 4 MiB over 10 Gbit/s).
MIN_CHUNK, MAX_CHUNK = 256 << 10, 1 << 20
FANOUT = 2
# A star is one hop deep, so a bigger chunk costs no pipeline fill, and it saves the per-chunk
# Python work of the root that reduces it (7 stars x 64 MiB / 7 = 9 MiB blocks: 3 chunks
# each instead of 10; the per-chunk cost is what made adaptive allreduce 1.8x the static
# direct plan, which moves whole 8 MiB blocks, on this loaded 2-core machine)
STAR_CHUNK = 4 << 20
# ...but no longer than STAR_CHUNK_S of the slowest rank link: an owner forwards a result
# chunk only once the last rank's piece of it arrived, at B/(n-1) while the last rank feeds
# n-1 owners at once, so the result stream lags (n-1) x chunk / B behind: 4 MiB chunks on
# 20 MB/s links lag 1.47 s (0.44 of a 64 MiB hop), 50 ms of link (1 MB) lags 0.35 s
STAR_CHUNK_S = 0.05
# Sub-blocks per owner slot (claimed one by one, _Run.maybe_claim): 8 ranks -> 56 sub-blocks
# of M/56, so a rank's share moves in steps of 1/8 of an equal share
STAR_SPLIT = 8
# A rank may claim at most CLAIM_CAP x an equal share (M/(n-1)) before the last arrival;
# its results then leave its link in CLAIM_CAP x one hop, the budget every claim is held to.
# Measured (8-rank emulated star, 20 MB/s, 64 MiB, staggered arrivals, default engine, ratio
# to last arrival + one hop, seeds 7 / 42, 3 reps each, one run per value, commit a0e0d0f):
# 1.1: 1.25 / 1.20; 1.25: 1.24 / 1.18 (two runs of seed 7: 1.24, 1.24); 1.5: 1.20 / 1.15
# (seed 7 again: 1.20); 2.0: 1.35 / 1.23. More claimed before the last arrival leaves fewer
# pieces to push after it; past ~1.5 an early owner's results outlast the last rank's pieces.
# At 1.5, five runs (seeds 42 / 7 / 2026 / 11 / 5, commit 72c5121) gave 1.15 / 1.20 / 1.10 /
# 1.15 / 1.14. (It was once taken back for a hang of the 5-rank quorum test; that hang was a
# result chunk stamped with a lagging contributor set, at any cap, fixed in refresh_shapes.)
CLAIM_CAP = 1.5
# A rank claims only once it has been present CLAIM_WAIT_S: with nobody late every rank is
# there within ~15 ms (LATE_WAIT_S) and the whole buffer is shared out once everyone is in
CLAIM_WAIT_S = 0.1
_WAIT_SLICE = 0.1
# How long a rank waits, after its own arrival, for everyone else's before it declares the run
# late (the fast path then gives way to the adaptive schedule). 8 processes released by one
# barrier on this 2-core machine reach the log within ~5-15 ms of each other; 30 ms keeps
# on-time runs static while costing a late run at most that before it adapts.
LATE_WAIT_S = 0.03
# the fast path's per-run counter (_Run.decide): arrivals count in units, late markers in
# _MARK, the decision in _DECIDE (fields that cannot carry into each other for n < 2**16)
FAST_SLOTS, _MARK, _DECIDE = 64, 1 << 16, 1 << 32


class AdaptiveUnsupported(RuntimeFault):
    """The adaptive executor cannot run this plan (kind or transport)."""


class AdaptiveResult(np.ndarray):
    """The output array, with what the run agreed on.

    ``contributors``: ranks whose input is in the result (reducing kinds: exactly these inputs
    were reduced; other kinds: the live ranks). ``missing``: ranks whose block of an allgather
    or gather output is absent (their owner died first; the block is zero-filled). ``late``:
    ranks whose input a ``quorum`` run ignored. ``dead``: the agreed dead set at the end.
    ``generation``: how many deaths the run's log had seen when it ended. ``stats``: data
    chunks this rank received and sent (in all, and in the run's first generation) and the
    plan's chunk count — a repaired broadcast receives each chunk once: it resumes — and
    ``path`` ("adaptive"), with seconds from this rank's entry to the moment it saw every
    arrival (``all_arrived_s``), held its output (``output_s``) and returned (``finished_s``);
    a star allreduce adds the sub-blocks this rank owned at the end (``owns``), how many of
    them it inherited from a dead owner (``inherited``) and the claim events it appended
    (``claims``)."""

    contributors: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()
    late: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    generation: int = 0
    stats: dict | None = None  # data chunks this rank received / sent, and the plan's chunk count

    def __array_finalize__(self, obj):
        for k in ("contributors", "missing", "late", "dead"):
            setattr(self, k, getattr(obj, k, ()))
        self.generation = getattr(obj, "generation", 0)
        self.stats = getattr(obj, "stats", None)


def adaptive_on(plan: Plan, comm: Transport, option: bool | None = None) -> bool:
    """Whether arrival-order scheduling is on: the ``adaptive`` run option if given, else the
    plan's ``adaptive`` (``adaptive = on|off`` in the source), else the backend's default —
    on for the transports named in :data:`DEFAULT_ON` (sockets, ray), off elsewhere (mpi)."""
    if option is not None:
        return bool(option)
    if plan.adaptive is not None:
        return bool(plan.adaptive)
    return getattr(comm, "name", "") in DEFAULT_ON


def wants(plan: Plan, comm: Transport, options: dict) -> bool:
    """Whether ``plan.run(comm, ...)`` should use this executor — the one-line hook
    backends/executor.py's ``run`` dispatches on: a kind this executor runs, a transport with
    a rendezvous store (sockets, ray over sockets; MPI cannot survive a death and keeps the
    static executor), and ``on_failure = continue``, a ``quorum``, an ``adaptive`` run
    option, or adaptive scheduling on (:func:`adaptive_on`: by default on sockets and ray)."""
    if plan.kind not in KINDS or plan.compress not in (None, "none"):
        return False
    if getattr(comm, "store", None) is None or getattr(comm, "token", None) is None:
        return False
    if plan.on_failure == "continue" or options.get("quorum") is not None or "adaptive" in options \
            or plan.adaptive:
        return True
    # the backend default never turns a plan this executor cannot lay out (one flow per rank
    # in arrival order: at most MAX_FLOWS ranks) into an error; it stays static
    return plan.adaptive is None and plan.n <= MAX_FLOWS and adaptive_on(plan, comm)


def tag(run: int, gen: int, phase: int, flow: int, chunk: int) -> int:
    # bit 31 set: never equal to a static plan's tag (< 2**24, ir/plan.py), so a frame left
    # over from an abandoned adaptive transfer can never match a later static run's receive
    return (1 << 31) | ((run & 31) << 26) | ((gen & 15) << 22) | (phase << 20) | (flow << 14) | chunk


# --------------------------------------------------------------------------- sessions

class _Session:
    """Per-communicator state that outlives one run: the log, its tail thread, the run count."""

    def __init__(self, comm: Transport):
        store = getattr(comm, "store", None)
        token = getattr(comm, "token", None)
        if store is None or token is None:
            raise AdaptiveUnsupported(
                f"the adaptive runtime needs a transport with a rendezvous store (sockets), "
                f"not {getattr(comm, 'name', type(comm).__name__)!r}")
        # the communicator is held weakly (it keys _SESSIONS, a WeakKeyDictionary: a strong
        # reference here would keep it, and this session's thread and connections, forever);
        # when the communicator goes, the session closes with it
        self._comm = weakref.ref(comm)
        group = log_group(getattr(comm, "group", None) or "hcc")
        self.log = EventLog(store.address, token, group, timeout=min(getattr(comm, "timeout", 30.0), 30.0),
                            world=comm.world)
        # the tail reads as rank comm.rank: writers reuse a ring slot only once it has read it
        self.tail = Tail(self.log, token, wake=self.wake, rank=comm.rank)
        self.runs = 0
        self.abort_runs = 0
        self.reported: set[int] = set()
        self.greeted = False
        self._hello = np.zeros(1, dtype=np.uint8)
        self._finalizer = weakref.finalize(comm, _Session.close, self)

    def greet(self, comm: Transport) -> None:
        """Connect every pair (the lower rank dials) so that any death is an EOF somewhere —
        once, before the first run that uses the adaptive schedule (a static fast-path run
        does not need it: the static executor reports the deaths of the peers it uses)."""
        if not self.greeted:
            self.greeted = True
            for p in range(comm.rank + 1, comm.world):
                comm.isend(p, HELLO_TAG, memoryview(self._hello))

    def wake(self) -> None:
        comm = self._comm()
        if comm is not None:
            comm.wake()

    def close(self) -> None:
        self.tail.close()
        self.log.close()


_SESSIONS: "weakref.WeakKeyDictionary[Any, _Session]" = weakref.WeakKeyDictionary()


def _session(comm: Transport) -> _Session:
    s = _SESSIONS.get(comm)
    if s is None:
        s = _SESSIONS[comm] = _Session(comm)
    return s


def close_session(comm: Transport) -> None:
    s = _SESSIONS.pop(comm, None)
    if s is not None:
        s.close()


def _transport_dead(comm: Transport) -> set[int]:
    return set(comm.failed())


def _wait(comm: Transport, session: _Session, reqs: list, timeout: float, seen: int, known_dead: set) -> list[int]:
    """Indices of completed requests; [] when woken by a log event, a new death or ``timeout``
    (``Transport.wait_change``: unlike ``wait_any`` it does not raise for a dead peer)."""
    tail = session.tail
    return comm.wait_change(reqs, timeout, ignore=frozenset(known_dead),
                            woken=lambda: tail.length != seen or tail.error is not None)


# --------------------------------------------------------------------------- flows

@dataclass
class _Flow:
    fid: int
    root: int
    members: tuple[int, ...]
    up: bool
    down: bool
    chunks: list[tuple[int, int]]
    src_off: int  # down source reads in[a - src_off : b - src_off] on the root
    static_parent: tuple[int, ...] | None
    star: bool = False  # arrival shape is a star: every member a direct child of the root
    # state that survives generations
    have: np.ndarray = None  # down: contributor key of the valid value, -1 = none
    part: list = None  # up: int bitmask of ranks covered by the partial of chunk c, 0 = none
    acc: list = None  # up: the partial of chunk c (None: it is this rank's input itself)
    # star flows over every member (allreduce in arrival order, _Run.star_all), kept across
    # generations: a member's piece is its own input whatever the generation, so it moves once
    # per owner, not once per generation
    pieces: list = None  # owner, on_failure = continue: chunk c -> {rank: its piece}
    rposted: list = None  # owner: chunk c -> ranks whose piece has a receive posted (or is in)
    sent_to: list = None  # member: chunk c -> the owner its piece went to (-1: not sent)

    def __post_init__(self):
        self.have = np.full(len(self.chunks), -1, dtype=np.int64)
        self.part = [0] * len(self.chunks)
        self.acc = [None] * len(self.chunks)
        self.pieces = [{} for _ in self.chunks]
        self.rposted = [set() for _ in self.chunks]
        self.sent_to = [-1] * len(self.chunks)


def _ranges(xs: Sequence[int]) -> str:
    """The flows a timeout names, runs of consecutive ids shortened.

    >>> _ranges([8, 0, 2, 1, 3, 10, 11])
    '0-3, 8, 10-11'
    """
    runs: list[list[int]] = []  # [first, last] of each run
    for x in sorted(xs):
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _split(lo: int, hi: int, ce: int) -> list[tuple[int, int]]:
    out, s = [], lo
    while s < hi:
        out.append((s, min(hi, s + ce)))
        s = min(hi, s + ce)
    return out or [(lo, lo)]


def _chunk_elems(plan: Plan, override: int | None) -> int:
    b = override or min(max(plan.chunk_bytes or MAX_CHUNK, MIN_CHUNK), MAX_CHUNK)
    return max(1, b // plan.itemsize)


def _partition(spans: Sequence[tuple[int, int]], lo: int, hi: int) -> bool:
    pos = lo
    for a, b in sorted(spans):
        if a != pos or b < a:
            return False
        pos = b
    return pos == hi


def _flows(plan: Plan, static: bool, ce: int, star_ce: int | None = None) -> list[_Flow]:
    """The flows of ``plan`` (chunks of ``ce`` elements; ``star_ce`` for allreduce stars,
    default ``max(ce, STAR_CHUNK)``)."""
    n, E, kind = plan.n, plan.elems, plan.kind
    every = tuple(range(n))
    flows: list[_Flow] = []

    def add(root, members, up, down, lo, hi, src_off, parent, star=False):
        c = max(ce, -(-(hi - lo) // MAX_CHUNKS))
        flows.append(_Flow(len(flows), root, members, up, down, _split(lo, hi, c), src_off, parent, star))

    trees = [t for t in plan.trees if len(t.parent) == n]
    if kind in ("broadcast", "reduce", "allreduce"):
        usable = static and trees and _partition([t.span for t in trees], 0, E) and all(
            len(bfs_order(t.parent, t.root)) == n for t in trees) and (
            kind == "allreduce" or all(t.root == plan.root for t in trees))
        up, down = kind != "broadcast", kind != "reduce"
        if usable:
            for t in trees:
                if t.span[1] > t.span[0]:
                    add(t.root, every, up, down, t.span[0], t.span[1], 0, t.parent)
        elif kind == "allreduce" and static:
            # one tree per block, each rooted at another rank (rotated heaps), so the
            # reductions spread over every rank as in a reduce-scatter + allgather
            for i in every:
                lo, hi = block_range(E, n, i)
                if hi > lo:
                    order = [(i + k) % n for k in range(n)]
                    add(i, every, up, down, lo, hi, 0, arrival_parents(order, n, FANOUT))
        elif kind == "allreduce":
            # arrival order: n-1 blocks, block i owned by the i-th rank to arrive, as a star
            # (every other rank sends the owner its piece, the owner sends back the sum): a
            # direct reduce-scatter + allgather whose owners are the first n-1 arrivals, so the
            # last rank to arrive owns nothing and only streams its input up and the result
            # down. A star child's partial is its own input, so an owner reduces the pieces
            # of early arrivals while it waits for the late ones (pre-reduction). Stars, not
            # heaps: each byte crosses one hop each way, as in the compiler's direct plan
            # (8 ranks, 64 MiB, nobody late: binary heaps measured 0.87 s, the static direct
            # plan 0.58 s, on this 2-core loopback)
            # Each of the n-1 owner slots is cut into STAR_SPLIT sub-blocks (at most MAX_FLOWS
            # flows in all): a sub-block is owned by whoever *claims* it (_Run.maybe_claim),
            # so ownership follows how early a rank arrived at the grain of 1/(q(n-1)) of the
            # buffer. ``root`` is the slot (the arrival index a quorum run gives it).
            slots = max(1, n - 1)
            q = max(1, min(STAR_SPLIT, (MAX_FLOWS - 1) // slots))
            star_ce = star_ce or max(ce, STAR_CHUNK // plan.itemsize)
            for i in range(slots * q):
                lo, hi = block_range(E, slots * q, i)
                if hi > lo:
                    # equal chunks no larger than star_ce (a 1.14 MiB sub-block in 1 MiB chunks
                    # would leave a 0.14 MiB tail chunk: two messages for one's work)
                    per = -(-(hi - lo) // max(star_ce, -(-(hi - lo) // MAX_CHUNKS)))
                    flows.append(_Flow(len(flows), i // q, every, up, down,
                                       _split(lo, hi, -(-(hi - lo) // per)), 0, None, True))
        else:
            root = plan.root
            parent = arrival_parents([root] + [r for r in every if r != root], n, FANOUT) if static else None
            add(root, every, up, down, 0, E, 0, parent)
    elif kind == "allgather":
        blocks = [block_range(E, n, r) for r in range(n)]
        usable = static and trees and all(
            blocks[t.root][0] <= t.span[0] <= t.span[1] <= blocks[t.root][1] for t in trees) and all(
            _partition([t.span for t in trees if t.root == r], *blocks[r]) for r in every if blocks[r][1] > blocks[r][0])
        for r in every:
            lo, hi = blocks[r]
            if hi <= lo:
                continue
            if usable:
                for t in trees:
                    if t.root == r and t.span[1] > t.span[0]:
                        add(r, every, False, True, t.span[0], t.span[1], lo, t.parent)
            else:
                parent = arrival_parents([r] + [x for x in every if x != r], n, FANOUT) if static else None
                add(r, every, False, True, lo, hi, lo, parent)
    elif kind == "gather":
        for r in every:
            lo, hi = block_range(E, n, r)
            if hi <= lo:
                continue
            parent = tuple(r if x == plan.root and x != r else -1 for x in every)
            add(r, (r, plan.root) if r != plan.root else (r,), False, True, lo, hi, lo, parent)
    else:
        raise AdaptiveUnsupported(f"the adaptive runtime does not run {kind!r} collectives "
                                  f"(it runs {', '.join(sorted(KINDS))})")
    if len(flows) > MAX_FLOWS:
        raise AdaptiveUnsupported(f"{len(flows)} trees exceed the adaptive runtime's {MAX_FLOWS}")
    return flows


# --------------------------------------------------------------------------- one run

@dataclass
class _Pending:
    req: Any
    what: str  # "down" | "up" | "have" | "need" | "send"
    flow: int
    chunk: int
    peer: int
    staging: np.ndarray | None = None


@dataclass
class _View:
    """What the log prefix says: arrivals, dead, generation, finish."""

    arrivals: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    dead_before_arrival: set[int] = field(default_factory=set)
    arrived_at: dict[int, float] = field(default_factory=dict)  # rank -> its "at" (wall clock)
    done: dict[int, set] = field(default_factory=dict)  # generation -> ranks done in it
    finished: bool = False
    pos: int = 0  # events folded
    # the generation at this run's first arrival: in it HAVE/NEED are implied (nobody holds
    # anything yet), so the run's first generation sends no control message
    base_gen: int | None = None
    # star allreduce: star flow id -> its owner, from ``claim`` events folded before the last
    # arrival, then (``shared``) the rest given out by load at the last arrival
    owner: dict[int, int] = field(default_factory=dict)
    shared: bool = False
    late_owned: frozenset = frozenset()  # star flow ids whose owner the share-out chose
    claims_folded: int = 0  # this rank's own claim events folded so far


class _Run:
    def __init__(self, plan: Plan, comm: Transport, session: _Session, inp: np.ndarray, out: np.ndarray,
                 timeout: float, static: bool, quorum: int | None, ce: int, progress: Callable | None,
                 fast: bool = False, explicit_chunk: bool = False, trace: bool = False):
        self.plan, self.comm, self.s = plan, comm, session
        # star allreduce event trace (run(trace=True), fault_bench --trace): per data chunk,
        # (monotonic s, kind, flow, chunk, peer) — kinds: "ps"/"rs" piece/result send posted,
        # "pc"/"rc" the transport took it all, "pi"/"ri" piece/result received whole
        self.trace: list | None = [] if trace else None
        self.fast, self.ran_static = fast, False
        # on_failure = abort without a quorum: no repair, no agreement on contributors, so a
        # rank returns as soon as its own part is done (served_all) instead of at the log's end
        self.abort_mode = plan.on_failure != "continue" and quorum is None
        self.rank, self.n = comm.rank, plan.n
        self.inp, self.out = inp, out
        self.timeout, self.static, self.quorum = timeout, static, quorum
        self.progress = progress
        self.run_id = session.runs
        session.runs += 1
        self.op = plan.op or "sum"
        self.kind = plan.kind
        self.rooted = plan.kind in ROOTED_KINDS
        # an explicit chunk size (run(chunk_bytes=...)) applies to every flow, stars included;
        # otherwise a star chunk is STAR_CHUNK_S of the slowest rank's link, within
        # [MIN_CHUNK, STAR_CHUNK]
        star_b = min(STAR_CHUNK, max(MIN_CHUNK, int(min(self._uplinks()) * STAR_CHUNK_S)))
        self.flows = _flows(plan, static, ce, ce if explicit_chunk else max(ce, star_b // plan.itemsize))
        self.claims_sent = 0  # claim events this rank appended (maybe_claim)
        self.t_arrived = None
        # the local copy of the log keeps only what this run can need: the deaths so far and
        # the events from the first one not of a finished run (agreement.Tail.compact)
        base, dead = session.tail.compact(self.run_id)
        self.view = _View(dead=list(dead), dead_before_arrival=set(dead), pos=base)
        self.gen = -1
        self.first_gen = None
        self.pending: list[_Pending] = []
        self.done_posted: set[int] = set()
        self.events = 0
        self.known_dead: set[int] = set()
        self.contrib: list[int] = []
        self.contrib_mask = 0
        self.stats = {"chunks_received": 0, "chunks_sent": 0, "received_before_repair": 0, "chunks": sum(len(f.chunks) for f in self.flows)}

    # ---- the log -------------------------------------------------------------------------
    def fold(self) -> None:
        evs = self.s.tail.snapshot(self.view.pos)
        v = self.view
        for ev in evs:
            v.pos += 1
            if v.finished:
                continue
            t = ev.get("t")
            if t == "dead":
                d = int(ev["rank"])
                if d not in v.dead:
                    v.dead.append(d)
                    if d not in v.arrivals:
                        v.dead_before_arrival.add(d)
            elif ev.get("run") != self.run_id:
                continue
            elif t == "arr":
                if v.base_gen is None:
                    v.base_gen = len(v.dead)
                if ev["rank"] not in v.arrivals and ev["rank"] not in v.dead:
                    v.arrivals.append(int(ev["rank"]))
                    if "at" in ev:
                        v.arrived_at[int(ev["rank"])] = float(ev["at"])
            elif t == "done":
                v.done.setdefault(int(ev["gen"]), set()).add(int(ev["rank"]))
            elif t == "claim":
                self.fold_claim(int(ev["rank"]), int(ev.get("count", 1)))
            if not v.shared and len(set(v.arrivals) | set(v.dead)) >= self.n:
                self.share_rest()
            g = len(v.dead)
            live = set(range(self.n)) - set(v.dead)
            if v.done.get(g, set()) >= live:
                v.finished = True
        if self.s.tail.error is not None and not v.finished:
            raise RuntimeFault(f"rank {self.rank}: lost the agreement store ({self.s.tail.error})")

    # ---- star ownership: claims, then the rest by load --------------------------------------
    def star_flows(self) -> list[_Flow]:
        return [f for f in self.flows if self.star_all(f)]

    def flow_bytes(self, f: _Flow) -> int:
        return (f.chunks[-1][1] - f.chunks[0][0]) * self.plan.itemsize

    def claim_cap(self) -> float:
        """The most bytes one rank may own through claims: CLAIM_CAP x an equal share."""
        total = sum(self.flow_bytes(f) for f in self.star_flows())
        return CLAIM_CAP * total / max(1, self.n - 1) + 1e-6

    def owned_bytes(self, r: int) -> int:
        return sum(self.flow_bytes(self.flows[fid]) for fid, o in self.view.owner.items() if o == r)

    def fold_claim(self, r: int, count: int) -> None:
        """A ``claim(r, count)`` event: ``r`` takes the next ``count`` unowned star flows (in
        flow order) while it stays within :meth:`claim_cap`. Void after the last arrival (the
        rest is then shared by load, :meth:`share_rest`) or from a rank that is dead or not
        arrived. A function of the log prefix: every rank folds the same owners."""
        v = self.view
        if r == self.rank:
            v.claims_folded += 1
        if v.shared or r in v.dead or r not in v.arrivals:
            return
        cap, mine = self.claim_cap(), self.owned_bytes(r)
        for f in self.star_flows():
            if count <= 0:
                break
            if f.fid in v.owner:
                continue
            if mine + self.flow_bytes(f) > cap:
                break
            v.owner[f.fid] = r
            mine += self.flow_bytes(f)
            count -= 1

    def share_rest(self) -> None:
        """At the log position where every rank has arrived (or died): the star flows nobody
        claimed go, in flow order, to the live rank whose link would then finish first
        (repair.share_by_load, from the arrival clocks and the plan's link capacities)."""
        v = self.view
        v.shared = True
        flows = self.star_flows()
        if not flows:
            return
        dead = set(v.dead)
        live = [r for r in v.arrivals if r not in dead]
        if not live:
            return
        given = share_by_load(
            [(f.fid, self.flow_bytes(f), v.owner.get(f.fid, -1)) for f in flows],
            live, v.arrived_at, self._uplinks(), self.n, self._downlinks())
        v.owner.update(given)
        v.late_owned = frozenset(given)

    def maybe_claim(self) -> None:
        """Before the last arrival, claim the next star flows when this rank can absorb them
        (:func:`repair.claim_count`: its link, if the last rank arrived now, would still carry
        no more than CLAIM_CAP x one hop in either direction — out its pieces and results,
        in the absent ranks' pieces and the other results —, and at most about one sub-block
        of pieces per present rank is still on its way in). Claims go through the log (one event per claim, one claim
        in flight per rank), so every rank agrees on the owners."""
        v = self.view
        if v.shared or self.t_arrived is None or self.claims_sent != v.claims_folded:
            return
        flows = self.star_flows()
        if not flows or self.rank not in v.arrivals or self.rank in v.dead:
            return
        if time.monotonic() - self.t_arrived < CLAIM_WAIT_S:
            return
        dead = set(v.dead)
        present = [r for r in v.arrivals if r not in dead]
        if len(present) < 2:
            return  # alone, nobody could send this rank a piece yet
        free = [f for f in flows if f.fid not in v.owner]
        if not free:
            return
        me = self.rank
        item = self.plan.itemsize
        # bytes of this rank's pieces still to leave its link (queued, or not yet sent to a known owner)
        push = 0
        for p in self.pending:
            if p.what == "send" and p.staging is None and not p.req.done and self.flows[p.flow].star:
                a, b = self.flows[p.flow].chunks[p.chunk]
                push += (b - a) * item
        backlog = 0  # pieces of flows this rank owns that present ranks still owe it
        for f in flows:
            o = v.owner.get(f.fid)
            if o == me:
                for a_b, part in zip(f.chunks, f.part):
                    missing = sum(1 for k in present if k != me and not (part >> k) & 1)
                    backlog += missing * (a_b[1] - a_b[0]) * item
            elif o is not None and o not in dead:
                push += sum((b - a) * item for (a, b), to in zip(f.chunks, f.sent_to) if to != o)
        # ...or, where the link is faster than the plan says (loopback), what the plan's link
        # would still hold: the model share_rest uses at the last arrival
        others = sum(self.flow_bytes(f) for f in flows if v.owner.get(f.fid, me) != me
                     and v.owner[f.fid] not in dead)
        push = max(push, others - self._uplinks()[me] * (time.monotonic() - self.t_arrived))
        up, down = self._uplinks(), self._downlinks()
        # the incoming side too: pieces the absent ranks would send in, results of the rest
        m = claim_count([self.flow_bytes(f) for f in free], self.owned_bytes(me), int(push), backlog,
                        len(present), self.n, self.claim_cap(), up[me] / max(up),
                        total=sum(self.flow_bytes(f) for f in flows), speed_in=down[me] / max(down))
        if m > 0:
            self.claims_sent += 1
            self.stats["claims"] = self.claims_sent  # log events this rank appended (tests count them)
            self.s.log.append({"t": "claim", "run": self.run_id, "rank": me, "count": m})

    # ---- shapes --------------------------------------------------------------------------
    def contributors(self) -> list[int]:
        dead = set(self.view.dead)
        if self.kind not in ("reduce", "allreduce"):
            return [r for r in range(self.n) if r not in dead]
        if self.quorum is None:
            return [r for r in range(self.n) if r not in dead]
        return [r for r in self.first_arrivals() if r not in dead]

    def first_arrivals(self) -> list[int]:
        """The ranks whose inputs are wanted, in arrival order, dead ones included."""
        if self.quorum is None:
            return list(self.view.arrivals)
        first = [self.plan.root] if self.kind == "reduce" else []
        for r in self.view.arrivals:
            if len(first) >= self.quorum:
                break
            if r not in first:
                first.append(r)
        return first

    def base_root(self, f: _Flow) -> int:
        """The root of flow ``f`` before repair; -1 while it is not known yet."""
        if self.kind != "allreduce" or f.static_parent is not None:
            return f.root
        cand = self.first_arrivals()
        if not self.star_all(f):
            return self._block_owner(cand, f.root)  # quorum: slot i is the i-th arrival's
        r = self.view.owner.get(f.fid, -1)
        if r < 0 or r not in self.view.dead:
            return r
        return self.star_heir(cand, f)

    def _block_owner(self, cand: list[int], i: int) -> int:
        """The owner of block ``i`` before any death: the ``i``-th arrival."""
        if i < len(cand):
            return cand[i]
        if cand and self.up_complete():  # fewer ranks than blocks will ever arrive
            return cand[i % len(cand)]
        return -1

    def star_heir(self, cand: list[int], f: _Flow) -> int:
        """Who owns star flow ``f`` now that its owner is dead: a live rank that owns none
        (often the last rank to arrive: it had only streamed its input up), so that no
        survivor's link carries a second share of results; when none is left, the live ranks
        in arrival order, in turn — a dead owner's sub-blocks spread over the survivors. The
        ``j``-th flow to lose its owner (in the order the owners died, then flow order) takes
        the ``j``-th such rank. Decided only once every rank has arrived (-1 before: the
        owners are final then). A function of the log prefix, so every rank picks the same."""
        if not self.up_complete():
            return -1
        dead = self.view.dead
        blocks = self.star_flows()
        owner = {g.fid: self.view.owner.get(g.fid, -1) for g in blocks}
        orphans = sorted((g for g in blocks if owner[g.fid] in dead),
                         key=lambda g: (dead.index(owner[g.fid]), g.fid))
        j = [g.fid for g in orphans].index(f.fid)
        owned = set(owner.values())
        spare = [x for x in cand if x not in owned and x not in dead]
        if j < len(spare):
            return spare[j]
        live = [x for x in cand if x not in dead]
        return live[(j - len(spare)) % len(live)] if live else -1

    def up_complete(self) -> bool:
        """Every rank that will contribute has arrived (or died)."""
        if self.static and self.quorum is None:
            return True
        arrived = set(self.view.arrivals) | set(self.view.dead)
        if self.quorum is None:
            return len(arrived) == self.n
        want = min(self.quorum, self.n - len(self.view.dead_before_arrival))
        got = len([r for r in self.view.arrivals if r not in self.view.dead_before_arrival])
        return got >= want or len(arrived) == self.n

    def shape(self, f: _Flow, members: Sequence[int], root: int) -> tuple[tuple[int, ...], int]:
        """``(parent array, root)`` of flow ``f`` over ``members``, rooted at ``root`` before
        repair, for the current log prefix."""
        dead = set(self.view.dead)
        if root < 0:
            return tuple([-1] * self.n), -1
        if f.static_parent is not None:
            base = tuple(p if (c in members and p in members) else -1 for c, p in enumerate(f.static_parent))
            # members the restricted static tree no longer reaches hang off the root
            reach = set(bfs_order(base, root))
            base = tuple(root if (c in members and c not in reach) else p for c, p in enumerate(base))
        elif self.star_all(f):
            # a star over every member, arrived or not: leaves are leaves whatever the order,
            # so the root waits for no log event — a piece that arrives proves its sender
            # arrived (the log is a store round trip per event behind; 8 ranks on this loaded
            # machine saw arrivals up to 0.5 s late)
            base = tuple(-1 if (r == root or r not in members) else root for r in range(self.n))
        else:
            order = [root] + [r for r in self.view.arrivals if r in members and r != root]
            # broadcast: a chain in arrival order (every rank forwards the buffer once, the
            # last to arrive is the tail); elsewhere a binary heap (each flow carries 1/n)
            fanout = 1 if self.kind == "broadcast" else max(1, self.n - 1) if f.star else FANOUT
            base = arrival_parents(order, self.n, fanout)
        if root in dead:
            if self.kind != "allreduce":
                return tuple([-1] * self.n), -1
            live = [r for r in bfs_order(base, root) if r not in dead]
            if not live:
                return tuple([-1] * self.n), -1
            return repair_parents(base, root, dead, promote=True), live[0]
        return repair_parents(base, root, dead), root

    def star_all(self, f: _Flow) -> bool:
        """Flow ``f`` is a star over all its members (allreduce in arrival order, no quorum:
        the contributors are every live rank, so nothing about the tree waits for arrivals)."""
        return f.star and self.quorum is None

    def new_generation(self) -> None:
        v = self.view
        self.gen = len(v.dead)
        if self.first_gen is None:
            self.first_gen = self.gen
        dead = set(v.dead)
        if dead and self.plan.on_failure != "continue":
            d = v.dead[0]
            cls = RootFailed if (self.rooted and d == self.plan.root) else RankFailed
            raise cls(d, by=self.rank, detail="on_failure = abort")
        if self.rooted and self.plan.root in dead:
            raise RootFailed(self.plan.root, by=self.rank, detail="the root died; on_failure = continue "
                             "cannot deliver a rooted collective without it")
        # a star piece is its sender's input in every generation: its receive (posted once per
        # owner, member and chunk, with a generation-free tag) is kept while both live
        self.pending = [p for p in self.pending if p.peer not in dead and (
            p.what == "send" or (p.what == "up" and self.star_all(self.flows[p.flow])))]
        self.g = {}  # per-flow state of this generation
        for f in self.flows:
            self.g[f.fid] = {"root_dead": f.root in dead, "have_sent": False, "need_got": None,
                             "kids_have": {}, "kid_need_sent": set(), "kid_have_posted": set(),
                             "up_from": {}, "my_need": None, "up_sent": set(), "up_posted": set(),
                             "dirty": set()}
        self.refresh_shapes()

    def refresh_shapes(self) -> None:
        """Recompute the trees from the log (arrivals add leaves; the generation fixes deaths)."""
        contrib = set(self.contributors())
        mask = sum(1 << r for r in contrib)
        old = getattr(self, "contrib_mask", None)
        if old is not None and old != mask and getattr(self, "_mask_gen", None) == self.gen:
            # A quorum run's contributors grow with the arrivals this rank has folded. A down
            # chunk is final for its generation (a root delivers only once every contributor
            # is in), but its receiver stamped it with the mask of the log prefix it had then
            # folded, which may lag the sender's: restamp it, or the chunk would look invalid
            # and, never sent again, hold the run until its deadline (seen 2 in 30 runs of the
            # 5-rank quorum test). Within a generation only a down receive (or the root's own
            # final delivery) writes ``have``.
            for f in self.flows:
                if f.up:
                    f.have[f.have == old] = mask
        self.contrib_mask, self._mask_gen = mask, self.gen
        self.contrib = sorted(contrib)
        me = self.rank
        for f in self.flows:
            st = self.g[f.fid]
            if f.up:
                # dead ranks keep their positions in the base tree (repair then removes them),
                # so the up tree and the down tree are repaired the same way
                up_members = [r for r in f.members if r in contrib or r in self.view.dead]
                par, root = self.shape(f, up_members, self.base_root(f))
                st["up_parent"], st["up_root"] = par, root
                st["up_kids"] = [c for c, p in enumerate(par) if p == me]
                st["my_sub"] = sum(1 << r for r in subtree(par, me)) if me in contrib else 0
                st["kid_sub"] = {k: sum(1 << r for r in subtree(par, k)) for k in st["up_kids"]}
            if f.down:
                par, root = self.shape(f, f.members, self.base_root(f))
                if self.star_all(f) and root >= 0 and self.up_complete():
                    par = self.star_down_parents().get(f.fid, par)
                st["down_parent"], st["down_root"] = par, root
                st["down_kids"] = [c for c, p in enumerate(par) if p == me]

    def _uplinks(self) -> list[float]:
        """Bytes/s each rank's vertex can send (the plan topology's links out of it)."""
        return self._link_caps("src")

    def _downlinks(self) -> list[float]:
        """Bytes/s each rank's vertex can receive (the plan topology's links into it)."""
        return self._link_caps("dst")

    def _link_caps(self, end: str) -> list[float]:
        """Per rank, the summed capacity of the topology's links whose ``end`` ("src" or
        "dst") is the rank's vertex; computed once per run."""
        caps = self.__dict__.setdefault("_caps_by_end", {})
        if end not in caps:
            total: dict[str, float] = {}
            for link in self.plan.topology.links:
                v = getattr(link, end)
                total[v] = total.get(v, 0.0) + link.capacity
            caps[end] = [total.get(v, 0.0) or 1.0 for v in self.plan.ranks]
        return caps[end]

    def star_down_parents(self) -> dict[int, tuple[int, ...]]:
        """The down trees of the star sub-blocks once every rank has arrived: a star, except
        where an owner's link would finish late. Each rank's link is given a load in seconds
        after the last arrival — what it still had to push (its pieces' bytes over its uplink,
        less the time since it arrived) plus one sub-block per direct child — and, while the
        most loaded owner has a child ``y`` whose load stays below its own after taking one
        more child, one of the owner's other children moves under ``y`` (``y`` relays the
        sub-block to it) — backends/repair.relay_parents. A function of the log (arrival
        order, each arrival's clock) and the plan, so every rank builds the same trees; cached
        per generation and arrival count. Relays were the first answer to a late owner (an
        owner arriving just before the last with its pieces still queued): alone they left
        the emulated star at 1.28x of ideal (4 MiB chunks) / 1.23x (1 MiB). Ownership by
        claims (:meth:`maybe_claim`, :meth:`share_rest`) now keeps such a rank's share small
        or empty; relays only even out what the share-out leaves uneven, and only through a
        rank with no piece left to push — counting the pieces of the sub-blocks the share-out
        gave away, which could not leave before the last arrival (``late_owned``)."""
        v = self.view
        key = (self.gen, len(v.arrivals), len(v.dead))
        if getattr(self, "_relay_key", None) == key:
            return self._relay
        self._relay_key, self._relay = key, {}
        dead = set(v.dead)
        live = [r for r in range(self.n) if r not in dead]
        flows = [f for f in self.flows if self.star_all(f)]
        if any(r not in v.arrived_at for r in live) or len(live) < 3:
            return self._relay
        caps = self._uplinks()
        item = self.plan.itemsize
        size = [(f.chunks[-1][1] - f.chunks[0][0]) * item for f in flows]
        roots = [self.base_root(f) for f in flows]
        if any(r < 0 or r in dead for r in roots):
            return self._relay
        trees = relay_parents(roots, size, [caps[r] for r in range(self.n)], v.arrived_at, live, self.n,
                              [f.fid in v.late_owned for f in flows])
        for f, par in zip(flows, trees):
            if par is not None:
                self._relay[f.fid] = par
        return self._relay

    # ---- helpers -------------------------------------------------------------------------
    def valid_mask(self, f: _Flow) -> np.ndarray:
        return f.have == self.contrib_mask if f.up else f.have >= 0

    def valid(self, f: _Flow, c: int) -> bool:
        key = f.have[c]
        return key >= 0 and (key == self.contrib_mask if f.up else True)

    def down_key(self, f: _Flow) -> int:
        return self.contrib_mask if f.up else 0

    def post_recv(self, what, f, c, peer, ph, ctrl_bytes=0):
        if what in ("have", "need"):
            staging = np.empty(ctrl_bytes, dtype=np.uint8)
            t = tag(self.run_id, self.gen, PH_CTRL, f.fid, CTRL_HAVE if what == "have" else CTRL_NEED)
        else:
            a, b = f.chunks[c]
            # pooled (backends/kernels.py STAGING: no page faults per chunk); returned to the
            # pool only once complete — an abandoned receive's chunk is left to the collector
            staging = STAGING.take(b - a, self.inp.dtype)
            t = tag(self.run_id, self.gen, ph, f.fid, c)
        req = self.comm.irecv(peer, t, memoryview(staging).cast("B"))
        self.pending.append(_Pending(req, what, f.fid, c, peer, staging))

    def send(self, f, c, peer, ph, arr):
        t = tag(self.run_id, self.gen, ph, f.fid, c if ph != PH_CTRL else c)
        req = self.comm.isend(peer, t, memoryview(arr).cast("B"))
        self.pending.append(_Pending(req, "send", f.fid, c, peer, arr if ph == PH_CTRL else None))
        if self.trace is not None and ph != PH_CTRL and f.star:
            self.trace.append((time.monotonic(), "rs" if ph == PH_DOWN else "us", f.fid, c, peer))

    def bits(self, f, pred) -> np.ndarray:
        return np.packbits(np.array([bool(pred(c)) for c in range(len(f.chunks))], dtype=bool))

    def unbits(self, f, packed: np.ndarray) -> np.ndarray:
        return np.unpackbits(packed)[: len(f.chunks)].astype(bool)

    def down_src(self, f, c) -> np.ndarray:
        a, b = f.chunks[c]
        if self.rank == f.root and not f.up:
            return self.inp[a - f.src_off: b - f.src_off]
        return self.out[a:b]

    # ---- progress: post whatever the state allows ------------------------------------------
    def implied(self) -> bool:
        """HAVE/NEED are implied in the run's first generation: no member holds a valid
        chunk of a flow it does not root, every root needs every chunk (saves 2 messages per
        tree edge; generations after a death exchange them, since survivors then resume)."""
        return self.gen == self.view.base_gen

    def step(self) -> None:
        if self.view.base_gen is None:
            return  # this run's first arrival is not in the log yet: nothing to do
        for f in self.flows:
            st = self.g[f.fid]
            if st["root_dead"] and not f.up:
                continue  # allgather/gather: the owner of this block is dead (missing)
            if f.up and self.rank in self.contrib:
                if self.star_all(f):
                    self.step_up_star(f, st)
                else:
                    self.step_up(f, st)
            if f.down and self.rank in f.members:
                if self.star_all(f) and not self.up_complete():
                    continue  # a star block's down tree is fixed once everyone arrived
                self.step_down(f, st)

    def step_down(self, f, st) -> None:
        par = st["down_parent"]
        me = self.rank
        implied = self.implied()
        if me != st["down_root"] and par[me] >= 0 and not st["have_sent"]:
            missing = [c for c in range(len(f.chunks)) if not self.valid(f, c)]
            st["have_sent"] = True
            if missing:
                if not implied:
                    self.send(f, CTRL_HAVE, par[me], PH_CTRL, self.bits(f, lambda c: self.valid(f, c)))
                # always into a staging chunk, copied into out on completion: the transport
                # cannot cancel a posted receive, so a receive dropped by a repair must never
                # point into the caller's buffer (a late frame would land there after return)
                for c in missing:
                    self.post_recv("down", f, c, par[me], PH_DOWN)
        nbytes = (len(f.chunks) + 7) // 8
        for k in st["down_kids"]:
            if k not in st["kid_have_posted"] and k not in self.view.dead:
                st["kid_have_posted"].add(k)
                if implied:
                    st["kids_have"][k] = np.ones(len(f.chunks), dtype=bool)
                else:
                    self.post_recv("have", f, -1, k, PH_CTRL, ctrl_bytes=nbytes)
        if st["kids_have"]:
            valid = self.valid_mask(f)
            for k, need in st["kids_have"].items():
                todo = np.flatnonzero(need & valid)
                if todo.size:
                    need[todo] = False  # sent: the child needs it no more from us
                    for c in todo:
                        self.send(f, int(c), k, PH_DOWN, self.down_src(f, int(c)))

    def deliver_up(self, f, st, c: int) -> None:
        """Partial ``c`` covers this rank's whole subtree: finalize it (root) or send it up."""
        st["up_sent"].add(c)
        a, b = f.chunks[c]
        partial = f.acc[c] if f.acc[c] is not None else self.inp[a:b]
        if self.rank == st["up_root"]:
            self.out[a:b] = partial
            if self.op == "avg":
                scale_into(self.plan.dtype, self.out[a:b], bin(f.part[c]).count("1"))
            f.have[c] = f.part[c]
        else:
            self.send(f, c, st["up_parent"][self.rank], PH_UP, partial)

    def step_up(self, f, st) -> None:
        me = self.rank
        par = st["up_parent"]
        root = st["up_root"]
        if root < 0 or (me != root and par[me] < 0):
            return  # the flow's root, or this rank's place in it, is not known yet
        complete = self.up_complete()
        implied = self.implied()
        if st["my_need"] is None:
            if me == root:
                asked = ~self.valid_mask(f)
            elif implied:
                asked = np.ones(len(f.chunks), dtype=bool)
            elif st["need_got"] is not None:
                asked = st["need_got"]
            else:
                if "need_posted" not in st:
                    st["need_posted"] = True
                    self.post_recv("need", f, -1, par[me], PH_CTRL, ctrl_bytes=(len(f.chunks) + 7) // 8)
                return
            need = np.zeros(len(f.chunks), dtype=bool)
            for c in np.flatnonzero(asked):
                c = int(c)
                if (complete or self.star_all(f)) and st["my_sub"] and f.part[c] == st["my_sub"]:
                    self.deliver_up(f, st, c)  # clean: resume, nothing below is redone
                else:
                    need[c] = True
                    f.acc[c] = None  # the partial restarts from this rank's input (never written)
                    f.part[c] = 1 << me
            st["my_need"] = need
            st["up_from"] = {int(c): set() for c in np.flatnonzero(need)}
            st["dirty"] = set(st["up_from"])
        need = st["my_need"]
        if not implied:
            for k in st["up_kids"]:
                if k not in st["kid_need_sent"] and k not in self.view.dead:
                    st["kid_need_sent"].add(k)
                    self.send(f, CTRL_NEED, k, PH_CTRL, np.packbits(need))
        # In a heap, partials are taken in only once every contributor has arrived, so the
        # subtree a child's partial covers (kid_sub) is final for this generation and
        # f.part[c] says exactly which inputs the partial holds (a clean partial can then be
        # reused). In a star every child is a leaf whatever arrives later: its partial is
        # its own input, so the root takes it in at once and leaves send theirs as soon as
        # the root is known (pre-reduction); only the root's delivery waits for everyone.
        if not (complete or f.star):
            return
        for k in st["up_kids"]:
            if k not in st["up_posted"] and k not in self.view.dead:
                st["up_posted"].add(k)
                for c in np.flatnonzero(need):
                    self.post_recv("up", f, int(c), k, PH_UP)
        kids = set(st["up_kids"])
        if st.get("kids_seen") != kids or st.get("complete_seen") != complete:
            # the children changed (arrivals) or everyone is in now: look at every chunk
            st["kids_seen"], st["complete_seen"] = kids, complete
            st["dirty"] = set(st["up_from"])
        if not (complete or self.star_all(f)) and me == root:
            return  # the root's partial is final only once every contributor is in
        dirty, st["dirty"] = st["dirty"], set()
        for c in dirty:
            if c not in st["up_sent"] and st["up_from"][c] >= kids:
                self.deliver_up(f, st, c)

    def star_tag(self, f, c) -> int:
        # generation field 0 whatever the generation: a piece never changes, so a receive
        # posted before a death still matches the piece sent before it (no re-send)
        return tag(self.run_id, 0, PH_UP, f.fid, c)

    def rereduce(self, f, c: int) -> None:
        """Owner: rebuild partial ``c`` from this rank's input and the pieces it holds from
        live contributors — a death costs local reductions, not a second trip of the pieces."""
        a, b = f.chunks[c]
        keep = {r: x for r, x in f.pieces[c].items() if (self.contrib_mask >> r) & 1}
        for r in set(f.pieces[c]) - set(keep):
            STAGING.give(f.pieces[c][r])
        f.pieces[c] = keep
        f.part[c] = 1 << self.rank
        if not keep:
            f.acc[c] = None
            return
        acc = f.acc[c] if f.acc[c] is not None else STAGING.take(b - a, self.inp.dtype)
        acc[...] = self.inp[a:b]
        for r in sorted(keep):
            reduce_into(self.op, self.plan.dtype, acc, keep[r])
            f.part[c] |= 1 << r
        f.acc[c] = acc

    def step_up_star(self, f, st) -> None:
        """The up half of a star over every member (allreduce in arrival order). A member
        sends each chunk of its input to the block's owner once per owner (again only when the
        owner died and an heir took the block). The owner posts one receive per member and
        chunk for the whole run, keeps the pieces (``on_failure = continue``; about M of
        staging per owner: n-1 pieces of M/(n-1)), reduces them as they come, and after a death
        re-reduces locally what it holds from the survivors (:meth:`rereduce`); a chunk is
        final once its partial covers every contributor. No NEED messages in any generation."""
        me, root = self.rank, st["up_root"]
        if root < 0:
            return
        n_ch = len(f.chunks)
        if me != root:
            if st["my_need"] is None:
                st["my_need"] = np.ones(n_ch, dtype=bool)
            for c in range(n_ch):
                if f.sent_to[c] != root:
                    f.sent_to[c] = root
                    a, b = f.chunks[c]
                    req = self.comm.isend(root, self.star_tag(f, c), memoryview(self.inp[a:b]).cast("B"))
                    self.pending.append(_Pending(req, "send", f.fid, c, root, None))
                    if self.trace is not None:
                        self.trace.append((time.monotonic(), "ps", f.fid, c, root))
                    self.stats["pieces_sent"] = self.stats.get("pieces_sent", 0) + 1
                st["up_sent"].add(c)
            return
        if st["my_need"] is None:
            for c in range(n_ch):
                if f.part[c] == 0:
                    f.part[c] = 1 << me  # nothing held yet: the partial is this rank's input
                elif f.part[c] & ~self.contrib_mask:
                    self.rereduce(f, c)  # it included a rank that died
            st["my_need"] = ~self.valid_mask(f)
        need = st["my_need"]
        dead = set(self.view.dead)
        for c in np.flatnonzero(need):
            c = int(c)
            for k in st["up_kids"]:
                if k not in dead and k not in f.rposted[c] and not (f.part[c] >> k) & 1:
                    f.rposted[c].add(k)
                    a, b = f.chunks[c]
                    staging = STAGING.take(b - a, self.inp.dtype)
                    req = self.comm.irecv(k, self.star_tag(f, c), memoryview(staging).cast("B"))
                    self.pending.append(_Pending(req, "up", f.fid, c, k, staging))
            if c not in st["up_sent"] and f.part[c] == st["my_sub"]:
                self.deliver_up(f, st, c)

    # ---- completions -----------------------------------------------------------------------
    def complete(self, p: _Pending) -> None:
        if p.what == "send":
            if p.staging is None:  # a data chunk, not a HAVE/NEED bitmap
                self.stats["chunks_sent"] += 1
                f = self.flows[p.flow]
                if f.star:  # when this rank's last piece / result copy left (fault_bench's trace)
                    own = self.g[f.fid].get("up_root") == self.rank
                    self.stats["t_result_out" if own else "t_piece_out"] = time.monotonic()
                    if self.trace is not None:
                        self.trace.append((time.monotonic(), "rc" if own else "pc", f.fid, p.chunk, p.peer))
                if self.progress is not None:
                    self.progress()
            return
        f = self.flows[p.flow]
        st = self.g[f.fid]
        if p.what == "have":
            st["kids_have"][p.peer] = ~self.unbits(f, p.staging)
            return
        if p.what == "need":
            st["need_got"] = self.unbits(f, p.staging)
            return
        a, b = f.chunks[p.chunk]
        if f.star:  # when the last piece / result came in (clock of this machine, monotonic)
            self.stats["t_result_in" if p.what == "down" else "t_piece_in"] = time.monotonic()
            if self.trace is not None:
                self.trace.append((time.monotonic(), "ri" if p.what == "down" else "pi", f.fid, p.chunk, p.peer))
        if p.what == "down":
            self.out[a:b] = p.staging
            STAGING.give(p.staging)
            f.have[p.chunk] = self.down_key(f)
        elif self.star_all(f):  # a member's piece of a star block this rank owns
            c, keep = p.chunk, not self.abort_mode
            if (self.contrib_mask >> p.peer) & 1 and not (f.part[c] >> p.peer) & 1:
                if keep:  # kept for a re-reduction after a death (rereduce)
                    f.pieces[c][p.peer] = p.staging
                if f.acc[c] is None:
                    acc = p.staging
                    if keep:
                        acc = STAGING.take(b - a, self.inp.dtype)
                        acc[...] = p.staging
                    reduce_into(self.op, self.plan.dtype, acc, self.inp[a:b])
                    f.acc[c] = acc
                else:
                    reduce_into(self.op, self.plan.dtype, f.acc[c], p.staging)
                    if not keep:
                        STAGING.give(p.staging)
                f.part[c] |= 1 << p.peer
        else:  # "up": a child's partial
            if f.acc[p.chunk] is None:
                # the first child's chunk becomes the partial: staging (op)= input, no copy
                reduce_into(self.op, self.plan.dtype, p.staging, self.inp[a:b])
                f.acc[p.chunk] = p.staging
            else:
                reduce_into(self.op, self.plan.dtype, f.acc[p.chunk], p.staging)
                STAGING.give(p.staging)
            f.part[p.chunk] |= st["kid_sub"][p.peer]
            st["up_from"].setdefault(p.chunk, set()).add(p.peer)
            st.setdefault("dirty", set()).add(p.chunk)
        self.stats["chunks_received"] += 1
        if self.gen == self.first_gen:
            self.stats["received_before_repair"] += 1
        if self.progress is not None:
            self.progress()

    def own_output_complete(self) -> bool:
        me, kind = self.rank, self.kind
        for f in self.flows:
            if self.g[f.fid]["root_dead"] and kind in ("allgather", "gather"):
                continue  # the owner died: its block is missing, nothing to wait for
            if kind in ("reduce", "gather") and me != self.plan.root:
                continue  # out is scratch on non-roots
            if not self.valid_mask(f).all():
                return False
        return True

    def served_all(self) -> bool:
        """``on_failure = abort``: this rank's part is over — its output is complete, every
        chunk it owes a parent or a child is sent (and the sends complete), and no tree can
        still change (every rank arrived, or the flow is a star over all members). No death
        can be repaired in this mode, so nothing else is owed and no ``done`` agreement is
        needed: as with the static executor, a rank returns when its own work is done (it
        saves the log's n appends and n reads at the end of every run)."""
        v = self.view
        if any(p.what == "send" and not p.req.done for p in self.pending):
            return False
        shape_final = len(v.arrivals) + len(v.dead) >= self.n
        dead = set(v.dead)
        me = self.rank
        for f in self.flows:
            st = self.g[f.fid]
            if not (shape_final or self.star_all(f)):
                return False
            if st["root_dead"] and not f.up:
                continue
            if f.up and me in self.contrib and me != st["up_root"]:
                need = st["my_need"]
                if need is None or any(int(c) not in st["up_sent"] for c in np.flatnonzero(need)):
                    return False
            if f.down and me in f.members:
                for k in st["down_kids"]:
                    if k not in dead and (k not in st["kids_have"] or st["kids_have"][k].any()):
                        return False
        return True

    def finish_abort_mode(self) -> None:
        """``on_failure = abort``: the run ends when every rank has served its part, unless a
        rank dies first (then every rank that has not seen the end raises RankFailed). One
        store counter per session (``fin``, counting every rank's finished abort-mode runs)
        replaces the log's ``done`` events: one ``add`` and one server-side ``wait`` instead
        of n appends and n reads. A death seen before the count is full raises, unless the
        count is full when checked after it (the dead rank had finished: the run had ended
        everywhere, its death does not change it)."""
        from .rendezvous import RendezvousError

        client = self.s.log.client
        key = f"{self.s.log.prefix}/fin"
        # every rank that finished each earlier such run added 1 (a run that lost a rank
        # raises everywhere, and so does every later abort-mode run: the death is in the log)
        self.s.abort_runs += 1
        target = self.n * self.s.abort_runs
        client.add(key, 1)
        start = time.monotonic()
        while True:
            try:
                client.wait(key, target, _WAIT_SLICE)
                return
            except RendezvousError as e:
                if "timeout" not in str(e):
                    raise RuntimeFault(f"rank {self.rank}: lost the agreement store ({e})") from None
            self.report_deaths()
            self.fold()
            if len(self.view.dead) != self.gen:
                if int(client.add(key, 0)) >= target:
                    return
                self.new_generation()  # raises RankFailed / RootFailed
            if time.monotonic() - start > self.timeout:
                raise CollectiveTimeout(self.rank, -1, f"adaptive run {self.run_id}: waiting for the "
                                        "other ranks to finish", self.timeout)

    # ---- the loop --------------------------------------------------------------------------
    def report_deaths(self) -> None:
        """Append the deaths this rank's transport saw (once per dead rank, agreement.py)."""
        seen = _transport_dead(self.comm)
        for d in seen - self.s.reported - set(self.view.dead):
            self.s.reported.add(d)
            self.s.log.report_dead(d)
        self.known_dead |= seen

    def decide(self) -> bool:
        """The fast path's check: True when every rank entered this run before any rank
        declared it late — then the run is the plan's static program (with nobody late,
        arrival order cannot help, and the flattened program is the faster executor).

        One store counter per run (``fast/<run mod 64>``; rank 0 zeroes the slot 32 runs
        ahead, which every rank left long ago: a run's decision needs every rank's arrival,
        so no rank is more than two runs ahead of another) holds three fields: arrivals
        (+1 each), late markers (+:data:`_MARK`, posted by a rank that waited
        :data:`LATE_WAIT_S` after its own arrival), and the decision (+:data:`_DECIDE` static,
        +2 :data:`_DECIDE` adaptive). ``add`` is linearizable and returns the new value, so
        exactly one rank learns the outcome first: the n-th arrival when no marker preceded it
        (static), or the first marker when some arrival was still missing (adaptive); it adds
        the decision, every rank waits for it server-side. Nobody late: 3 store round trips,
        and the log is not touched (the default path adds no key to the store)."""
        from .rendezvous import RendezvousError

        self.fold()
        if self.view.dead:
            return False  # a rank is known dead: the adaptive path decides what that means
        client = self.s.log.client
        slot = self.run_id % FAST_SLOTS
        key = f"{self.s.log.prefix}/fast/{slot}"
        if self.rank == 0:
            client.set(f"{self.s.log.prefix}/fast/{(slot + FAST_SLOTS // 2) % FAST_SLOTS}", 0)
        t_arr = time.monotonic()
        v = int(client.add(key, 1))
        if v % _MARK == self.n and v < _MARK:
            client.add(key, _DECIDE)  # the last arrival, and nobody declared the run late
        posted = False
        while True:
            waited = time.monotonic() - t_arr
            try:
                value = int(client.wait(key, _DECIDE, max(1e-3, LATE_WAIT_S - waited) if not posted
                                        else _WAIT_SLICE))
                return value // _DECIDE == 1
            except RendezvousError as e:
                if "timeout" not in str(e):
                    raise RuntimeFault(f"rank {self.rank}: lost the agreement store ({e})") from None
            if not posted:
                posted = True
                v = int(client.add(key, _MARK))
                if v % _MARK < self.n and v // _MARK % (_DECIDE // _MARK) == 1:
                    client.add(key, 2 * _DECIDE)  # the first marker, and someone is missing
            self.report_deaths()
            if waited > self.timeout:
                raise CollectiveTimeout(self.rank, -1, f"adaptive run {self.run_id}: waiting for the "
                                        "static/adaptive decision", self.timeout)

    def run_static(self) -> None:
        """Everyone is present: run this rank's flattened program (backends/executor.py)."""
        from .executor import RankExecution

        plan, rank = self.plan, self.rank
        bufs = {"in": self.inp, "out": self.out, "tmp": np.empty(plan.tmp_elems[rank], dtype=self.inp.dtype)}
        RankExecution(plan, self.comm, plan.programs[rank], bufs, self.timeout).execute()
        self.ran_static = True
        self.stats["path"] = "static"
        self.gen = len(self.view.dead)
        self.contrib = list(range(self.n))

    def execute(self) -> None:
        t0 = time.monotonic()
        if self.fast and self.decide():
            self.run_static()
            return
        self.s.greet(self.comm)
        # "t": this rank's wall clock at arrival — the star allreduce's down trees weigh how
        # much of its input each rank still had to push when the last one arrived
        # (_Run.star_down_parents; one machine's clock here, NTP-synchronised hosts elsewhere)
        self.s.log.append({"t": "arr", "run": self.run_id, "rank": self.rank, "at": time.time()})
        self.t_arrived = time.monotonic()
        self.stats["t_arrived"] = self.t_arrived
        self.stats["path"] = "adaptive"
        last = time.monotonic()
        while True:
            seen = self.s.tail.length
            before = (len(self.view.arrivals), len(self.view.dead), len(self.view.owner))
            self.fold()
            if "all_arrived_s" not in self.stats and len(self.view.arrivals) + len(self.view.dead) >= self.n:
                self.stats["all_arrived_s"] = time.monotonic() - t0
            if self.view.finished:
                self.stats["finished_s"] = time.monotonic() - t0
                return
            if len(self.view.dead) != self.gen:
                if self.gen >= 0:
                    # transfers that completed before the switch count in the old generation
                    # (a chunk that arrived whole from a rank that then died is kept)
                    for p in [p for p in self.pending if p.req.done]:
                        self.pending.remove(p)
                        self.complete(p)
                self.new_generation()
            elif (len(self.view.arrivals), len(self.view.dead), len(self.view.owner)) != before:
                self.refresh_shapes()
            self.report_deaths()
            self.step()
            self.maybe_claim()
            if self.gen not in self.done_posted and self.own_output_complete():
                self.done_posted.add(self.gen)
                self.stats["output_s"] = time.monotonic() - t0
                if not self.abort_mode:
                    self.s.log.append({"t": "done", "run": self.run_id, "rank": self.rank, "gen": self.gen})
            if self.abort_mode and self.gen in self.done_posted and self.served_all():
                self.finish_abort_mode()
                self.stats["finished_s"] = time.monotonic() - t0
                return
            live = [p for p in self.pending if p.peer not in self.view.dead]
            reqs = [p.req for p in live]
            # while claims are open, look again every _WAIT_SLICE (a claim may wait on nothing
            # but CLAIM_WAIT_S or a piece send leaving this rank's link)
            slice_s = _WAIT_SLICE if not self.view.shared and self.t_arrived is not None else _WAIT_SLICE * 5
            done = _wait(self.comm, self.s, reqs, slice_s, seen, self.known_dead)
            now = time.monotonic()
            if done:
                last = now
                finished = set(done)
                batch = [live[i] for i in sorted(finished)]
                ids = {id(p) for p in batch}
                self.pending = [p for p in self.pending if id(p) not in ids]
                for p in batch:
                    self.complete(p)
            elif self.s.tail.length != seen:
                last = now
            elif now - last > self.timeout:
                waiting = [p for p in live if p.what != "send"] or live
                peer = waiting[0].peer if waiting else -1
                detail = f"adaptive run {self.run_id}, generation {self.gen}"
                if waiting:
                    detail += f", {waiting[0].what} flow {waiting[0].flow} chunk {waiting[0].chunk}"
                else:  # nothing posted: say what this rank still lacks and who is done
                    lack = [f.fid for f in self.flows if not self.valid_mask(f).all()]
                    detail += (f", nothing posted; output lacks flows {_ranges(lack) or 'none'}; "
                               f"done: ranks {sorted(self.view.done.get(self.gen, set()))}")
                self.dump_state(detail)
                raise CollectiveTimeout(self.rank, peer, detail, self.timeout)

    def dump_state(self, why: str) -> None:
        """With ``HCC_ADAPTIVE_DUMP=DIR`` in the environment, write this rank's view of the run
        (arrivals, deaths, owners, contributors, pending transfers, and per flow its chunks'
        validity keys and tree positions) to ``DIR/adaptive-<run>-rank<r>.json`` — what each
        rank believed when it gave up, side by side. A stuck run whose ranks all wait on nothing
        is a disagreement between those views (one rank's result chunks stamped with a
        contributor set older than the others' was found this way)."""
        import json
        import os

        folder = os.environ.get("HCC_ADAPTIVE_DUMP")
        if not folder:
            return
        from ..ir.files import atomic_write_text

        v = self.view

        def plain(x):
            if isinstance(x, np.ndarray):
                return x.tolist()
            if isinstance(x, (set, frozenset)):
                return sorted(x)
            if isinstance(x, dict):
                return {str(k): plain(y) for k, y in x.items()}
            if isinstance(x, (list, tuple)):
                return [plain(y) for y in x]
            return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)

        keep = ("up_root", "up_parent", "up_kids", "down_root", "down_parent", "down_kids", "my_need",
                "up_sent", "up_from", "have_sent", "root_dead")
        state = {
            "why": why, "rank": self.rank, "run": self.run_id, "generation": self.gen,
            "arrivals": v.arrivals, "dead": v.dead, "done": plain(v.done), "owner": plain(v.owner),
            "shared": v.shared, "contributors": self.contrib, "contrib_mask": self.contrib_mask,
            "pending": [[p.what, p.flow, p.chunk, p.peer, bool(p.req.done)] for p in self.pending],
            "flows": [{"fid": f.fid, "root": f.root, "have": f.have.tolist(), "part": [int(x) for x in f.part],
                       **{k: plain(self.g[f.fid].get(k)) for k in keep}} for f in self.flows],
        }
        try:
            os.makedirs(folder, exist_ok=True)
            atomic_write_text(os.path.join(folder, f"adaptive-{self.run_id}-rank{self.rank}.json"),
                              json.dumps(state, indent=1))
        except OSError:
            pass  # a dump that cannot be written must not hide the timeout itself

    def result(self, result_arr: np.ndarray) -> "AdaptiveResult":
        res = result_arr.view(AdaptiveResult)
        dead = set(self.view.dead)
        missing = []
        if self.kind in ("allgather", "gather") and (self.kind == "allgather" or self.rank == self.plan.root):
            for f in self.flows:
                if f.root not in missing and not all(self.valid(f, c) for c in range(len(f.chunks))):
                    missing.append(f.root)
            # a missing owner's whole block is zero, also the chunks of it that did arrive: the
            # caller sees a block as there or not, never part of one
            for f in self.flows:
                if f.root in missing:
                    for a, b in f.chunks:
                        self.out[a:b] = 0
        res.contributors = tuple(sorted(set(self.contrib) - set(missing)))
        res.missing = tuple(sorted(missing))
        res.late = tuple(r for r in range(self.n) if r not in self.contrib and r not in dead) \
            if self.quorum is not None else ()
        res.dead = tuple(sorted(dead))
        res.generation = self.gen
        res.stats = dict(self.stats)
        if self.trace is not None:
            res.stats["events"] = [[round(t, 4), k, fid, c, peer] for t, k, fid, c, peer in self.trace]
            res.stats["chunk_bytes"] = {f.fid: [(b - a) * self.plan.itemsize for a, b in f.chunks]
                                        for f in self.flows if f.star}
            res.stats["owner"] = {f.fid: self.g[f.fid].get("up_root") for f in self.flows if f.star}
        if any(self.star_all(f) for f in self.flows):  # star blocks this rank owned at the end
            res.stats["owns"] = sum(1 for f in self.flows if self.g[f.fid].get("up_root") == self.rank)
            # ...of which this rank inherited from a dead owner (star_heir)
            res.stats["inherited"] = sum(1 for f in self.flows if self.g[f.fid].get("up_root") == self.rank
                                         and self.view.owner.get(f.fid, self.rank) != self.rank)
            # blocks whose result this rank relayed to others (star_down_parents)
            res.stats["relays"] = sum(1 for f in self.flows if self.g[f.fid].get("down_kids")
                                      and self.g[f.fid].get("down_root") != self.rank)
        return res


def run(plan: Plan, comm: Transport, array=None, *, out=None, timeout: float = 60.0, step: int = 0,
        adaptive: bool | None = None, quorum: int | None = None, chunk_bytes: int | None = None,
        progress: Callable[[], None] | None = None, trace: bool = False) -> AdaptiveResult:
    """Run ``plan`` on rank ``comm.rank`` with the adaptive executor; returns the output as an
    :class:`AdaptiveResult` (an ndarray with ``contributors``/``missing``/``late``/``dead``) —
    or, when the static program ran (adaptive off, or the fast path), exactly what
    backends/executor.py's ``run`` returns (the caller's ``out`` itself when given).

    ``adaptive``: arrival-order trees; default :func:`adaptive_on` (``plan.adaptive``, else on
    for sockets and ray). Off with ``on_failure = abort`` and no quorum: the plan's flattened
    program, exactly as backends/executor.py runs it; off otherwise: ``Plan.trees`` as
    compiled, repaired around deaths. Left to the default (not passed) with ``on_failure =
    abort`` and no quorum, the *fast path* applies: when every rank arrived before any
    declared the run late (:meth:`_Run.decide`), the flattened program runs; only a run with
    a late rank pays for the adaptive schedule. ``adaptive=True`` forces the adaptive
    schedule. ``quorum=K`` (reduce, allreduce): reduce the first K inputs that arrive
    (reduce: the root's and the first K-1 others'); the others are reported in ``late``.
    ``timeout``: the longest the run may make no progress. ``progress``: called after every
    data chunk this rank sends or receives (fault injection; it turns the fast path off).
    ``trace``: a star allreduce records every data chunk's send post, send completion and
    receive in ``stats["events"]`` (benchmarks/fault_bench.py --trace)."""
    from .executor import InputMismatch, caller_buffers

    if plan.kind not in KINDS:
        raise AdaptiveUnsupported(f"the adaptive runtime does not run {plan.kind!r} collectives")
    if plan.compress not in (None, "none"):
        raise AdaptiveUnsupported("the adaptive runtime does not run compressed plans")
    if quorum is not None:
        if plan.kind not in ("reduce", "allreduce"):
            raise InputMismatch(f"quorum applies to reduce and allreduce, not {plan.kind}")
        if not 1 <= int(quorum) <= plan.n:
            raise InputMismatch(f"quorum must be in 1..{plan.n}, not {quorum}")
        if plan.op == "avg" and plan.dtype not in FLOAT_DTYPES:
            raise InputMismatch("quorum with op = avg needs a float dtype")
    rank, inp, out_flat, result = caller_buffers(plan, comm, array, out, timeout, zero_fill=True)
    on = adaptive_on(plan, comm, adaptive)
    plain = plan.on_failure != "continue" and quorum is None and progress is None
    if not on and plain:
        from .executor import RankExecution

        bufs = {"in": inp, "out": out_flat, "tmp": np.empty(plan.tmp_elems[rank], dtype=inp.dtype)}
        RankExecution(plan, comm, plan.programs[rank], bufs, float(timeout)).execute()
        return result  # exactly what executor.run returns (the caller's `out` itself if given)
    ce = _chunk_elems(plan, chunk_bytes)
    session = _session(comm)
    r = _Run(plan, comm, session, inp, out_flat, float(timeout), not on,
             None if quorum is None else int(quorum), ce, progress, fast=on and plain and adaptive is None,
             explicit_chunk=chunk_bytes is not None, trace=trace)
    if plan.kind in ("allgather", "gather"):
        if plan.kind == "allgather" or rank == plan.root:
            lo, hi = block_range(plan.elems, plan.n, rank)
            out_flat[lo:hi] = inp
        for f in r.flows:
            if f.root == rank:
                f.have[:] = 0  # this rank owns the block its flow carries
    if plan.kind in ("broadcast",) and rank == plan.root:
        out_flat[...] = inp
        for f in r.flows:
            f.have[:] = 0
    r.execute()
    if r.ran_static:
        return result  # the fast path: exactly what executor.run returns
    return r.result(result if isinstance(result, np.ndarray) else out_flat)


# --------------------------------------------------------------------------- local jobs
# A fault-injection and late-arrival harness: one process per rank runs a list of cases over
# one communicator (processes are reused across cases, and a rank killed in one case stays
# dead, known to the log, in the next). Used by tests/runtime/test_faults*.py and
# benchmarks/fault_bench.py. Outputs travel back through .npy files in the job directory.

@dataclass
class Case:
    """One run of a local job. ``kill=(rank, k)``: that rank SIGKILLs itself after its k-th
    data chunk; ``delays[r]``: seconds rank r waits after the start barrier (late arrivals);
    ``engine``: "adaptive" (this module's ``run``, whose ``adaptive`` option is ``adaptive``),
    "static" (backends/executor.py on the flattened programs) or "hop" (rank 0 sends its
    whole input to rank 1: one link's time for the same bytes)."""

    plan: Plan
    seed: int = 0
    kill: tuple[int, int] | None = None
    delays: tuple[float, ...] = ()
    quorum: int | None = None
    adaptive: bool | None = None
    engine: str = "adaptive"
    chunk_bytes: int | None = None
    trace: bool = False  # record the star allreduce's per-chunk events (run(trace=True))
    save: bool = True  # write the outputs back (64 MiB x ranks per case: benchmarks save few)


@dataclass
class Outcome:
    """What each rank of one case did: ``outputs[r]`` (None if it raised or died), ``errors[r]``,
    ``info[r]`` (contributors, missing, late, dead, seconds from the start barrier, and
    cpu_seconds: the rank process's CPU time over those seconds)."""

    outputs: list
    errors: dict
    info: dict


def run_local(cases: Sequence[Case], *, timeout: float = 20.0, overall: float = 300.0,
              wrap: Callable[[int, list[str]], list[str]] | None = None, hosts: Sequence[str] | None = None,
              store_host: str = "127.0.0.1", store_keys: list | None = None) -> list[Outcome]:
    """Run ``cases`` in order on ``plan.n`` local processes over sockets; SIGKILLed ranks are
    expected (the outcomes say who died), not errors.

    ``wrap(rank, argv)`` may rewrite a rank's command line, ``hosts[rank]`` sets the address
    it listens on and ``store_host`` where the launcher serves the rendezvous store — the
    keywords of ``backends/launch.run_cases_local``, so ``Netem.launch_kwargs(plan.ranks)``
    runs every rank in its ``hcc netem`` namespace (call this inside
    ``with emulation.inside(plan.ranks[0]):`` so the store's socket is made there).
    ``store_keys``: a list that receives every key the launcher's store holds when the job
    ends (the agreement log's footprint, tests/runtime/test_late.py)."""
    import json
    import os
    import secrets
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from ..ir.files import atomic_write_text
    from .rendezvous import StoreServer

    world = cases[0].plan.n
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="hcc-adaptive-") as tmp:
        job = Path(tmp)
        spec = []
        for i, c in enumerate(cases):
            if c.plan.n != world:
                raise RuntimeFault(f"case {i}: {c.plan.n} ranks, the job has {world}")
            # a plan file says adaptive true or false (ir/serialize.py); None (the backend's
            # default) travels beside it
            replace(c.plan, adaptive=bool(c.plan.adaptive)).save(job / f"case{i}.plan.json")
            spec.append({"plan": f"case{i}.plan.json", "plan_adaptive": c.plan.adaptive, "seed": c.seed,
                         "kill": c.kill, "delays": list(c.delays),
                         "quorum": c.quorum, "adaptive": c.adaptive, "engine": c.engine,
                         "chunk_bytes": c.chunk_bytes, "trace": c.trace, "save": c.save})
        atomic_write_text(job / "job.json", json.dumps({"timeout": timeout, "cases": spec}))
        env = dict(os.environ, HCC_TOKEN=token)
        procs = []
        if hosts is not None and len(hosts) != world:
            raise RuntimeFault(f"run_local: {len(hosts)} hosts for {world} ranks")
        with StoreServer(token, store_host, 0) as store:
            try:
                for r in range(world):
                    argv = [sys.executable, "-m", "hcc.backends.adaptive", str(job), str(r), str(world),
                            store.address]
                    if hosts is not None:
                        argv.append(hosts[r])
                    if wrap is not None:
                        argv = wrap(r, argv)
                    with open(job / f"rank{r}.log", "wb") as log:  # the child keeps its own copy
                        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                      stdin=subprocess.DEVNULL))
                end = time.monotonic() + overall
                while any(p.poll() is None for p in procs) and time.monotonic() < end:
                    time.sleep(0.02)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                    p.wait()
                if store_keys is not None:
                    # the store has no list operation (its clients only need named keys); the
                    # launcher serves it in this process and reads its table directly
                    with store._cond:
                        store_keys.extend(sorted(store._data))
        results = []
        for r in range(world):
            path = job / f"result{r}.json"
            results.append(json.loads(path.read_text()) if path.exists() else {"cases": {}})
        outs = []
        for i, c in enumerate(cases):
            outputs, errors, info = [], {}, {}
            for r in range(world):
                rec = results[r]["cases"].get(str(i))
                if rec is None:
                    outputs.append(None)
                    errors[r] = "died" if procs[r].returncode == -9 else (
                        f"exited {procs[r].returncode}: " + (job / f"rank{r}.log").read_text(errors="replace")[-800:])
                    continue
                if "error" in rec:
                    outputs.append(None)
                    errors[r] = rec["error"]
                else:
                    path = job / f"case{i}.out{r}.npy"
                    outputs.append(np.load(path) if path.exists() else None)
                info[r] = rec
            outs.append(Outcome(outputs, errors, info))
        return outs


def _barrier(comm: Transport, name: str, timeout: float) -> None:
    """Every live rank meets here (the log's dead set tells who is live); deaths this rank's
    transport saw are reported first so that nobody waits for a dead rank."""
    from .rendezvous import RendezvousError

    sess = _session(comm)
    key = f"{sess.log.prefix}/barrier/{name}"
    sess.log.client.add(key, 1)
    end = time.monotonic() + timeout
    while True:
        for d in _transport_dead(comm) - sess.reported:
            sess.reported.add(d)
            sess.log.report_dead(d)
        dead = set(sess.tail.dead())
        try:
            sess.log.client.wait(key, comm.world - len(dead), 0.1)
            return
        except RendezvousError as e:
            if "timeout" not in str(e) or time.monotonic() > end:
                raise


def _worker(job_dir: str, rank: int, world: int, store: str, host: str = "127.0.0.1") -> int:
    import json
    import os
    import signal
    from pathlib import Path

    from ..ir.files import atomic_write_text
    from .executor import run as static_run
    from .reference import make_input
    from .sockets import connect

    job = Path(job_dir)
    spec = json.loads((job / "job.json").read_text())
    timeout = float(spec["timeout"])
    result: dict = {"cases": {}, "t_start": time.time()}
    comm = connect(rank, world, store, os.environ["HCC_TOKEN"], timeout, serve_store=False, host=host)

    result["t_connected"] = time.time()

    def save() -> None:
        atomic_write_text(job / f"result{rank}.json", json.dumps(result))

    try:
        for i, case in enumerate(spec["cases"]):
            plan = replace(Plan.load(job / case["plan"]), adaptive=case["plan_adaptive"])
            x = make_input(plan, case["seed"], rank)
            rec: dict = {}
            count = [0]
            kill = case["kill"]

            def progress() -> None:
                count[0] += 1
                if kill is not None and kill[0] == rank and count[0] >= kill[1]:
                    save()
                    os.kill(os.getpid(), signal.SIGKILL)

            t0 = time.perf_counter()
            cpu0 = time.process_time()
            try:
                result[f"t_in{i}"] = time.time()
                _barrier(comm, f"start/{i}", timeout)
                result[f"t_bar{i}"] = time.time()
                t0 = time.perf_counter()
                cpu0 = time.process_time()
                delays = case["delays"]
                if delays and delays[rank] > 0:
                    time.sleep(delays[rank])
                if kill is not None and kill[0] == rank and kill[1] <= 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                if case["engine"] == "hop":
                    # one link, the whole buffer: rank 0 sends its input to rank 1, the others
                    # idle (fault_bench's one-hop time, measured inside the same job)
                    if rank in (0, 1):
                        buf = x if rank == 0 else np.empty_like(x)
                        view = memoryview(buf).cast("B")
                        req = comm.isend(1, HOP_TAG, view) if rank == 0 else comm.irecv(0, HOP_TAG, view)
                        end = time.monotonic() + timeout
                        while not req.done and time.monotonic() < end:
                            comm.wait_any([req], max(0.0, end - time.monotonic()))
                    out = x
                    rec.update(contributors=[], missing=[], late=[], dead=[])
                elif case["engine"] == "static":
                    # the flattened programs (executor.run would hand a plan with on_failure =
                    # continue back to this module: the comparison needs the static one)
                    out = static_run(replace(plan, on_failure="abort", adaptive=False), comm, x, timeout=timeout)
                    rec.update(contributors=list(range(world)), missing=[], late=[], dead=[])
                else:
                    # progress only when this case kills: a progress hook turns the fast path off
                    out = run(plan, comm, x, timeout=timeout, quorum=case["quorum"], adaptive=case["adaptive"],
                              chunk_bytes=case["chunk_bytes"], progress=progress if kill is not None else None,
                              trace=bool(case.get("trace")))
                    if isinstance(out, AdaptiveResult):
                        rec.update(contributors=list(out.contributors), missing=list(out.missing),
                                   late=list(out.late), dead=list(out.dead), stats=out.stats,
                                   generation=out.generation)
                    else:  # the static program ran (adaptive off, or the fast path)
                        rec.update(contributors=list(range(world)), missing=[], late=[], dead=[],
                                   stats={"path": "static"}, generation=0)
                rec["seconds"] = time.perf_counter() - t0
                # this process's CPU time (every thread) over the same span: against
                # ``seconds`` it says whether the rank waited on its links or on a core
                rec["cpu_seconds"] = time.process_time() - cpu0
                rec["log_length"] = _session(comm).log.length()  # events in the agreement log
                if case["save"]:
                    np.save(job / f"case{i}.out{rank}.npy", np.asarray(out))
            except RuntimeFault as e:
                rec["seconds"] = time.perf_counter() - t0
                rec["error"] = f"{type(e).__name__}: {e}"
                rec["error_type"] = type(e).__name__
                rec["failed_rank"] = getattr(e, "rank", None)
            result["cases"][str(i)] = rec
            save()
    finally:
        result["t_cases_done"] = time.time()
        save()
        close_session(comm)
        comm.close()
        result["t_closed"] = time.time()
        save()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:6]))
