"""Every kind × dtype × op × size × rank count, compiled by hcc and run over the sockets
backend between real processes, checked against numpy.

Grid: kinds (all nine; neighbor_average with peers ring, and shift_one on even counts) ×
dtypes {float32, float64, int32, bfloat16} × every valid op × sizes {1 element (n for
alltoall), 1001 elements (not divisible by the ranks or the chunks)} × ranks {2, 3, 4, 8};
plus every kind at 8 MiB on 2 and 3 ranks and 2 MiB on 4 and 8 (one dtype/op per kind, rotating).

Cost control (the whole grid must stay well under a few minutes on 2 cores):
- one process launch per rank count: every plan of that count runs in one job, in sequence;
- one compile per (kind, ranks, elements, op): a plan's program counts *elements*, so the
  other dtypes are the same program with ``dtype``/``size_bytes`` replaced — re-verified by
  the worker's ``Plan.load`` before it runs;
- the topology is a bidirectional ring (the packer's cheapest non-trivial case);
- 2 MiB, not 8, at 4 and 8 ranks: every kind compiles to the same algorithm at both sizes;
  the pipelined ones (broadcast and reduce, and scatter at 4 ranks) run half the chunks
  (2 MiB in 64 KiB chunks at 4 ranks, in 32 KiB at 8), the others the same ops, with
  messages still far above a socket buffer. The 8 MiB cases at 8 ranks were the grid's
  largest cost (35 s of the suite: their inputs and traffic).
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest

import hcc
from hcc.backends.launch import run_cases_local
from hcc.backends.reference import check, expected, make_inputs
from hcc.ir.plan import DTYPE_SIZES, KINDS, OPS, REDUCING_KINDS

pytestmark = pytest.mark.slow

DTYPES = ("float32", "float64", "int32", "bfloat16")
BIG = 8 << 20
BIG_AT = {4: 2 << 20, 8: 2 << 20}  # rank count -> its large size instead of BIG (see the docstring)


def _source(n: int, cols: list[tuple]) -> str:
    links = "\n".join(f"    r{i} <-> r{(i + 1) % n} : 1 GB/s, 10 us" for i in range(n) if n > 2 or i == 0)
    s = f"topology t {{\n    node r[0..{n - 1}]\n{links}\n}}\n"
    for name, kind, size, dtype, op, peers in cols:
        s += f"collective {name} = {kind} on t {{\n    size = {size} B\n    dtype = {dtype}\n"
        if op:
            s += f"    op = {op}\n"
        if peers:
            s += f"    peers = {peers}\n"
        s += "}\n"
    return s


def _variants(n: int):
    """(kind, ops, peers) combinations valid on n ranks."""
    for kind in KINDS:
        if kind in REDUCING_KINDS:
            yield kind, OPS, None
        elif kind == "neighbor_average":
            yield kind, ("avg",), "ring"
            if n % 2 == 0:
                yield kind, ("avg",), "shift_one"
        else:
            yield kind, (None,), None


def _cases(n: int):
    cols = []
    for kind, ops, peers in _variants(n):
        for elems in (1, 1001):
            e = elems * n if kind == "alltoall" else elems
            for op in ops:
                cols.append((f"c{len(cols)}", kind, e * 4, "float32", op if kind != "neighbor_average" else None, peers))
    rot = itertools.cycle(itertools.product(DTYPES, OPS))
    big = []
    for kind, ops, peers in _variants(n):
        dtype, op = next(rot)
        if kind not in REDUCING_KINDS:
            op = None
        big_bytes = BIG_AT.get(n, BIG)
        size = big_bytes - big_bytes % (n * DTYPE_SIZES[dtype])
        big.append((f"b{len(big)}", kind, size, dtype, op, peers))
    program = hcc.load(_source(n, cols + big))
    plans = []
    for c in cols:
        base = hcc.compile(program, c[0])
        for dtype in DTYPES:
            plans.append(dataclasses.replace(base, dtype=dtype, size_bytes=base.elems * DTYPE_SIZES[dtype],
                                             name=f"{c[1]}-{c[4] or c[5] or ''}-{dtype}-{base.elems}"))
    plans += [hcc.compile(program, c[0]) for c in big]
    return plans


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_grid_against_numpy(n):
    plans = _cases(n)
    cases = [(p, make_inputs(p, 11)) for p in plans]
    results = run_cases_local("sockets", cases, iters=1, timeout=30)
    bad = []
    for (p, ins), res in zip(cases, results):
        try:
            check(p, res.outputs, expected(p, ins))
        except Exception as e:  # collect every failure, report them together
            bad.append(f"{p.name} ({p.kind}, {p.dtype}, op={p.op}, {p.elems} elems, {p.algorithm}): {e}")
    assert not bad, f"{len(bad)} of {len(cases)} cases wrong:\n" + "\n".join(bad[:20])
    kinds = {p.kind for p in plans}
    assert kinds == set(KINDS)
