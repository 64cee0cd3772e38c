"""hcc.backends.agreement — how the survivors agree on who died, who arrived and when a run ends.

The coordinator is the rendezvous store every sockets rank already holds a connection to
(backends/rendezvous.py). It serves only four atomic operations (set, get, add, wait), and
one of them, ``add``, is a linearizable counter: that is enough for a totally ordered,
append-only *event log* that every rank reads in the same order.

Log (keys under ``<group>/ev/``)
- append: ``i = add("seq", 1)`` reserves slot ``i`` (unique, in order); ``set("<i>", event)``
  fills it. A reader that sees ``seq >= i`` before the slot is filled waits on ``get`` (the
  store blocks it until the key exists; the gap is one round trip).
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
itself dies (it lives in the launcher, the Ray driver, or rank 0 for embedded sockets jobs),
agreement is lost and every rank raises within its deadline.
"""
from __future__ import annotations

import threading

from .rendezvous import RendezvousError, StoreClient

__all__ = ["EventLog", "Tail", "log_group"]

# The tail thread waits on the store in slices so that close() ends it within this bound.
_SLICE_S = 0.25


class EventLog:
    """Append to and read the event log of ``group`` over one store connection."""

    def __init__(self, address: str, token: bytes | str, group: str, timeout: float = 30.0):
        self.client = StoreClient(address, token, timeout)
        self.prefix = f"{group}/ev"
        self.timeout = timeout

    def append(self, event: dict) -> int:
        i = self.client.add(f"{self.prefix}/seq", 1)
        self.client.set(f"{self.prefix}/{i}", event)
        return i

    def report_dead(self, rank: int) -> bool:
        """Append ``dead(rank)`` unless another rank already did; True when this call did."""
        if self.client.add(f"{self.prefix}/deadrep/{rank}", 1) != 1:
            return False
        self.append({"t": "dead", "rank": int(rank)})
        return True

    def length(self) -> int:
        return int(self.client.add(f"{self.prefix}/seq", 0))

    def read(self, i: int) -> dict:
        return self.client.get(f"{self.prefix}/{i}", self.timeout)

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
    """A daemon thread that keeps ``events`` equal to the log, in order, over its own store
    connection (it blocks in ``wait``), and calls ``wake()`` after each batch: the executor's
    main loop sleeps on the transport until woken."""

    def __init__(self, log: EventLog, token: bytes | str, wake=None):
        self.log, self.wake = log, wake
        self.events: list[dict] = []
        self.error: Exception | None = None
        self._token = token
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hcc-agreement", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        reader = None
        try:
            reader = EventLog(self.log.client.address, self._token, "", self.log.timeout)
            reader.prefix = self.log.prefix
            while not self._stop.is_set():
                known = len(self.events)
                if not reader.wait_longer(known, _SLICE_S):
                    continue
                total = reader.length()
                batch = [reader.read(i) for i in range(known + 1, total + 1)]
                with self._lock:
                    self.events.extend(batch)
                if self.wake is not None:
                    self.wake()
        except Exception as e:  # the store is gone: agreement is lost; the executor raises it
            if not self._stop.is_set():
                self.error = e
                if self.wake is not None:
                    self.wake()
        finally:
            if reader is not None:
                reader.close()

    def snapshot(self, start: int = 0) -> list[dict]:
        with self._lock:
            return self.events[start:]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2 * _SLICE_S + 1.0)


def log_group(group: str) -> str:
    """The group under which the agreement log of a communicator of ``group`` lives (its keys:
    ``<log_group>/ev/...``). backends/adaptive.py's session and the Ray driver, which appends
    the deaths Ray reports (backends/ray.py), must name the same log."""
    return f"{group}/adaptive"
