"""hcc.backends.reference — random inputs and the numpy result every rank must end with.

The reference states each collective's final ``out`` directly from buffer_layout's table in
ir/plan.py, with no knowledge of trees or chunks, so a run checked against it is checked
against the collective's definition, not against the plan.

Inputs (:func:`make_inputs`) are chosen so that checking is decisive:
- integers: small values (|x| ≤ 50, or 0..20 for uint8); ``prod`` uses ±1/±2, so nothing
  overflows on up to 8 ranks (2**8 < 2**31; int8/uint8 products wrap identically in the
  reference and the executor, both modulo 2**8).
- float32/float64: uniform in ±[0.25, 1): a missing or doubled contribution moves a result by
  at least 0.25, a thousand times the rounding tolerance below.
- float16/bfloat16: multiples of 1/8 in ±[1/8, 2]: sums of up to 8 such values are exact in
  8 significant bits (bfloat16) and 11 (float16) in any order, so only ``avg``'s division
  rounds. ``prod`` draws from ±{1/2, 1, 2} (exact powers of two).

Tolerance (:func:`check`): floats may differ from the float64 reference by the rounding of n
sequential operations of the plan's dtype: ``|got − want| ≤ 2·n·eps·max(1, |want|)`` with
``eps`` the dtype's machine epsilon (bfloat16: 2**−7) — the classic bound n·eps·Σ|x| on
recursive summation (Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2), with
Σ|x| ≤ n·max|x| and |x| ≤ 2 here. Integers and min/max must match exactly.
Compressed plans (``compress = fp16 | int8``) are held to their codec's stated error bound
(:func:`hcc.ir.wire.error_bound`, from each rank's input range) plus that rounding; a
checker reports which test it applied (:func:`check` returns it: ``exact``, ``rounding`` or
``int8 ≤ 0.0157``).

:func:`check_seeded` checks a run whose ranks drew their inputs from a seed a block at a
time (:func:`input_range`, :func:`expected_range`), reading each rank's output a block at a
time too, so ``hcc run``'s parent holds a few blocks, not every rank's buffers.
"""
from __future__ import annotations

import mmap

import numpy as np

from ..ir.plan import FLOAT_DTYPES, Plan, block_range, neighbor_peers
from ..ir.wire import error_bound
from .base import RuntimeFault
from .kernels import from_float32, np_dtype, scale_into, to_float32

__all__ = ["make_inputs", "make_input", "input_range", "expected", "expected_range", "expected_after_failures",
           "check", "check_seeded", "ResultMismatch"]


class ResultMismatch(RuntimeFault):
    """A rank's output differs from the numpy reference."""

    def __init__(self, rank: int, index: int, got, want, detail: str = ""):
        msg = f"rank {rank}: wrong result at element {index}: got {got!r}, expected {want!r}"
        super().__init__(msg + (f" ({detail})" if detail else ""))
        self.rank, self.index, self.got, self.want = rank, index, got, want


# Inputs are drawn block by block: a 500 MB float32 input drawn at once needs ~3 GB of float64
# temporaries, and 8 ranks doing it together exhausted this 24 GiB machine (SIGKILL by the
# OOM killer); 1 Mi-element blocks cap the temporaries at ~24 MB per rank.
_BLOCK = 1 << 20


def make_input(plan: Plan, seed: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s input of ``plan`` (independent of the other ranks' draws)."""
    return input_range(plan, seed, rank, 0, plan.buffer_elems(rank)["in"])


def input_range(plan: Plan, seed: int, rank: int, lo: int, hi: int) -> np.ndarray:
    """Elements ``[lo, hi)`` of :func:`make_input`'s array, drawn without the rest of it:
    each block of ``_BLOCK`` elements has its own generator, so a checker can walk a 500 MB
    input a block at a time (:func:`check_seeded`)."""
    out = np.empty(max(0, hi - lo), dtype=np_dtype(plan.dtype))
    count = plan.buffer_elems(rank)["in"]
    b = lo // _BLOCK
    while b * _BLOCK < hi:
        b0 = b * _BLOCK
        rng = np.random.default_rng([seed, rank, plan.elems, b])
        # a whole block always: the draws of a shorter one would differ (_draw takes the
        # magnitudes, then the signs)
        block = _draw(rng, plan.dtype, plan.op, min(count, b0 + _BLOCK) - b0)
        a, z = max(lo, b0), min(hi, b0 + _BLOCK)
        out[a - lo:z - lo] = block[a - b0:z - b0]
        b += 1
    return out


def _draw(rng, dt: str, op: str | None, count: int) -> np.ndarray:
    if dt in ("float32", "float64"):
        if op == "prod":
            vals = rng.choice(np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0]), size=count)
        else:
            mag = rng.uniform(0.25, 1.0, size=count)
            vals = np.where(rng.integers(0, 2, size=count) == 1, mag, -mag)
        return vals.astype(np_dtype(dt))
    if dt in ("float16", "bfloat16"):
        if op == "prod":
            vals = rng.choice(np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0]), size=count)
        else:
            k = rng.integers(1, 17, size=count) * np.where(rng.integers(0, 2, size=count) == 1, 1, -1)
            vals = k / 8.0
        return from_float32(vals.astype(np.float32), dt)
    if op == "prod":
        vals = rng.choice(np.array([1, 2] if dt == "uint8" else [-2, -1, 1, 2]), size=count)
    elif dt == "uint8":
        vals = rng.integers(0, 21, size=count)
    else:
        vals = rng.integers(-50, 51, size=count)
    return vals.astype(np_dtype(dt))


def make_inputs(plan: Plan, seed: int) -> list[np.ndarray]:
    """One input per rank, shaped ``plan.buffer_elems(r)["in"]``, of the plan's storage dtype."""
    return [make_input(plan, seed, r) for r in range(plan.n)]


def _reduce(plan: Plan, arrays: list[np.ndarray]) -> np.ndarray:
    """op over ``arrays`` (same length) in the plan's storage dtype; floats via float64."""
    op, dt = plan.op or "sum", plan.dtype
    if dt in FLOAT_DTYPES:
        stack = np.stack([to_float32(a, dt) if dt == "bfloat16" else a.astype(np.float64) for a in arrays])
        stack = stack.astype(np.float64)
        red = {"sum": np.sum, "avg": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](stack, axis=0)
        if op == "avg":
            red = red / len(arrays)
        return from_float32(red.astype(np.float32), dt) if dt == "bfloat16" else red.astype(np_dtype(dt))
    acc = arrays[0].copy()
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    for a in arrays[1:]:
        ufunc(acc, a, out=acc)
    if op == "avg":
        scale_into(dt, acc, len(arrays))
    return acc


def expected(plan: Plan, inputs: list[np.ndarray], step: int = 0) -> list[np.ndarray | None]:
    """Each rank's required final ``out`` (None where the collective leaves it unspecified)."""
    n, E, kind, root = plan.n, plan.elems, plan.kind, plan.root
    ins = [np.asarray(a).reshape(-1) for a in inputs]
    blocks = [block_range(E, n, r) for r in range(n)]
    if kind == "broadcast":  # one array shared by every rank's entry (check never writes)
        return [ins[root]] * n
    if kind == "reduce":
        red = _reduce(plan, ins)
        return [red if r == root else None for r in range(n)]
    if kind == "allreduce":
        red = _reduce(plan, ins)
        return [red] * n
    if kind in ("allgather", "gather"):
        full = np.concatenate(ins)
        return [full if kind == "allgather" or r == root else None for r in range(n)]
    if kind == "reduce_scatter":
        red = _reduce(plan, ins)
        return [red[lo:hi].copy() for lo, hi in blocks]
    if kind == "scatter":
        return [ins[root][lo:hi].copy() for lo, hi in blocks]
    if kind == "alltoall":
        b = E // n
        return [np.concatenate([ins[j][r * b:(r + 1) * b] for j in range(n)]) for r in range(n)]
    if kind == "neighbor_average":
        out = []
        for r in range(n):
            group = [ins[r]] + [ins[p] for p in neighbor_peers(plan.peers, n, r, step)]
            avg_plan = plan if plan.op == "avg" else _with_op(plan, "avg")
            out.append(_reduce(avg_plan, group))
        return out
    raise ValueError(f"unknown collective kind {kind!r}")


def expected_after_failures(plan: Plan, inputs: list[np.ndarray], died: set[int],
                            contributors, missing: dict[int, set[int]]) -> list[np.ndarray | None]:
    """Each rank's required ``out`` after an ``on_failure = continue`` run that the ranks of
    ``died`` did not survive (backends/adaptive.py): reduce/allreduce, the reduction over
    exactly ``contributors``; broadcast, the root's input; allgather/gather, every block but
    those of ``missing[r]`` (rank r's reported missing owners), which are zero. None for the
    dead, and where the collective leaves the output unspecified."""
    n, root = plan.n, plan.root
    ins = [np.asarray(a).reshape(-1) for a in inputs]
    if plan.kind in ("reduce", "allreduce"):
        red = _reduce(plan, [ins[r] for r in sorted(contributors)])
        exp = [red if plan.kind == "allreduce" or r == root else None for r in range(n)]
    elif plan.kind == "broadcast":
        exp = [ins[root]] * n
    elif plan.kind in ("allgather", "gather"):
        exp = [np.concatenate([np.zeros_like(ins[j]) if j in missing.get(r, ()) else ins[j]
                               for j in range(n)])
               if plan.kind == "allgather" or r == root else None for r in range(n)]
    else:
        raise ValueError(f"{plan.kind!r} collectives do not survive failures")
    return [None if r in died else e for r, e in enumerate(exp)]


def _with_op(plan: Plan, op: str) -> Plan:
    import dataclasses

    return dataclasses.replace(plan, op=op)


def _eps(dtype: str) -> float:
    if dtype == "bfloat16":
        return 2.0 ** -7
    return float(np.finfo(np_dtype(dtype)).eps)


def _kind_of_check(plan: Plan) -> str:
    if plan.compress != "none":
        return plan.compress
    exact = plan.dtype not in FLOAT_DTYPES or plan.op in ("min", "max") or plan.kind in (
        "broadcast", "allgather", "gather", "scatter", "alltoall")
    return "exact" if exact else "rounding"


def _bound(plan: Plan, ranges) -> float:
    peers = max((len(neighbor_peers(plan.peers, plan.n, r, 0)) for r in range(plan.n)), default=1) \
        if plan.kind == "neighbor_average" else 1
    return error_bound(plan.compress, plan.kind, plan.op, ranges, peers=peers)


def _describe(how: str, bound: float) -> str:
    return how if how in ("exact", "rounding") else f"{how} ≤ {bound:.3g}"


class _Mismatches:
    """The first wrong element of one rank and how many there are, block by block."""

    def __init__(self, plan: Plan, how: str, bound: float):
        self.plan, self.how, self.bound = plan, how, bound
        self.first = None
        self.count = 0

    def compare(self, got: np.ndarray, exp: np.ndarray, offset: int) -> None:
        plan = self.plan
        if self.how == "exact":
            bad = np.flatnonzero(got != exp)
            if plan.dtype in FLOAT_DTYPES and plan.dtype != "bfloat16":
                bad = bad[~(np.isnan(got[bad]) & np.isnan(exp[bad]))]
        else:
            g = to_float32(got, plan.dtype).astype(np.float64) if plan.dtype == "bfloat16" else got.astype(np.float64)
            e = to_float32(exp, plan.dtype).astype(np.float64) if plan.dtype == "bfloat16" else exp.astype(np.float64)
            tol = 2.0 * plan.n * _eps(plan.dtype) * np.maximum(1.0, np.abs(e)) + self.bound
            bad = np.flatnonzero(~(np.abs(g - e) <= tol))
        if bad.size:
            if self.first is None:
                i = int(bad[0])
                self.first = (offset + i, got[i].item(), exp[i].item())
            self.count += int(bad.size)

    def raise_if_any(self, rank: int, size: int) -> None:
        if self.first is not None:
            i, g, e = self.first
            extra = "" if self.how in ("exact", "rounding") else f", {_describe(self.how, self.bound)} allowed"
            raise ResultMismatch(rank, i, g, e, f"{self.count} of {size} elements differ{extra}")


def check(plan: Plan, outputs: list, want: list, inputs: list | None = None) -> str:
    """Raise :class:`ResultMismatch` naming the first rank and element that is wrong; return
    which test was applied (``exact``, ``rounding``, or the codec and its bound). A compressed
    plan's bound depends on the inputs' ranges, so it needs ``inputs``."""
    if len(outputs) != plan.n:
        raise ResultMismatch(-1, -1, len(outputs), plan.n, "number of rank outputs")
    how = _kind_of_check(plan)
    bound = 0.0
    if how not in ("exact", "rounding"):
        if inputs is None:
            raise ValueError(f"checking compressed plan {plan.name!r} (compress = {plan.compress}) needs the "
                             "inputs: its error bound depends on their ranges")
        bound = _bound(plan, [_range(np.asarray(a).reshape(-1), plan.dtype) for a in inputs])
    for r, (got, exp) in enumerate(zip(outputs, want)):
        if exp is None:
            continue
        if got is None:
            raise ResultMismatch(r, -1, None, "an output", "the rank returned nothing")
        got = np.asarray(got).reshape(-1)
        if got.shape != exp.shape or got.dtype != exp.dtype:
            raise ResultMismatch(r, -1, f"{got.dtype}[{got.size}]", f"{exp.dtype}[{exp.size}]", "shape/dtype")
        m = _Mismatches(plan, how, bound)
        m.compare(got, exp, 0)
        m.raise_if_any(r, got.size)
    return _describe(how, bound)


def _range(a: np.ndarray, dtype: str) -> tuple[float, float]:
    if a.size == 0:
        return (0.0, 0.0)
    f = to_float32(a, dtype) if dtype == "bfloat16" else a
    return (float(np.min(f)), float(np.max(f)))


def _specified(plan: Plan, rank: int) -> bool:
    """Whether the collective defines rank ``rank``'s ``out`` (reduce, gather: the root's only)."""
    return not (plan.kind in ("reduce", "gather") and rank != plan.root)


def expected_range(plan: Plan, src, rank: int, lo: int, hi: int, step: int = 0) -> np.ndarray:
    """Elements ``[lo, hi)`` of rank ``rank``'s required ``out`` (as :func:`expected`), from
    ``src(j, a, b)``: elements ``[a, b)`` of rank j's input."""
    n, E, kind, root = plan.n, plan.elems, plan.kind, plan.root
    if kind == "broadcast":
        return src(root, lo, hi)
    if kind in ("reduce", "allreduce"):
        return _reduce(plan, [src(j, lo, hi) for j in range(n)])
    if kind == "reduce_scatter":
        b0 = block_range(E, n, rank)[0]
        return _reduce(plan, [src(j, b0 + lo, b0 + hi) for j in range(n)])
    if kind == "scatter":
        b0 = block_range(E, n, rank)[0]
        return src(root, b0 + lo, b0 + hi)
    if kind == "neighbor_average":
        group = [rank] + list(neighbor_peers(plan.peers, n, rank, step))
        avg_plan = plan if plan.op == "avg" else _with_op(plan, "avg")
        return _reduce(avg_plan, [src(j, lo, hi) for j in group])
    if kind in ("allgather", "gather", "alltoall"):
        # out is a concatenation of input pieces: (rank, start in its input, length)
        if kind == "alltoall":
            b = E // n
            pieces = [(j, rank * b, b) for j in range(n)]
        else:
            pieces = [(j, 0, plan.buffer_elems(j)["in"]) for j in range(n)]
        parts, at = [], 0
        for j, start, length in pieces:
            a, z = max(lo, at), min(hi, at + length)
            if a < z:
                parts.append(src(j, start + a - at, start + z - at))
            at += length
        return np.concatenate(parts) if parts else np.empty(0, dtype=np_dtype(plan.dtype))
    raise ValueError(f"unknown collective kind {kind!r}")


def check_seeded(plan: Plan, seed: int, outputs: list, step: int = 0, block: int = _BLOCK) -> str:
    """:func:`check` for inputs drawn by :func:`make_input` from ``seed``, a block at a time:
    ``outputs[r]`` is rank r's output as an array or as a reader ``read(lo, hi)`` of its
    elements ``[lo, hi)`` (None where the rank returned nothing). Memory: a few blocks of
    every rank, whatever the buffer size. Returns the test applied, as :func:`check`."""
    if len(outputs) != plan.n:
        raise ResultMismatch(-1, -1, len(outputs), plan.n, "number of rank outputs")
    how = _kind_of_check(plan)
    bound = 0.0

    def src(j: int, a: int, b: int) -> np.ndarray:
        return input_range(plan, seed, j, a, b)

    if how not in ("exact", "rounding"):
        ranges = []
        for j in range(plan.n):
            lo_j, hi_j = float("inf"), float("-inf")
            count = plan.buffer_elems(j)["in"]
            for a in range(0, count, block):
                x0, x1 = _range(src(j, a, min(count, a + block)), plan.dtype)
                lo_j, hi_j = min(lo_j, x0), max(hi_j, x1)
            ranges.append((lo_j, hi_j) if count else (0.0, 0.0))
        bound = _bound(plan, ranges)
    want_dtype = np_dtype(plan.dtype)
    for r, got in enumerate(outputs):
        if not _specified(plan, r):
            continue
        if got is None:
            raise ResultMismatch(r, -1, None, "an output", "the rank returned nothing")
        size = plan.buffer_elems(r)["out"]
        if isinstance(got, np.ndarray):
            arr = got.reshape(-1)
            if arr.size != size or arr.dtype != want_dtype:
                raise ResultMismatch(r, -1, f"{arr.dtype}[{arr.size}]", f"{want_dtype}[{size}]", "shape/dtype")
            read = lambda a, b, arr=arr: np.array(arr[a:b])
        else:
            read = got
        # a memory-mapped output (np.load(mmap_mode="r")): each block's pages are dropped from
        # this process once compared, else checking a 477 MiB output maps all of it resident
        mapped = getattr(got, "_mmap", None)
        m = _Mismatches(plan, how, bound)
        for a in range(0, size, block):
            b = min(size, a + block)
            g = read(a, b)
            if mapped is not None and hasattr(mapped, "madvise"):
                mapped.madvise(mmap.MADV_DONTNEED)
            if g.size != b - a or g.dtype != want_dtype:
                raise ResultMismatch(r, a, f"{g.dtype}[{g.size}]", f"{want_dtype}[{b - a}]", "shape/dtype")
            m.compare(g, expected_range(plan, src, r, a, b, step), a)
        m.raise_if_any(r, size)
    return _describe(how, bound)
