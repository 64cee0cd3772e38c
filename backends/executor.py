"""hcc.backends.executor — the static executor: interpret a verified plan on one rank over any
Transport.

One executor serves every backend (design.md "Runtime"); a backend only moves bytes. The
runtime (backends/runtime.py) decides whether a call runs here or in the adaptive runtime.

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

Copy fusion: a ``Copy(in → d)`` whose dependents are all ``RecvReduce`` ops into exactly ``d``
is not executed; the first of them to complete computes ``d = in (op) received`` in one pass
(:func:`~.kernels.combine_into`), the others reduce into ``d`` as usual. A ring allreduce's
reduce-scatter starts with one such RecvReduce; a direct allreduce's own block has n−1 of
them, and those are fused only on the staged path (MPI, Ray's object store), where whole
chunks complete in this thread: a folding transport reduces pieces in reader threads, where
the first piece of a slice cannot know whether another message already started it. Sound
because ``in`` is never written by a plan and nothing else depends on the Copy, so no other
op may read ``d`` before those RecvReduces complete (it would race in the plan itself).
In-place calls (the output is the input) fuse nothing; their ``Copy`` of a slice onto the
same memory (a broadcast root's Copy(in → out)) costs nothing: numpy returns at once when an
assignment's source and destination are the same memory (0.3 us for 16 MiB).

Per-run cost: what does not change between runs of one rank's program (the dependency
lists, the start order, the fused Copies, the op kinds, how far each buffer is reached) is a
:class:`Schedule`, computed once per plan, rank and fusion mode and kept beside the plan
(backends/state.py). A run
checks its buffers against the schedule once; ``view`` then slices without checks. Measured
(4 ranks on 2 cores under MPI, 1 MiB direct allreduce): the Python around each transfer is
most of what separates the executor from the same exchange written inline with mpi4py
(1.1-1.2 ms against 0.7-0.8 ms), because each rank runs on a cache its neighbours just
evicted; with no transport at all a run of that program costs 59 us of Python (67 before).

Deadlines: every ``wait_any`` gets the per-wait ``timeout``; when it expires the executor
raises :class:`CollectiveTimeout` naming this rank, the peer and the op/tree/chunk of the
oldest outstanding receive (or send). A dead peer surfaces as :class:`RankFailed` (or
:class:`RootFailed`) naming it. Never a hang.

Bound runs: over a transport with persistent transfers (MPI), a call that passes ``out`` and
plain numpy arrays is bound once (backends/bound.py: persistent requests on the caller's
memory, kept beside the plan for the last few array sets per rank) and later calls with the
same arrays only start requests and reduce — MPI-4's persistent collectives for any plan.

The per-rank state lives in :class:`RankExecution`, whose ``pending``/``ready`` sets are
explicit, so a later repair step can replace the remaining ops of a rank (design.md
"Adaptive hooks") without re-running completed ones.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import numpy as np

from ..ir.plan import Copy, Plan, Recv, RecvReduce, Reduce, Scale, Send
from .base import CollectiveTimeout, PeerFailed, RankFailed, RootFailed, RuntimeFault, Transport
from .kernels import STAGING, combine_into, np_dtype, reduce_into, scale_into
from .state import state_of

__all__ = ["static_call", "RankExecution", "Schedule", "schedule", "caller_buffers", "InputMismatch",
           "UnknownOption", "CodecUnavailable"]

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


class _Pending:
    """One outstanding transfer: op index, the transport's request, and the RecvReduce's
    staging chunk or the encoded wire bytes (else None)."""

    __slots__ = ("op", "request", "staging")

    def __init__(self, op: int, request: Any, staging: np.ndarray | None = None):
        self.op, self.request, self.staging = op, request, staging


# op kinds, precomputed per op by :func:`schedule` (one tuple index instead of isinstance chains)
SEND, RECV, RECV_REDUCE, COPY, REDUCE, SCALE = range(6)
_KIND = {Send: SEND, Recv: RECV, RecvReduce: RECV_REDUCE, Copy: COPY, Reduce: REDUCE, Scale: SCALE}


@dataclass(frozen=True, eq=False)
class Schedule:
    """What every run of one rank's program needs and no run changes, computed once per
    (plan, rank, fusion mode) by :func:`schedule`: the dependency lists, the start order
    and the fused Copies. A 1 MiB allreduce runs in about a millisecond, and on 4 ranks
    sharing 2 cores each microsecond of Python before the first send is several of wall
    time (measured: the body of ``run`` before the first post took 50-100 us under MPI
    against 12 us alone)."""

    dependents: tuple[tuple[int, ...], ...]
    missing: tuple[int, ...]  # per op: how many deps it waits for
    first: tuple[int, ...]  # the ops without deps, in start order (module docstring)
    fused: dict[int, Any]  # RecvReduce index -> the source of the Copy fused into it
    fuse_group: dict[int, int]  # RecvReduce index -> index of that Copy
    skip_copy: frozenset[int]
    kinds: tuple[int, ...]  # SEND, RECV, ... per op
    extent: dict[str, int]  # per buffer: the end of the furthest range an op touches


def schedule(plan: Plan, rank: int, program, fuse: int) -> Schedule:
    """The :class:`Schedule` of ``program`` (rank ``rank``'s program of ``plan``). ``fuse``:
    0 no Copy fusion (compressed plans, in-place calls: the output is the input, so "in" is
    written); 1 a Copy is fused only into a single dependent RecvReduce (transports that fold
    pieces in reader threads: the first piece of a slice cannot know whether another
    message's piece already started it); 2 also into several RecvReduces of the same block
    (the staged path: whole chunks complete in this thread, the first one starts from the
    source). Kept beside the plan (backends/state.py) for the plan's own step-0 programs; a
    neighbor_average's other steps are computed per call."""
    cache = state_of(plan).schedules
    own = 0 <= rank < len(plan.programs) and program is plan.programs[rank]
    if own and (rank, fuse) in cache:
        return cache[rank, fuse]
    n_ops = len(program)
    dependents: list[list[int]] = [[] for _ in range(n_ops)]
    kinds, extent = [], {}
    for i, op in enumerate(program):
        kind = _KIND.get(type(op))
        if kind is None:
            raise RuntimeFault(f"rank {rank}: op {i} has unknown type {type(op).__name__}")
        kinds.append(kind)
        for ref in (getattr(op, "src", None), getattr(op, "dst", None)):
            if ref is not None:
                if ref.offset < 0:
                    raise RuntimeFault(f"rank {rank}: op {i} range {ref.buf}[{ref.offset}:{ref.end}] starts before the buffer")
                extent[ref.buf] = max(extent.get(ref.buf, 0), ref.end)
        for d in op.deps:
            if not 0 <= d < i:
                raise RuntimeFault(f"rank {rank}: op {i} depends on op {d}, not an earlier op")
            dependents[d].append(i)
    fused: dict[int, Any] = {}
    group: dict[int, int] = {}
    for k, op in enumerate(program):
        if not (fuse and isinstance(op, Copy) and not getattr(op, "roundtrip", False)
                and op.src.buf == "in" and dependents[k]):
            continue
        deps = dependents[k]
        if len(deps) > 1 and fuse < 2:
            continue
        if all(isinstance(program[j], RecvReduce) and program[j].dst == op.dst and j not in fused
               for j in deps):
            for j in deps:
                fused[j], group[j] = op.src, k
    def start_rank(i: int) -> int:
        kind = type(program[i])
        if kind in (Recv, RecvReduce):
            return 0
        if kind is Send:
            return 2
        return 1 if dependents[i] else 3

    first = sorted((i for i, op in enumerate(program) if not op.deps), key=start_rank)
    sched = Schedule(tuple(map(tuple, dependents)), tuple(len(op.deps) for op in program), tuple(first),
                     fused, group, frozenset(group.values()), tuple(kinds), extent)
    if own:
        cache[rank, fuse] = sched
    return sched


def reduce_staged(op_name: str, dtype_name: str, dst: np.ndarray, staging: np.ndarray, src, group,
                  started: set) -> None:
    """Reduce a RecvReduce's staged chunk into ``dst``. With Copy fusion (``src``: the fused
    Copy's source, ``group``: its index) the first of the group to complete computes
    ``dst = src (op) staging`` in one pass and marks the group ``started``; the others, and
    RecvReduces without a fused Copy (``src`` None), reduce in place."""
    if src is None or group in started:
        reduce_into(op_name, dtype_name, dst, staging)
    else:
        combine_into(op_name, dtype_name, dst, src, staging)
        started.add(group)


def _blame_op(kinds, ops) -> int:
    """The outstanding transfer a timeout names: the oldest receive, else the oldest send."""
    recvs = [k for k in ops if kinds[k] != SEND]
    return min(recvs or ops)


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
        # hcc run --trace's wrapper (backends/tracing.py) takes the time of each local op and
        # staged reduction as record_local(op, start, end); None on every other transport
        self.record_local = getattr(comm, "record_local", None)
        # Reductions are the one kind of write a plan may leave unordered: a direct allreduce
        # posts three RecvReduces into the same block at once. Folded in the readers of three
        # connections they would race (numpy drops the GIL in the loop), so every reduction
        # of this run — folds and the main thread's Reduce ops — holds this lock.
        self.reduce_lock = threading.Lock()
        inp, outp = bufs.get("in"), bufs.get("out")
        # an in-place call (out is the input): "in" gets written, so no Copy is fused
        aliased = inp is not None and outp is not None and np.may_share_memory(inp, outp)
        # a transport with a native runner (backends/shm.py) reduces piece by piece, as a fold does
        self.native_run = getattr(comm, "native_run", None) if codec is None else None
        fuse = 0 if codec is not None or aliased else (
            1 if self.fold_recv is not None or self.native_run is not None else 2)
        sched = schedule(plan, comm.rank, program, fuse)
        self.sched = sched
        for name, end in sched.extent.items():  # once per run, so view() needs no check
            size = bufs[name].size if name in bufs else 0
            if end > size:
                raise RuntimeFault(f"rank {self.rank}: the program reaches {name}[{end}], outside the buffer of {size}")
        self.kinds = sched.kinds
        self.dependents = sched.dependents
        self.missing_at_start = sched.missing
        self.first = sched.first
        self.completed = 0
        self.pending: dict[int, _Pending] = {}  # id(request) -> the transfer it carries
        # Copy fusion (module docstring): RecvReduce index -> the Copy source it starts from
        self.fused: dict[int, Any] = sched.fused
        self.fuse_group = sched.fuse_group
        self.skip_copy: frozenset[int] = sched.skip_copy  # the Copies fused away
        self.started: set[int] = set()  # fused Copies whose destination holds the source now

    @cached_property
    def missing(self) -> list[int]:
        """Deps not yet completed, per op: made when the Python loop first needs it (a run in
        the native core starts from the schedule's counts and never copies them here)."""
        return list(self.sched.missing)

    # -- buffers -------------------------------------------------------------------------
    def view(self, ref) -> np.ndarray:
        # in bounds: __init__ checked every buffer against the program's extent
        return self.bufs[ref.buf][ref.offset:ref.offset + ref.count]

    # -- posting and completing -------------------------------------------------------------
    def post(self, i: int) -> None:
        """Post op ``i``; local ops complete (and release their dependents) at once."""
        stack = [i]
        program, kinds, pending, codec, comm = self.program, self.kinds, self.pending, self.codec, self.comm
        while stack:
            k = stack.pop()
            op, kind = program[k], kinds[k]
            if kind == SEND:
                src = self.view(op.src)
                if codec is None:
                    req = comm.isend(op.peer, op.tag, memoryview(src).cast("B"))
                    pending[id(req)] = _Pending(k, req)
                else:
                    wire = np.empty(codec.wire_nbytes(src.size), dtype=np.uint8)
                    codec.encode(src, wire)
                    req = comm.isend(op.peer, op.tag, memoryview(wire))
                    pending[id(req)] = _Pending(k, req, wire)
                continue
            if kind == RECV or kind == RECV_REDUCE:
                dst = self.view(op.dst)
                staging = None
                if codec is not None:
                    staging = np.empty(codec.wire_nbytes(dst.size), dtype=np.uint8)
                    req = comm.irecv(op.peer, op.tag, memoryview(staging))
                elif kind == RECV:
                    req = comm.irecv(op.peer, op.tag, memoryview(dst).cast("B"))
                elif self.fold_recv is not None:
                    req = self.fold_recv(op.peer, op.tag, dst.nbytes, self._folder(k, dst))
                else:
                    staging = STAGING.take(dst.size, dst.dtype)
                    req = comm.irecv(op.peer, op.tag, memoryview(staging).cast("B"))
                pending[id(req)] = _Pending(k, req, staging)
                continue
            t0 = time.monotonic() if self.record_local is not None else 0.0
            if kind == COPY:
                if k in self.skip_copy:
                    pass  # fused into the RecvReduce that depends on it (module docstring)
                elif getattr(op, "roundtrip", False) and codec is not None:
                    # dst := decode(encode(src)): the value a receiver of src gets, so the
                    # owner of a compressed block keeps exactly what it sent (ir/plan.py Copy)
                    src = self.view(op.src)
                    wire = np.empty(codec.wire_nbytes(src.size), dtype=np.uint8)
                    codec.encode(src, wire)
                    codec.decode(wire, self.view(op.dst))
                else:  # onto the same memory (an in-place call's Copy(in -> out)) numpy moves nothing
                    self.view(op.dst)[...] = self.view(op.src)
            elif kind == REDUCE:
                with self.reduce_lock:
                    reduce_into(self.op_name, self.plan.dtype, self.view(op.dst), self.view(op.src))
            else:  # SCALE
                scale_into(self.plan.dtype, self.view(op.dst), op.divisor)
            if self.record_local is not None and k not in self.skip_copy:
                self.record_local(k, t0, time.monotonic())
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

    def _complete(self, k: int) -> list[int]:
        self.completed += 1
        ready = []
        for j in self.dependents[k]:
            self.missing[j] -= 1
            if self.missing[j] == 0:
                ready.append(j)
        return ready

    def _finish_transfer(self, p: _Pending) -> None:
        op, kind = self.program[p.op], self.kinds[p.op]
        if kind == RECV and self.codec is not None:
            self.codec.decode(p.staging, self.view(op.dst))
        elif kind == RECV_REDUCE:
            t0 = time.monotonic() if self.record_local is not None else 0.0
            dst = self.view(op.dst)
            if self.codec is not None:
                tmp = np.empty(dst.size, dtype=dst.dtype)
                self.codec.decode(p.staging, tmp)
                reduce_into(self.op_name, self.plan.dtype, dst, tmp)
            elif p.staging is not None:  # else the transport folded it while receiving
                group = self.fuse_group.get(p.op)
                with self.reduce_lock:
                    reduce_staged(self.op_name, self.plan.dtype, dst, p.staging,
                                  None if group is None else self.view(self.fused[p.op]), group, self.started)
                STAGING.give(p.staging)
            if self.record_local is not None and (self.codec is not None or p.staging is not None):
                self.record_local(p.op, t0, time.monotonic())
        # _complete, inlined: this runs once per transfer
        self.completed += 1
        missing = self.missing
        for j in self.dependents[p.op]:
            missing[j] -= 1
            if missing[j] == 0:
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
        by_op = {p.op: p for p in self.pending.values()}
        return by_op[_blame_op(self.kinds, list(by_op))]

    def execute(self) -> None:
        # the native core runs the whole program when the transport has one and every peer of
        # the program is on its channels (backends/native.py); else this Python loop runs it
        if self.native_run is not None and self.native_run(self):
            return
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
        for i in self.first:
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
                    batch = [pend[i] for i in (done if len(done) == 1 else sorted(set(done)))]
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


def _reads_input(program) -> bool:
    return any(getattr(op, "src", None) is not None and op.src.buf == "in" for op in program)


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


def caller_buffers(plan: Plan, comm: Transport, array: Any, out: Any, timeout: float, *,
                   zero_fill: bool = False, input_read: bool = True) -> tuple[int, np.ndarray, np.ndarray, Any]:
    """Check the communicator and the caller's arrays against ``plan`` before any byte moves,
    for every executor (static here, adaptive in backends/adaptive/). Returns ``(rank, in, out, result)``:
    flat views of the input and output buffers, and what ``run`` returns — ``out`` when the
    caller gave one, else a new array shaped like the input when the sizes agree.
    ``zero_fill``: a new output starts as zeros (the adaptive runtime leaves missing blocks 0).
    ``input_read=False``: this rank's program never reads its input (a broadcast receiver),
    so a missing input is a read-only zero-stride view, not a new zeroed buffer (1 MiB of
    ``np.zeros`` cost a broadcast receiver 35 us a run under MPI)."""
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
        inp = (np.zeros(sizes["in"], dtype=dtype) if input_read
               else np.broadcast_to(np.zeros(1, dtype=dtype), (sizes["in"],)))
        shape = None
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


def static_call(plan: Plan, comm: Transport, array=None, *, out=None, timeout: float = 60.0, step: int = 0,
                **options) -> tuple[Any, Callable[[], RankExecution], bool]:
    """Check a call of ``plan``'s program for rank ``comm.rank`` at training step ``step``
    before any byte moves, and prepare it: returns ``(result, execution, bindable)`` — what
    the call returns (``out``, or a new array), a maker of its checked
    :class:`RankExecution`, and whether the call may be bound (backends/bound.py: a transport
    with persistent transfers, the plan's own program, plain numpy arrays, an output given).
    ``options`` are refused (this executor has none). See ``hcc.run`` for the arguments."""
    unknown = sorted(set(options) - KNOWN_OPTIONS) if options else ()
    if unknown:
        raise UnknownOption(
            f"unknown run option(s) {', '.join(unknown)}"
            + (f" (known: {', '.join(sorted(KNOWN_OPTIONS))})" if KNOWN_OPTIONS else " (none are defined)")
        )
    program = plan.programs_at(step)[comm.rank] if 0 <= comm.rank < plan.n else ()
    rank, inp, out_flat, result = caller_buffers(plan, comm, array, out, timeout,
                                                 input_read=array is not None or _reads_input(program))
    dtype, sizes = np_dtype(plan.dtype), plan.buffer_elems(rank)
    codec = _codec(plan)

    def execution() -> RankExecution:
        bufs = {"in": inp, "out": out_flat, "tmp": np.empty(sizes["tmp"], dtype=dtype)}
        return RankExecution(plan, comm, program, bufs, float(timeout), codec)

    bindable = (codec is None and type(out) is np.ndarray and (array is None or type(array) is np.ndarray)
                and program is plan.programs[rank] and getattr(comm, "send_init", None) is not None)
    return result, execution, bindable
