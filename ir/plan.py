"""hcc.ir.plan — the plan IR: frozen value types a backend executes.

A :class:`Plan` is one compiled collective: per rank, a small dataflow program of chunk
operations, plus the spanning trees it was lowered from (kept so a runtime can re-route
around a late or dead rank, design.md "Adaptive hooks") and the compiler's figures.

Terms
- rank: an integer ``0 .. n-1``, the index of a vertex name in :attr:`Plan.ranks`.
- element: one item of the plan's dtype. Every offset and count is in elements, never bytes.
- buffers: every rank has three flat element buffers, named ``"in"`` (the caller's input,
  never written), ``"out"`` (the caller's output, also the working buffer) and ``"tmp"``
  (scratch owned by the executor). Their lengths are :meth:`Plan.buffer_elems`; see
  :func:`buffer_layout` for what each kind puts where.
- block ``i`` of an E-element buffer over n ranks is ``[block_start(E, n, i), block_start(E,
  n, i+1))`` with ``block_start(E, n, i) = i*E // n``: blocks differ by at most one element,
  so a size that does not divide by the rank count still works.
- :class:`ChunkRef` ``(buf, offset, count)``: a contiguous range of one buffer of the rank
  that runs the op.
- program: ``Plan.programs[r]`` is a tuple of ops. Op ``i`` may be *posted* only when every
  op listed in its ``deps`` (indices into the same program, each ``< i``) has *completed*;
  apart from that, ops run in any order and concurrently. A Send completes when its source
  range may be overwritten; a Recv when the data is in place; a RecvReduce when the data has
  been combined into ``dst`` with the plan's reduction. Local ops complete when done.
- message: a Send on rank ``a`` with ``(peer=b, tag=t)`` matches exactly one Recv or
  RecvReduce on rank ``b`` with ``(peer=a, tag=t)``, with equal counts. Tags are unique per
  ordered pair ``(a, b)`` and small (``0 <= tag < 2**24``) so MPI can use them directly.
- ``tree``/``chunk`` on an op name the packed tree and the chunk within it that the op moves
  (``-1`` when not from a tree): error messages and the adaptive runtime use them.

Reduction ``avg`` is lowered as ``sum`` (RecvReduce / Reduce with the plan's ``op`` =
"avg" mean "sum") followed by a :class:`Scale` by the contributor count on the ranks that
hold the result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from .topology import Topology

PLAN_VERSION = 1

DTYPE_SIZES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
}
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})

REDUCING_KINDS = frozenset({"reduce", "allreduce", "reduce_scatter"})
ROOTED_KINDS = frozenset({"broadcast", "reduce", "gather", "scatter"})
KINDS = (
    "broadcast",
    "reduce",
    "allreduce",
    "allgather",
    "reduce_scatter",
    "gather",
    "scatter",
    "alltoall",
    "neighbor_average",
)
OPS = ("sum", "prod", "min", "max", "avg")
PEERS = ("ring", "all", "shift_one")  # neighbor_average peer selections (BAGUA)
BUFFERS = ("in", "out", "tmp")


def block_start(elems: int, n: int, i: int) -> int:
    """First element of block ``i`` when ``elems`` elements are split over ``n`` ranks.

    >>> [block_start(10, 4, i) for i in range(5)]
    [0, 2, 5, 7, 10]
    """
    return i * elems // n


def block_range(elems: int, n: int, i: int) -> tuple[int, int]:
    return block_start(elems, n, i), block_start(elems, n, i + 1)


def neighbor_peers(peers: str | None, n: int, rank: int, step: int = 0) -> tuple[int, ...]:
    """The ranks whose ``in`` rank ``rank`` averages with its own at ``step``, sorted — the one
    definition the lowering, the verifier and the numpy reference all use.

    ``ring`` (the default): left and right neighbours (one peer when n = 2); ``all``: every
    other rank; ``shift_one`` pairs as BAGUA does: for ``r < n/2`` the peer is
    ``((step + r) mod ceil(n/2)) + n/2``, otherwise ``(r - n/2 - step) mod (n/2)``.

    >>> [neighbor_peers("shift_one", 4, r, 1) for r in range(4)]
    [(3,), (2,), (1,), (0,)]
    >>> neighbor_peers("ring", 2, 0), neighbor_peers("ring", 5, 0), neighbor_peers("all", 3, 1)
    ((1,), (1, 4), (0, 2))
    """
    from .errors import PlanError

    if not 0 <= rank < n:
        raise PlanError(f"rank {rank} outside 0..{n - 1}")
    if peers in (None, "ring"):
        return tuple(sorted({(rank - 1) % n, (rank + 1) % n} - {rank}))
    if peers == "all":
        return tuple(p for p in range(n) if p != rank)
    if peers == "shift_one":
        if n % 2:
            raise PlanError(f"peers = shift_one pairs ranks, so it needs an even rank count, not {n}")
        h = n // 2
        if rank < h:
            return (((step + rank) % ((n + 1) // 2)) + h,)
        return ((rank - h - step) % h,)
    raise PlanError(f"unknown peers {peers!r}; expected one of {', '.join(PEERS)}")


def buffer_layout(kind: str, elems: int, n: int, rank: int, root: int) -> tuple[int, int]:
    """``(in, out)`` lengths in elements for one rank; ``elems`` = size_bytes / dtype size.

    Initial and required final states (the verifier's contract, style.md habit 6):

    ======================  ==========================  ===========================================
    kind                    in (initial)                out (required at the end)
    ======================  ==========================  ===========================================
    broadcast               E (root's data; others 0)   E: root's ``in`` on every rank
    reduce                  E                           E on root: op over all ranks' ``in``
    allreduce               E                           E: op over all ranks' ``in``, every rank
    allgather               |block r|                   E: block j = rank j's ``in``
    reduce_scatter          E                           |block r|: op over all ranks' block r
    gather                  |block r|                   E on root: block j = rank j's ``in``
    scatter                 E (root's data; others 0)   |block r|: root's block r
    alltoall                E (E divisible by n)        E: block j = rank j's block r of ``in``
    neighbor_average        E                           E: mean of own ``in`` and the peers' ``in``
    ======================  ==========================  ===========================================

    Non-root ranks of reduce and gather have an ``out`` of E too (used as scratch; its final
    content is unspecified). Rooted kinds whose non-roots own no input still get ``in`` of E
    for broadcast and scatter so every rank can call with the same shape.
    """
    lo, hi = block_range(elems, n, rank)
    b = hi - lo
    if kind in ("broadcast", "reduce", "allreduce", "alltoall", "neighbor_average"):
        return elems, elems
    if kind == "allgather":
        return b, elems
    if kind == "reduce_scatter":
        return elems, b
    if kind == "gather":
        return b, elems
    if kind == "scatter":
        return elems, b
    raise ValueError(f"unknown collective kind {kind!r}")


@dataclass(frozen=True)
class ChunkRef:
    buf: str  # "in" | "out" | "tmp"
    offset: int  # elements
    count: int  # elements

    @property
    def end(self) -> int:
        return self.offset + self.count


@dataclass(frozen=True)
class _Message:
    """The fields every message op starts with: the other rank and the message's tag."""

    peer: int
    tag: int


@dataclass(frozen=True)
class Send(_Message):
    src: ChunkRef
    deps: tuple[int, ...] = ()
    tree: int = -1
    chunk: int = -1


@dataclass(frozen=True)
class _Receive(_Message):
    """The fields of :class:`Recv` and :class:`RecvReduce` (two types: ``type(op) is Recv``
    tells the executor and the verifier which one an op is)."""

    dst: ChunkRef
    deps: tuple[int, ...] = ()
    tree: int = -1
    chunk: int = -1


class Recv(_Receive):
    """``dst := message``."""


class RecvReduce(_Receive):
    """``dst := dst (op) message`` with the plan's reduction op (``avg`` reduces as sum)."""


@dataclass(frozen=True)
class Copy:
    """``dst := src`` on this rank (counts equal).

    ``roundtrip=True`` (compressed plans only): ``dst := decode(encode(src))`` with the plan's
    codec, i.e. the value a receiver of ``src`` gets; ``src`` and ``dst`` may be the same
    range. A compressed allreduce uses it so the owner of a block keeps what it sent and every
    rank ends with identical values (compiler/lower_relax.py). Symbolically (ir/verify.py) and
    when ``compress == "none"`` it is a plain copy.
    """

    src: ChunkRef
    dst: ChunkRef
    deps: tuple[int, ...] = ()
    roundtrip: bool = False


@dataclass(frozen=True)
class Reduce:
    """``dst := dst (op) src`` on this rank (counts equal)."""

    src: ChunkRef
    dst: ChunkRef
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Scale:
    """``dst := dst / divisor`` (for ``avg`` and ``neighbor_average``; float dtypes only)."""

    dst: ChunkRef
    divisor: int
    deps: tuple[int, ...] = ()


Op = Union[Send, Recv, RecvReduce, Copy, Reduce, Scale]
OP_TYPES: dict[str, type] = {
    "send": Send,
    "recv": Recv,
    "recv_reduce": RecvReduce,
    "copy": Copy,
    "reduce": Reduce,
    "scale": Scale,
}


@dataclass(frozen=True)
class Tree:
    """One packed spanning tree over the plan's ranks.

    ``parent[r]`` is the parent rank of rank ``r`` (``-1`` for the root and for ranks the tree
    does not span). Data flows root→leaves for broadcast-like phases and leaves→root for
    reduce-like phases. ``paths[r]`` is the topology vertex path from ``parent[r]`` to ``r``
    (through switches or a relaying rank's vertex; empty for the root). ``rate`` is the bytes/s the packing gives the tree
    and ``span = (lo, hi)`` the element range of the root's data it carries.
    """

    index: int
    root: int
    parent: tuple[int, ...]
    rate: float
    span: tuple[int, int]
    paths: tuple[tuple[str, ...], ...] = ()

    def children(self, r: int) -> tuple[int, ...]:
        return tuple(c for c, p in enumerate(self.parent) if p == r)

    def depth(self) -> int:
        best = 0
        for r in range(len(self.parent)):
            d, v, guard = 0, r, 0
            while self.parent[v] != -1 and guard <= len(self.parent):
                v, d, guard = self.parent[v], d + 1, guard + 1
            best = max(best, d)
        return best


@dataclass(frozen=True)
class Figures:
    """The compiler's numbers for one plan (design.md "Cost model"). Rates in bytes/s,
    times in seconds. ``efficiency = bound_s / predicted_s``."""

    rate_Bps: float = 0.0  # the packed trees' aggregate rate (the schedule's steady state)
    bound_rate_Bps: float = 0.0  # best rate the network allows (cut bound)
    predicted_s: float = 0.0  # event-driven simulation of this plan
    bound_s: float = 0.0  # size / bound rate (+ the least latency), the lower bound
    efficiency: float = 0.0
    ring_predicted_s: float = 0.0  # NCCL-style ring, same cost model
    tree_predicted_s: float = 0.0  # NCCL-style double binary tree, same cost model
    compile_s: float = 0.0
    wire_bytes: int = 0  # bytes put on links by this plan (after compression)
    algbw_Bps: float = 0.0  # size_bytes / predicted_s
    busbw_Bps: float = 0.0  # algbw x the nccl-tests factor of the kind
    exact_predicted_s: float = 0.0  # compress != none: best uncompressed plan, same model (else 0)
    # the NCCL-like baselines (compiler/baselines.py), same cost model; 0 / "" where none applies
    baseline: str = ""  # the fastest of them: rings | tree | rd | ring
    baseline_predicted_s: float = 0.0
    rings_predicted_s: float = 0.0  # NCCL's multi-channel rings
    ring_channels: int = 0  # how many ring channels the NCCL-style search found
    rd_predicted_s: float = 0.0  # recursive doubling / Bruck (allgather, reduce_scatter)
    # why the plan is as fast as it is (docs/plan-format.md "Figures")
    pack_rate_Bps: float = 0.0  # the tree packing's rate, in bound_rate_Bps's units (0: none)
    cut_vertices: tuple[str, ...] = ()  # the vertex set S whose links set the bound
    cut_links: tuple[tuple[str, str], ...] = ()  # the links its bytes must cross
    cut_capacity_Bps: float = 0.0
    cut_direction: str = ""  # out: the links leave S; in: they enter S
    cut_note: str = ""
    # predicted_s = bandwidth_bound_s + load_s + fill_s + message_s + contention_s
    bandwidth_bound_s: float = 0.0  # the cut bound alone (bound_s less the least latency)
    load_s: float = 0.0  # the bottleneck link's bytes / capacity beyond the bandwidth bound
    fill_s: float = 0.0  # bottleneck link idle before its first and after its last message
    message_s: float = 0.0  # per-message costs: its links' latency per message + software cost
    contention_s: float = 0.0  # bottleneck link idle between its first and last message
    bottleneck_link: tuple[str, ...] = ()  # (src, dst) of the bottleneck link
    # compiler.bounds.message_bound at the plan's largest message: no plan whose messages are
    # that small runs faster (the cut bound plus the per-message cost on the cut's links)
    message_bound_s: float = 0.0
    # compiler.bounds.latency_bound: no fixed-chunk pipeline (messages between half a chunk and
    # a chunk, for any chunk size) runs faster; its arithmetic at the chunk where it is least:
    # the cut's time at that chunk, then latency_hops message times of latency_hop_s each
    latency_bound_s: float = 0.0
    latency_chunk_bytes: float = 0.0
    latency_rate_s: float = 0.0
    latency_hops: int = 0
    latency_hop_s: float = 0.0
    latency_fanout: int = 0  # the cut's links (the last byte's first copies)
    latency_degree: int = 0  # the most links a rank sends (receives) on at once
    latency_beyond: int = 0  # ranks past the cut that need the last byte


_FIGURE_NAMES = frozenset(Figures.__dataclass_fields__)


@dataclass(frozen=True)
class Plan:
    name: str
    kind: str
    ranks: tuple[str, ...]  # topology vertex of each rank
    root: int  # -1 for kinds without a root
    size_bytes: int
    dtype: str
    op: str | None  # reducing kinds (and "avg" for neighbor_average); None otherwise
    algorithm: str  # the algorithm actually used: treepack | ring | tree | direct | ...
    chunk_bytes: int
    trees: tuple[Tree, ...]
    programs: tuple[tuple[Op, ...], ...]
    tmp_elems: tuple[int, ...]  # per rank length of "tmp"
    topology: Topology
    figures: Figures = field(default_factory=Figures)
    compress: str = "none"  # none | fp16 | int8
    on_failure: str = "abort"  # abort | continue
    # adaptive scheduling (issue 4): True = on, False = off (the flattened programs / compiled
    # trees), None = the backend's default (on for sockets and ray, off for mpi:
    # backends/adaptive.py adaptive_on) — what a source that does not say `adaptive` means
    adaptive: bool | None = False
    peers: str | None = None  # neighbor_average only: ring | all | shift_one
    # neighbor_average whose pairing changes with the training step (peers = shift_one): the
    # programs of steps 1 .. p-1, p the pairing's period (n/2 steps); ``programs`` is step 0.
    # Step k runs :meth:`programs_at` (k), so no runtime lowers anything. Empty otherwise.
    step_programs: tuple[tuple[tuple[Op, ...], ...], ...] = ()
    version: int = PLAN_VERSION

    def __getstate__(self) -> dict:
        # Pickled (Ray ships plans to its actors) without the values derived from the plan and
        # memoized on it under "_" names (digest, buffer sizes): recomputed where needed. A
        # runtime's own state (schedules, bound MPI runs) is never kept on a Plan
        # (backends/state.py keeps it beside the plan).
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    @property
    def n(self) -> int:
        return len(self.ranks)

    def __getattr__(self, name: str):
        # the compiler's figures read as attributes too: plan.efficiency, plan.bound_s, …
        # (only called for names a Plan does not have itself)
        if name in _FIGURE_NAMES:
            return getattr(self.figures, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def elems(self) -> int:
        return self.size_bytes // self.itemsize

    def buffer_elems(self, rank: int) -> dict[str, int]:
        # computed once per rank (a run asks twice before its first send); a new dict each call
        cache = self.__dict__.get("_buffer_elems")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_buffer_elems", cache)
        sizes = cache.get(rank)
        if sizes is None:
            i, o = buffer_layout(self.kind, self.elems, self.n, rank, self.root)
            sizes = cache[rank] = {"in": i, "out": o, "tmp": self.tmp_elems[rank]}
        return dict(sizes)

    def programs_at(self, step: int) -> tuple[tuple[Op, ...], ...]:
        """Every rank's program at training step ``step``: ``programs`` except for a
        neighbor_average whose pairing changes with the step (``step_programs``), which
        repeats with its period.

        >>> from .topology import Topology
        >>> p = Plan("p", "neighbor_average", ("a", "b"), -1, 0, "float32", "avg", "relax", 0, (),
        ...          ((), ()), (0, 0), Topology("t", ("a", "b"), ()), step_programs=(((), ()),))
        >>> p.programs_at(3) is p.step_programs[0], p.programs_at(4) is p.programs
        (True, True)
        """
        if not self.step_programs:
            return self.programs
        if step < 0:
            from .errors import PlanError

            raise PlanError(f"step must be >= 0, got {step}")
        k = step % (len(self.step_programs) + 1)
        return self.programs if k == 0 else self.step_programs[k - 1]

    # The heavy parts live in their own modules and are imported where used.
    def verify(self) -> None:
        from .verify import verify

        verify(self)

    def to_json(self) -> str:
        from .serialize import dumps

        return dumps(self)

    @staticmethod
    def from_json(text: str, source: str = "<plan>") -> "Plan":
        from .serialize import loads

        return loads(text, source=source)

    def save(self, path) -> None:
        from .serialize import save

        save(self, path)

    @staticmethod
    def load(path) -> "Plan":
        from .serialize import load

        return load(path)

    def digest(self) -> str:
        """A short stable id of the plan (sha256 of its canonical JSON without the figures,
        16 hex digits); the sockets transport's frames carry its first 8 digits as the plan
        id. Computed once per Plan object: a run asks for it every time."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            from .serialize import digest

            cached = digest(self)
            object.__setattr__(self, "_digest", cached)
        return cached

    def wire_id(self) -> int:
        """The 32-bit plan id frames carry: the first 8 hex digits of :meth:`digest`."""
        return int(self.digest()[:8], 16)

    def largest_message_bytes(self) -> int:
        """An upper bound on any one message a run of this plan sends: its largest buffer on
        any rank (a chunk never spans buffers; the adaptive runtime's pieces are slices of
        them), at least 64 KiB for the adaptive runtime's control messages."""
        cached = self.__dict__.get("_largest_message")
        if cached is None:
            elems = max(max(self.buffer_elems(r).values()) for r in range(self.n))
            cached = max(elems * self.itemsize, 64 << 10)
            object.__setattr__(self, "_largest_message", cached)
        return cached

    def summary(self) -> dict:
        from .serialize import summary

        return summary(self)
