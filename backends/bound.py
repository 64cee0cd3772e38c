"""hcc.backends.bound — bound runs: one rank's program bound once to the caller's arrays over a
transport with persistent transfers (MPI), then run again and again.

Terms
- persistent transfers: ``send_init``/``recv_init`` make a request on fixed memory,
  ``start_all`` posts a list of them, ``wait_some`` waits for some, ``free_all`` frees them
  (backends/mpi.py: ``MPI_Send_init``, ``MPI_Startall``, ``MPI_Testsome``).
- binding: a plan, a rank's communicator and the caller's exact input and output arrays; its
  :class:`BoundRun` is kept beside the plan (backends/state.py), at most :data:`_BOUND_KEEP`
  per plan and communicator, least recently used first out.

The runtime (backends/runtime.py) calls :func:`run_bound` for a call the executor says can be
bound (``executor.static_call``) and falls back to the executor's general loop when it cannot.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..ir.plan import Plan
from .base import CollectiveTimeout, RuntimeFault, Transport
from .executor import COPY, RECV, RECV_REDUCE, REDUCE, SCALE, SEND, RankExecution, _blame_op, reduce_staged
from .kernels import reduce_into, scale_into
from .state import state_of

__all__ = ["BoundRun", "run_bound"]


class BoundRun:
    """One rank's program bound to one set of buffers over a transport with persistent
    transfers (``send_init``/``recv_init``/``start_all``/``wait_some``/``free_all``: the MPI
    backend), run again and again: MPI-4's persistent collectives (``MPI_Allreduce_init``)
    for any plan.

    Built from a :class:`RankExecution` whose buffers are checked, it holds per op what a
    run would otherwise recompute: a persistent request per Send, Recv and RecvReduce (one
    ``MPI_Startall`` posts all that become ready together), the slices of every buffer, and a
    staging chunk per RecvReduce of its own. A run is then the dependency count and the
    reductions. With 4 ranks on 2 cores each microsecond of Python a rank spends outside
    ``MPI_Testsome`` stalls its peers' copies (MPICH moves a large message when the receiver
    polls), and per transfer the general loop makes a slice, two memoryviews, two request
    objects and two dict entries. Measured (4 ranks on 2 cores, 1 MiB direct allreduce, median
    of 140 runs per variant in one mpiexec job): general loop 1.67 ms, bound 1.23 ms, MPICH
    ``Allreduce`` 1.31 ms; on idle cores the bound run took 0.81-1.0 ms against 0.75-0.91 ms
    for the same exchange written inline with mpi4py and 0.78-1.22 ms for MPICH.

    Semantics are the executor's: the same dependency order, Copy fusion, reductions on the
    main thread, the per-wait deadline naming the rank, peer and chunk."""

    def __init__(self, ex: RankExecution, key: tuple):
        comm = ex.comm
        self.ex, self.comm, self.key = ex, comm, key
        self.generation = getattr(comm, "generation", 0)
        self.busy = False
        program, kinds = ex.program, ex.kinds
        n_ops = len(program)
        self.handles: list[Any] = [None] * n_ops
        self.local: list[Any] = [None] * n_ops
        self.reduce: list[Any] = [None] * n_ops
        made = []
        try:
            for k, op in enumerate(program):
                kind = kinds[k]
                if kind == SEND:
                    h = comm.send_init(op.peer, op.tag, memoryview(ex.view(op.src)).cast("B"))
                elif kind == RECV:
                    h = comm.recv_init(op.peer, op.tag, memoryview(ex.view(op.dst)).cast("B"))
                elif kind == RECV_REDUCE:
                    dst = ex.view(op.dst)
                    staging = np.empty(dst.size, dtype=dst.dtype)
                    src = ex.fused.get(k)
                    self.reduce[k] = (dst, staging, None if src is None else ex.view(src), ex.fuse_group.get(k))
                    h = comm.recv_init(op.peer, op.tag, memoryview(staging).cast("B"))
                else:
                    if kind == COPY and k not in ex.skip_copy:
                        self.local[k] = (COPY, ex.view(op.dst), ex.view(op.src))
                    elif kind == REDUCE:
                        self.local[k] = (REDUCE, ex.view(op.dst), ex.view(op.src))
                    elif kind == SCALE:
                        self.local[k] = (SCALE, ex.view(op.dst), op.divisor)
                    continue
                self.handles[k] = h
                made.append(h)
        except BaseException:
            comm.free_all(made)
            raise
        self.made = made

    def free(self) -> None:
        if self.made and getattr(self.comm, "generation", 0) == self.generation:
            self.comm.free_all(self.made)
        self.made = []

    def _post(self, order: list[int], missing: list[int], active: list, owner: list[int]) -> int:
        """Post the ops of ``order`` and, depth first, what each releases (the executor's
        order): transfers gathered into one ``start_all``, flushed before any local op that
        has work (a receive is never left unposted behind a copy). Returns how many local
        ops completed."""
        handles, local, deps, ex, comm = self.handles, self.local, self.ex.dependents, self.ex, self.comm
        starts: list = []
        done = 0
        for first in order:
            stack = [first]
            while stack:
                k = stack.pop()
                h = handles[k]
                if h is not None:
                    starts.append(h)
                    active.append(h)
                    owner.append(k)
                    continue
                work = local[k]
                if work is not None:
                    if starts:
                        comm.start_all(starts)
                        starts = []
                    what, dst, arg = work
                    if what == COPY:
                        dst[...] = arg
                    elif what == REDUCE:
                        reduce_into(ex.op_name, ex.plan.dtype, dst, arg)
                    else:
                        scale_into(ex.plan.dtype, dst, arg)
                done += 1
                for j in deps[k]:
                    missing[j] -= 1
                    if missing[j] == 0:
                        stack.append(j)
        if starts:
            comm.start_all(starts)
        return done

    def run(self, timeout: float) -> None:
        ex, comm = self.ex, self.comm
        deps, reduce = ex.dependents, self.reduce
        op_name, dtype_name = ex.op_name, ex.plan.dtype
        missing = list(ex.missing_at_start)
        active: list = []
        owner: list[int] = []
        started: set[int] = set()
        completed = self._post(ex.first, missing, active, owner)
        while active:
            try:
                idx = comm.wait_some(active, timeout)
            except CollectiveTimeout:
                k = _blame_op(ex.kinds, owner)
                raise CollectiveTimeout(ex.rank, ex.program[k].peer, ex.describe(k), timeout) from None
            finished = [owner[i] for i in idx]
            for i in reversed(idx):
                del active[i]
                del owner[i]
            ready: list[int] = []
            for k in finished:
                red = reduce[k]
                if red is not None:
                    reduce_staged(op_name, dtype_name, *red, started)
                for j in deps[k]:
                    missing[j] -= 1
                    if missing[j] == 0:
                        ready.append(j)
            completed += len(finished)
            if ready:
                completed += self._post(ready, missing, active, owner)
        if completed != len(ex.program):
            raise RuntimeFault(f"rank {ex.rank}: {len(ex.program) - completed} ops never became ready; "
                               "is the plan verified?")


_BOUND_KEEP = 4  # bound runs kept per plan and communicator (least recently used first out)


def _bound_run(plan: Plan, comm: Transport, array, out, make) -> BoundRun | None:
    """The :class:`BoundRun` of this plan, rank, communicator and caller arrays, made by
    ``make()`` (a checked :class:`RankExecution`) on first use and kept beside the plan, or None
    when the call cannot be bound. Only exact numpy arrays are bound, held by reference: a
    held array cannot be resized under the requests (numpy refuses to resize an array
    something else references), and its identity names its memory. The output must be given
    (a new result per call has new memory every time); the input may be None."""
    cache = state_of(plan).bound
    key = (comm, array, out)
    for i, b in enumerate(cache):
        k = b.key
        if k[0] is comm and k[1] is array and k[2] is out:
            if b.busy:
                return None
            if b.generation != getattr(comm, "generation", 0):  # the communicator was closed
                del cache[i]
                break
            if i:
                cache.insert(0, cache.pop(i))
            return b
    b = BoundRun(make(), key)
    cache.insert(0, b)
    mine = [x for x in cache if x.key[0] is comm]
    if len(mine) > _BOUND_KEEP:
        old = mine[-1]
        cache.remove(old)
        old.free()
    return b


def run_bound(plan: Plan, comm: Transport, array, out, make: Callable[[], RankExecution], timeout: float) -> bool:
    """Run this call as a bound run; False when it cannot be bound (the binding is busy in
    another thread), and the caller runs the general loop. A failed bound run drops its
    binding: its requests may still be active and must not be started again."""
    bound = _bound_run(plan, comm, array, out, make)
    if bound is None:
        return False
    bound.busy = True
    try:
        bound.run(timeout)
    except BaseException:
        cache = state_of(plan).bound
        if bound in cache:
            cache.remove(bound)
        raise
    finally:
        bound.busy = False
    return True
