"""hcc.collectives without processes: the default topology, the rank mapping, the plan cache
(memory, disk, atomic files, keyed by the topology's digest), and the error report that names
each rank's call."""
from __future__ import annotations

import pytest

import hcc
from hcc.collectives import (
    CallInfo, CollectiveError, Communicator, PlanCache, _star_program, resolve_topology, star_topology,
)

from conftest import two_ranks

TOPO = """
topology two {
    node a, b, c
    switch s
    a <-> s : 1 GB/s
    b <-> s : 1 GB/s
    c <-> s : 2 GB/s
}
"""


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("shm", [False, True])
def test_default_star_is_what_its_source_parses_to(world, shm):
    assert (_star_program(world, shm).topologies["hcc_star"]
            == hcc.load(star_topology(world, shm)).topologies["hcc_star"])


def test_rank_mapping_default_and_named(monkeypatch):
    monkeypatch.delenv("HCC_TOPOLOGY", raising=False)
    monkeypatch.delenv("HCC_RANKS", raising=False)
    _, name, ranks = resolve_topology(2, TOPO)
    assert (name, ranks) == ("two", ("a", "b"))
    monkeypatch.setenv("HCC_RANKS", "c,a")
    assert resolve_topology(2, TOPO)[2] == ("c", "a")
    monkeypatch.setenv("HCC_RANKS", "c,x")
    with pytest.raises(CollectiveError, match="not nodes: x"):
        resolve_topology(2, TOPO)
    monkeypatch.delenv("HCC_RANKS")
    with pytest.raises(CollectiveError, match="has 3 nodes, the job 4 ranks"):
        resolve_topology(4, TOPO)


def test_plan_cache_compiles_once_then_reads_disk(tmp_path):
    program, name, ranks = resolve_topology(3, TOPO, ["a", "b", "c"])
    first = PlanCache(program, name, ranks, str(tmp_path))
    p = first.get("allreduce", 13, "float32", "sum", -1)
    assert first.get("allreduce", 13, "float32", "sum", -1) is p  # memory
    assert (first.compiled, first.loaded) == (1, 0)
    assert p.kind == "allreduce" and p.elems == 13 and p.n == 3 and p.ranks == ranks
    files = sorted(x.name for x in (tmp_path / first.digest).iterdir() if x.suffix == ".json")
    assert files == ["allreduce-13-float32-sum--1.json"]
    second = PlanCache(program, name, ranks, str(tmp_path))
    q = second.get("allreduce", 13, "float32", "sum", -1)
    assert (second.compiled, second.loaded) == (0, 1) and q.digest() == p.digest()
    # another rank mapping is another topology digest: no plan is shared across them
    other = PlanCache(program, name, ("c", "b", "a"), str(tmp_path))
    assert other.digest != first.digest
    r = other.get("broadcast", 7, "int8", None, 2)
    assert other.compiled == 1 and r.root == 2 and r.dtype == "int8"


class _Store(dict):
    def set(self, k, v):
        self[k] = v

    def get(self, k):  # noqa: A003 - the KeyStore protocol's name
        return self[k]

    def check(self, keys):
        return all(k in self for k in keys)


def test_failure_report_names_each_ranks_call():
    import json

    store = _Store()
    store.set("hcc/diag/5/1", json.dumps(CallInfo("allreduce", 101, "float32", "sum", -1, (101,)).__dict__).encode())
    store.set("hcc/diag/5/2", json.dumps(CallInfo("allreduce", 100, "float32", "sum", -1, (10, 10)).__dict__).encode())
    comm = Communicator.__new__(Communicator)
    comm.store, comm.rank, comm.world, comm.prefix, comm.timeout = store, 0, 4, "hcc", 0.2
    err = comm._diagnose(5, CallInfo("allreduce", 100, "float32", "sum", -1, (10, 10)), RuntimeError("boom"))
    text = str(err)
    assert "rank 0: collective #5 (allreduce float32 count 100 shape (10, 10) op sum) failed: boom" in text
    assert "ranks 0, 2 called allreduce float32 count 100 shape (10, 10) op sum" in text
    assert "rank 1 called allreduce float32 count 101 op sum" in text
    assert json.loads(store["hcc/diag/5/0"])["count"] == 100  # this rank's call, for the others


def test_shared_packing_gives_the_plans_the_whole_pipeline_gives(tmp_path):
    """The cache packs each (kind, root) once and lowers every size from that packing: the
    plans are exactly those of a full compile of each size."""
    from dataclasses import replace

    from hcc.compiler.pipeline import compile_unit
    from hcc.compiler.program import CollectiveSpec
    from hcc.runner import RUN_MODELS

    program, name, ranks = resolve_topology(3, TOPO, ["a", "b", "c"])
    cache = PlanCache(program, name, ranks, str(tmp_path))
    for kind, count, root in (("allreduce", 1001, -1), ("allreduce", 70001, -1), ("broadcast", 999, 1),
                              ("broadcast", 5003, 1)):
        got = cache.get(kind, count, "float32", "sum" if kind == "allreduce" else None, root)
        spec = CollectiveSpec(name="c", kind=kind, topology=name, ranks=ranks, root=root, size_bytes=count * 4,
                              dtype="float32", op="sum" if kind == "allreduce" else None, adaptive=False)
        want = compile_unit(replace(program, collectives=(spec,)), "c", model=RUN_MODELS["sockets"]).plan
        assert got.digest() == want.digest(), (kind, count)
    assert sorted(cache._packings) == [("allreduce", -1), ("broadcast", 1)]


# ---------------------------------------------------------------- order checks on the wire


def _shm_modes():
    from hcc.backends import native

    return ["off", "on"] if native.available() else ["off"]


@pytest.mark.parametrize("shm", _shm_modes())
@pytest.mark.parametrize("receive_first", [True, False])
def test_another_plan_in_a_tag_space_fails_at_once_whatever_its_tags(shm, receive_first):
    """Tag space 1 (bits 24-30, where a Communicator puts its call #0): rank 1 receives tag 5
    for plan A, rank 0 sends tag 7 of plan B. No tag matches, yet rank 1 fails with a protocol
    error naming both plans — before the frame is held (posted first) or when the receive is
    posted (frame first) — instead of waiting for its deadline."""
    import threading

    import numpy as np

    from hcc.backends.sockets import ProtocolError

    space = 1 << 24
    # the sender keeps its connection open until the receiver has its verdict. An event, not a
    # store barrier: the refused frame may mark the peer failed on one side, whose barrier then
    # raises at once while the other waited out the barrier's whole 10 s (1 run in ~7)
    verdict = threading.Event()

    def sender(c):
        if receive_first:
            c.barrier("posted")
        req = c.isend(1, space | 7, memoryview(np.ones(4)), plan=0xB0B0B0B0)
        c.wait_any([req], 5)
        if not receive_first:
            c.barrier("sent")
        verdict.wait(10)

    def receiver(c):
        buf = np.zeros(4)
        try:
            if not receive_first:
                c.barrier("sent")
                import time

                time.sleep(0.3)  # the frame is held by now
            req = c.irecv(0, space | 5, memoryview(buf), plan=0xA0A0A0A0)
            if receive_first:
                c.barrier("posted")
            c.wait_any([req], 8)
        finally:
            verdict.set()

    _, errs = two_ranks(sender, receiver, shm=shm)
    assert isinstance(errs[1], ProtocolError), errs
    assert "different plans as one call" in str(errs[1]) and "b0b0b0b0" in str(errs[1]) \
        and "a0a0a0a0" in str(errs[1]), errs[1]


def _wait_all(c, reqs):
    """Wait for every request of ``reqs`` (at most 100 rounds of 5 s)."""
    left = set(range(len(reqs)))
    for _ in range(100):
        left -= set(c.wait_any(reqs, 5))
        if not left:
            break


@pytest.mark.parametrize("shm", _shm_modes())
def test_one_plan_per_tag_space_and_no_space_are_left_alone(shm):
    """The same plan with other tags in one space, and another plan in space 0 (a plan run
    alone), are ordinary early frames: no error, the data arrives."""
    import numpy as np

    space = 3 << 24
    sent = [np.full(4, float(k)) for k in range(3)]

    def sender(c):
        reqs = [c.isend(1, space | 9, memoryview(sent[0]), plan=0xA),
                c.isend(1, space | 5, memoryview(sent[1]), plan=0xA),
                c.isend(1, 11, memoryview(sent[2]), plan=0xB)]
        _wait_all(c, reqs)
        c.barrier("end", 10)

    def receiver(c):
        got = [np.zeros(4) for _ in range(3)]
        reqs = [c.irecv(0, space | 5, memoryview(got[1]), plan=0xA),
                c.irecv(0, 11, memoryview(got[2]), plan=0xB)]
        import time

        time.sleep(0.3)
        reqs.append(c.irecv(0, space | 9, memoryview(got[0]), plan=0xA))
        _wait_all(c, reqs)
        c.barrier("end", 10)
        return got

    res, errs = two_ranks(sender, receiver, shm=shm)
    assert errs == [None, None], errs
    assert all(np.array_equal(a, b) for a, b in zip(res[1], sent))


def test_a_size_is_specialised_from_its_octave_and_depends_on_its_key_only(tmp_path, monkeypatch):
    """100003 and 70001 floats (391 and 273 KiB) share the octave of 256 KiB, whose reference
    (65536 floats) is the size-generic plan's (1 MiB, the one full compile) algorithm with its
    chunk searched again; each size is lowered from the reference's algorithm and chunk. A new
    octave costs no further full compile. Two caches that saw the sizes in different orders
    hold the same plans (ranks with different histories must run one plan);
    HCC_PLAN_SEARCH=full compiles every size with the whole search instead."""
    from hcc.collectives import GENERIC_BYTES, SPECIALISE_MIN_BYTES

    monkeypatch.delenv("HCC_PLAN_SEARCH", raising=False)
    program, name, ranks = resolve_topology(3, TOPO, ["a", "b", "c"])
    a = PlanCache(program, name, ranks, str(tmp_path / "a"))
    b = PlanCache(program, name, ranks, str(tmp_path / "b"))
    generic = ("allreduce", GENERIC_BYTES // 4, "float32", "sum", -1)
    assert a.reference(("allreduce", 100003, "float32", "sum", -1)) == ("allreduce", 65536, "float32", "sum", -1)
    assert a.reference(("allreduce", 65536, "float32", "sum", -1)) == generic  # an octave's reference
    assert a.reference(generic) is None  # the one full compile
    assert a.reference(("allreduce", SPECIALISE_MIN_BYTES // 4 - 1, "float32", "sum", -1)) is None
    pa = a.get("allreduce", 100003, "float32", "sum", -1)
    b.get("allreduce", 70001, "float32", "sum", -1)
    pb = b.get("allreduce", 100003, "float32", "sum", -1)
    assert pa.digest() == pb.digest()
    ref = a.get("allreduce", 65536, "float32", "sum", -1)
    gen = a.get(*generic)
    assert (a.compiled, a.specialised) == (3, 2) and pa.algorithm == ref.algorithm == gen.algorithm
    assert pa.elems == 100003 and b.specialised == 3
    # a new octave (4 MiB): its reference and the size, both specialised, no full compile
    big = a.get("allreduce", (4 << 20) // 4 + 7, "float32", "sum", -1)
    assert (a.compiled, a.specialised) == (5, 4) and big.algorithm == gen.algorithm
    monkeypatch.setenv("HCC_PLAN_SEARCH", "full")
    full = PlanCache(program, name, ranks, str(tmp_path / "a"))
    assert full.digest != a.digest  # never mixed on disk with the specialised plans
    pf = full.get("allreduce", 100003, "float32", "sum", -1)
    assert full.specialised == 0 and pf.elems == 100003
    # the whole search can only be as fast or faster, by the same cost model
    assert pf.figures.predicted_s <= pa.figures.predicted_s * (1 + 1e-9)
