/* The CUDA codec's kernels: the device half of codec.h, compiled by NVRTC
 * at build time (scripts/nvrtc_build.py) for every GPU architecture the
 * library carries; codec_cuda.cc plans and launches them. Per-element math comes from
 * codec_math.h, rng.h and dtype.h, the same functions the host codec runs,
 * so both write the same bytes (docs/wire-format.md). This file only maps
 * the work onto threads; everything is enqueued on the caller's stream,
 * nothing synchronizes or allocates.
 *
 * Quantize is one kernel, encode_kernel, when buckets are powers of two up
 * to kSliceValues values (one_pass(), codec_kernels.h): a warp reduces the
 * buckets of its span of tiles, stores their metadata and encodes them. Other
 * buckets take two passes over the input:
 *   1. stats_kernel: min/max of every bucket into the metadata. A
 *      group of `lanes` lanes (a power of two, up to a warp) reduces one
 *      bucket. Buckets longer than kSliceValues are cut into slices whose
 *      partial metadata goes to scratch space in the (not yet written) code
 *      area; a second launch of the same kernel merges them.
 *   2. encode_kernel, reading pass 1's metadata.
 * Encoding gives one lane per packing group of 8 values (8 codes -> BITS
 * bytes); a warp stages its tile of 32 groups, 32*BITS contiguous bytes, in
 * shared memory and stores them as whole words.
 * Dequantize is one pass, decode_kernel: one lane per packing group; so is
 * reduce_kernel, which widens the input and adds several decoded buffers.
 *
 * Per-lane work lives in QNCCL_HD functions; the kernels are the loops that
 * hand out lanes, plus the warp shuffles and shared-memory staging.
 *
 * Alignment: typed buffers must be aligned to their element size (else
 * cudaErrorMisalignedAddress); a group moves as 16-byte vectors when the
 * buffer is 16-byte aligned. The compressed buffer may have any alignment;
 * at 8 bytes (cudaMalloc gives 256) metadata and codes move as words. */
#include "codec/codec_kernels.h"

namespace qnccl {

constexpr unsigned kFullWarp = 0xffffffffu;

/* ---- Memory access ------------------------------------------------------ */

/* Metadata of bucket (or slice) k: 8 bytes at meta + 8k, little-endian like
 * the GPU. `aligned`: meta is 8-byte aligned. */
QNCCL_HD BucketMeta load_meta(const uint8_t* meta, size_t k, bool aligned) {
  const uint8_t* p = meta + k * kMetaBytes;
  uint32_t lo = 0, hi = 0;
  if (aligned) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    lo = w.x;
    hi = w.y;
  } else {
    for (int b = 0; b < 4; ++b) {
      lo |= (uint32_t)p[b] << (8 * b);
      hi |= (uint32_t)p[4 + b] << (8 * b);
    }
  }
  BucketMeta m = {bits_float(lo), bits_float(hi)};
  return m;
}

QNCCL_HD void store_meta(uint8_t* meta, size_t k, BucketMeta m, bool aligned) {
  uint8_t* p = meta + k * kMetaBytes;
  const uint32_t lo = float_bits(m.min), hi = float_bits(m.max);
  if (aligned) {
    *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
  } else {
    for (int b = 0; b < 4; ++b) {
      p[b] = (uint8_t)(lo >> (8 * b));
      p[4 + b] = (uint8_t)(hi >> (8 * b));
    }
  }
}

/* Eight elements from a 16-byte aligned address, as two or one 16-byte loads. */
QNCCL_HD void load8(const float* p, float (&v)[kGroup]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

QNCCL_HD void load8(const uint16_t* p, uint16_t (&v)[kGroup]) {
  const uint4 a = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
  for (int i = 0; i < 4; ++i) v[2 * i] = (uint16_t)w[i], v[2 * i + 1] = (uint16_t)(w[i] >> 16);
}

QNCCL_HD void store8(float* p, const float (&v)[kGroup]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

QNCCL_HD void store8(uint16_t* p, const uint16_t (&v)[kGroup]) {
  uint32_t w[4];
  for (int i = 0; i < 4; ++i) w[i] = v[2 * i] | (uint32_t)v[2 * i + 1] << 16;
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

/* Values [first, first + len) widened to float32 into x[0, len), len <= 8.
 * `vectors`: src is 16-byte aligned, so a whole group (first is a multiple
 * of 8) is too. */
template <class Type>
QNCCL_HD void load_group(const typename Type::T* src, size_t first, int len, bool vectors,
                         float (&x)[kGroup]) {
  typename Type::T raw[kGroup];
  if (vectors && len == (int)kGroup) {
    load8(src + first, raw);
  } else {
    for (int j = 0; j < (int)kGroup; ++j) raw[j] = j < len ? src[first + j] : (typename Type::T)0;
  }
  for (int j = 0; j < (int)kGroup; ++j) x[j] = Type::load(raw[j]);
}

template <class Type>
QNCCL_HD void store_group(typename Type::T* dst, size_t first, int len, bool vectors,
                          const float (&y)[kGroup]) {
  typename Type::T raw[kGroup];
  for (int j = 0; j < (int)kGroup; ++j) raw[j] = Type::store(y[j]);
  if (vectors && len == (int)kGroup) {
    store8(dst + first, raw);
  } else {
    for (int j = 0; j < len; ++j) dst[first + j] = raw[j];
  }
}

/* The BITS code bytes of packing group g, the first in the low byte; what
 * follows them in the result is garbage for unpack8 to mask. Reads only
 * inside the code area's `bytes` (a multiple of 8), which the last group
 * may overhang. `aligned`: codes is 8-byte aligned. */
template <int BITS>
QNCCL_HD uint64_t load_code_group(const uint8_t* codes, size_t bytes, size_t g, bool aligned) {
  const size_t begin = g * BITS;
  if (aligned) {
    const uint64_t* words = reinterpret_cast<const uint64_t*>(codes);
    const size_t w = begin / 8;
    const int shift = 8 * (int)(begin % 8);
    uint64_t v = words[w] >> shift;
    if (shift != 0 && (w + 1) * 8 < bytes) v |= words[w + 1] << (64 - shift);
    return v;
  }
  uint64_t v = 0;
  for (int b = 0; b < BITS; ++b)
    if (begin + b < bytes) v |= (uint64_t)codes[begin + b] << (8 * b);
  return v;
}

/* ---- Pass 1: bucket metadata -------------------------------------------- */

/* Stats of the values of `item` that lane `rank` (of the item's a.lanes)
 * reads: every a.lanes-th, so a group reads contiguous memory. */
template <class Type>
QNCCL_HD BucketStats lane_stats(const StatsArgs<Type>& a, size_t item, int rank) {
  const size_t k = a.slices_per_bucket == 1 ? item : div_index(item, a.slices_per_bucket);
  const size_t bucket_begin = k * a.bucket;
  // No overflow: k > 0 means bucket < count, so the sum stays below 2 * count.
  const size_t bucket_end = min_size(bucket_begin + a.bucket, a.count);
  const size_t begin = bucket_begin + (item - k * a.slices_per_bucket) * a.slice;
  const size_t end = min_size(begin + a.slice, bucket_end);
  BucketStats s = stats_init();
#pragma unroll 4
  for (size_t i = begin + rank; i < end; i += a.lanes) stats_add(s, Type::load(a.src[i]));
  return s;
}

__device__ BucketStats shfl_xor_stats(const BucketStats& s, int mask) {
  BucketStats o;
  o.min = __shfl_xor_sync(kFullWarp, s.min, mask);
  o.max = __shfl_xor_sync(kFullWarp, s.max, mask);
  o.nonfinite = __shfl_xor_sync(kFullWarp, s.nonfinite, mask);
  return o;
}

/* Pass 1 over `items` items reduced by `lanes` lanes each: each warp takes
 * kWarp / lanes consecutive items per step; lane group `lane / lanes` owns
 * one of them. locate(item, &local) gives the StatsArgs the item belongs to
 * and its index there. */
template <class Type, class Locate>
__device__ __forceinline__ void stats_items(size_t items, int lanes, Locate locate) {
  const int lane = threadIdx.x % kWarp;
  const int rank = lane % lanes;
  const size_t per_warp = kWarp / lanes;
  const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / kWarp;
  const size_t warps = gridDim.x * (size_t)blockDim.x / kWarp;
  // `first` is the same in all lanes: every lane reaches every shuffle.
  for (size_t first = warp * per_warp; first < items; first += warps * per_warp) {
    const size_t item = first + lane / lanes;
    size_t local = 0;
    const StatsArgs<Type> a = locate(item < items ? item : items - 1, &local);
    BucketStats s = item < items ? lane_stats(a, local, rank) : stats_init();
    // XOR masks below lanes stay inside the aligned lane group.
    for (int mask = lanes / 2; mask > 0; mask /= 2) stats_merge(s, shfl_xor_stats(s, mask));
    if (rank == 0 && item < items)
      store_meta(a.out, local, clip_meta(stats_meta(s), a.clip), a.out_aligned);
  }
}

template <class Type>
__device__ __forceinline__ void stats_kernel(const StatsArgs<Type>& a) {
  stats_items<Type>(a.items, a.lanes, [&](size_t item, size_t* local) {
    *local = item;
    return a;
  });
}

/* stats_kernel over the buckets of several buffers (whole buckets only):
 * the same metadata as one stats pass per buffer. */
template <class Type>
__device__ __forceinline__ void stats_many_kernel(const StatsManyArgs<Type>& a) {
  stats_items<Type>(a.first_item[a.n], a.lanes, [&](size_t item, size_t* local) {
    int i = 0;
    while (i + 1 < a.n && item >= a.first_item[i + 1]) ++i;
    *local = item - a.first_item[i];
    return StatsArgs<Type>{a.srcs[i], a.counts[i], a.bucket, a.bucket, 1,
                           a.first_item[i + 1] - a.first_item[i], a.lanes, a.outs[i],
                           a.out_aligned, a.clip};
  });
}

/* ---- Encode -------------------------------------------------------------- */

/* The code of value i (x) of a bucket with params bp: zero in a non-finite bucket. */
template <int BITS, bool STOCHASTIC>
QNCCL_HD uint32_t encode_value(const BucketParams& bp, float x, RngKey key, uint64_t i) {
  if (bp.nonfinite) return 0;
  if constexpr (STOCHASTIC)
    return encode_stochastic<BITS>(bp, x, rng_uniform(key, i));
  else
    return encode_nearest<BITS>(bp, x);
}

/* Codes of values [8g, 8g + 8) (x, those below count), packed: BITS bytes in
 * the low bytes of the result, zero past count. One pass: every value is in
 * the bucket of params `bp`; two passes: each value's bucket is read from
 * the metadata. */
template <class Type, int BITS, bool STOCHASTIC, bool ONE_PASS>
QNCCL_HD uint64_t encode_group(const EncodeArgs<Type>& a, RngKey key, size_t g,
                               const float (&x)[kGroup], BucketParams bp) {
  const size_t first = g * kGroup;
  const int len = (int)min_size(kGroup, a.count - first);
  // Bucket k holds value first + j while first + j < next; no overflow as in lane_stats.
  size_t k = 0, next = 0;
  if constexpr (!ONE_PASS) {
    k = div_index(first, a.bucket);
    next = k * a.bucket + a.bucket;
    bp = bucket_params_of_grid<true>(load_meta(a.meta, k, a.wire_aligned), BITS, a.cubic);
  }
  uint64_t codes = 0;  // code j in byte j, as pack8 takes them
#pragma unroll
  for (int j = 0; j < (int)kGroup; ++j) {
    if (j >= len) break;
    if (!ONE_PASS && first + j == next) {  // buckets not a multiple of 8 end inside groups
      ++k;
      next += a.bucket;
      bp = bucket_params_of_grid<true>(load_meta(a.meta, k, a.wire_aligned), BITS, a.cubic);
    }
    codes |= (uint64_t)encode_value<BITS, STOCHASTIC>(bp, x[j], key, a.first + first + j) << (8 * j);
  }
  return pack8<BITS>(codes);
}

/* Warp tile t: groups [32t, 32t + 32), so code bytes [t*kBytes, (t+1)*kBytes),
 * staged in kWords shared words. */
template <int BITS>
struct Tile {
  static constexpr int kBytes = kWarp * BITS;
  static constexpr int kWords = kBytes / 4;
};

/* Lane `lane` (group 32t + lane) puts its BITS code bytes in the staging words. */
template <int BITS>
QNCCL_HD void stage_group(uint32_t* tile_words, int lane, uint64_t packed) {
  uint8_t* bytes = reinterpret_cast<uint8_t*>(tile_words) + lane * BITS;
  for (int b = 0; b < BITS; ++b) bytes[b] = (uint8_t)(packed >> (8 * b));
}

/* Lane `lane`'s share of storing staged tile t, clipped to the code area.
 * The last tile ends at or past code_bytes (a multiple of 8, so of 4): the
 * zeros staged for groups past count become the padding. */
template <int BITS>
QNCCL_HD void store_tile(const uint32_t* tile_words, uint8_t* codes, size_t code_bytes, size_t t,
                         int lane, bool aligned) {
  const size_t begin = t * Tile<BITS>::kBytes;
  const size_t bytes = min_size(Tile<BITS>::kBytes, code_bytes - begin);
  if (aligned) {
    uint32_t* out = reinterpret_cast<uint32_t*>(codes + begin);
    for (size_t w = lane; w < bytes / 4; w += kWarp) out[w] = tile_words[w];
  } else {
    const uint8_t* staged = reinterpret_cast<const uint8_t*>(tile_words);
    for (size_t b = lane; b < bytes; b += kWarp) codes[begin + b] = staged[b];
  }
}

/* Lane `lane` of the warp encoding tile t: its packing group's values x
 * (zeros past count), loaded, and whether the group holds any. */
template <class Type>
__device__ __forceinline__ bool load_lane_group(const EncodeArgs<Type>& a, size_t t, int lane,
                                                float (&x)[kGroup]) {
  const size_t g = t * kWarp + lane;
  if (g >= ceil_div(a.count, kGroup)) return false;
  load_group<Type>(a.src, g * kGroup, (int)min_size(kGroup, a.count - g * kGroup), a.src_vectors,
                   x);
  return true;
}

/* One warp encodes tile t of `a` (the lane's values x if it has a group);
 * every lane of the warp calls it. */
template <class Type, int BITS, bool STOCHASTIC, bool ONE_PASS>
__device__ __forceinline__ void encode_tile(const EncodeArgs<Type>& a, RngKey key, size_t t,
                                            bool has_group, const float (&x)[kGroup],
                                            BucketParams bp, uint32_t* tile_words, int lane) {
  const size_t g = t * kWarp + lane;
  const uint64_t packed =
      has_group ? encode_group<Type, BITS, STOCHASTIC, ONE_PASS>(a, key, g, x, bp) : 0;
  stage_group<BITS>(tile_words, lane, packed);
  __syncwarp();
  store_tile<BITS>(tile_words, a.codes, a.code_bytes, t, lane, a.wire_aligned);
  __syncwarp();  // the next tile restages these words
}

/* One warp quantizes span s of `a` (tiles [s * span_tiles, ...)); every
 * lane of the warp calls it. One pass: the lanes reduce their groups' stats
 * across the bucket's stats_lanes lanes and the span's tiles, the first lane
 * of a bucket stores its metadata, and every lane encodes with its bucket's
 * params (the first tile's values still in registers). */
template <class Type, int BITS, bool STOCHASTIC>
__device__ __forceinline__ void encode_span(const EncodeArgs<Type>& a, RngKey key, size_t s,
                                            uint32_t* tile_words, int lane) {
  const size_t tiles = ceil_div(ceil_div(a.count, kGroup), kWarp);
  const size_t t0 = s * a.span_tiles;
  float x[kGroup] = {};
  bool has_group = load_lane_group(a, t0, lane, x);
  if (a.stats_lanes == 0) {  // uniform across the warp, as are t0 and every t below
    encode_tile<Type, BITS, STOCHASTIC, false>(a, key, t0, has_group, x, BucketParams{}, tile_words,
                                               lane);
    return;
  }
  BucketStats st = stats_init();
  const size_t first = (t0 * kWarp + lane) * kGroup;
  for (int j = 0; j < (int)kGroup; ++j)
    if (first + j < a.count) stats_add(st, x[j]);
  for (size_t t = t0 + 1; t < t0 + a.span_tiles && t < tiles; ++t) {
    float y[kGroup];
    if (load_lane_group(a, t, lane, y))
      for (int j = 0; j < (int)kGroup; ++j)
        if ((t * kWarp + lane) * kGroup + j < a.count) stats_add(st, y[j]);
  }
  for (int mask = a.stats_lanes / 2; mask > 0; mask /= 2) stats_merge(st, shfl_xor_stats(st, mask));
  const BucketMeta meta = clip_meta(stats_meta(st), a.clip);
  // The bucket's first lane: its group is the bucket's first (bucket = stats_lanes groups
  // or a whole span), so it holds values when the bucket does.
  if (lane % a.stats_lanes == 0 && has_group)
    store_meta(a.meta, div_index(first, a.bucket), meta, a.wire_aligned);
  const BucketParams bp = bucket_params_of_grid<true>(meta, BITS, a.cubic);
  encode_tile<Type, BITS, STOCHASTIC, true>(a, key, t0, has_group, x, bp, tile_words, lane);
  for (size_t t = t0 + 1; t < t0 + a.span_tiles && t < tiles; ++t) {
    has_group = load_lane_group(a, t, lane, x);  // the L1 cache's copy
    encode_tile<Type, BITS, STOCHASTIC, true>(a, key, t, has_group, x, bp, tile_words, lane);
  }
}

/* The spans of one or several buffers, in buffer order (one quantize, or
 * SRA's N - 1 at once). */
template <class Type, int BITS, bool STOCHASTIC>
__device__ __forceinline__ void encode_kernel(const EncodeManyArgs<Type>& a) {
  __shared__ uint32_t staging[kWarpsPerBlock][Tile<BITS>::kWords];
  uint32_t* tile_words = staging[threadIdx.x / kWarp];
  const int lane = threadIdx.x % kWarp;
  const size_t spans = a.first_span[a.n];
  const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / kWarp;
  const size_t warps = gridDim.x * (size_t)blockDim.x / kWarp;
  // `S` is the same in all lanes: every lane reaches every shuffle and __syncwarp.
  for (size_t S = warp; S < spans; S += warps) {
    int i = 0;
    while (S >= a.first_span[i + 1]) ++i;
    encode_span<Type, BITS, STOCHASTIC>(a.items[i], key_of(a.items[i]), S - a.first_span[i],
                                        tile_words, lane);
  }
}

/* ---- Dequantize --------------------------------------------------------- */

/* The decoded values of group g ([8g, 8g + len)) of one compressed buffer
 * (its metadata at `meta`, its code area at `codes`): the canonical NaN in a
 * non-finite bucket. */
template <int BITS>
QNCCL_HD void decode_values(const uint8_t* meta, const uint8_t* codes, size_t code_bytes,
                            size_t bucket, bool aligned, bool cubic, size_t g, int len,
                            float (&y)[kGroup]) {
  const size_t first = g * kGroup;
  const uint64_t packed = unpack8<BITS>(load_code_group<BITS>(codes, code_bytes, g, aligned));
  size_t k = div_index(first, bucket);  // as in encode_group
  size_t next = k * bucket + bucket;
  BucketParams bp = bucket_params_of_grid<false>(load_meta(meta, k, aligned), BITS, cubic);
#pragma unroll
  for (int j = 0; j < (int)kGroup; ++j) {
    if (j >= len) break;
    if (first + j == next) {
      ++k;
      next += bucket;
      bp = bucket_params_of_grid<false>(load_meta(meta, k, aligned), BITS, cubic);
    }
    y[j] = bp.nonfinite ? bits_float(kCanonicalNanF32)
                        : decode(bp, (uint32_t)(packed >> (8 * j)) & 0xffu);
  }
}

/* Values [8g, 8g + 8) (those below count): dst = y, or dst += y (a NaN y
 * gives the canonical NaN either way). */
template <class Type, int BITS, bool ACCUMULATE>
QNCCL_HD void decode_group(const DecodeArgs<Type>& a, size_t g) {
  const size_t first = g * kGroup;
  const int len = (int)min_size(kGroup, a.count - first);
  float y[kGroup] = {};
  decode_values<BITS>(a.meta, a.codes, a.code_bytes, a.bucket, a.wire_aligned, a.cubic, g, len,
                      y);
  if constexpr (ACCUMULATE) {
    float acc[kGroup] = {};
    load_group<Type>(a.dst, first, len, a.dst_vectors, acc);
    for (int j = 0; j < (int)kGroup; ++j) y[j] = accumulate(acc[j], y[j]);
  }
  store_group<Type>(a.dst, first, len, a.dst_vectors, y);
}

template <class Type, int BITS, bool ACCUMULATE>
__device__ __forceinline__ void decode_kernel(const DecodeArgs<Type>& a) {
  const size_t groups = ceil_div(a.count, kGroup);
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < groups; g += threads)
    decode_group<Type, BITS, ACCUMULATE>(a, g);
}

/* Group G of all the items' groups, in item order: item i's group
 * G - first_group[i], decoded as decode_kernel does. */
template <class Type, int BITS>
__device__ __forceinline__ void decode_many_kernel(const DecodeManyArgs<Type>& a) {
  const size_t total = a.first_group[a.n];
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t G = blockIdx.x * (size_t)blockDim.x + threadIdx.x; G < total; G += threads) {
    int i = 0;
    while (G >= a.first_group[i + 1]) ++i;
    const DecodeArgs<Type> d = {a.metas[i], a.codes[i], a.code_bytes[i], a.dsts[i],
                                a.counts[i], a.bucket, a.dst_vectors, a.wire_aligned, a.cubic};
    decode_group<Type, BITS, false>(d, G - a.first_group[i]);
  }
}

/* ---- Reduce -------------------------------------------------------------- */

/* Values [8g, 8g + 8): acc = widen(src) (+ residual) or acc, then
 * acc = acc + D(wire) for every wire, in order. */
template <class Type, int BITS>
QNCCL_HD void reduce_group(const ReduceArgs<Type>& a, size_t g) {
  const size_t first = g * kGroup;
  const int len = (int)min_size(kGroup, a.count - first);
  float acc[kGroup];
  if (a.src != nullptr) {
    load_group<Type>(a.src, first, len, a.src_vectors, acc);
    if (a.residual != nullptr) {
      float e[kGroup];
      load_group<F32>(a.residual, first, len, a.residual_vectors, e);
      for (int j = 0; j < (int)kGroup; ++j) acc[j] = accumulate(acc[j], e[j]);
    }
  } else {
    load_group<F32>(a.acc, first, len, a.acc_vectors, acc);
  }
  for (int w = 0; w < a.nwires; ++w) {
    float y[kGroup] = {};
    decode_values<BITS>(a.wires[w], a.wires[w] + a.meta_bytes, a.code_bytes, a.bucket,
                        a.wire_aligned, a.cubic, g, len, y);
    for (int j = 0; j < (int)kGroup; ++j) acc[j] = accumulate(acc[j], y[j]);
  }
  store_group<F32>(a.acc, first, len, a.acc_vectors, acc);
}

template <class Type, int BITS>
__device__ __forceinline__ void reduce_kernel(const ReduceArgs<Type>& a) {
  const size_t groups = ceil_div(a.count, kGroup);
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < groups; g += threads)
    reduce_group<Type, BITS>(a, g);
}

}  // namespace qnccl

/* ---- Entry points -------------------------------------------------------- */

/* One kernel per instantiation, with a C name the host looks up
 * (codec_cuda.cc, kernel_name()): qnccl_stats_<type>,
 * qnccl_encode_<type>_<bits>_<nearest|stochastic>,
 * qnccl_decode_<type>_<bits>_<store|accumulate>, qnccl_reduce_<type>_<bits>,
 * qnccl_decode_many_<type>_<bits>, qnccl_stats_many_<type>. An encode
 * takes one buffer (a quantize) or several (SRA's scatter). */
#define QNCCL_KERNEL extern "C" __global__ void __launch_bounds__(qnccl::kBlockThreads)

#define QNCCL_CODEC_BITS(TYPE, NAME, BITS)                                               \
  QNCCL_KERNEL qnccl_encode_##NAME##_##BITS##_nearest(                                    \
      const qnccl::EncodeManyArgs<qnccl::TYPE> a) {                                       \
    qnccl::encode_kernel<qnccl::TYPE, BITS, false>(a);                                    \
  }                                                                                       \
  QNCCL_KERNEL qnccl_encode_##NAME##_##BITS##_stochastic(                                 \
      const qnccl::EncodeManyArgs<qnccl::TYPE> a) {                                       \
    qnccl::encode_kernel<qnccl::TYPE, BITS, true>(a);                                     \
  }                                                                                       \
  QNCCL_KERNEL qnccl_decode_##NAME##_##BITS##_store(const qnccl::DecodeArgs<qnccl::TYPE> a) { \
    qnccl::decode_kernel<qnccl::TYPE, BITS, false>(a);                                           \
  }                                                                                       \
  QNCCL_KERNEL qnccl_decode_##NAME##_##BITS##_accumulate(                                 \
      const qnccl::DecodeArgs<qnccl::TYPE> a) {                                           \
    qnccl::decode_kernel<qnccl::TYPE, BITS, true>(a);                                            \
  }                                                                                       \
  QNCCL_KERNEL qnccl_reduce_##NAME##_##BITS(const qnccl::ReduceArgs<qnccl::TYPE> a) {     \
    qnccl::reduce_kernel<qnccl::TYPE, BITS>(a);                                           \
  }                                                                                       \
  QNCCL_KERNEL qnccl_decode_many_##NAME##_##BITS(const qnccl::DecodeManyArgs<qnccl::TYPE> a) { \
    qnccl::decode_many_kernel<qnccl::TYPE, BITS>(a);                                      \
  }

#define QNCCL_CODEC_TYPE(TYPE, NAME)                                                       \
  QNCCL_KERNEL qnccl_stats_##NAME(const qnccl::StatsArgs<qnccl::TYPE> a) {                 \
    qnccl::stats_kernel<qnccl::TYPE>(a);                                                  \
  }                                                                                       \
  QNCCL_KERNEL qnccl_stats_many_##NAME(const qnccl::StatsManyArgs<qnccl::TYPE> a) {        \
    qnccl::stats_many_kernel<qnccl::TYPE>(a);                                             \
  }                                                                                       \
  QNCCL_CODEC_BITS(TYPE, NAME, 1)                                                         \
  QNCCL_CODEC_BITS(TYPE, NAME, 2)                                                         \
  QNCCL_CODEC_BITS(TYPE, NAME, 3)                                                         \
  QNCCL_CODEC_BITS(TYPE, NAME, 4)                                                         \
  QNCCL_CODEC_BITS(TYPE, NAME, 5)                                                         \
  QNCCL_CODEC_BITS(TYPE, NAME, 6)                                                         \
  QNCCL_CODEC_BITS(TYPE, NAME, 7)                                                         \
  QNCCL_CODEC_BITS(TYPE, NAME, 8)

QNCCL_CODEC_TYPE(F32, f32)
QNCCL_CODEC_TYPE(F16, f16)
QNCCL_CODEC_TYPE(BF16, bf16)
