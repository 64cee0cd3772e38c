"""hcc viz: panels and hosts in a stable order, as Graphviz lays them out (``dot -Tplain``
positions): the topology panel, then tree 0, 1, ... left to right along each row, rows top
to bottom; the hosts of the topology panel in their declared order; every tree panel rings
its root. Without the ordering constraints dot swapped the two servers of a two-host plan
(s1 drawn left of s0) and staggered the tops of the panels of one row."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import hcc
from hcc.ir import viz

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")

TWO = """
topology two {
    host s[0..1] {
        node g[0..1]
        switch nic
        g0 <-> g1 : 50 GB/s, 1 us
        g[0..1] <-> nic : 16 GB/s, 1 us
    }
    switch tor
    s[0..1].nic <-> tor : 12.5 GB/s, 5 us
}
collective bc = broadcast on two { root = s0.g0  size = 4 MiB }
"""


def _positions(dot: str) -> dict[str, tuple[float, float]]:
    plain = subprocess.run(["dot", "-Tplain"], input=dot, capture_output=True, text=True, timeout=60).stdout
    out = {}
    for line in plain.splitlines():
        f = line.split()
        if f and f[0] == "node":
            out[f[1].strip('"')] = (float(f[2]), float(f[3]))  # y grows upward
    return out


def test_hosts_in_declared_order():
    plan = hcc.compile(TWO, "bc")
    pos = _positions(viz.to_dot(plan))
    assert pos["p0:s0.g0"][0] < pos["p0:s1.g0"][0]  # s0 left of s1


def test_tree_panels_in_order_with_their_roots_ringed():
    plan = hcc.compile("samples/dgx1.hcl", "broadcast")
    assert len(plan.trees) >= 3
    dot = viz.to_dot(plan)
    pos = _positions(dot)
    tops = [pos[f"p{k}:_top"] for k in range(len(plan.trees) + 1)]
    cols = 3  # viz.to_dot's grid for <= 30 vertices
    for k in range(1, len(tops)):
        if k % cols:  # same row: to the right of the previous panel, tops level
            assert tops[k][0] > tops[k - 1][0] and tops[k][1] == pytest.approx(tops[k - 1][1])
        else:  # a new row: below the previous row
            assert tops[k][1] < tops[k - 1][1]
    for k, t in enumerate(plan.trees, 1):
        root = plan.ranks[t.root]
        assert re.search(rf'"p{k}:{re.escape(root)}" \[label="{re.escape(root)}\\n\(root\)".*peripheries=2', dot)
