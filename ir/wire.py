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
"""
from __future__ import annotations

from .errors import PlanError
from .plan import DTYPE_SIZES, FLOAT_DTYPES

__all__ = ["COMPRESS_MODES", "INT8_HEADER", "check_compress", "wire_nbytes"]

COMPRESS_MODES = ("none", "fp16", "int8")
INT8_HEADER = 8  # int8: the chunk's lo, hi as two little-endian float32


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
