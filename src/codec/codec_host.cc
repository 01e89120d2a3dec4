/* The host codec. Per-element math comes from codec_math.h (shared with the
 * CUDA kernels); this file only organizes the loops so the compiler can
 * vectorize them: values are processed in tiles of kTile, each tile's codes
 * are staged one per byte, then packed (or unpacked) eight at a time.
 *
 * Quantize, per bucket: one pass for min/max (the bucket then sits in L1 for
 * B up to several thousand values), one pass that encodes it into the stage.
 * Dequantize: unpack a tile's codes, then decode bucket by bucket.
 *
 * The Makefile compiles this file once per instruction set (QNCCL_HOST_ISA:
 * generic, and avx2 on x86-64); host_isa.cc picks one at run
 * time. Both give the same bytes: only IEEE operations, no contraction. */
#include <string.h>

#include <algorithm>

#include "codec/codec.h"
#include "codec/codec_math.h"

#ifndef QNCCL_HOST_ISA
#error "QNCCL_HOST_ISA names the instruction set this copy is built for (see the Makefile)"
#endif

namespace qnccl {
namespace QNCCL_HOST_ISA {
namespace {

/* Values per tile. A multiple of 8 (tiles start on packing groups) that
 * divides 2^32 (a tile never straddles a multiple of 2^32, so the high half
 * of the random-stream index is fixed within it). */
constexpr size_t kTile = 4096;
static_assert(kTile % kGroup == 0 && (1ull << 32) % kTile == 0, "tile alignment");

/* Four-lane float vectors (GCC/Clang vector extensions): the min/max
 * reduction below is one the auto-vectorizer does not take on. */
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

template <class D>
BucketMeta bucket_meta(const typename D::T* x, size_t n) {
  const BucketStats init = stats_init();
  f32x4 lo = {init.min, init.min, init.min, init.min};
  f32x4 hi = {init.max, init.max, init.max, init.max};
  i32x4 bad = {0, 0, 0, 0};
  const size_t full = n - n % 4;
  for (size_t i = 0; i < full; i += 4) {
    f32x4 v = {D::load(x[i]), D::load(x[i + 1]), D::load(x[i + 2]), D::load(x[i + 3])};
    lo = v < lo ? v : lo;                 // the same selects as stats_add, four at a time
    hi = v > hi ? v : hi;
    bad |= (i32x4)(v - v != 0.0f);
  }
  BucketStats total = init;
  for (size_t i = full; i < n; i++) stats_add(total, D::load(x[i]));
  for (int j = 0; j < 4; j++) stats_merge(total, BucketStats{lo[j], hi[j], (uint32_t)(bad[j] != 0)});
  return stats_meta(total);
}

template <class D>
void encode_nearest_run(const typename D::T* x, size_t n, const BucketParams& p, uint8_t* codes) {
  for (size_t j = 0; j < n; j++) codes[j] = (uint8_t)encode_nearest(p, D::load(x[j]));
}

/* Values [first, first + n) of the call; the run lies inside one tile. */
template <class D>
void encode_stochastic_run(const typename D::T* x, size_t n, const BucketParams& p, RngKey key,
                           uint64_t first, uint8_t* codes) {
  uint32_t lo = (uint32_t)first, hi = (uint32_t)(first >> 32);
  for (uint32_t j = 0; j < (uint32_t)n; j++)
    codes[j] = (uint8_t)encode_stochastic(p, D::load(x[j]), rng_uniform_split(key, lo + j, hi));
}

/* Packs `n` staged codes (the stage is zero past n up to the next group)
 * into `out`, which has room for `room` bytes. A group stores a whole 8-byte
 * word, overlapping the next group (which overwrites the excess), while the
 * word fits in `room`; near the end it stores only the bytes that fit (a
 * partial last group may own fewer than BITS bytes). */
template <int BITS>
void pack_stage(const uint8_t* stage, size_t n, uint8_t* out, size_t room) {
  const size_t groups = (n + kGroup - 1) / kGroup;
  for (size_t g = 0; g < groups; g++) {
    uint64_t w;
    memcpy(&w, stage + g * kGroup, 8);
    w = pack8<BITS>(w);
    if (g * BITS + 8 <= room)
      memcpy(out + g * BITS, &w, 8);
    else
      memcpy(out + g * BITS, &w, std::min<size_t>(BITS, room - g * BITS));
  }
}

/* Inverse of pack_stage: reads whole words while they fit in `room`. */
template <int BITS>
void unpack_stage(const uint8_t* in, size_t n, size_t room, uint8_t* stage) {
  const size_t groups = (n + kGroup - 1) / kGroup;
  for (size_t g = 0; g < groups; g++) {
    uint64_t w = 0;
    if (g * BITS + 8 <= room)
      memcpy(&w, in + g * BITS, 8);
    else
      memcpy(&w, in + g * BITS, std::min<size_t>(BITS, room - g * BITS));
    w = unpack8<BITS>(w);
    memcpy(stage + g * kGroup, &w, 8);
  }
}

template <class D, int BITS>
void encode_buffer(const typename D::T* src, size_t count, const CodecParams& p, uint8_t* dst) {
  const size_t nb = num_buckets(count, p.bucket);
  uint8_t* codes = dst + nb * kMetaBytes;
  const size_t room = code_bytes(count, BITS);
  const RngKey key = rng_key(p.seed, p.stream);
  alignas(64) uint8_t stage[kTile + kGroup];

  size_t bucket = 0, bucket_end = 0;
  BucketParams bp{};
  for (size_t t0 = 0; t0 < count; t0 += kTile) {
    const size_t t1 = std::min(count, t0 + kTile);
    for (size_t i = t0; i < t1;) {
      if (i == bucket_end) {
        bucket_end = std::min(count, i + p.bucket);
        BucketMeta m = bucket_meta<D>(src + i, bucket_end - i);
        memcpy(dst + bucket++ * kMetaBytes, &m, kMetaBytes);
        bp = bucket_params(m, BITS);
      }
      const size_t end = std::min(t1, bucket_end);
      uint8_t* out = stage + (i - t0);
      if (bp.nonfinite)
        memset(out, 0, end - i);
      else if (p.rounding == qncclRoundStochastic)
        encode_stochastic_run<D>(src + i, end - i, bp, key, i, out);
      else
        encode_nearest_run<D>(src + i, end - i, bp, out);
      i = end;
    }
    memset(stage + (t1 - t0), 0, kGroup);  // zero codes pad the last group
    const size_t offset = t0 / kGroup * BITS;
    pack_stage<BITS>(stage, t1 - t0, codes + offset, room - offset);
  }
  // Zero the bytes between the end of the bit stream and the 8-byte boundary.
  const size_t used = (count / 8) * BITS + ((count % 8) * BITS + 7) / 8;
  memset(codes + used, 0, room - used);
}

template <class D, bool ACCUMULATE>
void decode_run(const uint8_t* codes, size_t n, const BucketParams& p, typename D::T* out) {
  if (p.nonfinite) {
    const typename D::T nan = D::store(bits_float(kCanonicalNanF32));
    for (size_t j = 0; j < n; j++) out[j] = nan;
    return;
  }
  for (size_t j = 0; j < n; j++) {
    float y = decode(p, codes[j]);
    out[j] = D::store(ACCUMULATE ? accumulate(D::load(out[j]), y) : y);
  }
}

template <class D, int BITS, bool ACCUMULATE>
void decode_buffer(const uint8_t* src, size_t count, const CodecParams& p, typename D::T* dst) {
  const size_t nb = num_buckets(count, p.bucket);
  const uint8_t* codes = src + nb * kMetaBytes;
  const size_t room = code_bytes(count, BITS);
  alignas(64) uint8_t stage[kTile + kGroup];

  size_t bucket = 0, bucket_end = 0;
  BucketParams bp{};
  for (size_t t0 = 0; t0 < count; t0 += kTile) {
    const size_t t1 = std::min(count, t0 + kTile);
    const size_t offset = t0 / kGroup * BITS;
    unpack_stage<BITS>(codes + offset, t1 - t0, room - offset, stage);
    for (size_t i = t0; i < t1;) {
      if (i == bucket_end) {
        bucket_end = std::min(count, i + p.bucket);
        BucketMeta m;
        memcpy(&m, src + bucket++ * kMetaBytes, kMetaBytes);
        bp = bucket_params(m, BITS);
      }
      const size_t end = std::min(t1, bucket_end);
      decode_run<D, ACCUMULATE>(stage + (i - t0), end - i, bp, dst + i);
      i = end;
    }
  }
}

/* Calls fn(std::integral_constant<int, BITS>) for bits in 1..8. */
template <class Fn>
void dispatch_bits(int bits, Fn&& fn) {
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

}  // namespace

void host_quantize(const void* src, size_t count, ncclDataType_t type, const CodecParams& p,
                   void* dst) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    dispatch_bits(p.bits, [&](auto bits) {
      encode_buffer<D, bits.value>((const typename D::T*)src, count, p, (uint8_t*)dst);
    });
  });
}

void host_dequantize(const void* src, size_t count, const CodecParams& p, void* dst,
                     ncclDataType_t type, bool accumulate) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    dispatch_bits(p.bits, [&](auto bits) {
      if (accumulate)
        decode_buffer<D, bits.value, true>((const uint8_t*)src, count, p, (typename D::T*)dst);
      else
        decode_buffer<D, bits.value, false>((const uint8_t*)src, count, p, (typename D::T*)dst);
    });
  });
}

}  // namespace QNCCL_HOST_ISA
}  // namespace qnccl
