"""Late arrivals on the sockets backend: ranks enter a collective at different times; the
adaptive executor gives ready ranks the interior tree positions, and ``quorum=K`` reduces the
first K inputs that arrive (Hoplite's subset reduction), reporting the others as late."""
from __future__ import annotations

import numpy as np
import pytest

import hcc
from hcc.backends.testing import Case, run_local
from hcc.backends.reference import _reduce, check, expected, make_inputs

pytestmark = pytest.mark.slow

N = 5
SRC = f"""
topology t {{ node g[0..{N - 1}]
  g[0..{N - 1}] <-> g[0..{N - 1}] : 1 GB/s, 10 us }}
collective broadcast = broadcast on t {{ size = 4 MB  root = g3  adaptive = on }}
collective allreduce = allreduce on t {{ size = 4 MB  adaptive = on }}
collective reduce = reduce on t {{ size = 4 MB  dtype = int32  op = sum  adaptive = on }}
collective allgather = allgather on t {{ size = 4 MB  adaptive = on }}
collective small = allreduce on t {{ size = 64 KB  dtype = int32 }}
collective small_c = allreduce on t {{ size = 64 KB  dtype = int32  on_failure = continue }}
"""
LATE_S = 0.6  # far beyond the scheduling jitter of 5 processes on 2 cores (~50 ms)


@pytest.fixture(scope="module")
def plans():
    prog = hcc.load(SRC)
    return {c.name: hcc.compile(prog, c.name) for c in prog.collectives}


STAR = f"""topology star {{ node g[0..{N - 1}]  switch s
  g[0..{N - 1}] <-> s : 1 MB/s }}
collective ar = allreduce on star {{ size = 4 MB  on_failure = continue }}
collective ari = allreduce on star {{ size = 4 MB  dtype = int32  op = max }}
"""
SLOW_G3 = f"""topology star {{ node g[0..{N - 1}]  switch s
  g[0..2] <-> s : 1 MB/s
  g3 <-> s : 0.25 MB/s
  g4 <-> s : 1 MB/s }}
collective ar = allreduce on star {{ size = 4 MB  on_failure = continue }}
collective ari = allreduce on star {{ size = 4 MB  dtype = int32  op = max }}
"""
QUORUM_SETS = [((0, 2, 4), (1, 3)), ((1, 3, 4), (0, 2)), ((0, 1, 2), (3, 4))] * 2


def _shared_cases(plans) -> dict[str, list[Case]]:
    """The cases of the tests below that need a job of their own only for its start-up: each
    test's cases, in order (the cases are independent runs; a case's timings count from its
    own start barrier)."""
    rng = np.random.default_rng(7)
    staggered = []
    for name in ("broadcast", "allreduce", "reduce", "allgather"):
        for adaptive in (True, False):
            delays = tuple(float(d) for d in rng.uniform(0, 0.3, N))
            staggered.append(Case(plans[name], seed=int(rng.integers(1 << 16)), delays=delays, adaptive=adaptive))
    quorum = [Case(plans["allreduce"], seed=11 + i, delays=tuple(LATE_S if r in late else 0.0 for r in range(N)),
                   quorum=3) for i, (early, late) in enumerate(QUORUM_SETS)]
    quorum_reduce = [Case(plans["reduce"], seed=5, delays=tuple(0.0 if r in (0, 3) else LATE_S for r in range(N)),
                          quorum=2)]
    star = hcc.load(STAR)
    relays = [Case(hcc.compile(star, name), seed=s, adaptive=True, chunk_bytes=256 << 10,
                   delays=tuple(0.15 * r for r in range(N))) for name, s in (("ar", 3), ("ari", 4))]
    slow = hcc.load(SLOW_G3)
    drain = [Case(hcc.compile(slow, name), seed=s, adaptive=True, delays=(0.0, 0.0, 0.0, 0.5, 0.55))
             for name, s in (("ar", 5), ("ari", 6))]
    trace = [Case(plans["allreduce"], seed=8, adaptive=True, trace=True, delays=(0.0, 0.2, 0.05, 0.3, 0.1))]
    return {"staggered": staggered, "quorum": quorum, "quorum_reduce": quorum_reduce, "relays": relays,
            "drain": drain, "trace": trace}


@pytest.fixture(scope="module")
def shared(plans) -> dict[str, list[tuple[Case, object]]]:
    """One 5-rank job runs the cases of six tests (each test used to start five processes of
    its own for a few runs); per test, its (case, outcome) pairs."""
    groups = _shared_cases(plans)
    cases = [c for g in groups.values() for c in g]
    outs = iter(run_local(cases, timeout=10))
    return {name: [(c, next(outs)) for c in g] for name, g in groups.items()}


def test_staggered_arrivals_adaptive_and_static_are_exact_and_wait_only_for_the_last(shared):
    assert len(shared["staggered"]) == 8
    for case, out in shared["staggered"]:
        assert not out.errors, out.errors
        plan = case.plan
        check(plan, out.outputs, expected(plan, make_inputs(plan, case.seed)))
        last = max(case.delays)
        for r in range(N):
            # no rank finishes before the last one arrived (reduce non-roots excepted: they
            # may return as soon as everybody is done), and none long after
            assert out.info[r]["seconds"] < last + 3.0, (plan.kind, r, out.info[r]["seconds"], last)
            assert out.info[r]["contributors"] == list(range(N))


def test_default_is_static_when_nobody_is_late_adaptive_when_someone_is_and_the_log_stays_bounded(plans):
    # `adaptive` not said: the backend's default, on for sockets (Plan.adaptive None). Every
    # run decides on one store counter whether every rank arrived before any rank declared the
    # run late (backends/adaptive/engine.py Run.decide): static program then, adaptive otherwise.
    from dataclasses import replace

    plan = replace(plans["small"], adaptive=None)
    assert plan.on_failure == "abort"
    late_run = 25
    cases = [Case(plan, seed=i, delays=tuple(LATE_S if (i == late_run and r == 1) else 0.0 for r in range(N)))
             for i in range(50)]
    outs = run_local(cases, timeout=10, overall=240)
    adaptive_runs = 0
    for i, (case, out) in enumerate(zip(cases, outs)):
        assert not out.errors, (i, out.errors)
        check(plan, out.outputs, expected(plan, make_inputs(plan, case.seed)))
        paths = {out.info[r]["stats"]["path"] for r in range(N)}
        assert len(paths) == 1, f"run {i}: the ranks disagree on the schedule: {paths}"
        adaptive_runs += paths == {"adaptive"}
        if i == late_run:
            # rank 1 is 0.6 s late, far beyond the 30 ms the others wait before declaring it
            assert paths == {"adaptive"}
    # nobody late: almost always static (a run whose ranks reach it more than 30 ms apart, as
    # on a machine whose cores other jobs hold, adapts, and is still exact)
    assert adaptive_runs <= 10, f"{adaptive_runs} of 50 runs adapted"
    # the log: a static run appends nothing; an adaptive run with on_failure = abort appends
    # one arrival per rank (no done events: it ends on a store counter) and the claims of the
    # star allreduce's sub-blocks (at most one per sub-block). So over 50 runs the log grows
    # by exactly N + its claims per adaptive run, and not at all for the others.
    first, last = outs[0].info[0]["log_length"], outs[-1].info[0]["log_length"]
    grown = 0
    for out in outs[1:]:
        if out.info[0]["stats"]["path"] == "adaptive":
            claims = sum(out.info[r]["stats"].get("claims", 0) for r in range(N))
            assert claims <= 8 * (N - 1), claims  # 8 sub-blocks per owner slot (STAR_SPLIT)
            grown += N + claims
    assert last - first == grown, (first, last, adaptive_runs)


def test_quorum_allreduce_reduces_the_first_k_arrivals_and_reports_the_late(plans, shared):
    # Several runs: a rank may fold the early arrivals after its first result chunk came in
    # (its contributor set still growing then); such a chunk must still count as final. One
    # run of this in about 15 hung before that was handled (Run.refresh_shapes).
    plan = plans["allreduce"]
    assert len(shared["quorum"]) == len(QUORUM_SETS)
    for (case, out), (early, late) in zip(shared["quorum"], QUORUM_SETS):
        assert case.plan is plan and case.quorum == 3
        assert not out.errors, out.errors
        ins = make_inputs(plan, case.seed)
        want = _reduce(plan, [ins[r] for r in early])
        check(plan, out.outputs, [want] * N)  # late ranks get the result too
        for r in range(N):
            assert out.info[r]["contributors"] == list(early)
            assert out.info[r]["late"] == list(late)
        # the early ranks need not wait for the late ones' inputs; the late ones only receive
        for r in early:
            assert out.info[r]["seconds"] < LATE_S + 2.0


def test_quorum_reduce_keeps_the_root_and_the_first_arrivals(plans, shared):
    plan = plans["reduce"]
    assert plan.root == 0
    ((case, out),) = shared["quorum_reduce"]
    assert case.plan is plan and case.quorum == 2 and case.delays == (0.0, LATE_S, LATE_S, 0.0, LATE_S)
    assert not out.errors, out.errors
    ins = make_inputs(plan, case.seed)
    got = out.outputs[plan.root]
    assert np.array_equal(got, ins[0] + ins[3])  # int32 sum: exact
    assert out.info[plan.root]["contributors"] == [0, 3]
    assert out.info[plan.root]["late"] == [1, 2, 4]


def test_plan_run_dispatches_to_the_adaptive_runtime_and_returns_an_ndarray(plans):
    # three ranks as threads of this process over real sockets: hcc.run -> runtime.run ->
    # the adaptive runtime for a plan with on_failure = continue
    import secrets
    import threading

    from hcc.backends import sockets
    from hcc.backends.adaptive import AdaptiveResult, close_session
    from hcc.backends.rendezvous import StoreServer

    prog = hcc.load("""topology t { node g[0..2]
      g[0..2] <-> g[0..2] : 1 GB/s }
    collective a = allreduce on t { size = 4000 B  dtype = int32  on_failure = continue }""")
    plan = hcc.compile(prog, "a")
    ins = make_inputs(plan, 2)
    outs, errs = [None] * 3, []
    token = secrets.token_hex(8)
    with StoreServer(token) as store:
        def rank(r):
            try:
                with sockets.connect(r, 3, store.address, token, timeout=10, serve_store=False) as comm:
                    outs[r] = hcc.run(plan, comm, ins[r], timeout=10)
                    close_session(comm)
            except Exception as e:  # reported below with the rank
                errs.append((r, e))

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errs, errs
    for o in outs:
        assert isinstance(o, AdaptiveResult) and isinstance(o, np.ndarray)
        assert o.contributors == (0, 1, 2) and o.missing == ()
    assert np.array_equal(outs[0], ins[0] + ins[1] + ins[2])
    check(plan, [np.asarray(o) for o in outs], expected(plan, ins))


def test_a_timed_out_adaptive_run_names_what_it_lacks_and_dumps_each_ranks_view(tmp_path, monkeypatch):
    # HCC_ADAPTIVE_DUMP=DIR: a rank whose adaptive run reaches its deadline writes its view of
    # the run (arrivals, contributors, pending transfers, per flow its chunks' keys and tree
    # positions) to DIR before it raises. Ranks 0 and 1 run the collective, rank 2 never enters
    # it (connected, alive, not dead: on_failure = continue waits for it up to the deadline).
    import json
    import secrets
    import threading

    from hcc.backends import sockets
    from hcc.backends.adaptive import close_session
    from hcc.backends.base import CollectiveTimeout
    from hcc.backends.rendezvous import StoreServer

    monkeypatch.setenv("HCC_ADAPTIVE_DUMP", str(tmp_path))
    prog = hcc.load("""topology t { node g[0..2]
      g[0..2] <-> g[0..2] : 1 GB/s }
    collective a = allreduce on t { size = 4000 B  dtype = int32  on_failure = continue }""")
    plan = hcc.compile(prog, "a")
    ins = make_inputs(plan, 3)
    errs: dict = {}
    token = secrets.token_hex(8)
    released = threading.Event()
    with StoreServer(token) as store:
        def rank(r):
            try:
                with sockets.connect(r, 3, store.address, token, timeout=10, serve_store=False) as comm:
                    if r == 2:
                        released.wait(20)  # present on the wire, never in the collective
                        return
                    try:
                        hcc.run(plan, comm, ins[r], timeout=1.0)
                    finally:
                        close_session(comm)
            except Exception as e:  # reported below with the rank
                errs[r] = e

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads[:2]:
            t.join(30)
        released.set()
        threads[2].join(30)
    assert sorted(errs) == [0, 1], errs
    for r in (0, 1):
        assert isinstance(errs[r], CollectiveTimeout), errs[r]
        assert f"rank {r}: timed out after 1 s" in str(errs[r]), str(errs[r])
        dumps = list(tmp_path.glob(f"adaptive-*-rank{r}.json"))
        assert len(dumps) == 1, dumps
        state = json.loads(dumps[0].read_text())
        assert state["rank"] == r and state["why"] in str(errs[r])
        assert sorted(state["arrivals"]) == [0, 1] and state["dead"] == []
        assert state["contributors"] == [0, 1, 2]  # continue: every live rank, arrived or not
        assert state["flows"] and state["pending"]
        # nothing is final without rank 2's input: every flow lacks some chunk
        assert all(min(f["have"]) != state["contrib_mask"] for f in state["flows"])
    assert not list(tmp_path.glob("adaptive-*-rank2.json"))
    # the flows a timeout with nothing posted names, as ranges
    import doctest

    import hcc.backends.adaptive.flows as flows
    from hcc.backends.adaptive import ranges as _ranges
    assert _ranges([8, 0, 2, 1, 3, 10, 11]) == "0-3, 8, 10-11" and _ranges([]) == ""
    result = doctest.testmod(flows)
    assert result.attempted > 0 and result.failed == 0


def test_the_agreement_log_stays_bounded_over_50_adaptive_runs(plans):
    # on_failure = continue, adaptive forced: every run appends 2n events (n arrivals, n done).
    # The log is a ring of agreement.capacity(n) slots that a writer reuses once every rank's
    # tail has read it, so after 50 runs (10 n events, many times the ring) the store holds at
    # most the ring + seq/world/cap/capinit/ndead + per rank a reader position + per death a
    # deadrep counter and a dead record (none die here) — and the harness's per-case start
    # barriers, which are not the log's. Before the ring, the log held one key per event.
    from hcc.backends.agreement import capacity

    plan = plans["small_c"]
    runs = 50
    cases = [Case(plan, seed=i, adaptive=True,
                  delays=tuple(0.05 if (r == i % N) else 0.0 for r in range(N))) for i in range(runs)]
    keys: list[str] = []
    outs = run_local(cases, timeout=10, overall=240, store_keys=keys)
    for i, (case, out) in enumerate(zip(cases, outs)):
        assert not out.errors, (i, out.errors)
        check(plan, out.outputs, expected(plan, make_inputs(plan, case.seed)))
        assert all(out.info[r]["contributors"] == list(range(N)) for r in range(N))
    events = outs[-1].info[0]["log_length"]
    assert events >= runs * 2 * N, events  # the log did go round the ring many times
    cap = capacity(N)
    assert events > 5 * cap
    log_keys = [k for k in keys if "/ev/" in k and "/ev/barrier/" not in k
                and "/ev/fast/" not in k and not k.endswith("/ev/fin")]
    assert len(log_keys) <= cap + 3 * N + 5, (len(log_keys), sorted(log_keys)[:20])


def test_no_rank_relays_while_it_still_has_pieces_to_push_and_the_result_stays_exact(shared):
    # The plan is compiled for a star of 1 MB/s links (the links' figures are what the
    # relay trees weigh; the bytes here cross loopback). Ranks arrive 0.15 s apart, so every
    # rank still has seconds of pieces to push (3 blocks of 1 MB at 1 MB/s) when the last
    # arrives. Every owner's results wait for those pieces, so nobody relays a copy
    # (backends/repair.relay_parents): a relayed copy through a rank still pushing pieces
    # delayed the last rank's pieces by ~0.5 s in the emulated 8-rank star. Results are exact.
    # (the cases: STAR, in _shared_cases)
    assert len(shared["relays"]) == 2
    for case, out in shared["relays"]:
        assert not out.errors, out.errors
        check(case.plan, out.outputs, expected(case.plan, make_inputs(case.plan, case.seed)))
        relays = {r: out.info[r]["stats"]["relays"] for r in range(N)}
        assert sum(relays.values()) == 0, relays


def test_the_second_to_last_arrival_owns_nothing_when_its_link_cannot_drain_in_time(shared):
    # Who owns the star allreduce's sub-blocks (backends/adaptive/star.py maybe_claim / share_rest,
    # backends/repair.py claim_count / share_by_load): the plan says g3's link is 4x slower
    # (0.25 MB/s) than the others' (1 MB/s). Ranks 0-2 arrive at once and claim up to
    # CLAIM_CAP equal shares each (1.5 x 8 = 12 sub-blocks: possibly all 32); rank 3 arrives
    # 0.05 s before the last with the pieces of the claimed sub-blocks to push through its
    # slow link (4 MB at most: 16 s by the model, against ~6 s for an early owner at the cap). So it claims
    # nothing, gets no sub-block at the share-out, and ends like the last rank: pieces up,
    # results down. The bytes cross loopback; the result is exact (float sum, int32 max).
    # (the cases: SLOW_G3 with delays (0, 0, 0, 0.5, 0.55), in _shared_cases)
    assert len(shared["drain"]) == 2
    for case, out in shared["drain"]:
        assert not out.errors, out.errors
        check(case.plan, out.outputs, expected(case.plan, make_inputs(case.plan, case.seed)))
        stats = {r: out.info[r]["stats"] for r in range(N)}
        assert stats[3]["owns"] == 0 and stats[3].get("claims", 0) == 0, stats[3]
        # every sub-block has exactly one owner, and the early ranks claimed (1.5 x 8 = 12 at most)
        assert sum(s["owns"] for s in stats.values()) == 8 * (N - 1), stats
        assert all(0 < stats[r]["owns"] for r in (0, 1, 2)), stats


def test_the_star_trace_accounts_for_every_chunk_and_results_follow_their_last_piece(plans, shared):
    # run(trace=True) (benchmarks/fault_bench.py --trace): every piece an owner received was
    # posted by its sender to that owner, every result a rank received was posted to it, and
    # an owner posts a result chunk only once the pieces of every other rank are in (one
    # CLOCK_MONOTONIC for all processes on Linux, so the ranks' times compare).
    plan = plans["allreduce"]
    ((case, out),) = shared["trace"]
    assert case.plan is plan and case.trace
    assert not out.errors, out.errors
    check(plan, out.outputs, expected(plan, make_inputs(plan, case.seed)))
    ev = {r: out.info[r]["stats"]["events"] for r in range(N)}
    owner = {int(k): v for k, v in out.info[0]["stats"]["owner"].items()}
    posted = {(r, k, f, c, p) for r in ev for t, k, f, c, p in ev[r] if k in ("ps", "rs")}
    for r in range(N):
        for t, k, f, c, p in ev[r]:
            if k == "pi":
                assert owner[f] == r and (p, "ps", f, c, r) in posted, (r, f, c, p)
            elif k == "ri":
                assert (p, "rs", f, c, r) in posted, (r, f, c, p)
    pieces_in = {}
    for r in range(N):
        for t, k, f, c, p in ev[r]:
            if k == "pi":
                pieces_in.setdefault((f, c), []).append(t)
    for r in range(N):
        for t, k, f, c, p in ev[r]:
            if k == "rs" and owner[f] == r:
                got = pieces_in.get((f, c), [])
                assert len(got) == N - 1 and t >= max(got), (f, c, t, got)
