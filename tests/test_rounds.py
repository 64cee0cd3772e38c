"""rounds (compiler/rounds.py): broadcast and reduce in paced rounds over one switch. Checked:
every schedule against the one-port rules by replaying it (each rank sends and receives at
most one block per round, only blocks it holds, and everyone ends with every block), its
round count against the least any one-port schedule can take (k + ceil(log2 n) - 1, met
for powers of two), the plans verify and compute, the simulated time against the rounds'
own α-β arithmetic, and auto's choice on samples/nvswitch.hcl."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import hcc
from hcc.compiler.cost import simulate
from hcc.compiler.program import CollectiveSpec
from hcc.compiler.rounds import one_switch, round_schedule, rounds_plan
from hcc.ir.topology import Link, Topology
from hcc.ir.verify import verify

from test_lower import check_numeric
from test_ringfill import SQUARE, refused_at_collective

ROOT = Path(__file__).resolve().parent.parent


def switch(n: int, cap: float = 150e9, lat: float = 1e-6) -> Topology:
    links = []
    for i in range(n):
        links += [Link(f"g{i}", "sw", cap, lat), Link("sw", f"g{i}", cap, lat)]
    return Topology("sw", tuple(f"g{i}" for i in range(n)), switches=("sw",), links=tuple(links))


def spec(kind: str, n: int, size: int, *, root: int = 0, op=None, dtype="float64") -> CollectiveSpec:
    return CollectiveSpec(name="c", kind=kind, topology="sw", ranks=tuple(f"g{i}" for i in range(n)),
                          root=root, size_bytes=size, dtype=dtype, op=op)


def replay(n: int, k: int, rounds) -> None:
    """Every round obeys the one-port rules on the state the rounds before it left."""
    have = [set(range(k))] + [set() for _ in range(n - 1)]
    for t, rnd in enumerate(rounds):
        senders = [u for u, _, _ in rnd]
        receivers = [v for _, v, _ in rnd]
        assert len(set(senders)) == len(senders) and len(set(receivers)) == len(receivers), t
        for u, v, b in rnd:
            assert b in have[u] and b not in have[v], (t, u, v, b)
        for _, v, b in rnd:
            have[v].add(b)
    assert all(h == set(range(k)) for h in have)


@pytest.mark.parametrize("n", list(range(2, 21)) + [32, 33, 48, 64])
def test_schedules_obey_one_port_and_meet_the_least_rounds_at_powers_of_two(n):
    for k in (1, 2, 3, 7, 16, 40):
        rounds = round_schedule(n, k)
        replay(n, k, rounds)
        least = k + math.ceil(math.log2(n)) - 1  # the last block leaves the root in round k-1,
        # and its holders at most double per round
        assert least <= len(rounds) <= k + n - 2
        if n & (n - 1) == 0:
            assert len(rounds) == least, (n, k)


@pytest.mark.parametrize("kind,op", [("broadcast", None), ("reduce", "sum"), ("reduce", "avg"), ("reduce", "max")])
@pytest.mark.parametrize("n,root", [(2, 1), (3, 0), (5, 3), (8, 6)])
def test_plans_verify_and_compute(kind, op, n, root):
    size = 8 * 1001  # 1001 float64: divides by neither the ranks nor the chunks
    s = spec(kind, n, size, root=root, op=op)
    for chunk in (8 * 64, 8 * 1001):
        plan = rounds_plan(s, switch(n), chunk)
        verify(plan)
        check_numeric(plan, seed=n * 100 + chunk)
        assert plan.algorithm == "rounds"


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_a_round_holds_each_port_for_a_block_and_three_latencies(kind):
    """Paced rounds take k + log2(n) - 1 rounds of c/B + 2 link latencies + the per-message
    cost each (rounds.py's α-β arithmetic), and beat a chain's k + n - 2 message times."""
    n, k, c, B = 8, 16, 1 << 20, 150e9
    plan = rounds_plan(spec(kind, n, k * c, op="sum" if kind == "reduce" else None), switch(n, B), c)
    got = simulate(plan).time
    want = (k + 2) * (c / B + 2e-6 + 1e-6)
    assert abs(got - want) < 0.01 * want
    chain = (k + n - 2) * (c / B + 2e-6)  # a chain's messages overlap their latency, 2 us each
    assert got < chain


def test_one_switch_holds_only_where_every_rank_has_one_port_into_one_switch():
    assert one_switch(switch(4), ("g0", "g1", "g2", "g3"))
    two = switch(4)
    two = Topology("two", two.nodes, switches=("sw", "sw2"),
                   links=two.links + (Link("g0", "sw2", 1e9, 1e-6), Link("sw2", "g0", 1e9, 1e-6)))
    assert not one_switch(two, two.nodes)  # g0 has a second port
    mesh = Topology("m", ("a", "b"), links=(Link("a", "b", 1e9, 1e-6), Link("b", "a", 1e9, 1e-6)))
    assert not one_switch(mesh, mesh.nodes)  # no switch


def test_forced_on_an_nvswitch_server_it_beats_auto_and_auto_does_not_offer_it():
    src = (ROOT / "samples" / "nvswitch.hcl").read_text()
    auto = hcc.compile(src, "broadcast")
    assert auto.algorithm != "rounds"  # registry: forced only, until the runtime gains from it
    forced = hcc.compile(src.replace("root = gpu0", "root = gpu0\n    algorithm = rounds", 1), "broadcast")
    assert forced.algorithm == "rounds"
    assert forced.figures.predicted_s < auto.figures.predicted_s
    assert forced.figures.predicted_s < forced.figures.baseline_predicted_s  # the NCCL-like baseline's


def test_forcing_it_off_one_switch_is_refused_at_the_collective():
    err = refused_at_collective(SQUARE + "collective b = broadcast on sq { size = 1 MiB  algorithm = rounds }\n")
    assert "algorithm rounds has no form of this broadcast on topology sq" in err.message


def test_doctests():
    import doctest

    import hcc.compiler.rounds

    assert doctest.testmod(hcc.compiler.rounds).failed == 0
