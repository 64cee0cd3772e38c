"""hcc.ir.verify — prove that a plan does what its collective requires and cannot deadlock.

The checker is a symbolic executor over intervals (style.md habit 6, after msccl-tools'
``Check()``), not over elements, so a 256-rank allgather of ~100k ops verifies in seconds and
the 1024-rank fat tree's plans of millions of ops in tens of seconds.

Terms
- term ``(q, s)``: "rank ``q``'s input element at ``x + s``", where ``x`` is the position of
  the element that holds the term. Storing the shift ``s`` rather than an absolute offset
  makes a run of consecutive elements one value: splitting a run changes nothing, moving a
  run from position ``xs`` to ``xd`` adds ``xs - xd`` to every shift.
- value: ``(groups, divisor)``: the set of terms (input elements combined with the plan's
  reduction) as ``groups = ((s, mask), ...)``, sorted by shift ``s``, where bit ``q`` of
  ``mask`` is the term ``(q, s)``; and the divisor a Scale applied (1 if none). ``None`` is
  an element never written (``out``/``tmp`` start so). A term can occur at most once in a
  value (a second occurrence is the double-counting error), so a set is exact, and a bit
  mask makes combining two partial reductions of a 1024-rank allreduce a few machine-word
  operations instead of a merge of 1024-term tuples (a chain of 1023 reductions was
  quadratic in the ranks).
- segment map: per rank and buffer, a sorted list of runs ``[start, next start)`` with one
  value each (:class:`_Segs`). When every range the rank's ops name in a buffer is either
  equal to or disjoint from every other (*laminar*: chunk-pipelined tree plans always are),
  the buffer is a dict from range start to its runs instead (:class:`_Slots`), and the race
  sweep keeps its state per range: one dict lookup per access instead of a bisect and two
  list splices.

Execution model (ir/plan.py): an op is *posted* when every op in its ``deps`` has completed;
sends are non-blocking (posting never waits), and the value a Send carries is its source range
at the moment it is posted. A Recv completes once its matching Send is posted. To hold under
MPI's rendezvous protocol as well, where an ``Isend`` completes only once the receiver has
posted the matching receive, the check also lets a Send complete only after every dep of its
matching Recv. The plan cannot deadlock iff the graph of these "completes-before" edges
(deps, send -> recv, recv's deps -> send) is acyclic: then some op is always ready to post.

Checks, in order (the first failure raises :class:`VerifyError` with ``rank`` and ``op``):
1. header: kind, dtype, sizes, root, one program and one tmp length per rank, trees;
2. each op: deps are earlier ops of the same program; ChunkRefs lie inside their buffer and
   are not empty; peers are other ranks; tags in ``[0, 2**24)``; equal counts for Copy and
   Reduce; nothing writes ``in``;
3. messages: every Send has exactly one Recv/RecvReduce with the same pair, tag and count,
   and the reverse;
4. no data race: two ops of one rank touching overlapping elements, one writing, are ordered
   by deps (a sweep over each buffer keeping the last writer and the readers since) — except
   two reductions (RecvReduce/Reduce) into the same elements, which commute: the executor
   applies reductions one at a time in its completion loop, so their order only changes
   floating-point rounding, never which inputs are combined;
5. no deadlock (the acyclic graph above, held as arrays: a 1024-rank allgather has ~3
   million edges);
6. symbolic execution in a topological order of that graph: reads of unwritten elements,
   reductions that count an input twice or combine scaled values are errors;
7. every rank's final ``out`` equals buffer_layout's required table exactly (as multisets;
   ``avg`` and neighbor_average need a Scale by the contributor count).
"""
from __future__ import annotations

import gc
from array import array
from dataclasses import replace
from typing import Any, Callable

from .errors import VerifyError
from .plan import BUFFERS, DTYPE_SIZES, KINDS, OPS, REDUCING_KINDS, ROOTED_KINDS, neighbor_peers
from .plan import ChunkRef, Copy, Plan, Recv, RecvReduce, Reduce, Scale, Send
from . import verify_native
from .verify_scan import check_ops as check_ops_scan
from .verify_values import (  # noqa: F401  (_bits, _laminar, _show, _union: tests reach them here)
    Value,
    _Input,
    _Segs,
    _Slots,
    _bits,
    _laminar,
    _required,
    _runs,
    _shift,
    _show,
    _union,
)

MAX_TAG = 1 << 24

__all__ = ["neighbor_peers", "verify"]



def _kind_name(op: Any) -> str:
    return {Send: "send", Recv: "recv", RecvReduce: "recv_reduce", Copy: "copy", Reduce: "reduce",
            Scale: "scale"}.get(type(op), type(op).__name__)


def _ref(r: ChunkRef) -> str:
    return f"{r.buf}[{r.offset}:{r.offset + r.count}]"


def _describe(op: Any) -> str:
    if isinstance(op, Send):
        return f"send {_ref(op.src)} to rank {op.peer} tag {op.tag}"
    if isinstance(op, (Recv, RecvReduce)):
        return f"{_kind_name(op)} {_ref(op.dst)} from rank {op.peer} tag {op.tag}"
    if isinstance(op, Scale):
        return f"scale {_ref(op.dst)} by 1/{op.divisor}"
    return f"{_kind_name(op)} {_ref(op.src)} -> {_ref(op.dst)}"


def _where(r: int, i: int, op: Any) -> str:
    return f"rank {r} op {i} ({_describe(op)})"


def _reads_writes(op: Any) -> tuple[tuple[ChunkRef, ...], tuple[ChunkRef, ...]]:
    if isinstance(op, Send):
        return (op.src,), ()
    if isinstance(op, Recv):
        return (), (op.dst,)
    if isinstance(op, (RecvReduce, Scale)):
        return (), (op.dst,)  # read-modify-write: ordering it as a write covers the read
    if isinstance(op, Reduce):
        return (op.src,), (op.dst,)
    return (op.src,), (op.dst,)


def _fail(plan: Plan, msg: str, rank: int = -1, op: int = -1) -> VerifyError:
    return VerifyError(f"plan {plan.name!r}: {msg}", rank=rank, op=op)


# -- 1. header ---------------------------------------------------------------------------
def _check_header(plan: Plan) -> None:
    if plan.kind not in KINDS:
        raise _fail(plan, f"unknown collective kind {plan.kind!r}")
    if plan.dtype not in DTYPE_SIZES:
        raise _fail(plan, f"unknown dtype {plan.dtype!r}")
    n = plan.n
    if n < 1:
        raise _fail(plan, "a plan needs at least one rank")
    if plan.size_bytes < 0 or plan.size_bytes % plan.itemsize:
        raise _fail(plan, f"size {plan.size_bytes} bytes is not a whole number of {plan.dtype} elements")
    if len(plan.programs) != n or len(plan.tmp_elems) != n:
        raise _fail(plan, f"{n} ranks but {len(plan.programs)} programs and {len(plan.tmp_elems)} tmp lengths")
    if any(t < 0 for t in plan.tmp_elems):
        raise _fail(plan, "a tmp length is negative")
    if plan.kind in ROOTED_KINDS and not 0 <= plan.root < n:
        raise _fail(plan, f"{plan.kind} needs a root in 0..{n - 1}, got {plan.root}")
    if plan.kind in REDUCING_KINDS and plan.op not in OPS:
        raise _fail(plan, f"{plan.kind} needs a reduction op ({', '.join(OPS)}), got {plan.op!r}")
    if plan.kind == "alltoall" and plan.elems % n:
        raise _fail(plan, f"alltoall needs a size divisible by the rank count ({plan.elems} elements, {n} ranks)")
    for i, t in enumerate(plan.trees):
        if t.index != i or len(t.parent) != n or not 0 <= t.root < n or t.parent[t.root] != -1:
            raise _fail(plan, f"tree {i} is malformed (index {t.index}, root {t.root}, {len(t.parent)} parents for {n} ranks)")
        if any(not -1 <= p < n for p in t.parent):
            raise _fail(plan, f"tree {i} has a parent outside the ranks")


# -- 2./3. ops and messages ----------------------------------------------------------------
class _Index:
    """The plan's ops numbered globally (rank ``r``'s op ``i`` is ``base[r] + i``), its
    messages matched, and the completes-before edges as flat arrays (``src[k] -> dst[k]``).
    Message keys are ints, ``(a * n + b) * MAX_TAG + tag``: tuple keys cost 3x the memory on
    the million messages of a 1024-rank allgather."""

    def __init__(self, plan: Plan):
        self.n = plan.n
        self.base = [0]
        for prog in plan.programs:
            self.base.append(self.base[-1] + len(prog))
        self.total = self.base[-1]
        self.sends: dict[int, int] = {}  # key -> op index on the sender
        self.recvs: dict[int, int] = {}  # key -> op index on the receiver
        # arrays of 8-byte ints, not lists: a list holds a 28-byte int object per entry, and
        # the 6 million ops of a 1024-rank allreduce make ~18 million edges
        self.src = array("q")
        self.dst = array("q")

    def key(self, a: int, b: int, tag: int) -> int:
        return (a * self.n + b) * MAX_TAG + tag

    def unkey(self, key: int) -> tuple[int, int, int]:
        pair, tag = divmod(key, MAX_TAG)
        a, b = divmod(pair, self.n)
        return a, b, tag


_MESSAGE_TYPES = (Send, Recv, RecvReduce)
_OP_TYPES = (Send, Recv, RecvReduce, Copy, Reduce, Scale)


def _check_ops(plan: Plan, sizes: list[dict[str, int]]) -> _Index:
    n = plan.n
    ix = _Index(plan)
    sends, recvs = ix.sends, ix.recvs
    esrc, edst = ix.src, ix.dst
    ntrees = len(plan.trees)
    for r, prog in enumerate(plan.programs):
        size_of = sizes[r]
        b0 = ix.base[r]
        for i, op in enumerate(prog):
            t = type(op)
            if t not in _OP_TYPES:
                t = next((k for k in _OP_TYPES if isinstance(op, k)), None)
                if t is None:
                    raise _fail(plan, f"rank {r} op {i} is not a plan op: {op!r}", r, i)
            for d in op.deps:
                if not isinstance(d, int) or not 0 <= d < i:
                    raise _fail(plan, f"{_where(r, i, op)} depends on op {d}, which is not an earlier op of rank {r}", r, i)
                esrc.append(b0 + d)
                edst.append(b0 + i)
            if t is Send:
                refs, dst = (op.src,), None
            elif t is Copy or t is Reduce:
                refs, dst = (op.src, op.dst), op.dst
            else:
                refs, dst = (op.dst,), op.dst
            for ref in refs:
                size = size_of.get(ref.buf)
                if size is None:
                    raise _fail(plan, f"{_where(r, i, op)} names buffer {ref.buf!r} (expected one of {', '.join(BUFFERS)})", r, i)
                if ref.count < 1 or ref.offset < 0 or ref.offset + ref.count > size:
                    raise _fail(plan, f"{_where(r, i, op)}: {_ref(ref)} is outside buffer {ref.buf} of rank {r} ({size} elements)", r, i)
            if dst is not None and dst.buf == "in":
                raise _fail(plan, f"{_where(r, i, op)} writes the input buffer 'in', which is read-only", r, i)
            if t is Copy or t is Reduce:
                if op.src.count != op.dst.count:
                    raise _fail(plan, f"{_where(r, i, op)}: source and destination counts differ", r, i)
                same = op.src == op.dst and getattr(op, "roundtrip", False)  # codec round trip in place
                if not same and op.src.buf == op.dst.buf and op.src.offset < op.dst.end and op.dst.offset < op.src.end:
                    raise _fail(plan, f"{_where(r, i, op)}: source and destination overlap", r, i)
            elif t is Scale:
                if op.divisor < 1:
                    raise _fail(plan, f"{_where(r, i, op)}: divisor must be at least 1", r, i)
            else:
                peer, tag = op.peer, op.tag
                if not 0 <= peer < n or peer == r:
                    raise _fail(plan, f"{_where(r, i, op)}: peer {peer} is not another rank (0..{n - 1})", r, i)
                if not 0 <= tag < MAX_TAG:
                    raise _fail(plan, f"{_where(r, i, op)}: tag {tag} outside [0, 2**24)", r, i)
                if not -1 <= op.tree < ntrees:
                    raise _fail(plan, f"{_where(r, i, op)}: tree {op.tree} does not exist", r, i)
                if t is Send:
                    key, table, a, b = (r * n + peer) * MAX_TAG + tag, sends, r, peer
                else:
                    key, table, a, b = (peer * n + r) * MAX_TAG + tag, recvs, peer, r
                if key in table:
                    raise _fail(plan, f"{_where(r, i, op)} reuses tag {tag} between ranks {a} -> {b} (op {table[key]})", r, i)
                table[key] = i
    programs, base = plan.programs, ix.base
    for key, i in sends.items():
        a, b, tag = ix.unkey(key)
        op = programs[a][i]
        j = recvs.get(key)
        if j is None:
            raise _fail(plan, f"{_where(a, i, op)} has no matching recv on rank {b}", a, i)
        other = programs[b][j]
        if other.dst.count != op.src.count:
            raise _fail(plan, f"{_where(a, i, op)} sends {op.src.count} elements but its match {_where(b, j, other)} expects {other.dst.count}", a, i)
        s, v = base[a] + i, base[b] + j
        esrc.append(s)
        edst.append(v)
        for d in other.deps:  # rendezvous: the send completes after the recv is posted
            esrc.append(base[b] + d)
            edst.append(s)
    if len(recvs) != len(sends):
        for key, j in recvs.items():
            if key not in sends:
                a, b, tag = ix.unkey(key)
                op = programs[b][j]
                raise _fail(plan, f"{_where(b, j, op)} has no matching send on rank {a}", b, j)
    return ix


# -- 4. races --------------------------------------------------------------------------------
def _unordered(deps: list[tuple[int, ...]], targets: tuple[int, ...], i: int) -> int | None:
    """The first of ``targets`` that is not an ancestor of op ``i`` along deps, or None.
    One backward search from ``i`` serves every target; it never descends below the
    smallest target (deps only point to earlier ops)."""
    todo = {t for t in targets if t != i}
    if not todo:
        return None
    todo.difference_update(deps[i])
    if not todo:
        return None
    low = min(todo)
    stack, seen = [i], {i}
    while stack and todo:
        for d in deps[stack.pop()]:
            if d >= low and d not in seen:
                seen.add(d)
                todo.discard(d)
                stack.append(d)
    return min(todo) if todo else None


def _accesses(op: Any) -> tuple[tuple[ChunkRef, ...], tuple[ChunkRef, ...]]:
    t = type(op)
    if t is Send:
        return (op.src,), ()
    if t is Recv or t is RecvReduce or t is Scale:
        return (), (op.dst,)  # RecvReduce, Scale: read-modify-write, ordered as a write
    return (op.src,), (op.dst,)


def _buffer_ranges(prog) -> dict[str, set[tuple[int, int]]]:
    """The distinct element ranges rank ops name in ``out`` and ``tmp``."""
    ranges: dict[str, set[tuple[int, int]]] = {"out": set(), "tmp": set()}
    for op in prog:
        reads, writes = _accesses(op)
        for ref in reads + writes:
            if ref.buf != "in":
                ranges[ref.buf].add((ref.offset, ref.offset + ref.count))
    return ranges


def _check_races(plan: Plan, r: int, sizes: dict[str, int]) -> dict[str, bool]:
    """Sweep rank ``r``'s ops in program order keeping, per run of elements, the last plain
    writer ``w``, the reductions ``red`` and the readers ``rd`` since. Reductions
    (RecvReduce, Reduce) commute with each other, so they need no order among themselves,
    but every other access must be ordered with each of them. Returns, per buffer, whether
    its ranges are laminar (then the state is kept per range, see the module docstring)."""
    prog = plan.programs[r]
    deps = [op.deps for op in prog]
    lam = {b: _laminar(rs) for b, rs in _buffer_ranges(prog).items()}
    maps = {b: _Segs(sizes[b], (-1, (), ())) for b in ("out", "tmp") if not lam[b]}
    state: dict[tuple[str, int], tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
    fresh = (-1, (), ())

    def check(i: int, targets: tuple[int, ...], ref: ChunkRef, what: str) -> None:
        j = _unordered(deps, targets, i)
        if j is not None:
            raise _fail(plan, f"data race on rank {r}: {_where(r, i, prog[i])} {what} "
                              f"{ref.buf} elements also touched by op {j} ({_describe(prog[j])}) "
                              f"without a dependency between them", r, i)

    for i, op in enumerate(prog):
        t = type(op)
        if t is Send:
            reads, writes = (op.src,), ()
        elif t is Recv or t is RecvReduce or t is Scale:
            reads, writes = (), (op.dst,)  # RecvReduce, Scale: read-modify-write, a write
        else:
            reads, writes = (op.src,), (op.dst,)
        for ref in reads:
            if ref.buf == "in":
                continue  # never written (checked above), so reads never race
            if lam[ref.buf]:
                key = (ref.buf, ref.offset)
                w, red, rd = state.get(key, fresh)
                if w >= 0 or red:
                    check(i, ((w,) if w >= 0 else ()) + red, ref, "reads")
                state[key] = (w, red, rd + (i,))
                continue
            segs = maps[ref.buf]
            new = []
            for s, e, (w, red, rd) in segs.pieces(ref.offset, ref.end):
                check(i, ((w,) if w >= 0 else ()) + red, ref, "reads")
                new.append((s, e, (w, red, rd + (i,))))
            segs.assign(ref.offset, ref.end, new)
        commuting = t is RecvReduce or t is Reduce
        for ref in writes:
            if lam[ref.buf]:
                key = (ref.buf, ref.offset)
                w, red, rd = state.get(key, fresh)
                before = ((w,) if w >= 0 else ()) + rd
                targets = before if commuting else before + red
                if targets:
                    check(i, targets, ref, "writes")
                state[key] = (w, red + (i,), rd) if commuting else (i, (), ())
                continue
            segs = maps[ref.buf]
            new = []
            for s, e, (w, red, rd) in segs.pieces(ref.offset, ref.end):
                before = ((w,) if w >= 0 else ()) + rd
                check(i, before if commuting else before + red, ref, "writes")
                new.append((s, e, (w, red + (i,), rd)))
            if commuting:
                segs.assign(ref.offset, ref.end, new)
            else:
                segs.assign(ref.offset, ref.end, [(ref.offset, ref.end, (i, (), ()))])
    return lam


# -- 5. deadlock: completes-before graph --------------------------------------------------------
def _order(plan: Plan, ix: _Index) -> list[int]:
    """A topological order (global op numbers) of the completes-before graph, or the
    cycle that makes the plan deadlock. The graph is a CSR of numpy arrays; Kahn's loop
    runs over the successor array as one list."""
    import numpy as np

    total = ix.total
    src = np.frombuffer(ix.src, dtype=np.int64)
    dst = np.frombuffer(ix.dst, dtype=np.int64)
    by_src = np.argsort(src, kind="stable")
    succ = array("q", dst[by_src].tobytes())  # 8 bytes an edge; a list would hold int objects
    ptr = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=total), out=ptr[1:])
    ptr_l = array("q", ptr.tobytes())
    indeg = np.bincount(dst, minlength=total).tolist()
    del src, dst, by_src, ptr
    ix.src = ix.dst = array("q")  # the edge arrays are the largest thing verify holds
    ready = [x for x in range(total) if indeg[x] == 0]
    order: list[int] = []
    while ready:
        x = ready.pop()
        order.append(x)
        for k in range(ptr_l[x], ptr_l[x + 1]):
            y = succ[k]
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    if len(order) == total:
        return order
    base = ix.base
    rank_of = [r for r, prog in enumerate(plan.programs) for _ in prog]
    # report an op on the cycle: walk back along unfinished predecessors until one repeats
    pred: dict[int, int] = {}
    for x in range(total):
        if indeg[x] > 0:
            for k in range(ptr_l[x], ptr_l[x + 1]):
                y = succ[k]
                if indeg[y] > 0:
                    pred[y] = x
    x = next(y for y in range(total) if indeg[y] > 0 and y in pred)
    seen: list[int] = []
    while x not in seen:
        seen.append(x)
        x = pred[x]
    cyc = seen[seen.index(x):]
    cyc.reverse()
    desc = " -> ".join(f"rank {rank_of[y]} op {y - base[rank_of[y]]}" for y in cyc[:8])
    r = rank_of[x]
    raise _fail(plan, f"dependency cycle, the plan can deadlock: {desc}"
                      f"{' -> ...' if len(cyc) > 8 else ''} (starting at {_where(r, x - base[r], plan.programs[r][x - base[r]])})",
                r, x - base[r])


# -- 6. symbolic execution ---------------------------------------------------------------------


def _execute(plan: Plan, order: list[int], sizes: list[dict[str, int]], ix: _Index,
             laminar: list[dict[str, bool]]) -> list[Any]:
    n = plan.n
    mem = []
    for r in range(n):
        mem.append({
            "in": _Input(sizes[r]["in"], r),
            "out": _Slots(sizes[r]["out"]) if laminar[r]["out"] else _Segs(sizes[r]["out"], None),
            "tmp": _Slots(sizes[r]["tmp"]) if laminar[r]["tmp"] else _Segs(sizes[r]["tmp"], None),
        })
    inflight: dict[int, tuple[int, list]] = {}

    def read(r: int, i: int, op: Any, ref: ChunkRef) -> list:
        ps = mem[r][ref.buf].pieces(ref.offset, ref.offset + ref.count)
        for s, e, v in ps:
            if v is None:
                raise _fail(plan, f"{_where(r, i, op)} reads {ref.buf}[{s}:{e}] of rank {r} before anything was written there", r, i)
        return ps

    def put(r: int, i: int, op: Any, dst: ChunkRef, src_off: int, ps: list, reduce: bool) -> None:
        delta = src_off - dst.offset
        end = dst.offset + dst.count
        if delta:
            incoming = [(s - delta, e - delta, _shift(v, delta)) for s, e, v in ps]
        else:
            incoming = ps
        segs = mem[r][dst.buf]
        if not reduce:
            segs.assign(dst.offset, end, incoming)
            return
        have = segs.pieces(dst.offset, end)
        if len(have) == 1 and len(incoming) == 1:  # the common case: one run each, one range
            v, why = _union(have[0][2], incoming[0][2])
            if why:
                raise _fail(plan, f"{_where(r, i, op)}: {dst.buf}[{dst.offset}:{end}] of rank {r} {why}", r, i)
            segs.assign(dst.offset, end, [(dst.offset, end, v)])
            return
        out, a, b = [], 0, 0
        pos = dst.offset
        while pos < end:
            s1, e1, v1 = have[a]
            s2, e2, v2 = incoming[b]
            e = min(e1, e2)
            v, why = _union(v1, v2)
            if why:
                raise _fail(plan, f"{_where(r, i, op)}: {dst.buf}[{pos}:{e}] of rank {r} {why}", r, i)
            out.append((pos, e, v))
            pos = e
            if e == e1:
                a += 1
            if e == e2:
                b += 1
        segs.assign(dst.offset, end, out)

    programs, base, N = plan.programs, ix.base, n
    rank_of = [r for r, prog in enumerate(programs) for _ in prog]
    flat = [op for prog in programs for op in prog]
    for x in order:
        r = rank_of[x]
        i = x - base[r]
        op = flat[x]
        t = type(op)
        if t is Send:
            inflight[(r * N + op.peer) * MAX_TAG + op.tag] = (op.src.offset, read(r, i, op, op.src))
        elif t is Recv or t is RecvReduce:
            src_off, ps = inflight.pop((op.peer * N + r) * MAX_TAG + op.tag)
            put(r, i, op, op.dst, src_off, ps, t is RecvReduce)
        elif t is Copy or t is Reduce:
            put(r, i, op, op.dst, op.src.offset, read(r, i, op, op.src), t is Reduce)
        else:  # Scale
            segs = mem[r][op.dst.buf]
            new = []
            for s, e, v in segs.pieces(op.dst.offset, op.dst.end):
                if v is None:
                    raise _fail(plan, f"{_where(r, i, op)} scales {op.dst.buf}[{s}:{e}], which was never written", r, i)
                if v[1] != 1:
                    raise _fail(plan, f"{_where(r, i, op)} scales {op.dst.buf}[{s}:{e}] a second time", r, i)
                new.append((s, e, (v[0], op.divisor)))
            segs.assign(op.dst.offset, op.dst.end, new)
    return [m["out"] for m in mem]


# -- 7. the required final state -----------------------------------------------------------------


def _check_final(plan: Plan, r: int, out: Any, step: int = 0) -> None:
    name = plan.ranks[r]
    if plan.kind == "neighbor_average":
        exact = set(neighbor_peers(plan.peers, plan.n, r, step))
        for s, e, v in _runs(out, 0, out.length):
            ok = v is not None and len(v[0]) == 1 and v[0][0][0] == 0
            if ok:
                qs = _bits(v[0][0][1])  # a set already: a rank counted twice failed earlier
                others = set(qs) - {r}
                ok = r in qs and v[1] == len(qs) and others == exact
            if not ok:
                raise _fail(plan, f"rank {r} ({name}) ends with out[{s}:{e}] = {_show(v, s, e)}, but "
                                  f"neighbor_average (peers = {plan.peers}) requires the mean of its own "
                                  f"input and its peers' inputs"
                                  + (f" of step {step}" if getattr(plan, "step_programs", ()) or step else ""), r)
        return
    req = _required(plan, r)
    if req is None:
        return
    # one walk over the buffer's runs and the required runs together (both sorted): per-
    # block lookups sorted the runs once per block, 256 x 256 times on a 256-rank allgather
    have = _runs(out, 0, out.length)
    k = 0
    for lo, hi, want in req:
        if hi <= lo:
            continue
        while k < len(have) and have[k][1] <= lo:
            k += 1
        j = k
        while j < len(have) and have[j][0] < hi:
            s, e, v = have[j]
            if v != want:
                s, e = max(s, lo), min(e, hi)
                raise _fail(plan, f"rank {r} ({name}) ends with out[{s}:{e}] = {_show(v, s, e)}, but "
                                  f"{plan.kind} requires {_show(want, s, e)}", r)
            j += 1


def verify(plan: Plan, on_phase: Callable[[str, int, int], None] | None = None) -> None:
    """Raise :class:`VerifyError` unless ``plan`` is consistent, deadlock-free and leaves
    every rank's ``out`` exactly as its collective requires (see the module docstring) — at
    every training step, for a neighbor_average plan that carries ``step_programs``.
    ``on_phase(step, done, total)`` is told each phase as it starts (progress reporting)."""
    _check_header(plan)
    _check_steps(plan)
    # verification allocates a few objects per op and frees almost none until it returns:
    # the cyclic collector would rescan them all again and again (cost.simulate does the same)
    enabled = gc.isenabled()
    gc.disable()
    try:
        _verify_programs(plan, 0, on_phase)
        for k, progs in enumerate(getattr(plan, "step_programs", ()), 1):
            _verify_programs(replace(plan, programs=progs, step_programs=()), k, on_phase)
    finally:
        if enabled:
            gc.enable()


def _check_steps(plan: Plan) -> None:
    """``step_programs`` only on a neighbor_average whose pairing changes with the step, one
    program per rank, exactly one period of steps (shift_one repeats every n/2)."""
    steps = getattr(plan, "step_programs", ())
    period = plan.n // 2 if plan.kind == "neighbor_average" and plan.peers == "shift_one" and plan.n > 1 else 1
    if len(steps) + 1 != period:
        raise _fail(plan, f"the plan carries {len(steps) + 1} steps' programs, but "
                          f"{plan.kind}{f' (peers = {plan.peers})' if plan.peers else ''} repeats every {period}")
    for k, progs in enumerate(steps, 1):
        if len(progs) != plan.n:
            raise _fail(plan, f"step {k}: {plan.n} ranks but {len(progs)} programs")


def _verify_programs(plan: Plan, step: int, on_phase: Callable[[str, int, int], None] | None = None) -> None:
    say = on_phase or (lambda what, done, total: None)
    sizes = [plan.buffer_elems(r) for r in range(plan.n)]
    say("ops and messages", 1, 5)
    # the numpy check (ir/verify_scan.py) where the op columns can be read; it accepts what
    # _check_ops accepts and yields its edges, and leaves every fault to _check_ops to name
    ix = check_ops_scan(plan, sizes) or _check_ops(plan, sizes)
    # checks 4-7 in one native pass where the plan allows it (ir/verify_native.py); any
    # failure there, or a plan it does not represent, runs the Python checks below, which
    # accept the plan or name its fault
    say("races, deadlock freedom, symbolic execution (native)", 2, 5)
    if verify_native.verify(plan, sizes, ix):
        return
    ix.tab = ix.partner = None
    say("data races", 2, 5)
    laminar = [_check_races(plan, r, sizes[r]) for r in range(plan.n)]
    say("deadlock freedom", 3, 5)
    order = _order(plan, ix)
    say("symbolic execution", 4, 5)
    outs = _execute(plan, order, sizes, ix, laminar)
    del order
    say("final buffers", 5, 5)
    for r, out in enumerate(outs):
        _check_final(plan, r, out, step)
