"""hcc.backends.adaptive.engine — one adaptive run on one rank: the main loop, generations,
tree shapes, the down and up halves of every flow, completions, and the fast path.

Terms (the package docstring gives the protocol; flows.py the flows and tags)
- view: what the agreed log prefix says — arrivals, deaths, done markers, the star owners
  (:class:`View`). Every decision of a run is a function of it.
- generation: the number of deaths in the log; a new one re-shapes every tree around the
  dead (backends/repair.py) and resumes from the chunks already valid.
- fast path (fast.py, :meth:`~.fast.FastPath.decide`): with ``on_failure = abort`` and no
  quorum, the ranks first agree on one store counter whether everyone arrived in time; then
  the plan's flattened program runs (backends/executor.py) and the log is not touched.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

from ...ir.plan import FLOAT_DTYPES, ROOTED_KINDS, Plan, block_range
from ..base import CollectiveTimeout, RankFailed, RootFailed, RuntimeFault, Transport
from ..kernels import STAGING, reduce_into, scale_into
from ..repair import arrival_parents, bfs_order, repair_parents, subtree
from .flows import (CTRL_HAVE, CTRL_NEED, FANOUT, KINDS, MIN_CHUNK, PH_CTRL, PH_DOWN, PH_UP, STAR_CHUNK,
                    STAR_CHUNK_S, WAIT_SLICE, AdaptiveUnsupported, Flow, Pending, chunk_elems, make_flows, ranges,
                    tag)
from .result import AdaptiveResult, dump_state, package
from .session import Session, session_of, transport_dead, wait_for_change
from .fast import FastPath
from .star import StarOwnership

__all__ = ["Run", "View", "run"]

@dataclass
class View:
    """What the log prefix says: arrivals, dead, generation, finish."""

    arrivals: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    dead_before_arrival: set[int] = field(default_factory=set)
    arrived_at: dict[int, float] = field(default_factory=dict)  # rank -> its "at" (wall clock)
    done: dict[int, set] = field(default_factory=dict)  # generation -> ranks done in it
    finished: bool = False
    pos: int = 0  # events folded
    # the generation at this run's first arrival: in it HAVE/NEED are implied (nobody holds
    # anything yet), so the run's first generation sends no control message
    base_gen: int | None = None
    # star allreduce: star flow id -> its owner, from ``claim`` events folded before the last
    # arrival, then (``shared``) the rest given out by load at the last arrival
    owner: dict[int, int] = field(default_factory=dict)
    shared: bool = False
    late_owned: frozenset = frozenset()  # star flow ids whose owner the share-out chose
    claims_folded: int = 0  # this rank's own claim events folded so far


class Run(StarOwnership, FastPath):
    """One adaptive run of one rank (see the module docstring)."""

    def __init__(self, plan: Plan, comm: Transport, session: Session, inp: np.ndarray, out: np.ndarray,
                 timeout: float, static: bool, quorum: int | None, ce: int, progress: Callable | None,
                 fast: bool = False, explicit_chunk: bool = False, trace: bool = False):
        self.plan, self.comm, self.s = plan, comm, session
        # star allreduce event trace (run(trace=True), fault_bench --trace): per data chunk,
        # (monotonic s, kind, flow, chunk, peer) — kinds: "ps"/"rs" piece/result send posted,
        # "pc"/"rc" the transport took it all, "pi"/"ri" piece/result received whole
        self.trace: list | None = [] if trace else None
        self.fast, self.ran_static = fast, False
        # on_failure = abort without a quorum: no repair, no agreement on contributors, so a
        # rank returns as soon as its own part is done (served_all) instead of at the log's end
        self.abort_mode = plan.on_failure != "continue" and quorum is None
        self.rank, self.n = comm.rank, plan.n
        self.inp, self.out = inp, out
        self.timeout, self.static, self.quorum = timeout, static, quorum
        self.progress = progress
        self.run_id = session.runs
        session.runs += 1
        self.op = plan.op or "sum"
        self.kind = plan.kind
        self.rooted = plan.kind in ROOTED_KINDS
        self._layout = (ce, explicit_chunk)
        self.claims_sent = 0  # claim events this rank appended (maybe_claim)
        self.t_arrived = None
        # the local copy of the log keeps only what this run can need: the deaths so far and
        # the events from the first one not of a finished run (agreement.Tail.compact)
        base, dead = session.tail.compact(self.run_id)
        self.view = View(dead=list(dead), dead_before_arrival=set(dead), pos=base)
        self.gen = -1
        self.first_gen = None
        self.pending: list[Pending] = []
        self.done_posted: set[int] = set()
        self.events = 0
        self.known_dead: set[int] = set()
        self.contrib: list[int] = []
        self.contrib_mask = 0
        self.stats = {"chunks_received": 0, "chunks_sent": 0, "received_before_repair": 0}

    @cached_property
    def flows(self) -> list[Flow]:
        """The run's flows (flows.make_flows), laid out on first use: a fast-path run that
        turns static never needs them (~0.1-0.3 ms a call in Python)."""
        ce, explicit_chunk = self._layout
        # an explicit chunk size (run(chunk_bytes=...)) applies to every flow, stars included;
        # otherwise a star chunk is STAR_CHUNK_S of the slowest rank's link, within
        # [MIN_CHUNK, STAR_CHUNK]
        star_b = min(STAR_CHUNK, max(MIN_CHUNK, int(min(self._uplinks()) * STAR_CHUNK_S)))
        flows = make_flows(self.plan, self.static, ce, ce if explicit_chunk else max(ce, star_b // self.plan.itemsize))
        self.stats["chunks"] = sum(len(f.chunks) for f in flows)
        return flows

    # ---- the log -------------------------------------------------------------------------
    def fold(self) -> None:
        evs = self.s.tail.snapshot(self.view.pos)
        v = self.view
        for ev in evs:
            v.pos += 1
            if v.finished:
                continue
            t = ev.get("t")
            if t == "dead":
                d = int(ev["rank"])
                if d not in v.dead:
                    v.dead.append(d)
                    if d not in v.arrivals:
                        v.dead_before_arrival.add(d)
            elif ev.get("run") != self.run_id:
                continue
            elif t == "arr":
                if v.base_gen is None:
                    v.base_gen = len(v.dead)
                if ev["rank"] not in v.arrivals and ev["rank"] not in v.dead:
                    v.arrivals.append(int(ev["rank"]))
                    if "at" in ev:
                        v.arrived_at[int(ev["rank"])] = float(ev["at"])
            elif t == "done":
                v.done.setdefault(int(ev["gen"]), set()).add(int(ev["rank"]))
            elif t == "claim":
                self.fold_claim(int(ev["rank"]), int(ev.get("count", 1)))
            if not v.shared and len(set(v.arrivals) | set(v.dead)) >= self.n:
                self.share_rest()
            g = len(v.dead)
            live = set(range(self.n)) - set(v.dead)
            if v.done.get(g, set()) >= live:
                v.finished = True
        if self.s.tail.error is not None and not v.finished:
            raise RuntimeFault(f"rank {self.rank}: lost the agreement store ({self.s.tail.error})")

    # ---- shapes --------------------------------------------------------------------------
    def contributors(self) -> list[int]:
        dead = set(self.view.dead)
        if self.kind not in ("reduce", "allreduce"):
            return [r for r in range(self.n) if r not in dead]
        if self.quorum is None:
            return [r for r in range(self.n) if r not in dead]
        return [r for r in self.first_arrivals() if r not in dead]

    def first_arrivals(self) -> list[int]:
        """The ranks whose inputs are wanted, in arrival order, dead ones included."""
        if self.quorum is None:
            return list(self.view.arrivals)
        first = [self.plan.root] if self.kind == "reduce" else []
        for r in self.view.arrivals:
            if len(first) >= self.quorum:
                break
            if r not in first:
                first.append(r)
        return first

    def base_root(self, f: Flow) -> int:
        """The root of flow ``f`` before repair; -1 while it is not known yet."""
        if self.kind != "allreduce" or f.static_parent is not None:
            return f.root
        cand = self.first_arrivals()
        if not self.star_all(f):
            return self._block_owner(cand, f.root)  # quorum: slot i is the i-th arrival's
        r = self.view.owner.get(f.fid, -1)
        if r < 0 or r not in self.view.dead:
            return r
        return self.star_heir(cand, f)

    def _block_owner(self, cand: list[int], i: int) -> int:
        """The owner of block ``i`` before any death: the ``i``-th arrival."""
        if i < len(cand):
            return cand[i]
        if cand and self.up_complete():  # fewer ranks than blocks will ever arrive
            return cand[i % len(cand)]
        return -1

    def up_complete(self) -> bool:
        """Every rank that will contribute has arrived (or died)."""
        if self.static and self.quorum is None:
            return True
        arrived = set(self.view.arrivals) | set(self.view.dead)
        if self.quorum is None:
            return len(arrived) == self.n
        want = min(self.quorum, self.n - len(self.view.dead_before_arrival))
        got = len([r for r in self.view.arrivals if r not in self.view.dead_before_arrival])
        return got >= want or len(arrived) == self.n

    def shape(self, f: Flow, members: Sequence[int], root: int) -> tuple[tuple[int, ...], int]:
        """``(parent array, root)`` of flow ``f`` over ``members``, rooted at ``root`` before
        repair, for the current log prefix."""
        dead = set(self.view.dead)
        if root < 0:
            return tuple([-1] * self.n), -1
        if f.static_parent is not None:
            base = tuple(p if (c in members and p in members) else -1 for c, p in enumerate(f.static_parent))
            # members the restricted static tree no longer reaches hang off the root
            reach = set(bfs_order(base, root))
            base = tuple(root if (c in members and c not in reach) else p for c, p in enumerate(base))
        elif self.star_all(f):
            # a star over every member, arrived or not: leaves are leaves whatever the order,
            # so the root waits for no log event — a piece that arrives proves its sender
            # arrived (the log is a store round trip per event behind; 8 ranks on 2 busy cores
            # saw arrivals up to 0.5 s late)
            base = tuple(-1 if (r == root or r not in members) else root for r in range(self.n))
        else:
            order = [root] + [r for r in self.view.arrivals if r in members and r != root]
            # broadcast: a chain in arrival order (every rank forwards the buffer once, the
            # last to arrive is the tail); elsewhere a binary heap (each flow carries 1/n)
            fanout = 1 if self.kind == "broadcast" else max(1, self.n - 1) if f.star else FANOUT
            base = arrival_parents(order, self.n, fanout)
        if root in dead:
            if self.kind != "allreduce":
                return tuple([-1] * self.n), -1
            live = [r for r in bfs_order(base, root) if r not in dead]
            if not live:
                return tuple([-1] * self.n), -1
            return repair_parents(base, root, dead, promote=True), live[0]
        return repair_parents(base, root, dead), root

    def new_generation(self) -> None:
        v = self.view
        self.gen = len(v.dead)
        if self.first_gen is None:
            self.first_gen = self.gen
        dead = set(v.dead)
        if dead and self.plan.on_failure != "continue":
            d = v.dead[0]
            cls = RootFailed if (self.rooted and d == self.plan.root) else RankFailed
            raise cls(d, by=self.rank, detail="on_failure = abort")
        if self.rooted and self.plan.root in dead:
            raise RootFailed(self.plan.root, by=self.rank, detail="the root died; on_failure = continue "
                             "cannot deliver a rooted collective without it")
        # a star piece is its sender's input in every generation: its receive (posted once per
        # owner, member and chunk, with a generation-free tag) is kept while both live
        self.pending = [p for p in self.pending if p.peer not in dead and (
            p.what == "send" or (p.what == "up" and self.star_all(self.flows[p.flow])))]
        self.g = {}  # per-flow state of this generation
        for f in self.flows:
            self.g[f.fid] = {"root_dead": f.root in dead, "have_sent": False, "need_got": None,
                             "kids_have": {}, "kid_need_sent": set(), "kid_have_posted": set(),
                             "up_from": {}, "my_need": None, "up_sent": set(), "up_posted": set(),
                             "dirty": set()}
        self.refresh_shapes()

    def refresh_shapes(self) -> None:
        """Recompute the trees from the log (arrivals add leaves; the generation fixes deaths)."""
        contrib = set(self.contributors())
        mask = sum(1 << r for r in contrib)
        old = getattr(self, "contrib_mask", None)
        if old is not None and old != mask and getattr(self, "_mask_gen", None) == self.gen:
            # A quorum run's contributors grow with the arrivals this rank has folded. A down
            # chunk is final for its generation (a root delivers only once every contributor
            # is in), but its receiver stamped it with the mask of the log prefix it had then
            # folded, which may lag the sender's: restamp it, or the chunk would look invalid
            # and, never sent again, hold the run until its deadline (seen 2 in 30 runs of the
            # 5-rank quorum test). Within a generation only a down receive (or the root's own
            # final delivery) writes ``have``.
            for f in self.flows:
                if f.up:
                    f.have[f.have == old] = mask
        self.contrib_mask, self._mask_gen = mask, self.gen
        self.contrib = sorted(contrib)
        me = self.rank
        for f in self.flows:
            st = self.g[f.fid]
            if f.up:
                # dead ranks keep their positions in the base tree (repair then removes them),
                # so the up tree and the down tree are repaired the same way
                up_members = [r for r in f.members if r in contrib or r in self.view.dead]
                par, root = self.shape(f, up_members, self.base_root(f))
                st["up_parent"], st["up_root"] = par, root
                st["up_kids"] = [c for c, p in enumerate(par) if p == me]
                st["my_sub"] = sum(1 << r for r in subtree(par, me)) if me in contrib else 0
                st["kid_sub"] = {k: sum(1 << r for r in subtree(par, k)) for k in st["up_kids"]}
            if f.down:
                par, root = self.shape(f, f.members, self.base_root(f))
                if self.star_all(f) and root >= 0 and self.up_complete():
                    par = self.star_down_parents().get(f.fid, par)
                st["down_parent"], st["down_root"] = par, root
                st["down_kids"] = [c for c, p in enumerate(par) if p == me]

    # ---- helpers -------------------------------------------------------------------------
    def valid_mask(self, f: Flow) -> np.ndarray:
        return f.have == self.contrib_mask if f.up else f.have >= 0

    def valid(self, f: Flow, c: int) -> bool:
        key = f.have[c]
        return key >= 0 and (key == self.contrib_mask if f.up else True)

    def down_key(self, f: Flow) -> int:
        return self.contrib_mask if f.up else 0

    def post_recv(self, what, f, c, peer, ph, ctrl_bytes=0):
        if what in ("have", "need"):
            staging = np.empty(ctrl_bytes, dtype=np.uint8)
            t = tag(self.run_id, self.gen, PH_CTRL, f.fid, CTRL_HAVE if what == "have" else CTRL_NEED)
        else:
            a, b = f.chunks[c]
            # pooled (backends/kernels.py STAGING: no page faults per chunk); returned to the
            # pool only once complete — an abandoned receive's chunk is left to the collector
            staging = STAGING.take(b - a, self.inp.dtype)
            t = tag(self.run_id, self.gen, ph, f.fid, c)
        req = self.comm.irecv(peer, t, memoryview(staging).cast("B"))
        self.pending.append(Pending(req, what, f.fid, c, peer, staging))

    def send(self, f, c, peer, ph, arr):
        t = tag(self.run_id, self.gen, ph, f.fid, c if ph != PH_CTRL else c)
        req = self.comm.isend(peer, t, memoryview(arr).cast("B"))
        self.pending.append(Pending(req, "send", f.fid, c, peer, arr if ph == PH_CTRL else None))
        if self.trace is not None and ph != PH_CTRL and f.star:
            self.trace.append((time.monotonic(), "rs" if ph == PH_DOWN else "us", f.fid, c, peer))

    def bits(self, f, pred) -> np.ndarray:
        return np.packbits(np.array([bool(pred(c)) for c in range(len(f.chunks))], dtype=bool))

    def unbits(self, f, packed: np.ndarray) -> np.ndarray:
        return np.unpackbits(packed)[: len(f.chunks)].astype(bool)

    def down_src(self, f, c) -> np.ndarray:
        a, b = f.chunks[c]
        if self.rank == f.root and not f.up:
            return self.inp[a - f.src_off: b - f.src_off]
        return self.out[a:b]

    # ---- progress: post whatever the state allows ------------------------------------------
    def implied(self) -> bool:
        """HAVE/NEED are implied in the run's first generation: no member holds a valid
        chunk of a flow it does not root, every root needs every chunk (saves 2 messages per
        tree edge; generations after a death exchange them, since survivors then resume)."""
        return self.gen == self.view.base_gen

    def step(self) -> None:
        if self.view.base_gen is None:
            return  # this run's first arrival is not in the log yet: nothing to do
        for f in self.flows:
            st = self.g[f.fid]
            if st["root_dead"] and not f.up:
                continue  # allgather/gather: the owner of this block is dead (missing)
            if f.up and self.rank in self.contrib:
                if self.star_all(f):
                    self.step_up_star(f, st)
                else:
                    self.step_up(f, st)
            if f.down and self.rank in f.members:
                if self.star_all(f) and not self.up_complete():
                    continue  # a star block's down tree is fixed once everyone arrived
                self.step_down(f, st)

    def step_down(self, f, st) -> None:
        par = st["down_parent"]
        me = self.rank
        implied = self.implied()
        if me != st["down_root"] and par[me] >= 0 and not st["have_sent"]:
            missing = [c for c in range(len(f.chunks)) if not self.valid(f, c)]
            st["have_sent"] = True
            if missing:
                if not implied:
                    self.send(f, CTRL_HAVE, par[me], PH_CTRL, self.bits(f, lambda c: self.valid(f, c)))
                # always into a staging chunk, copied into out on completion: the transport
                # cannot cancel a posted receive, so a receive dropped by a repair must never
                # point into the caller's buffer (a late frame would land there after return)
                for c in missing:
                    self.post_recv("down", f, c, par[me], PH_DOWN)
        nbytes = (len(f.chunks) + 7) // 8
        for k in st["down_kids"]:
            if k not in st["kid_have_posted"] and k not in self.view.dead:
                st["kid_have_posted"].add(k)
                if implied:
                    st["kids_have"][k] = np.ones(len(f.chunks), dtype=bool)
                else:
                    self.post_recv("have", f, -1, k, PH_CTRL, ctrl_bytes=nbytes)
        if st["kids_have"]:
            valid = self.valid_mask(f)
            for k, need in st["kids_have"].items():
                todo = np.flatnonzero(need & valid)
                if todo.size:
                    need[todo] = False  # sent: the child needs it no more from us
                    for c in todo:
                        self.send(f, int(c), k, PH_DOWN, self.down_src(f, int(c)))

    def deliver_up(self, f, st, c: int) -> None:
        """Partial ``c`` covers this rank's whole subtree: finalize it (root) or send it up."""
        st["up_sent"].add(c)
        a, b = f.chunks[c]
        partial = f.acc[c] if f.acc[c] is not None else self.inp[a:b]
        if self.rank == st["up_root"]:
            self.out[a:b] = partial
            if self.op == "avg":
                scale_into(self.plan.dtype, self.out[a:b], bin(f.part[c]).count("1"))
            f.have[c] = f.part[c]
        else:
            self.send(f, c, st["up_parent"][self.rank], PH_UP, partial)

    def step_up(self, f, st) -> None:
        me = self.rank
        par = st["up_parent"]
        root = st["up_root"]
        if root < 0 or (me != root and par[me] < 0):
            return  # the flow's root, or this rank's place in it, is not known yet
        complete = self.up_complete()
        implied = self.implied()
        if st["my_need"] is None:
            if me == root:
                asked = ~self.valid_mask(f)
            elif implied:
                asked = np.ones(len(f.chunks), dtype=bool)
            elif st["need_got"] is not None:
                asked = st["need_got"]
            else:
                if "need_posted" not in st:
                    st["need_posted"] = True
                    self.post_recv("need", f, -1, par[me], PH_CTRL, ctrl_bytes=(len(f.chunks) + 7) // 8)
                return
            need = np.zeros(len(f.chunks), dtype=bool)
            for c in np.flatnonzero(asked):
                c = int(c)
                if (complete or self.star_all(f)) and st["my_sub"] and f.part[c] == st["my_sub"]:
                    self.deliver_up(f, st, c)  # clean: resume, nothing below is redone
                else:
                    need[c] = True
                    f.acc[c] = None  # the partial restarts from this rank's input (never written)
                    f.part[c] = 1 << me
            st["my_need"] = need
            st["up_from"] = {int(c): set() for c in np.flatnonzero(need)}
            st["dirty"] = set(st["up_from"])
        need = st["my_need"]
        if not implied:
            for k in st["up_kids"]:
                if k not in st["kid_need_sent"] and k not in self.view.dead:
                    st["kid_need_sent"].add(k)
                    self.send(f, CTRL_NEED, k, PH_CTRL, np.packbits(need))
        # In a heap, partials are taken in only once every contributor has arrived, so the
        # subtree a child's partial covers (kid_sub) is final for this generation and
        # f.part[c] says exactly which inputs the partial holds (a clean partial can then be
        # reused). In a star every child is a leaf whatever arrives later: its partial is
        # its own input, so the root takes it in at once and leaves send theirs as soon as
        # the root is known (pre-reduction); only the root's delivery waits for everyone.
        if not (complete or f.star):
            return
        for k in st["up_kids"]:
            if k not in st["up_posted"] and k not in self.view.dead:
                st["up_posted"].add(k)
                for c in np.flatnonzero(need):
                    self.post_recv("up", f, int(c), k, PH_UP)
        kids = set(st["up_kids"])
        if st.get("kids_seen") != kids or st.get("complete_seen") != complete:
            # the children changed (arrivals) or everyone is in now: look at every chunk
            st["kids_seen"], st["complete_seen"] = kids, complete
            st["dirty"] = set(st["up_from"])
        if not (complete or self.star_all(f)) and me == root:
            return  # the root's partial is final only once every contributor is in
        dirty, st["dirty"] = st["dirty"], set()
        for c in dirty:
            if c not in st["up_sent"] and st["up_from"][c] >= kids:
                self.deliver_up(f, st, c)

    # ---- completions -----------------------------------------------------------------------
    def complete(self, p: Pending) -> None:
        if p.what == "send":
            if p.staging is None:  # a data chunk, not a HAVE/NEED bitmap
                self.stats["chunks_sent"] += 1
                f = self.flows[p.flow]
                if f.star:  # when this rank's last piece / result copy left (fault_bench's trace)
                    own = self.g[f.fid].get("up_root") == self.rank
                    self.stats["t_result_out" if own else "t_piece_out"] = time.monotonic()
                    if self.trace is not None:
                        self.trace.append((time.monotonic(), "rc" if own else "pc", f.fid, p.chunk, p.peer))
                if self.progress is not None:
                    self.progress()
            return
        f = self.flows[p.flow]
        st = self.g[f.fid]
        if p.what == "have":
            st["kids_have"][p.peer] = ~self.unbits(f, p.staging)
            return
        if p.what == "need":
            st["need_got"] = self.unbits(f, p.staging)
            return
        a, b = f.chunks[p.chunk]
        if f.star:  # when the last piece / result came in (clock of this machine, monotonic)
            self.stats["t_result_in" if p.what == "down" else "t_piece_in"] = time.monotonic()
            if self.trace is not None:
                self.trace.append((time.monotonic(), "ri" if p.what == "down" else "pi", f.fid, p.chunk, p.peer))
        if p.what == "down":
            self.out[a:b] = p.staging
            STAGING.give(p.staging)
            f.have[p.chunk] = self.down_key(f)
        elif self.star_all(f):  # a member's piece of a star block this rank owns
            c, keep = p.chunk, not self.abort_mode
            if (self.contrib_mask >> p.peer) & 1 and not (f.part[c] >> p.peer) & 1:
                if keep:  # kept for a re-reduction after a death (rereduce)
                    f.pieces[c][p.peer] = p.staging
                if f.acc[c] is None:
                    acc = p.staging
                    if keep:
                        acc = STAGING.take(b - a, self.inp.dtype)
                        acc[...] = p.staging
                    reduce_into(self.op, self.plan.dtype, acc, self.inp[a:b])
                    f.acc[c] = acc
                else:
                    reduce_into(self.op, self.plan.dtype, f.acc[c], p.staging)
                    if not keep:
                        STAGING.give(p.staging)
                f.part[c] |= 1 << p.peer
        else:  # "up": a child's partial
            if f.acc[p.chunk] is None:
                # the first child's chunk becomes the partial: staging (op)= input, no copy
                reduce_into(self.op, self.plan.dtype, p.staging, self.inp[a:b])
                f.acc[p.chunk] = p.staging
            else:
                reduce_into(self.op, self.plan.dtype, f.acc[p.chunk], p.staging)
                STAGING.give(p.staging)
            f.part[p.chunk] |= st["kid_sub"][p.peer]
            st["up_from"].setdefault(p.chunk, set()).add(p.peer)
            st.setdefault("dirty", set()).add(p.chunk)
        self.stats["chunks_received"] += 1
        if self.gen == self.first_gen:
            self.stats["received_before_repair"] += 1
        if self.progress is not None:
            self.progress()

    def own_output_complete(self) -> bool:
        me, kind = self.rank, self.kind
        for f in self.flows:
            if self.g[f.fid]["root_dead"] and kind in ("allgather", "gather"):
                continue  # the owner died: its block is missing, nothing to wait for
            if kind in ("reduce", "gather") and me != self.plan.root:
                continue  # out is scratch on non-roots
            if not self.valid_mask(f).all():
                return False
        return True

    def served_all(self) -> bool:
        """``on_failure = abort``: this rank's part is over — its output is complete, every
        chunk it owes a parent or a child is sent (and the sends complete), and no tree can
        still change (every rank arrived, or the flow is a star over all members). No death
        can be repaired in this mode, so nothing else is owed and no ``done`` agreement is
        needed: as with the static executor, a rank returns when its own work is done (it
        saves the log's n appends and n reads at the end of every run)."""
        v = self.view
        if any(p.what == "send" and not p.req.done for p in self.pending):
            return False
        shape_final = len(v.arrivals) + len(v.dead) >= self.n
        dead = set(v.dead)
        me = self.rank
        for f in self.flows:
            st = self.g[f.fid]
            if not (shape_final or self.star_all(f)):
                return False
            if st["root_dead"] and not f.up:
                continue
            if f.up and me in self.contrib and me != st["up_root"]:
                need = st["my_need"]
                if need is None or any(int(c) not in st["up_sent"] for c in np.flatnonzero(need)):
                    return False
            if f.down and me in f.members:
                for k in st["down_kids"]:
                    if k not in dead and (k not in st["kids_have"] or st["kids_have"][k].any()):
                        return False
        return True

    def finish_abort_mode(self) -> None:
        """``on_failure = abort``: the run ends when every rank has served its part, unless a
        rank dies first (then every rank that has not seen the end raises RankFailed). One
        store counter per session (``fin``, counting every rank's finished abort-mode runs)
        replaces the log's ``done`` events: one ``add`` and one server-side ``wait`` instead
        of n appends and n reads. A death seen before the count is full raises, unless the
        count is full when checked after it (the dead rank had finished: the run had ended
        everywhere, its death does not change it)."""
        from ..rendezvous import RendezvousError

        client = self.s.log.client
        key = f"{self.s.log.prefix}/fin"
        # every rank that finished each earlier such run added 1 (a run that lost a rank
        # raises everywhere, and so does every later abort-mode run: the death is in the log)
        self.s.abort_runs += 1
        target = self.n * self.s.abort_runs
        client.add(key, 1)
        start = time.monotonic()
        while True:
            try:
                client.wait(key, target, WAIT_SLICE)
                return
            except RendezvousError as e:
                if "timeout" not in str(e):
                    raise RuntimeFault(f"rank {self.rank}: lost the agreement store ({e})") from None
            self.report_deaths()
            self.fold()
            if len(self.view.dead) != self.gen:
                if int(client.add(key, 0)) >= target:
                    return
                self.new_generation()  # raises RankFailed / RootFailed
            if time.monotonic() - start > self.timeout:
                raise CollectiveTimeout(self.rank, -1, f"adaptive run {self.run_id}: waiting for the "
                                        "other ranks to finish", self.timeout)

    # ---- the loop --------------------------------------------------------------------------
    def report_deaths(self) -> None:
        """Append the deaths this rank's transport saw (once per dead rank, agreement.py)."""
        seen = transport_dead(self.comm)
        for d in seen - self.s.reported - set(self.view.dead):
            self.s.reported.add(d)
            self.s.log.report_dead(d)
        self.known_dead |= seen

    def own_data(self) -> None:
        """Put this rank's own data where the adaptive schedule expects it: its block of an
        allgather (or a gather's root), a broadcast root's whole input, marked valid. Not on
        the fast path: the static program copies what it needs (a 64 MiB in-place broadcast
        root would copy its buffer onto itself for nothing)."""
        plan, rank, inp, out = self.plan, self.rank, self.inp, self.out
        if plan.kind in ("allgather", "gather"):
            if plan.kind == "allgather" or rank == plan.root:
                lo, hi = block_range(plan.elems, plan.n, rank)
                out[lo:hi] = inp
            for f in self.flows:
                if f.root == rank:
                    f.have[:] = 0  # this rank owns the block its flow carries
        if plan.kind == "broadcast" and rank == plan.root:
            out[...] = inp
            for f in self.flows:
                f.have[:] = 0

    def execute(self) -> None:
        t0 = time.monotonic()
        if self.fast and self.decide():
            self.run_static()
            return
        self.own_data()
        self.s.greet(self.comm)
        # "t": this rank's wall clock at arrival — the star allreduce's down trees weigh how
        # much of its input each rank still had to push when the last one arrived
        # (Run.star_down_parents; one machine's clock here, NTP-synchronised hosts elsewhere)
        self.s.log.append({"t": "arr", "run": self.run_id, "rank": self.rank, "at": time.time()})
        self.t_arrived = time.monotonic()
        self.stats["t_arrived"] = self.t_arrived
        self.stats["path"] = "adaptive"
        last = time.monotonic()
        while True:
            seen = self.s.tail.length
            before = (len(self.view.arrivals), len(self.view.dead), len(self.view.owner))
            self.fold()
            if "all_arrived_s" not in self.stats and len(self.view.arrivals) + len(self.view.dead) >= self.n:
                self.stats["all_arrived_s"] = time.monotonic() - t0
            if self.view.finished:
                self.stats["finished_s"] = time.monotonic() - t0
                return
            if len(self.view.dead) != self.gen:
                if self.gen >= 0:
                    # transfers that completed before the switch count in the old generation
                    # (a chunk that arrived whole from a rank that then died is kept)
                    for p in [p for p in self.pending if p.req.done]:
                        self.pending.remove(p)
                        self.complete(p)
                self.new_generation()
            elif (len(self.view.arrivals), len(self.view.dead), len(self.view.owner)) != before:
                self.refresh_shapes()
            self.report_deaths()
            self.step()
            self.maybe_claim()
            if self.gen not in self.done_posted and self.own_output_complete():
                self.done_posted.add(self.gen)
                self.stats["output_s"] = time.monotonic() - t0
                if not self.abort_mode:
                    self.s.log.append({"t": "done", "run": self.run_id, "rank": self.rank, "gen": self.gen})
            if self.abort_mode and self.gen in self.done_posted and self.served_all():
                self.finish_abort_mode()
                self.stats["finished_s"] = time.monotonic() - t0
                return
            live = [p for p in self.pending if p.peer not in self.view.dead]
            reqs = [p.req for p in live]
            # while claims are open, look again every WAIT_SLICE (a claim may wait on nothing
            # but CLAIM_WAIT_S or a piece send leaving this rank's link)
            slice_s = WAIT_SLICE if not self.view.shared and self.t_arrived is not None else WAIT_SLICE * 5
            done = wait_for_change(self.comm, self.s, reqs, slice_s, seen, self.known_dead)
            now = time.monotonic()
            if done:
                last = now
                finished = set(done)
                batch = [live[i] for i in sorted(finished)]
                ids = {id(p) for p in batch}
                self.pending = [p for p in self.pending if id(p) not in ids]
                for p in batch:
                    self.complete(p)
            elif self.s.tail.length != seen:
                last = now
            elif now - last > self.timeout:
                waiting = [p for p in live if p.what != "send"] or live
                peer = waiting[0].peer if waiting else -1
                detail = f"adaptive run {self.run_id}, generation {self.gen}"
                if waiting:
                    detail += f", {waiting[0].what} flow {waiting[0].flow} chunk {waiting[0].chunk}"
                else:  # nothing posted: say what this rank still lacks and who is done
                    lack = [f.fid for f in self.flows if not self.valid_mask(f).all()]
                    detail += (f", nothing posted; output lacks flows {ranges(lack) or 'none'}; "
                               f"done: ranks {sorted(self.view.done.get(self.gen, set()))}")
                dump_state(self, detail)
                raise CollectiveTimeout(self.rank, peer, detail, self.timeout)


def run(plan: Plan, comm: Transport, array=None, *, out=None, timeout: float = 60.0, step: int = 0,
        arrival_order: bool = True, fast: bool = False, quorum: int | None = None,
        chunk_bytes: int | None = None, progress: Callable[[], None] | None = None,
        trace: bool = False) -> AdaptiveResult:
    """Run ``plan`` on rank ``comm.rank`` with the adaptive executor; returns the output as an
    :class:`AdaptiveResult` (an ndarray with ``contributors``/``missing``/``late``/``dead``) —
    or, when the fast path ran the static program, exactly what the static executor returns
    (the caller's ``out`` itself when given). The runtime (backends/runtime.py) decides that
    a call runs here and with which of the options below.

    ``arrival_order``: lay the trees out in the order the ranks arrive (else ``Plan.trees``
    as compiled, repaired around deaths). ``fast``: first agree whether every rank arrived
    before any declared the run late (:meth:`Run.decide`); if so the flattened program runs
    and only a run with a late rank pays for the adaptive schedule. ``quorum=K`` (reduce, allreduce): reduce the first K inputs that arrive
    (reduce: the root's and the first K-1 others'); the others are reported in ``late``.
    ``timeout``: the longest the run may make no progress. ``progress``: called after every
    data chunk this rank sends or receives (fault injection; it turns the fast path off).
    ``trace``: a star allreduce records every data chunk's send post, send completion and
    receive in ``stats["events"]`` (benchmarks/fault_bench.py --trace)."""
    from ..executor import InputMismatch, caller_buffers

    if plan.kind not in KINDS:
        raise AdaptiveUnsupported(f"the adaptive runtime does not run {plan.kind!r} collectives")
    if plan.compress not in (None, "none"):
        raise AdaptiveUnsupported("the adaptive runtime does not run compressed plans")
    if quorum is not None:
        if plan.kind not in ("reduce", "allreduce"):
            raise InputMismatch(f"quorum applies to reduce and allreduce, not {plan.kind}")
        if not 1 <= int(quorum) <= plan.n:
            raise InputMismatch(f"quorum must be in 1..{plan.n}, not {quorum}")
        if plan.op == "avg" and plan.dtype not in FLOAT_DTYPES:
            raise InputMismatch("quorum with op = avg needs a float dtype")
    rank, inp, out_flat, result = caller_buffers(plan, comm, array, out, timeout, zero_fill=True)
    plain = plan.on_failure != "continue" and quorum is None and progress is None
    ce = chunk_elems(plan, chunk_bytes)
    session = session_of(comm)
    r = Run(plan, comm, session, inp, out_flat, float(timeout), not arrival_order,
            None if quorum is None else int(quorum), ce, progress, fast=fast and plain,
            explicit_chunk=chunk_bytes is not None, trace=trace)
    r.execute()
    if r.ran_static:
        return result  # the fast path: exactly what the static executor returns
    return package(r, result if isinstance(result, np.ndarray) else out_flat)
