"""hcc.backends.adaptive.fast — the fast path: when every rank arrived in time, run the plan's
flattened program after all.

Terms
- late: a rank that waited :data:`LATE_WAIT_S` after its own arrival without seeing every
  other rank's declares the run late.
- decision counter: one store key per run, ``fast/<run mod FAST_SLOTS>``, holding four
  fields — arrivals (+1 each), late markers (+:data:`MARK`), the static decision (a flag from
  the n-th arrival, :data:`DECIDE`, and one from the first late marker, :data:`BACKUP`) and the
  adaptive decision (+:data:`ADAPT` per rank that knows it) — that cannot carry into each other
  for n < 2**16.

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

__all__ = ["FastPath", "LATE_WAIT_S", "FAST_SLOTS", "StoreCounters", "agree", "fast_counters"]

# How long a rank waits, after its own arrival, for everyone else's before it declares the run
# late (the fast path then gives way to the adaptive schedule). 8 processes released by one
# barrier on this 2-core machine reach the log within ~5-15 ms of each other; 30 ms keeps
# on-time runs static while costing a late run at most that before it adapts.
LATE_WAIT_S = 0.03
# the fast path's per-run counter (Run.decide): arrivals count in units, late markers in
# MARK, the static decision as two flags (DECIDE, BACKUP), the adaptive one counted in ADAPT
# (fields that cannot carry into each other for n < 2**16)
FAST_SLOTS, MARK, DECIDE, BACKUP, ADAPT = 64, 1 << 16, 1 << 32, 1 << 33, 1 << 34


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


def agree(counters, slot: int, n: int, rank: int, what: str, timeout: float, *,
          gate=None, idle=lambda: None, late: float = LATE_WAIT_S) -> str:
    """One rank's part of a run's static/adaptive decision on ``counters``' ``slot`` among
    ``n`` ranks (:meth:`FastPath.decide` says how): ``"static"``, ``"adaptive"``, or
    ``"ran"`` when ``gate(target, wait)`` (the native core's gated run) ran the static program
    itself. A rank that waited ``late`` seconds declares the run late; ``idle`` is called
    between waits from then on; past ``timeout`` seconds without a decision it raises
    :class:`CollectiveTimeout` naming ``what``."""
    t_arr = time.monotonic()
    v = counters.add(slot, 1, wake=False)  # waiters wait for a decision, not for arrivals
    if v % MARK == n:  # the last arrival: static unless someone declared the run late
        counters.add(slot, DECIDE if v < MARK else ADAPT)
    elif gate is not None and gate(DECIDE, max(1e-3, late)):
        return "ran"
    posted = False
    while True:
        waited = time.monotonic() - t_arr
        value = counters.wait(slot, DECIDE, max(1e-3, late - waited) if not posted else WAIT_SLICE)
        if value is not None:
            return "static" if value < ADAPT else "adaptive"
        if not posted:
            posted = True
            v = counters.add(slot, MARK, wake=False)
            if v % MARK < n:
                counters.add(slot, ADAPT)  # someone is missing, so the first marker saw it missing too
            elif v // MARK % (DECIDE // MARK) == 1:
                counters.add(slot, BACKUP)  # the first marker, and everyone had arrived before it
        idle()
        if waited > timeout:
            raise CollectiveTimeout(rank, -1, f"{what}: waiting for the static/adaptive decision", timeout)


class FastPath:
    """The fast path's part of a run (see the module docstring)."""

    def decide(self) -> bool:
        """The fast path's check: True when every rank entered this run before any rank
        declared it late — then the run is the plan's static program (with nobody late,
        arrival order cannot help, and the flattened program is the faster executor).

        One counter per run (slot ``run mod 64`` of :func:`fast_counters`; rank 0 zeroes the slot 32 runs
        ahead, which every rank left long ago: a run's decision needs every rank's arrival,
        so no rank is more than two runs ahead of another) holds arrivals (+1 each), late
        markers (+:data:`MARK`, posted by a rank that waited :data:`LATE_WAIT_S` after its own
        arrival) and the decision. The run is static exactly when the n-th arrival precedes
        the first marker. ``add`` is linearizable and returns the new value, so the ranks
        whose own add shows that order add the decision, and every rank waits for it
        (server-side, or on the board inside the native core's run of the program:
        ShmBoard.run_gated): static is known to the n-th arrival (no marker yet: +:data:`DECIDE`)
        and to the first marker (all had arrived: +:data:`BACKUP`); adaptive to the n-th
        arrival (a marker came first) and to every marker that saw an arrival missing
        (+:data:`ADAPT` each). Two ranks know either outcome, so a rank killed between its
        arrival and its decision (the n-th arrival, say) leaves the others a decision, not a
        wait until their deadline. Nobody late: 3 counter operations, and the log is not
        touched."""
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
        gate = (lambda target, wait: gated(ex, slot, target, wait)) if ex is not None else None
        way = agree(counters, slot, self.n, self.rank, f"adaptive run {self.run_id}", self.timeout,
                    gate=gate, idle=self.report_deaths)
        self.ran_static = way == "ran"  # decided static, and the program ran behind the gate
        return way != "adaptive"

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
