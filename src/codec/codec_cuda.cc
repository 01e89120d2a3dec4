/* The CUDA codec's host half: plans the passes of codec_kernels.cu (which
 * NVRTC compiled into the library at build time) and launches them on the
 * caller's stream; nothing here synchronizes or allocates. Also where a
 * pointer lives, and the CUDA versions. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "codec/codec.h"
#include "codec/codec_kernels.h"
#include "codec/cuda_module.h"
#include "common/error.h"

namespace qnccl {
namespace {

/* Lanes for items of up to `values` values: at least kValuesPerLane each. */
int lanes_for(size_t values) {
  int lanes = 1;
  while (lanes < kWarp && (size_t)lanes * kValuesPerLane < values) lanes *= 2;
  return lanes;
}

bool aligned_to(const void* p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

/* Pass 1 as one or two launches of bucket_stats_kernel. */
template <class Type>
struct StatsPasses {
  StatsArgs<Type> first;  // metadata of every bucket, or partials of every slice
  bool sliced;            // then `merge` turns the partials into the metadata
  StatsArgs<F32> merge;
};

/* Buckets of up to kSliceValues values stay whole. Longer ones are cut into
 * per_bucket <= kMaxSlicesPerBucket slices of `slice` >= kSliceValues
 * values, the last bucket only into those it fills. Slice partials are
 * metadata too (a non-finite slice is NaN), so the stats of a bucket are the
 * stats of its partials' 2 * per_bucket floats: `merge` is pass 1 again,
 * over the partials.
 * The partials go to the code area, 16-byte aligned; encode overwrites them
 * later on the stream. They fit: the area holds at least count/8 bytes with
 * count > kSliceValues; every slice but the last of a bucket holds `slice`
 * values and more than one bucket means bucket > kSliceValues, so
 * items <= 2 * count / kSliceValues + 1, at most 16 * count / kSliceValues
 * + 8 bytes, plus 15 of alignment. */
template <class Type>
StatsPasses<Type> plan_stats(const typename Type::T* src, size_t count, size_t bucket,
                             float clip, uint8_t* wire) {
  const size_t longest = min_size(bucket, count);
  const size_t buckets = num_buckets(count, bucket);
  const bool wire_aligned = aligned_to(wire, 8);
  StatsPasses<Type> passes = {};
  if (longest <= kSliceValues) {
    passes.first = {src,     count, bucket, bucket, 1, buckets, lanes_for(longest),
                    wire,    wire_aligned, clip};
    return passes;
  }
  size_t slice = ceil_div(longest, kMaxSlicesPerBucket);
  slice = slice > kSliceValues ? slice : kSliceValues;
  const size_t per_bucket = ceil_div(longest, slice);
  const size_t last = count - (buckets - 1) * bucket;  // values of the last bucket
  const size_t items = (buckets - 1) * per_bucket + ceil_div(last, slice);
  uint8_t* codes = wire + buckets * kMetaBytes;
  uint8_t* partials = codes + (16 - (uintptr_t)codes % 16) % 16;
  passes.first = {src, count, bucket, slice, per_bucket, items, kWarp, partials, true, 0.0f};
  passes.sliced = true;
  const size_t merged = 2 * per_bucket;
  passes.merge = {reinterpret_cast<const float*>(partials), 2 * items, merged, merged, 1, buckets,
                  lanes_for(merged), wire, wire_aligned, clip};
  return passes;
}

int grid_for(size_t warps) {
  return (int)min_size(ceil_div(warps, kWarpsPerBlock), kMaxBlocks);
}

/* A codec kernel over `warps` warps of work (grid-stride beyond kMaxBlocks). */
template <class Args>
ncclResult_t launch(const char* name, size_t warps, const Args& args, cudaStream_t stream) {
  void* params[] = {const_cast<Args*>(&args)};
  return launch_kernel(kCudaModule_codec, name, (unsigned)grid_for(warps), kBlockThreads, stream,
                       params);
}

template <class Type>
ncclResult_t launch_stats(const StatsArgs<Type>& a, cudaStream_t stream) {
  const size_t warps = ceil_div(a.items, kWarp / a.lanes);
  char name[64];
  snprintf(name, sizeof name, "qnccl_stats_%s", Type::kName);
  return launch(name, warps, a, stream);
}

/* ---- Dispatch ----------------------------------------------------------- */

/* The encode of quantize: in one pass when one_pass(bucket), else after pass 1. */
template <class Type>
EncodeArgs<Type> plan_encode(const typename Type::T* src, size_t count, const CodecParams& p,
                             uint8_t* wire) {
  return EncodeArgs<Type>{src,
                          count,
                          p.bucket,
                          wire,
                          wire + num_buckets(count, p.bucket) * kMetaBytes,
                          code_bytes(count, p.bits),
                          one_pass(p.bucket) ? (int)min_size(kWarp, p.bucket / kGroup) : 0,
                          span_tiles(p.bucket),
                          rng_key(p.seed, p.stream),
                          aligned_to(src, 16),
                          aligned_to(wire, 8),
                          p.cubic,
                          p.clip,
                          p.call,
                          p.seed,
                          p.segment,
                          p.rank,
                          p.step,
                          p.first};
}

template <class Type>
DecodeArgs<Type> plan_decode(const uint8_t* wire, size_t count, const CodecParams& p,
                             typename Type::T* dst) {
  return DecodeArgs<Type>{wire,
                          wire + num_buckets(count, p.bucket) * kMetaBytes,
                          code_bytes(count, p.bits),
                          dst,
                          count,
                          p.bucket,
                          aligned_to(dst, 16),
                          aligned_to(wire, 8),
                          p.cubic};
}

struct KernelName {
  char name[64];
};

/* qnccl_encode_<type>_<bits>_<rounding>: one or several buffers. */
template <class Type>
KernelName encode_name(const CodecParams& p) {
  KernelName k;
  snprintf(k.name, sizeof k.name, "qnccl_encode_%s_%d_%s", Type::kName, p.bits,
           p.rounding == qncclRoundStochastic ? "stochastic" : "nearest");
  return k;
}

template <class Type>
ncclResult_t quantize_as(const typename Type::T* src, size_t count, const CodecParams& p,
                         uint8_t* wire, cudaStream_t stream) {
  if (!aligned_to(src, sizeof(*src)))
    return set_error(ncclInvalidArgument, "the input is not aligned to its %zu-byte elements",
                     sizeof(*src));
  if (!one_pass(p.bucket)) {
    const StatsPasses<Type> stats = plan_stats<Type>(src, count, p.bucket, p.clip, wire);
    QNCCL_CHECK(launch_stats(stats.first, stream));
    if (stats.sliced) QNCCL_CHECK(launch_stats(stats.merge, stream));
  }
  EncodeManyArgs<Type> a = {};
  a.items[0] = plan_encode<Type>(src, count, p, wire);
  a.first_span[1] = num_spans(a.items[0]);
  a.n = 1;
  return launch(encode_name<Type>(p).name, a.first_span[1], a, stream);
}

template <class Type>
ncclResult_t dequantize_as(const uint8_t* wire, size_t count, const CodecParams& p,
                           typename Type::T* dst, bool accumulate, cudaStream_t stream) {
  if (!aligned_to(dst, sizeof(*dst)))
    return set_error(ncclInvalidArgument, "the output is not aligned to its %zu-byte elements",
                     sizeof(*dst));
  const DecodeArgs<Type> a = plan_decode<Type>(wire, count, p, dst);
  char name[64];
  snprintf(name, sizeof name, "qnccl_decode_%s_%d_%s", Type::kName, p.bits,
           accumulate ? "accumulate" : "store");
  return launch(name, ceil_div(ceil_div(count, kGroup), kWarp), a, stream);
}

/* Up to kEncodeItems buffers per launch of the encode kernel (after one of
 * stats-many when the buckets take two passes) while buckets stay whole in
 * pass 1; longer buckets take quantize_as per buffer. Each buffer gets the
 * bytes quantize_as gives it with its own params ps[i]. */
template <class Type>
ncclResult_t quantize_many_as(const typename Type::T* const* srcs, const size_t* counts, int n,
                              const CodecParams* ps, uint8_t* const* wires, cudaStream_t stream) {
  for (int i = 0; i < n; i++)
    if (!aligned_to(srcs[i], sizeof(typename Type::T)))
      return set_error(ncclInvalidArgument, "an input is not aligned to its %zu-byte elements",
                       sizeof(typename Type::T));
  const size_t bucket = ps[0].bucket;
  if (bucket > kSliceValues) {
    for (int i = 0; i < n; i++)
      if (counts[i] > 0) QNCCL_CHECK(quantize_as<Type>(srcs[i], counts[i], ps[i], wires[i], stream));
    return ncclSuccess;
  }
  char stats_name[64];
  snprintf(stats_name, sizeof stats_name, "qnccl_stats_many_%s", Type::kName);
  const KernelName encode = encode_name<Type>(ps[0]);
  for (int i = 0; i < n;) {
    StatsManyArgs<Type> stats = {};
    EncodeManyArgs<Type> items = {};
    stats.bucket = bucket;
    stats.out_aligned = true;
    stats.clip = ps[0].clip;
    size_t longest = 0;
    for (; i < n && stats.n < kEncodeItems; i++) {
      if (counts[i] == 0) continue;
      const int k = stats.n++;
      stats.srcs[k] = srcs[i];
      stats.counts[k] = counts[i];
      stats.outs[k] = wires[i];
      stats.first_item[k + 1] = stats.first_item[k] + num_buckets(counts[i], bucket);
      stats.out_aligned = stats.out_aligned && aligned_to(wires[i], 8);
      longest = counts[i] > longest ? counts[i] : longest;
      items.items[k] = plan_encode<Type>(srcs[i], counts[i], ps[i], wires[i]);
      items.first_span[k + 1] = items.first_span[k] + num_spans(items.items[k]);
    }
    if (stats.n == 0) break;
    items.n = stats.n;
    stats.lanes = lanes_for(min_size(bucket, longest));
    if (!one_pass(bucket))
      QNCCL_CHECK(launch(stats_name, ceil_div(stats.first_item[stats.n], kWarp / stats.lanes), stats,
                         stream));
    QNCCL_CHECK(launch(encode.name, items.first_span[items.n], items, stream));
  }
  return ncclSuccess;
}

/* Up to kReduceWires wires per launch; the first widens src, the next ones
 * carry on from acc. */
template <class Type>
ncclResult_t reduce_as(const typename Type::T* src, const float* residual,
                       const uint8_t* const* wires, int nwires, size_t count, const CodecParams& p,
                       float* acc, cudaStream_t stream) {
  if (!aligned_to(src, sizeof(*src)))
    return set_error(ncclInvalidArgument, "the input is not aligned to its %zu-byte elements",
                     sizeof(*src));
  ReduceArgs<Type> a = {};
  a.residual = residual;
  a.acc = acc;
  a.count = count;
  a.bucket = p.bucket;
  a.meta_bytes = num_buckets(count, p.bucket) * kMetaBytes;
  a.code_bytes = code_bytes(count, p.bits);
  a.src_vectors = aligned_to(src, 16);
  a.residual_vectors = aligned_to(residual, 16);
  a.acc_vectors = aligned_to(acc, 16);
  a.cubic = p.cubic;
  char name[64];
  snprintf(name, sizeof name, "qnccl_reduce_%s_%d", Type::kName, p.bits);
  const size_t warps = ceil_div(ceil_div(count, kGroup), kWarp);
  int done = 0;
  do {  // at least once: with no wires, the widening alone
    a.src = done == 0 ? src : nullptr;
    a.nwires = nwires - done < kReduceWires ? nwires - done : kReduceWires;
    a.wire_aligned = true;
    for (int w = 0; w < a.nwires; w++) {
      a.wires[w] = wires[done + w];
      a.wire_aligned = a.wire_aligned && aligned_to(a.wires[w], 8);
    }
    QNCCL_CHECK(launch(name, warps, a, stream));
    done += a.nwires;
  } while (done < nwires);
  return ncclSuccess;
}

/* Up to kDecodeItems buffers per launch. */
template <class Type>
ncclResult_t decode_many_as(const uint8_t* const* wires, typename Type::T* const* dsts,
                            const size_t* counts, int n, const CodecParams& p,
                            cudaStream_t stream) {
  char name[64];
  snprintf(name, sizeof name, "qnccl_decode_many_%s_%d", Type::kName, p.bits);
  for (int i = 0; i < n;) {
    DecodeManyArgs<Type> a = {};
    a.bucket = p.bucket;
    a.cubic = p.cubic;
    a.dst_vectors = a.wire_aligned = true;
    for (; i < n && a.n < kDecodeItems; i++) {
      if (counts[i] == 0) continue;
      if (!aligned_to(dsts[i], sizeof(typename Type::T)))
        return set_error(ncclInvalidArgument,
                         "an output is not aligned to its %zu-byte elements",
                         sizeof(typename Type::T));
      const int k = a.n++;
      a.metas[k] = wires[i];
      a.codes[k] = wires[i] + num_buckets(counts[i], p.bucket) * kMetaBytes;
      a.code_bytes[k] = code_bytes(counts[i], p.bits);
      a.dsts[k] = dsts[i];
      a.counts[k] = counts[i];
      a.first_group[k + 1] = a.first_group[k] + ceil_div(counts[i], kGroup);
      a.dst_vectors = a.dst_vectors && aligned_to(dsts[i], 16);
      a.wire_aligned = a.wire_aligned && aligned_to(wires[i], 8);
    }
    if (a.n > 0) QNCCL_CHECK(launch(name, ceil_div(a.first_group[a.n], kWarp), a, stream));
  }
  return ncclSuccess;
}

/* The kernels divide by p.bucket and instantiate bits 1..8 only. */
bool valid(const CodecParams& p) {
  return p.bits >= QNCCL_MIN_BITS && p.bits <= QNCCL_MAX_BITS && p.bucket >= 1;
}

/* The device entry points' common part: checks `p`, does nothing for no
 * work, else runs fn(Type{}) for `type`'s codec type. `what` names the
 * operation in messages. */
template <class Fn>
ncclResult_t on_codec_type(const char* what, const CodecParams& p, ncclDataType_t type,
                           size_t work, Fn&& fn) {
  if (!valid(p)) return set_error(ncclInternalError, "device %s: invalid codec parameters", what);
  if (work == 0) return ncclSuccess;
  bool known = false;
  ncclResult_t res = ncclSuccess;
  dispatch_float_type(type, [&](auto t) {
    known = true;
    res = fn(t);
  });
  if (!known) return set_error(ncclInvalidArgument, "device %s: not a codec type", what);
  return res;
}

}  // namespace

ncclResult_t device_quantize(const void* src, size_t count, ncclDataType_t type,
                             const CodecParams& p, void* dst, cudaStream_t stream) {
  return on_codec_type("quantize", p, type, count, [&](auto t) {
    using Type = decltype(t);
    return quantize_as<Type>(static_cast<const typename Type::T*>(src), count, p,
                             static_cast<uint8_t*>(dst), stream);
  });
}

ncclResult_t device_quantize_many(const void* const* srcs, const size_t* counts, int n,
                                  ncclDataType_t type, const CodecParams* ps,
                                  uint8_t* const* wires, cudaStream_t stream) {
  if (n <= 0) return ncclSuccess;
  return on_codec_type("quantize", ps[0], type, (size_t)n, [&](auto t) {
    using Type = decltype(t);
    return quantize_many_as<Type>(reinterpret_cast<const typename Type::T* const*>(srcs), counts,
                                  n, ps, wires, stream);
  });
}

ncclResult_t device_dequantize(const void* src, size_t count, const CodecParams& p, void* dst,
                               ncclDataType_t type, bool accumulate, cudaStream_t stream) {
  return on_codec_type("dequantize", p, type, count, [&](auto t) {
    using Type = decltype(t);
    return dequantize_as<Type>(static_cast<const uint8_t*>(src), count, p,
                               static_cast<typename Type::T*>(dst), accumulate, stream);
  });
}

ncclResult_t device_reduce(const void* src, ncclDataType_t type, const float* residual,
                           const uint8_t* const* wires, int nwires, size_t count,
                           const CodecParams& p, float* acc, cudaStream_t stream) {
  return on_codec_type("reduce", p, type, count, [&](auto t) {
    using Type = decltype(t);
    return reduce_as<Type>(static_cast<const typename Type::T*>(src), residual, wires, nwires,
                           count, p, acc, stream);
  });
}

ncclResult_t device_decode_many(const uint8_t* const* wires, void* const* dsts,
                                const size_t* counts, int n, const CodecParams& p,
                                ncclDataType_t type, cudaStream_t stream) {
  return on_codec_type("decode", p, type, (size_t)n, [&](auto t) {
    using Type = decltype(t);
    return decode_many_as<Type>(wires, reinterpret_cast<typename Type::T* const*>(dsts), counts,
                                n, p, stream);
  });
}

ncclResult_t pointer_device(const char* fn, const void* ptr, int* device) {
  *device = -1;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    (void)cudaGetLastError();
    return ncclSuccess;  // no driver: every buffer is host memory
  }
  const char* why = "";
  const PointerQuery q = driver_pointer_device(ptr, device, &why);
  if (q == PointerQuery::kOk || q == PointerQuery::kNoDevice) return ncclSuccess;  // no GPU: host
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  if (q == PointerQuery::kDriverTooOld)
    return set_error(ncclUnhandledCudaError,
                     "%s: cannot tell whether %p is device memory: the CUDA driver (CUDA %d.%d) "
                     "is older than the runtime libqnccl.so was built with (CUDA %d.%d); update "
                     "the driver, or build QNCCL with a CUDA toolkit the driver supports "
                     "(`qnccl info` shows both)",
                     fn, ptr, driver / 1000, driver % 1000 / 10, runtime / 1000,
                     runtime % 1000 / 10);
  return set_error(ncclUnhandledCudaError,
                   "%s: cannot tell whether %p is device memory: the driver's "
                   "cuPointerGetAttributes failed (%s); a buffer QNCCL cannot place is never "
                   "taken for host memory",
                   fn, ptr, why);
}

void cuda_versions(int* runtime, int* driver) {
  *runtime = *driver = 0;
  if (cudaRuntimeGetVersion(runtime) != cudaSuccess) *runtime = 0;
  if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
  (void)cudaGetLastError();
}

int cuda_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace qnccl
