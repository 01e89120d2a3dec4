/* The quantized allreduce on device buffers (the engine's CUDA path) through
 * NVIDIA's NCCL, which QNCCL_NCCL_LIB names (tests/test_allreduce_gpu.py
 * finds it):
 *   1. one rank: every algorithm, type, op and rounding on device buffers
 *      writes the bytes the host path writes for the same call (a second
 *      1-rank communicator runs the host buffers, so both count calls alike);
 *      outputs get garbage first and guard bytes after, inputs stay intact;
 *   2. mixed host/device buffers fail with ncclInvalidArgument;
 *   3. a call enqueued behind a held stream returns without waiting for it;
 *   4. CUDA graph capture through the interposed ncclAllReduce (with a
 *      quantized op: on one rank the environment's policy passes calls
 *      through, nothing crossing a link, but an explicit request stays): on a new
 *      communicator (no workspace yet: it is allocated during the capture,
 *      in relaxed mode) two captured calls are quantized, and a replay
 *      writes the host path's bytes of calls 0 and 1; after an eager call a
 *      captured call is quantized again, and each replay writes the host
 *      path's bytes of the next call number (a device counter the graph
 *      advances), as does an eager call after the replays;
 *   5. error feedback: four calls on the same host and device buffers give
 *      the same bytes and leave the same residuals on both sides, for every
 *      algorithm and type, sum and avg;
 *   6. with two devices, two ranks in this process (ncclCommInitAll), each
 *      case one group of both ranks' interposed ncclAllReduce calls on their
 *      devices' streams: both ranks' outputs are identical, and with an
 *      output folder (argv[1]) the inputs and outputs are written there with
 *      a manifest for the emulator to check;
 *   7. qncclReduceScatter (ring, SRA), qncclAllGather and qncclAlltoAll on
 *      device buffers write the host path's bytes too, in and out of place
 *      (one rank: the store, the encode and decode kernels, the copy).
 *
 * Exit status: 0 all passed, 1 a failure (printed), 77 skipped (no CUDA
 * device, or no NVIDIA NCCL). */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "codec/dtype.h"
#include "gpu_test.h"
#include "qnccl.h"

namespace {

using namespace gpu_test;
using Bytes = std::vector<uint8_t>;


size_t type_size(ncclDataType_t type) { return type == ncclFloat32 ? 4 : 2; }

const char* type_name(ncclDataType_t type) {
  return type == ncclFloat32 ? "float32" : type == ncclFloat16 ? "float16" : "bfloat16";
}

/* `count` values of `type`: each run of up to 300 values at its own scale;
 * with `nonfinite` a few NaN and +-Inf. */
Bytes make_input(ncclDataType_t type, size_t count, uint64_t seed, bool nonfinite) {
  Bytes out(count * type_size(type));
  uint64_t s = seed;
  float scale = 1.0f;
  for (size_t i = 0; i < count; ++i) {
    if (i % 300 == 0) scale = ldexpf(1.0f, (int)(next_random(s) % 24) - 12);
    float v = ((float)(next_random(s) >> 40) * 0x1p-23f - 1.0f) * scale;
    if (nonfinite && next_random(s) % 997 == 0) v = next_random(s) % 2 ? NAN : -INFINITY;
    if (type == ncclFloat32) {
      memcpy(&out[4 * i], &v, 4);
    } else {
      const uint16_t h = type == ncclFloat16 ? qnccl::F16::store(v) : qnccl::BF16::store(v);
      memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

/* `bytes` of device memory plus kGuard, filled with kGarbage. */
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes;
  // (cudaMemset is asynchronous and on the legacy stream, which the calls'
  // non-blocking stream does not wait for: it is waited for here.)
  explicit DeviceBuffer(size_t n) : bytes(n + kGuard) {
    if (cuda_ok(cudaMalloc(&ptr, bytes), "cudaMalloc"))
      cuda_ok(cudaMemset(ptr, kGarbage, bytes), "cudaMemset") &&
          cuda_ok(cudaStreamSynchronize(nullptr), "cudaMemset");
  }
  // cudaFree does not wait for queued work that still uses the memory (CUDA
  // promises no synchronization there): the device is idle first.
  ~DeviceBuffer() {
    cudaDeviceSynchronize();
    cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /* cudaMemcpy from pageable memory may return before its bytes reach the
   * device, and the calls run on a non-blocking stream, which does not wait
   * for the legacy stream's copy: wait for it. */
  bool upload(const Bytes& b) {
    return b.empty() ||
           (cuda_ok(cudaMemcpy(ptr, b.data(), b.size(), cudaMemcpyHostToDevice),
                    "cudaMemcpy to the device") &&
            cuda_ok(cudaStreamSynchronize(nullptr), "the copy to the device"));
  }
  Bytes download() const {
    Bytes out(bytes);
    cuda_ok(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    return out;
  }
};

/* `want` equals the first want.size() bytes of `got`, whose rest is kGarbage. */
bool same_bytes(const std::string& what, const Bytes& want, const Bytes& got, size_t unit) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == got[i]) continue;
    printf("MISMATCH %s: element %zu (byte %zu of %zu): host %02x, device %02x\n", what.c_str(),
           i / unit, i, want.size(), want[i], got[i]);
    return false;
  }
  for (size_t i = want.size(); i < got.size(); ++i) {
    if (got[i] == kGarbage) continue;
    printf("MISMATCH %s: the device wrote byte %zu past the end (%zu bytes)\n", what.c_str(), i,
           want.size());
    return false;
  }
  return true;
}

/* Two 1-rank communicators on device 0: one for host buffers, one for
 * device buffers, given the same calls in the same order. */
struct Twin {
  ncclComm_t host = nullptr, device = nullptr;
  bool init() {
    const int dev = 0;
    return nccl_ok(ncclCommInitAll(&host, 1, &dev), "ncclCommInitAll") &&
           nccl_ok(ncclCommInitAll(&device, 1, &dev), "ncclCommInitAll");
  }
  ~Twin() {
    if (host) ncclCommDestroy(host);
    if (device) ncclCommDestroy(device);
  }
};

struct Case {
  qncclAllReduceConfig_t config;
  ncclDataType_t type;
  ncclRedOp_t op;
  size_t count;
  bool inplace, nonfinite;
  std::string name() const {
    static const char* algos[] = {"auto", "ring", "tree", "sra"};
    char text[200];
    snprintf(text, sizeof text, "%s %s n=%zu bits=%d bucket=%zu %s %s segment=%zu%s%s",
             algos[config.algo], type_name(type), count, config.codec.bits,
             config.codec.bucketSize,
             config.codec.rounding == qncclRoundStochastic ? "stochastic" : "nearest",
             op == ncclAvg ? "avg" : "sum", config.segmentValues, inplace ? " in-place" : "",
             nonfinite ? " nonfinite" : "");
    return text;
  }
};

/* The host path's output of `c` on `input` (the twin's host communicator). */
bool host_result(const Case& c, ncclComm_t comm, const Bytes& input, Bytes* out) {
  Bytes send = input;
  *out = Bytes(input.size(), kGarbage);
  void* recv = c.inplace ? send.data() : out->data();
  if (!nccl_ok(qncclAllReduce(send.data(), recv, c.count, c.type, c.op, &c.config, comm, nullptr),
               c.name() + " (host buffers)"))
    return false;
  if (c.inplace) *out = send;
  return true;
}

/* Part 1: one case on both sides of the twin. */
bool check_case(const Case& c, Twin& twin, cudaStream_t stream, uint64_t seed) {
  const std::string name = c.name();
  const Bytes input = make_input(c.type, c.count, seed, c.nonfinite);
  Bytes want;
  if (!host_result(c, twin.host, input, &want)) return false;
  DeviceBuffer send(input.size()), recv(input.size());
  if (!send.upload(input)) return false;
  void* out = c.inplace ? send.ptr : recv.ptr;
  if (!nccl_ok(qncclAllReduce(send.ptr, out, c.count, c.type, c.op, &c.config, twin.device,
                              stream),
               name + " (device buffers)") ||
      !cuda_ok(cudaStreamSynchronize(stream), name + ": the device work"))
    return false;
  if (!same_bytes(name, want, (c.inplace ? send : recv).download(), type_size(c.type)))
    return false;
  return c.inplace || same_bytes(name + " (input)", input, send.download(), type_size(c.type));
}

int check_matrix(Twin& twin, cudaStream_t stream) {
  struct Shape {
    size_t count, bucket, segment;
    int bits;
  };
  const Shape shapes[] = {{0, 128, 0, 4}, {1, 128, 0, 4}, {4099, 7, 0, 3},
                          {5003, 1000, 1000, 8}, {300007, 128, 65536, 4}, {(1 << 20) + 3, 64, 0, 2}};
  const ncclDataType_t types[] = {ncclFloat32, ncclFloat16, ncclBfloat16};
  int failed = 0;
  uint64_t serial = 0;
  for (const Shape& shape : shapes)
    for (int algo = qncclAlgoRing; algo <= qncclAlgoSra; ++algo)
      for (ncclDataType_t type : types)
        for (int variant = 0; variant < 4; ++variant, ++serial) {
          Case c;
          c.config.codec = {shape.bits, shape.bucket,
                            variant % 2 ? qncclRoundStochastic : qncclRoundNearest,
                            0x5eed0000ull + serial, qncclRotationNone, 0, qncclClipNone};
          c.config.algo = (qncclAlgo_t)algo;
          c.config.segmentValues = shape.segment;
          c.type = type;
          c.op = variant / 2 ? ncclAvg : ncclSum;
          c.count = shape.count;
          c.inplace = serial % 3 == 1;
          c.nonfinite = serial % 5 == 2;
          if (!check_case(c, twin, stream, serial * 7919 + 1) && ++failed >= 10) return failed;
        }
  printf("matrix: %llu cases, %d failed\n", (unsigned long long)serial, failed);
  return failed;
}

/* Part 7: one call of `kind` (a qncclColl* flag) on both sides of the twin. */
bool check_collective(qncclCollective_t kind, const Case& c, Twin& twin, cudaStream_t stream,
                      uint64_t seed) {
  static const char* kinds[] = {"", "reduce-scatter", "allgather", "", "all-to-all"};
  const std::string name = std::string(kinds[kind / 2]) + " " + c.name();
  const size_t bytes = c.count * type_size(c.type);  // one rank: one chunk
  auto call = [&](ncclComm_t comm, void* send, void* recv, cudaStream_t s) {
    switch (kind) {
      case qncclCollReduceScatter:
        return qncclReduceScatter(send, recv, c.count, c.type, c.op, &c.config, comm, s);
      case qncclCollAllGather:
        return qncclAllGather(send, recv, c.count, c.type, &c.config, comm, s);
      default:
        return qncclAlltoAll(send, recv, c.count, c.type, &c.config, comm, s);
    }
  };
  const Bytes input = make_input(c.type, c.count, seed, c.nonfinite);
  Bytes send = input, want(bytes, kGarbage);
  if (!nccl_ok(call(twin.host, send.data(), c.inplace ? send.data() : want.data(), nullptr),
               name + " (host buffers)"))
    return false;
  if (c.inplace) want = send;
  DeviceBuffer dsend(bytes), drecv(bytes);
  if (!dsend.upload(input)) return false;
  if (!nccl_ok(call(twin.device, dsend.ptr, c.inplace ? dsend.ptr : drecv.ptr, stream),
               name + " (device buffers)") ||
      !cuda_ok(cudaStreamSynchronize(stream), name + ": the device work"))
    return false;
  if (!same_bytes(name, want, (c.inplace ? dsend : drecv).download(), type_size(c.type)))
    return false;
  return c.inplace || same_bytes(name + " (input)", input, dsend.download(), type_size(c.type));
}

int check_collectives(Twin& twin, cudaStream_t stream) {
  const ncclDataType_t types[] = {ncclFloat32, ncclFloat16, ncclBfloat16};
  const size_t counts[] = {0, 1, 4099, 300007};
  int failed = 0;
  uint64_t serial = 0;
  for (qncclCollective_t kind : {qncclCollReduceScatter, qncclCollAllGather, qncclCollAllToAll})
    for (size_t count : counts)
      for (ncclDataType_t type : types)
        for (int variant = 0; variant < 4; ++variant, ++serial) {
          Case c;
          c.config = {{1 + (int)(serial % 8), variant < 2 ? (size_t)128 : (size_t)7,
                       variant % 2 ? qncclRoundStochastic : qncclRoundNearest,
                       0xc011ull + serial, qncclRotationNone, 0, qncclClipNone},
                      qncclAlgoAuto, variant == 3 ? (size_t)65536 : 0, 0, qncclAlgoAuto, 0, 0};
          if (kind == qncclCollReduceScatter)
            c.config.algo = variant % 2 ? qncclAlgoRing : qncclAlgoSra;
          c.type = type;
          c.op = kind == qncclCollReduceScatter && variant / 2 ? ncclAvg : ncclSum;
          c.count = count;
          c.inplace = serial % 3 == 1;
          c.nonfinite = serial % 5 == 2;
          if (!check_collective(kind, c, twin, stream, serial * 104729 + 3) && ++failed >= 10)
            return failed;
        }
  printf("collectives: %llu cases, %d failed\n", (unsigned long long)serial, failed);
  return failed;
}

/* Part 2. */
bool check_mixed_buffers(Twin& twin, cudaStream_t stream) {
  const qncclAllReduceConfig_t config = {
      {4, 128, qncclRoundNearest, 1, qncclRotationNone, 0, qncclClipNone},
      qncclAlgoAuto, 0, 0, qncclAlgoAuto, 0, 0};
  std::vector<float> host(1000, 1.0f);
  DeviceBuffer device(host.size() * 4);
  const ncclResult_t res = qncclAllReduce(host.data(), device.ptr, host.size(), ncclFloat32,
                                          ncclSum, &config, twin.device, stream);
  if (res == ncclInvalidArgument && strstr(qncclGetLastError(), "host memory") != nullptr)
    return true;
  printf("FAIL: mixed host/device buffers: result %d, message: %s\n", (int)res,
         qncclGetLastError());
  return false;
}

bool check_no_sync(Twin& twin, cudaStream_t stream) {
  Case c;
  c.config = {{4, 128, qncclRoundStochastic, 42, qncclRotationNone, 0, qncclClipNone},
              qncclAlgoRing, 1 << 18, 0, qncclAlgoAuto, 0, 0};
  c.type = ncclFloat32;
  c.op = ncclAvg;
  c.count = (3 << 20) + 5;
  c.inplace = false;
  c.nonfinite = false;
  // The first call grows the workspace (and loads the kernels); then hold the stream.
  if (!check_case(c, twin, stream, 99)) return false;
  const Bytes input = make_input(c.type, c.count, 100, false);
  Bytes want;
  if (!host_result(c, twin.host, input, &want)) return false;
  DeviceBuffer send(input.size()), recv(input.size());
  if (!send.upload(input)) return false;
  StreamGate gate(stream);
  const auto t0 = Clock::now();
  const ncclResult_t res = qncclAllReduce(send.ptr, recv.ptr, c.count, c.type, c.op, &c.config,
                                          twin.device, stream);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  gate.open();
  if (!nccl_ok(res, "no-sync call") || !cuda_ok(cudaStreamSynchronize(stream), "gated work"))
    return false;
  if (seconds > 10) {
    printf("FAIL: the device allreduce took %.1f s behind a held stream: it synchronizes\n",
           seconds);
    return false;
  }
  return same_bytes("no-sync " + c.name(), want, recv.download(), 4);
}

/* Part 4: captures `calls` interposed ncclAllReduce calls of `op` into a graph. */
bool capture(cudaStream_t stream, ncclComm_t comm, ncclRedOp_t op, const DeviceBuffer& send,
             const DeviceBuffer& recv, size_t count, int calls, cudaGraphExec_t* exec) {
  cudaGraph_t graph;
  if (!cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture"))
    return false;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < calls && res == ncclSuccess; ++i)
    res = ncclAllReduce(send.ptr, recv.ptr, count, ncclFloat32, op, comm, stream);
  const bool ended = cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  if (!nccl_ok(res, "captured ncclAllReduce") || !ended) return false;
  const bool ok = cuda_ok(cudaGraphInstantiate(exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return ok;
}

bool replay(cudaGraphExec_t exec, cudaStream_t stream, const DeviceBuffer& recv,
            const Bytes& want, const std::string& what) {
  // On the replay's stream: the legacy stream does not order with a non-blocking one.
  return cuda_ok(cudaMemsetAsync(recv.ptr, kGarbage, recv.bytes, stream), "cudaMemsetAsync") &&
         cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch") &&
         cuda_ok(cudaStreamSynchronize(stream), what) &&
         same_bytes(what, want, recv.download(), 4);
}

bool check_capture(cudaStream_t stream) {
  Twin twin;
  qncclEnvConfig_t env;
  if (!twin.init() || !nccl_ok(qncclConfigFromEnv(&env), "qncclConfigFromEnv")) return false;
  if (env.minBytes > 0 || !env.enable) {
    printf("FAIL: run with QNCCL_MIN_BYTES=0 (and QNCCL_ENABLE unset)\n");
    return false;
  }
  Case c;
  c.config = env.allreduce;
  c.type = ncclFloat32;
  c.op = ncclSum;
  c.count = 1 << 16;
  c.inplace = false;
  c.nonfinite = false;
  const Bytes input = make_input(c.type, c.count, 5, false);
  DeviceBuffer send(input.size()), recv(input.size());
  if (!send.upload(input)) return false;
  const qncclQuantizedOpConfig_t quantized = {c.config, ncclSum};
  ncclRedOp_t op;
  if (!nccl_ok(qncclRedOpCreateQuantized(&op, &quantized, twin.device),
               "qncclRedOpCreateQuantized"))
    return false;
  // No workspace yet: it is made during the capture, and both captured calls
  // are quantized; one replay runs calls 0 and 1 (the second's bytes stay).
  cudaGraphExec_t exec;
  Bytes want;
  if (!capture(stream, twin.device, op, send, recv, c.count, 2, &exec) ||
      !host_result(c, twin.host, input, &want) || !host_result(c, twin.host, input, &want))
    return false;
  bool ok = replay(exec, stream, recv, want, "captured calls on a new communicator");
  cudaGraphExecDestroy(exec);
  qncclStats_t stats;
  if (!ok || !nccl_ok(qncclCommGetStats(twin.device, &stats), "stats")) return false;
  if (stats.callsPassedThrough != 0 || stats.callsCompressed != 2) {
    printf("FAIL: capture without workspace: %llu passed through, %llu compressed; want 0, 2\n",
           (unsigned long long)stats.callsPassedThrough,
           (unsigned long long)stats.callsCompressed);
    return false;
  }
  // An eager call (call 2), then a captured one: replays take calls 3, 4.
  if (!host_result(c, twin.host, input, &want) ||
      !nccl_ok(ncclAllReduce(send.ptr, recv.ptr, c.count, c.type, op, twin.device, stream),
               "eager ncclAllReduce") ||
      !cuda_ok(cudaStreamSynchronize(stream), "eager call") ||
      !same_bytes("eager " + c.name(), want, recv.download(), 4))
    return false;
  if (!host_result(c, twin.host, input, &want) ||
      !capture(stream, twin.device, op, send, recv, c.count, 1, &exec))
    return false;
  // Each replay takes the next call number from the device counter: replay 1
  // is call 3, replay 2 call 4 (new rounding noise), and an eager call after
  // them call 5, ordered after the replays that share its workspace.
  ok = replay(exec, stream, recv, want, "captured quantized call, replay 1") &&
       host_result(c, twin.host, input, &want) &&
       replay(exec, stream, recv, want, "captured quantized call, replay 2") &&
       host_result(c, twin.host, input, &want) &&
       nccl_ok(ncclAllReduce(send.ptr, recv.ptr, c.count, c.type, op, twin.device, stream),
               "eager ncclAllReduce after the replays") &&
       cuda_ok(cudaStreamSynchronize(stream), "eager call after the replays") &&
       same_bytes("eager call after the replays", want, recv.download(), 4);
  cudaGraphExecDestroy(exec);
  ok = ok && nccl_ok(qncclCommGetStats(twin.device, &stats), "stats") &&
       stats.callsCompressed == 5;
  return nccl_ok(ncclRedOpDestroy(op, twin.device), "ncclRedOpDestroy") && ok;
}

/* Part 5: `calls` calls with error feedback on one pair of buffers (host and
 * device, in place): equal outputs and residuals after each. */
bool check_error_feedback_case(Case c, Twin& twin, cudaStream_t stream, int calls) {
  c.config.errorFeedback = 1;
  const std::string name = c.name() + " error feedback";
  const size_t unit = type_size(c.type), bytes = c.count * unit;
  Bytes host(bytes);
  DeviceBuffer device(bytes);
  std::vector<float> host_residual(c.count), device_residual(c.count);
  bool ok = true;
  for (int call = 0; call < calls && ok; ++call) {
    const std::string what = name + " call " + std::to_string(call);
    // New values in the same buffers: residuals belong to a buffer's address.
    const Bytes input = make_input(c.type, c.count, 31 * call + 5, call == 2);  // NaN/Inf once
    std::copy(input.begin(), input.end(), host.begin());
    ok = device.upload(host) &&
         nccl_ok(qncclAllReduce(host.data(), host.data(), c.count, c.type, c.op, &c.config,
                                twin.host, nullptr), what + " (host)") &&
         nccl_ok(qncclAllReduce(device.ptr, device.ptr, c.count, c.type, c.op, &c.config,
                                twin.device, stream), what + " (device)") &&
         cuda_ok(cudaStreamSynchronize(stream), what) &&
         same_bytes(what, host, device.download(), unit) &&
         nccl_ok(qncclCommGetResidual(twin.host, host.data(), c.count, c.type,
                                      host_residual.data()), what + " host residual") &&
         nccl_ok(qncclCommGetResidual(twin.device, device.ptr, c.count, c.type,
                                      device_residual.data()), what + " device residual");
    if (ok && memcmp(host_residual.data(), device_residual.data(), c.count * 4) != 0) {
      printf("MISMATCH %s: the residuals differ\n", what.c_str());
      ok = false;
    }
  }
  // The buffers are freed: their addresses may come back for another case.
  return nccl_ok(qncclCommResetErrorFeedback(twin.host), "reset") &&
         nccl_ok(qncclCommResetErrorFeedback(twin.device), "reset") && ok;
}

int check_error_feedback(Twin& twin, cudaStream_t stream) {
  int failed = 0;
  for (int algo = qncclAlgoRing; algo <= qncclAlgoSra; ++algo)
    for (ncclDataType_t type : {ncclFloat32, ncclFloat16, ncclBfloat16})
      for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
        Case c;
        c.config = {{3, 100, qncclRoundStochastic, 11, qncclRotationNone, 0, qncclClipNone},
                    (qncclAlgo_t)algo, 20000, 0, qncclAlgoAuto, 0, 0};
        c.type = type;
        c.op = op;
        c.count = 50021;  // three segments
        c.inplace = true;
        c.nonfinite = false;
        failed += !check_error_feedback_case(c, twin, stream, 4);
      }
  printf("error feedback: %d failed\n", failed);
  return failed;
}

/* Part 6: two devices in one process: ncclCommInitAll of two ranks, one
 * device each, and per case one group of both ranks' interposed
 * ncclAllReduce calls, each on its own device's stream (the QNCCL_* settings
 * of the communicators: ring, tree and SRA in turn). */
bool write_file(const std::string& path, const Bytes& bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  const bool ok = f != nullptr && fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f != nullptr) fclose(f);
  if (!ok) printf("FAIL: cannot write %s\n", path.c_str());
  return ok;
}

/* The cases of `algo`, each the call-th call of a new pair of communicators. */
std::vector<Case> two_rank_cases(qncclAlgo_t algo) {
  std::vector<Case> cases;
  for (ncclDataType_t type : {ncclFloat32, ncclBfloat16}) {
    Case c;
    c.config = {{4, 128, qncclRoundStochastic, 7, qncclRotationNone, 0, qncclClipNone}, algo,
                0, 0, qncclAlgoAuto, 0, 0};
    c.type = type;
    c.op = type == ncclFloat32 ? ncclAvg : ncclSum;
    c.count = 300007;
    c.inplace = algo == qncclAlgoTree;
    c.nonfinite = false;
    cases.push_back(c);
  }
  return cases;
}

/* Runs the cases of `algo` on both ranks: their inputs and outputs. */
bool run_two_ranks(qncclAlgo_t algo, const std::vector<Case>& cases,
                   std::vector<Bytes> (&inputs)[2], std::vector<Bytes> (&outputs)[2]) {
  static const char* names[] = {"auto", "ring", "tree", "sra"};
  setenv("QNCCL_ALGO", names[algo], 1);  // read when the communicators' state is made
  setenv("QNCCL_BITS", "4", 1);
  setenv("QNCCL_BUCKET_SIZE", "128", 1);
  setenv("QNCCL_ROUNDING", "stochastic", 1);
  setenv("QNCCL_SEED", "7", 1);
  ncclComm_t comms[2] = {nullptr, nullptr};
  cudaStream_t streams[2] = {nullptr, nullptr};
  const int devices[2] = {0, 1};
  bool ok = nccl_ok(ncclCommInitAll(comms, 2, devices), "ncclCommInitAll of two devices");
  for (int r = 0; r < 2 && ok; ++r)
    ok = cuda_ok(cudaSetDevice(r), "cudaSetDevice") &&
         cuda_ok(cudaStreamCreate(&streams[r]), "cudaStreamCreate");
  for (size_t i = 0; i < cases.size() && ok; ++i) {
    const Case& c = cases[i];
    std::unique_ptr<DeviceBuffer> send[2], recv[2];
    for (int r = 0; r < 2 && ok; ++r) {
      inputs[r].push_back(make_input(c.type, c.count, 1000 * i + r + 10 * algo, false));
      ok = cuda_ok(cudaSetDevice(r), "cudaSetDevice");
      send[r].reset(new DeviceBuffer(inputs[r].back().size()));
      recv[r].reset(new DeviceBuffer(inputs[r].back().size()));
      ok = ok && send[r]->upload(inputs[r].back());
    }
    ok = ok && nccl_ok(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < 2 && ok; ++r)
      ok = cuda_ok(cudaSetDevice(r), "cudaSetDevice") &&
           nccl_ok(ncclAllReduce(send[r]->ptr, c.inplace ? send[r]->ptr : recv[r]->ptr, c.count,
                                 c.type, c.op, comms[r], streams[r]),
                   c.name() + " rank " + std::to_string(r));
    ok = nccl_ok(ncclGroupEnd(), "ncclGroupEnd of both ranks' calls") && ok;
    for (int r = 0; r < 2 && ok; ++r) {
      ok = cuda_ok(cudaSetDevice(r), "cudaSetDevice") &&
           cuda_ok(cudaStreamSynchronize(streams[r]), c.name());
      Bytes out = (c.inplace ? *send[r] : *recv[r]).download();
      out.resize(inputs[r].back().size());
      outputs[r].push_back(out);
    }
  }
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    if (comms[r] != nullptr) ncclCommDestroy(comms[r]);
    if (streams[r] != nullptr) cudaStreamDestroy(streams[r]);
  }
  cudaSetDevice(0);
  return ok;
}

bool check_two_ranks(const char* folder) {
  FILE* manifest = nullptr;
  if (folder != nullptr) manifest = fopen((std::string(folder) + "/manifest.txt").c_str(), "w");
  bool ok = folder == nullptr || manifest != nullptr;
  size_t checked = 0;
  for (int algo = qncclAlgoRing; algo <= qncclAlgoSra && ok; ++algo) {
    const std::vector<Case> cases = two_rank_cases((qncclAlgo_t)algo);
    std::vector<Bytes> inputs[2], outputs[2];
    ok = run_two_ranks((qncclAlgo_t)algo, cases, inputs, outputs);
    for (size_t i = 0; i < cases.size() && ok; ++i, ++checked) {
      const Case& c = cases[i];
      if (outputs[0][i] != outputs[1][i]) {
        printf("FAIL: 2 ranks, %s: the ranks' outputs differ\n", c.name().c_str());
        ok = false;
      } else if (manifest != nullptr) {
        static const char* algos[] = {"auto", "ring", "tree", "sra"};
        const std::string stem = std::string(folder) + "/case" + std::to_string(checked);
        ok = write_file(stem + ".in0", inputs[0][i]) && write_file(stem + ".in1", inputs[1][i]) &&
             write_file(stem + ".out", outputs[0][i]);
        // name algo dtype op rounding bits bucket seed segment_values call count
        fprintf(manifest, "case%zu %s %s %s %s %d %zu %llu %zu %zu %zu\n", checked,
                algos[c.config.algo], type_name(c.type), c.op == ncclAvg ? "avg" : "sum",
                c.config.codec.rounding == qncclRoundStochastic ? "stochastic" : "nearest",
                c.config.codec.bits, c.config.codec.bucketSize,
                (unsigned long long)c.config.codec.seed, c.config.segmentValues, i, c.count);
      }
    }
  }
  if (manifest != nullptr) fclose(manifest);
  printf("2 ranks: %zu cases, %s\n", checked, ok ? "ranks identical" : "FAILED");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
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
  const char* path = getenv("QNCCL_NCCL_LIB");
  if (dlopen(path != nullptr ? path : "libnccl.so.2", RTLD_NOW) == nullptr) {
    printf("SKIP: NVIDIA's NCCL (%s) does not load: %s\n", path ? path : "libnccl.so.2",
           dlerror());
    return 77;
  }
  cudaStream_t stream;
  if (!cuda_ok(cudaSetDevice(0), "cudaSetDevice") ||
      !cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"))
    return 1;
  const auto start = Clock::now();
  int failed = 0;
  {
    Twin twin;
    if (!twin.init()) return 1;
    failed += check_matrix(twin, stream);
    failed += !check_mixed_buffers(twin, stream);
    failed += !check_no_sync(twin, stream);
    failed += check_error_feedback(twin, stream);
    failed += check_collectives(twin, stream);
  }
  failed += !check_capture(stream);
  if (devices >= 2)
    failed += !check_two_ranks(argc > 1 ? argv[1] : nullptr);
  else
    printf("2 ranks: skipped, needs 2 CUDA devices (found %d)\n", devices);
  cudaStreamDestroy(stream);
  printf("%s (%.1f s)\n", failed == 0 ? "all passed" : "FAILED",
         std::chrono::duration<double>(Clock::now() - start).count());
  return failed == 0 ? 0 : 1;
}
