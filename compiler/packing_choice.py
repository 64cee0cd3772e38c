"""hcc.compiler.packing_choice — of an allgather's shallow and deep packings, the faster schedule.

Terms
- *deep packing*: pack_allgather's first phase alone (``shallow=False``): the LP optimum over
  any trees, which on a switch or a ring comes out as long chains.
- *shallow packing*: the same rate over depth-bounded trees (treepack_shallow.py, the default
  up to treepack._SHALLOW_PHASE_MAX_RANKS ranks; its ``method`` says "shallow(depth D)").
- *one-uplink rank*: a rank whose every link goes to one switch (samples/nvswitch.hcl's GPUs;
  not DGX-1's, which have NVLinks beside their PCIe switch, nor an A100's, with an NVSwitch
  port and a NIC).
- *star through a switch*: a tree in which a one-uplink rank has two children or more: every
  copy it sends goes out, one after the other, on its one link.

Why: the two packings have the same rate, but not the same schedule. Over direct links and
ranks with several links the shallow trees fill the pipeline sooner (DGX-1, A100, MI250:
+0.02 to +0.11 of the bound). On one switch they are 1-level stars: each root puts all 7
copies of a chunk on its one uplink, where a 7-deep chain sent one and the next rank
forwarded it (samples/nvswitch.hcl allgather at 1 GB: 0.890 of the bound over the stars,
0.997 over the chains). So where the shallow packing has a star through a switch, both are
lowered as the candidate lowers them (lower.lower_priced, with a chunk search) and the
faster is kept. Elsewhere the shallow packing is kept without pricing: pricing both
everywhere a route crosses a switch doubled the allgather compile CPU on two A100 servers
(2.0-2.5 s -> 4.0-4.4 s, where ForestColl takes 12.3 s) and added 0.7 s on DGX-1, for no
change of plan at 1 GB on either.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .chunks import best_time

__all__ = ["faster_allgather_packing", "one_uplink_ranks", "stars_through_switch"]

# chunk sizes the choice tries past the first slower one (chunks.choose_chunk's patience): the
# timed tree plans are not unimodal in the chunk size while a tree share holds 1-3 chunks
# (pipeline.Lower gives them the same second chance)
_PATIENCE = 2


def one_uplink_ranks(topo: Any, ranks: tuple[str, ...]) -> frozenset[str]:
    """The ranks of ``ranks`` whose every link (either way) goes to one and the same switch."""
    ends: dict[str, set[str]] = {r: set() for r in ranks}
    for link in topo.restricted(ranks).links:
        for a, b in ((link.src, link.dst), (link.dst, link.src)):
            if a in ends:
                ends[a].add(b)
    return frozenset(r for r, e in ends.items() if len(e) == 1 and next(iter(e)) not in ends)


def stars_through_switch(packing: Any, topo: Any, ranks: tuple[str, ...]) -> bool:
    """Some tree of ``packing`` (over ``ranks``) gives a one-uplink rank
    (:func:`one_uplink_ranks`) two children or more."""
    lone = one_uplink_ranks(topo, ranks)
    for t in packing.trees:
        kids: dict[str, int] = {}
        for parent, _, _ in t.edges:
            if parent in lone:
                kids[parent] = kids.get(parent, 0) + 1
                if kids[parent] >= 2:
                    return True
    return False


def _priced(u: Any, packing: Any, algorithm: str) -> float:
    """The predicted time of ``algorithm``'s schedule over ``packing``'s trees at the best
    chunk size (the spec's own when it fixes one)."""
    from .lower import lower_priced

    spec = u.spec
    if spec.kind == "allreduce" and spec.compress != "none":  # as registry.builder lowers it
        spec = replace(spec, compress="none")
    return best_time(spec, lambda c: lower_priced(spec, u.topology, packing.trees, c, algorithm=algorithm,
                                                  model=u.model), model=u.model, patience=_PATIENCE)


def faster_allgather_packing(u: Any, *, reverse: bool, algorithm: str) -> Any:
    """The allgather packing (in-trees with ``reverse``) of unit ``u`` whose schedule under
    ``algorithm``'s lowering is predicted faster: the shallow one unless it differs from the
    deep one, has a star through a switch (:func:`stars_through_switch`), and simulates slower than the deep one (ties keep
    the shallow one). The deep packing, when kept, says so in its ``method``."""
    from . import treepack

    topo, ranks = u.topology, u.spec.ranks
    shallow = treepack.pack_allgather(topo, ranks, reverse=reverse)
    if "shallow(" not in shallow.method or not stars_through_switch(shallow, topo, ranks):
        return shallow
    deep = treepack.pack_allgather(topo, ranks, reverse=reverse, shallow=False)
    t_shallow, t_deep = _priced(u, shallow, algorithm), _priced(u, deep, algorithm)
    if t_deep < t_shallow:
        return replace(deep, method=f"{deep.method} (faster than {shallow.method})")
    return shallow
