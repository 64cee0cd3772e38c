"""hcc.backends.adaptive — the dynamic, tree-based executor: late ranks and dead ranks do not
stall the others (Hoplite, SIGCOMM 2021; design.md "Adaptive hooks").

Where backends/executor.py interprets a plan's flattened per-rank programs, this executor runs
from the plan's *trees* and decides at run time who sends which chunk to whom, so it can
re-attach the children of a dead rank to a live ancestor (backends/repair.py) and give the
interior positions of a tree to the ranks that are ready first.

Terms
- flow: one tree's worth of work: a root rank, the ranks it spans, an element span of the
  output split into chunks, and a direction: *down* (the root's data to every member:
  broadcast, allgather's per-rank trees, gather's owner→root hops, allreduce's second half)
  and/or *up* (a reduction of the members' inputs to the root: reduce, allreduce's first half).
- shape: ``static`` (adaptive off) takes each flow's parent array from ``Plan.trees``;
  ``arrival`` (adaptive on) lays the flow's members out in the order they entered the run,
  the root first, so ready ranks are interior and late ranks are leaves
  (repair.arrival_parents): a chain for broadcast, a binary heap for reduce, allgather and
  gather. An allreduce in arrival order runs *star* flows over 8(n-1) sub-blocks (a direct
  reduce-scatter + allgather: every rank sends a sub-block's owner its piece, the owner sends
  back the sum). A sub-block is owned by the rank that *claimed* it through the log before
  the last arrival — a rank claims while its link, were the last rank to arrive now, would
  carry no more than CLAIM_CAP (1.5) hops in either direction (out: its own pieces still queued
  plus n-1 copies of what it owns; in: the pieces the absent ranks would send it plus the results
  of the rest: repair.claim_count) — and the sub-blocks nobody claimed go, at the last
  arrival, to the ranks whose links would finish first (repair.share_by_load). Early ranks
  thus own most of the buffer and a rank that arrives just before the last, its input still to push, owns
  little or nothing; owners reduce the pieces of early ranks while they wait for the late
  ones. Either shape is then repaired for the agreed dead set. Plans without usable trees
  and adaptive off get heaps in rank order (allreduce: n flows, flow ``i`` rooted at rank
  ``i``).
- default and fast path: ``adaptive`` unsaid (``Plan.adaptive`` None) is on over transports
  that declare ``arrival_order`` (sockets, ray; backends/runtime.py decides). With
  ``on_failure = abort`` and no quorum, a run first decides on one store counter whether
  every rank arrived before any rank declared the run late (:meth:`fast.FastPath.decide`,
  30 ms): if so it runs the plan's flattened program (backends/executor.py) — nobody late
  pays 3 store round trips, the log is not touched.
- log, generation: the agreed event log of backends/agreement.py (arrivals, deaths, done,
  and the star allreduce's claims).
  Generation ``g`` = the number of deaths in the log so far; every message's tag carries
  ``g mod 16``, so a message of an older generation never matches a receive of this one.
- valid chunk (down): a chunk of ``out`` that holds its final value. For broadcast, allgather
  and gather every received chunk stays valid (the root's input never changes). For allreduce a
  final chunk is valid only while the set of ranks it reduced equals the current contributors:
  when a contributor dies, the chunks that already included its input become invalid and are
  recomputed from the survivors' inputs (inputs are never written, so they are all still there).
- partial (up): chunk ``c`` of this rank's input (op) its up-children's partials of chunk ``c``,
  with the set of ranks it covers. After a death a partial is reused only if it covers exactly
  the rank's new subtree (it is *clean*); otherwise it is recomputed. So only the chunks the
  dead rank touched on the way up are redone; the others resume.

Protocol per generation, per flow (messages over the data transport, tags below):
- down: each member sends ``HAVE(bitmap of valid chunks)`` to its parent and posts receives for
  the chunks it lacks; a parent sends a child every chunk the child lacks as soon as it holds
  it (so a repaired child resumes from what it already has: no restart from byte 0).
- up: the root computes which final chunks it lacks and sends ``NEED(bitmap)`` to its children;
  every rank reuses its clean partials, resets the others to its input, and forwards
  ``NEED`` to its own children; partials flow up as soon as they are complete.
- in the run's first generation HAVE and NEED are implied (nobody holds a chunk it does not
  root, every root needs everything) and not sent; only generations after a death send them.
- ``on_failure = continue`` (or a quorum): a rank appends ``done(run, g)`` to the log once its
  own output is complete in generation g, and keeps serving its children until the log shows
  every live rank done (agreement.py): every survivor reports the same contributors.
  ``abort``: a rank that has served its part adds 1 to one store counter and returns when it
  holds every rank's 1 (:meth:`engine.Run.finish_abort_mode`); a death before that raises.

Tags (32 bits; the sockets frame carries 32): 1 (bit 31: never a static plan's tag, which is
< 2**24) | ``run mod 32`` (5) | ``g mod 16`` (4) | phase (2: down, up, control) | flow (6) |
chunk (14). Hence at most 64 flows and 16384 chunks per flow; the chunk size grows to respect
that.

``on_failure = abort``: the first death in the log makes every rank raise :class:`RankFailed`
(:class:`RootFailed` when the collective's root died). ``continue``: survivors complete; a dead
root of a rooted collective raises :class:`RootFailed` on every survivor.

Modules (imports go one way, down this list):
- ``flows.py``: constants, tags, flows and their chunks (:func:`~.flows.make_flows`);
- ``session.py``: the per-communicator agreement log, its tail and run counter;
- ``result.py``: :class:`AdaptiveResult` and the debug dump;
- ``star.py``: the star allreduce — claims, share-out, heirs, relays, owners' reductions;
- ``fast.py``: the fast path — agree whether everyone arrived in time, then run static;
- ``engine.py``: one run — the loop, generations, shapes, down and up halves, completions.
"""
from __future__ import annotations

from .engine import Run, run
from .flows import (CLAIM_CAP, KINDS, MAX_CHUNKS, MAX_FLOWS, STAR_CHUNK, STAR_CHUNK_S, STAR_SPLIT,
                    AdaptiveUnsupported, ranges)
from .result import AdaptiveResult
from .session import close_session, session_of

__all__ = [
    "AdaptiveResult", "AdaptiveUnsupported", "CLAIM_CAP", "KINDS", "MAX_CHUNKS", "MAX_FLOWS", "Run",
    "STAR_CHUNK", "STAR_CHUNK_S", "STAR_SPLIT", "close_session", "ranges", "run", "session_of",
]
