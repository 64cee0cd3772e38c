"""hcc.torch — hcc as a ``torch.distributed`` backend named ``"hcc"`` (CPU tensors).

    import torch.distributed as dist
    import hcc.torch                                   # registers the backend "hcc"
    dist.init_process_group("hcc", init_method="env://")   # torchrun, tcp://, rank=/world_size=
    model = torch.nn.parallel.DistributedDataParallel(model)   # unchanged

Terms
- process group: :class:`ProcessGroupHCC`, a Python subclass of ``torch.distributed.ProcessGroup``
  (torch calls its methods from Python for ``dist.all_reduce`` & co., and from C++ for DDP's
  bucket all-reduces and parameter broadcasts). Each call is issued on an
  :class:`hcc.collectives.Communicator` and returns a ``Work`` built on a ``torch.futures.Future``
  that a lane completes: ``async_op=True`` hands it to the caller, ``wait()`` completes it.
- wire dtype: the dtype the plan runs in. float16, bfloat16, float32, float64, int8, int32,
  int64 and uint8 run natively (bfloat16 reductions in float32, rounded to nearest even:
  backends/kernels.py). Ops that only move data (broadcast, gathers, scatter, all-to-all)
  move any dtype as its bytes. Reductions of other dtypes: bool as uint8 (SUM is OR, PRODUCT
  is AND, as NCCL does), int16/uint16 in int32 and uint32 in int64 (sums and products modulo
  2**bits are the same in the wider type, then narrowed), complex as pairs of reals (SUM and
  AVG only). Anything else is a ``TypeError`` at the call.
- the topology: ``HCC_TOPOLOGY=path.hcl`` (and ``HCC_RANKS``), or the default star around one
  switch, whose links are those of the path the ranks take (shared memory on one host, else
  10 Gbit/s TCP), with that path's cost model (hcc/collectives.py, "placement").

Semantics are torch's: in-place ops fill their tensor (a non-contiguous tensor is run through
a contiguous copy and written back), ``reduce`` leaves non-destination tensors unchanged,
lists of tensors must have equal sizes. CUDA tensors are refused (CPU only).
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

from .collectives import CallInfo, Communicator

__all__ = ["ProcessGroupHCC", "BACKEND_NAME", "register"]

BACKEND_NAME = "hcc"

_NATIVE = {
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
    torch.float64: "float64", torch.int8: "int8", torch.int32: "int32", torch.int64: "int64",
    torch.uint8: "uint8",
}
# reductions of these run in a wider integer type (exact modulo 2**bits, then narrowed)
_WIDEN = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}


def _op_name(op: Any) -> str:
    R = dist.ReduceOp
    table = {R.SUM: "sum", R.AVG: "avg", R.PRODUCT: "prod", R.MIN: "min", R.MAX: "max"}
    for k, v in table.items():
        try:
            if op == k:
                return v
        except TypeError:
            pass
    raise ValueError(f"hcc: reduce op {op} is not supported (SUM, AVG, PRODUCT, MIN, MAX are)")


def _check(t: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"hcc: {what} must be a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"hcc: {what} is on {t.device}; the hcc backend runs on CPU tensors only "
                         "(move it with .cpu(), or use NCCL for GPU tensors)")
    if t.is_sparse:
        raise ValueError(f"hcc: {what} is sparse; hcc reduces dense tensors only")


def _np(t: torch.Tensor) -> np.ndarray:
    """A flat numpy view of a contiguous CPU tensor (bfloat16 as uint16 bits)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.reshape(-1).view(torch.int16).numpy().view(np.uint16)
    return t.reshape(-1).numpy()


class _Wire:
    """One tensor prepared for a run: ``arr`` (flat numpy, the wire dtype), ``dtype`` (its
    name), ``op`` (possibly remapped), and ``back()`` to write a copy back into the tensor."""

    __slots__ = ("tensor", "work", "arr", "dtype", "op", "copied")

    def __init__(self, t: torch.Tensor, what: str, op: str | None = None, reducing: bool = False):
        _check(t, what)
        self.tensor, self.op = t, op
        dt = t.dtype
        if dt in _NATIVE:
            self.dtype = _NATIVE[dt]
            work = t if t.is_contiguous() else t.contiguous()
        elif not reducing:  # data movement: any dtype as its bytes
            self.dtype = "uint8"
            work = (t if t.is_contiguous() else t.contiguous()).reshape(-1).view(torch.uint8)
        elif dt == torch.bool:
            if op == "avg":
                raise TypeError("hcc: AVG of bool tensors is not defined")
            self.dtype = "uint8"
            self.op = {"sum": "max", "prod": "min"}.get(op, op)
            work = (t if t.is_contiguous() else t.contiguous()).reshape(-1).view(torch.uint8)
        elif dt in _WIDEN:
            if op == "avg":
                raise TypeError(f"hcc: AVG of {dt} tensors is not defined (integer)")
            work = t.to(_WIDEN[dt])
            self.dtype = _NATIVE[_WIDEN[dt]]
        elif dt in (torch.complex64, torch.complex128):
            if op not in ("sum", "avg"):
                raise TypeError(f"hcc: {op} of complex tensors is not defined (SUM and AVG are)")
            work = torch.view_as_real(t if t.is_contiguous() else t.contiguous())
            self.dtype = "float32" if dt == torch.complex64 else "float64"
        else:
            raise TypeError(f"hcc: {what} has dtype {dt}, which hcc cannot reduce")
        if self.dtype in ("int8", "int32", "int64", "uint8") and self.op == "avg":
            raise TypeError(f"hcc: AVG of integer tensors ({dt}) is not defined; use SUM and divide")
        self.work = work
        self.copied = not _same_memory(work, t)
        self.arr = _np(work)

    def back(self) -> None:
        """Write the wire buffer into the tensor when it ran through a copy."""
        if self.copied:
            t = self.tensor
            w = self.work
            with torch.no_grad():
                if t.dtype in (torch.complex64, torch.complex128):
                    t.copy_(torch.view_as_complex(w))
                elif w.dtype == torch.uint8 and t.dtype != torch.uint8 and t.dtype not in _WIDEN:
                    t.copy_(w.view(t.dtype).reshape(t.shape))
                else:
                    t.copy_(w.reshape(t.shape))


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() * a.element_size() == b.storage_offset() * b.element_size()
            and b.is_contiguous())


def _same_size(ts: list[torch.Tensor], what: str) -> None:
    if len({(t.numel(), t.dtype) for t in ts}) > 1:
        raise ValueError(f"hcc: the tensors of {what} must have one size and dtype; got "
                         + ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in ts))


class _Work(dist._Work):
    """A call in flight as torch sees it: ``wait()`` completes it (raising its error: a Work
    built by ``_create_work_from_future`` returns True from ``wait()`` even when its future
    failed), ``get_future()`` is completed by the lane with the call's result."""

    def __init__(self, handle, result: Any):
        super().__init__()
        self.handle, self.result_ = handle, result
        self.future = Future()
        fut = self.future

        def finished(h) -> None:
            if h.error is None:
                fut.set_result(result)
            else:
                fut.set_exception(h.error)

        if handle is None:
            fut.set_result(result)
        else:
            handle.on_done(finished)

    def wait(self, timeout: Any = None) -> bool:
        if self.handle is not None:
            secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
            self.handle.wait(secs if secs else None)  # torch's "no timeout" is 0
        return True

    def is_completed(self) -> bool:
        return self.handle is None or self.handle.done()

    def is_success(self) -> bool:
        return self.is_completed() and (self.handle is None or self.handle.error is None)

    def exception(self) -> Any:
        return None if self.handle is None else self.handle.error

    def result(self) -> Any:
        return self.result_

    def get_future(self) -> Future:
        return self.future


class ProcessGroupHCC(dist.ProcessGroup):
    """The ``"hcc"`` process group (module docstring)."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta | float | None = None,
                 *, topology: str | None = None, ranks: str | list[str] | None = None):
        super().__init__(rank, size)
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 1800.0)
        self._rank, self._size = rank, size
        self.comm: Communicator | None = None
        if size > 1:
            self.comm = Communicator.connect(rank, size, _TorchStore(store), timeout=secs,
                                             topology=topology, ranks=ranks)

    # -- identity ----------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    # -- issuing -----------------------------------------------------------------------
    def _call(self, info: CallInfo, body: Callable[[Communicator, tuple[int, ...]], None], result: Any,
              runs: int = 1):
        if self.comm is None:  # a world of one: nothing to exchange
            body(None, ())
            return _Work(None, result)
        return _Work(self.comm.submit(info, body, runs), result)

    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        wires = [_Wire(t, "all_reduce tensor", op, reducing=True) for t in _list(tensors)]

        def body(comm, seqs):
            for i, w in enumerate(wires):
                if comm is not None:
                    comm.run(seqs[i], "allreduce", w.arr.size, w.dtype, w.arr, w.arr, op=w.op,
                             info=_info("allreduce", w, op=w.op))
                w.back()

        return self._call(_info("allreduce", wires[0], op=op), body, list(tensors), runs=len(wires))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        wires = [_Wire(t, "broadcast tensor") for t in _list(tensors)]

        def body(comm, seqs):
            for i, w in enumerate(wires):
                if comm is not None:
                    comm.run(seqs[i], "broadcast", w.arr.size, w.dtype, w.arr, w.arr, root=root,
                             info=_info("broadcast", w, root=root))
                w.back()

        return self._call(_info("broadcast", wires[0], root=root), body, list(tensors), runs=len(wires))

    def reduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        root = opts.rootRank if opts is not None else 0
        (t,) = _list(tensors)
        w = _Wire(t, "reduce tensor", op, reducing=True)
        me = self._rank

        def body(comm, seqs):
            if comm is not None:
                out = w.arr if me == root else np.empty_like(w.arr)  # non-roots keep their tensor
                comm.run(seqs[0], "reduce", w.arr.size, w.dtype, w.arr, out, op=w.op, root=root,
                         info=_info("reduce", w, op=w.op, root=root))
            if me == root:
                w.back()

        return self._call(_info("reduce", w, op=op, root=root), body, [t])

    def _flat(self, kind: str, wi: _Wire, wo: _Wire, what: str, op: str | None = None):
        """``(body, info)`` of one allgather (``wo`` is ``n`` x ``wi``) or reduce_scatter
        (``wi`` is ``n`` x ``wo``) of flat buffers."""
        n = self._size
        small, big, side = (wi, wo, "output") if kind == "allgather" else (wo, wi, "input")
        if big.arr.size != n * small.arr.size or wo.dtype != wi.dtype:
            raise ValueError(f"hcc: {what}: {side} has {big.tensor.numel()} elements of {big.tensor.dtype}, "
                             f"expected {n} x {small.tensor.numel()} of {small.tensor.dtype}")
        info = _info(kind, big, op=wi.op)

        def body(comm, seqs):
            if comm is None:
                wo.arr[...] = wi.arr
            else:
                comm.run(seqs[0], kind, big.arr.size, big.dtype, wi.arr, wo.arr, op=wi.op, info=info)
            wo.back()

        return body, _info(kind, big, op=op)

    def _allgather_flat(self, out_t: torch.Tensor, in_t: torch.Tensor, what: str):
        return self._flat("allgather", _Wire(in_t, f"{what} input"), _Wire(out_t, f"{what} output"), what)

    def all_gather_single(self, output, input, opts=None):
        body, info = self._allgather_flat(output, input, "all_gather_into_tensor")
        return self._call(info, body, [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        parts = [self._allgather_flat(o, i, "all_gather_into_tensor") for o, i in zip(outputs, inputs)]

        def body(comm, seqs):
            for k, (b, _) in enumerate(parts):
                b(comm, seqs[k:k + 1])

        return self._call(parts[0][1], body, list(outputs), runs=len(parts))

    def allgather(self, output_lists, inputs, opts=None):
        (outs,) = output_lists
        (t,) = _list(inputs)
        _same_size(list(outs) + [t], "all_gather")
        if len(outs) != self._size:
            raise ValueError(f"hcc: all_gather: {len(outs)} output tensors for {self._size} ranks")
        flat = torch.empty(self._size * t.numel(), dtype=t.dtype)
        body0, info = self._allgather_flat(flat, t, "all_gather")

        def body(comm, seqs):
            body0(comm, seqs)
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(flat[r * t.numel():(r + 1) * t.numel()].reshape(o.shape))

        return self._call(info, body, [list(outs)])

    def _reduce_scatter_flat(self, out_t: torch.Tensor, in_t: torch.Tensor, op: str, what: str):
        return self._flat("reduce_scatter", _Wire(in_t, f"{what} input", op, reducing=True),
                          _Wire(out_t, f"{what} output", op, reducing=True), what, op)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        body, info = self._reduce_scatter_flat(output, input, op, "reduce_scatter_tensor")
        return self._call(info, body, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        parts = [self._reduce_scatter_flat(o, i, op, "reduce_scatter_tensor") for o, i in zip(outputs, inputs)]

        def body(comm, seqs):
            for k, (b, _) in enumerate(parts):
                b(comm, seqs[k:k + 1])

        return self._call(parts[0][1], body, list(outputs), runs=len(parts))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        (out,) = _list(outputs)
        (ins,) = input_lists
        _same_size(list(ins) + [out], "reduce_scatter")
        if len(ins) != self._size:
            raise ValueError(f"hcc: reduce_scatter: {len(ins)} input tensors for {self._size} ranks")
        flat = torch.cat([i.detach().reshape(-1) for i in ins])
        body, info = self._reduce_scatter_flat(out, flat, op, "reduce_scatter")
        return self._call(info, body, [out])

    def gather(self, output_lists, inputs, opts=None):
        root = opts.rootRank if opts is not None else 0
        (t,) = _list(inputs)
        w = _Wire(t, "gather input")
        me, n = self._rank, self._size
        outs = list(output_lists[0]) if (me == root and output_lists) else []
        if me == root:
            if len(outs) != n:
                raise ValueError(f"hcc: gather: {len(outs)} output tensors on the root for {n} ranks")
            _same_size(outs + [t], "gather")
        flat = torch.empty(n * t.numel(), dtype=t.dtype)
        wf = _Wire(flat, "gather buffer")

        def after() -> None:
            if me == root:
                with torch.no_grad():
                    for r, o in enumerate(outs):
                        o.copy_(flat[r * t.numel():(r + 1) * t.numel()].reshape(o.shape))

        return self._rooted("gather", wf, w.arr, wf.arr, w.arr, root, after, [outs])

    def _rooted(self, kind: str, wire: _Wire, src, dst, local, root: int, after: Callable[[], None],
                result: Any):
        """A gather or scatter of ``wire`` (the ``n``-block buffer): the run from ``src`` into
        ``dst`` (``local`` copied into ``dst`` in a world of one), then ``after()``."""
        info = _info(kind, wire, root=root)

        def body(comm, seqs):
            if comm is None:
                dst[...] = local
            else:
                comm.run(seqs[0], kind, wire.arr.size, wire.dtype, src, dst, root=root, info=info)
            after()

        return self._call(info, body, result)

    def scatter(self, outputs, input_lists, opts=None):
        root = opts.rootRank if opts is not None else 0
        (t,) = _list(outputs)
        wo = _Wire(t, "scatter output")
        me, n = self._rank, self._size
        if me == root:
            ins = list(input_lists[0]) if input_lists else []
            if len(ins) != n:
                raise ValueError(f"hcc: scatter: {len(ins)} input tensors on the root for {n} ranks")
            _same_size(ins + [t], "scatter")
            flat = torch.cat([i.detach().reshape(-1) for i in ins])
        else:
            flat = torch.zeros(n * t.numel(), dtype=t.dtype)
        wi = _Wire(flat, "scatter buffer")
        return self._rooted("scatter", wi, wi.arr if me == root else None, wo.arr, wi.arr, root, wo.back, [t])

    def all_to_all_single(self, output, input, output_split_sizes=(), input_split_sizes=(), opts=None):
        n = self._size
        wi, wo = _Wire(input, "all_to_all_single input"), _Wire(output, "all_to_all_single output")
        if wi.dtype != wo.dtype:
            raise ValueError("hcc: all_to_all_single: input and output dtypes differ")
        row_i = input.numel() // max(1, input.shape[0]) if input.dim() else 1
        row_o = output.numel() // max(1, output.shape[0]) if output.dim() else 1
        scale_i = wi.arr.size // max(1, input.numel())  # wire elements per tensor element
        even = not list(output_split_sizes) and not list(input_split_sizes)
        if even:
            if wi.arr.size % n or wi.arr.size != wo.arr.size:
                raise ValueError(f"hcc: all_to_all_single: {input.numel()} input and {output.numel()} output "
                                 f"elements must be equal and divisible by {n} ranks")
            info = _info("alltoall", wi)

            def body(comm, seqs):
                if comm is None:
                    wo.arr[...] = wi.arr
                else:
                    comm.run(seqs[0], "alltoall", wi.arr.size, wi.dtype, wi.arr, wo.arr, info=info)
                wo.back()

            return self._call(info, body, [output])
        ins = [int(s) * row_i * scale_i for s in (input_split_sizes or [input.shape[0] // n] * n)]
        outs = [int(s) * row_o * scale_i for s in (output_split_sizes or [output.shape[0] // n] * n)]
        if len(ins) != n or len(outs) != n or sum(ins) != wi.arr.size or sum(outs) != wo.arr.size:
            raise ValueError("hcc: all_to_all_single: split sizes do not match the tensors or the world size")
        info = _info("alltoall", wi)
        big = np.array([max(ins + outs)], dtype=np.int64)

        def body(comm, seqs):
            if comm is None:
                wo.arr[...] = wi.arr
                wo.back()
                return
            # uneven splits: agree on the largest block, pad every block to it, one alltoall
            comm.run(seqs[0], "allreduce", 1, "int64", big, big, op="max",
                     info=CallInfo("alltoall(agree block)", 1, "int64", "max"))
            m = int(big[0])
            send = np.zeros(n * m, dtype=wi.arr.dtype)
            o = 0
            for r, s in enumerate(ins):
                send[r * m:r * m + s] = wi.arr[o:o + s]
                o += s
            recv = np.empty_like(send)
            if m:
                comm.run(seqs[1], "alltoall", n * m, wi.dtype, send, recv, info=info)
            o = 0
            for r, s in enumerate(outs):
                wo.arr[o:o + s] = recv[r * m:r * m + s]
                o += s
            wo.back()

        return self._call(info, body, [output], runs=2)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        token = np.zeros(1, dtype=np.uint8)

        def body(comm, seqs):
            if comm is not None:
                comm.run(seqs[0], "allreduce", 1, "uint8", token, token, op="max",
                         info=CallInfo("barrier", 1, "uint8", "max"))

        return self._call(CallInfo("barrier", 1, "uint8", "max"), body, [])

    def shutdown(self) -> None:
        if self.comm is not None:
            self.comm.close()

    def abort(self) -> None:
        self.shutdown()


def _list(tensors) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _info(kind: str, w: _Wire, op: str | None = None, root: int = -1) -> CallInfo:
    return CallInfo(kind, int(w.arr.size), w.dtype, op, root, tuple(w.tensor.shape))


class _TorchStore:
    """torch's c10d Store as hcc's :class:`~hcc.collectives.KeyStore`."""

    def __init__(self, store):
        self.store = store

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def get(self, key: str) -> bytes:
        return bytes(self.store.get(key))

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check(keys))


def _create(store, rank: int, size: int, timeout) -> ProcessGroupHCC:
    return ProcessGroupHCC(store, rank, size, timeout)


def register() -> None:
    """Register the backend name ``"hcc"`` with torch.distributed (done on import)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu"])


register()
