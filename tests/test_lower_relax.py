"""Lowering of relaxations (compiler/lower_relax.py): plan structure, shift_one pairing, and
end-to-end results of the plans executed in-process by a small reference interpreter that
applies the codec on every message as the executor does (no processes, no sockets)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcc.backends.codecs import get_codec
from hcc.backends.kernels import np_dtype, reduce_into, scale_into
from hcc.ir.plan import neighbor_peers
from hcc.compiler.lower_relax import (
    relax_plan,
    wire_bytes,
)
from hcc.compiler.program import CollectiveSpec
from hcc.grammar.diagnostics import Source, SourceError, Span
from hcc.ir.errors import PlanError, VerifyError
from hcc.ir.plan import Copy, Recv, RecvReduce, Scale, Send
from hcc.ir.topology import Link, Topology


def full_mesh(n: int) -> Topology:
    names = tuple(f"r{i}" for i in range(n))
    links = tuple(Link(a, b, 1e9) for a in names for b in names if a != b)
    return Topology("mesh", names, links=links)


def spec(kind="allreduce", n=4, elems=1000, dtype="float32", op="sum", compress="int8",
         peers=None, span=None) -> CollectiveSpec:
    from hcc.ir.plan import DTYPE_SIZES

    return CollectiveSpec(
        name="c", kind=kind, topology="mesh", ranks=tuple(f"r{i}" for i in range(n)), root=-1,
        size_bytes=elems * DTYPE_SIZES[dtype], dtype=dtype, op=op, compress=compress,
        peers=peers, span=span,
    )


def execute(plan, inputs, programs=None):
    """Run every rank's program in-process: ops are posted when their deps completed; a Send
    completes at once (its bytes, encoded by the plan's codec, wait in a mailbox); a Recv or
    RecvReduce completes when its message is there. Fails on a deadlock or unmatched message.
    Reductions use the executor's kernels (backends/kernels.py: bfloat16 in float32)."""
    progs = plan.programs if programs is None else programs
    codec = get_codec(plan.compress, plan.dtype)
    dt = np_dtype(plan.dtype)
    bufs = []
    for r in range(plan.n):
        sizes = plan.buffer_elems(r)
        bufs.append({"in": np.asarray(inputs[r], dtype=dt).copy(),
                     "out": np.zeros(sizes["out"], dt), "tmp": np.zeros(sizes["tmp"], dt)})
    view = lambda r, ref: bufs[r][ref.buf][ref.offset:ref.end]  # noqa: E731
    mail: dict[tuple[int, int, int], np.ndarray] = {}
    done = [[False] * len(p) for p in progs]
    progress = True
    while progress:
        progress = False
        for r, prog in enumerate(progs):
            for i, op in enumerate(prog):
                if done[r][i] or not all(done[r][d] for d in op.deps):
                    continue
                if isinstance(op, Send):
                    key = (r, op.peer, op.tag)
                    assert key not in mail, f"duplicate message {key}"
                    src = view(r, op.src)
                    if codec is None:
                        mail[key] = src.copy()
                    else:
                        wire = np.empty(codec.wire_nbytes(len(src)), np.uint8)
                        codec.encode(src, wire)
                        mail[key] = wire
                elif isinstance(op, (Recv, RecvReduce)):
                    key = (op.peer, r, op.tag)
                    if key not in mail:
                        continue
                    msg = mail.pop(key)
                    dst = view(r, op.dst)
                    val = np.empty_like(dst)
                    if codec is None:
                        assert len(msg) == len(dst)
                        val[:] = msg
                    else:
                        codec.decode(msg, val)
                    if isinstance(op, Recv):
                        dst[:] = val
                    else:
                        reduce_into(plan.op, plan.dtype, dst, val)
                elif isinstance(op, Copy):
                    if op.roundtrip and codec is not None:
                        codec.roundtrip(view(r, op.src), view(r, op.dst))
                    else:
                        view(r, op.dst)[:] = view(r, op.src)
                elif isinstance(op, Scale):
                    scale_into(plan.dtype, view(r, op.dst), op.divisor)
                done[r][i] = progress = True
    assert all(all(d) for d in done), "deadlock: some ops never became ready"
    assert not mail, f"messages never received: {sorted(mail)}"
    return [b["out"] for b in bufs]


# ---------------------------------------------------------------- structure


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_compressed_allreduce_structure(n):
    plan = relax_plan(spec(n=n, elems=1024), full_mesh(n), chunk_bytes=4096)
    sends = [(r, op.peer) for r, p in enumerate(plan.programs) for op in p if isinstance(op, Send)]
    # blocks of 1024/n floats fit one 4 KiB chunk: each ordered pair talks twice
    # (reduce-scatter and allgather), n(n-1)*2 messages in all
    assert len(sends) == n * (n - 1) * 2
    assert set(sends) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert plan.figures.wire_bytes == wire_bytes(plan)
    # every element crosses the wire twice (once per phase) with an 8-byte header per message
    assert plan.figures.wire_bytes == 2 * (n - 1) * 1024 + 8 * len(sends)
    for r, prog in enumerate(plan.programs):
        for i, op in enumerate(prog):
            assert all(d < i for d in op.deps)
        rt = [op for op in prog if isinstance(op, Copy) and op.roundtrip]
        assert len(rt) == 1  # the owner keeps what it sent


def test_wire_ratio_int8_and_fp16():
    elems = (64 << 20) // 4
    base = relax_plan(spec(elems=elems, compress="fp16"), full_mesh(4), None).figures.wire_bytes
    int8 = relax_plan(spec(elems=elems), full_mesh(4), None).figures.wire_bytes
    uncompressed = 2 * 3 * elems * 4  # 2(n-1)/n of the buffer per rank, times n ranks
    assert base == uncompressed // 2
    assert int8 / uncompressed <= 0.26


def test_chunking_respects_chunk_bytes():
    plan = relax_plan(spec(n=2, elems=10_000), full_mesh(2), chunk_bytes=4000)
    counts = [op.src.count for p in plan.programs for op in p if isinstance(op, Send)]
    assert max(counts) <= 1000 and sum(counts) == 2 * 10_000


def test_tags_unique_per_ordered_pair():
    plan = relax_plan(spec(n=3, elems=30_000), full_mesh(3), chunk_bytes=4096)
    seen = set()
    for r, prog in enumerate(plan.programs):
        for op in prog:
            if isinstance(op, Send):
                key = (r, op.peer, op.tag)
                assert key not in seen and 0 <= op.tag < 2**24
                seen.add(key)


@pytest.mark.parametrize("n", [2, 4, 6, 8, 10])
def test_shift_one_pairs_are_mutual_and_rotate(n):
    partners_over_steps = [set() for _ in range(n)]
    for step in range(n):
        for r in range(n):
            (p,) = neighbor_peers("shift_one", n, r, step)
            assert p != r
            assert neighbor_peers("shift_one", n, p, step) == (r,)  # mutual
            assert (r < n // 2) != (p < n // 2)  # pairs cross the halves
            partners_over_steps[r].add(p)
    # over n/2 steps a rank meets every rank of the other half
    assert all(len(s) == n // 2 for s in partners_over_steps)


def test_shift_one_formula_literal():
    n, h = 8, 4
    for step in range(5):
        for r in range(n):
            want = ((step + r) % 4) + h if r < h else (r - h - step) % h
            assert neighbor_peers("shift_one", n, r, step) == (want,)


def test_ring_and_all_peers():
    assert neighbor_peers("ring", 1, 0) == ()
    assert neighbor_peers("ring", 2, 1) == (0,)
    assert neighbor_peers("ring", 4, 0) == (1, 3)
    assert neighbor_peers("all", 4, 2) == (0, 1, 3)


def test_shift_one_odd_is_a_source_error():
    src = Source("x.hcl", "collective c = neighbor_average on mesh { peers = shift_one }\n")
    span = Span(src, 1, 12)
    with pytest.raises(SourceError, match="even rank count") as e:
        relax_plan(spec(kind="neighbor_average", n=3, peers="shift_one", span=span), full_mesh(3), None)
    assert "x.hcl:1:12" in e.value.render()
    with pytest.raises(PlanError, match="even"):
        neighbor_peers("shift_one", 5, 0)


def test_rejects_what_it_does_not_lower():
    with pytest.raises(PlanError, match="only compressed"):
        relax_plan(spec(compress="none"), full_mesh(4), None)
    with pytest.raises(PlanError, match="not broadcast"):
        relax_plan(spec(kind="broadcast"), full_mesh(4), None)
    with pytest.raises(PlanError, match="floating-point"):
        relax_plan(spec(dtype="int32"), full_mesh(4), None)


def test_plans_carry_every_step():
    ring = relax_plan(spec(kind="neighbor_average", compress="none"), full_mesh(4), None)
    assert ring.step_programs == () and ring.programs_at(7) is ring.programs
    s1 = relax_plan(spec(kind="neighbor_average", peers="shift_one", compress="none"), full_mesh(4), None)
    assert len(s1.step_programs) == 1  # shift_one over 4 ranks repeats every 2 steps
    assert s1.programs_at(0) is s1.programs and s1.programs_at(2) is s1.programs
    step1 = s1.programs_at(1)
    assert step1 != s1.programs and s1.programs_at(5) is step1
    assert {op.peer for op in step1[0] if isinstance(op, Send)} == {3}
    # every step a rank can be at is one of the plan's, with the pairing of that step
    s6 = relax_plan(spec(kind="neighbor_average", n=6, peers="shift_one", compress="none"), full_mesh(6), None)
    assert len(s6.step_programs) == 2
    for step in range(7):
        for r in range(6):
            sent = {op.peer for op in s6.programs_at(step)[r] if isinstance(op, Send)}
            assert sent == set(neighbor_peers("shift_one", 6, r, step)), (step, r)


def test_plans_verify_when_verifier_present():
    from hcc.ir import verify
    for sp in (spec(n=3, elems=1001), spec(op="avg", compress="fp16"),
               spec(kind="neighbor_average", compress="none"),
               spec(kind="neighbor_average", peers="shift_one", compress="int8"),
               spec(kind="neighbor_average", peers="all", compress="fp16")):
        verify.verify(relax_plan(sp, full_mesh(len(sp.ranks)), 1024))
    # every step's programs of a shift_one plan verify too (verify checks each step's pairing)
    plan = relax_plan(spec(kind="neighbor_average", n=6, peers="shift_one", compress="none"), full_mesh(6), 1024)
    verify.verify(plan)
    # a plan whose steps are out of order fails: step 1 run as step 0 averages the wrong peers
    with pytest.raises(VerifyError, match="of step 0"):
        verify.verify(replace(plan, programs=plan.step_programs[0],
                              step_programs=(plan.programs, plan.step_programs[1])))
    # a plan that drops a step of its period is refused
    with pytest.raises(VerifyError, match="repeats every 3"):
        verify.verify(replace(plan, step_programs=plan.step_programs[:1]))


# ---------------------------------------------------------------- executed results


def _bound_int8(contribs: list[np.ndarray], owner_sum: np.ndarray, n: int, avg: bool) -> float:
    """The bound of lower_relax's docstring for one chunk: each contribution quantized once,
    the reduced chunk once more (plus float32 rounding slack)."""
    q = lambda v: (float(v.max()) - float(v.min()) + 1e-7) / 510 * (1 + 1e-6)  # noqa: E731
    first = sum(q(v) for v in contribs) / (n if avg else 1)
    return first + q(owner_sum)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(1, 3000), st.sampled_from(["sum", "avg"]),
       st.floats(1e-3, 1e4), st.integers(0, 2**32 - 1))
def test_int8_allreduce_error_bound_and_identical_ranks(n, elems, op, spread, seed):
    rng = np.random.default_rng(seed)
    xs = [(rng.normal(size=elems) * spread).astype(np.float32) for _ in range(n)]
    chunk = 512  # bytes: several chunks per block so each carries its own header
    plan = relax_plan(spec(n=n, elems=elems, op=op), full_mesh(n), chunk)
    outs = execute(plan, xs)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0) / (n if op == "avg" else 1)
    for o in outs[1:]:
        assert o.tobytes() == outs[0].tobytes()  # every rank identical (owner round trip)
    # check the bound chunk by chunk, per owner
    y = outs[0].astype(np.float64)
    for owner, prog in enumerate(plan.programs):
        for o in prog:
            if isinstance(o, Copy) and o.roundtrip:
                sl = slice(o.dst.offset, o.dst.end)
                contribs = [xs[r][sl].astype(np.float64) for r in range(n) if r != owner]
                partial = xs[owner][sl].astype(np.float64) + sum(contribs)
                if op == "avg":
                    partial = partial / n
                bound = _bound_int8(contribs, partial, n, op == "avg")
                # the owner quantizes its approximate sum: widen by the first-phase error
                bound += _bound_int8(contribs, partial, n, op == "avg") / 255
                # float32 arithmetic: each of the n-1 additions, the scale and the final
                # store round by at most 2^-24 of the magnitudes involved
                mag = np.sum([np.abs(x[sl].astype(np.float64)) for x in xs], axis=0)
                slack = (n + 2) * mag * 2.0**-24 + 1e-30
                assert np.all(np.abs(y[sl] - exact[sl]) <= bound + slack)


@pytest.mark.parametrize("op", ["sum", "max", "min", "avg"])
def test_fp16_allreduce_close(op):
    rng = np.random.default_rng(5)
    n, elems = 4, 777
    xs = [rng.normal(size=elems).astype(np.float64) for _ in range(n)]
    plan = relax_plan(spec(n=n, elems=elems, dtype="float64", op=op, compress="fp16"), full_mesh(n), 256)
    outs = execute(plan, xs)
    red = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}[op]
    exact = red(np.stack(xs), axis=0)
    mag = np.sum(np.abs(np.stack(xs)), axis=0)
    for o in outs:
        assert np.all(np.abs(o - exact) <= 2 * 2.0**-11 * mag + 1e-12)
        assert o.tobytes() == outs[0].tobytes()


@pytest.mark.parametrize("peers,n", [("ring", 2), ("ring", 5), ("all", 4), ("shift_one", 6)])
@pytest.mark.parametrize("step", [0, 3])
def test_neighbor_average_exact_uncompressed(peers, n, step):
    rng = np.random.default_rng(7)
    elems = 1234
    xs = [rng.normal(size=elems) for _ in range(n)]
    plan = relax_plan(spec(kind="neighbor_average", n=n, elems=elems, dtype="float64",
                           compress="none", peers=peers), full_mesh(n), 2048)
    outs = execute(plan, xs, plan.programs_at(step))
    for r in range(n):
        group = neighbor_peers(peers, n, r, step)
        want = (xs[r] + sum(xs[p] for p in group)) / (1 + len(group))
        np.testing.assert_allclose(outs[r], want, rtol=1e-12, atol=1e-12)


def test_neighbor_average_int8_within_bound():
    rng = np.random.default_rng(8)
    n, elems = 4, 3000
    xs = [rng.normal(size=elems).astype(np.float32) for _ in range(n)]
    plan = relax_plan(spec(kind="neighbor_average", n=n, elems=elems, peers="ring"), full_mesh(n), 1 << 20)
    outs = execute(plan, xs)
    for r in range(n):
        group = neighbor_peers("ring", n, r)
        want = (xs[r].astype(np.float64) + sum(xs[p] for p in group)) / (1 + len(group))
        # each peer's message quantized once (one chunk: range of its whole buffer)
        bound = sum((float(xs[p].max()) - float(xs[p].min()) + 1e-7) / 510 for p in group) / (1 + len(group))
        assert np.all(np.abs(outs[r] - want) <= bound * 1.0001 + 1e-6)


def test_bfloat16_int8_allreduce():
    from hcc.backends.kernels import from_float32, to_float32

    rng = np.random.default_rng(9)
    n, elems = 3, 500
    xs32 = [rng.normal(size=elems).astype(np.float32) for _ in range(n)]
    xs = [from_float32(x, "bfloat16") for x in xs32]
    plan = relax_plan(spec(n=n, elems=elems, dtype="bfloat16", op="avg"), full_mesh(n), 256)
    outs = execute(plan, xs)
    exact = np.mean([to_float32(x, "bfloat16").astype(np.float64) for x in xs], axis=0)
    assert all(o.dtype == np.uint16 and o.tobytes() == outs[0].tobytes() for o in outs)
    got = to_float32(outs[0], "bfloat16").astype(np.float64)
    # two quantizations of ranges < 10 (first divided by n) plus bfloat16 rounding (2^-8)
    assert np.max(np.abs(got - exact)) <= 10 / 510 + 10 / 510 + np.max(np.abs(exact)) * 2.0**-7


def test_single_rank_is_a_copy():
    x = np.arange(10, dtype=np.float32)
    plan = relax_plan(spec(n=1, elems=10), full_mesh(1), None)
    assert execute(plan, [x])[0].tolist() == x.tolist()


def test_doctests_of_relax_modules():
    import doctest

    import hcc.backends.codecs
    import hcc.ir.plan
    import hcc.relax

    for mod in (hcc.backends.codecs, hcc.ir.plan, hcc.relax):  # ir.plan: neighbor_peers
        res = doctest.testmod(mod)
        assert res.failed == 0 and res.attempted > 0, mod.__name__
