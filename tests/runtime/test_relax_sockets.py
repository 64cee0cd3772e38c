"""Relaxed plans on real processes over the sockets backend (backends/launch.py): a compressed
allreduce ends identical on every rank within its error bound, and neighbor_average with
shift_one pairs the right ranks at a given step."""
from __future__ import annotations

import numpy as np
import pytest

from hcc.backends.launch import run_cases_local
from hcc.compiler.lower_relax import relax_plan
from hcc.ir.plan import neighbor_peers
from hcc.compiler.program import CollectiveSpec
from hcc.ir.topology import Link, Topology


def mesh(n):
    names = tuple(f"r{i}" for i in range(n))
    return Topology("mesh", names, links=tuple(Link(a, b, 1e9) for a in names for b in names if a != b))


def spec(kind, n, elems, compress, op=None, peers=None, dtype="float32"):
    size = elems * {"float32": 4, "float64": 8}[dtype]
    return CollectiveSpec(name=f"{kind}_{compress}", kind=kind, topology="mesh",
                          ranks=tuple(f"r{i}" for i in range(n)), root=-1, size_bytes=size, dtype=dtype,
                          op=op, compress=compress, peers=peers)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_compressed_allreduce_and_shift_one_over_sockets():
    n, elems = 4, 300_000
    rng = np.random.default_rng(21)
    xs = [rng.uniform(-1, 1, elems).astype(np.float32) for _ in range(n)]
    ar = relax_plan(spec("allreduce", n, elems, "int8", op="sum"), mesh(n), 256 << 10)
    fp = relax_plan(spec("allreduce", n, elems, "fp16", op="avg"), mesh(n), 256 << 10)
    xs64 = [rng.normal(size=4099) for _ in range(n)]
    na = relax_plan(spec("neighbor_average", n, 4099, "none", peers="shift_one", dtype="float64"), mesh(n), 8192)

    # one job for the three plans, at training step 3: a step picks the programs of a plan
    # whose pairing changes with it (Plan.programs_at: step_programs, shift_one's) and is
    # ignored by every other plan, as by these allreduces
    step = 3
    assert not ar.step_programs and not fp.step_programs and na.step_programs
    res_ar, res_fp, res_na = run_cases_local("sockets", [(ar, xs), (fp, xs), (na, xs64)], timeout=60, step=step)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    outs = res_ar.outputs
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)  # identical on every rank
    # two quantizations: 3 contributions of range <= 2, then a sum of range <= 8
    assert np.max(np.abs(outs[0] - exact)) <= (3 * 2 + 8 + 4e-7) / 510 + 1e-5
    assert np.max(np.abs(outs[0] - exact)) > 0  # it really was compressed
    for o in res_fp.outputs:
        assert np.max(np.abs(o - exact / n)) <= 2 * 2.0**-11 + 1e-6

    for r in range(n):
        (p,) = neighbor_peers("shift_one", n, r, step)
        np.testing.assert_allclose(res_na.outputs[r], (xs64[r] + xs64[p]) / 2, rtol=1e-12)
