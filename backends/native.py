"""hcc.backends.native — hand one rank's compiled program to the native core.

The native core (``backends/_native.c``, built by ``pip install`` as ``hcc.backends._native``)
runs the loop of :class:`~hcc.backends.executor.RankExecution` — post receives, send, reduce,
copy, scale, wait — in C with the GIL released, over the shared-memory channels of
``backends/shm.py``. It stays small and dumb (style.md habit 16): Python computes the
:class:`~hcc.backends.executor.Schedule` (dependencies, start order, fused Copies) and every
decision; the core runs the op table it is given.

Terms
- encoded program: per op ``NF`` int64 fields ``(kind, peer, tag, dst buffer, dst byte
  offset, bytes, src buffer, src byte offset, divisor, external)``; buffers are numbered ``in`` 0,
  ``out`` 1, ``tmp`` 2. A Send names its source in the dst fields; a RecvReduce with a fused
  Copy names the Copy's source as its src (it computes ``dst = src (op) received`` piece by
  piece), without one src is -1. A fused Copy is a ``NOP``. The dependents of op k are
  ``dep_idx[dep_ptr[k]:dep_ptr[k+1]]``; ``missing`` the deps each op waits for; ``first`` the
  ops without deps in the executor's start order. ``peer`` is the local peer's index on the
  channels, or, for an *external* transfer (``external`` = 1: the peer is not on this host),
  the peer's rank: the core hands those to Python, which moves them over the sockets
  transport's TCP connections while the core runs the rest (a mixed job, e.g. 2 hosts).
- fallback: where the extension is not built (``HCC_NO_NATIVE=1`` at install: no channels
  either, every peer is reached over TCP), where ``HCC_NATIVE=0`` is set (the channels stay,
  the Python executor drives them), or where a rank has no local peer at all (a plain
  sockets transport), the pure-Python executor runs it — the reference the tests compare
  the core against.

Reductions: the core's kernels compute exactly what :mod:`hcc.backends.kernels` computes with
numpy for integers (wrapping sum and product, floor division for ``avg``) and for float16 and
bfloat16 (widened to float32, rounded once, ties to even); float32/float64 results may differ
from numpy's in the last bits only where numpy's pairwise SIMD order differs (they do not for
the elementwise kernels used here, but the tests allow the reduction-order tolerance).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

try:  # built by `pip install -e .` (setup.py); absent when HCC_NO_NATIVE=1 was set at install
    from . import _native
except ImportError:  # the pure-Python executor runs every plan
    _native = None

__all__ = ["available", "runner_enabled", "encode", "Encoded", "DTYPE_CODES", "OP_CODES", "NF", "combine", "scale"]

DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3, "int8": 4, "int32": 5, "int64": 6,
               "uint8": 7}
OP_CODES = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3}
NF = 10
K_SEND, K_RECV, K_RECV_REDUCE, K_COPY, K_REDUCE, K_SCALE, K_NOP = range(7)
_BUF = {"in": 0, "out": 1, "tmp": 2}


def available() -> bool:
    """The extension is importable (the shared-memory channels need it)."""
    return _native is not None


def runner_enabled() -> bool:
    """The native program runner is used: the extension is built and ``HCC_NATIVE=0`` is not
    set (with it, the pure-Python executor runs every program, over the same channels)."""
    return _native is not None and os.environ.get("HCC_NATIVE", "1") != "0"


def combine(op: str, dtype: str, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``dst = a (op) b`` with the core's kernel (tests compare it with kernels.combine_into)."""
    _native.combine(OP_CODES[op], DTYPE_CODES[dtype], dst, a, b)


def scale(dtype: str, dst: np.ndarray, divisor: int) -> None:
    """``dst /= divisor`` with the core's kernel (floor division for integers)."""
    _native.scale(DTYPE_CODES[dtype], dst, int(divisor))


@dataclass(frozen=True, eq=False)
class Encoded:
    """One rank's program as the core's op table (see the module docstring)."""

    ops: np.ndarray  # int64 [n_ops, NF]
    dep_ptr: np.ndarray  # int64 [n_ops + 1]
    dep_idx: np.ndarray  # int64
    missing: np.ndarray  # int32 [n_ops]
    first: np.ndarray  # int64
    op: int
    dtype: int
    external: int = 0  # transfers to peers not on this host (moved over TCP by Python)


def encode(ex, peer_index: dict[int, int]) -> Encoded:
    """The op table of ``ex`` (a :class:`~hcc.backends.executor.RankExecution`); a transfer to
    a rank without an index in ``peer_index`` (not on this host) is an external row naming
    the rank. Cached on the execution's schedule for its peer map, so a plan run again costs
    no encoding."""
    sched = ex.sched
    key = tuple(sorted(peer_index.items()))
    cache = sched.__dict__.get("_native")
    if cache is not None and cache[0] == key:
        return cache[1]
    program, kinds = ex.program, ex.kinds
    size = np.dtype(ex.bufs["out"].dtype).itemsize
    from .executor import COPY, RECV, RECV_REDUCE, REDUCE, SCALE, SEND

    rows = np.zeros((len(program), NF), dtype=np.int64)
    external = 0
    for k, op in enumerate(program):
        kind = kinds[k]
        row = rows[k]
        if kind in (SEND, RECV, RECV_REDUCE):
            idx = peer_index.get(op.peer)
            if idx is None:
                idx, row[9] = op.peer, 1
                external += 1
            ref = op.src if kind == SEND else op.dst
            row[0] = K_SEND if kind == SEND else K_RECV if kind == RECV else K_RECV_REDUCE
            row[1], row[2] = idx, op.tag
            row[3], row[4], row[5] = _BUF[ref.buf], ref.offset * size, ref.count * size
            row[6] = -1
            if kind == RECV_REDUCE and k in ex.fused:
                src = ex.fused[k]
                row[6], row[7] = _BUF[src.buf], src.offset * size
        elif kind == COPY:
            if k in ex.skip_copy:
                row[0] = K_NOP
            else:
                row[0] = K_COPY
                row[3], row[4], row[5] = _BUF[op.dst.buf], op.dst.offset * size, op.dst.count * size
                row[6], row[7] = _BUF[op.src.buf], op.src.offset * size
        elif kind == REDUCE:
            row[0] = K_REDUCE
            row[3], row[4], row[5] = _BUF[op.dst.buf], op.dst.offset * size, op.dst.count * size
            row[6], row[7] = _BUF[op.src.buf], op.src.offset * size
        elif kind == SCALE:
            row[0] = K_SCALE
            row[3], row[4], row[5] = _BUF[op.dst.buf], op.dst.offset * size, op.dst.count * size
            row[6], row[8] = -1, op.divisor
    deps = ex.dependents
    ptr = np.zeros(len(program) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(d) for d in deps])
    idx = np.fromiter((j for d in deps for j in d), dtype=np.int64, count=int(ptr[-1]))
    enc = Encoded(rows, ptr, idx, np.asarray(ex.missing_at_start, dtype=np.int32),
                  np.asarray(ex.first, dtype=np.int64), OP_CODES[ex.op_name], DTYPE_CODES[ex.plan.dtype],
                  external)
    object.__setattr__(sched, "_native", (key, enc))
    return enc


def buffer_arg(arr: np.ndarray | None):
    """What the core gets for a buffer: the array when it is contiguous, else None (a
    broadcast receiver's zero-stride input view, which its program never reads)."""
    if arr is None or not arr.flags.c_contiguous:
        return None
    return arr
