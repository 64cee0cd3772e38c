"""hcc.ir.opscan — a plan's ops as flat numpy columns, read in one native pass (ir/_opscan.c).

Terms
- op id ``g``: rank ``r``'s op ``i`` is ``base[r] + i`` (programs concatenated in rank order).
- columns, per op id: ``code`` (0 Send, 1 Recv, 2 RecvReduce, 3 Copy, 4 Reduce, 5 Scale),
  ``rank``, ``ndeps``; ``peer``, ``tag``, ``tree`` of the message ops (-1 for local ops); the
  source range ``sbuf, soff, scnt`` (Send, Copy, Reduce) and the destination range ``dbuf,
  doff, dcnt`` (every op but Send), buffer codes 0 ``in``, 1 ``out``, 2 ``tmp``, 3 any other
  name, -1 none; ``extra``: a Scale's divisor, 1 for a Copy with ``roundtrip``, else 0.
- ``deps``: every op's ``deps`` entries concatenated (local indices, as written); ``owner``:
  the op id each entry belongs to.

The simulator (compiler/compact.py) and the verifier's fast path (ir/verify_scan.py) read
plans of millions of ops this way: about 0.3 us per op where a Python pass per field costs
that per field and op (each pass misses the cache on every object again).
:func:`scan` returns None when the extension is not built or an op is not one of the six
plan classes exactly (subclasses, foreign objects, fields of the wrong type): the callers
then take their Python paths, which also report every error.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from .plan import Copy, Recv, RecvReduce, Reduce, Scale, Send

try:
    from . import _opscan
except ImportError:  # not built (HCC_NO_NATIVE=1)
    _opscan = None

CLASSES = (Send, Recv, RecvReduce, Copy, Reduce, Scale)
BUF_CODES = ("in", "out", "tmp")


@dataclass(frozen=True, eq=False)
class OpTable:
    base: list[int]
    code: np.ndarray
    rank: np.ndarray
    ndeps: np.ndarray
    deps: np.ndarray
    owner: np.ndarray
    peer: np.ndarray
    tag: np.ndarray
    tree: np.ndarray
    sbuf: np.ndarray
    soff: np.ndarray
    scnt: np.ndarray
    dbuf: np.ndarray
    doff: np.ndarray
    dcnt: np.ndarray
    extra: np.ndarray

    @property
    def total(self) -> int:
        return self.base[-1]


def available() -> bool:
    return _opscan is not None


def scan(programs) -> OpTable | None:
    """The columns of ``programs`` (a plan's ``programs``), or None (see the module docstring)."""
    if _opscan is None:
        return None
    lens = list(map(len, programs))
    base = [0] * (len(lens) + 1)
    for r, k in enumerate(lens):
        base[r + 1] = base[r] + k
    total = base[-1]
    ops = list(chain.from_iterable(programs))
    code = np.empty(total, dtype=np.int8)
    sbuf = np.empty(total, dtype=np.int8)
    dbuf = np.empty(total, dtype=np.int8)
    cols = [np.empty(total, dtype=np.int64) for _ in range(9)]
    ndeps, peer, tag, tree, soff, scnt, doff, dcnt, extra = cols
    try:
        raw = _opscan.scan(ops, CLASSES, code, ndeps, peer, tag, tree, sbuf, soff, scnt, dbuf, doff, dcnt, extra)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    del ops
    if total and code.min() < 0:
        return None
    deps = np.frombuffer(raw, dtype=np.int64)
    rank = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    owner = np.repeat(np.arange(total, dtype=np.int64), ndeps)
    return OpTable(base, code, rank, ndeps, deps, owner, peer, tag, tree, sbuf, soff, scnt, dbuf, doff, dcnt, extra)
