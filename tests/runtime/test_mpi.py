"""The MPI backend on real MPICH processes (mpi4py + the ``mpich`` wheel's launcher).

A grid of compiled plans — every kind on 2 and 4 ranks, several dtypes and ops, element counts
that do not divide by the rank count, pipelined tree plans of ~1 MiB — runs in ONE mpiexec job
per rank count and is checked against the numpy reference. The transport is also exercised
directly (isend/irecv/wait_any), including the deadline that aborts the whole job.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import hcc
from hcc.backends import mpi
from hcc.backends.launch import RunFailed
from hcc.backends.reference import check, expected, make_inputs

from conftest import ITEM, KINDS, clique_topology

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not mpi.available(), reason="mpi4py does not import"),
]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import mpi_peers  # noqa: E402  MPICH's own collectives, the benchmarks' peer
PY = sys.executable

TOPO = clique_topology("t4", 4, "1 GB/s, 10 us")
OPS = ("sum", "max", "prod", "min", "avg")


def grid_program(n: int) -> tuple[str, list[str]]:
    """HCL for every kind on ranks r0..r{n-1}: two dtypes per kind (float32 and a rotating
    second one), 1001 elements (alltoall: 1000, divisible by n), rotating roots and ops; plus
    pipelined ~1 MiB tree/ring plans."""
    parts, names = [TOPO], []
    others = ("float64", "int32", "bfloat16", "float16")
    for i, kind in enumerate(KINDS):
        for dt in ("float32", others[i % len(others)]):
            if kind == "neighbor_average" and dt == "int32":
                dt = "float64"  # averaging is for float dtypes
            elems = 1000 if kind == "alltoall" else 1001
            body = [f"ranks = r[0..{n - 1}]", f"size = {elems * ITEM[dt]} B", f"dtype = {dt}"]
            if kind in ("broadcast", "reduce", "gather", "scatter"):
                body.append(f"root = r{(i + len(names)) % n}")
            if kind in ("reduce", "allreduce", "reduce_scatter"):
                op = OPS[(i + len(names)) % len(OPS)]
                if op == "avg" and dt == "int32":
                    op = "sum"
                body.append(f"op = {op}")
            if kind == "neighbor_average":
                body.append("peers = ring")
            name = f"{kind}_{dt}"
            parts.append(f"collective {name} = {kind} on t4 {{ {'; '.join(body)} }}".replace("; ", "\n "))
            names.append(name)
    big = 1048580  # 262145 float32: not a multiple of 4 ranks, nor of the chunk size
    for name, kind, extra in (("big_allreduce", "allreduce", "algorithm = treepack"),
                              ("big_broadcast", "broadcast", f"root = r{n - 1}\n algorithm = treepack"),
                              ("big_allgather", "allgather", "algorithm = ring")):
        parts.append(f"collective {name} = {kind} on t4 {{ ranks = r[0..{n - 1}]\n "
                     f"size = {big} B\n {extra} }}")
        names.append(name)
    return "\n".join(parts), names


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def grid(request):
    src, names = grid_program(request.param)
    return [hcc.compile(src, nm) for nm in names]


def test_grid_against_numpy(grid):
    """Every plan of the grid, in one mpiexec job, matches the numpy reference."""
    kinds = {p.kind for p in grid}
    assert kinds == set(KINDS)
    cases = [(p, make_inputs(p, seed)) for seed, p in enumerate(grid)]
    results = mpi.run_cases_local(cases, iters=2, warmup=1, timeout=30.0)
    assert len(results) == len(cases)
    for (plan, inputs), res in zip(cases, results):
        assert res.backend == "mpi"
        assert len(res.times) == 2 and all(t > 0 for t in res.times)
        check(plan, res.outputs, expected(plan, inputs))


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


def _mpiexec(n: int, script: Path, *args: str, timeout: float = 120.0):
    cmd = [*mpi.find_mpiexec(), "-n", str(n), PY, str(script), *args]
    t0 = time.monotonic()
    with mpi.reaping_shm():  # the abort tests end in MPI_Abort: no MPI_Finalize unlinks
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=mpi.loopback_env(), cwd=ROOT)
    return proc, time.monotonic() - t0


TRANSPORT = """
    import sys, numpy as np
    from mpi4py import MPI
    from hcc.backends.mpi import MPIBackend
    t = MPIBackend(MPI.COMM_WORLD)
    r, n = t.rank, t.world
    N = (1 << 20) + 3                          # odd byte count, 8 chunks of unequal size
    a = (np.arange(N, dtype=np.uint8) + r).astype(np.uint8)
    b = np.zeros(N, dtype=np.uint8)
    nxt, prv = (r + 1) % n, (r - 1) % n
    reqs = []
    for c in range(8):
        lo, hi = c * N // 8, (c + 1) * N // 8
        reqs.append(t.irecv(prv, 1000 + c, memoryview(b)[lo:hi]))
        reqs.append(t.isend(nxt, 1000 + c, memoryview(a)[lo:hi]))
    pending = list(range(len(reqs)))
    rounds = 0
    while pending:
        done = t.wait_any([reqs[i] for i in pending], 20.0)
        assert done, "wait_any returned nothing"
        pending = [i for k, i in enumerate(pending) if k not in set(done)]
        rounds += 1
    want = (np.arange(N, dtype=np.uint8) + prv).astype(np.uint8)
    assert np.array_equal(b, want), "ring exchange delivered wrong bytes"
    print(f"rank {r}: exchange ok in {rounds} waits", flush=True)
    if sys.argv[1:] == ["timeout"]:
        q = t.irecv(prv, 77, memoryview(b)[:16])   # nobody ever sends tag 77
        with t:
            if r == 0:
                t.wait_any([q], 1.5)
            else:
                import time; time.sleep(60)
"""


def test_transport_ring_exchange(tmp_path):
    proc, _ = _mpiexec(4, _script(tmp_path, TRANSPORT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("exchange ok") == 4


def test_timeout_aborts_the_job_with_a_message(tmp_path):
    """A wait past its deadline raises CollectiveTimeout; leaving the ``with`` block aborts
    the whole job (MPICH cannot continue), so the sleeping rank does not hang the launcher."""
    proc, elapsed = _mpiexec(2, _script(tmp_path, TRANSPORT), "timeout")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "timed out after 1.5 s waiting on rank 1 (recv tag 77, 16 B)" in out
    assert "aborting the MPI job (MPI_Abort)" in out
    assert elapsed < 30, f"the job took {elapsed:.1f} s; the sleeping rank was not aborted"


TRACKED = """
    import time, numpy as np
    from mpi4py import MPI
    from hcc.backends.base import CollectiveTimeout
    from hcc.backends.mpi import MPIBackend
    t = MPIBackend(MPI.COMM_WORLD)
    r, n = t.rank, t.world
    N = (1 << 20) + 3
    a = (np.arange(N, dtype=np.uint8) + r).astype(np.uint8)
    b = np.zeros(N, dtype=np.uint8)
    nxt, prv = (r + 1) % n, (r - 1) % n
    t.track_completions(True)
    posted = []
    for c in range(8):
        lo, hi = c * N // 8, (c + 1) * N // 8
        posted.append(t.irecv(prv, 1000 + c, memoryview(b)[lo:hi]))
        posted.append(t.isend(nxt, 1000 + c, memoryview(a)[lo:hi]))
    seen = []
    for _ in range(100):                        # bounded: 16 requests, at least one per call
        if len(seen) == len(posted):
            break
        got = t.wait_completed(20.0)
        assert got and all(q.done for q in got), "wait_completed returned nothing or undone"
        seen += got
    assert sorted(map(id, seen)) == sorted(map(id, posted)), "a request came back twice or never"
    assert np.array_equal(b, (np.arange(N, dtype=np.uint8) + prv).astype(np.uint8)), "wrong bytes"
    q = t.irecv(prv, 77, memoryview(b)[:16])    # nobody ever sends tag 77
    t0 = time.monotonic()
    try:
        t.wait_completed(1.0)
    except CollectiveTimeout as e:
        print(f"rank {r}: tracked ok, timeout after {time.monotonic() - t0:.1f} s: {e}", flush=True)
    t.track_completions(False)
    q.req.Cancel()
    q.req.Wait()
"""


def test_tracked_completions_return_every_request_once_and_keep_the_deadline(tmp_path):
    # the executor's fast path under MPI (MPIBackend.wait_completed)
    proc, _ = _mpiexec(3, _script(tmp_path, TRACKED))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("tracked ok, timeout after 1.") == 3, proc.stdout
    assert "waiting on rank" in proc.stdout and "recv tag 77, 16 B" in proc.stdout


def test_tag_above_tag_ub_is_a_plan_error(tmp_path):
    body = """
        import numpy as np
        from mpi4py import MPI
        from hcc.backends.mpi import MPIBackend
        from hcc.ir.errors import PlanError
        t = MPIBackend(MPI.COMM_WORLD)
        try:
            t.isend(1 - t.rank, t.tag_ub + 1, memoryview(np.zeros(4, np.uint8)))
        except PlanError as e:
            print("rejected:", e, flush=True)
    """
    proc, _ = _mpiexec(2, _script(tmp_path, body))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("is outside 0..MPI_TAG_UB") == 2


@pytest.fixture(scope="module")
def killed_job() -> dict:
    """One 4-rank job of the grid's big allreduce whose rank 1 is SIGKILLed at its first send
    (the two tests below checked one such job each): the ranks' errors, how long it took, and
    the /dev/shm segments that appeared during it and nobody maps afterwards."""
    src, _ = grid_program(4)
    plan = hcc.compile(src, "big_allreduce")
    before = mpi._shm_segments()
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as info:
        mpi.run_local(plan, make_inputs(plan, 0), timeout=30.0, kill=(1, 0))
    elapsed = time.monotonic() - t0
    left = mpi._shm_segments() - before - mpi._mapped_segments()
    return {"errors": info.value.errors, "elapsed": elapsed, "left": left}


def test_killed_rank_ends_the_job_with_a_clear_error(killed_job):
    """SIGKILL one rank at its first send: every rank is reported, the dead one as killed,
    the others as stopped because MPICH cannot continue; well within the deadline."""
    errs, elapsed = killed_job["errors"], killed_job["elapsed"]
    assert errs[1] == "killed (SIGKILL)"
    assert set(errs) == {0, 1, 2, 3}
    for r in (0, 2, 3):
        assert "MPICH cannot continue" in errs[r] or "rank 1" in errs[r], errs[r]
    assert elapsed < 30.0, f"took {elapsed:.1f} s"


def test_an_aborted_job_leaves_no_shared_memory_behind(killed_job):
    """A SIGKILLed rank never reaches MPI_Finalize, so MPICH's /dev/shm segments outlive the
    job; the launcher unlinks the ones that appeared during it and nobody maps any more (a
    later job whose segment name collides would fail in MPI_Init: "Out of memory")."""
    left = killed_job["left"]
    assert not left, f"segments left by the aborted job: {sorted(left)}"


def test_embedding_example_under_mpiexec():
    proc, _ = _mpiexec(4, ROOT / "examples" / "mpi_embed.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": verified") == 4, proc.stdout


def test_native_peer_and_pair():
    """MPICH's own collective runs in the same job as the plan, on the same buffers."""
    plan = hcc.compile(grid_program(4)[0], "big_allreduce")
    hcc_t, native_t = mpi_peers.bench_pair(plan, make_inputs(plan, 3), iters=3, warmup=1)
    assert len(hcc_t) == 3 and len(native_t) == 3
    assert all(t > 0 for t in hcc_t + native_t)
    times = mpi_peers.bench_native("broadcast", 1 << 16, 2, iters=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_native_collective_matches_reference(tmp_path):
    """native_collective lays buffers out as the plan IR does (blocks differ by one element)."""
    body = """
        import numpy as np
        from mpi4py import MPI
        import sys; sys.path.insert(0, "benchmarks")
        from mpi_peers import native_collective
        from hcc.ir.plan import buffer_layout, block_range
        c = MPI.COMM_WORLD; r, n = c.rank, c.size
        E = 1001
        i, o = buffer_layout("allgather", E, n, r, 0)
        lo, hi = block_range(E, n, r)
        out = native_collective("allgather", c, np.arange(lo, hi, dtype=np.int32), np.zeros(o, np.int32))
        assert np.array_equal(out, np.arange(E, dtype=np.int32))
        i, o = buffer_layout("reduce_scatter", E, n, r, 0)
        out = native_collective("reduce_scatter", c, np.arange(E, dtype=np.int32), np.zeros(o, np.int32))
        assert np.array_equal(out, n * np.arange(lo, hi, dtype=np.int32))
        print("native ok", flush=True)
    """
    proc, _ = _mpiexec(3, _script(tmp_path, body))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("native ok") == 3


def test_cli_run_backend_mpi():
    """``hcc run samples/demo.hcl --backend mpi`` on one of its collectives (4 ranks, 4 MiB:
    the CLI's path to mpiexec; sizes and rank counts are the grid's above. DGX-1's 61 MiB
    allgather on 8 ranks, which this test ran before, took 3.6x as long and takes no other path)."""
    proc = subprocess.run([str(Path(PY).parent / "hcc"), "run", "samples/demo.hcl", "-c",
                           "allgather", "--backend", "mpi", "--iters", "1", "--warmup", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [l for l in proc.stdout.splitlines() if " mpi " in l]
    assert len(rows) == 1 and "verified: ok" in rows[0] and " 4 " in rows[0], proc.stdout


def test_no_mpi_process_listens_beyond_loopback(tmp_path):
    """The launcher and MPICH's netmod bind only 127.0.0.1 (checked with ``ss`` inside the job)."""
    if not any(os.access(os.path.join(d, "ss"), os.X_OK) for d in os.environ.get("PATH", "").split(":")):
        pytest.skip("ss (iproute2) is not installed")
    body = """
        import os, re, subprocess
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        c.Barrier()
        mine = {os.getpid(), os.getppid()}      # this rank and the launcher
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if {int(p) for p in re.findall(r"pid=(\\d+)", line)} & mine:
                print("LISTEN", line.split()[3], flush=True)
        c.Barrier()
    """
    proc, _ = _mpiexec(2, _script(tmp_path, body))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listens = [l.split()[1] for l in proc.stdout.splitlines() if l.startswith("LISTEN")]
    assert all(a.startswith("127.0.0.1:") for a in listens), listens


BOUND = """
    import os, sys, numpy as np
    from mpi4py import MPI
    import hcc
    from hcc.ir.plan import Plan
    from hcc.backends.mpi import MPIBackend
    from hcc.backends.reference import check, expected, make_input
    from hcc.backends.state import peek
    t = MPIBackend(MPI.COMM_WORLD)
    r, n = t.rank, t.world
    names = sys.argv[2:]
    plans = [Plan.load(os.path.join(sys.argv[1], f"{nm}.json")) for nm in names]
    for plan in plans:
        sizes = plan.buffer_elems(r)
        x = make_input(plan, 0, r).copy()
        outs = [np.empty(sizes["out"], x.dtype), np.empty(sizes["out"], x.dtype)]
        for it in range(6):
            # new values in the same input array, garbage in the output: a bound run must
            # read the memory as it is now and write every element it owns
            x[...] = make_input(plan, it + 1, r)
            out = outs[it % 2]
            out[...] = make_input(plan, 99, r)[:1].repeat(out.size) if out.size else out
            got = hcc.run(plan, t, x, out=out)
            assert got is out
            want = expected(plan, [make_input(plan, it + 1, q) for q in range(n)])
            check(plan, [out if q == r else None for q in range(n)],
                  [want[q] if q == r else None for q in range(n)])
        bound = peek(plan).bound
        assert len(bound) == 2, f"{plan.name}: {len(bound)} bindings, want one per output buffer"
        if plan.kind == "allreduce":  # in place: the output is the input
            for it in range(3):
                x[...] = make_input(plan, it + 7, r)
                hcc.run(plan, t, x, out=x)
                want = expected(plan, [make_input(plan, it + 7, q) for q in range(n)])
                check(plan, [x if q == r else None for q in range(n)],
                      [want[q] if q == r else None for q in range(n)])
            assert len(peek(plan).bound) == 3
    made = len(t._persistent)
    t.close()                                   # frees every persistent request; later runs bind again
    assert not t._persistent and made > 0
    plan = plans[0]
    x = make_input(plan, 5, r).copy()
    out = np.zeros(plan.buffer_elems(r)["out"], x.dtype)
    hcc.run(plan, t, x, out=out)
    want = expected(plan, [make_input(plan, 5, q) for q in range(n)])
    check(plan, [out if q == r else None for q in range(n)], [want[q] if q == r else None for q in range(n)])
    print(f"rank {r}: bound ok, {made} persistent requests", flush=True)
"""

BOUND_SRC = """
topology t4 {
    node r[0..3]
    class fast = 1 GB/s, 10 us
    r[0..3] <-> r[0..3] : fast
}
collective ar_direct = allreduce on t4 { size = 4000 B
 algorithm = direct }
collective ar_ring = allreduce on t4 { size = 100004 B
 dtype = int32
 op = max
 algorithm = ring
 chunk = 8 KiB }
collective ar_pack = allreduce on t4 { size = 262148 B
 algorithm = treepack
 chunk = 32 KiB }
collective bc = broadcast on t4 { size = 40008 B
 dtype = float64
 root = r2
 chunk = 8 KiB }
collective ag = allgather on t4 { size = 4004 B }
collective rs = reduce_scatter on t4 { size = 8000 B
 op = avg }
collective a2a = alltoall on t4 { size = 4000 B
 dtype = float16 }
"""


def test_bound_runs_reuse_persistent_requests_and_stay_exact(tmp_path):
    """hcc.run with the same arrays again binds once (persistent MPI requests, backends/bound.py)
    and stays exact when the input changes between runs and the output holds garbage;
    in-place runs and a closed communicator bind anew."""
    names = ["ar_direct", "ar_ring", "ar_pack", "bc", "ag", "rs", "a2a"]
    for nm in names:
        hcc.compile(BOUND_SRC, nm).save(tmp_path / f"{nm}.json")
    proc, _ = _mpiexec(4, _script(tmp_path, BOUND), str(tmp_path), *names)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("bound ok") == 4, proc.stdout
    assert "persistent request" not in proc.stderr, proc.stderr  # MPICH's warning at finalize


BOUND_TIMEOUT = """
    import time, numpy as np
    from mpi4py import MPI
    import hcc
    from hcc.backends.base import CollectiveTimeout
    from hcc.backends.mpi import MPIBackend
    from hcc.backends.state import peek
    t = MPIBackend(MPI.COMM_WORLD)
    r = t.rank
    plan = hcc.compile('''
    topology t2 { node r[0..1]
     r0 <-> r1 : 1 GB/s, 10 us }
    collective bc = broadcast on t2 { size = 4 MiB
     root = r0 }
    ''', "bc")
    x = np.arange(plan.buffer_elems(r)["in"], dtype=np.float32)
    out = np.zeros(plan.buffer_elems(r)["out"], np.float32)
    hcc.run(plan, t, x, out=out)                     # binds
    hcc.run(plan, t, x, out=out)                     # reuses the binding
    assert len(peek(plan).bound) == 1
    if r == 0:
        t0 = time.monotonic()
        try:
            hcc.run(plan, t, x, out=out, timeout=1.0)
        except CollectiveTimeout as e:
            print(f"rank 0: bound timeout after {time.monotonic() - t0:.1f} s: {e}", flush=True)
        assert peek(plan).bound == [], "a run that failed must drop its binding"
    else:
        time.sleep(2.0)                         # the root's bound run times out meanwhile
    if r == 1:
        hcc.run(plan, t, x, out=out)                 # drains the root's abandoned sends
        assert np.array_equal(out, x)
    t.barrier("end", 30.0)
    print(f"rank {r}: done", flush=True)
"""


def test_a_bound_run_keeps_the_deadline(tmp_path):
    proc, _ = _mpiexec(2, _script(tmp_path, BOUND_TIMEOUT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: bound timeout after 1." in proc.stdout, proc.stdout + proc.stderr
    assert "waiting on rank 1" in proc.stdout and "Send" in proc.stdout, proc.stdout
    assert proc.stdout.count("done") == 2, proc.stdout
