"""hcc.backends.adaptive.flows — what the adaptive runtime moves: flows, their chunks, and tags.

Terms (the package docstring, backends/adaptive/__init__.py, gives the whole protocol)
- flow: one tree's worth of work — a root rank, the ranks it spans, an element span of the
  output split into chunks, and a direction (*down* from the root, *up* towards it).
- chunk: a contiguous element range of a flow, the unit every message carries.
- tag: 32 bits, ``1 | run mod 32 | generation mod 16 | phase | flow | chunk`` (:func:`tag`).
- pending: one posted transfer of a run (:class:`Pending`).

:func:`make_flows` lays a plan out as flows: the plan's own trees when adaptive scheduling is
off and they are usable, otherwise heaps or, for an allreduce in arrival order, star flows
over sub-blocks that ranks claim (backends/adaptive/star.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...ir.plan import Plan, block_range
from ..base import RuntimeFault
from ..repair import arrival_parents, bfs_order

__all__ = ["KINDS", "MAX_FLOWS", "MAX_CHUNKS", "Flow", "Pending", "AdaptiveUnsupported", "make_flows", "tag",
           "chunk_elems", "ranges"]

KINDS = frozenset({"broadcast", "reduce", "allreduce", "allgather", "gather"})
PH_DOWN, PH_UP, PH_CTRL = 0, 1, 2
CTRL_HAVE, CTRL_NEED = 0, 1
HELLO_TAG = 0xFFFFFFFF
MAX_FLOWS, MAX_CHUNKS = 64, 1 << 14
# 256 KiB..1 MiB chunks: below 256 KiB the per-chunk Python cost (~30 us) shows on loopback;
# above 1 MiB a tree of depth 3 waits several ms to fill (Hoplite used 4 MiB over 10 Gbit/s).
MIN_CHUNK, MAX_CHUNK = 256 << 10, 1 << 20
FANOUT = 2
# A star is one hop deep, so a bigger chunk costs no pipeline fill, and it saves the per-chunk
# Python work of the root that reduces it (7 stars x 64 MiB / 7 = 9 MiB blocks: 3 chunks
# each instead of 10; at 1 MiB chunks the per-chunk cost made the adaptive allreduce 1.8x the
# time of the static direct plan, which moves whole 8 MiB blocks, with 8 ranks on 2 cores)
STAR_CHUNK = 4 << 20
# ...but no longer than STAR_CHUNK_S of the slowest rank link: an owner forwards a result
# chunk only once the last rank's piece of it arrived, at B/(n-1) while the last rank feeds
# n-1 owners at once, so the result stream lags (n-1) x chunk / B behind: 4 MiB chunks on
# 20 MB/s links lag 1.47 s (0.44 of a 64 MiB hop), 50 ms of link (1 MB) lags 0.35 s
STAR_CHUNK_S = 0.05
# Sub-blocks per owner slot (claimed one by one, Run.maybe_claim): 8 ranks -> 56 sub-blocks
# of M/56, so a rank's share moves in steps of 1/8 of an equal share
STAR_SPLIT = 8
# A rank may claim at most CLAIM_CAP x an equal share (M/(n-1)) before the last arrival;
# its results then leave its link in CLAIM_CAP x one hop, the budget every claim is held to.
# More claimed before the last arrival leaves fewer pieces to push after it; past ~1.5 an
# early owner's results outlast the last rank's pieces. Measured on an emulated 8-rank star
# (20 MB/s links, 64 MiB, staggered arrivals; time over last arrival + one hop, two seeds):
# cap 1.1: 1.20-1.25, 1.25: 1.18-1.24, 1.5: 1.10-1.20, 2.0: 1.23-1.35.
CLAIM_CAP = 1.5
# A rank claims only once it has been present CLAIM_WAIT_S: with nobody late every rank is
# there within ~15 ms (LATE_WAIT_S) and the whole buffer is shared out once everyone is in
CLAIM_WAIT_S = 0.1
WAIT_SLICE = 0.1


class AdaptiveUnsupported(RuntimeFault):
    """The adaptive executor cannot run this plan (kind or transport)."""


def tag(run: int, gen: int, phase: int, flow: int, chunk: int) -> int:
    # bit 31 set: never equal to a static plan's tag (< 2**24, ir/plan.py), so a frame left
    # over from an abandoned adaptive transfer can never match a later static run's receive
    return (1 << 31) | ((run & 31) << 26) | ((gen & 15) << 22) | (phase << 20) | (flow << 14) | chunk


@dataclass
class Flow:
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
    # star flows over every member (allreduce in arrival order, Run.star_all), kept across
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


def ranges(xs: Sequence[int]) -> str:
    """The flows a timeout names, runs of consecutive ids shortened.

    >>> ranges([8, 0, 2, 1, 3, 10, 11])
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


def chunk_elems(plan: Plan, override: int | None) -> int:
    b = override or min(max(plan.chunk_bytes or MAX_CHUNK, MIN_CHUNK), MAX_CHUNK)
    return max(1, b // plan.itemsize)


def _partition(spans: Sequence[tuple[int, int]], lo: int, hi: int) -> bool:
    pos = lo
    for a, b in sorted(spans):
        if a != pos or b < a:
            return False
        pos = b
    return pos == hi


def make_flows(plan: Plan, static: bool, ce: int, star_ce: int | None = None) -> list[Flow]:
    """The flows of ``plan`` (chunks of ``ce`` elements; ``star_ce`` for allreduce stars,
    default ``max(ce, STAR_CHUNK)``)."""
    n, E, kind = plan.n, plan.elems, plan.kind
    every = tuple(range(n))
    flows: list[Flow] = []

    def add(root, members, up, down, lo, hi, src_off, parent, star=False):
        c = max(ce, -(-(hi - lo) // MAX_CHUNKS))
        flows.append(Flow(len(flows), root, members, up, down, _split(lo, hi, c), src_off, parent, star))

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
            # flows in all): a sub-block is owned by whoever *claims* it (Run.maybe_claim),
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
                    flows.append(Flow(len(flows), i // q, every, up, down,
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


@dataclass
class Pending:
    req: Any
    what: str  # "down" | "up" | "have" | "need" | "send"
    flow: int
    chunk: int
    peer: int
    staging: np.ndarray | None = None
