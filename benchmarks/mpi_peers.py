"""MPICH's own collectives as the peer of hcc's MPI backend, in the same mpiexec job.

Benchmark code, not library code: ``bench_pair`` runs a plan and MPICH's collective of the same
kind, size, dtype and op alternately, iteration by iteration, on the same buffers (used by
benchmarks/runtime_bench.py); ``bench_native`` times MPICH's collective alone;
``native_collective`` calls it on the plan IR's buffer layout. The rank side of both is this
file run under ``mpiexec`` (``python benchmarks/mpi_peers.py --job DIR --pair KIND | --native
KIND``); the job directory is backends/launch.py's.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from hcc.backends.base import RuntimeFault
from hcc.backends.kernels import np_dtype
from hcc.backends.launch import prepare_job
from hcc.backends.mpi import MPIBackend, _wall, mpiexec_job
from hcc.backends.reference import check, expected
from hcc.backends.runtime import run
from hcc.ir.files import atomic_write_text
from hcc.ir.plan import DTYPE_SIZES, Plan, buffer_layout

__all__ = ["bench_native", "bench_pair", "native_collective"]


def _rank_argv(job: Path, *extra: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--job", str(job), *extra]


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


def bench_pair(plan, inputs, iters: int, warmup: int = 1,
               timeout: float = 60.0) -> tuple[list[float], list[float]]:
    """hcc's plan against MPICH's own collective of the same kind, size, dtype and op, on the
    same input buffers, in the same mpiexec job: ``(hcc_times, native_times)`` in seconds, per
    iteration, slowest rank. The two alternate iteration by iteration (which one goes first
    alternates too), each after the same ``MPI_Barrier``, so a noisy moment of the shared
    machine falls on both; hcc's output array is given from the first warm-up on, so the
    bound run (backends/bound.py) is made before anything is timed.
    hcc's last output is checked against the numpy reference."""
    with tempfile.TemporaryDirectory(prefix="hcc-mpi-") as tmp:
        job = Path(tmp)
        world = prepare_job(job, [(plan, inputs)], iters, warmup, timeout)
        code, log = mpiexec_job(world, _rank_argv(job, "--pair", plan.kind), _wall(timeout, 2 * (iters + warmup), world))
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
        code, log = mpiexec_job(n, _rank_argv(job, "--native", kind), _wall(60.0, iters + warmup, n))
        path = job / "native.json"
        if code != 0 or not path.exists():
            raise RuntimeFault(f"hcc mpi: native {kind} failed (mpiexec status {code}): "
                               + log.strip()[-600:])
        return json.loads(path.read_text())["times"]


def _native_times(job: Path, kind: str, comm) -> list[float]:
    """MPICH's collective alone (:func:`bench_native`), on random buffers of
    ``native_only.json``'s size. Times are the slowest rank's."""
    from mpi4py import MPI

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


def _pair_times(job: Path, kind: str, comm) -> None:
    """:func:`bench_pair`'s rank side: case 0's plan and MPICH's ``kind`` alternating, each
    iteration after one ``MPI_Barrier``; rank 0 writes the slowest rank's times of both."""
    from mpi4py import MPI

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


def main(argv=None) -> int:
    """The rank side: ``mpiexec -n N python benchmarks/mpi_peers.py --job DIR (--pair KIND |
    --native KIND)``. A failure on either side ends the whole job with its reason."""
    import argparse

    from mpi4py import MPI

    ap = argparse.ArgumentParser(prog="benchmarks/mpi_peers.py")
    ap.add_argument("--job", required=True)
    ap.add_argument("--native", default=None, help="only MPICH's own collective KIND (native_only.json)")
    ap.add_argument("--pair", default=None, help="case 0's plan and MPICH's own collective KIND, alternating")
    a = ap.parse_args(argv)
    job, world = Path(a.job), MPI.COMM_WORLD
    comm = MPIBackend(world)
    try:
        if a.pair:
            _pair_times(job, a.pair, comm)
        if a.native:
            _native_times(job, a.native, world)
    except Exception as e:  # end the job with the reason: the other ranks must not hang
        comm.abort(RuntimeFault(f"rank {world.Get_rank()}: {a.pair or a.native}: {type(e).__name__}: {e}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
