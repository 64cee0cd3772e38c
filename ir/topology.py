"""hcc.ir.topology — the network a plan runs on, as a frozen value.

Terms
- vertex: a name. A *node* is an endpoint that can own data (a GPU, a host CPU); a *switch*
  only forwards (NVSwitch, PCIe switch, ToR) and never owns data.
- link: one directed arc ``src -> dst`` with ``capacity`` in bytes/s and ``latency`` in
  seconds. ``a <-> b`` in the language is two links. Parallel links declared with ``x k`` are
  one Link whose capacity is already k times the class bandwidth; the same ordered pair
  declared twice gives two Links, and :meth:`Topology.graph` adds their capacities.
- host: an optional grouping name of a vertex (``h0`` for ``h0.gpu3``); "" when none.

The topology is the capacitated digraph of design.md ("The mathematics"): every bound, tree
packing and cost model in the compiler reads it through :meth:`Topology.graph`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # networkx is imported where it is used, so `hcc check` starts fast
    import networkx as nx


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    capacity: float  # bytes/s, parallel links already summed
    latency: float = 0.0  # seconds


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: tuple[str, ...]
    switches: tuple[str, ...] = ()
    links: tuple[Link, ...] = ()
    hosts: tuple[tuple[str, str], ...] = ()  # (vertex, host) pairs for vertices inside a host

    @property
    def vertices(self) -> tuple[str, ...]:
        return self.nodes + self.switches

    def host_of(self, vertex: str) -> str:
        return dict(self.hosts).get(vertex, "")

    def graph(self) -> "nx.DiGraph":
        """A fresh DiGraph: node attr ``switch`` (bool); edge attrs ``capacity`` (B/s, summed
        over parallel declarations) and ``latency`` (s, the largest declared)."""
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        for v in self.nodes:
            g.add_node(v, switch=False)
        for v in self.switches:
            g.add_node(v, switch=True)
        for l in self.links:
            if g.has_edge(l.src, l.dst):
                e = g[l.src][l.dst]
                e["capacity"] += l.capacity
                e["latency"] = max(e["latency"], l.latency)
            else:
                g.add_edge(l.src, l.dst, capacity=l.capacity, latency=l.latency)
        return g

    def transposed(self) -> "Topology":
        """Every link turned round (``a -> b`` becomes ``b -> a``, same capacity and latency),
        in the same order: in-trees to a vertex here are out-trees from it there.

        >>> Topology("t", ("a", "b"), links=(Link("a", "b", 2.0, 1e-6),)).transposed().links
        (Link(src='b', dst='a', capacity=2.0, latency=1e-06),)
        """
        return Topology(self.name, self.nodes, self.switches,
                        tuple(Link(l.dst, l.src, l.capacity, l.latency) for l in self.links), self.hosts)

    def restricted(self, ranks: tuple[str, ...]) -> "Topology":
        """The sub-topology a collective may use: its ranks and every switch, no other node
        (language.md: nodes outside ``ranks`` neither send, receive nor forward)."""
        keep = set(ranks) | set(self.switches)
        return Topology(
            name=self.name,
            nodes=tuple(v for v in self.nodes if v in keep),
            switches=self.switches,
            links=tuple(l for l in self.links if l.src in keep and l.dst in keep),
            hosts=tuple((v, h) for v, h in self.hosts if v in keep),
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "nodes": list(self.nodes),
            "switches": list(self.switches),
            "links": [[l.src, l.dst, l.capacity, l.latency] for l in self.links],
            "hosts": [list(p) for p in self.hosts],
        }

    @staticmethod
    def from_dict(d: dict) -> "Topology":
        return Topology(
            name=str(d["name"]),
            nodes=tuple(str(v) for v in d["nodes"]),
            switches=tuple(str(v) for v in d.get("switches", ())),
            links=tuple(Link(str(s), str(t), float(c), float(a)) for s, t, c, a in d["links"]),
            hosts=tuple((str(v), str(h)) for v, h in d.get("hosts", ())),
        )


def arc_tables(topo: Topology) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Per (src, dst) arc of ``topo.links``: the summed capacity of its links and their
    largest latency."""
    caps: dict[tuple[str, str], float] = {}
    lats: dict[tuple[str, str], float] = {}
    for l in topo.links:
        caps[(l.src, l.dst)] = caps.get((l.src, l.dst), 0.0) + l.capacity
        lats[(l.src, l.dst)] = max(lats.get((l.src, l.dst), 0.0), l.latency)
    return caps, lats


def reach(adj: dict[str, list[str]], start: str) -> set[str]:
    """The vertices ``start`` reaches over the adjacency ``adj`` (vertex -> its neighbours
    one way), itself included.

    >>> sorted(reach({"a": ["b"], "b": ["c"], "d": ["a"]}, "a"))
    ['a', 'b', 'c']
    """
    seen = {start}
    todo = [start]
    while todo:
        for w in adj.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen
