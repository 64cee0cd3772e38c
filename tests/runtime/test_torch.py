"""The torch.distributed backend "hcc" between real processes (tests/runtime/torch_worker.py):
every op with odd sizes and each dtype against numpy, two async all-reduces in flight, DDP on
4 processes over "hcc" and "gloo" from one seed, torchrun and tcp://, and the errors a user
gets for mismatched sizes, mismatched op order, an absent rank and a tensor not on the CPU.

One job of 4 processes (:func:`job4`) runs the ops, DDP, op-order (also of ranks that only
send), size and absent-rank checks (each breaking check on a process group of its own), so
they share one start-up."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
WORKER = HERE / "torch_worker.py"
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cache: Path, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"MASTER_ADDR": "127.0.0.1", "HCC_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"})
    env.pop("HCC_TOPOLOGY", None)
    env.pop("HCC_RANKS", None)
    env.update(extra or {})
    return env


def parse(out: str) -> tuple[str, dict]:
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return "RESULT", json.loads(line[7:])
        if line.startswith("ERROR "):
            return "ERROR", json.loads(line[6:])
    return "NONE", {}


def launch(mode: str, n: int, cache: Path, backend: str = "hcc", timeout: float = 240,
           extra: dict | None = None) -> list[tuple[int, str, dict, str]]:
    """Start ``n`` ranks (env://), wait (bounded), return (exit code, kind, payload, output).

    Each rank writes to a file of its own, not a pipe: the job4 ranks' results (DDP's
    parameters) are ~100 KB, beyond a pipe's 64 KiB, so with pipes read one rank after the
    other each rank waited in its last write for the ranks before it to exit."""
    import tempfile

    port = free_port()
    procs, outs = [], []
    for r in range(n):
        env = _env(cache, {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                           "MASTER_PORT": str(port), **(extra or {})})
        outs.append(tempfile.TemporaryFile("w+"))
        procs.append(subprocess.Popen([PY, str(WORKER), mode, backend], env=env, stdout=outs[-1],
                                      stderr=subprocess.STDOUT, text=True))
    end = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                p.wait(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                    q.wait()
                outs[procs.index(p)].seek(0)
                pytest.fail(f"{mode}: a rank did not finish in {timeout} s:\n{outs[procs.index(p)].read()[-3000:]}")
        done = []
        for p, f in zip(procs, outs):
            f.seek(0)
            done.append((p.returncode, f.read()))
    finally:
        for f in outs:
            f.close()
    return [(code, *parse(out), out) for code, out in done]


def ok(results) -> list[dict]:
    for code, kind, payload, out in results:
        assert code == 0 and kind == "RESULT", out[-4000:]
    return [payload for _, _, payload, _ in results]


@pytest.fixture(scope="module")
def job4(tmp_path_factory) -> list[dict]:
    """One 4-rank job (default group "hcc", env://): ops, ddp, order, sendonly, sizes, absent
    (last: its group is left broken); per rank a dict mode -> result."""
    return ok(launch("ops,ddp,order,sendonly,sizes,absent", 4, tmp_path_factory.mktemp("job4") / "cache",
                     timeout=420))


def _mode(job: list[dict], mode: str) -> list[dict]:
    for r in job:
        assert "error" not in r[mode] or mode in ("order", "sendonly", "sizes", "absent"), r[mode]
    return [r[mode] for r in job]


def test_every_op_each_dtype_odd_sizes(job4):
    res = _mode(job4, "ops")
    assert all(r["checked"] == res[0]["checked"] for r in res) and res[0]["checked"] > 250
    for r in res:  # a tensor not on the CPU is refused with a message that says so
        assert "CPU tensors only" in r["not_cpu"], r


def test_async_in_flight_three_ranks_tcp_init_and_disk_cache(tmp_path):
    """Two all_reduces in flight at once and a burst of 16 async calls waited for in reverse,
    on three ranks (no size divides by 3) joined with tcp:// and explicit rank/world_size, over
    TCP (``HCC_SHM=off``: the native core drives the connections, the runs of both lanes at
    once); then again on a new group of the same ranks, whose empty plan cache reads every plan
    the first run left on disk (nothing is compiled twice)."""
    cache = tmp_path / "cache"
    extra = {"HCC_TEST_INIT": "tcp", "HCC_SHM": "off"}
    res = ok(launch("async,async_cached", 3, cache, extra=extra))
    files = sorted(p.name for p in cache.rglob("*.json"))
    assert files and all(f.startswith(("allreduce-", "broadcast-")) for f in files)
    for r in res:
        assert r["async"]["ok"] and r["async_cached"]["ok"], r
        # the ranks of a host compile each plan once between them (the others read its file)
        assert r["async"]["compiled"] + r["async"]["loaded"] > 0, r
        assert r["async_cached"]["compiled"] == 0 and r["async_cached"]["loaded"] > 0, r
    assert sum(r["async"]["compiled"] for r in res) > 0, res
    assert sorted(p.name for p in cache.rglob("*.json")) == files


def test_ddp_hcc_matches_gloo(job4):
    """The same model, seed and batches trained 10 steps with DDP over "hcc" and over "gloo"
    in one job of 4 processes: every rank's parameters agree across ranks and backends."""
    import numpy as np

    res = _mode(job4, "ddp")
    ref = np.array(res[0]["gloo"])
    for r in res:
        assert np.allclose(np.array(r["gloo"]), ref, rtol=1e-5, atol=1e-6)
        assert np.allclose(np.array(r["hcc"]), ref, rtol=1e-5, atol=1e-6)
    # and training moved them: the comparison is not between two untouched models
    assert np.abs(np.array(res[0]["init"]) - ref).max() > 1e-2


def test_torchrun(tmp_path):
    port = free_port()
    env = _env(tmp_path / "cache")
    p = subprocess.run([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(port), str(WORKER), "join"], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    dec = json.JSONDecoder()  # each RESULT's JSON object, wherever the line breaks fell
    res = [dec.raw_decode(piece)[0] for piece in p.stdout.split("RESULT ")[1:]]
    assert sorted(r["rank"] for r in res) == [0, 1] and all(r["world"] == 2 for r in res), res


def test_mismatched_sizes_name_ranks_and_shapes(job4):
    msgs = [r.get("error", "") for r in _mode(job4, "sizes")]
    assert all(msgs), msgs
    assert any("rank 1 called allreduce float32 count 101" in m
               and "ranks 0, 2, 3 called allreduce float32 count 100" in m for m in msgs), msgs


def test_mismatched_op_order_is_found_on_the_wire(job4):
    """Ranks 0, 1 issue all_reduce then broadcast, ranks 2, 3 the reverse: every rank's first
    call fails long before the group's 120 s deadline, and the error names both groups' ops."""
    res = _mode(job4, "order")
    for r in res:
        assert "error" in r, r
        assert "timed out" not in r["error"] and r["elapsed_s"] < 60, r
    # every rank names both groups' calls; the one rank that sees the other plan's frame
    # first says "different plans", the others that its connection closed after, and where two
    # see it at once each may report only the other's closed connection (as in
    # tests/runtime/test_sockets_native.py), so no rank's wording is required
    named = [r["error"] for r in res if "ranks 0, 1 called allreduce float32 count 1000" in r["error"]
             and "ranks 2, 3 called broadcast float32 count 77" in r["error"]]
    assert len(named) == len(res), [r["error"] for r in res]


def test_mismatched_op_order_of_ranks_that_only_send_is_found(job4):
    """Rank 0 broadcasts from itself and the others from rank 1: ranks 0 and 1 only send in
    that run, so nothing they receive in the plan can show the mismatch; the run's header
    (hcc/collectives.py) does. Every rank fails by the barrier after it, well before the
    group's 120 s deadline, and the error names both calls."""
    res = _mode(job4, "sendonly")
    for r in res:
        assert "error" in r and "barrier" not in r["after"], r
        assert "timed out" not in r["error"] and r["elapsed_s"] < 60, r
    named = [r["error"] for r in res if "rank 0 called broadcast float32 count 77 root 0" in r["error"]
             and "ranks 1, 2, 3 called broadcast float32 count 77 root 1" in r["error"]]
    assert named, [r["error"] for r in res]


def test_absent_rank_is_named(job4):
    """Rank 3 of job4 never calls the second all_reduce of a group with a 6 s deadline (alive
    and connected, until the others have failed): each other rank fails, naming it."""
    res = _mode(job4, "absent")
    assert res[3].get("absent") is True and res[3]["others_failed"] == 3, res[3]
    errs = [r["error"] for r in res[:3] if "error" in r]
    assert len(errs) == 3, res
    for m in errs:
        # a rank either reaches its own deadline or hears first that another waiting rank
        # gave up at its deadline; either way the absent rank is the one named
        assert ("timed out" in m or any(f"rank {k} failed" in m for k in range(3))) \
            and "rank 3 did not report this collective" in m, m
