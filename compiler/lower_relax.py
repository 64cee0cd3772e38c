"""hcc.compiler.lower_relax — lowering of BAGUA's relaxations to the plan IR.

Two plan shapes (design.md "Relaxations", language.md ``compress`` and ``neighbor_average``):

**Compressed allreduce** (``compress = fp16 | int8``), ByteGrad-style, so every element is
quantized a bounded number of times instead of once per tree hop:

1. reduce-scatter by alltoall: rank r sends block j of its ``in`` (compressed by the
   executor's codec) directly to rank j, which copies its own block and reduces the n−1
   decoded messages into ``out`` block j (``avg``: then scales by n);
2. allgather, direct: rank j sends its reduced block (compressed again) to every rank, which
   decodes it into ``out`` block j.

The owner j does not receive its own block, so after its sends it replaces its block by
``decode(encode(block))`` (a :class:`~hcc.ir.plan.Copy` with ``roundtrip=True``): every rank
ends with bit-identical values — the choice BAGUA's allgather of compressed chunks makes too.

Error bound (tested in tests/test_lower_relax.py by executing the plan in-process). Let
``q(v) = (max v − min v + 1e-7)/510`` for one message's values ``v`` (the int8 half step,
codecs.py) and ``S`` the reduced chunk the owner quantizes in step 2. Every element of the
final result, on every rank, satisfies for ``sum``::

    |ŷ − y| ≤ Σ_{r ≠ owner} q(x_r chunk) + q(S chunk)        (+ dtype rounding)

that is, each contribution is quantized once and the result once more: at most two
quantizations per element, whatever n. For ``avg`` the first term is divided by n (the Scale
runs before the second quantization). For fp16 each quantization is a relative error of at
most 2⁻¹¹ of the quantized value.

**neighbor_average** (``peers = ring | all | shift_one``): every rank sends its ``in`` to its
peers of the step and computes ``out = (in + Σ peers' in) / (1 + #peers)`` by RecvReduce
(sum) and Scale. Peers of rank r at step k (:func:`hcc.ir.plan.neighbor_peers`):

- ``ring``: r − 1 and r + 1 mod n (one peer when n = 2, none when n = 1);
- ``all``: every other rank;
- ``shift_one`` (BAGUA): with h = n/2, for r < h the peer is ((k + r) mod ⌈n/2⌉) + h,
  otherwise (r − h − k) mod h. The pairing is mutual (one peer each) and changes every step,
  so n must be even. The pairing repeats every n/2 steps, so the plan carries every step:
  ``programs`` is step 0's, ``step_programs`` steps 1 .. n/2 − 1 (``Plan.programs_at(k)``
  picks step k's; no runtime lowers anything).

Messages are split into chunks of ``chunk_bytes`` (uncompressed bytes) so both phases
pipeline and each chunk carries its own codec header (int8 quantizes per chunk).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..grammar.diagnostics import SourceError
from ..ir.errors import PlanError
from ..ir.plan import (
    PEERS,
    neighbor_peers,
    DTYPE_SIZES,
    ChunkRef,
    Copy,
    Figures,
    Op,
    Plan,
    RecvReduce,
    Recv,
    Scale,
    Send,
    block_range,
)
from ..ir.topology import Topology
from ..ir.wire import check_compress, wire_nbytes
from .program import CollectiveSpec

__all__ = [
    "AUTO_CHUNK_BYTES", "PEERS", "message_nbytes", "step_period",
    "relax_plan", "wire_bytes",
]


# 1 MiB: the int8 header (8 bytes) is then 0.003% of a float32 chunk, and one chunk takes
# ~1 ms on a 1 GB/s loopback socket, 20x the ~50 µs per-message overhead of a Python executor.
AUTO_CHUNK_BYTES = 1 << 20

# Tags of the allgather phase start here; reduce-scatter tags are the chunk index below it.
_PHASE_TAG = 1 << 20


def _chunks(lo: int, hi: int, chunk_elems: int) -> list[tuple[int, int]]:
    """Split ``[lo, hi)`` into near-equal ``(offset, count)`` chunks of at most
    ``chunk_elems`` elements (none when empty)."""
    count = hi - lo
    if count <= 0:
        return []
    k = min(-(-count // chunk_elems), _PHASE_TAG)
    return [(lo + i * count // k, (i + 1) * count // k - i * count // k) for i in range(k)]


def _chunk_elems(chunk_bytes: int | None, dtype: str) -> int:
    if chunk_bytes is None:
        chunk_bytes = AUTO_CHUNK_BYTES
    if chunk_bytes <= 0:
        raise PlanError(f"chunk size must be positive, got {chunk_bytes} bytes")
    return max(1, chunk_bytes // DTYPE_SIZES[dtype])


def _allreduce_program(rank: int, n: int, elems: int, chunk_elems: int, avg: bool) -> tuple[Op, ...]:
    ops: list[Op] = []
    blocks = [_chunks(*block_range(elems, n, j), chunk_elems) for j in range(n)]
    mine = blocks[rank]
    others = [(rank + s) % n for s in range(1, n)]  # start at r+1 so the n senders spread out

    copies = []
    for off, cnt in mine:
        copies.append(len(ops))
        ops.append(Copy(ChunkRef("in", off, cnt), ChunkRef("out", off, cnt)))
    if n == 1:
        return tuple(ops)
    for j in others:  # step 1: my part of every other block, to its owner
        for c, (off, cnt) in enumerate(blocks[j]):
            ops.append(Send(j, c, ChunkRef("in", off, cnt), chunk=c))
    for j in others:  # step 2's receipts, posted early: they touch only block j of out
        for c, (off, cnt) in enumerate(blocks[j]):
            ops.append(Recv(j, _PHASE_TAG + c, ChunkRef("out", off, cnt), chunk=c))
    ready: list[tuple[int, ...]] = []
    for c, (off, cnt) in enumerate(mine):
        reduced = []
        for p in others:  # unordered: reductions commute (ir/verify.py), so all post at once
            reduced.append(len(ops))
            ops.append(RecvReduce(p, c, ChunkRef("out", off, cnt), deps=(copies[c],), chunk=c))
        if avg:
            ops.append(Scale(ChunkRef("out", off, cnt), n, deps=tuple(reduced)))
            reduced = [len(ops) - 1]
        ready.append(tuple(reduced))
    for c, (off, cnt) in enumerate(mine):  # step 2: the reduced block, to every rank
        sent = []
        for j in others:
            sent.append(len(ops))
            ops.append(Send(j, _PHASE_TAG + c, ChunkRef("out", off, cnt), deps=ready[c], chunk=c))
        # Keep what the others decode (after the sends have read the exact values).
        ref = ChunkRef("out", off, cnt)
        ops.append(Copy(ref, ref, deps=tuple(sent), roundtrip=True))
    return tuple(ops)


def _neighbor_program(
    rank: int, n: int, elems: int, chunk_elems: int, peers: str, step: int
) -> tuple[Op, ...]:
    ops: list[Op] = []
    group = neighbor_peers(peers, n, rank, step)
    chunks = _chunks(0, elems, chunk_elems)
    copies = []
    for off, cnt in chunks:
        copies.append(len(ops))
        ops.append(Copy(ChunkRef("in", off, cnt), ChunkRef("out", off, cnt)))
    if not group:
        return tuple(ops)
    for p in group:
        for c, (off, cnt) in enumerate(chunks):
            ops.append(Send(p, c, ChunkRef("in", off, cnt), chunk=c))
    for c, (off, cnt) in enumerate(chunks):
        reduced = []
        for p in group:  # unordered, as above
            reduced.append(len(ops))
            ops.append(RecvReduce(p, c, ChunkRef("out", off, cnt), deps=(copies[c],), chunk=c))
        ops.append(Scale(ChunkRef("out", off, cnt), 1 + len(group), deps=tuple(reduced)))
    return tuple(ops)


def _programs(kind: str, n: int, elems: int, chunk_elems: int, op: str | None,
              peers: str | None, step: int) -> tuple[tuple[Op, ...], ...]:
    if kind == "neighbor_average":
        return tuple(
            _neighbor_program(r, n, elems, chunk_elems, peers or "ring", step) for r in range(n)
        )
    return tuple(_allreduce_program(r, n, elems, chunk_elems, op == "avg") for r in range(n))


def step_period(kind: str, peers: str | None, n: int) -> int:
    """How many training steps the plan's pairing takes to repeat: n/2 for a neighbor_average
    with ``peers = shift_one`` (the pairing of step k + n/2 is step k's), else 1.

    >>> step_period("neighbor_average", "shift_one", 6), step_period("neighbor_average", "ring", 6)
    (3, 1)
    """
    return n // 2 if kind == "neighbor_average" and peers == "shift_one" and n > 1 else 1


def message_nbytes(plan: Plan, count: int) -> int:
    """Bytes one message of ``count`` elements puts on the wire under the plan's codec."""
    return wire_nbytes(plan.compress, plan.dtype, count)


def wire_bytes(plan: Plan, programs: tuple[tuple[Op, ...], ...] | None = None) -> int:
    """Total bytes every Send of the plan puts on links (after compression)."""
    progs = plan.programs if programs is None else programs
    return sum(
        message_nbytes(plan, op.src.count) for prog in progs for op in prog if isinstance(op, Send)
    )


def _fail(spec: CollectiveSpec, message: str) -> None:
    if spec.span is not None:
        raise SourceError(spec.span, message)
    raise PlanError(message, source=spec.name)


def relax_plan(spec: CollectiveSpec, topo: Topology, chunk_bytes: int | None) -> Plan:
    """Lower a ``neighbor_average`` (any ``compress``) or a compressed ``allreduce``
    (``compress`` fp16 or int8) to a plan; ``chunk_bytes`` None means
    :data:`AUTO_CHUNK_BYTES`. ``Figures.wire_bytes`` is filled; the pipeline prices the rest."""
    n = len(spec.ranks)
    if spec.kind == "allreduce":
        if spec.compress == "none":
            _fail(spec, "relax_plan lowers only compressed allreduce (compress = fp16 | int8)")
    elif spec.kind != "neighbor_average":
        _fail(spec, f"relax_plan lowers allreduce and neighbor_average, not {spec.kind}")
    try:
        check_compress(spec.compress, spec.dtype)
    except PlanError as e:
        _fail(spec, e.message)
    peers = (spec.peers or "ring") if spec.kind == "neighbor_average" else None
    if peers is not None and peers not in PEERS:
        _fail(spec, f"unknown peers {peers!r}; expected one of {', '.join(PEERS)}")
    if peers == "shift_one" and n % 2:
        _fail(spec, f"peers = shift_one pairs ranks, so it needs an even rank count; "
                    f"{spec.name} has {n} ranks")
    itemsize = DTYPE_SIZES[spec.dtype]
    if spec.size_bytes % itemsize:
        _fail(spec, f"size {spec.size_bytes} B is not a multiple of {spec.dtype} ({itemsize} B)")
    elems = spec.size_bytes // itemsize
    chunk_elems = _chunk_elems(chunk_bytes, spec.dtype)
    op = "avg" if spec.kind == "neighbor_average" else (spec.op or "sum")
    programs = _programs(spec.kind, n, elems, chunk_elems, op, peers, 0)
    steps = tuple(_programs(spec.kind, n, elems, chunk_elems, op, peers, k)
                  for k in range(1, step_period(spec.kind, peers, n)))
    plan = Plan(
        name=spec.name,
        kind=spec.kind,
        ranks=tuple(spec.ranks),
        root=-1,
        size_bytes=spec.size_bytes,
        dtype=spec.dtype,
        op=op,
        algorithm="relax",
        chunk_bytes=chunk_elems * itemsize,
        trees=(),
        programs=programs,
        tmp_elems=(0,) * n,
        topology=topo,
        compress=spec.compress,
        on_failure=spec.on_failure,
        adaptive=spec.adaptive,
        peers=peers,
        step_programs=steps,
    )
    return replace(plan, figures=Figures(wire_bytes=wire_bytes(plan)))
