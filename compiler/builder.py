"""hcc.compiler.builder — building per-rank chunk programs: the op builder every lowering
shares (compiler/lower.py, the timed scheduler compiler/schedule.py, and the schedules built
op by op: baselines, hier, channels, ringpack).

Terms
- program: one rank's op list of the plan IR (ir/plan.py); an op's ``deps`` are indices into
  the same rank's list.
- message: a matched Send on the sending rank and Recv (or RecvReduce) on the receiving one,
  tagged per ordered pair ``(src, dst)`` from 0 upward, so tags are unique per pair and small
  (``< MAX_TAG``, ir/plan.py) (:class:`ProgramBuilder`).
- span: the element range a tree carries, a share of the data proportional to its rate
  (:func:`split_by_rate`); :class:`Spans` finds a rank's ops by the ranges they touch.
- lowering run (:class:`_Lowering`): the builder plus the collective's constants, with the
  per-chunk steps of an out-tree (broadcast) and an in-tree (reduction) that lower.py and
  schedule.py both emit.

Its own module so that lower.py (which hands the timed order to schedule.py) and schedule.py
(which emits through the same builder) import it, not each other.
"""
from __future__ import annotations

import bisect
from typing import Sequence

from ..ir.errors import PlanError
from ..ir.plan import (
    DTYPE_SIZES,
    ChunkRef,
    Copy,
    Op,
    Recv,
    RecvReduce,
    Scale,
    Send,
    block_range,
)
from .trees import TreeShape

__all__ = ["MAX_TAG", "ProgramBuilder", "Spans", "plan_op", "split_by_rate"]

MAX_TAG = 1 << 24


def split_by_rate(lo: int, hi: int, rates: Sequence[float]) -> list[tuple[int, int]]:
    """Split ``[lo, hi)`` into consecutive ranges proportional to ``rates`` (cumulative floor,
    so the parts tile the range exactly). Non-positive total rate splits evenly.

    >>> split_by_rate(0, 10, [3.0, 1.0])
    [(0, 7), (7, 10)]
    """
    total = float(sum(rates))
    weights = list(rates) if total > 0 else [1.0] * len(rates)
    total = float(sum(weights))
    out, acc, start = [], 0.0, lo
    for i, w in enumerate(weights):
        acc += w
        end = hi if i == len(weights) - 1 else lo + int((hi - lo) * acc / total)
        end = max(start, min(hi, end))
        out.append((start, end))
        start = end
    return out



def _deps(*xs: int | None) -> tuple[int, ...]:
    return tuple(sorted({x for x in xs if x is not None}))


def plan_op(kind: str, op: str | None) -> str | None:
    """The plan's reduction op: the spec's (default sum) for reducing kinds, ``avg`` for
    neighbor_average, ``None`` otherwise."""
    if kind in ("reduce", "allreduce", "reduce_scatter"):
        return op or "sum"
    if kind == "neighbor_average":
        return "avg"
    return None


_new = object.__new__


def _message_op(cls, peer: int, tag: int, ref: ChunkRef, deps: tuple[int, ...], tree: int, chunk: int):
    """``cls(peer, tag, ref, deps, tree, chunk)`` for Send, Recv and RecvReduce, built by
    filling the instance dict: a frozen dataclass's ``__init__`` sets each of the six fields
    through ``object.__setattr__``, and at a million messages per 1024-rank candidate that
    was a third of the lowering. The value is the same (equality, hash and repr read the
    fields); the three classes have no ``__post_init__``.

    >>> _message_op(Send, 1, 0, ChunkRef("in", 0, 4), (), -1, -1) == Send(1, 0, ChunkRef("in", 0, 4))
    True
    """
    op = _new(cls)
    d = op.__dict__
    d["peer"] = peer
    d["tag"] = tag
    d["src" if cls is Send else "dst"] = ref
    d["deps"] = deps
    d["tree"] = tree
    d["chunk"] = chunk
    return op


class ProgramBuilder:
    """Per-rank op lists under construction, with per-pair tag counters and tmp sizing."""

    def __init__(self, n: int):
        self.n = n
        self.programs: list[list[Op]] = [[] for _ in range(n)]
        self.tmp_end = [0] * n
        self._tags: dict[tuple[int, int], int] = {}

    def add(self, rank: int, op: Op) -> int:
        prog = self.programs[rank]
        prog.append(op)
        for ref in _refs(op):
            if ref.buf == "tmp" and ref.end > self.tmp_end[rank]:
                self.tmp_end[rank] = ref.end
        return len(prog) - 1

    def message(
        self,
        src: int,
        dst: int,
        src_ref: ChunkRef,
        dst_ref: ChunkRef,
        *,
        send_deps: tuple[int, ...] = (),
        recv_deps: tuple[int, ...] = (),
        reduce: bool = False,
        tree: int = -1,
        chunk: int = -1,
    ) -> tuple[int, int]:
        """Add a matched Send (on ``src``) and Recv/RecvReduce (on ``dst``); return their
        indices in the two programs."""
        key = (src, dst)
        tag = self._tags.get(key, 0)
        if tag >= MAX_TAG:
            raise PlanError(f"more than {MAX_TAG} messages from rank {src} to rank {dst}; use larger chunks")
        self._tags[key] = tag + 1
        # the hot path of lowering (34 000 messages for a DGX-1 broadcast candidate): append
        # directly, since the one ref of each op is known here (add() would look it up)
        tmp_end = self.tmp_end
        for rank, ref in ((src, src_ref), (dst, dst_ref)):
            if ref.buf == "tmp" and ref.end > tmp_end[rank]:
                tmp_end[rank] = ref.end
        ps, pr = self.programs[src], self.programs[dst]
        ps.append(_message_op(Send, dst, tag, src_ref, send_deps, tree, chunk))
        pr.append(_message_op(RecvReduce if reduce else Recv, src, tag, dst_ref, recv_deps, tree, chunk))
        return len(ps) - 1, len(pr) - 1

    def finish(self) -> tuple[tuple[tuple[Op, ...], ...], tuple[int, ...]]:
        return tuple(tuple(p) for p in self.programs), tuple(self.tmp_end)


def _refs(op: Op) -> tuple[ChunkRef, ...]:
    if isinstance(op, Send):
        return (op.src,)
    if isinstance(op, (Recv, RecvReduce, Scale)):
        return (op.dst,)
    return (op.src, op.dst)


class _Lowering:
    """One lowering run: the builder plus the collective's constants."""

    def __init__(self, spec: Any, ce: int):
        self.spec = spec
        self.n = len(spec.ranks)
        self.E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
        self.ce = ce
        self.op = plan_op(spec.kind, spec.op)
        self.B = ProgramBuilder(self.n)
        # trees a schedule added to the given ones (schedule.DRAIN_TREE), recorded in the plan
        self.drain_shapes: list = []

    def block(self, j: int) -> tuple[int, int]:
        return block_range(self.E, self.n, j)

    # -- out-tree: one chunk from the root to every rank -------------------------------
    def bcast_chunk(self, t: int, k: int, sh: TreeShape, root_src: ChunkRef, dst: ChunkRef,
                    root_ready: tuple[int, ...], wait_for: dict[int, int] | None = None
                    ) -> dict[int, tuple[int, ...]]:
        """Returns, per rank, the ops after which it holds the chunk."""
        B = self.B
        have: dict[int, tuple[int, ...]] = {sh.root: root_ready}
        src = {sh.root: root_src}
        for r in sh.order:
            for c in sh.children[r]:
                rd = _deps(wait_for.get(c)) if wait_for else ()
                _, rv = B.message(r, c, src[r], dst, send_deps=have[r], recv_deps=rd,
                                  tree=t, chunk=k)
                have[c], src[c] = (rv,), dst
        return have

    # -- in-tree: one chunk reduced from every rank to the root -------------------------
    def reduce_chunk(self, t: int, k: int, sh: TreeShape, a: int, b: int, dst_of,
                     gate: dict[int, tuple[int, ...]] | None = None
                     ) -> tuple[ChunkRef, tuple[int, ...], dict[int, int]]:
        """Returns the root's result ref, the ops that complete it, and each non-root's
        Send-up index. The RecvReduces of one rank's children all depend only on its Copy:
        reductions into one range commute (ir/verify.py), so a child's chunk is combined as
        soon as it lands rather than after its siblings'. ``gate[r]``: ops rank ``r`` waits
        for before it starts this chunk (its Copy, or a leaf's Send): a credit window."""
        B = self.B
        cnt = b - a
        inref = ChunkRef("in", a, cnt)
        ready: dict[int, tuple[ChunkRef, tuple[int, ...]]] = {}
        sendup: dict[int, int] = {}
        for r in reversed(sh.order):  # children before parents
            kids = sh.children[r]
            wait = gate.get(r, ()) if gate else ()
            if not kids and r != sh.root:
                ready[r] = (inref, wait)  # a leaf sends its input as is
                continue
            acc = dst_of(r)
            copy = B.add(r, Copy(inref, acc, wait))
            done = []
            for c in kids:
                cref, cdeps = ready[c]
                s, rr = B.message(c, r, cref, acc, send_deps=cdeps, recv_deps=(copy,),
                                  reduce=True, tree=t, chunk=k)
                sendup[c] = s
                done.append(rr)
            ready[r] = (acc, tuple(done) or (copy,))
        acc, last = ready[sh.root]
        if self.op == "avg" and self.n > 1:
            last = (B.add(sh.root, Scale(acc, self.n, last)),)
        return acc, last, sendup


class Spans:
    """Per rank, ops by the element range they concern, queried by overlap."""

    def __init__(self, n: int):
        self.starts: list[list[int]] = [[] for _ in range(n)]
        self.items: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        self.longest = [0] * n

    def add(self, r: int, a: int, b: int, op: int) -> None:
        st = self.starts[r]
        if not st or a >= st[-1]:  # in order, as a lowering mostly adds them: appended
            st.append(a)
            self.items[r].append((a, b, op))
        else:
            k = bisect.bisect_right(st, a)
            st.insert(k, a)
            self.items[r].insert(k, (a, b, op))
        if b - a > self.longest[r]:
            self.longest[r] = b - a

    def over(self, r: int, a: int, b: int) -> tuple[int, ...]:
        """The ops of rank ``r`` whose range overlaps ``[a, b)``, sorted, each once."""
        st = self.starts[r]
        k = bisect.bisect_left(st, a - self.longest[r] + 1)
        end = bisect.bisect_left(st, b, k)  # the ranges starting before b
        if end - k == 1:  # the common case (a lowering's ranges are mostly disjoint chunks)
            y, op = self.items[r][k][1:]
            return (op,) if y > a else ()
        return tuple(sorted({op for _, y, op in self.items[r][k:end] if y > a}))
