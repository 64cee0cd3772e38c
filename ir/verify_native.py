"""hcc.ir.verify_native — checks 4-7 of ir/verify.py (races, deadlock freedom, symbolic
execution, final buffers) in one native pass (ir/_verifycore.c) over the op columns that
ir/verify_scan.py read for checks 2-3, for plans of millions of ops.

Terms
- slot: one elementary ``(rank, buffer, range)`` of ``out`` or ``tmp``: the ranges the rank's
  ops name in the buffer, cut at every one's start and end, so that each op's range is a run
  of whole slots and one slot holds one value and one race state. In a *laminar* buffer
  (ranges pairwise equal or disjoint, verify_values._laminar: the tree lowerings' plans) a
  slot is an op's range; the two-level plans (compiler/levels.py) name ranges that overlap
  without nesting, whose ops then span several slots. A message's value is the run of its
  source slots' values (equal neighbours merged); a destination slot that would receive two
  different values is not represented here.
- value: verify_values' ``((shift, mask),), divisor`` with a single term group, the rank mask
  as ``ceil(n / 64)`` 64-bit words.

:func:`verify` returns True only when every check passed natively. It returns False when the
columns are missing, the extension is not built, the kind's final state is not a fixed
table (neighbor_average), a value needs two term groups, a slot two values, or any check
failed: ir/verify.py then runs its Python checks, which accept the plan or name its fault
with rank and op. So the native pass decides nothing the Python checks would decide
otherwise; tests/test_verify_native.py holds the two to the same verdict on valid plans and
on plans with injected faults.
"""
from __future__ import annotations

import numpy as np

try:
    from . import _verifycore
except ImportError:  # not built (HCC_NO_NATIVE=1)
    _verifycore = None

# slot keys ((rank * 2 + buffer - 1) << OFFSET_BITS) + start stay inside 63 bits for buffers of
# fewer than 2**40 elements and fewer than 2**22 ranks
OFFSET_BITS = 40


def available() -> bool:
    return _verifycore is not None


def verify(plan, sizes: list[dict[str, int]], ix) -> bool:
    """True when ``plan`` passes checks 4-7 natively (see the module docstring); ``ix`` is
    verify_scan.check_ops's index."""
    tab = getattr(ix, "tab", None)
    if _verifycore is None or tab is None or plan.kind == "neighbor_average":
        return False
    n, total = plan.n, ix.total
    if n >= 1 << 21 or any(max(s.get("out", 0), s.get("tmp", 0)) >= 1 << OFFSET_BITS for s in sizes):
        return False
    req = _required(plan)
    if req is None:
        return False
    req_ptr, req_lo, req_hi, req_shift, req_bit, req_div = req
    # the required table's run ends cut ``out`` too: a range that spans two blocks of
    # different owners (an allgather's lane message) holds two values, one per block
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(req_ptr))
    cuts = np.concatenate([(owner * 2) << OFFSET_BITS | req_lo, (owner * 2) << OFFSET_BITS | req_hi])
    rslot, rend, wslot, wend, slot_key, slot_end = _slots(tab, cuts)
    code, rank, soff, doff, extra = tab.code, tab.rank, tab.soff, tab.doff, tab.extra
    # deps as global ids: the first ndep_edges edges, in op order (verify_scan's edges A)
    dep_ptr = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(tab.ndeps, out=dep_ptr[1:])
    # the other columns go now: on a 4-million-op plan they are ~200 MB of the peak
    ix.tab = tab = None
    dep_idx = np.ascontiguousarray(ix.src[:ix.ndep_edges], dtype=np.int64)
    # the completes-before CSR, built as verify._order builds it
    src, dst = np.asarray(ix.src, dtype=np.int64), np.asarray(ix.dst, dtype=np.int64)
    succ = np.ascontiguousarray(dst[np.argsort(src, kind="stable")])
    succ_ptr = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=total), out=succ_ptr[1:])
    indeg = np.bincount(dst, minlength=total).astype(np.int64)
    del src, dst
    # rank r's out slots: keys sort by (rank, buffer, start), so they are the keys in
    # [(2r) << OFFSET_BITS, (2r + 1) << OFFSET_BITS)
    r2 = np.arange(n, dtype=np.int64) * 2
    out_rng = np.stack([np.searchsorted(slot_key, r2 << OFFSET_BITS),
                        np.searchsorted(slot_key, (r2 + 1) << OFFSET_BITS)], axis=1).astype(np.int64).ravel()
    slot_start = slot_key & ((1 << OFFSET_BITS) - 1)
    words = (n + 63) // 64
    status, why = _verifycore.run(
        n, words, _c(code, np.int8), _c(rank), dep_ptr, dep_idx, rslot, rend, _c(soff), wslot, wend, _c(doff),
        _c(extra), _c(ix.partner), succ_ptr, succ, indeg, int(slot_key.size),
        _c(out_rng), _c(slot_start), _c(slot_end), req_ptr, req_lo, req_hi, req_shift, req_bit, req_div)
    return status == 0


def _c(a: np.ndarray, dtype=np.int64) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=dtype)


def _slots(tab, cuts: np.ndarray):
    """``(rslot, rend, wslot, wend, slot_key, slot_end)``: per op the slots it reads
    (``rslot:rend``; rslot -1 none, -2 ``in``) and writes (``wslot:wend``; -1 none), and per
    slot its key and end. The slots of a (rank, buffer) are the *elementary* ranges between
    consecutive ends of the ranges its ops name and of ``cuts`` (keys where values are
    known to change; module docstring): a range of a laminar buffer is one slot, one that
    overlaps others without nesting spans several."""
    code, rank = tab.code, tab.rank
    reads = ((code == 0) | (code == 3) | (code == 4)) & (tab.sbuf >= 1)
    writes = code >= 1
    r_ids, w_ids = np.flatnonzero(reads), np.flatnonzero(writes)
    key = np.concatenate([((rank[r_ids] * 2 + tab.sbuf[r_ids] - 1) << OFFSET_BITS) + tab.soff[r_ids],
                          ((rank[w_ids] * 2 + tab.dbuf[w_ids] - 1) << OFFSET_BITS) + tab.doff[w_ids]])
    end = key + np.concatenate([tab.scnt[r_ids], tab.dcnt[w_ids]])
    # every start and end, sorted: elementary range i is [ends[i], ends[i + 1]), a slot when
    # some range covers it (ranges never cross a (rank, buffer): ends stay below 2**40)
    ends = np.unique(np.concatenate([key, end, cuts]))
    lo, hi = np.searchsorted(ends, key), np.searchsorted(ends, end)
    depth = np.cumsum(np.bincount(lo, minlength=ends.size) - np.bincount(hi, minlength=ends.size))[:-1]
    covered = depth > 0
    sid = np.cumsum(covered) - 1  # the slot of each covered elementary range
    slot_key = ends[:-1][covered]
    slot_end = ends[1:][covered] & ((1 << OFFSET_BITS) - 1)
    first = sid[lo]
    last = first + (hi - lo)  # every elementary range inside an op's range is covered
    rslot = np.full(tab.total, -1, dtype=np.int64)
    rslot[((code == 0) | (code == 3) | (code == 4)) & (tab.sbuf == 0)] = -2
    rend = np.full(tab.total, -1, dtype=np.int64)
    k = r_ids.size
    rslot[r_ids], rend[r_ids] = first[:k], last[:k]
    wslot = np.full(tab.total, -1, dtype=np.int64)
    wend = np.full(tab.total, -1, dtype=np.int64)
    wslot[w_ids], wend[w_ids] = first[k:], last[k:]
    return rslot, rend, wslot, wend, slot_key, slot_end


def _required(plan):
    """ir/verify_values._required for every rank as columns: ``req_ptr`` (rank r's runs are
    ``req_ptr[r]:req_ptr[r+1]``), ``lo, hi, shift``, ``bit`` (the one contributing rank, -1
    for every rank) and ``div``; None for a kind without a fixed table."""
    n, E, kind, root = plan.n, plan.elems, plan.kind, plan.root
    div = n if plan.op == "avg" else 1
    r = np.arange(n, dtype=np.int64)
    lo_r = r * E // n
    hi_r = (r + 1) * E // n
    one = np.ones(n, dtype=np.int64)
    if kind == "broadcast":
        cols = (one * 0, one * E, one * 0, one * root, one)
    elif kind in ("reduce", "allreduce"):
        cols = (one * 0, one * E, one * 0, -one, one * div)
        if kind == "reduce":
            cols = tuple(c[root:root + 1] for c in cols)
            return _table(n, np.array([root]), cols)
    elif kind in ("allgather", "gather"):
        who = r if kind == "allgather" else np.array([root])
        j = np.tile(r, who.size)
        lo = j * E // n
        hi = (j + 1) * E // n
        cols = (lo, hi, -lo, j, np.ones_like(j))
        return _table(n, np.repeat(who, n), cols)
    elif kind == "reduce_scatter":
        cols = (one * 0, hi_r - lo_r, lo_r, -one, one * div)
    elif kind == "scatter":
        cols = (one * 0, hi_r - lo_r, lo_r, one * root, one)
    elif kind == "alltoall":
        w = E // n
        rr, j = np.repeat(r, n), np.tile(r, n)
        cols = (j * w, (j + 1) * w, (rr - j) * w, j, np.ones_like(j))
        return _table(n, rr, cols)
    else:
        return None
    return _table(n, r, cols)


def _table(n: int, owner: np.ndarray, cols) -> tuple:
    """The runs ``cols`` of ranks ``owner`` (sorted by rank, runs in order) with ``req_ptr``."""
    req_ptr = np.searchsorted(owner, np.arange(n + 1), side="left").astype(np.int64)
    return (req_ptr,) + tuple(np.ascontiguousarray(c, dtype=np.int64) for c in cols)


__all__ = ["available", "verify"]
