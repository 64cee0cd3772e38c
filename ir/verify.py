"""hcc.ir.verify — prove that a plan does what its collective requires and cannot deadlock.

The checker is a symbolic executor over intervals (style.md habit 6, after msccl-tools'
``Check()``), not over elements, so a 256-rank allgather of ~100k ops verifies in seconds.

Terms
- term ``(q, s)``: "rank ``q``'s input element at ``x + s``", where ``x`` is the position of
  the element that holds the term. Storing the shift ``s`` rather than an absolute offset
  makes a run of consecutive elements one value: splitting a run changes nothing, moving a
  run from position ``xs`` to ``xd`` adds ``xs - xd`` to every shift.
- value: ``(terms, divisor)``: a sorted tuple of terms (a multiset of input elements combined
  with the plan's reduction) and the divisor a Scale applied (1 if none); ``None`` is an
  element never written (``out``/``tmp`` start so).
- segment map: per rank and buffer, a sorted list of runs ``[start, next start)`` with one
  value each.

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
5. no deadlock (the acyclic graph above);
6. symbolic execution in a topological order of that graph: reads of unwritten elements,
   reductions that count an input twice or combine scaled values are errors;
7. every rank's final ``out`` equals buffer_layout's required table exactly (as multisets;
   ``avg`` and neighbor_average need a Scale by the contributor count).
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any

from .errors import VerifyError
from .plan import (
    neighbor_peers,
    BUFFERS,
    DTYPE_SIZES,
    KINDS,
    OPS,
    REDUCING_KINDS,
    ROOTED_KINDS,
    ChunkRef,
    Copy,
    Plan,
    Recv,
    RecvReduce,
    Reduce,
    Scale,
    Send,
    block_range,
)

MAX_TAG = 1 << 24

__all__ = ["neighbor_peers", "verify"]

Value = Any  # None | tuple[tuple[tuple[int, int], ...], int]


class _Segs:
    """Runs ``[starts[i], starts[i+1])`` of one buffer, each with one value."""

    __slots__ = ("starts", "vals", "length")

    def __init__(self, length: int, val: Any):
        self.starts = [0]
        self.vals = [val]
        self.length = length

    def _cut(self, x: int) -> int:
        """Ensure a run starts at ``x``; return its index (``len`` when ``x`` is the end)."""
        if x >= self.length:
            return len(self.starts)
        i = bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            i += 1
            self.starts.insert(i, x)
            self.vals.insert(i, self.vals[i - 1])
        return i

    def pieces(self, a: int, b: int) -> list[tuple[int, int, Any]]:
        i = bisect_right(self.starts, a) - 1
        out = []
        starts, vals, n = self.starts, self.vals, len(self.starts)
        while i < n and starts[i] < b:
            e = starts[i + 1] if i + 1 < n else self.length
            out.append((max(a, starts[i]), min(b, e), vals[i]))
            i += 1
        return out

    def assign(self, a: int, b: int, pieces: list[tuple[int, int, Any]]) -> None:
        i = self._cut(a)
        j = self._cut(b)
        self.starts[i:j] = [p[0] for p in pieces]
        self.vals[i:j] = [p[2] for p in pieces]
        # merge equal neighbours at the two seams so maps stay as small as the data's runs
        k = i + len(pieces)
        if k < len(self.starts) and k > 0 and self.vals[k] == self.vals[k - 1]:
            del self.starts[k], self.vals[k]
        if i > 0 and i < len(self.starts) and self.vals[i] == self.vals[i - 1]:
            del self.starts[i], self.vals[i]


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
def _check_ops(plan: Plan, sizes: list[dict[str, int]]):
    n = plan.n
    sends: dict[tuple[int, int, int], int] = {}
    recvs: dict[tuple[int, int, int], int] = {}
    ntrees = len(plan.trees)
    for r, prog in enumerate(plan.programs):
        for i, op in enumerate(prog):
            if not isinstance(op, (Send, Recv, RecvReduce, Copy, Reduce, Scale)):
                raise _fail(plan, f"rank {r} op {i} is not a plan op: {op!r}", r, i)
            for d in op.deps:
                if not isinstance(d, int) or not 0 <= d < i:
                    raise _fail(plan, f"{_where(r, i, op)} depends on op {d}, which is not an earlier op of rank {r}", r, i)
            reads, writes = _reads_writes(op)
            for ref in reads + writes:
                size = sizes[r].get(ref.buf)
                if size is None:
                    raise _fail(plan, f"{_where(r, i, op)} names buffer {ref.buf!r} (expected one of {', '.join(BUFFERS)})", r, i)
                if ref.count < 1 or ref.offset < 0 or ref.end > size:
                    raise _fail(plan, f"{_where(r, i, op)}: {_ref(ref)} is outside buffer {ref.buf} of rank {r} ({size} elements)", r, i)
            for ref in writes:
                if ref.buf == "in":
                    raise _fail(plan, f"{_where(r, i, op)} writes the input buffer 'in', which is read-only", r, i)
            if isinstance(op, (Copy, Reduce)):
                if op.src.count != op.dst.count:
                    raise _fail(plan, f"{_where(r, i, op)}: source and destination counts differ", r, i)
                same = op.src == op.dst and getattr(op, "roundtrip", False)  # codec round trip in place
                if not same and op.src.buf == op.dst.buf and op.src.offset < op.dst.end and op.dst.offset < op.src.end:
                    raise _fail(plan, f"{_where(r, i, op)}: source and destination overlap", r, i)
            if isinstance(op, Scale) and op.divisor < 1:
                raise _fail(plan, f"{_where(r, i, op)}: divisor must be at least 1", r, i)
            if isinstance(op, (Send, Recv, RecvReduce)):
                if not 0 <= op.peer < n or op.peer == r:
                    raise _fail(plan, f"{_where(r, i, op)}: peer {op.peer} is not another rank (0..{n - 1})", r, i)
                if not 0 <= op.tag < MAX_TAG:
                    raise _fail(plan, f"{_where(r, i, op)}: tag {op.tag} outside [0, 2**24)", r, i)
                if not -1 <= op.tree < ntrees:
                    raise _fail(plan, f"{_where(r, i, op)}: tree {op.tree} does not exist", r, i)
                if isinstance(op, Send):
                    key, table = (r, op.peer, op.tag), sends
                else:
                    key, table = (op.peer, r, op.tag), recvs
                if key in table:
                    raise _fail(plan, f"{_where(r, i, op)} reuses tag {op.tag} between ranks {key[0]} -> {key[1]} (op {table[key]})", r, i)
                table[key] = i
    for key, i in sends.items():
        a, b, tag = key
        op = plan.programs[a][i]
        j = recvs.get(key)
        if j is None:
            raise _fail(plan, f"{_where(a, i, op)} has no matching recv on rank {b}", a, i)
        other = plan.programs[b][j]
        if other.dst.count != op.src.count:
            raise _fail(plan, f"{_where(a, i, op)} sends {op.src.count} elements but its match {_where(b, j, other)} expects {other.dst.count}", a, i)
    for key, j in recvs.items():
        if key not in sends:
            a, b, tag = key
            op = plan.programs[b][j]
            raise _fail(plan, f"{_where(b, j, op)} has no matching send on rank {a}", b, j)
    return sends, recvs


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


def _check_races(plan: Plan, r: int, sizes: dict[str, int]) -> None:
    """Sweep rank ``r``'s ops in program order keeping, per run of elements, the last plain
    writer ``w``, the reductions ``red`` and the readers ``rd`` since. Reductions
    (RecvReduce, Reduce) commute with each other, so they need no order among themselves,
    but every other access must be ordered with each of them."""
    prog = plan.programs[r]
    deps = [op.deps for op in prog]
    maps = {b: _Segs(sizes[b], (-1, (), ())) for b in ("out", "tmp")}

    def check(i: int, targets: tuple[int, ...], ref: ChunkRef, what: str) -> None:
        j = _unordered(deps, targets, i)
        if j is not None:
            raise _fail(plan, f"data race on rank {r}: {_where(r, i, prog[i])} {what} "
                              f"{ref.buf} elements also touched by op {j} ({_describe(prog[j])}) "
                              f"without a dependency between them", r, i)

    for i, op in enumerate(prog):
        reads, writes = _reads_writes(op)
        for ref in reads:
            if ref.buf == "in":
                continue  # never written (checked above), so reads never race
            segs = maps[ref.buf]
            new = []
            for s, e, (w, red, rd) in segs.pieces(ref.offset, ref.end):
                check(i, ((w,) if w >= 0 else ()) + red, ref, "reads")
                new.append((s, e, (w, red, rd + (i,))))
            segs.assign(ref.offset, ref.end, new)
        commuting = isinstance(op, (RecvReduce, Reduce))
        for ref in writes:
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


# -- 5. deadlock: completes-before graph --------------------------------------------------------
def _order(plan: Plan, sends, recvs) -> list[tuple[int, int]]:
    base = [0]
    for prog in plan.programs:
        base.append(base[-1] + len(prog))
    total = base[-1]
    succ: list[list[int]] = [[] for _ in range(total)]
    indeg = [0] * total
    for r, prog in enumerate(plan.programs):
        b = base[r]
        for i, op in enumerate(prog):
            for d in op.deps:
                succ[b + d].append(b + i)
                indeg[b + i] += 1
    for (a, bb, tag), i in sends.items():
        j = recvs[(a, bb, tag)]
        s, v = base[a] + i, base[bb] + j
        succ[s].append(v)
        indeg[v] += 1
        for d in plan.programs[bb][j].deps:  # rendezvous: the send completes after the recv is posted
            succ[base[bb] + d].append(s)
            indeg[s] += 1
    rank_of = []
    for r, prog in enumerate(plan.programs):
        rank_of.extend([r] * len(prog))
    ready = [x for x in range(total) if indeg[x] == 0]
    order: list[tuple[int, int]] = []
    while ready:
        x = ready.pop()
        r = rank_of[x]
        order.append((r, x - base[r]))
        for y in succ[x]:
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    if len(order) < total:
        # report an op on the cycle: walk back along unfinished predecessors until one repeats
        pred: dict[int, int] = {}
        for x in range(total):
            if indeg[x] > 0:
                for y in succ[x]:
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
    return order


# -- 6. symbolic execution ---------------------------------------------------------------------
def _shift(val: Value, delta: int) -> Value:
    if val is None or delta == 0:
        return val
    terms, div = val
    return tuple((q, s + delta) for q, s in terms), div


def _union(a: Value, b: Value) -> tuple[Value, str]:
    """Combine two values with the reduction; returns ``(value, "")`` or ``(None, why)``."""
    if a is None or b is None:
        return None, "combines elements that were never written"
    if a[1] != 1 or b[1] != 1:
        return None, "reduces a value that was already scaled"
    ta, tb = a[0], b[0]
    if not set(ta).isdisjoint(tb):
        q = next(t for t in ta if t in set(tb))[0]
        return None, f"counts rank {q}'s input twice (double-counted reduction)"
    return (tuple(sorted(ta + tb)), 1), ""


def _execute(plan: Plan, order: list[tuple[int, int]], sizes: list[dict[str, int]]) -> list[_Segs]:
    n = plan.n
    mem = []
    for r in range(n):
        mem.append({
            "in": _Segs(sizes[r]["in"], (((r, 0),), 1)),
            "out": _Segs(sizes[r]["out"], None),
            "tmp": _Segs(sizes[r]["tmp"], None),
        })
    inflight: dict[tuple[int, int, int], tuple[int, list]] = {}

    def read(r: int, i: int, op: Any, ref: ChunkRef) -> list:
        ps = mem[r][ref.buf].pieces(ref.offset, ref.end)
        for s, e, v in ps:
            if v is None:
                raise _fail(plan, f"{_where(r, i, op)} reads {ref.buf}[{s}:{e}] of rank {r} before anything was written there", r, i)
        return ps

    def put(r: int, i: int, op: Any, dst: ChunkRef, src_off: int, ps: list, reduce: bool) -> None:
        delta = src_off - dst.offset
        incoming = [(s - delta, e - delta, _shift(v, delta)) for s, e, v in ps]
        segs = mem[r][dst.buf]
        if not reduce:
            segs.assign(dst.offset, dst.end, incoming)
            return
        have = segs.pieces(dst.offset, dst.end)
        out, a, b = [], 0, 0
        pos = dst.offset
        while pos < dst.end:
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
        segs.assign(dst.offset, dst.end, out)

    for r, i in order:
        op = plan.programs[r][i]
        if isinstance(op, Send):
            inflight[(r, op.peer, op.tag)] = (op.src.offset, read(r, i, op, op.src))
        elif isinstance(op, (Recv, RecvReduce)):
            src_off, ps = inflight.pop((op.peer, r, op.tag))
            put(r, i, op, op.dst, src_off, ps, isinstance(op, RecvReduce))
        elif isinstance(op, (Copy, Reduce)):
            put(r, i, op, op.dst, op.src.offset, read(r, i, op, op.src), isinstance(op, Reduce))
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
def _required(plan: Plan, r: int) -> list[tuple[int, int, Value]] | None:
    """Required runs of rank ``r``'s ``out`` (buffer_layout's table), or None: unspecified."""
    n, E, kind, root = plan.n, plan.elems, plan.kind, plan.root
    div = n if plan.op == "avg" else 1
    everyone = tuple((q, 0) for q in range(n))
    if kind == "broadcast":
        return [(0, E, (((root, 0),), 1))]
    if kind in ("reduce", "allreduce"):
        if kind == "reduce" and r != root:
            return None
        return [(0, E, (everyone, div))]
    if kind in ("allgather", "gather"):
        if kind == "gather" and r != root:
            return None
        return [(lo, hi, (((j, -lo),), 1)) for j in range(n) for lo, hi in [block_range(E, n, j)]]
    lo, hi = block_range(E, n, r)
    if kind == "reduce_scatter":
        return [(0, hi - lo, (tuple((q, lo) for q in range(n)), div))]
    if kind == "scatter":
        return [(0, hi - lo, (((root, lo),), 1))]
    if kind == "alltoall":
        w = E // n
        return [(j * w, (j + 1) * w, (((j, (r - j) * w),), 1)) for j in range(n)]
    raise ValueError(kind)


def _show(val: Value, s: int, e: int) -> str:
    if val is None:
        return "never written"
    terms, div = val
    if len(terms) == 1:
        q, sh = terms[0]
        txt = f"rank {q}'s in[{s + sh}:{e + sh}]"
    else:
        qs = sorted({q for q, _ in terms})
        shown = ", ".join(map(str, qs[:8])) + (", ..." if len(qs) > 8 else "")
        same = len({sh for _, sh in terms}) == 1
        txt = f"the reduction of {len(terms)} inputs (ranks {shown}{'' if same else ', at differing offsets'})"
    return txt + (f" / {div}" if div != 1 else "")


def _check_final(plan: Plan, r: int, out: _Segs) -> None:
    name = plan.ranks[r]
    if plan.kind == "neighbor_average":
        exact = None if plan.peers == "shift_one" else set(neighbor_peers(plan.peers, plan.n, r))
        for s, e, v in out.pieces(0, out.length):
            ok = v is not None and all(sh == 0 for _, sh in v[0])
            if ok:
                qs = [q for q, _ in v[0]]
                others = set(qs) - {r}
                ok = (r in qs and len(set(qs)) == len(qs) and v[1] == len(qs)
                      and (others == exact if exact is not None else len(others) == 1))
            if not ok:
                raise _fail(plan, f"rank {r} ({name}) ends with out[{s}:{e}] = {_show(v, s, e)}, but "
                                  f"neighbor_average (peers = {plan.peers}) requires the mean of its own "
                                  f"input and its peers' inputs", r)
        return
    req = _required(plan, r)
    if req is None:
        return
    for lo, hi, want in req:
        if hi <= lo:
            continue
        for s, e, v in out.pieces(lo, hi):
            if v != want:
                raise _fail(plan, f"rank {r} ({name}) ends with out[{s}:{e}] = {_show(v, s, e)}, but "
                                  f"{plan.kind} requires {_show(want, s, e)}", r)


def verify(plan: Plan) -> None:
    """Raise :class:`VerifyError` unless ``plan`` is consistent, deadlock-free and leaves
    every rank's ``out`` exactly as its collective requires (see the module docstring)."""
    _check_header(plan)
    sizes = [plan.buffer_elems(r) for r in range(plan.n)]
    sends, recvs = _check_ops(plan, sizes)
    for r in range(plan.n):
        _check_races(plan, r, sizes[r])
    order = _order(plan, sends, recvs)
    outs = _execute(plan, order, sizes)
    for r, out in enumerate(outs):
        _check_final(plan, r, out)
