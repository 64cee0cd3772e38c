"""hcc.backends.launch — start local rank processes, run plans in them, collect the results.

A *job* is a temporary directory holding ``job.json`` (the cases, in order), each case's plan
(``case<i>.plan.json``, written with :meth:`Plan.save`) and inputs (``case<i>.in<r>.npy``, or a
seed from which each rank draws its own input with :func:`reference.make_input`). One process
per rank runs every case in sequence over one communicator — a test grid of hundreds of plans
costs one process launch, not hundreds — and writes ``result<r>.json`` (per-iteration times or
the error it raised) and ``case<i>.out<r>.npy`` (the output of the last iteration). After
each case a rank also writes ``case<i>.res<r>.json`` (that case's record), so the launcher can
hand each case to ``on_case`` as soon as every rank has finished it — ``hcc run`` prints and
checks a collective while the next one runs, and deletes its outputs once checked.

Timing: before each iteration the ranks meet at a barrier; each rank times its own
``hcc.run``; an iteration's time is the maximum over ranks (the collective is done when the
slowest rank is). Each rank also records the CPU seconds its process spent (all threads,
``time.process_time``) per iteration: ``RunResult.detail["rank_cpu"]``, and how long the
host's cores sat idle during its timed region (:func:`host_idle_seconds`, read just outside
it): ``RunResult.detail["rank_idle"]``. The CPU figure misses the kernel work that runs in the
host's softirq threads (``ksoftirqd``) on behalf of loopback TCP; the idle figure does not, so
the two together say whether a run was short of CPU. ``RunResult.detail["rank_spans"]`` has
each iteration's restore (in-place cases), start and end on the host's monotonic clock, so
overlaps between ranks can be checked. :class:`RunResult` is what every backend's
``run_local`` returns.

Failure: the launcher watches its children; when one exits abnormally the others must end on
their own (they raise :class:`RankFailed` within the per-wait deadline); after that deadline
plus a grace period the launcher kills whatever is left — only its own children, by handle.

:func:`local_ranks` is the one place that starts local rank processes (beside the rendezvous
store they meet at) and ends them: :func:`run_cases_local` runs timed cases with it, and the
fault and late-arrival harness of backends/testing.py runs its cases with it too.
"""
from __future__ import annotations

import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..ir.files import atomic_write_text
from .base import RuntimeFault

__all__ = ["RunResult", "RunFailed", "run_cases_local", "worker_run", "prepare_job", "host_idle_seconds",
           "local_ranks", "npy_reader"]


def host_idle_seconds() -> float | None:
    """Seconds the host's cores have spent idle since boot, summed over cores (the second
    field of Linux's ``/proc/uptime``, 10 ms resolution); None where there is no such file.
    Two readings around a timed region give the idle core-seconds inside it: a run that keeps
    ``c`` cores busy for ``t`` seconds leaves ``(ncpu - c) * t``."""
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class RunResult:
    outputs: list[np.ndarray]  # from the last iteration, per rank
    times: list[float]  # per timed iteration: max over ranks of that iteration's time
    backend: str
    detail: dict = field(default_factory=dict)


class RunFailed(RuntimeFault):
    """One or more ranks of a local run failed; ``errors`` maps rank -> what it said."""

    def __init__(self, backend: str, errors: dict[int, str], detail: dict | None = None):
        lines = [f"rank {r}: {msg}" for r, msg in sorted(errors.items())]
        super().__init__(f"{backend} run failed on {len(errors)} rank(s):\n  " + "\n  ".join(lines))
        self.backend, self.errors, self.detail = backend, errors, detail or {}


def prepare_job(job: Path, cases: Sequence[tuple], iters: int, warmup: int, timeout: float,
                step: int = 0, save_outputs: bool = True) -> int:
    """Write ``job.json``, plans and inputs into ``job``; returns the world size."""
    world = None
    entries = []
    for i, case in enumerate(cases):
        plan, inputs = case[0], case[1]
        if world is None:
            world = plan.n
        elif plan.n != world:
            raise RuntimeFault(f"case {i}: plan has {plan.n} ranks, the job {world}")
        plan.save(job / f"case{i}.plan.json")
        opts = case[2] if len(case) > 2 else {}
        unknown = set(opts) - {"inplace", "trace"}
        if unknown:
            raise RuntimeFault(f"case {i}: unknown case option(s) {', '.join(sorted(unknown))}")
        inplace = opts.get("inplace", False)
        if inplace not in (False, True, "chained"):
            raise RuntimeFault(f"case {i}: inplace must be False, True or 'chained', not {inplace!r}")
        entry = {"plan": f"case{i}.plan.json", "iters": iters, "warmup": warmup, "step": step,
                 "save_outputs": save_outputs, "inplace": inplace, "trace": bool(opts.get("trace", False))}
        if isinstance(inputs, (int, np.integer)):
            entry["seed"] = int(inputs)
        else:
            if len(inputs) != plan.n:
                raise RuntimeFault(f"case {i}: {len(inputs)} inputs for {plan.n} ranks")
            for r, a in enumerate(inputs):
                np.save(job / f"case{i}.in{r}.npy", np.ascontiguousarray(a))
            entry["inputs"] = f"case{i}.in{{rank}}.npy"
        entries.append(entry)
    if world is None:
        raise RuntimeFault("no cases to run")
    atomic_write_text(job / "job.json", json.dumps({"world": world, "timeout": timeout, "cases": entries}))
    return world


def worker_run(job_dir: str, rank: int, make_comm: Callable) -> int:
    """Body of one rank process: run every case of the job; 0 on success, 1 on failure."""
    from ..ir.plan import Plan
    from .executor import _reads_input
    from .reference import make_input
    from .runtime import run
    from .tracing import TraceTransport

    job = Path(job_dir)
    spec = json.loads((job / "job.json").read_text())
    timeout = float(spec["timeout"])
    result: dict = {"ok": False, "cases": []}
    comm = None
    try:
        comm = make_comm()
        for i, case in enumerate(spec["cases"]):
            plan = Plan.load(job / case["plan"])
            inplace = case.get("inplace", False)
            if not inplace and not _reads_input(plan.programs_at(case["step"])[rank]):
                # a broadcast's or scatter's non-root: the run ignores its input, so none is
                # drawn (run() then uses a zero view that takes no memory): a 477 MiB DGX-1
                # broadcast rank held 477 MiB less
                x = None
            elif "seed" in case:
                x = make_input(plan, case["seed"], rank)
            else:
                x = np.load(job / case["inputs"].format(rank=rank))
            out = None
            times, cpu, idle, spans = [], [], [], []
            total = case["warmup"] + case["iters"]
            # chained: each iteration takes the last one's output as its input, as a loop of
            # torch.distributed calls does; only the last starts again from the original input
            chained = inplace == "chained"
            x0 = x.copy() if inplace and total > 1 else None
            # traced (hcc run --trace): every iteration runs the Python executor over a
            # TraceTransport; the last iteration's stamps are kept
            traced = TraceTransport(comm) if case.get("trace") else None
            for it in range(total):
                restored = None
                if inplace:  # the output is the input: restore it outside the timed region
                    out = x
                    if it and (not chained or it == total - 1):
                        # after every rank's previous iteration: a rank that finished early
                        # and copied its input back while another rank was still in its timed
                        # region took a core from it (the in-place 16 MiB broadcast measured
                        # 1.02x gloo that way, 1.20x with this barrier)
                        comm.barrier(f"c{i}/r{it}", timeout)
                        restored = time.monotonic()
                        np.copyto(x, x0)
                comm.barrier(f"c{i}/i{it}", timeout)
                i0 = host_idle_seconds()
                m0 = time.monotonic()
                c0, t0 = time.process_time(), time.perf_counter()
                if traced is None:
                    out = run(plan, comm, x, out=out, timeout=timeout, step=case["step"])
                else:
                    out = _run_traced(plan, traced, x, out, timeout, case["step"])
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                m1 = time.monotonic()
                i1 = host_idle_seconds()
                spans.append((restored, m0, m1))  # the host's monotonic clock, every iteration
                if it >= case["warmup"]:
                    times.append(dt)
                    cpu.append(dc)
                    idle.append(None if i0 is None or i1 is None else i1 - i0)
            if case["save_outputs"] and out is not None:
                np.save(job / f"case{i}.out{rank}.npy", out)
            if traced is not None:
                atomic_write_text(job / f"case{i}.trace{rank}.json", json.dumps(
                    {"start": spans[-1][1], "end": spans[-1][2], "events": traced.events}))
                traced = None
            out = x = x0 = None  # this case's buffers go before the next case allocates its own
            _release_memory()
            # this process's peak resident set so far (Linux: KiB): what a case costs a rank
            record = {"times": times, "cpu": cpu, "idle": idle, "spans": spans,
                      "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
            result["cases"].append(record)
            atomic_write_text(job / f"case{i}.res{rank}.json", json.dumps(record))
        comm.barrier("end", timeout)
        result["ok"] = True
    except Exception as e:  # reported to the launcher, which raises a typed error
        result["error"] = f"{type(e).__name__}: {e}"
        if os.environ.get("HCC_TRACEBACK"):
            result["traceback"] = traceback.format_exc()
    finally:
        if comm is not None:
            try:
                comm.close()
            except Exception as e:
                result.setdefault("error", f"close failed: {type(e).__name__}: {e}")
    atomic_write_text(job / f"result{rank}.json", json.dumps(result))
    return 0 if result["ok"] else 1


def _release_memory() -> None:
    """Between cases: drop the staging arrays the process keeps for reuse (up to 256 MiB:
    frames that arrived before their receive was posted) and hand freed heap memory back to
    the system (glibc keeps freed chunks below its mmap threshold, up to 32 MiB each, in the
    heap). Measured: after an 8-rank 256 MB DGX-1 broadcast each rank held 524 MB of
    anonymous memory for its 244 MiB output, the rest staged early frames; the pool kept up to
    256 MiB of them into the next collective."""
    import ctypes
    import gc

    from .kernels import STAGING

    STAGING.release()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the memory is reused, not returned
        pass


def _run_traced(plan, comm, x, out, timeout: float, step: int):
    """One call of ``plan`` on the static Python executor over ``comm`` (a
    :class:`~.tracing.TraceTransport`), its stamps cleared first; returns the output."""
    from .executor import static_call

    comm.clear()
    comm.bind_plan(plan.wire_id(), plan.largest_message_bytes())
    result, execution, _ = static_call(plan, comm, x, out=out, timeout=timeout, step=step)
    execution().execute()
    return result


def _wait_children(procs: list[subprocess.Popen], timeout: float, overall: float,
                   report_dead: Callable[[list[int]], None] | None = None,
                   poll: Callable[[], None] | None = None) -> dict[int, int]:
    """Wait for every child; returns {rank: returncode}. Kills stragglers after the deadline.
    ``report_dead(ranks)`` is told every rank whose process died abnormally; ``poll()`` is
    called every 10 ms while waiting (and once after)."""
    start = time.monotonic()
    grace_until = None
    codes: dict[int, int] = {}
    dead: list[int] = []
    while len(codes) < len(procs):
        for r, p in enumerate(procs):
            if r not in codes and p.poll() is not None:
                codes[r] = p.returncode
                if p.returncode < 0 and report_dead is not None:  # killed by a signal
                    dead.append(r)
                    report_dead(dead)
                if p.returncode != 0 and grace_until is None:
                    # the others must notice within one per-wait deadline; 5 s covers start-up
                    grace_until = time.monotonic() + timeout + 5.0
        if poll is not None:
            poll()
        now = time.monotonic()
        if (grace_until is not None and now > grace_until) or now - start > overall:
            break
        time.sleep(0.01)
    if poll is not None:
        poll()
    for r, p in enumerate(procs):
        if r not in codes:
            p.kill()
            p.wait()
            codes[r] = None  # killed by the launcher
    return codes


@contextmanager
def local_ranks(job: Path, world: int, argv_of: Callable[[int, str], list[str]], token: str, *,
                store_host: str = "127.0.0.1", wrap: Callable[[int, list[str]], list[str]] | None = None
                ) -> Iterator[tuple]:
    """Serve a rendezvous store and start ``world`` rank processes, ``argv_of(rank,
    store_address)`` each (rewritten by ``wrap(rank, argv)`` when given), with ``HCC_TOKEN`` in
    their environment and their output in ``job/rank<r>.log``. Yields ``(store, procs)``; on
    exit every child still running is killed and reaped — only these children, by handle."""
    from .rendezvous import StoreServer

    env = dict(os.environ, HCC_TOKEN=token)
    procs: list[subprocess.Popen] = []
    with StoreServer(token, store_host, 0) as store:
        try:
            for r in range(world):
                argv = argv_of(r, store.address)
                if wrap is not None:
                    argv = wrap(r, argv)
                with open(job / f"rank{r}.log", "wb") as log:  # the child keeps its own copy
                    procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL))
            yield store, procs
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()


def run_cases_local(backend: str, cases: Sequence[tuple], *, iters: int = 1, warmup: int = 0,
                    timeout: float = 60.0, step: int = 0, save_outputs: bool = True,
                    wrap: Callable[[int, list[str]], list[str]] | None = None,
                    hosts: Sequence[str] | None = None, store_host: str = "127.0.0.1",
                    kill_rank: tuple[int, float] | None = None,
                    max_message: int | None = None, pace_Bps: float = 0.0,
                    on_case: Callable[[int, "RunResult"], None] | None = None,
                    on_progress: Callable[[int, int, int], None] | None = None,
                    trace: bool = False) -> list[RunResult]:
    """Run each ``(plan, inputs_or_seed)`` case, in order, on ``world`` local processes.

    A case may carry a third element, its options: ``{"inplace": True}`` calls
    ``run(plan, comm, x, out=x)`` (the output overwrites the input, as ``torch.distributed``'s
    collectives do); each iteration starts from the original input, restored before its
    barrier, so the last output is still checkable against the reference. The ranks restore
    only once all of them are past the previous iteration (one more barrier), so no rank's
    copy runs beside another rank's timed region. ``{"inplace": "chained"}`` restores only
    before the last iteration: the others take the previous iteration's output as their
    input, as a loop of ``dist.all_reduce(x)`` does (a sum grows n-fold per iteration, so
    long float runs reach inf in between; the checked last iteration starts afresh).

    ``wrap(rank, argv)`` may rewrite a rank's command line (e.g. ``hcc netem``'s namespace
    wrapper) and ``hosts[rank]`` set the address it listens on. ``kill_rank=(r, seconds)``
    SIGKILLs rank ``r`` that long after every rank finished iteration 0 (fault-injection tests).
    ``pace_Bps`` paces every connection to that many bytes/s (emulated links, no root needed).

    ``on_case(i, result)`` is called in the launcher as soon as every rank has finished case
    ``i`` (in order), with ``result.detail["out_paths"]`` the rank outputs' ``.npy`` files; once
    it returns, those files are deleted and the returned list holds None for that case's
    outputs (the caller has what it needed). ``on_progress(i, iteration, total)`` says which
    iteration of which case every rank has entered (from the barrier counters).

    ``trace=True`` (as a case option ``{"trace": True}`` for one case): the ranks run every
    iteration on the Python executor over a :class:`~.tracing.TraceTransport` and each
    result's ``detail["traces"]`` holds every rank's stamps of the last iteration."""
    if trace:
        cases = [(c[0], c[1], dict(c[2] if len(c) > 2 else {}, trace=True)) for c in cases]
    if backend != "sockets":
        raise RuntimeFault(f"run_cases_local launches the sockets worker, not {backend!r}")
    token = secrets.token_hex(32)
    with tempfile.TemporaryDirectory(prefix="hcc-run-") as tmp:
        job = Path(tmp)
        world = prepare_job(job, cases, iters, warmup, timeout, step, save_outputs)
        if max_message is None:
            max_message = max(int(c[0].size_bytes) for c in cases) + (1 << 20)

        def argv_of(r: int, store: str) -> list[str]:
            argv = [sys.executable, "-m", "hcc.backends.sockets", "--job", str(job), "--rank", str(r),
                    "--world", str(world), "--store", store, "--timeout", str(timeout),
                    "--max-message", str(max_message)]
            if hosts is not None:
                argv += ["--host", hosts[r]]
            if pace_Bps:
                argv += ["--pace", repr(float(pace_Bps))]
            return argv

        t0 = time.monotonic()
        with local_ranks(job, world, argv_of, token, store_host=store_host, wrap=wrap) as (store, procs):
            killed_at = None
            if kill_rank is not None:
                # count the delay from the moment every rank has finished iteration 0, so
                # the kill lands mid-run however slow the start-up was
                kr, delay = kill_rank
                key = "barrier/hcc/c0/i1"
                limit = time.monotonic() + timeout * 3
                while store.value(key, 0) < world and time.monotonic() < limit and all(
                        p.poll() is None for p in procs):
                    time.sleep(0.005)
                time.sleep(delay)
                procs[kr].kill()
                killed_at = time.monotonic()
            n_iters = sum(1 for _ in cases) * (iters + warmup)
            watch = _CaseWatch(job, backend, world, len(cases), iters + warmup, store, on_case, on_progress)
            codes = _wait_children(procs, timeout, overall=timeout * (3 + n_iters) + 30.0,
                                   report_dead=lambda ranks: store.put("hcc/dead", list(ranks)),
                                   poll=watch.poll if on_case or on_progress else None)
            wall = time.monotonic() - t0
            detail = {"wall_s": wall}
            if killed_at is not None:
                detail["kill_to_end_s"] = time.monotonic() - killed_at
        return _collect(job, backend, world, len(cases), codes, detail)


class _CaseWatch:
    """Hands each finished case to ``on_case`` and iteration starts to ``on_progress``."""

    def __init__(self, job: Path, backend: str, world: int, n_cases: int, total: int, store, on_case, on_progress):
        self.job, self.backend, self.world, self.n_cases, self.total = job, backend, world, n_cases, total
        self.store, self.on_case, self.on_progress = store, on_case, on_progress
        self.case = 0  # the next case to hand over
        self.iteration = -1  # the last iteration of ``case`` every rank entered

    def poll(self) -> None:
        while self.case < self.n_cases:
            i = self.case
            if self.on_progress is not None:
                it = self.iteration
                while it + 1 < self.total and self.store.value(f"barrier/hcc/c{i}/i{it + 1}", 0) >= self.world:
                    it += 1
                if it != self.iteration:
                    self.iteration = it
                    self.on_progress(i, it, self.total)
            paths = [self.job / f"case{i}.res{r}.json" for r in range(self.world)]
            if not all(p.exists() for p in paths):
                return
            if self.on_case is not None:
                records = [json.loads(p.read_text()) for p in paths]
                outs = [self.job / f"case{i}.out{r}.npy" for r in range(self.world)]
                rank_times = [rec["times"] for rec in records]
                traces = [self.job / f"case{i}.trace{r}.json" for r in range(self.world)]
                res = RunResult([None] * self.world, [max(ts) for ts in zip(*rank_times)], self.backend,
                                {"rank_times": rank_times, "rank_maxrss": [rec.get("maxrss") for rec in records],
                                 "out_paths": [p if p.exists() else None for p in outs],
                                 "traces": [json.loads(p.read_text()) for p in traces if p.exists()]})
                try:
                    self.on_case(i, res)
                finally:
                    for p in outs:
                        p.unlink(missing_ok=True)
            self.case += 1
            self.iteration = -1


def npy_reader(path: Path):
    """``read(lo, hi)``: elements ``[lo, hi)`` of a 1-D ``.npy`` file, read with file reads, not
    a memory map (a mapped page counts in the reader's resident set: checking a 500 MB output
    through ``np.load(mmap_mode="r")`` grows the parent by 500 MB)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = header(f)
        offset = f.tell()
    if fortran or dtype.hasobject:
        raise RuntimeFault(f"{path}: not a plain C-order array")

    def read(lo: int, hi: int) -> np.ndarray:
        with open(path, "rb") as f:
            f.seek(offset + lo * dtype.itemsize)
            return np.fromfile(f, dtype=dtype, count=max(0, hi - lo))
    read.size = int(np.prod(shape))  # type: ignore[attr-defined]
    return read


def _collect(job: Path, backend: str, world: int, n_cases: int, codes: dict, detail: dict) -> list[RunResult]:
    errors: dict[int, str] = {}
    per_rank = []
    for r in range(world):
        path = job / f"result{r}.json"
        res = json.loads(path.read_text()) if path.exists() else None
        if res is None or not res.get("ok"):
            code = codes.get(r)
            if res is not None and res.get("error"):
                errors[r] = res["error"]
            elif code is None:
                errors[r] = "killed by the launcher after the deadline"
            elif code < 0:
                errors[r] = f"killed by signal {-code}"
            else:
                tail = (job / f"rank{r}.log").read_bytes()[-2000:].decode(errors="replace").strip()
                errors[r] = f"exited with status {code}" + (f": {tail}" if tail else "")
        per_rank.append(res)
    if errors:
        raise RunFailed(backend, errors, detail)
    results = []
    for i in range(n_cases):
        rank_times = [per_rank[r]["cases"][i]["times"] for r in range(world)]
        times = [max(ts) for ts in zip(*rank_times)]
        # CPU seconds (all threads) of every rank's process per iteration: the work a run
        # costs, much steadier than wall time on a shared machine
        rank_cpu = [per_rank[r]["cases"][i].get("cpu", []) for r in range(world)]
        # idle core-seconds of the whole host during each rank's timed region (host_idle_seconds)
        rank_idle = [per_rank[r]["cases"][i].get("idle", []) for r in range(world)]
        # per rank and iteration (warm-up included): (restore start or None, timed start, end)
        rank_spans = [per_rank[r]["cases"][i].get("spans", []) for r in range(world)]
        # each rank's peak resident set by the end of this case (bytes)
        rank_maxrss = [per_rank[r]["cases"][i].get("maxrss") for r in range(world)]
        outs = []
        for r in range(world):
            p = job / f"case{i}.out{r}.npy"
            outs.append(np.load(p, mmap_mode="r") if p.exists() else None)  # paged in by the check
            # (None when on_case has checked and removed it)
        traces = [job / f"case{i}.trace{r}.json" for r in range(world)]
        traces = [json.loads(p.read_text()) for p in traces if p.exists()]
        results.append(RunResult(outs, times, backend, dict(detail, rank_times=rank_times, rank_cpu=rank_cpu,
                                                                 rank_idle=rank_idle, rank_spans=rank_spans,
                                                                 rank_maxrss=rank_maxrss,
                                                                 **({"traces": traces} if traces else {}))))
    return results
