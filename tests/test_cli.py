"""The ``hcc`` console script, run as a user runs it (subprocess of .venv/bin/hcc): exit
codes, error rendering, atomic -o, --json keys, and the viz/simulate outputs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hcc
from hcc.ir.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "samples" / "demo.hcl"
HCC = Path(sys.executable).parent / "hcc"
JSON_KEYS = {"name", "kind", "ranks", "size_bytes", "algorithm", "trees", "chunk_bytes", "rate_Bps",
             "bound_rate_Bps", "predicted_s", "bound_s", "efficiency", "ring_predicted_s", "compile_s"}


def hcc_cmd(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HCC_TRACEBACK"}
    return subprocess.run([str(HCC), *map(str, args)], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


BAD_SOURCE = """topology t {
    node a, b
    a <-> c : 1 GB/s
}
"""


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "bcast.json"
    r = hcc_cmd("compile", DEMO, "-c", "broadcast", "-o", out)
    assert r.returncode == 0, r.stderr
    return out


def test_check_ok():
    r = hcc_cmd("check", DEMO)
    prog = hcc.load(DEMO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{DEMO}: ok ({len(prog.topologies)} topologies, {len(prog.collectives)} collectives)"


def test_bad_input_exits_2_with_location_and_caret(tmp_path):
    bad = tmp_path / "bad.hcl"
    bad.write_text(BAD_SOURCE)
    for cmd in ("check", "compile"):
        r = hcc_cmd(cmd, bad)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "Traceback" not in r.stderr
        m = re.match(rf"{re.escape(str(bad))}:(\d+):(\d+): error: ", r.stderr)
        assert m, r.stderr
        line, col = int(m.group(1)), int(m.group(2))
        assert (line, col) == (3, BAD_SOURCE.splitlines()[2].index("c") + 1)
        lines = r.stderr.splitlines()
        assert lines[1].strip() == "a <-> c : 1 GB/s"
        assert lines[2].index("^") - lines[1].index("a") == col - 1 - BAD_SOURCE.splitlines()[2].index("a")


def test_compile_table_and_json():
    r = hcc_cmd("compile", DEMO)
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split()
    for col in ("collective", "algorithm", "trees", "chunk", "predicted", "bound", "eff", "algbw", "busbw", "ring"):
        assert col in header
    prog = hcc.load(DEMO)
    for c in prog.collectives:
        assert re.search(rf"^{c.name}\s", r.stdout, re.M)
    r = hcc_cmd("compile", DEMO, "--json")
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == [c.name for c in prog.collectives]
    for row in rows:
        assert JSON_KEYS <= row.keys()
        assert row["efficiency"] == pytest.approx(row["bound_s"] / row["predicted_s"])
        assert 0 < row["efficiency"] <= 1 + 1e-9


def test_output_is_atomic_and_needs_one_collective(tmp_path):
    out = tmp_path / "plan.json"
    r = hcc_cmd("compile", DEMO, "-o", out)
    assert r.returncode == 2 and "-c NAME" in r.stderr and not out.exists()
    bad = tmp_path / "bad.hcl"
    bad.write_text(BAD_SOURCE)
    r = hcc_cmd("compile", bad, "-o", out)
    assert r.returncode == 2 and not out.exists()
    r = hcc_cmd("compile", DEMO, "-c", "nope", "-o", out)
    assert r.returncode == 2 and "unknown collective 'nope'" in r.stderr and "^" in r.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_plan_file_loads_and_simulates(plan_file):
    plan = Plan.load(plan_file)
    assert plan.name == "broadcast" and plan.figures.predicted_s > 0
    r = hcc_cmd("simulate", plan_file, "--json")
    assert r.returncode == 0, r.stderr
    sim = json.loads(r.stdout)
    assert sim["predicted_s"] == pytest.approx(plan.figures.predicted_s)
    assert len(sim["ranks"]) == plan.n
    assert max(x["finish_s"] for x in sim["ranks"]) == pytest.approx(sim["predicted_s"])
    assert all(0 < l["utilisation"] <= 1 + 1e-9 for l in sim["links"])
    r = hcc_cmd("simulate", plan_file)
    assert r.returncode == 0 and "utilisation" in r.stdout


def test_viz_outputs(plan_file, tmp_path):
    plan = Plan.load(plan_file)
    dot = tmp_path / "t.dot"
    assert hcc_cmd("viz", plan_file, "--format", "dot", "-o", dot).returncode == 0
    text = dot.read_text()
    assert text.startswith("digraph") and text.rstrip().endswith("}")
    for v in plan.ranks:
        assert f'"{v}"' in text
    # one coloured edge per hop of every tree
    assert text.count("penwidth=2") == sum(max(1, len(p) - 1) for t in plan.trees for p, par in zip(t.paths, t.parent) if par >= 0)
    trace = tmp_path / "t.json"
    assert hcc_cmd("viz", plan_file, "--format", "trace", "-o", trace).returncode == 0
    events = json.loads(trace.read_text())["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 for e in xs)
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(plan.figures.predicted_s * 1e6, rel=1e-6)
    png = tmp_path / "t.png"
    assert hcc_cmd("viz", DEMO, "-c", "allgather", "--format", "png", "-o", png).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "t.svg"
    assert hcc_cmd("viz", plan_file, "--format", "svg", "-o", svg).returncode == 0
    assert b"<svg" in svg.read_bytes()[:2000]


def test_bad_plan_file_exits_2(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{"version": 999}')
    r = hcc_cmd("simulate", p)
    assert r.returncode == 2 and "Traceback" not in r.stderr
