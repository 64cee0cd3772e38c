"""hcc.backends.kernels — element types and the in-place reduction kernels of the executor.

Terms
- dtype name: one of :data:`hcc.ir.plan.DTYPE_SIZES` (``float16 bfloat16 float32 float64 int8
  int32 int64 uint8``). numpy has no bfloat16, so a bfloat16 buffer is stored as ``uint16``
  holding the top 16 bits of the IEEE float32 pattern (the layout of torch.bfloat16 and of
  Google's brain float). Arithmetic on bfloat16 runs in float32 and is rounded back to nearest,
  ties to even, as :func:`from_float32` defines.
- reduction op: ``sum prod min max avg``; ``avg`` reduces as ``sum`` and is followed by a
  :func:`scale_into` by the contributor count (ir/plan.py).

Integer arithmetic wraps modulo 2**bits exactly as numpy's in-place ufuncs do (addition and
multiplication modulo 2**k are associative and commutative, so every reduction order gives the
same result). ``scale_into`` on integers is floor division (numpy ``//``); the reference
(backends/reference.py) applies the same kernel, so the two always agree.

Every kernel works in place with numpy ufuncs (``out=``): no Python loop over elements, no
temporary of the buffer's size except for bfloat16, where float32 copies are unavoidable.
"""
from __future__ import annotations

import threading

import numpy as np

from ..ir.plan import DTYPE_SIZES, OPS

__all__ = ["np_dtype", "to_float32", "from_float32", "reduce_into", "combine_into", "scale_into", "DTypeError",
           "StagingPool", "STAGING"]

_NUMPY = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
}
assert set(_NUMPY) == set(DTYPE_SIZES)

_UFUNC = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
assert set(_UFUNC) == set(OPS)


class DTypeError(ValueError):
    """An unknown dtype name or reduction op."""


def np_dtype(name: str) -> np.dtype:
    """The numpy storage dtype of a plan dtype name (bfloat16 → uint16).

    >>> np_dtype("bfloat16"), np_dtype("float32")
    (dtype('uint16'), dtype('float32'))
    """
    try:
        return _NUMPY[name]
    except KeyError:
        raise DTypeError(f"unknown dtype {name!r} (expected one of {', '.join(_NUMPY)})") from None


def to_float32(arr: np.ndarray, dtype_name: str) -> np.ndarray:
    """A float32 copy of ``arr`` (a buffer of ``dtype_name``); bfloat16 bits are widened exactly.

    >>> to_float32(np.array([0x3F80, 0xC000], dtype=np.uint16), "bfloat16")
    array([ 1., -2.], dtype=float32)
    """
    if dtype_name == "bfloat16":
        wide = np.asarray(arr, dtype=np.uint16).astype(np.uint32)
        np.left_shift(wide, 16, out=wide)
        return wide.view(np.float32)
    return np.asarray(arr).astype(np.float32)


def from_float32(arr32: np.ndarray, dtype_name: str, out: np.ndarray | None = None) -> np.ndarray:
    """Convert float32 values to ``dtype_name`` storage, into ``out`` when given.

    bfloat16 rounds to nearest, ties to even: add ``0x7FFF + lsb`` to the float32 bits and keep
    the top half; NaNs keep a quiet-NaN pattern (the addition could otherwise carry a NaN into
    infinity).

    >>> from_float32(np.array([1.0, 1.00390625, 1.01171875], np.float32), "bfloat16")
    array([16256, 16256, 16258], dtype=uint16)
    """
    if dtype_name != "bfloat16":
        res = np.asarray(arr32).astype(np_dtype(dtype_name))
        if out is not None:
            out[...] = res
            return out
        return res
    bits = np.ascontiguousarray(arr32, dtype=np.float32).view(np.uint32)
    lsb = np.right_shift(bits, 16) & np.uint32(1)
    rounded = bits + np.uint32(0x7FFF) + lsb
    np.right_shift(rounded, 16, out=rounded)
    res = rounded.astype(np.uint16)
    nan = np.isnan(bits.view(np.float32))
    if nan.any():
        res[nan] = (np.right_shift(bits[nan], 16) | np.uint32(0x0040)).astype(np.uint16)
    if out is not None:
        out[...] = res
        return out
    return res


def reduce_into(op: str, dtype_name: str, dst: np.ndarray, src: np.ndarray) -> None:
    """``dst = dst (op) src`` in place; equal lengths. ``avg`` reduces as ``sum``."""
    combine_into(op, dtype_name, dst, dst, src)


def combine_into(op: str, dtype_name: str, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``dst = a (op) b``; equal lengths; ``dst`` may be ``a`` (then it is :func:`reduce_into`).

    The executor uses the three-operand form to fuse a plan's ``Copy(in → dst)`` with the
    ``RecvReduce(dst)`` that follows it: one pass over memory instead of two (a 64 MiB
    4-rank ring allreduce copies 48 MiB per rank less)."""
    try:
        ufunc = _UFUNC[op]
    except KeyError:
        raise DTypeError(f"unknown reduction op {op!r} (expected one of {', '.join(OPS)})") from None
    if dst.shape != a.shape or dst.shape != b.shape:
        raise ValueError(f"reduce_into: shapes differ ({dst.shape}, {a.shape}, {b.shape})")
    if dtype_name == "bfloat16":
        acc = to_float32(a, dtype_name)
        ufunc(acc, to_float32(b, dtype_name), out=acc)
        from_float32(acc, dtype_name, out=dst)
        return
    ufunc(a, b, out=dst)


def scale_into(dtype_name: str, dst: np.ndarray, divisor: int) -> None:
    """``dst = dst / divisor`` in place; floor division for integer dtypes."""
    if divisor == 1:
        return
    if divisor == 0:
        raise ValueError("scale_into: divisor 0")
    if dtype_name == "bfloat16":
        acc = to_float32(dst, dtype_name)
        np.divide(acc, np.float32(divisor), out=acc)
        from_float32(acc, dtype_name, out=dst)
    elif np.issubdtype(dst.dtype, np.integer):
        np.floor_divide(dst, dst.dtype.type(divisor), out=dst)
    else:
        np.divide(dst, dst.dtype.type(divisor), out=dst)


class StagingPool:
    """Reusable receive-staging arrays, by byte size, at most ``limit`` bytes kept.

    Used by the executor (a RecvReduce's staging chunk) and the sockets transport (a frame
    that arrives before its receive is posted). Why: ``np.empty`` of a large array is a fresh
    mmap whose pages fault in (and are zeroed by the kernel) while the socket fills them —
    4096 faults per 16 MiB, every run (with the pool and the Copy fusion of the executor, a
    4-rank 64 MiB ring allreduce in 256 KiB chunks measured 218 ms instead of 390 ms on this
    machine). Thread-safe (Ray actors may run several
    executions in one process)."""

    def __init__(self, limit: int = 256 << 20):
        self.limit = limit
        self._free: dict[int, list[np.ndarray]] = {}
        self._kept = 0
        self._lock = threading.Lock()

    def take(self, count: int, dtype: np.dtype) -> np.ndarray:
        nbytes = count * dtype.itemsize
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self._kept -= nbytes
                return free.pop().view(dtype)
        return np.empty(nbytes, dtype=np.uint8).view(dtype)

    def release(self) -> None:
        """Drop every kept array (a launched rank calls it between collectives: the pool may
        hold up to ``limit`` bytes that the next collective does not need)."""
        with self._lock:
            self._free.clear()
            self._kept = 0

    def give(self, arr: np.ndarray) -> None:
        raw = arr.view(np.uint8)
        with self._lock:
            if self._kept + raw.nbytes <= self.limit:
                self._free.setdefault(raw.nbytes, []).append(raw)
                self._kept += raw.nbytes


STAGING = StagingPool()
