"""hcc.compiler.chunks — the chunk-size search: which chunk each candidate plan is lowered at.

Terms
- candidate chunk: a chunk size in bytes from :func:`chunk_candidates` (the whole buffer, then
  powers of two down to 4 KiB), tried largest first.
- the curve: a plan's predicted time as a function of its chunk size; past a few chunks per
  tree share it is ``A + B c + C / c`` (pipeline fill grows with the chunk, per-message costs
  with the chunk count; compiler/cost.py's module docstring derives it), so the search stops
  once the fitted curve says a smaller chunk cannot win.

Every candidate is priced by :func:`hcc.compiler.cost.simulate`; this module only decides
which chunk sizes are worth pricing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..ir.plan import DTYPE_SIZES, Plan, Send
from .cost import DEFAULT_MODEL, CostModel, Simulation, simulate


def spec_chunks(spec) -> tuple[int, ...]:
    """The chunk sizes a collective's search tries: the one its program fixes, else
    :func:`chunk_candidates` of its size."""
    return (spec.chunk_bytes,) if spec.chunk_bytes else chunk_candidates(spec.size_bytes, DTYPE_SIZES[spec.dtype])


def best_time(spec, build: Callable[[int], "Plan | tuple[Plan, Simulation]"], *, model: CostModel = DEFAULT_MODEL,
              patience: int = 1) -> float:
    """The predicted time of ``build``'s plan at the chunk size :func:`choose_chunk` picks
    among :func:`spec_chunks` (to choose between two forms of one candidate)."""
    return choose_chunk(build, spec_chunks(spec), model=model, patience=patience).simulation.time


# the chunk size the search's refinement (pipeline._refined) lowers the selected plan around,
# while it does (:class:`refining`)
_AROUND: list[int | None] = [None]


class refining:
    """``with refining(chunk):`` the chunk search's refinement is lowering the selected plan's
    algorithm at a size near ``chunk``, where the search priced it already; a builder that
    prices several forms at every size may then price only those that came close at
    ``chunk`` (levels.levels_priced). :func:`refined_around` reads it."""

    def __init__(self, around: int):
        self.around = around

    def __enter__(self):
        self.prev = _AROUND[0]
        _AROUND[0] = self.around

    def __exit__(self, *exc):
        _AROUND[0] = self.prev


def refined_around() -> int | None:
    """The chunk size the refinement lowers around (:class:`refining`), else None."""
    return _AROUND[0]


def chunk_candidates(size_bytes: int, itemsize: int, smallest: int = 4096) -> tuple[int, ...]:
    """Chunk sizes to try, largest first: the whole buffer, then powers of two from
    ``size/2`` down to 4 KiB (below 4 KiB the per-message cost dominates every link
    hcc targets: 1 us x 25 GB/s = 25 KB). Each is a multiple of the dtype size.

    >>> chunk_candidates(64 * 1024, 4)
    (65536, 32768, 16384, 8192, 4096)
    >>> chunk_candidates(1000, 4)
    (1000,)
    """
    out = [size_bytes]
    c = 1 << max(0, (size_bytes - 1).bit_length() - 1)
    while c >= max(smallest, itemsize):
        if c < size_bytes and c % itemsize == 0:
            out.append(c)
        c //= 2
    return tuple(out)


# The search never lowers a plan estimated above this many ops: at ~5 us per op (lowering
# plus simulation) that is ~1 s per candidate, and the 256-rank fat tree (65 280 messages,
# 130 560 ops per chunk round) must compile in 30 s: it gets one chunk size per algorithm
# (its second, 261 120 ops, was 1% slower for the ring anyway).
MAX_SEARCH_OPS = 200_000
# Above this many ops, a slower candidate counts against the search even within the first
# few chunks per share: there, evaluating one more candidate costs more than the bumps of
# the curve (below SMOOTH_CHUNKS) can gain.
LARGE_PLAN_OPS = 60_000
# Below 4 chunks per tree share the predicted time is not unimodal in the chunk size (the
# last, partial chunk of each share comes and goes: on the demo sample 1 MiB beats 512 KiB,
# which loses to 256 KiB and 128 KiB); the early stop only trusts the curve past that point.
SMOOTH_CHUNKS = 4
# A candidate still this many times slower than the incumbent where the curve is smooth is
# dropped: each halving of the chunk at best halves the pipeline fill, and on the samples no
# candidate came back from more than 1.8x (DGX-1 broadcast trees at 32 MiB against the ring).
HOPELESS = 4.0


# The search skips the next (smaller, so costlier) chunk when the fitted curve predicts it
# this much slower than the best (see _extrapolate): on DGX-1 broadcast the fit predicts
# 4.22 ms at 256 KiB against a measured 4.36 ms and a best of 3.80 ms.
PREDICT_MARGIN = 0.02


def _extrapolate(tried: Sequence[tuple[int, float]], c: int, ceiling: int) -> float | None:
    """The predicted time at chunk ``c`` from the last three candidates, by the pipeline
    model ``t(c) = A + B c + C / c`` (fill grows with the chunk, per-message costs with the
    chunk count; see the module docstring), fitted exactly through the three points. None
    unless all three lie where the curve is smooth (:data:`SMOOTH_CHUNKS`), the fit is
    convex (B, C > 0), and the same fit through the three candidates before the last one
    predicted the last within :data:`FIT_CHECK`: only then is the prediction trusted to stop
    the search. (Unchecked, the fit through DGX-1's 1 GB broadcast at 64, 32 and 16 MiB,
    where the fill of its 7-deep chains still dominates, put the best chunk at 17 MiB and
    stopped the search at 0.58 of the bound; the best, 1 MiB, reaches 0.89.)"""
    if len(tried) < 3:
        return None
    pts = tried[-3:]
    if any(x * SMOOTH_CHUNKS > ceiling for x, _ in pts) or c * SMOOTH_CHUNKS > ceiling:
        return None
    fit = _fit(pts)
    if fit is None:
        return None
    if len(tried) >= 4:
        prior = _fit(tried[-4:-1])
        x, t = tried[-1]
        if prior is None or abs(prior(x) - t) > FIT_CHECK * t:
            return None
    return fit(c)


# how well the pipeline-model fit must have predicted the last candidate to be trusted
FIT_CHECK = 0.05


def _fit(pts: Sequence[tuple[int, float]]):
    """``t(c) = A + B c + C / c`` through three (chunk, time) points, as a function; None
    unless convex (B, C > 0)."""
    import numpy as np

    m = np.array([[1.0, x, 1.0 / x] for x, _ in pts])
    try:
        a, b, k = np.linalg.solve(m, np.array([t for _, t in pts]))
    except np.linalg.LinAlgError:
        return None
    if not (b > 0 and k > 0):
        return None
    return lambda c: float(a + b * c + k / c)


@dataclass(frozen=True)
class ChunkChoice:
    chunk_bytes: int
    plan: Plan
    simulation: Simulation
    tried: tuple[tuple[int, float], ...]  # (chunk, predicted seconds) for every candidate simulated


def _op_count(plan: Plan) -> int:
    return sum(len(p) for p in plan.programs)


def choose_chunk(
    build: Callable[[int], "Plan | tuple[Plan, Simulation]"],
    candidates: Sequence[int],
    *,
    model: CostModel = DEFAULT_MODEL,
    patience: int = 1,
    incumbent: float = float("inf"),
    fitted: bool = True,
) -> ChunkChoice:
    """Lower at each candidate chunk size, largest first, and keep the fastest predicted.
    ``build(c)`` returns the plan, or ``(plan, simulation)`` when it simulated it already.

    Smaller chunks fill the pipeline faster but pay α and the per-message cost more often,
    so the predicted time is close to unimodal in the chunk size once every tree share holds
    a few chunks. The first (largest) candidate's biggest message is the biggest tree share
    (the *ceiling*): larger chunks lower to the same plan and are skipped. Past
    :data:`SMOOTH_CHUNKS` chunks in the largest share (or for plans above
    :data:`LARGE_PLAN_OPS`) the search stops after ``patience`` candidates in a row slower
    than the best, or before lowering a candidate that the curve fitted through the last
    three (:func:`_extrapolate`) predicts :data:`PREDICT_MARGIN` slower than the best; and
    it never lowers a plan estimated above :data:`MAX_SEARCH_OPS` ops (the op count grows
    as ceiling / chunk).

    ``incumbent``: the predicted time of the best plan another algorithm already has. The
    search stops when this schedule cannot catch up with it: once the curve is smooth, it is
    still :data:`HOPELESS` times slower (a heuristic: the 128-rank fat tree's one-chain
    allreduce tree went from 5.2 s to 114 ms over 9 costly candidates against a 41 ms ring).

    ``fitted``: whether the fitted curve may stop the search (not for plans whose trees are
    packed again at each size, registry's ``repacked``: their time is not that curve's; DGX-1
    gpu[0,1,2,3,4,5,7]'s split allreduce at 1 GiB, 18.4 / 16.8 / 16.5 ms at 16 / 8 / 4 MiB,
    was stopped there by a fit that put 2 MiB above 16.9 ms; it takes 14.7)."""
    if not candidates:
        raise ValueError("no chunk size candidates")
    best: ChunkChoice | None = None
    tried: list[tuple[int, float]] = []
    worse = 0
    ceiling = 0
    first_ops = 0
    for c in candidates:
        if best is not None:
            if c >= ceiling:
                continue
            est = first_ops * ceiling / c
            if est > MAX_SEARCH_OPS:
                break
            guess = _extrapolate(tried, c, ceiling) if fitted else None
            if guess is not None and guess > best.simulation.time * (1 + PREDICT_MARGIN):
                break  # the smooth curve already turned up: skip the costliest plan of all
        built = build(c)
        # a builder that priced its own alternatives returns (plan, its simulation)
        plan, sim = built if isinstance(built, tuple) else (built, simulate(built, model=model))
        tried.append((c, sim.time))
        if best is None:
            first_ops = max(1, _op_count(plan))
            ceiling = max((op.src.count for prog in plan.programs for op in prog if type(op) is Send),
                          default=0) * plan.itemsize
            best = ChunkChoice(c, plan, sim, ())
            continue
        smooth = c * SMOOTH_CHUNKS <= ceiling
        # no stop on the busiest link's bytes / capacity alone: the timed lowering rebalances
        # a block's share between its trees per chunk size, so a link's bytes do change with
        # the chunk (demo broadcast at 1 GiB: 0.91 s at the largest chunk, 0.49 s at the best,
        # against 0.54 s for the rings, which that stop had kept)
        if smooth and sim.time > HOPELESS * incumbent:
            if sim.time < best.simulation.time:
                best = ChunkChoice(c, plan, sim, ())
            break
        if sim.time < best.simulation.time * (1 - 1e-9):
            best = ChunkChoice(c, plan, sim, ())
            worse = 0
        elif sim.time > best.simulation.time * (1 + 1e-9) and (smooth or _op_count(plan) > LARGE_PLAN_OPS):
            worse += 1
            if worse >= patience:
                break
        # equal times are a plateau, not evidence that smaller chunks lose: keep going
    return ChunkChoice(best.chunk_bytes, best.plan, best.simulation, tuple(tried))

