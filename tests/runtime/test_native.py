"""The native core against the pure-Python executor: the kernels for every dtype and op, and
compiled plans run by the core's program runner, by the Python executor over the same
shared-memory channels, and by the Python executor over TCP — integer results bit-identical,
float results within the reduction-order tolerance, all against numpy's reference. A test
also proves the extension is the one in use (its runner ran the programs: its own counters
moved, and the Python loop never ran)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import hcc
from hcc.backends import kernels, native
from hcc.backends.executor import RankExecution
from hcc.backends.launch import run_cases_local
from hcc.backends.reference import check, expected, make_inputs

sys.path.insert(0, str(Path(__file__).parent))
from test_shm import _job  # noqa: E402  (one threaded local job for both files)
from hcc.ir.plan import DTYPE_SIZES, OPS

pytestmark = pytest.mark.skipif(not native.available(), reason="the native core is not built (pip install -e .)")

INTS = ("int8", "int32", "int64", "uint8")


def _arrays(dtype: str, n: int, seed: int):
    rng = np.random.default_rng(seed)
    st = kernels.np_dtype(dtype)
    if dtype == "bfloat16":
        return [kernels.from_float32(rng.standard_normal(n).astype(np.float32) * 8, "bfloat16") for _ in range(2)]
    if np.issubdtype(st, np.integer):
        info = np.iinfo(st)
        return [rng.integers(info.min, info.max, n, dtype=st, endpoint=True) for _ in range(2)]
    a, b = (rng.standard_normal(n) * 8).astype(st), (rng.standard_normal(n) * 8).astype(st)
    a[::97] = np.nan  # min/max propagate NaN as numpy does
    return [a, b]


@pytest.mark.parametrize("dtype", sorted(DTYPE_SIZES))
@pytest.mark.parametrize("op", OPS)
def test_kernels_match_numpy(dtype, op):
    a, b = _arrays(dtype, 4099, 1)  # odd length: the vector loops' tails
    want = np.empty_like(a)
    kernels.combine_into(op, dtype, want, a, b)
    got = np.empty_like(a)
    native.combine(op, dtype, got, a, b)
    inplace = a.copy()
    native.combine(op, dtype, inplace, inplace, b)
    if dtype in INTS:
        assert np.array_equal(got, want) and np.array_equal(inplace, want)
    else:
        f = (lambda x: kernels.to_float32(x, "bfloat16")) if dtype == "bfloat16" else (lambda x: x)
        np.testing.assert_allclose(f(got), f(want), rtol=1e-6, equal_nan=True)
        np.testing.assert_allclose(f(inplace), f(want), rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", sorted(DTYPE_SIZES))
def test_scale_matches_numpy(dtype):
    a, _ = _arrays(dtype, 1001, 2)
    want, got = a.copy(), a.copy()
    kernels.scale_into(dtype, want, 3)
    native.scale(dtype, got, 3)
    if dtype in INTS:  # floor division, negative numbers included
        assert np.array_equal(got, want)
    else:
        f = (lambda x: kernels.to_float32(x, "bfloat16")) if dtype == "bfloat16" else (lambda x: x)
        np.testing.assert_allclose(f(got), f(want), rtol=1e-6, equal_nan=True)


def _grid_source() -> tuple[str, list[str]]:
    """A 4-rank switch topology and one collective per (kind, dtype, op) that reduces, in sizes
    (in elements) that do not divide evenly, with small chunks so that messages span several ring slots and
    arrive before their receives."""
    src = "topology t {\n    node r[0..3]\n    switch s\n    r[0..3] <-> s : 8 GB/s, 5 us\n}\n"
    names = []
    cases = [("allreduce", "int32", "sum", 300_001, ""), ("allreduce", "int8", "prod", 4097, ""),
             ("allreduce", "uint8", "max", 1001, "chunk = 256 B"), ("allreduce", "int64", "min", 70_001, ""), ("allreduce", "float64", "avg", 70_001, ""),
             ("allreduce", "float32", "sum", 1 << 20, "chunk = 64 KiB"), ("allreduce", "bfloat16", "avg", 99_999, ""),
             ("allreduce", "float16", "min", 5000, ""), ("allreduce", "float64", "sum", 777_777, "algorithm = ring"),
             ("reduce_scatter", "int32", "sum", 40_000, ""), ("reduce", "float32", "max", 1 << 20, ""),
             ("broadcast", "int32", None, 3_000_001, "chunk = 512 KiB"), ("allgather", "float64", None, 100_000, ""),
             ("alltoall", "int64", None, 4096, ""), ("gather", "uint8", None, 1 << 20, "")]
    for i, (kind, dtype, op, size, extra) in enumerate(cases):
        name = f"c{i}_{kind}"
        names.append(name)
        body = f"    size = {size * DTYPE_SIZES[dtype]} B\n    dtype = {dtype}\n    adaptive = off\n"
        if op:
            body += f"    op = {op}\n"
        for line in extra.split(";"):
            if line.strip():
                body += f"    {line.strip()}\n"
        src += f"collective {name} = {kind} on t {{\n{body}}}\n"
    return src, names


@pytest.fixture(scope="module")
def grid_plans():
    src, names = _grid_source()
    program = hcc.load(src)
    return [hcc.compile(program, n) for n in names]


def _run(plans, monkeypatch, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cases = [(p, make_inputs(p, 5)) for p in plans]
    return cases, run_cases_local("sockets", cases, iters=2, warmup=0, timeout=30)


@pytest.mark.slow
def test_runner_matches_python_executor_over_both_transports(grid_plans, monkeypatch):
    cases, runner = _run(grid_plans, monkeypatch, HCC_NATIVE="1", HCC_SHM="on")
    _, py_shm = _run(grid_plans, monkeypatch, HCC_NATIVE="0", HCC_SHM="on")
    _, py_tcp = _run(grid_plans, monkeypatch, HCC_NATIVE="0", HCC_SHM="off")
    for (plan, ins), a, b, c in zip(cases, runner, py_shm, py_tcp):
        want = expected(plan, ins)
        for res in (a, b, c):
            check(plan, res.outputs, want)
        for r in range(plan.n):
            x, y, z = a.outputs[r], b.outputs[r], c.outputs[r]
            if x is None or want[r] is None:  # an output the collective leaves undefined
                continue
            if plan.dtype in INTS:  # bit-identical
                assert np.array_equal(x, y) and np.array_equal(x, z), (plan.name, r)
            else:  # the same reduction order: equal up to the reduction-order tolerance
                f = (lambda v: kernels.to_float32(v, "bfloat16")) if plan.dtype == "bfloat16" else np.asarray
                np.testing.assert_allclose(f(x), f(y), rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(f(x), f(z), rtol=1e-5, atol=1e-6)


def _local_job(n: int, fn, timeout: float = 20.0):
    """``fn(rank, comm)`` on n ranks connected over sockets with shm on, as threads of this
    process (each rank has its own channels; the runner releases the GIL)."""
    return _job(n, fn, timeout=timeout, shm_mode="on")


@pytest.mark.slow
def test_the_extension_runs_the_programs(grid_plans, monkeypatch):
    monkeypatch.setenv("HCC_NATIVE", "1")
    plan = grid_plans[0]  # allreduce int32
    ins = make_inputs(plan, 9)
    python_loops = []
    orig = RankExecution._execute

    def spy(self, fast):  # the Python loop: must not run when the core takes the program
        python_loops.append(self.rank)
        return orig(self, fast)

    monkeypatch.setattr(RankExecution, "_execute", spy)

    def fn(r, c):
        before = c.native_stats()["runs"]
        outs = [hcc.run(plan, c, ins[r]) for _ in range(3)]
        return outs[-1], c.native_stats()["runs"] - before, type(c).__name__

    res = _local_job(plan.n, fn)
    assert native._native.__file__.endswith(".so")
    assert all(kind == "ShmSocketTransport" for _, _, kind in res)
    assert [runs for _, runs, _ in res] == [3] * plan.n
    assert python_loops == []
    check(plan, [o for o, _, _ in res], expected(plan, ins))


@pytest.mark.slow
def test_python_executor_runs_when_the_runner_is_off(grid_plans, monkeypatch):
    monkeypatch.setenv("HCC_NATIVE", "0")
    plan = grid_plans[0]
    ins = make_inputs(plan, 9)

    def fn(r, c):
        out = hcc.run(plan, c, ins[r])
        return out, c.native_stats()["runs"], c.native_stats()["messages"]

    res = _local_job(plan.n, fn)
    assert all(runs == 0 and msgs > 0 for _, runs, msgs in res)  # the channels, not the runner
    check(plan, [o for o, _, _ in res], expected(plan, ins))


@pytest.mark.slow
def test_the_core_runs_a_mixed_job_and_hands_tcp_peers_to_the_sockets_transport(grid_plans, monkeypatch):
    # two "hosts" of two ranks (HCC_SHM_HOST-style labels): each rank has one peer on its
    # channels and two over TCP. The core runs every program (its run counter moves, the Python
    # loop never runs), the TCP transfers go through the sockets transport, and the results
    # equal the Python executor's over the same mixed transport: bit for bit for integers
    plans = [grid_plans[0], grid_plans[1]]  # allreduce int32 sum, int8 prod (direct and treepack plans)
    program = hcc.load(
        "topology t {\n    node r[0..3]\n    switch s\n    r[0..3] <-> s : 8 GB/s, 5 us\n}\n"
        "collective bc = broadcast on t {\n    size = 1000004 B\n    dtype = int32\n    chunk = 64 KiB\n"
        "    adaptive = off\n}\n"
        "collective ag = allgather on t {\n    size = 400000 B\n    dtype = uint8\n    adaptive = off\n}\n"
        "collective arf = allreduce on t {\n    size = 2 MiB\n    dtype = float32\n    chunk = 128 KiB\n"
        "    adaptive = off\n}\n")
    plans += [hcc.compile(program, n) for n in ("bc", "ag", "arf")]
    ins = {p.name: make_inputs(p, 11) for p in plans}
    python_loops = []
    orig = RankExecution._execute

    def spy(self, fast):
        python_loops.append((self.rank, os.environ.get("HCC_NATIVE")))
        return orig(self, fast)

    monkeypatch.setattr(RankExecution, "_execute", spy)

    def fn(r, c):
        before = c.native_stats()["runs"]
        core = [np.array(hcc.run(p, c, ins[p.name][r])) for p in plans]
        runs = c.native_stats()["runs"] - before
        c.barrier("switch")
        return sorted(c.local_peers), core, runs

    from hcc.backends import shm

    host_id = shm.host_id  # each labelled job patches it on top of what it finds
    monkeypatch.setenv("HCC_NATIVE", "1")
    res = _job(4, fn, ["a", "a", "b", "b"], monkeypatch=monkeypatch)
    assert [local for local, _, _ in res] == [[1], [0], [3], [2]]
    assert [runs for _, _, runs in res] == [len(plans)] * 4
    assert python_loops == []
    monkeypatch.setenv("HCC_NATIVE", "0")  # the reference: the Python executor, same mixed transport
    monkeypatch.setattr(shm, "host_id", host_id)
    ref = _job(4, fn, ["a", "a", "b", "b"], monkeypatch=monkeypatch)
    assert len(python_loops) == 4 * len(plans)
    for i, p in enumerate(plans):
        check(p, [core[i] for _, core, _ in res], expected(p, ins[p.name]))
        for r in range(4):
            x, y = res[r][1][i], ref[r][1][i]
            if p.dtype in INTS:
                assert np.array_equal(x, y), (p.name, r)
            else:
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


_TCP_SUICIDE = """
import os, signal, sys
os.environ["HCC_SHM_HOST"] = "other"
from hcc.backends import sockets
c = sockets.connect(0, 3, sys.argv[1], token="kill-test", timeout=20, serve_store=False)
for p in (1, 2):  # the TCP connections exist before the death (the transport notices it on them)
    c.wait_any([c.isend(p, 99, memoryview(b"12345678"))], 20)
c.barrier("up")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_mixed_run_in_the_core_notices_a_dead_tcp_peer(monkeypatch):
    # rank 0 (a child process on another "host") SIGKILLs itself; ranks 1 and 2 (threads here,
    # sharing memory) broadcast from it in the core: both stop with RootFailed naming rank 0
    # long before their 10 s deadline, the one with the TCP receive through check(), the other
    # through its channel peer's report
    import subprocess
    import threading
    import time

    from hcc.backends import shm as shm_mod, sockets
    from hcc.backends.base import RootFailed
    from hcc.backends.rendezvous import StoreServer

    monkeypatch.setenv("HCC_NATIVE", "1")
    monkeypatch.delenv("HCC_SHM_HOST", raising=False)
    real = shm_mod.host_id
    monkeypatch.setattr(shm_mod, "host_id", lambda: real() + ":here")
    plan = hcc.compile(hcc.load("topology t {\n    node r[0..2]\n    switch s\n    r[0..2] <-> s : 8 GB/s, 20 us\n}\n"
                                "collective c = broadcast on t {\n    size = 4 MiB\n    dtype = int32\n"
                                "    chunk = 256 KiB\n    adaptive = off\n}\n"), "c")
    errs, took = {}, {}
    with StoreServer("kill-test") as server:
        child = subprocess.Popen([sys.executable, "-c", _TCP_SUICIDE, server.address])
        try:
            def body(r):
                comm = sockets.connect(r, 3, server.address, token="kill-test", timeout=20, serve_store=False)
                try:
                    assert comm.local_peers == {3 - r}
                    comm.wait_any([comm.irecv(0, 99, memoryview(bytearray(8)))], 20)
                    comm.barrier("up")
                    t0 = time.monotonic()
                    try:
                        hcc.run(plan, comm, np.ones(plan.elems, np.int32), timeout=10)
                    except Exception as e:  # checked below
                        errs[r] = e
                    took[r] = time.monotonic() - t0
                finally:
                    comm.close()

            ts = [threading.Thread(target=body, args=(r,)) for r in (1, 2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
        finally:
            child.wait(20)
    assert child.returncode == -9
    assert set(errs) == {1, 2}, errs
    for r in (1, 2):
        assert isinstance(errs[r], RootFailed) and errs[r].rank == 0, errs[r]
        assert took[r] < 5, took
