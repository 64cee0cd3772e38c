"""hcc.compiler.pipeline — one collective from a checked Program to a verified Plan.

The compiler is a tuple of small frozen passes (style.md habit 3, xDSL's ``ModulePass``):
each has a ``name`` and ``apply(unit) -> unit`` over the frozen :class:`Unit` value, and
:func:`run_passes` calls a hook after every pass (for dumps and timing).

    bounds   the cut bound of the collective (compiler/bounds.py; for allreduce capped by
             :func:`allreduce_floor`, see there), plus the least latency a byte must cross
             (cost.least_latency) — still a lower bound of the cost model
    pack     the packing of every candidate to lower that has one (compiler/registry.py): the
             spanning-tree packings of compiler/treepack.py (out-trees from the root for
             broadcast and scatter, the reversed graph for reduce and gather, out-trees from
             every rank for allgather, their reverse for reduce_scatter; for allreduce the
             reduce+broadcast trees of rank 0 and the reduce-scatter+allgather trees), the
             trees used both ways (bidir.py), the narrowest rank cut (hier.py), the rings of
             ringpack.py and NCCL's ring channels (channels.py)
    lower    every candidate the spec allows (registry.candidates_for), each lowered by its
             registered builder at the chunk size that minimises the simulated time
             (chunks.choose_chunk); the NCCL-like baselines (compiler/baselines.py, channels.py:
             the single ring, multi-channel rings, double binary tree, recursive doubling)
             are always priced too, for the figures. ``algorithm = auto`` skips a candidate
             whose lower bound at every chunk size (tree_floor.candidate_floor: the cut's
             chunk floor, its trees' floor, what its ranks must send) is above a plan
             already priced, and the chunk sizes whose bound is above it; the fixed-load
             candidates' searches (the baselines and direct) stop where their load floor
             (baselines.load_floor) shows that no smaller chunk beats their first, so the
             baselines report the same times
    select   ``algorithm = auto``: the fastest predicted candidate; otherwise the forced one
    figures  predicted time, bound, efficiency = bound_s / predicted_s, the best NCCL-like
             baseline, algbw, busbw (nccl-tests factors), wire bytes, and the explanation:
             the cut that sets the bound (bounds.binding_cut), the packing's rate, and the
             predicted time split into bound, load, fill, per-message cost and contention
             (:func:`breakdown`)
    verify   ir/verify.py symbolically executes the plan

The candidates, their names and when each is offered are compiler/registry.py's; a plan's
``algorithm`` field names the one that ran.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from ..grammar.diagnostics import Source, SourceError, Span
from ..grammar.errors import HccError
from ..ir.plan import DTYPE_SIZES, Figures, Plan, Send
from ..ir.topology import Topology
from . import baselines, chunk_floor, progress, registry, tree_floor
from .channels import columns_allowed
from .chunks import ChunkChoice, choose_chunk, refining, spec_chunks
from .cost import DEFAULT_MODEL, CostModel, gc_paused, least_latency, simulate
from .program import CollectiveSpec, Program
from .registry import BASELINES, candidates_for



def __getattr__(name: str):
    """``allreduce_floor`` moved to compiler/bounds.py; the old name still resolves there
    (lazily: bounds loads ortools' max-flow)."""
    if name == "allreduce_floor":
        from .bounds import allreduce_floor

        return allreduce_floor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CompileError(HccError):
    """An internal inconsistency of the compiler (a plan faster than its lower bound, no
    applicable algorithm): a bug, reported with exit status 1, never bad input."""


# nccl-tests' bus-bandwidth factors (its doc/PERFORMANCE.md), as functions of n
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "neighbor_average": lambda n: 1.0,
}

EFFICIENCY_SLACK = 1e-9


@dataclass(frozen=True)
class Candidate:
    algorithm: str
    choice: ChunkChoice

    @property
    def predicted_s(self) -> float:
        return self.choice.simulation.time


@dataclass(frozen=True)
class Unit:
    """The value the passes transform: one collective on its topology."""

    program: Program
    spec: CollectiveSpec
    topology: Topology
    model: CostModel = DEFAULT_MODEL
    bound_s: float = 0.0
    bound_rate_Bps: float = 0.0
    bandwidth_bound_s: float = 0.0  # the cut bound alone, without the latency term
    packings: tuple[tuple[str, object], ...] = ()  # (role, packing): registry.Algorithm.role
    candidates: tuple[Candidate, ...] = ()
    # auto's candidates not lowered: their floor at every chunk size was above a plan already
    # priced (tree_floor.candidate_floor), so they could not be selected
    skipped: tuple[str, ...] = ()
    chosen: Candidate | None = None
    plan: Plan | None = None

    def packing(self, role: str):
        for r, p in self.packings:
            if r == role:
                return p
        return None

    def candidate(self, algorithm: str) -> Candidate | None:
        for c in self.candidates:
            if c.algorithm == algorithm:
                return c
        return None

    def compile_other(self, program: Program, name: str) -> Plan:
        """The plan of collective ``name`` of ``program`` by the same passes and cost model
        (replay.py's broadcast, compiled for the reduce it runs backwards)."""
        return compile_unit(program, name, model=self.model).plan


def _bound_size(spec: CollectiveSpec) -> int:
    """Bytes a bound must carry: compression shrinks what crosses the wire (fp16 halves
    4-byte elements, int8 is 1 byte per element; int8's per-chunk header only adds), so a
    compressed plan is compared with the bound of its compressed size — otherwise it could
    beat the "lower" bound.

    >>> from hcc.compiler.program import CollectiveSpec
    >>> [_bound_size(CollectiveSpec("c", "allreduce", "t", ("a", "b"), -1, 4096, compress=c))
    ...  for c in ("none", "fp16", "int8")]
    [4096, 2048, 1024]
    """
    itemsize = DTYPE_SIZES[spec.dtype]
    elems = spec.size_bytes // itemsize
    if spec.compress == "fp16":
        return elems * min(2, itemsize)
    if spec.compress == "int8":
        return elems
    return spec.size_bytes


@dataclass(frozen=True)
class Bounds:
    name: str = "bounds"

    def apply(self, u: Unit) -> Unit:
        from . import bounds  # ortools' max-flow: loaded when a compile starts, not on import

        spec = u.spec
        size = _bound_size(spec)
        if len(spec.ranks) < 2:
            return replace(u, bound_s=0.0, bound_rate_Bps=float("inf"), bandwidth_bound_s=0.0)
        t = float(bounds.time_bound(spec.kind, u.topology, spec.ranks, spec.root, size,
                                    peers=spec.peers or "ring"))
        if spec.kind == "allreduce":
            t = min(t, bounds.allreduce_floor(u.topology, spec.ranks, size))
        # every byte crosses at least one link after its last reserved byte (cost.py): adding
        # the smallest latency keeps t a lower bound of any simulated plan
        total = t + least_latency(u.topology, spec.ranks)
        rate = spec.size_bytes / t if t > 0 else float("inf")
        return replace(u, bound_s=total, bound_rate_Bps=rate, bandwidth_bound_s=t)


@dataclass(frozen=True)
class Pack:
    """The packing of every candidate to lower that needs one (registry.packings)."""

    name: str = "pack"

    def apply(self, u: Unit) -> Unit:
        _, want = candidates_for(u.spec)
        return replace(u, packings=registry.packings(u, want))


@dataclass(frozen=True)
class Lower:
    name: str = "lower"

    def apply(self, u: Unit) -> Unit:
        spec = u.spec
        cands = spec_chunks(spec)
        eligible, lowered = candidates_for(spec)
        # baselines first (their searches always run to the end: the figures report them),
        # then the others, each stopping once it cannot catch up with the best so far (auto
        # only: a forced algorithm is returned whatever its time, so it is searched fully)
        order = [a for a in lowered if a in BASELINES] + [a for a in lowered if a not in BASELINES]
        out = []
        best = float("inf")
        kept = None  # the index in out of the candidate Select would take so far
        builders: dict[str, Callable[[int], Plan]] = {}
        # algorithm -> what its plan no longer holds, to check a lowering again against:
        # ("ops", count) where its programs were emptied, ("sends", count) where it never
        # held any (priced from op columns, channels.rings_priced)
        dropped: dict[str, tuple[str, int]] = {}
        skipped: list[str] = []  # candidates whose floor exceeds the best plan so far
        floor = chunk_floor.plan_floor(u) if spec.algorithm == "auto" else None
        for i, alg in enumerate(order):
            build = registry.builder(alg, u)
            if build is None:
                continue
            progress.report("lower", alg, i + 1, len(order))
            build = builders[alg] = _reporting(build, alg)
            prune = spec.algorithm == "auto" and alg not in BASELINES
            mine = cands
            most = registry.algorithm(alg).max_chunks
            if most and not spec.chunk_bytes:
                mine = tuple(c for c in cands if c * most >= spec.size_bytes) or cands[:1]
            if prune and registry.algorithm(alg).chunked:  # sizes that cannot win (chunk_floor.py,
                # and for the tree packings their own trees' floors, tree_floor.py)
                bound = tree_floor.candidate_floor(floor, u, alg, best)
                least = skip_floor(bound, mine, best)
                if least is not None:  # no size can beat the best so far: not lowered at all
                    progress.report("lower", f"{alg} skipped: its floor {least:.6g} s is above {best:.6g} s")
                    skipped.append(alg)
                    continue
                mine = chunk_floor.worth_lowering(bound, mine, best)
            # the timed tree plans are not unimodal in the chunk size while a tree share holds
            # only 1-3 chunks (DGX-1 allgather at 1 GB: 32 MiB 7.0 ms, 16 MiB 7.5, 8 MiB 6.8, 2 MiB
            # 6.2): they get a second chance past the first slower size
            patience = 2 if registry.algorithm(alg).treepack else 1
            with columns_allowed():  # the largest ring allreduces priced from op columns
                if alg in baselines.FIXED_LOADS and len(mine) > 1 and spec.compress == "none":
                    build, mine = _fixed_loads(build, mine, u, best if prune else float("inf"))
                choice = choose_chunk(build, mine, model=u.model, incumbent=best if prune else float("inf"),
                                      patience=patience, fitted=not registry.algorithm(alg).repacked)
            out.append(Candidate(alg, choice))
            best = min(best, choice.simulation.time)
            if _columns_only(choice):  # priced from op columns (channels.rings_priced): no ops held
                dropped[alg] = ("sends", choice.simulation.messages)
            kept = _keep_selected(out, eligible, kept, dropped)
        if not out:
            raise CompileError(f"{spec.name}: no algorithm could be lowered for a {spec.kind}")
        if kept is not None and not spec.chunk_bytes:
            # the candidate Select would take and the runners-up within REFINE_RIVALS of it are
            # refined, and Select takes the fastest after refinement (the others are slower
            # than it was before)
            first = out[kept].choice.simulation.time
            rivals = [k for k, c in enumerate(out)
                      if k == kept or (c.algorithm in eligible and c.choice.simulation.time <= first * REFINE_RIVALS)]
            for k in rivals:
                out[k] = _refined(out[k], builders, dropped, u)
            kept = min(rivals, key=lambda k: _select_key(out[k]))
            for k in rivals:  # a refined plan holds programs again: held or emptied as after lowering
                _hold(out, k, KEEP_SELECTED_OPS if k == kept else KEEP_PROGRAMS_OPS, dropped)
        if kept is not None and out[kept].algorithm in dropped:
            # the plan Select will take was too large to hold: lowered again, same chunk
            c = out[kept]
            progress.report("lower", f"{c.algorithm} again, the plan selected")
            plan = builders[c.algorithm](c.choice.chunk_bytes)  # op objects (no columns_allowed)
            if isinstance(plan, tuple):  # a builder that prices its own plan: (plan, simulation)
                plan = plan[0]
            what, want = dropped[c.algorithm]
            if _count(plan, what) != want:
                raise CompileError(f"{spec.name}: lowering {c.algorithm} again gave a different plan")
            out[kept] = Candidate(c.algorithm, replace(c.choice, plan=replace(plan, figures=c.choice.plan.figures)))
        return replace(u, candidates=tuple(out), skipped=tuple(skipped))


# the chunk search's sizes are powers of two; the plan selected is also priced between its
# chunk's neighbours, at these fractions of it (4 A100 servers' allreduce at 1 GiB: 0.948 of
# the bound at 4 MiB, 0.951 at 3 MiB), where it is small enough that two more lowerings
# cost little (LARGE_PLAN_OPS)
REFINE = (3 / 4, 3 / 2)
# rounds of REFINE, each around the chunk the last one found faster (DGX-1 broadcast 256 MiB:
# 1 MiB from the search, 768 KiB, then 1152 KiB)
REFINE_ROUNDS = 3
# then, for an algorithm whose trees are packed again at each chunk size (registry
# ``repacked``), around the chunk those rounds end at, these finer fractions, as many rounds:
# the split trees of DGX-1 fragment 0,1,2,3's allreduce at 256 MiB run 0.893 of the bound at
# 1 MiB, 0.876 at 768 KiB, 0.887 at 1.5 MiB and 0.906 at 1.25 MiB. For every chunked
# algorithm it gained 0.3-1.5 points on a few more plans (2 x MI250 allgather 0.821 -> 0.836
# at 256 MiB) but cost one MI250 node's allgather compile a third more, past 0.3 x
# ForestColl's
REFINE_FINE = (7 / 8, 5 / 4)
# the chunk search's runners-up within this factor of the selected candidate's time (before
# its refinement) are refined as well: the refinement alone can reorder them (hetero.hcl's
# mesh allreduce: the split trees 4.176 ms at 1 MiB before bidir's 4.182 ms at 4 MiB, 4.169 ms
# at 768 KiB refined, where bidir refined reaches 4.128 ms at 3 MiB)
REFINE_RIVALS = 1.02


def _refined(c: Candidate, builders: dict, dropped: dict, u: Unit) -> Candidate:
    """``c``, or ``c``'s algorithm at the fastest of the chunk sizes :data:`REFINE` of its
    chunk where one of them is faster, up to :data:`REFINE_ROUNDS` times, then (a
    ``repacked`` algorithm) of :data:`REFINE_FINE` the same way; baselines (their
    figures are reported as such), plans priced from op columns and plans above
    LARGE_PLAN_OPS ops (counted before their programs were emptied, ``dropped``) stay as
    they are."""
    from .chunks import LARGE_PLAN_OPS

    what, held = dropped.get(c.algorithm, ("ops", None))
    if (c.algorithm in BASELINES or what != "ops" or not registry.algorithm(c.algorithm).chunked
            or (_count(c.choice.plan, "ops") if held is None else held) > LARGE_PLAN_OPS):
        return c
    item = DTYPE_SIZES[u.spec.dtype]
    best = c.choice
    tried = list(c.choice.tried)
    for fracs in (REFINE, REFINE_FINE) if registry.algorithm(c.algorithm).repacked else (REFINE,):
        for _ in range(REFINE_ROUNDS):
            around = best.chunk_bytes
            for f in fracs:
                size = int(around * f) // item * item
                if size <= 0 or size >= u.spec.size_bytes or size in {x for x, _ in tried}:
                    continue
                with refining(around):
                    got = builders[c.algorithm](size)
                plan, sim = got if isinstance(got, tuple) else (got, simulate(got, model=u.model))
                tried.append((size, sim.time))
                if sim.time < best.simulation.time * (1 - 1e-9):
                    best = ChunkChoice(size, plan, sim, ())
            if best.chunk_bytes == around:
                break
    return Candidate(c.algorithm, ChunkChoice(best.chunk_bytes, best.plan, best.simulation, tuple(tried)))


def _fixed_loads(build: Callable[[int], Plan], chunks: tuple[int, ...], u: Unit,
                 incumbent: float) -> tuple[Callable[[int], Plan], tuple[int, ...]]:
    """For a candidate whose link bytes do not depend on the chunk size
    (baselines.FIXED_LOADS): lowers and prices it at the first (largest) of ``chunks`` and
    returns a builder that hands that back to the chunk search, and ``chunks`` up to the first
    size whose load floor (baselines.load_floor) is above that time, or above ``incumbent``
    (for a candidate ``select`` need not report: auto's own, not a baseline). The floor never
    falls as the chunk shrinks, so every size dropped is slower than the first (or than the
    best plan so far), whatever the search would have done there: the search picks the same
    chunk, plan and time (only its ``tried`` is shorter; or, against ``incumbent``, a plan
    that could not be selected either way). On one MI250 node this spares three of the multi-channel rings'
    four allgather lowerings, whose floors at 2 MiB and below are above their time at one
    message per block."""
    first = chunks[0]
    got = build(first)
    plan, sim = got if isinstance(got, tuple) else (got, simulate(got, model=u.model))
    floor = baselines.load_floor(sim, u.topology, u.model.per_message_s, DTYPE_SIZES[u.spec.dtype])
    bar = min(sim.time, incumbent)
    kept = chunk_floor.worth_lowering(floor, chunks, bar)  # a prefix: the floor never falls
    keep = len(kept)
    if keep < len(chunks):
        progress.report("lower", f"chunks from {chunks[keep]} B skipped: their floor "
                                 f"{floor(chunks[keep]):.6g} s is above {bar:.6g} s")
    held = [(plan, sim)]

    def again(c: int):
        if c == first and held:
            return held.pop()  # the chunk search prices the first size first, once
        return build(c)

    return again, kept


def _columns_only(choice: ChunkChoice) -> bool:
    """Whether the chosen plan holds no ops though its simulation moved messages: a builder
    that priced op columns (channels.rings_priced) and left the programs empty."""
    return choice.simulation.messages > 0 and not any(choice.plan.programs)


def skip_floor(floor: Callable[[int], float] | None, chunks: tuple[int, ...], incumbent: float) -> float | None:
    """``floor`` at the largest of ``chunks`` where it exceeds ``incumbent`` (the candidate
    cannot produce the selected plan at any size), else None. The largest size decides: every
    floor here (tree_floor.candidate_floor's three) bounds a quantity that does not grow with
    the chunk size (fewer, larger messages only lower the per-message charges), so the plan
    at any smaller size is no faster than the floor at the largest; the tree floor's LP is
    solved once, not per size (3 s on the 512-rank allreduce's trees)."""
    if floor is None or not chunks or not incumbent < float("inf"):
        return None
    least = floor(max(chunks))
    return least if least > incumbent else None


@dataclass(frozen=True)
class Select:
    name: str = "select"

    def apply(self, u: Unit) -> Unit:
        eligible, _ = candidates_for(u.spec)
        pool = [c for c in u.candidates if c.algorithm in eligible]
        if not pool:
            why = (f"algorithm {u.spec.algorithm.replace('-', '_')} has no form of this {u.spec.kind} "
                   f"on topology {u.topology.name}; algorithm = auto picks among those that apply")
            if u.spec.span is not None:
                raise SourceError(u.spec.span, f"collective {u.spec.name}: {why}")
            raise CompileError(f"{u.spec.name}: {why}")
        best = min(pool, key=_select_key)
        return replace(u, chosen=best, plan=best.choice.plan)


def _reporting(build: Callable[[int], Plan], alg: str) -> Callable[[int], Plan]:
    """``build`` that first reports which candidate it lowers at which chunk size."""
    def run(chunk: int) -> Plan:
        progress.report("lower", f"{alg} at {chunk} B chunks")
        return build(chunk)

    return run


def _select_key(c: Candidate) -> tuple:
    """Select's order: fastest first; on a tie the compiler's own schedule over a baseline
    (the same rings, say), then by name."""
    return (c.predicted_s, c.algorithm in BASELINES, c.algorithm)


# a lowered candidate of more than this many ops keeps its figures and trees but not its
# programs, unless it is the one Select would take so far: on the 1024-rank fat tree an
# allreduce candidate holds 5-6 million ops (1.2-1.4 GB), and keeping them all took a compile
# to 8.8 GB
KEEP_PROGRAMS_OPS = 500_000
# the one Select would take so far keeps its programs up to this many ops, so it is not lowered
# a second time at the end (the 2.1 million ops of the 1024-rank allgather's ring or the
# 512-rank allgather's rings: ~0.45 GB, against 6-15 s of lowering). Above it, it is lowered
# again: held through a later candidate's lowering, the 5.2 million ops of a 512- or 1024-rank
# ring allreduce (1.1 GB) would take those compiles past 4 GiB (the treepack-rsag candidate
# alone peaks at 4 GB)
KEEP_SELECTED_OPS = 3_000_000


def _keep_selected(out: list[Candidate], eligible: tuple[str, ...], kept: int | None,
                   dropped: dict[str, tuple[str, int]]) -> int | None:
    """After the last candidate of ``out`` is lowered: of it and ``out[kept]``, the one Select
    would prefer (an eligible one, by :func:`_select_key`) keeps its programs up to
    :data:`KEEP_SELECTED_OPS` ops, the other up to :data:`KEEP_PROGRAMS_OPS`; programs above
    are emptied, their op count noted in ``dropped`` (:func:`_count`). Returns the index Select
    would take."""
    new = len(out) - 1
    let_go = new
    if out[new].algorithm in eligible and (kept is None or _select_key(out[new]) < _select_key(out[kept])):
        kept, let_go = new, kept
    for k, most in ((let_go, KEEP_PROGRAMS_OPS), (kept, KEEP_SELECTED_OPS)):
        if k is not None and out[k].algorithm not in dropped:
            _hold(out, k, most, dropped)
    return kept


def _hold(out: list[Candidate], k: int, most: int, dropped: dict[str, tuple[str, int]]) -> None:
    """``out[k]`` keeps its programs up to ``most`` ops; above, they are emptied and the count
    noted in ``dropped``. A plan without programs (emptied before, or priced from op columns)
    is left as it is; one that holds programs again (refined at another chunk) is no longer
    in ``dropped`` where it keeps them."""
    c = out[k]
    plan = c.choice.plan
    if not any(plan.programs):
        return
    ops = _count(plan, "ops")
    if ops > most:
        dropped[c.algorithm] = ("ops", ops)
        hollow = replace(plan, programs=tuple(() for _ in plan.programs))
        out[k] = Candidate(c.algorithm, replace(c.choice, plan=hollow))
    elif dropped.get(c.algorithm, ("", 0))[0] == "ops":
        del dropped[c.algorithm]


def _count(plan: Plan, what: str) -> int:
    """A plan's ops (``"ops"``) or its sends (``"sends"``, as many as its simulation's
    messages)."""
    if what == "ops":
        return sum(len(p) for p in plan.programs)
    return sum(type(op) is Send for p in plan.programs for op in p)


def bottleneck(sim):
    """The simulated plan's *bottleneck link*: the one with the most bytes per capacity (the
    one that must be busy longest; ties: the busier); None without link traffic."""
    return max(sim.links, key=lambda l: (l.bytes / l.capacity, l.busy_s)) if sim.links else None


def load_rate(size_bytes: int, sim) -> float:
    """``size_bytes`` over the time the :func:`bottleneck` link needs for its bytes (no latency,
    no per-message cost): the rate the plan's link loads sustain, at most the cut bound's (0
    for a plan without link traffic)."""
    e = bottleneck(sim)
    return size_bytes * e.capacity / e.bytes if e is not None and e.bytes > 0 else 0.0


@dataclass(frozen=True)
class FiguresPass:
    name: str = "figures"

    def apply(self, u: Unit) -> Unit:
        spec, c = u.spec, u.chosen
        plan, sim = c.choice.plan, c.choice.simulation
        n = len(spec.ranks)
        predicted = sim.time
        ring = u.candidate("ring")
        tree = u.candidate("tree")
        # efficiency = bound / predicted: a plan faster than its lower bound is a bug
        eff = u.bound_s / predicted if predicted > 0 else 1.0
        if eff > 1 + EFFICIENCY_SLACK:
            raise CompileError(
                f"{spec.name}: predicted {predicted:.6g} s beats the lower bound {u.bound_s:.6g} s "
                f"({c.algorithm}); the bound or the cost model is wrong"
            )
        algbw = spec.size_bytes / predicted if predicted > 0 else float("inf")
        base = [b for b in (u.candidate(a) for a in BASELINES) if b is not None]
        best_base = min(base, key=lambda b: (b.predicted_s, BASELINES.index(b.algorithm))) if base else None
        rings = u.candidate("rings")
        rd = u.candidate("rd")
        cut = self._cut(u)
        parts = breakdown(sim, u.bandwidth_bound_s)
        figures = Figures(
            rate_Bps=registry.steady_rate(u, c.algorithm, plan, predicted),
            bound_rate_Bps=u.bound_rate_Bps,
            predicted_s=predicted,
            bound_s=u.bound_s,
            efficiency=eff,
            ring_predicted_s=ring.predicted_s if ring else 0.0,
            tree_predicted_s=tree.predicted_s if tree else 0.0,
            compile_s=0.0,
            wire_bytes=sim.wire_bytes,
            algbw_Bps=algbw,
            busbw_Bps=algbw * BUSBW_FACTOR[spec.kind](n) if n > 1 else algbw,
            exact_predicted_s=self._exact(u) if plan.compress != "none" else 0.0,
            baseline=best_base.algorithm if best_base else "",
            baseline_predicted_s=best_base.predicted_s if best_base else 0.0,
            rings_predicted_s=rings.predicted_s if rings else 0.0,
            ring_channels=len(u.packing("channels") or ()),
            rd_predicted_s=rd.predicted_s if rd else 0.0,
            pack_rate_Bps=self._pack_rate(u, sim),
            cut_vertices=cut.vertices if cut else (),
            cut_links=cut.links if cut else (),
            cut_capacity_Bps=cut.capacity_Bps if cut else 0.0,
            cut_direction=cut.direction if cut else "",
            cut_note=cut.what if cut else "",
            message_bound_s=self._message_bound(u, plan, cut),
            **self._latency_bound(u, plan, cut),
            **parts,
        )
        return replace(u, plan=replace(plan, figures=figures))

    @staticmethod
    def _message_bound(u: Unit, plan: Plan, cut) -> float:
        """bounds.message_bound at the plan's largest message, at least bound_s (0: no cut,
        or a compressed plan, whose wire bytes the bound does not count)."""
        from ..ir.plan import Send
        from .bounds import message_bound

        spec = u.spec
        if cut is None or plan.compress != "none":
            return 0.0
        largest = max((op.src.count for prog in plan.programs for op in prog if type(op) is Send),
                       default=0) * plan.itemsize
        root = spec.ranks[spec.root] if spec.root >= 0 else None
        return max(u.bound_s, message_bound(spec.kind, u.topology, spec.ranks, root, _bound_size(spec), largest,
                                            u.model.per_message_s, peers=spec.peers or "ring"))

    @staticmethod
    def _latency_bound(u: Unit, plan: Plan, cut) -> dict:
        """bounds.latency_bound over the named cut (no max-flow beyond the one that named it),
        at least bound_s, as Figures fields; none for compressed plans (their wire bytes are
        not the buffer's) or without a cut."""
        from .bounds import latency_bound

        spec = u.spec
        if cut is None or plan.compress != "none":
            return {}
        root = spec.ranks[spec.root] if spec.root >= 0 else None
        lb = latency_bound(spec.kind, u.topology, spec.ranks, root, _bound_size(spec), u.model.per_message_s,
                           cut=cut, itemsize=plan.itemsize)
        if lb is None:
            return {}
        return dict(latency_bound_s=max(u.bound_s, lb.time_s), latency_chunk_bytes=lb.chunk_bytes,
                    latency_rate_s=lb.rate_s, latency_hops=lb.hops, latency_hop_s=lb.hop_s,
                    latency_fanout=lb.links_out, latency_degree=lb.degree, latency_beyond=lb.beyond)

    @staticmethod
    def _cut(u: Unit):
        """The cut that sets the bandwidth bound, checked against it (bounds.binding_cut)."""
        from . import bounds

        spec = u.spec
        if len(spec.ranks) < 2 or not u.bandwidth_bound_s > 0:
            return None
        cut = bounds.binding_cut(spec.kind, u.topology, spec.ranks, spec.root, _bound_size(spec),
                          peers=spec.peers or "ring")
        if cut is not None and abs(cut.time(_bound_size(spec)) - u.bandwidth_bound_s) > 1e-6 * u.bandwidth_bound_s:
            raise CompileError(f"{spec.name}: the named cut gives {cut.time(_bound_size(spec)):.6g} s, "
                               f"the bound is {u.bandwidth_bound_s:.6g} s")
        return cut

    @staticmethod
    def _pack_rate(u: Unit, sim) -> float:
        """The rate the chosen algorithm's packing sustains (size / time at the LP's rates, in
        bound_rate_Bps's units); for one of the family without a single packing (the two-level
        layouts of treepack-levels), the rate its plan's own link loads allow
        (:func:`load_rate`); for an algorithm outside the treepack family, the best of the
        family's packings computed; 0 when none was."""
        chosen = u.chosen.algorithm
        family = {a.name for a in registry.REGISTRY if a.treepack}
        if chosen in family:
            rate = registry.pack_rate(u, chosen)
            if not rate and u.spec.compress == "none":
                rate = load_rate(u.spec.size_bytes, sim)
            return rate
        algs = [a for a in [c.algorithm for c in u.candidates] + list(u.skipped) if a in family]
        return max((registry.pack_rate(u, a) for a in algs), default=0.0)

    @staticmethod
    def _exact(u: Unit) -> float:
        """The best predicted time among the uncompressed candidates (0 if none was lowered)."""
        times = [c.predicted_s for c in u.candidates if c.choice.plan.compress == "none"]
        return min(times) if times else 0.0


# links whose bytes per capacity are within this share of the most are loaded alike (a packing
# at the cut rate loads many links to it, some a few elements under: one MI250 node's
# allgather, 156 587 360 B over a 50 GB/s link, 313 174 704 B over a 100 GB/s one)
LOADED_ALIKE = 1e-6


def breakdown_link(sim):
    """The link :func:`breakdown` splits the predicted time at: of the links loaded alike to
    the :func:`bottleneck` one (:data:`LOADED_ALIKE`), the one busy longest, so the least idle
    before its first reservation, between its reservations and after its last. On one MI250
    node's allgather at 1 GiB its twelve 100 GB/s links are busy 3.32 ms, 0.19 ms of it for the
    per-message cost of twice a 50 GB/s link's messages, where the 50 GB/s cut link the most
    bytes per capacity names is busy 3.23 ms and idle the rest. None without link traffic."""
    top = bottleneck(sim)
    if top is None:
        return None
    floor = top.bytes / top.capacity * (1.0 - LOADED_ALIKE)
    return max((l for l in sim.links if l.bytes / l.capacity >= floor), key=lambda l: (l.busy_s, l.bytes / l.capacity))


def breakdown(sim, bandwidth_bound_s: float) -> dict:
    """The predicted time ``sim.time`` as ``bandwidth_bound_s + load_s + fill_s + message_s
    + contention_s``, at the simulation's :func:`breakdown_link` e.

    - ``load_s = bytes(e) / c(e) - bandwidth_bound_s``: how far the schedule's heaviest link
      load sits above the cut bound (0 when the packing reaches the bound and its shares round
      evenly; >= 0, since some link of the binding cut carries at least its share: e's load is
      the most within :data:`LOADED_ALIKE`, and where that share puts it under the bound it
      counts as 0, the difference, at most a millionth of it, in the fill).
    - ``message_s = busy(e) - bytes(e) / c(e)``: the per-message charge of e's reservations,
      (latency + software cost per message) x its messages.
    - ``contention_s = (last(e) - first(e)) - busy(e)``: e idle between its first and its last
      reservation, waiting for chunks held up elsewhere (other links, dependencies).
    - ``fill_s``: the rest, ``first(e) + (time - last(e))``: before e's first reservation and
      after its last: the pipeline filling and draining (every hop's latency and per-message
      cost elsewhere before the first chunk reaches e, and after the last leaves it).

    The parts sum to the predicted time exactly (up to rounding). A plan with no messages
    is all fill."""
    t = sim.time
    out = {"bandwidth_bound_s": bandwidth_bound_s, "load_s": 0.0, "fill_s": t - bandwidth_bound_s,
           "message_s": 0.0, "contention_s": 0.0, "bottleneck_link": ()}
    e = breakdown_link(sim)
    if e is None:
        return out
    data = e.bytes / e.capacity
    load = max(0.0, data - bandwidth_bound_s)
    message, contention = e.busy_s - data, (e.last_s - e.first_s) - e.busy_s
    out.update(load_s=load, message_s=message, contention_s=contention,
               fill_s=t - bandwidth_bound_s - load - message - contention, bottleneck_link=(e.src, e.dst))
    return out


@dataclass(frozen=True)
class Verify:
    name: str = "verify"

    def apply(self, u: Unit) -> Unit:
        from ..ir.verify import verify

        verify(u.plan, on_phase=lambda step, done, total: progress.report("verify", step, done, total))
        return u


PASSES: tuple = (Bounds(), Pack(), Lower(), Select(), FiguresPass(), Verify())

Hook = Callable[[str, float, Unit], None]


def run_passes(unit: Unit, passes: tuple = PASSES, hook: Hook | None = None) -> Unit:
    """Apply each pass in order; ``hook(name, seconds, unit)`` runs after each one."""
    for p in passes:
        t0 = time.perf_counter()
        progress.report(p.name)
        unit = p.apply(unit)
        if hook is not None:
            hook(p.name, time.perf_counter() - t0, unit)
    return unit


def resolve(program: Program, name: str | None) -> CollectiveSpec:
    """The collective to compile: ``name``, or the only one. Bad names are bad input."""
    names = [c.name for c in program.collectives]
    listing = ", ".join(names) if names else "none"
    if name is None:
        if len(names) == 1:
            return program.collectives[0]
        raise SourceError(
            Span(Source("<command line>", program.path), 1, 1, 1, 1 + len(program.path)),
            f"the program declares {len(names)} collectives ({listing}); name one with -c NAME",
        )
    for c in program.collectives:
        if c.name == name:
            return c
    text = f"-c {name}"
    import difflib

    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else ""
    raise SourceError(
        Span(Source("<command line>", text), 1, 4, 1, 4 + len(name)),
        f"unknown collective {name!r} (collectives: {listing})",
        hint,
    )


def compile_unit(program: Program, name: str | None = None, *, model: CostModel = DEFAULT_MODEL,
                 hook: Hook | None = None) -> Unit:
    """Run the whole pipeline and return its final :class:`Unit` (plan, candidates, bounds)."""
    t0 = time.perf_counter()
    spec = resolve(program, name)
    unit = Unit(program=program, spec=spec, topology=program.topology_of(spec), model=model)
    # lowering and verifying allocate millions of small acyclic objects (a second lowering of
    # the 1024-rank ring allgather took 20 s instead of 13 s of CPU with the collector on)
    with gc_paused(), progress.collective(spec.name):
        unit = run_passes(unit, PASSES, hook)
    figures = replace(unit.plan.figures, compile_s=time.perf_counter() - t0)
    return replace(unit, plan=replace(unit.plan, figures=figures))


def compile_one(program: Program, name: str | None = None) -> Plan:
    """Compile one collective of ``program`` to a verified :class:`Plan` with its figures."""
    return compile_unit(program, name).plan
