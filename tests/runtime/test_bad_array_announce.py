"""A rank given a bad array tells the others at once (issue 21), over MPI and Ray as over
sockets: the others raise an error naming that rank instead of waiting out their deadline
(a 60 s deadline here: an error naming it before that can only come from the notice)."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0  # every wait's deadline; the notice must end the others' runs well before it
pytestmark = pytest.mark.slow

SOURCE = """
topology t3 {
    node r[0..2]
    r[0..2] <-> r[0..2] : 1 GB/s, 10 us
}
collective ar = allreduce on t3 { size = 4 KiB  dtype = float32 }
"""

MPI_JOB = """
    import sys, numpy as np
    from mpi4py import MPI
    import hcc
    from hcc.backends.base import RuntimeFault
    from hcc.backends.mpi import MPIBackend
    plan = hcc.Plan.load(sys.argv[1])
    t = MPIBackend(MPI.COMM_WORLD, abort_on_fault=False)
    x = np.ones(plan.buffer_elems(t.rank)["in"], dtype=np.float64 if t.rank == 1 else np.float32)
    try:
        hcc.run(plan, t, x, timeout=60)  # the test's TIMEOUT
        print(f"rank {t.rank}: no error", flush=True)
    except RuntimeFault as e:
        print(f"rank {t.rank}: {type(e).__name__}: {e}", flush=True)
"""


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    import hcc

    path = tmp_path_factory.mktemp("bad") / "ar.json"
    hcc.compile(SOURCE, "ar").save(path)
    return path


def test_mpi_ranks_hear_a_refused_array_at_once(tmp_path, plan_file):
    from hcc.backends import mpi

    if not mpi.available():
        pytest.skip("mpi4py does not import")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(MPI_JOB))
    with mpi.reaping_shm():
        proc = subprocess.run([*mpi.find_mpiexec(), "-n", "3", sys.executable, str(script), str(plan_file)],
                              capture_output=True, text=True, timeout=50, env=mpi.loopback_env(), cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert "rank 1: InputMismatch" in out, out
    for r in (0, 2):  # the ranks' lines may interleave in the job's one output stream
        assert re.search(rf"rank {r}: RankFailed: rank {r}: rank 1 failed [^\n]*refused", out), out


def test_ray_actors_hear_a_refused_array_at_once(plan_file):
    """Both of Ray's data paths (sockets between the actors, and the object store), one
    cluster and one actor group for both (a cluster costs ~20 s to start here)."""
    from hcc.backends import ray as hray

    if not hray.available():
        pytest.skip("ray does not import")
    import numpy as np

    import hcc
    from hcc.backends.base import RuntimeFault
    from hcc.backends.ray.driver import DATA_PATHS, ActorGroup

    plan = hcc.Plan.load(plan_file)
    inputs = [np.ones(plan.buffer_elems(r)["in"], dtype=np.float64 if r == 1 else np.float32) for r in range(3)]
    with hray.local_cluster(num_cpus=3):
        with ActorGroup(3) as group:
            for data in DATA_PATHS:
                t0 = time.monotonic()
                with pytest.raises(RuntimeFault) as info:
                    group.run(plan, inputs, timeout=TIMEOUT, data=data)
                # before any rank's deadline: only the notice can end the others' waits so early
                assert time.monotonic() - t0 < TIMEOUT, data
                errors = getattr(info.value, "errors", {})
                assert "dtype" in str(errors.get(1)), (data, errors)
                for r in (0, 2):
                    e = errors.get(r)
                    assert e is not None and "Timeout" not in type(e).__name__, (data, errors)
                    assert "rank 1" in str(e), (data, errors)
