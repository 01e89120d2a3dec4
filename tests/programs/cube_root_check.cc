// Every float w in [0, 2^24) through the cubic grid's encoder (codec_math.h)
// against the definition it replaces (docs/wire-format.md): f = the largest
// integer in [0, d] with f^3 <= w, found by a binary search over exact cubes,
// then the nearest level f or f + 1 (with 255 codes, and with 15: four bits,
// whose floor, as three bits', comes from the estimate without its Newton
// step); below 2^13 (four bits' range: w <= 15^3 and a hair) also that floor
// itself (cube_floor_small). Prints the number of values where a fast path
// differs; exits 1 if any.
//
//   cube_root_check [FIRST_BITS LAST_BITS]   (hex float bit patterns, default all)
#include <cstdio>
#include <cstdlib>

#include "codec/codec_math.h"

namespace {

// The definition: a binary search of eight probes (d <= 255).
float floor_by_search(float w, float d) {
  float f = 0.0f;
  for (int b = 7; b >= 0; --b) {
    const float g = f + (float)(1 << b);
    f = ((g <= d) & (g * g * g <= w)) ? g : f;
  }
  return f;
}

// The nearest level, f or f + 1, given the floor f.
float nearest_of_floor(float w, float f, float d) {
  const float g = f + 1.0f, f3 = f * f * f;
  const float into = w - f3, width = g * g * g - f3;
  const float m = f + (into + into > width ? 1.0f : 0.0f);
  return m > d ? d : m;
}

float nearest_by_search(float w, float d) { return nearest_of_floor(w, floor_by_search(w, d), d); }

}  // namespace

int main(int argc, char** argv) {
  uint32_t first = 0, last = qnccl::float_bits(0x1p24f) - 1;
  if (argc == 3) {
    first = (uint32_t)strtoul(argv[1], nullptr, 16);
    last = (uint32_t)strtoul(argv[2], nullptr, 16);
  }
  // One side of a cubic grid with 255 codes above zero and unit 1: w = x.
  qnccl::BucketParams p = {};
  p.cubic = true;
  p.zero = 0.0f;
  p.span_pos = 255.0f;
  p.unit_pos = p.inv_unit_pos = 1.0f;
  // Each takes w and the search's floor f (searched once per value).
  auto floor_differs = [&](float w, float f) {
    const float got = qnccl::cube_floor(w);
    return (got > 255.0f ? 255.0f : got) != f;
  };
  auto small_differs = [&](float w, float f) {
    return w < 0x1p13f && qnccl::cube_floor_small(w) != f;
  };
  // four bits: 15 codes above zero, the floor without a division (as at three)
  qnccl::BucketParams p4 = p;
  p4.span_pos = 15.0f;
  // (the definition's level with 15 codes is its level with 255, at most 15)
  auto nearest_differs = [&](float w, float f) {
    const float want = nearest_of_floor(w, f, 255.0f);
    return ((float)qnccl::encode_nearest_cubic<8>(p, w) != want) |
           ((float)qnccl::encode_nearest_cubic<4>(p4, w) != (want > 15.0f ? 15.0f : want));
  };
  // Chunks counted by a loop that vectorizes; a chunk with a difference is
  // scanned again to name its values.
  unsigned long long floor_wrong = 0, small_wrong = 0, nearest_wrong = 0;
  const uint64_t chunk = 1u << 16;
  for (uint64_t c = first; c <= last; c += chunk) {
    const uint32_t n = (uint32_t)(last - c + 1 < chunk ? last - c + 1 : chunk);
    uint32_t wrong = 0;
    for (uint32_t j = 0; j < n; j++) {
      const float w = qnccl::bits_float((uint32_t)(c + j));
      const float f = floor_by_search(w, 255.0f);
      wrong += (uint32_t)floor_differs(w, f) + (uint32_t)small_differs(w, f) +
               (uint32_t)nearest_differs(w, f);
    }
    if (wrong == 0) continue;
    for (uint32_t j = 0; j < n; j++) {
      const float w = qnccl::bits_float((uint32_t)(c + j));
      const float f = floor_by_search(w, 255.0f);
      if (floor_differs(w, f) && floor_wrong++ < 5)
        std::printf("cube_floor(%.9g) = %g, the search finds %g\n", w, qnccl::cube_floor(w), f);
      if (small_differs(w, f) && small_wrong++ < 5)
        std::printf("cube_floor_small(%.9g) = %g, the search finds %g\n", w,
                    qnccl::cube_floor_small(w), f);
      if (nearest_differs(w, f) && nearest_wrong++ < 5)
        std::printf("nearest level of %.9g (of 255, of 15): %u %u, the search finds %g %g\n", w,
                    qnccl::encode_nearest_cubic<8>(p, w), qnccl::encode_nearest_cubic<4>(p4, w),
                    nearest_by_search(w, 255.0f), nearest_by_search(w, 15.0f));
    }
  }
  volatile float negative_zero = -0.0f;  // not folded at compile time
  if (qnccl::encode_nearest_cubic<8>(p, negative_zero) != 0 ||
      qnccl::encode_stochastic_cubic<8>(p, negative_zero, 0.5f) != 0) {
    std::printf("-0.0 does not encode as zero\n");
    nearest_wrong++;
  }
  std::printf("%llu values checked: cube_floor wrong %llu, cube_floor_small wrong %llu, "
              "nearest wrong %llu\n",
              (unsigned long long)(last - first) + 1, floor_wrong, small_wrong, nearest_wrong);
  return floor_wrong || small_wrong || nearest_wrong ? 1 : 0;
}
