"""Fault injection and late arrivals on the Ray backend (issue 4 on Ray): a rank actor SIGKILLs
its own process (the PID it reported, ``ActorGroup.pids``) at a seeded random chunk of a
broadcast, reduce, allreduce, allgather or gather; every survivor completes with the exact
result over the survivors (``on_failure = continue``), or raises RootFailed / RankFailed.

One Ray cluster and one group of N rank actors for the module (actor start-up is seconds on
this machine); a test that kills an actor replaces it (``ActorGroup.respawn``) when done. The
driver hosts the rendezvous store and the agreement log, and appends every death Ray reports.
"""
from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest

import hcc
from hcc.backends import RankFailed, RootFailed
from hcc.backends import ray as hray
from hcc.backends.reference import _reduce, check, expected, expected_after_failures, make_inputs
from hcc.backends.testing import kill_after_chunks

from conftest import ray_group_member

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hray.available(), reason="ray does not import"),
]

N = 4
SRC = f"""
topology t {{ node g[0..{N - 1}]
  g[0..{N - 1}] <-> g[0..{N - 1}] : 1 GB/s, 10 us }}
collective broadcast = broadcast on t {{ size = 4 MB  root = g1  on_failure = continue }}
collective reduce = reduce on t {{ size = 4 MB  op = max  root = g2  on_failure = continue }}
collective allreduce = allreduce on t {{ size = 4 MB  on_failure = continue }}
collective allgather = allgather on t {{ size = 4 MB  on_failure = continue }}
collective gather = gather on t {{ size = 4 MB  root = g3  on_failure = continue }}
collective big_broadcast = broadcast on t {{ size = 32 MB  on_failure = continue }}
collective abort = allreduce on t {{ size = 4 MB  dtype = int32 }}
collective late = allreduce on t {{ size = 4 MB  adaptive = on  on_failure = continue }}
"""
# 4 MB in 256 KiB chunks: 16 per tree (allreduce, allgather, gather: 4 per block). A victim
# dies after 1..KMAX of its own chunk transfers (sent or received), i.e. from its first chunk
# to near its last; KMAX stays below what any non-root rank moves in each kind on 4 ranks.
CHUNK = 256 << 10
KMAX = {"broadcast": 16, "reduce": 14, "allreduce": 24, "allgather": 11, "gather": 3}
# A survivor's step must end within this (no-failure runs take ~0.2 s here; detection is an
# EOF or Ray's notice plus two store round trips): generous for a 2-core machine shared by
# other jobs. The driver's whole call gets the deadline of every wait plus its grace.
BOUND_S = 8.0
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def plans():
    prog = hcc.load(SRC)
    return {c.name: hcc.compile(prog, c.name) for c in prog.collectives}


@pytest.fixture(scope="module")
def group(ray_cluster):
    with hray.ActorGroup(N) as g:
        yield g


@pytest.fixture
def fresh(group):
    """The module's group with every actor alive before and after the test."""
    group.respawn()
    yield group
    group.respawn()


def _validate(plan, ins, outs, report, died: set[int]) -> None:
    """Survivors' outputs exact over the survivors, agreement equal on every survivor, every
    survivor's step bounded in time."""
    surv = [r for r in range(plan.n) if r not in died]
    assert all(outs[r] is None for r in died)
    assert set(report.info) == set(surv), "a survivor did not report what it agreed on"
    first = report.info[surv[0]]
    for r in surv:
        assert report.info[r]["contributors"] == first["contributors"], "survivors disagree"
        assert set(report.info[r]["dead"]) <= died
        assert outs[r].contributors == first["contributors"]  # on the returned array too
    for s in report.seconds:
        for r, t in s.items():
            assert t < BOUND_S, f"rank {r} took {t:.2f} s"
    contrib = set(first["contributors"])
    missing = {r: set(outs[r].missing) for r in surv}
    if plan.kind in ("reduce", "allreduce"):
        # exactly the survivors, or the victim too when it died after the run had ended
        assert set(surv) <= contrib <= set(range(plan.n))
    elif plan.kind in ("allgather", "gather"):
        for r in surv:
            if plan.kind == "allgather" or r == plan.root:
                assert missing[r] <= died, f"rank {r} reports live ranks {missing[r] - died} missing"
    exp = expected_after_failures(plan, ins, died, contrib, missing)
    check(plan, outs, exp)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", ["broadcast", "reduce", "allreduce", "allgather", "gather"])
def test_seeded_kill_every_survivor_completes_exactly(plans, fresh, kind, seed):
    plan = plans[kind]
    rng = random.Random(f"ray-{kind}-{seed}")
    victim = rng.choice([r for r in range(N) if r != plan.root])
    k = rng.randint(1, KMAX[kind])
    ins = make_inputs(plan, rng.randrange(1 << 16))
    pid = fresh.pids[victim]
    t0 = time.monotonic()
    outs, _ = fresh.run(plan, ins, timeout=TIMEOUT_S, die=(victim, k),
                        options={"chunk_bytes": CHUNK})
    wall = time.monotonic() - t0
    report = fresh.last
    assert report.dead == (victim,), f"victim {victim} (pid {pid}) at chunk {k}: {report.dead}"
    assert victim in fresh.dead
    _validate(plan, ins, outs, report, {victim})
    assert wall < BOUND_S + 5.0, f"the driver returned after {wall:.1f} s"
    if kind == "allreduce" and seed == 0:
        # the group keeps the dead actor: the next run starts without it (the driver appends
        # its death to the new run's log and gives it an address that refuses connections)
        ins2 = make_inputs(plan, 99)
        outs2, _ = fresh.run(plan, ins2, timeout=TIMEOUT_S)
        _validate(plan, ins2, outs2, fresh.last, {victim})
        assert fresh.last.info[0]["contributors"] == tuple(r for r in range(N) if r != victim)


def test_object_store_path_survives_a_kill(plans, fresh):
    """Data over Ray's object store: the same adaptive executor over RayTransport, whose
    agreement log the driver's store holds too."""
    plan = plans["allgather"]
    ins = make_inputs(plan, 12)
    outs, _ = fresh.run(plan, ins, timeout=TIMEOUT_S, data="objects", die=(2, 4),
                        options={"chunk_bytes": CHUNK})
    assert fresh.last.dead == (2,)
    _validate(plan, ins, outs, fresh.last, {2})


def test_rank_zero_dies_and_the_driver_hosted_agreement_survives(plans, fresh):
    """Rank 0 used to serve the rendezvous store; now the driver does, so its death is one
    death like any other."""
    plan = plans["allreduce"]
    ins = make_inputs(plan, 5)
    outs, _ = fresh.run(plan, ins, timeout=TIMEOUT_S, die=(0, 7), options={"chunk_bytes": CHUNK},
                        iters=2)
    assert fresh.last.dead == (0,)
    _validate(plan, ins, outs, fresh.last, {0})
    assert fresh.last.info[1]["contributors"] == (1, 2, 3)  # the second iteration ran without 0


def test_dead_root_raises_root_failed_on_every_survivor(plans, fresh):
    # 32 MB: more than the socket buffers hold, so the root dies with most chunks unsent
    plan = plans["big_broadcast"]
    t0 = time.monotonic()
    with pytest.raises(RootFailed) as info:
        fresh.run(plan, make_inputs(plan, 3), timeout=TIMEOUT_S, die=(plan.root, 3))
    wall = time.monotonic() - t0
    err = info.value
    assert err.rank == plan.root and err.dead == [plan.root]
    survivors = {r: e for r, e in err.errors.items() if r != plan.root}
    assert set(survivors) == set(range(N)) - {plan.root}
    for r, e in survivors.items():
        assert isinstance(e, RootFailed) and e.rank == plan.root, (r, e)
    assert wall < BOUND_S + 5.0, f"took {wall:.1f} s"


def test_abort_every_survivor_raises_rank_failed(plans, ray_cluster):
    """Through ``hcc.backends.ray.run``, which makes its own actors on the running cluster."""
    plan = plans["abort"]
    assert plan.on_failure == "abort"
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as info:
        hray.run(plan, make_inputs(plan, 4), timeout=TIMEOUT_S, die=(3, 2))
    wall = time.monotonic() - t0
    err = info.value
    assert err.rank == 3 and err.dead == [3]
    for r in (0, 1, 2):
        e = err.errors[r]
        assert isinstance(e, RankFailed) and e.rank == 3, (r, e)
    assert wall < BOUND_S + 5.0, f"took {wall:.1f} s"


def test_late_arrivals_complete_with_the_adaptive_schedule(plans, group):
    plan = plans["late"]
    rng = np.random.default_rng(17)
    delays = [float(d) for d in rng.uniform(0.0, 0.5, N)]
    ins = make_inputs(plan, 23)
    outs, times = group.run(plan, ins, timeout=TIMEOUT_S, delays=delays, iters=2)
    check(plan, outs, expected(plan, ins))
    report = group.last
    assert report.dead == ()
    for r in range(N):
        assert report.info[r]["contributors"] == tuple(range(N))
    last = max(range(N), key=lambda r: delays[r])
    for spans in report.spans:
        # the allreduce needs every input: nobody returns before the last rank entered (its
        # step start plus its delay), and nobody long after
        entered = spans[last][0] + delays[last]
        for r, (start, end) in spans.items():
            assert entered <= end < entered + BOUND_S, (r, start, end, entered)


def test_actor_killed_between_runs_only_ray_can_tell(plans, fresh):
    """The driver SIGKILLs an idle actor by the PID it reported (a process this test started):
    it never publishes an address or opens a connection in the next run, so no survivor's
    transport can see it die. Ray fails its step; the driver appends the death to the log and
    publishes a refusing address, and the survivors complete without it, well inside the
    deadline."""
    plan = plans["allgather"]
    victim = 2
    os.kill(fresh.pids[victim], signal.SIGKILL)
    ins = make_inputs(plan, 31)
    t0 = time.monotonic()
    outs, _ = fresh.run(plan, ins, timeout=TIMEOUT_S)
    wall = time.monotonic() - t0
    report = fresh.last
    assert report.dead == (victim,) and report.first_by_ray == (victim,)
    _validate(plan, ins, outs, report, {victim})
    for r in (0, 1, 3):
        assert outs[r].missing == (victim,)
    assert wall < BOUND_S, f"took {wall:.1f} s"


def test_users_actors_survive_a_members_death_through_init_group(plans, ray_cluster):
    """Ray's collective convention (``init_group`` in the user's own actors, data over the
    object store): the group's coordinator actor serves the agreement log and appends the
    death Ray reports; the survivors' allreduce is exact over the survivors."""
    ray = ray_cluster
    plan = plans["allreduce"]

    @ray.remote(num_cpus=0)
    class Trainer(ray_group_member()):
        def allreduce(self, plan, x, die_at):
            opts = {"progress": kill_after_chunks(die_at)} if die_at is not None else {}
            out = hcc.run(plan, self.comm, x, timeout=TIMEOUT_S, chunk_bytes=CHUNK, **opts)
            return np.asarray(out), out.contributors, out.dead

    actors = [Trainer.remote(r, N) for r in range(N)]
    try:
        ray.get([a.join.remote("survivors") for a in actors], timeout=120)
        ins = make_inputs(plan, 41)
        victim = 1
        refs = [a.allreduce.remote(plan, ins[r], 9 if r == victim else None)
                for r, a in enumerate(actors)]
        t0 = time.monotonic()
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(refs[victim], timeout=60)
        got = ray.get([refs[r] for r in range(N) if r != victim], timeout=60)
        wall = time.monotonic() - t0
        contrib = got[0][1]
        assert all(g[1] == contrib for g in got) and set(contrib) == {0, 2, 3}
        assert all(g[2] == (victim,) for g in got)
        want = _reduce(plan, [ins[r] for r in contrib])
        outs = [g[0] for g in got]
        outs.insert(victim, None)
        check(plan, outs, [None if r == victim else want for r in range(N)])
        assert wall < BOUND_S, f"took {wall:.1f} s"
        ray.get([a.leave.remote("survivors") for r, a in enumerate(actors) if r != victim],
                timeout=60)
    finally:
        for a in actors:
            ray.kill(a)
