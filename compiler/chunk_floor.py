"""hcc.compiler.chunk_floor — a lower bound on any plan's predicted time at a chunk size.

Terms
- *cut*: the vertex set whose links set the collective's bandwidth bound (bounds.binding_cut):
  every plan must move ``F = factor x M`` bytes over its links ``E``, whose capacities sum to
  ``C``; the bandwidth bound is ``F / C``.
- *message cost* of a hop over link e: the simulator (compiler/cost.py) reserves the link for
  ``k(e) + b / c(e)`` per message of ``b`` bytes, ``k(e) = α(e) + per_message_s``, and a
  link's reservations never overlap, start at 0 or later and end before the plan does.
- *chunk floor* ``T(s)``: a plan lowered at chunk size ``s`` sends messages of at most ``s``
  bytes, so a link that carries ``B`` bytes holds at least ``B / s`` messages and is busy at
  least ``B (1 / c(e) + k(e) / s)``; that is, it moves bytes at most at the *effective
  capacity* ``c'(e) = s c(e) / (s + c(e) k(e))``. Over the cut,
  ``T(s) >= F / sum_E c'(e) = (F / C) x C / sum_E c'(e)``, which grows as ``s`` shrinks.

Use (pipeline.Lower, ``algorithm = auto``): a candidate's chunk sizes whose floor is above the
fastest plan priced so far cannot produce the selected plan, so they are not lowered: on one
MI250 node the treepack trees' 1 MiB and 512 KiB chunks (floors 1.2x and 1.4x the bandwidth
bound, against rings at 1.15x) cost more than half of the allgather's compile. The floor
needs the plan's messages to be at most a chunk and uncompressed (compressed wire bytes are
smaller): it is offered only without compression, and tests/test_chunk_floor.py checks it
against every candidate's simulated times on the samples and that pruning with it changes no
plan.

>>> from hcc.ir.topology import Topology, Link
>>> from hcc.compiler.bounds import binding_cut
>>> t = Topology("pair", ("a", "b"), links=(Link("a", "b", 1e9, 1e-6), Link("b", "a", 1e9, 1e-6)))
>>> floor = cut_floor(binding_cut("broadcast", t, ("a", "b"), "a", 1000), t, 1000, 1e-6)
>>> round(floor(1000) * 1e6, 3), round(floor(100) * 1e6, 3)   # 1 message, then 10 of 2.1 us
(3.0, 21.0)
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .bounds import effective_capacity, merged_arcs

__all__ = ["cut_floor", "plan_floor", "worth_lowering"]


def cut_floor(cut: Any, topo: Any, size_bytes: float, per_message_s: float) -> Callable[[int], float] | None:
    """``T(s)`` (module docstring) for ``cut`` (a bounds.Cut) of ``topo`` and a collective of
    ``size_bytes``; None when the cut's links do not add up to its capacity (then no floor)."""
    links = merged_arcs(topo)
    try:
        arcs = [(links[a][0], links[a][1] + per_message_s) for a in cut.links]
    except KeyError:
        return None
    cap = sum(c for c, _ in arcs)
    if not arcs or cap <= 0 or abs(cap - cut.capacity_Bps) > 1e-9 * cap:
        return None
    base = cut.time(size_bytes)

    def floor(s: int) -> float:
        return base * cap / sum(effective_capacity(c, k, s) for c, k in arcs)

    return floor


def plan_floor(u: Any) -> Callable[[int], float] | None:
    """The chunk floor of pipeline unit ``u`` (its spec, topology and cost model), or None where
    none holds: compression, fewer than 2 ranks, no bandwidth bound."""
    from . import bounds

    spec = u.spec
    if spec.compress != "none" or len(spec.ranks) < 2 or not u.bandwidth_bound_s > 0:
        return None
    cut = bounds.binding_cut(spec.kind, u.topology, spec.ranks, spec.root, spec.size_bytes,
                             peers=spec.peers or "ring")
    if cut is None or abs(cut.time(spec.size_bytes) - u.bandwidth_bound_s) > 1e-9 * u.bandwidth_bound_s:
        return None
    return cut_floor(cut, u.topology, spec.size_bytes, u.model.per_message_s)


def worth_lowering(floor: Callable[[int], float] | None, chunks: Sequence[int], incumbent: float) -> tuple[int, ...]:
    """The chunk sizes of ``chunks`` whose floor is not above ``incumbent`` (at least the
    first, so every candidate is lowered once)."""
    if floor is None:
        return tuple(chunks)
    return tuple(c for c in chunks if floor(c) <= incumbent) or tuple(chunks[:1])
