"""hcc.backends.mpi — the ``mpi`` backend: a Transport over mpi4py, and a local launcher.

mpi4py is imported where it is used (``pip install 'hcc[mpi]'`` installs it with the ``mpich``
wheel; a site MPI's mpi4py works too); :func:`available` says whether it is there.

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

A rank whose own array is refused before any byte moved (wrong dtype or size) tells the
others at once (:meth:`MPIBackend.announce_failure`): a 4-byte message naming it on the
reserved tag :data:`FAIL_TAG` to every other rank, which each rank's wait loop probes for at
most every :data:`_PROBE_S` while it waits; a rank that hears it raises
:class:`~hcc.backends.base.PeerFailed` naming that rank (the executor reports it as
``RankFailed``) instead of waiting out its deadline for a message that will never come.

Embedding, one call per rank inside the user's own ``mpiexec`` job::

    from mpi4py import MPI
    import hcc.backends.mpi
    comm = hcc.backends.mpi.MPIBackend(MPI.COMM_WORLD)
    out = hcc.run(plan, comm, array)
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..ir.errors import PlanError
from .base import (BackendUnavailable, Capabilities, CollectiveTimeout, MessageRequest, PeerFailed, RuntimeFault,
                   Transport, register)

__all__ = [
    "MPIBackend", "MPIRequest", "available", "find_mpiexec", "loopback_env", "mpiexec_job", "reaping_shm",
    "run_cases_local", "run_local",
]

# Poll schedule of wait_any: test this many times back to back, then sleep between tests,
# doubling from _NAP_MIN to _NAP_MAX. Measured with 4 ranks on 2 busy cores, 16 MiB broadcast,
# hcc time / MPICH Bcast time in one job (below 1: hcc faster), one figure per run: 64 tests, naps to 1 ms: 0.58 0.68 0.84 1.94; 64 tests,
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
# The tag of "this rank gave up" messages: 2**24, above every plan tag (the IR keeps tags
# below it), or a site MPI's TAG_UB when that is lower (plan tags are then checked below it).
FAIL_TAG_WANTED = 1 << 24
# How often a waiting rank probes for a FAIL message: an Iprobe costs ~1 us, a wait's test
# loop spins every few us; 1 ms makes the probe <0.1% of a wait and the notice immediate
# next to any deadline.
_PROBE_S = 1e-3
# Extra wall time granted to a whole launched job beyond the per-wait deadlines: a 4-rank job
# of one small plan takes 1-2 s here, most of it interpreter, numpy and mpi4py start-up.
_JOB_GRACE_S = 30.0

def import_mpi():
    """mpi4py's ``MPI`` module, imported on first use (the import initialises MPI); raises
    :class:`~hcc.backends.base.BackendUnavailable` naming ``hcc[mpi]`` when it is missing."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise BackendUnavailable("mpi", "mpi4py", "mpi", e) from None
    return MPI


def available() -> bool:
    """True when mpi4py and its MPI extension are installed. Checked without importing
    ``mpi4py.MPI``: that import initialises MPI, and a singleton MPICH opens UCX listeners on
    every interface of the calling process (seen with ``ss -ltnp`` in the test runner)."""
    import importlib.util

    try:
        return importlib.util.find_spec("mpi4py.MPI") is not None
    except ImportError:  # mpi4py itself is absent
        return False


class MPIRequest(MessageRequest):
    """One outstanding ``Isend``/``Irecv`` (or persistent request): ``req`` is mpi4py's."""

    __slots__ = ("req",)

    def __init__(self, req, peer: int, tag: int, what: str, buf: memoryview):
        super().__init__(peer, tag, what, buf)
        self.req = req


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
    # MPI ranks run in lockstep and MPICH cannot survive a death: no arrival-order scheduling
    # by default, no agreement store (the runtime runs the static executor)
    capabilities = Capabilities()

    def __init__(self, comm=None, *, abort_on_fault: bool = True):
        MPI = import_mpi()
        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.world = self.comm.Get_size()
        self.abort_on_fault = abort_on_fault
        ub = self.comm.Get_attr(MPI.TAG_UB)
        # The IR promises tags < 2**24; the MPI standard only promises TAG_UB >= 32767.
        self.tag_ub = int(ub) if ub is not None else 32767
        # the reserved tag of announce_failure; plan tags must stay below it
        self.fail_tag = min(self.tag_ub, FAIL_TAG_WANTED)
        self.tag_ub = self.fail_tag - 1
        self._failed: dict[int, str] = {}  # peer -> why, heard through FAIL_TAG
        self._fail_sends: list = []  # our own announcements, kept until sent
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

    def _request(self, make, peer: int, tag: int, what: str, view) -> MPIRequest:
        """``make([bytes, MPI.BYTE], peer, tag)`` (``comm.Isend``, ``Irecv``, ``Send_init``,
        ``Recv_init``: each takes the peer and the tag in that order) on ``view``, checked."""
        self._check(peer, tag)
        mv = _as_bytes(view)
        if what == "recv" and mv.readonly:
            raise ValueError("hcc mpi: receive buffer is read-only")
        return MPIRequest(make([mv, self._MPI.BYTE], peer, tag), peer, tag, what, mv)

    def _track(self, r: MPIRequest) -> MPIRequest:
        if self._live is not None:
            self._live.append(r)
            self._live_reqs.append(r.req)
        return r

    def isend(self, peer: int, tag: int, data: memoryview) -> MPIRequest:
        return self._track(self._request(self.comm.Isend, peer, tag, "send", data))

    def irecv(self, peer: int, tag: int, buf: memoryview) -> MPIRequest:
        return self._track(self._request(self.comm.Irecv, peer, tag, "recv", buf))

    # -- persistent transfers: the executor's bound runs (backends/bound.py) -----------------
    def send_init(self, peer: int, tag: int, data: memoryview) -> MPIRequest:
        """A persistent send of ``data`` (``MPI_Send_init``): posted by :meth:`start_all`, any
        number of times, until :meth:`free_all` or :meth:`close`."""
        return self._keep(self._request(self.comm.Send_init, peer, tag, "send", data))

    def recv_init(self, peer: int, tag: int, buf: memoryview) -> MPIRequest:
        """A persistent receive into ``buf`` (``MPI_Recv_init``); see :meth:`send_init`."""
        return self._keep(self._request(self.comm.Recv_init, peer, tag, "recv", buf))

    def _keep(self, r: MPIRequest) -> MPIRequest:
        if not self._atexit:  # before mpi4py's own exit hook (registered at import) finalizes
            atexit.register(self.close)
            self._atexit = True
        self._persistent.append(r)
        return r

    def start_all(self, requests: Sequence[MPIRequest]) -> None:
        """Post persistent requests (``MPI_Startall``), in the given order."""
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

    def announce_failure(self, reason: str = "") -> None:
        """This rank will not take part in the run it was given (its array was refused before
        any byte moved): tell every other rank now (a message on :attr:`fail_tag` naming this
        rank) instead of leaving them to their deadline."""
        me = np.array([self.rank], dtype=np.int32)
        reqs = [self.comm.Isend([me, self._MPI.INT], p, self.fail_tag) for p in range(self.world) if p != self.rank]
        # 4 bytes go eagerly: complete at once; bounded, so a stuck peer cannot hold this rank.
        # Completed requests are freed (MPICH warns at exit about requests still referenced)
        end = time.monotonic() + 1.0
        while not self._MPI.Request.Testall(reqs) and time.monotonic() < end:
            time.sleep(1e-3)
        self._fail_sends.append((reqs, me))  # kept (with the buffer) in case one is still in flight

    def _heard_failure(self) -> None:
        """Raise :class:`PeerFailed` for a rank that announced it gave up (probed, not
        blocking)."""
        MPI = self._MPI
        status = MPI.Status()
        while self.comm.Iprobe(MPI.ANY_SOURCE, self.fail_tag, status):
            buf = np.zeros(1, dtype=np.int32)
            self.comm.Recv([buf, MPI.INT], status.Get_source(), self.fail_tag)
            self._failed[int(buf[0])] = "it gave up and announced it over MPI (its input was refused, or its run failed)"
        if self._failed:
            peer, why = next(iter(self._failed.items()))
            raise PeerFailed(self.rank, peer, why)

    def _poll(self, requests: Sequence[MPIRequest], reqs: list, timeout: float) -> list[int]:
        """Indices (sorted) of ``reqs`` that completed: ``MPI_Testsome`` in the polling
        schedule above, until one completes or ``timeout`` passes; a peer's announced failure
        (:meth:`announce_failure`) raises :class:`PeerFailed`."""
        start = time.monotonic()
        deadline, yield_until = start + timeout, start + _YIELD_S
        tests, nap = 0, _NAP_MIN
        probe_at = start
        while True:
            idx = self._MPI.Request.Testsome(reqs)
            if idx:
                return sorted(idx)
            if idx is None:  # every request inactive: all completed earlier
                return list(range(len(requests)))
            now = time.monotonic()
            if now >= probe_at:
                self._heard_failure()
                probe_at = now + _PROBE_S
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


def mpiexec_job(world: int, argv: Sequence[str], wall: float) -> tuple[int, str]:
    """Run ``argv`` as ``world`` MPI ranks under the ``mpich`` wheel's launcher, on loopback,
    reaping the shared-memory segments an aborted job leaves; returns ``(status, output)``.
    A job that outlives ``wall`` seconds is killed (status -9)."""
    cmd = [*find_mpiexec(), "-n", str(world), *argv]
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
            # mapped, not read: a checker pages in a block at a time (hcc run: reference.check_seeded)
            outs.append(np.load(p, mmap_mode="r") if p.exists() else None)
        traces = [job / f"case{i}.trace{r}.json" for r in range(world)]
        results.append(RunResult(outs, times, "mpi", {"rank_times": rank_times,
                                                      "launcher": find_mpiexec()[0],
                                                      "traces": [json.loads(p.read_text()) for p in traces
                                                                 if p.exists()]}))
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
        code, log = mpiexec_job(world, [sys.executable, "-m", "hcc.backends.mpi", "--job", str(job), *extra],
                                budget)
        return _collect(job, world, len(cases), code, log)


def run_local(plan, inputs, *, iters: int = 1, warmup: int = 0, timeout: float = 60.0, **kw):
    """``hcc run --backend mpi``: ``plan`` on ``plan.n`` local MPI ranks under the ``mpich``
    wheel's launcher. ``times`` are per measured iteration, the slowest rank's, in seconds.
    ``trace=True``: every iteration on the Python executor with each transfer stamped, the
    last one's stamps in ``detail["traces"]`` (backends/tracing.py)."""
    case = (plan, inputs, {"trace": True}) if kw.get("trace") else (plan, inputs)
    return run_cases_local([case], iters=iters, warmup=warmup, timeout=timeout,
                           step=kw.get("step", 0), kill=kw.get("kill"), wall=kw.get("wall"))[0]


# --------------------------------------------------------------------------- the rank side

def _worker(job: Path, kill: tuple[int, int] | None) -> int:
    from mpi4py import MPI

    from .launch import worker_run

    me = MPI.COMM_WORLD.Get_rank()
    comm = MPIBackend(MPI.COMM_WORLD)
    runner = comm
    if kill is not None and kill[0] == me:
        from .testing import KillSwitch

        # SIGKILL at the first send after iteration kill[1] of case 0 begins
        runner = KillSwitch(comm, at_barrier=f"c0/i{kill[1]}")
    code = worker_run(str(job), me, lambda: runner)
    if code != 0:  # the reason is in result<rank>.json; the others must not hang
        comm.abort(RuntimeFault(f"rank {me}: failed; see the launcher's report"), code=code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``mpiexec -n N python -m hcc.backends.mpi --job DIR [--kill R:I]``: one rank of a
    launched job (backends/launch.py's job format)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m hcc.backends.mpi")
    ap.add_argument("--job", required=True)
    ap.add_argument("--kill", default=None, help="RANK:ITERATION to SIGKILL (fault tests)")
    a = ap.parse_args(argv)
    kill = tuple(int(v) for v in a.kill.split(":")) if a.kill else None
    return _worker(Path(a.job), kill)


if __name__ == "__main__":
    sys.exit(main())
