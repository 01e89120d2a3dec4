/* What the CUDA codec's host code (codec_cuda.cc) and its kernels
 * (codec_kernels.cu, compiled by NVRTC at build time) share: the launch
 * geometry and the kernels' arguments. The arguments cross to the device by
 * value, so they hold only pointers, sizes, ints and bools, which have the
 * same layout on both sides. */
#ifndef QNCCL_CODEC_CODEC_KERNELS_H_
#define QNCCL_CODEC_CODEC_KERNELS_H_

#include "codec/codec_math.h"

namespace qnccl {

constexpr int kWarp = 32;
constexpr int kBlockThreads = 256;
constexpr int kWarpsPerBlock = kBlockThreads / kWarp;
/* Grid-stride loops cover any count; beyond a few waves of blocks more
 * blocks only add scheduling. */
constexpr size_t kMaxBlocks = 4096;
/* Pass 1 (plan_stats): buckets longer than kSliceValues are cut into at
 * most kMaxSlicesPerBucket slices of at least kSliceValues values, so one
 * warp never walks a huge bucket alone; lane groups are sized to give each
 * lane at least kValuesPerLane values. */
constexpr size_t kSliceValues = 4096;
constexpr size_t kMaxSlicesPerBucket = 256;
constexpr size_t kValuesPerLane = 4;

QNCCL_HD size_t ceil_div(size_t a, size_t b) { return a / b + (a % b != 0); }
QNCCL_HD size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* a / b. 64-bit division is a long instruction sequence on the GPU; indices
 * that fit 32 bits (all but huge calls) take the short one. */
QNCCL_HD size_t div_index(size_t a, size_t b) {
  if (((a | b) >> 32) == 0) return (uint32_t)a / (uint32_t)b;
  return a / b;
}

/* ---- Kernel arguments ----------------------------------------------------- */

/* An item is bucket k, or slice j of bucket k when buckets are sliced:
 * values [k*bucket + j*slice, min(that + slice, (k+1)*bucket, count)).
 * Items are numbered k*slices_per_bucket + j and all hold at least one value
 * (plan_stats gives the short last bucket only the slices it fills). With
 * slices_per_bucket = 1, slice = bucket. */
template <class Type>
struct StatsArgs {
  const typename Type::T* src;
  size_t count, bucket, slice, slices_per_bucket, items;
  int lanes;       // lanes reducing one item: a power of two <= kWarp
  uint8_t* out;    // stats_meta of item i at out + 8i
  bool out_aligned;
  float clip;      // clip_meta's f for the metadata (CodecParams::clip); 0 for partials
};

/* Quantize in one pass when a bucket is a power of two from kGroup to
 * kSliceValues values: a bucket is then whole packing groups, and a span of
 * max(1, bucket / kSpanValues) warp tiles (kSpanValues = a tile's 256
 * values) holds whole buckets. One warp reduces a span's buckets (groups of
 * min(kWarp, bucket / kGroup) lanes, each lane one packing group per tile),
 * stores their metadata and encodes the span from them, the values still
 * in registers or the L1 cache: one kernel reads the input once. Other
 * buckets take two passes (statistics, then encoding). */
constexpr size_t kSpanValues = (size_t)kWarp * kGroup;

QNCCL_HD bool one_pass(size_t bucket) {
  return bucket >= kGroup && bucket <= kSliceValues && (bucket & (bucket - 1)) == 0;
}

QNCCL_HD size_t span_tiles(size_t bucket) {
  return one_pass(bucket) && bucket > kSpanValues ? bucket / kSpanValues : 1;
}

template <class Type>
struct EncodeArgs {
  const typename Type::T* src;
  size_t count, bucket;
  uint8_t* meta;   // pass 1's output, or written by the encode itself (stats_lanes > 0)
  uint8_t* codes;  // the code area, code_bytes(count, bits) long
  size_t code_bytes;
  int stats_lanes;    // one pass: lanes per bucket, min(kWarp, bucket / kGroup); 0: two passes
  size_t span_tiles;  // tiles a warp takes at once: span_tiles(bucket), 1 with two passes
  RngKey key;
  bool src_vectors;   // src is 16-byte aligned
  bool wire_aligned;  // meta (and so codes) is 8-byte aligned
  bool cubic;         // CodecParams::cubic
  float clip;         // CodecParams::clip (one pass: the metadata it stores)
  // CodecParams::call and what goes with it: the key is read when the kernel runs.
  const uint64_t* call;
  uint64_t seed, segment, rank, step;
  uint64_t first;  // value i draws u(first + i)
};

/* The random key of an encode: fixed when it was enqueued, or derived from
 * the call number in device memory when it runs. */
template <class Type>
QNCCL_HD RngKey key_of(const EncodeArgs<Type>& a) {
  return a.call == nullptr ? a.key
                           : rng_key(a.seed, stream_id(*a.call, a.segment, a.rank, a.step));
}

/* Warp spans of an encode: one warp each. */
template <class Type>
QNCCL_HD size_t num_spans(const EncodeArgs<Type>& a) {
  return ceil_div(ceil_div(ceil_div(a.count, kGroup), kWarp), a.span_tiles);
}

template <class Type>
struct DecodeArgs {
  const uint8_t* meta;
  const uint8_t* codes;
  size_t code_bytes;
  typename Type::T* dst;
  size_t count, bucket;
  bool dst_vectors;   // dst is 16-byte aligned
  bool wire_aligned;  // meta (and so codes) is 8-byte aligned
  bool cubic;         // CodecParams::cubic
};

/* Up to kReduceWires compressed buffers per launch of the reduce kernel
 * (they cross as kernel parameters); more take further launches that carry
 * on from acc. */
constexpr int kReduceWires = 32;

template <class Type>
struct ReduceArgs {
  const typename Type::T* src;  // widened into acc first; null: acc holds the sum so far
  const float* residual;        // added to the widened src, or null
  float* acc;
  size_t count, bucket, meta_bytes, code_bytes;
  const uint8_t* wires[kReduceWires];  // each: metadata, then codes at + meta_bytes
  int nwires;
  bool src_vectors, residual_vectors, acc_vectors;  // 16-byte aligned
  bool wire_aligned;                                // every wire 8-byte aligned
  bool cubic;                                       // CodecParams::cubic
};

/* Up to kDecodeItems compressed buffers per launch of the decode-many
 * kernel, each decoded into its own output; one lane per packing group of
 * all of them. */
constexpr int kDecodeItems = 32;

template <class Type>
struct DecodeManyArgs {
  const uint8_t* metas[kDecodeItems];
  const uint8_t* codes[kDecodeItems];
  size_t code_bytes[kDecodeItems];
  typename Type::T* dsts[kDecodeItems];
  size_t counts[kDecodeItems];
  size_t first_group[kDecodeItems + 1];  // item i: groups [first_group[i], first_group[i + 1])
  int n;
  size_t bucket;
  bool dst_vectors;   // every dst 16-byte aligned
  bool wire_aligned;  // every wire 8-byte aligned
  bool cubic;         // CodecParams::cubic
};

/* Up to kEncodeItems buffers per launch of the encode kernel: one for a
 * quantize, or the N - 1 encodes of SRA's scatter (after one stats-many
 * launch when the buckets take two passes), each quantized as one quantize
 * would with its own random stream. Only buckets that stay whole in pass 1
 * (bucket <= kSliceValues) take several; longer ones are quantized one
 * buffer at a time. */
constexpr int kEncodeItems = 16;

/* Pass 1 over several buffers: bucket k of buffer i is item
 * first_item[i] + k; its metadata goes to outs[i] + 8k. */
template <class Type>
struct StatsManyArgs {
  const typename Type::T* srcs[kEncodeItems];
  size_t counts[kEncodeItems];
  uint8_t* outs[kEncodeItems];
  size_t first_item[kEncodeItems + 1];
  int n;
  size_t bucket;
  int lanes;         // as StatsArgs::lanes
  bool out_aligned;  // every out 8-byte aligned
  float clip;        // as StatsArgs::clip
};

/* The encode kernel's buffers: warp span s of buffer i is span
 * first_span[i] + s of the launch. */
template <class Type>
struct EncodeManyArgs {
  EncodeArgs<Type> items[kEncodeItems];
  size_t first_span[kEncodeItems + 1];
  int n;
};

/* Kernel arguments cross as parameters, at most 4 KiB on every architecture. */
static_assert(sizeof(EncodeManyArgs<F32>) <= 4096 && sizeof(DecodeManyArgs<F32>) <= 4096 &&
                  sizeof(ReduceArgs<F32>) <= 4096 && sizeof(StatsManyArgs<F32>) <= 4096,
              "kernel parameters over 4 KiB");

}  // namespace qnccl

#endif
