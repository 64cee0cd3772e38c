"""hcc.ir.verify_scan — checks 2 and 3 of ir/verify.py (ops, messages) over the plan's op
columns (ir/opscan.py) in numpy, for plans of millions of ops.

:func:`check_ops` accepts exactly the plans ir/verify.py's ``_check_ops`` accepts and returns
the same completes-before edges in the same order (so the deadlock check and the symbolic
execution after it run identically), or None whenever anything is off, or the columns cannot
be read: ``_check_ops`` then runs and reports the fault with the op that has it. The check is
at least as strict as the Python one, item by item:

- deps: every entry ``d`` of op ``i`` satisfies ``0 <= d < i``;
- ranges: a known buffer, ``count >= 1``, ``offset >= 0``, ``offset + count <= `` the rank's
  buffer length; nothing writes ``in``;
- Copy / Reduce: equal counts, and source and destination disjoint unless a Copy's round
  trip in place; Scale: divisor >= 1;
- messages: peer another rank, ``0 <= tag < 2**24``, ``-1 <= tree <`` the tree count; one
  Send and one Recv/RecvReduce per (sender, receiver, tag), with equal counts.

Edges (``src[k] -> dst[k]``): every dependency in op order, then per Send in op order the
send -> receive edge and the receive's dependencies -> send (MPI's rendezvous), as
``_check_ops`` appends them.
"""
from __future__ import annotations

import numpy as np

from . import opscan

MAX_TAG = 1 << 24


class ScanIndex:
    """What the later checks read of ir/verify.py's ``_Index``: ``base``, ``total`` and the
    edge arrays ``src`` and ``dst``; for ir/verify_native.py also the op columns ``tab``, the
    receive matched with each Send (``partner``, -1 elsewhere) and how many of the edges are
    dependencies (``ndep_edges``: the first ones, in op order)."""

    def __init__(self, base: list[int], src: np.ndarray, dst: np.ndarray, tab=None,
                 partner: np.ndarray | None = None, ndep_edges: int = 0):
        self.base = base
        self.total = base[-1]
        self.src = src
        self.dst = dst
        self.tab = tab
        self.partner = partner
        self.ndep_edges = ndep_edges


def check_ops(plan, sizes: list[dict[str, int]]) -> ScanIndex | None:
    n = plan.n
    if n >= 1 << 19:  # keys (a * n + b) * 2**24 + tag stay inside 63 bits
        return None
    tab = opscan.scan(plan.programs)
    if tab is None:
        return None
    code, rank, owner, deps = tab.code, tab.rank, tab.owner, tab.deps
    base = np.asarray(tab.base, dtype=np.int64)
    first = base[rank[owner]]
    if deps.size and ((deps < 0).any() or (deps >= owner - first).any()):
        return None
    limit = np.asarray([[s.get("in", 0), s.get("out", 0), s.get("tmp", 0)] for s in sizes], dtype=np.int64)
    for buf, off, cnt in ((tab.sbuf, tab.soff, tab.scnt), (tab.dbuf, tab.doff, tab.dcnt)):
        has = buf >= 0
        b = buf[has].astype(np.int64)
        if b.size and b.max() > 2:
            return None
        o, c = off[has], cnt[has]
        if ((c < 1) | (o < 0) | (o + c > limit[rank[has], b])).any():
            return None
    if (tab.dbuf == 0).any():
        return None
    local = (code == 3) | (code == 4)
    if (tab.scnt[local] != tab.dcnt[local]).any():
        return None
    in_place = (code == 3) & (tab.extra == 1) & (tab.sbuf == tab.dbuf) & (tab.soff == tab.doff) & (tab.scnt == tab.dcnt)
    overlap = local & (tab.sbuf == tab.dbuf) & (tab.soff < tab.doff + tab.dcnt) & (tab.doff < tab.soff + tab.scnt)
    if (overlap & ~in_place).any():
        return None
    if ((code == 5) & (tab.extra < 1)).any():
        return None
    msg = code <= 2
    p, r, t, tr = tab.peer[msg], rank[msg], tab.tag[msg], tab.tree[msg]
    if ((p < 0) | (p >= n) | (p == r)).any() or ((t < 0) | (t >= MAX_TAG)).any():
        return None
    if ((tr < -1) | (tr >= len(plan.trees))).any():
        return None
    send_ids = np.flatnonzero(code == 0)
    recv_ids = np.flatnonzero((code == 1) | (code == 2))
    if send_ids.size != recv_ids.size:
        return None
    s_key = (rank[send_ids] * n + tab.peer[send_ids]) * MAX_TAG + tab.tag[send_ids]
    r_key = (tab.peer[recv_ids] * n + rank[recv_ids]) * MAX_TAG + tab.tag[recv_ids]
    so = np.argsort(s_key, kind="stable")
    ro = np.argsort(r_key, kind="stable")
    sk, rk = s_key[so], r_key[ro]
    if sk.size and ((sk[1:] == sk[:-1]).any() or (rk[1:] == rk[:-1]).any() or (sk != rk).any()):
        return None
    if (tab.scnt[send_ids[so]] != tab.dcnt[recv_ids[ro]]).any():
        return None
    # the receive matched with each send, sends in op order
    match = np.empty(send_ids.size, dtype=np.int64)
    match[so] = recv_ids[ro]
    # edges A: every dependency, in op order
    a_src, a_dst = deps + first, owner
    # edges B: per send (in op order) send -> recv, then each of the recv's deps -> send
    pos_of_recv = np.full(tab.total, -1, dtype=np.int64)
    pos_of_recv[match] = np.arange(send_ids.size, dtype=np.int64)
    start = np.zeros(tab.total + 1, dtype=np.int64)
    np.cumsum(tab.ndeps, out=start[1:])
    entry = np.flatnonzero(pos_of_recv[owner] >= 0)  # dependency entries of receives
    v = owner[entry]
    pos = np.concatenate([np.arange(send_ids.size, dtype=np.int64), pos_of_recv[v]])
    sub = np.concatenate([np.zeros(send_ids.size, dtype=np.int64), 1 + entry - start[v]])
    b_src = np.concatenate([send_ids, base[rank[v]] + deps[entry]])
    b_dst = np.concatenate([match, send_ids[pos_of_recv[v]]])
    order = np.lexsort((sub, pos))
    src = np.ascontiguousarray(np.concatenate([a_src, b_src[order]]), dtype=np.int64)
    dst = np.ascontiguousarray(np.concatenate([a_dst, b_dst[order]]), dtype=np.int64)
    partner = np.full(tab.total, -1, dtype=np.int64)
    partner[send_ids] = match
    return ScanIndex(tab.base, src, dst, tab, partner, int(a_src.size))
