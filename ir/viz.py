"""hcc.ir.viz — pictures of a plan: the topology with its packed trees, and a timeline.

- :func:`to_dot`: Graphviz DOT text. Nodes are ellipses, switches boxes; each full-duplex
  pair of links is one grey undirected edge labelled with its capacity; every edge of a
  packed tree is a coloured arrow (one colour per tree) labelled with the tree's rate, routed
  along the tree's vertex path through switches.
- :func:`draw`: the same picture drawn with matplotlib (Agg backend, no screen) to PNG/SVG.
- :func:`to_trace`: Chrome / Perfetto trace-event JSON (load it in ui.perfetto.dev or
  chrome://tracing): one track (thread) per link, one complete event ("ph": "X") per chunk
  crossing that link, from the cost model's simulation (compiler/cost.py, ``detail=True``).
  Timestamps are microseconds, as the trace-event format defines them.
"""
from __future__ import annotations

import os
from pathlib import Path

from .plan import Plan

# 10 colours that stay distinct on white (matplotlib's tab10), cycled past 10 trees
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _rate(bps: float) -> str:
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} B/s"


def _q(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


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


def to_dot(plan: Plan) -> str:
    """The topology and the plan's trees as Graphviz DOT text."""
    topo = plan.topology
    ranks = set(plan.ranks)
    lines = [f"digraph {_q(plan.name)} {{",
             f'  label={_q(f"{plan.name}: {plan.kind} on {topo.name}, {plan.algorithm}, {len(plan.trees)} trees")};',
             "  labelloc=t; overlap=false; splines=true;",
             '  node [fontname="Helvetica", fontsize=10]; edge [fontname="Helvetica", fontsize=8];']
    for v in topo.nodes:
        style = "filled" if v in ranks else "dashed"
        fill = "#dde8f7" if v in ranks else "white"
        lines.append(f"  {_q(v)} [shape=ellipse, style={_q(style)}, fillcolor={_q(fill)}];")
    for v in topo.switches:
        lines.append(f'  {_q(v)} [shape=box, style="filled", fillcolor="#eeeeee"];')
    caps = _links(plan)
    seen = set()
    for (u, v), c in sorted(caps.items()):
        if (v, u) in caps and (v, u) in seen:
            continue
        seen.add((u, v))
        both = (v, u) in caps
        dirs = "none" if both else "forward"
        lines.append(f'  {_q(u)} -> {_q(v)} [color="#bbbbbb", dir={dirs}, label={_q(_rate(c))}, fontcolor="#999999"];')
    for t, u, v, rate in tree_edges(plan):
        color = PALETTE[t % len(PALETTE)]
        lines.append(f'  {_q(u)} -> {_q(v)} [color={_q(color)}, penwidth=2, '
                     f'label={_q(_tree_label(plan, t, rate))}, fontcolor={_q(color)}, constraint=false];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_trace(plan: Plan, simulation=None) -> dict:
    """Chrome/Perfetto trace-event JSON (as a dict) of every chunk transfer on every link."""
    from ..compiler.cost import simulate

    sim = simulation if simulation is not None and simulation.events else simulate(plan, detail=True)
    links = sorted({ev.link for ev in sim.events})
    tid = {l: i + 1 for i, l in enumerate(links)}
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
         "args": {"name": f"{plan.name} ({plan.kind}, {plan.algorithm}) links"}},
    ]
    for l, i in tid.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": f"{l[0]} -> {l[1]}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": i, "args": {"sort_index": i}})
    for ev in sim.events:
        label = f"T{ev.tree} c{ev.chunk}" if ev.tree >= 0 else f"r{ev.src}->r{ev.dst}"
        events.append({
            "name": label, "cat": f"tree{ev.tree}", "ph": "X", "pid": 1, "tid": tid[ev.link],
            "ts": ev.start * 1e6, "dur": max(ev.end - ev.start, 0.0) * 1e6,
            "args": {"src_rank": ev.src, "dst_rank": ev.dst, "bytes": ev.bytes, "tree": ev.tree, "chunk": ev.chunk},
        })
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"plan": plan.name, "predicted_s": sim.time, "messages": sim.messages}}


def _layout(plan: Plan) -> dict[str, tuple[float, float]]:
    """Positions: hosts on a big circle, each host's nodes on a small circle around its
    centre; a switch linked to most of a group's nodes (NVSwitch, leaf) sits at the centre,
    a switch linked to one or two nodes (a NIC) just outside them; the other switches
    (ToR, spines) in the middle. Without hosts, ranks on one circle."""
    import math

    topo = plan.topology
    nbrs: dict[str, set[str]] = {}
    for l in topo.links:
        nbrs.setdefault(l.src, set()).add(l.dst)
        nbrs.setdefault(l.dst, set()).add(l.src)
    hosts: dict[str, list[str]] = {}
    for v in topo.vertices:
        hosts.setdefault(topo.host_of(v), []).append(v)
    pos: dict[str, tuple[float, float]] = {}

    def ring(vs, cx, cy, r, phase=math.pi / 2):
        for i, v in enumerate(vs):
            a = phase - 2 * math.pi * i / max(1, len(vs))
            pos[v] = (cx + r * math.cos(a), cy + r * math.sin(a))

    def group(members, cx, cy, r):
        nodes = [v for v in members if v in set(topo.nodes)]
        sws = [v for v in members if v not in set(topo.nodes)]
        ring(nodes, cx, cy, r)
        hubs, rest = [], []
        for sw in sws:
            near = [v for v in nbrs.get(sw, ()) if v in pos and v in set(nodes)]
            if 0 < len(near) <= 2 and len(nodes) > 2:
                mx = sum(pos[v][0] for v in near) / len(near)
                my = sum(pos[v][1] for v in near) / len(near)
                pos[sw] = (cx + (mx - cx) * 1.35, cy + (my - cy) * 1.35)
            elif len(near) > 2 or not nodes:
                hubs.append(sw)
            else:
                rest.append(sw)
        ring(hubs + rest, cx, cy, 0.0 if len(hubs + rest) == 1 else 0.3 * r)

    named = [h for h in hosts if h]
    if not named:
        group(list(topo.vertices), 0.0, 0.0, 1.0)
        return pos
    big = 1.2 + 0.9 * len(named) if len(named) > 1 else 0.0
    for k, h in enumerate(named):
        a = math.pi / 2 - 2 * math.pi * k / len(named)
        group(hosts[h], big * math.cos(a), big * math.sin(a), 1.0)
    ring(hosts.get("", []), 0.0, 0.0, 0.0 if len(hosts.get("", [])) == 1 else 0.25 * big)
    return pos


def draw(plan: Plan, path: str | os.PathLike, fmt: str | None = None) -> None:
    """Draw the topology and the trees with matplotlib to ``path`` (PNG or SVG), atomically."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from .files import atomic_write_bytes

    fmt = fmt or Path(path).suffix.lstrip(".") or "png"
    topo = plan.topology
    pos = _layout(plan)
    ranks = set(plan.ranks)
    big = len(topo.vertices) > 40
    fig, ax = plt.subplots(figsize=(9, 9) if not big else (14, 14))
    caps = _links(plan)
    for (u, v) in caps:
        (x0, y0), (x1, y1) = pos[u], pos[v]
        ax.plot([x0, x1], [y0, y1], color="#d0d0d0", lw=0.6 if big else 1.2, zorder=1)
    # trees: curved arrows, each tree bent by its own amount so parallel tree edges stay apart
    handles = []
    for t in plan.trees:
        color = PALETTE[t.index % len(PALETTE)]
        handles.append(Line2D([0], [0], color=color, lw=2, label=_tree_label(plan, t.index, t.rate)))
    for t, u, v, rate in tree_edges(plan):
        color = PALETTE[t % len(PALETTE)]
        bend = 0.08 + 0.05 * (t % 6)
        ax.annotate("", xy=pos[v], xytext=pos[u], zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color=color, lw=0.8 if big else 1.6, alpha=0.85,
                                    shrinkA=7, shrinkB=7, connectionstyle=f"arc3,rad={bend}"))
    size = 60 if big else 500
    font = 5 if big else 8
    for v in topo.nodes:
        x, y = pos[v]
        ax.scatter([x], [y], s=size, marker="o", zorder=3,
                   color="#dde8f7" if v in ranks else "white", edgecolors="#333333")
        ax.annotate(v, (x, y), ha="center", va="center", fontsize=font, zorder=4)
    for v in topo.switches:
        x, y = pos[v]
        ax.scatter([x], [y], s=size * 1.4, marker="s", zorder=3, color="#eeeeee", edgecolors="#333333")
        ax.annotate(v, (x, y), ha="center", va="center", fontsize=font, zorder=4)
    f = plan.figures
    title = f"{plan.name}: {plan.kind} on {topo.name} — {plan.algorithm}, {len(plan.trees)} trees"
    if f.predicted_s > 0:
        title += f"\nrate {_rate(f.rate_Bps)}, bound {_rate(f.bound_rate_Bps)}, efficiency {f.efficiency:.3f}"
    ax.set_title(title, fontsize=10)
    if handles and len(handles) <= 16:
        ax.legend(handles=handles, loc="lower right", fontsize=7, frameon=False)
    ax.set_aspect("equal")
    ax.axis("off")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
