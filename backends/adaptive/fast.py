"""hcc.backends.adaptive.fast — the fast path: when every rank arrived in time, run the plan's
flattened program after all.

Terms
- late: a rank that waited :data:`LATE_WAIT_S` after its own arrival without seeing every
  other rank's declares the run late.
- decision counter: one store key per run, ``fast/<run mod FAST_SLOTS>``, holding three
  fields — arrivals (+1 each), late markers (+:data:`MARK`) and the decision (+:data:`DECIDE`
  static, +2 :data:`DECIDE` adaptive) — that cannot carry into each other for n < 2**16.

With nobody late, arrival order cannot help, and the flattened program is the faster
executor: the run costs 3 counter operations and the agreement log is not touched. The
counters are the rendezvous store's keys, or, when every rank of the job is on one host,
the host's shared board (backends/shm.py :class:`~hcc.backends.shm.ShmBoard`: atomic adds in
shared memory; a waiter naps on its eventfd). A dead rank never arrives, so either way the
others declare the run late after :data:`LATE_WAIT_S` and the adaptive path handles it.
:class:`FastPath` is a mixin of the engine's :class:`~hcc.backends.adaptive.engine.Run`.
"""
from __future__ import annotations

import time

import numpy as np

from ..base import CollectiveTimeout, RuntimeFault
from .flows import WAIT_SLICE

__all__ = ["FastPath", "LATE_WAIT_S", "FAST_SLOTS", "StoreCounters", "fast_counters"]

# How long a rank waits, after its own arrival, for everyone else's before it declares the run
# late (the fast path then gives way to the adaptive schedule). 8 processes released by one
# barrier on this 2-core machine reach the log within ~5-15 ms of each other; 30 ms keeps
# on-time runs static while costing a late run at most that before it adapts.
LATE_WAIT_S = 0.03
# the fast path's per-run counter (Run.decide): arrivals count in units, late markers in
# MARK, the decision in DECIDE (fields that cannot carry into each other for n < 2**16)
FAST_SLOTS, MARK, DECIDE = 64, 1 << 16, 1 << 32


class StoreCounters:
    """The fast path's counters as keys ``<prefix>/fast/<slot>`` of the rendezvous store (any
    job); the same calls as :class:`~hcc.backends.shm.ShmBoard` (one host)."""

    def __init__(self, client, prefix: str, rank: int):
        self.client, self.prefix, self.rank = client, prefix, rank

    def add(self, slot: int, amount: int, wake: bool = True) -> int:
        return int(self.client.add(f"{self.prefix}/fast/{slot}", amount))

    def set(self, slot: int, value: int) -> None:
        self.client.set(f"{self.prefix}/fast/{slot}", value)

    def wait(self, slot: int, at_least: int, timeout: float) -> int | None:
        from ..rendezvous import RendezvousError

        try:
            return int(self.client.wait(f"{self.prefix}/fast/{slot}", at_least, timeout))
        except RendezvousError as e:
            if "timeout" not in str(e):
                raise RuntimeFault(f"rank {self.rank}: lost the agreement store ({e})") from None
            return None


def fast_counters(session, comm):
    """Where a session's fast path counts: the host's shared board when the transport has one
    for this job (every rank on one host, ``board()`` of backends/shm.py: an atomic add in
    shared memory instead of a store round trip), else the rendezvous store. Every rank of a
    job makes the same choice (all on one host or not), once per session."""
    counters = getattr(session, "fast_counters", None)
    if counters is None:
        board = getattr(comm, "board", None)
        counters = board() if board is not None else None
        if counters is None:
            counters = StoreCounters(session.log.client, session.log.prefix, comm.rank)
        session.fast_counters = counters
    return counters


class FastPath:
    """The fast path's part of a run (see the module docstring)."""

    def decide(self) -> bool:
        """The fast path's check: True when every rank entered this run before any rank
        declared it late — then the run is the plan's static program (with nobody late,
        arrival order cannot help, and the flattened program is the faster executor).

        One counter per run (slot ``run mod 64`` of :func:`fast_counters`; rank 0 zeroes the slot 32 runs
        ahead, which every rank left long ago: a run's decision needs every rank's arrival,
        so no rank is more than two runs ahead of another) holds three fields: arrivals
        (+1 each), late markers (+:data:`MARK`, posted by a rank that waited
        :data:`LATE_WAIT_S` after its own arrival), and the decision (+:data:`DECIDE` static,
        +2 :data:`DECIDE` adaptive). ``add`` is linearizable and returns the new value, so
        exactly one rank learns the outcome first: the n-th arrival when no marker preceded it
        (static), or the first marker when some arrival was still missing (adaptive); it adds
        the decision, every rank waits for it (server-side, or on the board inside the native
        core's run of the program: ShmBoard.run_gated). Nobody
        late: 3 counter operations, and the log is not touched."""
        self.fold()
        if self.view.dead:
            return False  # a rank is known dead: the adaptive path decides what that means
        counters = fast_counters(self.s, self.comm)
        slot = self.run_id % FAST_SLOTS
        if self.rank == 0:
            counters.set((slot + FAST_SLOTS // 2) % FAST_SLOTS, 0)
        # over the host's board the wait for a static decision happens in the native core's
        # run of the program, built before arriving: no Python turn between the decision and
        # the first send (ShmBoard.run_gated)
        gated = getattr(counters, "run_gated", None)
        ex = self.static_execution() if gated is not None else None
        t_arr = time.monotonic()
        v = counters.add(slot, 1, wake=False)  # waiters wait for a decision, not for arrivals
        if v % MARK == self.n and v < MARK:
            counters.add(slot, DECIDE)  # the last arrival, and nobody declared the run late
        elif ex is not None and gated(ex, slot, DECIDE, max(1e-3, LATE_WAIT_S)):
            self.ran_static = True  # decided static, and the program ran
            return True
        posted = False
        while True:
            waited = time.monotonic() - t_arr
            value = counters.wait(slot, DECIDE, max(1e-3, LATE_WAIT_S - waited) if not posted else WAIT_SLICE)
            if value is not None:
                return value // DECIDE == 1
            if not posted:
                posted = True
                v = counters.add(slot, MARK, wake=False)
                if v % MARK < self.n and v // MARK % (DECIDE // MARK) == 1:
                    counters.add(slot, 2 * DECIDE)  # the first marker, and someone is missing
            self.report_deaths()
            if waited > self.timeout:
                raise CollectiveTimeout(self.rank, -1, f"adaptive run {self.run_id}: waiting for the "
                                        "static/adaptive decision", self.timeout)

    def static_execution(self):
        """This rank's flattened program over this run's buffers, ready to execute."""
        from ..executor import RankExecution

        plan, rank = self.plan, self.rank
        bufs = {"in": self.inp, "out": self.out, "tmp": np.empty(plan.tmp_elems[rank], dtype=self.inp.dtype)}
        return RankExecution(plan, self.comm, plan.programs[rank], bufs, self.timeout)

    def run_static(self) -> None:
        """Everyone is present: run this rank's flattened program (backends/executor.py),
        unless :meth:`decide` already ran it behind the board's gate."""
        if not self.ran_static:
            self.static_execution().execute()
        self.ran_static = True
        self.stats["path"] = "static"
        self.gen = len(self.view.dead)
        self.contrib = list(range(self.n))
