"""Golden compile summaries of every sample (style.md habit 7): ``tests/golden/<sample>.json``
holds, per collective, the algorithm, tree count, chunk size, rate, bound and efficiency (to
3 significant digits). ``HCC_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` rewrites them.

One case per collective; the 128-rank fat tree's take seconds each and are marked slow."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import hcc
from hcc.ir.files import atomic_write_text

from conftest import sample_unit

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("HCC_UPDATE_GOLDEN") == "1"
SLOW_SAMPLES = {"fattree"}  # 128 ranks: seconds each
# 1024 and 512 ranks: minutes each to compile; tests/test_scale.py and benchmarks/scale_bench.py
# cover them
SCALE_SAMPLES = {"fattree1024", "dgx1x64"}


def sig3(x: float) -> float:
    """Round to 3 significant digits.

    >>> sig3(123456.0), sig3(0.0012345)
    (123000.0, 0.00123)
    """
    return float(f"{x:.3g}")


def summarise(plan) -> dict:
    f = plan.figures
    return {
        "kind": plan.kind,
        "ranks": plan.n,
        "algorithm": plan.algorithm,
        "trees": len(plan.trees),
        "chunk_bytes": plan.chunk_bytes,
        "rate_Bps": sig3(f.rate_Bps),
        "bound_rate_Bps": sig3(f.bound_rate_Bps),
        "efficiency": sig3(f.efficiency),
    }


def cases() -> list:
    """One case per (sample, collective); the 128-rank fat tree's are marked slow."""
    out = []
    for path in sorted(SAMPLES.glob("*.hcl")):
        if path.stem in SCALE_SAMPLES:
            continue
        for c in hcc.load(path).collectives:
            marks = [pytest.mark.slow] if path.stem in SLOW_SAMPLES else []
            out.append(pytest.param(path.stem, c.name, marks=marks, id=f"{path.stem}-{c.name}"))
    return out


def _golden(sample: str) -> dict:
    path = GOLDEN / f"{sample}.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize("sample,name", cases())
def test_sample_matches_golden(sample, name):
    plan = sample_unit(sample, name).plan  # hcc.compile's plan, shared with test_compact
    assert plan.figures.efficiency <= 1 + 1e-9
    got = summarise(plan)
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        table = _golden(sample)
        table[name] = got
        atomic_write_text(GOLDEN / f"{sample}.json", json.dumps(table, indent=2, sort_keys=True) + "\n")
    want = _golden(sample)
    assert name in want, f"no golden entry for {sample}/{name}: run with HCC_UPDATE_GOLDEN=1"
    assert got == want[name]


def test_every_golden_entry_is_a_sample_collective():
    for path in GOLDEN.glob("*.json"):
        names = {c.name for c in hcc.load(SAMPLES / f"{path.stem}.hcl").collectives}
        assert set(json.loads(path.read_text())) <= names, path
