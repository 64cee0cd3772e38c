"""hcc.backends.adaptive.star — the allreduce in arrival order: star flows, who owns them, and
how an owner reduces and serves them.

Terms
- star flow: one of the allreduce's sub-blocks (each of the n-1 owner slots cut into
  STAR_SPLIT); every other rank sends the owner its piece, the owner sends back the sum.
- claim: before the last arrival, a rank appends ``claim(rank, count)`` to the log and takes
  the next unowned sub-blocks while its link, were the last rank to arrive now, would carry
  no more than CLAIM_CAP hops in either direction (backends/repair.py ``claim_count``).
- share-out: at the log position where every rank has arrived (or died), the unclaimed
  sub-blocks go to the ranks whose links would finish first (``share_by_load``).
- heir: the live rank that takes a dead owner's sub-block (:meth:`StarOwnership.star_heir`).
- relay: once everyone arrived, an owner whose link would finish late lets a child forward
  the result to some of the others (``relay_parents``).

Every decision here is a function of the agreed log prefix and the plan, so every rank
computes the same owners and trees without another message. :class:`StarOwnership` is a
mixin of the engine's :class:`~hcc.backends.adaptive.engine.Run`, whose state it reads.
"""
from __future__ import annotations

import time

import numpy as np

from ..kernels import STAGING, reduce_into
from ..repair import claim_count, relay_parents, share_by_load
from .flows import CLAIM_CAP, CLAIM_WAIT_S, PH_UP, Flow, Pending, tag

__all__ = ["StarOwnership"]


class StarOwnership:
    """The star allreduce's part of a run (see the module docstring)."""

    def star_flows(self) -> list[Flow]:
        return [f for f in self.flows if self.star_all(f)]

    def flow_bytes(self, f: Flow) -> int:
        return (f.chunks[-1][1] - f.chunks[0][0]) * self.plan.itemsize

    def claim_cap(self) -> float:
        """The most bytes one rank may own through claims: CLAIM_CAP x an equal share."""
        total = sum(self.flow_bytes(f) for f in self.star_flows())
        return CLAIM_CAP * total / max(1, self.n - 1) + 1e-6

    def owned_bytes(self, r: int) -> int:
        return sum(self.flow_bytes(self.flows[fid]) for fid, o in self.view.owner.items() if o == r)

    def fold_claim(self, r: int, count: int) -> None:
        """A ``claim(r, count)`` event: ``r`` takes the next ``count`` unowned star flows (in
        flow order) while it stays within :meth:`claim_cap`. Void after the last arrival (the
        rest is then shared by load, :meth:`share_rest`) or from a rank that is dead or not
        arrived. A function of the log prefix: every rank folds the same owners."""
        v = self.view
        if r == self.rank:
            v.claims_folded += 1
        if v.shared or r in v.dead or r not in v.arrivals:
            return
        cap, mine = self.claim_cap(), self.owned_bytes(r)
        for f in self.star_flows():
            if count <= 0:
                break
            if f.fid in v.owner:
                continue
            if mine + self.flow_bytes(f) > cap:
                break
            v.owner[f.fid] = r
            mine += self.flow_bytes(f)
            count -= 1

    def share_rest(self) -> None:
        """At the log position where every rank has arrived (or died): the star flows nobody
        claimed go, in flow order, to the live rank whose link would then finish first
        (repair.share_by_load, from the arrival clocks and the plan's link capacities)."""
        v = self.view
        v.shared = True
        flows = self.star_flows()
        if not flows:
            return
        dead = set(v.dead)
        live = [r for r in v.arrivals if r not in dead]
        if not live:
            return
        given = share_by_load(
            [(f.fid, self.flow_bytes(f), v.owner.get(f.fid, -1)) for f in flows],
            live, v.arrived_at, self._uplinks(), self.n, self._downlinks())
        v.owner.update(given)
        v.late_owned = frozenset(given)

    def maybe_claim(self) -> None:
        """Before the last arrival, claim the next star flows when this rank can absorb them
        (:func:`repair.claim_count`: its link, if the last rank arrived now, would still carry
        no more than CLAIM_CAP x one hop in either direction — out its pieces and results,
        in the absent ranks' pieces and the other results —, and at most about one sub-block
        of pieces per present rank is still on its way in). Claims go through the log (one event per claim, one claim
        in flight per rank), so every rank agrees on the owners."""
        v = self.view
        if v.shared or self.t_arrived is None or self.claims_sent != v.claims_folded:
            return
        flows = self.star_flows()
        if not flows or self.rank not in v.arrivals or self.rank in v.dead:
            return
        if time.monotonic() - self.t_arrived < CLAIM_WAIT_S:
            return
        dead = set(v.dead)
        present = [r for r in v.arrivals if r not in dead]
        if len(present) < 2:
            return  # alone, nobody could send this rank a piece yet
        free = [f for f in flows if f.fid not in v.owner]
        if not free:
            return
        me = self.rank
        item = self.plan.itemsize
        # bytes of this rank's pieces still to leave its link (queued, or not yet sent to a known owner)
        push = 0
        for p in self.pending:
            if p.what == "send" and p.staging is None and not p.req.done and self.flows[p.flow].star:
                a, b = self.flows[p.flow].chunks[p.chunk]
                push += (b - a) * item
        backlog = 0  # pieces of flows this rank owns that present ranks still owe it
        for f in flows:
            o = v.owner.get(f.fid)
            if o == me:
                for a_b, part in zip(f.chunks, f.part):
                    missing = sum(1 for k in present if k != me and not (part >> k) & 1)
                    backlog += missing * (a_b[1] - a_b[0]) * item
            elif o is not None and o not in dead:
                push += sum((b - a) * item for (a, b), to in zip(f.chunks, f.sent_to) if to != o)
        # ...or, where the link is faster than the plan says (loopback), what the plan's link
        # would still hold: the model share_rest uses at the last arrival
        others = sum(self.flow_bytes(f) for f in flows if v.owner.get(f.fid, me) != me
                     and v.owner[f.fid] not in dead)
        push = max(push, others - self._uplinks()[me] * (time.monotonic() - self.t_arrived))
        up, down = self._uplinks(), self._downlinks()
        # the incoming side too: pieces the absent ranks would send in, results of the rest
        m = claim_count([self.flow_bytes(f) for f in free], self.owned_bytes(me), int(push), backlog,
                        len(present), self.n, self.claim_cap(), up[me] / max(up),
                        total=sum(self.flow_bytes(f) for f in flows), speed_in=down[me] / max(down))
        if m > 0:
            self.claims_sent += 1
            self.stats["claims"] = self.claims_sent  # log events this rank appended (tests count them)
            self.s.log.append({"t": "claim", "run": self.run_id, "rank": me, "count": m})

    def star_heir(self, cand: list[int], f: Flow) -> int:
        """Who owns star flow ``f`` now that its owner is dead: a live rank that owns none
        (often the last rank to arrive: it had only streamed its input up), so that no
        survivor's link carries a second share of results; when none is left, the live ranks
        in arrival order, in turn — a dead owner's sub-blocks spread over the survivors. The
        ``j``-th flow to lose its owner (in the order the owners died, then flow order) takes
        the ``j``-th such rank. Decided only once every rank has arrived (-1 before: the
        owners are final then). A function of the log prefix, so every rank picks the same."""
        if not self.up_complete():
            return -1
        dead = self.view.dead
        blocks = self.star_flows()
        owner = {g.fid: self.view.owner.get(g.fid, -1) for g in blocks}
        orphans = sorted((g for g in blocks if owner[g.fid] in dead),
                         key=lambda g: (dead.index(owner[g.fid]), g.fid))
        j = [g.fid for g in orphans].index(f.fid)
        owned = set(owner.values())
        spare = [x for x in cand if x not in owned and x not in dead]
        if j < len(spare):
            return spare[j]
        live = [x for x in cand if x not in dead]
        return live[(j - len(spare)) % len(live)] if live else -1

    def star_all(self, f: Flow) -> bool:
        """Flow ``f`` is a star over all its members (allreduce in arrival order, no quorum:
        the contributors are every live rank, so nothing about the tree waits for arrivals)."""
        return f.star and self.quorum is None

    def _uplinks(self) -> list[float]:
        """Bytes/s each rank's vertex can send (the plan topology's links out of it)."""
        return self._link_caps("src")

    def _downlinks(self) -> list[float]:
        """Bytes/s each rank's vertex can receive (the plan topology's links into it)."""
        return self._link_caps("dst")

    def _link_caps(self, end: str) -> list[float]:
        """Per rank, the summed capacity of the topology's links whose ``end`` ("src" or
        "dst") is the rank's vertex; computed once per run."""
        caps = self.__dict__.setdefault("_caps_by_end", {})
        if end not in caps:
            total: dict[str, float] = {}
            for link in self.plan.topology.links:
                v = getattr(link, end)
                total[v] = total.get(v, 0.0) + link.capacity
            caps[end] = [total.get(v, 0.0) or 1.0 for v in self.plan.ranks]
        return caps[end]

    def star_down_parents(self) -> dict[int, tuple[int, ...]]:
        """The down trees of the star sub-blocks once every rank has arrived: a star, except
        where an owner's link would finish late. Each rank's link is given a load in seconds
        after the last arrival — what it still had to push (its pieces' bytes over its uplink,
        less the time since it arrived) plus one sub-block per direct child — and, while the
        most loaded owner has a child ``y`` whose load stays below its own after taking one
        more child, one of the owner's other children moves under ``y`` (``y`` relays the
        sub-block to it) — backends/repair.relay_parents. A function of the log (arrival
        order, each arrival's clock) and the plan, so every rank builds the same trees; cached
        per generation and arrival count. Relays were the first answer to a late owner (an
        owner arriving just before the last with its pieces still queued): alone they left
        the emulated star at 1.28x of ideal (4 MiB chunks) / 1.23x (1 MiB). Ownership by
        claims (:meth:`maybe_claim`, :meth:`share_rest`) now keeps such a rank's share small
        or empty; relays only even out what the share-out leaves uneven, and only through a
        rank with no piece left to push — counting the pieces of the sub-blocks the share-out
        gave away, which could not leave before the last arrival (``late_owned``)."""
        v = self.view
        key = (self.gen, len(v.arrivals), len(v.dead))
        if getattr(self, "_relay_key", None) == key:
            return self._relay
        self._relay_key, self._relay = key, {}
        dead = set(v.dead)
        live = [r for r in range(self.n) if r not in dead]
        flows = [f for f in self.flows if self.star_all(f)]
        if any(r not in v.arrived_at for r in live) or len(live) < 3:
            return self._relay
        caps = self._uplinks()
        item = self.plan.itemsize
        size = [(f.chunks[-1][1] - f.chunks[0][0]) * item for f in flows]
        roots = [self.base_root(f) for f in flows]
        if any(r < 0 or r in dead for r in roots):
            return self._relay
        trees = relay_parents(roots, size, [caps[r] for r in range(self.n)], v.arrived_at, live, self.n,
                              [f.fid in v.late_owned for f in flows])
        for f, par in zip(flows, trees):
            if par is not None:
                self._relay[f.fid] = par
        return self._relay

    def star_tag(self, f, c) -> int:
        # generation field 0 whatever the generation: a piece never changes, so a receive
        # posted before a death still matches the piece sent before it (no re-send)
        return tag(self.run_id, 0, PH_UP, f.fid, c)

    def rereduce(self, f, c: int) -> None:
        """Owner: rebuild partial ``c`` from this rank's input and the pieces it holds from
        live contributors — a death costs local reductions, not a second trip of the pieces."""
        a, b = f.chunks[c]
        keep = {r: x for r, x in f.pieces[c].items() if (self.contrib_mask >> r) & 1}
        for r in set(f.pieces[c]) - set(keep):
            STAGING.give(f.pieces[c][r])
        f.pieces[c] = keep
        f.part[c] = 1 << self.rank
        if not keep:
            f.acc[c] = None
            return
        acc = f.acc[c] if f.acc[c] is not None else STAGING.take(b - a, self.inp.dtype)
        acc[...] = self.inp[a:b]
        for r in sorted(keep):
            reduce_into(self.op, self.plan.dtype, acc, keep[r])
            f.part[c] |= 1 << r
        f.acc[c] = acc

    def step_up_star(self, f, st) -> None:
        """The up half of a star over every member (allreduce in arrival order). A member
        sends each chunk of its input to the block's owner once per owner (again only when the
        owner died and an heir took the block). The owner posts one receive per member and
        chunk for the whole run, keeps the pieces (``on_failure = continue``; about M of
        staging per owner: n-1 pieces of M/(n-1)), reduces them as they come, and after a death
        re-reduces locally what it holds from the survivors (:meth:`rereduce`); a chunk is
        final once its partial covers every contributor. No NEED messages in any generation."""
        me, root = self.rank, st["up_root"]
        if root < 0:
            return
        n_ch = len(f.chunks)
        if me != root:
            if st["my_need"] is None:
                st["my_need"] = np.ones(n_ch, dtype=bool)
            for c in range(n_ch):
                if f.sent_to[c] != root:
                    f.sent_to[c] = root
                    a, b = f.chunks[c]
                    req = self.comm.isend(root, self.star_tag(f, c), memoryview(self.inp[a:b]).cast("B"))
                    self.pending.append(Pending(req, "send", f.fid, c, root, None))
                    if self.trace is not None:
                        self.trace.append((time.monotonic(), "ps", f.fid, c, root))
                    self.stats["pieces_sent"] = self.stats.get("pieces_sent", 0) + 1
                st["up_sent"].add(c)
            return
        if st["my_need"] is None:
            for c in range(n_ch):
                if f.part[c] == 0:
                    f.part[c] = 1 << me  # nothing held yet: the partial is this rank's input
                elif f.part[c] & ~self.contrib_mask:
                    self.rereduce(f, c)  # it included a rank that died
            st["my_need"] = ~self.valid_mask(f)
        need = st["my_need"]
        dead = set(self.view.dead)
        for c in np.flatnonzero(need):
            c = int(c)
            for k in st["up_kids"]:
                if k not in dead and k not in f.rposted[c] and not (f.part[c] >> k) & 1:
                    f.rposted[c].add(k)
                    a, b = f.chunks[c]
                    staging = STAGING.take(b - a, self.inp.dtype)
                    req = self.comm.irecv(k, self.star_tag(f, c), memoryview(staging).cast("B"))
                    self.pending.append(Pending(req, "up", f.fid, c, k, staging))
            if c not in st["up_sent"] and f.part[c] == st["my_sub"]:
                self.deliver_up(f, st, c)
