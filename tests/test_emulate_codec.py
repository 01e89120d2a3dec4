"""The numpy emulator (qnccl.emulate.codec) against independent references:
numpy's float16, exact float64 rounding, known splitmix64 outputs, bit-by-bit
Python loops and the formulas of docs/wire-format.md. No library needed."""
import numpy as np
import pytest

from conftest import F32_MAX, F32_TINY, assert_python_message, widen
import qnccl.emulate as emulate
from qnccl.emulate import codec as emu
from qnccl.emulate import rotation as rot


def f32(*values):
    return np.array(values, np.float32)


def f32_bit_patterns(rng, count):
    """Random float32 bit patterns plus the rounding boundaries of float16 and bfloat16."""
    random = rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0x00000000, 0x80000000, 0x33000000, 0x33000001, 0x337FFFFF, 0x38800000,
                      0x387FF000, 0x387FE000, 0x387FFFFF, 0x477FE000, 0x477FEFFF, 0x477FF000,
                      0x7F7F8000, 0x7F7F7FFF, 0x7F7FFFFF, 0x3F808000, 0x3F818000, 0x7F800000,
                      0xFF800000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF], np.uint32)
    return np.concatenate([random, edges]).view(np.float32)


# ---- 16-bit conversions (src/codec/dtype.h) --------------------------------

def test_float16_widening_is_exact_for_every_pattern():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    got = emu.f16_to_f32(bits)
    expected = bits.view(np.float16).astype(np.float32)
    finite = np.isfinite(expected)
    assert np.array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    assert np.array_equal(got[np.isinf(expected)], expected[np.isinf(expected)])


def test_float16_narrowing_rounds_to_nearest_even(rng):
    x = np.concatenate([f32_bit_patterns(rng, 500_000),
                        (rng.standard_normal(200_000) * 2.0**-18).astype(np.float32)])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    got = emu.f32_to_f16(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], expected[~nan])
    assert np.all(got[nan] == 0x7E00)


def test_bfloat16_conversions_round_to_nearest_even(rng):
    x = f32_bit_patterns(rng, 500_000)
    got = emu.f32_to_bf16(x)
    # Reference: the nearer of the two bfloat16 neighbours in exact float64,
    # the one with an even last bit on a tie.
    down = (x.view(np.uint32) >> 16).astype(np.uint16)
    up = down + np.uint16(1)
    with np.errstate(invalid="ignore", over="ignore"):
        d_down = np.abs(widen(down, "bfloat16") - x.astype(np.float64))
        d_up = np.abs(widen(up, "bfloat16") - x.astype(np.float64))
    expected = np.where((d_up < d_down) | ((d_up == d_down) & (down & 1 == 1)), up, down)
    finite = np.isfinite(x) & (np.abs(x) <= widen(np.uint16(0x7F7F), "bfloat16"))
    assert np.array_equal(got[finite], expected[finite])
    nan = np.isnan(x)
    assert np.all(got[nan] == 0x7FC0)
    # above the largest bfloat16 the halfway point decides between max and infinity
    assert emu.f32_to_bf16(f32(F32_MAX, -F32_MAX, np.inf)).tolist() == [0x7F80, 0xFF80, 0x7F80]
    assert np.array_equal(emu.bf16_to_f32(expected[finite]).astype(np.float64),
                          widen(expected[finite], "bfloat16"))


def test_float16_subnormal_path_uses_the_float32_add_of_one_half():
    # 2^-25 is half a float16 subnormal step: ties to even (0); just above it rounds up
    halfway = f32(2.0**-25, np.nextafter(np.float32(2.0**-25), np.float32(1)), 3 * 2.0**-25,
                  -(2.0**-25), 2.0**-14 - 2.0**-25)
    assert emu.f32_to_f16(halfway).tolist() == [0x0000, 0x0001, 0x0002, 0x8000, 0x0400]


# ---- random numbers (src/codec/rng.h) --------------------------------------

def test_mix64_is_the_splitmix64_finalizer():
    golden = 0x9E3779B97F4A7C15
    outputs = [int(emu._mix64(np.uint64(k * golden % 2**64))) for k in (1, 2, 3)]
    # the first outputs of splitmix64 seeded with 0
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def _uniform_reference(seed, stream, i):
    """rng_uniform written with Python integers, one value at a time."""
    mask64, mask32 = 2**64 - 1, 2**32 - 1

    def mix64(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask64
        return z ^ (z >> 31)

    def hash32(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & mask32
        x ^= x >> 15
        x = (x * 0x846CA68B) & mask32
        return x ^ (x >> 16)

    key = mix64(seed ^ mix64(stream))
    h = hash32(((i & mask32) * ((key & mask32) | 1) + ((key >> 32) ^ (i >> 32))) & mask32)
    return (h >> 8) / 2.0**24


@pytest.mark.parametrize("seed,stream", [(0, 0), (1, 0), (0, 1), (2**64 - 1, 2**63 + 5),
                                         (12345, 2**32)])
def test_rng_uniform_matches_the_integer_formula(seed, stream):
    index = np.array([0, 1, 2, 255, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**64 - 1],
                     np.uint64)
    got = emu.rng_uniform(seed, stream, index)
    assert got.dtype == np.float32
    assert got.tolist() == [_uniform_reference(seed, stream, int(i)) for i in index]


def test_rng_uniform_is_uniform_and_streams_are_uncorrelated():
    n = 200_000
    index = np.arange(n, dtype=np.uint64)
    u = emu.rng_uniform(7, 0, index)
    assert u.min() >= 0 and u.max() < 1
    assert np.all(u * np.float32(2**24) == np.floor(u * np.float32(2**24)))  # 24-bit grid
    histogram = np.bincount((u * 16).astype(int), minlength=16)
    chi2 = ((histogram - n / 16) ** 2 / (n / 16)).sum()
    assert chi2 < 50  # 15 degrees of freedom: p(chi2 > 50) < 1e-5
    sd = 1 / np.sqrt(n)  # of a correlation coefficient of independent samples
    for other in (emu.rng_uniform(7, 1, index), emu.rng_uniform(8, 0, index),
                  emu.rng_uniform(7, 0, index + np.uint64(2**32))):
        assert abs(np.corrcoef(u, other)[0, 1]) < 5 * sd
        assert np.mean(u == other) < 1e-3
    # Neighbours within a stream: no serial correlation at small lags, and
    # the pairs (u[i], u[i+1]) fill a 4 x 4 grid evenly.
    for lag in (1, 2, 3, 8, 128):
        assert abs(np.corrcoef(u[:-lag], u[lag:])[0, 1]) < 5 * sd
    pairs = np.bincount((u[:-1] * 4).astype(int) * 4 + (u[1:] * 4).astype(int), minlength=16)
    chi2 = ((pairs - (n - 1) / 16) ** 2 / ((n - 1) / 16)).sum()
    assert chi2 < 50


@pytest.mark.parametrize("seed", [0, 1, 2**63])
def test_streams_of_consecutive_ids_are_uncorrelated(seed):
    """The collectives number their streams (call, segment, rank, step): the
    uniforms of many streams at the same index are as independent as those
    of one stream along its indices."""
    streams = np.arange(4096, dtype=np.uint64)
    index = np.arange(64, dtype=np.uint64)
    keys = emu.rng_key(np.uint64(seed), streams)
    u = emu.uniform_from_key(keys[:, None], index[None, :])  # (streams, index)
    n = u.shape[0]
    sd = 1 / np.sqrt(n)
    for i in range(0, 64, 7):
        assert abs(np.corrcoef(u[:, i], u[:, i + 1 if i < 63 else 0])[0, 1]) < 5 * sd
    for a, b in ((0, 1), (1, 2), (0, 4095)):
        assert abs(np.corrcoef(u[a], u[b])[0, 1]) < 5 / np.sqrt(u.shape[1])
    histogram = np.bincount((u[:, 5] * 16).astype(int), minlength=16)
    chi2 = ((histogram - n / 16) ** 2 / (n / 16)).sum()
    assert chi2 < 50


# ---- the code bit stream ---------------------------------------------------

def _pack_reference(codes, bits):
    """docs/wire-format.md, bit by bit: bit j of the stream is bit j % 8 of byte j // 8."""
    stream = bytearray(emu.code_bytes(len(codes), bits))
    for i, code in enumerate(codes):
        for k in range(bits):
            j = i * bits + k
            stream[j // 8] |= ((int(code) >> k) & 1) << (j % 8)
    return np.frombuffer(bytes(stream), np.uint8)


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_and_unpack_follow_the_bit_stream(rng, bits):
    for count in list(range(0, 42)) + [255, 1001]:
        codes = rng.integers(0, 2**bits, count).astype(np.uint8)
        packed = emu.pack_codes(codes, bits)
        assert np.array_equal(packed, _pack_reference(codes, bits)), count
        assert packed.size % 8 == 0
        assert np.array_equal(emu.unpack_codes(packed, count, bits), codes)
        # values 8g..8g+7 fill bytes g*b..g*b+b-1
        for g in range(count // 8):
            group = emu.pack_codes(codes[8 * g:8 * g + 8], bits)[:bits]
            assert np.array_equal(packed[g * bits:(g + 1) * bits], group)


def test_pack_rejects_codes_wider_than_bits():
    with pytest.raises(ValueError, match="0..7"):
        emu.pack_codes(np.array([1, 8], np.uint8), 3)


# ---- sizes and bucket parameters -------------------------------------------

@pytest.mark.parametrize("count,bits,bucket,expected", [
    (0, 4, 128, 0), (1, 1, 1, 8 + 8), (128, 4, 128, 72), (128, 4, 1024, 72),
    (1024, 4, 1024, 520), (9, 8, 4, 24 + 16), (2**20, 4, 128, 8 * 8192 + 2**19)])
def test_compressed_size(count, bits, bucket, expected):
    assert emu.compressed_size(count, bits, bucket) == expected


@pytest.mark.parametrize("bits,bucket,rounding,message", [
    (0, 8, "nearest", r"bits must be an integer in 1\.\.8, got 0"),
    (9, 8, "nearest", r"bits must be an integer in 1\.\.8, got 9"),
    (4, 0, "nearest", r"bucket_size must be an integer in 1\.\.2\*\*64-1, got 0"),
    (4, 8, "up", "rounding must be one of nearest, stochastic, got 'up'")])
def test_bad_configuration_is_named(bits, bucket, rounding, message):
    with pytest.raises(ValueError, match=message):
        emu.quantize(f32(1, 2), bits, bucket, rounding)


VALUES = "a float32, float16 or bfloat16 array (bfloat16 as ml_dtypes.bfloat16, or uint16 bits"


@pytest.mark.parametrize("call, error, name, allowed, given", [
    (lambda: emu.quantize([1.0, 2.0], 4, 8, "nearest"), TypeError, "array", VALUES, "a list"),
    (lambda: emu.quantize(f32(1, 2).astype(np.int32), 4, 8, "nearest"), TypeError, "array",
     VALUES, "an int32 numpy array"),
    (lambda: emu.quantize(f32(1, 2), 4.0, 8, "nearest"), TypeError, "bits",
     "an integer in 1..8", "a float (4.0)"),
    (lambda: emu.compressed_size(-1, 4, 8), ValueError, "count", "an integer in 0..2**60-1",
     "-1"),
    (lambda: emu.dequantize([0] * 16, 2, 4, 8), TypeError, "buf",
     "a uint8 numpy array or a bytes-like object", "a list"),
    (lambda: emu.dequantize(np.zeros(16, np.uint8), 2, 4, 8, dtype="int8"), ValueError, "dtype",
     "one of float32, float16, bfloat16", "'int8'"),
    (lambda: emu.dequantize_accumulate(np.zeros(16, np.uint8), 2, 4, 8, [0.0, 0.0]),
     ValueError, "acc", "a C-contiguous writable numpy array", "a list"),
    (lambda: emu.rng_uniform(-1, 0, 0), ValueError, "seed", "an integer in 0..2**64-1", "-1"),
    (lambda: emu.rng_uniform(0, 2**64, 0), ValueError, "stream", "an integer in 0..2**64-1",
     str(2**64)),
    (lambda: emulate.stream_id(0, 0, 2**32, 0), ValueError, "rank", "an integer in 0..2**32-1",
     str(2**32)),
    (lambda: rot.rotate([1.0, 2.0], 2, 0), ValueError, "x", "a float32 array", "a list"),
    (lambda: rot.rotate(f32(1, 2), 3, 0), ValueError, "block", "a power of two in 2..16384",
     "3"),
    (lambda: emulate.allreduce([[1.0], [2.0]]), TypeError, "inputs[0]", VALUES, "a list"),
    (lambda: emulate.allreduce([f32(1)] * 2, seed=-1), ValueError, "seed",
     "an integer in 0..2**64-1", "-1"),
    (lambda: emulate.allreduce([f32(1)] * 2, segment_values=-1), ValueError, "segment_values",
     "0 (the default, 2**22) or an integer in 1..2**64-1", "-1"),
    (lambda: emulate.allgather([f32(1)] * 2, call=-1), ValueError, "call",
     "an integer in 0..2**64-1", "-1"),
    (lambda: emulate.sendrecv(f32(1), 2, 0, 2), ValueError, "rank", "an integer in 0..1", "2"),
    (lambda: emulate.sendrecv([1.0], 0, 1, 2), TypeError, "x", VALUES, "a list"),
    (lambda: emulate.EmulatedAllReduce(0), ValueError, "nranks", "an integer >= 1", "0"),
    (lambda: emulate.EmulatedAllReduce(2, error_feedback=1), TypeError, "error_feedback",
     "True or False", "an int (1)"),
    (lambda: emulate.EmulatedAllReduce(2, warmup_calls=-1), ValueError, "warmup_calls",
     "an integer >= 0", "-1"),
])
def test_emulator_messages_name_the_argument_the_range_and_the_type(call, error, name, allowed,
                                                                   given):
    """qnccl.emulate's public functions refuse bad arguments as qnccl.codec does: the
    argument's name, what is allowed, what was given (its real type)."""
    with pytest.raises(error) as caught:
        call()
    assert_python_message(caught.value, name, allowed, given)


def test_bucket_params_follow_the_doc():
    lo = f32(0, -3, 5, -F32_MAX, 0, 1e-40, 0, -8)
    hi = f32(15, 4.5, 5, F32_MAX, 16 * F32_TINY, np.float32(1e-40) + 30 * F32_TINY, F32_TINY, 0)
    p = emu.bucket_params(lo, hi, 4)
    cubic = [False, True, False, True, False, False, False, True]
    assert p["cubic"].tolist() == cubic
    uniform = ~p["cubic"]
    assert p["sigma"][uniform].tolist() == [1, 1, 1, 1, 1]
    # a subnormal step of a non-constant bucket is raised to 2^-126, also one
    # that rounds to 0 (the last); only the constant bucket keeps step 0
    assert p["step"][uniform].tolist() == [1, 0, 2.0**-126, 2.0**-126, 2.0**-126]
    assert p["inv"][uniform].tolist() == [1, 0, 2.0**126, 2.0**126, 2.0**126]
    assert p["a"][uniform].tolist() == [0, 5, 0, np.float32(1e-40), 0]
    # cubic: [-3, 4.5]: L*B/(A+B) = 6, w(6) = max(3/6, 4.5/9) = 0.5 < w(7) = 4.5/8, so z = 6;
    # [-M, M]: 7.5 -> w(7) = w(8) = M/7, a tie: the smaller; [-8, 0]: no code above zero
    m = np.float32(F32_MAX)
    assert p["zero"][p["cubic"]].tolist() == [6, 7, 15]
    assert p["span_pos"][p["cubic"]].tolist() == [9, 8, 0]
    assert p["unit_neg"][p["cubic"]].tolist() == [np.float32(3) / np.float32(216), m / np.float32(343),
                                                  np.float32(8) / np.float32(3375)]
    assert p["unit_pos"][p["cubic"]].tolist() == [np.float32(4.5) / np.float32(729),
                                                  m / np.float32(512),
                                                  np.float32(8) / np.float32(3375)]
    assert p["inv_unit_neg"][1] == np.float32(1) / p["unit_neg"][1]
    assert all(v.dtype == np.float32 for k, v in p.items() if k != "cubic")


def test_cubic_levels_are_cubes_of_the_code_distance_from_zero():
    """At 4 bits [-3, 4.5] has z = 6: codes 0..6 are -3 (m/6)^3, codes 6..15 4.5 (m/9)^3."""
    p = emu.bucket_params(np.float32(-3), np.float32(4.5), 4)
    levels = emu.decode_values(np.arange(16, dtype=np.float32), p).astype(np.float64)
    m = np.arange(16) - 6
    expected = np.where(m < 0, -3 * (-m / 6.0) ** 3, 4.5 * (m / 9.0) ** 3)
    assert np.allclose(levels, expected, rtol=2**-22, atol=0)
    assert levels[6] == 0 and levels[0] == -3 and levels[15] == 4.5
    # a value between levels 1 and 2 above zero: w = x / unit+ = 4 lies in [1, 8): frac 3/7
    x = np.float32(4 * 4.5 / 729)
    assert emu.decode_values(emu.encode_values(x, p), p) == levels[7]  # 3/7 < 1/2: down
    u = np.array([0.42, 0.43], np.float32)  # up iff u < 3/7 = 0.4286
    assert emu.encode_values(np.full(2, x), p, u).tolist() == [8, 7]


# ---- quantize / dequantize -------------------------------------------------

def test_known_bytes_of_a_small_chunk():
    # bucket 0: min 0, max 3 (step 1 at 2 bits); bucket 1: constant 5
    x = f32(0, 1, 2, 3, 2.5, 1.5, 5, 5)
    buf = emu.quantize(x, 2, 6, "nearest")
    meta = np.frombuffer(f32(0, 3, 5, 5).tobytes(), np.uint8)
    # codes 0,1,2,3,2,2 (2.5 and 1.5 tie to even), 0,0 -> 0b10_11_10_01_00 etc.
    codes = [0b11100100, 0b00001010, 0, 0, 0, 0, 0, 0]
    assert buf.tolist() == meta.tolist() + codes
    assert emu.dequantize(buf, 8, 2, 6).tolist() == [0, 1, 2, 3, 2, 2, 5, 5]


def test_stochastic_rounding_compares_u_with_the_fraction():
    x = f32(0, 4, 1.25, 2.5, 3.75, 0.5)
    buf = emu.quantize(x, 2, 6, "stochastic", seed=3, stream=9)
    t = np.array([0, 3, 0.9375, 1.875, 2.8125, 0.375], np.float32)  # (x - 0) * (3 / 4)
    u = emu.rng_uniform(3, 9, np.arange(6, dtype=np.uint64))
    expected = np.floor(t) + (u < t - np.floor(t))
    assert emu.unpack_codes(buf[8:], 6, 2).tolist() == expected.tolist()


def test_emulator_handles_a_million_values(rng):
    x = rng.standard_normal(2**20).astype(np.float32)
    buf = emu.quantize(x, 4, 128, "stochastic", seed=1, stream=2)
    assert buf.size == emu.compressed_size(x.size, 4, 128)
    y = emu.dequantize(buf, x.size, 4, 128)
    step = emu.grid_step(emu.bucket_params(*emu.read_meta(buf, x.size, 128).T, 4))
    assert np.all(np.abs(y - x) < np.repeat(step, 128) * 1.0001)


def test_accumulate_requires_a_writable_contiguous_array():
    buf = emu.quantize(f32(1, 2, 3, 4), 4, 4, "nearest")
    with pytest.raises(ValueError, match="C-contiguous writable"):
        emu.dequantize_accumulate(buf, 2, 4, 4, np.zeros(4, np.float32)[::2])
    with pytest.raises(TypeError, match="bfloat16"):
        emu.dequantize_accumulate(buf, 4, 4, 4, np.zeros(4, np.float64))
