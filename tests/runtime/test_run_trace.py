"""`hcc run --trace`: a measured trace of a real 4-rank run over sockets.

Checked on the trace file itself (what Perfetto reads): every transfer op of every rank's
program appears exactly once as a measured slice, no two slices of one lane overlap, and the
flows join each send to the receive of the same message (same ranks, same tag) and each
chunk's arrival at a rank to the send that forwards it."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from conftest import ring_topology

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# a 4-rank chain broadcast in 16 chunks: every non-root receives and forwards (flows across hops)
SRC = ring_topology("line", 4, "1 GB/s, 10 us", closed=False) + """
collective b = broadcast on line { root = r0  size = 256 KiB }
collective a = allreduce on line { size = 64 KiB  dtype = float32 }
"""


def test_measured_trace_of_a_real_run(tmp_path):
    from hcc import api
    from hcc.ir.plan import Send

    src = tmp_path / "line.hcl"
    src.write_text(SRC)
    out = tmp_path / "run.json"
    r = subprocess.run([sys.executable, "-m", "hcc", "run", str(src), "--iters", "2", "--warmup", "0",
                        "--trace", str(out), "--per-message-us", "100"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr + r.stdout
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    measured = [e for e in events if e["ph"] == "X" and e["pid"] < 100000 and e["name"].startswith(("send", "recv"))]
    # the executor's own work, on lanes of its own: the allreduce's staged receives reduced
    # after their receive completed (a reduce slice per RecvReduce of the op it names)
    local = [e for e in events if e["ph"] == "X" and e["pid"] < 100000 and not e["name"].startswith(("send", "recv"))]
    assert {e["name"].split()[0] for e in local} <= {"copy", "reduce", "scale"}
    recv_at = {(e["args"]["collective"], e["args"]["rank"], e["args"]["op"]): e for e in measured}
    reduced = [e for e in local if (e["args"]["collective"], e["args"]["rank"], e["args"]["op"]) in recv_at]
    assert reduced and {e["args"]["collective"] for e in reduced} == {1}
    for e in reduced:
        rv = recv_at[e["args"]["collective"], e["args"]["rank"], e["args"]["op"]]
        assert rv["name"] == "recv" + e["name"][len("reduce"):] and rv["tid"] != e["tid"]
        assert e["ts"] >= rv["ts"] + rv["dur"] - 1e-3  # reduced once the receive completed
    predicted = [e for e in events if e["ph"] == "X" and e["pid"] >= 100000]
    assert predicted, "the prediction is drawn beside the measurement"
    # every transfer op of every rank's program, once (plans compiled as hcc run compiled them)
    from hcc.compiler.cost import CostModel
    from hcc.runner import compile_on

    program = api.load(str(src))
    want = Counter()
    for c, name in enumerate(["b", "a"]):
        plan = compile_on(program, name, model=CostModel(per_message_s=100e-6))
        for rank, prog in enumerate(plan.programs):
            for k, op in enumerate(prog):
                if hasattr(op, "peer"):
                    want[c, rank, k] += 1
    got = Counter((e["args"]["collective"], e["args"]["rank"], e["args"]["op"]) for e in measured)
    assert got == want
    assert all(e["pid"] == 2 + e["args"]["rank"] for e in measured)  # per-rank tracks, as predicted
    # one lane never holds overlapping slices
    lanes = defaultdict(list)
    for e in measured:
        lanes[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in lanes.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:]))
    assert max(len({t for p, t in lanes if p == pid}) for pid in {p for p, _ in lanes}) >= 2
    # flows: a start and a finish per id, each bound inside a measured slice
    flows = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f") and e["pid"] < 100000:
            flows[e["id"]][e["ph"]] = e

    def slice_at(e):
        hits = [x for x in measured if x["pid"] == e["pid"] and x["tid"] == e["tid"]
                and x["ts"] <= e["ts"] <= x["ts"] + x["dur"]]
        assert hits, e
        return hits[0]

    send_to_recv = 0
    forwards = 0
    for f in flows.values():
        assert set(f) == {"s", "f"}
        a, b = slice_at(f["s"]), slice_at(f["f"])
        assert a["args"]["collective"] == b["args"]["collective"]
        if a["name"].startswith("send"):  # a message: the receive of the same ranks and tag
            assert b["name"].startswith("recv")
            assert (a["args"]["rank"], a["args"]["peer"], a["args"]["tag"]) == \
                   (b["args"]["peer"], b["args"]["rank"], b["args"]["tag"])
            send_to_recv += 1
        else:  # a hop: the chunk received at a rank, then sent on by it
            assert b["name"].startswith("send") and a["args"]["rank"] == b["args"]["rank"]
            assert (a["args"]["tree"], a["args"]["chunk"]) == (b["args"]["tree"], b["args"]["chunk"])
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
            forwards += 1
    n_sends = sum(1 for e in measured if e["name"].startswith("send"))
    assert send_to_recv == n_sends  # every send's message is followed to its receive
    assert forwards > 0
    # chunk order as executed: a rank's sends of one tree go out in chunk order on a chain
    root_sends = sorted((e for e in measured if e["args"]["collective"] == 0 and e["args"]["rank"] == 1
                         and e["name"].startswith("send")), key=lambda e: e["ts"])
    assert [e["args"]["chunk"] for e in root_sends] == sorted(e["args"]["chunk"] for e in root_sends)
