"""The emulated network on a real kernel: shaped links deliver their configured bandwidth,
latency is applied, ``down`` leaves nothing behind, ``up`` twice refuses.

Needs root and permission to create network namespaces; skipped with the reason otherwise.
Each emulation has a unique name (``t<pid><letter>``) and its state in a temporary folder, so
these tests never meet a user's emulation or each other."""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hcc import netem
from hcc.cli import main
from hcc.ir.topology import Link, Topology

pytestmark = [pytest.mark.slow, pytest.mark.netem]


def _why_not() -> str:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "hcc netem needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN); run the tests as root"
    try:
        ns = f"hcc-permprobe-{os.getpid()}"
        p = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=10)
        if p.returncode != 0:
            return f"`ip netns add` is not permitted here: {p.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns` unavailable: {e}"
    return ""


REASON = _why_not()
needs_netns = pytest.mark.skipif(bool(REASON), reason=REASON or "ok")


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("HCC_NETEM_STATE_DIR", str(tmp_path))
    made: list[str] = []
    yield made
    for name in made:  # a failing test must not leave namespaces behind
        if netem.state_path(name).exists():
            netem.down(name, kill=True)


def _name(letter: str) -> str:
    return f"t{os.getpid()}{letter}"


def _root_links() -> set[str]:
    """Root-namespace interfaces named like netem's link ends (``n<index>``); other work on
    the machine may add and remove its own interfaces meanwhile."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}
    return {n for n in names if re.fullmatch(r"n\d+", n)}


def _mine(name: str) -> set[str]:
    """This emulation's namespaces that exist (others' tests may run concurrently)."""
    return {ns for ns in netem.existing_namespaces() if ns.startswith(f"hcc-{name}-")}


MB = 1e6


@needs_netns
def test_shaped_links_deliver_configured_bandwidth(state):
    # a -> b 16 MB/s but b -> a 8 MB/s (each direction shaped on its own), and c behind a
    # switch whose links are 24 and 12 MB/s: a path is as fast as its slowest link
    topo = Topology(
        "bw", nodes=("a", "b", "c"), switches=("s",),
        links=(Link("a", "b", 16 * MB), Link("b", "a", 8 * MB),
               Link("b", "s", 24 * MB), Link("s", "b", 24 * MB),
               Link("s", "c", 12 * MB), Link("c", "s", 12 * MB)),
    )
    name = _name("b")
    state.append(name)
    n = netem.up(topo, name)
    assert n.address("a") != n.address("b")
    for src, dst, want in (("a", "b", 16 * MB), ("b", "a", 8 * MB), ("b", "c", 12 * MB), ("c", "a", 8 * MB)):
        got = netem.measure_throughput(n, src, dst, seconds=1.5)
        assert abs(got - want) <= 0.15 * want, f"{src}->{dst}: {got / MB:.2f} MB/s, configured {want / MB:.2f}"


@needs_netns
def test_latency_is_applied(state):
    # 5 ms each way on a<->b: a TCP ping-pong takes 10 ms plus the stack's few hundred us;
    # b<->c has none, so its round trip stays under a millisecond
    topo = Topology(
        "lat", nodes=("a", "b", "c"),
        links=(Link("a", "b", 20 * MB, 0.005), Link("b", "a", 20 * MB, 0.005),
               Link("b", "c", 20 * MB), Link("c", "b", 20 * MB)),
    )
    name = _name("l")
    state.append(name)
    n = netem.up(topo, name)
    assert n.delay_mode in ("netem", "delay-line")
    slow = statistics.median(netem.measure_rtt(n, "a", "b", count=15))
    fast = statistics.median(netem.measure_rtt(n, "b", "c", count=15))
    assert 0.010 <= slow <= 0.013, f"a<->b round trip {slow * 1e3:.3f} ms, configured 2 x 5 ms"
    assert fast < 0.002, f"b<->c round trip {fast * 1e3:.3f} ms with no latency configured"
    # through b the delays add: a -> c crosses the delayed link once each way
    assert 0.010 <= statistics.median(netem.measure_rtt(n, "a", "c", count=10)) <= 0.014


@needs_netns
def test_down_removes_everything_and_up_twice_refuses(state):
    before_links = _root_links()
    topo = Topology(
        "twice", nodes=("a", "b"),
        links=(Link("a", "b", 10 * MB, 0.002), Link("b", "a", 10 * MB, 0.002)),
    )
    name = _name("d")
    state.append(name)
    n = netem.up(topo, name, delay_mode="delay-line")  # exercise the relay process too
    assert n.relay_pid and netem.relay_alive(n.relay_pid)
    assert _root_links() == before_links, "up created interfaces in the root namespace"
    with pytest.raises(netem.NetemExists):
        netem.up(topo, name)
    assert netem.load(name) == n  # the refused second `up` touched nothing
    # a process left inside a namespace makes `down` refuse, unless asked to kill it
    sleeper = subprocess.Popen(n.wrap("a", ["sleep", "30"]))
    try:
        with pytest.raises(netem.NetemError, match="processes still run"):
            netem.down(name)
        removed = netem.down(name, kill=True)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(removed) == sorted(ns for _, ns in n.namespaces)
    assert _mine(name) == set()
    assert _root_links() == before_links
    assert not netem.state_path(name).exists() and netem.names() == []
    assert not netem.relay_alive(n.relay_pid)


@needs_netns
def test_cli_up_exec_status_down(state, tmp_path, capsys):
    topo = Topology("cli", nodes=("x", "y"), links=(Link("x", "y", 5 * MB), Link("y", "x", 5 * MB)))
    path = tmp_path / "cli.json"
    path.write_text(__import__("json").dumps(topo.to_dict()))
    name = _name("c")
    state.append(name)
    assert main(["netem", "up", str(path), "-n", name, "--scale", "2"]) == 0
    assert "10.000 MB/s" in capsys.readouterr().out  # 5 MB/s x scale 2
    assert main(["netem", "up", str(path), "-n", name]) == 2
    assert "already up" in capsys.readouterr().err
    n = netem.load(name)
    # exec runs in the rank's namespace (rank 1 = y) and returns the command's status
    out = subprocess.run([sys.executable, "-m", "hcc", "netem", "exec", "-n", name, "1", "--",
                          "ip", "-o", "addr", "show", "dev", "lo"],
                         capture_output=True, text=True, env={**os.environ}, timeout=30)
    assert out.returncode == 0 and n.address("y") in out.stdout
    assert main(["netem", "exec", "-n", name, "0", "--", "sh", "-c", "exit 3"]) == 3
    assert main(["netem", "status", name]) == 0
    assert f"ns hcc-{name}-x" in capsys.readouterr().out
    assert main(["netem", "down", name]) == 0
    assert not netem.state_path(name).exists()
    assert main(["netem", "down", name]) == 1  # nothing to remove is an error, not a crash


@needs_netns
def test_run_netem_predicts_the_emulated_links(state, tmp_path, capsys):
    # `hcc run --netem` on an emulation at scale 0.5: the plan is compiled against 20 MB/s
    # links, not the declared 40, so its bound is the one the shaped links impose (the run
    # cannot beat it) and its prediction is near what they deliver
    import json

    import hcc

    src = tmp_path / "tri.hcl"
    src.write_text("""
topology tri {
    node a, b, c
    a <-> b : 40 MB/s
    b <-> c : 40 MB/s
    a <-> c : 40 MB/s
}
collective ar = allreduce on tri {
    size = 4 MB
}
""")
    name = _name("r")
    state.append(name)
    assert main(["netem", "up", str(src), "-n", name, "--scale", "0.5"]) == 0
    capsys.readouterr()
    assert main(["run", str(src), "--netem", "--json", "--iters", "2"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    program = hcc.load(str(src))
    declared = hcc.compile(program, "ar")
    # compiled as the bench compiles it: its own HCL of the emulated topology, the sockets
    # backend's per-message cost (hcc.runner.RUN_MODELS)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import netem_bench

    from hcc.compiler.cost import simulate
    from hcc.runner import RUN_MODELS

    model = netem.load(name).model_topology()
    emulated = netem_bench.compile_case(model, ("a", "b", "c"), "allreduce", 4_000_000, "auto", RUN_MODELS["sockets"])
    assert row["verified"] is True
    assert row["per_message_us"] == pytest.approx(RUN_MODELS["sockets"].per_message_s * 1e6)
    assert row["predicted_s"] == pytest.approx(emulated.figures.predicted_s, rel=1e-9)
    assert row["predicted_s"] == pytest.approx(simulate(emulated, model=RUN_MODELS["sockets"]).time, rel=1e-9)
    assert row["chunk_bytes"] == emulated.chunk_bytes
    assert row["bound_s"] == pytest.approx(emulated.figures.bound_s) and row["bound_s"] > 1.8 * declared.figures.bound_s
    # the shaped links are real: the run is no faster than their bound (HTB's 2 ms burst aside)
    assert row["time_median_s"] >= 0.9 * row["bound_s"]
    assert netem.down(name) and not netem.names()


@needs_netns
def test_acks_do_not_queue_behind_bulk_data(state):
    # b -> a saturated by one bulk stream: a small packet on b -> a (the echo of a ping-pong,
    # or an ACK) takes its own HTB class instead of waiting behind the bulk FIFO. Measured
    # on this machine: 0.01 ms median round trip; with one FIFO per link end, 16-24 ms (one
    # stream's standing queue at 8 MB/s; many streams fill all 256 x 9000 B, 290 ms)
    import threading
    import time

    topo = Topology("ack", nodes=("a", "b"), links=(Link("a", "b", 8 * MB), Link("b", "a", 8 * MB)))
    name = _name("k")
    state.append(name)
    n = netem.up(topo, name)
    bulk: list[float] = []
    t = threading.Thread(target=lambda: bulk.append(netem.measure_throughput(n, "b", "a", seconds=6.0)))
    t.start()
    try:
        time.sleep(3.0)  # let the stream build its standing queue
        rtts = netem.measure_rtt(n, "a", "b", count=20)
    finally:
        t.join(timeout=60)
    assert bulk and bulk[0] >= 0.8 * 8 * MB, "the bulk stream did not saturate the link"
    assert statistics.median(rtts) < 0.005, f"ping-pong behind bulk data: {statistics.median(rtts) * 1e3:.1f} ms"
