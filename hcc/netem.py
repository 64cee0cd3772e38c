"""hcc.netem — a topology emulated on one Linux machine (network namespaces + tc).

Terms
- emulation: one topology built under a *name*; every object it makes carries the name, and a
  state file ``/run/hcc-netem/<name>.json`` (``HCC_NETEM_STATE_DIR`` overrides the folder)
  records all of it, so ``down`` removes exactly what ``up`` made and ``up`` refuses to build
  over an emulation that is already there.
- namespace: every vertex (node or switch) gets its own network namespace
  ``hcc-<name>-<vertex>``. Every namespace forwards (``ip_forward = 1``), so a switch is simply
  a namespace with no process in it, and a node may relay for others as a GPU relays over NVLink.
- address: each vertex owns one /32, ``10.77.x.y`` (index ``i`` -> ``10.77.0.0 + i + 1``), set on
  its loopback; every link end reuses that address with ``peer`` = the neighbour's /32
  (point-to-point addressing), so no subnet exists anywhere and nothing is visible from the
  root namespace: links are created with both ends directly inside their namespaces.
- link: one veth pair per unordered pair of adjacent vertices. Each direction declared in the
  topology is shaped on the egress of its sending end with an HTB class at
  ``capacity x scale`` (bytes/s; parallel declarations summed as :meth:`Topology.graph` does).
  A direction that is not declared (``a -> b`` only) carries the reverse traffic (TCP ACKs)
  unshaped, and routes use it only when no declared path exists.
- latency: with the kernel's ``sch_netem``, a ``netem delay`` qdisc under the HTB class. Kernels
  built without it (this development machine: ``CONFIG_NET_SCH_NETEM`` is not set) get a
  *delay line* instead: the link becomes a pair of TUN devices whose packets a small relay
  process (``python -m hcc.netem --delay-line``) holds for the link's latency, FIFO,
  before writing them into the peer's TUN device; shaping stays in tc (HTB on the TUN's
  egress). Delay-line resolution is about 0.1 ms, so latencies under ``MIN_DELAY_LINE_S`` are
  not emulated in that mode (the namespaces' own stack adds tens of microseconds per hop).
- routes: destination-based, one next hop per (namespace, node), computed towards each
  destination so every hop strictly approaches it (no loops). ``routing = "cost"`` (default):
  the compiler cost model's own route metric, ``α(e) + 1 MiB / c(e)`` per arc
  (``compiler/cost.py``), so a message the model routes over several hops crosses the same
  links here and predicted and measured times compare like with like. ``routing = "hops"``:
  fewest hops, ties to the larger capacity — a declared link is a cable that two neighbours
  use however slow it is. ``routing = "bandwidth"``: OSPF's ``1 / capacity``. An undeclared
  reverse arc costs 1000x in every mode.
- scale: capacities are multiplied by ``scale`` so that a topology of tens of GB/s fits what
  loopback processes can move (a DGX-1 at 25 GB/s per NVLink with ``scale = 0.001`` has
  25 MB/s links); latencies are kept. :attr:`Netem.topology` is the topology *as emulated*:
  compile plans against it to compare their predictions with what the namespaces measure.

Python API: :func:`up`, :func:`down`, :func:`load`, :func:`names`; a :class:`Netem` gives
:meth:`Netem.address` and :meth:`Netem.wrap` (``ip netns exec <ns> argv``) so a launcher starts
each rank inside its namespace. Everything here needs root (``CAP_NET_ADMIN`` and
``CAP_SYS_ADMIN`` for namespaces); without it :class:`NetemPermissionError` says so.

This is a tool beside the compiler and the runtime (it emulates a network; it runs no plan),
so it sits in the ``hcc`` package, not in ``backends/``. One module of ~950 lines on purpose:
the delay-line relay and the probe are this module run as ``python -m hcc.netem`` inside the
namespaces it builds, reading the same state file and link specs that :func:`up` writes.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .grammar.errors import HccError
from .ir.files import atomic_write_text
from .ir.topology import Link, Topology

STATE_VERSION = 1
NS_PREFIX = "hcc-"
# 9000 B (jumbo) MTU: 0.6% header overhead instead of 3.5% at 1500 B, and 6x fewer packets for
# HTB and the delay line to handle; HTB's rate accuracy at 64 KiB GSO packets is the same.
MTU = 9000
# HTB bucket: one jumbo packet plus 2 ms of traffic; a smaller bucket under-delivers at rates
# above ~100 MB/s (HTB refills per packet dequeue), a larger one lets bursts through.
HTB_BURST_MIN = 2 * MTU
HTB_BURST_S = 0.002
# 256 packets x 9000 B = 2.3 MB queue per shaped link end: enough for TCP to keep a 25 MB/s
# link busy across a 50 ms RTT (1.25 MB in flight) without unbounded bufferbloat.
QUEUE_PACKETS = 256
# small packets (ACKs) get their own HTB class guaranteed 1/SMALL_SHARE of the link (see
# _shape_lines); 1/20: a 52-byte ACK per two 9000-byte segments needs 0.3%
SMALL_SHARE = 20
MIN_DELAY_LINE_S = 50e-6
ROUTINGS = ("cost", "hops", "bandwidth")
# the compiler's route metric uses a 1 MiB reference message (compiler/cost.py _ROUTE_BYTES)
ROUTE_BYTES = float(1 << 20)
ADDR_BASE = (10 << 24) | (77 << 16)
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")


class NetemError(HccError):
    """Building, reading or removing an emulation failed."""


class NetemPermissionError(NetemError):
    """Not root, or network namespaces are not permitted here."""


class NetemExists(NetemError):
    """``up`` was asked to build over an emulation that exists."""


def state_dir() -> Path:
    return Path(os.environ.get("HCC_NETEM_STATE_DIR", "/run/hcc-netem"))


def state_path(name: str) -> Path:
    return state_dir() / f"{name}.json"


def relay_log(name: str) -> Path:
    return state_dir() / f"{name}.relay.log"


# --------------------------------------------------------------------------- the layout (pure)


@dataclass(frozen=True)
class LinkEnd:
    """One end of an emulated link: device ``dev`` in namespace ``ns`` towards ``peer``.

    ``rate_Bps`` is the shaped egress rate (0 = unshaped: a direction the topology does not
    declare); ``delay_s`` the latency applied on egress."""

    vertex: str
    peer: str
    ns: str
    dev: str
    rate_Bps: float
    delay_s: float


@dataclass(frozen=True)
class Route:
    ns: str
    dst: str  # destination address (a node's /32)
    via: str  # next hop's address
    dev: str


@dataclass(frozen=True)
class Netem:
    """An emulation as built (or planned): the topology as emulated and where it lives."""

    name: str
    topology: Topology  # capacities already multiplied by ``scale``
    scale: float
    delay_mode: str  # "netem" | "delay-line" | "none"
    namespaces: tuple[tuple[str, str], ...]  # (vertex, namespace)
    addresses: tuple[tuple[str, str], ...]  # (vertex, address)
    ends: tuple[LinkEnd, ...]  # two per link, in link order
    kinds: tuple[str, ...]  # per link (pair of ends): "veth" | "tun"
    routes: tuple[Route, ...]
    relay_pid: int = 0  # the delay-line relay process, 0 when none
    created: float = 0.0
    routing: str = "cost"
    # delay line only: what one crossing of a delayed link costs beyond its configured
    # latency (the relay's wake-up and copies), measured by ``up``; 0 when not measured
    relay_extra_s: float = 0.0

    def live_arcs(self) -> frozenset[tuple[str, str]]:
        """The arcs ``(u, v)`` some route uses: ``v`` is ``u``'s next hop towards some node.
        An arc no route uses carries nothing, whatever a plan sends "over" it: on a ring
        with one link 10x slower routed by ``cost``, the slow link's ends reach each other
        the long way round, so a tree edge the compiler puts on the slow link would in fact
        cross the fast links that its other trees use."""
        vertex_of_ns = {ns: v for v, ns in self.namespaces}
        vertex_of_addr = {a: v for v, a in self.addresses}
        return frozenset((vertex_of_ns[r.ns], vertex_of_addr[r.via]) for r in self.routes)

    def model_topology(self) -> Topology:
        """The topology to compile against to predict this emulation: :attr:`topology`
        (scaled capacities) without the arcs no route uses (:meth:`live_arcs`), and with each
        delayed arc's latency raised by the measured :attr:`relay_extra_s`, since every
        packet on it pays the relay's wake-up too (twohost: 200 us configured, +0.1 ms per
        crossing measured with the machine 100% busy)."""
        live = self.live_arcs()
        delayed = {(e.vertex, e.peer) for k, kind in enumerate(self.kinds) if kind == "tun"
                   for e in self.ends[2 * k: 2 * k + 2] if e.delay_s > 0}
        return replace(self.topology, links=tuple(
            replace(l, latency=l.latency + self.relay_extra_s) if (l.src, l.dst) in delayed else l
            for l in self.topology.links if (l.src, l.dst) in live))

    # -- lookups ---------------------------------------------------------------------------
    def _vertex(self, rank_vertex: str | int) -> str:
        if isinstance(rank_vertex, int):
            nodes = self.topology.nodes
            if not 0 <= rank_vertex < len(nodes):
                raise NetemError(f"netem {self.name}: rank {rank_vertex} out of range 0..{len(nodes) - 1}")
            return nodes[rank_vertex]
        if rank_vertex not in dict(self.namespaces):
            known = ", ".join(self.topology.nodes)
            raise NetemError(f"netem {self.name}: no vertex {rank_vertex!r} (nodes: {known})")
        return rank_vertex

    def namespace(self, rank_vertex: str | int) -> str:
        return dict(self.namespaces)[self._vertex(rank_vertex)]

    def address(self, rank_vertex: str | int) -> str:
        """The IPv4 address of a vertex (name, or index into ``topology.nodes``): reachable
        from every namespace of this emulation, from nowhere else."""
        return dict(self.addresses)[self._vertex(rank_vertex)]

    def wrap(self, rank_vertex: str | int, argv: list[str] | tuple[str, ...]) -> list[str]:
        """``argv`` run inside the vertex's namespace (``ip netns exec <ns> argv...``)."""
        return [_tool("ip"), "netns", "exec", self.namespace(rank_vertex), *argv]

    @contextlib.contextmanager
    def inside(self, rank_vertex: str | int):
        """Run the block with the calling thread in the vertex's namespace: sockets created in
        it live there (and stay there after the block), processes started from it start
        there. A launcher in the root namespace uses it to serve its rendezvous store where
        the ranks can reach it, since nothing in the root namespace is routable from them."""
        target = os.open(f"/run/netns/{self.namespace(rank_vertex)}", os.O_RDONLY)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield self
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)

    def launch_kwargs(self, ranks: tuple[str, ...] | list[str]) -> dict:
        """Keyword arguments for ``backends.launch.run_cases_local`` (and ``sockets.run_local``)
        that start rank ``r`` (vertex ``ranks[r]``, e.g. ``plan.ranks``) in its namespace,
        listening on its address, with the store on rank 0's address. Call it inside
        ``with netem.inside(ranks[0]):`` so the store's socket is made in that namespace."""
        ranks = tuple(ranks)
        for v in ranks:
            self._vertex(v)
        return {
            "wrap": lambda r, argv: self.wrap(ranks[r], argv),
            "hosts": [self.address(v) for v in ranks],
            "store_host": self.address(ranks[0]),
        }

    # -- state file ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "name": self.name,
            "scale": self.scale,
            "delay_mode": self.delay_mode,
            "topology": self.topology.to_dict(),
            "namespaces": [list(p) for p in self.namespaces],
            "addresses": [list(p) for p in self.addresses],
            "ends": [
                [e.vertex, e.peer, e.ns, e.dev, e.rate_Bps, e.delay_s] for e in self.ends
            ],
            "kinds": list(self.kinds),
            "routes": [[r.ns, r.dst, r.via, r.dev] for r in self.routes],
            "relay_pid": self.relay_pid,
            "created": self.created,
            "routing": self.routing,
            "relay_extra_s": self.relay_extra_s,
        }

    @staticmethod
    def from_dict(d: dict) -> "Netem":
        if d.get("version") != STATE_VERSION:
            raise NetemError(f"netem state version {d.get('version')!r}, expected {STATE_VERSION}")
        return Netem(
            name=d["name"],
            topology=Topology.from_dict(d["topology"]),
            scale=float(d["scale"]),
            delay_mode=d["delay_mode"],
            namespaces=tuple((v, n) for v, n in d["namespaces"]),
            addresses=tuple((v, a) for v, a in d["addresses"]),
            ends=tuple(LinkEnd(v, p, n, dv, float(r), float(dl)) for v, p, n, dv, r, dl in d["ends"]),
            kinds=tuple(d["kinds"]),
            routes=tuple(Route(*r) for r in d["routes"]),
            relay_pid=int(d.get("relay_pid", 0)),
            created=float(d.get("created", 0.0)),
            routing=str(d.get("routing", "cost")),
            relay_extra_s=float(d.get("relay_extra_s", 0.0)),
        )

    def describe(self) -> str:
        """A human summary: one line per namespace and per link direction."""
        lines = [
            f"netem {self.name}: topology {self.topology.name}, scale {self.scale:g}, "
            f"{len(self.namespaces)} namespaces, {len(self.kinds)} links, latency by {self.delay_mode}, "
            f"routing by {self.routing}"
            + (f" (relay pid {self.relay_pid}" + (f", +{self.relay_extra_s * 1e3:.3f} ms measured per crossing"
                                                   if self.relay_extra_s else "") + ")" if self.relay_pid else "")
        ]
        switches = set(self.topology.switches)
        for v, ns in self.namespaces:
            role = "switch" if v in switches else "node"
            lines.append(f"  {role:6} {v:16} {dict(self.addresses)[v]:15} ns {ns}")
        for k, kind in enumerate(self.kinds):
            for e in self.ends[2 * k: 2 * k + 2]:
                rate = f"{e.rate_Bps / 1e6:.3f} MB/s" if e.rate_Bps else "unshaped"
                lines.append(
                    f"  link   {e.vertex} -> {e.peer}: {rate}, {e.delay_s * 1e3:.3f} ms ({kind} {e.dev})"
                )
        return "\n".join(lines)


def vertex_address(index: int) -> str:
    a = ADDR_BASE + index + 1
    return f"{a >> 24}.{(a >> 16) & 255}.{(a >> 8) & 255}.{a & 255}"


def scaled(topo: Topology, scale: float) -> Topology:
    """The topology with every capacity multiplied by ``scale`` (latencies kept)."""
    if not scale > 0:
        raise NetemError(f"netem: scale must be > 0, got {scale!r}")
    return Topology(
        name=topo.name,
        nodes=topo.nodes,
        switches=topo.switches,
        links=tuple(Link(l.src, l.dst, l.capacity * scale, l.latency) for l in topo.links),
        hosts=topo.hosts,
    )


def layout(topo: Topology, name: str, scale: float = 1.0, delay_mode: str = "netem",
           routing: str = "cost") -> Netem:
    """The emulation ``up`` would build, without touching the system (pure, testable anywhere).

    ``delay_mode``: "netem" (kernel qdisc), "delay-line" (TUN relay for latencies of at least
    ``MIN_DELAY_LINE_S``) or "none" (latencies not emulated)."""
    import networkx as nx

    if not _NAME_RE.match(name):
        raise NetemError(f"netem: bad name {name!r} (letters, digits, '_', '.', '-'; at most 32)")
    vertices = topo.vertices
    if len(vertices) > 65000:
        raise NetemError(f"netem: {len(vertices)} vertices, at most 65000 addresses")
    emu = scaled(topo, scale)
    g = emu.graph()
    for u, v in g.edges:
        if u == v:
            raise NetemError(f"netem: link from {u} to itself")
    index = {v: i for i, v in enumerate(vertices)}
    ns = {v: f"{NS_PREFIX}{name}-{v}" for v in vertices}
    addr = {v: vertex_address(index[v]) for v in vertices}

    def dev(v: str, peer: str) -> str:  # unique inside v's namespace; <= 15 chars
        return f"n{index[peer]}"

    ends: list[LinkEnd] = []
    kinds: list[str] = []
    pairs = sorted({tuple(sorted((u, v), key=index.get)) for u, v in g.edges}, key=lambda p: (index[p[0]], index[p[1]]))
    for a, b in pairs:
        def end(x: str, y: str) -> LinkEnd:
            e = g.get_edge_data(x, y)
            rate = e["capacity"] if e else 0.0
            delay = e["latency"] if e else 0.0
            if delay_mode == "none" or (delay_mode == "delay-line" and delay < MIN_DELAY_LINE_S):
                delay = 0.0
            return LinkEnd(x, y, ns[x], dev(x, y), float(rate), float(delay))

        ea, eb = end(a, b), end(b, a)
        ends += [ea, eb]
        tun = delay_mode == "delay-line" and (ea.delay_s > 0 or eb.delay_s > 0)
        kinds.append("tun" if tun else "veth")

    if routing not in ROUTINGS:
        raise NetemError(f"netem: routing {routing!r} ({' | '.join(ROUTINGS)})")
    cmin = min((d["capacity"] for _, _, d in g.edges(data=True)), default=1.0)

    def cost(c: float, lat: float) -> float:
        if routing == "cost":
            return lat + ROUTE_BYTES / c
        if routing == "bandwidth":
            return cmin / c
        # one per hop plus a tie-break below 0.5 / |V| per arc: a simple path's tie-breaks
        # sum to < 0.5, so they never outweigh one hop
        return 1.0 + 0.5 / len(vertices) * (cmin / c)

    r = nx.DiGraph()
    r.add_nodes_from(vertices)
    for u, v, d in g.edges(data=True):
        r.add_edge(u, v, w=cost(d["capacity"], d["latency"]))
    for u, v, d in g.edges(data=True):
        if not g.has_edge(v, u):
            r.add_edge(v, u, w=1000.0 * cost(d["capacity"], d["latency"]))
    rev = r.reverse(copy=False)
    routes: list[Route] = []
    for dst in emu.nodes:
        _, paths = nx.single_source_dijkstra(rev, dst, weight="w")
        for src in vertices:
            if src == dst or src not in paths:
                continue
            hop = paths[src][-2]  # path dst .. hop, src in the reversed graph
            routes.append(Route(ns[src], addr[dst], addr[hop], dev(src, hop)))
    return Netem(
        name=name,
        topology=emu,
        scale=float(scale),
        delay_mode=delay_mode,
        namespaces=tuple((v, ns[v]) for v in vertices),
        addresses=tuple((v, addr[v]) for v in vertices),
        ends=tuple(ends),
        kinds=tuple(kinds),
        routes=tuple(routes),
        routing=routing,
    )


# --------------------------------------------------------------------------- system side


_CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    """setns(2) for the calling thread (Python 3.11 has no os.setns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetemError(f"netem: setns failed: {os.strerror(err)}")


def _tool(name: str) -> str:
    for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        p = Path(d) / name
        if p.exists():
            return str(p)
    found = shutil.which(name)
    if not found:
        raise NetemError(f"netem: `{name}` not found (install iproute2)")
    return found


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        shown = " ".join(argv)
        if stdin:
            shown += f" <<< {stdin.strip().splitlines()[0]} ..."
        raise NetemError(f"netem: `{shown}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


def _batch(tool: str, ns: str, lines: list[str]) -> None:
    """Run ``lines`` through ``ip -batch`` / ``tc -batch`` in one namespace (one process, not
    one per command: a 32-rank cluster needs ~3000 route commands)."""
    if lines:
        _run([_tool(tool), "-n", ns, "-batch", "-"], stdin="\n".join(lines) + "\n")


def check_permitted() -> None:
    """Raise :class:`NetemPermissionError` unless namespaces can be made here."""
    if sys.platform != "linux":
        raise NetemPermissionError("hcc netem needs Linux network namespaces")
    if os.geteuid() != 0:
        raise NetemPermissionError(
            "hcc netem needs root (network namespaces, veth and tc need CAP_SYS_ADMIN and "
            "CAP_NET_ADMIN): run it with sudo"
        )
    for t in ("ip", "tc"):
        _tool(t)


def existing_namespaces() -> set[str]:
    p = _run([_tool("ip"), "netns", "list"], check=False)
    return {line.split()[0] for line in p.stdout.splitlines() if line.strip()}


def netem_qdisc_available() -> bool:
    """Probe the kernel for ``sch_netem`` in a scratch namespace (deleted at once)."""
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    _run([_tool("ip"), "netns", "add", probe])
    try:
        p = _run([_tool("tc"), "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
        return p.returncode == 0
    finally:
        _run([_tool("ip"), "netns", "del", probe], check=False)


def _shape_lines(e: LinkEnd, netem_delay: bool) -> list[str]:
    """tc commands for one link end: HTB at the link's rate with two leaf classes, small
    packets (IP length < 128 B: TCP's ACKs, 1-byte probes) before bulk data.

    Why two classes: one FIFO of ``QUEUE_PACKETS`` jumbo frames is 2.3 MB, 230 ms at a
    scaled 10 MB/s link (0.23 ms at the real 10 GB/s), and ACKs of the reverse direction's
    flows queued behind it: a 7-hop route (slow8's way round) saw ~1.6 s round trips, its
    TCP window could not cover them, and every ring over it (hcc-ring, gloo) ran at half the
    ring's rate. Scaling the rate down should not scale the wait of a 52-byte ACK up; its own
    class (guaranteed 1/20 of the rate, may borrow all of it) keeps ACKs one packet time
    behind the bulk data instead of a whole queue."""
    if not e.rate_Bps and not (netem_delay and e.delay_s):
        return []

    def leaf(parent: str) -> str:
        if netem_delay and e.delay_s:
            us = max(int(round(e.delay_s * 1e6)), 1)
            # netem's queue must hold rate x delay (the bandwidth-delay product) or it drops
            limit = QUEUE_PACKETS + int(e.rate_Bps * e.delay_s / MTU) if e.rate_Bps else 10000
            return f"qdisc add dev {e.dev} {parent} netem delay {us}us limit {limit}"
        return f"qdisc add dev {e.dev} {parent} pfifo limit {QUEUE_PACKETS}"

    if not e.rate_Bps:
        return [leaf("root handle 10:")]
    bits = max(int(e.rate_Bps * 8), 8000)
    small = max(bits // SMALL_SHARE, 8000)
    burst = max(HTB_BURST_MIN, int(e.rate_Bps * HTB_BURST_S))
    shape = f"burst {burst}b cburst {burst}b quantum {MTU}"
    # r2q 1000 keeps HTB's quantum (rate / r2q) near one packet at these rates
    return [
        f"qdisc add dev {e.dev} root handle 1: htb default 20 r2q 1000",
        f"class add dev {e.dev} parent 1: classid 1:1 htb rate {bits}bit ceil {bits}bit "
        f"burst {burst}b cburst {burst}b",
        f"class add dev {e.dev} parent 1:1 classid 1:10 htb rate {small}bit ceil {bits}bit {shape} prio 0",
        f"class add dev {e.dev} parent 1:1 classid 1:20 htb rate {max(bits - small, 8000)}bit ceil {bits}bit "
        f"{shape} prio 1",
        leaf("parent 1:10 handle 10:"),
        leaf("parent 1:20 handle 20:"),
        # IPv4 total length (bytes 2-3 of the header) below 128
        f"filter add dev {e.dev} parent 1: protocol ip prio 1 u32 match u16 0x0000 0xff80 at 2 flowid 1:10",
    ]


def _sysctl_lines() -> str:
    # every namespace forwards; rp_filter off because routes are asymmetric by design
    return (
        "echo 1 > /proc/sys/net/ipv4/ip_forward; "
        "echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter; "
        "echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter"
    )


def up(topo: Topology, name: str | None = None, scale: float = 1.0, delay_mode: str = "auto",
       routing: str = "cost") -> Netem:
    """Build ``topo`` as namespaces, links and shaping; return the :class:`Netem`.

    ``name`` defaults to the topology's name. Refuses (:class:`NetemExists`) when a state file
    or a namespace of that name exists. On any failure everything made so far is removed
    before the error propagates."""
    check_permitted()
    name = name or topo.name
    if delay_mode not in ("auto", "netem", "delay-line", "none"):
        raise NetemError(f"netem: delay mode {delay_mode!r} (auto | netem | delay-line | none)")
    plan = layout(topo, name, scale, "netem", routing)  # validates the name before touching anything
    sp = state_path(name)
    sp.parent.mkdir(parents=True, exist_ok=True)
    stale = sorted(n for n in existing_namespaces() if n in dict(plan.namespaces).values())
    if sp.exists() or stale:
        what = f"state file {sp}" if sp.exists() else f"namespaces {', '.join(stale)}"
        raise NetemExists(f"netem {name} is already up ({what}); run `hcc netem down {name}` first")
    try:  # claim the name atomically: two concurrent `up`s cannot both pass this
        fd = os.open(sp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise NetemExists(f"netem {name} is already up (state file {sp})") from None
    with os.fdopen(fd, "w") as f:
        json.dump({"version": STATE_VERSION, "name": name, "building": True,
                   "namespaces": [list(p) for p in plan.namespaces]}, f)
    made: list[str] = []
    relay: subprocess.Popen | None = None
    try:
        if delay_mode == "auto":
            has_delay = any(l.latency > 0 for l in topo.links)
            delay_mode = ("netem" if netem_qdisc_available() else "delay-line") if has_delay else "none"
        plan = layout(topo, name, scale, delay_mode, routing)
        if not any(e.delay_s for e in plan.ends):  # every latency below what the mode emulates
            plan = replace(plan, delay_mode="none")
        ip = _tool("ip")
        addr = dict(plan.addresses)
        for v, ns in plan.namespaces:
            _run([ip, "netns", "add", ns])
            made.append(ns)
            _batch("ip", ns, ["link set lo up", f"addr add {addr[v]}/32 dev lo"])
            _run([ip, "netns", "exec", ns, "sh", "-c", _sysctl_lines()])
        tuns = [(e.ns, e.dev) for k, kind in enumerate(plan.kinds) if kind == "tun"
                for e in plan.ends[2 * k: 2 * k + 2]]
        if tuns:
            relay = _start_relay(plan)
        per_ns: dict[str, list[str]] = {}
        tc_ns: dict[str, list[str]] = {}
        for k, kind in enumerate(plan.kinds):
            ea, eb = plan.ends[2 * k], plan.ends[2 * k + 1]
            if kind == "veth":
                _run([ip, "link", "add", "name", ea.dev, "netns", ea.ns, "mtu", str(MTU), "type", "veth",
                      "peer", "name", eb.dev, "netns", eb.ns, "mtu", str(MTU)])
            for e in (ea, eb):
                lines = per_ns.setdefault(e.ns, [])
                if kind == "tun":
                    lines.append(f"link set dev {e.dev} mtu {MTU} txqueuelen {QUEUE_PACKETS}")
                lines += [
                    f"addr add {addr[e.vertex]} peer {addr[e.peer]}/32 dev {e.dev}",
                    f"link set dev {e.dev} up",
                ]
                tc_ns.setdefault(e.ns, []).extend(_shape_lines(e, plan.delay_mode == "netem"))
        for r in plan.routes:
            if r.dst == r.via:
                continue  # the neighbour's /32: the point-to-point address already routes it
            per_ns.setdefault(r.ns, []).append(f"route replace {r.dst}/32 via {r.via} dev {r.dev}")
        for ns, lines in per_ns.items():
            _batch("ip", ns, lines)
        for ns, lines in tc_ns.items():
            _batch("tc", ns, lines)
        built = replace(plan, relay_pid=relay.pid if relay else 0, created=time.time())
        if relay is not None:
            built = replace(built, relay_extra_s=_relay_extra(built))
        atomic_write_text(sp, json.dumps(built.to_dict(), indent=1))
        return built
    except BaseException:
        if relay is not None:
            _stop_relay(relay.pid)
        for ns in reversed(made):
            _run([_tool("ip"), "netns", "del", ns], check=False)
        sp.unlink(missing_ok=True)
        relay_log(name).unlink(missing_ok=True)
        raise


RELAY_PROBE_LINKS = 3  # delayed links probed by `up` (each ~0.5 s: two probe processes)


def _relay_extra(n: Netem) -> float:
    """Median over up to ``RELAY_PROBE_LINKS`` delayed links of ``(rtt - α_ab - α_ba) / 2``:
    what one crossing costs beyond its configured latency (relay wake-up, TUN copies and the
    two ends' stacks), from 15 one-byte ping-pongs between the link's own two vertices."""
    import statistics

    extra = []
    for k, kind in enumerate(n.kinds):
        if kind != "tun" or len(extra) >= RELAY_PROBE_LINKS:
            continue
        ea, eb = n.ends[2 * k], n.ends[2 * k + 1]
        rtt = statistics.median(measure_rtt(n, ea.vertex, eb.vertex, count=15))
        extra.append(max(rtt - ea.delay_s - eb.delay_s, 0.0) / 2)
    return statistics.median(extra) if extra else 0.0


def _state(name: str) -> dict:
    """The state file ``up`` wrote for ``name``, read (:class:`NetemError` if absent or corrupt)."""
    sp = state_path(name)
    try:
        return json.loads(sp.read_text())
    except FileNotFoundError:
        raise NetemError(f"netem {name} is not up (no state file {sp})") from None
    except json.JSONDecodeError as e:
        raise NetemError(f"netem {name}: corrupt state file {sp}: {e}") from None


def load(name: str) -> Netem:
    """The emulation ``name`` as recorded by ``up`` (:class:`NetemError` if none)."""
    d = _state(name)
    if d.get("building"):
        raise NetemError(f"netem {name} is being built (or a build died: `hcc netem down {name}`)")
    return Netem.from_dict(d)


def names() -> list[str]:
    """Names of the emulations that have a state file."""
    d = state_dir()
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def namespace_pids(ns: str) -> list[int]:
    p = _run([_tool("ip"), "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def down(name: str, kill: bool = False) -> list[str]:
    """Remove everything ``up`` made for ``name``; return the namespaces removed.

    Processes still running inside the namespaces (started with ``exec`` or ``wrap``) would
    keep them alive after their names are gone, so ``down`` refuses while any runs, unless
    ``kill`` (SIGKILL to exactly those pids, the delay-line relay excepted, which is stopped
    first)."""
    check_permitted()
    sp = state_path(name)
    d = _state(name)
    spaces = [n for _, n in d.get("namespaces", [])]
    if not all(n.startswith(f"{NS_PREFIX}{name}-") for n in spaces):
        raise NetemError(f"netem {name}: state file {sp} names namespaces outside hcc-{name}-*")
    present = existing_namespaces()
    relay_pid = int(d.get("relay_pid", 0))
    if relay_pid:
        _stop_relay(relay_pid)
    busy = {n: namespace_pids(n) for n in spaces if n in present}
    busy = {n: p for n, p in busy.items() if p}
    if busy and not kill:
        shown = "; ".join(f"{n}: {' '.join(map(str, p))}" for n, p in busy.items())
        raise NetemError(f"netem {name}: processes still run inside ({shown}); stop them or use --kill")
    for pids in busy.values():
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    removed = []
    for n in spaces:
        if n in present:
            _run([_tool("ip"), "netns", "del", n])
            removed.append(n)
    sp.unlink(missing_ok=True)
    relay_log(name).unlink(missing_ok=True)
    return removed


# --------------------------------------------------------------------------- delay line

_RELAY_MARK = "--delay-line"


def _start_relay(plan: Netem) -> subprocess.Popen:
    """Start the relay for every "tun" link; it creates the TUN devices in their namespaces
    and prints ``ready`` once they all exist (bounded wait: 20 s)."""
    spec = []
    for k, kind in enumerate(plan.kinds):
        if kind == "tun":
            ea, eb = plan.ends[2 * k], plan.ends[2 * k + 1]
            spec.append([ea.ns, ea.dev, ea.delay_s, eb.ns, eb.dev, eb.delay_s])
    log = open(relay_log(plan.name), "wb")
    with log:  # the relay keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "hcc.netem", _RELAY_MARK, plan.name, json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
        )
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    ready = bool(sel.select(timeout=20.0)) and proc.stdout.readline().strip() == b"ready"
    sel.close()
    if not ready:
        proc.kill()
        proc.wait(timeout=10)
        err = relay_log(plan.name).read_text(errors="replace") or "no answer in 20 s"
        raise NetemError(f"netem {plan.name}: delay-line relay failed to start: {err.strip()}")
    proc.stdout.close()
    return proc


def _is_relay(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"hcc.netem" in cmd and _RELAY_MARK.encode() in cmd


def relay_alive(pid: int) -> bool:
    return pid > 0 and _is_relay(pid)


def _stop_relay(pid: int) -> None:
    """SIGTERM the relay (only if that pid is still our relay), then SIGKILL after 5 s."""
    if not _is_relay(pid):
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not _is_relay(pid):
            return
        try:  # reap it if it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if _is_relay(pid):
        os.kill(pid, signal.SIGKILL)


def _relay_main(name: str, spec_json: str) -> None:
    """The relay process: TUN fds for both ends of each delayed link; a packet read from one
    end is written into the other after that direction's delay, in arrival order (a constant
    delay keeps FIFO order, so one deque per direction suffices — no heap)."""
    import collections
    import fcntl
    import selectors
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet, tunsetiff, iff_tun, iff_no_pi = 0x40000000, 0x400454CA, 0x0001, 0x1000

    def open_tun(ns: str, dev: str) -> int:
        nfd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(nfd, clone_newnet) != 0:
                raise OSError(ctypes.get_errno(), f"setns {ns}")
        finally:
            os.close(nfd)
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, tunsetiff, struct.pack("16sH", dev.encode(), iff_tun | iff_no_pi))
        return fd

    # fd -> (out fd, delay, queue of (due, packet))
    route: dict[int, tuple[int, float, collections.deque]] = {}
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    for ns_a, dev_a, d_ab, ns_b, dev_b, d_ba in json.loads(spec_json):
        fa, fb = open_tun(ns_a, dev_a), open_tun(ns_b, dev_b)
        route[fa] = (fb, float(d_ab), collections.deque())
        route[fb] = (fa, float(d_ba), collections.deque())
    libc.setns(home, clone_newnet)  # back home: the relay must not keep a namespace busy
    os.close(home)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:  # the relay is the emulated wire: let it preempt the ranks it carries (it is root)
        os.nice(-5)
    except OSError:
        pass
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sel = selectors.DefaultSelector()
    for fd in route:
        sel.register(fd, selectors.EVENT_READ)
    queued_limit = 20000  # packets per direction: 180 MB at 9000 B, far above rate x delay
    while not stop:
        now = time.monotonic()
        due = min((q[0][0] for _, _, q in route.values() if q), default=None)
        wait = None if due is None else max(due - now, 0.0)
        if wait is not None and wait < 0.002:
            # epoll rounds its timeout up to whole milliseconds (a 5 ms delay became 5.9 ms);
            # sleep the last ~2 ms instead (hrtimer, ~0.1 ms late), reading nothing meanwhile:
            # the TUN queue holds what arrives (256 packets = 2.3 MB, 2 ms at 1.1 GB/s)
            time.sleep(wait)
            events = sel.select(timeout=0)
        else:
            events = sel.select(timeout=None if wait is None else wait - 0.0015)
        now = time.monotonic()
        for key, _ in events:
            out, delay, q = route[key.fd]
            for _ in range(64):  # bounded burst so one busy link cannot starve the others
                try:
                    pkt = os.read(key.fd, 65536)
                except BlockingIOError:
                    break
                if len(q) < queued_limit:
                    q.append((now + delay, pkt))
        now = time.monotonic()
        for out, _, q in route.values():
            while q and q[0][0] <= now:
                try:
                    os.write(out, q.popleft()[1])
                except OSError:
                    pass  # the peer device is gone or full: a dropped packet, as a wire would


# --------------------------------------------------------------------------- probes
# A tiny TCP sender/receiver and ping-pong, run inside the namespaces, to measure what a link
# delivers against what it is configured to (tests, `hcc netem probe`, benchmarks/netem_bench.py).

_PROBE_MARK = "--probe"


def _probe_main(argv: list[str]) -> None:
    import socket

    mode, host, port = argv[0], argv[1], int(argv[2])
    limit = float(argv[3])  # every probe ends within this many seconds
    deadline = time.monotonic() + limit
    if mode in ("sink", "echo"):
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(1)
        srv.settimeout(limit)
        sys.stdout.write("listening\n")
        sys.stdout.flush()
        conn, _ = srv.accept()
        conn.settimeout(max(deadline - time.monotonic(), 0.1))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(1 << 20)
        total, first, last = 0, None, None
        while time.monotonic() < deadline:
            k = conn.recv_into(buf)
            if not k:
                break
            last = time.monotonic()
            if first is None:
                first = last
            if mode == "echo":
                conn.sendall(buf[:k])
            total += k
        print(json.dumps({"bytes": total, "seconds": (last - first) if first else 0.0}))
        return
    sock = None
    while sock is None:  # the listener may still be starting: retry until the deadline
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(max(deadline - time.monotonic(), 0.1))
    if mode == "source":
        seconds = float(argv[4])
        block = bytes(1 << 20)
        end = min(time.monotonic() + seconds, deadline)
        while time.monotonic() < end:
            sock.sendall(block)
        sock.close()
        return
    rtts = []
    one = bytearray(1)
    for _ in range(int(argv[4])):  # mode == "ping"
        t0 = time.perf_counter()
        sock.sendall(b"x")
        if sock.recv_into(one) != 1:
            break
        rtts.append(time.perf_counter() - t0)
    sock.close()
    print(json.dumps({"rtts": rtts}))


def _probe_pair(n: Netem, src: str | int, dst: str | int, server: str, client: list[str], port: int,
                limit: float) -> dict:
    py = [sys.executable, "-m", "hcc.netem", _PROBE_MARK]
    addr = n.address(dst)
    srv = subprocess.Popen(n.wrap(dst, py + [server, addr, str(port), str(limit)]),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = srv.stdout.readline()
        if line.strip() != "listening":
            raise NetemError(f"netem probe: listener in {n.namespace(dst)} failed: {srv.stderr.read().strip()}")
        cli = subprocess.run(n.wrap(src, py + [client[0], addr, str(port), str(limit)] + client[1:]),
                             capture_output=True, text=True, timeout=limit + 10)
        out, err = srv.communicate(timeout=limit + 10)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    if cli.returncode != 0 or srv.returncode != 0:
        raise NetemError(f"netem probe {src} -> {dst} failed: {cli.stderr.strip()} {err.strip()}")
    return json.loads(out if client[0] == "source" else cli.stdout)


def measure_throughput(n: Netem, src: str | int, dst: str | int, seconds: float = 2.0,
                       port: int = 5201) -> float:
    """Bytes/s one TCP stream carries from ``src`` to ``dst`` over ``seconds`` (payload only,
    timed at the receiver from the first to the last byte)."""
    r = _probe_pair(n, src, dst, "sink", ["source", str(seconds)], port, seconds + 20.0)
    if not r["seconds"]:
        raise NetemError(f"netem probe {src} -> {dst}: no bytes arrived")
    return r["bytes"] / r["seconds"]


def measure_rtt(n: Netem, src: str | int, dst: str | int, count: int = 20, port: int = 5202) -> list[float]:
    """Round-trip times (s) of ``count`` 1-byte TCP ping-pongs from ``src`` to ``dst``."""
    return _probe_pair(n, src, dst, "echo", ["ping", str(count)], port, 30.0)["rtts"]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == _RELAY_MARK:
        _relay_main(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 6 and sys.argv[1] == _PROBE_MARK:
        _probe_main(sys.argv[2:])
    else:
        print("usage: python -m hcc.netem --delay-line NAME SPEC_JSON (started by `hcc netem up`)",
              file=sys.stderr)
        sys.exit(2)
