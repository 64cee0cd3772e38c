"""The verifier's numpy check of ops and messages (ir/verify_scan.py) against its Python
check (ir/verify.py ``_check_ops``): the same completes-before edges in the same order on
every candidate plan of the small samples, and no verdict at all (None, so the Python check
runs and names the fault) on each kind of malformed op."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hcc.compiler.frontend import load_program
from hcc.compiler.pipeline import compile_unit
from hcc.ir import opscan, verify as V, verify_scan
from hcc.ir.errors import VerifyError
from hcc.ir.plan import ChunkRef, Copy, Recv, Scale, Send

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

pytestmark = pytest.mark.skipif(not opscan.available(), reason="the op scanner is not built")


def plans_of(sample):
    program = load_program(str(SAMPLES / sample))
    for c in program.collectives:
        u = compile_unit(program, c.name)
        yield from (cand.choice.plan for cand in u.candidates if any(cand.choice.plan.programs))
        yield u.plan


@pytest.mark.parametrize("sample", ["demo.hcl", "dgx1_fragmented.hcl"])
def test_same_edges_as_the_python_check(sample):
    seen = 0
    for p in plans_of(sample):
        sizes = [p.buffer_elems(r) for r in range(p.n)]
        slow, fast = V._check_ops(p, sizes), verify_scan.check_ops(p, sizes)
        assert fast is not None
        assert (fast.base, fast.total) == (slow.base, slow.total)
        assert fast.src.tolist() == list(slow.src) and fast.dst.tolist() == list(slow.dst)
        seen += 1
    assert seen >= 5


def test_every_fault_is_left_to_the_python_check():
    program = load_program(str(SAMPLES / "demo.hcl"))
    plan = compile_unit(program, "allgather").plan
    progs = [list(p) for p in plan.programs]
    r = next(k for k, p in enumerate(progs) if any(type(op) is Send for op in p))
    i = next(k for k, op in enumerate(progs[r]) if type(op) is Send)
    send = progs[r][i]
    out_elems = plan.buffer_elems(r)["out"]
    faults = {
        "dep on a later op": replace(send, deps=(len(progs[r]),)),
        "range past the buffer": replace(send, src=ChunkRef(send.src.buf, send.src.offset, 10**9)),
        "empty range": replace(send, src=ChunkRef(send.src.buf, send.src.offset, 0)),
        "unknown buffer": replace(send, src=ChunkRef("scratch", 0, 1)),
        "peer is itself": replace(send, peer=r),
        "tag too large": replace(send, tag=1 << 24),
        "no such tree": replace(send, tree=len(plan.trees) + 3),
        "writes in": Recv(send.peer, 1 << 23, ChunkRef("in", 0, 1)),
        "copy overlaps": Copy(ChunkRef("out", 0, 2), ChunkRef("out", 1, 2)),
        "copy counts differ": Copy(ChunkRef("out", 0, 2), ChunkRef("tmp", 0, 1)),
        "divisor 0": Scale(ChunkRef("out", 0, min(2, out_elems)), 0),
    }
    for what, bad in faults.items():
        mutated = [list(p) for p in progs]
        if type(bad) is Send:
            mutated[r][i] = bad
        else:
            mutated[r].append(bad)
        p = replace(plan, programs=tuple(tuple(x) for x in mutated), tmp_elems=tuple(max(t, 4) for t in plan.tmp_elems))
        sizes = [p.buffer_elems(k) for k in range(p.n)]
        assert verify_scan.check_ops(p, sizes) is None, what
        with pytest.raises(VerifyError):
            V.verify(p)
