"""hcc.backends.testing — test doubles and harnesses: fault injection from outside the
production send paths, and the local fault / late-arrival job runner.

Terms
- kill switch (:class:`KillSwitch`): a Transport that wraps the real one and SIGKILLs its own
  process at a chosen send — the k-th from now, or the first after a named barrier. The
  transports themselves carry no test hooks (style.md habit 15); the MPI and Ray workers wrap
  their transport in one when a test asks a rank to die.
- case (:class:`Case`): one run of a local job — a plan, a seed for every rank's input, an
  optional kill (after the victim's k-th data chunk, through the adaptive runtime's
  ``progress`` hook), per-rank start delays (late arrivals), the run options, and which engine
  runs it ("adaptive", "static" or "hop", a one-link reference transfer).
- job: one process per rank runs every case in order over one sockets communicator (a rank
  killed in one case stays dead, known to the agreement log, in the next); the processes are
  started by :func:`~hcc.backends.launch.local_ranks`, like every local job, and write their
  records and outputs into the job directory. Used by tests/runtime/test_faults*.py,
  tests/runtime/test_late.py and benchmarks/fault_bench.py.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..ir.files import atomic_write_text
from ..ir.plan import Plan
from .adaptive import AdaptiveResult, close_session, session_of
from .base import RuntimeFault, Transport
from .launch import local_ranks
from .rendezvous import RendezvousError
from .runtime import run

__all__ = ["KillSwitch", "kill_after_chunks", "Case", "Outcome", "run_local", "barrier", "HOP_TAG"]

HOP_TAG = 0xFFFFFFFE  # the "hop" engine's one transfer (outside every plan's and the adaptive runtime's tags)


class KillSwitch(Transport):
    """``inner`` with a switch that SIGKILLs this process at a send (``isend`` or, for
    persistent transfers, ``start_all``): the ``after_sends + 1``-th send from now, or the first
    send after the barrier named ``at_barrier`` (``launch.worker_run`` names iteration ``k`` of
    case 0 ``c0/i<k>``). Everything else is the inner transport's, capabilities included, so
    the runtime runs a plan over the wrapped transport exactly as over the bare one."""

    def __init__(self, inner: Transport, *, after_sends: int | None = None, at_barrier: str | None = None):
        self.inner = inner
        self.name, self.rank, self.world = inner.name, inner.rank, inner.world
        self.capabilities = inner.capabilities
        self._left = after_sends
        self._at_barrier = at_barrier

    def __getattr__(self, attr: str) -> Any:
        # what the wrapper does not define (store, token, irecv_fold, send_init, barrier's
        # helpers, ...) is the inner transport's own
        return getattr(self.inner, attr)

    def _sending(self) -> None:
        if self._left is not None:
            if self._left <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
            self._left -= 1

    def isend(self, peer: int, tag: int, data: memoryview):
        self._sending()
        return self.inner.isend(peer, tag, data)

    def irecv(self, peer: int, tag: int, buf: memoryview):
        return self.inner.irecv(peer, tag, buf)

    def start_all(self, requests) -> None:
        self._sending()
        self.inner.start_all(requests)

    def wait_any(self, requests, timeout: float) -> list[int]:
        return self.inner.wait_any(requests, timeout)

    def wait_change(self, requests, timeout, **kw) -> list[int]:
        return self.inner.wait_change(requests, timeout, **kw)

    def failed(self) -> frozenset[int]:
        return self.inner.failed()

    def wake(self) -> None:
        self.inner.wake()

    def bind_plan(self, plan_id: int, max_message: int) -> None:
        self.inner.bind_plan(plan_id, max_message)

    def barrier(self, name: str = "", timeout: float = 60.0) -> None:
        self.inner.barrier(name, timeout)
        if self._at_barrier is not None and name == self._at_barrier:
            self._left = 0  # die at the next send

    def close(self) -> None:
        self.inner.close()


def kill_after_chunks(k: int, before: Callable[[], None] | None = None) -> Callable[[], None]:
    """A ``progress`` callback for the adaptive runtime (called after every data chunk this
    rank sends or receives) that SIGKILLs this process at the ``k``-th chunk, after calling
    ``before()`` when given (the job harness saves its records first)."""
    count = [0]

    def progress() -> None:
        count[0] += 1
        if count[0] >= k:
            if before is not None:
                before()
            os.kill(os.getpid(), signal.SIGKILL)

    return progress


# --------------------------------------------------------------------------- local fault jobs

@dataclass
class Case:
    """One run of a local job. ``kill=(rank, k)``: that rank SIGKILLs itself after its k-th
    data chunk; ``delays[r]``: seconds rank r waits after the start barrier (late arrivals);
    ``engine``: "adaptive" (the runtime's ``run`` with the adaptive options ``adaptive``,
    ``quorum``, ``chunk_bytes``, ``trace``), "static" (the flattened programs, adaptive off)
    or "hop" (rank 0 sends its whole input to rank 1: one link's time for the same bytes)."""

    plan: Plan
    seed: int = 0
    kill: tuple[int, int] | None = None
    delays: tuple[float, ...] = ()
    quorum: int | None = None
    adaptive: bool | None = None
    engine: str = "adaptive"
    chunk_bytes: int | None = None
    trace: bool = False  # record the star allreduce's per-chunk events (run(trace=True))
    save: bool = True  # write the outputs back (64 MiB x ranks per case: benchmarks save few)


@dataclass
class Outcome:
    """What each rank of one case did: ``outputs[r]`` (None if it raised or died), ``errors[r]``,
    ``info[r]`` (contributors, missing, late, dead, seconds from the start barrier, and
    cpu_seconds: the rank process's CPU time over those seconds)."""

    outputs: list
    errors: dict
    info: dict


def run_local(cases: Sequence[Case], *, timeout: float = 20.0, overall: float = 300.0,
              wrap: Callable[[int, list[str]], list[str]] | None = None, hosts: Sequence[str] | None = None,
              store_host: str = "127.0.0.1", store_keys: list | None = None) -> list[Outcome]:
    """Run ``cases`` in order on ``plan.n`` local processes over sockets; SIGKILLed ranks are
    expected (the outcomes say who died), not errors.

    ``wrap(rank, argv)`` may rewrite a rank's command line, ``hosts[rank]`` sets the address
    it listens on and ``store_host`` where the launcher serves the rendezvous store — the
    keywords of :func:`~hcc.backends.launch.run_cases_local` (both start their ranks with
    :func:`~hcc.backends.launch.local_ranks`), so ``Netem.launch_kwargs(plan.ranks)``
    runs every rank in its ``hcc netem`` namespace (call this inside
    ``with emulation.inside(plan.ranks[0]):`` so the store's socket is made there).
    ``store_keys``: a list that receives every key the launcher's store holds when the job
    ends (the agreement log's footprint, tests/runtime/test_late.py)."""
    world = cases[0].plan.n
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="hcc-adaptive-") as tmp:
        job = Path(tmp)
        spec = []
        for i, c in enumerate(cases):
            if c.plan.n != world:
                raise RuntimeFault(f"case {i}: {c.plan.n} ranks, the job has {world}")
            # a plan file says adaptive true or false (ir/serialize.py); None (the backend's
            # default) travels beside it
            replace(c.plan, adaptive=bool(c.plan.adaptive)).save(job / f"case{i}.plan.json")
            spec.append({"plan": f"case{i}.plan.json", "plan_adaptive": c.plan.adaptive, "seed": c.seed,
                         "kill": c.kill, "delays": list(c.delays),
                         "quorum": c.quorum, "adaptive": c.adaptive, "engine": c.engine,
                         "chunk_bytes": c.chunk_bytes, "trace": c.trace, "save": c.save})
        atomic_write_text(job / "job.json", json.dumps({"timeout": timeout, "cases": spec}))
        if hosts is not None and len(hosts) != world:
            raise RuntimeFault(f"run_local: {len(hosts)} hosts for {world} ranks")

        def argv_of(r: int, store: str) -> list[str]:
            argv = [sys.executable, "-m", "hcc.backends.testing", str(job), str(r), str(world), store]
            return argv + [hosts[r]] if hosts is not None else argv

        with local_ranks(job, world, argv_of, token, store_host=store_host, wrap=wrap) as (store, procs):
            end = time.monotonic() + overall
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(0.02)
            for p in procs:  # past the deadline: end them before the store's keys are read
                if p.poll() is None:
                    p.kill()
                p.wait()
            if store_keys is not None:
                # the store has no list operation (its clients only need named keys); the
                # launcher serves it in this process and reads its table directly
                with store._cond:
                    store_keys.extend(sorted(store._data))
        results = []
        for r in range(world):
            path = job / f"result{r}.json"
            results.append(json.loads(path.read_text()) if path.exists() else {"cases": {}})
        outs = []
        for i, c in enumerate(cases):
            outputs, errors, info = [], {}, {}
            for r in range(world):
                rec = results[r]["cases"].get(str(i))
                if rec is None:
                    outputs.append(None)
                    errors[r] = "died" if procs[r].returncode == -9 else (
                        f"exited {procs[r].returncode}: " + (job / f"rank{r}.log").read_text(errors="replace")[-800:])
                    continue
                if "error" in rec:
                    outputs.append(None)
                    errors[r] = rec["error"]
                else:
                    path = job / f"case{i}.out{r}.npy"
                    outputs.append(np.load(path) if path.exists() else None)
                info[r] = rec
            outs.append(Outcome(outputs, errors, info))
        return outs


def barrier(comm: Transport, name: str, timeout: float) -> None:
    """Every live rank meets here (the log's dead set tells who is live); deaths this rank's
    transport saw are reported first so that nobody waits for a dead rank."""
    sess = session_of(comm)
    key = f"{sess.log.prefix}/barrier/{name}"
    sess.log.client.add(key, 1)
    end = time.monotonic() + timeout
    while True:
        for d in set(comm.failed()) - sess.reported:
            sess.reported.add(d)
            sess.log.report_dead(d)
        dead = set(sess.tail.dead())
        try:
            sess.log.client.wait(key, comm.world - len(dead), 0.1)
            return
        except RendezvousError as e:
            if "timeout" not in str(e) or time.monotonic() > end:
                raise


def _worker(job_dir: str, rank: int, world: int, store: str, host: str = "127.0.0.1") -> int:
    from .reference import make_input
    from .sockets import connect

    job = Path(job_dir)
    spec = json.loads((job / "job.json").read_text())
    timeout = float(spec["timeout"])
    result: dict = {"cases": {}, "t_start": time.time()}
    comm = connect(rank, world, store, os.environ["HCC_TOKEN"], timeout, serve_store=False, host=host)

    result["t_connected"] = time.time()

    def save() -> None:
        atomic_write_text(job / f"result{rank}.json", json.dumps(result))

    try:
        for i, case in enumerate(spec["cases"]):
            plan = replace(Plan.load(job / case["plan"]), adaptive=case["plan_adaptive"])
            x = make_input(plan, case["seed"], rank)
            rec: dict = {}
            kill = case["kill"]
            progress = kill_after_chunks(kill[1], before=save) if kill is not None and kill[0] == rank else None

            t0 = time.perf_counter()
            cpu0 = time.process_time()
            try:
                result[f"t_in{i}"] = time.time()
                barrier(comm, f"start/{i}", timeout)
                result[f"t_bar{i}"] = time.time()
                t0 = time.perf_counter()
                cpu0 = time.process_time()
                delays = case["delays"]
                if delays and delays[rank] > 0:
                    time.sleep(delays[rank])
                if kill is not None and kill[0] == rank and kill[1] <= 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                if case["engine"] == "hop":
                    # one link, the whole buffer: rank 0 sends its input to rank 1, the others
                    # idle (fault_bench's one-hop time, measured inside the same job)
                    if rank in (0, 1):
                        buf = x if rank == 0 else np.empty_like(x)
                        view = memoryview(buf).cast("B")
                        req = comm.isend(1, HOP_TAG, view) if rank == 0 else comm.irecv(0, HOP_TAG, view)
                        end = time.monotonic() + timeout
                        while not req.done and time.monotonic() < end:
                            comm.wait_any([req], max(0.0, end - time.monotonic()))
                    out = x
                    rec.update(contributors=[], missing=[], late=[], dead=[])
                elif case["engine"] == "static":
                    # the flattened programs (the runtime would give a plan with on_failure =
                    # continue to the adaptive runtime: the comparison needs the static one)
                    out = run(replace(plan, on_failure="abort", adaptive=False), comm, x, timeout=timeout)
                    rec.update(contributors=list(range(world)), missing=[], late=[], dead=[])
                else:
                    # a progress hook (only when this case kills) turns the fast path off: on
                    # every rank, not only the victim, so that all of them decide alike
                    hook = progress or ((lambda: None) if kill is not None else None)
                    out = run(plan, comm, x, timeout=timeout, quorum=case["quorum"], adaptive=case["adaptive"],
                              chunk_bytes=case["chunk_bytes"], progress=hook, trace=bool(case.get("trace")))
                    if isinstance(out, AdaptiveResult):
                        rec.update(contributors=list(out.contributors), missing=list(out.missing),
                                   late=list(out.late), dead=list(out.dead), stats=out.stats,
                                   generation=out.generation)
                    else:  # the static program ran (adaptive off, or the fast path)
                        rec.update(contributors=list(range(world)), missing=[], late=[], dead=[],
                                   stats={"path": "static"}, generation=0)
                rec["seconds"] = time.perf_counter() - t0
                # this process's CPU time (every thread) over the same span: against
                # ``seconds`` it says whether the rank waited on its links or on a core
                rec["cpu_seconds"] = time.process_time() - cpu0
                rec["log_length"] = session_of(comm).log.length()  # events in the agreement log
                if case["save"]:
                    np.save(job / f"case{i}.out{rank}.npy", np.asarray(out))
            except RuntimeFault as e:
                rec["seconds"] = time.perf_counter() - t0
                rec["error"] = f"{type(e).__name__}: {e}"
                rec["error_type"] = type(e).__name__
                rec["failed_rank"] = getattr(e, "rank", None)
            result["cases"][str(i)] = rec
            save()
    finally:
        result["t_cases_done"] = time.time()
        save()
        close_session(comm)
        comm.close()
        result["t_closed"] = time.time()
        save()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:6]))
