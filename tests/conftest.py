"""Shared test helpers. Tests that start processes, MPI or Ray live in tests/runtime/ and are
marked ``slow``; they run in CI too."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


# The suite runs on two pytest-xdist workers (pyproject.toml: ``-n 2``), in units of work
# that this scheduler hands out whole (LoadScopeScheduling over :func:`_unit`, not
# ``--dist loadgroup``, whose group marks pytest 9 no longer carries into the node ids). Each
# test file is one unit, so its module fixtures are built once; the files of tests/runtime/
# are one unit together, run one at a time on one worker, since their ranks' processes, Ray
# cluster, MPI jobs and /dev/shm checks must not overlap each other; and test_golden and
# test_compact share sample_unit's compiles.
SHARED_UNITS = {"test_golden": "samples", "test_compact": "samples"}
# ... and the worker running the compiler's tests yields the CPU to the runtime tests' ranks
# (nice 19): their bounds on detection and completion times are the product's, and a
# compile beside them at the same priority stretched a survivor's step past its 8 s bound
# (tests/runtime/test_faults_ray.py) on two cores
COMPILE_NICE = 19


def _unit(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    if path.startswith("tests/runtime/"):
        return "runtime"
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    return SHARED_UNITS.get(stem, path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Units(config, log)


_START_NICE: list[int] = []


def pytest_runtest_setup(item):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if not _START_NICE:
        _START_NICE.append(nice)
    want = max(_START_NICE[0], COMPILE_NICE) if _unit(item.nodeid) != "runtime" else _START_NICE[0]
    if nice != want:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, want)
        except PermissionError:  # back up to the start's priority needs root: stay
            pass


@pytest.fixture(autouse=True)
def _runtime_alone(request, tmp_path_factory):
    """Under xdist, a runtime test holds a lock shared by the workers (in the run's temporary
    root) while it runs, and fails at once if another worker holds it: the scheduler above is
    what keeps them apart, and this says so loudly if it ever stops doing so."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or _unit(request.node.nodeid) != "runtime":
        yield
        return
    import fcntl

    with open(tmp_path_factory.getbasetemp().parent / "runtime.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.fail("another worker is running a runtime test at the same time "
                        "(tests/conftest.py's scheduler keeps tests/runtime/ on one worker)")
        yield


@pytest.fixture
def samples_dir() -> Path:
    return SAMPLES


@functools.lru_cache(maxsize=None)
def sample_unit(sample: str, name: str):
    """``compile_unit`` (default cost model) of collective ``name`` of samples/<sample>.hcl,
    once per session: test_golden and test_compact compile the same sample collectives
    (DGX-1 fragmented's seven take seconds each)."""
    from hcc.compiler.frontend import load_program
    from hcc.compiler.pipeline import compile_unit

    return compile_unit(load_program(str(SAMPLES / f"{sample}.hcl")), name)


def ring_topology(name: str, n: int, link: str, closed: bool = True) -> str:
    """HCL text of topology ``name``: nodes r0..r{n-1}, each linked (``<->``, bandwidth and
    latency ``link``) to the next, and the last to r0 when ``closed`` (a ring; else a chain).

    >>> print(ring_topology("pair", 2, "1 GB/s", closed=False), end="")
    topology pair {
        node r[0..1]
        r0 <-> r1 : 1 GB/s
    }
    """
    hops = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if closed else [])
    return (f"topology {name} {{\n    node r[0..{n - 1}]\n"
            + "".join(f"    r{a} <-> r{b} : {link}\n" for a, b in hops) + "}\n")


def fat_tree(name: str, racks: int, per_rack: int, spines: int, down: str, up: str) -> str:
    """HCL text of a two-level fat tree ``name``: hosts rack0.. of ``per_rack`` nodes n0.. on
    a leaf switch (links ``down``), every leaf linked to every spine switch (links ``up``)."""
    return (f"topology {name} {{\n    host rack[0..{racks - 1}] {{\n        node n[0..{per_rack - 1}]\n"
            f"        switch leaf\n        n[0..{per_rack - 1}] <-> leaf : {down}\n    }}\n"
            f"    switch spine[0..{spines - 1}]\n    rack[0..{racks - 1}].leaf <-> spine[0..{spines - 1}] : {up}\n}}\n")


# four hosts of 8 GPUs on an NVSwitch each, the switches on one ToR (docs/language.md, "Hosts")
CLUSTER = """\
topology cluster {
    host h[0..3] {
        node gpu[0..7]
        switch nvs
        gpu[0..7] <-> nvs : 150 GB/s
    }
    switch tor
    h[0..3].nvs <-> tor : 12.5 GB/s, 5 us
}
"""


# every collective kind, and the bytes of an element of each dtype the runtime tests use
KINDS = ("broadcast", "reduce", "allreduce", "allgather", "reduce_scatter", "gather", "scatter",
         "alltoall", "neighbor_average")
ITEM = {"float32": 4, "float64": 8, "int32": 4, "bfloat16": 2, "float16": 2}


def clique_topology(name: str, n: int, link: str) -> str:
    """HCL text of topology ``name``: nodes r0..r{n-1}, every pair linked both ways (``link``)."""
    return f"topology {name} {{\n    node r[0..{n - 1}]\n    r[0..{n - 1}] <-> r[0..{n - 1}] : {link}\n}}\n"


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster on loopback for the module (4 CPUs: the rank actors of one job)."""
    from hcc.backends import ray as hray

    with hray.local_cluster(num_cpus=4) as ray:
        yield ray


def ray_group_member() -> type:
    """A base class for the tests' Ray actors that join an hcc group as Ray's collective
    convention has it (``init_group`` inside the user's actors; ``join`` returns the rank).
    A new local class per call, so Ray ships it by value to workers that cannot import this
    file, as it does the test's own subclass."""

    class GroupMember:
        def __init__(self, rank: int, world: int):
            self.rank, self.world, self.comm = rank, world, None

        def join(self, name: str) -> int:
            from hcc.backends import ray as hr

            self.comm = hr.init_group(self.world, self.rank, name)
            return self.comm.rank

        def leave(self, name: str) -> None:
            from hcc.backends import ray as hr

            hr.destroy_group(name)

    return GroupMember


def two_ranks(fn0, fn1, timeout: float = 10.0, shm: str | None = None):
    """Run ``fn0`` / ``fn1`` on ranks 0 / 1 of a real sockets job in two threads (loopback;
    ``shm="on"``: their data goes through the native core's shared-memory channels). Returns
    ``(results, errors)``, one entry per rank; an exception a rank raised is in ``errors``."""
    return ranks_in_threads((fn0, fn1), timeout, shm)


def ranks_in_threads(fns, timeout: float = 10.0, shm: str | None = None):
    """:func:`two_ranks` for ``len(fns)`` ranks: ``fns[r]`` runs on rank r."""
    import threading

    from hcc.backends import sockets
    from hcc.backends.rendezvous import StoreServer

    server = StoreServer("tok")
    n = len(fns)
    res, errs = [None] * n, [None] * n

    def body(r, fn):
        try:
            with sockets.connect(r, n, server.address, "tok", timeout=timeout, serve_store=False, shm=shm) as c:
                res[r] = fn(c)
        except Exception as e:  # collected for the assertions
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r, f)) for r, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(3 * timeout)
    server.close()
    return res, errs
