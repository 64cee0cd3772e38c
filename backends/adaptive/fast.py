"""hcc.backends.adaptive.fast — the fast path: when every rank arrived in time, run the plan's
flattened program after all.

Terms
- late: a rank that waited :data:`LATE_WAIT_S` after its own arrival without seeing every
  other rank's declares the run late.
- decision counter: one store key per run, ``fast/<run mod FAST_SLOTS>``, holding three
  fields — arrivals (+1 each), late markers (+:data:`MARK`) and the decision (+:data:`DECIDE`
  static, +2 :data:`DECIDE` adaptive) — that cannot carry into each other for n < 2**16.

With nobody late, arrival order cannot help, and the flattened program is the faster
executor: the run costs 3 store round trips and the agreement log is not touched.
:class:`FastPath` is a mixin of the engine's :class:`~hcc.backends.adaptive.engine.Run`.
"""
from __future__ import annotations

import time

import numpy as np

from ..base import CollectiveTimeout, RuntimeFault
from .flows import WAIT_SLICE

__all__ = ["FastPath", "LATE_WAIT_S", "FAST_SLOTS"]

# How long a rank waits, after its own arrival, for everyone else's before it declares the run
# late (the fast path then gives way to the adaptive schedule). 8 processes released by one
# barrier on this 2-core machine reach the log within ~5-15 ms of each other; 30 ms keeps
# on-time runs static while costing a late run at most that before it adapts.
LATE_WAIT_S = 0.03
# the fast path's per-run counter (Run.decide): arrivals count in units, late markers in
# MARK, the decision in DECIDE (fields that cannot carry into each other for n < 2**16)
FAST_SLOTS, MARK, DECIDE = 64, 1 << 16, 1 << 32


class FastPath:
    """The fast path's part of a run (see the module docstring)."""

    def decide(self) -> bool:
        """The fast path's check: True when every rank entered this run before any rank
        declared it late — then the run is the plan's static program (with nobody late,
        arrival order cannot help, and the flattened program is the faster executor).

        One store counter per run (``fast/<run mod 64>``; rank 0 zeroes the slot 32 runs
        ahead, which every rank left long ago: a run's decision needs every rank's arrival,
        so no rank is more than two runs ahead of another) holds three fields: arrivals
        (+1 each), late markers (+:data:`MARK`, posted by a rank that waited
        :data:`LATE_WAIT_S` after its own arrival), and the decision (+:data:`DECIDE` static,
        +2 :data:`DECIDE` adaptive). ``add`` is linearizable and returns the new value, so
        exactly one rank learns the outcome first: the n-th arrival when no marker preceded it
        (static), or the first marker when some arrival was still missing (adaptive); it adds
        the decision, every rank waits for it server-side. Nobody late: 3 store round trips,
        and the log is not touched (the default path adds no key to the store)."""
        from ..rendezvous import RendezvousError

        self.fold()
        if self.view.dead:
            return False  # a rank is known dead: the adaptive path decides what that means
        client = self.s.log.client
        slot = self.run_id % FAST_SLOTS
        key = f"{self.s.log.prefix}/fast/{slot}"
        if self.rank == 0:
            client.set(f"{self.s.log.prefix}/fast/{(slot + FAST_SLOTS // 2) % FAST_SLOTS}", 0)
        t_arr = time.monotonic()
        v = int(client.add(key, 1))
        if v % MARK == self.n and v < MARK:
            client.add(key, DECIDE)  # the last arrival, and nobody declared the run late
        posted = False
        while True:
            waited = time.monotonic() - t_arr
            try:
                value = int(client.wait(key, DECIDE, max(1e-3, LATE_WAIT_S - waited) if not posted
                                        else WAIT_SLICE))
                return value // DECIDE == 1
            except RendezvousError as e:
                if "timeout" not in str(e):
                    raise RuntimeFault(f"rank {self.rank}: lost the agreement store ({e})") from None
            if not posted:
                posted = True
                v = int(client.add(key, MARK))
                if v % MARK < self.n and v // MARK % (DECIDE // MARK) == 1:
                    client.add(key, 2 * DECIDE)  # the first marker, and someone is missing
            self.report_deaths()
            if waited > self.timeout:
                raise CollectiveTimeout(self.rank, -1, f"adaptive run {self.run_id}: waiting for the "
                                        "static/adaptive decision", self.timeout)

    def run_static(self) -> None:
        """Everyone is present: run this rank's flattened program (backends/executor.py)."""
        from ..executor import RankExecution

        plan, rank = self.plan, self.rank
        bufs = {"in": self.inp, "out": self.out, "tmp": np.empty(plan.tmp_elems[rank], dtype=self.inp.dtype)}
        RankExecution(plan, self.comm, plan.programs[rank], bufs, self.timeout).execute()
        self.ran_static = True
        self.stats["path"] = "static"
        self.gen = len(self.view.dead)
        self.contrib = list(range(self.n))
