"""hcc.backends.codecs — the lossy wire codecs of ``compress = fp16 | int8`` (BAGUA).

A codec turns one message (a contiguous run of ``count`` elements of the plan's dtype) into
``wire_nbytes(count)`` bytes and back. The executor applies it to every Send/Recv/RecvReduce
of a plan whose ``compress != "none"``; the sizes are the IR's (ir/wire.py), from which the
compiler prices plans (design.md "Relaxations").

Terms
- message: the ``count`` elements one Send moves. Quantization is per message ("per chunk"):
  each message carries its own header, so a chunk's range never widens another's.
- ``fp16``: IEEE binary16, 2 bytes per element. Values beyond ±65504 become ±inf (IEEE
  overflow), NaN stays NaN. Relative error of a normal value ≤ 2⁻¹¹; absolute error of a
  value in the subnormal range (|x| < 2⁻¹⁴) ≤ 2⁻²⁵.
- ``int8``: BAGUA's min-max quantization, exactly as design.md gives it. With ``lo, hi`` the
  chunk's minimum and maximum (rounded to float32, the header format)::

      scale = 255 / (hi - lo + 1e-7)
      upper = rint(hi * scale);  lower = upper - 255
      q     = min(rint(x * scale), upper) - lower            (one uint8 per element)
      x̂     = (q + lower) / scale

  Wire layout: ``lo, hi`` as two little-endian float32 (8 bytes), then ``count`` bytes of q:
  ``wire_nbytes(count) = count + 8``. Decode recomputes ``scale, upper, lower`` from the
  stored ``lo, hi`` with the same float64 arithmetic as encode (:func:`_grid`), so it lands on
  exactly the grid encode rounded to (storing ``lower`` alone would not give ``scale``).
  Elementwise, both evaluate the formula shifted by ``lo`` — ``q = rint((x − lo)·scale + c)``
  and ``x̂ = lo + (q − c)/scale`` with ``c = lo·scale − lower`` — which is the same number
  (``lower`` is an integer) but keeps the work in [0, 255] so float32 arithmetic suffices
  (float64 for float64 data and for ranges beyond 1e37).

  Two guards keep the formula well-defined without changing it where it is already exact:
  ``rint(x·scale)`` is also clipped below at ``lower`` (round-half-to-even can put
  ``rint(lo·scale)`` one under ``upper − 255`` because 255 is odd, which would wrap the uint8),
  and x̂ is clipped to ``[lo, hi]`` (x lies there, so this never increases the error and keeps
  a huge range from overflowing to inf).

  Error bound (tested with hypothesis in tests/test_codecs.py): for every element,
  ``|x̂ − x| ≤ (hi − lo + 1e-7) / 510`` plus the rounding of x̂ to the output dtype; hence
  ``|x̂ − x| ≤ (max − min)/255`` whenever ``max − min ≥ 1e-7``. A chunk containing NaN or ±inf
  has no finite range: its header is ``(nan, nan)`` and it decodes to all NaN, so a
  non-finite gradient poisons the result as it would uncompressed instead of vanishing.

bfloat16 buffers are numpy ``uint16`` (the top half of a float32); the codecs widen and narrow
them with backends/kernels.py (exact widening, round-to-nearest-even narrowing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..ir.errors import PlanError
from ..ir.wire import COMPRESS_MODES, INT8_HEADER, check_compress, wire_nbytes
from .kernels import from_float32, to_float32

__all__ = ["COMPRESS_MODES", "Codec", "Fp16Codec", "Int8Codec", "get_codec"]

_HEADER = INT8_HEADER  # int8: lo, hi as float32 (the wire sizes are the IR's, ir/wire.py)
_EPS = 1e-7  # design.md's guard against a zero range


@dataclass(frozen=True)
class Codec:
    """One lossy wire format for one plan dtype. Subclasses: :class:`Fp16Codec`,
    :class:`Int8Codec`. ``encode``/``decode`` work on 1-D contiguous arrays."""

    dtype: str
    name: ClassVar[str] = ""

    def wire_nbytes(self, count: int) -> int:
        """Bytes of one message of ``count`` elements (ir/wire.py defines the sizes)."""
        if not self.name:
            raise PlanError(f"codec {type(self).__name__} defines no wire format")
        return wire_nbytes(self.name, self.dtype, count)

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        """Write the wire form of ``x`` (``count`` elements of the plan dtype) into ``out``,
        a uint8 array of ``wire_nbytes(count)`` bytes."""
        raise PlanError(f"codec {type(self).__name__} cannot encode")

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        """Write ``len(out)`` values of the plan dtype decoded from ``wire`` into ``out``."""
        raise PlanError(f"codec {type(self).__name__} cannot decode")

    def roundtrip(self, x: np.ndarray, out: np.ndarray) -> None:
        """``out := decode(encode(x))`` — what a receiver of ``x`` holds. ``out`` may be
        ``x`` itself (a Copy with ``roundtrip=True`` in a compressed allreduce)."""
        wire = np.empty(self.wire_nbytes(len(x)), dtype=np.uint8)
        self.encode(x, wire)
        self.decode(wire, out)

    # helpers shared by the subclasses
    def _as_float(self, x: np.ndarray) -> np.ndarray:
        """The values of ``x`` as a float array (bfloat16 widened to float32)."""
        if self.dtype == "bfloat16":
            return to_float32(x, "bfloat16")
        return np.asarray(x)

    def _store(self, values: np.ndarray, out: np.ndarray) -> None:
        if self.dtype == "bfloat16":
            from_float32(values.astype(np.float32, copy=False), "bfloat16", out=out)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                out[...] = values

    def _check(self, count: int, wire: np.ndarray) -> None:
        if wire.dtype != np.uint8 or wire.ndim != 1 or len(wire) != self.wire_nbytes(count):
            raise PlanError(
                f"{self.name} codec: wire buffer must be {self.wire_nbytes(count)} uint8 bytes "
                f"for {count} elements, got {wire.dtype} of shape {wire.shape}"
            )


@dataclass(frozen=True)
class Fp16Codec(Codec):
    name: ClassVar[str] = "fp16"

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        self._check(len(x), out)
        with np.errstate(over="ignore", invalid="ignore"):
            out.view(np.float16)[...] = self._as_float(x)

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        self._check(len(out), wire)
        self._store(wire.view(np.float16), out)


def _grid(lo: float, hi: float) -> tuple[float, float, float]:
    """``(scale, upper, lower)`` of design.md from the header's float32 ``lo, hi``, in float64
    — the single place encode and decode both get them from, so they agree bit for bit."""
    lo64, hi64 = float(np.float32(lo)), float(np.float32(hi))
    scale = 255.0 / (hi64 - lo64 + _EPS)
    upper = float(np.rint(hi64 * scale))
    return scale, upper, upper - 255.0


@dataclass(frozen=True)
class Int8Codec(Codec):
    name: ClassVar[str] = "int8"

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        count = len(x)
        self._check(count, out)
        header = out[:_HEADER].view(np.float32)
        if count == 0:
            header[:] = 0.0
            return
        v = self._as_float(x)
        lo, hi = v.min(), v.max()
        if self.dtype == "float64":
            v = np.asarray(v, dtype=np.float64)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            header[:] = np.nan
            out[_HEADER:] = 0
            return
        # The header is float32: round the range outward so every x stays inside [lo, hi]
        # (for float64 data the nearest float32 could cut the extreme values off).
        lo32 = np.nextafter(np.float32(lo), np.float32(-np.inf)) if np.float32(lo) > lo else np.float32(lo)
        hi32 = np.nextafter(np.float32(hi), np.float32(np.inf)) if np.float32(hi) < hi else np.float32(hi)
        header[0], header[1] = lo32, hi32
        scale, _, lower = _grid(lo32, hi32)
        wd = np.dtype(np.float64) if self.dtype == "float64" else self._work_dtype(lo32, hi32)
        # rint(x·scale) − lower, evaluated as rint((x − lo)·scale + c) with c = lo·scale − lower
        # (lower is an integer, so the two are equal): x·scale and lower can be ~1e9 apart
        # from the 0..255 that matters, and float32 would lose the step; (x − lo)·scale stays
        # in [0, 255] and float32 keeps it to ~3e-5 of a step, at half float64's memory traffic.
        t = np.subtract(v, wd.type(lo32), dtype=wd)
        t *= wd.type(scale)
        t += wd.type(float(lo32) * scale - lower)
        np.rint(t, out=t)
        np.clip(t, 0, 255, out=t)  # the min(·, upper) of the formula, and the guard at lower
        np.copyto(out[_HEADER:], t, casting="unsafe")  # exact: t holds integers 0..255

    @staticmethod
    def _work_dtype(lo: np.float32, hi: np.float32) -> np.dtype:
        """float32 arithmetic unless the range overflows it (|hi − lo| near float32's max)."""
        return np.dtype(np.float64 if float(hi) - float(lo) > 1e37 else np.float32)

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        count = len(out)
        self._check(count, wire)
        if count == 0:
            return
        lo, hi = wire[:_HEADER].view(np.float32)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            self._store(np.full(count, np.nan, dtype=np.float64), out)
            return
        scale, _, lower = _grid(lo, hi)
        wd = np.dtype(np.float64) if self.dtype == "float64" else self._work_dtype(lo, hi)
        # (q + lower) / scale, evaluated as lo + (q − c) / scale (same c as encode)
        direct = out.dtype == wd and out.flags.c_contiguous  # work in out itself: no extra pass
        t = out if direct else np.empty(count, dtype=wd)
        np.copyto(t, wire[_HEADER:], casting="unsafe")
        t -= wd.type(float(lo) * scale - lower)
        t *= wd.type(1.0 / scale)
        t += wd.type(lo)
        np.clip(t, wd.type(lo), wd.type(hi), out=t)
        if not direct:
            self._store(t, out)


_CODECS: dict[str, type[Codec]] = {"fp16": Fp16Codec, "int8": Int8Codec}


def get_codec(compress: str, dtype: str) -> Codec | None:
    """The codec of ``compress`` for buffers of ``dtype``; None for ``"none"``.

    >>> get_codec("int8", "float32").wire_nbytes(1000)
    1008
    >>> get_codec("none", "float32") is None
    True
    """
    check_compress(compress, dtype)
    if compress == "none":
        return None
    return _CODECS[compress](dtype)

