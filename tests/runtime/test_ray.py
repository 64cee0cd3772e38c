"""The Ray backend on a real local Ray cluster (one per module: start-up costs ~5 s).

One actor per rank; data over the sockets transport (the default) and over Ray's object
store; failures detected through Ray (a SIGKILLed actor makes every survivor of a plan with
``on_failure = abort`` raise RankFailed long before the deadline); users' own actors get a
communicator from ``init_group``; the adaptive executor is the default on both data paths.
Surviving deaths (``on_failure = continue``) is tests/runtime/test_faults_ray.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import hcc
from hcc.backends import RankFailed
from hcc.backends import ray as hray
from hcc.backends.reference import check, expected, make_inputs

from conftest import ITEM, KINDS, clique_topology, ray_group_member

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hray.available(), reason="ray does not import"),
]

ROOT = Path(__file__).resolve().parents[2]

TOPO = clique_topology("t4", 4, "1 GB/s, 10 us")


def program() -> tuple[str, list[str]]:
    """Every kind on 4 ranks in float32 and on 3 ranks in a second dtype (rotating), odd
    element counts (alltoall: divisible by the rank count), and two pipelined ~1 MiB plans."""
    parts, names = [TOPO], []
    others = ("int32", "float64", "bfloat16", "float16")
    ops = ("sum", "max", "min", "prod", "avg")
    for i, kind in enumerate(KINDS):
        for n, dt in ((4, "float32"), (3, others[i % len(others)])):
            if kind == "neighbor_average" and dt == "int32":
                dt = "float64"
            elems = (1000 if n == 4 else 999) if kind == "alltoall" else 1001
            body = [f"ranks = r[0..{n - 1}]", f"size = {elems * ITEM[dt]} B", f"dtype = {dt}"]
            if kind in ("broadcast", "reduce", "gather", "scatter"):
                body.append(f"root = r{(i + n) % n}")
            if kind in ("reduce", "allreduce", "reduce_scatter"):
                op = ops[(i + n) % len(ops)]
                body.append(f"op = {'sum' if op == 'avg' and dt == 'int32' else op}")
            if kind == "neighbor_average":
                body.append("peers = ring")
            name = f"{kind}_{n}_{dt}"
            parts.append(f"collective {name} = {kind} on t4 {{\n " + "\n ".join(body) + "\n}")
            names.append(name)
    for name, kind, extra in (("big_allreduce", "allreduce", "algorithm = treepack"),
                              ("big_broadcast", "broadcast", "root = r1\n algorithm = treepack")):
        parts.append(f"collective {name} = {kind} on t4 {{\n size = 1048580 B\n {extra}\n}}")
        names.append(name)
    return "\n".join(parts), names


@pytest.fixture(scope="module")
def plans():
    src, names = program()
    return {nm: hcc.compile(src, nm) for nm in names}


@pytest.fixture(scope="module")
def group(ray_cluster):
    with hray.ActorGroup(4) as g:
        yield g


def test_cluster_is_on_loopback(ray_cluster, group):
    """Every Ray process of this cluster (GCS, raylet, agents, our rank actors) listens on
    127.0.0.1 only (``ss -ltnp``)."""
    node = ray_cluster._private.worker._global_node
    pids = {os.getpid(), *group.pids}
    for procs in node.all_processes.values():
        pids.update(p.process.pid for p in procs if p.process is not None)
    assert ray_cluster.util.get_node_ip_address() == "127.0.0.1"
    try:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
    except FileNotFoundError:
        pytest.skip("ss (iproute2) is not installed")
    listens = [line.split()[3] for line in out.splitlines()
               if {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids]
    assert listens, "found none of the cluster's listeners: the check would prove nothing"
    loopback = ("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")  # v4, v4-mapped v6, v6
    assert all(a.startswith(loopback) for a in listens), listens


def test_grid_over_sockets(plans, group):
    kinds = {p.kind for p in plans.values()}
    assert kinds == set(KINDS) and {p.n for p in plans.values()} == {3, 4}
    for seed, plan in enumerate(plans.values()):
        inputs = make_inputs(plan, seed)
        outs, times = group.run(plan, inputs, timeout=30.0, data="sockets")
        assert len(times) == 1 and times[0] > 0
        check(plan, outs, expected(plan, inputs))


def test_grid_over_the_object_store(plans, group):
    chosen = [p for p in plans.values() if p.n == 4 and p.kind in (
        "broadcast", "allreduce", "allgather", "alltoall")] + [plans["big_allreduce"]]
    for seed, plan in enumerate(chosen):
        inputs = make_inputs(plan, seed)
        outs, times = group.run(plan, inputs, iters=2, timeout=30.0, data="objects")
        assert len(times) == 2
        check(plan, outs, expected(plan, inputs))


@pytest.mark.parametrize("data", ["sockets", "objects"])
def test_adaptive_is_the_default_on_both_data_paths(plans, group, data):
    """A plan that does not say ``adaptive`` (``Plan.adaptive = None``) is adaptive over Ray
    (backends/runtime.py ``adaptive_on``: on for transports that declare ``arrival_order``, as Ray's do): on time, the fast
    path runs the static program; with a rank 0.4 s late the run takes the adaptive schedule,
    whose ranks report what they agreed on (only that executor does)."""
    plan = replace(plans["allreduce_4_float32"], adaptive=None)
    inputs = make_inputs(plan, 3)
    outs, _ = group.run(plan, inputs, timeout=30.0, data=data)
    check(plan, outs, expected(plan, inputs))
    outs, _ = group.run(plan, inputs, timeout=30.0, data=data, delays=[0.0, 0.0, 0.0, 0.4])
    check(plan, outs, expected(plan, inputs))
    assert set(group.last.info) == {0, 1, 2, 3}
    assert all(o.contributors == (0, 1, 2, 3) for o in outs)
    # and adaptive = off stays off: no agreement reported even with the same late rank
    off = replace(plan, adaptive=False)
    outs, _ = group.run(off, inputs, timeout=30.0, data=data, delays=[0.0, 0.0, 0.0, 0.4])
    check(off, outs, expected(off, inputs))
    assert not group.last.info


@pytest.mark.parametrize("data", ["sockets", "objects"])
def test_killed_actor_fails_every_survivor_quickly(plans, ray_cluster, data):
    """Rank 2 SIGKILLs itself at its second send: the driver names it, and each survivor
    raised RankFailed(2) — through Ray's death notice, far inside the 20 s deadline."""
    plan = plans["big_allreduce"]
    with hray.ActorGroup(4) as g:
        t0 = time.monotonic()
        with pytest.raises(RankFailed) as info:
            g.run(plan, make_inputs(plan, 1), timeout=20.0, data=data, die=(2, 1))
        elapsed = time.monotonic() - t0
    err = info.value
    assert err.rank == 2 and err.dead == [2]
    survivors = {r: e for r, e in err.errors.items() if r != 2}
    assert set(survivors) == {0, 1, 3}
    for r, e in survivors.items():
        assert isinstance(e, RankFailed) and e.rank == 2 and e.by == r, (r, e)
    assert elapsed < 10.0, f"survivors took {elapsed:.1f} s: Ray's death notice was not used"


def test_run_from_a_driver(plans, ray_cluster):
    """``hcc.backends.ray.run`` reuses the running cluster and makes its own actors."""
    plan = plans["allgather_4_float32"]
    inputs = make_inputs(plan, 7)
    outs = hray.run(plan, inputs, timeout=30.0)
    check(plan, outs, expected(plan, inputs))
    assert ray_cluster.is_initialized()  # not shut down: run() did not start it


def test_init_group_in_users_actors(plans, ray_cluster):
    """Ray's collective convention: the user's actors join a named group and call
    ``hcc.run(plan, comm, x)`` — twice, to show the communicator is reusable."""
    ray = ray_cluster
    plan = plans["big_allreduce"]

    @ray.remote(num_cpus=0)
    class Trainer(ray_group_member()):
        def allreduce(self, plan, x):
            first = hcc.run(plan, self.comm, x, timeout=30.0)
            second = hcc.run(plan, self.comm, first / 4, timeout=30.0)
            return first, second

    actors = [Trainer.remote(r, 4) for r in range(4)]
    assert ray.get([a.join.remote("grads") for a in actors], timeout=120) == [0, 1, 2, 3]
    inputs = make_inputs(plan, 11)
    res = ray.get([a.allreduce.remote(plan, inputs[r]) for r, a in enumerate(actors)],
                  timeout=120)
    want = expected(plan, inputs)
    check(plan, [f for f, _ in res], want)
    quarter = [w / 4 for w in want]
    check(plan, [s for _, s in res], expected(plan, quarter))
    ray.get([a.leave.remote("grads") for a in actors], timeout=60)
    for a in actors:
        ray.kill(a)


def test_cli_run_backend_ray():
    """``hcc run --backend ray`` starts (and stops) its own local cluster."""
    proc = subprocess.run([str(Path(sys.executable).parent / "hcc"), "run", "samples/demo.hcl",
                           "-c", "broadcast", "--backend", "ray", "--iters", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [l for l in proc.stdout.splitlines() if " ray " in l]
    assert len(rows) == 1 and "verified: ok" in rows[0], proc.stdout
