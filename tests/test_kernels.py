"""Kernels: bfloat16 conversions against an independent bit-level definition, reductions
against plain numpy, integer wrap-around, scale."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hcc.backends.kernels import DTypeError, combine_into, from_float32, np_dtype, reduce_into, scale_into, to_float32


def bf16_reference(x: float) -> int:
    """Round-to-nearest-even of a float32 to its top 16 bits, done with Python integers."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    hi, lo = bits >> 16, bits & 0xFFFF
    if lo > 0x8000 or (lo == 0x8000 and hi & 1):
        hi += 1
    return hi & 0xFFFF


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_bfloat16_rounding_matches_bit_definition(x):
    got = int(from_float32(np.array([x], np.float32), "bfloat16")[0])
    assert got == bf16_reference(x)


def test_bfloat16_ties_to_even_and_widening_exact():
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa (1.0) wins; 1 + 3·2^-8 rounds up
    vals = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5], np.float32)
    b = from_float32(vals, "bfloat16")
    assert to_float32(b, "bfloat16").tolist() == [1.0, 1.0, 1 + 2 ** -6, -2.5]
    assert np.isnan(to_float32(from_float32(np.array([np.nan], np.float32), "bfloat16"), "bfloat16")[0])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "int64", "uint8"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_reduce_into_matches_numpy(dtype, op):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 5, 257).astype(np_dtype(dtype))
    b = rng.integers(0, 5, 257).astype(np_dtype(dtype))
    want = {"sum": a + b, "avg": a + b, "prod": a * b, "min": np.minimum(a, b), "max": np.maximum(a, b)}[op]
    dst = a.copy()
    reduce_into(op, dtype, dst, b)
    assert dst.dtype == a.dtype and np.array_equal(dst, want)


def test_integers_wrap_like_numpy():
    dst = np.array([127, -128], np.int8)
    reduce_into("sum", "int8", dst, np.array([1, -1], np.int8))
    assert dst.tolist() == [-128, 127]


def test_bfloat16_reduction_via_float32():
    a = from_float32(np.array([1.5, -3.0, 7.0], np.float32), "bfloat16")
    b = from_float32(np.array([0.25, 4.0, -7.0], np.float32), "bfloat16")
    reduce_into("sum", "bfloat16", a, b)
    assert to_float32(a, "bfloat16").tolist() == [1.75, 1.0, 0.0]
    reduce_into("max", "bfloat16", a, from_float32(np.array([2, 0, -1], np.float32), "bfloat16"))
    assert to_float32(a, "bfloat16").tolist() == [2.0, 1.0, 0.0]


def test_scale_into():
    f = np.array([3.0, -6.0], np.float32)
    scale_into("float32", f, 3)
    assert f.tolist() == [1.0, -2.0]
    i = np.array([7, -7], np.int32)
    scale_into("int32", i, 2)
    assert i.tolist() == [3, -4]  # floor division, as the reference does
    b = from_float32(np.array([3.0], np.float32), "bfloat16")
    scale_into("bfloat16", b, 4)
    assert to_float32(b, "bfloat16").tolist() == [0.75]


def test_unknown_names_are_clear_errors():
    with pytest.raises(DTypeError, match="unknown dtype 'complex64'"):
        np_dtype("complex64")
    with pytest.raises(DTypeError, match="unknown reduction op 'xor'"):
        reduce_into("xor", "int32", np.zeros(1, np.int32), np.zeros(1, np.int32))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_combine_into_equals_copy_then_reduce(dtype, op):
    """The executor's fused Copy + RecvReduce gives the bits of the two unfused steps."""
    rng = np.random.default_rng(3)
    dt = np_dtype(dtype)
    if dtype == "bfloat16":
        a = from_float32(rng.normal(size=257).astype(np.float32), dtype)
        b = from_float32(rng.normal(size=257).astype(np.float32), dtype)
    else:
        a = rng.integers(-100, 100, 257).astype(dt)
        b = rng.integers(-100, 100, 257).astype(dt)
    unfused = a.copy()
    reduce_into(op, dtype, unfused, b)
    fused = np.full(257, 9, dtype=dt)
    combine_into(op, dtype, fused, a, b)
    assert fused.tobytes() == unfused.tobytes()
    with pytest.raises(ValueError, match="shapes differ"):
        combine_into(op, dtype, fused[:3], a, b)
