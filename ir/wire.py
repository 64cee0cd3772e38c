"""hcc.ir.wire — how many bytes a message of a plan puts on the wire, per ``compress`` mode.

The wire format of each mode is part of the plan's meaning (a compressed plan's figures, the
cost model and the executor's codecs must agree on it), so its sizes live with the IR: the
compiler prices plans from here, and backends/codecs.py, which encodes and decodes, takes
its sizes from here too.

Terms
- message: the ``count`` elements one Send moves; each carries its own codec header.
- ``none``: ``count × itemsize`` bytes; ``fp16``: 2 bytes per element; ``int8``: one byte
  per element after an 8-byte header (the chunk's minimum and maximum as two float32).

>>> wire_nbytes("int8", "float32", 1000), wire_nbytes("fp16", "float64", 10), wire_nbytes("none", "int32", 3)
(1008, 20, 12)

Error bounds (docs/relaxations.md, "Codecs" and "Error bound"), stated per mode beside its
wire size because the checker of every run (backends/reference.py) holds results to them:
- one quantization (:func:`quantization_error`) of a message whose values lie in [lo, hi]:
  ``fp16``: 2⁻¹¹·max|x| for normal values plus 2⁻²⁵ below 2⁻¹⁴ (infinite past ±65504, where
  values become ±inf); ``int8``: (hi − lo + 1e−7)/510, half a step of the 255-step grid.
- a collective (:func:`error_bound`), from each rank's input range: the compressed allreduce
  quantizes every contribution once (the owner's own block stays exact, but a checker that
  does not know the owner counts it too) and the reduced block once more; ``avg`` divides the
  first term by n. A ``neighbor_average`` quantizes each peer's message once and divides by
  1 + #peers. The bounds hold per element with the range of the whole input in place of each
  chunk's (a chunk's range is inside it), so they are looser than the per-chunk figure.

>>> quantization_error("int8", -1.0, 1.0) == (2 + 1e-7) / 510
True
>>> round(error_bound("int8", "allreduce", "sum", [(-1.0, 1.0)] * 2), 6)
0.015717
"""
from __future__ import annotations

from .errors import PlanError
from .plan import DTYPE_SIZES, FLOAT_DTYPES

__all__ = ["COMPRESS_MODES", "INT8_HEADER", "check_compress", "wire_nbytes", "quantization_error",
           "error_bound"]

COMPRESS_MODES = ("none", "fp16", "int8")
INT8_HEADER = 8  # int8: the chunk's lo, hi as two little-endian float32
FP16_MAX = 65504.0  # the largest finite float16
FP16_REL = 2.0 ** -11  # float16's unit roundoff (10 stored significand bits)
FP16_TINY = 2.0 ** -25  # half the spacing of float16's subnormals (2^-24)
INT8_EPS = 1e-7  # the int8 codec's guard against a zero range (scale = 255 / (hi - lo + 1e-7))


def check_compress(compress: str, dtype: str) -> None:
    """Raise :class:`PlanError` unless ``compress`` is a known mode that applies to ``dtype``
    (the lossy modes need a floating-point dtype)."""
    if compress not in COMPRESS_MODES:
        raise PlanError(f"unknown compress mode {compress!r}; expected one of {', '.join(COMPRESS_MODES)}")
    if compress != "none" and dtype not in FLOAT_DTYPES:
        raise PlanError(
            f"compress = {compress} needs a floating-point dtype "
            f"({', '.join(sorted(FLOAT_DTYPES))}), not {dtype}"
        )


def wire_nbytes(compress: str, dtype: str, count: int) -> int:
    """Bytes one message of ``count`` elements of ``dtype`` puts on the wire under ``compress``."""
    check_compress(compress, dtype)
    if compress == "fp16":
        return 2 * count
    if compress == "int8":
        return count + INT8_HEADER
    return count * DTYPE_SIZES[dtype]


def quantization_error(compress: str, lo: float, hi: float) -> float:
    """Largest ``|decode(encode(x)) − x|`` one message can carry under ``compress`` when its
    values lie in ``[lo, hi]`` (0 for ``none``; ``inf`` for fp16 past ±65504)."""
    if compress not in COMPRESS_MODES:
        raise PlanError(f"unknown compress mode {compress!r}; expected one of {', '.join(COMPRESS_MODES)}")
    if not (lo <= hi):
        raise PlanError(f"quantization_error: empty or non-finite range [{lo}, {hi}]")
    if compress == "none":
        return 0.0
    if compress == "fp16":
        big = max(abs(lo), abs(hi))
        return float("inf") if big > FP16_MAX else FP16_REL * big + FP16_TINY
    return (hi - lo + INT8_EPS) / 510.0


def error_bound(compress: str, kind: str, op: str | None, ranges, peers: int = 1) -> float:
    """Largest per-element ``|result − exact|`` of a compressed ``kind`` collective (before
    float rounding of the reductions, which the checker adds) given ``ranges[r] = (lo, hi)``,
    rank r's input range; ``peers``: a neighbor_average's largest peer count. ``none``: 0.
    Raises :class:`PlanError` for a collective or op with no stated bound."""
    if compress == "none":
        return 0.0
    q = [quantization_error(compress, lo, hi) for lo, hi in ranges]
    if kind == "neighbor_average":
        return peers * max(q, default=0.0) / (1 + peers)
    if kind != "allreduce":
        raise PlanError(f"no stated error bound for a compressed {kind}")
    n = len(ranges)
    if op in ("sum", "avg", None):
        s = 1.0 / n if op == "avg" else 1.0
        first = s * sum(q)
        lo_s, hi_s = s * sum(lo for lo, _ in ranges), s * sum(hi for _, hi in ranges)
    elif op in ("min", "max"):
        first = max(q)
        lo_s, hi_s = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
    else:
        raise PlanError(f"no stated error bound for a compressed allreduce with op = {op}")
    # the owner's reduced block differs from the exact one by at most `first`, so its range
    # (what the second quantization sees) is the exact range widened by it
    return first + quantization_error(compress, lo_s - first, hi_s + first)
