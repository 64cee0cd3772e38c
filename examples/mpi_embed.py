"""Embed an hcc plan in your own MPI program: one call per rank.

    mpiexec -n 4 python examples/mpi_embed.py [samples/demo.hcl] [COLLECTIVE]

Rank 0 compiles the collective (default: ``allreduce`` of samples/demo.hcl, 4 ranks) and
broadcasts the plan as JSON; every rank then runs it over MPI on its own numpy array and
checks the result against MPICH's own ``Allreduce`` of the same arrays.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hcc
import hcc.backends.mpi


def main(argv: list[str]) -> int:
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    source = argv[0] if argv else str(Path(__file__).resolve().parent.parent / "samples" / "demo.hcl")
    name = argv[1] if len(argv) > 1 else "allreduce"

    text = hcc.compile(source, name).to_json() if rank == 0 else None
    plan = hcc.Plan.from_json(world.bcast(text, root=0))
    if plan.kind != "allreduce" or plan.n != world.Get_size():
        raise SystemExit(f"this example runs an allreduce on {world.Get_size()} ranks, "
                         f"not a {plan.kind} on {plan.n}")

    x = np.random.default_rng(rank).standard_normal(plan.elems).astype(np.float32)
    comm = hcc.backends.mpi.MPIBackend(world)   # the Transport: MPI rank = hcc rank
    with comm:                                  # on a failure: report, then MPI_Abort the job
        out = hcc.run(plan, comm, x, timeout=30.0)

    want = np.empty_like(x)
    world.Allreduce(x, want, op=MPI.SUM)        # MPICH's own result on the same inputs
    ok = np.allclose(out, want, rtol=1e-5, atol=1e-5)
    print(f"rank {rank}: {plan.name} of {plan.size_bytes} B over {plan.n} ranks: "
          f"{'verified' if ok else 'WRONG'}", flush=True)
    return 0 if world.allreduce(ok, op=MPI.LAND) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
