/* The host codec. Per-element math comes from codec_math.h (shared with the
 * CUDA kernels); this file only organizes the loops so the compiler can
 * vectorize them: values are processed in tiles of kTile, each tile's codes
 * are staged one per byte, then packed (or unpacked) eight at a time.
 *
 * Quantize, per bucket: one pass for min/max (the bucket then sits in L1 for
 * B up to several thousand values), one pass that encodes it into the stage.
 * Dequantize: unpack a tile's codes, then decode bucket by bucket.
 *
 * The Makefile compiles this file once per instruction set (QNCCL_CODEC_ISA:
 * generic, and avx2 and avx512 on x86-64); host_isa.cc picks one at run
 * time. All give the same bytes: only IEEE operations, no contraction. */
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_math.h"
#include "codec/rotation.h"

#ifndef QNCCL_CODEC_ISA
#error "QNCCL_CODEC_ISA names the instruction set this copy is built for (see the Makefile)"
#endif

namespace qnccl {
namespace QNCCL_CODEC_ISA {
namespace {

/* Values per tile: a multiple of 8 (tiles start on packing groups). */
constexpr size_t kTile = 4096;
constexpr size_t kLineValues = 64 / 4;  // float32 values per cache line (16-bit: half a line)
static_assert(kTile % kGroup == 0, "tile alignment");

/* Explicit vectors (GCC/Clang vector extensions) for the loops the
 * auto-vectorizer does not take on: the min/max reduction and the packing.
 * One register wide: 64 bytes in the AVX-512 build, 32 in the AVX2 build,
 * 16 otherwise. */
#if defined(__AVX512F__)
constexpr size_t kVectorBytes = 64;
#elif defined(__AVX2__)
constexpr size_t kVectorBytes = 32;
#else
constexpr size_t kVectorBytes = 16;
#endif
constexpr size_t kLanes = kVectorBytes / 4;    // float lanes
constexpr size_t kWords = kVectorBytes / 8;    // packing groups per vector
typedef float VecF __attribute__((vector_size(kVectorBytes)));
typedef int32_t VecI __attribute__((vector_size(kVectorBytes)));
typedef uint64_t VecW __attribute__((vector_size(kVectorBytes)));

template <class D>
VecF load_vector(const typename D::T* x) {
  VecF v = {};
  for (size_t j = 0; j < kLanes; j++) v[j] = D::load(x[j]);
  return v;
}

/* Lanes [first, first + sizeof...(J)) of v as a vector of that many lanes:
 * a narrower register (or the same one's low part), no memory. */
template <size_t first, class V, size_t... J>
inline __attribute__((always_inline)) auto lanes_from(V v, std::index_sequence<J...>) {
  return __builtin_shufflevector(v, v, (first + J)...);
}

/* One lane holding OP of all of v's lanes (OP: min, max or sum, exact in
 * any order here): the upper half folded onto the lower one until two
 * lanes remain, each fold on a vector half as wide. */
enum class Fold { kMin, kMax, kSum };
template <Fold OP, class V>
inline __attribute__((always_inline)) float fold_lanes(V v) {
  constexpr size_t n = sizeof(V) / sizeof(float);
  const auto op = [](auto a, auto b) {
    if constexpr (OP == Fold::kMin) return b < a ? b : a;
    else if constexpr (OP == Fold::kMax) return b > a ? b : a;
    else return a + b;
  };
  if constexpr (n == 2) {
    return op(v[0], v[1]);
  } else {
    constexpr auto half = std::make_index_sequence<n / 2>{};
    return fold_lanes<OP>(op(lanes_from<0>(v, half), lanes_from<n / 2>(v, half)));
  }
}

template <class D>
BucketMeta bucket_meta(const typename D::T* x, size_t n) {
  const BucketStats init = stats_init();
  // Min and max a vector at a time into kChains independent (min, max) pairs
  // so consecutive vectors do not wait for each other's compare. The order
  // does not matter: min and max of finite values are the same in any order
  // (up to the sign of zero, which stats_meta drops), and a NaN or Inf
  // anywhere makes the bucket non-finite whatever the rest holds.
  VecF lo0 = init.min + VecF{}, lo1 = lo0, lo2 = lo0, lo3 = lo0;
  VecF hi0 = init.max + VecF{}, hi1 = hi0, hi2 = hi0, hi3 = hi0;
  VecF nan = VecF{};  // NaN in the lanes where a value was NaN or Inf, else 0
  auto add = [&nan](VecF v, VecF& lo, VecF& hi) {
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    nan += v - v;  // inf - inf and NaN - NaN are NaN, which the sum keeps
  };
  constexpr size_t kChains = 4;
  const size_t full = n - n % kLanes, chained = n - n % (kChains * kLanes);
  size_t i = 0;
  for (; i < chained; i += kChains * kLanes) {
    __builtin_prefetch(x + i + 2048);
    add(load_vector<D>(x + i), lo0, hi0);
    add(load_vector<D>(x + i + kLanes), lo1, hi1);
    add(load_vector<D>(x + i + 2 * kLanes), lo2, hi2);
    add(load_vector<D>(x + i + 3 * kLanes), lo3, hi3);
  }
  for (; i < full; i += kLanes) add(load_vector<D>(x + i), lo0, hi0);
  lo0 = lo1 < lo0 ? lo1 : lo0;
  lo2 = lo3 < lo2 ? lo3 : lo2;
  lo0 = lo2 < lo0 ? lo2 : lo0;
  hi0 = hi1 > hi0 ? hi1 : hi0;
  hi2 = hi3 > hi2 ? hi3 : hi2;
  hi0 = hi2 > hi0 ? hi2 : hi0;
  // nan's lanes are 0 or NaN, so their sum is NaN exactly when one of them is
  const float nans = fold_lanes<Fold::kSum>(nan);
  BucketStats total = {fold_lanes<Fold::kMin>(lo0), fold_lanes<Fold::kMax>(hi0),
                       (uint32_t)(nans != nans)};
  for (; i < n; i++) stats_add(total, D::load(x[i]));
  return stats_meta(total);
}

/* Nearest rounding on a cubic grid by search (codec_math.h, cubic_threshold):
 * a bucket's L = 2^BITS - 1 thresholds in the order of a binary search's
 * levels (the middle one, then the middles of both halves, ..: level l holds
 * 2^l of them, from position 2^l - 1), each level one vector. A vector of
 * values finds its codes in BITS steps of a table lookup (one variable
 * permute), a compare and a doubling of the index: no cube root, no division.
 * It takes a permute instruction and the widest level in one vector: AVX2 up
 * to 4 bits, AVX-512 up to 5; elsewhere the closed form runs. */
template <int BITS>
constexpr bool kCubicSearch = kVectorBytes >= 32 && BITS >= 2 && (1u << (BITS - 1)) <= kLanes;
constexpr size_t kSearchRow = 2 * kLanes;  // room for the last level's whole vector

/* The sorted index of the threshold at search position q. */
template <int BITS>
constexpr int sorted_index(int q) {
  int level = 0;
  while ((2 << level) <= q + 1) level++;
  return ((2 * (q + 1 - (1 << level)) + 1) << (BITS - 1 - level)) - 1;
}

/* Lane j of the result: table[index[j]] (0 <= index < kLanes). */
inline VecF lookup(VecF table, VecI index) {
#if defined(__AVX512F__)
  // the masked form: the plain one's undefined pass-through trips -Wmaybe-uninitialized
  return (VecF)_mm512_mask_permutexvar_ps((__m512)table, (__mmask16)-1, (__m512i)index,
                                          (__m512)table);
#elif defined(__AVX2__)
  return (VecF)_mm256_permutevar8x32_ps((__m256)table, (__m256i)index);
#else
  (void)index;
  return table;  // never called: kCubicSearch is false without a permute
#endif
}

/* One step down the search: 2 c + (x > t), written in the form each
 * instruction set does in the fewest instructions (AVX-512's compares give
 * masks: a masked add; AVX2's give all-ones lanes: a subtraction). */
inline VecI descend(VecI c, VecF x, VecF t) {
#if defined(__AVX512F__)
  const VecI twice = c + c;
  return x > t ? twice + 1 : twice;
#else
  return c + c - (VecI)(x > t);
#endif
}

/* The low bytes of four vectors' lanes, in order, to out[0, 4 kLanes). */
inline void store_bytes(const VecI c[4], uint8_t* out) {
#if defined(__AVX512F__)
  for (int v = 0; v < 4; v++)  // one truncating move each (maskz: no undefined pass-through)
    _mm_storeu_si128((__m128i*)(out + v * kLanes),
                     _mm512_maskz_cvtepi32_epi8((__mmask16)-1, (__m512i)c[v]));
#elif defined(__AVX2__)
  // saturating packs work within 128-bit halves: a permute puts the halves in order
  const __m256i w0 = _mm256_packs_epi32((__m256i)c[0], (__m256i)c[1]);
  const __m256i w1 = _mm256_packs_epi32((__m256i)c[2], (__m256i)c[3]);
  const __m256i b = _mm256_packus_epi16(w0, w1);
  _mm256_storeu_si256((__m256i*)out,
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
  for (size_t v = 0; v < 4; v++)
    for (size_t j = 0; j < kLanes; j++) out[v * kLanes + j] = (uint8_t)c[v][j];
#endif
}

/* sorted_index of every search position, as floats; 0 past the last. */
template <int BITS>
struct SearchOrder {
  float index[kSearchRow];
  constexpr SearchOrder() : index() {
    for (int q = 0; q < (1 << BITS) - 1; q++) index[q] = (float)sorted_index<BITS>(q);
  }
};

/* Search level l of a row held in two vectors: its 2^l thresholds from
 * position 2^l - 1 on, a constant permutation (lanes past the row: any). */
template <int l, size_t... J>
VecF search_level(VecF r0, VecF r1, std::index_sequence<J...>) {
  constexpr size_t at = (1u << l) - 1;
  return __builtin_shufflevector(r0, r1, (at + J < 2 * kLanes ? at + J : 0)...);
}

template <class D, int BITS, size_t... L>
inline __attribute__((always_inline)) void encode_nearest_search(
    const typename D::T* __restrict x, size_t n, const BucketParams& p, uint8_t* __restrict codes,
    std::index_sequence<L...>) {
  // The bucket's thresholds in search order, derived together (one vector
  // loop), then each level made a vector from them in registers.
  static constexpr SearchOrder<BITS> kOrder{};
  constexpr size_t kUsed = ((1u << BITS) - 1 + kLanes - 1) / kLanes * kLanes;
  alignas(kVectorBytes) float row[kSearchRow] = {};
  for (size_t q = 0; q < kUsed; q++) row[q] = cubic_threshold<BITS>(p, kOrder.index[q]);
  VecF r0, r1;
  memcpy(&r0, row, sizeof r0);
  memcpy(&r1, row + kLanes, sizeof r1);
  const VecF level[BITS] = {search_level<L>(r0, r1, std::make_index_sequence<kLanes>{})...};
  auto encode = [&level](VecF xv) {
    VecI c = VecI{};
    for (int l = 0; l < BITS; l++) c = descend(c, xv, lookup(level[l], c));
    return c;
  };
  constexpr size_t kChunk = 4 * kLanes;  // four independent searches in flight
  size_t j = 0;
  for (; j + kChunk <= n; j += kChunk) {
    const VecI c[4] = {encode(load_vector<D>(x + j)), encode(load_vector<D>(x + j + kLanes)),
                       encode(load_vector<D>(x + j + 2 * kLanes)),
                       encode(load_vector<D>(x + j + 3 * kLanes))};
    store_bytes(c, codes + j);
  }
  for (; j < n; j++) codes[j] = (uint8_t)encode_nearest_cubic<BITS>(p, D::load(x[j]));
}

/* The encode loops take the bucket's params by value: a local copy that the
 * uint8_t stores cannot alias, so the cubic grid's per-side selects stay in
 * registers and the loops vectorize. */
template <class D, int BITS>
inline __attribute__((always_inline)) void encode_nearest_run(const typename D::T* __restrict x,
                                                               size_t n, const BucketParams p,
                                                               uint8_t* __restrict codes) {
  if constexpr (kCubicSearch<BITS>) {
    if (p.cubic)
      return encode_nearest_search<D, BITS>(x, n, p, codes, std::make_index_sequence<BITS>{});
  }
  if (p.cubic)
    for (size_t j = 0; j < n; j++) codes[j] = (uint8_t)encode_nearest_cubic<BITS>(p, D::load(x[j]));
  else
    for (size_t j = 0; j < n; j++) codes[j] = (uint8_t)encode_nearest_uniform(p, D::load(x[j]));
}

/* Values [first, first + n) of the random stream. The high half of the
 * index is fixed within each loop: a run that crosses a multiple of 2^32
 * takes two. */
template <class D, int BITS>
inline __attribute__((always_inline)) void encode_stochastic_run(
    const typename D::T* __restrict x, size_t n, const BucketParams p, RngKey key,
    uint64_t first, uint8_t* __restrict codes) {
  for (size_t done = 0; done < n;) {
    const uint64_t at = first + done;
    const uint32_t lo = (uint32_t)at, hi = (uint32_t)(at >> 32);
    const size_t run = (size_t)std::min<uint64_t>(n - done, (1ull << 32) - lo);
    const typename D::T* xs = x + done;
    uint8_t* out = codes + done;
    // The Weyl value steps by addition: a vector induction, no multiply.
    const uint32_t stride = rng_stride(key);
    uint32_t w = rng_weyl(key, lo, hi);
    if (p.cubic)
      for (uint32_t j = 0; j < (uint32_t)run; j++, w += stride)
        out[j] = (uint8_t)encode_stochastic_cubic<BITS>(p, D::load(xs[j]), rng_uniform_weyl(w));
    else
      for (uint32_t j = 0; j < (uint32_t)run; j++, w += stride)
        out[j] = (uint8_t)encode_stochastic_uniform(p, D::load(xs[j]), rng_uniform_weyl(w));
    done += run;
  }
}

/* A packed group of BITS bytes is its word's low BITS bytes: for 1, 2, 4
 * and 8 bits an integer type, so that a vector of words narrows to the
 * groups side by side in one move; void otherwise. (Widening back on
 * unpacking measured no faster at 4 bits and 8% slower at 2 than a load
 * per group.) */
template <int BITS>
using LowBytes = std::conditional_t<
    BITS == 1, uint8_t,
    std::conditional_t<BITS == 2, uint16_t,
                       std::conditional_t<BITS == 4, uint32_t,
                                          std::conditional_t<BITS == 8, uint64_t, void>>>>;

/* Packs `n` staged codes (the stage is zero past n up to the next group)
 * into `out`, which has room for `room` bytes. A vector of groups at 1, 2, 4
 * or 8 bits stores exactly its groups' bytes (LowBytes); otherwise a group
 * stores a whole 8-byte word, overlapping the next group (which overwrites
 * the excess), while the word fits in `room`; near the end it stores only the
 * bytes that fit (a partial last group may own fewer than BITS bytes). */
template <int BITS>
void pack_stage(const uint8_t* stage, size_t n, uint8_t* out, size_t room) {
  const size_t groups = (n + kGroup - 1) / kGroup;
  size_t g = 0;
  for (; g + kWords <= groups && (g + kWords) * BITS + 8 <= room; g += kWords) {
    VecW w;
    memcpy(&w, stage + g * kGroup, sizeof w);
    w = pack8<BITS>(w);
    if constexpr (std::is_void_v<LowBytes<BITS>>) {
      for (size_t j = 0; j < kWords; j++) memcpy(out + (g + j) * BITS, &w[j], 8);
    } else {  // each word narrowed to its group's BITS bytes: one truncating move, one store
      typedef LowBytes<BITS> VecLow __attribute__((vector_size(kWords * BITS)));
      const VecLow low = __builtin_convertvector(w, VecLow);
      memcpy(out + g * BITS, &low, sizeof low);
    }
  }
  for (; g < groups; g++) {
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
  size_t g = 0;
  for (; g + kWords <= groups && (g + kWords - 1) * BITS + 8 <= room; g += kWords) {
    VecW w;
    for (size_t j = 0; j < kWords; j++) memcpy(&w[j], in + (g + j) * BITS, 8);
    w = unpack8<BITS>(w);
    memcpy(stage + g * kGroup, &w, sizeof w);
  }
  for (; g < groups; g++) {
    uint64_t w = 0;
    if (g * BITS + 8 <= room)
      memcpy(&w, in + g * BITS, 8);
    else
      memcpy(&w, in + g * BITS, std::min<size_t>(BITS, room - g * BITS));
    w = unpack8<BITS>(w);
    memcpy(stage + g * kGroup, &w, 8);
  }
}

/* The parameters of the next buckets, derived a batch at a time: the
 * buckets that start in the current tile (at most kAhead). Their two
 * divisions each are independent, so a batch overlaps them instead of
 * waiting for each bucket's before its values. */
constexpr size_t kAhead = 64;

struct Ahead {
  /* The params, one array per field: the loop that derives a batch then
   * vectorizes (bucket_params is branch-free after inlining). */
  struct Fields {
    float lo[kAhead], hi[kAhead], top[kAhead], a[kAhead], step[kAhead], inv_step[kAhead],
        sigma[kAhead], inv_sigma[kAhead], zero[kAhead], span_neg[kAhead], span_pos[kAhead],
        unit_neg[kAhead], unit_pos[kAhead], inv_unit_neg[kAhead], inv_unit_pos[kAhead];
    bool nonfinite[kAhead], cubic[kAhead];
  } f;
  BucketParams current{};
  size_t size = 0, next = 0;

  /* How many to derive at value `at`, a bucket start: the buckets of
   * `bucket` values that start before `tile_end`, of `left` still to come. */
  static size_t batch(size_t at, size_t tile_end, size_t bucket, size_t left) {
    return std::min(std::min(kAhead, left), (tile_end - at + bucket - 1) / bucket);
  }
  /* The params of the n buckets whose metadata is at `metas`. */
  template <int BITS>
  void refill(const uint8_t* metas, size_t n, bool cubic) {
    size = n;
    next = 0;
    float mins[kAhead], maxs[kAhead];
    for (size_t k = 0; k < size; k++) {
      memcpy(&mins[k], metas + k * kMetaBytes, 4);
      memcpy(&maxs[k], metas + k * kMetaBytes + 4, 4);
    }
    for (size_t k = 0; k < size; k++) {
      const BucketParams p = bucket_params(BucketMeta{mins[k], maxs[k]}, BITS, cubic);
      f.lo[k] = p.lo, f.hi[k] = p.hi, f.top[k] = p.top, f.a[k] = p.a, f.step[k] = p.step;
      f.inv_step[k] = p.inv_step, f.sigma[k] = p.sigma, f.inv_sigma[k] = p.inv_sigma;
      f.zero[k] = p.zero, f.span_neg[k] = p.span_neg, f.span_pos[k] = p.span_pos;
      f.unit_neg[k] = p.unit_neg, f.unit_pos[k] = p.unit_pos;
      f.inv_unit_neg[k] = p.inv_unit_neg, f.inv_unit_pos[k] = p.inv_unit_pos;
      f.nonfinite[k] = p.nonfinite, f.cubic[k] = p.cubic;
    }
  }
  bool empty() const { return next == size; }
  const BucketParams& pop() {
    const size_t k = next++;
    BucketParams& p = current;
    p.lo = f.lo[k], p.hi = f.hi[k], p.top = f.top[k], p.a = f.a[k], p.step = f.step[k];
    p.inv_step = f.inv_step[k], p.sigma = f.sigma[k], p.inv_sigma = f.inv_sigma[k];
    p.zero = f.zero[k], p.span_neg = f.span_neg[k], p.span_pos = f.span_pos[k];
    p.unit_neg = f.unit_neg[k], p.unit_pos = f.unit_pos[k];
    p.inv_unit_neg = f.inv_unit_neg[k], p.inv_unit_pos = f.inv_unit_pos[k];
    p.nonfinite = f.nonfinite[k], p.cubic = f.cubic[k];
    return p;
  }
};

/* clip_meta of the n (<= kAhead) bucket metadata at `metas`, in place: one
 * vector loop over the batch. */
inline void clip_metas(uint8_t* metas, size_t n, float f) {
  float mins[kAhead], maxs[kAhead];
  for (size_t k = 0; k < n; k++) {
    memcpy(&mins[k], metas + k * kMetaBytes, 4);
    memcpy(&maxs[k], metas + k * kMetaBytes + 4, 4);
  }
  for (size_t k = 0; k < n; k++) {
    const BucketMeta c = clip_meta(BucketMeta{mins[k], maxs[k]}, f);
    mins[k] = c.min;
    maxs[k] = c.max;
  }
  for (size_t k = 0; k < n; k++) {
    memcpy(metas + k * kMetaBytes, &mins[k], 4);
    memcpy(metas + k * kMetaBytes + 4, &maxs[k], 4);
  }
}

/* Encodes a buffer of `count` values tile after tile: tiles(t0, t1) gives
 * the values [t0, t1) of each (x[j] is value t0 + j, and x reaches the end
 * of every bucket that starts in the tile), the tiles `tile` values apart
 * (a multiple of 8: each starts on a packing group). `ahead`: x also holds
 * the rest of the buffer, to prefetch. The state of the buckets carries
 * over from one tile to the next; everything hot stays in locals, which the
 * stage's byte stores cannot alias. */
template <class D, int BITS, class Tiles>
void encode_tiles(size_t count, const CodecParams& p, uint8_t* dst, size_t tile, bool ahead,
                  Tiles tiles) {
  const size_t nb = num_buckets(count, p.bucket);
  uint8_t* codes = dst + nb * kMetaBytes;
  const size_t room = code_bytes(count, BITS);
  const RngKey key = rng_key(p.seed, p.stream);
  alignas(64) uint8_t stage[kTile + kGroup];

  size_t bucket = 0, bucket_end = 0;
  Ahead batch;
  BucketParams bp{};
  for (size_t t0 = 0; t0 < count; t0 += tile) {
    const size_t t1 = std::min(count, t0 + tile);
    const typename D::T* x = tiles(t0, t1);
    for (size_t s0 = t0; s0 < t1; s0 += kTile) {  // a stage's worth at a time
      const size_t s1 = std::min(t1, s0 + kTile);
      for (size_t i = s0; i < s1;) {
        if (i == bucket_end) {
          if (batch.empty()) {  // min and max of the buckets starting here, then their params
            uint8_t* metas = dst + bucket * kMetaBytes;
            const size_t n = Ahead::batch(i, s1, p.bucket, nb - bucket);
            for (size_t k = 0; k < n; k++) {
              const size_t b0 = i + k * p.bucket;
              const BucketMeta m =
                  bucket_meta<D>(x + (b0 - t0), std::min(count, b0 + p.bucket) - b0);
              memcpy(metas + k * kMetaBytes, &m, kMetaBytes);
            }
            if (p.clip > 0.0f) clip_metas(metas, n, p.clip);
            batch.refill<BITS>(metas, n, p.cubic);
          }
          bucket_end = std::min(count, i + p.bucket);
          bucket++;
          bp = batch.pop();
        }
        const size_t end = std::min(s1, bucket_end);
        // The next stage's values, a line at a time while this one encodes, so
        // its min/max pass finds them in the cache instead of waiting on memory.
        if (ahead)
          for (size_t line = i; line < end; line += kLineValues)
            __builtin_prefetch(x + (std::min(line + kTile, count - 1) - t0));
        uint8_t* out = stage + (i - s0);
        if (bp.nonfinite)
          memset(out, 0, end - i);
        else if (p.rounding == qncclRoundStochastic)
          encode_stochastic_run<D, BITS>(x + (i - t0), end - i, bp, key, p.first + i, out);
        else
          encode_nearest_run<D, BITS>(x + (i - t0), end - i, bp, out);
        i = end;
      }
      memset(stage + (s1 - s0), 0, kGroup);  // zero codes pad the last group
      const size_t offset = s0 / kGroup * BITS;
      pack_stage<BITS>(stage, s1 - s0, codes + offset, room - offset);
    }
  }
  // Zero the bytes between the end of the bit stream and the 8-byte boundary.
  const size_t used = (count / 8) * BITS + ((count % 8) * BITS + 7) / 8;
  memset(codes + used, 0, room - used);
}

template <class D, int BITS>
void encode_buffer(const typename D::T* src, size_t count, const CodecParams& p, uint8_t* dst) {
  encode_tiles<D, BITS>(count, p, dst, kTile, true, [src](size_t t0, size_t) { return src + t0; });
}

template <class D, bool ACCUMULATE>
void decode_run(const uint8_t* codes, size_t n, const BucketParams p, typename D::T* out) {
  if (p.nonfinite) {
    const typename D::T nan = D::store(bits_float(kCanonicalNanF32));
    for (size_t j = 0; j < n; j++) out[j] = nan;
    return;
  }
  auto store = [&](size_t j, float y) {
    out[j] = D::store(ACCUMULATE ? accumulate(D::load(out[j]), y) : y);
  };
  if (p.cubic)
    for (size_t j = 0; j < n; j++) store(j, decode_cubic(p, codes[j]));
  else
    for (size_t j = 0; j < n; j++) store(j, decode_uniform(p, codes[j]));
}

/* Reads one compressed buffer tile after tile: the bucket it is in and the
 * parameters of the buckets ahead carry over from one tile to the next. */
template <int BITS>
class Decoder {
 public:
  Decoder(const uint8_t* src, size_t count, const CodecParams& p)
      : metas_(src), codes_(src + num_buckets(count, p.bucket) * kMetaBytes), count_(count),
        buckets_(num_buckets(count, p.bucket)), bucket_(p.bucket),
        room_(code_bytes(count, BITS)), cubic_(p.cubic) {}

  /* Values [t0, t1) of tile t0 (the tiles in order, each starting on a
   * packing group): value i into dst[i - origin], dst = y, or dst += y. */
  template <class D, bool ACCUMULATE>
  void tile(size_t t0, size_t t1, uint8_t* stage, typename D::T* dst, size_t origin = 0) {
    const size_t offset = t0 / kGroup * BITS;
    unpack_stage<BITS>(codes_ + offset, t1 - t0, room_ - offset, stage);
    for (size_t i = t0; i < t1;) {
      if (i == bucket_end_) {
        if (ahead_.empty())
          ahead_.refill<BITS>(metas_ + next_ * kMetaBytes,
                              Ahead::batch(i, t1, bucket_, buckets_ - next_), cubic_);
        bucket_end_ = std::min(count_, i + bucket_);
        next_++;
        bp_ = ahead_.pop();
      }
      const size_t end = std::min(t1, bucket_end_);
      decode_run<D, ACCUMULATE>(stage + (i - t0), end - i, bp_, dst + (i - origin));
      i = end;
    }
  }

 private:
  const uint8_t* metas_;
  const uint8_t* codes_;
  size_t count_, buckets_, bucket_, room_;
  bool cubic_;
  size_t next_ = 0, bucket_end_ = 0;  // the next bucket, the end of the current one
  Ahead ahead_;
  BucketParams bp_{};
};

template <class D, int BITS, bool ACCUMULATE>
void decode_buffer(const uint8_t* src, size_t count, const CodecParams& p, typename D::T* dst) {
  alignas(64) uint8_t stage[kTile + kGroup];
  Decoder<BITS> decoder(src, count, p);
  for (size_t t0 = 0; t0 < count; t0 += kTile)
    decoder.template tile<D, ACCUMULATE>(t0, std::min(count, t0 + kTile), stage, dst);
}

/* acc = widen(src) (+ residual), then + D(wire) for each wire in order, a
 * tile at a time: the tile of acc stays in the cache while every wire's
 * tile is added to it. */
template <class D, int BITS>
void reduce_buffer(const typename D::T* src, const float* residual, const uint8_t* const* wires,
                   int nwires, size_t count, const CodecParams& p, float* acc) {
  alignas(64) uint8_t stage[kTile + kGroup];
  std::vector<Decoder<BITS>> decoders;
  decoders.reserve((size_t)nwires);
  for (int j = 0; j < nwires; j++) decoders.emplace_back(wires[j], count, p);
  for (size_t t0 = 0; t0 < count; t0 += kTile) {
    const size_t t1 = std::min(count, t0 + kTile);
    if (residual == nullptr) {
      for (size_t i = t0; i < t1; i++) acc[i] = D::load(src[i]);
    } else {
      for (size_t i = t0; i < t1; i++) acc[i] = accumulate(D::load(src[i]), residual[i]);
    }
    for (Decoder<BITS>& d : decoders) d.template tile<F32, true>(t0, t1, stage, acc);
  }
}

/* ---- Rotation (codec/rotation.h, docs/rotation.md) ---------------------- */

typedef uint32_t VecU __attribute__((vector_size(kVectorBytes)));

/* One in-register butterfly stage h < kLanes on every lane pair (j, j ^ h):
 * v[j] + v[j^h] where bit h of j is clear, v[j^h] - v[j] where it is set:
 * the same two IEEE operations on the same operands as the definition. */
template <size_t H, size_t... J>
inline __attribute__((always_inline)) VecF lane_stage(VecF v, std::index_sequence<J...>) {
  const VecF t = __builtin_shufflevector(v, v, (J ^ H)...);
  const VecI high = {(int32_t)((J & H) ? -1 : 0)...};
  return high ? t - v : v + t;
}

template <size_t... H>
inline __attribute__((always_inline)) VecF lane_stages(VecF v, std::index_sequence<H...>) {
  ((v = lane_stage<(size_t)1 << H>(v, std::make_index_sequence<kLanes>{})), ...);
  return v;
}

constexpr size_t log2_of(size_t n) { return n <= 1 ? 0 : 1 + log2_of(n / 2); }

/* Every stage below kLanes, in registers. */
inline __attribute__((always_inline)) VecF in_lanes(VecF v) {
  return lane_stages(v, std::make_index_sequence<log2_of(kLanes)>{});
}

inline VecF flip(VecF v, const uint32_t* masks) {
  VecU m;
  memcpy(&m, masks, sizeof m);
  return (VecF)((VecU)v ^ m);
}

template <class D, bool ACCUMULATE>
inline __attribute__((always_inline)) void store_vector(VecF v, typename D::T* out) {
  for (size_t j = 0; j < kLanes; j++)
    out[j] = D::store(ACCUMULATE ? accumulate(D::load(out[j]), v[j]) : v[j]);
}

/* H_b on v[0, b) for b < kLanes, pair by pair. */
void small_butterfly(float* v, size_t b) {
  for (size_t h = 1; h < b; h *= 2)
    for (size_t j = 0; j < b; j++)
      if (!(j & h)) {
        const float x = v[j], y = v[j + h];
        v[j] = x + y;
        v[j + h] = x - y;
      }
}

/* The stages h = kLanes .. b/2 of H_b on v[0, b) (b > kLanes), two per pass
 * over the block while two remain; the last pass's results times `scale`
 * (the block's scale: it follows the last stage in both directions). */
void cross_stages(float* v, size_t b, float scale) {
  auto radix4 = [&](size_t h, auto last) {
    for (size_t j0 = 0; j0 < b; j0 += 4 * h)
      for (size_t i = j0; i < j0 + h; i += kLanes) {
        VecF p0, p1, p2, p3;
        memcpy(&p0, v + i, sizeof p0);
        memcpy(&p1, v + i + h, sizeof p1);
        memcpy(&p2, v + i + 2 * h, sizeof p2);
        memcpy(&p3, v + i + 3 * h, sizeof p3);
        const VecF q0 = p0 + p1, q1 = p0 - p1, q2 = p2 + p3, q3 = p2 - p3;  // stage h
        VecF r0 = q0 + q2, r1 = q1 + q3, r2 = q0 - q2, r3 = q1 - q3;         // stage 2h
        if constexpr (decltype(last)::value) r0 *= scale, r1 *= scale, r2 *= scale, r3 *= scale;
        memcpy(v + i, &r0, sizeof r0);
        memcpy(v + i + h, &r1, sizeof r1);
        memcpy(v + i + 2 * h, &r2, sizeof r2);
        memcpy(v + i + 3 * h, &r3, sizeof r3);
      }
  };
  size_t h = kLanes;
  for (; h * 4 < b; h *= 4) radix4(h, std::false_type{});
  if (h * 4 == b) return radix4(h, std::true_type{});
  for (size_t j0 = 0; j0 < b; j0 += 2 * h)  // h * 2 == b: one stage left
    for (size_t i = j0; i < j0 + h; i += kLanes) {
      VecF p0, p1;
      memcpy(&p0, v + i, sizeof p0);
      memcpy(&p1, v + i + h, sizeof p1);
      const VecF r0 = (p0 + p1) * scale, r1 = (p0 - p1) * scale;
      memcpy(v + i, &r0, sizeof r0);
      memcpy(v + i + h, &r1, sizeof r1);
    }
}

/* The forward rotation of one block of b values from x into z: signs (the
 * block's masks), stages, scale. */
template <class D>
void forward_block(const typename D::T* x, size_t b, const uint32_t* masks, float* z) {
  const float scale = rotation_scale(b, true);
  if (b < kLanes) {
    for (size_t j = 0; j < b; j++) z[j] = bits_float(float_bits(D::load(x[j])) ^ masks[j]);
    small_butterfly(z, b);
    for (size_t j = 0; j < b; j++) z[j] *= scale;
    return;
  }
  for (size_t j = 0; j < b; j += kLanes) {
    VecF v = in_lanes(flip(load_vector<D>(x + j), masks + j));
    if (b == kLanes) v *= scale;
    memcpy(z + j, &v, sizeof v);
  }
  if (b > kLanes) cross_stages(z, b, scale);
}

/* The inverse rotation of one block of b values in z, stored into out (or
 * added to it): stages, scale, signs, the canonical NaN. z may be out
 * (float32). */
template <class D, bool ACCUMULATE>
void inverse_block(float* z, size_t b, const uint32_t* masks, typename D::T* out) {
  const float scale = rotation_scale(b, false);
  if (b < kLanes) {
    small_butterfly(z, b);
    for (size_t j = 0; j < b; j++) {
      const float y = canonical(bits_float(float_bits(z[j] * scale) ^ masks[j]));
      out[j] = D::store(ACCUMULATE ? accumulate(D::load(out[j]), y) : y);
    }
    return;
  }
  for (size_t j = 0; j < b; j += kLanes) {
    VecF v;
    memcpy(&v, z + j, sizeof v);
    v = in_lanes(v);
    if (b == kLanes) v *= scale;
    memcpy(z + j, &v, sizeof v);
  }
  if (b > kLanes) cross_stages(z, b, scale);
  const VecF nan = bits_float(kCanonicalNanF32) + VecF{};
  for (size_t j = 0; j < b; j += kLanes) {
    VecF v;
    memcpy(&v, z + j, sizeof v);
    v = flip(v, masks + j);
    store_vector<D, ACCUMULATE>(v == v ? v : nan, out + j);
  }
}

/* Values [t0, t1) of a segment of n values (t0, t1 cut points of its
 * blocks) rotated forward from x (value t0 first) into z. */
template <class D>
void rotate_forward(const typename D::T* x, size_t t0, size_t t1, size_t n, size_t block,
                    const uint32_t* masks, float* z) {
  for (size_t at = t0; at < t1;) {  // a block never crosses a multiple of `block`
    const size_t b = rotation_block_at(at, n, block);
    forward_block<D>(x + (at - t0), b, masks + at % block, z + (at - t0));
    at += b;
  }
}

/* Its inverse: z (value t0 first, overwritten) rotated back into out. */
template <class D, bool ACCUMULATE>
void rotate_inverse(float* z, size_t t0, size_t t1, size_t n, size_t block,
                    const uint32_t* masks, typename D::T* out) {
  for (size_t at = t0; at < t1;) {
    const size_t b = rotation_block_at(at, n, block);
    inverse_block<D, ACCUMULATE>(z + (at - t0), b, masks + at % block, out + (at - t0));
    at += b;
  }
}

/* A rotated call's working memory (CodecParams): the tile, and the signs'
 * masks of one block, computed here. */
struct RotationScratch {
  RotationScratch(const CodecParams& p, size_t count) : tile(p.scratch), masks(p.signs) {
    rotation_masks(rotation_key(p.seed), std::min(count, p.rotation), p.signs);
  }
  float* tile;
  const uint32_t* masks;
};

/* A rotated quantize: each tile of whole blocks and buckets rotated into
 * the scratch, then encoded from there as float32. */
template <class D, int BITS>
void rotated_encode_buffer(const typename D::T* src, size_t count, const CodecParams& p,
                           uint8_t* dst) {
  const RotationScratch scratch(p, count);
  encode_tiles<F32, BITS>(count, p, dst, rotation_tile(count, p.bucket, p.rotation), false,
                          [&](size_t t0, size_t t1) {
                            rotate_forward<D>(src + t0, t0, t1, count, p.rotation,
                                              scratch.masks, scratch.tile);
                            return (const float*)scratch.tile;
                          });
}

/* A rotated dequantize: each tile decoded into the scratch as float32, then
 * rotated back into dst. */
template <class D, int BITS, bool ACCUMULATE>
void rotated_decode_buffer(const uint8_t* src, size_t count, const CodecParams& p,
                           typename D::T* dst) {
  const size_t tile = rotation_tile(count, p.bucket, p.rotation);
  const RotationScratch scratch(p, count);
  alignas(64) uint8_t stage[kTile + kGroup];
  Decoder<BITS> decoder(src, count, p);
  for (size_t t0 = 0; t0 < count; t0 += tile) {
    const size_t t1 = std::min(count, t0 + tile);
    for (size_t s0 = t0; s0 < t1; s0 += kTile)
      decoder.template tile<F32, false>(s0, std::min(t1, s0 + kTile), stage, scratch.tile, t0);
    rotate_inverse<D, ACCUMULATE>(scratch.tile, t0, t1, count, p.rotation, scratch.masks,
                                  dst + t0);
  }
}

void quantize(const void* src, size_t count, ncclDataType_t type, const CodecParams& p,
              void* dst) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    dispatch_bits(p.bits, [&](auto bits) {
      if (p.rotation != 0)
        rotated_encode_buffer<D, bits.value>((const typename D::T*)src, count, p, (uint8_t*)dst);
      else
        encode_buffer<D, bits.value>((const typename D::T*)src, count, p, (uint8_t*)dst);
    });
  });
}

void dequantize(const void* src, size_t count, const CodecParams& p, void* dst,
                ncclDataType_t type, bool accumulate) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    dispatch_bits(p.bits, [&](auto bits) {
      auto decode = [&](auto acc) {
        constexpr int B = bits.value;
        constexpr bool A = decltype(acc)::value;
        if (p.rotation != 0)
          rotated_decode_buffer<D, B, A>((const uint8_t*)src, count, p, (typename D::T*)dst);
        else
          decode_buffer<D, B, A>((const uint8_t*)src, count, p, (typename D::T*)dst);
      };
      if (accumulate)
        decode(std::true_type{});
      else
        decode(std::false_type{});
    });
  });
}

void reduce(const void* src, ncclDataType_t type, const float* residual,
            const uint8_t* const* wires, int nwires, size_t count, const CodecParams& p,
            float* acc) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    dispatch_bits(p.bits, [&](auto bits) {
      reduce_buffer<D, bits.value>((const typename D::T*)src, residual, wires, nwires, count, p,
                                   acc);
    });
  });
}

void rotate(const void* src, ncclDataType_t type, size_t n, size_t block, const uint32_t* masks,
            float* z) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    rotate_forward<D>((const typename D::T*)src, 0, n, n, block, masks, z);
  });
}

void unrotate(float* z, size_t n, size_t block, const uint32_t* masks, void* dst,
              ncclDataType_t type) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    rotate_inverse<D, false>(z, 0, n, n, block, masks, (typename D::T*)dst);
  });
}

}  // namespace

#define QNCCL_STRINGIFY2(x) #x
#define QNCCL_STRINGIFY(x) QNCCL_STRINGIFY2(x)
extern const HostCodec kHostCodec = {QNCCL_STRINGIFY(QNCCL_CODEC_ISA), quantize, dequantize,
                                     reduce, rotate, unrotate};

}  // namespace QNCCL_CODEC_ISA
}  // namespace qnccl
