"""hcc.backends.mpi — the ``mpi`` backend: a Transport over mpi4py, and a local launcher.

Terms
- *communicator*: an mpi4py ``Comm`` (usually ``MPI.COMM_WORLD``); hcc rank ``r`` is MPI rank
  ``r`` of that communicator, so a plan of ``n`` ranks needs a communicator of size ``n``.
- *job directory*: the temporary directory :func:`run_local` shares with the ranks it starts,
  in backends/launch.py's format (``job.json``, plans, inputs; each rank writes back its
  per-iteration times or its error, and its output), so the sockets and MPI launchers share
  one worker loop (``launch.worker_run``).

The Transport maps the plan IR's messages one to one onto MPI point-to-point messages
(design.md "Runtime"): ``isend``/``irecv`` are ``Isend``/``Irecv`` on the caller's memory (a
``memoryview`` of a numpy slice, cast to bytes — no copy), the MPI tag is the plan's tag (the IR
keeps tags below 2**24; MPICH's ``MPI_TAG_UB`` here is 2**29 - 1, and the bound is checked at
construction), and ``wait_any`` is ``MPI_Testsome`` in a bounded polling loop with a deadline
(yielding the core between tests for the first 20 ms, then napping).

Failures: MPICH cannot survive a dead process (the job's communicators are unusable once a
rank is gone). On a timeout or any error the embedding helpers and the launched workers write
the error and call ``MPI.COMM_WORLD.Abort``, which ends every rank of the job; the launcher then
raises :class:`~hcc.backends.base.RuntimeFault` with the messages the ranks left. See
docs/backends.md.

Embedding, one call per rank inside the user's own ``mpiexec`` job::

    from mpi4py import MPI
    import hcc.backends.mpi
    comm = hcc.backends.mpi.MPIBackend(MPI.COMM_WORLD)
    out = plan.run(comm, array)
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..ir.errors import PlanError
from ..ir.files import atomic_write_text
from .base import CollectiveTimeout, Request, RuntimeFault, Transport, register

__all__ = [
    "MPIBackend", "MPIRequest", "available", "bench_hcc", "bench_native", "bench_pair",
    "find_mpiexec", "loopback_env", "native_collective", "run_cases_local", "run_local",
]

# Poll schedule of wait_any: test this many times back to back, then sleep between tests,
# doubling from _NAP_MIN to _NAP_MAX. Measured on this 2-core machine shared with other jobs
# (load average ~12), 4 ranks, 16 MiB broadcast, hcc time / MPICH Bcast time in one job (below
# 1: hcc faster), one figure per run: 64 tests, naps to 1 ms: 0.58 0.68 0.84 1.94; 64 tests,
# naps to 0.5 ms: 0.73 0.72; 16 tests, naps to 2 ms: 1.46 2.17; 2000 tests, naps to 0.1 ms:
# 1.93 2.22; never sleeping: 2.67 1.53 (4 spinning ranks starve each other of 2 cores).
_SPIN = 64
# Before any nap, wait_any first spends up to _YIELD_S testing with ``os.sched_yield()``
# between tests: the core goes to another runnable rank (4 ranks, 2 cores) at once, and MPICH's
# rendezvous copies progress only inside a Test call, so a 20 us..1 ms nap stalls every
# message of the pipeline behind it. Measured (machine otherwise idle, 4 ranks, 10 iterations,
# hcc/MPICH busbw, two runs each) at 1 MiB allreduce/broadcast/allgather: no yield 0.36/0.11/0.41
# and 0.53/0.11/0.54; 2 ms 0.70/0.84/0.97 and 0.74/0.68/1.01; 20 ms 1.08/0.56/1.09 and
# 0.75/0.93/1.50; 16 MiB went from 1.13-1.32/0.55-0.77/1.38-2.28 to 1.29-1.32/1.41-1.54/1.93-2.91.
# A wait longer than 20 ms (a late peer) falls back to the naps, so it does not burn a core.
_YIELD_S = 20e-3
_NAP_MIN = 20e-6
_NAP_MAX = 1e-3
# Extra wall time granted to a whole launched job beyond the per-wait deadlines: a 4-rank job
# of one small plan takes 1-2 s here, most of it interpreter, numpy and mpi4py start-up.
_JOB_GRACE_S = 30.0

def available() -> bool:
    """True when mpi4py and its MPI extension are installed. Checked without importing
    ``mpi4py.MPI``: that import initialises MPI, and a singleton MPICH opens UCX listeners on
    every interface of the calling process (seen with ``ss -ltnp`` in the test runner)."""
    import importlib.util

    try:
        return importlib.util.find_spec("mpi4py.MPI") is not None
    except ImportError:  # mpi4py itself is absent
        return False


class MPIRequest(Request):
    """One outstanding ``Isend``/``Irecv``; keeps the memory it reads or writes alive."""

    __slots__ = ("req", "peer", "tag", "what", "nbytes", "buf", "done")

    def __init__(self, req, peer: int, tag: int, what: str, buf: memoryview):
        self.req, self.peer, self.tag, self.what, self.buf = req, peer, tag, what, buf
        self.nbytes = buf.nbytes
        self.done = False

    def describe(self) -> str:
        return f"{self.what} tag {self.tag}, {self.nbytes} B"


def _as_bytes(view) -> memoryview:
    """A byte-format memoryview of the same memory (zero-copy; C-contiguous required)."""
    mv = view if isinstance(view, memoryview) else memoryview(view)
    if not mv.c_contiguous:
        raise ValueError("hcc mpi: buffers must be C-contiguous")
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


@register
class MPIBackend(Transport):
    """The plan's Transport over an mpi4py communicator (rank = MPI rank, world = size)."""

    name = "mpi"

    def __init__(self, comm=None, *, abort_on_fault: bool = True):
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.world = self.comm.Get_size()
        self.abort_on_fault = abort_on_fault
        ub = self.comm.Get_attr(MPI.TAG_UB)
        # The IR promises tags < 2**24; the MPI standard only promises TAG_UB >= 32767.
        self.tag_ub = int(ub) if ub is not None else 32767
        self.kill_at_iteration: int | None = None  # fault tests: SIGKILL at the first send
        self._die_armed = False  # of that iteration of the first case (see barrier)
        # track_completions(True): every request posted since, not yet seen complete, and its
        # MPI request in a parallel list that Testsome reads as it is (wait_completed)
        self._live: list[MPIRequest] | None = None
        self._live_reqs: list = []
        # persistent requests made by send_init/recv_init, freed by close() or at exit (MPICH
        # warns about every persistent request still allocated at MPI_Finalize); ``generation``
        # counts the closes, so a bound run made before one knows its requests are gone
        self._persistent: list[MPIRequest] = []
        self.generation = 0
        self._atexit = False

    @classmethod
    def available(cls) -> bool:
        return available()

    def _check(self, peer: int, tag: int) -> None:
        if not 0 <= peer < self.world or peer == self.rank:
            raise PlanError(f"rank {self.rank}: peer {peer} is not another rank of {self.world}")
        if not 0 <= tag <= self.tag_ub:
            raise PlanError(f"rank {self.rank}: tag {tag} is outside 0..MPI_TAG_UB={self.tag_ub}")

    def isend(self, peer: int, tag: int, data: memoryview) -> MPIRequest:
        self._check(peer, tag)
        if self._die_armed:
            os.kill(os.getpid(), signal.SIGKILL)
        mv = _as_bytes(data)
        req = self.comm.Isend([mv, self._MPI.BYTE], dest=peer, tag=tag)
        r = MPIRequest(req, peer, tag, "send", mv)
        if self._live is not None:
            self._live.append(r)
            self._live_reqs.append(req)
        return r

    def irecv(self, peer: int, tag: int, buf: memoryview) -> MPIRequest:
        self._check(peer, tag)
        mv = _as_bytes(buf)
        if mv.readonly:
            raise ValueError("hcc mpi: receive buffer is read-only")
        req = self.comm.Irecv([mv, self._MPI.BYTE], source=peer, tag=tag)
        r = MPIRequest(req, peer, tag, "recv", mv)
        if self._live is not None:
            self._live.append(r)
            self._live_reqs.append(req)
        return r

    # -- persistent transfers: the executor's bound runs (backends/executor.py, BoundRun) ------
    def send_init(self, peer: int, tag: int, data: memoryview) -> MPIRequest:
        """A persistent send of ``data`` (``MPI_Send_init``): posted by :meth:`start_all`, any
        number of times, until :meth:`free_all` or :meth:`close`."""
        self._check(peer, tag)
        mv = _as_bytes(data)
        return self._keep(MPIRequest(self.comm.Send_init([mv, self._MPI.BYTE], dest=peer, tag=tag),
                                     peer, tag, "send", mv))

    def recv_init(self, peer: int, tag: int, buf: memoryview) -> MPIRequest:
        """A persistent receive into ``buf`` (``MPI_Recv_init``); see :meth:`send_init`."""
        self._check(peer, tag)
        mv = _as_bytes(buf)
        if mv.readonly:
            raise ValueError("hcc mpi: receive buffer is read-only")
        return self._keep(MPIRequest(self.comm.Recv_init([mv, self._MPI.BYTE], source=peer, tag=tag),
                                     peer, tag, "recv", mv))

    def _keep(self, r: MPIRequest) -> MPIRequest:
        if not self._atexit:  # before mpi4py's own exit hook (registered at import) finalizes
            atexit.register(self.close)
            self._atexit = True
        self._persistent.append(r)
        return r

    def start_all(self, requests: Sequence[MPIRequest]) -> None:
        """Post persistent requests (``MPI_Startall``), in the given order."""
        if self._die_armed:
            os.kill(os.getpid(), signal.SIGKILL)
        self._MPI.Prequest.Startall([r.req for r in requests])

    def wait_some(self, requests: Sequence[MPIRequest], timeout: float) -> list[int]:
        """Sorted indices of the started ``requests`` that completed (at least one); the
        polling and deadline of :meth:`wait_any`. A persistent request is inactive again
        once it completed: the caller drops it from the list it passes next."""
        return self._poll(requests, [r.req for r in requests], timeout)

    def free_all(self, requests: Sequence[MPIRequest]) -> None:
        """Free persistent requests that are not active (``MPI_Request_free``)."""
        gone = {id(r) for r in requests}
        for r in requests:
            r.req.Free()
        self._persistent = [r for r in self._persistent if id(r) not in gone]

    def close(self) -> None:
        """Free every persistent request this communicator made; bound runs made before
        see ``generation`` change and bind again."""
        if self._persistent and not self._MPI.Is_finalized():
            for r in self._persistent:
                r.req.Free()
        self._persistent = []
        self.generation += 1

    def track_completions(self, on: bool) -> None:
        """Keep every request posted from now on for :meth:`wait_completed` (the executor's
        fast path), until called with ``False``."""
        self._live = [] if on else None
        self._live_reqs = []

    def wait_completed(self, timeout: float) -> list[MPIRequest]:
        """The tracked requests that completed (at least one), same polling and deadline as
        :meth:`wait_any`, without rebuilding the list of outstanding requests on each call
        (the executor's loop did that twice per completion: under MPI at 1 MiB, with 4 ranks
        on 2 cores, each rank's Python between two completions is on the critical path)."""
        live, reqs = self._live, self._live_reqs
        if not live:
            raise RuntimeFault(f"rank {self.rank}: wait_completed with no outstanding request")
        idx = self._poll(live, reqs, timeout)
        done = [live[i] for i in idx]
        for r in done:
            r.done = True
        if len(done) == len(live):
            live.clear()
            reqs.clear()
        else:
            gone = set(idx)
            self._live = [r for i, r in enumerate(live) if i not in gone]
            self._live_reqs = [q for i, q in enumerate(reqs) if i not in gone]
        return done

    def wait_any(self, requests: Sequence[MPIRequest], timeout: float) -> list[int]:
        ready = [i for i, r in enumerate(requests) if r.done]
        if ready or not requests:
            return ready
        idx = self._poll(requests, [r.req for r in requests], timeout)
        for i in idx:
            requests[i].done = True
        return idx

    def _poll(self, requests: Sequence[MPIRequest], reqs: list, timeout: float) -> list[int]:
        """Indices (sorted) of ``reqs`` that completed: ``MPI_Testsome`` in the polling
        schedule above, until one completes or ``timeout`` passes."""
        start = time.monotonic()
        deadline, yield_until = start + timeout, start + _YIELD_S
        tests, nap = 0, _NAP_MIN
        while True:
            idx = self._MPI.Request.Testsome(reqs)
            if idx:
                return sorted(idx)
            if idx is None:  # every request inactive: all completed earlier
                return list(range(len(requests)))
            now = time.monotonic()
            if now >= deadline:
                oldest = requests[0]
                raise CollectiveTimeout(self.rank, oldest.peer, oldest.describe(), timeout)
            if now < yield_until:
                os.sched_yield()
                continue
            tests += 1
            if tests > _SPIN:
                time.sleep(nap)
                nap = min(nap * 2, _NAP_MAX)

    def barrier(self, name: str = "", timeout: float = 60.0) -> None:
        """All ranks meet (``MPI_Ibarrier`` polled with the same deadline as ``wait_any``);
        ``name`` is only for messages (launch.worker_run names each iteration ``c<i>/i<k>``)."""
        if self.kill_at_iteration is not None and name == f"c0/i{self.kill_at_iteration}":
            self._die_armed = True
        req = MPIRequest(self.comm.Ibarrier(), -1, -1, f"barrier {name}",
                         memoryview(b""))
        self.wait_any([req], timeout)

    def abort(self, error: BaseException, code: int = 3) -> None:
        """Write why, then end the whole MPI job: MPICH cannot continue after a failed rank,
        so aborting is the only way survivors do not hang (docs/backends.md)."""
        sys.stderr.write(
            f"hcc mpi: {error}\n"
            f"hcc mpi: rank {self.rank}: aborting the MPI job (MPI_Abort): MPICH cannot "
            "continue a collective after a rank failed or timed out\n"
        )
        sys.stderr.flush()
        self._MPI.COMM_WORLD.Abort(code)
        os._exit(code)  # gforker's Abort can return to the caller before the job is torn down

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and self.abort_on_fault and isinstance(exc, (RuntimeFault, OSError)):
            self.abort(exc)
        self.close()


# --------------------------------------------------------------------------- native peer

def _mpi_op(MPI, op: str | None):
    return {None: MPI.SUM, "sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN,
            "max": MPI.MAX}[op]


def native_collective(kind: str, comm, inp: np.ndarray, out: np.ndarray, root: int = 0,
                      op: str | None = "sum") -> np.ndarray:
    """Run MPICH's own collective ``kind`` on ``inp``/``out`` (the plan's buffer layout,
    ir.plan.buffer_layout) — the native peer of benchmarks. Returns ``out``."""
    from mpi4py import MPI

    n = comm.Get_size()
    mop = _mpi_op(MPI, op)
    if kind == "allreduce":
        comm.Allreduce(inp, out, op=mop)
    elif kind == "reduce":
        comm.Reduce(inp, out, op=mop, root=root)
    elif kind == "broadcast":
        if comm.Get_rank() == root:
            out[...] = inp
        comm.Bcast(out, root=root)
    elif kind in ("allgather", "gather", "reduce_scatter", "scatter"):
        e = out.size if kind in ("allgather", "gather") else inp.size
        counts = [((i + 1) * e // n) - (i * e // n) for i in range(n)]
        displs = [i * e // n for i in range(n)]
        if kind == "allgather":
            comm.Allgatherv(inp, [out, counts, displs, None])
        elif kind == "gather":
            comm.Gatherv(inp, [out, counts, displs, None], root=root)
        elif kind == "scatter":
            comm.Scatterv([inp, counts, displs, None], out, root=root)
        else:
            comm.Reduce_scatter(inp, out, recvcounts=counts, op=mop)
    elif kind == "alltoall":
        comm.Alltoall(inp, out)
    else:
        raise ValueError(f"no native MPI peer for collective kind {kind!r}")
    return out


# --------------------------------------------------------------------------- launching

def find_mpiexec() -> list[str]:
    """The launcher command: the ``mpich`` wheel's programs beside ``sys.executable``, else
    PATH. ``mpiexec.gforker`` is preferred: it forks the ranks and talks to them over pipes, so
    the job opens no TCP listener at all, where hydra's ``mpiexec`` listens on 0.0.0.0 for its
    proxies (measured with ``ss -ltn``; ``-iface lo`` only moves the data network)."""
    here = Path(sys.executable).parent
    choices = (("mpiexec.gforker", []), ("mpiexec", ["-iface", "lo"]))
    for name, extra in choices:
        p = here / name
        if p.exists():
            return [str(p), *extra]
    for name, extra in choices:
        found = shutil.which(name)
        if found:
            return [found, *extra]
    raise RuntimeFault("hcc mpi: no mpiexec found beside the Python interpreter or on PATH "
                       "(pip install mpich)")


def loopback_env() -> dict[str, str]:
    """The environment of launched ranks: every MPI data path on the loopback interface.
    MPICH's UCX netmod otherwise listens on every interface (seen on eth0 with ``ss -ltn``);
    ranks on one machine move data through shared memory anyway."""
    env = dict(os.environ)
    env.setdefault("UCX_NET_DEVICES", "lo")
    env.setdefault("HYDRA_IFACE", "lo")
    env.setdefault("FI_TCP_IFACE", "lo")
    return env


# MPICH's shared-memory segments: /dev/shm/mpich_shm_<hash>_<i>, unlinked by the ranks at
# MPI_Finalize. A job that ends in MPI_Abort or with a SIGKILLed rank leaves them behind, and
# a later job whose name hashes the same (gforker's names follow the launcher's pid, and this
# machine's pid_max is 32768) then fails in MPI_Init with "MPIDI_POSIX_comm_bootstrap: Out of
# memory" — seen once in a full test run after 76 segments had piled up over a day.
_SHM_DIR = Path("/dev/shm")
_SHM_PREFIX = "mpich_shm_"


def _shm_segments() -> set[str]:
    try:
        return {p.name for p in _SHM_DIR.iterdir() if p.name.startswith(_SHM_PREFIX)}
    except OSError:
        return set()


def _mapped_segments() -> set[str]:
    """Names of the MPICH segments some live process still maps (from /proc/PID/maps)."""
    mapped: set[str] = set()
    needle = f"{_SHM_DIR}/{_SHM_PREFIX}"
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        at = text.find(needle)
        while at >= 0:
            end = text.find("\n", at)
            mapped.add(text[at + len(str(_SHM_DIR)) + 1:end if end >= 0 else None].split()[0])
            at = text.find(needle, at + 1)
    return mapped


@contextlib.contextmanager
def reaping_shm():
    """Around one mpiexec job: afterwards, unlink the MPICH segments that appeared during it
    and that no live process maps — what its own aborted or killed ranks left. Segments that
    existed before, or that another running job maps, are never touched."""
    before = _shm_segments()
    try:
        yield
    finally:
        new = _shm_segments() - before
        # an aborted job's ranks may still be exiting (mapping their segment) when mpiexec
        # returns: look again for up to 2 s (a fresh-clone CI run once left one segment behind)
        for _ in range(20):
            if not new:
                break
            for name in new - _mapped_segments():
                try:
                    (_SHM_DIR / name).unlink()
                except OSError:
                    pass
            new = _shm_segments() & new
            if new:
                time.sleep(0.1)


def _launch(job: Path, world: int, extra: list[str], wall: float) -> tuple[int, str]:
    cmd = [*find_mpiexec(), "-n", str(world), sys.executable, "-m", "hcc.backends.mpi",
           "--job", str(job), *extra]
    with reaping_shm():
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=loopback_env(), timeout=wall)
        except subprocess.TimeoutExpired as e:
            out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else ""
            return -9, out + f"\nhcc mpi: the mpiexec job did not end within {wall:g} s; killed"
    return proc.returncode, proc.stdout.decode(errors="replace")


def _collect(job: Path, world: int, n_cases: int, code: int, log: str):
    from .launch import RunFailed, RunResult

    errors: dict[int, str] = {}
    per_rank = []
    # gforker reports each rank as "[0]R:Return code = C[, signaled with NAME]"
    signals = {int(m.group(1)): m.group(2) for m in
               re.finditer(r"\[\d+\](\d+):Return code = -?\d+, signaled with (\w+)", log)}
    ours = [l.strip() for l in log.splitlines() if l.startswith("hcc mpi:")]
    for r in range(world):
        path = job / f"result{r}.json"
        res = json.loads(path.read_text()) if path.exists() else None
        if res is None or not res.get("ok"):
            if res is not None and res.get("error"):
                errors[r] = res["error"]
            elif signals.get(r) == "Killed":
                errors[r] = "killed (SIGKILL)"
            elif r in signals:
                errors[r] = (f"stopped by mpiexec ({signals[r]}) after another rank failed: "
                             "MPICH cannot continue a job with a dead rank")
            else:
                why = "; ".join(ours) or log.strip()[-400:]
                errors[r] = (f"no result; the MPI job ended with status {code}"
                             + (f": {why}" if why else ""))
        per_rank.append(res)
    if errors:
        raise RunFailed("mpi", errors)
    results = []
    for i in range(n_cases):
        rank_times = [per_rank[r]["cases"][i]["times"] for r in range(world)]
        times = [max(ts) for ts in zip(*rank_times)]
        outs = []
        for r in range(world):
            p = job / f"case{i}.out{r}.npy"
            outs.append(np.load(p) if p.exists() else None)
        results.append(RunResult(outs, times, "mpi", {"rank_times": rank_times,
                                                      "launcher": find_mpiexec()[0]}))
    return results


def _wall(timeout: float, n_iters: int, world: int) -> float:
    return _JOB_GRACE_S + timeout * (2 + n_iters) + 0.5 * world


def run_cases_local(cases: Sequence[tuple], *, iters: int = 1, warmup: int = 0,
                    timeout: float = 60.0, step: int = 0, kill: tuple[int, int] | None = None,
                    wall: float | None = None) -> list:
    """Run each ``(plan, inputs_or_seed)`` case in order in ONE mpiexec job (start-up of the
    ranks costs ~1 s of this 2-core machine; a grid pays it once). Every plan must have the
    same rank count. ``kill = (rank, iteration)``: that rank SIGKILLs itself before that
    iteration of the first case (fault tests). Returns one RunResult per case."""
    from .launch import prepare_job

    with tempfile.TemporaryDirectory(prefix="hcc-mpi-") as tmp:
        job = Path(tmp)
        world = prepare_job(job, cases, iters, warmup, timeout, step)
        extra = ["--kill", f"{kill[0]}:{kill[1]}"] if kill else []
        budget = wall or _wall(timeout, len(cases) * (iters + warmup), world)
        code, log = _launch(job, world, extra, budget)
        return _collect(job, world, len(cases), code, log)


def run_local(plan, inputs, *, iters: int = 1, warmup: int = 0, timeout: float = 60.0, **kw):
    """``hcc run --backend mpi``: ``plan`` on ``plan.n`` local MPI ranks under the ``mpich``
    wheel's launcher. ``times`` are per measured iteration, the slowest rank's, in seconds."""
    return run_cases_local([(plan, inputs)], iters=iters, warmup=warmup, timeout=timeout,
                           step=kw.get("step", 0), kill=kw.get("kill"), wall=kw.get("wall"))[0]


def bench_pair(plan, inputs, iters: int, warmup: int = 1,
               timeout: float = 60.0) -> tuple[list[float], list[float]]:
    """hcc's plan against MPICH's own collective of the same kind, size, dtype and op, on the
    same input buffers, in the same mpiexec job: ``(hcc_times, native_times)`` in seconds, per
    iteration, slowest rank. The two alternate iteration by iteration (which one goes first
    alternates too), each after the same ``MPI_Barrier``, so a noisy moment of the shared
    machine falls on both; hcc's output array is given from the first warm-up on, so the
    bound run (:class:`~hcc.backends.executor.BoundRun`) is made before anything is timed.
    hcc's last output is checked against the numpy reference."""
    from .launch import prepare_job
    from .reference import check, expected

    with tempfile.TemporaryDirectory(prefix="hcc-mpi-") as tmp:
        job = Path(tmp)
        world = prepare_job(job, [(plan, inputs)], iters, warmup, timeout)
        code, log = _launch(job, world, ["--pair", plan.kind],
                            _wall(timeout, 2 * (iters + warmup), world))
        path = job / "pair.json"
        if code != 0 or not path.exists():
            raise RuntimeFault(f"hcc mpi: paired run of {plan.name!r} failed (mpiexec status {code}): "
                               + log.strip()[-600:])
        outs = [np.load(job / f"case0.out{r}.npy") for r in range(world)]
        check(plan, outs, expected(plan, list(inputs)))
        pair = json.loads(path.read_text())
        return pair["hcc"], pair["native"]


def bench_native(kind: str, size_bytes: int, n: int, iters: int, *, dtype: str = "float32",
                 warmup: int = 1, op: str = "sum", root: int = 0) -> list[float]:
    """Per-iteration times (s, slowest rank) of MPICH's own ``kind`` on ``n`` local ranks at
    ``size_bytes`` per rank (nccl-tests sizes; the plan IR's buffer layout)."""
    with tempfile.TemporaryDirectory(prefix="hcc-mpi-") as tmp:
        job = Path(tmp)
        spec = {"kind": kind, "size_bytes": size_bytes, "dtype": dtype, "iters": iters,
                "warmup": warmup, "op": op, "root": root}
        atomic_write_text(job / "native_only.json", json.dumps(spec))
        code, log = _launch(job, n, ["--native", kind], _wall(60.0, iters + warmup, n))
        path = job / "native.json"
        if code != 0 or not path.exists():
            raise RuntimeFault(f"hcc mpi: native {kind} failed (mpiexec status {code}): "
                               + log.strip()[-600:])
        return json.loads(path.read_text())["times"]


def bench_hcc(plan, iters: int, warmup: int = 1, seed: int = 0) -> list[float]:
    """Per-iteration times (s, slowest rank) of ``plan`` on ``plan.n`` local MPI ranks, each
    rank drawing the reference module's random input from ``seed``."""
    return run_cases_local([(plan, seed)], iters=iters, warmup=warmup)[0].times


# --------------------------------------------------------------------------- the rank side

def _native_times(job: Path, kind: str, comm) -> list[float]:
    """MPICH's collective alone (:func:`bench_native`), on random buffers of
    ``native_only.json``'s size. Times are the slowest rank's."""
    from mpi4py import MPI

    from ..ir.plan import DTYPE_SIZES, buffer_layout
    from .kernels import np_dtype

    me, n = comm.Get_rank(), comm.Get_size()
    spec = json.loads((job / "native_only.json").read_text())
    dt = np_dtype(spec["dtype"])
    elems = spec["size_bytes"] // DTYPE_SIZES[spec["dtype"]]
    n_in, n_out = buffer_layout(kind, elems, n, me, spec["root"])
    inp = np.random.default_rng(me).integers(0, 100, n_in).astype(dt)
    out = np.zeros(n_out, dtype=dt)
    times = []
    for it in range(spec["warmup"] + spec["iters"]):
        comm.Barrier()
        t0 = MPI.Wtime()
        native_collective(kind, comm, inp, out, root=spec["root"], op=spec["op"])
        dt_s = MPI.Wtime() - t0
        if it >= spec["warmup"]:
            times.append(comm.allreduce(dt_s, op=MPI.MAX))
    if me == 0:
        atomic_write_text(job / "native.json", json.dumps({"kind": kind, "times": times}))
    return times


def _pair_times(job: Path, kind: str, comm: MPIBackend) -> None:
    """:func:`bench_pair`'s rank side: case 0's plan and MPICH's ``kind`` alternating, each
    iteration after one ``MPI_Barrier``; rank 0 writes the slowest rank's times of both."""
    from mpi4py import MPI

    from ..ir.plan import Plan
    from .executor import run
    from .kernels import np_dtype

    world = comm.comm
    me = world.Get_rank()
    spec = json.loads((job / "job.json").read_text())
    case, timeout = spec["cases"][0], float(spec["timeout"])
    plan = Plan.load(job / case["plan"])
    x = np.ascontiguousarray(np.load(job / case["inputs"].format(rank=me)))
    elems = plan.buffer_elems(me)
    dt = np_dtype(plan.dtype)
    out = np.empty(elems["out"], dtype=dt)  # given from the first warm-up: bound before timing
    native_out = np.zeros(elems["out"], dtype=dt)
    root, op = max(plan.root, 0), plan.op or "sum"
    times: dict[str, list[float]] = {"hcc": [], "native": []}

    def hcc() -> None:
        run(plan, comm, x, out=out, timeout=timeout)

    def native() -> None:
        native_collective(kind, world, x, native_out, root=root, op=op)

    for it in range(case["warmup"] + case["iters"]):
        for name, fn in (("hcc", hcc), ("native", native)) if it % 2 == 0 else (("native", native), ("hcc", hcc)):
            world.Barrier()
            t0 = MPI.Wtime()
            fn()
            dt_s = MPI.Wtime() - t0
            if it >= case["warmup"]:
                times[name].append(dt_s)
    every = world.gather(times, root=0)
    np.save(job / f"case0.out{me}.npy", out)
    if me == 0:
        slowest = {k: [max(ts) for ts in zip(*(t[k] for t in every))] for k in times}
        atomic_write_text(job / "pair.json", json.dumps(slowest))


def _worker(job: Path, kill: tuple[int, int] | None, native: str | None, pair: str | None = None) -> int:
    from mpi4py import MPI

    from .launch import worker_run

    world = MPI.COMM_WORLD
    me = world.Get_rank()
    comm = MPIBackend(world)
    if kill is not None and kill[0] == me:
        comm.kill_at_iteration = kill[1]
    if pair:
        try:
            _pair_times(job, pair, comm)
        except Exception as e:  # either side failed: end the job with the reason
            comm.abort(RuntimeFault(f"rank {me}: paired {pair}: {type(e).__name__}: {e}"))
        return 0
    code = 0
    if (job / "job.json").exists():
        code = worker_run(str(job), me, lambda: comm)
    if code != 0:  # the reason is in result<rank>.json; the others must not hang
        comm.abort(RuntimeFault(f"rank {me}: failed; see the launcher's report"), code=code)
    if native:
        try:
            _native_times(job, native, world)
        except Exception as e:  # MPICH's own collective failed: end the job with the reason
            comm.abort(RuntimeFault(f"rank {me}: native {native}: {type(e).__name__}: {e}"))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``mpiexec -n N python -m hcc.backends.mpi --job DIR [--kill R:I] [--native KIND |
    --pair KIND]``: one rank of a launched job (backends/launch.py's job format)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m hcc.backends.mpi")
    ap.add_argument("--job", required=True)
    ap.add_argument("--kill", default=None, help="RANK:ITERATION to SIGKILL (fault tests)")
    ap.add_argument("--native", default=None, help="only MPICH's own collective KIND (native_only.json)")
    ap.add_argument("--pair", default=None,
                    help="case 0's plan and MPICH's own collective KIND, alternating (bench_pair)")
    a = ap.parse_args(argv)
    kill = tuple(int(v) for v in a.kill.split(":")) if a.kill else None
    return _worker(Path(a.job), kill, a.native, a.pair)


if __name__ == "__main__":
    sys.exit(main())
