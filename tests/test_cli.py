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
    for col in ("collective", "algorithm", "trees", "chunk", "predicted", "bound", "eff", "algbw", "busbw", "NCCL-like"):
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
    from hcc.ir.viz import tree_edges as viz_tree_edges

    plan = Plan.load(plan_file)
    dot = tmp_path / "t.dot"
    assert hcc_cmd("viz", plan_file, "--format", "dot", "-o", dot).returncode == 0
    text = dot.read_text()
    assert text.startswith("digraph") and text.rstrip().endswith("}")
    for v in plan.ranks:  # panel 0 (the topology) draws every rank
        assert f'"p0:{v}"' in text
    # one coloured edge per distinct hop of every tree, in the tree's own panel (tests/test_viz.py)
    assert len(re.findall(r'-> "p\d+:[^"]+" \[color="#', text)) == sum(
        len({(u, v) for t, u, v, _ in viz_tree_edges(plan) if t == tree.index}) for tree in plan.trees)
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


# ---------------------------------------------------------------- the cost model's flags
LINE = """topology line {
    node g[0..4]
    class hop = 1 GB/s, 2 us
    g[0] <-> g[1] : hop
    g[1] <-> g[2] : hop
    g[2] <-> g[3] : hop
    g[3] <-> g[4] : hop
}
collective b = broadcast on line {
    size = 4 MiB
    dtype = float32
    algorithm = treepack    # one chain from the end of a line: the pipeline formula holds
}
"""


def _chain_time(chunk: int, per_message_s: float, size: int = 4 << 20, hops: int = 4) -> float:
    """The pipeline formula of a chain broadcast: independent of the simulator, for the line
    above (α = 2 us, C = 1 GB/s, d = 4 hops), the buffer of M bytes cut into k chunks of
    nearly one size, the largest c (``chunk`` or less): every chunk crosses the first hop,
    the last one the other d - 1, (k + d - 1)(α + p) + M / C + (d - 1) c / C (c = M / k
    where it divides)."""
    k = -(-size // chunk)
    c = -(-(size // 4) // k) * 4
    return (k + hops - 1) * (2e-6 + per_message_s) + size / 1e9 + (hops - 1) * c / 1e9


def test_per_message_flag_moves_the_chunk_and_the_prediction(tmp_path):
    from test_cost import searched_argmin

    src = tmp_path / "line.hcl"
    src.write_text(LINE)
    rows = {}
    for us in (None, 50, 500):
        r = hcc_cmd("compile", src, "--json", *(("--per-message-us", us) if us is not None else ()))
        assert r.returncode == 0, r.stderr
        (rows[us],) = json.loads(r.stdout)
    assert rows[None]["per_message_us"] == pytest.approx(1.0)  # the compiler's default
    for us, row in rows.items():
        p = (1.0 if us is None else us) * 1e-6
        best = searched_argmin(lambda c: _chain_time(c, p), 4 << 20)
        assert row["per_message_us"] == pytest.approx(p * 1e6)
        assert row["chunk_bytes"] == best
        assert row["predicted_s"] == pytest.approx(_chain_time(best, p), rel=1e-9)
    assert rows[None]["chunk_bytes"] < rows[50]["chunk_bytes"] < rows[500]["chunk_bytes"]
    assert rows[None]["predicted_s"] < rows[50]["predicted_s"] < rows[500]["predicted_s"]
    r = hcc_cmd("compile", src, "--per-message-us", 500)
    assert r.returncode == 0 and "cost model: 500 us per message" in r.stdout


def test_simulate_prices_a_plan_file_with_the_flags(tmp_path):
    src, plan_json = tmp_path / "line.hcl", tmp_path / "line.json"
    src.write_text(LINE)
    assert hcc_cmd("compile", src, "-o", plan_json).returncode == 0
    chunk = Plan.load(plan_json).chunk_bytes
    for us in (1, 300):
        r = hcc_cmd("simulate", plan_json, "--json", "--per-message-us", us)
        assert r.returncode == 0, r.stderr
        sim = json.loads(r.stdout)
        assert sim["chunk_bytes"] == chunk and sim["per_message_us"] == pytest.approx(us)
        assert sim["predicted_s"] == pytest.approx(_chain_time(chunk, us * 1e-6), rel=1e-9)
    # a .hcl is compiled with the flags: its chunk follows the model
    r = hcc_cmd("simulate", src, "--json", "--per-message-us", 300)
    assert json.loads(r.stdout)["chunk_bytes"] > chunk
    r = hcc_cmd("simulate", src, "--per-message-us", 300, "--reduce-GBps", 2)
    assert r.returncode == 0 and "cost model: 300 us per message, reduce 2 GB/s, copies free" in r.stdout


def test_bad_cost_flags_exit_2():
    for flag, value in (("--per-message-us", "-3"), ("--reduce-GBps", "nan"), ("--copy-GBps", "inf")):
        r = hcc_cmd("compile", DEMO, flag, value)
        assert r.returncode == 2, (flag, r.stderr)
        assert f"{flag} must be a finite number >= 0" in r.stderr and "^" in r.stderr and "Traceback" not in r.stderr


def test_run_compiles_with_the_backends_model_unless_told(tmp_path):
    # `hcc run` compiles with the cost model of the runtime that carries the plan
    # (hcc.runner.RUN_MODELS), the flags override it; no rank is started here
    from hcc import runner
    from hcc.cli import build_parser
    from hcc.commands import cost_model
    from test_cost import searched_argmin

    src = tmp_path / "line.hcl"
    src.write_text(LINE)
    for backend in ("sockets", "mpi", "ray"):
        args = build_parser().parse_args(["run", str(src), "--backend", backend])
        assert cost_model(args, base=runner.RUN_MODELS[backend]) == runner.RUN_MODELS[backend]
    assert runner.RUN_MODELS["sockets"].per_message_s == runner.SOCKETS_PER_MESSAGE_S
    args = build_parser().parse_args(["run", str(src), "--per-message-us", "7", "--copy-GBps", "3"])
    model = cost_model(args, base=runner.RUN_MODELS["sockets"])
    assert (model.per_message_s, model.copy_Bps) == (pytest.approx(7e-6), 3e9)
    for m in (runner.RUN_MODELS["sockets"], model):
        (plan,) = runner.load_plans(str(src), model=m)
        best = searched_argmin(lambda c: _chain_time(c, m.per_message_s), 4 << 20)
        assert plan.chunk_bytes == best
        assert plan.figures.predicted_s == pytest.approx(_chain_time(best, m.per_message_s), rel=1e-9)
    # a plan file keeps its chunk and is re-priced with the run's model
    plan_json = tmp_path / "line.json"
    assert hcc_cmd("compile", src, "-o", plan_json).returncode == 0
    (plan,) = runner.load_plans(str(plan_json), model=runner.RUN_MODELS["sockets"])
    assert plan.chunk_bytes == Plan.load(plan_json).chunk_bytes
    assert plan.figures.predicted_s == pytest.approx(_chain_time(plan.chunk_bytes, runner.SOCKETS_PER_MESSAGE_S))


# ---- the help a user finds (issue 21) ---------------------------------------------------------

def test_version():
    r = hcc_cmd("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"hcc {hcc.__version__}", (r.stdout, r.stderr)


def _options(parser):
    """Every argument of ``parser`` and of its subcommands: (where, argparse action)."""
    import argparse

    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                for where, b in _options(sub):
                    yield f"{name} {where}".strip(), b
        else:
            yield "", a


def test_every_option_has_help_text():
    """`hcc run --backend/--iters/--warmup/--json/--seed`, `hcc viz -c --format -o` and the
    whole `hcc netem` family had no help line."""
    from hcc.cli import build_parser
    from hcc.netemcmd import _parser

    bare = [f"hcc {where} {a.option_strings or a.dest}" for where, a in _options(build_parser())
            if not (a.help or "").strip()]
    for action in ("up", "down", "status", "exec"):
        p = _parser(action)
        assert (p.description or "").strip(), action
        bare += [f"hcc netem {action} {a.option_strings or a.dest}" for _, a in _options(p)
                 if not (a.help or "").strip()]
    assert not bare, bare


def test_help_shows_the_run_options():
    r = hcc_cmd("run", "-h")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for fragment in ("--backend {sockets,mpi,ray} sockets:", "--iters N timed runs", "--warmup N untimed runs",
                     "--json print one JSON object", "--seed SEED seed of the random inputs"):
        assert fragment in text, fragment


def test_netem_says_why_a_latency_is_not_emulated():
    """2 µs and 20 µs links under the delay line (the mode this kernel gets: no sch_netem)
    were shown as `latency by none` and `0.000 ms` without a reason."""
    from dataclasses import replace

    from hcc.netem import MIN_DELAY_LINE_S, layout
    from hcc.netemcmd import latency_notes

    topo = hcc.load("topology lat { node a, b, c\n a <-> b : 1 GB/s, 2 us\n b <-> c : 1 GB/s, 20 us\n"
                    " a <-> c : 1 GB/s, 80 us }").topologies["lat"]
    n = layout(topo, "lat", delay_mode="delay-line")  # what `up` builds without the netem qdisc
    assert {(e.vertex, e.peer): e.delay_s for e in n.ends}[("a", "c")] == pytest.approx(80e-6)
    (note,) = latency_notes(topo, n, "auto")
    assert "4 link directions declared with a latency (2 µs, 20 µs) run with none added" in note
    assert f"under {MIN_DELAY_LINE_S * 1e6:g} µs" in note and "no sch_netem" in note
    assert "--delay none" in latency_notes(topo, layout(topo, "lat", delay_mode="none"), "none")[0]
    sub_us = hcc.load("topology s { node a, b\n a <-> b : 1 GB/s, 0.3 us }").topologies["s"]
    n = replace(layout(sub_us, "s", delay_mode="netem"))
    assert latency_notes(sub_us, n, "netem") == ["note: tc netem applies delays in whole microseconds: 0.3 µs as 1 µs"]


@pytest.mark.netem
@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/sbin/ip").exists() and not Path("/sbin/ip").exists(),
                    reason="needs root and iproute2")
def test_netem_up_prints_the_reason(tmp_path):
    src = tmp_path / "lat.hcl"
    src.write_text("topology lat { node a, b\n a <-> b : 1 GB/s, 2 us }\n")
    name = f"t21{os.getpid() % 100000}"
    try:
        r = hcc_cmd("netem", "up", src, "-n", name)
        if r.returncode == 2 and "netem" in r.stderr and "permitted" in r.stderr:
            pytest.skip(r.stderr)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert any(l.startswith("note: 2 link directions declared with a latency (2 µs)") for l in lines), r.stdout
    finally:
        hcc_cmd("netem", "down", name)


def test_a_plan_file_with_a_negative_latency_exits_2(plan_file, tmp_path):
    """It made `hcc simulate`, `hcc viz` and `hcc run` loop forever (routing cycles on
    negative arcs); a zero capacity raised ZeroDivisionError (exit 1)."""
    d = json.loads(Path(plan_file).read_text())
    for field, value, fragment in ((3, -1e-6, "latency -1e-06 is outside 0 .. 3600 s"),
                                   (2, 0, "capacity 0 is outside 1 .. 10^18 B/s")):
        bad = json.loads(json.dumps(d))
        bad["topology"]["links"][0][field] = value
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(bad))
        for cmd in (("simulate", p), ("viz", p, "-o", tmp_path / "x.dot"), ("run", p, "--iters", 1)):
            r = hcc_cmd(*cmd)
            assert r.returncode == 2, (cmd, r.stderr)
            assert fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "x.dot").exists()


def test_api_errors_from_flags_exit_2(monkeypatch):
    """A value out of its domain that reaches the library (an ArgumentError) is bad input."""
    import hcc.commands as commands
    from hcc.cli import main
    from hcc.ir.errors import ArgumentValueError

    def boom(args):
        raise ArgumentValueError("a flag out of its domain")

    monkeypatch.setattr(commands, "cmd_check", boom)
    assert main(["check", str(DEMO)]) == 2
