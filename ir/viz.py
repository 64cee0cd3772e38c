"""hcc.ir.viz — pictures of a plan: its topology, its trees one panel each, and a timeline.

Terms:

- **scene**: what a picture shows, computed once from the plan and drawn by either renderer.
  A small plan shows every vertex; a plan of more than :data:`AGGREGATE_OVER` vertices shows
  each host (a rack, a server) as one box and merges the switches outside hosts that reach the
  same hosts (a fat tree's spines) into one box, so 1024 ranks draw as 32 racks and a spine.
- **panel**: one small drawing inside the picture. Panel 0 is the topology with the bottleneck
  cut — the links whose capacity sets the plan's bound rate (``Figures.cut_links``) — drawn
  thick red and labelled with that rate; then one panel per packed tree with only the tree's
  edges, its root marked. More than :data:`MAX_TREE_PANELS` trees: the first ones are drawn and
  the title says how many are not. A plan without trees (a direct alltoall) gets instead a
  panel with its traffic matrix: the bytes each rank sends each other rank.
- **lane**: one track of the trace that never holds two overlapping slices. Transfers that
  overlap on one link (cut-through hops, a queue of messages) go to the link's next lane.

Functions:

- :func:`to_dot`: Graphviz DOT text; every host is a ``cluster`` subgraph inside its panel.
- :func:`draw`: PNG/SVG. With Graphviz's ``dot`` on PATH it renders :func:`to_dot`; without it,
  matplotlib (the ``viz`` extra, imported only here) draws the same scene: hosts as shaded
  boxes, a grid of panels.
- :func:`to_trace`: Chrome / Perfetto trace-event JSON from a simulation the caller ran (the
  compiler's ``simulate(plan, detail=True)``; this module takes its result and never imports
  the compiler — the stages import one way). Process 1 holds one lane per concurrent transfer
  on each link; then one process per rank with its send and receive lanes; flow events
  (``ph`` ``s``/``f``) follow each chunk from hop to hop and from the rank that received it to
  the rank it forwards it to. Timestamps are microseconds, as the trace-event format defines.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ArgumentValueError, HccError
from .plan import Plan


class VizError(HccError):
    """Graphviz's ``dot`` refused the picture (its message follows)."""

# 10 colours that stay distinct on white (matplotlib's tab10), cycled past 10 trees
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
CUT_COLOR = "#d62728"
# more vertices than this (and hosts declared): hosts become boxes. cluster.hcl's 69 vertices
# drawn one by one gave 12 panels of 23 000 x 7 000 px that dot needed 2 minutes for; as 4
# hosts and a ToR they read at a glance. demo, dgx1, nvswitch (<= 18 vertices) stay whole.
AGGREGATE_OVER = 48
# 12 panels of a few inches each keep a picture under ~6000 px wide at dot's 96 dpi
MAX_TREE_PANELS = 11


def _rate(bps: float) -> str:
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} B/s"


def _q(name: str) -> str:
    return '"' + str(name).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _links(plan: Plan) -> dict[tuple[str, str], float]:
    caps: dict[tuple[str, str], float] = {}
    for l in plan.topology.links:
        caps[(l.src, l.dst)] = caps.get((l.src, l.dst), 0.0) + l.capacity
    return caps


def tree_edges(plan: Plan) -> list[tuple[int, str, str, float]]:
    """``(tree, u, v, rate)`` for every topology link a packed tree uses (hop by hop along
    ``Tree.paths``; a direct parent→child link when the tree records no path)."""
    out = []
    for t in plan.trees:
        for child, parent in enumerate(t.parent):
            if parent < 0:
                continue
            path = t.paths[child] if child < len(t.paths) and len(t.paths[child]) >= 2 else ()
            if not path:
                path = (plan.ranks[parent], plan.ranks[child])
            for u, v in zip(path, path[1:]):
                out.append((t.index, u, v, t.rate))
    return out


def _tree_label(plan: Plan, index: int, rate: float) -> str:
    """``T3 25 GB/s`` for packed trees; baselines (ring, double binary tree) carry no
    meaningful per-tree rate, so only their index."""
    if plan.algorithm.startswith("treepack"):
        return f"T{index} {_rate(rate)}"
    return f"T{index}"


# ---------------------------------------------------------------- scene
@dataclass
class _Vertex:
    label: str
    kind: str  # rank | node (not a rank of this plan) | switch | group
    host: str  # "" outside hosts (and for a group, which is a host itself)
    root: bool = False


@dataclass
class _Panel:
    title: str
    edges: dict[tuple[str, str], int]  # directed scene edge -> how many topology hops it stands for
    color: str
    root: str = ""  # scene id of the tree's root ("" for none)


@dataclass
class _Scene:
    title: str
    verts: dict[str, _Vertex]
    links: dict[tuple[str, str], tuple[float, int]]  # unordered pair (sorted) -> (capacity one way, count)
    cut: set[tuple[str, str]]  # unordered pairs holding a cut link
    cut_label: str
    cut_side: set[str] = field(default_factory=set)  # scene vertices holding the cut's side S
    panels: list[_Panel] = field(default_factory=list)
    aggregated: bool = False
    hidden_trees: int = 0


def _scene(plan: Plan) -> _Scene:
    topo = plan.topology
    ranks = set(plan.ranks)
    root_v = plan.ranks[plan.root] if 0 <= plan.root < len(plan.ranks) else ""
    nodes = set(topo.nodes)
    big = len(topo.vertices) > AGGREGATE_OVER and bool(topo.hosts)
    host = dict(topo.hosts)
    where: dict[str, str] = {}  # topology vertex -> scene id
    verts: dict[str, _Vertex] = {}
    if not big:
        for v in topo.vertices:
            kind = "switch" if v not in nodes else ("rank" if v in ranks else "node")
            where[v] = v
            verts[v] = _Vertex(v, kind, host.get(v, ""), root=v == root_v)
    else:
        members: dict[str, list[str]] = {}
        for v in topo.vertices:
            if host.get(v):
                members.setdefault(host[v], []).append(v)
        for h, vs in members.items():
            nr = sum(v in ranks for v in vs)
            label = f"{h}\n{nr} ranks" if nr else f"{h}\n{len(vs)} vertices"
            for v in vs:
                where[v] = h
            verts[h] = _Vertex(label, "group", "", root=root_v in vs)
            if root_v in vs:
                verts[h].label += f"\nroot {root_v}"
        # switches and nodes outside hosts: merge those reaching the same scene vertices
        nbrs: dict[str, set[str]] = {}
        for l in topo.links:
            nbrs.setdefault(l.src, set()).add(where.get(l.dst, l.dst))
            nbrs.setdefault(l.dst, set()).add(where.get(l.src, l.src))
        by_sig: dict[tuple, list[str]] = {}
        for v in topo.vertices:
            if v not in where:
                by_sig.setdefault((v in nodes, frozenset(nbrs.get(v, ()))), []).append(v)
        for (is_node, _), vs in by_sig.items():
            sid = vs[0] if len(vs) == 1 else f"{vs[0]}..{vs[-1]}"
            label = vs[0] if len(vs) == 1 else f"{len(vs)} {'nodes' if is_node else 'switches'}\n{vs[0]} .. {vs[-1]}"
            for v in vs:
                where[v] = sid
            kind = ("rank" if vs[0] in ranks else "node") if is_node else "switch"
            verts[sid] = _Vertex(label, kind if len(vs) == 1 else "group", "", root=root_v in vs)
    links: dict[tuple[str, str], tuple[float, int]] = {}
    caps = _links(plan)
    for (u, v), c in caps.items():
        a, b = where[u], where[v]
        if a == b:
            continue
        key = (a, b) if a < b else (b, a)
        if u < v or (v, u) not in caps:  # a full-duplex pair counts once
            cap, n = links.get(key, (0.0, 0))
            links[key] = (cap + c, n + 1)
    f = plan.figures
    cut = set()
    for u, v in f.cut_links:
        if u in where and v in where and where[u] != where[v]:
            a, b = where[u], where[v]
            cut.add((a, b) if a < b else (b, a))
    cut_label = ""
    if f.cut_links:
        cut_label = (f"bottleneck cut: {len(f.cut_links)} links {'into' if f.cut_direction == 'in' else 'out of'} "
                     f"S (shaded, {len(f.cut_vertices)} vertices), {_rate(f.cut_capacity_Bps)}; bound {_rate(f.bound_rate_Bps)}")
    inside = sorted({where[u] for u, v in f.cut_links if u in where and where.get(v) == where[u]})
    if big and inside:  # a cut within a host box has no edge of its own to colour
        cut_label += ("\ncut links inside the box " if len(inside) == 1 else f"\ncut links inside {len(inside)} boxes: ") + ", ".join(inside[:4]) + \
            (" ..." if len(inside) > 4 else "")
    title = f"{plan.name}: {plan.kind} on {topo.name}, {plan.algorithm}, {len(plan.trees)} trees"
    if f.predicted_s > 0:
        title += f"\nrate {_rate(f.rate_Bps)}, bound {_rate(f.bound_rate_Bps)}, efficiency {f.efficiency:.2f}"
    scene = _Scene(title, verts, links, cut, cut_label, aggregated=big)
    scene.cut_side = {where[v] for v in f.cut_vertices if v in where}
    per_tree: dict[int, dict[tuple[str, str], int]] = {}
    for t, u, v, _ in tree_edges(plan):
        a, b = where[u], where[v]
        if a != b:
            e = per_tree.setdefault(t, {})
            e[(a, b)] = e.get((a, b), 0) + 1
    shown = plan.trees[:MAX_TREE_PANELS]
    scene.hidden_trees = len(plan.trees) - len(shown)
    for t in shown:
        r = plan.ranks[t.root] if 0 <= t.root < len(plan.ranks) else ""
        depth = t.depth()
        title = f"{_tree_label(plan, t.index, t.rate)}, root {r}, depth {depth}"
        scene.panels.append(_Panel(title, per_tree.get(t.index, {}), PALETTE[t.index % len(PALETTE)], where.get(r, "")))
    return scene


# ---------------------------------------------------------------- DOT
def _dot_panel(lines: list[str], scene: _Scene, k: int, title: str, used: set[str] | None,
               root: str | None = None) -> None:
    """``root``: the vertex ringed in this panel (a tree's root); None: the plan's root."""
    """One panel: a cluster holding a cluster per host; node ids ``p<k>:<vertex>``."""
    lines.append(f"  subgraph {_q(f'cluster_panel{k}')} {{")
    lines.append(f'    label={_q(title)}; style="rounded"; color="#999999"; fontsize=11;')
    lines.append(f"    {_q(f'p{k}:_top')} [style=invis, shape=point, width=0, label=\"\"];")
    by_host: dict[str, list[str]] = {}
    for sid, vx in scene.verts.items():
        if used is None or sid in used:
            by_host.setdefault(vx.host, []).append(sid)
    for h, sids in by_host.items():
        ind = "    "
        if h:
            lines.append(f"    subgraph {_q(f'cluster_panel{k}_host_{h}')} {{")
            lines.append(f'      label={_q(h)}; style="rounded,filled"; fillcolor="#f4f4f4"; color="#aaaaaa";')
            ind = "      "
        for sid in sids:
            vx = scene.verts[sid]
            ringed = vx.root if root is None else sid == root
            label = vx.label + ("\n(root)" if ringed and vx.kind != "group" else "")
            attrs = {
                "rank": 'shape=ellipse, style="filled", fillcolor="#dde8f7"',
                "node": 'shape=ellipse, style="dashed"',
                "switch": 'shape=box, style="filled", fillcolor="#eeeeee"',
                "group": 'shape=box3d, style="filled", fillcolor="#dde8f7"',
            }[vx.kind]
            if k == 0 and sid in scene.cut_side:
                attrs = attrs.replace('fillcolor="#dde8f7"', 'fillcolor="#f9d0cc"').replace('fillcolor="#eeeeee"', 'fillcolor="#f9d0cc"')
            if ringed:
                attrs += ', peripheries=2, penwidth=2, color="#000000"'
            lines.append(f"{ind}{_q(f'p{k}:{sid}')} [label={_q(label)}, {attrs}];")
        if h:
            lines.append("    }")
    lines.append("  }")


def to_dot(plan: Plan) -> str:
    """The plan as Graphviz DOT text: a topology panel with the bottleneck cut, then one
    panel per tree; each host a cluster."""
    scene = _scene(plan)
    title = scene.title + (f"\n{scene.hidden_trees} more trees not drawn" if scene.hidden_trees else "")
    lines = [f"digraph {_q(plan.name)} {{",
             f"  label={_q(title)}; labelloc=t; fontname=\"Helvetica\"; compound=true; newrank=true;",
             '  node [fontname="Helvetica", fontsize=10, margin="0.05,0.03"]; '
             'edge [fontname="Helvetica", fontsize=8];']
    # panel 0: the topology, every link grey except the cut's, red and labelled
    _dot_panel(lines, scene, 0, "topology" + ("\n" + scene.cut_label if scene.cut_label else ""), None)
    for (a, b), (cap, n) in sorted(scene.links.items()):
        lab = _rate(cap) if n == 1 else f"{n} links, {_rate(cap)}"
        if (a, b) in scene.cut:
            lines.append(f"  {_q(f'p0:{a}')} -> {_q(f'p0:{b}')} [dir=none, color={_q(CUT_COLOR)}, penwidth=3, "
                         f"label={_q('cut ' + lab)}, fontcolor={_q(CUT_COLOR)}];")
        else:
            lines.append(f"  {_q(f'p0:{a}')} -> {_q(f'p0:{b}')} [dir=none, color=\"#bbbbbb\", label={_q(lab)}, "
                         f"fontcolor=\"#888888\"];")
    for k, p in enumerate(scene.panels, 1):
        used = {x for e in p.edges for x in e} | ({p.root} if p.root else set())
        _dot_panel(lines, scene, k, p.title, used, root=p.root)
        for (a, b), n in sorted(p.edges.items()):
            extra = f", label={_q(f'{n} hops')}" if n > 1 else ""
            lines.append(f"  {_q(f'p{k}:{a}')} -> {_q(f'p{k}:{b}')} [color={_q(p.color)}, penwidth=2{extra}];")
    # a grid of panels: invisible edges from every vertex of a panel to the top of the panel
    # below it (dot keeps clusters apart, so without them 12 panels make one row 30 000 px wide)
    # aggregated: left to right, so 32 racks make a column, and the panels one row ("below"
    # the previous panel is then "right of" it)
    if scene.aggregated:  # here cols = panels stacked per column: about square overall
        import math

        hosts = sum(v.kind == "group" for v in scene.verts.values())
        cols = max(1, round(math.sqrt(3 * (len(scene.panels) + 1) / max(1, hosts))))
    else:
        cols = 2 if len(scene.verts) > 30 else 3
    if scene.aggregated:
        lines.insert(3, "  rankdir=LR; ranksep=1.2;")
    drawn = [[sid for sid in scene.verts]] + [
        sorted({x for e in p.edges for x in e} | ({p.root} if p.root else set())) for p in scene.panels]
    for k in range(cols, len(drawn)):
        for sid in drawn[k]:
            lines.append(f"  {_q(f'p{k}:_top')} -> {_q(f'p{k}:{sid}')} [style=invis, weight=0];")
        for sid in drawn[k - cols] or ["_top"]:
            lines.append(f"  {_q(f'p{k - cols}:{sid}')} -> {_q(f'p{k}:_top')} [style=invis, weight=0];")
    # a stable order: the hosts of the topology panel in their declared order (dot's
    # crossing minimisation otherwise may swap them: a two-server plan drew s1 left of s0),
    # through the panel's top with ``ordering=out`` (its out-edges' heads left to right as
    # written; a flat edge between the hosts' first vertices is not kept across clusters);
    # and the panels of a row left to right in their order (topology, tree 0, tree 1, ...):
    # a flat invisible edge between two vertices of one rank is drawn left to right
    # (not for the aggregated drawing: under rankdir=LR dot 2.43 kept neither order)
    if not scene.aggregated:
        firsts: dict[str, str] = {}
        for sid, vx in scene.verts.items():
            if vx.host:
                firsts.setdefault(vx.host, sid)
        if len(firsts) > 1:
            lines.append(f"  {_q('p0:_top')} [ordering=out];")
            for sid in firsts.values():
                lines.append(f"  {_q('p0:_top')} -> {_q(f'p0:{sid}')} [style=invis];")
        for start in range(0, len(drawn), cols):
            row = [f"p{k}:_top" for k in range(start, min(start + cols, len(drawn)))]
            if len(row) > 1:
                lines.append("  {rank=same; " + " ".join(_q(i) for i in row) + "}")
                for a, b in zip(row, row[1:]):
                    lines.append(f"  {_q(a)} -> {_q(b)} [style=invis];")
    if not scene.panels:
        _dot_traffic(lines, plan)
    lines.append("}")
    return "\n".join(lines) + "\n"


# 24 ranks: a 25 x 25 table of short numbers stays about as wide as a topology panel
TRAFFIC_MAX_RANKS = 24


def traffic(plan: Plan) -> dict[tuple[int, int], int]:
    """Bytes each rank sends each other rank in the plan's programs (elements x itemsize,
    before any compression): the phase a tree-less plan (alltoall, direct) is made of."""
    out: dict[tuple[int, int], int] = {}
    for r, prog in enumerate(plan.programs):
        for op in prog:
            if type(op).__name__ == "Send":
                out[(r, op.peer)] = out.get((r, op.peer), 0) + op.src.count * plan.itemsize
    return out


def _dot_traffic(lines: list[str], plan: Plan) -> None:
    """A panel with the rank-to-rank traffic matrix (an HTML-like table), darker = more bytes."""
    n = plan.n
    k = 1
    lines.append(f"  subgraph {_q(f'cluster_panel{k}')} {{")
    if n > TRAFFIC_MAX_RANKS:
        lines.append(f'    label={_q(f"no trees; {n} ranks: traffic matrix not drawn (over {TRAFFIC_MAX_RANKS})")};')
        lines.append(f"    {_q(f'p{k}:_top')} [style=invis, shape=point, width=0, label=\"\"];")
        lines.append("  }")
        return
    m = traffic(plan)
    top = max(m.values(), default=0)
    unit, scale = next(((u, sc) for u, sc in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if top >= sc), ("B", 1))
    lines.append(f'    label={_q(f"no trees: {plan.algorithm} transfers, {unit} sent (row) to (column)")}; '
                 'style="rounded"; color="#999999"; fontsize=11;')
    rows = ['<TR><TD></TD>' + "".join(f"<TD><B>{c}</B></TD>" for c in range(n)) + "</TR>"]
    for r in range(n):
        cells = []
        for c in range(n):
            b = m.get((r, c), 0)
            shade = int(255 - 140 * b / top) if top and b else 255
            fill = f"#{shade:02x}{shade:02x}ff" if b else "#ffffff"
            cells.append(f'<TD BGCOLOR="{fill}">{b / scale:.3g}</TD>' if b else "<TD></TD>")
        rows.append(f"<TR><TD><B>{r}</B></TD>{''.join(cells)}</TR>")
    names = ", ".join(f"{i}={v}" for i, v in enumerate(plan.ranks))
    table = ('<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">' + "".join(rows) +
             f'<TR><TD COLSPAN="{n + 1}"><FONT POINT-SIZE="8">{_html(names)}</FONT></TD></TR></TABLE>')
    lines.append(f"    {_q(f'p{k}:traffic')} [shape=plain, fontsize=9, label=<{table}>];")
    lines.append("  }")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------- PNG / SVG
def draw(plan: Plan, path: str | os.PathLike, fmt: str | None = None, *, engine: str | None = None) -> None:
    """Draw the plan to ``path`` (PNG or SVG), atomically. ``engine``: ``dot`` (Graphviz, the
    default when ``dot`` is on PATH) or ``matplotlib`` (the fallback)."""
    from .files import atomic_write_bytes

    fmt = fmt or Path(path).suffix.lstrip(".") or "png"
    if engine is None:
        engine = "dot" if shutil.which("dot") else "matplotlib"
    if engine == "dot":
        # 120 s: fattree1024's scene (33 boxes) renders in well under a second; a bound, not a target
        r = subprocess.run(["dot", f"-T{fmt}"], input=to_dot(plan).encode(), capture_output=True, timeout=120)
        if r.returncode != 0:
            raise VizError(f"dot -T{fmt} failed: {r.stderr.decode(errors='replace')[:500]}")
        atomic_write_bytes(path, r.stdout)
        return
    atomic_write_bytes(path, _draw_matplotlib(plan, fmt))


def _layout(scene: _Scene, used: set[str] | None = None) -> dict[str, tuple[float, float]]:
    """Positions for the matplotlib fallback: each host's vertices on a small circle, hosts on
    a grid; vertices outside hosts on a row above the hosts (switches: spines, a ToR)."""
    import math

    hosts: dict[str, list[str]] = {}
    for sid, vx in scene.verts.items():
        if used is None or sid in used:
            hosts.setdefault(vx.host, []).append(sid)
    pos: dict[str, tuple[float, float]] = {}
    named = [h for h in hosts if h]
    cols = max(1, math.ceil(math.sqrt(len(named)))) if named else 1
    for k, h in enumerate(named):
        cx, cy = 3.8 * (k % cols), -3.8 * (k // cols)
        vs = hosts[h]
        for i, v in enumerate(vs):
            a = math.pi / 2 - 2 * math.pi * i / max(1, len(vs))
            r = 0.0 if len(vs) == 1 else 1.0
            pos[v] = (cx + r * math.cos(a), cy + r * math.sin(a))
    free = hosts.get("", [])
    if named:
        width = 3.8 * (cols - 1)
        for i, v in enumerate(free):
            pos[v] = (width * (i + 0.5) / max(1, len(free)) if len(free) > 1 else width / 2, 2.6)
    else:  # no hosts drawn as boxes: switches in the middle, the rest on a circle around them
        hubs = [v for v in free if scene.verts[v].kind == "switch" or
                (scene.verts[v].kind == "group" and "switches" in scene.verts[v].label)]
        outer = [v for v in free if v not in hubs]
        radius = max(2.0, 0.4 * len(outer))  # ~0.6 units of arc per vertex keeps labels apart
        for ring, r in ((outer, radius), (hubs, 0.0 if len(hubs) == 1 else 0.6)):
            for i, v in enumerate(ring):
                a = math.pi / 2 - 2 * math.pi * i / max(1, len(ring))
                pos[v] = (r * math.cos(a), r * math.sin(a))
    return pos


def _draw_matplotlib(plan: Plan, fmt: str) -> bytes:
    import io
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    scene = _scene(plan)
    n = 1 + len(scene.panels)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.4 * rows + 0.6), squeeze=False)
    pos = _layout(scene)

    def verts(ax, used, shade=False, root=None):
        for h in {scene.verts[s].host for s in used} - {""}:
            xs = [pos[s][0] for s in used if scene.verts[s].host == h]
            ys = [pos[s][1] for s in used if scene.verts[s].host == h]
            ax.add_patch(FancyBboxPatch((min(xs) - 0.5, min(ys) - 0.5), max(xs) - min(xs) + 1.0,
                                        max(ys) - min(ys) + 1.0, boxstyle="round,pad=0.1",
                                        fc="#f4f4f4", ec="#aaaaaa", zorder=0))
            ax.text(min(xs) - 0.5, max(ys) + 0.7, h, fontsize=8, color="#555555", zorder=5)
        for s in used:
            vx = scene.verts[s]
            x, y = pos[s]
            marker = "s" if vx.kind in ("switch", "group") else "o"
            fc = "#eeeeee" if vx.kind == "switch" else ("white" if vx.kind == "node" else "#dde8f7")
            if shade and s in scene.cut_side:
                fc = "#f9d0cc"
            ringed = vx.root if root is None else s == root
            ax.scatter([x], [y], s=260, marker=marker, color=fc, edgecolors="black",
                       linewidths=2.5 if ringed else 0.8, zorder=3)
            label = vx.label + ("\n(root)" if ringed and vx.kind != "group" else "")
            ax.annotate(label, (x, y), xytext=(0, -13), textcoords="offset points", ha="center", va="top",
                        fontsize=6, zorder=4)

    ax = axes[0][0]
    for (a, b), (cap, _) in scene.links.items():
        (x0, y0), (x1, y1) = pos[a], pos[b]
        cut = (a, b) in scene.cut
        ax.plot([x0, x1], [y0, y1], color=CUT_COLOR if cut else "#c8c8c8", lw=2.5 if cut else 0.8, zorder=1)
    verts(ax, list(scene.verts), shade=True)
    ax.set_title("topology" + ("\n" + scene.cut_label.replace("; ", "\n") if scene.cut_label else ""), fontsize=8,
                 color=CUT_COLOR if scene.cut_label else "black")
    for k, p in enumerate(scene.panels, 1):
        ax = axes[k // cols][k % cols]
        used = {x for e in p.edges for x in e} | ({p.root} if p.root else set())
        for (a, b) in p.edges:
            ax.annotate("", xy=pos[b], xytext=pos[a], zorder=2,
                        arrowprops=dict(arrowstyle="-|>", color=p.color, lw=1.6, shrinkA=8, shrinkB=8))
        verts(ax, [s for s in scene.verts if s in used], root=p.root)
        ax.set_title(p.title, fontsize=8, color=p.color)
    for row in axes:
        for ax in row:
            ax.set_aspect("equal")
            ax.axis("off")
            ax.margins(0.15)
    title = scene.title + (f"\n{scene.hidden_trees} more trees not drawn" if scene.hidden_trees else "")
    fig.suptitle(title, fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=110, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return buf.getvalue()


# ---------------------------------------------------------------- trace
def _lanes(items: list[tuple[float, float, int]]) -> dict[int, int]:
    """Greedy interval partitioning: ``(start, end, id)`` -> lane, no two overlapping slices in
    one lane; a slice reuses the lowest lane free at its start."""
    free_at: list[float] = []
    out: dict[int, int] = {}
    for start, end, i in sorted(items):
        for lane, t in enumerate(free_at):
            if t <= start:
                free_at[lane] = end
                out[i] = lane
                break
        else:
            out[i] = len(free_at)
            free_at.append(end)
    return out


def _hop_chains(plan: Plan, events) -> list[list[int]]:
    """The events of each message, hop after hop: the simulator records one event per link of
    a message's path; chain the events of one (src, dst, tree, chunk) whose links continue
    each other, in start order."""
    groups: dict[tuple, list[int]] = {}
    for i, ev in enumerate(events):
        groups.setdefault((ev.src, ev.dst, ev.tree, ev.chunk), []).append(i)
    chains: list[list[int]] = []
    for (src, _, _, _), idx in groups.items():
        idx.sort(key=lambda i: (events[i].start, events[i].end))
        open_: list[list[int]] = []
        for i in idx:
            ev = events[i]
            home = next((c for c in open_ if events[c[-1]].link[1] == ev.link[0]
                         and events[c[-1]].link[1] != plan.ranks[ev.dst]), None)
            if home is None or ev.link[0] == plan.ranks[src]:
                home = []
                open_.append(home)
                chains.append(home)
            home.append(i)
    return chains


def to_trace(plan: Plan, simulation) -> dict:
    """Chrome/Perfetto trace-event JSON (as a dict) of a simulation with ``detail=True``:
    ``simulation`` has ``events`` (each with ``src, dst, link, tree, chunk, bytes, start,
    end``), ``time`` and ``messages`` — the compiler's ``Simulation``."""
    evs = list(simulation.events)
    if not evs and simulation.messages:
        raise ArgumentValueError("to_trace needs a simulation run with detail=True (it has no events)")
    out: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                        "args": {"name": f"links: {plan.name} ({plan.kind}, {plan.algorithm}), predicted"}},
                       {"name": "process_sort_index", "ph": "M", "pid": 1, "tid": 0, "args": {"sort_index": 0}}]
    order = sorted(range(len(evs)), key=lambda i: (evs[i].start, evs[i].end, evs[i].link))

    def label(ev) -> str:
        return f"T{ev.tree} c{ev.chunk}" if ev.tree >= 0 else f"r{ev.src}->r{ev.dst} c{ev.chunk}"

    def slice_(ev, pid, tid, seq) -> dict:
        return {"name": label(ev), "cat": f"tree{ev.tree}", "ph": "X", "pid": pid, "tid": tid,
                "ts": ev.start * 1e6, "dur": max(ev.end - ev.start, 0.0) * 1e6,
                "args": {"src_rank": ev.src, "dst_rank": ev.dst, "link": f"{ev.link[0]} -> {ev.link[1]}",
                         "bytes": ev.bytes, "tree": ev.tree, "chunk": ev.chunk, "seq": seq}}

    # links: one lane per concurrent transfer
    by_link: dict[tuple[str, str], list[int]] = {}
    for i in order:
        by_link.setdefault(tuple(evs[i].link), []).append(i)
    where: dict[int, tuple[int, int]] = {}  # event -> (pid, tid) of its link slice
    tid = 0
    for l in sorted(by_link):
        lanes = _lanes([(evs[i].start, evs[i].end, i) for i in by_link[l]])
        base = tid + 1
        for lane in range(max(lanes.values()) + 1):
            name = f"{l[0]} -> {l[1]}" + (f" #{lane + 1}" if lane else "")
            out.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": base + lane, "args": {"name": name}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": base + lane,
                        "args": {"sort_index": base + lane}})
        tid = base + max(lanes.values())
        for seq, i in enumerate(by_link[l]):
            where[i] = (1, base + lanes[i])
            out.append(slice_(evs[i], 1, base + lanes[i], seq))
    # ranks: a process each; a send lane set (first hop of a message) and a receive lane set
    chains = _hop_chains(plan, evs)
    per_rank: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
    msg_of: dict[int, tuple[float, float, int]] = {}
    for c, chain in enumerate(chains):
        first, last = evs[chain[0]], evs[chain[-1]]
        msg_of[c] = (first.start, max(evs[i].end for i in chain), c)
        per_rank.setdefault((first.src, "send"), []).append(msg_of[c])
        per_rank.setdefault((first.dst, "recv"), []).append(msg_of[c])
    for r in sorted({r for r, _ in per_rank}):
        pid = 2 + r
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": f"rank {r} ({plan.ranks[r] if r < len(plan.ranks) else '?'})"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        t0 = 0
        for what in ("send", "recv"):
            items = per_rank.get((r, what), [])
            if not items:
                continue
            lanes = _lanes(items)
            for lane in range(max(lanes.values()) + 1):
                out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t0 + lane + 1,
                            "args": {"name": what + (f" #{lane + 1}" if lane else "")}})
            for start, end, c in sorted(items):
                ev = evs[chains[c][0]]
                s = slice_(ev, pid, t0 + lanes[c] + 1, c)
                s["name"] = ("send " if what == "send" else "recv ") + label(ev)
                s["ts"], s["dur"] = start * 1e6, max(end - start, 0.0) * 1e6
                s["args"].pop("link")
                out.append(s)
            t0 += max(lanes.values()) + 1
    # flows: hop to hop within a message, and from a chunk's arrival at a rank to the
    # messages that rank sends on with the same tree and chunk
    flow = 0

    def arrow(a: int, b: int) -> None:
        nonlocal flow
        flow += 1
        (pa, ta), (pb, tb) = where[a], where[b]
        out.append({"name": "chunk", "cat": "flow", "ph": "s", "id": flow, "pid": pa, "tid": ta,
                    "ts": evs[a].start * 1e6})
        out.append({"name": "chunk", "cat": "flow", "ph": "f", "bp": "e", "id": flow, "pid": pb, "tid": tb,
                    "ts": evs[b].start * 1e6})

    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            arrow(a, b)
    arrivals: dict[tuple[int, int, int], list[int]] = {}  # (rank, tree, chunk) -> last hops into it
    for chain in chains:
        ev = evs[chain[-1]]
        if ev.tree >= 0:
            arrivals.setdefault((ev.dst, ev.tree, ev.chunk), []).append(chain[-1])
    for chain in chains:
        ev = evs[chain[0]]
        came = [i for i in arrivals.get((ev.src, ev.tree, ev.chunk), ()) if evs[i].end <= ev.start + 1e-12]
        if came:
            arrow(max(came, key=lambda i: evs[i].end), chain[0])
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"plan": plan.name, "predicted_s": simulation.time, "messages": simulation.messages}}


# ---------------------------------------------------------------- measured trace
# pids of a measured trace: rank r measured at MEASURED_PID + r, its prediction beside it
MEASURED_PID = 2
PREDICTED_PID = 100000


def _op_index(program) -> dict[tuple[str, int, int], int]:
    """``(kind, peer, tag) -> op`` of one rank's program (a plan has one transfer op per key)."""
    from .plan import Send

    out: dict[tuple[str, int, int], int] = {}
    for k, op in enumerate(program):
        if hasattr(op, "peer"):
            out["send" if isinstance(op, Send) else "recv", op.peer, op.tag] = k
    return out


def measured_slices(plan: Plan, records: list[dict], step: int = 0) -> list[dict]:
    """The transfers of one measured run, one dict per op of every rank's program:
    ``rank, op, kind, peer, tag, tree, chunk, bytes, start, end`` (seconds on the ranks'
    shared monotonic clock). ``records[r]`` is rank r's ``{"events": [(kind, peer, tag,
    posted, done), ...]}`` (backends/tracing.py). A send runs from its post to its completion;
    a receive from the later of its post and its matching send's post (the bytes cannot move
    earlier; every receive is posted when its dependencies are met, often long before) to its
    completion. Raises :class:`ArgumentValueError` when an event matches no op."""
    programs = plan.programs_at(step)
    posted: dict[tuple[int, int, int], float] = {}  # (src, dst, tag) -> the send's post
    rows: list[dict] = []
    for r, rec in enumerate(records):
        index = _op_index(programs[r])
        for kind, peer, tag, t0, t1 in rec["events"]:
            k = index.get((kind, int(peer), int(tag)))
            if k is None:
                raise ArgumentValueError(f"rank {r}: measured {kind} with rank {peer} tag {tag} is no op of the plan")
            op = programs[r][k]
            ref = op.src if kind == "send" else op.dst
            rows.append({"rank": r, "op": k, "kind": kind, "peer": int(peer), "tag": int(tag), "tree": op.tree,
                         "chunk": op.chunk, "elems": ref.count, "start": float(t0), "end": float(t1)})
            if kind == "send":
                posted[r, int(peer), int(tag)] = float(t0)
    for row in rows:
        if row["kind"] == "recv":
            sent = posted.get((row["peer"], row["rank"], row["tag"]))
            if sent is not None:
                row["start"] = min(max(row["start"], sent), row["end"])
    return rows


def measured_trace(runs: list[tuple[Plan, list[dict], object | None]], origin: float | None = None) -> dict:
    """Chrome/Perfetto trace-event JSON of measured runs (``hcc run --trace``), on the axes of
    :func:`to_trace`: one process per rank (pid ``2 + r``, as the prediction's), with send and
    receive lanes (no two slices of a lane overlap), slices named as the prediction names them
    (``send T0 c3``), flows from each send to its matching receive and from a chunk's arrival
    at a rank to the sends that forward it. ``runs``: ``(plan, records, simulation)`` per
    collective, ``records`` as :func:`measured_slices` takes them plus ``start`` (the run's
    start on the same clock); ``simulation`` (``detail=True``) or None. Each prediction is
    drawn beside the measured ranks (pid ``100000 + 2 + r``, links at ``100001``), shifted
    to start when its measured run started. Time 0 is ``origin`` (default: the first run's
    start); microseconds, as the format defines."""
    out: list[dict] = []
    if not runs:
        return {"traceEvents": out, "displayTimeUnit": "ns"}
    if origin is None:
        origin = min(min(rec["start"] for rec in records) for _, records, _ in runs)
    per_lane: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
    slices: list[dict] = []
    names: dict[int, str] = {}
    summary = []
    for c, (plan, records, sim) in enumerate(runs):
        rows = measured_slices(plan, records)
        start = min(rec["start"] for rec in records)
        end = max(rec.get("end", start) for rec in records)
        summary.append({"plan": plan.name, "measured_s": end - start,
                        "predicted_s": getattr(sim, "time", None), "ops": len(rows)})
        for r in range(plan.n):
            names.setdefault(r, f"rank {r} ({plan.ranks[r]})")
        for row in rows:
            row["collective"] = c
            row["name"] = f"{row['kind']} " + (f"T{row['tree']} c{row['chunk']}" if row["tree"] >= 0 else
                                               (f"r{row['rank']}->r{row['peer']} c{row['chunk']}" if row["kind"] == "send"
                                                else f"r{row['peer']}->r{row['rank']} c{row['chunk']}"))
            row["bytes"] = row.pop("elems") * plan.itemsize
            i = len(slices)
            slices.append(row)
            per_lane.setdefault((row["rank"], row["kind"]), []).append((row["start"], row["end"], i))
        if sim is not None:
            shift = (start - origin) * 1e6
            pred = to_trace(plan, sim)["traceEvents"]
            for ev in pred:
                ev = dict(ev)
                own = ev["pid"]  # 1: the links; 2 + r: rank r
                ev["pid"] = PREDICTED_PID + own
                if ev.get("name") == "process_name" and own >= 2:
                    ev["args"] = {"name": ev["args"]["name"] + " predicted"}
                if ev.get("name") == "process_sort_index":
                    ev["args"] = {"sort_index": 2 * (own - 2) + 3 if own >= 2 else 1_000_000}
                if "ts" in ev:
                    ev["ts"] = ev["ts"] + shift
                if ev.get("ph") in ("s", "f"):
                    ev["id"] = f"p{c}-{ev['id']}"
                if ev.get("name") == "process_name" and own == 1 and len(runs) > 1:
                    ev["args"] = {"name": "links, predicted"}
                out.append(ev)
    where: dict[int, tuple[int, int]] = {}
    for r in sorted(names):
        pid = MEASURED_PID + r
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": names[r] + " measured"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": 2 * r + 2}})
        t0 = 0
        for what in ("send", "recv"):
            items = per_lane.get((r, what), [])
            if not items:
                continue
            lanes = _lanes(items)
            for lane in range(max(lanes.values()) + 1):
                out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t0 + lane + 1,
                            "args": {"name": what + (f" #{lane + 1}" if lane else "")}})
            for _, _, i in items:
                where[i] = (pid, t0 + lanes[i] + 1)
            t0 += max(lanes.values()) + 1
    for i, row in enumerate(sorted(range(len(slices)), key=lambda i: (slices[i]["start"], slices[i]["end"]))):
        s = slices[row]
        pid, tid = where[row]
        out.append({"name": s["name"], "cat": f"tree{s['tree']}", "ph": "X", "pid": pid, "tid": tid,
                    "ts": (s["start"] - origin) * 1e6, "dur": max(s["end"] - s["start"], 0.0) * 1e6,
                    "args": {k: s[k] for k in ("collective", "rank", "peer", "op", "tag", "tree", "chunk", "bytes")}
                    | {"seq": i}})
    # flows: each send to its receive; each receive to the sends of the same (tree, chunk)
    # that its rank posted after it completed (the forwarding)
    flow = 0

    def arrow(a: int, b: int) -> None:
        nonlocal flow
        flow += 1
        for ph, i in (("s", a), ("f", b)):
            ev = {"name": "chunk", "cat": "flow", "ph": ph, "id": flow, "pid": where[i][0], "tid": where[i][1],
                  "ts": (slices[i]["start"] - origin) * 1e6}
            if ph == "f":
                ev["bp"] = "e"
            out.append(ev)

    recv_of = {(s["collective"], s["peer"], s["rank"], s["tag"]): i for i, s in enumerate(slices) if s["kind"] == "recv"}
    arrived: dict[tuple[int, int, int, int], list[int]] = {}
    for i, s in enumerate(slices):
        if s["kind"] == "recv" and s["tree"] >= 0:
            arrived.setdefault((s["collective"], s["rank"], s["tree"], s["chunk"]), []).append(i)
    for i, s in enumerate(slices):
        if s["kind"] != "send":
            continue
        j = recv_of.get((s["collective"], s["rank"], s["peer"], s["tag"]))
        if j is not None:
            arrow(i, j)
        came = [k for k in arrived.get((s["collective"], s["rank"], s["tree"], s["chunk"]), ())
                if slices[k]["end"] <= s["start"]]
        if came:
            arrow(max(came, key=lambda k: slices[k]["end"]), i)
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": {"measured": summary}}

