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
"""
from __future__ import annotations

import numpy as np

from ..ir.plan import FLOAT_DTYPES, Plan, block_range, neighbor_peers
from .base import RuntimeFault
from .kernels import from_float32, np_dtype, scale_into, to_float32

__all__ = ["make_inputs", "make_input", "expected", "expected_after_failures", "check", "ResultMismatch"]


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
    count = plan.buffer_elems(rank)["in"]
    rng = np.random.default_rng([seed, rank, plan.elems])
    out = np.empty(count, dtype=np_dtype(plan.dtype))
    for lo in range(0, count, _BLOCK):
        hi = min(count, lo + _BLOCK)
        out[lo:hi] = _draw(rng, plan.dtype, plan.op, hi - lo)
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


def check(plan: Plan, outputs: list, want: list) -> None:
    """Raise :class:`ResultMismatch` naming the first rank and element that is wrong."""
    if len(outputs) != plan.n:
        raise ResultMismatch(-1, -1, len(outputs), plan.n, "number of rank outputs")
    exact = plan.dtype not in FLOAT_DTYPES or plan.op in ("min", "max") or plan.kind in (
        "broadcast", "allgather", "gather", "scatter", "alltoall")
    for r, (got, exp) in enumerate(zip(outputs, want)):
        if exp is None:
            continue
        if got is None:
            raise ResultMismatch(r, -1, None, "an output", "the rank returned nothing")
        got = np.asarray(got).reshape(-1)
        if got.shape != exp.shape or got.dtype != exp.dtype:
            raise ResultMismatch(r, -1, f"{got.dtype}[{got.size}]", f"{exp.dtype}[{exp.size}]", "shape/dtype")
        if exact:
            bad = np.flatnonzero(got != exp)
            if plan.dtype in FLOAT_DTYPES and plan.dtype != "bfloat16":
                bad = bad[~(np.isnan(got[bad]) & np.isnan(exp[bad]))]
        else:
            g = to_float32(got, plan.dtype).astype(np.float64) if plan.dtype == "bfloat16" else got.astype(np.float64)
            e = to_float32(exp, plan.dtype).astype(np.float64) if plan.dtype == "bfloat16" else exp.astype(np.float64)
            tol = 2.0 * plan.n * _eps(plan.dtype) * np.maximum(1.0, np.abs(e))
            bad = np.flatnonzero(~(np.abs(g - e) <= tol))
        if bad.size:
            i = int(bad[0])
            raise ResultMismatch(r, i, got[i].item(), exp[i].item(), f"{bad.size} of {got.size} elements differ")
