"""hcc.ray — hcc as a collective backend for Ray actors (numpy arrays and torch tensors).

    import ray.util.collective as col
    import hcc.ray                                     # registers the backend "hcc" with Ray

    @ray.remote
    class Worker:
        def setup(self, world, rank):
            import hcc.ray                             # every process registers it
            col.init_collective_group(world, rank, backend="hcc", group_name="g")
        def step(self, x):
            col.allreduce(x, "g")                      # in place, over hcc's sockets
            return x

Terms
- group: :class:`HccGroup`, a subclass of Ray's ``BaseGroup`` registered with
  ``ray.util.collective.backend_registry.register_collective_backend("HCC", ...)`` where the
  installed Ray has it (Ray >= 2.5x). Ray constructs it as ``HccGroup(world, rank, name)`` in
  each member; the members meet through Ray's internal key-value store (the GCS: addresses, a
  random token, error reports; a few hundred bytes per member), and every byte of data then
  moves over hcc's authenticated sockets between the actors' processes, never through the
  object store. Plans, lanes, the plan cache and error reports are hcc/collectives.py's.
- module functions: :func:`init_collective_group`, :func:`allreduce`, :func:`broadcast`,
  :func:`reduce`, :func:`allgather`, :func:`reducescatter`, :func:`barrier` and
  :func:`destroy_collective_group` have the call shapes of ``ray.util.collective``'s and work
  with any Ray (they keep their own groups), for a Ray without backend registration.

Calls block until done, as Ray's do; they fill their output in place. A name must not be
reused while a group of that name is alive; :meth:`HccGroup.destroy_group` (rank 0) clears
the group's keys.
"""
from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from .collectives import CallInfo, CollectiveError, Communicator

__all__ = ["HccGroup", "register", "init_collective_group", "destroy_collective_group", "allreduce",
           "broadcast", "reduce", "allgather", "reducescatter", "barrier", "BACKEND_NAME"]

BACKEND_NAME = "HCC"  # Ray upper-cases backend names
_KV_NAMESPACE = "hcc"

_NP_NATIVE = {np.dtype(np.float16): "float16", np.dtype(np.float32): "float32",
              np.dtype(np.float64): "float64", np.dtype(np.int8): "int8", np.dtype(np.int32): "int32",
              np.dtype(np.int64): "int64", np.dtype(np.uint8): "uint8"}


class _KVStore:
    """Ray's internal key-value store as hcc's :class:`~hcc.collectives.KeyStore`."""

    def __init__(self, prefix: str):
        import ray.experimental.internal_kv as kv

        self.kv, self.prefix = kv, prefix

    def set(self, key: str, value: bytes) -> None:
        self.kv._internal_kv_put(self.prefix + key, value, overwrite=True, namespace=_KV_NAMESPACE)

    def get(self, key: str) -> bytes:
        v = self.kv._internal_kv_get(self.prefix + key, namespace=_KV_NAMESPACE)
        if v is None:
            raise KeyError(key)
        return bytes(v)

    def check(self, keys: list[str]) -> bool:
        return all(self.kv._internal_kv_exists(self.prefix + k, namespace=_KV_NAMESPACE) for k in keys)

    def clear(self) -> None:
        self.kv._internal_kv_del(self.prefix, del_by_prefix=True, namespace=_KV_NAMESPACE)


def _op(op: Any) -> str:
    name = op if isinstance(op, str) else getattr(op, "name", str(op))
    m = {"sum": "sum", "product": "prod", "prod": "prod", "min": "min", "max": "max", "avg": "avg"}
    try:
        return m[name.lower()]
    except KeyError:
        raise ValueError(f"hcc: reduce op {op!r} is not supported (SUM, PRODUCT, MIN, MAX)") from None


class _NpWire:
    """A numpy array prepared for a run (see hcc.torch._Wire for tensors)."""

    def __init__(self, a: np.ndarray, what: str, op: str | None = None, reducing: bool = False,
                 writable: bool = False):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"hcc: {what} must be a numpy array or a torch tensor, not {type(a).__name__}")
        if writable and not a.flags.writeable:
            raise ValueError(f"hcc: {what} is read-only and the call writes it (numpy arrays passed "
                             "to a Ray task or actor are read-only: pass x.copy())")
        self.tensor, self.op = a, op
        work = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        if a.dtype in _NP_NATIVE:
            self.dtype = _NP_NATIVE[a.dtype]
            self.arr = work.reshape(-1)
        elif not reducing:
            self.dtype = "uint8"
            self.arr = work.reshape(-1).view(np.uint8)
        elif a.dtype == np.bool_:
            self.dtype, self.op = "uint8", {"sum": "max", "prod": "min"}.get(op, op)
            self.arr = work.reshape(-1).view(np.uint8)
        else:
            raise TypeError(f"hcc: {what} has dtype {a.dtype}, which hcc cannot reduce")
        if op == "avg" and self.dtype not in ("float16", "float32", "float64"):
            raise TypeError(f"hcc: AVG of {a.dtype} arrays is not defined")
        self.copied = work is not a

    def back(self) -> None:
        if self.copied:
            self.tensor[...] = self.arr.view(self.tensor.dtype).reshape(self.tensor.shape)


def _wire(x: Any, what: str, op: str | None = None, reducing: bool = False, writable: bool = False):
    if isinstance(x, np.ndarray):
        return _NpWire(x, what, op, reducing, writable)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        from .torch import _Wire

        return _Wire(x, what, op, reducing)
    raise TypeError(f"hcc: {what} must be a numpy array or a torch tensor, not {type(x).__name__}")


def _info(kind: str, w, op: str | None = None, root: int = -1) -> CallInfo:
    return CallInfo(kind, int(w.arr.size), w.dtype, op, root, tuple(w.tensor.shape))


def _base_group():
    try:
        from ray.util.collective.collective_group.base_collective_group import BaseGroup
    except ImportError:
        return object
    return BaseGroup


class HccGroup(_base_group()):  # type: ignore[misc]
    """One member of a Ray collective group over hcc (module docstring)."""

    def __init__(self, world_size: int, rank: int, group_name: str, timeout: float | None = None):
        if _base_group() is not object:
            super().__init__(world_size, rank, group_name)
        self._world_size, self._rank, self._group_name = world_size, rank, group_name
        self.store = _KVStore(f"group/{group_name}/")
        secs = float(timeout if timeout is not None else os.environ.get("HCC_RAY_TIMEOUT", 300.0))
        self.comm: Communicator | None = None
        if world_size > 1:
            self.comm = Communicator.connect(rank, world_size, self.store, timeout=secs, prefix="hcc")

    # Ray's BaseGroup interface -------------------------------------------------------------
    @classmethod
    def backend(cls) -> str:
        return BACKEND_NAME

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def group_name(self) -> str:
        return self._group_name

    def destroy_group(self) -> None:
        if self.comm is not None:
            self.comm.close()
            self.comm = None
        if self._rank == 0:
            try:
                self.store.clear()
            except Exception:  # the GCS may already be gone at shutdown
                pass

    def _do(self, info: CallInfo, body) -> None:
        if self.comm is None:
            body(None, ())
            return
        self.comm.submit(info, body).wait()

    def allreduce(self, tensors, allreduce_options=None) -> None:
        op = _op(getattr(allreduce_options, "reduceOp", "sum"))
        for t in _one_or_list(tensors):
            w = _wire(t, "allreduce tensor", op, reducing=True, writable=True)

            def body(comm, seqs, w=w):
                if comm is not None:
                    comm.run(seqs[0], "allreduce", w.arr.size, w.dtype, w.arr, w.arr, op=w.op,
                             info=_info("allreduce", w, w.op))
                w.back()

            self._do(_info("allreduce", w, op), body)

    def barrier(self, barrier_options=None) -> None:
        token = np.zeros(1, dtype=np.uint8)

        def body(comm, seqs):
            if comm is not None:
                comm.run(seqs[0], "allreduce", 1, "uint8", token, token, op="max",
                         info=CallInfo("barrier", 1, "uint8", "max"))

        self._do(CallInfo("barrier", 1, "uint8", "max"), body)

    def broadcast(self, tensors, broadcast_options=None) -> None:
        root = int(getattr(broadcast_options, "root_rank", 0))
        (t,) = _one_or_list(tensors)
        w = _wire(t, "broadcast tensor", writable=True)

        def body(comm, seqs):
            if comm is not None:
                comm.run(seqs[0], "broadcast", w.arr.size, w.dtype, w.arr, w.arr, root=root,
                         info=_info("broadcast", w, root=root))
            w.back()

        self._do(_info("broadcast", w, root=root), body)

    def reduce(self, tensors, reduce_options=None) -> None:
        op = _op(getattr(reduce_options, "reduceOp", "sum"))
        root = int(getattr(reduce_options, "root_rank", 0))
        (t,) = _one_or_list(tensors)
        me = self._rank
        w = _wire(t, "reduce tensor", op, reducing=True, writable=me == root)

        def body(comm, seqs):
            if comm is not None:
                out = w.arr if me == root else np.empty_like(w.arr)
                comm.run(seqs[0], "reduce", w.arr.size, w.dtype, w.arr, out, op=w.op, root=root,
                         info=_info("reduce", w, w.op, root))
            if me == root:
                w.back()

        self._do(_info("reduce", w, op, root), body)

    def allgather(self, tensor_lists, tensors, allgather_options=None) -> None:
        (outs,) = tensor_lists if isinstance(tensor_lists[0], (list, tuple)) else (tensor_lists,)
        (t,) = _one_or_list(tensors)
        n = self._world_size
        if len(outs) != n:
            raise ValueError(f"hcc: allgather: {len(outs)} output tensors for {n} ranks")
        w = _wire(t, "allgather input")
        flat = np.empty(n * w.arr.size, dtype=w.arr.dtype)
        outw = [_wire(o, "allgather output", writable=True) for o in outs]
        for ow in outw:
            if ow.arr.size != w.arr.size or ow.dtype != w.dtype:
                raise ValueError(f"hcc: allgather: an output of {ow.arr.size} {ow.dtype} elements for an "
                                 f"input of {w.arr.size} {w.dtype}")
        k = w.arr.size

        def body(comm, seqs):
            if comm is None:
                flat[...] = w.arr
            else:
                comm.run(seqs[0], "allgather", flat.size, w.dtype, w.arr, flat,
                         info=_info("allgather", w))
            for r, ow in enumerate(outw):
                ow.arr[...] = flat[r * k:(r + 1) * k]
                ow.back()

        self._do(_info("allgather", w), body)

    def reducescatter(self, tensors, tensor_lists, reducescatter_options=None) -> None:
        op = _op(getattr(reducescatter_options, "reduceOp", "sum"))
        (t,) = _one_or_list(tensors)
        (ins,) = tensor_lists if isinstance(tensor_lists[0], (list, tuple)) else (tensor_lists,)
        n = self._world_size
        if len(ins) != n:
            raise ValueError(f"hcc: reducescatter: {len(ins)} input tensors for {n} ranks")
        w = _wire(t, "reducescatter output", op, reducing=True, writable=True)
        inw = [_wire(i, "reducescatter input", op, reducing=True) for i in ins]
        for iw in inw:
            if iw.arr.size != w.arr.size or iw.dtype != w.dtype:
                raise ValueError("hcc: reducescatter: every input must match the output's size and dtype")
        flat = np.concatenate([iw.arr for iw in inw])

        def body(comm, seqs):
            if comm is None:
                w.arr[...] = flat
            else:
                comm.run(seqs[0], "reduce_scatter", flat.size, w.dtype, flat, w.arr, op=w.op,
                         info=_info("reduce_scatter", w, w.op))
            w.back()

        self._do(_info("reduce_scatter", w, op), body)

    def send(self, tensors, send_options=None) -> None:
        raise CollectiveError("hcc: point-to-point send/recv are not collectives hcc plans; "
                              "use Ray's object store (ray.put / ray.get) for them")

    def recv(self, tensors, recv_options=None) -> None:
        self.send(tensors, recv_options)


def _one_or_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


_registered: list[bool] = []


def register() -> bool:
    """Register :class:`HccGroup` with Ray's collective library as ``"hcc"``; False when the
    installed Ray has no backend registration (the module functions below still work)."""
    if _registered:
        return _registered[0]
    try:
        from ray.util.collective.backend_registry import _global_registry, register_collective_backend
    except ImportError:
        _registered.append(False)
        return False
    if not _global_registry.is_registered(BACKEND_NAME):
        register_collective_backend(BACKEND_NAME, HccGroup)
    _registered.append(True)
    return True


# ------------------------------------------------------------------ ray.util.collective's shapes

_groups: dict[str, HccGroup] = {}
_groups_lock = threading.Lock()


def init_collective_group(world_size: int, rank: int, backend: str = "hcc", group_name: str = "default",
                          timeout: float | None = None) -> None:
    """Join ``group_name`` as ``rank`` of ``world_size`` (inside an actor or task)."""
    if str(backend).lower() != "hcc":
        raise ValueError(f"hcc.ray groups use the backend 'hcc', not {backend!r}")
    with _groups_lock:
        if group_name in _groups:
            raise RuntimeError(f"hcc: group {group_name!r} is already initialised in this process")
        _groups[group_name] = HccGroup(world_size, rank, group_name, timeout)


def _group(name: str) -> HccGroup:
    g = _groups.get(name)
    if g is None:
        raise ValueError(f"hcc: no collective group {name!r} in this process (init_collective_group first)")
    return g


class _Opts:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def allreduce(tensor, group_name: str = "default", op: Any = "sum") -> None:
    _group(group_name).allreduce([tensor], _Opts(reduceOp=op))


def broadcast(tensor, src_rank: int = 0, group_name: str = "default") -> None:
    _group(group_name).broadcast([tensor], _Opts(root_rank=src_rank))


def reduce(tensor, dst_rank: int = 0, group_name: str = "default", op: Any = "sum") -> None:
    _group(group_name).reduce([tensor], _Opts(root_rank=dst_rank, reduceOp=op))


def allgather(tensor_list: list, tensor, group_name: str = "default") -> None:
    _group(group_name).allgather([tensor_list], [tensor])


def reducescatter(tensor, tensor_list: list, group_name: str = "default", op: Any = "sum") -> None:
    _group(group_name).reducescatter([tensor], [tensor_list], _Opts(reduceOp=op))


def barrier(group_name: str = "default") -> None:
    _group(group_name).barrier()


def destroy_collective_group(group_name: str = "default") -> None:
    with _groups_lock:
        g = _groups.pop(group_name, None)
    if g is not None:
        g.destroy_group()


register()
