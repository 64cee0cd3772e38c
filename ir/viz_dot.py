"""hcc.ir.viz_dot — a plan's scene (:mod:`hcc.ir.viz_scene`) as Graphviz DOT text.

Terms:

- **panel body**: the DOT lines of one panel — a ``cluster_panel<k>`` subgraph holding one
  ``cluster`` per host, and the panel's edges; node ids are ``p<k>:<vertex>``, and every panel
  has an invisible ``p<k>:_top`` node that the grid constraints hang on.

Functions:

- :func:`to_dot`: the whole picture, every panel in one graph (``hcc viz --format dot``).
- :func:`panel_dots`: each panel as a graph of its own, for the renderer that lays each panel
  out alone and composes them in order (:mod:`hcc.ir.viz_draw`).
- :func:`traffic`: the rank-to-rank bytes of a plan without trees (drawn as a table).
"""
from __future__ import annotations

import math

from .plan import Plan
from .viz_scene import CUT_COLOR, _q, _rate, _Scene, _scene

__all__ = ["to_dot", "panel_dots", "traffic", "TRAFFIC_MAX_RANKS"]

_HEAD = ('  node [fontname="Helvetica", fontsize=10, margin="0.05,0.03"]; '
         'edge [fontname="Helvetica", fontsize=8];')


# ---------------------------------------------------------------- DOT
def _dot_panel(lines: list[str], scene: _Scene, k: int, title: str, used: set[str] | None,
               root: str | None = None, shade: set[str] = frozenset()) -> None:
    """One panel: a cluster holding a cluster per host; node ids ``p<k>:<vertex>``.
    ``root``: the vertex ringed in this panel (a tree's root); None: the plan's root.
    ``shade``: the vertices filled red (the cut's side S)."""
    lines.append(f"  subgraph {_q(f'cluster_panel{k}')} {{")
    lines.append(f'    label={_q(title)}; style="rounded"; color="#999999"; fontsize=11;')
    lines.append(f"    {_q(f'p{k}:_top')} [style=invis, shape=point, width=0, label=\"\"];")
    by_host: dict[str, list[str]] = {}
    ids = list(scene.verts) if used is None else [s for s in scene.verts if s in used] + \
        [s for s in scene.inner if s in used]
    for sid in ids:
        by_host.setdefault(scene.vertex(sid).host, []).append(sid)
    for h, sids in by_host.items():
        ind = "    "
        if h:
            lines.append(f"    subgraph {_q(f'cluster_panel{k}_host_{h}')} {{")
            lines.append(f'      label={_q(h)}; style="rounded,filled"; fillcolor="#f4f4f4"; color="#aaaaaa";')
            ind = "      "
        for sid in sids:
            vx = scene.vertex(sid)
            ringed = vx.root if root is None else sid == root
            label = vx.label + ("\n(root)" if ringed and vx.kind != "group" else "")
            attrs = {
                "rank": 'shape=ellipse, style="filled", fillcolor="#dde8f7"',
                "node": 'shape=ellipse, style="dashed"',
                "switch": 'shape=box, style="filled", fillcolor="#eeeeee"',
                "group": 'shape=box3d, style="filled", fillcolor="#dde8f7"',
            }[vx.kind]
            if sid in shade:
                attrs = attrs.replace('fillcolor="#dde8f7"', 'fillcolor="#f9d0cc"').replace('fillcolor="#eeeeee"', 'fillcolor="#f9d0cc"')
            if ringed:
                attrs += ', peripheries=2, penwidth=2, color="#000000"'
            lines.append(f"{ind}{_q(f'p{k}:{sid}')} [label={_q(label)}, {attrs}];")
        if h:
            lines.append("    }")
    lines.append("  }")


def _link_lines(k: int, links: dict[tuple[str, str], tuple[float, int]], cut: set[tuple[str, str]]) -> list[str]:
    """A panel's links: grey and labelled with their capacity, the cut's red."""
    lines = []
    for (a, b), (cap, n) in sorted(links.items()):
        lab = _rate(cap) if n == 1 else f"{n} links, {_rate(cap)}"
        if (a, b) in cut:
            lines.append(f"  {_q(f'p{k}:{a}')} -> {_q(f'p{k}:{b}')} [dir=none, color={_q(CUT_COLOR)}, penwidth=3, "
                         f"label={_q('cut ' + lab)}, fontcolor={_q(CUT_COLOR)}];")
        else:
            lines.append(f"  {_q(f'p{k}:{a}')} -> {_q(f'p{k}:{b}')} [dir=none, color=\"#bbbbbb\", label={_q(lab)}, "
                         f"fontcolor=\"#888888\"];")
    return lines


def _panel_body(scene: _Scene, k: int) -> list[str]:
    """Panel ``k``'s DOT lines (0: the topology, every link grey except the cut's, red and
    labelled; k >= 1: tree k - 1's edges in its colour)."""
    lines: list[str] = []
    if k == 0:
        _dot_panel(lines, scene, 0, "topology" + ("\n" + scene.cut_label if scene.cut_label else ""), None,
                   shade=scene.cut_side)
        return lines + _link_lines(k, scene.links, scene.cut)
    p = scene.panels[k - 1]
    if p.links is not None:
        _dot_panel(lines, scene, k, p.title, p.used(), root=p.root, shade=p.cut_side)
        return lines + _link_lines(k, p.links, p.cut)
    _dot_panel(lines, scene, k, p.title, p.used(), root=p.root)
    unit = "arcs" if p.arcs else "hops"
    for (a, b), n in sorted(p.edges.items()):
        extra = f", label={_q(f'{n} {unit}')}" if n > 1 else ""
        lines.append(f"  {_q(f'p{k}:{a}')} -> {_q(f'p{k}:{b}')} [color={_q(p.color)}, penwidth=2{extra}];")
    return lines


def _host_order(scene: _Scene) -> list[str]:
    """The hosts of the topology panel in their declared order (dot's crossing minimisation
    otherwise may swap them: a two-server plan drew s1 left of s0), through the panel's top
    with ``ordering=out`` (its out-edges' heads left to right as written; a flat edge between
    the hosts' first vertices is not kept across clusters)."""
    firsts: dict[str, str] = {}
    for sid, vx in scene.verts.items():
        if vx.host:
            firsts.setdefault(vx.host, sid)
    if len(firsts) < 2:
        return []
    return [f"  {_q('p0:_top')} [ordering=out];"] + \
        [f"  {_q('p0:_top')} -> {_q(f'p0:{sid}')} [style=invis];" for sid in firsts.values()]


def panel_dots(plan: Plan, scene: _Scene | None = None) -> list[str]:
    """Every panel of the plan's scene as a graph of its own, in order: the topology, then
    an aggregated plan's cut panel, each drawn tree (or the traffic table of a plan without
    trees). The aggregated topology and cut panels run left to right (32 racks make a column beside the spine box, not a row 3000 px
    wide)."""
    scene = scene or _scene(plan)
    out = []
    for k in range(len(scene.panels) + 1 + (not plan.trees)):
        lines = [f"digraph {_q(f'panel{k}')} {{", '  fontname="Helvetica";', _HEAD]
        if scene.aggregated and (k == 0 or (k <= len(scene.panels) and scene.panels[k - 1].links is not None)):
            lines.append("  rankdir=LR; ranksep=1.2;")
        if k == 0 and not scene.aggregated:
            lines += _host_order(scene)
        if k > len(scene.panels):  # a plan without trees: its traffic table last
            _dot_traffic(lines, plan, k)
        else:
            lines += _panel_body(scene, k)
        lines.append("}")
        out.append("\n".join(lines) + "\n")
    return out


def to_dot(plan: Plan) -> str:
    """The plan as Graphviz DOT text: a topology panel with the bottleneck cut, then one
    panel per tree; each host a cluster."""
    scene = _scene(plan)
    title = scene.title + (f"\n{scene.hidden_trees} more trees not drawn" if scene.hidden_trees else "")
    lines = [f"digraph {_q(plan.name)} {{",
             f"  label={_q(title)}; labelloc=t; fontname=\"Helvetica\"; compound=true; newrank=true;", _HEAD]
    for k in range(len(scene.panels) + 1):
        lines += _panel_body(scene, k)
    # a grid of panels: invisible edges from every vertex of a panel to the top of the panel
    # below it (dot keeps clusters apart, so without them 12 panels make one row 30 000 px wide)
    # aggregated: left to right, so 32 racks make a column, and the panels one row ("below"
    # the previous panel is then "right of" it)
    if scene.aggregated:  # here cols = panels stacked per column: about square overall
        hosts = sum(v.kind == "group" for v in scene.verts.values())
        cols = max(1, round(math.sqrt(3 * (len(scene.panels) + 1) / max(1, hosts))))
    else:
        cols = 2 if len(scene.verts) > 30 else 3
    if scene.aggregated:
        lines.insert(3, "  rankdir=LR; ranksep=1.2;")
    drawn = [list(scene.verts)] + [sorted(p.used()) for p in scene.panels]
    for k in range(cols, len(drawn)):
        for sid in drawn[k]:
            lines.append(f"  {_q(f'p{k}:_top')} -> {_q(f'p{k}:{sid}')} [style=invis, weight=0];")
        for sid in drawn[k - cols] or ["_top"]:
            lines.append(f"  {_q(f'p{k - cols}:{sid}')} -> {_q(f'p{k}:_top')} [style=invis, weight=0];")
    # a stable order: the hosts in declared order (_host_order); the panels of a row left to
    # right in their order (topology, tree 0, tree 1, ...): a flat invisible edge between two
    # vertices of one rank is drawn left to right (not for the aggregated drawing: under
    # rankdir=LR dot 2.43 kept neither order; hcc viz --format png lays each panel out alone)
    if not scene.aggregated:
        lines += _host_order(scene)
        for start in range(0, len(drawn), cols):
            row = [f"p{k}:_top" for k in range(start, min(start + cols, len(drawn)))]
            if len(row) > 1:
                lines.append("  {rank=same; " + " ".join(_q(i) for i in row) + "}")
                for a, b in zip(row, row[1:]):
                    lines.append(f"  {_q(a)} -> {_q(b)} [style=invis];")
    if not plan.trees:
        _dot_traffic(lines, plan, len(scene.panels) + 1)
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


def _dot_traffic(lines: list[str], plan: Plan, k: int) -> None:
    """Panel ``k``: the rank-to-rank traffic matrix (an HTML-like table), darker = more bytes."""
    n = plan.n
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

