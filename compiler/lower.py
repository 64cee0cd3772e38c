"""hcc.compiler.lower — packed spanning trees to per-rank chunk programs (the plan IR).

Terms
- packed tree: a ``compiler.trees.PackedTree`` (or a value shaped like one): ``root`` (a
  rank's vertex name, or its rank index), ``edges`` = ``(parent, child, path)`` triples (vertex
  names or rank indices; ``path`` the topology vertices from parent to child) and ``rate`` in
  bytes/s; resolved once to rank positions (``trees.TreeShape``).
- span: the element range a tree carries, a share of the data proportional to its rate
  (Blink, MLSys 2020, sec. 3: each tree of the packing moves ``w_T / sum w`` of the data).
- chunk: a run of at most ``chunk_elems`` consecutive elements of a span; the unit of
  pipelining. A rank forwards chunk ``c`` as soon as it holds it: a Send depends only on the
  op that produced that chunk on that rank, so a depth-``d`` tree costs about ``d`` chunk times
  plus one buffer time, not ``d`` buffer times (design.md "Runtime").
- ready ops: the ops after whose completion a rank holds a chunk's value (a Recv, every
  RecvReduce of a reduction, or none when the value sits in ``in`` from the start).

Lowering per kind (ir/plan.py ``buffer_layout`` gives the required result):
- broadcast: out-trees from the root; the root sends from ``in`` and copies ``in`` to ``out``.
- reduce: in-trees to the root: an interior rank copies ``in`` to ``out``, RecvReduces each
  child (concurrently: reductions into one range commute, and the executor applies them one
  at a time), then sends up; a leaf sends straight from ``in``. ``avg`` = sum, then a Scale
  at the root.
- allreduce: Blink's reduce-then-broadcast over the same trees, per chunk: the broadcast of
  chunk ``c`` starts when the root has reduced ``c``; a non-root's Recv of the result depends
  on its own Send-up of that chunk (it overwrites what it sent).
- allreduce over trees rooted at every rank (a ForestColl allgather packing, the pipeline's
  "treepack-rsag"): tree ``T`` rooted at ``j`` carries a rate share of block ``j``; per chunk
  it reduces into ``j`` over ``T`` walked backwards, then broadcasts back over ``T``: a
  reduce-scatter followed by an allgather, pipelined chunk by chunk. (Trees with fewer
  distinct roots, e.g. the double binary tree, share the whole buffer by rate instead.)
- allgather / reduce_scatter: one set of trees per root rank ``j`` carrying block ``j``
  (ForestColl); reduce_scatter accumulates in ``tmp`` on interior ranks and in ``out`` at ``j``.
- gather / scatter: trees rooted at the root; each block is split across the trees in the
  same rate proportions and every block part travels along the tree path between its owner
  and the root; relays hold it in ``out`` (gather: a non-root's ``out`` is scratch) or in
  ``tmp`` at its natural offset (scatter).
- alltoall: direct messages between the pairs that exchange data; neighbor_average is the
  relaxation's lowering (lower_relax.relax_plan), which carries every step.

Order (``lower(schedule=...)``): ``fifo`` emits the chunks tree by tree in chunk-major order
with data dependencies only; ``timed`` (what the pipeline uses for the treepack candidates)
runs a weighted-fair list schedule of every message under the cost model and writes each
port's order into the plan as send-to-send dependencies, so every tree advances at its packed
share of the links it crosses (compiler/schedule.py).

The ops are built by compiler/builder.py (the program builder and its per-chunk tree steps,
shared with schedule.py): tags are allocated per ordered pair ``(src, dst)`` from 0 upward,
so they are unique per pair and small (``< 2**24``, ir/plan.py).
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ROOTED_KINDS, ChunkRef, Copy, Plan, Recv, Send, Tree
from ..ir.topology import Topology
from ..ir.verify import neighbor_peers
from .builder import MAX_TAG, ProgramBuilder, _deps, _Lowering, _message_op, plan_op, split_by_rate
from .schedule import PORT_WINDOW, TIMED_KINDS, Outrun, lower_timed
from .trees import PackedTree, TreeShape

if TYPE_CHECKING:
    from .cost import CostModel

__all__ = [
    "ProgramBuilder",
    "assemble",
    "TreeShape",
    "chunk_elems",
    "lower",
    "lower_priced",
    "neighbor_peers",
    "plan_op",
    "split_by_rate",
]


class CollectiveLike(Protocol):
    """What lowering reads of a collective: a :class:`~hcc.compiler.program.CollectiveSpec`,
    or any value with these fields (a repair's residual collective over the survivors); the
    optional ``compress``, ``on_failure``, ``adaptive`` and ``peers`` are read with defaults."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def ranks(self) -> Sequence[str]: ...
    @property
    def root(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def op(self) -> str | None: ...


def chunk_elems(chunk_bytes: int, dtype: str) -> int:
    """Chunk size in whole elements, at least one.

    >>> chunk_elems(1000, "float32"), chunk_elems(1, "float64")
    (250, 1)
    """
    if chunk_bytes <= 0:
        raise PlanError(f"chunk size must be positive, got {chunk_bytes} bytes")
    return max(1, int(chunk_bytes) // DTYPE_SIZES[dtype])


def _chunks(lo: int, hi: int, ce: int) -> Iterator[tuple[int, int]]:
    a = lo
    while a < hi:
        b = min(hi, a + ce)
        yield a, b
        a = b


def _tree_jobs(spans: list[tuple[int, int]], ce: int | Sequence[int]) -> list[list[tuple[int, int]]]:
    """Each span cut into chunks of ``ce`` elements (one size, or one per span)."""
    sizes = [ce] * len(spans) if isinstance(ce, int) else list(ce)
    return [list(_chunks(a, b, c)) for (a, b), c in zip(spans, sizes)]


def _proportional_chunks(ce: int, rates: Sequence[float]) -> list[int]:
    """Per-tree chunk sizes proportional to the trees' rates, the fastest tree's being ``ce``:
    every tree then cuts its share into the same number of chunks, so the trees advance
    together in the chunk-major order instead of the small ones finishing first and leaving
    the big one alone at the end (DGX-1, 11 undirected trees of 2 to 28 GB/s at 1 MiB:
    1.23 ms with one size, links 68% busy).

    >>> _proportional_chunks(100, [4.0, 1.0, 0.001])
    [100, 25, 1]
    """
    top = max(rates, default=0.0)
    if top <= 0:
        return [ce] * len(rates)
    return [max(1, int(round(ce * r / top))) for r in rates]


def _round_robin(jobs: list[list[Any]]) -> Iterator[tuple[int, int, Any]]:
    """(tree, chunk index, job) in chunk-major order so every tree advances together."""
    longest = max((len(j) for j in jobs), default=0)
    for k in range(longest):
        for t, js in enumerate(jobs):
            if k < len(js):
                yield t, k, js[k]


def _direct_alltoall(L: _Lowering) -> None:
    n, E, B = L.n, L.E, L.B
    if E % n:
        raise PlanError(f"alltoall needs a size divisible by the rank count: {E} elements over {n} ranks")
    w = E // n
    pieces = list(_chunks(0, w, L.ce))
    for k, (a, b) in enumerate(pieces):
        for r in range(n):
            B.add(r, Copy(ChunkRef("in", r * w + a, b - a), ChunkRef("out", r * w + a, b - a)))
        # shift d pairs every rank with a distinct peer, spreading the load over links
        for d in range(1, n):
            for i in range(n):
                j = (i + d) % n
                B.message(i, j, ChunkRef("in", j * w + a, b - a), ChunkRef("out", i * w + a, b - a),
                          chunk=k)


class _OutTrees:
    """``send(t, k, root_src, dst)``: chunk ``k`` of out-tree ``t`` from its root to every
    rank, ``root_src`` at the root, ``dst`` everywhere else, each send after the receive that
    brought the chunk to its rank: the ops ``_Lowering.bcast_chunk`` adds without a root
    dependency or a receive gate (neither ref in ``tmp``), written straight into the builder's
    programs. The plain broadcast and allgather lowerings send every chunk this way, and a
    chunk search lowers them at several sizes (the multi-channel rings of one MI250 node:
    17 280 messages over four sizes, half the compile's lowering in builder.message)."""

    def __init__(self, B: ProgramBuilder, shapes: list[TreeShape]):
        self.B = B
        # per tree, its edges parent -> child in the order bcast_chunk walks them
        self.edges = [tuple((r, c) for r in sh.order for c in sh.children[r]) for sh in shapes]
        self.roots = [sh.root for sh in shapes]

    def __call__(self, t: int, k: int, root_src: ChunkRef, dst: ChunkRef) -> None:
        if root_src.buf == "tmp" or dst.buf == "tmp":
            raise PlanError("internal: an out-tree chunk through tmp takes bcast_chunk")
        B = self.B
        progs, tags = B.programs, B._tags
        have: dict[int, tuple[int, ...]] = {self.roots[t]: ()}
        src: dict[int, ChunkRef] = {self.roots[t]: root_src}
        for key in self.edges[t]:
            r, c = key
            tag = tags.get(key, 0)
            if tag >= MAX_TAG:
                raise PlanError(f"more than {MAX_TAG} messages from rank {r} to rank {c}; use larger chunks")
            tags[key] = tag + 1
            ps, pr = progs[r], progs[c]
            ps.append(_message_op(Send, c, tag, src[r], have[r], t, k))
            pr.append(_message_op(Recv, r, tag, dst, (), t, k))
            have[c] = (len(pr) - 1,)
            src[c] = dst


def _root_spans(L: _Lowering, shapes: list[TreeShape]) -> list[tuple[int, int]]:
    """Per tree, its share of its root's block (trees rooted at every rank)."""
    spec, n = L.spec, L.n
    spans: list[tuple[int, int]] = [(0, 0)] * len(shapes)
    for j in range(n):
        mine = [i for i, s in enumerate(shapes) if s.root == j]
        lo, hi = L.block(j)
        if not mine:
            if hi > lo and n > 1:
                raise PlanError(f"{spec.kind} {spec.name!r} needs a tree rooted at every rank; "
                                f"none is rooted at {spec.ranks[j]}")
            continue
        for i, sp in zip(mine, split_by_rate(lo, hi, [shapes[i].rate for i in mine])):
            spans[i] = sp
    return spans


def _lower_trees(L: _Lowering, shapes: list[TreeShape], per_root: bool | None = None,
                 proportional: bool = False, window: int = 0, timed=None,
                 spans: list[tuple[int, int]] | None = None, sizes: Sequence[int] | None = None,
                 up: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Emit every op for a tree-based kind; return each tree's span. ``per_root`` (allreduce):
    True lowers reduce-scatter + allgather over trees rooted at every rank, False shares the
    whole buffer by rate (reduce-then-broadcast per tree), None picks True exactly when every
    rank roots a tree. ``spans`` and ``sizes`` (allgather, reduce_scatter and per-root
    allreduce, plain order): each tree's span and chunk size instead of its rate share of its
    root's block and ``L.ce`` (lower_mixed: an empty span emits nothing); ``up`` (per-root
    allreduce, plain order): per tree, the tree its chunks are reduced over, rooted at the
    same rank (by default itself)."""
    spec, n, E, ce, B = L.spec, L.n, L.E, L.ce, L.B
    kind = spec.kind
    if not shapes:
        raise PlanError(f"cannot lower {kind} {spec.name!r}: no trees")
    rates = [s.rate for s in shapes]

    if kind in ("broadcast", "reduce", "gather", "scatter"):
        for i, s in enumerate(shapes):
            if s.root != spec.root:
                raise PlanError(f"tree {i} is rooted at {spec.ranks[s.root]}, but {kind} "
                                f"{spec.name!r} has root {spec.ranks[spec.root]}")

    if per_root is None:
        per_root = kind == "allreduce" and n > 1 and {s.root for s in shapes} == set(range(n))
    else:
        per_root = per_root and kind == "allreduce" and n > 1
    if timed is not None and kind in TIMED_KINDS:
        if kind in ("allgather", "reduce_scatter") or per_root:
            spans = _root_spans(L, shapes)
        else:
            spans = split_by_rate(0, E, rates)
        got = lower_timed(L, shapes, spans, bool(per_root), *timed)
        if got is not None:
            return got
    if kind in ("broadcast", "reduce", "allreduce") and not per_root:
        spans = split_by_rate(0, E, rates)
        sizes = _proportional_chunks(ce, rates) if proportional else ce
        held: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}  # (tree, chunk) -> have
        send = _OutTrees(B, shapes) if kind == "broadcast" else None
        for t, k, (a, b) in _round_robin(_tree_jobs(spans, sizes)):
            sh, cnt = shapes[t], b - a
            out = ChunkRef("out", a, cnt)
            if kind == "broadcast":
                B.add(sh.root, Copy(ChunkRef("in", a, cnt), out))
                send(t, k, ChunkRef("in", a, cnt), out)
            else:
                gate = held.pop((t, k - window), None) if window > 0 and kind == "allreduce" else None
                acc, last, sendup = L.reduce_chunk(t, k, sh, a, b, lambda r: out, gate)
                if kind == "allreduce":
                    have = L.bcast_chunk(t, k, sh, acc, out, last, wait_for=sendup)
                    if window > 0:
                        held[(t, k)] = have
        return spans

    if kind in ("allgather", "reduce_scatter") or per_root:
        if spans is None:
            spans = _root_spans(L, shapes)
        send = _OutTrees(B, shapes) if kind == "allgather" and not per_root else None
        for t, k, (a, b) in _round_robin(_tree_jobs(spans, ce if sizes is None else sizes)):
            sh, cnt = shapes[t], b - a
            j = sh.root
            lo = L.block(j)[0]
            if per_root:  # reduce-scatter then allgather, chunk by chunk, over each tree
                out = ChunkRef("out", a, cnt)
                u = t if up is None else up[t]
                acc, last, sendup = L.reduce_chunk(u, k, shapes[u], a, b, lambda r: out)
                L.bcast_chunk(t, k, sh, acc, out, last, wait_for=sendup)
            elif kind == "allgather":
                src = ChunkRef("in", a - lo, cnt)
                out = ChunkRef("out", a, cnt)
                B.add(j, Copy(src, out))
                send(t, k, src, out)
            else:
                def dst_of(r: int, j=j, a=a, cnt=cnt, lo=lo) -> ChunkRef:
                    return ChunkRef("out", a - lo, cnt) if r == j else ChunkRef("tmp", a, cnt)

                L.reduce_chunk(t, k, sh, a, b, dst_of)
        return spans

    if kind in ("gather", "scatter"):
        spans = split_by_rate(0, E, rates)
        parts = [split_by_rate(*L.block(j), rates) for j in range(n)]
        jobs: list[list[tuple[int, int, int]]] = []
        for t in range(len(shapes)):
            jobs.append([(j, a, b) for j in range(n) for a, b in _chunks(*parts[j][t], ce)])
        root = spec.root
        rlo = L.block(root)[0]
        for t, k, (j, a, b) in _round_robin(jobs):
            sh, cnt = shapes[t], b - a
            jlo = L.block(j)[0]
            if j == root:
                if kind == "gather":
                    B.add(root, Copy(ChunkRef("in", a - jlo, cnt), ChunkRef("out", a, cnt)))
                else:
                    B.add(root, Copy(ChunkRef("in", a, cnt), ChunkRef("out", a - rlo, cnt)))
                continue
            hops = sh.path_up(j)  # j ... root
            if kind == "gather":
                src, dep = ChunkRef("in", a - jlo, cnt), None
                for u, v in zip(hops, hops[1:]):
                    dst = ChunkRef("out", a, cnt)
                    _, rv = B.message(u, v, src, dst, send_deps=_deps(dep), tree=t, chunk=k)
                    src, dep = dst, rv
            else:
                hops.reverse()  # root ... j
                src, dep = ChunkRef("in", a, cnt), None
                for u, v in zip(hops, hops[1:]):
                    dst = ChunkRef("out", a - jlo, cnt) if v == j else ChunkRef("tmp", a, cnt)
                    _, rv = B.message(u, v, src, dst, send_deps=_deps(dep), tree=t, chunk=k)
                    src, dep = dst, rv
        return spans

    raise PlanError(f"cannot lower collective kind {kind!r} over trees")



def lower(
    spec: CollectiveLike,
    topo: Topology,
    trees: Sequence[PackedTree],
    chunk_bytes: int,
    algorithm: str = "treepack",
    *,
    per_root: bool | None = None,
    proportional: bool = False,
    window: int = 0,
    schedule: str = "fifo",
    model: CostModel | None = None,
    port_window: int | None = None,
    rival=None,
    rival_ops: int = 0,
    narrow: Sequence[float] | None = None,
    halves: str | None = None,
) -> Plan:
    """Lower ``trees`` for the collective ``spec`` to a
    :class:`Plan` with chunks of ``chunk_bytes`` (rounded down to whole elements, at least 1).

    alltoall ignores ``trees`` and uses direct messages (its plan says ``algorithm =
    "direct"``); neighbor_average is handed to :func:`lower_relax.relax_plan` (``"relax"``). ``figures`` are left at their defaults for the cost model.
    ``per_root`` (allreduce only): see :func:`_lower_trees`; False keeps reduce-then-broadcast
    per tree even when the trees' roots happen to cover every rank. ``proportional``: each
    tree's chunk is ``chunk_bytes`` scaled by its rate over the fastest tree's (broadcast,
    reduce and allreduce over shared trees). ``window``: the allreduce credit window of
    :func:`_lower_trees` (0: none).

    ``schedule``: ``"fifo"`` emits each chunk's messages with data dependencies only, the
    trees in chunk-major order (the executor's posting order decides the rest); ``"timed"``
    (broadcast, reduce, allgather, reduce_scatter, allreduce) runs the list schedule of the
    compiler/schedule.py under ``model``'s per-message cost and writes its order into
    the plan, ``port_window`` sends in flight per port when the links include a switch, one
    without (``proportional`` and ``window`` do not apply to it). ``rival`` and
    ``rival_ops``: see schedule.lower_jobs (raises schedule.Outrun; for lower_priced);
    ``narrow`` (timed): per tree, the share of the chunk it cuts at (:func:`narrow_tree_factors`);
    ``halves`` (timed): which chunks go as two halves (schedule.lower_jobs; None: its default).
    """
    kind = spec.kind
    n = len(spec.ranks)
    if n < 1:
        raise PlanError(f"collective {spec.name!r} has no ranks")
    if spec.dtype not in DTYPE_SIZES:
        raise PlanError(f"unknown dtype {spec.dtype!r}")
    if schedule not in ("fifo", "timed"):
        raise PlanError(f"unknown schedule {schedule!r} (fifo or timed)")
    if port_window is None:
        port_window = PORT_WINDOW
    if port_window < 1:
        raise PlanError(f"port window must be at least 1, got {port_window}")
    ce = chunk_elems(chunk_bytes, spec.dtype)
    L = _Lowering(spec, ce)
    tree_values: tuple[Tree, ...] = ()
    if kind == "alltoall":
        _direct_alltoall(L)
        algorithm = "direct"
    elif kind == "neighbor_average":
        # one lowering of neighbor_average, the relaxation's: it carries every step of a
        # shift_one period (a step-0-only plan would not verify)
        from .lower_relax import relax_plan

        return relax_plan(spec, topo, chunk_bytes)
    else:
        shapes = [TreeShape.of(t, spec.ranks, i) for i, t in enumerate(trees)]
        timed = None
        if schedule == "timed":
            from .cost import DEFAULT_MODEL

            timed = (topo, (model or DEFAULT_MODEL).per_message_s, port_window, rival, rival_ops, narrow, halves)
        spans = _lower_trees(L, shapes, per_root, proportional, window, timed)
        shapes += L.drain_shapes  # the timed broadcast's drain tree (schedule.DRAIN_TREE)
        tree_values = tuple(s.to_tree(i, spans[i]) for i, s in enumerate(shapes))
    return assemble(spec, topo, L.B, tree_values, algorithm, ce)


MIXED_KINDS = frozenset({"allgather", "reduce_scatter", "allreduce"})


def lower_mixed(spec: CollectiveLike, topo: Topology, timed_trees: Sequence[PackedTree], timed_topo: Topology,
                plain_trees: Sequence[PackedTree], timed_chunk: int, plain_chunk: int,
                algorithm: str, *, model: CostModel | None = None, plain_up: Sequence[PackedTree] = ()) -> Plan:
    """One plan of two sets of trees rooted at every rank (allgather, reduce_scatter, and
    allreduce as reduce-scatter + allgather per root), each root's block shared over all of
    them by rate: ``timed_trees`` through the timed schedule (compiler/schedule.py) at
    ``timed_chunk`` bytes, scheduled over ``timed_topo`` (the links they may use: the
    schedule's gates and replay follow those links' kind, switch-only or direct), and
    ``plain_trees`` in the plain chunk-major order at ``plain_chunk`` bytes. Meant for sets
    whose links are disjoint (compiler/ringfill.py: NCCL's ring channels and trees packed
    into what they leave), where each set then runs as it would alone. ``plain_up``
    (allreduce): per plain tree, the in-tree to the same root its chunks are reduced over
    before ``plain_trees`` broadcasts them (a ring's chain into the root, then the chain out
    of it: the ring allreduce, each direction of a ring's links used once); by default each
    plain tree's own edges reversed. The plan's chunk size is ``plain_chunk``'s."""
    from .cost import DEFAULT_MODEL

    kind = spec.kind
    if kind not in MIXED_KINDS:
        raise PlanError(f"no mixed lowering for collective kind {kind!r}")
    n = len(spec.ranks)
    ce = chunk_elems(plain_chunk, spec.dtype)
    ce_timed = chunk_elems(timed_chunk, spec.dtype)
    L = _Lowering(spec, ce_timed)
    m, p = len(timed_trees), len(plain_trees)
    per_root = kind == "allreduce" and n > 1
    if plain_up and (not per_root or len(plain_up) != p):
        raise PlanError("plain_up pairs an in-tree with each plain tree of a per-root allreduce")
    trees = list(timed_trees) + list(plain_trees) + list(plain_up)
    shapes = [TreeShape.of(t, spec.ranks, i) for i, t in enumerate(trees)]
    spans = _root_spans(L, shapes[:m + p])
    up = None
    if plain_up:
        up = list(range(m + p)) + [0] * p
        for i in range(p):
            if shapes[m + p + i].root != shapes[m + i].root:
                raise PlanError(f"plain_up tree {i} is not rooted where plain tree {i} is")
            up[m + i] = m + p + i
    got = None
    if m:
        got = lower_timed(L, shapes[:m], spans[:m], per_root, timed_topo, (model or DEFAULT_MODEL).per_message_s,
                          PORT_WINDOW)
    sizes = [ce_timed] * m + [ce] * (len(shapes) - m)
    emit = spans + [(0, 0)] * len(plain_up)  # an up tree carries its pair's chunks
    if got is not None:  # else no timed part, or its paths are not timed_topo's links: all plain
        spans[:m] = got
        emit[:m] = [(0, 0)] * m
    _lower_trees(L, shapes, per_root, spans=emit, sizes=sizes, up=up)
    if plain_up:  # an up tree's span: the range its pair carries
        spans += spans[m:m + p]
    values = tuple(s.to_tree(i, spans[i]) for i, s in enumerate(shapes))
    return assemble(spec, topo, L.B, values, algorithm, ce)


# lower_priced(narrow=narrow_tree_factors(...)), which the tree candidates' own chunk search asks for
# (registry.py; not the packing choice's pricing of each packing, compiler/packing_choice.py),
# also prices for these kinds the timed schedule with each tree's chunk scaled by the
# narrowest link its messages cross over the widest such among the trees
# (schedule.narrow_factors), where that differs between trees, and keeps the faster: a tree
# over a 12 GB/s PCIe route fills and drains twice as slowly per chunk as one over NVLink,
# and the rebalancing moves its bytes onto the root's other links (DGX-1's broadcast from
# gpu0 at 1 GiB 0.926 -> 0.932). Off while NARROWING says so (replay.py compiles the
# broadcast it runs backwards without it, and up to 8 ranks with it too, keeping the faster)
NARROW_KINDS = frozenset({"broadcast", "reduce"})
NARROWING: ContextVar[bool] = ContextVar("NARROWING", default=True)
# while NARROWING is off, where a list is set here lower_priced appends to it each time it
# would have priced the narrow-link form: none appended, the compile with it on is the same
NARROW_SKIPPED: ContextVar[list | None] = ContextVar("NARROW_SKIPPED", default=None)
# ... where the buffer is at least this many chunks: the chunk search starts from the whole
# buffer and halves, and the sizes where these plans are fastest are 1/64-1/512 of it (DGX-1's
# broadcast, 1 GiB: 2-4 MiB), so the narrow form is not lowered at the first five sizes
NARROW_MIN_CHUNKS = 32
# lower_priced(halves=True), which the tree candidates' own chunk search asks for (as for the
# narrow form, not the packing choice's pricing of each packing: there it cost a third more
# CPU and moved a ring-fill plan's packing for the worse), also prices for these kinds the
# timed schedule with each tree's last chunk in halves (schedule.TAIL_HALVES, asked for jobs
# that only reduce) and keeps the faster where the buffer is at least this many chunks:
# DGX-1 gpu[0,2,4,6]'s reduce-scatter at 1 GiB 0.945 -> 0.963 of the bound; forced,
# gpu[0,3,4,5,7]'s at 256 MiB fell 0.976 -> 0.960
HALVES_KINDS = frozenset({"reduce", "reduce_scatter"})
HALVES_MIN_CHUNKS = 4
# both orders are priced up to this many ops per plan (the plain order's lowering and a second
# simulation cost about as much again as the timed plan's); above it the timed plan alone
BOTH_ORDERS_MAX_OPS = 200_000


def lower_priced(spec: CollectiveLike, topo: Topology, trees: Sequence[PackedTree], chunk_bytes: int,
                 algorithm: str = "treepack", *, model: CostModel | None = None,
                 narrow: Sequence[float] | None = None, halves: bool = False):
    """``(plan, simulation)``: the timed lowering, or the plain chunk-major one where that
    simulates faster (the timed schedule is a heuristic: on a 4-GPU DGX-1 fragment's
    allreduce it lost 0.96 -> 0.93 of the bound to the plain order), for
    chunks.choose_chunk. ``narrow``: the trees' :func:`narrow_tree_factors`, the timed
    lowering in that narrow-link form priced too and kept where faster (NARROW_KINDS);
    ``halves``: the timed lowering with the last chunks in halves likewise (HALVES_KINDS)."""
    from .cost import DEFAULT_MODEL, simulate

    model = model or DEFAULT_MODEL
    got: list = []  # the plain order's (plan, simulation), once lowered

    def plain_time() -> float:
        if not got:
            plain = lower(spec, topo, trees, chunk_bytes, algorithm)
            got.append((plain, simulate(plain, model=model)))
        return got[0][1].time

    # a timed schedule known to simulate to its own makespan is compared with the plain
    # order before it is written out, and not written where it loses (1 x MI250 allgather:
    # at each chunk size tried the plain order wins by 1-4 %)
    try:
        timed = lower(spec, topo, trees, chunk_bytes, algorithm, schedule="timed", model=model,
                      rival=plain_time, rival_ops=BOTH_ORDERS_MAX_OPS)
    except Outrun:
        return got[0]
    st = simulate(timed, model=model)
    forms: list[dict] = []  # the timed lowering's other forms priced here, each kept where faster
    if narrow is not None and spec.kind in NARROW_KINDS and spec.size_bytes >= NARROW_MIN_CHUNKS * chunk_bytes:
        if NARROWING.get():
            forms.append({"narrow": narrow})
        elif (skipped := NARROW_SKIPPED.get()) is not None:
            skipped.append(chunk_bytes)
    if halves and spec.kind in HALVES_KINDS and spec.size_bytes >= HALVES_MIN_CHUNKS * chunk_bytes:
        forms.append({"halves": "last"})
    for form in forms:
        other = lower(spec, topo, trees, chunk_bytes, algorithm, schedule="timed", model=model, **form)
        so = simulate(other, model=model)
        if so.time < st.time:
            timed, st = other, so
    if sum(len(p) for p in timed.programs) > BOTH_ORDERS_MAX_OPS:
        return timed, st
    plain_time()
    plain, sp = got[0]
    return (timed, st) if st.time <= sp.time else (plain, sp)


def narrow_tree_factors(spec: CollectiveLike, topo: Topology, trees: Sequence[PackedTree]) -> list[float] | None:
    """Per tree, the share of the chunk it cuts at in the narrow-link form of the timed
    schedule (schedule.narrow_factors: they do not depend on the chunk size, so a chunk
    search reads them once); None where every tree cuts the whole chunk."""
    from .schedule import narrow_factors

    shapes = [TreeShape.of(t, spec.ranks, i) for i, t in enumerate(trees)]
    factors = narrow_factors(spec, shapes, shapes, topo)
    return factors if min(factors, default=1.0) < 1.0 else None


def assemble(spec: CollectiveLike, topo: Topology, builder: ProgramBuilder, trees: tuple[Tree, ...],
             algorithm: str, ce: int) -> Plan:
    """The :class:`Plan` of ``spec`` from a finished builder (shared with the schedules built op by op: baselines.py, hier.py, ...)."""
    kind = spec.kind
    programs, tmp = builder.finish()
    return Plan(
        name=spec.name,
        kind=kind,
        ranks=tuple(spec.ranks),
        root=spec.root if kind in ROOTED_KINDS else -1,
        size_bytes=spec.size_bytes,
        dtype=spec.dtype,
        op=plan_op(kind, spec.op),
        algorithm=algorithm,
        chunk_bytes=ce * DTYPE_SIZES[spec.dtype],
        trees=trees,
        programs=programs,
        tmp_elems=tmp,
        topology=topo,
        compress=getattr(spec, "compress", "none") or "none",
        on_failure=getattr(spec, "on_failure", "abort") or "abort",
        adaptive=getattr(spec, "adaptive", None),
        peers=getattr(spec, "peers", None) if kind == "neighbor_average" else None,
    )
