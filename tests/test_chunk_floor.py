"""The chunk floor (compiler/chunk_floor.py): a lower bound on the simulated time of every
``chunked`` candidate at every chunk size tried, and pruning by it changes no compiled plan."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import hcc
from hcc.compiler import chunk_floor, registry
from hcc.compiler.pipeline import compile_unit
from hcc.ir.plan import Send

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
# small samples (3-8 ranks), between them the chunked algorithms auto offers (the full sweep
# of the samples' 22 cases took 100 s)
CASES = [("demo", "broadcast"), ("dgx1_fragmented", "alloc_0136_allreduce"),
         ("dgx1_fragmented", "alloc_157_reduce"), ("nvswitch", "reduce_scatter")]


def _unpruned(monkeypatch, program, name):
    with monkeypatch.context() as m:
        m.setattr(chunk_floor, "worth_lowering", lambda floor, chunks, incumbent: tuple(chunks))
        return compile_unit(program, name)


@pytest.mark.parametrize("sample,name", CASES)
def test_floor_bounds_every_tried_chunk_and_pruning_keeps_the_plan(monkeypatch, sample, name):
    program = hcc.load(SAMPLES / f"{sample}.hcl")
    full = _unpruned(monkeypatch, program, name)
    floor = chunk_floor.plan_floor(full)
    assert floor is not None
    for cand in full.candidates:
        if not registry.algorithm(cand.algorithm).chunked:
            continue
        plan = cand.choice.plan
        biggest = max((op.src.count for prog in plan.programs for op in prog if type(op) is Send), default=0)
        assert biggest * plan.itemsize <= cand.choice.chunk_bytes, cand.algorithm
        for chunk, t in cand.choice.tried:
            assert floor(chunk) <= t * (1 + 1e-12), (cand.algorithm, chunk, t)
    pruned = compile_unit(program, name)
    assert pruned.plan.digest() == full.plan.digest()
    assert replace(pruned.plan.figures, compile_s=0.0) == replace(full.plan.figures, compile_s=0.0)


def test_floor_is_the_bandwidth_bound_at_large_chunks_and_grows_as_they_shrink():
    program = hcc.load(SAMPLES / "dgx1.hcl")
    u = compile_unit(program, "allgather")
    floor = chunk_floor.plan_floor(u)
    sizes = [1 << k for k in range(12, 31)]
    values = [floor(s) for s in sizes]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert values[-1] == pytest.approx(u.bandwidth_bound_s, rel=1e-3)
    assert chunk_floor.worth_lowering(floor, sizes[::-1], 0.0) == (sizes[-1],)


def test_no_floor_for_compressed_plans():
    src = """topology t { node a, b  a <-> b : 10 GB/s, 1 us }
collective ar = allreduce on t { size = 1 MiB  op = sum  compress = int8 }"""
    u = compile_unit(hcc.load(src), "ar")
    assert chunk_floor.plan_floor(u) is None
