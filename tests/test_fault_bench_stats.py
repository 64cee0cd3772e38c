"""The staggered rows of benchmarks/fault_bench.py: every rep draws its own start delays, so
a rep's time is compared with its own last arrival + one hop, and the row's ratio is the
median of those per-rep ratios (the median time over the median reference pairs one rep's
time with another rep's arrivals)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "fault_bench.py"


@pytest.fixture(scope="module")
def fb():
    spec = importlib.util.spec_from_file_location("fault_bench_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# a seed-7 run on the emulated star whose first rep stalled on one TCP connection (15.65 s)
HOP = 3.55
LASTS = [6.02, 5.35, 6.68]
TIMES = {"allreduce/stagger/default": [15.652, 9.762, 12.085],
         "allreduce/stagger/static": [13.84, 12.419, 12.42]}


def _med_meta():
    results = dict(TIMES, hop=[HOP])
    med = {k: statistics.median(v) for k, v in results.items()}
    meta = {"allreduce/stagger/static": {"last_arrival": LASTS}}
    return results, med, meta


def test_a_staggered_row_is_the_median_of_each_reps_own_ratio(fb):
    results, med, meta = _med_meta()
    args = argparse.Namespace(kinds=["allreduce"], stagger=6.71)
    rows = {r["case"]: r for r in fb._rows(args, med, meta, results)}
    row = rows["allreduce: stagger [0,6.71] default"]
    own = sorted(t / (last + HOP) for t, last in zip(TIMES["allreduce/stagger/default"], LASTS))
    assert row["ratio"] == pytest.approx(own[1])  # 1.18: the third rep's own ratio
    assert row["ratio"] < 1.2
    # the old figure: the third rep's 12.085 s over the first rep's 6.02 + one hop
    assert row["ratio_of_medians"] == pytest.approx(12.085 / (6.02 + HOP))
    assert row["ratio_of_medians"] > 1.25
    vs = rows["allreduce: stagger default vs static"]
    assert vs["ratio"] == pytest.approx(statistics.median(
        t / s for t, s in zip(TIMES["allreduce/stagger/default"], TIMES["allreduce/stagger/static"])))
    # without per-rep times (an old results file) the row falls back to the ratio of medians
    row = {r["case"]: r for r in fb._rows(args, med, meta)}["allreduce: stagger [0,6.71] default"]
    assert row["ratio"] == pytest.approx(row["ratio_of_medians"])


def test_the_seeds_table_reports_both_ratios(fb, tmp_path):
    results, med, meta = _med_meta()
    run = {"seed": 7, "ranks": 8, "stagger_s": 6.71, "times": results,
           "meta": {"allreduce/stagger/static": {"last_arrival": LASTS, "delays": [
               [0.0] * 7 + [x] for x in LASTS]}}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    rows = fb.seeds_table([str(path)], str(tmp_path / "seeds.csv"), label="t")
    (row,) = [r for r in rows if r["engine"] == "default"]
    own = sorted(t / (last + HOP) for t, last in zip(TIMES["allreduce/stagger/default"], LASTS))
    assert row["ratio"] == pytest.approx(own[1], abs=1e-3)
    assert row["ratio_of_medians"] == pytest.approx(12.085 / (6.02 + HOP), abs=1e-3)
    assert "ratio_of_medians" in (tmp_path / "seeds.csv").read_text().splitlines()[0]


def test_the_doctests_of_the_benchmark(fb):
    import doctest

    assert doctest.testmod(fb).failed == 0
