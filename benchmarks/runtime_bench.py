"""Runtime benchmark: hcc's backends against the peers a user would otherwise pick.

    .venv/bin/python benchmarks/runtime_bench.py [--sizes 1,16,64] [--ranks 4] [--iters 5] [--warmup 10] [--reps 3]
                                                  [--peers sockets,gloo,mpi,ray] [--quick]

The plans run on the default runtime: the sockets backend's adaptive runtime, whose fast
path agrees that every rank arrived in time and then runs the plan's flattened program
(``--static`` writes ``adaptive = off`` into the source instead: the static executor alone,
no agreement), compiled for loopback modelled as a star through a switch (every rank one 2 GB/s port), not a clique: see
:func:`loopback_source` for why. Where :data:`SOCKETS_SETTINGS` / :data:`MPI_SETTINGS` name
an ``algorithm`` or ``chunk`` for a (kind, size), the source says so, as a user could write
it; the table's ``settings`` column shows it (``auto``: the compiler's choice; ``--auto``
ignores the tables). The hcc-mpi plans are
compiled on the same star with 8 GB/s ports (:data:`MPI_PORT`): MPICH moves bytes between
local ranks through shared memory, not the kernel's TCP stack.

- hcc-sockets vs gloo (``torch.distributed``, CPU wheel; skipped with a message if torch is
  missing): allreduce, broadcast, allgather at each size (MiB, nccl-tests' per-rank output
  buffer) on ``--ranks`` local processes over loopback. Allreduce and broadcast run in place on both sides
  (gloo's calls are in place; :data:`INPLACE_KINDS`, ``--out-of-place`` for separate outputs),
  each iteration on the last one's output as in gloo's loop (:data:`INPLACE_MODE`;
  ``--restore-each`` restores the input before every iteration instead).
- hcc-mpi vs MPICH's own Allreduce/Bcast/Allgather through mpi4py, same mpiexec job, the two
  alternating iteration by iteration (``bench_pair`` of benchmarks/mpi_peers.py).
- hcc-ray vs a Ray object-store broadcast (``ray.put`` once, every other actor ``ray.get``s).
- pipelining: a chain broadcast of depth d = 1..7 at 16 MiB, 256 KiB chunks vs whole-buffer,
  over links paced to ``--pace`` bytes/s (default 200 MB/s): fine-grained pipelining costs
  about one *chunk* time per extra level, store-and-forward one *buffer* time per level.

The memory bound: the run first measures the host's copy and add rates with numpy
(:func:`memory_bandwidth`, all cores at once); each row gives the least time the collective
can take at those rates (:func:`memory_traffic` states how many bytes it must copy and add)
and the share of it hcc's median reached (``of_mem_bound``). The hcc-sockets plans are
compiled for the port their local ranks will use (:func:`sockets_port`: shared memory when
the native core is built). gloo runs as torchrun starts it (``LOCAL_WORLD_SIZE`` and the rest
set), and the header says whether the installed gloo has a shared-memory path at all.

busbw follows nccl-tests (2(n−1)/n allreduce, (n−1)/n allgather, 1 broadcast) on the median
of the timed iterations, which follow ``--warmup`` untimed ones on every side (:data:`WARMUP`);
every hcc time is the slowest rank's. The table goes to stdout and
to benchmarks/results/runtime.csv.

The machine is shared (2 cores, several jobs at once), so absolute figures are noisy; each
hcc/peer pair is measured back to back at the same load, and the ratio is what to read. For
sockets/gloo the pair is repeated ``--reps`` times (hcc run, then gloo run, then again) and the
``ratio`` column is the median of the reps' ratios (``ratio_min``/``ratio_max`` beside it);
the busbw columns pool every rep's iterations. hcc-mpi/MPICH is repeated the same way (one
mpiexec job per rep and size, hcc's plan and MPICH's collective alternating in it).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hcc.backends.rendezvous import free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
KINDS = ("allreduce", "broadcast", "allgather")


def busbw_factor(kind: str, n: int) -> float:
    from hcc.runner import busbw_factor as f

    return f(kind, n)


# --------------------------------------------------------------------------- plans
def loopback_source(n: int, port: str = "2 GB/s, 100 us") -> str:
    """The topology of n processes on one host talking over loopback: a star through a switch.

    Why a star and not a clique: on loopback every byte any process sends is copied by the
    one kernel through the one memory system of the host, so the ranks share one path, not
    n(n-1) independent links. Modelled as a clique of 1 GB/s links, the compiler believed the
    fabric had n(n-1) GB/s and picked "direct" allreduce (every rank sends its whole buffer to
    every other rank: 2(n-1)·M bytes per rank instead of a ring's 2(n-1)/n·M), which measured
    0.76-0.78x gloo at 16/64 MiB. Through a switch each rank has one 2 GB/s port (the
    1.4-1.7 GB/s a single loopback stream measures, rounded up), so the cut bound favours ring
    and trees that move each byte once, as gloo does.

    Latency 100 us, not 5: a message's cost on loopback is mostly the Python wake-ups on each
    side. A 64-byte chain broadcast over 3 hops (4 ranks) measured a median of 504-576 us
    (min 204-238 us) per run on the 2-core benchmark machine: 70-190 us per hop. With 5 us the compiler cut a
    16 MiB broadcast into 256 KiB chunks (31-57 ms); with 100 us it picks 1 MiB (27-30 ms;
    64 MiB: 2 MiB chunks, 94-124 ms against 104-143 ms for 512 KiB)."""
    return (f"topology loopback {{\n    node r[0..{n - 1}]\n    switch s\n"
            f"    r[0..{n - 1}] <-> s : {port}\n}}\n")


# The MPI ranks of one host do not talk over loopback TCP: MPICH moves their bytes through
# shared memory. Measured with mpi4py Send/Recv between 2 of 4 local ranks: 1 MiB in 102 us
# (10.3 GB/s), 16 MiB in 1.4 ms (12.0 GB/s), a 64-byte round trip 20 us. So each rank's port is
# 8 GB/s (the single stream, rounded down: 4 ranks share the host's memory bandwidth); the
# latency stays 100 us because a message's cost is still the executor's Python turn on each
# side. With the sockets star (2 GB/s) the compiler cut a 1 MiB broadcast into 256 KiB chunks
# down a chain: 0.64-0.80 ms under MPI against 0.50-0.54 ms for the direct plan the 8 GB/s
# port makes it pick (allreduce: ring 1.33-1.44 ms, direct 1.18-1.32 ms; 2 runs each).
MPI_PORT = "8 GB/s, 100 us"

# The sockets backend's local ranks exchange through shared memory (backends/shm.py) when the
# native core is built: no kernel copy, and the native runner's turn per message instead of
# the Python executor's. A star of 8 GB/s ports, as MPICH's shared memory above; the latency
# is the runner's per-message cost on this machine, measured by `netem_bench.py messages`:
# hcc.runner's SHM_PER_MESSAGE_S, what `hcc run` compiles such jobs with.
def shm_port() -> str:
    from hcc.runner import SHM_PER_MESSAGE_S

    return f"8 GB/s, {SHM_PER_MESSAGE_S * 1e6:g} us"


def sockets_port() -> str:
    """The star's port for hcc-sockets: :func:`shm_port` when its local ranks will share
    memory (the native core is built and ``HCC_SHM`` is not ``off``), else loopback TCP's."""
    from hcc.backends import native

    if native.available() and os.environ.get("HCC_SHM", "auto").lower() != "off":
        return shm_port()
    return "2 GB/s, 100 us"


# --------------------------------------------------------------------------- the memory bound
def _bandwidth_worker(kind: str, nbytes: int, reps: int, barrier, q) -> None:
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    np.copyto(a, b)  # pages in
    barrier.wait()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        if kind == "copy":
            np.copyto(a, b)
        else:
            np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t0)
    q.put(nbytes / best)


def memory_bandwidth(nbytes: int = 64 << 20, procs: int | None = None, reps: int = 5) -> dict:
    """This host's memory rates, measured now with numpy: ``copy_Bps`` (bytes written per
    second by ``np.copyto``) and ``add_Bps`` (bytes of output per second of ``np.add(a, b,
    out=a)``), each the sum over ``procs`` processes (default: one per core) running at once
    on arrays of ``nbytes`` — the whole machine's rate, as the ranks of a collective share it."""
    import multiprocessing as mp

    procs = procs or os.cpu_count() or 1
    out = {}
    for kind in ("copy", "add"):
        barrier, q = mp.Barrier(procs), mp.Queue()
        ps = [mp.Process(target=_bandwidth_worker, args=(kind, nbytes, reps, barrier, q)) for _ in range(procs)]
        for p in ps:
            p.start()
        rates = [q.get(timeout=120) for _ in ps]
        for p in ps:
            p.join(30)
        out[f"{kind}_Bps"] = sum(rates)
    return out


def remeasure(rates: dict) -> None:
    """Measure the memory rates again after a half's runs and keep the best of each in
    ``rates``: a rate measured while other jobs held the cores understates the machine."""
    later = memory_bandwidth()
    rates.update({k: max(v, later[k]) for k, v in rates.items()})
    print(f"memory, measured again: copy {later['copy_Bps'] / 1e9:.1f} GB/s, add {later['add_Bps'] / 1e9:.1f} GB/s;"
          f" the bound uses the best of the two", flush=True)


def memory_traffic(kind: str, n: int, nbytes: int) -> tuple[int, int]:
    """(bytes copied, bytes of reduction output) the host's memory must move for one ``kind``
    on ``n`` ranks of one host whose buffers are private (nccl-tests' size: ``nbytes`` is each
    rank's buffer; an allgather's output), with the fewest passes any algorithm can make when
    ranks reach each other only through shared memory:

    - allreduce: each rank copies the n−1 blocks of M/n that others reduce into shared memory
      ((n−1)·M copied), each block's owner reduces the n inputs of its block ((n−1)·M of adds,
      the last into its own buffer), copies its result block out for the others (M) and every
      rank copies the n−1 other result blocks in ((n−1)·M): (2n−1)·M copied, (n−1)·M added.
    - broadcast: the root's buffer into shared memory (M), out into n−1 buffers: n·M copied.
    - allgather: each rank's block into shared memory and into its own output (2·M over all
      ranks), the n−1 other blocks into each output ((n−1)·M): (n+1)·M copied.

    >>> memory_traffic("allreduce", 4, 1 << 20)
    (7340032, 3145728)
    """
    m = nbytes
    if kind == "allreduce":
        return (2 * n - 1) * m, (n - 1) * m
    if kind == "broadcast":
        return n * m, 0
    if kind == "allgather":
        return (n + 1) * m, 0
    raise ValueError(f"no memory-traffic count for {kind!r}")


def memory_bound_s(kind: str, n: int, nbytes: int, rates: dict) -> float:
    """The least time ``kind`` takes on this host: its :func:`memory_traffic` at the measured
    :func:`memory_bandwidth` (copies and adds one after the other, all cores at once)."""
    copied, added = memory_traffic(kind, n, nbytes)
    return copied / rates["copy_Bps"] + added / rates["add_Bps"]


# Per (kind, MiB): the settings the benchmark adds to a collective, as a user could write them
# in the source (docs/language.md: ``algorithm``, ``chunk``); every other case is the compiler's
# choice (``auto``). Chosen by measurement (hcc/gloo busbw ratio over interleaved reps, and the
# CPU ms of all ranks per iteration, which moves far less with the machine's load than wall
# time; on two cores that four ranks keep busy, the CPU a schedule costs decides):
# - broadcast 16 MiB: direct (the root sends the whole buffer to each rank, one round) 19-24 ms
#   CPU and 0.92-1.05x gloo, against the compiler's ring of 1 MiB chunks 26-31 ms and
#   0.55-0.90x (gloo 19-22 ms).
# - broadcast 64 MiB: a ring of 8 MiB chunks, 87 ms CPU against 101-106 ms in the compiler's
#   2 MiB chunks (gloo 84-90 ms); the wall ratios of the two were within the reps' spread.
# - allreduce: auto (ring, one chunk per step): 0.98-1.04x at 64 MiB against 0.95-0.99x for 2,
#   4 or 8 MiB chunks, which cost up to 30 ms more CPU; at 16 MiB chunked rings lost outright
#   (1 MiB: 0.43x; 512 KiB: 0.54x; direct 0.70x).
SOCKETS_SETTINGS: dict[tuple[str, int], str] = {
    ("broadcast", 16): "algorithm = direct",
    ("broadcast", 64): "algorithm = ring; chunk = 8 MiB",
}
# MPI allreduce 1 MiB: auto (direct) 0.58-0.93x, tree 0.61-0.82x, ring 0.54x, treepack 1.11x
# (one run): no setting beat auto consistently at that load, so none is set.
MPI_SETTINGS: dict[tuple[str, int], str] = {}


def collective_source(kind: str, mib: int, settings: str = "") -> str:
    """One benchmark collective on ``loopback``, with ``settings`` (``;``-separated source
    lines, e.g. ``adaptive = off``) added. Without ``adaptive`` said, the transport's default
    runs it (sockets: the adaptive runtime and its fast path)."""
    extra = "".join(f"\n    {line.strip()}" for line in settings.split(";") if line.strip())
    return f"collective {kind}_{mib} = {kind} on loopback {{\n    size = {mib} MiB\n    dtype = float32{extra}\n}}\n"


def compile_plans(n: int, sizes_mib: list[int], port: str = "2 GB/s, 100 us",
                  settings: dict[tuple[str, int], str] | None = None, static: bool = False) -> dict:
    """One plan per (kind, MiB) on the star of n ranks (:func:`loopback_source`) whose ports
    are ``port`` (the sockets default; :data:`MPI_PORT` for MPICH's shared memory), with
    ``settings[(kind, MiB)]`` (``;``-separated source lines) added where given; ``static``:
    ``adaptive = off`` in every collective."""
    import hcc

    settings = settings or {}
    src = loopback_source(n, port)
    for kind in KINDS:
        for m in sizes_mib:
            src += collective_source(kind, m, "; ".join(x for x in (settings.get((kind, m), ""),
                                                                    "adaptive = off" if static else "") if x))
    program = hcc.load(src)
    return {(k, m): hcc.compile(program, f"{k}_{m}") for k in KINDS for m in sizes_mib}


# Untimed iterations before the timed ones, the same on every side (``--warmup``). hcc's
# first runs of a plan are slower than its steady state: the bound MPI run is made in the
# first, and CPython 3.11 specializes a function's bytecode only after it has run 8 times, so
# the executor's loop reaches its speed around the tenth run. Measured (hcc-mpi / MPICH at 1 MiB, 4 ranks, bench_pair with 5 timed iterations,
# median of 7 jobs' ratios, two rounds, 03:47 UTC): allreduce after 2 warm-ups 0.85x / 0.82x,
# after 5 0.87x / 0.89x, after 10 0.95x / 1.04x, after 20 0.93x / 0.94x; with 1 warm-up,
# allreduce 0.76x and broadcast 0.80x, against 0.96x and 1.03x when 64 iterations are timed.
WARMUP = 10


# --------------------------------------------------------------------------- hcc over sockets
# Kinds whose gloo call is in place (``dist.all_reduce(x)`` and ``dist.broadcast(x, 0)`` overwrite
# x; ``all_gather`` writes separate outputs): hcc runs them in place too, ``hcc.run(plan, comm, x,
# out=x)``, so both sides move and touch the same memory. It matters for allreduce: a ring
# step out of place computes ``out = in + received`` (three streams), in place ``x += received``
# (two); numpy, per 16 MiB in 256 KiB pieces: 1.35 ms against 0.61 ms, and a
# 64 MiB 4-rank ring folds 48 MiB per rank per iteration. ``--out-of-place`` measures the other.
INPLACE_KINDS = frozenset({"allreduce", "broadcast"})
# How the in-place kinds get their input back between iterations (backends/launch.py's case
# option): "chained", as gloo's loop (each call reduces the last one's output; the input is
# restored only before the last iteration, which is checked), or True, restored before every
# iteration (``--restore-each``): 64 MiB copied per rank between timed regions, which gloo's
# side never pays.
INPLACE_MODE = "chained"


def bench_sockets(plans: dict, iters: int, inplace: frozenset = INPLACE_KINDS,
                  mode: str | bool = INPLACE_MODE, warmup: int = WARMUP) -> dict:
    from hcc.backends.launch import run_cases_local
    from hcc.backends.reference import check, expected, make_inputs

    keys = list(plans)
    results = run_cases_local("sockets", [(plans[k], 7, {"inplace": mode if k[0] in inplace else False})
                                          for k in keys],
                              iters=iters, warmup=warmup, timeout=120)
    for k, res in zip(keys, results):  # the benchmark checks what it measures
        check(plans[k], res.outputs, expected(plans[k], make_inputs(plans[k], 7)))
    return ({k: r.times for k, r in zip(keys, results)},
            {k: _cpu_per_iter(r.detail["rank_cpu"]) for k, r in zip(keys, results)},
            {k: _idle_windows(r.detail["rank_idle"][0], r.detail["rank_times"][0]) for k, r in zip(keys, results)})


def _cpu_per_iter(rank_cpu: list[list[float]]) -> list[float]:
    """CPU seconds of all ranks together, per iteration (the work, whatever the load)."""
    return [sum(cs) for cs in zip(*rank_cpu)]


def _idle_windows(idle: list, times: list[float]) -> list[tuple[float, float]]:
    """(idle core-seconds of the host, seconds) of each of rank 0's timed regions that has a
    reading (:func:`hcc.backends.launch.host_idle_seconds`)."""
    return [(i, t) for i, t in zip(idle, times) if i is not None]


def _work_note(row: dict) -> str:
    """`` cpu 47/52 ms, idle 4%/6%`` (hcc/peer) for a table line, from what the row has."""
    out = ""
    if "hcc_cpu_s" in row:
        out += f"  cpu {row['hcc_cpu_s'] * 1e3:.0f}" + (f"/{row['peer_cpu_s'] * 1e3:.0f}" if "peer_cpu_s" in row else "") + " ms"
    if "hcc_host_idle" in row:
        out += f", idle {row['hcc_host_idle']:.0%}" + (f"/{row['peer_host_idle']:.0%}" if "peer_host_idle" in row else "")
    return out


IDLE_MIN_SECONDS = 1.0  # timed seconds below which an idle share is not reported


def idle_share(windows: list[tuple[float, float]], ncpu: int | None = None,
               min_seconds: float = IDLE_MIN_SECONDS) -> float | None:
    """The share of the host's cores left idle over these timed regions: idle core-seconds
    over ``ncpu`` x seconds, pooled. The idle counter moves in 10 ms ticks, so one region of
    a few ms means nothing and only a sum over at least ``min_seconds`` of timed regions is
    reported (None otherwise, or without readings).

    >>> idle_share([(0.02, 0.5), (0.08, 0.5)], ncpu=2)
    0.05
    >>> idle_share([(0.01, 0.003)] * 7, ncpu=2) is None
    True
    """
    ncpu = ncpu or os.cpu_count() or 1
    total = sum(t for _, t in windows)
    if not windows or total < min_seconds:
        return None
    return round(sum(i for i, _ in windows) / (ncpu * total), 6)


# --------------------------------------------------------------------------- gloo
def _gloo_worker(rank: int, world: int, port: int, cases: list, iters: int, warmup: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from hcc.backends.launch import host_idle_seconds

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # as torchrun starts a worker: a gloo with a shared-memory path engages it when the local
    # world is the whole group (see gloo_shm_path)
    os.environ.update(LOCAL_WORLD_SIZE=str(world), LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world),
                      GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    times, cpu, idle = [], [], []
    for kind, mib in cases:
        n = (mib << 20) // 4
        x = torch.ones(n)
        part = x[: n // world].clone()
        outs = [torch.empty(n // world) for _ in range(world)]
        ts, cs, ids = [], [], []
        for it in range(warmup + iters):
            dist.barrier()
            i0 = host_idle_seconds()  # as hcc's launcher reads it: just outside the timed region
            c0, t0 = time.process_time(), time.perf_counter()
            if kind == "allreduce":
                dist.all_reduce(x)
            elif kind == "broadcast":
                dist.broadcast(x, 0)
            else:
                dist.all_gather(outs, part)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            i1 = host_idle_seconds()
            if it >= warmup:
                ts.append(dt)
                cs.append(dc)
                ids.append(None if i0 is None or i1 is None else i1 - i0)
        times.append(ts)
        cpu.append(cs)
        idle.append(ids)
    dist.destroy_process_group()
    Path(out).write_text(json.dumps({"times": times, "cpu": cpu, "idle": idle}))


def gloo_shm_path() -> bool | None:
    """Whether the installed torch's gloo has a shared-memory path for local ranks: any of its
    libraries names ``LOCAL_WORLD_SIZE``, the variable such a path keys on (torchrun sets it).
    None without torch."""
    try:
        import torch
    except ImportError:
        return None
    lib = Path(torch.__file__).parent / "lib"
    for f in lib.glob("*.so*"):
        try:
            if b"LOCAL_WORLD_SIZE" in f.read_bytes():
                return True
        except OSError:
            continue
    return False


def bench_gloo(n: int, keys: list, iters: int, warmup: int = WARMUP) -> dict | None:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("gloo: skipped (torch is not installed: .venv/bin/pip install torch==2.13.0)")
        return None
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hcc-gloo-") as tmp:
        procs = []
        for r in range(n):
            argv = [sys.executable, __file__, "--gloo-worker", str(r), str(n), str(port),
                    json.dumps(keys), str(iters), str(warmup), f"{tmp}/g{r}.json"]
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        try:
            for p in procs:
                p.wait(timeout=600)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            err = b"".join(p.stderr.read() for p in procs).decode(errors="replace")[-1500:]
            print(f"gloo: failed: {err}")
            return None
        per_rank = [json.loads(Path(f"{tmp}/g{r}.json").read_text()) for r in range(n)]
    times = {tuple(k): [max(ts) for ts in zip(*(pr["times"][i] for pr in per_rank))] for i, k in enumerate(keys)}
    cpu = {tuple(k): _cpu_per_iter([pr["cpu"][i] for pr in per_rank]) for i, k in enumerate(keys)}
    idle = {tuple(k): _idle_windows(per_rank[0]["idle"][i], per_rank[0]["times"][i]) for i, k in enumerate(keys)}
    return times, cpu, idle


@dataclass
class SocketsVsGloo:
    """What :func:`sockets_vs_gloo` measured, per (kind, MiB): the times of every rep pooled,
    the busbw ratio hcc/gloo of each rep, the CPU seconds per iteration of all ranks together
    (pooled), and rank 0's timed regions as (host idle core-seconds, seconds) pairs (pooled;
    :func:`idle_share`). The gloo fields are None when gloo did not run."""
    hcc: dict
    gloo: dict | None
    ratios: dict
    hcc_cpu: dict
    gloo_cpu: dict
    hcc_idle: dict
    gloo_idle: dict


def sockets_vs_gloo(plans: dict, n: int, keys: list, iters: int, reps: int, with_gloo: bool,
                    inplace: frozenset = INPLACE_KINDS, mode: str | bool = INPLACE_MODE,
                    warmup: int = WARMUP) -> SocketsVsGloo:
    """hcc-sockets and gloo, ``reps`` times, each rep one hcc run then one gloo run at once.

    The machine is shared, so its load drifts between minutes; a ratio of two figures taken
    seconds apart is what survives that drift."""
    m = SocketsVsGloo(*({k: [] for k in keys} for _ in range(7)))
    for rep in range(max(1, reps)):
        h, h_cpu, h_idle = bench_sockets(plans, iters, inplace, mode, warmup)
        g = bench_gloo(n, keys, iters, warmup) if m.gloo is not None and with_gloo else None
        if g is None:
            m.gloo = None
        for k in keys:
            m.hcc[k] += h[k]
            m.hcc_cpu[k] += h_cpu[k]
            m.hcc_idle[k] += h_idle[k]
            if g is not None:
                m.gloo[k] += g[0][k]
                m.gloo_cpu[k] += g[1][k]
                m.gloo_idle[k] += g[2][k]
                m.ratios[k].append(statistics.median(g[0][k]) / statistics.median(h[k]))
        if reps > 1:
            print(f"  rep {rep + 1}/{reps}: " + "  ".join(
                f"{kd}{mib}:{m.ratios[(kd, mib)][-1]:.2f}x" for kd, mib in keys if m.ratios[(kd, mib)]), flush=True)
    if m.gloo is None:
        m.ratios, m.gloo_cpu, m.gloo_idle = {}, {}, {}
    return m


# --------------------------------------------------------------------------- mpi
def _mpi_peers(label: str):
    """benchmarks/mpi_peers.py (beside this file), or None with a line saying why ``label``'s
    half is skipped (mpi4py or the mpich wheel missing)."""
    try:
        import mpi_peers  # noqa: F401  (benchmarks/ is on sys.path when this file runs)
    except ImportError as e:
        print(f"{label}: skipped ({e})")
        return None
    return mpi_peers


def bench_mpi(plans: dict, iters: int, reps: int = 1, warmup: int = WARMUP) -> dict | None:
    """Per key ``(hcc times, native times, ratios)``: ``reps`` mpiexec jobs per plan, each
    running hcc's plan and MPICH's own collective alternately, iteration by iteration
    (``bench_pair``; times pooled over the reps, one busbw ratio hcc/native per rep), so a
    noisy minute on the shared machine moves one rep's ratio, not the figure."""
    from hcc.backends.reference import make_inputs

    mpi_peers = _mpi_peers("mpi")
    if mpi_peers is None:
        return None
    out = {}
    for k, plan in plans.items():
        hs, ns, ratios = [], [], []
        try:
            for _ in range(max(1, reps)):
                h, nt = mpi_peers.bench_pair(plan, make_inputs(plan, 7), iters, warmup=warmup)
                hs += h
                ns += nt
                ratios.append(statistics.median(nt) / statistics.median(h))
        except Exception as e:  # report and go on with the other sizes
            print(f"mpi {k}: failed: {type(e).__name__}: {e}")
        if ratios:
            out[k] = (hs, ns, ratios)
    return out


def sockets_vs_mpich(plans: dict, keys: list, n: int, iters: int, reps: int, warmup: int = WARMUP,
                     budget_s: float | None = None) -> dict:
    """Per key ``(hcc times, MPICH times, ratios)``: hcc's default runtime (the sockets
    backend; shared memory between these local ranks) run, then MPICH's own collective in an
    mpiexec job of its own, ``reps`` times back to back (one busbw ratio per rep). With
    ``budget_s``, no rep starts once that many seconds have passed (``--budget``: a loaded
    run whose reps take far longer than a quiet one's still ends with whole reps; each row
    says how many it has)."""
    peers_mod = _mpi_peers("mpich")
    if peers_mod is None:
        return {}
    out = {k: ([], [], []) for k in keys}
    start = time.monotonic()
    for rep in range(max(1, reps)):
        if rep and budget_s is not None and time.monotonic() - start > budget_s:
            print(f"  mpich: {rep} of {reps} reps within the budget of {budget_s:g} s", flush=True)
            break
        h, _, _ = bench_sockets(plans, iters, warmup=warmup)
        for k in keys:
            try:
                nt = peers_mod.bench_native(k[0], plans[k].size_bytes, n, iters, warmup=warmup)
            except Exception as e:  # report and go on with the other cases
                print(f"mpich {k}: failed: {type(e).__name__}: {e}")
                continue
            out[k][0].extend(h[k])
            out[k][1].extend(nt)
            out[k][2].append(statistics.median(nt) / statistics.median(h[k]))
    return {k: v for k, v in out.items() if v[2]}


# --------------------------------------------------------------------------- ray
def bench_ray(plans: dict, iters: int, warmup: int = WARMUP) -> dict | None:
    try:
        from hcc.backends import ray as hray
        from hcc.backends.reference import make_inputs
    except ImportError as e:
        print(f"ray: skipped ({e})")
        return None
    out = {}
    for k, plan in plans.items():
        if k[0] != "broadcast":
            continue
        try:
            res = hray.run_local(plan, make_inputs(plan, 7), iters=iters, warmup=warmup, timeout=120)
            out[k] = (res.times, _ray_object_store_broadcast(hray, plan.n, plan.size_bytes, iters, warmup))
        except Exception as e:  # report and go on
            print(f"ray {k}: failed: {type(e).__name__}: {e}")
    return out


def _ray_object_store_broadcast(hray, n: int, size: int, iters: int, warmup: int = WARMUP) -> list[float]:
    """Ray's own way to broadcast: the root ``ray.put``s, the other n-1 actors ``ray.get``."""
    with hray.local_cluster(num_cpus=max(2, n)) as ray:

        @ray.remote
        class Rank:
            def put(self, nbytes):
                return ray.put(np.ones(nbytes // 4, np.float32))

            def get(self, refs):
                return int(ray.get(refs[0]).size)

        actors = [Rank.remote() for _ in range(n)]
        times = []
        for it in range(warmup + iters):
            t0 = time.perf_counter()
            ref = ray.get(actors[0].put.remote(size))
            ray.get([a.get.remote([ref]) for a in actors[1:]])
            if it >= warmup:
                times.append(time.perf_counter() - t0)
            del ref
        return times


# --------------------------------------------------------------------------- pipelining
def chain_plan(d: int, elems: int, chunk: int):
    """Broadcast down a chain 0 → 1 → … → d, chunk by chunk (the IR built by hand)."""
    from hcc.ir.plan import ChunkRef, Copy, Plan, Recv, Send, Tree
    from hcc.ir.topology import Link, Topology

    n = d + 1
    chunks = [(lo, min(elems, lo + chunk)) for lo in range(0, elems, chunk)]
    programs = []
    for r in range(n):
        ops = []
        for c, (lo, hi) in enumerate(chunks):
            ref = ChunkRef("out", lo, hi - lo)
            if r == 0:
                ops.append(Copy(ChunkRef("in", lo, hi - lo), ref))
                ops.append(Send(1, c, ChunkRef("in", lo, hi - lo), tree=0, chunk=c))
            else:
                ops.append(Recv(r - 1, c, ref, tree=0, chunk=c))
                if r < d:
                    ops.append(Send(r + 1, c, ref, deps=(len(ops) - 1,), tree=0, chunk=c))
        programs.append(tuple(ops))
    names = tuple(f"r{i}" for i in range(n))
    topo = Topology("chain", names, (), tuple(Link(names[i], names[i + 1], 1e9) for i in range(d)))
    return Plan(name=f"chain{d}", kind="broadcast", ranks=names, root=0, size_bytes=elems * 4, dtype="float32",
                op=None, algorithm="chain", chunk_bytes=chunk * 4,
                trees=(Tree(0, 0, tuple([-1] + list(range(d))), 1e9, (0, elems)),),
                programs=tuple(programs), tmp_elems=(0,) * n, topology=topo)


def bench_pipelining(mib: int, chunk_kib: int, depths: range, iters: int, pace: float) -> list[dict]:
    """Chain broadcasts over links paced to ``pace`` bytes/s (0: raw loopback).

    Why paced: on raw loopback a hop costs CPU (two copies through the kernel), and d+1
    processes on this 2-core machine serialise, so every schedule costs ~d hop-times of CPU
    whatever its pipelining (measured: 12.6 ms/level pipelined vs 10.9 whole-buffer). Pacing
    makes a hop cost link time, as on a real network, which is what the claim is about."""
    from hcc.backends.launch import run_cases_local

    elems = (mib << 20) // 4
    rows = []
    for d in depths:
        fine = chain_plan(d, elems, (chunk_kib << 10) // 4)
        whole = chain_plan(d, elems, elems)
        res = run_cases_local("sockets", [(fine, 3), (whole, 3)], iters=iters, warmup=1, timeout=120,
                              save_outputs=False, pace_Bps=pace)
        rows.append({"depth": d, "pipelined_s": statistics.median(res[0].times),
                     "store_forward_s": statistics.median(res[1].times)})
        print(f"  depth {d}: pipelined {rows[-1]['pipelined_s'] * 1e3:8.1f} ms   "
              f"whole-buffer {rows[-1]['store_forward_s'] * 1e3:8.1f} ms", flush=True)
    return rows


# --------------------------------------------------------------------------- load
BURN_LIMIT_S = 4 * 3600  # a burner stops by itself after this long, whatever happens to its parent


def _burn(limit_s: float) -> None:
    end = time.monotonic() + limit_s
    x = 0
    while time.monotonic() < end:  # pure CPU: the load a busy neighbour puts on a core
        for _ in range(100_000):
            x += 1


def start_burners(count: int) -> list:
    """``count`` processes that each keep one core busy (``--burners``: the loaded-machine
    run), until :func:`stop_burners` ends them (or :data:`BURN_LIMIT_S` passes)."""
    import multiprocessing as mp

    procs = [mp.Process(target=_burn, args=(BURN_LIMIT_S,), daemon=True) for _ in range(count)]
    for p in procs:
        p.start()
    return procs


def stop_burners(procs: list) -> None:
    for p in procs:  # only the burners this run started, by their handles
        p.terminate()
        p.join(10)


# --------------------------------------------------------------------------- report
def _bw(kind, n, mib, times):
    med = statistics.median(times)
    return (mib << 20) / med * busbw_factor(kind, n) / 1e9, med


# the on/off options of main()
SWITCHES = {
    "--quick": "1 and 16 MiB, 3 iterations, depths 1..3",
    "--out-of-place": "hcc-sockets writes a separate output for every kind (default: allreduce and broadcast "
                      "in place, as gloo's calls are; see INPLACE_KINDS)",
    "--restore-each": "in place, restore the input before every iteration (default: chained iterations, as "
                      "gloo's loop, restored only before the last, checked one)",
    "--static": "adaptive = off in every hcc-sockets plan (the static executor; default: the default "
                "runtime, adaptive with its fast path)",
    "--auto": "the compiler's own algorithm and chunk everywhere (ignore SOCKETS_SETTINGS/MPI_SETTINGS)",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,16,64", help="MiB, comma separated")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=WARMUP,
                    help="untimed iterations before the timed ones, on every side (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3,
                    help="hcc-sockets/gloo and hcc-mpi/MPICH repetitions, each pair back to back "
                         "(ratio = median of the reps' ratios)")
    ap.add_argument("--peers", default="sockets,gloo,mpi,ray",
                    help="sockets (hcc's default runtime), gloo, mpi (hcc over MPI against MPICH), mpich "
                         "(hcc-sockets against MPICH's own collectives), ray")
    ap.add_argument("--pipeline", default="1..7", help="chain depths for the pipelining figure ('' to skip)")
    ap.add_argument("--pace", type=float, default=200e6,
                    help="bytes/s per link for the pipelining figure (0 = raw loopback)")
    ap.add_argument("--out", default=None, help="the comparison CSV (default benchmarks/results/runtime.csv)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds after which the MPICH half starts no further rep (default: none)")
    ap.add_argument("--burners", type=int, default=0,
                    help="start this many CPU burners (one busy process each) before the run and end "
                         "them after it: the loaded-machine run")
    for flag, text in SWITCHES.items():
        ap.add_argument(flag, action="store_true", help=text)
    a = ap.parse_args(argv)
    burners = start_burners(a.burners) if a.burners else []
    if burners:  # a SIGTERM (e.g. from `timeout`) still ends them: finally runs on SystemExit
        import signal

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return _main(a)
    finally:
        stop_burners(burners)


def _main(a) -> int:
    if a.quick:
        a.sizes, a.iters, a.pipeline, a.reps, a.warmup = "1,16", 3, "1..3", 1, 1
    sizes = [int(s) for s in a.sizes.split(",")]
    peers = set(a.peers.split(","))
    n = a.ranks
    plans = compile_plans(n, sizes, sockets_port(), settings=None if a.auto else SOCKETS_SETTINGS, static=a.static)
    keys = [(k, m) for k in KINDS for m in sizes]
    rows = []
    rates = memory_bandwidth()
    if a.burners:
        print(f"{a.burners} CPU burners running (the loaded-machine run)")
    print(f"host load average at the start: {os.getloadavg()[0]:.1f}")
    print(f"memory: copy {rates['copy_Bps'] / 1e9:.1f} GB/s, add {rates['add_Bps'] / 1e9:.1f} GB/s "
          f"({os.cpu_count()} processes at once, numpy, 64 MiB arrays); hcc-sockets port {sockets_port()}; "
          f"gloo's shared-memory path: " + {True: "present (LOCAL_WORLD_SIZE set as torchrun does)",
                                            False: "absent from the installed torch",
                                            None: "torch missing"}[gloo_shm_path()], flush=True)

    def emit(kind, mib, backend, hcc_t, peer, peer_t, ratios=None, plan=None, cpu=None, settings=None,
             idle=None):
        hb, hm = _bw(kind, n, mib, hcc_t)
        plan = plan or plans[(kind, mib)]
        chosen = "" if a.auto else (settings if settings is not None else SOCKETS_SETTINGS).get((kind, mib), "")
        row = {"kind": kind, "MiB": mib, "ranks": n, "backend": backend, "algorithm": plan.algorithm,
               "chunk_bytes": plan.chunk_bytes, "settings": chosen or "auto",
               "in_place": ("" if backend != "hcc-sockets" or a.out_of_place or kind not in INPLACE_KINDS
                            else "restored" if a.restore_each else "chained"),
               "hcc_median_s": hm, "hcc_busbw_GBps": hb, "peer": peer}
        bound = memory_bound_s(kind, n, mib << 20, rates)
        row.update(mem_bound_s=bound, of_mem_bound=bound / hm)
        if cpu and cpu[0]:  # CPU seconds per iteration, all ranks together (median)
            row["hcc_cpu_s"] = statistics.median(cpu[0])
            if cpu[1]:
                row["peer_cpu_s"] = statistics.median(cpu[1])
        if idle:  # the share of the host's cores idle during rank 0's timed regions
            for side, windows in zip(("hcc", "peer"), idle):
                share = idle_share(windows or [])
                if share is not None:
                    row[f"{side}_host_idle"] = share
        if peer_t:
            pb, pm = _bw(kind, n, mib, peer_t)
            row.update(peer_median_s=pm, peer_busbw_GBps=pb, ratio=hb / pb)
            if ratios:  # several back-to-back repetitions: the median of their ratios
                row.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                           reps=len(ratios))
        rows.append(row)
        ratio = f"{row['ratio']:6.2f}x" if peer_t else "     -"
        pbs = f"{row.get('peer_busbw_GBps', 0):8.3f}" if peer_t else "       -"
        print(f"{kind:10s} {mib:4d} MiB  {backend:12s} {hb:8.3f} GB/s   {peer:16s} {pbs} GB/s  {ratio}"
              f"   {plan.algorithm}/{plan.chunk_bytes >> 10} KiB ({row['settings']}"
              + (f", in place, {row['in_place']})" if row["in_place"] else ")") + _work_note(row)
              + f"  mem bound {row['mem_bound_s'] * 1e3:.1f} ms ({row['of_mem_bound']:.0%})", flush=True)

    print(("static plans (adaptive = off, --static)" if a.static else "the default runtime (adaptive, fast path)")
          + f"; {n} ranks; {a.iters} iterations after {a.warmup} warm-up x {a.reps} reps; settings: "
          + ("the compiler's own (--auto)" if a.auto else "SOCKETS_SETTINGS / MPI_SETTINGS, else auto"))
    print(f"{'kind':10s} {'size':8s}  {'hcc':12s} {'busbw':>13s}   {'peer':16s} {'busbw':>13s}  hcc/peer   plan")
    # hcc alone only when no peer half measures it (--peers sockets); the MPICH half runs
    # hcc beside each MPICH job itself
    if "sockets" in peers and ("gloo" in peers or "mpich" not in peers):
        m = sockets_vs_gloo(plans, n, keys, a.iters, a.reps, "gloo" in peers,
                            frozenset() if a.out_of_place else INPLACE_KINDS,
                            True if a.restore_each else INPLACE_MODE, a.warmup)
        remeasure(rates)
        for k in keys:
            emit(*k, "hcc-sockets", m.hcc[k], "gloo", m.gloo[k] if m.gloo else None, m.ratios.get(k),
                 cpu=(m.hcc_cpu[k], m.gloo_cpu.get(k)), idle=(m.hcc_idle[k], m.gloo_idle.get(k)))
    if "mpich" in peers:  # hcc's default runtime (sockets: shared memory here) against MPICH's own
        res = sockets_vs_mpich(plans, keys, n, a.iters, a.reps, a.warmup, a.budget)
        remeasure(rates)
        for k, (ht, nt, rs) in res.items():
            emit(*k, "hcc-sockets", ht, "mpich-native", nt, rs)
    if "mpi" in peers:
        mpi_plans = compile_plans(n, sizes, MPI_PORT, settings=None if a.auto else MPI_SETTINGS)
        mp = bench_mpi(mpi_plans, a.iters, a.reps, a.warmup) or {}
        for k, (ht, nt, rs) in mp.items():
            emit(*k, "hcc-mpi", ht, "mpich-native", nt, rs, plan=mpi_plans[k], settings=MPI_SETTINGS)
    if "ray" in peers:
        ry = bench_ray(plans, a.iters, a.warmup) or {}
        for k, (ht, ot) in ry.items():
            emit(*k, "hcc-ray", ht, "ray-object-store", ot)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if rows:  # a pipelining-only run (--peers none) keeps the last comparison table
        fields = ["kind", "MiB", "ranks", "backend", "algorithm", "chunk_bytes", "settings", "in_place", "hcc_median_s", "hcc_busbw_GBps", "peer",
                  "peer_median_s", "peer_busbw_GBps", "ratio", "ratio_min", "ratio_max", "reps", "hcc_cpu_s",
                  "peer_cpu_s", "hcc_host_idle", "peer_host_idle", "mem_bound_s", "of_mem_bound"]
        out = Path(a.out) if a.out else RESULTS / "runtime.csv"
        tmp = out.with_name(out.name + ".part")  # a stopped run leaves no half-written table
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(out)
        print(f"wrote {out}; host load average at the end: {os.getloadavg()[0]:.1f}")
    if a.pipeline:
        lo, hi = (int(x) for x in a.pipeline.split(".."))
        print(f"pipelining: chain broadcast of 16 MiB, 256 KiB chunks vs whole buffer, depth d = {lo}..{hi}, "
              f"links paced to {a.pace / 1e6:g} MB/s (chunk time {(256 << 10) / a.pace * 1e3:.2f} ms, "
              f"buffer time {(16 << 20) / a.pace * 1e3:.1f} ms)" if a.pace else
              f"pipelining: chain broadcast of 16 MiB, 256 KiB chunks vs whole buffer, depth d = {lo}..{hi}, raw loopback")
        prow = bench_pipelining(16, 256, range(lo, hi + 1), a.iters, a.pace)
        with open(RESULTS / "pipelining.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["depth", "pipelined_s", "store_forward_s"])
            w.writeheader()
            w.writerows(prow)
        if len(prow) >= 2:
            slope_p = (prow[-1]["pipelined_s"] - prow[0]["pipelined_s"]) / (prow[-1]["depth"] - prow[0]["depth"])
            slope_s = (prow[-1]["store_forward_s"] - prow[0]["store_forward_s"]) / (prow[-1]["depth"] - prow[0]["depth"])
            print(f"  cost per extra level: pipelined {slope_p * 1e3:.1f} ms, whole-buffer {slope_s * 1e3:.1f} ms "
                  f"(one 16 MiB hop at depth 1: {prow[0]['store_forward_s'] * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--gloo-worker":
        r, w, p, cases, it, wu, out = sys.argv[2:9]
        _gloo_worker(int(r), int(w), int(p), [tuple(c) for c in json.loads(cases)], int(it), int(wu), out)
        sys.exit(0)
    sys.exit(main())
