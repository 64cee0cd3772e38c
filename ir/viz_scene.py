"""hcc.ir.viz_scene — what a picture of a plan shows, computed once for every renderer.

Terms:

- **scene**: the vertices, links and panels of a picture. A small plan shows every vertex; a
  plan of more than :data:`AGGREGATE_OVER` vertices (and hosts declared) is **aggregated**:
  each host (a rack, a server) is one box, and the switches outside hosts that reach the same
  hosts (a fat tree's spines) merge into one box, so 1024 ranks draw as 32 racks and a spine.
- **panel**: one small drawing. Panel 0 is the topology with the bottleneck cut — the links
  whose capacity sets the plan's bound rate (``Figures.cut_links``) — drawn thick red and
  labelled with that rate. An aggregated picture whose cut lies inside host boxes follows it
  with a **cut panel**: those hosts opened vertex by vertex, the cut's links red. Then one
  panel per packed tree, its root ringed. A small plan's
  tree panel draws the tree's links hop by hop (through switches). An aggregated plan's tree
  panel draws **arcs**, parent rank to child rank (the route through switches left out): the
  root's host and the next hosts of the tree, up to :data:`OPEN_HOST_MAX` ranks, are
  **opened** — their ranks drawn one by one inside their box, the **rank-level inset** — and
  every other host stays a box, so a tree that lives inside one host (a ring's
  closing arc) shows its ranks, not one box. More than :data:`MAX_TREE_PANELS` trees: the
  first ones are drawn and the title says how many are not.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .plan import Plan

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
# ranks a tree's panel draws one by one: one of fattree1024's racks (32 ranks) or two of
# cluster.hcl's servers (16) open; a panel of hundreds of ellipses would not read
OPEN_HOST_MAX = 40


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
    edges: dict[tuple[str, str], int]  # directed scene edge -> how many hops (or arcs) it stands for
    color: str
    root: str = ""  # scene id of the tree's root ("" for none)
    opened: tuple[str, ...] = ()  # hosts whose ranks this panel draws one by one (aggregated)
    arcs: bool = False  # edges are parent -> child arcs (aggregated), not topology hops
    # a panel of links (the aggregated picture's cut panel), drawn as the topology panel is
    links: dict[tuple[str, str], tuple[float, int]] | None = None
    cut: set[tuple[str, str]] = field(default_factory=set)
    cut_side: set[str] = field(default_factory=set)

    def used(self) -> set[str]:
        """The vertices this panel draws: its edges' (or links') ends and its root."""
        ends = {x for e in (self.links if self.links is not None else self.edges) for x in e}
        return ends | ({self.root} if self.root else set())


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
    inner: dict[str, _Vertex] = field(default_factory=dict)  # aggregated: every vertex of a host

    def vertex(self, sid: str) -> _Vertex:
        """A scene vertex or, for an opened host, one of its own vertices."""
        return self.verts[sid] if sid in self.verts else self.inner[sid]


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
    caps = _links(plan)
    links = _scene_links(caps, where)
    f = plan.figures
    cut = _scene_cut(f.cut_links, where)
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
    if big:
        for v, h in host.items():
            kind = "switch" if v not in nodes else ("rank" if v in ranks else "node")
            scene.inner[v] = _Vertex(v, kind, h, root=v == root_v)
        if inside:
            scene.panels.append(_cut_panel(plan, scene, caps, where, host, inside))
    shown = plan.trees[:MAX_TREE_PANELS]
    scene.hidden_trees = len(plan.trees) - len(shown)
    per_tree = {} if big else _hop_edges(plan, where)
    ranks_in: dict[str, int] = {}  # host -> how many of the plan's ranks it holds
    for v in plan.ranks:
        if host.get(v):
            ranks_in[host[v]] = ranks_in.get(host[v], 0) + 1
    for t in shown:
        r = plan.ranks[t.root] if 0 <= t.root < len(plan.ranks) else ""
        title = f"{_tree_label(plan, t.index, t.rate)}, root {r}, depth {t.depth()}"
        color = PALETTE[t.index % len(PALETTE)]
        if not big:
            scene.panels.append(_Panel(title, per_tree.get(t.index, {}), color, where.get(r, "")))
            continue
        opened = _opened(plan, t, host, ranks_in)
        edges: dict[tuple[str, str], int] = {}
        hidden = 0
        for child, parent in enumerate(t.parent):
            if parent < 0:
                continue
            u, v = plan.ranks[parent], plan.ranks[child]
            a = u if host.get(u) in opened else where[u]
            b = v if host.get(v) in opened else where[v]
            if a == b:
                hidden += 1
            else:
                edges[(a, b)] = edges.get((a, b), 0) + 1
        title += "\nparent -> child arcs" + (f" ({hidden} inside closed boxes)" if hidden else "")
        root = (r if host.get(r) in opened else where[r]) if r else ""
        scene.panels.append(_Panel(title, edges, color, root, opened=opened, arcs=True))
    return scene


def _opened(plan: Plan, tree, host: dict[str, str], ranks_in: dict[str, int]) -> tuple[str, ...]:
    """The hosts a tree's panel opens: the root's host, then the hosts of its ranks in tree
    order (breadth first from the root), while they hold at most :data:`OPEN_HOST_MAX` ranks
    together."""
    kids: dict[int, list[int]] = {}
    for c, p in enumerate(tree.parent):
        if p >= 0:
            kids.setdefault(p, []).append(c)
    order = [tree.root] if 0 <= tree.root < len(plan.ranks) else []
    for v in order:
        order.extend(kids.get(v, ()))
    out: list[str] = []
    budget = OPEN_HOST_MAX
    for v in order:
        h = host.get(plan.ranks[v], "")
        if h and h not in out:
            if ranks_in[h] > budget:
                break
            out.append(h)
            budget -= ranks_in[h]
    return tuple(out)


def _scene_links(caps: dict[tuple[str, str], float], where: dict[str, str],
                 keep=lambda a, b: True) -> dict[tuple[str, str], tuple[float, int]]:
    """Unordered scene pair -> (capacity one way, how many links) of the topology's links
    between different scene vertices (``where``) that ``keep`` accepts."""
    links: dict[tuple[str, str], tuple[float, int]] = {}
    for (u, v), c in caps.items():
        a, b = where[u], where[v]
        if a == b or not keep(a, b):
            continue
        key = (a, b) if a < b else (b, a)
        if u < v or (v, u) not in caps:  # a full-duplex pair counts once
            cap, n = links.get(key, (0.0, 0))
            links[key] = (cap + c, n + 1)
    return links


def _scene_cut(cut_links, where: dict[str, str]) -> set[tuple[str, str]]:
    out = set()
    for u, v in cut_links:
        if u in where and v in where and where[u] != where[v]:
            a, b = where[u], where[v]
            out.add((a, b) if a < b else (b, a))
    return out


def _cut_panel(plan: Plan, scene: _Scene, caps, where: dict[str, str], host: dict[str, str],
               inside: list[str]) -> _Panel:
    """The aggregated picture's second panel: the hosts that hold the bottleneck cut's links
    opened vertex by vertex (up to :data:`OPEN_HOST_MAX` vertices together), their links to
    the other boxes, the cut red — what the topology panel can only name in its title."""
    size: dict[str, int] = {}
    for v, h in host.items():
        size[h] = size.get(h, 0) + 1
    opened: list[str] = []
    budget = OPEN_HOST_MAX
    for h in inside:
        if size.get(h, budget + 1) <= budget:
            opened.append(h)
            budget -= size[h]
    at = {v: (v if host.get(v) in opened else s) for v, s in where.items()}
    mine = {v for v, s in at.items() if v == s and host.get(v) in opened}
    links = _scene_links(caps, at, keep=lambda a, b: a in mine or b in mine)
    f = plan.figures
    p = _Panel(f"the cut inside {', '.join(opened)}: {_rate(f.cut_capacity_Bps)}" +
               (f" ({len(inside) - len(opened)} more boxes hold cut links)" if len(inside) > len(opened) else ""),
               {}, CUT_COLOR, opened=tuple(opened), links=links, cut=_scene_cut(f.cut_links, at))
    p.cut_side = {at[v] for v in f.cut_vertices if v in at}
    root = plan.ranks[plan.root] if 0 <= plan.root < len(plan.ranks) else ""
    p.root = at[root] if root in mine else ""
    return p


def _hop_edges(plan: Plan, where: dict[str, str]) -> dict[int, dict[tuple[str, str], int]]:
    """Per tree: directed scene edge -> how many topology hops of the tree it stands for."""
    per_tree: dict[int, dict[tuple[str, str], int]] = {}
    for t, u, v, _ in tree_edges(plan):
        a, b = where[u], where[v]
        if a != b:
            e = per_tree.setdefault(t, {})
            e[(a, b)] = e.get((a, b), 0) + 1
    return per_tree

