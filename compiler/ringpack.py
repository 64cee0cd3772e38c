"""hcc.compiler.ringpack — allreduce over a packing of directed Hamiltonian rings.

Terms
- ring packing (:func:`ring_packing`): directed Hamiltonian cycles over the ranks' direct
  links, each with a rate, packed by an LP (the tree-packing master of treepack_master.py,
  through bidir.solve_master) so that no link carries more than its capacity.
- :func:`rings_plan`: an NCCL-style ring allreduce (baselines.ring_allreduce_ops) on each ring,
  on a share of the buffer proportional to its rate: the candidate ``treepack-rings`` of
  compiler/registry.py. (NCCL's own channel search, the ``rings`` baseline, is channels.py.)
"""
from __future__ import annotations

from typing import Any, Sequence

from ..ir.plan import DTYPE_SIZES, Plan
from ..ir.topology import Topology
from .bidir import MIN_SHARE, solve_master
from .lower import ProgramBuilder, assemble, chunk_elems, plan_op, split_by_rate

__all__ = ["RINGS_MAX_RANKS", "ring_packing", "rings_plan"]

# directed Hamiltonian cycles are enumerated up to this many ranks and this many cycles: DGX-1's
# 8 GPUs have 1 344 over their NVLinks (found in ~40 ms), a complete graph of 8 has 5 040
RINGS_MAX_RANKS = 8
_RINGS_MAX_CYCLES = 6000


def ring_packing(topo: Topology, ranks: Sequence[str]) -> tuple[tuple[tuple[int, ...], float], ...] | None:
    """Directed Hamiltonian cycles over the ranks' direct links with rates, packed by an LP:
    maximise sum r_C s.t. sum_{C uses e} r_C <= c(e). A ring allreduce of a share ``r_C / sum r``
    of the buffer on each cycle takes ``2(n-1)/n x M / sum r``, and every cycle uses n links,
    so ``sum r <= sum c / n`` and the time is at least ``2(n-1) M / sum c``: the allreduce
    floor itself, reached when the links decompose into rings (DGX-1's 8 GPUs: six rings of
    25 GB/s, 150 GB/s, as NCCL builds them; 4 of its GPUs cannot, 100 of 112.5 GB/s).
    Cycles below :data:`MIN_SHARE` of the rate are dropped and the LP re-solved.
    Returns ``((rank positions in ring order, rate), ...)``, or None (no Hamiltonian cycle over
    direct links, more than :data:`RINGS_MAX_RANKS` ranks, or too many cycles to list).

    >>> from hcc.ir.topology import Link
    >>> sq = Topology("sq", ("a", "b", "c", "d"), links=tuple(Link(x, y, 1.0) for x, y in
    ...     ["ab", "ba", "bc", "cb", "cd", "dc", "da", "ad"]))
    >>> sorted(r for r in ring_packing(sq, ("a", "b", "c", "d")))
    [((0, 1, 2, 3), 1.0), ((0, 3, 2, 1), 1.0)]
    """
    ranks = tuple(ranks)
    n = len(ranks)
    if not 3 <= n <= RINGS_MAX_RANKS:
        return None
    pos = {v: i for i, v in enumerate(ranks)}
    cap: dict[tuple[int, int], float] = {}
    for l in topo.restricted(ranks).links:
        if l.src in pos and l.dst in pos and l.src != l.dst:
            key = (pos[l.src], pos[l.dst])
            cap[key] = cap.get(key, 0.0) + l.capacity
    out: list[list[int]] = [[] for _ in range(n)]
    for a, b in sorted(cap):
        out[a].append(b)
    cycles: list[tuple[int, ...]] = []
    path, used = [0], [False] * n
    used[0] = True

    def extend() -> bool:  # False once the listing is too long
        u = path[-1]
        if len(path) == n:
            if 0 in out[u]:
                cycles.append(tuple(path))
            return len(cycles) <= _RINGS_MAX_CYCLES
        for v in out[u]:
            if not used[v]:
                used[v] = True
                path.append(v)
                ok = extend()
                path.pop()
                used[v] = False
                if not ok:
                    return False
        return True

    if not extend() or not cycles:
        return None
    links = sorted(cap)
    index = {e: i for i, e in enumerate(links)}
    cmax = max(cap.values())
    capn = [cap[e] / cmax for e in links]
    loads = [{index[(c[i], c[(i + 1) % n])]: 1 for i in range(n)} for c in cycles]
    weights, _ = solve_master(loads, capn)
    total = sum(weights)
    keep = [i for i, w in enumerate(weights) if w > MIN_SHARE * total]
    cycles = [cycles[i] for i in keep]
    weights, _ = solve_master([loads[i] for i in keep], capn)
    return tuple((c, w * cmax) for c, w in zip(cycles, weights) if w > 1e-12) or None


def rings_plan(spec: Any, topo: Topology, rings: Sequence[tuple[Sequence[int], float]],
               chunk_bytes: int) -> Plan:
    """Allreduce as one NCCL-style ring allreduce per ring of :func:`ring_packing`, each on a
    share of the buffer proportional to its rate, chunks of ``chunk_bytes``."""
    from .baselines import ring_allreduce_ops

    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    ce = chunk_elems(chunk_bytes, spec.dtype)
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    for (order, _), (lo, hi) in zip(rings, split_by_rate(0, E, [r for _, r in rings])):
        if hi > lo:
            ring_allreduce_ops(B, list(order), lo, hi, ce, avg)
    return assemble(spec, topo, B, (), "treepack-rings", ce)
