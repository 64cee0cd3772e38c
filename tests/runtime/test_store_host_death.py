"""The rendezvous store's host dying (issue 21): a sockets job with no launcher, where rank 0
starts the store (backends/rendezvous.spawn_store: a process of its own), survives rank 0
being SIGKILLed during and after the rendezvous with ``on_failure = continue`` — the
survivors complete over the store rank 0 left behind, and agree on who contributed.

Cheap like test_join_deaths: one zygote process compiles the plan once and forks the ranks
of every seed; the zygote only watches the store (as a client, with the job's token) to pick
the moment, and kills rank 0 by PID. 'during' holds the last rank back from the store (on a
pipe from the zygote) until rank 0 is dead, so the kill lands inside the rendezvous however
slow the machine: left to the clock, a loaded machine once let the rendezvous and rank 0's
contribution finish in the few ms between rank 0 publishing its address and the kill."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # also when run as the zygote's script
from test_join_deaths import ROOT, SOURCE, TIMEOUT, WORLD  # noqa: E402  (the same 4-rank ring and 'keep')

SEEDS = int(os.environ.get("HCC_HOST_SEEDS", "6"))  # per moment
MOMENTS = ("during", "after")
PARALLEL = 4


def _child(plan, rank: int, address: str, token: str, out: Path, hold: int | None) -> None:
    code = 0
    try:
        if hold is not None:  # wait for the zygote's word (or its end of the pipe closing)
            import select
            select.select([hold], [], [], TIMEOUT)
        from hcc.backends.adaptive import AdaptiveResult
        from hcc.backends.base import RuntimeFault
        from hcc.backends.reference import make_input
        from hcc.backends.runtime import run
        from hcc.backends.sockets import connect

        rec: dict = {"rank": rank}
        try:
            # no launcher: rank 0 serves the store (serve_store's default)
            comm = connect(rank, WORLD, address, token, TIMEOUT, shm="off")
            try:
                res = run(plan, comm, make_input(plan, 0, rank), timeout=TIMEOUT)
                rec["out"] = [float(v) for v in res]
                rec["contributors"] = sorted(res.contributors) if isinstance(res, AdaptiveResult) else list(range(WORLD))
            finally:
                comm.close()
        except RuntimeFault as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        # whole or not at all: the harness kills a rank still running at its deadline, and a
        # kill between the truncate and the write of write_text left an empty record
        part = out.with_suffix(".part")
        part.write_text(json.dumps(rec))
        os.replace(part, out)
    except BaseException:
        code = 3
    finally:
        os._exit(code)


def _release(job: dict) -> None:
    if job["hold"] is not None:
        os.write(job["hold"], b"go")
        os.close(job["hold"])
        job["hold"] = None


def zygote(out_path: str, seeds: int) -> int:
    import random
    import secrets
    import tempfile

    from hcc import api
    from hcc.backends import adaptive, reference, runtime, sockets  # noqa: F401  (imported before the forks)
    from hcc.backends.rendezvous import RendezvousError, StoreClient, free_port
    from hcc.runner import compile_on

    plan = compile_on(api.load(SOURCE), "keep")
    results = []
    todo = [(m, s) for m in MOMENTS for s in range(seeds)]
    with tempfile.TemporaryDirectory(prefix="hcc-host-") as tmp:
        active: list[dict] = []
        while todo or active:
            while todo and len(active) < PARALLEL:
                moment, seed = todo.pop(0)
                token = secrets.token_hex(16)
                address = f"127.0.0.1:{free_port()}"
                pids = {}
                hold_r, hold_w = os.pipe() if moment == "during" else (None, None)
                for r in range(WORLD):
                    pid = os.fork()
                    if pid == 0:
                        _child(plan, r, address, token, Path(tmp) / f"{moment}-{seed}.{r}.json",
                               hold_r if r == WORLD - 1 else None)
                    pids[r] = pid
                if hold_r is not None:
                    os.close(hold_r)
                active.append({"moment": moment, "seed": seed, "pids": pids, "codes": {}, "killed": False,
                               "rng": random.Random(f"{moment}/{seed}"), "address": address, "token": token,
                               "client": None, "deadline": time.monotonic() + 4 * TIMEOUT,
                               "hold": hold_w})
            for job in list(active):
                if not job["killed"]:
                    try:
                        if job["client"] is None:
                            job["client"] = StoreClient(job["address"], job["token"], TIMEOUT)
                        c = job["client"]
                        ready = (c.peek("hcc/addr/0") is not None if job["moment"] == "during"
                                 else (c.peek("hcc/joined") or 0) >= WORLD)
                    except RendezvousError:
                        ready = False
                    if ready:
                        time.sleep(job["rng"].uniform(0, 0.004))
                        os.kill(job["pids"][0], signal.SIGKILL)
                        os.waitpid(job["pids"][0], 0)  # dead before the held rank joins
                        job["codes"][0] = -signal.SIGKILL
                        job["killed"] = True
                        job["client"].close()
                        _release(job)
                for r, pid in job["pids"].items():
                    if r not in job["codes"]:
                        done, status = os.waitpid(pid, os.WNOHANG)
                        if done:
                            job["codes"][r] = status
                if len(job["codes"]) == WORLD or time.monotonic() > job["deadline"]:
                    _release(job)
                    for r, pid in job["pids"].items():
                        if r not in job["codes"]:
                            os.kill(pid, signal.SIGKILL)
                            os.waitpid(pid, 0)
                            job["codes"][r] = -1
                    recs = {}
                    for r in range(WORLD):
                        p = Path(tmp) / f"{job['moment']}-{job['seed']}.{r}.json"
                        if p.exists():
                            recs[r] = json.loads(p.read_text())
                    results.append({"moment": job["moment"], "seed": job["seed"], "killed": job["killed"],
                                    "records": recs})
                    active.remove(job)
            time.sleep(0.002)
    Path(out_path).write_text(json.dumps(results))
    return 0


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    out = tmp_path_factory.mktemp("host") / "outcomes.json"
    r = subprocess.run([sys.executable, __file__, str(out), str(SEEDS)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, HCC_SHM="off"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("moment", MOMENTS)
def test_survivors_complete_when_the_store_host_dies(outcomes, moment):
    import numpy as np

    from hcc import api
    from hcc.backends.reference import _reduce, make_input
    from hcc.runner import compile_on

    plan = compile_on(api.load(SOURCE), "keep")
    cases = [o for o in outcomes if o["moment"] == moment]
    assert len(cases) == SEEDS
    for o in cases:
        assert o["killed"], o
        contributors = set()
        for r in range(1, WORLD):
            rec = o["records"].get(str(r))
            assert rec is not None and "error" not in rec, (moment, o["seed"], r, rec)
            assert set(range(1, WORLD)) <= set(rec["contributors"]), rec
            if moment == "during":
                assert 0 not in rec["contributors"]
            want = _reduce(plan, [make_input(plan, 0, j) for j in rec["contributors"]])
            np.testing.assert_allclose(rec["out"], want, rtol=1e-6, atol=1e-6)
            contributors.add(tuple(rec["contributors"]))
        assert len(contributors) == 1  # the survivors agree


if __name__ == "__main__":
    sys.exit(zygote(sys.argv[1], int(sys.argv[2])))
