"""hcc.compiler.rounds — broadcast and reduce in rounds over one switch: every rank sends and
receives at most one block per round, so k blocks reach every rank in about k + log2(n) - 1
rounds, where a chain takes k + n - 2 and a binary tree about 2 (k + log2 n).

Terms
- one-switch fabric (:func:`one_switch`): every rank has exactly one link out, to one switch,
  and one link in, from it (an NVSwitch server as samples/nvswitch.hcl models it). Any
  pairing of senders with receivers is then free of contention: each port carries one
  message per round.
- block: a chunk of the buffer (the chunk search's size); the buffer is k blocks.
- round: transfers ``(src, dst, block)``, each rank the sender of at most one and the
  receiver of at most one. Ranks are numbered relative to the root (``(rank - root) mod n``).
- schedule (:func:`round_schedule`): a circulant one. In round t every rank i sends to
  ``i + d_t (mod n)``, ``d_t`` cycling through the skips ``2^j mod n`` (j < ceil(log2 n)), in
  ascending or descending order: the root sends the next block nobody has yet, every other
  rank the newest block its receiver lacks. A power of two finishes in k + log2 n - 1
  rounds, the least any schedule of one send and one receive per rank and round can: the
  root sends its last new block in round k - 1 at the earliest, and the ranks holding a block
  at most double each round. Other counts measured 0-4 rounds above it (both orders are
  built and the shorter kept); a count where neither finishes within a chain's k + n - 2
  rounds has no form here.
- pacing: each rank's send waits for its previous send to complete and its receive for its
  previous receive, so the ranks move through the rounds together. Posted as soon as its
  data is there, a rank ahead of the others queues its later blocks at the receivers' ports
  ahead of earlier ones from the rest (samples/nvswitch.hcl broadcast 256 MB at 8 MiB: 0.58
  of the bound unpaced, 0.88 paced).

α-β arithmetic (samples/nvswitch.hcl: 8 ranks, 256 MB, 150 GB/s ports, 1 µs per link and per
message): a round holds a port for c/B + 3 µs (the two links' latencies and the per-message
cost, the next send waiting for the last to land) and the plan takes S/c + 2 rounds: T(c) =
(S/c + 2)(c/B + 3 µs), least near c = sqrt(3 µs S B / 2) = 7.6 MB at 1.92 ms, 0.89 of the
1.71 ms bound. A chain's messages overlap (2 µs per message on a port) but it takes n - 2 =
6 rounds of fill: T(c) = S/B + 2 µs S/c + 6 (c/B + 2 µs), least 1.99 ms (0.857).

reduce is the broadcast's transfers reversed in time: each block's partial sums flow up the
tree the broadcast sent it down, a rank sending its partial after every partial it receives
for that block (``avg``: a Scale at the root).

Forced only (``algorithm = rounds``; registry.py): the local runtime's default topology is a
one-switch star, and over shared memory, where memory sets the pace, the rounds ran no
faster than the trees or the ring (docs/design.md, "Rounds over one switch").
"""
from __future__ import annotations

import functools
import math

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Scale
from ..ir.topology import Topology
from .builder import _deps
from .lower import ProgramBuilder, assemble, chunk_elems
from .routes import pieces

__all__ = ["ROUNDS_KINDS", "ROUNDS_MAX_RANKS", "one_switch", "round_schedule", "rounds_plan"]

ROUNDS_KINDS = frozenset({"broadcast", "reduce"})
# the schedule is built per block count at every chunk size the search tries (O(n) Python work
# per round); past this many ranks a one-switch fabric is not what hcc's samples model
ROUNDS_MAX_RANKS = 64
# the most rounds a schedule is built for: 4 x (k + n), beyond which a count that has not
# finished never will (each round moves at least one block or the schedule is stuck)
_STUCK_FACTOR = 4


def one_switch(topo: Topology, ranks) -> bool:
    """Whether every rank of ``ranks`` has exactly one link out and one link in, both with one
    and the same switch (:mod:`rounds` docstring)."""
    switches = set(topo.switches)
    out: dict[str, list[str]] = {r: [] for r in ranks}
    into: dict[str, list[str]] = {r: [] for r in ranks}
    for link in topo.links:
        if link.src in out:
            out[link.src].append(link.dst)
        if link.dst in into:
            into[link.dst].append(link.src)
    ends = {v for r in ranks for v in out[r] + into[r]}
    return (len(ranks) >= 2 and all(len(out[r]) == 1 and len(into[r]) == 1 for r in ranks)
            and len(ends) == 1 and ends <= switches)


def _circulant(n: int, k: int, descending: bool) -> tuple[tuple[tuple[int, int, int], ...], ...] | None:
    q = max(1, math.ceil(math.log2(n)))
    skips = [(1 << j) % n or 1 for j in range(q)]
    if descending:
        skips.reverse()
    full = (1 << k) - 1
    have = [0] * n
    have[0] = full
    fresh = 0  # the next block the root sends
    rounds: list[tuple[tuple[int, int, int], ...]] = []
    missing = n - 1
    while missing:
        if len(rounds) > _STUCK_FACTOR * (k + n):
            return None
        d = skips[len(rounds) % q]
        sends = []
        for u in range(n):
            v = (u + d) % n
            if v == 0:
                continue
            if u == 0 and fresh < k:
                b, fresh = fresh, fresh + 1
            else:
                lack = have[u] & ~have[v]
                if not lack:
                    continue
                b = lack.bit_length() - 1  # the newest block the receiver lacks
            sends.append((u, v, b))
        for _, v, b in sends:
            have[v] |= 1 << b
            if have[v] == full:
                missing -= 1
        rounds.append(tuple(sends))
    return tuple(rounds)


@functools.lru_cache(maxsize=256)
def round_schedule(n: int, k: int) -> tuple[tuple[tuple[int, int, int], ...], ...] | None:
    """The rounds of a k-block broadcast from rank 0 over n ranks (module docstring): the
    shorter of the two skip orders, or a chain's k + n - 2 rounds where both take longer.

    >>> [len(round_schedule(8, k)) for k in (1, 4, 16)]   # k + log2(8) - 1
    [3, 6, 18]
    >>> round_schedule(4, 2)
    (((0, 1, 0),), ((0, 2, 1), (1, 3, 0)), ((0, 1, 1), (1, 2, 0), (2, 3, 1)))
    >>> len(round_schedule(18, 64)) == 64 + 18 - 2   # both orders slower: the chain
    True
    """
    if n < 2 or k < 1:
        raise PlanError(f"a round schedule needs 2 or more ranks and a block, got {n} ranks, {k} blocks")
    got = [s for s in (_circulant(n, k, False), _circulant(n, k, True)) if s is not None]
    best = min(got, key=len, default=None)
    if best is not None and len(best) <= k + n - 2:
        return best
    return tuple(tuple((i, i + 1, t - i) for i in range(n - 1) if 0 <= t - i < k) for t in range(k + n - 2))


def rounds_plan(spec, topo: Topology, chunk_bytes: int) -> Plan:
    """The broadcast or reduce of ``spec`` in paced rounds of ``chunk_bytes`` blocks."""
    kind, n, root = spec.kind, len(spec.ranks), spec.root
    if kind not in ROUNDS_KINDS:
        raise PlanError(f"no round schedule for collective kind {kind!r}")
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    ce = chunk_elems(chunk_bytes, spec.dtype)
    blocks = list(pieces(0, E, ce))
    B = ProgramBuilder(n)
    if not blocks or n == 1:
        for a, b in blocks:
            B.add(root, Copy(ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)))
        return assemble(spec, topo, B, (), "rounds", ce)
    sched = round_schedule(n, len(blocks))
    real = [(v + root) % n for v in range(n)]
    transfers = [(real[u], real[v], b) for rnd in sched for u, v, b in rnd]
    last_send: list[int | None] = [None] * n
    last_recv: list[int | None] = [None] * n
    if kind == "broadcast":
        for a, b in blocks:
            B.add(root, Copy(ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)))
        got: dict[tuple[int, int], int] = {}  # (rank, block) -> the receive that brought it
        for t, (u, v, blk) in enumerate(transfers):
            a, b = blocks[blk]
            src = ChunkRef("in" if u == root else "out", a, b - a)
            s, r = B.message(u, v, src, ChunkRef("out", a, b - a),
                             send_deps=_deps(last_send[u], got.get((u, blk))),
                             recv_deps=_deps(last_recv[v]), chunk=blk)
            got[(v, blk)] = r
            last_send[u], last_recv[v] = s, r
        return assemble(spec, topo, B, (), "rounds", ce)

    # reduce: every rank starts from its own input in out; the transfers reversed, each rank
    # sends a block's partial once it has combined every partial sent to it for that block
    init = {(r, blk): B.add(r, Copy(ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)))
            for r in range(n) for blk, (a, b) in enumerate(blocks)}
    combined: dict[tuple[int, int], list[int]] = {}
    for u, v, blk in reversed(transfers):  # v sends its partial of blk up to u
        a, b = blocks[blk]
        ref = ChunkRef("out", a, b - a)
        s, r = B.message(v, u, ref, ref, reduce=True,
                         send_deps=_deps(last_send[v], init[(v, blk)], *combined.get((v, blk), ())),
                         recv_deps=_deps(last_recv[u], init[(u, blk)]), chunk=blk)
        combined.setdefault((u, blk), []).append(r)
        last_send[v], last_recv[u] = s, r
    if spec.op == "avg":
        for blk, (a, b) in enumerate(blocks):
            B.add(root, Scale(ChunkRef("out", a, b - a), n, _deps(init[(root, blk)], *combined.get((root, blk), ()))))
    return assemble(spec, topo, B, (), "rounds", ce)
