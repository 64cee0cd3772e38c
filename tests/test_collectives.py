"""hcc.collectives without processes: the default topology, the rank mapping, the plan cache
(memory, disk, atomic files, keyed by the topology's digest), and the error report that names
each rank's call."""
from __future__ import annotations

import pytest

import hcc
from hcc.collectives import (
    CallInfo, CollectiveError, Communicator, PlanCache, _star_program, resolve_topology, star_topology,
)

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
def test_default_star_is_what_its_source_parses_to(world):
    assert _star_program(world).topologies["hcc_star"] == hcc.load(star_topology(world)).topologies["hcc_star"]


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
