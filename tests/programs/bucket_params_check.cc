// The GPU kernels derive a bucket's parameters with bucket_params_of_grid
// (codec_math.h: the grid that applies, and with INVERSES = false no inverse
// units or step), the host codec with the branch-free bucket_params (both
// grids, every field). Every field that the applying grid's encoder
// (INVERSES = true) or decoder (false) reads must hold the same bits in both,
// for every metadata pair: ranges around zero, one-sided, constant, tiny
// (subnormal units), huge (half-scale), infinite, NaN, and random bit patterns.
// Prints the number of (metadata, bits) cases and of differing fields; exits
// 1 if any differs.
#include <cstdio>
#include <cstring>
#include <vector>

#include "codec/codec_math.h"

namespace {

using qnccl::BucketMeta;
using qnccl::BucketParams;

uint64_t next_random(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Field {
  const char* name;
  float BucketParams::*member;
};

// What each grid's encoder and decoder read (codec_math.h: encode_*, decode_*)
const Field kCommon[] = {{"lo", &BucketParams::lo}, {"hi", &BucketParams::hi},
                         {"top", &BucketParams::top}};
const Field kCubic[] = {{"zero", &BucketParams::zero},
                        {"span_neg", &BucketParams::span_neg},
                        {"span_pos", &BucketParams::span_pos},
                        {"unit_neg", &BucketParams::unit_neg},
                        {"unit_pos", &BucketParams::unit_pos}};
const Field kCubicInverses[] = {{"inv_unit_neg", &BucketParams::inv_unit_neg},
                                {"inv_unit_pos", &BucketParams::inv_unit_pos}};
const Field kUniform[] = {{"a", &BucketParams::a},
                          {"step", &BucketParams::step},
                          {"sigma", &BucketParams::sigma},
                          {"inv_sigma", &BucketParams::inv_sigma}};
const Field kUniformInverses[] = {{"inv_step", &BucketParams::inv_step}};

unsigned long long wrong = 0;

template <size_t N>
void compare(const Field (&fields)[N], const BucketParams& want, const BucketParams& got,
             BucketMeta m, int bits, bool inverses) {
  for (const Field& f : fields) {
    if (qnccl::float_bits(want.*f.member) == qnccl::float_bits(got.*f.member)) continue;
    if (++wrong <= 20)
      printf("min %a max %a bits %d inverses %d: %s %a, of its grid alone %a\n", m.min, m.max,
             bits, inverses, f.name, want.*f.member, got.*f.member);
  }
}

template <bool INVERSES>
void check(BucketMeta m, int bits, bool cubic) {
  const BucketParams want = qnccl::bucket_params(m, bits, cubic);
  const BucketParams got = qnccl::bucket_params_of_grid<INVERSES>(m, bits, cubic);
  if (!cubic && want.cubic) {
    if (++wrong <= 20) printf("min %a max %a bits %d: cubic with the grid forbidden\n", m.min,
                              m.max, bits);
    return;
  }
  if (want.nonfinite != got.nonfinite || want.cubic != got.cubic) {
    if (++wrong <= 20)
      printf("min %a max %a bits %d: nonfinite %d/%d cubic %d/%d\n", m.min, m.max, bits,
             want.nonfinite, got.nonfinite, want.cubic, got.cubic);
    return;
  }
  compare(kCommon, want, got, m, bits, INVERSES);
  if (want.nonfinite) return;  // nothing reads the grid: every code 0, every value NaN
  if (want.cubic) {
    compare(kCubic, want, got, m, bits, INVERSES);
    if (INVERSES) compare(kCubicInverses, want, got, m, bits, INVERSES);
  } else {
    compare(kUniform, want, got, m, bits, INVERSES);
    if (INVERSES) compare(kUniformInverses, want, got, m, bits, INVERSES);
  }
}

}  // namespace

int main() {
  const float special[] = {0.0f, -0.0f, 0x1p-149f, 0x1p-126f, 0x1p-110f, 0x1p-102f,
                           0x1p-100f, 1e-30f, 1e-6f, 0.5f, 1.0f, 3.0f, 1e6f, 0x1p100f,
                           0x1p125f, 0x1p126f, 0x1.fffffep127f, __builtin_inff(),
                           __builtin_nanf("")};
  std::vector<float> values;
  for (float v : special) {
    values.push_back(v);
    values.push_back(-v);
  }
  uint64_t state = 1;
  for (int i = 0; i < 400; ++i) {  // random finite floats of every exponent
    uint32_t b = (uint32_t)next_random(state);
    if ((b & 0x7f800000u) == 0x7f800000u) b &= 0xbfffffffu;
    values.push_back(qnccl::bits_float(b));
  }
  unsigned long long cases = 0;
  for (float x : values)
    for (float y : values) {
      // min <= max, or NaN for a non-finite bucket, as the encoder writes them; also
      // -0.0 and infinities, which it never writes: both forms must still agree there
      const BucketMeta m = x == x && y == y ? BucketMeta{x < y ? x : y, x < y ? y : x}
                                            : BucketMeta{__builtin_nanf(""), __builtin_nanf("")};
      for (int bits = 1; bits <= 8; ++bits) {
        for (bool cubic : {true, false}) {
          check<true>(m, bits, cubic);
          check<false>(m, bits, cubic);
        }
        cases += 4;
      }
    }
  printf("%llu cases checked: %llu fields differ\n", cases, wrong);
  return wrong == 0 ? 0 : 1;
}
