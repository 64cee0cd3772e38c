"""hcc.backends.executor — interpret a verified plan on one rank over any Transport.

One executor serves every backend (design.md "Runtime"); a backend only moves bytes.

Model (ir/plan.py): ``programs[rank]`` is a dataflow graph. An op is *posted* once every op in
its ``deps`` has *completed*. The executor
1. posts every op without deps at once (all Recvs and RecvReduces of the first chunks are
   therefore outstanding before any byte arrives);
2. loops on ``Transport.wait_any`` over the outstanding requests, with the per-wait deadline;
3. when a request completes, completes its op (a RecvReduce reduces its staged chunk into
   ``dst`` with numpy, in place) and immediately posts every op that became ready — so a chunk
   received from a parent is forwarded to the children in the same turn of the loop: a tree
   of depth d costs about one chunk time per level, not one buffer time (fine-grained
   pipelining, design.md), and the ops of several trees interleave freely.
Local ops (Copy, Reduce, Scale) run when posted and complete at once.

Zero copy: Sends and Recvs hand the transport memoryviews of the rank's numpy buffers; the
only copies are a RecvReduce's staging chunk (the bytes must land somewhere before they are
combined) and, for compressed plans, the encoded wire chunk. Staging chunks come from the
process-wide :class:`~.kernels.StagingPool` (a fresh ``np.empty`` of 16 MiB is a new mmap
whose 4096 pages fault in while the socket fills them, every run).

Fused receive-and-reduce: when the transport offers ``irecv_fold(peer, tag, nbytes, fold)``
(the sockets transport does; the others do not, and keep the staged path above), a
RecvReduce posts that instead of a staged receive: the transport's receiving thread calls
``fold(offset, piece)`` for each piece of the message (256 KiB) as it lands, and the fold
reduces the piece into its slice of ``dst`` while it is in cache — the reduction of a chunk
overlaps its own transfer, and no staging chunk is written and read back. The transport
never learns what the fold computes. Measured (4 ranks, 64 MiB ring allreduce, CPU seconds
of all ranks per iteration, same run): 260 → 233 ms with one 16 MiB chunk per ring step,
287 → 272 ms with 1 MiB chunks; gloo 233 ms. All reductions of a run (folds in reader
threads, Reduce ops and staged RecvReduces in this thread) hold one lock: a plan may leave
reductions into one block unordered (a direct allreduce posts n−1 of them at once).

Start order: the ops ready at the start are posted receives first (an early frame then finds
its receive posted: no holding copy), then local ops that other ops wait for (a direct
allreduce's Copy that its RecvReduces depend on), then sends, then local ops nothing waits
for (a broadcast root's Copy(in → out): 16 MiB of memcpy, ~3 ms, that no transfer needs, so
it no longer delays the root's first sends). Any order of ready ops is correct; this one
only changes what happens first.

Copy fusion: a ``Copy(in → d)`` whose only dependent is a ``RecvReduce`` into exactly ``d``
(how the compiler starts a ring allreduce's reduce-scatter) is not executed; the RecvReduce
computes ``d = in (op) received`` in one pass instead (:func:`~.kernels.combine_into`). Sound
because ``in`` is never written by a plan and nothing else depends on the Copy, so no other
op may read ``d`` before the RecvReduce completes (it would race in the plan itself).

Deadlines: every ``wait_any`` gets the per-wait ``timeout``; when it expires the executor
raises :class:`CollectiveTimeout` naming this rank, the peer and the op/tree/chunk of the
oldest outstanding receive (or send). A dead peer surfaces as :class:`RankFailed` (or
:class:`RootFailed`) naming it. Never a hang.

The per-rank state lives in :class:`RankExecution`, whose ``pending``/``ready`` sets are
explicit, so a later repair step can replace the remaining ops of a rank (design.md
"Adaptive hooks") without re-running completed ones.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.plan import Copy, Plan, Recv, RecvReduce, Reduce, Scale, Send
from .base import CollectiveTimeout, PeerFailed, RankFailed, RootFailed, RuntimeFault, Transport
from .kernels import STAGING, combine_into, np_dtype, reduce_into, scale_into

__all__ = ["run", "RankExecution", "InputMismatch", "UnknownOption", "CodecUnavailable"]

# Options the executor understands; unknown ones are rejected (a later issue adds quorum etc.).
KNOWN_OPTIONS: frozenset[str] = frozenset()


class InputMismatch(RuntimeFault, ValueError):
    """The caller's array does not have the plan's dtype or element count."""


class UnknownOption(RuntimeFault, TypeError):
    """``run`` got an option it does not know."""


class CodecUnavailable(RuntimeFault):
    """A compressed plan, but hcc.backends.codecs is missing or has no codec for it."""


def _as_flat(array: Any, want_dtype: np.dtype, count: int, what: str, writable: bool) -> np.ndarray:
    """A 1-D numpy view of ``array`` (ndarray or buffer-protocol object) — checked, no copy."""
    try:
        arr = array if isinstance(array, np.ndarray) else np.asarray(array)
    except Exception as e:  # an object numpy cannot view: say what was given
        raise InputMismatch(f"{what}: cannot view a {type(array).__name__} as an array ({e})") from None
    if arr.dtype != want_dtype:
        raise InputMismatch(
            f"{what}: dtype {arr.dtype} does not match the plan's {want_dtype}"
            + (" (bfloat16 is passed as uint16 bits)" if want_dtype == np.uint16 else "")
        )
    if arr.size != count:
        raise InputMismatch(f"{what}: {arr.size} elements (shape {arr.shape}), the plan needs {count}")
    if not arr.flags.c_contiguous:
        raise InputMismatch(f"{what}: the array must be C-contiguous (use np.ascontiguousarray)")
    if writable and not arr.flags.writeable:
        raise InputMismatch(f"{what}: the array is read-only")
    return arr.reshape(-1)


@dataclass
class _Pending:
    op: int
    request: Any
    staging: np.ndarray | None = None  # RecvReduce chunk, or encoded wire bytes


class RankExecution:
    """The state of one rank's program during a run (see the module docstring)."""

    def __init__(self, plan: Plan, comm: Transport, program, bufs: dict[str, np.ndarray],
                 timeout: float, codec=None):
        self.plan, self.comm, self.program, self.bufs = plan, comm, program, bufs
        self.timeout, self.codec = timeout, codec
        self.rank = comm.rank
        self.op_name = plan.op or "sum"
        # the optional fused receive-and-reduce of the transport (SocketTransport.irecv_fold);
        # compressed plans decode whole chunks, so they keep the staged path
        self.fold_recv = getattr(comm, "irecv_fold", None) if codec is None else None
        # Reductions are the one kind of write a plan may leave unordered: a direct allreduce
        # posts three RecvReduces into the same block at once. Folded in the readers of three
        # connections they would race (numpy drops the GIL in the loop), so every reduction
        # of this run — folds and the main thread's Reduce ops — holds this lock.
        self.reduce_lock = threading.Lock()
        n_ops = len(program)
        self.missing = [len(op.deps) for op in program]  # deps not yet completed
        self.dependents: list[list[int]] = [[] for _ in range(n_ops)]
        for i, op in enumerate(program):
            for d in op.deps:
                if not 0 <= d < i:
                    raise RuntimeFault(f"rank {self.rank}: op {i} depends on op {d}, not an earlier op")
                self.dependents[d].append(i)
        self.completed = 0
        self.pending: dict[int, _Pending] = {}  # id(request) -> the transfer it carries
        # Copy fusion (module docstring): RecvReduce index -> the Copy source it starts from
        self.fused: dict[int, Any] = {}
        self.skip_copy: set[int] = set()  # the Copies fused away
        inp, outp = bufs.get("in"), bufs.get("out")
        aliased = inp is not None and outp is not None and np.may_share_memory(inp, outp)
        if codec is None and not aliased:  # an in-place call (out is the input) writes "in"
            for k, op in enumerate(program):
                if (isinstance(op, Copy) and not getattr(op, "roundtrip", False) and op.src.buf == "in"
                        and len(self.dependents[k]) == 1):
                    j = self.dependents[k][0]
                    nxt = program[j]
                    if isinstance(nxt, RecvReduce) and nxt.dst == op.dst and j not in self.fused:
                        self.fused[j] = op.src
                        self.skip_copy.add(k)

    # -- buffers -------------------------------------------------------------------------
    def view(self, ref) -> np.ndarray:
        buf = self.bufs[ref.buf]
        if ref.offset < 0 or ref.end > buf.size:
            raise RuntimeFault(
                f"rank {self.rank}: range {ref.buf}[{ref.offset}:{ref.end}] outside the buffer of {buf.size}"
            )
        return buf[ref.offset:ref.end]

    @staticmethod
    def _bytes(arr: np.ndarray) -> memoryview:
        return memoryview(arr).cast("B")

    # -- posting and completing -------------------------------------------------------------
    def post(self, i: int) -> None:
        """Post op ``i``; local ops complete (and release their dependents) at once."""
        stack = [i]
        while stack:
            k = stack.pop()
            op = self.program[k]
            if isinstance(op, Send):
                src = self.view(op.src)
                if self.codec is None:
                    self._add(_Pending(k, self.comm.isend(op.peer, op.tag, self._bytes(src))))
                else:
                    wire = np.empty(self.codec.wire_nbytes(src.size), dtype=np.uint8)
                    self.codec.encode(src, wire)
                    self._add(_Pending(k, self.comm.isend(op.peer, op.tag, memoryview(wire)), wire))
                continue
            if isinstance(op, (Recv, RecvReduce)):
                dst = self.view(op.dst)
                if self.codec is not None:
                    wire = np.empty(self.codec.wire_nbytes(dst.size), dtype=np.uint8)
                    self._add(_Pending(k, self.comm.irecv(op.peer, op.tag, memoryview(wire)), wire))
                elif isinstance(op, Recv):
                    self._add(_Pending(k, self.comm.irecv(op.peer, op.tag, self._bytes(dst))))
                elif self.fold_recv is not None:
                    self._add(_Pending(k, self.fold_recv(op.peer, op.tag, dst.nbytes, self._folder(k, dst))))
                else:
                    staging = STAGING.take(dst.size, dst.dtype)
                    self._add(_Pending(k, self.comm.irecv(op.peer, op.tag, self._bytes(staging)), staging))
                continue
            if isinstance(op, Copy):
                if k in self.skip_copy:
                    pass  # fused into the RecvReduce that depends on it (module docstring)
                elif getattr(op, "roundtrip", False) and self.codec is not None:
                    # dst := decode(encode(src)): the value a receiver of src gets, so the
                    # owner of a compressed block keeps exactly what it sent (ir/plan.py Copy)
                    src = self.view(op.src)
                    wire = np.empty(self.codec.wire_nbytes(src.size), dtype=np.uint8)
                    self.codec.encode(src, wire)
                    self.codec.decode(wire, self.view(op.dst))
                else:
                    self.view(op.dst)[...] = self.view(op.src)
            elif isinstance(op, Reduce):
                with self.reduce_lock:
                    reduce_into(self.op_name, self.plan.dtype, self.view(op.dst), self.view(op.src))
            elif isinstance(op, Scale):
                scale_into(self.plan.dtype, self.view(op.dst), op.divisor)
            else:
                raise RuntimeFault(f"rank {self.rank}: op {k} has unknown type {type(op).__name__}")
            stack.extend(self._complete(k))

    def _folder(self, k: int, dst: np.ndarray):
        """The fold of RecvReduce ``k`` for :meth:`irecv_fold` transports: reduce each received
        piece into its slice of ``dst`` (from the fused Copy's source when there is one)."""
        src = self.fused.get(k)
        a = dst if src is None else self.view(src)
        op_name, dtype_name, dt = self.op_name, self.plan.dtype, dst.dtype
        size, lock = dt.itemsize, self.reduce_lock

        def fold(offset: int, piece: memoryview) -> None:
            lo = offset // size
            hi = lo + piece.nbytes // size
            with lock:
                combine_into(op_name, dtype_name, dst[lo:hi], a[lo:hi], np.frombuffer(piece, dtype=dt))

        return fold

    def _start_rank(self, i: int) -> int:
        kind = type(self.program[i])
        if kind in (Recv, RecvReduce):
            return 0
        if kind is Send:
            return 2
        return 1 if self.dependents[i] else 3

    def _add(self, p: _Pending) -> None:
        self.pending[id(p.request)] = p

    def _complete(self, k: int) -> list[int]:
        self.completed += 1
        ready = []
        for j in self.dependents[k]:
            self.missing[j] -= 1
            if self.missing[j] == 0:
                ready.append(j)
        return ready

    def _finish_transfer(self, p: _Pending) -> None:
        op = self.program[p.op]
        if isinstance(op, Recv) and self.codec is not None:
            self.codec.decode(p.staging, self.view(op.dst))
        elif isinstance(op, RecvReduce):
            dst = self.view(op.dst)
            if self.codec is not None:
                tmp = np.empty(dst.size, dtype=dst.dtype)
                self.codec.decode(p.staging, tmp)
                reduce_into(self.op_name, self.plan.dtype, dst, tmp)
            elif p.staging is not None:  # else the transport folded it while receiving
                src = self.fused.get(p.op)
                with self.reduce_lock:
                    if src is None:
                        reduce_into(self.op_name, self.plan.dtype, dst, p.staging)
                    else:
                        combine_into(self.op_name, self.plan.dtype, dst, self.view(src), p.staging)
                STAGING.give(p.staging)
        for j in self._complete(p.op):
            self.post(j)

    # -- the loop -----------------------------------------------------------------------
    def describe(self, k: int) -> str:
        op = self.program[k]
        kind = type(op).__name__
        if not isinstance(op, (Send, Recv, RecvReduce)):
            return f"op {k} {kind}"
        where = f"op {k} {kind} tag {op.tag}"
        if op.tree >= 0:
            where += f", tree {op.tree} chunk {op.chunk}"
        return where

    def _blame(self) -> _Pending:
        """The outstanding transfer to name in a timeout: the oldest receive, else send."""
        pend = list(self.pending.values())
        recvs = [p for p in pend if not isinstance(self.program[p.op], Send)]
        return min(recvs or pend, key=lambda p: p.op)

    def execute(self) -> None:
        fast = getattr(self.comm, "wait_completed", None)
        if fast is not None:
            self.comm.track_completions(True)
        try:
            self._execute(fast)
        finally:
            if fast is not None:
                self.comm.track_completions(False)

    def _execute(self, fast) -> None:
        # the ops ready at the start (module docstring, "Start order")
        first = [i for i, m in enumerate(self.missing) if m == 0]  # snapshot: posting releases more
        first.sort(key=self._start_rank)
        for i in first:
            self.post(i)
        n_ops = len(self.program)
        while self.pending:
            try:
                if fast is not None:
                    # transports that queue completions: O(completed) per wake-up
                    batch = [self.pending.pop(id(r)) for r in fast(self.timeout) if id(r) in self.pending]
                else:
                    pend = list(self.pending.values())
                    done = self.comm.wait_any([p.request for p in pend], self.timeout)
                    if not done:
                        raise RuntimeFault(f"rank {self.rank}: transport {self.comm.name!r} returned no completion")
                    batch = [pend[i] for i in sorted(set(done))]
                    for p in batch:
                        del self.pending[id(p.request)]
            except CollectiveTimeout:
                p = self._blame()
                op = self.program[p.op]
                raise CollectiveTimeout(self.rank, op.peer, self.describe(p.op), self.timeout) from None
            except PeerFailed as e:
                waiting = [p for p in self.pending.values() if self.program[p.op].peer == e.peer]
                detail = "while waiting on " + self.describe((waiting or [self._blame()])[0].op)
                if e.detail:
                    detail += f"; {e.detail}"
                cls = RootFailed if (e.peer == self.plan.root and self.plan.root >= 0) else RankFailed
                raise cls(e.peer, by=self.rank, detail=detail) from None
            for p in batch:
                self._finish_transfer(p)
        if self.completed != n_ops:
            stuck = [i for i, m in enumerate(self.missing) if m > 0][:1]
            raise RuntimeFault(
                f"rank {self.rank}: {n_ops - self.completed} ops never became ready "
                f"(first: {self.describe(stuck[0]) if stuck else '?'}); is the plan verified?"
            )


def _programs(plan: Plan, step: int):
    if plan.kind == "neighbor_average" and step != 0:
        from ..compiler.lower_relax import programs_for_step

        return programs_for_step(plan, step)
    return plan.programs


def _codec(plan: Plan):
    if plan.compress in (None, "none"):
        return None
    try:
        from . import codecs
    except ImportError as e:
        raise CodecUnavailable(
            f"plan {plan.name!r} uses compress = {plan.compress}, but hcc.backends.codecs is not available ({e})"
        ) from None
    codec = codecs.get_codec(plan.compress, plan.dtype)
    if codec is None:
        raise CodecUnavailable(f"no codec {plan.compress!r} for dtype {plan.dtype}")
    return codec


def _adaptive_module():
    """hcc.backends.adaptive when it is installed (it is another part's module)."""
    try:
        from . import adaptive
    except ImportError:
        return None
    return adaptive


def caller_buffers(plan: Plan, comm: Transport, array: Any, out: Any, timeout: float, *,
                   zero_fill: bool = False) -> tuple[int, np.ndarray, np.ndarray, Any]:
    """Check the communicator and the caller's arrays against ``plan`` before any byte moves,
    for every executor (static here, adaptive in adaptive.py). Returns ``(rank, in, out, result)``:
    flat views of the input and output buffers, and what ``run`` returns — ``out`` when the
    caller gave one, else a new array shaped like the input when the sizes agree.
    ``zero_fill``: a new output starts as zeros (the adaptive runtime leaves missing blocks 0)."""
    rank = comm.rank
    if not 0 <= rank < plan.n:
        raise InputMismatch(f"rank {rank} is outside the plan's {plan.n} ranks")
    if getattr(comm, "world", plan.n) != plan.n:
        raise InputMismatch(f"the communicator has {comm.world} ranks, the plan {plan.n}")
    if not timeout > 0:
        raise InputMismatch(f"timeout must be positive, not {timeout!r}")
    dtype = np_dtype(plan.dtype)
    sizes = plan.buffer_elems(rank)
    if array is None:
        inp, shape = np.zeros(sizes["in"], dtype=dtype), None
    else:
        inp = _as_flat(array, dtype, sizes["in"], f"rank {rank} input", writable=False)
        shape = np.shape(array)
    if out is None:
        result = (np.zeros if zero_fill else np.empty)(sizes["out"], dtype=dtype)
        out_flat = result
        if shape is not None and sizes["out"] == sizes["in"]:
            result = result.reshape(shape)
    else:
        out_flat = _as_flat(out, dtype, sizes["out"], f"rank {rank} output", writable=True)
        result = out
    return rank, inp, out_flat, result


def run(plan: Plan, comm: Transport, array=None, *, out=None, timeout: float = 60.0, step: int = 0,
        **options) -> np.ndarray:
    """Run ``plan`` on rank ``comm.rank``; returns ``out`` (allocated when not given).

    ``array``: this rank's input, ``plan.buffer_elems(rank)["in"]`` elements of the plan's dtype
    (numpy storage dtype: bfloat16 as uint16), any shape, C-contiguous; ``None`` means zeros
    (for ranks whose input the collective ignores, e.g. non-roots of a broadcast). ``out``:
    optional preallocated output of ``buffer_elems(rank)["out"]`` elements. ``timeout``: the
    deadline of every wait, in seconds. ``step``: the training step (``neighbor_average``
    with ``peers = shift_one`` changes partners every step). Every check happens before any
    byte moves.
    """
    comm.bind_plan(plan.wire_id(), plan.largest_message_bytes())
    adaptive = _adaptive_module()
    if adaptive is not None and adaptive.wants(plan, comm, options):
        # on_failure = continue, adaptive = on, or a quorum: the adaptive runtime (issue 4)
        # runs the plan's trees itself and survives deaths; this executor aborts on them
        return adaptive.run(plan, comm, array, out=out, timeout=timeout, step=step, **options)
    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        raise UnknownOption(
            f"unknown run option(s) {', '.join(unknown)}"
            + (f" (known: {', '.join(sorted(KNOWN_OPTIONS))})" if KNOWN_OPTIONS else " (none are defined)")
        )
    rank, inp, out_flat, result = caller_buffers(plan, comm, array, out, timeout)
    dtype, sizes = np_dtype(plan.dtype), plan.buffer_elems(rank)
    program = _programs(plan, step)[rank]
    codec = _codec(plan)
    bufs = {"in": inp, "out": out_flat, "tmp": np.empty(sizes["tmp"], dtype=dtype)}
    RankExecution(plan, comm, program, bufs, float(timeout), codec).execute()
    return result
