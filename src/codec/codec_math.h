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

/* A clipped range (qncclClipGaussian; docs/rotation.md, "Clipped ranges"):
 * a bucket with min < 0 < max is cut at t = f * M, M = max(-min, max):
 *   max' = min(max, t),  min' = max(min, -t);
 * any other bucket (one side of zero, constant, non-finite) and f = 0 (no
 * clip: clip_fraction) keep their ranges. + 0.0f keeps -0.0 off the wire
 * (-t of a t that underflowed), as stats_meta does. */
QNCCL_HD BucketMeta clip_meta(BucketMeta m, float f) {
  // Selects only, no early return: the host clips a batch of buckets as one vector loop
  // (which end is cut is data, which branches mispredict).
  const bool cut = (f > 0.0f) & (m.min < 0.0f) & (m.max > 0.0f);  // false for NaN
  const float t = f * (-m.min > m.max ? -m.min : m.max);
  BucketMeta c;
  c.max = cut ? (t < m.max ? t : m.max) + 0.0f : m.max;
  c.min = cut ? (-t > m.min ? -t : m.min) + 0.0f : m.min;
  return c;
}

/* Everything encode and decode need of a bucket, derived from its metadata
 * alone so both ends derive the same values (docs/wire-format.md, Arithmetic).
 *
 * Cubic grid, when bits >= 2 and min < 0 <= max (the usual gradient bucket;
 * not for ranges so tiny that a unit below would be subnormal):
 * zero is code z, exactly; the d- = z codes below it are -B (m / d-)^3 for
 * m = 1..d-, the d+ = L - z codes above it A (m / d+)^3 (B = -min, A = max).
 * Levels crowd around zero, where most of a gradient's coordinates are, so a
 * small coordinate keeps its size relative to its neighbours instead of
 * drowning in a step set by the bucket's largest value; a value whose inputs
 * are all zero decodes to exactly zero.
 * Uniform grid, otherwise: L steps of s from min to max,
 *   s     = sigma * (max - min) / L, raised to 2^-126 when it is below that
 *           and max > min (1/s stays finite, and a tiny nonzero range is never
 *           mistaken for a constant bucket);
 *   sigma = 1/2 when |min| or |max| >= 2^126, else 1: works in half-scale
 *           so that x - min and max - min cannot overflow.
 *   encode q = clamp(round((sigma*x - sigma*min) / s), 0, L)
 *   decode y = clamp((sigma*min + q*s) / sigma, min, max)                   */
struct BucketParams {
  float lo, hi;         // bucket min and max: decoded values are clamped to them
  float top;            // L = 2^bits - 1
  bool nonfinite;
  bool cubic;
  // uniform grid
  float a;              // sigma * min
  float step;           // s
  float inv_step;       // 1 / s, or 0 for a constant bucket
  float sigma, inv_sigma;
  // cubic grid: per side (below zero, above zero) its code count d and unit M / d^3
  float zero;           // z
  float span_neg, span_pos;
  float unit_neg, unit_pos;
  float inv_unit_neg, inv_unit_pos;
};

QNCCL_HD float max_f(float x, float y) { return x > y ? x : y; }

/* The cubic grid's z: with A = max >= 0 and B = -min > 0, the z in 1..L-1
 * that minimises max(B / z, A / (L - z)) (the two sides' mean spacing),
 * chosen between the two integers around L * B / (A + B), the smaller on a
 * tie; L when A == 0 (no code above zero). */
QNCCL_HD float zero_code(float big, float small, float top) {
  const float ratio = div_rn(0.5f * small, 0.5f * big + 0.5f * small);  // halves: no overflow
  float i0 = (float)(int32_t)(top * ratio);  // floor: the product is >= 0
  i0 = i0 < 1.0f ? 1.0f : (i0 > top - 1.0f ? top - 1.0f : i0);
  const float i1 = i0 + 1.0f > top - 1.0f ? top - 1.0f : i0 + 1.0f;
  const float w0 = max_f(div_rn(small, i0), div_rn(big, top - i0));
  const float w1 = max_f(div_rn(small, i1), div_rn(big, top - i1));
  return big == 0.0f ? top : (w1 < w0 ? i1 : i0);
}

/* The cubic grid's values for a bucket of max A = big and min -B = -small
 * (both finite, A >= 0, B > 0); the inverse units only where they are asked
 * for (the encoder's; the decoder multiplies by the units). */
template <bool INVERSES>
QNCCL_HD void cubic_grid(BucketParams& p, float big, float small) {
  p.zero = zero_code(big, small, p.top);
  p.span_neg = p.zero;
  p.span_pos = p.top - p.zero;
  p.unit_neg = div_rn(small, p.span_neg * p.span_neg * p.span_neg);
  // with A == 0 the side above zero holds only zero itself: any unit will do
  const float unit_pos = div_rn(big, p.span_pos * p.span_pos * p.span_pos);
  p.unit_pos = big == 0.0f ? p.unit_neg : unit_pos;
  if constexpr (INVERSES) {
    p.inv_unit_neg = div_rn(1.0f, p.unit_neg);
    p.inv_unit_pos = div_rn(1.0f, p.unit_pos);
  }
}

/* A subnormal unit would make the cubes coarser than the uniform grid's 2^-126
 * floor: such tiny buckets (below about 2^-102) keep the uniform grid. */
QNCCL_HD bool cubic_applies(const BucketParams& p, bool straddles) {
  return straddles & (p.unit_neg >= 0x1p-126f) & (p.unit_pos >= 0x1p-126f);
}

/* The uniform grid's values for a bucket of metadata m. */
template <bool INVERSES>
QNCCL_HD void uniform_grid(BucketParams& p, BucketMeta m) {
  const float amin = m.min < 0.0f ? -m.min : m.min;
  const float amax = m.max < 0.0f ? -m.max : m.max;
  const bool huge = (amin > amax ? amin : amax) >= 0x1p126f;
  p.sigma = huge ? 0.5f : 1.0f;
  p.inv_sigma = huge ? 2.0f : 1.0f;
  p.a = p.sigma * m.min;
  const float d = p.sigma * m.max - p.a;
  const float s = div_rn(d, p.top);
  p.step = (d > 0.0f && s < 0x1p-126f) ? 0x1p-126f : s;  // also when d / top underflowed to 0
  if constexpr (INVERSES) {
    const float inv_step = div_rn(1.0f, p.step);
    p.inv_step = p.step > 0.0f ? inv_step : 0.0f;
  }
}

QNCCL_HD BucketParams bucket_common(BucketMeta m, int bits) {
  BucketParams p = {};
  p.nonfinite = !(m.min == m.min);
  p.lo = m.min;
  p.hi = m.max;
  p.top = levels(bits);
  return p;
}

/* `cubic`: the call lets buckets take the cubic grid (false: a rotated
 * call's buckets, all on the uniform grid; docs/rotation.md). */
QNCCL_HD bool straddles_zero(BucketMeta m, int bits, bool cubic) {
  return cubic && bits >= 2 && m.min < 0.0f && m.max >= 0.0f;  // false for NaN
}

/* Both grids' values are derived every time and the grid that applies
 * picks its own: no branches, so that the host's loop over a batch of
 * buckets vectorizes. Where the cubic grid does not apply, its inputs are
 * replaced by 1 so that its unused values stay finite (zero_code converts
 * a float to an integer, undefined for NaN). */
QNCCL_HD BucketParams bucket_params(BucketMeta m, int bits, bool cubic) {
  BucketParams p = bucket_common(m, bits);
  const bool straddles = straddles_zero(m, bits, cubic);
  cubic_grid<true>(p, straddles ? m.max : 1.0f, straddles ? -m.min : 1.0f);
  p.cubic = cubic_applies(p, straddles);
  uniform_grid<true>(p, m);
  return p;
}

/* The same values of the grid that applies, and of it alone (the inverses
 * only with INVERSES): for a GPU thread, which derives one bucket's
 * parameters at a time, where the branch-free form's other grid and unused
 * inverses cost divisions for every group of values decoded. */
template <bool INVERSES>
QNCCL_HD BucketParams bucket_params_of_grid(BucketMeta m, int bits, bool cubic) {
  BucketParams p = bucket_common(m, bits);
  const bool straddles = straddles_zero(m, bits, cubic);
  if (straddles) {
    cubic_grid<INVERSES>(p, m.max, -m.min);
    p.cubic = cubic_applies(p, straddles);
  }
  if (!p.cubic) uniform_grid<INVERSES>(p, m);
  return p;
}

/* Position of x on a uniform grid, in steps from min, within [0, L]:
 * rounding can put the minimum a hair below 0 and the maximum a hair above
 * L, where they code 0 and L anyway; a value past a clipped range
 * (clip_meta) lands on its end, L at most even where sigma * x - a
 * overflows. */
QNCCL_HD float grid_position(const BucketParams& p, float x) {
  const float t = (p.sigma * x - p.a) * p.inv_step;
  const float above = t > 0.0f ? t : 0.0f;
  return above < p.top ? above : p.top;
}

/* cbrt(w) for 0 <= w < 2^24 to within 0.17 (checked for every float in that
 * range by tests/programs/cube_root_check.cc): a third of the float's bit
 * pattern, offset so that the exponent's bias stays right, is cbrt within
 * about 3%; one Newton step squares that error. Plain IEEE operations, the
 * same on every target. */
QNCCL_HD float cube_root_first(float w) {  // the bit pattern's third alone: within 3.3%
  const uint32_t bits = (uint32_t)(int32_t)((float)(int32_t)float_bits(w) * (1.0f / 3.0f));
  return bits_float(bits + 709958130u);
}

QNCCL_HD float cube_root_estimate(float w) {
  const float a = cube_root_first(w);
  return (a + a + div_rn(w, a * a)) * (1.0f / 3.0f);
}

/* The largest integer f with f^3 <= w, 0 <= w < 2^24: the estimate, lowered
 * by its error bound, truncates to f or f - 1; one comparison of exact cubes
 * (integers up to 256 cube exactly in float32) decides. */
QNCCL_HD float cube_floor(float w) {
  const float k = (float)(int32_t)(cube_root_estimate(w) - 0.17f);
  const float g = k + 1.0f;
  return g * g * g <= w ? g : k;
}

/* The largest integer f with f^3 <= w, or any integer of at least 18 when w
 * >= 2^13: without the Newton step (and its division) the estimate is within
 * 0.65 of cbrt(w) for every float w in [0, 2^13) (checked by
 * tests/programs/cube_root_check.cc), so it truncates to f - 1, f or f + 1,
 * and two comparisons of exact cubes decide. Beyond, it is monotone and at
 * least 19.3. */
QNCCL_HD float cube_floor_small(float w) {
  const float k = (float)(int32_t)cube_root_first(w);
  const float g = k + 1.0f;
  return k - (k * k * k > w ? 1.0f : 0.0f) + (g * g * g <= w ? 1.0f : 0.0f);
}

/* The largest integer f <= d with f^3 <= w (w >= 0): at two bits (d <= 3)
 * a binary search of two probes is cheaper than the estimate; at three and
 * four (d <= 15) the estimate needs no Newton step. */
template <int BITS>
QNCCL_HD float cube_floor_within(float w, float d) {
  if constexpr (BITS <= 2) {
    float f = 0.0f;
    QNCCL_UNROLL
    for (int b = BITS - 1; b >= 0; --b) {
      const float g = f + (float)(1 << b);
      f = ((g <= d) & (g * g * g <= w)) ? g : f;
    }
    return f;
  } else if constexpr (BITS <= 4) {
    const float f = cube_floor_small(w);
    return f > d ? d : f;
  } else {
    const float f = cube_floor(w);
    return f > d ? d : f;
  }
}

/* The code of x on a cubic grid: on x's side (d codes, unit), the cell
 * [f^3, (f+1)^3) of w = |x| / unit that holds it (f <= d) and how far into
 * the cell it lies decide between the levels f and f + 1: nearest goes up
 * when 2 (w - f^3) > (f+1)^3 - f^3, stochastic when u ((f+1)^3 - f^3) <
 * w - f^3 (probability (w - f^3) / ((f+1)^3 - f^3): unbiased), with no
 * division; w - f^3 and the widths are exact (up to four bits f comes
 * without a division, cube_floor_within). Nearest from five bits needs
 * no exact f: with k the estimate truncated (f - 1, f or f + 1; w - k^3 is
 * exact: for k <= f an integer at most w < 2^24 apart, for k = f + 1 the two
 * within a factor of two), the nearest level is k,
 * or k + 1 when 2 (w - k^3) > (k+1)^3 - k^3, because the cube root of every
 * midpoint (k^3 + (k+1)^3) / 2 lies more than 0.17 from an integer. Written
 * without branches, so that host loops vectorize. */
template <int BITS, bool STOCHASTIC>
QNCCL_HD uint32_t encode_cubic(const BucketParams& p, float x, float u) {
  const bool neg = x < 0.0f;
  const float d = neg ? p.span_neg : p.span_pos;
  // |x| by its sign bit: -0.0 becomes +0.0, whose bit pattern the estimate needs
  const float w = bits_float(float_bits(x) & 0x7fffffffu) * (neg ? p.inv_unit_neg : p.inv_unit_pos);
  float m;
  if (STOCHASTIC || BITS <= 4) {
    const float f = cube_floor_within<BITS>(w, d);
    const float g = f + 1.0f, f3 = f * f * f;
    const float into = w - f3, width = g * g * g - f3;
    m = f + ((STOCHASTIC ? u * width < into : into + into > width) ? 1.0f : 0.0f);
  } else {
    const float k = (float)(int32_t)cube_root_estimate(w);
    const float kk = k * k;
    const float into = w - kk * k, width = (kk + k) * 3.0f + 1.0f;
    m = k + (into + into > width ? 1.0f : 0.0f);
  }
  m = m > d ? d : m;
  return (uint32_t)(int32_t)(neg ? p.zero - m : p.zero + m);
}

/* Nearest rounding on a cubic grid as a count: the code of x is the number of
 * the bucket's L thresholds t_0 < .. < t_{L-1} that lie below x (x > t_i), the
 * same code as encode_nearest_cubic. On a side with inverse unit c, x goes
 * past the side's level j (away from zero) when w = |x| * c exceeds the
 * midpoint h_j = (j^3 + (j+1)^3) / 2, j = 0..d-1; as w rounds monotonically in
 * |x|, that holds exactly from the least float a_j with a_j * c > h_j on. So
 * t_i = -a_j of the side below zero for i < z (j = z - 1 - i: x > -a_j keeps
 * x above that level) and, above zero, the float just below a_j (j = i - z).
 * The host's vector encoder searches these (codec_host.cc); BITS <= 5, where
 * every h_j (at most 30.5^3) is exact in float32. */
QNCCL_HD float float_above(float a) { return bits_float(float_bits(a) + 1u); }  // a >= 0
QNCCL_HD float float_below(float a) { return bits_float(float_bits(a) - 1u); }  // a > 0

/* The least float a >= 0 with a * c > h (h >= 1/2 exact, 0 < c <= 2^126, as on
 * a cubic grid): a0 = h / c rounded is it or at most two floats below it.
 * Every float below a0 is below h / c, so its product is below h and rounds
 * to at most h; a0 + 2 floats is at least 1.5 of its float spacing (at least
 * 2^-24 of it) above h / c, so its product exceeds h by more than half of h's
 * float spacing and rounds above h. */
QNCCL_HD float least_above(float h, float c) {
  float a = div_rn(h, c);
  a = a * c > h ? a : float_above(a);
  return a * c > h ? a : float_above(a);
}

template <int BITS>
QNCCL_HD float cubic_threshold(const BucketParams& p, float i) {
  static_assert(BITS >= 2 && BITS <= 5, "midpoints are exact in float32 up to 5 bits");
  const bool below = i < p.zero;
  const float j = below ? p.zero - 1.0f - i : i - p.zero;
  const float h = j * j * j + ((j * j + j) * 3.0f + 1.0f) * 0.5f;  // exact
  const float a = least_above(h, below ? p.inv_unit_neg : p.inv_unit_pos);
  return below ? -a : float_below(a);
}

/* Each grid's rounding on its own (the host's encode loops run one per
 * bucket, so that each vectorizes), then both behind one call for the CUDA
 * kernels. Codes are at most 255: converted through int32, which SIMD
 * converts natively. */

/* Uniform: round to nearest, ties to even (within [0, L], as the position
 * is: the doc's clamp). */
QNCCL_HD uint32_t encode_nearest_uniform(const BucketParams& p, float x) {
  return (uint32_t)(int32_t)round_even(grid_position(p, x));
}

/* Uniform: rounds up with probability equal to the fractional position:
 * unbiased. At t = L the fraction is 0, so the code stays L. */
QNCCL_HD uint32_t encode_stochastic_uniform(const BucketParams& p, float x, float u) {
  const float t = grid_position(p, x);
  const int32_t f = (int32_t)t;  // floor: t >= 0, and truncation is exact
  return (uint32_t)(f + (u < t - (float)f ? 1 : 0));
}

/* Cubic: the nearer of the two levels around x, the one nearer zero on a tie. */
template <int BITS>
QNCCL_HD uint32_t encode_nearest_cubic(const BucketParams& p, float x) {
  return encode_cubic<BITS, false>(p, x, 0.0f);
}

/* Cubic: away from the level nearer zero with probability equal to the
 * fractional position between the two levels around x: unbiased. */
template <int BITS>
QNCCL_HD uint32_t encode_stochastic_cubic(const BucketParams& p, float x, float u) {
  return encode_cubic<BITS, true>(p, x, u);
}

template <int BITS>
QNCCL_HD uint32_t encode_nearest(const BucketParams& p, float x) {
  return p.cubic ? encode_nearest_cubic<BITS>(p, x) : encode_nearest_uniform(p, x);
}

template <int BITS>
QNCCL_HD uint32_t encode_stochastic(const BucketParams& p, float x, float u) {
  return p.cubic ? encode_stochastic_cubic<BITS>(p, x, u) : encode_stochastic_uniform(p, x, u);
}

QNCCL_HD float clamp_value(const BucketParams& p, float y) {
  y = y < p.lo ? p.lo : y;
  return y > p.hi ? p.hi : y;
}

QNCCL_HD float decode_uniform(const BucketParams& p, uint32_t q) {
  return clamp_value(p, (p.a + (float)q * p.step) * p.inv_sigma);
}

QNCCL_HD float decode_cubic(const BucketParams& p, uint32_t q) {
  const float k = (float)q - p.zero;  // exact: small integers, and so is k |k|^2
  const float m = k < 0.0f ? -k : k;
  return clamp_value(p, (k * m * m) * (k < 0.0f ? p.unit_neg : p.unit_pos));
}

QNCCL_HD float decode(const BucketParams& p, uint32_t q) {
  return p.cubic ? decode_cubic(p, q) : decode_uniform(p, q);
}

/* x, or the canonical NaN for any NaN: stored results then do not depend on
 * which NaN operand the hardware propagated. */
QNCCL_HD float canonical(float x) { return x == x ? x : bits_float(kCanonicalNanF32); }

/* acc + y in float32; a NaN sum becomes the canonical NaN. */
QNCCL_HD float accumulate(float acc, float y) { return canonical(acc + y); }

/* Error feedback's residual of one value (docs/allreduce.md): what
 * quantizing v dropped, v - decoded in float32, or 0 where that is not
 * finite (a bucket holding NaN or Inf must not poison later calls). */
QNCCL_HD float dropped_value(float v, float decoded) {
  float r = v - decoded;
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
