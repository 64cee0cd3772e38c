"""hcc.compiler.ringfill — NCCL's ring channels plus trees packed into the capacity they leave
(the ``treepack-ringfill`` algorithm: allgather, reduce_scatter, allreduce).

Terms
- channels: the ring channels of channels.ring_channels (NCCL's graph search), each using its
  rate on every link it crosses. Their all-rank form is one chain per rank and channel
  (channels._chain_from / _chain_into): rank j's block travels n-1 hops along the ring.
- residual topology: the collective's links less what the channels use on them
  (:func:`residual_topology`). Two of them: the links no channel uses (*disjoint*), and,
  where some channel uses a link in part, those links' leftover capacity too (*partial*).
  A fill tree on a link it shares with a ring queues behind the ring's chunks (the rings
  take the whole share of each block in one or two chunks) and its schedule, made for the
  residual links alone, may no longer hold (the DGX-1 fragment gpu2,3,6,7, whose rings leave
  half of three NVLinks: 0.58 of the bound), or it may (gpu0,4-7: allgather 0.993 with the
  halves, 0.954 as trees alone), so both are priced where they differ and the faster kept.
- fill: an allgather packing (in-trees for reduce_scatter) of the residual topology
  (treepack.pack_allgather): the trees that carry a share of every block over what the rings
  leave idle.
- shares: each root's block split between the chains and the fill trees. At the packed rates
  the chains carry ring/(ring + fill) of it; the fill trees' schedule loses more to pipeline
  fill and per-message cost than the rings do, so the share is set from the fill trees'
  priced time alone (:func:`fill_share`).
- allreduce: reduce-scatter + allgather per root over both parts: over a chain, the block is
  reduced along the ring into its owner and sent on round it (the ring allreduce's own
  messages); over a fill tree, reduced up it and broadcast down it.

Why: the rings are the best schedule where the links decompose into rings (a ring allgather
streams with one hop of fill per chunk), but NCCL's search builds rings of one link class:
on DGX-1 the six NVLink rings carry 150 GB/s into each GPU and leave its 12 GB/s PCIe link
idle, so the rings reach 150/162 = 0.926 of the allgather bound at best (0.922 at 1 GiB).
Packing trees over the PCIe switches into that idle capacity and running both at once reaches
the bound's rate; the chains keep their plain order (the rings' own), the fill trees take the
timed schedule over the residual links (their switch paths need its gates).

Where the channels use every link (one MI250 node, A100 servers: the rings already fill the
NICs) the residual topology leaves some rank unreachable and there is no such plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..ir.plan import DTYPE_SIZES, Plan
from ..ir.topology import Link, Topology, arc_tables, reach
from .channels import RingChannel, _chain_from, _chain_into, ring_channels_memo
from .chunks import choose_chunk, spec_chunks
from .lower import MIXED_KINDS, lower_mixed, lower_priced
from .trees import PackedTree

__all__ = ["RingFill", "RINGFILL_MAX_RANKS", "fill_share", "ringfill_builder", "ringfill_packing", "ringfill_packings",
           "residual_topology"]

# the fill trees are packed and scheduled for every rank as a root: up to 64 ranks (DGX-1
# servers and their fragments); above, the two-level plans fill the links
RINGFILL_MAX_RANKS = 64
# a fill whose per-root rate is under this share of the rings' adds less than its schedule's
# losses can take away
MIN_FILL_SHARE = 0.02
# where auto chooses, a fill whose rings and trees pack under this share of the allgather
# bound is not priced: it could reach no more of the bound than that, and the tree packings,
# which pack at the bound, do better (2 x MI250: rings and fill at 0.46 of the bound, 1-3 CPU
# s of pricing per compile for a plan never chosen)
MIN_BOUND_SHARE = 0.9
# capacity a channel leaves on a link under this share of it counts as none (rate rounding)
_LEFT = 1e-6


@dataclass(frozen=True)
class RingFill:
    """The channels, the residual topology and the fill trees packed on it. ``ring_rate`` and
    ``fill_rate``: per-root rates (bytes/s of each rank's block) of the chains together and of
    the fill trees together; ``share`` and ``fill_chunk``: for one collective, what
    :func:`fill_share` found."""

    channels: tuple[RingChannel, ...]
    residual: Topology
    trees: tuple[PackedTree, ...]
    ring_rate: float
    fill_rate: float
    share: float = 0.0  # of each block, what the fill trees carry (fill_share); 0: none yet
    fill_chunk: int = 0  # their chunk in bytes (fill_share); 0: none yet

    @property
    def rate(self) -> float:
        return self.ring_rate + self.fill_rate


def residual_topology(topo: Topology, ranks: Sequence[str], channels: Sequence[RingChannel], *,
                      partial: bool = False) -> Topology:
    """The links of ``ranks``' sub-topology that no channel crosses (parallel declarations
    summed, the largest latency kept); ``partial``: also those a channel uses in part, at
    the capacity the channels leave.

    >>> from hcc.ir.topology import Link
    >>> tri = Topology("tri", ("a", "b", "c"), links=tuple(Link(x, y, 2.0) for x, y in
    ...     ["ab", "ba", "bc", "cb", "ca", "ac"]))
    >>> ch = RingChannel((0, 1, 2), 1.0, (("a", "b"), ("b", "c"), ("c", "a")))
    >>> sorted((l.src, l.dst, l.capacity) for l in residual_topology(tri, ("a", "b", "c"), [ch]).links)
    [('a', 'c', 2.0), ('b', 'a', 2.0), ('c', 'b', 2.0)]
    >>> len(residual_topology(tri, ("a", "b", "c"), [ch], partial=True).links)
    6
    """
    sub = topo.restricted(tuple(ranks))
    cap, lat = arc_tables(sub)
    used: dict[tuple[str, str], float] = {}
    for ch in channels:
        for path in ch.paths:
            for hop in zip(path, path[1:]):
                used[hop] = used.get(hop, 0.0) + ch.rate
    links = []
    for key, c in cap.items():
        left = c - used.get(key, 0.0)
        if key[0] != key[1] and (key not in used or (partial and left > _LEFT * c)):
            links.append(Link(key[0], key[1], left, lat[key]))
    return replace(sub, links=tuple(links))


def _connected(topo: Topology, ranks: Sequence[str]) -> bool:
    """Every rank of ``topo`` (a restricted topology: its vertices are the ranks and the
    switches) reaches every other over its links, and is reached by it."""
    out: dict[str, list[str]] = {}
    inn: dict[str, list[str]] = {}
    for l in topo.links:
        out.setdefault(l.src, []).append(l.dst)
        inn.setdefault(l.dst, []).append(l.src)
    return all(set(ranks) <= reach(adj, ranks[0]) for adj in (out, inn))


def ringfill_packings(topo: Topology, ranks: Sequence[str], kind: str) -> tuple[RingFill, ...]:
    """The channels with the fill trees of ``kind`` over each residual topology (the disjoint
    one, and the partial one where it differs), none where there is no such plan: another
    kind, fewer than 3 or more than :data:`RINGFILL_MAX_RANKS` ranks, no ring found, a
    residual topology that does not connect the ranks, or a fill under
    :data:`MIN_FILL_SHARE` of the rings' rate."""
    from . import treepack
    from .treepack_master import PackError

    ranks = tuple(ranks)
    n = len(ranks)
    if kind not in MIXED_KINDS or not 3 <= n <= RINGFILL_MAX_RANKS:
        return ()
    channels = ring_channels_memo(topo, ranks)
    if not channels:
        return ()
    ring_rate = sum(ch.rate for ch in channels) / (n - 1)
    out: list[RingFill] = []
    seen: set = set()
    for partial in (False, True):
        residual = residual_topology(topo, ranks, channels, partial=partial)
        if residual.links in seen or not _connected(residual, ranks):
            continue
        seen.add(residual.links)
        try:
            packing = treepack.pack_allgather(residual, ranks, reverse=kind == "reduce_scatter", shallow=False)
        except PackError:
            continue
        if packing.trees and packing.rate >= MIN_FILL_SHARE * ring_rate:
            out.append(RingFill(channels, residual, packing.trees, ring_rate, packing.rate))
    return tuple(out)


def ringfill_packing(spec: Any, topo: Topology, model: Any = None, *, bound_rate: float = 0.0) -> RingFill | None:
    """The fill of :func:`ringfill_packings` for ``spec``, with its share and chunk
    (:func:`fill_share`); of two, the one whose plan the chunk search prices faster.
    ``bound_rate``: the allgather bound's per-root rate; where given, fills whose rings and
    trees together pack under :data:`MIN_BOUND_SHARE` of it are dropped (no schedule of
    theirs can run faster than they pack)."""
    from .chunks import best_time
    from .cost import DEFAULT_MODEL

    model = model or DEFAULT_MODEL
    fills = []
    for f in ringfill_packings(topo, spec.ranks, spec.kind):
        if f.rate >= MIN_BOUND_SHARE * bound_rate:
            share, chunk = fill_share(spec, f, model)
            fills.append(replace(f, share=share, fill_chunk=chunk))
    if len(fills) < 2:
        return fills[0] if fills else None
    return min(fills, key=lambda f: best_time(spec, ringfill_builder(spec, topo, f, model), model=model))


def _chains(fill: RingFill, kind: str, n: int, into: bool | None = None) -> list[PackedTree]:
    """One chain per channel and rank, at its per-root rate (the channel's rate over n-1):
    along the ring into the rank (``into``, default for reduce_scatter) or out of it."""
    chain = _chain_into if (kind == "reduce_scatter" if into is None else into) else _chain_from
    return [replace(chain(ch, j), rate=ch.rate / (n - 1)) for ch in fill.channels for j in range(n)]


def fill_share(spec: Any, fill: RingFill, model: Any) -> tuple[float, int]:
    """``(share, chunk)``: the share of each block the fill trees carry and their chunk size.
    The fill trees are priced alone, over the residual links, at their packed share of the
    data (lower.lower_priced with a chunk search); the share is then what they carry in the
    time the rings take for the rest at the rings' rate, priced again at that share for the
    chunk (their efficiency changes with the size)."""
    item = DTYPE_SIZES[spec.dtype]
    share = fill.fill_rate / fill.rate
    # an allreduce moves each block over its trees twice (reduce-scatter, then allgather), so
    # the rings' block rate is half their allgather rate, as the fill's priced one is
    ring = fill.ring_rate / (2 if spec.kind == "allreduce" else 1)
    chunk = 0
    for _ in range(2):
        size = max(item * len(spec.ranks), int(spec.size_bytes * share) // item * item)
        part = replace(spec, size_bytes=size)  # a chunk the program fixes is the fill's too

        def build(c: int, part=part):
            return lower_priced(part, fill.residual, fill.trees, c, "treepack-ringfill", model=model)

        got = choose_chunk(build, spec_chunks(part), model=model, patience=2)
        chunk = got.chunk_bytes
        # the fill's rate as priced, against the rings' packed rate (their plain order runs at
        # 0.99 of it on DGX-1): per-root bytes over time, in the same units
        fill_rate = (size / len(spec.ranks)) / got.simulation.time if got.simulation.time > 0 else 0.0
        share = fill_rate / (fill_rate + ring) if fill_rate > 0 else 0.0
    return share, chunk


def ringfill_builder(spec: Any, topo: Topology, fill: RingFill, model: Any = None):
    """The chunk search's builder: at chunk ``c`` for the chains, the plan with the fill trees
    at ``fill``'s share and chunk (:func:`fill_share`, computed at the first call where
    ``fill`` has none)."""
    from .cost import DEFAULT_MODEL, simulate

    model = model or DEFAULT_MODEL
    n = len(spec.ranks)
    chains = _chains(fill, spec.kind, n)
    # an allreduce reduces each block along its rings into its owner, then sends it on round
    # them: the ring allreduce's messages, each ring's links used in its direction only
    ups = _chains(fill, spec.kind, n, into=True) if spec.kind == "allreduce" else ()
    chosen: list[tuple[float, int]] = [(fill.share, fill.fill_chunk)] if fill.fill_chunk else []

    def build(c: int) -> tuple[Plan, Any]:
        if not chosen:
            chosen.append(fill_share(spec, fill, model))
        share, fill_chunk = chosen[0]
        if share <= 0:
            plan = lower_mixed(spec, topo, (), fill.residual, chains, c, c, "treepack-ringfill", model=model,
                               plain_up=ups)
        else:
            # the fill trees' rates scaled so their sum is ``share`` of each root's block
            scale = share / (1 - share) * fill.ring_rate / fill.fill_rate
            trees = [replace(t, rate=t.rate * scale) for t in fill.trees]
            plan = lower_mixed(spec, topo, trees, fill.residual, chains, fill_chunk, c, "treepack-ringfill",
                               model=model, plain_up=ups)
        return plan, simulate(plan, model=model)

    return build
