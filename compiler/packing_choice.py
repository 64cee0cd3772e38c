"""hcc.compiler.packing_choice — of an allgather's shallow and deep packings, the faster schedule.

Terms
- *deep packing*: pack_allgather's first phase alone (``shallow=False``): the LP optimum over
  any trees, which on a switch or a ring comes out as long chains.
- *shallow packing*: the same rate over depth-bounded trees (treepack_shallow.py, the default
  up to treepack._SHALLOW_PHASE_MAX_RANKS ranks; its ``method`` says "shallow(depth D)").
- *switch route*: a tree edge whose path passes through a switch (a path of more than two
  vertices, trees.PackedTree).

Why both: the two packings have the same rate, but not the same schedule. Over direct links
the shallow trees fill the pipeline sooner (DGX-1, A100, MI250: +0.02 to +0.11 of the bound).
Through one switch they are 1-level stars: each root puts all 7 copies of a chunk on its one
uplink, back to back, where a 7-deep chain sent one and the next rank forwarded it
(samples/nvswitch.hcl allgather at 1 GB: 0.890 of the bound over the stars, 0.997 over the
chains). So where the shallow packing routes through a switch, both are lowered as the
candidate lowers them (lower.lower_priced, with a chunk search) and the faster is kept.
Where no tree edge crosses a switch the shallow packing is kept without pricing: no compile
time is added there (DGX-1, MI250).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..ir.plan import DTYPE_SIZES
from .cost import choose_chunk, chunk_candidates

__all__ = ["faster_allgather_packing", "routes_through_switch"]

# chunk sizes the choice tries past the first slower one (cost.choose_chunk's patience): the
# timed tree plans are not unimodal in the chunk size while a tree share holds 1-3 chunks
# (pipeline.Lower gives them the same second chance)
_PATIENCE = 2


def routes_through_switch(packing: Any) -> bool:
    """Some edge of some tree of ``packing`` passes through a switch."""
    return any(len(path) > 2 for t in packing.trees for _, _, path in t.edges)


def _priced(u: Any, packing: Any, algorithm: str) -> float:
    """The predicted time of ``algorithm``'s schedule over ``packing``'s trees at the best
    chunk size (the spec's own when it fixes one)."""
    from .lower import lower_priced

    spec = u.spec
    if spec.kind == "allreduce" and spec.compress != "none":  # as registry.builder lowers it
        spec = replace(spec, compress="none")
    cands = (spec.chunk_bytes,) if spec.chunk_bytes else chunk_candidates(spec.size_bytes, DTYPE_SIZES[spec.dtype])
    got = choose_chunk(lambda c: lower_priced(spec, u.topology, packing.trees, c, algorithm=algorithm, model=u.model),
                       cands, model=u.model, patience=_PATIENCE)
    return got.simulation.time


def faster_allgather_packing(u: Any, *, reverse: bool, algorithm: str) -> Any:
    """The allgather packing (in-trees with ``reverse``) of unit ``u`` whose schedule under
    ``algorithm``'s lowering is predicted faster: the shallow one unless it differs from the
    deep one, routes through a switch, and simulates slower than the deep one (ties keep
    the shallow one). The deep packing, when kept, says so in its ``method``."""
    from . import treepack

    topo, ranks = u.topology, u.spec.ranks
    shallow = treepack.pack_allgather(topo, ranks, reverse=reverse)
    if "shallow(" not in shallow.method or not routes_through_switch(shallow):
        return shallow
    deep = treepack.pack_allgather(topo, ranks, reverse=reverse, shallow=False)
    t_shallow, t_deep = _priced(u, shallow, algorithm), _priced(u, deep, algorithm)
    if t_deep < t_shallow:
        return replace(deep, method=f"{deep.method} (faster than {shallow.method})")
    return shallow
