"""hcc as a Ray collective backend: ``col.init_collective_group(..., backend="hcc")`` and
``col.allreduce(tensor, group_name)`` in user actors (numpy arrays and torch tensors), every
collective of Ray's API checked against numpy, data over hcc's sockets; and the same call
shapes through ``hcc.ray``'s own functions. One local Ray cluster on loopback per module."""
from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")
col = pytest.importorskip("ray.util.collective")

pytestmark = pytest.mark.slow

WORLD = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import os

    os.environ["HCC_CACHE_DIR"] = str(tmp_path_factory.mktemp("plans"))
    ray.init(address="local", num_cpus=WORLD, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@ray.remote(num_cpus=0)
class Member:
    def __init__(self, rank: int):
        self.rank = rank

    def setup(self, world: int, group: str, via_module: bool) -> str:
        import hcc.ray as hray

        if via_module:
            hray.init_collective_group(world, self.rank, backend="hcc", group_name=group)
            return "module"
        col.init_collective_group(world, self.rank, backend="hcc", group_name=group)
        from hcc.backends import native
        from hcc.backends.sockets import SocketTransport
        from hcc.runner import RUN_MODELS

        g = col.get_group_handle(group)
        t = g.comm.transport
        # actors of one node share a host: their data goes through shared memory when the
        # native core is built, and the plans are compiled for it
        local = len(getattr(t, "local_peers", ())) == world - 1
        want_local = native.available()
        return (f"{type(g).__name__} {isinstance(t, SocketTransport)} local={local == want_local} "
                f"model={g.comm.cache.model == RUN_MODELS['shm' if local else 'sockets']}")

    def work(self, world: int, group: str, via_module: bool) -> dict:
        import torch

        import hcc.ray as hray

        api = hray if via_module else col
        r = self.rank
        out: dict = {}
        a = np.arange(1009, dtype=np.float32) * (r + 1)
        api.allreduce(a, group_name=group)
        out["allreduce_np"] = a
        t = torch.arange(13, dtype=torch.bfloat16) + r
        api.allreduce(t, group_name=group, op=col.types.ReduceOp.MAX)
        out["allreduce_torch_bf16_max"] = t.float().numpy()
        b = np.full(7, r, dtype=np.int64)
        api.broadcast(b, src_rank=1, group_name=group)
        out["broadcast"] = b
        c = np.full(5, r + 1, dtype=np.float64)
        api.reduce(c, dst_rank=2, group_name=group, op=col.types.ReduceOp.PRODUCT)
        out["reduce"] = c
        parts = [np.empty(4, dtype=np.int32) for _ in range(world)]
        api.allgather(parts, np.full(4, 10 * r, dtype=np.int32), group_name=group)
        out["allgather"] = np.concatenate(parts)
        rs = np.empty(6, dtype=np.float32)
        api.reducescatter(rs, [np.full(6, r * world + j, dtype=np.float32) for j in range(world)],
                          group_name=group)
        out["reducescatter"] = rs
        api.barrier(group_name=group)
        return out

    def readonly(self, x: np.ndarray, group: str) -> str:
        """``x`` arrives read-only (Ray's argument): the call is refused before any byte moves."""
        try:
            col.allreduce(x, group_name=group)
        except ValueError as e:
            return str(e)
        return "no error"

    def teardown(self, group: str, via_module: bool) -> None:
        import hcc.ray as hray

        (hray if via_module else col).destroy_collective_group(group)


def expected(world: int) -> dict:
    return {
        "allreduce_np": np.arange(1009, dtype=np.float32) * sum(range(1, world + 1)),
        "allreduce_torch_bf16_max": np.arange(13, dtype=np.float32) + world - 1,
        "broadcast": np.full(7, 1),
        "reduce": None,  # checked per rank below
        "allgather": np.concatenate([np.full(4, 10 * r) for r in range(world)]),
        "reducescatter": None,
    }


@pytest.fixture(scope="module")
def members(cluster):
    """One set of member actors for both ways in: each joins, uses and destroys a group of its
    own name, so the second way starts from actors whose group was torn down (an actor's
    first start-up, torch import included, was most of each test's time)."""
    actors = [Member.remote(r) for r in range(WORLD)]
    yield actors
    for a in actors:
        ray.kill(a)


@pytest.mark.parametrize("via_module", [False, True], ids=["ray.util.collective", "hcc.ray"])
def test_collectives_in_user_actors(cluster, members, via_module):
    import hcc.ray as hray

    assert hray.register()  # the installed Ray has backend registration
    group = f"g{int(via_module)}"
    kinds = ray.get([m.setup.remote(WORLD, group, via_module) for m in members], timeout=180)
    if not via_module:
        assert kinds == ["HccGroup True local=True model=True"] * WORLD
    results = ray.get([m.work.remote(WORLD, group, via_module) for m in members], timeout=300)
    want = expected(WORLD)
    for r, res in enumerate(results):
        for k, v in want.items():
            if v is not None:
                np.testing.assert_array_equal(res[k], v, err_msg=f"rank {r} {k}")
        np.testing.assert_array_equal(res["reduce"], np.full(5, 6.0) if r == 2 else np.full(5, r + 1.0))
        np.testing.assert_array_equal(res["reducescatter"],
                                      np.full(6, float(sum(q * WORLD + r for q in range(WORLD)))))
    if not via_module:
        msg = ray.get(members[0].readonly.remote(np.ones(3, dtype=np.float32), group), timeout=60)
        assert "is read-only and the call writes it" in msg, msg
    ray.get([m.teardown.remote(group, via_module) for m in members], timeout=60)
