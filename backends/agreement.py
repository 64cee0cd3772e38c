"""hcc.backends.agreement — how the survivors agree on who died, who arrived and when a run ends.

The coordinator is the rendezvous store every sockets rank already holds a connection to
(backends/rendezvous.py). It serves only four atomic operations (set, get, add, wait), and
one of them, ``add``, is a linearizable counter: that is enough for a totally ordered,
append-only *event log* that every rank reads in the same order.

Log (keys under ``<group>/ev/``) — a ring of ``C`` slots, so the store stays bounded
- append: ``i = add("seq", 1)`` reserves position ``i`` (unique, in order); ``set("s/<i mod C>",
  {"i": i, "e": event})`` fills its slot. A reader that finds an older ``i`` in the slot (the
  writer has reserved but not yet written it: one round trip) polls until it is there.
- slot reuse: a writer may overwrite position ``i - C`` only once every reader has read it.
  Each reader (the :class:`Tail` of rank ``r``) publishes how far it has read in
  ``rpos/<r>``, every ``C/4`` events; a writer that reaches the limit it last saw (the least
  published position + ``C``) re-reads those counters (``world`` of them, the communicator
  size each session records in ``world``), skips the readers of ranks the log holds dead
  (``deadrep/<r>``) and waits, bounded by its timeout, for the others. Tails read
  continuously on their own connection, so a writer waits only behind a reader that is
  ``C`` events behind — with ``C = max(32, 8n)`` (:func:`capacity`), about 4 adaptive
  ``continue`` runs; in practice never.
- the store's keys of one log are therefore at most ``C`` slots + ``seq`` + ``world`` +
  ``n`` reader positions + per death a ``deadrep`` counter and a ``dead/<k>`` record (deaths in
  order, kept beside the ring so that a tail starting on a log that has wrapped still learns
  every death) + ``ndead``: bounded by ``C + 3n + 4`` (with ``cap``) whatever the number of runs.
- a reader's local copy is bounded too: :meth:`Tail.compact` drops the prefix of events of
  runs this rank has finished (deaths are kept as a list), called at the start of each run.
- events (JSON objects): ``{"t": "dead", "rank": d}``; ``{"t": "arr", "run": k, "rank": r}``
  (rank ``r`` entered run ``k``); ``{"t": "done", "run": k, "rank": r, "gen": g}`` (rank
  ``r`` holds its complete output of run ``k`` under generation ``g``).
- deaths are appended once: a rank that sees a peer die (EOF or reset on a data connection,
  or a FAIL frame gossiped by another rank) does ``add("deadrep/<d>", 1)`` and appends the
  event only when it got 1, so the log holds each death once however many ranks saw it.
- on Ray (backends/ray.py) the store lives in the driver, which is one more reporter: it
  appends ``dead(r)`` the moment Ray fails rank r's actor call (``ActorDiedError``, 8-10 ms
  after a SIGKILL here), through the same ``report_dead``. Whoever is first appends; the
  others' reports are no-ops, so a death reaches the log at the earliest of the survivors'
  EOFs and Ray's notice.

Epochs and generations: the *generation* of a log prefix is the number of ``dead`` events in
it; the dead set of generation ``g`` is the ranks named by the first ``g`` dead events. Every
rank folds the same log in the same order, so every rank that reaches generation ``g`` has the
same dead set and computes the same repaired trees (backends/repair.py).

A run ends (every rank returns) at the first log position where, in the current generation
``g``, every rank that is not dead has a ``done`` event for generation ``g``; ``done`` events of
older generations do not count (a death may invalidate an output: an allreduce chunk that
included the dead rank's input is recomputed). Because the decision is a function of the log
prefix, every rank decides it at the same position, with the same dead set, and so reports
the same contributors. A death appended after that position does not affect the run.

Worst case (docs/fault-tolerance.md): a death is known to everybody one detection delay (the
kernel's EOF on a loopback TCP connection: microseconds after SIGKILL; a hung, not dead, peer:
only the per-wait deadline) plus two store round trips after it happens; ``f`` deaths during
a run cost at most ``f`` generations, each at most one re-send of every chunk. If the store
itself dies (it lives in the launcher, the Ray driver, or for sockets jobs without a launcher
a process rank 0 starts that outlives it: rendezvous.spawn_store),
agreement is lost and every rank raises within its deadline.
"""
from __future__ import annotations

import threading
import time

from .base import RuntimeFault
from .rendezvous import RendezvousError, StoreClient

__all__ = ["EventLog", "Tail", "log_group", "capacity"]

# The tail thread waits on the store in slices so that close() ends it within this bound.
_SLICE_S = 0.25
# A reader polls a reserved but not yet written slot this often (the gap is one round trip).
_POLL_S = 0.001


# The most ranks the adaptive runtime lays out (backends/adaptive.py MAX_FLOWS): the ring's
# size for a log whose first writer does not know the communicator's size (the Ray driver,
# appending a death before any rank opened its session).
_MAX_WORLD = 64


def capacity(world: int | None) -> int:
    """Ring slots for a communicator of ``world`` ranks: 8 per rank (an adaptive ``continue``
    run appends 2n events, an ``abort`` run n; so the ring holds the last ~4 runs), at least
    32; 512 when the size is unknown (8 x the 64 ranks the adaptive runtime lays out)."""
    return max(32, 8 * int(world if world is not None else _MAX_WORLD))


class EventLog:
    """Append to and read the event log of ``group`` over one store connection.

    ``capacity``: ring slots (default :func:`capacity` of the ``world`` a session recorded in
    the store, or of ``world`` when given). ``world``: the communicator's size, recorded for
    writers that do not know it (the Ray driver appends deaths without one)."""

    def __init__(self, address: str, token: bytes | str, group: str, timeout: float = 30.0,
                 world: int | None = None, capacity: int | None = None):
        self.client = StoreClient(address, token, timeout)
        self.prefix = f"{group}/ev"
        self.timeout = timeout
        self.world = world
        if world is not None:
            self.client.set(f"{self.prefix}/world", int(world))
        self._want, self._capacity = capacity, None
        self._limit = 0  # positions up to this may be written without looking at the readers

    @property
    def capacity(self) -> int:
        """The ring's slots, fixed once per log in the store (``cap``): the first writer or
        reader to ask sets it (its ``capacity`` argument, else :func:`capacity` of its world),
        every later one gets the value already there, in the same single request
        (``set_default``), so all agree even if they were built with different arguments (the
        Ray driver builds its log without a world: 512 slots then, enough for any layout). One
        request, not a check-then-set: each store request under load is one more wait that a
        slow store could stretch past a deadline."""
        if self._capacity is None:
            c = self._want if self._want is not None else capacity(self.world)
            self._capacity = int(self.client.set_default(f"{self.prefix}/cap", int(c)))
        return self._capacity

    def slot(self, i: int) -> str:
        return f"{self.prefix}/s/{i % self.capacity}"

    def append(self, event: dict) -> int:
        # reserve and fill in one store step while the slot is known free (every append but
        # those that pass the room limit): a writer SIGKILLed between a separate reserve and
        # fill left a hole that every reader waited on until its deadline, then gave up the
        # store as lost ("get '.../ev/s/2': timeout") although it was answering
        # positions 1..C fill slots never written before, so they need no room: a session's
        # first append (an arrival, right after the join) is one request too
        cap = self.capacity
        i, written = self.client.add_then_set(f"{self.prefix}/seq", f"{self.prefix}/s", cap,
                                              max(self._limit, cap), event)
        if not written:
            self._make_room(i)
            self.client.set(self.slot(i), {"i": i, "e": event})
        return i

    def _make_room(self, i: int) -> None:
        """Wait until every live reader has read position ``i - C`` (the slot's last event)."""
        cap = self.capacity
        world = self.world if self.world is not None else self.client.peek(f"{self.prefix}/world")
        end = time.monotonic() + self.timeout
        while True:
            least = None
            for r in range(int(world or 0)):
                pos = self.client.peek(f"{self.prefix}/rpos/{r}")
                if pos is None or pos < 0 or self.client.peek(f"{self.prefix}/deadrep/{r}"):
                    continue  # not reading (never started, or closed), or dead
                if pos < i - cap:
                    try:  # server-side wait for that reader, in slices
                        self.client.wait(f"{self.prefix}/rpos/{r}", i - cap, min(_SLICE_S, self.timeout))
                        pos = i - cap
                    except RendezvousError as e:
                        if "timeout" not in str(e):
                            raise
                        if time.monotonic() > end:
                            raise RuntimeFault(f"agreement log: rank {r}'s reader is {i - pos} events "
                                               f"behind a ring of {cap} after {self.timeout:g} s") from None
                        break  # re-read every reader (one may have died meanwhile)
                least = pos if least is None else min(least, pos)
            else:
                self._limit = (i if least is None else least) + cap
                if i <= self._limit:
                    return

    def report_dead(self, rank: int) -> bool:
        """Append ``dead(rank)`` unless another rank already did; True when this call did."""
        if self.client.add(f"{self.prefix}/deadrep/{rank}", 1) != 1:
            return False
        i = self.append({"t": "dead", "rank": int(rank)})
        k = self.client.add(f"{self.prefix}/ndead", 1)
        self.client.set(f"{self.prefix}/dead/{k}", {"rank": int(rank), "i": i})
        return True

    def length(self) -> int:
        return int(self.client.add(f"{self.prefix}/seq", 0))

    def read(self, i: int, before_wait=None) -> dict:
        """Event ``i`` (1-based); waits while its writer has reserved but not filled the slot
        (calling ``before_wait()`` once first: a tail publishes how far it has read, since that
        writer may itself be waiting for this reader to make room)."""
        end = time.monotonic() + self.timeout
        key = self.slot(i)
        waited = False
        while True:
            rec = self.client.get(key, self.timeout)
            if rec["i"] == i:
                return rec["e"]
            if rec["i"] > i:
                raise RuntimeFault(f"agreement log: event {i} was overwritten by event {rec['i']} "
                                   f"(a reader fell {self.capacity} events behind)")
            if time.monotonic() > end:
                raise RuntimeFault(f"agreement log: event {i} reserved but not written after "
                                   f"{self.timeout:g} s")
            if not waited and before_wait is not None:
                before_wait()
            waited = True
            time.sleep(_POLL_S)

    def deaths(self) -> list[tuple[int, int]]:
        """``(rank, position)`` of every death, in log order (the records beside the ring)."""
        out = []
        for k in range(1, int(self.client.add(f"{self.prefix}/ndead", 0)) + 1):
            rec = self.client.get(f"{self.prefix}/dead/{k}", self.timeout)
            out.append((int(rec["rank"]), int(rec["i"])))
        return sorted(out, key=lambda x: x[1])

    def publish(self, rank: int, pos: int) -> None:
        """Reader ``rank`` has read every event up to ``pos`` (-1: it stopped reading)."""
        self.client.set(f"{self.prefix}/rpos/{rank}", int(pos))

    def wait_longer(self, known: int, timeout: float) -> bool:
        """True once the log holds more than ``known`` events; False after ``timeout``."""
        try:
            self.client.wait(f"{self.prefix}/seq", known + 1, timeout)
            return True
        except RendezvousError as e:
            if "timeout" in str(e):
                return False
            raise

    def close(self) -> None:
        self.client.close()


class Tail:
    """A daemon thread that keeps a local copy of the log, in order, over its own store
    connection (it blocks in ``wait``), and calls ``wake()`` after each batch: the executor's
    main loop sleeps on the transport until woken.

    Positions are absolute (event ``i`` of the log is position ``i - 1``); ``events`` holds
    positions ``base ..`` ``length - 1``, the prefix before ``base`` having been dropped by
    :meth:`compact` (its deaths are kept in ``dead_before``). ``rank``: the reader this tail
    is, for the ring's slot reuse (it publishes how far it has read); None: an unregistered
    reader (tests), which a writer does not wait for."""

    def __init__(self, log: EventLog, token: bytes | str, wake=None, rank: int | None = None):
        self.log, self.wake, self.rank = log, wake, rank
        self.events: list[dict] = []
        self.base = 0
        self.dead_before: list[int] = []
        self.error: Exception | None = None
        self._token = token
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._start()
        self._thread = threading.Thread(target=self._loop, name="hcc-agreement", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        """Start at event 1, or, when the ring has already wrapped (a session opened on a log
        older than C events), after the current end, with the deaths before it."""
        log = self.log
        if self.rank is not None:
            log.publish(self.rank, 0)  # first, so that no writer reuses slot 1 from now on
        total = log.length()
        start = 0
        if total > log.capacity:
            first = log.client.peek(log.slot(1))
            if first is None or first["i"] != 1:
                start = total
                self.dead_before = [r for r, i in log.deaths() if i <= total]
                if self.rank is not None:
                    log.publish(self.rank, start)
        self.base = start
        self._published = start

    @property
    def length(self) -> int:
        """Events of the log this tail has read (positions 0 .. length - 1)."""
        return self.base + len(self.events)

    def _loop(self) -> None:
        reader = None
        try:
            reader = EventLog(self.log.client.address, self._token, "", self.log.timeout)
            reader.prefix = self.log.prefix
            reader._capacity = self.log.capacity  # already fixed in the store
            step = max(1, self.log.capacity // 4)
            while not self._stop.is_set():
                known = self.length
                if not reader.wait_longer(known, _SLICE_S):
                    continue
                total = reader.length()
                for i in range(known + 1, total + 1):
                    # a reserved slot may be unfilled because its writer waits for room that
                    # only this reader's progress can give: publish before polling it
                    ev = reader.read(i, before_wait=lambda: self._publish(reader, i - 1, 1))
                    with self._lock:
                        self.events.append(ev)
                    self._publish(reader, i, step)
                if self.wake is not None:
                    self.wake()
        except Exception as e:  # the store is gone: agreement is lost; the executor raises it
            if not self._stop.is_set():
                self.error = e
                if self.wake is not None:
                    self.wake()
        finally:
            if reader is not None:
                if self.rank is not None and self._stop.is_set():
                    try:
                        reader.publish(self.rank, -1)  # stopped reading: writers need not wait
                    except RuntimeFault:
                        pass
                reader.close()

    def _publish(self, reader: EventLog, pos: int, step: int) -> None:
        """Publish ``pos`` as this reader's position when it is ``step`` past the last one."""
        if self.rank is not None and pos - self._published >= step:
            reader.publish(self.rank, pos)
            self._published = pos
        if step == 1 and self.wake is not None:
            self.wake()  # the executor sees what is read so far while this tail waits

    def snapshot(self, start: int = 0) -> list[dict]:
        """The events from position ``start`` on (from ``base`` if ``start`` is older)."""
        with self._lock:
            return self.events[max(0, start - self.base):]

    def dead(self) -> list[int]:
        """Every rank the log holds dead, in log order."""
        with self._lock:
            return self.dead_before + [int(e["rank"]) for e in self.events if e.get("t") == "dead"]

    def compact(self, run: int) -> tuple[int, list[int]]:
        """Drop the longest prefix of events that are deaths or belong to runs before ``run``
        (this rank finished those); the deaths move to ``dead_before``. Called by the executor
        at the start of run ``run``, so the local copy holds about one or two runs' events.
        Returns ``(base, dead_before)``: where run ``run``'s view of the log starts."""
        with self._lock:
            k = 0
            for e in self.events:
                if e.get("t") == "dead":
                    self.dead_before.append(int(e["rank"]))
                elif e.get("run", run) >= run:
                    break
                k += 1
            if k:
                del self.events[:k]
                self.base += k
            return self.base, list(self.dead_before)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2 * _SLICE_S + 1.0)


def log_group(group: str) -> str:
    """The group under which the agreement log of a communicator of ``group`` lives (its keys:
    ``<log_group>/ev/...``). backends/adaptive.py's session and the Ray driver, which appends
    the deaths Ray reports (backends/ray.py), must name the same log."""
    return f"{group}/adaptive"
