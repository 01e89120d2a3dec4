/* The codec's arithmetic, element by element, shared by the host codec
 * (codec_host.cc), the CUDA kernels (codec_kernels.cu) and mirrored by the numpy
 * emulator (qnccl/emulate/codec.py). docs/wire-format.md is the normative
 * description; this file is its executable form.
 *
 * Bit-exactness rules: float32 arithmetic in the order written, every
 * operation rounded to nearest even, no FMA contraction (-ffp-contract=off,
 * -fmad=false), no flush-to-zero, IEEE division. */
#ifndef QNCCL_CODEC_MATH_H_
#define QNCCL_CODEC_MATH_H_

#include <stddef.h>

#include <type_traits>

#include "dtype.h"
#include "rng.h"

namespace qnccl {

constexpr size_t kMetaBytes = 8;   // per bucket: float32 min, float32 max
constexpr size_t kGroup = 8;       // values per packing group (= `bits` bytes)
constexpr size_t kCodeAlign = 8;   // the code area is padded to this many bytes

QNCCL_HD size_t num_buckets(size_t count, size_t bucket) { return count / bucket + (count % bucket != 0); }

QNCCL_HD size_t code_bytes(size_t count, int bits) {
  size_t b = (count / 8) * (size_t)bits + ((count % 8) * (size_t)bits + 7) / 8;
  return (b + kCodeAlign - 1) / kCodeAlign * kCodeAlign;
}

QNCCL_HD size_t compressed_bytes(size_t count, int bits, size_t bucket) {
  return num_buckets(count, bucket) * kMetaBytes + code_bytes(count, bits);
}

QNCCL_HD float levels(int bits) { return (float)((1u << bits) - 1u); }

QNCCL_HD float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/* Grid positions lie in [0, 2^bits] (up to rounding), far inside the range
 * where adding and subtracting 2^23 rounds a float32 to an integer, ties to
 * even. Written as plain adds, this is the same on every target and
 * vectorizes without SSE4.1's roundps. Valid for 0 <= t < 2^22. */
QNCCL_HD float round_even(float t) {
  const float shift = 0x1p23f;
  return (t + shift) - shift;
}

/* Min, max and a non-finite flag of a bucket, accumulated element by element
 * in any order (min and max are exact, so any order gives the same result). */
struct BucketStats {
  float min, max;
  uint32_t nonfinite;
};

QNCCL_HD BucketStats stats_init() {
  BucketStats s = {bits_float(0x7f800000u), bits_float(0xff800000u), 0u};
  return s;
}

QNCCL_HD void stats_add(BucketStats& s, float x) {
  s.min = x < s.min ? x : s.min;
  s.max = x > s.max ? x : s.max;
  s.nonfinite |= (uint32_t)(x - x != 0.0f);  // inf - inf and NaN - NaN are NaN
}

QNCCL_HD void stats_merge(BucketStats& s, const BucketStats& o) {
  s.min = o.min < s.min ? o.min : s.min;
  s.max = o.max > s.max ? o.max : s.max;
  s.nonfinite |= o.nonfinite;
}

/* The metadata a bucket puts on the wire. A bucket holding NaN or +-Inf is
 * marked by min = max = canonical NaN and decodes to NaN. -0.0 becomes +0.0 so
 * the bytes do not depend on which zero a reduction order met first. */
struct BucketMeta {
  float min, max;
};

QNCCL_HD BucketMeta stats_meta(const BucketStats& s) {
  BucketMeta m;
  if (s.nonfinite) {
    m.min = m.max = bits_float(kCanonicalNanF32);
  } else {
    m.min = s.min + 0.0f;
    m.max = s.max + 0.0f;
  }
  return m;
}

/* Everything encode and decode need of a bucket, derived from its metadata
 * alone so both ends derive the same values.
 *   step  s = sigma * (max - min) / (2^bits - 1), raised to 2^-126 when
 *           it is below that and max > min (1/s stays finite, and a tiny
 *           nonzero range is never mistaken for a constant bucket);
 *   sigma = 1/2 when |min| or |max| >= 2^126, else 1: works in half-scale
 *           so that x - min and max - min cannot overflow.
 *   encode q = clamp(round((sigma*x - sigma*min) / s), 0, 2^bits - 1)
 *   decode y = clamp((sigma*min + q*s) / sigma, min, max)              */
struct BucketParams {
  float lo, hi;         // bucket min and max: decoded values are clamped to them
  float a;              // sigma * min
  float step;           // s
  float inv_step;       // 1 / s, or 0 for a constant bucket
  float sigma, inv_sigma;
  float top;            // 2^bits - 1
  bool nonfinite;
};

QNCCL_HD BucketParams bucket_params(BucketMeta m, int bits) {
  BucketParams p;
  p.nonfinite = !(m.min == m.min);
  p.lo = m.min;
  p.hi = m.max;
  p.top = levels(bits);
  float amin = m.min < 0.0f ? -m.min : m.min;
  float amax = m.max < 0.0f ? -m.max : m.max;
  bool huge = (amin > amax ? amin : amax) >= 0x1p126f;
  p.sigma = huge ? 0.5f : 1.0f;
  p.inv_sigma = huge ? 2.0f : 1.0f;
  p.a = p.sigma * m.min;
  float d = p.sigma * m.max - p.a;
  float s = div_rn(d, p.top);
  if (d > 0.0f && s < 0x1p-126f) s = 0x1p-126f;  // also when d / top underflowed to 0
  p.step = s;
  p.inv_step = s > 0.0f ? div_rn(1.0f, s) : 0.0f;
  return p;
}

/* Position of x on the bucket's grid, in steps from min; never negative
 * (rounding can put the minimum a hair below 0, where it codes 0 anyway). */
QNCCL_HD float grid_position(const BucketParams& p, float x) {
  float t = (p.sigma * x - p.a) * p.inv_step;
  return t > 0.0f ? t : 0.0f;
}

/* min(max(q, 0), top) of the doc: q >= 0 already, as grid_position is. */
QNCCL_HD float clamp_code(float q, float top) { return q > top ? top : q; }

/* Codes are at most 255: converted through int32, which SIMD converts natively. */
QNCCL_HD uint32_t encode_nearest(const BucketParams& p, float x) {
  return (uint32_t)(int32_t)clamp_code(round_even(grid_position(p, x)), p.top);
}

/* Rounds up with probability equal to the fractional position: unbiased. */
QNCCL_HD uint32_t encode_stochastic(const BucketParams& p, float x, float u) {
  const float t = grid_position(p, x);
  const int32_t f = (int32_t)t;  // floor: t >= 0, and truncation is exact
  const int32_t q = f + (u < t - (float)f ? 1 : 0);
  const int32_t top = (int32_t)p.top;
  return (uint32_t)(q > top ? top : q);
}

QNCCL_HD float decode(const BucketParams& p, uint32_t q) {
  float y = (p.a + (float)q * p.step) * p.inv_sigma;
  y = y < p.lo ? p.lo : y;
  return y > p.hi ? p.hi : y;
}

/* x, or the canonical NaN for any NaN: stored results then do not depend on
 * which NaN operand the hardware propagated. */
QNCCL_HD float canonical(float x) { return x == x ? x : bits_float(kCanonicalNanF32); }

/* acc + y in float32; a NaN sum becomes the canonical NaN. */
QNCCL_HD float accumulate(float acc, float y) { return canonical(acc + y); }

/* Error feedback's residual of one value (docs/allreduce.md): what
 * quantizing v dropped, (v - decoded) * scale in float32, or 0 where that is
 * not finite (a bucket holding NaN or Inf must not poison later calls). */
QNCCL_HD float dropped_value(float v, float decoded, float scale) {
  float r = (v - decoded) * scale;
  return r - r == 0.0f ? r : 0.0f;  // inf - inf and NaN - NaN are NaN
}

/* Packing: eight codes, one per byte of a little-endian uint64, become
 * 8*BITS contiguous bits (code j at bits [j*BITS, (j+1)*BITS)), i.e. BITS
 * bytes of the LSB-first bit stream. Three shift-and-merge steps; the inverse
 * masks off whatever follows the group in the word it was loaded from. */
/* Word is uint64_t, or on the host a vector of them (GCC vector
 * extensions), which packs several groups at once with the same steps. */
template <int BITS, class Word = uint64_t>
QNCCL_HD Word pack8(Word w) {
  w = (w & 0x00ff00ff00ff00ffull) | ((w & 0xff00ff00ff00ff00ull) >> (8 - BITS));
  w = (w & 0x0000ffff0000ffffull) | ((w & 0xffff0000ffff0000ull) >> (16 - 2 * BITS));
  w = (w & 0x00000000ffffffffull) | ((w & 0xffffffff00000000ull) >> (32 - 4 * BITS));
  return w;
}

template <int BITS, class Word = uint64_t>
QNCCL_HD Word unpack8(Word w) {
  const uint64_t m4 = (BITS == 8) ? 0xffffffffull : ((1ull << (4 * BITS)) - 1);
  const uint64_t m2 = ((1ull << (2 * BITS)) - 1) * 0x0000000100000001ull;
  const uint64_t m1 = ((1ull << BITS) - 1) * 0x0001000100010001ull;
  w = (w & m4) | ((w << (32 - 4 * BITS)) & (m4 << 32));
  w = (w & m2) | ((w << (16 - 2 * BITS)) & (m2 << 16));
  w = (w & m1) | ((w << (8 - BITS)) & (m1 << 8));
  return w;
}

/* Calls fn(std::integral_constant<int, BITS>) for bits in 1..8: where a
 * runtime bit width becomes a template argument, for host and device code. */
template <class Fn>
inline void dispatch_bits(int bits, Fn&& fn) {
  switch (bits) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 5: fn(std::integral_constant<int, 5>{}); break;
    case 6: fn(std::integral_constant<int, 6>{}); break;
    case 7: fn(std::integral_constant<int, 7>{}); break;
    case 8: fn(std::integral_constant<int, 8>{}); break;
  }
}

}  // namespace qnccl

#endif
