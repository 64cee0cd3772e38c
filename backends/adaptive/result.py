"""hcc.backends.adaptive.result — what an adaptive run hands back: the output array with what
the survivors agreed on (:class:`AdaptiveResult`), and the debug dump of a stuck run.

Terms
- contributors / missing / late / dead: see :class:`AdaptiveResult`.
- dump: with ``HCC_ADAPTIVE_DUMP=DIR`` a rank that times out writes its view of the run there
  (:func:`dump_state`), so the views of all ranks can be read side by side.
"""
from __future__ import annotations

import numpy as np

__all__ = ["AdaptiveResult", "package", "dump_state"]


class AdaptiveResult(np.ndarray):
    """The output array, with what the run agreed on.

    ``contributors``: ranks whose input is in the result (reducing kinds: exactly these inputs
    were reduced; other kinds: the live ranks). ``missing``: ranks whose block of an allgather
    or gather output is absent (their owner died first; the block is zero-filled). ``late``:
    ranks whose input a ``quorum`` run ignored. ``dead``: the agreed dead set at the end.
    ``generation``: how many deaths the run's log had seen when it ended. ``stats``: data
    chunks this rank received and sent (in all, and in the run's first generation) and the
    plan's chunk count — a repaired broadcast receives each chunk once: it resumes — and
    ``path`` ("adaptive"), with seconds from this rank's entry to the moment it saw every
    arrival (``all_arrived_s``), held its output (``output_s``) and returned (``finished_s``);
    a star allreduce adds the sub-blocks this rank owned at the end (``owns``), how many of
    them it inherited from a dead owner (``inherited``) and the claim events it appended
    (``claims``)."""

    contributors: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()
    late: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    generation: int = 0
    stats: dict | None = None  # data chunks this rank received / sent, and the plan's chunk count

    def __array_finalize__(self, obj):
        for k in ("contributors", "missing", "late", "dead"):
            setattr(self, k, getattr(obj, k, ()))
        self.generation = getattr(obj, "generation", 0)
        self.stats = getattr(obj, "stats", None)


def dump_state(run, why: str) -> None:
    """With ``HCC_ADAPTIVE_DUMP=DIR`` in the environment, write this rank's view of the run
    (arrivals, deaths, owners, contributors, pending transfers, and per flow its chunks'
    validity keys and tree positions) to ``DIR/adaptive-<run>-rank<r>.json`` — what each
    rank believed when it gave up, side by side. A stuck run whose ranks all wait on nothing
    is a disagreement between those views (one rank's result chunks stamped with a
    contributor set older than the others' was found this way)."""
    import json
    import os

    folder = os.environ.get("HCC_ADAPTIVE_DUMP")
    if not folder:
        return
    from ...ir.files import atomic_write_text

    v = run.view

    def plain(x):
        if isinstance(x, np.ndarray):
            return x.tolist()
        if isinstance(x, (set, frozenset)):
            return sorted(x)
        if isinstance(x, dict):
            return {str(k): plain(y) for k, y in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(y) for y in x]
        return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)

    keep = ("up_root", "up_parent", "up_kids", "down_root", "down_parent", "down_kids", "my_need",
            "up_sent", "up_from", "have_sent", "root_dead")
    state = {
        "why": why, "rank": run.rank, "run": run.run_id, "generation": run.gen,
        "arrivals": v.arrivals, "dead": v.dead, "done": plain(v.done), "owner": plain(v.owner),
        "shared": v.shared, "contributors": run.contrib, "contrib_mask": run.contrib_mask,
        "pending": [[p.what, p.flow, p.chunk, p.peer, bool(p.req.done)] for p in run.pending],
        "flows": [{"fid": f.fid, "root": f.root, "have": f.have.tolist(), "part": [int(x) for x in f.part],
                   **{k: plain(run.g[f.fid].get(k)) for k in keep}} for f in run.flows],
    }
    try:
        os.makedirs(folder, exist_ok=True)
        atomic_write_text(os.path.join(folder, f"adaptive-{run.run_id}-rank{run.rank}.json"),
                          json.dumps(state, indent=1))
    except OSError:
        pass  # a dump that cannot be written must not hide the timeout itself


def package(run, result_arr: np.ndarray) -> "AdaptiveResult":
    """``result_arr`` viewed as an :class:`AdaptiveResult` carrying what ``run`` agreed on."""
    res = result_arr.view(AdaptiveResult)
    dead = set(run.view.dead)
    missing = []
    if run.kind in ("allgather", "gather") and (run.kind == "allgather" or run.rank == run.plan.root):
        for f in run.flows:
            if f.root not in missing and not all(run.valid(f, c) for c in range(len(f.chunks))):
                missing.append(f.root)
        # a missing owner's whole block is zero, also the chunks of it that did arrive: the
        # caller sees a block as there or not, never part of one
        for f in run.flows:
            if f.root in missing:
                for a, b in f.chunks:
                    run.out[a:b] = 0
    res.contributors = tuple(sorted(set(run.contrib) - set(missing)))
    res.missing = tuple(sorted(missing))
    res.late = tuple(r for r in range(run.n) if r not in run.contrib and r not in dead) \
        if run.quorum is not None else ()
    res.dead = tuple(sorted(dead))
    res.generation = run.gen
    res.stats = dict(run.stats)
    if run.trace is not None:
        res.stats["events"] = [[round(t, 4), k, fid, c, peer] for t, k, fid, c, peer in run.trace]
        res.stats["chunk_bytes"] = {f.fid: [(b - a) * run.plan.itemsize for a, b in f.chunks]
                                    for f in run.flows if f.star}
        res.stats["owner"] = {f.fid: run.g[f.fid].get("up_root") for f in run.flows if f.star}
    if any(run.star_all(f) for f in run.flows):  # star blocks this rank owned at the end
        res.stats["owns"] = sum(1 for f in run.flows if run.g[f.fid].get("up_root") == run.rank)
        # ...of which this rank inherited from a dead owner (star_heir)
        res.stats["inherited"] = sum(1 for f in run.flows if run.g[f.fid].get("up_root") == run.rank
                                     and run.view.owner.get(f.fid, run.rank) != run.rank)
        # blocks whose result this rank relayed to others (star_down_parents)
        res.stats["relays"] = sum(1 for f in run.flows if run.g[f.fid].get("down_kids")
                                  and run.g[f.fid].get("down_root") != run.rank)
    return res
