"""hcc.compiler.compact — a plan's ops, messages and dependencies as flat arrays, and the
simulator's event loop run over them (compiler/_simcore.c).

Terms
- op id ``g``: rank ``r``'s op ``i`` is ``base[r] + i`` (programs concatenated in rank order).
- op table: per op id, ``code`` (0 Send, 1 Recv, 2 RecvReduce, 3 a local op: Copy, Reduce,
  Scale), ``partner`` (the matching op of a message, -1 for a local op) and ``local_s`` (the
  seconds a local op or a RecvReduce's combine takes under the cost model).
- dependents: the completes-before edges ``d -> g`` of every ``deps`` entry as a CSR
  (``dep_ptr``, ``dep_idx``), each op's dependents in increasing op id: the order in which
  cost._simulate_py appends them, so the two loops post ready ops in the same order.
- message table: per Send, its wire bytes and its *route*, an id into the distinct link
  paths the plan's messages take (``route_ptr``, ``route_links``, ``route_cmin``: the path's
  links and its bottleneck capacity). A 1024-rank allgather candidate of 3 million ops has
  a few thousand distinct paths.

Building the tables reads each op's fields in one native pass (ir/opscan.py) and does the
matching, the dependency checks and the CSR in numpy: 1-3 us per op, mostly the cache misses
of reading the op objects, where the reference's own Python set-up and loop cost 5-20 us.
Anything unusual (a tag outside 32 bits, a send without its receive, counts that differ, a
deadlock) is left to the reference implementation, which reports it with its own message:
the fast path only ever returns what the reference would return.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from ..ir import opscan
from ..ir.plan import Plan

try:
    from . import _simcore
except ImportError:  # not built (HCC_NO_NATIVE=1): cost.simulate runs the reference loop
    _simcore = None



def available() -> bool:
    return _simcore is not None


class Unsupported(Exception):
    """The plan needs the reference simulator (an error to report, or an unusual field)."""


def run(plan: Plan, net, model, tab: opscan.OpTable | None = None) -> tuple[np.ndarray, list[int], dict, int, int]:
    """Simulate ``plan`` on the native loop: ``(done, base, links, messages, wire_bytes)``,
    ``done[g]`` the completion time of op ``g``, ``links`` the per-link arrays ``free``,
    ``busy``, ``bytes`` and ``first`` (the reference's ``link_*`` lists). Raises
    :class:`Unsupported` where the reference must run instead (see the module docstring).
    ``tab``: the plan's op columns when the caller built them itself (compiler/channels.py's
    ring allreduce, whose ``programs`` are then left empty); else read from the programs."""
    if _simcore is None:
        raise Unsupported("the native loop is not built")
    progs = plan.programs
    nr = len(progs)
    if nr >= 1 << 15:  # message keys below are ((a * nr + b) << 32) | tag in 63 bits
        raise Unsupported("too many ranks for 64-bit message keys")
    if tab is None:
        tab = opscan.scan(progs)
    if tab is None:
        raise Unsupported("an op the simulator does not know, or a field of an unexpected type")
    base, total = list(tab.base), tab.total
    kind = tab.code  # 0 Send, 1 Recv, 2 RecvReduce, 3 Copy, 4 Reduce, 5 Scale
    flat, ndeps, peer, tag, tree = tab.deps, tab.ndeps, tab.peer, tab.tag, tab.tree
    count = np.where(kind == 0, tab.scnt, tab.dcnt)
    rank_of = tab.rank
    owner = tab.owner
    # every column is let go as soon as it is read for the last time, the unread ones (the
    # buffers and offsets) at once: at the simulator's call the 1024-rank ring allreduce's
    # 5.2 million ops otherwise held ~0.5 GB of columns it no longer needed
    del tab
    base_a = np.asarray(base, dtype=np.int64)

    # dependencies: each entry d of op g (rank r, index i) must satisfy 0 <= d < i
    first = base_a[rank_of[owner]]
    if flat.size and ((flat < 0).any() or (flat >= owner - first).any()):
        raise Unsupported("a dependency that is not an earlier op")
    src = flat + first
    del flat, first
    by_src = np.argsort(src, kind="stable")  # dependents of one op stay in op-id order
    dep_idx = np.ascontiguousarray(owner[by_src])
    del owner
    dep_ptr = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=total), out=dep_ptr[1:])
    del by_src, src

    # messages: match every Send with its Recv / RecvReduce by (sender, receiver, tag)
    send_ids = np.flatnonzero(kind == 0)
    recv_ids = np.flatnonzero((kind == 1) | (kind == 2))
    if send_ids.size != recv_ids.size:
        raise Unsupported("unmatched messages")
    m = send_ids.size
    s_peer, r_peer = peer[send_ids], peer[recv_ids]
    s_tag, r_tag = tag[send_ids], tag[recv_ids]
    s_count, r_count = count[send_ids], count[recv_ids]
    s_tree = tree[send_ids]
    del peer, tag, tree
    for a in (s_peer, r_peer):
        if m and (a.min() < 0 or a.max() >= nr):
            raise Unsupported("a peer outside the ranks")
    for a in (s_tag, r_tag):
        if m and (a.min() < 0 or a.max() >= 1 << 32):
            raise Unsupported("a tag outside 32 bits")
    s_rank = rank_of[send_ids]
    r_rank = rank_of[recv_ids]
    del rank_of
    s_key = ((s_rank * nr + s_peer) << 32) | s_tag
    r_key = ((r_peer * nr + r_rank) << 32) | r_tag
    so = np.argsort(s_key, kind="stable")
    ro = np.argsort(r_key, kind="stable")
    sk, rk = s_key[so], r_key[ro]
    if m and ((sk[1:] == sk[:-1]).any() or (rk[1:] == rk[:-1]).any() or (sk != rk).any()):
        raise Unsupported("duplicate or unmatched messages")
    if (s_count[so] != r_count[ro]).any():
        raise Unsupported("send and receive counts differ")
    del s_key, r_key, sk, rk
    partner = np.full(total, -1, dtype=np.int64)
    partner[send_ids[so]] = recv_ids[ro]
    partner[recv_ids[ro]] = send_ids[so]
    del so, ro, r_peer, r_tag, r_count, r_rank, recv_ids

    itemsize = plan.itemsize
    if plan.compress == "none":
        nb = s_count * itemsize
    else:
        from ..ir.wire import wire_nbytes

        uniq, inv = np.unique(s_count, return_inverse=True)
        nb = np.asarray([wire_nbytes(plan.compress, plan.dtype, int(c)) for c in uniq], dtype=np.int64)[inv]
    nbytes = np.zeros(total, dtype=np.int64)
    nbytes[send_ids] = nb

    paths = _paths_of(net)
    route = np.zeros(total, dtype=np.int64)
    route[send_ids] = _routes(plan, net, paths, s_rank, s_peer, s_tree)
    del send_ids, s_rank, s_peer, s_tree, s_tag, s_count, nb
    route_ptr, route_links, route_cmin = paths.tables(net.cap)

    local_s = np.zeros(total, dtype=np.float64)
    if model.reduce_Bps > 0:
        red = (kind == 2) | (kind == 4) | (kind == 5)
        local_s[red] = count[red] * itemsize / model.reduce_Bps
    if model.copy_Bps > 0:
        cp = kind == 3
        local_s[cp] = count[cp] * itemsize / model.copy_Bps
    code = np.minimum(kind, 3).astype(np.int8)
    del kind, count

    cap = net.cap
    nl = len(cap)
    done = np.full(total, -1.0)
    free = np.zeros(nl)
    busy = np.zeros(nl)
    lbytes = np.zeros(nl, dtype=np.int64)
    lfirst = np.full(nl, -1.0)
    messages, wire = _simcore.simulate(
        code, local_s, partner, dep_ptr, dep_idx, ndeps, nbytes, route,
        route_ptr, route_links, route_cmin, np.asarray(net.lat, dtype=np.float64),
        np.asarray(cap, dtype=np.float64), float(model.per_message_s),
        done, free, busy, lbytes, lfirst)
    if total and done.min() < 0.0:
        raise Unsupported("the plan deadlocks")
    return done, base, {"free": free, "busy": busy, "bytes": lbytes, "first": lfirst}, messages, wire


class _Paths:
    """Link paths of one collective's sub-topology interned to route ids, kept on its
    shared cost._Links (so every simulation of that collective reuses them), with each
    packed tree's per-rank path ids (:meth:`tree`) memoized by the tree's value: the chunk
    search lowers the same trees at every chunk size, and a 1024-rank allgather has 1472
    trees of 1023 edges."""

    # trees remembered per sub-topology: two 1024-rank allgather packings' worth
    MAX_TREES = 4096

    def __init__(self):
        self.ids: dict[tuple[int, ...], int] = {}
        self.list: list[tuple[int, ...]] = []
        self.by_verts: dict[tuple[str, ...], int] = {(): -2}
        self.pairs: dict[tuple[int, int], int] = {}
        self.trees: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._tables = None

    def intern(self, path: tuple[int, ...]) -> int:
        pid = self.ids.get(path)
        if pid is None:
            pid = self.ids[path] = len(self.list)
            self.list.append(path)
            self._tables = None
        return pid

    def verts(self, net, verts: tuple[str, ...]) -> int:
        """The route id of a tree edge's vertex path, -1 when a hop is not a link (the
        reference then routes the message)."""
        pid = self.by_verts.get(verts)
        if pid is None:
            found = net._vertex_path(verts)
            pid = self.by_verts[verts] = -1 if found is None else self.intern(found)
        return pid

    def tree(self, net, t, way: int) -> tuple[np.ndarray, np.ndarray]:
        """``(parent, ids)`` of tree ``t`` as arrays over the ranks; ``way`` 0: ``ids[r]``
        the route id of the edge parent -> r when ``t.paths[r]`` names one (2+ vertices),
        -2 when it does not, -1 when it is not made of links; ``way`` 1: the same for the
        edge r -> parent (the path reversed)."""
        key = (way, t.parent, t.paths)
        try:
            hit = self.trees.get(key)
        except TypeError:  # lists for tuples: computed every time
            key, hit = None, None
        if hit is not None:
            return hit
        n = len(t.parent)
        paths = [tuple(p) for p in t.paths[:n]] if key is None else t.paths[:n]
        if way:
            paths = [p[::-1] for p in paths]
        ids = list(map(self.by_verts.get, paths))  # one C-level pass; misses are None
        for r, pid in enumerate(ids):
            if pid is None:
                p = paths[r]
                ids[r] = self.verts(net, p) if len(p) >= 2 else -2
        ids += [-2] * (n - len(ids))
        hit = (np.asarray(t.parent, dtype=np.int64), np.asarray(ids, dtype=np.int64))
        if key is not None:
            if len(self.trees) >= self.MAX_TREES:
                self.trees.clear()
            self.trees[key] = hit
        return hit

    def pair(self, net, a: int, b: int) -> int:
        """The route id of the cheapest route from rank ``a`` to ``b`` (cost._Network.path);
        ranks index the plan's names, which are fixed for the sub-topology's ranks."""
        pid = self.pairs.get((a, b))
        if pid is None:
            path = net._route(net.names[a], net.names[b])
            if not path and a != b:
                net.path(a, b, -1)  # raises the reference's error (one vertex for two ranks)
            pid = self.pairs[(a, b)] = self.intern(path)
        return pid

    def tables(self, cap) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._tables is None:
            ptr = np.zeros(len(self.list) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in self.list], out=ptr[1:])
            links = np.fromiter(chain.from_iterable(self.list), dtype=np.int64, count=int(ptr[-1]))
            cmin = np.asarray([min((cap[e] for e in p), default=float("inf")) for p in self.list], dtype=np.float64)
            self._tables = (ptr, links, cmin)
        return self._tables


def _paths_of(net) -> _Paths:
    links = net.links
    paths = getattr(links, "compact_paths", None)
    if paths is None or getattr(links, "compact_names", None) != net.names:
        paths = links.compact_paths = _Paths()
        links.compact_names = net.names
    return paths


def _routes(plan: Plan, net, paths: _Paths, a: np.ndarray, b: np.ndarray, tree: np.ndarray) -> np.ndarray:
    """The route id of every message (sender ``a``, receiver ``b``, tree ``tree``), chosen
    as cost._Network.path chooses: the tree's recorded path for a tree edge taken down
    (parent to child) or up (child to parent), else the cheapest route."""
    m = a.size
    out = np.full(m, -1, dtype=np.int64)
    trees = plan.trees
    n = len(net.names)
    valid = (tree >= 0) & (tree < len(trees))
    if valid.any():
        idx = np.flatnonzero(valid)
        order = idx[np.argsort(tree[idx], kind="stable")]
        ts = tree[order]
        cuts = np.flatnonzero(np.diff(ts)) + 1
        for grp in np.split(order, cuts):
            t = trees[int(tree[grp[0]])]
            if len(t.parent) != n:
                raise Unsupported("a tree over other ranks")
            parent, down = paths.tree(net, t, 0)
            ga, gb = a[grp], b[grp]
            is_down = (parent[gb] == ga) & (down[gb] != -2)
            pid = np.where(is_down, down[gb], -1)
            maybe_up = ~is_down & (parent[ga] == gb)
            if maybe_up.any():  # a reduction's edges, taken child to parent
                up = paths.tree(net, t, 1)[1]
                is_up = maybe_up & (up[ga] != -2)
                pid = np.where(is_up, up[ga], pid)
            out[grp] = pid
    rest = np.flatnonzero(out < 0)
    if rest.size:
        pair = a[rest] * n + b[rest]
        uniq, inv = np.unique(pair, return_inverse=True)
        ids = np.asarray([paths.pair(net, *divmod(int(k), n)) for k in uniq.tolist()], dtype=np.int64)
        out[rest] = ids[inv]
    return out
