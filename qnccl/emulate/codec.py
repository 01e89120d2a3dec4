"""Numpy reference of the QNCCL codec: docs/wire-format.md, step by step.

The library (host codec and CUDA kernels) and this module produce the same
bytes for the same input, configuration and random stream; the tests hold the
library to it. Every formula is evaluated as the doc states it: float32
operations in the written order (numpy float32 arrays and np.float32 scalars
only, so nothing is promoted to float64), np.rint for round-to-nearest-even,
wrapping uint32/uint64 arithmetic for the random numbers, and the 16-bit
conversions written bit by bit as in src/codec/dtype.h.

Arrays of three element types are read and written:
    "float32"   numpy float32
    "float16"   numpy float16, or uint16 bits with dtype="float16"
    "bfloat16"  ml_dtypes.bfloat16, or uint16 bits with dtype="bfloat16"
"""
from __future__ import annotations

import operator

import numpy as np

from .. import _checks

F32 = np.float32
WIRE_VERSION = 2  # the version of docs/wire-format.md implemented here
DTYPES = ("float32", "float16", "bfloat16")
ROUNDINGS = _checks.ROUNDINGS
# "auto": each bucket's grid from its metadata (cubic where it applies); "uniform": every
# bucket on the uniform grid (a rotated call's buckets, docs/rotation.md)
GRIDS = ("auto", "uniform")
# a rotated call's bucket ranges: "none" the whole [min, max], "gaussian" clipped (clip_range)
CLIPS = _checks.CLIPS
MIN_BITS, MAX_BITS = _checks.MIN_BITS, _checks.MAX_BITS
META_BYTES = 8  # per bucket: float32 min, float32 max
CODE_ALIGN = 8  # the code area is padded to a multiple of this many bytes

CANONICAL_NAN_BITS = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
_NAN32 = np.array(CANONICAL_NAN_BITS["float32"], np.uint32).view(F32)[()]
_TWO_POW_126 = F32(2.0**126)
_TWO_POW_MINUS_126 = F32(2.0**-126)
_TWO_POW_MINUS_24 = F32(2.0**-24)
_DTYPE_HELP = ("a float32, float16 or bfloat16 array (bfloat16 as ml_dtypes.bfloat16, or "
               "uint16 bits with dtype='bfloat16'; float16 bits likewise with dtype='float16')")


# ---- configuration and sizes (docs/wire-format.md, Parameters and Layout) ----

def check_config(bits, bucket_size, rounding=None):
    """Raises ValueError/TypeError naming the argument and its allowed values."""
    _checks.bits(bits)
    _checks.bucket_size(bucket_size)
    if rounding is not None:
        _checks.rounding(rounding)


def _ceil_div(a, b):
    return -(-a // b)


def num_buckets(count, bucket_size):
    return _ceil_div(count, bucket_size)


def code_bytes(count, bits):
    """C = ceil(n*b / 8) rounded up to a multiple of 8."""
    return _ceil_div(_ceil_div(count * bits, 8), CODE_ALIGN) * CODE_ALIGN


def compressed_size(count, bits, bucket_size):
    """Bytes of a quantized chunk of `count` values: 8*nb + C."""
    check_config(bits, bucket_size)
    count = _checks.count(count)
    return num_buckets(count, bucket_size) * META_BYTES + code_bytes(count, bits)


# ---- element types: src/codec/dtype.h, bit by bit ----------------------------

def _f32_bits(x):
    return np.asarray(x, F32).view(np.uint32)


def _bits_f32(u):
    return np.asarray(u, np.uint32).view(F32)


def f16_to_f32(h):
    """float16 bits (uint16) -> float32, exact; NaN keeps its payload."""
    h = np.asarray(h, np.uint16).astype(np.uint32)
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    special = np.uint32(0x7F800000) | (man << 13)
    normal = ((exp + (127 - 15)) << 23) | (man << 13)
    subnormal = _f32_bits(man.astype(F32) * _TWO_POW_MINUS_24)  # man * 2^-24, exact
    bits = np.where(exp == 0x1F, special, np.where(exp != 0, normal, subnormal))
    return _bits_f32(bits | sign)


def f32_to_f16(f):
    """float32 -> float16 bits (uint16), round to nearest even, NaN -> 0x7E00."""
    x = _f32_bits(f)
    sign = (x >> 16) & 0x8000
    x = x & 0x7FFFFFFF
    with np.errstate(invalid="ignore", over="ignore"):
        # below 2^-14: adding 0.5 puts the binary point at 2^-24, the float16
        # subnormal step, and the float32 add rounds to nearest even there
        subnormal = _f32_bits(_bits_f32(x) + F32(0.5)) - np.uint32(0x3F000000)
        odd = (x >> 13) & 1
        rebias = np.uint32(((15 - 127) << 23) & 0xFFFFFFFF)  # uint32 wrapping, as in C
        normal = (x + rebias + np.uint32(0xFFF) + odd) >> 13
    bits = np.where(x < 0x38800000, sign | subnormal, sign | normal)
    bits = np.where(x >= 0x477FF000, sign | 0x7C00, bits)  # >= 65520 rounds to inf
    bits = np.where(x > 0x7F800000, CANONICAL_NAN_BITS["float16"], bits)
    return (bits & 0xFFFF).astype(np.uint16)


def bf16_to_f32(h):
    """bfloat16 bits (uint16) -> float32, exact."""
    return _bits_f32(np.asarray(h, np.uint16).astype(np.uint32) << 16)


def f32_to_bf16(f):
    """float32 -> bfloat16 bits (uint16), round to nearest even, NaN -> 0x7FC0."""
    x = _f32_bits(f)
    with np.errstate(over="ignore"):
        rounded = (x + np.uint32(0x7FFF) + ((x >> 16) & 1)) >> 16
    bits = np.where((x & 0x7FFFFFFF) > 0x7F800000, CANONICAL_NAN_BITS["bfloat16"], rounded)
    return bits.astype(np.uint16)


def storage_dtype(name):
    """The numpy dtype that holds values of codec type `name`: bfloat16 is
    ml_dtypes.bfloat16 when ml_dtypes is installed, else its uint16 bits."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return np.dtype(np.uint16)
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


_NUMPY = object()  # dtype_name's source: a numpy array of array_dtype


def dtype_name(array_dtype, dtype=None, what="array", source=_NUMPY):
    """The codec type of an array whose numpy dtype is `array_dtype`; `dtype`
    (a name) is required for uint16 bits and must agree with typed arrays. `what`
    names the array in messages, `source` is the object that was handed in (described
    in the message: "a list", "a torch.Tensor of dtype torch.int32"; default a numpy array
    of `array_dtype`)."""
    if dtype is not None:
        dtype = _checks.dtype(dtype, DTYPES)
    actual = np.dtype(array_dtype)
    if actual.name in DTYPES and dtype in (None, actual.name):
        return actual.name
    if actual == np.uint16 and dtype in ("float16", "bfloat16"):
        return dtype
    given = (f"{_checks.with_article(actual.name)} numpy array" if source is _NUMPY
             else _checks.describe(source))
    with_dtype = f" with dtype={dtype!r}" if dtype is not None else ""
    raise TypeError(f"{what} must be {_DTYPE_HELP}, got {given}{with_dtype}")


def to_float32(values, name):
    """Values of codec type `name` (an array of its storage or uint16 bits) widened to float32."""
    if name == "float32":
        return np.asarray(values, F32)
    bits = np.asarray(values).view(np.uint16)
    return f16_to_f32(bits) if name == "float16" else bf16_to_f32(bits)


def from_float32(values, name):
    """float32 values stored as codec type `name`, in storage_dtype(name)."""
    if name == "float32":
        return np.asarray(values, F32)
    bits = f32_to_f16(values) if name == "float16" else f32_to_bf16(values)
    return bits.view(storage_dtype(name))


def as_float32(array, dtype=None, what="array"):
    """A flat float32 copy (or view) of `array` (named `what` in messages) and its codec
    type name."""
    source = array
    array = np.asarray(array)
    name = dtype_name(array.dtype, dtype, what, source)
    return to_float32(np.ascontiguousarray(array).reshape(-1), name), name


# ---- random numbers of stochastic rounding (src/codec/rng.h) ------------------

def _mix64(z):
    z = np.asarray(z, np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash32(x):
    x = np.asarray(x, np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def _uint64(name, value):
    return np.uint64(_checks.uint64(name, value))


def rng_key(seed, stream):
    """key = mix64(seed ^ mix64(stream)) of rng_uniform (arrays of streams: arrays of keys)."""
    return _mix64(np.uint64(seed) ^ _mix64(np.asarray(stream, np.uint64)))


def uniform_from_key(key, index):
    """rng_uniform from its key; key and index broadcast against each other."""
    key = np.asarray(key, np.uint64)
    k0 = (key & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    k1 = (key >> np.uint64(32)).astype(np.uint32)
    i = np.asarray(index, np.uint64)
    i_lo = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    i_hi = (i >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        h = _hash32(i_lo * (k0 | np.uint32(1)) + (k1 ^ i_hi))
    return (h >> np.uint32(8)).astype(F32) * _TWO_POW_MINUS_24


def rng_uniform(seed, stream, index):
    """u of the values at `index` (their positions in the quantize call), float32 in [0, 1):

        key = mix64(seed ^ mix64(stream));  k0 = key mod 2^32;  k1 = key >> 32
        h   = hash32((i mod 2^32) * (k0 | 1) + (k1 ^ (i >> 32)))
        u   = (h >> 8) * 2^-24
    """
    return uniform_from_key(rng_key(_uint64("seed", seed), _uint64("stream", stream)), index)


# ---- the code bit stream (docs/wire-format.md, Layout: Codes) -----------------

def pack_codes(codes, bits):
    """The code area of `codes`: code i at bits [i*b, (i+1)*b) of an LSB-first
    bit stream, zero bits after the last code, zero bytes up to a multiple of 8."""
    check_config(bits, 1)
    codes = np.asarray(codes, np.uint8).reshape(-1)
    if codes.size and int(codes.max()) >= 1 << bits:
        raise ValueError(f"codes must be 0..{(1 << bits) - 1} at {bits} bits, "
                         f"got {int(codes.max())}")
    stream_bits = (codes[:, None] >> np.arange(bits, dtype=np.uint8)) & 1
    stream = np.packbits(stream_bits.reshape(-1), bitorder="little")
    area = np.zeros(code_bytes(codes.size, bits), np.uint8)
    area[: stream.size] = stream
    return area


def unpack_codes(area, count, bits):
    """The `count` codes (uint8) of a code area written by pack_codes."""
    check_config(bits, 1)
    area = _as_bytes(area, _ceil_div(count * bits, 8), "area")
    stream_bits = np.unpackbits(area, bitorder="little", count=count * bits).reshape(count, bits)
    return (stream_bits << np.arange(bits, dtype=np.uint8)).sum(axis=1, dtype=np.uint8)


# ---- buckets (docs/wire-format.md, Arithmetic) --------------------------------

def bucket_params(lo, hi, bits, cubic=True):
    """What encode and decode derive from a bucket's metadata (min, max), as
    float32 scalars or arrays (docs/wire-format.md, Arithmetic). cubic=False: the
    uniform grid for every bucket (a rotated call's buckets, docs/rotation.md).

    Cubic grid, when cubic, b >= 2, min < 0 <= max (A = max, B = -min) and neither unit below
    is under 2^-126 (a range of about 2^-102 or less keeps the uniform grid):

        r     = (B * 0.5) / (A * 0.5 + B * 0.5)
        i0    = clamp(floor(L * r), 1, L - 1);  i1 = min(i0 + 1, L - 1)
        w(i)  = max(B / i, A / (L - i))
        z     = L if A == 0, else i1 if w(i1) < w(i0), else i0
        d-    = z,  d+ = L - z
        unit- = B / d-^3;  unit+ = A / d+^3, or unit- when A == 0
        inv-  = 1 / unit-;  inv+ = 1 / unit+

    Uniform grid, otherwise:

        sigma = 0.5 if max(|min|, |max|) >= 2^126 else 1
        a     = sigma * min
        d     = sigma * max - a
        step  = d / L,  raised to 2^-126 when d > 0 and step < 2^-126
        inv   = 1 / step if step > 0 else 0
    """
    check_config(bits, 1)
    lo, hi = np.asarray(lo, F32), np.asarray(hi, F32)
    top = F32((1 << bits) - 1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        huge = np.maximum(np.abs(lo), np.abs(hi)) >= _TWO_POW_126
        sigma = np.where(huge, F32(0.5), F32(1.0))
        a = sigma * lo
        d = sigma * hi - a
        step = d / top
        step = np.where((d > 0) & (step < _TWO_POW_MINUS_126), _TWO_POW_MINUS_126, step)
        inv = np.where(step > 0, F32(1.0) / step, F32(0.0))
        p = {"sigma": sigma, "inv_sigma": np.where(huge, F32(2.0), F32(1.0)), "a": a,
             "step": step, "inv": inv, "top": top, "lo": lo, "hi": hi,
             "cubic": np.zeros(np.shape(lo), bool)}
        if bits >= 2 and cubic:
            p.update(_cubic_params(hi, -lo, top))
            p["cubic"] = ((lo < 0) & (hi >= 0) & (p["unit_neg"] >= _TWO_POW_MINUS_126)
                          & (p["unit_pos"] >= _TWO_POW_MINUS_126))
    return p


def _cubic_params(big, small, top):
    """The cubic grid's z, d-, d+, unit-, unit+, inv-, inv+ (bucket_params), computed for
    every bucket (only those with p["cubic"] use them)."""
    ratio = (F32(0.5) * small) / (F32(0.5) * big + F32(0.5) * small)
    i0 = np.clip(np.floor(top * ratio), F32(1.0), top - F32(1.0))
    i1 = np.minimum(i0 + F32(1.0), top - F32(1.0))

    def width(i):
        return np.maximum(small / i, big / (top - i))

    zero = np.where(big == 0, top, np.where(width(i1) < width(i0), i1, i0)).astype(F32)
    span_neg, span_pos = zero, top - zero
    unit_neg = small / (span_neg * span_neg * span_neg)
    unit_pos = np.where(big == 0, unit_neg, big / (span_pos * span_pos * span_pos))
    return {"zero": zero, "span_neg": span_neg, "span_pos": span_pos, "unit_neg": unit_neg,
            "unit_pos": unit_pos, "inv_unit_neg": F32(1.0) / unit_neg,
            "inv_unit_pos": F32(1.0) / unit_pos}


def grid_step(p):
    """The widest distance between neighbouring levels of each bucket, float64, in the
    values' units: what the error of one quantization is bounded by (half of it when
    rounding to nearest). A cubic grid's widest cell is the top one of a side,
    unit * (d^3 - (d-1)^3)."""
    uniform = p["step"].astype(np.float64) * p["inv_sigma"]
    if "zero" not in p:
        return uniform
    d_neg, d_pos = p["span_neg"].astype(np.float64), p["span_pos"].astype(np.float64)
    cubic = np.maximum(p["unit_neg"] * (3 * d_neg * d_neg - 3 * d_neg + 1),
                       np.where(d_pos > 0, p["unit_pos"] * (3 * d_pos * d_pos - 3 * d_pos + 1),
                                0.0))
    return np.where(p["cubic"], cubic, uniform)


def _cubic_cell(x, p, bits):
    """Per value of a cubic grid: its side (neg), f, d, w - f^3 and (f+1)^3 - f^3."""
    neg = x < 0
    d = np.where(neg, p["span_neg"], p["span_pos"])
    w = np.where(neg, -x, x) * np.where(neg, p["inv_unit_neg"], p["inv_unit_pos"])
    f = np.zeros(np.shape(w), F32)
    for b in range(bits - 1, -1, -1):
        g = f + F32(1 << b)
        f = np.where((g <= d) & (g * g * g <= w), g, f)
    g = f + F32(1.0)
    f3 = f * f * f
    return neg, f, d, w - f3, g * g * g - f3


def encode_values(x, p, u=None, bits=None):
    """The codes (float32, 0..L) of the float32 values x, p holding their buckets'
    bucket_params broadcast to x's shape; u: their rng_uniform (stochastic rounding),
    None for nearest. A non-finite bucket's codes are the caller's to zero.

    Uniform grid:
        t = (sigma * x - a) * inv, 0 when not > 0, L when above L
        q = rint(t) (nearest) or floor(t) + (u < t - floor(t)) (stochastic)
    Cubic grid (x < 0 on the side below zero, else the side above):
        w = |x| * inv;  f = the integer in [0, d] with f^3 <= w < (f+1)^3 (or d)
        into = w - f^3;  width = (f+1)^3 - f^3
        m = f + (into + into > width) (nearest) or f + (u * width < into) (stochastic),
            at most d
        q = z - m below zero, z + m above
    """
    bits = int(np.log2(float(p["top"]) + 1)) if bits is None else bits
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = (p["sigma"] * x - p["a"]) * p["inv"]
        t = np.where(t > 0, t, F32(0.0))
        t = np.where(t < p["top"], t, p["top"])
        if u is None:
            q = np.rint(t)
        else:
            f = np.floor(t)
            q = f + np.where(u < t - f, F32(1.0), F32(0.0))
        if bits < 2 or not np.any(p["cubic"]):
            return q
        neg, f, d, into, width = _cubic_cell(x, p, bits)
        up = into + into > width if u is None else u * width < into
        m = f + np.where(up, F32(1.0), F32(0.0))
        m = np.where(m > d, d, m)
        return np.where(p["cubic"], np.where(neg, p["zero"] - m, p["zero"] + m), q)


def decode_values(q, p):
    """The float32 values of codes q, p holding their buckets' bucket_params broadcast to
    q's shape, clamped to [min, max]; NaN in a non-finite bucket (min is NaN):
    uniform grid (a + q * step) * (1 / sigma); cubic grid, k = q - z:
    (k |k|^2) * (unit- if k < 0 else unit+)."""
    lo, hi = p["lo"], p["hi"]
    with np.errstate(invalid="ignore", over="ignore"):
        y = (p["a"] + q.astype(F32) * p["step"]) * p["inv_sigma"]
        if "zero" in p and np.any(p["cubic"]):
            k = q.astype(F32) - p["zero"]
            m = np.abs(k)
            cubic = (k * m * m) * np.where(k < 0, p["unit_neg"], p["unit_pos"])
            y = np.where(p["cubic"], cubic, y)
        y = np.where(y < lo, lo, y)
        y = np.where(y > hi, hi, y)
        return np.where(lo != lo, _NAN32, y)


def per_value(p, index):
    """bucket_params p picked (or broadcast) per value: p[name][index] for each array entry."""
    return {name: (v[index] if np.ndim(v) else v) for name, v in p.items()}


def _bucket_of_each_value(count, bucket_size):
    return np.arange(count) // bucket_size


def _as_bytes(buf, size, what):
    allowed = f"{what} must be a uint8 numpy array or a bytes-like object"
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8:
            raise TypeError(f"{allowed}, got {_checks.describe(buf)}")
        buf = buf.reshape(-1)
    else:
        try:
            buf = np.frombuffer(buf, np.uint8)
        except (TypeError, ValueError):
            raise TypeError(f"{allowed}, got {_checks.describe(buf)}") from None
    if buf.size < size:
        raise ValueError(f"{what} holds {buf.size} bytes, {size} needed")
    return buf[:size]


def read_meta(buf, count, bucket_size):
    """The metadata of a quantized chunk: a float32 view of shape (nb, 2), (min, max) per bucket."""
    nb = num_buckets(count, bucket_size)
    return _as_bytes(buf, nb * META_BYTES, "buf").view("<f4").reshape(nb, 2)


def _cubic(grid):
    """Whether `grid` lets buckets take the cubic grid (ValueError for a bad name)."""
    return _checks.one_of("grid", grid, GRIDS) == "auto"


def _rotation(rotation, rotation_block):
    """The rotation block of a setting (0: none), checked."""
    from . import rotation as rot  # it imports this module
    rot.check(rotation, rotation_block)
    return rotation_block if rotation == "hadamard" else 0


# clip_fraction's tables (src/codec/codec_api.cc holds the same numbers): the outermost level,
# in standard deviations, of the 2^bits-level uniform quantizer with the least mean squared
# error for a Gaussian (Max's), and the expected largest magnitude of 2^k standard Gaussians
_CLIP_LEVEL = (0.0, 0.7979, 1.4935, 2.0511, 2.5140, 2.9162, 3.2780, 3.6111, 3.9222)
_CLIP_LARGEST = (
    0.797885, 1.128379, 1.464728, 1.783367, 2.077204, 2.347079, 2.596111, 2.827558, 3.044225,
    3.248391, 3.441870, 3.626116, 3.802295, 3.971358, 4.134087, 4.291131, 4.443040, 4.590279,
    4.733248, 4.872294, 5.007719, 5.139788, 5.268736, 5.394773, 5.518083, 5.638835, 5.757180,
    5.873255, 5.987183, 6.099080, 6.209048, 6.317183, 6.423573)


def check_clip(clip, rotation):
    """ValueError unless `clip` is one of CLIPS and allowed with `rotation`."""
    _checks.clip(clip, rotation)


def clip_fraction(clip, bits, bucket_size):
    """The f of clip_range for a configuration (docs/rotation.md, "Clipped ranges"): c(bits) /
    m(bucket_size), m interpolated linearly between the powers of two around bucket_size, in
    float64 as the library computes it, then float32; 0 for no clip, or where f >= 1."""
    if clip == "none":
        return F32(0.0)
    n = operator.index(bucket_size)
    k = min(n.bit_length() - 1, 32)
    largest = _CLIP_LARGEST[k]
    if k < 32:
        low = float(1 << k)
        largest += (_CLIP_LARGEST[k + 1] - _CLIP_LARGEST[k]) * ((float(n) - low) / low)
    f = _CLIP_LEVEL[bits] / largest
    return F32(f) if f < 1.0 else F32(0.0)


def clip_range(lo, hi, f):
    """The stored (min, max) of buckets of range [lo, hi] (float32 arrays): a bucket with
    lo < 0 < hi cut at t = f * max(-lo, hi), max' = min(hi, t), min' = max(lo, -t); other
    buckets (one side of zero, constant, NaN) and f = 0 keep their ranges."""
    if f == 0:
        return lo, hi
    with np.errstate(invalid="ignore", over="ignore"):
        cut = (lo < 0) & (hi > 0)
        t = F32(f) * np.maximum(-lo, hi)
        new_hi = np.where(t < hi, t, hi) + F32(0.0)
        new_lo = np.where(-t > lo, -t, lo) + F32(0.0)
    return np.where(cut, new_lo, lo).astype(F32), np.where(cut, new_hi, hi).astype(F32)


def quantize(array, bits, bucket_size, rounding, seed=0, stream=0, dtype=None, grid="auto",
             rotation="none", rotation_block=256, clip="none"):
    """The wire bytes (uint8 array of compressed_size bytes) of `array`.

    `seed` and `stream` pick the random numbers of stochastic rounding
    (rng_uniform); nearest rounding ignores them. grid: GRIDS. rotation="hadamard":
    the values are first rotated as one segment in blocks of rotation_block, with the
    signs of `seed`, and quantized on the uniform grid (docs/rotation.md); "prerotated":
    the uniform grid alone (values the caller rotated). clip="gaussian" (rotated calls only):
    every bucket's stored range clipped (clip_range).
    """
    check_config(bits, bucket_size, rounding)
    check_clip(clip, rotation)
    cubic = _cubic(grid)
    block = _rotation(rotation, rotation_block)
    x, _ = as_float32(array, dtype)
    if block:
        from . import rotation as rot
        x = rot.rotate(x, block, seed)
    cubic = cubic and rotation == "none"
    count = x.size
    out = np.zeros(compressed_size(count, bits, bucket_size), np.uint8)
    if count == 0:
        return out
    starts = np.arange(0, count, bucket_size)
    nonfinite = np.logical_or.reduceat(~np.isfinite(x), starts)
    with np.errstate(invalid="ignore"):
        # + 0.0 turns -0.0 into +0.0; a bucket holding NaN or +-Inf is marked by NaN
        lo = np.where(nonfinite, _NAN32, np.minimum.reduceat(x, starts) + F32(0.0))
        hi = np.where(nonfinite, _NAN32, np.maximum.reduceat(x, starts) + F32(0.0))
    lo, hi = clip_range(lo, hi, clip_fraction(clip, bits, bucket_size))
    nb = starts.size
    out[: nb * META_BYTES] = np.stack([lo, hi], axis=1).astype("<f4").view(np.uint8).reshape(-1)

    k = _bucket_of_each_value(count, bucket_size)
    u = None if rounding == "nearest" else rng_uniform(seed, stream, np.arange(count, dtype=np.uint64))
    q = encode_values(x, per_value(bucket_params(lo, hi, bits, cubic), k), u)
    codes = np.where(nonfinite[k], F32(0.0), q).astype(np.uint8)
    out[nb * META_BYTES:] = pack_codes(codes, bits)
    return out


def decode(buf, count, bits, bucket_size, grid="auto", rotation="none", rotation_block=256,
           seed=0):
    """The float32 values of a quantized chunk (quantized with the same `grid`, rotation
    and seed):

        y = (a + k * (s- if k < 0 else s+)) * (1 / sigma), k = q - z, clamped to [min, max];
        every value of a non-finite bucket (min is NaN) is the canonical NaN; a rotated
        chunk's values are then rotated back.
    """
    check_config(bits, bucket_size)
    cubic = _cubic(grid) and rotation == "none"
    block = _rotation(rotation, rotation_block)
    if block:
        from . import rotation as rot
        y = decode(buf, count, bits, bucket_size, "uniform")
        return rot.unrotate(y, block, seed)
    buf = _as_bytes(buf, compressed_size(count, bits, bucket_size), "buf")
    meta = read_meta(buf, count, bucket_size)
    codes = unpack_codes(buf[len(meta) * META_BYTES:], count, bits)
    lo, hi = meta[:, 0], meta[:, 1]
    k = _bucket_of_each_value(count, bucket_size)
    return decode_values(codes, per_value(bucket_params(lo, hi, bits, cubic), k))


def dequantize(buf, count, bits, bucket_size, dtype="float32", grid="auto", rotation="none",
               rotation_block=256, seed=0):
    """The `count` values of a quantized chunk as a flat array of `dtype`."""
    dtype = _checks.dtype(dtype, DTYPES)
    return from_float32(decode(buf, count, bits, bucket_size, grid, rotation, rotation_block,
                               seed), dtype)


def dequantize_accumulate(buf, count, bits, bucket_size, acc, dtype=None, grid="auto",
                          rotation="none", rotation_block=256, seed=0):
    """acc += decoded values, in place: added in float32, a NaN sum becomes the
    canonical NaN, stored back in acc's type. `acc` is a C-contiguous writable
    array of `count` float32/float16/bfloat16 values (uint16 bits need `dtype`).
    Returns acc."""
    if not isinstance(acc, np.ndarray) or not acc.flags.c_contiguous or not acc.flags.writeable:
        raise ValueError(f"acc must be a C-contiguous writable numpy array, got "
                         f"{_checks.describe_layout(acc)}")
    if acc.size != count:
        raise ValueError(f"acc holds {acc.size} values, count is {count}")
    name = dtype_name(acc.dtype, dtype, "acc")
    with np.errstate(invalid="ignore", over="ignore"):
        total = to_float32(acc.reshape(-1), name) + decode(buf, count, bits, bucket_size, grid,
                                                           rotation, rotation_block, seed)
    total = np.where(total == total, total, _NAN32)
    acc.reshape(-1)[:] = from_float32(total, name).view(acc.dtype)
    return acc
