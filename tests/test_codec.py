"""libqnccl.so's codec, through qnccl.codec and the raw C API, against
docs/wire-format.md: byte-for-byte agreement with the numpy emulator, the
error bounds, non-finite values, sizes and padding, memory safety, and the
messages of rejected arguments."""
import ctypes
import itertools
import mmap
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import (DTYPES, F32_MAX, F32_TINY, assert_python_message, from_float32,
                      make_values, special_values, widen)
from qnccl import codec
from qnccl.emulate import codec as emu
from qnccl.emulate import rotation as rot

ROUNDINGS = ("nearest", "stochastic")
CANONICAL_NAN = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
BUCKETS = (1, 3, 7, 8, 100, 128, 1024, 100_000)  # the last is larger than every count
COUNTS = (0, 1, 7, 8, 9, 1000, 4099, 65537)
TESTS_DIR = Path(__file__).resolve().parent


def storage_bits(values):
    """The raw bits of an array, as unsigned integers of its item size."""
    values = np.ascontiguousarray(values).reshape(-1)
    return values.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[values.itemsize])


def assert_same_bytes(actual, expected, what):
    actual, expected = storage_bits(actual), storage_bits(expected)
    assert actual.dtype == expected.dtype and actual.size == expected.size, (
        f"{what}: library gave {actual.size} x {actual.dtype}, emulator {expected.size} x "
        f"{expected.dtype}")
    differ = np.flatnonzero(actual != expected)
    assert differ.size == 0, (
        f"{what}: {differ.size} elements differ, first at {differ[0]}: library "
        f"{int(actual[differ[0]]):#x}, emulator {int(expected[differ[0]]):#x}")


# ---- the library computes the emulator's bytes -------------------------------

def check_against_emulator(x, dtype, bits, bucket, rounding, seed, stream, rng):
    """quantize, dequantize to every type and accumulate into float32 and into
    x's type: library and emulator bytes must be identical."""
    count = x.size
    where = (f"{dtype} {rounding} bits={bits} bucket={bucket} count={count} seed={seed} "
             f"stream={stream}")
    q = codec.quantize(x, bits, bucket, rounding, seed=seed, stream=stream, dtype=dtype)
    expected = emu.quantize(x, bits, bucket, rounding, seed=seed, stream=stream, dtype=dtype)
    assert_same_bytes(q.data, expected, f"quantize {where}")
    for out_dtype in DTYPES:
        assert_same_bytes(codec.dequantize(q, dtype=out_dtype),
                          emu.dequantize(expected, count, bits, bucket, out_dtype),
                          f"dequantize to {out_dtype}, {where}")
    for acc_dtype in dict.fromkeys(("float32", dtype)):
        acc = make_values(rng, count, acc_dtype, bucket)
        expected_acc = acc.copy()
        codec.dequantize_accumulate(q, acc)
        emu.dequantize_accumulate(expected, count, bits, bucket, expected_acc, dtype=acc_dtype)
        assert_same_bytes(acc, expected_acc, f"accumulate into {acc_dtype}, {where}")


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("bucket", BUCKETS)
@pytest.mark.parametrize("bits", range(1, 9))
def test_library_matches_emulator_byte_for_byte(rng, bits, bucket, count):
    for dtype, rounding in itertools.product(DTYPES, ROUNDINGS):
        seed, stream = (int(v) for v in rng.integers(0, 2**64, 2, dtype=np.uint64))
        x = make_values(rng, count, dtype, bucket)
        check_against_emulator(x, dtype, bits, bucket, rounding, seed, stream, rng)


@settings(max_examples=200)
@given(count=st.integers(0, 3000), bits=st.integers(1, 8),
       bucket=st.one_of(st.sampled_from([1, 2, 8, 128]), st.integers(1, 4000)),
       dtype=st.sampled_from(DTYPES), rounding=st.sampled_from(ROUNDINGS),
       seed=st.integers(0, 2**64 - 1), stream=st.integers(0, 2**64 - 1),
       data_seed=st.integers(0, 2**32 - 1), specials=st.booleans(), strided=st.booleans())
def test_random_configurations_match_emulator(count, bits, bucket, dtype, rounding, seed, stream,
                                              data_seed, specials, strided):
    rng = np.random.default_rng(data_seed)
    x = make_values(rng, count, dtype, bucket, specials)
    if strided:  # the same values, not contiguous
        x = np.repeat(x, 2)[::2]
    check_against_emulator(x, dtype, bits, bucket, rounding, seed, stream, rng)


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("block", [2, 8, 256, 4096, 16384])
@pytest.mark.parametrize("count", [0, 1, 7, 1000, 4099, 65537])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotated_codec_matches_emulator(rng, dtype, count, block, specials):
    # docs/rotation.md: the buffer rotated as one segment (a tail of binary blocks), every
    # bucket on the uniform grid, rotated back on decode; bytes and values the emulator's,
    # with NaN, Inf, -0 and the types' limits sprinkled in too. The host codec works in tiles
    # of whole blocks and buckets (4096 values for 128 / 256, 6400 for 100 / 256, more than
    # a stage of 4096 for 16384) or, where those would pass 2^20 values (1001 / 4096), in one
    for bits, bucket, rounding in ((4, 128, "stochastic"), (3, 100, "nearest"),
                                   (8, 1024, "nearest"), (5, 1001, "stochastic")):
        x = make_values(rng, count, dtype, bucket, specials=specials)
        where = f"rotated {dtype} bits={bits} bucket={bucket} count={count} block={block} " \
                f"{rounding}"
        check_rotated_against_emulator(rng, x, dtype, bits, bucket, rounding, where,
                                       rotation="hadamard", rotation_block=block)


def check_rotated_against_emulator(rng, x, dtype, bits, bucket, rounding, where, clip="none",
                                   **kw):
    """A rotated (or prerotated) quantize of x, its dequantize and its accumulate: the
    emulator's bytes (seed 77, stream 5). Returns the QuantizedArray."""
    count = x.size
    q = codec.quantize(x, bits, bucket, rounding, seed=77, stream=5, dtype=dtype, clip=clip,
                       **kw)
    want = emu.quantize(x, bits, bucket, rounding, seed=77, stream=5, dtype=dtype, clip=clip,
                        **kw)
    assert_same_bytes(q.data, want, f"quantize {where}")
    assert_same_bytes(codec.dequantize(q), emu.dequantize(want, count, bits, bucket, dtype,
                                                          seed=77, **kw),
                      f"dequantize {where}")
    acc = make_values(rng, count, dtype, bucket, specials=False)
    want_acc = acc.copy()
    codec.dequantize_accumulate(q, acc)
    emu.dequantize_accumulate(want, count, bits, bucket, want_acc, dtype=dtype, seed=77, **kw)
    assert_same_bytes(acc, want_acc, f"accumulate {where}")
    return q


def test_rotated_codec_rotates_back_and_keeps_nans_canonical():
    x = np.arange(1000, dtype=np.float32) - 500
    x[300] = np.nan  # poisons its block of 256, values 256..511
    q = codec.quantize(x, 8, 128, "nearest", rotation="hadamard", rotation_block=256)
    y = codec.dequantize(q)
    assert np.all(storage_bits(y[256:512]) == CANONICAL_NAN["float32"])
    rest = np.r_[0:256, 512:1000]
    assert np.abs(y[rest] - x[rest]).max() < 0.05 * np.abs(x[rest]).max()  # 8 bits: close


@pytest.mark.parametrize("rotation,block,match", [
    ("hadamrd", 256, "rotation must be one of none, hadamard, prerotated"),
    ("hadamard", 100, r"rotation_block must be 0 \(the default, 256\) or a power of two in "
                      r"2\.\.16384, got 100")])
def test_rotated_codec_refuses_bad_settings(rotation, block, match):
    with pytest.raises(ValueError, match=match):
        codec.quantize(np.ones(8, np.float32), rotation=rotation, rotation_block=block)


def test_rotated_codec_bad_config_through_the_c_api():
    lib, ffi = codec._lib.lib(), codec._lib.ffi()
    config = ffi.new("qncclCodecConfig_t*", {"bits": 4, "bucketSize": 128, "rotation": 1,
                                             "rotationBlock": 100})
    size = ffi.new("size_t*")
    assert lib.qncclCompressedSize(8, config, size) != 0
    assert ("rotationBlock = 100; allowed: 0 (the default, 256) or a power of two from 2 to "
            "16384") in ffi.string(lib.qncclGetLastError()).decode()
    config.rotationBlock = 0
    config.rotation = 7
    assert lib.qncclCompressedSize(8, config, size) != 0
    assert ("rotation = 7 is unknown; allowed: qncclRotationNone (0), qncclRotationHadamard "
            "(1) or qncclRotationPrerotated (2)") in ffi.string(lib.qncclGetLastError()).decode()


@pytest.mark.parametrize("block", [2, 256, 16384])
@pytest.mark.parametrize("count", [0, 1, 7, 4099, 65537])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotate_and_unrotate_match_the_emulator(rng, dtype, count, block):
    """qncclRotate / qncclUnrotate (docs/rotation.md): the buffer rotated as one segment (a tail
    of binary blocks) into float32 and back into its type, every NaN the canonical one; the
    emulator's bits, out of place and, for float32, in place."""
    x = make_values(rng, count, dtype, 128, specials=True)
    where = f"{dtype} count={count} block={block}"
    z = codec.rotate(x, seed=77, rotation_block=block, dtype=dtype)
    want = rot.rotate(emu.as_float32(x, dtype)[0], block, 77)
    want[np.isnan(want)] = emu._NAN32
    assert_same_bytes(z, want, f"rotate {where}")
    back = codec.unrotate(z, seed=77, rotation_block=block, dtype=dtype)
    assert_same_bytes(back, emu.from_float32(rot.unrotate(want, block, 77), dtype),
                      f"unrotate {where}")
    if dtype == "float32":
        w = x.copy()
        assert codec.rotate(w, seed=77, rotation_block=block, out=w) is w
        assert_same_bytes(w, want, f"rotate in place {where}")
        codec.unrotate(w, seed=77, rotation_block=block, out=w)
        assert_same_bytes(w, back, f"unrotate in place {where}")


@pytest.mark.parametrize("bits, bucket, rounding", [(4, 128, "stochastic"), (3, 100, "nearest")])
def test_prerotated_values_quantize_as_the_rotated_codec_does(rng, bits, bucket, rounding):
    """rotation="prerotated" is the rotated codec without its rotations: quantizing rotate(x)
    so gives the bytes of quantizing x with rotation="hadamard", and rotating the decoded
    values back gives its values (the emulator's bytes too); unrotated values take the cubic
    grid unless told they are rotated."""
    x = make_values(rng, 9000, "float32", bucket, specials=True)
    kw = dict(seed=77, stream=5)
    z = codec.rotate(x, seed=77, rotation_block=256)
    q = codec.quantize(z, bits, bucket, rounding, rotation="prerotated", **kw)
    whole = codec.quantize(x, bits, bucket, rounding, rotation="hadamard", rotation_block=256,
                           **kw)
    assert_same_bytes(q.data, whole.data, "prerotated against hadamard")
    assert_same_bytes(q.data, emu.quantize(z, bits, bucket, rounding, rotation="prerotated",
                                           **kw), "prerotated against the emulator")
    y = codec.dequantize(q)
    assert_same_bytes(y, emu.dequantize(q.data, z.size, bits, bucket, rotation="prerotated"),
                      "prerotated dequantize against the emulator")
    assert_same_bytes(codec.unrotate(y, seed=77, rotation_block=256), codec.dequantize(whole),
                      "unrotate(prerotated decode) against the hadamard decode")
    plain = codec.quantize(z, bits, bucket, rounding, **kw)  # the cubic grid where it applies
    assert not np.array_equal(plain.data, q.data)


@pytest.mark.parametrize("rotation", ["hadamard", "prerotated"])
@pytest.mark.parametrize("bucket", [7, 128, 1000, 4096])
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("dtype", DTYPES)
def test_clipped_codec_matches_emulator(rng, dtype, bits, bucket, rotation):
    """Clipped ranges (docs/rotation.md, "Clipped ranges"): bytes, values and accumulations
    the emulator's for every type, width, rounding and bucket (the cut applies up to 4 bits
    at bucket 128 and up to 7 at 4096), with NaN, Inf and the types' limits sprinkled in:
    a value past the cut encodes as its end, with no overflow on the way."""
    for rounding, count in (("nearest", 4099), ("stochastic", 65537)):
        x = make_values(rng, count, dtype, bucket, specials=True)
        where = f"clipped {dtype} bits={bits} bucket={bucket} {rotation} {rounding}"
        kw = dict(rotation=rotation, rotation_block=256)
        q = check_rotated_against_emulator(rng, x, dtype, bits, bucket, rounding, where,
                                           clip="gaussian", **kw)
        assert q.clip == "gaussian"
    # on zero-mean finite values (a NaN poisons its rotation block; a bucket on one side of
    # zero keeps its range) the cut shows where it applies
    x = from_float32(rng.standard_normal(4099).astype(np.float32), dtype)
    q = codec.quantize(x, bits, bucket, "nearest", dtype=dtype, clip="gaussian", **kw)
    whole = codec.quantize(x, bits, bucket, "nearest", dtype=dtype, **kw)
    clipping = emu.clip_fraction("gaussian", bits, bucket) != 0
    assert np.array_equal(q.data, whole.data) != clipping, f"the cut applies: {where}"


def test_clip_bad_config_through_the_python_and_c_apis():
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="clip must be one of none, gaussian, got 'yes'"):
        codec.quantize(x, rotation="prerotated", clip="yes")
    with pytest.raises(ValueError, match="it needs rotation='hadamard' or 'prerotated'"):
        codec.quantize(x, clip="gaussian")
    lib, ffi = codec._lib.lib(), codec._lib.ffi()
    config = ffi.new("qncclCodecConfig_t*", {"bits": 4, "bucketSize": 128, "clip": 1})
    size = ffi.new("size_t*")
    assert lib.qncclCompressedSize(8, config, size) != 0
    assert ("clip = qncclClipGaussian needs rotated values; allowed with rotation = "
            "qncclRotationHadamard or qncclRotationPrerotated, or pass clip = qncclClipNone"
            ) in ffi.string(lib.qncclGetLastError()).decode()
    config.rotation = lib.qncclRotationPrerotated
    config.clip = 5
    assert lib.qncclCompressedSize(8, config, size) != 0
    assert ("clip = 5 is unknown; allowed: qncclClipNone (0) or qncclClipGaussian (1)"
            in ffi.string(lib.qncclGetLastError()).decode())
    config.clip = 1
    assert lib.qncclCompressedSize(8, config, size) == 0 and size[0] == 8 + 8


@pytest.mark.parametrize("call, match", [
    (lambda x: codec.rotate(x, rotation_block=48), "or a power of two in 2..16384, got 48"),
    (lambda x: codec.rotate(x, out=np.zeros(7, np.float32)),
     "out holds 7 values; the array has 8"),
    (lambda x: codec.rotate(x, out=np.zeros(8, np.float64)), "out must be a float32 array"),
    (lambda x: codec.unrotate(x.astype(np.float16)), "values must be a float32 array"),
    (lambda x: codec.unrotate(x, dtype="int8"), "dtype must be one of"),
    (lambda x: codec.unrotate(x, out=np.zeros(9, np.float32)), "out holds 9 values"),
])
def test_rotate_and_unrotate_refuse_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call(np.ones(8, np.float32))


def test_rotate_and_unrotate_through_the_c_api_refuse_what_they_cannot_do():
    lib, ffi = codec._lib.lib(), codec._lib.ffi()
    config = ffi.new("qncclCodecConfig_t*", {"bits": 4, "bucketSize": 128, "rotation": 0})
    x = np.ones(64, np.float32)
    halves = np.zeros(64, np.uint16)
    ptr = ffi.from_buffer
    errors = []
    for rotation, src, dst, dtype in (
            (0, ptr(x), ffi.cast("float*", ptr(x)), lib.ncclFloat32),  # not a rotation
            (1, ptr(halves), ffi.cast("float*", ptr(halves)), lib.ncclFloat16),  # overlap
            (1, ptr(x), ffi.cast("float*", ptr(x)), lib.ncclInt32)):  # not a codec type
        config.rotation = rotation
        assert lib.qncclRotate(src, 32, dtype, config, dst, ffi.NULL) == lib.ncclInvalidArgument
        errors.append(ffi.string(lib.qncclGetLastError()).decode())
    assert "qncclRotate: rotation = 0; allowed: qncclRotationHadamard (1)" in errors[0]
    assert "qncclRotate: src and dst overlap; pass separate buffers" in errors[1]
    assert "qncclRotate: datatype = " in errors[2] and "allowed: ncclFloat32" in errors[2]
    config.rotation = 2
    assert lib.qncclUnrotate(ffi.cast("float*", ptr(x)), 64, config, ptr(x), lib.ncclFloat32,
                             ffi.NULL) == lib.ncclInvalidArgument
    assert "qncclUnrotate: rotation = 2; allowed: qncclRotationHadamard (1)" in \
        ffi.string(lib.qncclGetLastError()).decode()
    config.rotation = 1
    assert lib.qncclUnrotate(ffi.NULL, 64, config, ptr(x), lib.ncclFloat32,
                             ffi.NULL) == lib.ncclInvalidArgument
    assert "qncclUnrotate: src is NULL with count = 64" in \
        ffi.string(lib.qncclGetLastError()).decode()


def cubic_thresholds(p, bits):
    """Per bucket (a row each), the L values t_0 < .. < t_{L-1} of a cubic grid whose count
    below x is x's nearest code (codec_math.h, cubic_threshold), in numpy float32: the least
    float a with a * inv > (j^3 + (j+1)^3) / 2 for each side's level j, negated below zero,
    the float under it above."""
    top = (1 << bits) - 1
    i = np.arange(top, dtype=np.float32)[None, :]
    zero = p["zero"][:, None]
    below = i < zero
    j = np.where(below, zero - np.float32(1) - i, i - zero)
    h = j * j * j + ((j * j + j) * np.float32(3) + np.float32(1)) * np.float32(0.5)
    c = np.where(below, p["inv_unit_neg"][:, None], p["inv_unit_pos"][:, None])
    a = h / c
    for _ in range(2):
        a = np.where(a * c > h, a, np.nextafter(a, np.float32(np.inf)))
    return np.where(below, -a, np.nextafter(a, np.float32(0)))


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_values_at_cubic_thresholds_match_emulator(rng, bits):
    """Nearest rounding on a cubic grid, at the values where it changes code: each threshold
    of a bucket and the floats either side of it. The host's vector encoder finds codes by
    searching these thresholds, the emulator by the cube-root definition; buckets spanning
    2^-100..2^100, lopsided and with no code above zero."""
    nb, bucket = 300, 128
    lo = -np.float32(2) ** rng.uniform(-100, 100, nb).astype(np.float32)
    hi = np.float32(2) ** rng.uniform(-100, 100, nb).astype(np.float32)
    hi[:20] = 0  # every code at or below zero
    hi[20:40] = -lo[20:40] * np.float32(1e-3)
    p = emu.bucket_params(lo, hi, bits)
    assert p["cubic"].all()
    t = cubic_thresholds(p, bits)
    above = np.nextafter(t, np.float32(np.inf))
    # The thresholds are the definition's: code i at t_i, i + 1 just above it.
    rows = {k: (v[:, None] if np.ndim(v) else v) for k, v in p.items()}
    inside = (t >= lo[:, None]) & (above <= hi[:, None])
    index = np.broadcast_to(np.arange(t.shape[1], dtype=np.float32), t.shape)
    assert np.array_equal(emu.encode_values(t, rows, bits=bits)[inside], index[inside])
    assert np.array_equal(emu.encode_values(above, rows, bits=bits)[inside], index[inside] + 1)
    assert inside.mean() > 0.9

    x = rng.uniform(lo[:, None], hi[:, None], (nb, bucket)).astype(np.float32)
    near = np.concatenate([t, above, np.nextafter(t, np.float32(-np.inf))], axis=1)
    x[:, 2:2 + near.shape[1]] = np.clip(near, lo[:, None], hi[:, None])
    x[:, 0], x[:, 1] = lo, hi
    x = x.reshape(-1)
    q = codec.quantize(x, bits, bucket, "nearest")
    assert_same_bytes(q.data, emu.quantize(x, bits, bucket, "nearest"),
                      f"quantize nearest at cubic thresholds, bits={bits}")


def _undo_xorshift(y, shift, width):
    """x from y = x ^ (x >> shift) on `width` bits."""
    x = y
    for _ in range(width // shift + 1):
        x = y ^ (x >> shift)
    return x


def _undo_finalizer(y, width, shifts, multipliers):
    """The x with f(x) = y on `width`-bit words, f the xorshift-multiply finalizer
    x ^= x >> s0; x *= m0; x ^= x >> s1; x *= m1; x ^= x >> s2 (splitmix64's and the 32-bit
    hash of emulate/codec.py): each step is a bijection, undone in reverse order."""
    m = 2**width
    x = _undo_xorshift(y, shifts[2], width)
    for shift, multiplier in ((shifts[1], multipliers[1]), (shifts[0], multipliers[0])):
        x = _undo_xorshift(x * pow(multiplier, -1, m) % m, shift, width)
    return x


def _undo_mix64(y):
    return _undo_finalizer(y, 64, (30, 27, 31), (0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _undo_hash32(h):
    return _undo_finalizer(h, 32, (16, 15, 16), (0x7FEB352D, 0x846CA68B))


def seed_with_zero_uniform_at_index_0(stream):
    """A seed whose random number u of element 0 is exactly 0: the key's high word is then
    element 0's Weyl value, chosen as the preimage of hash 0."""
    key = _undo_hash32(0) << 32 | 1
    seed = _undo_mix64(key) ^ int(emu._mix64(np.uint64(stream)))  # key = mix64(seed ^ mix64(stream))
    assert emu.rng_uniform(seed, stream, 0) == 0
    return seed


@pytest.mark.parametrize("end", ["max", "min"])
@pytest.mark.parametrize("bits", [3, 4, 5])
def test_stochastic_rounding_stays_inside_the_cubic_grid_at_its_ends(rng, bits, end):
    """A bucket's max (or min) can scale to w a float above d^3 on its side, so that with u = 0
    the stochastic step goes one code past the grid: the encoder must clamp it to L (or 0).
    Element 0 holds the end, its random number is made exactly 0 by the seed, and the bucket
    has enough values that the host encoder's vectorized loop, not its scalar tail, codes it.
    (At two bits a side with values has d = 1 or 2, whose unit scales exactly: w never passes
    d^3 there.)"""
    bucket, stream = 128, 5
    for _ in range(1000):  # a bucket whose end overshoots d^3 (about every other one does)
        lo = -np.float32(2) ** np.float32(rng.uniform(-20, 20))
        hi = np.float32(2) ** np.float32(rng.uniform(-20, 20))
        p = emu.bucket_params(np.array([lo]), np.array([hi]), bits)
        top = (1 << bits) - 1
        d = top - p["zero"][0] if end == "max" else p["zero"][0]
        w = hi * p["inv_unit_pos"][0] if end == "max" else -lo * p["inv_unit_neg"][0]
        if w > d * d * d:
            break
    else:
        pytest.fail("no bucket whose end scales past d^3")
    x = rng.uniform(lo, hi, bucket).astype(np.float32)
    x[0] = hi if end == "max" else lo
    x[1] = lo if end == "max" else hi
    seed = seed_with_zero_uniform_at_index_0(stream)
    q = codec.quantize(x, bits, bucket, "stochastic", seed=seed, stream=stream)
    assert_same_bytes(q.data, emu.quantize(x, bits, bucket, "stochastic", seed=seed, stream=stream),
                      f"stochastic at the grid's {end}, bits={bits}")
    code0 = int(emu.unpack_codes(q.data[8:], bucket, bits)[0])
    assert code0 == (top if end == "max" else 0), f"element 0 ({end}) coded {code0}"


# ---- error bounds -------------------------------------------------------------

def rounding_slack(meta):
    """Allowance for float32 rounding in the bounds of docs/wire-format.md, per bucket.

    Work in sigma units (values times sigma; scaling by sigma and 1/sigma is
    exact) with M = sigma * max(|min|, |max|), e = 2^-24 the float32 unit
    roundoff and s the step derived from the metadata. Encode rounds three
    times: D = sigma*x - a (<= e*2M), inv = 1/s (relative e; when s > 2^126
    inv is subnormal and errs by up to 2^-150 = 2^-150*s relative < 4e, as
    s < 2^128) and t = D*inv (relative e), so s*|t - D/s| <= 2M(e + 4e + e)
    = 12eM. The code is within 1/2 (nearest) or 1 (stochastic) of t, except
    when clamped to L: s = fl(fl(sigma*max - a)/L) puts L*s within 2e*2M of
    the range, so the clamp costs at most 4eM. Decode rounds q*s (<= e*L*s
    <= 2eM(1 + 2e)) and the addition (<= eM). In all the error is within
    s/2 (resp. s) + 19eM, and 24eM covers the O(e^2) terms. Near zero a
    result may be subnormal, where an operation errs by up to 2^-150
    absolute instead: at most 6 of them, 3 * 2^-149.

    A cubic grid (min < 0 <= max) rounds less: unit = fl(M / d^3) and inv = fl(1/unit)
    (relative e each), w = fl(|x| * inv) (relative e), so w sits within 3e|x| <= 3eM of
    |x| / unit; the cell and its fraction are then found exactly or decide only which of
    the two levels around x is taken. A level is fl(k|k|^2 * unit): k|k|^2 is exact, the
    product and the unit err by e M each. Within 5eM, inside the same 24eM.
    """
    magnitude = np.abs(np.asarray(meta, np.float64)).max(axis=1)
    return 24 * 2.0**-24 * magnitude + 3 * F32_TINY


def grid_cells(values, meta, bits, bucket):
    """Per value (float64), the two neighbouring levels of its bucket's grid around it,
    lower <= x <= upper: the levels are the decoded values of codes 0..L (docs/wire-format.md,
    whichever grid the bucket has), in increasing order."""
    lo, hi = meta[:, :1], meta[:, 1:]
    levels = emu.decode_values(np.arange(2**bits, dtype=np.float32)[None, :],
                               emu.bucket_params(lo, hi, bits)).astype(np.float64)
    assert np.all(np.diff(levels, axis=1) >= 0), "levels must increase with the code"
    mine = levels[np.arange(values.size) // bucket]
    below = np.clip((mine <= values[:, None]).sum(axis=1) - 1, 0, 2**bits - 1)
    above = np.clip(below + (mine[np.arange(values.size), below] < values), 0, 2**bits - 1)
    rows = np.arange(values.size)
    return mine[rows, below], mine[rows, above]


def cell_width(values, params, owner):
    """Per value (float64), the width of the cell of its bucket's grid that holds it, before
    the decoder's clamp to [min, max]: the uniform grid's step, or on a cubic grid
    unit * ((f+1)^3 - f^3) with f = floor(cbrt(|x| / unit)) (at most d - 1) on x's side."""
    p = {k: (np.asarray(v, np.float64)[owner] if np.ndim(v) else v) for k, v in params.items()}
    width = p["step"] * p["inv_sigma"]
    if "zero" not in p:
        return width
    neg = values < 0
    unit = np.where(neg, p["unit_neg"], p["unit_pos"])
    d = np.where(neg, p["span_neg"], p["span_pos"])
    f = np.minimum(np.floor(np.cbrt(np.abs(values) / unit)), np.maximum(d - 1, 0))
    return np.where(p["cubic"].astype(bool), unit * ((f + 1) ** 3 - f**3), width)


def check_bounds(x, dtype, q):
    """Metadata, range, codes and error of `q` (quantized from `x`) per the doc: every value
    within half (nearest) or all (stochastic) of the distance between the two levels of its
    bucket's grid around it, and never farther than that from the widest cell allows."""
    values = widen(x, dtype).reshape(-1)
    count, bucket = values.size, q.bucket_size
    starts = np.arange(0, count, bucket)
    meta = q.meta.astype(np.float64)
    assert np.array_equal(meta[:, 0], np.minimum.reduceat(values, starts))
    assert np.array_equal(meta[:, 1], np.maximum.reduceat(values, starts))
    owner = np.arange(count) // bucket
    lo, hi = meta[owner, 0], meta[owner, 1]
    y = codec.dequantize(q, dtype="float32").astype(np.float64).reshape(-1)
    assert np.all(np.isfinite(y)) and np.all((lo <= y) & (y <= hi))

    params = emu.bucket_params(q.meta[:, 0], q.meta[:, 1], q.bits)
    step = emu.grid_step(params)  # the widest cell of each bucket's grid
    steps_allowed = 0.5 if q.rounding == "nearest" else 1.0
    # Only a constant bucket has step 0: a range so small that (max - min) / L
    # underflows still gets the 2^-126 floor.
    assert np.array_equal(step == 0, meta[:, 0] == meta[:, 1])
    cell = cell_width(values, params, owner)
    assert np.all(cell <= step[owner] * (1 + 2.0**-20))
    slack = rounding_slack(meta)[owner]
    limit = steps_allowed * cell + slack
    error = np.abs(values - y)
    outside = error > limit  # stochastic's strict "<" is moot once the slack is added
    if outside.any():
        i = np.flatnonzero(outside)[0]
        pytest.fail(f"{q.rounding}: |x - y| = {error[i]:.9g} > {limit[i]:.9g} at {i}: "
                    f"x={values[i]!r} y={y[i]!r} bucket [{lo[i]!r}, {hi[i]!r}] "
                    f"cell {cell[i]!r}")

    codes = q.codes.astype(np.int64)
    # the minimum sits on code 0 (exactly so on a uniform grid: x - min = 0) and, rounding to
    # nearest, the maximum on the top code, unless the step was raised to 2^-126
    regular = (hi - lo >= 2.0**-100)
    uniform = ~params["cubic"].astype(bool)[owner]
    assert np.all(codes[(values == lo) & (uniform | regular)] == 0)
    if q.rounding == "nearest":
        assert np.all(codes[(values == hi) & regular] == 2**q.bits - 1)


_DTYPE_LIMITS = {"float32": (F32_MAX, F32_TINY), "float16": (65504.0, 2.0**-24),
                 "bfloat16": (float(widen(np.uint16(0x7F7F), "bfloat16")), 2.0**-133)}


def bounded_values(kind, dtype, rng, count, bucket):
    """Finite test data of one kind, in the storage of `dtype`."""
    largest, tiniest = _DTYPE_LIMITS[dtype]
    if kind == "normal":
        values = rng.standard_normal(count) * 3
    elif kind == "offset":  # a narrow range far from zero: cancellation in x - min
        values = 1000 + rng.uniform(0, 1, count)
    elif kind == "scales":
        return make_values(rng, count, dtype, bucket, specials=False)
    elif kind == "huge":  # every bucket spans the whole finite range
        values = rng.uniform(-1, 1, count) * largest
        values[::bucket] = largest
        values[1::bucket] = -largest
    elif kind == "subnormal":  # ranges of a few subnormal steps, then normal neighbours
        values = rng.integers(-5, 6, count) * tiniest
        values[count // 2:] += 2.0**-126 if dtype != "float16" else 2.0**-14
    return from_float32(values, dtype)


@pytest.mark.parametrize("kind", ["normal", "offset", "scales", "huge", "subnormal"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_error_bounds(rng, dtype, bits, rounding, kind):
    for bucket in (37, 128):
        x = bounded_values(kind, dtype, rng, 1000, bucket)
        q = codec.quantize(x, bits, bucket, rounding, seed=3, stream=bucket, dtype=dtype)
        check_bounds(x, dtype, q)


@pytest.mark.parametrize("bits", [1, 8])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_values_at_the_float32_limits_stay_finite_and_bounded(bits, rounding):
    x = np.array([F32_MAX, -F32_MAX, 1.0, -1.0, 3e38, -2.5e38, 1e30, 0.0], np.float32)
    q = codec.quantize(x, bits, 8, rounding, seed=1, stream=2)
    assert q.meta.tolist() == [[-F32_MAX, F32_MAX]]
    check_bounds(x, "float32", q)


@pytest.mark.parametrize("bits", [1, 3, 4])
def test_stochastic_rounding_is_unbiased_and_nearest_is_not(rng, bits):
    bucket, buckets, streams = 16, 4, 4000
    lo = rng.uniform(-5, 0, (buckets, 1))
    x = rng.uniform(lo, lo + rng.uniform(0.5, 3, (buckets, 1)), (buckets, bucket))
    x = x.astype(np.float32).reshape(-1)

    def mean_and_std(rounding):
        y = np.stack([codec.dequantize(codec.quantize(x, bits, bucket, rounding, seed=11,
                                                      stream=stream))
                      for stream in range(streams)]).astype(np.float64)
        return y.mean(axis=0), y.std(axis=0, ddof=1)

    q = codec.quantize(x, bits, bucket, "nearest")
    owner = np.arange(x.size) // bucket
    lower, upper = grid_cells(x.astype(np.float64), q.meta, bits, bucket)
    fraction = (x - lower) / np.where(upper > lower, upper - lower, 1.0)
    interior = (fraction > 0.1) & (fraction < 0.9)  # nearest is off by >= 0.1 cell there
    assert interior.sum() > x.size // 2

    mean, std = mean_and_std("stochastic")
    tolerance = 5 * std / np.sqrt(streams) + rounding_slack(q.meta)[owner]
    x64 = x.astype(np.float64)
    assert np.all(np.abs(mean - x64) <= tolerance), np.max(np.abs(mean - x64) - tolerance)
    assert np.all(std[interior] > 0)

    nearest_mean, nearest_std = mean_and_std("nearest")
    assert np.all(nearest_std == 0)
    assert np.all(np.abs(nearest_mean - x64)[interior] > tolerance[interior])


# ---- random streams ----------------------------------------------------------

def test_streams_and_seeds_select_independent_rounding(rng):
    x = (rng.standard_normal(2000) * 4).astype(np.float32)
    keys = [(0, 0), (0, 1), (1, 0), (0, 2**32), (2**32, 0), (0, 2**64 - 1), (2**64 - 1, 0),
            (5, 5)]
    codes = {}
    for seed, stream in keys:
        q = codec.quantize(x, 4, 128, "stochastic", seed=seed, stream=stream)
        again = codec.quantize(x, 4, 128, "stochastic", seed=seed, stream=stream)
        assert_same_bytes(again.data, q.data, f"repeat of seed={seed} stream={stream}")
        codes[seed, stream] = q.codes
    for a, b in itertools.combinations(keys, 2):
        # independent noise changes a code with probability 2p(1-p), 1/3 on average
        assert np.mean(codes[a] != codes[b]) > 0.25, (a, b)
    nearest = [codec.quantize(x, 4, 128, "nearest", seed=s, stream=t).data for s, t in keys]
    for data in nearest[1:]:
        assert_same_bytes(data, nearest[0], "nearest rounding with another seed/stream")


# ---- non-finite values, constants, zeros ---------------------------------------

@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bits", [1, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nonfinite_bucket_decodes_to_nan_and_spares_the_others(rng, dtype, bits, rounding):
    bucket, count = 16, 75  # five buckets, the last holding 11 values
    nan, other_nan, inf, minus_inf = special_values(dtype)[:4]
    clean = from_float32(rng.uniform(-2, 2, count), dtype)
    x = clean.copy()
    x[16], x[47], x[70], x[74] = nan, inf, minus_inf, other_nan  # buckets 1, 2 and 4
    bad = np.isin(np.arange(count) // bucket, [1, 2, 4])
    q = codec.quantize(x, bits, bucket, rounding, seed=4, stream=2, dtype=dtype)
    q_clean = codec.quantize(clean, bits, bucket, rounding, seed=4, stream=2, dtype=dtype)

    meta_bits = q.meta.view(np.uint32)
    assert np.all(meta_bits[[1, 2, 4]] == CANONICAL_NAN["float32"])
    assert np.array_equal(meta_bits[[0, 3]], q_clean.meta.view(np.uint32)[[0, 3]])
    assert np.all(q.codes[bad] == 0)
    assert np.array_equal(q.codes[~bad], q_clean.codes[~bad])

    for out_dtype in DTYPES:
        y = storage_bits(codec.dequantize(q, dtype=out_dtype))
        assert np.all(y[bad] == CANONICAL_NAN[out_dtype]), out_dtype
        y_clean = storage_bits(codec.dequantize(q_clean, dtype=out_dtype))
        assert np.array_equal(y[~bad], y_clean[~bad])
    for acc_dtype in dict.fromkeys(("float32", dtype)):
        acc = from_float32(rng.uniform(-1, 1, count), acc_dtype)
        acc_clean = acc.copy()
        codec.dequantize_accumulate(q, acc)
        codec.dequantize_accumulate(q_clean, acc_clean)
        assert np.all(storage_bits(acc)[bad] == CANONICAL_NAN[acc_dtype])
        assert np.array_equal(storage_bits(acc)[~bad], storage_bits(acc_clean)[~bad])


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bits", [1, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_buckets_decode_exactly(dtype, bits, rounding):
    specials = special_values(dtype)
    wide = widen(specials, dtype)
    constants = specials[np.isfinite(wide) & ~((wide == 0) & np.signbit(wide))]
    constants = np.concatenate([constants, from_float32([-3.5, 7.0, 1e4], dtype)])
    bucket = 9
    x = np.repeat(constants, bucket)
    q = codec.quantize(x, bits, bucket, rounding, seed=9, stream=9, dtype=dtype)
    assert_same_bytes(codec.dequantize(q, dtype=dtype), x, "constant buckets")
    assert np.array_equal(q.meta[:, 0], q.meta[:, 1])
    assert np.array_equal(q.meta[:, 0].astype(np.float64), widen(constants, dtype))
    assert np.all(q.codes == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_negative_zero_is_stored_as_positive_zero(dtype):
    values = np.array([-0.0] * 8 + [-0.0, 1, 2, 3, 0, 5, 6, 7] + [-2, -0.0, -1, -1, -1, -1, -1, -1])
    x = from_float32(values, dtype)
    assert np.any(storage_bits(x) == storage_bits(from_float32([-0.0], dtype))[0])
    q = codec.quantize(x, 4, 8, "nearest", dtype=dtype)
    assert q.meta.view(np.uint32).tolist() == [[0, 0], [0, 0x40E00000], [0xC0000000, 0]]
    y = storage_bits(codec.dequantize(q, dtype=dtype))
    assert np.all(y[:8] == 0)  # the all-zero bucket decodes to +0.0


def test_subnormal_ranges_keep_their_bounds():
    x = (np.array([0, 1, 2, 3, 4, 5, -1, -2] * 2 + [3, 3, 3, 3, 4, 4, 4, 4]) * F32_TINY)
    x = x.astype(np.float32)
    for rounding in ROUNDINGS:
        check_bounds(x, "float32", codec.quantize(x, 2, 8, rounding, seed=1, stream=1))
    # ranges this tiny keep the uniform grid (a cubic unit would be subnormal), and its step
    # of a few subnormal units is raised to 2^-126 (or rounds to 0): every code is 0
    assert not codec.quantize(x, 2, 8, "nearest").codes.any()


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_decodes_to_exactly_zero(rng, dtype, bits, rounding):
    """Every bucket holding a negative value and a zero has a cubic grid with zero on it:
    a zero in it decodes to +0.0, bit for bit, whatever the other values are."""
    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-8, 8, 4096))).astype(np.float32)
    x[rng.random(x.size) < 0.4] = 0.0
    x[::64] = -np.abs(x[::64]) - 1e-3  # every bucket of 64 holds a negative value
    x[1::64] = 0.0  # and a zero
    x = from_float32(x, dtype)
    q = codec.quantize(x, bits, 64, rounding, seed=5, stream=6, dtype=dtype)
    y = codec.dequantize(q, dtype="float32").reshape(-1)
    zero = widen(x, dtype).reshape(-1) == 0
    assert np.count_nonzero(zero) > 1500
    assert np.all(y[zero].view(np.uint32) == 0)


def test_one_bit_has_no_zero_level():
    """At 1 bit a bucket holding negatives and positives has only its min and max."""
    x = np.array([-1.0, 0.0, 2.0, 0.0], np.float32)
    assert sorted(set(codec.dequantize(codec.quantize(x, 1, 4, "nearest")).tolist())) == [-1, 2]


# ---- sizes, empty input, padding --------------------------------------------

@pytest.mark.parametrize("count,bits,bucket", [
    (0, 4, 128), (1, 1, 1), (7, 3, 2), (9, 5, 4), (128, 4, 128), (1000, 8, 1000),
    (4099, 7, 100), (65537, 2, 1024), (10**12, 4, 128), (10**12, 3, 1)])
def test_compressed_size_is_metadata_plus_aligned_codes(count, bits, bucket):
    expected = 8 * -(-count // bucket) + -(-(-(-count * bits // 8)) // 8) * 8
    assert codec.compressed_size(count, bits, bucket) == expected
    assert emu.compressed_size(count, bits, bucket) == expected
    if count <= 65537:
        assert codec.quantize(np.ones(count, np.float32), bits, bucket).nbytes == expected


def test_four_bits_in_buckets_of_128_compress_float32_7_1_times():
    q = codec.quantize(np.zeros(2**20, np.float32), 4, 128, "nearest")
    assert q.nbytes == 8 * 2**13 + 2**19
    assert q.ratio == pytest.approx(4 * 2**20 / (8 * 2**13 + 2**19))
    assert 7.1 < q.ratio < 7.12
    # the doc's examples: 512 bytes of float32 cost 64 + 8 (bucket 128), or 512 + 8 (bucket 1024)
    assert codec.compressed_size(128, 4, 128) == 72
    assert codec.compressed_size(1024, 4, 1024) == 520


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_input(capi, dtype):
    x = from_float32(np.zeros(0), dtype)
    q = codec.quantize(x, 4, 128, dtype=dtype)
    assert q.nbytes == 0 and q.count == 0 and q.meta.shape == (0, 2) and q.codes.size == 0
    assert codec.dequantize(q).shape == (0,)
    assert codec.dequantize_accumulate(q, np.zeros(0, np.float32)).shape == (0,)
    ffi, lib = capi
    config = ffi.new("qncclCodecConfig_t*", {"bits": 4, "bucketSize": 128})
    assert lib.qncclQuantize(ffi.NULL, 0, lib.ncclFloat32, config, 0, ffi.NULL, 0, ffi.NULL) == 0
    assert lib.qncclDequantize(ffi.NULL, 0, 0, config, ffi.NULL, lib.ncclFloat32, ffi.NULL) == 0
    assert lib.qncclDequantizeAccumulate(ffi.NULL, 0, 0, config, ffi.NULL, lib.ncclBfloat16,
                                         ffi.NULL) == 0


@pytest.mark.parametrize("bits", range(1, 9))
def test_padding_bits_and_bytes_are_zero(bits):
    bucket = 5
    for count in (1, 7, 9, 13, 63, 4097):
        # every bucket: its minimum first, then values at its maximum (code 2^bits - 1)
        x = np.ones(count, np.float32)
        x[::bucket] = 0
        q = codec.quantize(x, bits, bucket, "nearest")
        buckets = -(-count // bucket)
        area = q.data[8 * buckets:]
        assert area.size == -(-(-(-count * bits // 8)) // 8) * 8
        stream = np.unpackbits(area, bitorder="little")
        assert stream[:count * bits].sum() == (count - buckets) * bits
        assert not stream[count * bits:].any(), f"nonzero padding, count {count}"


# ---- memory safety ------------------------------------------------------------

def _guarded(nbytes, keep):
    """A uint8 array of `nbytes` that ends where an inaccessible page begins."""
    pages = -(-nbytes // mmap.PAGESIZE)
    region = mmap.mmap(-1, (pages + 1) * mmap.PAGESIZE)
    whole = np.frombuffer(region, np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    guard = ctypes.c_void_p(whole.ctypes.data + pages * mmap.PAGESIZE)
    assert libc.mprotect(guard, ctypes.c_size_t(mmap.PAGESIZE), 0) == 0  # PROT_NONE
    keep.append(region)
    return whole[pages * mmap.PAGESIZE - nbytes:pages * mmap.PAGESIZE]


def run_guarded_cases():
    """Runs the codec on buffers that end at an inaccessible page: a read or a
    write past any buffer's end kills the process. Prints each case first."""
    from qnccl import _lib
    ffi, lib = _lib.ffi(), _lib.lib()
    rng = np.random.default_rng(0)
    counts = list(range(1, 18)) + [63, 64, 65, 4095, 4096, 4097, 4103, 8193]
    for bits, bucket, count, dtype, rounding in itertools.product(
            range(1, 9), (1, 5, 128, 5000), counts, DTYPES, (0, 1)):
        print(f"bits={bits} bucket={bucket} count={count} {dtype} rounding={rounding}",
              flush=True)
        keep = []
        x = make_values(rng, count, dtype, bucket)
        src = _guarded(x.nbytes, keep)
        src[:] = storage_bits(x).view(np.uint8)
        size = emu.compressed_size(count, bits, bucket)
        packed, out = _guarded(size, keep), _guarded(x.nbytes, keep)
        config = ffi.new("qncclCodecConfig_t*", {"bits": bits, "bucketSize": bucket,
                                                 "rounding": rounding, "seed": 1})
        nccl_type = getattr(lib, {"float32": "ncclFloat32", "float16": "ncclFloat16",
                                  "bfloat16": "ncclBfloat16"}[dtype])
        pointer = lambda a: ffi.cast("void*", a.ctypes.data)  # noqa: E731
        _lib.check(lib.qncclQuantize(pointer(src), count, nccl_type, config, 7, pointer(packed),
                                     size, ffi.NULL))
        _lib.check(lib.qncclDequantize(pointer(packed), size, count, config, pointer(out),
                                       nccl_type, ffi.NULL))
        _lib.check(lib.qncclDequantizeAccumulate(pointer(packed), size, count, config,
                                                 pointer(out), nccl_type, ffi.NULL))
    print("all guarded cases passed")


def test_buffers_are_not_accessed_past_their_ends():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS_DIR.parent), os.environ.get("PYTHONPATH", "")]))
    child = "import test_codec; test_codec.run_guarded_cases()"
    result = subprocess.run([sys.executable, "-c", child], cwd=TESTS_DIR, env=env,
                            capture_output=True, text=True, timeout=600)
    last_case = (result.stdout.strip().splitlines() or ["(none)"])[-1]
    status = result.returncode
    assert status == 0, (
        f"exit status {status} (negative: killed by that signal; -11 is an access "
        f"past a buffer's end) in case: {last_case}\n{result.stderr[-3000:]}")
    assert last_case == "all guarded cases passed"


# ---- arguments rejected by the C API ------------------------------------------

class CodecCalls:
    """The C codec entry points with valid arguments, any of which a test replaces."""

    count = 16
    size = emu.compressed_size(count, 4, 8)  # 2 buckets: 16 bytes of metadata, 8 of codes

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib
        self.values = np.linspace(-1, 1, self.count, dtype=np.float32)
        self.packed = np.zeros(self.size, np.uint8)
        self.out = np.zeros(self.count, np.float32)

    def config(self, bits=4, bucket=8, rounding=0):
        return self.ffi.new("qncclCodecConfig_t*",
                            {"bits": bits, "bucketSize": bucket, "rounding": rounding})

    def _pointer(self, array):
        return self.ffi.cast("void*", array.ctypes.data)

    def quantize(self, **replace):
        args = dict(src=self._pointer(self.values), count=self.count,
                    datatype=self.lib.ncclFloat32, config=self.config(), stream=0,
                    dst=self._pointer(self.packed), dst_bytes=self.size)
        args.update(replace)
        return self.lib.qncclQuantize(args["src"], args["count"], args["datatype"],
                                      args["config"], args["stream"], args["dst"],
                                      args["dst_bytes"], self.ffi.NULL)

    def dequantize(self, accumulate=False, **replace):
        args = dict(src=self._pointer(self.packed), src_bytes=self.size, count=self.count,
                    config=self.config(), dst=self._pointer(self.out),
                    datatype=self.lib.ncclFloat32)
        args.update(replace)
        function = self.lib.qncclDequantizeAccumulate if accumulate else self.lib.qncclDequantize
        return function(args["src"], args["src_bytes"], args["count"], args["config"],
                        args["dst"], args["datatype"], self.ffi.NULL)

    def compressed_size(self, **replace):
        args = dict(count=self.count, config=self.config(), bytes=self.ffi.new("size_t*"))
        args.update(replace)
        return self.lib.qncclCompressedSize(args["count"], args["config"], args["bytes"])


NULL = object()  # stands for ffi.NULL in the table below

BAD_ARGUMENTS = {
    # case: (entry point, replaced arguments, words the message must contain)
    "quantize bits 0": ("quantize", dict(config=dict(bits=0)), ["bits", "1..8"]),
    "quantize bits 9": ("quantize", dict(config=dict(bits=9)), ["bits", "1..8"]),
    "dequantize bits 9": ("dequantize", dict(config=dict(bits=9)), ["bits", "1..8"]),
    "size bits 0": ("compressed_size", dict(config=dict(bits=0)), ["bits", "1..8"]),
    "quantize bucket 0": ("quantize", dict(config=dict(bucket=0)), ["bucketSize", ">= 1"]),
    "size bucket 0": ("compressed_size", dict(config=dict(bucket=0)), ["bucketSize", ">= 1"]),
    "accumulate bucket 0": ("accumulate", dict(config=dict(bucket=0)), ["bucketSize", ">= 1"]),
    "rounding 2": ("quantize", dict(config=dict(rounding=2)),
                   ["rounding", "qncclRoundNearest", "qncclRoundStochastic"]),
    "quantize src NULL": ("quantize", dict(src=NULL), ["src", "NULL"]),
    "quantize dst NULL": ("quantize", dict(dst=NULL), ["dst", "NULL"]),
    "dequantize src NULL": ("dequantize", dict(src=NULL), ["src", "NULL"]),
    "dequantize dst NULL": ("dequantize", dict(dst=NULL), ["dst", "NULL"]),
    "accumulate acc NULL": ("accumulate", dict(dst=NULL), ["acc", "NULL"]),
    "quantize ncclInt32": ("quantize", dict(datatype=2), ["datatype", "ncclFloat32",
                                                          "ncclFloat16", "ncclBfloat16"]),
    "quantize ncclFloat64": ("quantize", dict(datatype=8), ["datatype", "ncclFloat32"]),
    "quantize type 99": ("quantize", dict(datatype=99), ["datatype", "ncclFloat32"]),
    "dequantize ncclFloat64": ("dequantize", dict(datatype=8), ["datatype", "ncclBfloat16"]),
    "accumulate ncclUint8": ("accumulate", dict(datatype=1), ["datatype", "ncclFloat16"]),
    "dst too small": ("quantize", dict(dst_bytes=CodecCalls.size - 1),
                      ["dstBytes", str(CodecCalls.size)]),
    "src too small": ("dequantize", dict(src_bytes=CodecCalls.size - 8),
                      ["srcBytes", str(CodecCalls.size)]),
    "quantize config NULL": ("quantize", dict(config=NULL), ["config", "NULL"]),
    "dequantize config NULL": ("dequantize", dict(config=NULL), ["config", "NULL"]),
    "size config NULL": ("compressed_size", dict(config=NULL), ["config", "NULL"]),
    "size bytes NULL": ("compressed_size", dict(bytes=NULL), ["bytes", "NULL"]),
    "count too large": ("compressed_size", dict(count=2**64 - 1), ["count", "<="]),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_with_a_message_naming_them(capi, case):
    ffi, lib = capi
    calls = CodecCalls(ffi, lib)
    entry, replace, words = BAD_ARGUMENTS[case]
    replace = {name: ffi.NULL if value is NULL else calls.config(**value) if name == "config"
               else value for name, value in replace.items()}
    function = {"quantize": calls.quantize, "dequantize": calls.dequantize,
                "accumulate": lambda **r: calls.dequantize(accumulate=True, **r),
                "compressed_size": calls.compressed_size}[entry]
    assert lib.qncclGetVersion(ffi.NULL) == lib.ncclInvalidArgument  # an unrelated message first
    assert function() == lib.ncclSuccess
    assert function(**replace) == lib.ncclInvalidArgument == 4
    message = ffi.string(lib.qncclGetLastError()).decode()
    missing = [word for word in words if word not in message]
    assert not missing, f"{message!r} does not mention {missing}"


def test_python_api_refuses_what_the_library_would_in_python_terms():
    """The library's refusals (the table above) never reach a Python caller for an argument
    the Python API checks first: ValueError in its own words, not QncclError in C's."""
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match=r"^bits must be an integer in 1\.\.8, got 9$"):
        codec.quantize(x, bits=9)
    with pytest.raises(ValueError, match=r"^bucket_size must be an integer in 1\.\.2\*\*64-1"):
        codec.quantize(x, bucket_size=0)
    with pytest.raises(ValueError, match=r"^bits must be an integer in 1\.\.8, got 0$"):
        codec.compressed_size(10, 0, 8)


@pytest.mark.parametrize("call,error,words", [
    (lambda x: codec.quantize(x.astype(np.float64)), TypeError, "float32, float16 or bfloat16"),
    (lambda x: codec.quantize([1.0, 2.0]), TypeError, "float32, float16 or bfloat16"),
    (lambda x: codec.quantize(x.view(np.uint16)), TypeError, "dtype='bfloat16'"),
    (lambda x: codec.quantize(x, dtype="bfloat16"), TypeError, "float32, float16 or bfloat16"),
    (lambda x: codec.quantize(x, dtype="float64"), ValueError, "float32, float16, bfloat16"),
    (lambda x: codec.quantize(x, rounding="up"), ValueError, "one of nearest, stochastic"),
    (lambda x: codec.quantize(x, bits="4"), TypeError, "bits must be an integer"),
    (lambda x: codec.quantize(x, bucket_size=-1), ValueError, "bucket_size must be an integer"),
    (lambda x: codec.quantize(x, seed=-1), ValueError, "seed must be an integer"),
    (lambda x: codec.quantize(x, stream=2**64), ValueError, "stream"),
    (lambda x: codec.dequantize(x), TypeError, "QuantizedArray"),
])
def test_python_argument_errors_name_what_is_allowed(call, error, words):
    with pytest.raises(error, match=re.escape(words)):
        call(np.ones(16, np.float32))


BITS = "an integer in 1..8"
BUCKET = "an integer in 1..2**64-1"
UINT64 = "an integer in 0..2**64-1"
BLOCK = "0 (the default, 256) or a power of two in 2..16384"
VALUES = "a float32, float16 or bfloat16 array (bfloat16 as ml_dtypes.bfloat16, or uint16 bits"
CODEC_TYPES = "one of float32, float16, bfloat16"
WRITABLE = "a C-contiguous writable array (numpy, torch tensor or device array)"


def _q(x):
    return codec.quantize(x, 4, 8)


PYTHON_MESSAGES = {
    # case: (call on 16 float32 ones, error, argument, what is allowed, what was given)
    "size bucket 0": (lambda x: codec.compressed_size(10, 4, 0), ValueError,
                      "bucket_size", BUCKET, "0"),
    "size bucket -1": (lambda x: codec.compressed_size(10, 4, -1), ValueError,
                       "bucket_size", BUCKET, "-1"),
    "size bucket 2**64": (lambda x: codec.compressed_size(10, 4, 2**64), ValueError,
                          "bucket_size", BUCKET, str(2**64)),
    "size bucket float": (lambda x: codec.compressed_size(10, 4, 128.0), TypeError,
                          "bucket_size", BUCKET, "a float (128.0)"),
    "size bits 0": (lambda x: codec.compressed_size(10, 0, 8), ValueError, "bits", BITS, "0"),
    "size bits 9": (lambda x: codec.compressed_size(10, 9, 8), ValueError, "bits", BITS, "9"),
    "size bits str": (lambda x: codec.compressed_size(10, "4", 8), TypeError,
                      "bits", BITS, "a str ('4')"),
    "size count -1": (lambda x: codec.compressed_size(-1, 4, 8), ValueError,
                      "count", "an integer in 0..2**60-1", "-1"),
    "size count 2**60": (lambda x: codec.compressed_size(2**60, 4, 8), ValueError,
                         "count", "an integer in 0..2**60-1", str(2**60)),
    "size count list": (lambda x: codec.compressed_size([10], 4, 8), TypeError,
                        "count", "an integer in 0..2**60-1", "a list"),
    "bucket bool": (lambda x: codec.quantize(x, bucket_size=True), TypeError,
                    "bucket_size", BUCKET, "a bool (True)"),
    "bits numpy float": (lambda x: codec.quantize(x, bits=np.float32(4)), TypeError,
                         "bits", BITS, "a numpy.float32 scalar"),
    "rounding word": (lambda x: codec.quantize(x, rounding="up"), ValueError,
                      "rounding", "one of nearest, stochastic", "'up'"),
    "rounding None": (lambda x: codec.quantize(x, rounding=None), TypeError,
                      "rounding", "one of nearest, stochastic", "None"),
    "seed -1": (lambda x: codec.quantize(x, seed=-1), ValueError, "seed", UINT64, "-1"),
    "seed 2**64": (lambda x: codec.quantize(x, seed=2**64), ValueError,
                   "seed", UINT64, str(2**64)),
    "stream -1": (lambda x: codec.quantize(x, stream=-1), ValueError, "stream", UINT64, "-1"),
    "stream str": (lambda x: codec.quantize(x, stream="0"), TypeError,
                   "stream", UINT64, "a str ('0')"),
    "rotation word": (lambda x: codec.quantize(x, rotation="walsh"), ValueError,
                      "rotation", "one of none, hadamard, prerotated", "'walsh'"),
    "block 48": (lambda x: codec.quantize(x, rotation="hadamard", rotation_block=48),
                 ValueError, "rotation_block", BLOCK, "48"),
    "block 2**15": (lambda x: codec.quantize(x, rotation="hadamard", rotation_block=2**15),
                    ValueError, "rotation_block", BLOCK, "32768"),
    "block -2": (lambda x: codec.quantize(x, rotation="hadamard", rotation_block=-2),
                 ValueError, "rotation_block", BLOCK, "-2"),
    "block float": (lambda x: codec.quantize(x, rotation="hadamard", rotation_block=256.0),
                    TypeError, "rotation_block", BLOCK, "a float (256.0)"),
    "clip word": (lambda x: codec.quantize(x, rotation="hadamard", clip="max"), ValueError,
                  "clip", "one of none, gaussian", "'max'"),
    "array list": (lambda x: codec.quantize([1.0, 2.0]), TypeError, "array", VALUES, "a list"),
    "array tuple": (lambda x: codec.quantize((1.0, 2.0)), TypeError, "array", VALUES,
                    "a tuple"),
    "array int32": (lambda x: codec.quantize(x.astype(np.int32)), TypeError, "array", VALUES,
                    "an int32 numpy array"),
    "array int8": (lambda x: codec.quantize(x.astype(np.int8)), TypeError, "array", VALUES,
                   "an int8 numpy array"),
    "array uint8": (lambda x: codec.quantize(x.astype(np.uint8)), TypeError, "array", VALUES,
                    "a uint8 numpy array"),
    "array float64": (lambda x: codec.quantize(x.astype(np.float64)), TypeError, "array",
                      VALUES, "a float64 numpy array"),
    "array uint16 alone": (lambda x: codec.quantize(x.view(np.uint16)), TypeError, "array",
                           VALUES, "a uint16 numpy array"),
    "array str": (lambda x: codec.quantize("1.0"), TypeError, "array", VALUES,
                  "a str ('1.0')"),
    "dtype word": (lambda x: codec.quantize(x, dtype="float64"), ValueError,
                   "dtype", CODEC_TYPES, "'float64'"),
    "dtype numpy type": (lambda x: codec.quantize(x, dtype=np.int8), ValueError,
                         "dtype", CODEC_TYPES, "the numpy dtype int8"),
    "dtype int": (lambda x: codec.quantize(x, dtype=5), TypeError,
                  "dtype", CODEC_TYPES, "an int (5)"),
    "q list": (lambda x: codec.dequantize([1, 2]), TypeError,
               "q", "a QuantizedArray (from quantize)", "a list"),
    "q array": (lambda x: codec.dequantize_accumulate(x, x), TypeError,
                "q", "a QuantizedArray (from quantize)", "a float32 numpy array"),
    "dequantize dtype": (lambda x: codec.dequantize(_q(x), dtype="int8"), ValueError,
                         "dtype", CODEC_TYPES, "'int8'"),
    "out list": (lambda x: codec.dequantize(_q(x), out=[0.0] * 16), ValueError,
                 "out", WRITABLE, "a list"),
    "out read-only": (lambda x: codec.dequantize(_q(x), out=np.broadcast_to(x, (16,))),
                      ValueError, "out", WRITABLE, "a read-only float32 numpy array"),
    "out int32": (lambda x: codec.dequantize(_q(x), out=np.zeros(16, np.int32)), ValueError,
                  "out", "a float32, float16 or bfloat16 array", "an int32 numpy array"),
    "acc float16": (lambda x: codec.dequantize_accumulate(_q(x), np.zeros(16, np.float16)),
                    ValueError, "acc", "a float32 array", "a float16 numpy array"),
    "acc strided": (lambda x: codec.dequantize_accumulate(_q(x), np.zeros(32, np.float32)[::2]),
                    ValueError, "acc", WRITABLE, "a non-contiguous float32 numpy array"),
    "acc tuple": (lambda x: codec.dequantize_accumulate(_q(x), (0.0,) * 16), ValueError,
                  "acc", WRITABLE, "a tuple"),
    "rotate list": (lambda x: codec.rotate([1.0] * 8), TypeError, "array", VALUES, "a list"),
    "rotate seed": (lambda x: codec.rotate(x, seed=-1), ValueError, "seed", UINT64, "-1"),
    "rotate block": (lambda x: codec.rotate(x, rotation_block=3), ValueError,
                     "rotation_block", BLOCK, "3"),
    "rotate out float64": (lambda x: codec.rotate(x, out=np.zeros(16)), ValueError,
                           "out", "a float32 array", "a float64 numpy array"),
    "unrotate float16": (lambda x: codec.unrotate(x.astype(np.float16)), ValueError,
                         "values", "a float32 array (rotate's output)", "a float16 numpy array"),
    "unrotate list": (lambda x: codec.unrotate([0.0] * 8), ValueError,
                      "values", "a float32 array (rotate's output)", "a list"),
    "unrotate dtype": (lambda x: codec.unrotate(x, dtype="int8"), ValueError,
                       "dtype", CODEC_TYPES, "'int8'"),
}


@pytest.mark.parametrize("case", PYTHON_MESSAGES)
def test_python_messages_name_the_argument_the_range_and_the_type(case):
    """qnccl.codec refuses a bad argument itself, before the library sees it: the message
    names the argument as the Python API spells it, says what is allowed and what was given
    (its real type: a list is "a list", not the float64 array numpy makes of it), in
    English ("an int32", "a uint8"), and no C name (qncclCompressedSize, bucketSize,
    size_t) reaches the caller."""
    call, error, name, allowed, given = PYTHON_MESSAGES[case]
    with pytest.raises(error) as caught:
        call(np.ones(16, np.float32))
    assert_python_message(caught.value, name, allowed, given)


@pytest.mark.parametrize("make_target,words", [
    (lambda: np.zeros(32, np.float32)[::2], "C-contiguous writable"),
    (lambda: np.zeros(8, np.float32), "holds 8 values"),
    (lambda: np.zeros(16, np.float64), "must be a float32"),
    (lambda: np.frombuffer(np.zeros(16, np.float32).tobytes(), np.float32), "writable"),
])
def test_out_and_acc_must_be_writable_contiguous_and_fit(make_target, words):
    q = codec.quantize(np.ones(16, np.float32), 4, 8)
    with pytest.raises(ValueError, match=words):
        codec.dequantize(q, out=make_target())
    with pytest.raises(ValueError, match=words):
        codec.dequantize_accumulate(q, make_target())


def test_accumulator_is_float32_or_the_quantized_type():
    q = codec.quantize(np.ones(16, np.float32), 4, 8)
    with pytest.raises(ValueError, match="acc must be a float32 array"):
        codec.dequantize_accumulate(q, np.zeros(16, np.float16))
    q16 = codec.quantize(np.ones(16, np.uint16) * 0x3F80, 4, 8, dtype="bfloat16")
    acc = np.zeros(16, np.uint16)  # bfloat16 bits, like the data
    codec.dequantize_accumulate(q16, acc)
    assert np.all(acc == 0x3F80)


# ---- the Python API ------------------------------------------------------------

def test_quantized_array_describes_its_bytes():
    x = np.arange(32, dtype=np.float32).reshape(4, 8) % 16  # on the 4-bit grid of [0, 15]
    q = codec.quantize(x, bits=4, bucket_size=16, rounding="nearest", seed=3, stream=4)
    assert (q.count, q.shape, q.dtype, q.bits, q.bucket_size) == (32, (4, 8), "float32", 4, 16)
    assert (q.rounding, q.seed, q.stream, q.wire_version) == ("nearest", 3, 4, 2)
    assert q.nbytes == 2 * 8 + 16 and q.ratio == 128 / 32
    assert q.meta.tolist() == [[0, 15], [0, 15]]
    assert q.codes.tolist() == x.reshape(-1).astype(int).tolist()
    y = codec.dequantize(q)
    assert y.shape == (4, 8) and y.dtype == np.float32 and np.array_equal(y, x)


def test_non_contiguous_input_is_quantized_like_a_copy(rng):
    x = rng.standard_normal((64, 3)).astype(np.float32)
    assert_same_bytes(codec.quantize(x[:, 1], seed=2).data,
                      codec.quantize(np.ascontiguousarray(x[:, 1]), seed=2).data, "strided input")


def test_dequantize_into_out_of_another_type():
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    q = codec.quantize(x, 6, 32, "nearest")
    expected = emu.dequantize(q.data, 100, 6, 32, "bfloat16")
    for out in (np.empty(100, np.uint16), np.empty((10, 10), np.uint16)):
        assert codec.dequantize(q, dtype="bfloat16", out=out) is out
        assert_same_bytes(out, expected, "dequantize into bfloat16 bits")


def test_ml_dtypes_bfloat16_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = np.arange(0x3F00, 0x3F00 + 300, dtype=np.uint16)
    q = codec.quantize(bits.view(ml_dtypes.bfloat16), 3, 64, seed=5)
    assert q.dtype == "bfloat16"
    assert_same_bytes(q.data, codec.quantize(bits, 3, 64, seed=5, dtype="bfloat16").data,
                      "ml_dtypes bfloat16 input")
    y = codec.dequantize(q)
    assert y.dtype == ml_dtypes.bfloat16


def test_versions_agree():
    import qnccl
    assert qnccl.version() == qnccl.__version__ == "0.1.0"


def test_missing_library_names_the_fix(monkeypatch):
    from qnccl import _lib
    monkeypatch.setenv("QNCCL_LIB", "/nonexistent/libqnccl.so")
    with pytest.raises(OSError, match="QNCCL_LIB names it; point QNCCL_LIB at the file, or unset"):
        _lib._bindings().load_library()


def test_import_needs_neither_the_library_nor_torch():
    code = ("import sys, qnccl, qnccl.emulate; assert qnccl.__version__ == '0.1.0'; "
            "assert not {'torch', 'mpi4py', 'cffi'} & set(sys.modules), sorted(sys.modules)")
    env = dict(os.environ, QNCCL_LIB="/nonexistent/libqnccl.so", QNCCL_CDEF="/nonexistent.h",
               PYTHONPATH=str(TESTS_DIR.parent))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    result = subprocess.run([sys.executable, "-c", "import qnccl; qnccl.version()"], env=env,
                            capture_output=True, text=True)
    assert "/nonexistent.h does not exist: QNCCL_CDEF names it" in result.stderr


def test_cubic_cells_match_their_definition_for_every_float(tmp_path):
    """The encoder finds a value's cubic-grid cell from a cube-root estimate and one comparison
    of exact cubes, not by the binary search docs/wire-format.md defines: programs/
    cube_root_check.cc compares both for every float w in [0, 2^24), the whole range a bucket's
    values scale to (and, below 2^13, the estimate without its Newton step that three and four
    bits use). Compiled as the library is (IEEE operations, no contraction)."""
    run = run_math_program(tmp_path, "cube_root_check", timeout=300)
    assert run.returncode == 0, run.stdout
    assert ("1266679808 values checked: cube_floor wrong 0, cube_floor_small wrong 0, "
            "nearest wrong 0") in run.stdout


def test_gpu_bucket_params_match_the_host_codecs(tmp_path):
    """The kernels derive a bucket's parameters for its grid alone (bucket_params_of_grid: no
    divisions for the other grid, the decoder none for inverses), the host codec for both
    grids without branches: every field the applying grid's encoder or decoder reads must hold
    the same bits (programs/bucket_params_check.cc: 191,844 metadata pairs at 8 widths, with
    and without the inverses, with the cubic grid allowed and not (a rotated call's): 6,139,008
    cases)."""
    run = run_math_program(tmp_path, "bucket_params_check", timeout=60)
    assert run.returncode == 0, run.stdout
    assert "6139008 cases checked: 0 fields differ" in run.stdout


def run_math_program(tmp_path, name, timeout):
    """tests/programs/NAME.cc, a check of codec_math.h compiled as the library is (IEEE
    operations, no contraction), run: its completed process."""
    exe = tmp_path / name
    repo = TESTS_DIR.parent
    subprocess.run([os.environ.get("CXX", "g++"), "-std=c++17", "-O3", "-ffp-contract=off",
                    f"-I{repo / 'src'}", f"-I{repo / 'src' / 'include'}",
                    str(TESTS_DIR / "programs" / f"{name}.cc"), "-o", str(exe)],
                   check=True, timeout=120)
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)


# ---- device arrays ---------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_device_arrays_match_host_arrays(rng, dtype):
    cupy = pytest.importorskip("cupy")
    x = make_values(rng, 10_000, dtype, 128)
    q = codec.quantize(x, 4, 128, "stochastic", seed=1, stream=2, dtype=dtype)
    q_device = codec.quantize(cupy.asarray(x), 4, 128, "stochastic", seed=1, stream=2,
                              dtype=dtype)
    assert_same_bytes(q_device.data.get(), q.data, "device quantize")
    assert_same_bytes(codec.dequantize(q_device).get(), codec.dequantize(q), "device dequantize")
    acc = make_values(rng, 10_000, dtype, 128)
    acc_device = cupy.asarray(acc)
    codec.dequantize_accumulate(q, acc)
    codec.dequantize_accumulate(q_device, acc_device)
    assert_same_bytes(acc_device.get(), acc, "device accumulate")
