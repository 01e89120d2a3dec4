/* The CUDA codec against the host codec, through the public API: for every
 * configuration (the cubic grid, or for half of them qncclRotationPrerotated:
 * every bucket on the uniform grid, as a rotated call's), qncclQuantize,
 * qncclDequantize and qncclDequantizeAccumulate run once on host buffers and
 * once on device buffers, and must write the same bytes. Device buffers get
 * garbage first (the codec must write every byte it owns, padding included)
 * and guard bytes after (it must write none
 * past its end); every other configuration uses device pointers that are
 * not 16- or 8-byte aligned, for the kernels' unvectorized paths. Finally
 * the device calls must not wait for their stream.
 *
 * Exit status: 0 all equal, 1 a mismatch or error (the first mismatch of each
 * configuration is printed), 77 no CUDA device (skipped). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "codec/dtype.h"
#include "gpu_test.h"
#include "qnccl.h"

namespace {

using namespace gpu_test;
using qnccl::BF16;
using qnccl::F16;
using qnccl::F32;

constexpr size_t kTypedOffset = 1;   // elements: a typed pointer not 16-byte aligned
constexpr size_t kWireOffset = 3;    // bytes: a compressed buffer not 8-byte aligned

/* Deterministic inputs in segments of random length, each of one kind:
 * ordinary values at some scale, constants, values near +-3e38 (overflowing
 * max - min), float32 and float16 subnormals, signed zeros, tiny mixed with
 * huge; with `nonfinite`, also segments sprinkled with NaN, +-Inf and NaN
 * payloads. */
std::vector<float> make_values(size_t n, uint64_t seed, bool nonfinite) {
  std::vector<float> v(n);
  uint64_t s = seed;
  for (size_t i = 0; i < n;) {
    const size_t len = 1 + next_random(s) % 300;
    const int kind = (int)(next_random(s) % (nonfinite ? 10 : 7));
    const float scale = ldexpf(1.0f, (int)(next_random(s) % 60) - 30);
    const float constant = (float)((int)(next_random(s) % 2001) - 1000) * scale;
    for (size_t j = 0; j < len && i < n; ++j, ++i) {
      const float u = (float)(next_random(s) >> 40) * 0x1p-23f - 1.0f;  // [-1, 1)
      const bool rare = next_random(s) % 50 == 0;
      switch (kind) {
        case 0: v[i] = u * scale; break;
        case 1: v[i] = constant; break;
        case 2: v[i] = u * 3e38f; break;
        case 3: v[i] = u * 1e-40f; break;
        case 4: v[i] = rare ? 0.0f : -0.0f; break;
        case 5: v[i] = rare ? u * 3.4e38f : u * 1e-38f; break;
        case 6: v[i] = u * 6e-5f; break;
        case 7: v[i] = rare ? NAN : u; break;
        case 8: v[i] = rare ? (u < 0 ? -INFINITY : INFINITY) : u * scale; break;
        default: v[i] = rare ? qnccl::bits_float(0xffc12345u) : u; break;
      }
    }
  }
  return v;
}

/* n bytes of device memory plus kGuard; `bytes` counts both. A failed
 * cudaMalloc leaves ptr null, which the first copy reports. */
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n + kGuard) {
    cuda_ok(cudaMalloc(&ptr, bytes), "cudaMalloc");
  }
  // cudaFree does not wait for queued work that still uses the memory (CUDA
  // promises no synchronization there): the device is idle first.
  ~DeviceBuffer() {
    cudaDeviceSynchronize();
    cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(ptr) + offset; }
};

bool upload(void* dst, const std::vector<uint8_t>& src) {
  return src.empty() ||
         cuda_ok(cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
}

std::vector<uint8_t> download(const void* src, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  cuda_ok(cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  return out;
}

/* Compares `want` (host codec) with the device's bytes, which carry kGuard
 * guard bytes of kGarbage; `unit` is the element size, for the message. */
bool same_bytes(const std::string& what, const std::vector<uint8_t>& want,
                const std::vector<uint8_t>& got, size_t unit) {
  const bool equal = want.empty() || memcmp(want.data(), got.data(), want.size()) == 0;
  for (size_t i = 0; !equal && i < want.size(); ++i) {
    if (want[i] == got[i]) continue;
    const size_t first = i / unit * unit;
    printf("MISMATCH %s: element %zu (byte %zu of %zu): host", what.c_str(), i / unit, i,
           want.size());
    for (size_t b = first; b < first + unit && b < want.size(); ++b) printf(" %02x", want[b]);
    printf(", device");
    for (size_t b = first; b < first + unit && b < want.size(); ++b) printf(" %02x", got[b]);
    printf("\n");
    return false;
  }
  for (size_t i = want.size(); i < got.size(); ++i) {
    if (got[i] == kGarbage) continue;
    printf("MISMATCH %s: device wrote byte %zu past the end (%zu bytes)\n", what.c_str(), i,
           want.size());
    return false;
  }
  return true;
}

struct Input {
  const char* name;
  ncclDataType_t type;
  size_t size;                   // bytes per element
  std::vector<uint8_t> values;   // `count` elements of `type`
  std::vector<uint8_t> acc;      // initial accumulator, same type
};

template <class Type>
std::vector<uint8_t> to_bytes(const std::vector<float>& f) {
  std::vector<uint8_t> out(f.size() * sizeof(typename Type::T));
  for (size_t i = 0; i < f.size(); ++i) {
    const typename Type::T t = Type::store(f[i]);
    memcpy(out.data() + i * sizeof t, &t, sizeof t);
  }
  return out;
}

Input make_input(ncclDataType_t type, size_t count, bool nonfinite) {
  const std::vector<float> values = make_values(count, count * 3 + nonfinite, nonfinite);
  const std::vector<float> acc = make_values(count, count * 7 + 1, true);
  switch (type) {
    case ncclFloat16: return Input{"float16", type, 2, to_bytes<F16>(values), to_bytes<F16>(acc)};
    case ncclBfloat16:
      return Input{"bfloat16", type, 2, to_bytes<BF16>(values), to_bytes<BF16>(acc)};
    default: return Input{"float32", type, 4, to_bytes<F32>(values), to_bytes<F32>(acc)};
  }
}

/* One configuration: quantize, dequantize, accumulate on both sides. */
bool check_config(const Input& in, size_t count, const qncclCodecConfig_t& cfg, uint64_t rstream,
                  bool aligned, const DeviceBuffer& dsrc, const DeviceBuffer& dwire,
                  const DeviceBuffer& dout, cudaStream_t stream, const std::string& name) {
  size_t bytes = 0;
  if (!nccl_ok(qncclCompressedSize(count, &cfg, &bytes), name + " qncclCompressedSize"))
    return false;
  const size_t typed = aligned ? 0 : kTypedOffset * in.size, wire = aligned ? 0 : kWireOffset;
  const size_t data = count * in.size;

  std::vector<uint8_t> hwire(bytes);
  if (!nccl_ok(qncclQuantize(in.values.data(), count, in.type, &cfg, rstream, hwire.data(), bytes,
                             nullptr),
               name + " host qncclQuantize"))
    return false;
  if (!upload(dsrc.at(typed), in.values) ||
      !cuda_ok(cudaMemset(dwire.ptr, kGarbage, dwire.bytes), "cudaMemset"))
    return false;
  if (!nccl_ok(qncclQuantize(dsrc.at(typed), count, in.type, &cfg, rstream, dwire.at(wire), bytes,
                             stream),
               name + " device qncclQuantize") ||
      !cuda_ok(cudaStreamSynchronize(stream), "quantize kernels"))
    return false;
  if (!same_bytes(name + " quantize", hwire, download(dwire.at(wire), bytes + kGuard), 1))
    return false;

  for (int accumulate = 0; accumulate < 2; ++accumulate) {
    std::vector<uint8_t> hout = accumulate ? in.acc : std::vector<uint8_t>(data, kGarbage);
    if (!cuda_ok(cudaMemset(dout.ptr, kGarbage, dout.bytes), "cudaMemset") ||
        (accumulate && !upload(dout.at(typed), in.acc)))
      return false;
    const auto run = accumulate ? qncclDequantizeAccumulate : qncclDequantize;
    const std::string op = name + (accumulate ? " qncclDequantizeAccumulate" : " qncclDequantize");
    if (!nccl_ok(run(hwire.data(), bytes, count, &cfg, hout.data(), in.type, nullptr),
                 op + " (host)") ||
        !nccl_ok(run(dwire.at(wire), bytes, count, &cfg, dout.at(typed), in.type, stream),
                 op + " (device)") ||
        !cuda_ok(cudaStreamSynchronize(stream), "dequantize kernels"))
      return false;
    if (!same_bytes(op, hout, download(dout.at(typed), data + kGuard), in.size)) return false;
  }
  return true;
}

/* The device calls return while their stream is still held shut, and compute
 * the right bytes once it opens. */
bool check_no_sync(cudaStream_t stream) {
  const size_t count = (3 << 20) + 5;
  const qncclCodecConfig_t cfg = {4, 128, qncclRoundStochastic, 42, qncclRotationNone, 0,
                                  qncclClipNone};
  const Input in = make_input(ncclFloat32, count, false);
  const std::string name = "no-sync float32 n=3145733 bits=4 bucket=128 stochastic";
  size_t bytes = 0;
  std::vector<uint8_t> hwire, hout(count * 4), hacc = in.acc;
  if (!nccl_ok(qncclCompressedSize(count, &cfg, &bytes), name)) return false;
  hwire.resize(bytes);
  if (!nccl_ok(qncclQuantize(in.values.data(), count, in.type, &cfg, 9, hwire.data(), bytes,
                             nullptr), name) ||
      !nccl_ok(qncclDequantize(hwire.data(), bytes, count, &cfg, hout.data(), in.type, nullptr),
               name) ||
      !nccl_ok(qncclDequantizeAccumulate(hwire.data(), bytes, count, &cfg, hacc.data(), in.type,
                                         nullptr), name))
    return false;
  DeviceBuffer dsrc(count * 4), dwire(bytes), dout(count * 4), dacc(count * 4);
  if (!upload(dsrc.ptr, in.values) || !upload(dacc.ptr, in.acc) ||
      !cuda_ok(cudaMemset(dacc.at(count * 4), kGarbage, kGuard), "cudaMemset"))
    return false;
  // CUDA loads kernels lazily, which may wait for the device on a kernel's
  // first launch: launch every kernel once before the gate.
  if (!nccl_ok(qncclQuantize(dsrc.ptr, count, in.type, &cfg, 9, dwire.ptr, bytes, stream), name) ||
      !nccl_ok(qncclDequantize(dwire.ptr, bytes, count, &cfg, dout.ptr, in.type, stream), name) ||
      !nccl_ok(qncclDequantizeAccumulate(dwire.ptr, bytes, count, &cfg, dout.ptr, in.type, stream),
               name) ||
      !cuda_ok(cudaMemsetAsync(dwire.ptr, kGarbage, dwire.bytes, stream), "cudaMemset") ||
      !cuda_ok(cudaMemsetAsync(dout.ptr, kGarbage, dout.bytes, stream), "cudaMemset") ||
      !cuda_ok(cudaDeviceSynchronize(), "setup"))
    return false;

  StreamGate gate(stream);
  const auto t0 = Clock::now();
  const bool called =
      nccl_ok(qncclQuantize(dsrc.ptr, count, in.type, &cfg, 9, dwire.ptr, bytes, stream), name) &&
      nccl_ok(qncclDequantize(dwire.ptr, bytes, count, &cfg, dout.ptr, in.type, stream), name) &&
      nccl_ok(qncclDequantizeAccumulate(dwire.ptr, bytes, count, &cfg, dacc.ptr, in.type, stream),
              name);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  gate.open();
  if (!cuda_ok(cudaStreamSynchronize(stream), "gated kernels") || !called) return false;
  if (seconds > 10) {
    printf("FAIL: %s: the device calls took %.1f s behind a held stream: they synchronize\n",
           name.c_str(), seconds);
    return false;
  }
  return same_bytes(name + " quantize", hwire, download(dwire.ptr, dwire.bytes), 1) &&
         same_bytes(name + " dequantize", hout, download(dout.ptr, dout.bytes), 4) &&
         same_bytes(name + " accumulate", hacc, download(dacc.ptr, dacc.bytes), 4);
}

/* The configuration matrix over `counts`; stops after kMaxFailures failures. */
void check_matrix(const std::vector<size_t>& counts, cudaStream_t stream, int* passed,
                  int* failed) {
  constexpr int kMaxFailures = 20;
  // One pass (powers of two from 8 to 4096: a bucket per 1 or 16 lanes, per warp over 2 or 16
  // tiles) and two (1, 7, 1000; 1 << 20 sliced).
  const size_t buckets[] = {1, 7, 8, 128, 512, 1000, 4096, 1 << 20};
  const ncclDataType_t types[] = {ncclFloat32, ncclFloat16, ncclBfloat16};
  uint64_t serial = 0;  // numbers the configurations: seed, random stream, alignment
  for (size_t count : counts) {
    // Largest buffers of this count: 4-byte values; 8 bits and bucket 1 on the wire.
    DeviceBuffer dsrc(count * 4 + 16), dout(count * 4 + 16), dwire(9 * count + 16 + kWireOffset);
    for (ncclDataType_t type : types) {
      for (int nonfinite = 0; nonfinite < 2; ++nonfinite) {
        const Input in = make_input(type, count, nonfinite);
        const char* values = nonfinite ? "with-nonfinite" : "finite";
        const auto t0 = Clock::now();
        for (int bits = QNCCL_MIN_BITS; bits <= QNCCL_MAX_BITS; ++bits) {
          for (size_t bucket : buckets) {
            for (int rounding = 0; rounding < 2; ++rounding, ++serial) {
              // every other bucket prerotated, flipping with bits: each bucket size takes
              // both grids, the cubic one and a rotated call's uniform one
              const bool rotated = (serial / 2 + (size_t)bits) % 2 == 1;
              // about half of those with their ranges clipped, picked by a hash of the
              // serial: every bucket size meets both roundings and many widths clipped
              const bool clipped = rotated && ((serial * 0x9e3779b97f4a7c15ull) >> 63) == 0;
              const qncclCodecConfig_t cfg = {
                  bits, bucket, (qncclRounding_t)rounding, 0x5eed0000ull + serial,
                  rotated ? qncclRotationPrerotated : qncclRotationNone, 0,
                  clipped ? qncclClipGaussian : qncclClipNone};
              const bool aligned = serial % 3 != 1;  // period 3: mixes with bits and rounding
              char name[160];
              snprintf(name, sizeof name, "%s n=%zu %s bits=%d bucket=%zu %s%s%s", in.name, count,
                       values, bits, bucket, rounding ? "stochastic" : "nearest",
                       rotated ? (clipped ? " prerotated clipped" : " prerotated") : "",
                       aligned ? "" : " unaligned");
              const bool ok = check_config(in, count, cfg, serial * 977, aligned, dsrc, dwire,
                                           dout, stream, name);
              ++*(ok ? passed : failed);
              if (*failed >= kMaxFailures) {
                printf("stopping after %d failures\n", *failed);
                return;
              }
            }
          }
        }
        printf("%s n=%zu %s: done in %.1f s\n", in.name, count, values,
               std::chrono::duration<double>(Clock::now() - t0).count());
        fflush(stdout);
      }
    }
  }
}

/* float32 values of the ordinary kind at a scale per run of 4096 (2^-30 to
 * 2^29), made by every core: for counts past 2^31, where make_input's
 * per-value segments would take minutes. */
std::vector<uint8_t> quick_values(size_t count, uint64_t seed) {
  std::vector<uint8_t> out(count * 4);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      float* f = reinterpret_cast<float*>(out.data());
      for (size_t i = count * t / threads; i < count * (t + 1) / threads; ++i) {
        uint64_t run = seed ^ (i >> 12) * 0x9e3779b97f4a7c15ull, s = seed + i * 0xbf58476d1ce4e5b9ull;
        const float scale = ldexpf(1.0f, (int)(next_random(run) % 60) - 30);
        f[i] = ((float)(next_random(s) >> 40) * 0x1p-23f - 1.0f) * scale;
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return out;
}

/* One float32 count, two configurations (one pass and two passes, both
 * roundings, aligned and not). With --wrap, so large that every grid-stride
 * loop of the kernels goes round more than once (kMaxBlocks blocks of 256
 * lanes, a lane per group of 8 values: past 8,388,608 values); with
 * --huge N, past 2^31 values (64-bit indexing, a wire past 2^32 bits). */
void check_large(size_t count, cudaStream_t stream, int* passed, int* failed) {
  const qncclCodecConfig_t configs[] = {
      {4, 128, qncclRoundStochastic, 77, qncclRotationNone, 0, qncclClipNone},
      {3, 7, qncclRoundNearest, 78, qncclRotationNone, 0, qncclClipNone}};
  DeviceBuffer dsrc(count * 4 + 16), dout(count * 4 + 16), dwire(2 * count + 16 + kWireOffset);
  const Input in = count <= (1u << 28) ? make_input(ncclFloat32, count, false)
                                        : Input{"float32", ncclFloat32, 4, quick_values(count, 3),
                                                quick_values(count, 7)};
  printf("float32 n=%zu: inputs made\n", count);
  fflush(stdout);
  uint64_t serial = 0;
  for (const qncclCodecConfig_t& cfg : configs) {
    char name[160];
    snprintf(name, sizeof name, "float32 n=%zu bits=%d bucket=%zu %s%s (large)", count,
             cfg.bits, cfg.bucketSize, cfg.rounding ? "stochastic" : "nearest",
             serial % 2 ? " unaligned" : "");
    const auto t0 = Clock::now();
    const bool ok = check_config(in, count, cfg, 4242 + serial, serial % 2 == 0, dsrc, dwire,
                                 dout, stream, name);
    ++*(ok ? passed : failed);
    printf("%s: %s in %.1f s\n", name, ok ? "equal" : "FAILED",
           std::chrono::duration<double>(Clock::now() - t0).count());
    fflush(stdout);
    ++serial;
  }
}

/* "0,1,9" as a list of counts. */
bool parse_counts(const char* text, std::vector<size_t>* out) {
  out->clear();
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const unsigned long long n = strtoull(p, &end, 10);
    if (end == p || (*end != ',' && *end != '\0')) return false;
    out->push_back((size_t)n);
    p = *end == ',' ? end + 1 : end;
  }
  return !out->empty();
}

}  // namespace

/* codec_gpu_test [--counts N,N,...] [--wrap] [--huge N]: the matrix over the
 * counts (by default 0, 1, 9, 4099, 2^20 and 3*2^20 + 5; --counts '' skips
 * it), then, with --wrap, a count whose grid-stride loops wrap, and with
 * --huge, N float32 values (2147483651 = 2^31 + 3: about 45 GB of host and
 * 20 GB of device memory). */
int main(int argc, char** argv) {
  std::vector<size_t> counts = {0, 1, 9, 4099, 1 << 20, (3 << 20) + 5};
  bool wrap = false;
  size_t huge = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<size_t> one;
    if (strcmp(argv[i], "--wrap") == 0) {
      wrap = true;
    } else if (strcmp(argv[i], "--huge") == 0 && i + 1 < argc && parse_counts(argv[i + 1], &one) &&
               one.size() == 1 && one[0] > 0) {
      huge = one[0];
      ++i;
    } else if (strcmp(argv[i], "--counts") == 0 && i + 1 < argc && argv[i + 1][0] == '\0') {
      counts.clear();
      ++i;
    } else if (strcmp(argv[i], "--counts") == 0 && i + 1 < argc &&
               parse_counts(argv[i + 1], &counts)) {
      ++i;
    } else {
      printf("usage: %s [--counts N,N,...] [--wrap] [--huge N]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  int compiled = 0;
  if (qncclCudaCompiled(&compiled) != ncclSuccess || !compiled) {
    printf("FAIL: libqnccl was built without the CUDA kernels\n");
    return 1;
  }
  cudaStream_t stream;
  if (!cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;
  const auto start = Clock::now();
  int passed = 0, failed = 0;
  check_matrix(counts, stream, &passed, &failed);
  if (wrap) check_large(9000011, stream, &passed, &failed);
  if (huge != 0) check_large(huge, stream, &passed, &failed);
  ++(check_no_sync(stream) ? passed : failed);
  cudaStreamDestroy(stream);
  printf("%d passed, %d failed (%.1f s)\n", passed, failed,
         std::chrono::duration<double>(Clock::now() - start).count());
  return failed == 0 ? 0 : 1;
}
