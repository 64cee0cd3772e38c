"""hcc.collectives — a communicator that front ends (torch.distributed, Ray) issue collectives on.

    comm = Communicator.connect(rank, world, store, topology=None)   # store: a KeyStore
    h = comm.allreduce(array, op="sum")        # numpy array, filled in place; returns a Handle
    h.wait()                                   # raises the collective's error, if any

Terms
- call: one collective a front end issues (``allreduce``, ``broadcast``, ...). Calls are issued
  in the same order on every rank (NCCL's and gloo's rule); each gets the next sequence number
  ``seq`` at issue, in the caller's thread, so ``seq`` names the same call on every rank.
- run: one execution of a compiled :class:`~hcc.ir.plan.Plan`. A call is one run, or two for
  ``alltoall`` with uneven splits (the largest split is agreed first). Each run takes its own
  ``seq``.
- slot: the tag space of a run, ``1 + seq mod 127``, put in bits 24-30 of every tag the run
  sends (a plan's own tags are below 2**24, ir/plan.py; bit 31 is the adaptive runtime's).
  Runs in flight at once therefore never match each other's messages, and every frame also
  carries its plan id (backends/sockets.py), so two ranks that issued different calls as the
  same ``seq`` get a ``ProtocolError`` naming both plans instead of a wrong result.
- lane: a worker thread. Calls wait in one FIFO queue and :data:`DEFAULT_LANES` lanes take them
  in issue order, so up to that many runs are in flight on the communicator (DDP's bucket
  all-reduces overlap each other and the backward pass). When every rank is on this host one
  lane is the default: the native core runs one program at a time and needs no GIL, so the
  backward pass still overlaps the run (a second lane's run would go through the Python
  executor over the same channels; it takes the core only when it is free). No deadlock: on every rank the oldest
  unfinished call is running (lanes take calls in order), so the globally oldest call always
  has every rank that has not finished it working on it.
- plan key, reference size, topology: hcc/plan_cache.py (plans compiled once per key, and
  the default topology).
- placement: after the sockets transport is up, the ranks on this host get shared-memory
  channels (backends/shm.py, ``HCC_SHM=auto|on|off``, argument ``shm``) and a run whose every
  peer is on them runs in the native core without the GIL (backends/native.py). When no
  rank shares a host with another (every peer over TCP), the native core drives the TCP
  connections too (backends/native_tcp.py, ``HCC_NATIVE_TCP=0`` keeps the Python transport
  and executor): every run goes without the GIL, the runs of several lanes at once. The plans
  are compiled with the cost model of that path (hcc/runner.py ``RUN_MODELS``: ``shm`` when
  every rank is on this host, else ``sockets``); both are part of the cache's digest. The
  placement is the same on every rank (ranks share a host or not: an equivalence), so every
  rank compiles the same plans.

Failures: a run that fails (a dead peer, a deadline, ranks running different plans) fails its
Handle and the rank tells its peers (a FAIL frame naming itself, or its shared-memory bell),
whose runs then fail at once too. Ranks that issued different calls as one ``seq`` are
found by the plan id on the wire: within one slot every rank must run one plan, so a frame
of another plan in a slot where this rank has a receive posted, or a receive posted where
such a frame waits, fails the run at once (backends/sockets.py and the native core, "tag
space"), whichever tags the two plans use. The failing rank publishes what it called under ``hcc/diag/<seq>/<rank>`` in the
store and reads the others' for a few seconds, so the error names every rank's call ("rank 0
called allreduce float32 count 100, rank 1 allreduce float32 count 101") or the ranks that
never called. The communicator is then broken: later calls fail at once with the first error
(a half-finished exchange leaves frames in flight that no later run may consume).
A rank that only sends in a run (a broadcast's or a scatter's root) would never see a frame
of another plan; so every run also has a *header*: 8 bytes (the call's ``seq``) sent to the
next rank around the ring of ranks and received from the previous one, in the run's slot
under its plan id (tag :data:`HEADER_TAG`), posted before the run's own messages and waited for
after them. Every rank then receives in every slot it runs, and a mismatch anywhere around the
ring fails a run at once (one message per rank per run, sent while the run goes on).
A Handle's contract never changes with timing: on success the outputs are filled in place,
on failure ``wait()`` raises :class:`CollectiveError`; never a different type of result.
"""
from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol

from .backends.base import RuntimeFault, Transport
from .plan_cache import (  # noqa: F401  (re-exported: the front ends' one import)
    GENERIC_BYTES, SPECIALISE_MIN_BYTES, CollectiveError, PlanCache, _star_program, resolve_topology,
    star_topology,
)

__all__ = [
    "Communicator", "Handle", "CollectiveError", "PlanCache", "KeyStore", "star_topology",
    "DEFAULT_LANES", "SLOTS", "wait_all",
]

SLOTS = 127  # tag spaces (bits 24-30 of a tag); a run's slot is 1 + seq % SLOTS
SLOT_SHIFT = 24
# The header's tag in a run's slot: a plan's tags are numbered from 0 per ordered pair of
# ranks (ir/plan.py) and the compiler never lowers a plan of more than 200 000 ops
# (compiler/chunks.py MAX_SEARCH_OPS), so no plan reaches 2**24 - 1.
HEADER_TAG = (1 << SLOT_SHIFT) - 1
# Two lanes: DDP keeps a bucket's all-reduce in flight while the next bucket fills; a third
# lane on 2 cores only adds GIL contention (the executor's Python runs under the GIL).
DEFAULT_LANES = 2
MAX_QUEUED = 64  # calls issued but not finished before issue blocks (bounds a slot's reuse)
DIAG_WAIT_S = 5.0  # how long a failing rank waits for the others' description of a call


class KeyStore(Protocol):
    """What the communicator needs of a rendezvous store (torch's c10d Store fits)."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...


@dataclass(frozen=True)
class CallInfo:
    """What one rank called, for error messages."""

    kind: str
    count: int
    dtype: str
    op: str | None = None
    root: int = -1
    shape: tuple[int, ...] = ()

    def text(self) -> str:
        parts = [self.kind, self.dtype, f"count {self.count}"]
        if self.shape and self.shape != (self.count,):
            parts.append(f"shape {tuple(self.shape)}")
        if self.op:
            parts.append(f"op {self.op}")
        if self.root >= 0:
            parts.append(f"root {self.root}")
        return " ".join(parts)


def warm_imports() -> threading.Thread:
    """Import the compiler and the runtime in a background thread, so the first collective
    does not pay for them (measured: 2.6 s for a first compile in a fresh process, of which
    0.3 s is compiling; OR-Tools and the compiler's modules are the rest)."""
    def work() -> None:
        try:
            from .backends import runtime  # noqa: F401
            from .compiler import pipeline, treepack  # noqa: F401
            from .ir import serialize  # noqa: F401
        except Exception:  # an import error surfaces, with its message, at the first compile
            pass

    t = threading.Thread(target=work, name="hcc-warm-imports", daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------- transport view


class SlotComm(Transport):
    """One run's view of the shared transport: its tags moved into the run's slot, its plan id
    stamped per message (so runs in flight at once never read each other's frames). Over
    shared-memory channels the run goes to the native core when ``engine`` (the
    communicator's lock on it) is free, else through the Python executor."""

    name = "sockets"

    def __init__(self, base, slot: int, engine: threading.Lock | None = None):
        self.base, self.rank, self.world = base, base.rank, base.world
        self.shift = slot << SLOT_SHIFT
        self.plan_id = 0
        self._engine = engine
        # the executor looks these optional primitives up with getattr: offer what the base has
        if getattr(base, "irecv_fold", None) is None:
            self.irecv_fold = None
        if getattr(base, "native_run", None) is None:
            self.native_run = None
        # this run's completions, queued by the requests themselves (``on_done``, called under
        # the base's lock), when the base is the TCP transport: the executor then takes them
        # O(completed) instead of rescanning every request it has outstanding at each wake-up
        # (wait_any): a 32 MiB all-reduce bucket on slow4 keeps ~300 requests outstanding,
        # and that rescan is Python under the GIL that DDP's other bucket and the backward
        # pass share. The base's own queue (track_completions) would mix two lanes' runs.
        self._done_q: deque | None = None
        if getattr(base, "wait_completed", None) is not None and hasattr(base, "wait_change"):
            self._done_q, self._live = deque(), {}
        else:
            self.wait_completed = self.track_completions = None

    def _watch(self, req):
        q = self._done_q
        if q is not None and hasattr(req, "on_done") and req.on_done is None:
            self._live[id(req)] = req
            req.on_done = partial(q.append, req)
            if req.done:  # completed before the callback was set (a duplicate is harmless:
                q.append(req)  # the executor takes only the requests it still has pending)
        return req

    def track_completions(self, on: bool) -> None:
        pass  # every request of this view is tracked (_watch)

    def wait_completed(self, timeout: float) -> list:
        """This run's requests completed since the last call (at least one): the executor's
        fast path. Failures and the deadline are the base's ``wait_any``'s, looked at when a
        wait slice passes with no completion."""
        from .backends.base import CollectiveTimeout

        q = self._done_q
        deadline = time.monotonic() + timeout
        while True:
            if q:
                out = []
                while q:
                    r = q.popleft()
                    if self._live.pop(id(r), None) is not None:
                        out.append(r)
                if out:
                    return out
                continue
            left = deadline - time.monotonic()
            live = list(self._live.values())
            if left <= 0 or self.base.failed():
                done = self.base.wait_any(live, max(0.0, left))  # raises the failure or timeout
                return [live[i] for i in done if self._live.pop(id(live[i]), None) is not None] or \
                    self.wait_completed(max(0.0, deadline - time.monotonic()))
            self.base.wait_change([], min(left, 0.2), woken=lambda: bool(q))
            if not q and live:
                try:  # a protocol error or a peer's give-up fails the requests: let wait_any say it
                    done = self.base.wait_any(live, 0.0)
                except CollectiveTimeout:
                    continue
                for i in done:
                    if not any(r is live[i] for r in q):
                        q.append(live[i])

    def native_run(self, ex) -> bool:
        lock = self._engine
        if lock is not None and not lock.acquire(blocking=False):
            return False  # another lane's run has the core
        try:
            return self.base.native_run(ex, plan=self.plan_id, tag_shift=self.shift)
        finally:
            if lock is not None:
                lock.release()

    def bind_plan(self, plan_id: int, max_message: int) -> None:
        self.plan_id = plan_id

    def isend(self, peer, tag, data):
        return self._watch(self.base.isend(peer, tag | self.shift, data, plan=self.plan_id))

    def irecv(self, peer, tag, buf):
        return self._watch(self.base.irecv(peer, tag | self.shift, buf, plan=self.plan_id))

    def irecv_fold(self, peer, tag, nbytes, fold):
        return self._watch(self.base.irecv_fold(peer, tag | self.shift, nbytes, fold, plan=self.plan_id))

    def wait_any(self, requests, timeout):
        return self.base.wait_any(requests, timeout)

    def failed(self):
        return self.base.failed()


class _Header:
    """A run's header (module docstring, "header"): sent to the next rank and received from
    the previous one around the ring of ranks, in the run's slot under its plan id, posted
    before the run's own messages and waited for after them."""

    __slots__ = ("comm", "seq", "got", "reqs", "pred")

    def __init__(self, comm: "SlotComm", plan_id: int, seq: int):
        import numpy as np

        world, rank = comm.world, comm.rank
        comm.plan_id = plan_id
        self.comm, self.seq, self.pred = comm, seq, (rank - 1) % world
        self.got = np.array([seq], dtype=np.uint64)  # a world of one has no one to hear from
        mine = np.array([seq], dtype=np.uint64)
        self.reqs = []
        if world > 1:
            self.got[0] = 0
            self.reqs = [comm.irecv(self.pred, HEADER_TAG, memoryview(self.got).cast("B")),
                         comm.isend((rank + 1) % world, HEADER_TAG, memoryview(mine).cast("B"))]

    def finish(self, timeout: float) -> None:
        from .backends.sockets import ProtocolError

        left = list(self.reqs)
        deadline = time.monotonic() + timeout
        for _ in range(4 * len(left)):  # wait_any returns at least one index each time
            if not left:
                break
            done = set(self.comm.wait_any(left, max(0.0, deadline - time.monotonic())))
            left = [r for i, r in enumerate(left) if i not in done]
        if int(self.got[0]) != self.seq:
            raise ProtocolError(f"rank {self.comm.rank}: rank {self.pred} ran its collective "
                                f"#{int(self.got[0])} where this rank ran #{self.seq} (same plan): "
                                "the ranks issued their calls in different orders")


def _run_plan(plan, comm: Transport, array, out, timeout: float):
    from .api import run  # the runtime's one entry (backends/runtime.py decides how)

    return run(plan, comm, array, out=out, timeout=timeout)


# ---------------------------------------------------------------------------- handles


class Handle:
    """A call in flight. ``wait()`` returns once it completed (outputs filled in place) or
    raises its :class:`CollectiveError`; ``done()`` does not block. ``on_done(fn)`` calls
    ``fn(handle)`` once it finishes, in the lane that finished it (or at once)."""

    __slots__ = ("seq", "info", "_event", "error", "_callbacks", "_lock", "elapsed_s", "started_at")

    def __init__(self, seq: int, info: CallInfo):
        self.seq, self.info = seq, info
        self._event = threading.Event()
        self.error: BaseException | None = None
        self._callbacks: list[Callable[["Handle"], None]] = []
        self._lock = threading.Lock()
        self.elapsed_s = 0.0
        self.started_at = 0.0  # time.perf_counter() when a lane took it

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> None:
        if not self._event.wait(timeout):
            raise CollectiveError(f"collective #{self.seq} ({self.info.text()}) not finished "
                                  f"after {timeout:g} s")
        if self.error is not None:
            raise self.error

    def on_done(self, fn: Callable[["Handle"], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self, error: BaseException | None) -> None:
        self.error = error
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


# ---------------------------------------------------------------------------- communicator


@dataclass
class _Call:
    handle: Handle
    seqs: tuple[int, ...]
    body: Callable[["Communicator", tuple[int, ...]], None]


class Communicator:
    """Collectives over one authenticated sockets transport (module docstring)."""

    def __init__(self, transport, store: KeyStore | None, cache: PlanCache, *, timeout: float = 1800.0,
                 lanes: int = DEFAULT_LANES, prefix: str = "hcc"):
        self.transport, self.store, self.cache = transport, store, cache
        self.rank, self.world = transport.rank, transport.world
        self.timeout, self.prefix = float(timeout), prefix
        self._engine = threading.Lock()  # the native core runs one program at a time
        self._seq = 0
        self._issue = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._room = threading.Semaphore(MAX_QUEUED)
        self.broken: CollectiveError | None = None
        self._closed = False
        self._lanes = [threading.Thread(target=self._lane, name=f"hcc-lane{i}-r{self.rank}", daemon=True)
                       for i in range(max(1, lanes))]
        for t in self._lanes:
            t.start()

    # -- making one ---------------------------------------------------------------------
    @classmethod
    def connect(cls, rank: int, world: int, store: KeyStore, *, timeout: float = 1800.0,
                topology: str | os.PathLike | None = None, ranks: str | list[str] | None = None,
                host: str | None = None, token: bytes | None = None, prefix: str = "hcc",
                lanes: int | None = None, cache_dir: str | None = None, shm: str | None = None) -> "Communicator":
        """Join a job: listen on ``host`` (default ``HCC_HOST``, else the address that routes to
        ``MASTER_ADDR``, else 127.0.0.1), publish the address and exchange the others' through
        ``store``, and authenticate every connection with ``token`` (default ``HCC_TOKEN``, else
        a random token rank 0 publishes in the store: as safe as the store itself). ``shm``:
        shared-memory channels to the ranks on this host, ``auto`` (default, or ``HCC_SHM``),
        ``on`` or ``off`` (module docstring, placement)."""
        from .backends.sockets import SocketTransport
        from .backends.rendezvous import parse_address
        from .runner import RUN_MODELS

        if not 0 <= rank < world:
            raise CollectiveError(f"rank {rank} outside a world of {world}")
        warm_imports()
        if token is None:
            env = os.environ.get("HCC_TOKEN")
            if env:
                token = env.encode()
            else:
                if rank == 0:
                    store.set(f"{prefix}/token", os.urandom(32).hex().encode())
                token = _store_get(store, f"{prefix}/token", timeout)
        host = host or os.environ.get("HCC_HOST") or _local_address()
        listener = socket.create_server((host, 0), backlog=max(16, world))
        lh, lp = listener.getsockname()[:2]
        store.set(f"{prefix}/addr/{rank}", f"{lh}:{lp}".encode())
        addresses = {}
        try:
            for p in range(world):
                if p != rank:
                    addresses[p] = parse_address(_store_get(store, f"{prefix}/addr/{p}", timeout).decode())
        except BaseException:
            listener.close()
            raise
        transport = SocketTransport(rank, world, token, addresses, listener, timeout=min(timeout, 60.0))
        try:
            transport = _enable_shm(transport, store, prefix, shm, min(timeout, 60.0))
            transport = _enable_native_tcp(transport, store, prefix, min(timeout, 60.0))
            on_host = len(getattr(transport, "local_peers", ())) == world - 1
            program, name, names = resolve_topology(world, topology, ranks, shm=on_host)
        except BaseException:
            transport.close()
            raise
        cache = PlanCache(program, name, names, cache_dir, model=RUN_MODELS["shm" if on_host else "sockets"])
        if lanes is None:
            env = os.environ.get("HCC_LANES")
            lanes = int(env) if env else (1 if on_host and _native_runner() else DEFAULT_LANES)
        return cls(transport, store, cache, timeout=timeout, lanes=lanes, prefix=prefix)

    # -- issuing ------------------------------------------------------------------------
    def submit(self, info: CallInfo, body: Callable[["Communicator", tuple[int, ...]], None],
               runs: int = 1) -> Handle:
        """Issue a call of ``runs`` plan runs; ``body(comm, seqs)`` runs in a lane."""
        if self._closed:
            raise CollectiveError(f"rank {self.rank}: the communicator is closed")
        self._room.acquire()
        with self._issue:
            seqs = tuple(range(self._seq, self._seq + runs))
            self._seq += runs
            handle = Handle(seqs[0], info)
            self._queue.put(_Call(handle, seqs, body))
        return handle

    def run(self, seq: int, kind: str, count: int, dtype: str, array, out, *, op: str | None = None,
            root: int = -1, info: CallInfo | None = None) -> None:
        """One plan run of a call, in a lane: ``array``/``out`` flat numpy buffers."""
        plan = self.cache.get(kind, count, dtype, op, root)
        # a peer's frame that arrives before its receive is posted is held only up to the
        # transport's bound (256 MiB): raise it to the largest message of a plan this rank
        # runs itself (a 4 GiB all-reduce in whole-block chunks sends 1 GiB messages)
        biggest = plan.largest_message_bytes()
        if biggest > getattr(self.transport, "max_message", biggest):
            self.transport.max_message = biggest
        # a transport whose runs go at once (the TCP core) needs no turn at the engine
        engine = None if getattr(self.transport, "concurrent_runs", False) else self._engine
        comm = SlotComm(self.transport, 1 + seq % SLOTS, engine)
        try:
            header = _Header(comm, plan.wire_id(), seq)
            _run_plan(plan, comm, array, out, self.timeout)
            header.finish(self.timeout)
        except RuntimeFault as e:
            # the communicator is broken from here on: tell the peers now (they fail their run
            # and report their call at once, instead of waiting for their deadline)
            tell = getattr(self.transport, "announce_failure", None)
            if tell is not None:
                try:
                    tell(str(e))
                except Exception:  # the run's error is the one to report
                    pass
            raise self._diagnose(seq, info or CallInfo(kind, count, dtype, op, root), e) from None

    def _lane(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            h = call.handle
            t0 = h.started_at = time.perf_counter()
            err: BaseException | None = self.broken
            if err is None:
                try:
                    call.body(self, call.seqs)
                except CollectiveError as e:
                    err = e
                    if self.broken is None:
                        self.broken = e
                except Exception as e:  # a bug or bad input found late: still the Handle's error
                    err = CollectiveError(f"rank {self.rank}: collective #{h.seq} ({h.info.text()}) "
                                          f"failed: {type(e).__name__}: {e}")
                    err.__cause__ = e
            h.elapsed_s = time.perf_counter() - t0
            self._room.release()
            h._finish(err)

    # -- failures -----------------------------------------------------------------------
    def _diagnose(self, seq: int, info: CallInfo, err: BaseException) -> CollectiveError:
        """Publish this rank's call, read the others' (bounded), and say who called what."""
        head = f"rank {self.rank}: collective #{seq} ({info.text()}) failed: {err}"
        if self.store is None:
            return CollectiveError(head)
        key = f"{self.prefix}/diag/{seq}"
        try:
            self.store.set(f"{key}/{self.rank}", json.dumps(info.__dict__).encode())
        except Exception:
            return CollectiveError(head)
        calls: dict[int, CallInfo] = {self.rank: info}
        deadline = time.monotonic() + min(DIAG_WAIT_S, self.timeout)
        for _ in range(int(DIAG_WAIT_S / 0.05) + 1):
            for r in range(self.world):
                if r not in calls:
                    try:
                        if self.store.check([f"{key}/{r}"]):
                            d = json.loads(self.store.get(f"{key}/{r}"))
                            d["shape"] = tuple(d.get("shape") or ())
                            calls[r] = CallInfo(**d)
                    except Exception:
                        pass
            if len(calls) == self.world or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        groups: dict[CallInfo, list[int]] = {}
        for r in sorted(calls):
            groups.setdefault(calls[r], []).append(r)
        lines = [head]
        if len(groups) > 1:
            lines.append("the ranks issued different calls as this collective: "
                         + "; ".join(f"{_ranks(rs)} called {c.text()}" for c, rs in groups.items()))
        missing = [r for r in range(self.world) if r not in calls]
        if missing and len(groups) == 1:
            lines.append(f"{_ranks(missing)} did not report this collective within "
                         f"{DIAG_WAIT_S:g} s of the failure (never called it, or still waiting in it)")
        return CollectiveError("\n".join(lines))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._lanes:
            self._queue.put(None)
        for t in self._lanes:
            t.join(timeout=max(5.0, min(self.timeout, 30.0)))
        self.transport.close()


def _native_runner() -> bool:
    from .backends import native

    return native.runner_enabled()


class _ShmStore:
    """The store as backends/shm.py's set-up reads it (``get(key, timeout)`` -> str)."""

    def __init__(self, store: KeyStore):
        self.store = store

    def set(self, key: str, value) -> None:
        self.store.set(key, value if isinstance(value, bytes) else str(value).encode())

    def get(self, key: str, timeout: float) -> str:
        return _store_get(self.store, key, timeout).decode()


def _enable_shm(transport, store: KeyStore, prefix: str, mode: str | None, timeout: float):
    """Shared-memory channels to the ranks on this host (backends/shm.py ``enable``: collective,
    every rank calls it once); the transport keeps no store afterwards."""
    from .backends.shm import enable

    transport.store, transport.group = _ShmStore(store), prefix
    try:
        return enable(transport, mode, timeout)
    except RuntimeFault as e:
        raise CollectiveError(f"rank {transport.rank}: shared-memory set-up failed: {e}") from e
    finally:
        transport.store = None


def _enable_native_tcp(transport, store: KeyStore, prefix: str, timeout: float):
    """The native core drives the TCP connections (backends/native_tcp.py) when every rank of
    the job is eligible (collective: every rank says so in the store, then every rank switches
    before any rank dials); else ``transport`` unchanged (the Python transport and executor)."""
    from .backends import native_tcp

    rank, world = transport.rank, transport.world
    store.set(f"{prefix}/ntcp/want/{rank}", b"1" if native_tcp.eligible(transport) else b"0")
    if not all(_store_get(store, f"{prefix}/ntcp/want/{p}", timeout) == b"1" for p in range(world)):
        return transport
    native_tcp.switch(transport)
    store.set(f"{prefix}/ntcp/on/{rank}", b"1")
    for p in range(world):
        _store_get(store, f"{prefix}/ntcp/on/{p}", timeout)
    native_tcp.dial(transport, timeout)
    return transport


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _store_get(store: KeyStore, key: str, timeout: float) -> bytes:
    """``store.get`` bounded by ``timeout`` (torch's Store.get blocks for the store's own)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.01) + 2):
        if store.check([key]):
            return store.get(key)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    raise CollectiveError(f"no value for {key!r} in the store after {timeout:g} s (a rank never joined?)")


def wait_all(procs: list, timeout: float) -> list[tuple[int, str, str]]:
    """``(returncode, stdout, stderr)`` of every process of a job started with pipes, all within
    one deadline of ``timeout`` seconds; at the deadline every process is killed and
    ``TimeoutError`` carries what the first unfinished one wrote (``.output``)."""
    import subprocess

    deadline = time.monotonic() + timeout
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            e = TimeoutError(f"a rank did not finish in {timeout:g} s")
            e.output = (out or "") + (err or "")
            raise e from None
        done.append((p.returncode, out or "", err or ""))
    return done


def _local_address() -> str:
    """The local address that routes to ``MASTER_ADDR`` (127.0.0.1 without one)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        addr = socket.gethostbyname(master)
    except OSError:
        return "127.0.0.1"
    if addr.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((addr, 9))  # no packet is sent: this only picks the route
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"
