"""hcc.backends.ray.driver — the driver's side: :class:`ActorGroup` (rank actors reused across
runs), the coordinator that serves one run's rendezvous store and agreement log, and the
``run``/``run_local`` entries.

Terms
- coordinator (:class:`Coordinator`): the driver's store for one :meth:`ActorGroup.run`, outside
  every rank (so any rank may die), holding the sockets path's addresses and the agreement log
  to which the driver appends every death Ray reports.
- report (:class:`RunReport`): what a call saw besides the outputs — deaths, per-rank times,
  what the adaptive runtime's survivors agreed on.
"""
from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..base import RankFailed, RootFailed, RuntimeFault
from ..rendezvous import free_port
from .actors import cause_of, remote_class, unpack_error
from .transport import DATA_PATHS, SOCKETS_GROUP, import_ray, is_actor_death, local_cluster

__all__ = ["ActorGroup", "RunReport", "Coordinator", "run", "run_local"]

_DRIVER_GRACE_S = 30.0


@dataclass(frozen=True)
class RunReport:
    """What one :meth:`ActorGroup.run` call saw besides the outputs: ``dead``, the ranks whose
    actors Ray reported dead during the call (in the order the driver learnt it);
    ``seconds``, per timed iteration, each rank's time from the start of its step (its start
    delay included) to its return; ``spans``, per timed iteration, each rank's step start and
    return as ``time.time()`` of this machine (one clock for every actor); ``info``, per rank, what the adaptive executor's survivors
    agreed on in the last iteration (``contributors``, ``missing``, ``late``, ``dead``,
    ``generation``, ``stats``), empty for plans the static executor ran; ``first_by_ray``,
    the deaths whose ``dead`` event the driver appended to the agreement log before any rank
    did (Ray's notice beat every survivor's own transport)."""

    dead: tuple[int, ...]
    seconds: tuple[dict, ...]
    info: dict
    first_by_ray: tuple[int, ...] = ()
    spans: tuple[dict, ...] = ()


class ActorGroup:
    """``world`` rank actors on the current Ray cluster, reusable across runs (actor start-up
    dominates short runs: ~1 s per actor here). A plan of ``n <= world`` ranks runs on actors
    ``0..n-1``. An actor that dies stays dead (``dead``; later runs of plans with
    ``on_failure = continue`` run without it) until :meth:`respawn` replaces it."""

    def __init__(self, world: int, *, num_cpus: float = 0):
        ray = import_ray()
        if not ray.is_initialized():
            raise RuntimeFault("hcc ray: no Ray cluster; call ray.init() or use local_cluster()")
        self.world = world
        self._num_cpus = num_cpus
        self.actors = [self._spawn() for _ in range(world)]
        self.pids = ray.get([a.pid.remote() for a in self.actors], timeout=120)
        self.dead: set[int] = set()
        self.last: RunReport | None = None

    def _spawn(self):
        # num_cpus=0: ranks mostly wait on the network; a 4-rank group must fit a 2-core
        # machine's cluster. max_concurrency: the mailbox serves one coroutine per pending
        # receive (a plan posts every first-chunk receive at once).
        return remote_class("rank").options(num_cpus=self._num_cpus, max_concurrency=10000).remote()

    def respawn(self) -> list[int]:
        """Replace every dead actor by a new one (same rank); returns the ranks replaced."""
        ray = import_ray()
        ranks = sorted(self.dead)
        for r in ranks:
            try:
                ray.kill(self.actors[r])
            except Exception:  # already gone
                pass
            self.actors[r] = self._spawn()
        if ranks:
            pids = ray.get([self.actors[r].pid.remote() for r in ranks], timeout=120)
            for r, pid in zip(ranks, pids):
                self.pids[r] = pid
        self.dead.clear()
        return ranks

    def kill(self) -> None:
        ray = import_ray()
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # already dead: nothing to end
                pass
        self.actors = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def run(self, plan, inputs: Sequence[np.ndarray] | None = None, *, iters: int = 1,
            warmup: int = 0, timeout: float = 60.0, step: int = 0, data: str = "sockets",
            die: tuple[int, int] | None = None, delays: Sequence[float] | None = None,
            options: dict | None = None) -> tuple[list, list[float]]:
        """Run ``plan`` once per iteration on the first ``plan.n`` actors. Returns every rank's
        output and the per-iteration times (slowest rank, seconds); :attr:`last` holds the
        :class:`RunReport`.

        ``on_failure = continue`` (data over sockets, where the adaptive executor runs): ranks
        whose actor died get ``None``; the survivors' outputs are
        :class:`~hcc.backends.adaptive.AdaptiveResult` arrays that carry ``contributors`` and
        ``missing``. Otherwise a death raises :class:`RankFailed`/:class:`RootFailed` (with
        every rank's own error in ``.errors`` and the dead ranks in ``.dead``).

        ``die = (rank, k)``: that rank SIGKILLs its own process (``pids[rank]``) in the first
        timed iteration — adaptive runs after its k-th data chunk sent or received, static
        runs at its (k+1)-th send; ``k = 0``: as it enters. ``delays[r]``: seconds rank r
        waits before it enters each iteration (late arrivals). ``options``: keyword options of
        every rank's ``hcc.run`` (e.g. ``quorum``, ``chunk_bytes`` of the adaptive runtime)."""
        ray = import_ray()
        n = plan.n
        if n > self.world:
            raise ValueError(f"hcc ray: plan needs {n} ranks, the group has {self.world}")
        if data not in DATA_PATHS:
            raise ValueError(f"hcc ray: data path {data!r} is not one of {DATA_PATHS}")
        if inputs is not None and len(inputs) != n:
            raise ValueError(f"hcc ray: {len(inputs)} inputs for a plan of {n} ranks")
        if delays is not None and len(delays) != n:
            raise ValueError(f"hcc ray: {len(delays)} delays for a plan of {n} ranks")
        continuing = plan.on_failure == "continue"
        gone = sorted(r for r in self.dead if r < n)
        if gone and not continuing:
            cls = RootFailed if gone[0] == plan.root else RankFailed
            raise cls(gone[0], detail="its actor died in an earlier run; ActorGroup.respawn() "
                      "replaces it")
        actors = self.actors[:n]
        session = uuid.uuid4().hex
        with Coordinator(gone, n) as coord:
            plan_ref = ray.put(plan)
            # Non-roots of broadcast and scatter own no input (the executor uses zeros): not
            # shipping theirs saves (n-1) x size of object store, 3.3 GiB for dgx1's broadcast.
            ignored = {r for r in range(n)
                       if plan.kind in ("broadcast", "scatter") and r != plan.root}
            xs = [None if inputs is None or r in ignored
                  else ray.put(np.ascontiguousarray(inputs[r])) for r in range(n)]
            seconds: list[dict] = []
            spans: list[dict] = []
            died: list[int] = []
            outs: list = [None] * n
            info: dict = {}
            total = warmup + iters
            for it in range(total):
                refs = {}
                for r, a in enumerate(actors):
                    if r in self.dead:
                        continue
                    refs[a.step.remote(
                        plan_ref, r, actors, session, it, xs[r], last=it == total - 1,
                        timeout=timeout, step=step, data=data, rendezvous=coord.address,
                        token=coord.token,
                        die_at=die[1] if die and die[0] == r and it == warmup else None,
                        delay=float(delays[r]) if delays is not None else 0.0,
                        options=options)] = r
                res, dead = self._collect(refs, timeout + _DRIVER_GRACE_S, plan, coord,
                                          continuing)
                died += dead
                if it >= warmup:
                    seconds.append({r: t[0] for r, (_, t, _) in res.items()})
                    spans.append({r: t[1:] for r, (_, t, _) in res.items()})
                if it == total - 1:
                    outs = [_result(*res[r][::2]) if r in res else None for r in range(n)]
                    info = {r: res[r][2] for r in res if res[r][2] is not None}
        self.last = RunReport(tuple(died), tuple(seconds), info, tuple(coord.first),
                              tuple(spans))
        return outs, [max(s.values()) for s in seconds]

    def _collect(self, refs: dict, budget: float, plan, coord: "Coordinator",
                 continuing: bool) -> tuple[dict, list[int]]:
        """Every returning rank's result of one round, and the ranks that died in it (in the
        order Ray told the driver; each is appended to the agreement log at once, so the
        survivors repair without waiting for their transports to notice). Raises the round's
        failure: a survivor's error, or any death unless ``continuing``."""
        ray = import_ray()
        deadline = time.monotonic() + budget
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        dead: list[int] = []
        pending = list(refs)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                late = sorted(refs[p] for p in pending)
                for p in pending:
                    try:
                        ray.cancel(p)  # actor tasks cannot be force-cancelled; the group's
                    except Exception:  # kill() on exit ends the actors themselves
                        pass
                raise RuntimeFault(f"hcc ray: ranks {late} did not finish within {budget:g} s; "
                                   "their actors are killed with the group")
            got, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in got:
                r = refs[ref]
                try:
                    res = ray.get(ref)
                except Exception as e:
                    if is_actor_death(e):
                        dead.append(r)
                        self.dead.add(r)
                        coord.report_dead(r)
                    errors[r] = cause_of(e)
                    continue
                if isinstance(res, dict) and res.get("hcc_error"):
                    errors[r] = unpack_error(res)
                else:
                    results[r] = res
        if any(r not in dead for r in errors) or (dead and not continuing):
            raise _failure(plan, set(dead), errors)
        return results, dead


def _result(out, info):
    """A rank's output as the driver returns it: with the adaptive run's agreement attached."""
    if out is None or info is None:
        return out
    from ..adaptive import AdaptiveResult

    res = out.view(AdaptiveResult)
    for k, v in info.items():
        setattr(res, k, v)
    return res


class Coordinator:
    """The driver's side of one :meth:`ActorGroup.run`: a rendezvous store (so no rank hosts
    it and any rank, rank 0 included, may die) holding the sockets path's addresses and the
    agreement log (backends/agreement.py), to which the driver appends every death Ray
    reports (on the object-store path the store holds only the log).

    Ranks known dead before the call get an address that refuses connections (a port bound
    and closed here), so the others' dials fail at once, and a ``dead`` event in the log."""

    def __init__(self, gone: Sequence[int], world: int):
        self.gone, self.world = list(gone), world  # world: the plan's ranks (sizes the log ring)
        self.address = self.token = None
        self._server = self._log = None
        self.first: list[int] = []  # deaths this driver appended before any rank did

    def __enter__(self):
        from ..agreement import EventLog, log_group
        from ..rendezvous import StoreServer

        self.token = secrets.token_hex(16)
        self._server = StoreServer(self.token, "127.0.0.1", 0)
        self.address = self._server.address
        try:
            self._log = EventLog(self.address, self.token, log_group(SOCKETS_GROUP), timeout=30.0, world=self.world)
            for d in self.gone:
                self.report_dead(d)
            self.first.clear()  # those were known before the call, not noticed in it
        except BaseException:
            self.__exit__()
            raise
        return self

    def report_dead(self, rank: int) -> None:
        """Append ``dead(rank)`` unless a rank's transport already did (agreement.py dedups)
        and, if the rank died before it published its addresses, publish a refusing one and
        "no shared memory" (backends/shm.py's ``- -``) so that the others' ``connect`` does not
        wait for it until its deadline."""
        if self._server is None:
            return
        key = f"{SOCKETS_GROUP}/addr/{rank}"
        if self._server.value(key) is None:
            self._server.put(key, f"127.0.0.1:{free_port()}")
        key = f"{SOCKETS_GROUP}/shm/{rank}"
        if self._server.value(key) is None:
            self._server.put(key, "- -")
        if self._log.report_dead(rank):
            self.first.append(rank)

    def __exit__(self, *exc):
        for x in (self._log, self._server):
            if x is not None:
                x.close()
        self._log = self._server = None


def _failure(plan, dead: set[int], errors: dict[int, BaseException]) -> RuntimeFault:
    survivors = {r: e for r, e in errors.items() if r not in dead}
    lines = "; ".join(str(e) if str(e).startswith("rank ") else f"rank {r}: {e}"
                      for r, e in sorted(survivors.items()))
    if dead:
        who = min(dead)
        cls = RootFailed if plan.root >= 0 and who == plan.root else RankFailed
        err = cls(who, detail=f"Ray reports its actor died; survivors: {lines or 'none failed'}")
    else:
        first = survivors[min(survivors)]
        if isinstance(first, RuntimeFault):
            err = first
        else:
            err = RuntimeFault(f"hcc ray: {lines}")
    err.errors = dict(sorted(errors.items()))  # every rank's own error, for callers and tests
    err.dead = sorted(dead)
    return err


def run(plan, inputs: Sequence[np.ndarray] | None = None, *, timeout: float = 60.0,
        step: int = 0, data: str = "sockets", die: tuple[int, int] | None = None,
        delays: Sequence[float] | None = None) -> list:
    """From a driver: run ``plan`` once over ``plan.n`` rank actors it creates (on the current
    Ray cluster, or a local one it starts and shuts down), and return every rank's output
    (``None`` for a rank whose actor died in a plan with ``on_failure = continue``; the
    survivors' outputs carry ``contributors`` and ``missing``). ``die``, ``delays``: as in
    :meth:`ActorGroup.run`."""
    with local_cluster(num_cpus=max(2, plan.n)):
        with ActorGroup(plan.n) as g:
            outs, _ = g.run(plan, inputs, timeout=timeout, step=step, data=data, die=die,
                            delays=delays)
            return outs


def run_local(plan, inputs: Sequence[np.ndarray], *, iters: int = 1, warmup: int = 0,
              timeout: float = 60.0, **kw):
    """The ``hcc run --backend ray`` entry: a local cluster, one actor per rank, ``warmup +
    iters`` runs; shuts down what it started. Returns a RunResult whose ``detail`` says which
    ranks died (``dead``) and, for adaptive runs, what the survivors agreed (``contributors``,
    ``missing`` per rank). Keywords: ``data``, ``step``, ``die``, ``delays`` (see
    :meth:`ActorGroup.run`)."""
    from ..launch import RunResult

    data = kw.get("data", "sockets")
    with local_cluster(num_cpus=max(2, plan.n)) as ray:
        with ActorGroup(plan.n) as g:
            outs, times = g.run(plan, inputs, iters=iters, warmup=warmup, timeout=timeout,
                                step=kw.get("step", 0), data=data, die=kw.get("die"),
                                delays=kw.get("delays"))
            report = g.last
        node = ray.util.get_node_ip_address()
    detail = {"data": data, "actors": plan.n, "node": node, "dead": list(report.dead)}
    if report.info:
        detail["contributors"] = {r: list(i["contributors"]) for r, i in report.info.items()}
        detail["missing"] = {r: list(i["missing"]) for r, i in report.info.items()}
    return RunResult(outputs=outs, times=times, backend="ray", detail=detail)
