"""hcc viz PNG/SVG: panels laid out one by one and composed in index order, whatever the size;
trees of an aggregated (rack/host) plan open their root's host rank by rank (the rank-level
inset), so a ring's closing arc inside one server shows its two GPUs, not one box; a
1024-rank plan draws racks, not 1024 labels. Structure is read from what the renderer
computes (grid corners, the SVG's nested panels, the DOT of each panel), never from timing."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import hcc
from hcc.ir import viz
from hcc.ir.plan import Figures, Plan, Tree

ROOT = Path(__file__).resolve().parent.parent

# 4 servers of 8 GPUs, each GPU with its own NIC to one ToR (samples/cluster.hcl's shape, 69
# vertices: aggregated); a ring allreduce over two of them has 16 trees, among them depth-1
# trees that live inside h0 (the ring's closing arc)
CLUSTER = ROOT / "samples" / "cluster.hcl"


def _ring_plan() -> Plan:
    """A 16-rank ring over h0 and h1 as the plan's trees: tree k starts at rank k and runs
    round the ring (depth 15); tree 16 + k is rank k's one arc to the next rank (depth 1:
    h0.gpu7 -> h0.gpu0 lives inside h0). Built directly: the picture needs trees, not a
    compile (the real compile takes ~50 s)."""
    prog = hcc.load(CLUSTER)
    topo = prog.topologies["cluster"]
    ranks = tuple(f"h{h}.gpu{g}" for h in (0, 1) for g in range(8))
    n = len(ranks)
    trees = []
    for k in range(n):  # chains
        parent = [-1] * n
        for i in range(1, n):
            parent[(k + i) % n] = (k + i - 1) % n
        trees.append(Tree(k, k, tuple(parent), 1e9, (0, 0)))
    for k in range(4):  # single arcs: the first is 7 -> 0 inside h0
        a, b = (7, 0) if k == 0 else (k, k + 1)
        parent = [-1] * n
        parent[b] = a
        trees.append(Tree(n + k, a, tuple(parent), 1e9, (0, 0)))
    # chain trees first would fill the 11 panels: put the one-arc tree in the middle
    order = trees[:5] + [trees[n]] + trees[5:n] + trees[n + 1:]
    order = [Tree(i, t.root, t.parent, t.rate, t.span) for i, t in enumerate(order)]
    return Plan("ring16", "allreduce", ranks, -1, 1 << 20, "float32", "sum", "rings", 1 << 16, tuple(order),
                tuple(() for _ in ranks), tuple(0 for _ in ranks), topo)


def _fattree_plan() -> Plan:
    """samples/fattree1024.hcl's 1024 ranks with a binary tree from rack0.n0 (rank i's parent
    (i - 1) // 2): depth 9, arcs inside racks and across them; its cut the compiler's for
    this broadcast (the root's one 12.5 GB/s link to its leaf)."""
    topo = hcc.load(ROOT / "samples" / "fattree1024.hcl").topologies["fattree1024"]
    ranks = topo.nodes
    parent = tuple((i - 1) // 2 if i else -1 for i in range(len(ranks)))
    cut = Figures(bound_rate_Bps=12.5e9, cut_vertices=("rack0.n0",), cut_links=(("rack0.n0", "rack0.leaf"),),
                  cut_capacity_Bps=12.5e9, cut_direction="out")
    return Plan("bc1024", "broadcast", ranks, 0, 1 << 20, "float32", None, "tree", 1 << 16,
                (Tree(0, 0, parent, 1e9, (0, 0)),), tuple(() for _ in ranks), tuple(0 for _ in ranks), topo, cut)


@pytest.fixture(scope="module")
def ring():
    return _ring_plan()


@pytest.fixture(scope="module")
def fattree():
    return _fattree_plan()


def test_grid_places_panels_in_reading_order_without_overlap():
    sizes = [(300, 200), (120, 500), (400, 90), (80, 80), (600, 300), (50, 700), (200, 200)]
    corners, (w, h) = viz.grid(sizes, gap=10)
    rows = []
    for (x, y), (pw, ph) in zip(corners, sizes):
        assert 0 <= x and x + pw <= w and 0 <= y and y + ph <= h
        if rows and rows[-1][0] == y:
            assert x > rows[-1][1]  # same row: right of the previous panel
            rows[-1] = (y, x)
        else:
            assert not rows or y > rows[-1][0]  # a new row: below
            assert x == 0
            rows.append((y, x))
    boxes = [(x, y, x + pw, y + ph) for (x, y), (pw, ph) in zip(corners, sizes)]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
    assert len(rows) > 1  # the grid wraps instead of one row 2000 px wide


def test_a_tree_inside_one_host_is_drawn_rank_by_rank(ring):
    scene = viz._scene(ring)
    assert scene.aggregated and len(ring.topology.vertices) > viz.AGGREGATE_OVER
    arc = scene.panels[5]  # the tree whose one arc is h0.gpu7 -> h0.gpu0
    assert arc.edges == {("h0.gpu7", "h0.gpu0"): 1} and arc.root == "h0.gpu7"
    assert arc.opened[0] == "h0"
    dot = viz.panel_dots(ring, scene)[6]
    body = dot.split('subgraph "cluster_panel6_host_h0"')[1]
    assert '"p6:h0.gpu7"' in body and '"p6:h0.gpu0"' in body and "peripheries=2" in body
    # a chain over both servers opens both (16 ranks), so the ring's path is drawn rank by rank
    chain = scene.panels[0]
    assert set(chain.opened) == {"h0", "h1"} and len(chain.edges) == 15
    assert ("h0.gpu7", "h1.gpu0") in chain.edges


def test_panels_are_composed_in_index_order(ring, tmp_path):
    """The SVG nests one <svg> per panel at its grid place: topology, then T0, T1, ... in
    reading order (one graph holding all panels had dot scatter them as T1, T0, T4, T7)."""
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    out = tmp_path / "ring.svg"
    viz.draw(ring, out)
    text = out.read_text()
    places = [(float(x), float(y)) for x, y in re.findall(r'<svg x="([\d.]+)" y="([\d.]+)"', text)]
    assert len(places) == 1 + viz.MAX_TREE_PANELS
    for (x0, y0), (x1, y1) in zip(places, places[1:]):
        assert y1 > y0 or (y1 == y0 and x1 > x0)
    # each nested panel holds its own tree's title, in order
    titles = re.findall(r">(T\d+), root", text)
    assert titles == [f"T{k}" for k in range(viz.MAX_TREE_PANELS)]


def test_1024_ranks_draw_as_racks(fattree, tmp_path):
    scene = viz._scene(fattree)
    assert len(scene.verts) == 33  # 32 rack boxes and one box for the 16 spines
    dots = viz.panel_dots(fattree, scene)
    assert len(dots) == 3  # topology, the cut opened, the tree
    drawn = [len(re.findall(r'^\s*"p\d+:(?!_top)[^"]+" \[label', d, re.M)) for d in dots]
    assert drawn[0] == 33
    # the cut lies inside rack0's box: the second panel opens rack0 (32 nodes, its leaf) and
    # draws the root's link red, the 31 other links of the leaf grey, the spines as one box
    assert drawn[1] == 32 + 1 + 1
    cut_lines = [l for l in dots[1].splitlines() if "penwidth=3" in l]
    assert len(cut_lines) == 1 and '"p1:rack0.leaf"' in cut_lines[0] and '"p1:rack0.n0"' in cut_lines[0]
    assert "cut 12.5 GB/s" in cut_lines[0]
    # the tree's panel: rack0 opened (its 32 ranks), the 31 other racks as boxes
    assert drawn[2] <= 32 + 31 and "rack0.n0" in dots[2] and '"p2:rack5"' in dots[2]
    assert not re.search(r'"p2:rack5\.n', dots[2])
    # arcs: rank -> rank inside rack0, rack0's ranks -> other racks, rack -> rack; each once
    tree = scene.panels[1]
    assert tree.root == "rack0.n0" and tree.opened == ("rack0",)
    hidden = re.search(r"\((\d+) inside closed boxes\)", tree.title)
    assert sum(tree.edges.values()) + (int(hidden.group(1)) if hidden else 0) == 1023
    out = tmp_path / "bc1024.svg"
    viz.draw(fattree, out)
    # Graphviz lays out each of the 3 panels in an <svg> of its own inside the picture's;
    # without dot on PATH, hcc's own layout draws one
    assert out.read_text().count("<svg") == (1 + len(dots) if shutil.which("dot") else 1)


def test_own_layout_without_dot(ring, fattree, tmp_path, monkeypatch):
    """Without Graphviz: hcc's own layout, panels in order in a grid of axes; a tree panel is
    layered from its root (each arc one row down), nothing drawn twice."""
    pytest.importorskip("matplotlib")
    scene = viz._scene(ring)
    for k, p in enumerate(scene.panels, 1):
        pos = viz.own_layout(scene, k)
        assert set(pos) == p.used()
        assert len(set(pos.values())) == len(pos)  # no two vertices on one spot
        for a, b in p.edges:
            assert pos[b][1] < pos[a][1]  # children below their parents
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    out = tmp_path / "bc1024.png"  # (the ring's 12 panels take matplotlib ~15 s: not here)
    viz.draw(fattree, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_viz_module_imports_the_compiler_or_matplotlib_at_load():
    """The split modules keep viz.py's rule: timings come in as arguments (the stages import
    one way) and matplotlib / Pillow (the viz extra) only inside the functions that draw."""
    import ast

    for path in sorted((ROOT / "ir").glob("viz*.py")):
        tree = ast.parse(path.read_text())
        mods = [("." * n.level + (n.module or "")) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in mods if "compiler" in m], (path.name, mods)
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        top_mods = [getattr(n, "module", None) or n.names[0].name for n in top]
        assert not [m for m in top_mods if m and m.split(".")[0] in ("matplotlib", "PIL")], (path.name, top_mods)
