"""One rank of the torch backend tests (tests/runtime/test_torch*.py): ``python torch_worker.py MODE[,MODE..]``.

Joins with ``init_process_group`` (env:// from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or
``tcp://`` with explicit rank and world size when HCC_TEST_INIT=tcp), runs MODE, prints one
JSON line ``RESULT {...}`` and exits 0, or prints the error and exits 1. Several modes in one
job (one process start-up for several tests): ``RESULT {"mode": {...}, ...}``, a mode that
raised as ``{"error": ..., "type": ...}``; modes that break a communicator on purpose
(``order``, ``sendonly``, ``sizes``, ``absent``) run on a process group of their own.

Every expected value is computed here with numpy from the inputs of all ranks, which each rank
can rebuild (they are functions of the rank): never read back from hcc.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

import hcc.torch  # noqa: F401  (registers "hcc")

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32,
          torch.int64, torch.uint8]
SIZES = [1, 13, 1009]  # one element, and primes (no size divides by the rank count)


def init(backend: str = "hcc", timeout_s: float = 60.0) -> tuple[int, int]:
    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get("HCC_TEST_INIT") == "tcp":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
        dist.init_process_group(backend, init_method=url, rank=rank, world_size=world, timeout=timeout)
        os.environ.update(env)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def value(rank: int, count: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: small integers (exact in every dtype, also summed and multiplied
    over 4 ranks: |x| <= 3), different per rank, element and salt."""
    i = np.arange(count, dtype=np.int64)
    v = ((i * 7 + rank * 5 + salt * 3) % 7) - 3  # -3..3
    if dtype == torch.uint8:
        v = v + 3  # 0..6 (sum over 4 ranks <= 24, product of 4 can wrap: uint8 wraps like numpy)
    return torch.tensor(v).to(dtype)


def np_of(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def reduce_np(arrays: list[np.ndarray], op: str, dtype: torch.dtype) -> np.ndarray:
    a = np.stack(arrays)
    if op == "sum":
        r = a.sum(axis=0, dtype=a.dtype)
    elif op == "prod":
        r = a.prod(axis=0, dtype=a.dtype)
    elif op == "min":
        r = a.min(axis=0)
    elif op == "max":
        r = a.max(axis=0)
    else:  # avg
        r = a.sum(axis=0, dtype=np.float64) / len(arrays)
    return r


OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "prod": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def check(got: torch.Tensor, want: np.ndarray, what: str) -> None:
    g = np_of(got).astype(np.float64).reshape(-1)
    w = np.asarray(want).astype(np.float64).reshape(-1)
    if g.shape != w.shape or not np.array_equal(g, w):
        bad = np.flatnonzero(g != w)[:3] if g.shape == w.shape else []
        raise AssertionError(f"{what}: got {g[bad] if len(bad) else g[:5]} want "
                             f"{w[bad] if len(bad) else w[:5]} (shape {g.shape} vs {w.shape})")


def mode_ops(rank: int, n: int) -> dict:
    done = 0
    for dtype in DTYPES:
        for count in SIZES:
            ins = [value(r, count, dtype) for r in range(n)]
            nps = [np_of(x) for x in ins]
            ops = ["sum", "avg", "prod", "min", "max"] if (dtype in (torch.float32, torch.int32, torch.bfloat16)
                                                           and count != 13) else ["sum"]
            for op in ops:
                if op == "avg" and not dtype.is_floating_point:
                    continue
                t = ins[rank].clone()
                dist.all_reduce(t, op=OPS[op])
                # the exact answer rounded once to the tensor's dtype: what torch's result can
                # hold (a bfloat16 average of 3 ranks is not a float32 value)
                want = np_of(torch.from_numpy(np.asarray(reduce_np(nps, op, dtype))).to(dtype))
                check(t, want, f"all_reduce {op} {dtype} x{count}")
                done += 1
            root = (count + 1) % n
            t = ins[rank].clone()
            dist.broadcast(t, src=root)
            check(t, nps[root], f"broadcast {dtype} x{count}")
            t = ins[rank].clone()
            dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
            check(t, reduce_np(nps, "sum", dtype) if rank == root else nps[rank], f"reduce {dtype} x{count}")
            outs = [torch.empty(count, dtype=dtype) for _ in range(n)]
            dist.all_gather(outs, ins[rank])
            check(torch.cat(outs), np.concatenate(nps), f"all_gather {dtype} x{count}")
            out = torch.empty(n * count, dtype=dtype)
            dist.all_gather_into_tensor(out, ins[rank])
            check(out, np.concatenate(nps), f"all_gather_into_tensor {dtype} x{count}")
            # reduce-scatter: rank r's input list is value(r, count, salt=j) for block j
            lists = [[value(r, count, dtype, salt=j) for j in range(n)] for r in range(n)]
            want = reduce_np([np_of(lists[r][rank]) for r in range(n)], "sum", dtype)
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(out, lists[rank])
            check(out, want, f"reduce_scatter {dtype} x{count}")
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(out, torch.cat(lists[rank]))
            check(out, want, f"reduce_scatter_tensor {dtype} x{count}")
            gl = [torch.empty(count, dtype=dtype) for _ in range(n)] if rank == root else None
            dist.gather(ins[rank], gather_list=gl, dst=root)
            if rank == root:
                check(torch.cat(gl), np.concatenate(nps), f"gather {dtype} x{count}")
            out = torch.empty(count, dtype=dtype)
            dist.scatter(out, scatter_list=lists[root] if rank == root else None, src=root)
            check(out, np_of(lists[root][rank]), f"scatter {dtype} x{count}")
            # all_to_all_single: block j of rank r's input goes to rank j
            out = torch.empty(n * count, dtype=dtype)
            dist.all_to_all_single(out, torch.cat(lists[rank]))
            check(out, np.concatenate([np_of(lists[r][rank]) for r in range(n)]), f"all_to_all_single {dtype} x{count}")
            done += 10
    # uneven all_to_all_single: rank r sends r + j + 1 elements to rank j
    send = [[torch.full((r + j + 1,), float(10 * r + j)) for j in range(n)] for r in range(n)]
    out = torch.empty(sum(r + rank + 1 for r in range(n)))
    dist.all_to_all_single(out, torch.cat(send[rank]), output_split_sizes=[r + rank + 1 for r in range(n)],
                           input_split_sizes=[rank + j + 1 for j in range(n)])
    check(out, np.concatenate([send[r][rank].numpy() for r in range(n)]), "all_to_all_single uneven")
    # non-contiguous tensors: a transposed matrix, all_reduce in place and broadcast
    m = (torch.arange(35, dtype=torch.float32).reshape(5, 7) + rank).t()
    assert not m.is_contiguous()
    dist.all_reduce(m)
    want = sum((torch.arange(35, dtype=torch.float32).reshape(5, 7) + r).t() for r in range(n))
    check(m, want.numpy(), "all_reduce non-contiguous")
    m = (torch.arange(35, dtype=torch.float64).reshape(5, 7) * (rank + 1))[:, ::2]
    dist.broadcast(m, src=0)
    check(m, (torch.arange(35, dtype=torch.float64).reshape(5, 7))[:, ::2].numpy(), "broadcast non-contiguous")
    # dtypes outside the plan's eight
    b = torch.tensor([rank == 0, False, True])
    dist.all_reduce(b)  # SUM of bool is OR
    check(b.to(torch.uint8), np.array([1, 0, 1]), "all_reduce bool")
    s = torch.tensor([30000, -5], dtype=torch.int16) + rank
    dist.all_reduce(s)
    check(s, (torch.tensor([30000, -5], dtype=torch.int16).to(torch.int64) * n + sum(range(n)))
          .to(torch.int16).numpy(), "all_reduce int16 (wraps)")
    c = torch.tensor([1 + 2j, rank * 1j], dtype=torch.complex64)
    dist.all_reduce(c)
    got = c.numpy()
    assert np.allclose(got, [n * (1 + 2j), sum(range(n)) * 1j]), got
    dist.barrier()
    done += 6
    return {"checked": done, "not_cpu": mode_cuda(rank, n)["error"]}


def mode_async(rank: int, n: int, group=None) -> dict:
    """Two all_reduces in flight at once on one process group (``group``, default the job's),
    then both checked; and a burst of 16 async ops of mixed kinds and sizes waited for in
    reverse order. What the group's plan cache compiled and read from disk."""
    pg = group or dist.distributed_c10d._get_default_group()
    a = torch.full((1 << 20,), float(rank + 1))  # 4 MiB
    b = torch.arange(1009, dtype=torch.float64) * (rank + 1)
    wa = dist.all_reduce(a, async_op=True, group=group)
    wb = dist.all_reduce(b, op=dist.ReduceOp.MAX, async_op=True, group=group)
    wb.wait()
    wa.wait()
    check(a[:3], np.full(3, float(sum(range(1, n + 1)))), "async a")
    check(b, np.arange(1009, dtype=np.float64) * n, "async b")
    assert wa.is_completed() and wb.is_completed()
    ts, works = [], []
    for k in range(16):
        t = torch.full((1 + 97 * (k % 4),), float(rank * k))  # 4 sizes: 8 plans, not 16 compiles
        works.append(dist.all_reduce(t, async_op=True, group=group) if k % 2
                     else dist.broadcast(t, src=k % n, async_op=True, group=group))
        ts.append(t)
    for w in reversed(works):
        w.wait()
    for k, t in enumerate(ts):
        want = sum(r * k for r in range(n)) if k % 2 else (k % n) * k
        check(t, np.full(t.numel(), float(want)), f"burst {k}")
    fut = dist.all_reduce(torch.ones(5), async_op=True, group=group).get_future()
    (res,) = fut.wait()
    check(res, np.full(5, float(n)), "future")
    return {"ok": True, "compiled": pg.comm.cache.compiled, "loaded": pg.comm.cache.loaded}


def mode_async_cached(rank: int, n: int) -> dict:
    """:func:`mode_async` again on a new group of the same ranks: a new communicator whose plan
    cache starts empty in memory, so every plan it runs comes from the files the first run
    left on disk (or is compiled again, which its counters show)."""
    return mode_async(rank, n, group=dist.new_group(backend="hcc"))


def mode_join(rank: int, n: int) -> dict:
    """Joined as the launcher set us up (torchrun's env://): one all_reduce and one broadcast
    across every rank, checked."""
    t = torch.full((1009,), float(rank + 1))
    dist.all_reduce(t)
    check(t, np.full(1009, float(n * (n + 1) // 2)), "join all_reduce")
    b = torch.full((13,), float(rank))
    dist.broadcast(b, src=n - 1)
    check(b, np.full(13, float(n - 1)), "join broadcast")
    return {"ok": True, "rank": rank, "world": n}


def ddp_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def mode_ddp(rank: int, n: int) -> dict:
    """One small MLP (1,732 parameters) trained 10 steps with DDP from seed 0 twice in this job:
    over the default group (hcc) and over a gloo group, on the same batches; returns both
    final parameter vectors and the initial one."""
    gloo = dist.new_group(backend="gloo")
    # 10 steps: every step after the first runs the same four bucket all-reduces in flight;
    # over hcc a step costs ~0.4 s on 4 ranks of 2 cores (gloo ~0.03 s): 20 were 4 s more, no new path
    steps = int(os.environ.get("HCC_TEST_STEPS", "10"))
    out: dict = {"init": torch.cat([p.detach().reshape(-1) for p in ddp_model().parameters()]).tolist()}
    for name, group in (("hcc", None), ("gloo", gloo)):
        model = ddp_model()
        # 2 KB buckets: four all-reduces per step, in flight together
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.002)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(1000 + rank)
        for _ in range(steps):
            x = torch.randn(16, 16, generator=gen)
            y = torch.randn(16, 4, generator=gen)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
        out[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
        out[f"{name}_loss"] = float(loss.detach())
    return out


def _own_group(timeout_s: float):
    return dist.new_group(backend="hcc", timeout=datetime.timedelta(seconds=timeout_s))


def mode_order(rank: int, n: int) -> dict:
    """Ranks 0 and 1 issue all_reduce then broadcast, the others broadcast then all_reduce, on a
    group of their own with a 120 s deadline: the error, and how long it took to come."""
    group = _own_group(120.0)
    a, b = torch.ones(1000), torch.ones(77)
    t0 = time.monotonic()
    try:
        if rank < 2:
            dist.all_reduce(a, group=group)
            dist.broadcast(b, src=0, group=group)
        else:
            dist.broadcast(b, src=0, group=group)
            dist.all_reduce(a, group=group)
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return {"error": str(e), "type": type(e).__name__, "elapsed_s": time.monotonic() - t0}
    return {"unexpected": "completed"}


def mode_sendonly(rank: int, n: int) -> dict:
    """Rank 0 broadcasts from itself, the others from rank 1, then every rank calls a barrier,
    on a group of their own: ranks 0 and 1 only send in the broadcast. Which call raised what."""
    group = _own_group(120.0)
    b = torch.full((77,), float(rank))
    t0 = time.monotonic()
    done = []
    try:
        dist.broadcast(b, src=0 if rank == 0 else 1, group=group)
        done.append("broadcast")
        dist.barrier(group=group)
        done.append("barrier")
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return {"error": str(e), "after": done, "elapsed_s": time.monotonic() - t0}
    return {"unexpected": "completed", "after": done}


def mode_sizes(rank: int, n: int) -> dict:
    """Rank 1 all-reduces 101 elements, the others 100, on a group of their own."""
    group = _own_group(20.0)
    try:
        dist.all_reduce(torch.ones(100 + (1 if rank == 1 else 0)), group=group)
    except Exception as e:  # noqa: BLE001
        return {"error": str(e), "type": type(e).__name__}
    return {"unexpected": "completed"}


ABSENT_TIMEOUT_S = 6.0  # the absent mode's group deadline: what the others wait before they fail


def mode_absent(rank: int, n: int) -> dict:
    """On a group of its own with a 6 s deadline, every rank all-reduces once; then the last
    rank never calls the second all_reduce the others call. It stays alive and connected (not
    dead: the others must reach their deadline, or hear that another waiting rank did) until
    every other rank has failed, which each says on the job's store; then it returns. The
    error each other rank raised."""
    group = _own_group(ABSENT_TIMEOUT_S)
    store = dist.distributed_c10d._get_default_store()
    dist.all_reduce(torch.ones(13), group=group)  # 13 floats: a plan the ops mode left on disk
    if rank == n - 1:
        # an event, not a sleep past the deadline: released as soon as the others have
        # failed, bounded at 10 deadlines
        end = time.monotonic() + 10 * ABSENT_TIMEOUT_S
        while store.add("absent/failed", 0) < n - 1 and time.monotonic() < end:
            time.sleep(0.05)
        return {"absent": True, "others_failed": store.add("absent/failed", 0)}
    try:
        dist.all_reduce(torch.ones(13), group=group)
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return {"error": str(e), "type": type(e).__name__}
    finally:
        store.add("absent/failed", 1)
    return {"unexpected": "completed"}


def mode_cuda(rank: int, n: int) -> dict:
    # torch here is a CPU build: a meta tensor takes the same path as a CUDA one (not on CPU)
    try:
        dist.all_reduce(torch.ones(3, device="meta"))
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return {"error": str(e)}
    return {"unexpected": "completed"}



def _say(line: str) -> None:
    """One line in one write(2): ranks of one job share the parent's stdout pipe, and a line
    written in pieces can interleave with another rank's (the torchrun test read
    ``RESULT {...}RESULT {...}`` once)."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())

def main() -> int:
    mode = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "hcc"
    timeout = float(os.environ.get("HCC_TEST_TIMEOUT", "60"))
    rank = -1
    try:
        rank, n = init(backend, timeout)
        if "," in mode:
            out = {}
            for m in mode.split(","):
                t0 = time.monotonic()
                try:
                    out[m] = globals()[f"mode_{m}"](rank, n)
                except Exception as e:  # noqa: BLE001 - reported per mode; the next still runs
                    traceback.print_exc()
                    out[m] = {"error": str(e), "type": type(e).__name__}
                out[m]["mode_s"] = time.monotonic() - t0  # what each check costs the job
        else:
            out = globals()[f"mode_{mode}"](rank, n)
        _say("RESULT " + json.dumps(out))
        dist.destroy_process_group()
        return 0
    except Exception as e:  # noqa: BLE001 - reported to the test on stdout
        _say("ERROR " + json.dumps({"rank": rank, "type": type(e).__name__, "message": str(e)}))
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the result is out and the group destroyed: skip the interpreter's teardown, which with
    # torch loaded takes 1.4-1.9 s of CPU per process (4 ranks on 2 cores: seconds per job)
    os._exit(code)
