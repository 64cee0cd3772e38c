"""A rank that dies before, during or after the rendezvous (issue 21): with ``on_failure =
continue`` the others form the group without it and complete, reporting who contributed; with
``abort`` every survivor raises an error naming it.

Many seeds cheaply: one *zygote* process imports hcc and compiles the plans once, serves the
rendezvous store (as the launcher's parent does for local jobs: no rank's death takes it down)
and, per seed, forks the rank processes — real processes over real loopback TCP, one of them
SIGKILLed at the chosen moment:

- ``before``: the victim dies before it contacts the store (it never publishes an address);
- ``during``: the zygote kills it as soon as its address is in the store (the others are then
  reading addresses, dialling or greeting it);
- ``after``: the zygote kills it once every rank has joined (before or inside the run).

The zygote reaps its children and, like ``backends/launch.py``, puts the killed rank in the
store's ``<group>/dead`` list. Each seed uses its own group name, so the seeds share a store
but nothing else. A fork costs milliseconds where a fresh interpreter importing numpy and hcc
costs a second of CPU: 4 ranks x 12 seeds x 3 moments x 2 policies would not fit in a CI minute
otherwise. The victims take turns (seed mod 4), so every rank dies 3 times per moment and
policy; a seed's own random draw sets how long after its moment the kill lands.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # also when the zygote runs this file as a script
from conftest import ring_topology  # noqa: E402

MOMENTS = ("before", "during", "after")
# per moment and policy: 12, so each rank is killed 3 times in every sweep
SEEDS = int(os.environ.get("HCC_JOIN_SEEDS", "12"))
WORLD = 4
PARALLEL = 6  # seeds in flight at once: a seed mostly waits (deaths, store round trips), not computes
TIMEOUT = 10.0  # every wait's deadline in the ranks; a seed that needs it has failed

SOURCE = ring_topology("quad", WORLD, "1 GB/s, 5 us") + """
collective keep = allreduce on quad { size = 4 KiB  on_failure = continue }
collective stop = allreduce on quad { size = 4 KiB  on_failure = abort }
"""


def _child(plan, rank: int, address: str, token: str, group: str, out_dir: Path, die_first: bool) -> None:
    """One rank (in a forked process): join, run, write what happened; never returns."""
    code = 0
    try:
        if die_first:
            os.kill(os.getpid(), signal.SIGKILL)
        from hcc.backends.adaptive import AdaptiveResult
        from hcc.backends.base import RuntimeFault
        from hcc.backends.reference import make_input
        from hcc.backends.runtime import run
        from hcc.backends.sockets import connect

        rec: dict = {"rank": rank}
        t0 = time.monotonic()
        try:
            comm = connect(rank, WORLD, address, token, TIMEOUT, serve_store=False, group=group, shm="off")
            comm._launched = True  # the zygote is this job's launcher: its store lists the dead
            try:
                out = run(plan, comm, make_input(plan, 0, rank), timeout=TIMEOUT)
                rec["out"] = [float(v) for v in out]
                if isinstance(out, AdaptiveResult):
                    rec["contributors"] = sorted(out.contributors)
                else:
                    rec["contributors"] = list(range(WORLD))
            finally:
                comm.close()
        except RuntimeFault as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["failed_rank"] = getattr(e, "rank", None)
        except Exception:  # not a typed error: the test fails on it, with the traceback
            import traceback

            rec["error"] = "untyped: " + traceback.format_exc()[-1500:]
            rec["failed_rank"] = None
        rec["seconds"] = time.monotonic() - t0
        (out_dir / f"{group}.{rank}.json").write_text(json.dumps(rec))
    except BaseException:  # a crash of the harness itself: exit status 3, noticed by the test
        code = 3
    finally:
        os._exit(code)


def zygote(out_path: str, burn: int = 0, only: str = "", seeds: int = SEEDS) -> int:
    """Run every seed; ``burn`` CPU-bound processes run beside the ranks (each ends itself
    after 10 minutes, and is killed by PID at the end); ``only``: one plan's seeds."""
    import random
    import secrets
    import tempfile

    from hcc import api
    from hcc.backends import adaptive, reference, runtime, sockets  # noqa: F401  (imported once, before the forks)
    from hcc.backends.rendezvous import StoreServer
    from hcc.runner import compile_on

    t0 = time.monotonic()
    prog = api.load(SOURCE)
    plans = {c.name: compile_on(prog, c.name) for c in prog.collectives if not only or c.name == only}
    burners = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 600\nwhile time.time() < end: pass"])
               for _ in range(burn)]
    print(f"compiled in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    token = secrets.token_hex(16)
    results = []
    todo = [(name, moment, seed) for name in plans for moment in MOMENTS for seed in range(seeds)]
    with tempfile.TemporaryDirectory(prefix="hcc-join-") as tmp, StoreServer(token, "127.0.0.1", 0) as store:
        out_dir = Path(tmp)
        active: list[dict] = []
        while todo or active:
            while todo and len(active) < PARALLEL:
                name, moment, seed = todo.pop(0)
                rng = random.Random(f"{name}/{moment}/{seed}")
                victim = seed % WORLD
                group = f"{name}-{moment}-{seed}"
                pids = {}
                for r in range(WORLD):
                    pid = os.fork()
                    if pid == 0:
                        _child(plans[name], r, store.address, token, group, out_dir,
                               die_first=moment == "before" and r == victim)
                    pids[r] = pid
                active.append({"plan": name, "moment": moment, "seed": seed, "victim": victim, "rng": rng,
                               "group": group, "pids": pids, "codes": {}, "killed": moment == "before",
                               "deadline": time.monotonic() + 3 * TIMEOUT})
            for job in list(active):
                group, victim, pids, codes = job["group"], job["victim"], job["pids"], job["codes"]
                if not job["killed"]:
                    if job["moment"] == "during":
                        ready = store.value(f"{group}/addr/{victim}", None) is not None
                    else:
                        ready = (store.value(f"{group}/joined", 0) or 0) >= WORLD
                    if ready:
                        time.sleep(job["rng"].uniform(0, 0.004))
                        os.kill(pids[victim], signal.SIGKILL)
                        job["killed"] = True
                for r, pid in pids.items():
                    if r not in codes:
                        done, status = os.waitpid(pid, os.WNOHANG)
                        if done:
                            codes[r] = status
                            if os.WIFSIGNALED(status):
                                # what launch._wait_children does for its children
                                store.put(f"{group}/dead", [r])
                if len(codes) == WORLD or time.monotonic() > job["deadline"]:
                    for r, pid in pids.items():
                        if r not in codes:
                            os.kill(pid, signal.SIGKILL)
                            os.waitpid(pid, 0)
                            codes[r] = -1
                    recs = {}
                    for r in range(WORLD):
                        p = out_dir / f"{group}.{r}.json"
                        if p.exists():
                            recs[r] = json.loads(p.read_text())
                    results.append({k: job[k] for k in ("plan", "moment", "seed", "victim", "killed", "codes")}
                                   | {"records": recs})
                    active.remove(job)
            time.sleep(0.002)
    for b in burners:
        b.kill()
        b.wait()
    Path(out_path).write_text(json.dumps(results))
    return 0


def _run_zygote(out: Path, *args: str) -> list:
    r = subprocess.run([sys.executable, __file__, str(out), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, HCC_SHM="off"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return _run_zygote(tmp_path_factory.mktemp("join") / "outcomes.json")


@pytest.fixture(scope="module")
def keep_plan():
    """The "keep" plan as the zygote compiles it, compiled once for the three moments' tests."""
    from hcc import api
    from hcc.runner import compile_on

    return compile_on(api.load(SOURCE), "keep")


@pytest.mark.parametrize("moment", MOMENTS)
def test_continue_survives_a_death_at_every_moment(outcomes, keep_plan, moment):
    import numpy as np

    from hcc.backends.reference import _reduce, make_input

    plan = keep_plan
    cases = [o for o in outcomes if o["plan"] == "keep" and o["moment"] == moment]
    assert len(cases) == SEEDS
    for o in cases:
        v = o["victim"]
        survivors = [r for r in range(WORLD) if r != v]
        for r in survivors:
            rec = o["records"].get(str(r))
            assert rec is not None and "error" not in rec, (o["seed"], r, rec, o["codes"])
            contributors = rec["contributors"]
            # the survivors contributed; the victim did only if it sent before it died
            assert set(survivors) <= set(contributors) <= set(range(WORLD)), (o["seed"], contributors)
            if moment != "after":
                assert v not in contributors
            want = _reduce(plan, [make_input(plan, 0, j) for j in contributors])
            np.testing.assert_allclose(rec["out"], want, rtol=1e-6, atol=1e-6)
        # every survivor agrees on who contributed
        assert len({tuple(o["records"][str(r)]["contributors"]) for r in survivors}) == 1


@pytest.mark.parametrize("moment", MOMENTS)
def test_abort_names_the_missing_rank_at_every_moment(outcomes, moment):
    cases = [o for o in outcomes if o["plan"] == "stop" and o["moment"] == moment]
    assert len(cases) == SEEDS
    for o in cases:
        v = o["victim"]
        for r in range(WORLD):
            if r == v:
                continue
            rec = o["records"].get(str(r))
            assert rec is not None, (o["seed"], r, o["codes"])
            if "error" not in rec:
                # killed after the run's last message to it: this rank finished first
                assert moment == "after", (o["seed"], r, rec)
                continue
            assert rec["failed_rank"] == v or f"rank {v}" in rec["error"], (o["seed"], r, rec)
            assert "Timeout" not in rec["error"], (o["seed"], r, rec)


LOADED_SEEDS = 4  # per moment, with both cores saturated (a second, smaller sweep): each rank dies once


def test_continue_survives_with_the_cores_saturated(tmp_path):
    """The same deaths with two CPU-bound processes beside the four ranks on this 2-core
    machine: slowness must not be taken for a death or a lost store."""
    outcomes = _run_zygote(tmp_path / "loaded.json", "2", "keep", str(LOADED_SEEDS))
    assert len(outcomes) == 3 * LOADED_SEEDS
    for o in outcomes:
        for r in range(WORLD):
            if r != o["victim"]:
                rec = o["records"].get(str(r))
                assert rec is not None and "error" not in rec, (o["moment"], o["seed"], r, rec, o["codes"])
                assert set(rec["contributors"]) >= set(range(WORLD)) - {o["victim"]}


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(zygote(a[0], int(a[1]) if len(a) > 1 else 0, a[2] if len(a) > 2 else "",
                    int(a[3]) if len(a) > 3 else SEEDS))
