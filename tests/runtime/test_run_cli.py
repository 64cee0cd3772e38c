"""`hcc run` end to end: compile a sample, run it on local ranks over sockets, verified."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def hcc(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "hcc", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_run_demo_every_collective():
    r = hcc("run", "samples/demo.hcl", "--iters", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    lines = [l for l in r.stdout.splitlines() if "verified" in l and "sockets" in l]
    assert len(lines) == 4 and all("verified: ok" in l for l in lines), r.stdout
    assert "busbw" in r.stdout and "predicted" in r.stdout


def test_run_json_and_plan_file(tmp_path):
    plan = tmp_path / "bcast.json"
    c = hcc("compile", "samples/demo.hcl", "-c", "broadcast", "-o", str(plan))
    assert c.returncode == 0, c.stderr
    r = hcc("run", str(plan), "--json", "--iters", "3", "--warmup", "0")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) == 1
    row = rows[0]
    assert row["verified"] is True and row["kind"] == "broadcast" and row["ranks"] == 4
    assert len(row["times_s"]) == 3 and row["time_min_s"] <= row["time_median_s"]
    # busbw of a broadcast is its algbw (factor 1), algbw = size / median time
    assert row["algbw_Bps"] == pytest.approx(row["size_bytes"] / row["time_median_s"])
    assert row["busbw_Bps"] == pytest.approx(row["algbw_Bps"])
    assert row["predicted_s"] > 0


def test_run_unknown_collective_is_a_clean_error():
    r = hcc("run", "samples/demo.hcl", "-c", "nope")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "nope" in r.stderr


def test_busbw_factors():
    from hcc.runner import busbw_factor

    assert busbw_factor("allreduce", 4) == 1.5
    assert busbw_factor("allgather", 4) == 0.75 and busbw_factor("alltoall", 8) == 7 / 8
    assert busbw_factor("broadcast", 4) == 1.0 and busbw_factor("reduce", 4) == 1.0
