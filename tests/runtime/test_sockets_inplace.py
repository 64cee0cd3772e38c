"""In-place runs over sockets (``hcc.run(plan, comm, x, out=x)``, what ``torch.distributed``'s
collectives do and what benchmarks/runtime_bench.py measures against gloo): compiled plans give
the numpy result when the output overwrites the input, and the launcher's ``inplace`` case
option restores the input before every iteration (``"chained"``: only before the last)."""
from __future__ import annotations

import functools
import os

import pytest

import hcc
from hcc.backends.base import RuntimeFault
from hcc.backends.launch import host_idle_seconds, run_cases_local
from hcc.backends.reference import check, expected, make_inputs

pytestmark = pytest.mark.slow

STAR = """topology loopback {
    node r[0..3]
    switch s
    r[0..3] <-> s : 2 GB/s, 100 us
}
"""


@functools.lru_cache(maxsize=1)
def _plans() -> list:
    # sizes that do not divide by 4 ranks or by the chunks; the algorithms the bench uses
    cases = [("allreduce", "float32", "sum", 4100, ""), ("allreduce", "float32", "sum", 3 << 20, ""),
             ("allreduce", "int32", "max", 4100, "algorithm = direct"),
             ("allreduce", "bfloat16", "avg", 2 << 20, ""),
             ("broadcast", "float32", "sum", 1 << 20, ""),
             ("broadcast", "float64", "sum", 4104, "algorithm = direct")]
    src = STAR
    for i, (kind, dtype, op, nbytes, extra) in enumerate(cases):
        op_line = f"\n    op = {op}" if kind == "allreduce" else ""
        src += (f"collective c{i} = {kind} on loopback {{\n    size = {nbytes} B\n    dtype = {dtype}{op_line}\n"
                f"    adaptive = off\n    {extra}\n}}\n")
    program = hcc.load(src)
    return [hcc.compile(program, f"c{i}") for i in range(len(cases))]


BCAST16 = STAR + """collective b = broadcast on loopback {
    size = 16 MiB
    dtype = float32
    algorithm = direct
    adaptive = off
}
"""


@pytest.fixture(scope="module")
def runs():
    """One 4-rank job of three timed iterations after a warm-up for the three tests below (a
    job each before): the six plans in place, two of them chained, and a 16 MiB broadcast in
    place; per test, its (plan, result) pairs."""
    every = _plans()
    chained = [every[1], every[4]]  # allreduce of 3 MiB, broadcast of 1 MiB
    bcast = hcc.compile(hcc.load(BCAST16), "b")
    cases = ([(p, 7, {"inplace": True}) for p in every] + [(p, 7, {"inplace": "chained"}) for p in chained]
             + [(bcast, 7, {"inplace": True})])
    results = run_cases_local("sockets", cases, iters=3, warmup=1, timeout=30)
    return {"inplace": list(zip(every, results[:6])), "chained": list(zip(chained, results[6:8])),
            "bcast16": (bcast, results[8])}


def test_in_place_runs_of_compiled_plans_are_exact_every_iteration(runs):
    # three timed iterations: without the restore, an allreduce's second iteration would
    # reduce the first one's result (4x the expected sum), and the check below would fail
    ncpu = os.cpu_count() or 1
    assert len(runs["inplace"]) == 6
    for p, res in runs["inplace"]:
        assert len(res.times) == 3
        check(p, res.outputs, expected(p, make_inputs(p, 7)))
        # per rank and timed iteration: its CPU seconds and the host's idle core-seconds over
        # its timed region (read just outside it; the counter prints 10 ms steps, and a core's
        # idle time can shift to iowait and back, so a few steps of slack each way)
        for times, cpu, idle in zip(res.detail["rank_times"], res.detail["rank_cpu"], res.detail["rank_idle"]):
            assert len(times) == len(cpu) == len(idle) == 3
            assert all(c >= 0 for c in cpu)
            if host_idle_seconds() is not None:
                assert all(-0.05 <= i <= ncpu * t + 0.05 for i, t in zip(idle, times)), (idle, times)


def test_no_rank_restores_its_input_while_another_is_still_timing(runs):
    # a broadcast's receivers finish long before its root; copying their input back then
    # took a core from the root's timed sends. Every iteration after the first restores the
    # same way: 3 of them are checked (the job's warm-up and 3 timed iterations; 4 before)
    plan, res = runs["bcast16"]
    check(plan, res.outputs, expected(plan, make_inputs(plan, 7)))
    spans = res.detail["rank_spans"]
    assert all(len(s) == 4 for s in spans)
    for it in range(1, 4):
        last_end = max(s[it - 1][2] for s in spans)
        for r, s in enumerate(spans):
            restored, start, end = s[it]
            assert last_end <= restored <= start <= end, (r, it, s[it], last_end)


def test_chained_iterations_restore_only_before_the_last_one(runs):
    # the benchmark's default against gloo: each iteration reduces the last one's output, as a
    # loop of dist.all_reduce(x) does; the last starts from the original input again, so its
    # output is the reference (had it not been restored, this sum would be 4**3 times too big)
    assert len(runs["chained"]) == 2
    for p, res in runs["chained"]:
        check(p, res.outputs, expected(p, make_inputs(p, 7)))
        spans = res.detail["rank_spans"]
        assert all(len(s) == 4 for s in spans)
        last_end = max(s[2][2] for s in spans)
        for r, s in enumerate(spans):
            assert [restored for restored, _, _ in s[:3]] == [None] * 3, (r, s)
            restored, start, end = s[3]
            assert last_end <= restored <= start <= end, (r, s[3], last_end)


def test_unknown_case_option_is_refused_before_any_process_starts():
    plan = _plans()[0]
    with pytest.raises(RuntimeFault, match="unknown case option"):
        run_cases_local("sockets", [(plan, 7, {"in_place": True})], iters=1, timeout=10)
    with pytest.raises(RuntimeFault, match="inplace must be"):
        run_cases_local("sockets", [(plan, 7, {"inplace": "yes"})], iters=1, timeout=10)
