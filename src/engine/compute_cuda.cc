/* The device compute (engine/compute.h): the CUDA codec, and the engine's
 * kernels (compute_kernels.cu, compiled into the library by NVRTC) doing
 * what the host loops of compute_host.cc do with the same per-element
 * functions, so both write the same bytes. Plus the CUDA runtime calls of
 * the device path: capture state, the communicator's workspace memory, the
 * event that orders its reuse and the counter its calls take their numbers
 * from. Everything is enqueued on the caller's stream or the workspace's
 * private one; nothing here waits for the device, but cudaFree where the
 * device lacks stream-ordered allocation, and copy_device_residual (for this
 * communicator's calls only). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "codec/codec_math.h"
#include "codec/cuda_module.h"
#include "codec/rotation.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/compute.h"
#include "engine/engine.h"

namespace qnccl {
namespace {

constexpr unsigned kBlockThreads = 256;  // compute_kernels.cu's launch bounds
constexpr size_t kMaxBlocks = 4096;      // grid-stride loops cover any count

unsigned blocks_for(size_t n) {
  const size_t blocks = (n + kBlockThreads - 1) / kBlockThreads;
  return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

ncclResult_t cuda_failed(const char* what, int err) {
  return set_error(ncclUnhandledCudaError, "quantized allreduce: %s failed: CUDA error %d: %s",
                   what, err, cudaGetErrorString((cudaError_t)err));
}

/* A step's result, its failure named as the step. */
ncclResult_t step(const char* what, ncclResult_t res) {
  return prefix_error(res, "quantized allreduce: %s failed", what);
}

template <class... Args>
ncclResult_t launch(const char* name, unsigned grid, cudaStream_t stream, Args... args) {
  void* params[] = {&args...};
  return launch_kernel(kCudaModule_engine, name, grid, kBlockThreads, stream, params);
}

/* A kernel that is one thread's work (a counter's update): one thread, or
 * every thread of a block would update it. */
template <class... Args>
ncclResult_t launch_one(const char* name, cudaStream_t stream, Args... args) {
  void* params[] = {&args...};
  return launch_kernel(kCudaModule_engine, name, 1, 1, stream, params);
}

ncclResult_t quantize(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                      const CodecParams& p, uint8_t* wire) {
  return step("quantizing on the device", device_quantize(src, n, type, p, wire, c.stream));
}

ncclResult_t quantize_many(const Compute& c, const void* const* srcs, const size_t* counts, int n,
                           ncclDataType_t type, const CodecParams* ps, uint8_t* const* wires) {
  return step("quantizing on the device",
              device_quantize_many(srcs, counts, n, type, ps, wires, c.stream));
}

ncclResult_t dequantize(const Compute& c, const uint8_t* wire, size_t n, const CodecParams& p,
                        void* dst, ncclDataType_t type, bool accumulate) {
  return step("dequantizing on the device",
              device_dequantize(wire, n, p, dst, type, accumulate, c.stream));
}

ncclResult_t decode_many(const Compute& c, const uint8_t* const* wires, void* const* dsts,
                         const size_t* counts, int n, const CodecParams& p, ncclDataType_t type) {
  return step("dequantizing on the device",
              device_decode_many(wires, dsts, counts, n, p, type, c.stream));
}

ncclResult_t reduce(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                    const float* residual, const uint8_t* const* wires, int nwires,
                    const CodecParams& p, float* acc) {
  return step("reducing on the device",
              device_reduce(src, type, residual, wires, nwires, n, p, acc, c.stream));
}

/* Launches qnccl_<kernel>_<type> over n values with `args`, once `buffer`
 * (`which`, of `type` elements) is known to be aligned to them. */
template <class... Args>
ncclResult_t launch_typed_grid(const char* kernel, ncclDataType_t type, const void* buffer,
                               const char* which, unsigned grid, cudaStream_t stream,
                               Args... args) {
  ncclResult_t res = ncclInvalidArgument;
  dispatch_float_type(type, [&](auto t) {
    using Type = decltype(t);
    if ((uintptr_t)buffer % sizeof(typename Type::T) != 0) {
      res = set_error(ncclInvalidArgument, "the %s is not aligned to its elements", which);
      return;
    }
    char name[32];
    snprintf(name, sizeof name, "qnccl_%s_%s", kernel, Type::kName);
    res = launch(name, grid, stream, args...);
  });
  return res;
}

template <class... Args>
ncclResult_t launch_typed(const char* kernel, ncclDataType_t type, const void* buffer,
                          const char* which, size_t n, cudaStream_t stream, Args... args) {
  return launch_typed_grid(kernel, type, buffer, which, blocks_for(n), stream, args...);
}

ncclResult_t widen(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                   const float* residual, float* acc) {
  if (n == 0) return ncclSuccess;
  return step("widening the input to float32 on the device",
              launch_typed("widen", type, src, "input", n, c.stream, src, n, residual, acc));
}

ncclResult_t divide(const Compute& c, float* acc, size_t n, float divisor) {
  if (n == 0) return ncclSuccess;
  return step("averaging on the device",
              launch("qnccl_divide", blocks_for(n), c.stream, acc, n, divisor));
}

ncclResult_t narrow(const Compute& c, const float* acc, size_t n, ncclDataType_t type, void* dst) {
  if (n == 0) return ncclSuccess;
  return step("storing the result in the data type on the device",
              launch_typed("narrow", type, dst, "output", n, c.stream, acc, n, dst));
}

ncclResult_t copy(const Compute& c, const void* src, void* dst, size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c.stream);
  return err == cudaSuccess ? ncclSuccess : cuda_failed("copying on the device", err);
}

ncclResult_t residual(const Compute& c, const float* v, float* e, size_t n) {
  if (n == 0) return ncclSuccess;
  return step("updating the error-feedback residual on the device",
              launch("qnccl_residual", blocks_for(n), c.stream, v, e, n));
}

ncclResult_t clear(const Compute& c, float* e, size_t n) {
  if (n == 0) return ncclSuccess;
  const cudaError_t err = cudaMemsetAsync(e, 0, n * sizeof(float), c.stream);
  return err == cudaSuccess ? ncclSuccess
                            : cuda_failed("clearing the error-feedback residual on the device", err);
}

/* docs/rotation.md (compute_kernels.cu): the table of sign masks, as the
 * host makes it; per piece a kernel runs every stage below a warp's tile,
 * and one launch each the stages of blocks larger than that. */
static_assert(kBlockThreads == 32 * kDeviceRotationWarps,
              "compute_kernels.cu's rotation gives each warp of a block its tile");

unsigned rotation_grid(size_t n) {
  const size_t tiles = (n + kDeviceRotationTile - 1) / kDeviceRotationTile;
  const size_t blocks = (tiles + kDeviceRotationWarps - 1) / kDeviceRotationWarps;
  return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

ncclResult_t rotation_signs(const Compute& c, uint64_t seed, size_t n, uint32_t* signs) {
  if (n == 0) return ncclSuccess;
  return step("making the rotation's signs on the device",
              launch("qnccl_rotation_masks", blocks_for(n), c.stream, signs, n, seed));
}

ncclResult_t rotate(const Compute& c, const void* const* srcs, const size_t* counts, int n,
                    ncclDataType_t type, size_t block, const uint32_t* signs,
                    float* const* zs) {
  for (int i = 0; i < n; i++) {
    const size_t m = counts[i];
    if (m == 0) continue;
    float* z = zs[i];
    QNCCL_CHECK(step("rotating on the device",
                     launch_typed_grid("rotate", type, srcs[i], "input", rotation_grid(m),
                                       c.stream, srcs[i], m, block, signs, z)));
    for (size_t h = kDeviceRotationTile; h < rotation_block_at(0, m, block); h *= 2)
      QNCCL_CHECK(step("rotating on the device",
                       launch("qnccl_rotate_stage", blocks_for(m / 2), c.stream, z, m, block,
                              signs, h)));
  }
  return ncclSuccess;
}

ncclResult_t unrotate(const Compute& c, float* const* zs, const size_t* counts, int n,
                      size_t block, const uint32_t* signs, void* const* dsts,
                      ncclDataType_t type) {
  for (int i = 0; i < n; i++) {
    const size_t m = counts[i];
    if (m == 0) continue;
    float* z = zs[i];
    void* out = dsts[i];
    QNCCL_CHECK(step("rotating back on the device",
                     launch_typed_grid("unrotate", type, out, "output", rotation_grid(m),
                                       c.stream, z, m, block, signs, out)));
    for (size_t h = kDeviceRotationTile; h < rotation_block_at(0, m, block); h *= 2)
      QNCCL_CHECK(step("rotating back on the device",
                       launch_typed("unrotate_stage", type, out, "output", m / 2, c.stream, z,
                                    m, block, signs, h, out)));
  }
  return ncclSuccess;
}

}  // namespace

Compute device_compute(cudaStream_t stream) {
  return Compute{"device",    nullptr,  stream,   quantize, quantize_many, dequantize,
                 decode_many, reduce,   widen,    divide,   narrow,        copy,
                 residual,    clear,    rotation_signs,     rotate,   unrotate};
}

ncclResult_t stream_capturing(int device, cudaStream_t stream, bool* capturing) {
  DeviceScope scope;
  QNCCL_CHECK(scope.enter("asking whether the stream is captured", device));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err == cudaErrorStreamCaptureImplicit) {
    (void)cudaGetLastError();
    return set_error(ncclInvalidUsage,
                     "the call is on the legacy default stream while another stream of its "
                     "device is being captured into a CUDA graph: CUDA allows no work on the "
                     "legacy stream then (it would invalidate that capture), so QNCCL issued "
                     "nothing for this call; retry it once the capture has ended, or issue "
                     "collectives on a stream of their own");
  }
  if (err != cudaSuccess) return cuda_failed("cudaStreamIsCapturing on the caller's stream", err);
  *capturing = status != cudaStreamCaptureStatusNone;
  return ncclSuccess;
}

namespace {

/* Runs `op` in relaxed capture mode: a capture in another thread, or this
 * thread's own, neither fails an allocation here nor is invalidated by it
 * (PyTorch's caching allocator allocates during a capture the same way). */
template <class Op>
cudaError_t relaxed(Op op) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess) return err;
  err = op();
  cudaThreadExchangeStreamCaptureMode(&mode);  // back to the thread's own mode
  return err;
}

/* `bytes` of device memory for the workspace, on its private stream (never
 * a captured one): in stream order after the communicator's calls so far
 * where the device can (cudaMallocAsync), else cudaMalloc. */
cudaError_t allocate(const DeviceWorkspace& ws, size_t bytes, void** out) {
  const cudaStream_t own = static_cast<cudaStream_t>(ws.stream);
  return relaxed([&] {
    return ws.async_alloc ? cudaMallocAsync(out, bytes, own) : cudaMalloc(out, bytes);
  });
}

/* Publishes what was just queued on the private stream (an allocation, a
 * clearing, the counter's start) to the communicator's next call, which
 * waits for `done` first. `done` keeps meaning "the communicator's previous
 * call has ended" too: the private stream waits for its last record before
 * recording it again (else a call on another stream would no longer wait
 * for the one before it). During a capture the host also waits for the
 * private stream, so the graph never depends on work outside it. */
ncclResult_t publish(const DeviceWorkspace& ws, bool capturing) {
  const cudaStream_t own = static_cast<cudaStream_t>(ws.stream);
  const cudaEvent_t done = static_cast<cudaEvent_t>(ws.done);
  cudaError_t err = cudaStreamWaitEvent(own, done, 0);
  if (err == cudaSuccess) err = cudaEventRecord(done, own);
  if (err == cudaSuccess && capturing) err = relaxed([&] { return cudaStreamSynchronize(own); });
  return err == cudaSuccess ? ncclSuccess
                            : cuda_failed("making the communicator's device memory ready", err);
}

/* The workspace's stream, event and counter, made once: all or nothing. */
ncclResult_t open_workspace(DeviceWorkspace& ws, int device, uint64_t next_call,
                            uint64_t next_p2p_call) {
  int pools = 0;
  cudaError_t err = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
  if (err != cudaSuccess) return cuda_failed("asking whether the device has memory pools", err);
  DeviceWorkspace made;
  made.device = device;
  made.async_alloc = pools != 0;
  cudaStream_t own = nullptr;
  cudaEvent_t done = nullptr;
  void* calls = nullptr;
  err = cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
  made.stream = own;
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (err == cudaSuccess) err = allocate(made, DeviceWorkspace::kCallCounters * sizeof(uint64_t), &calls);
  ncclResult_t res = err == cudaSuccess ? ncclSuccess
                                        : cuda_failed("making the workspace's stream, event and "
                                                      "call counter", err);
  if (res == ncclSuccess)
    res = step("starting the call counter",
               launch_one("qnccl_set_calls", own, static_cast<uint64_t*>(calls), next_call));
  if (res == ncclSuccess)
    res = step("starting the call counter",
               launch_one("qnccl_set_calls", own, static_cast<uint64_t*>(calls) + 2,
                          kP2pCall | next_p2p_call));
  if (res != ncclSuccess) {
    if (calls != nullptr) made.async_alloc ? cudaFreeAsync(calls, own) : cudaFree(calls);
    if (done != nullptr) cudaEventDestroy(done);
    if (own != nullptr) cudaStreamDestroy(own);
    return res;
  }
  made.done = done;
  made.calls = static_cast<uint64_t*>(calls);
  ws = made;
  return ncclSuccess;
}

}  // namespace

ncclResult_t grow_device_workspace(DeviceWorkspace& ws, int device, size_t bytes,
                                   uint64_t next_call, uint64_t next_p2p_call, bool capturing) {
  if (ws.stream == nullptr) QNCCL_CHECK(open_workspace(ws, device, next_call, next_p2p_call));
  void* memory = nullptr;
  const cudaError_t err = allocate(ws, bytes, &memory);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(ncclUnhandledCudaError,
                     "quantized allreduce: cannot allocate %zu bytes of workspace on device %d: "
                     "CUDA error %d: %s",
                     bytes, device, (int)err, cudaGetErrorString(err));
  }
  if (ws.memory != nullptr) ws.retired.push_back(ws.memory);
  ws.memory = memory;
  ws.bytes = bytes;
  return publish(ws, capturing);
}

ncclResult_t device_call_begin(DeviceWorkspace& ws, cudaStream_t stream, bool capturing,
                               uint64_t* counter) {
  cudaError_t err = cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(ws.done),
                                        capturing ? cudaEventWaitExternal : 0);
  if (err != cudaSuccess) return cuda_failed("ordering after the communicator's previous call", err);
  return step("taking the call number", launch_one("qnccl_take_call", stream, counter));
}

ncclResult_t device_call_end(DeviceWorkspace& ws, cudaStream_t stream, bool capturing) {
  const cudaEvent_t done = static_cast<cudaEvent_t>(ws.done);
  const cudaError_t err = capturing ? cudaEventRecordWithFlags(done, stream, cudaEventRecordExternal)
                                    : cudaEventRecord(done, stream);
  return err == cudaSuccess ? ncclSuccess : cuda_failed("recording the end of the call", err);
}

ncclResult_t device_call_skipped(DeviceWorkspace& ws, bool point_to_point) {
  DeviceScope scope;
  QNCCL_CHECK(scope.enter("quantized call", ws.device));
  const cudaStream_t own = static_cast<cudaStream_t>(ws.stream);
  const cudaEvent_t done = static_cast<cudaEvent_t>(ws.done);
  cudaError_t err = cudaStreamWaitEvent(own, done, 0);
  ncclResult_t res = err == cudaSuccess ? ncclSuccess
                                        : cuda_failed("ordering after the previous call", err);
  if (res == ncclSuccess)
    res = step("counting a call on the host",
               launch_one("qnccl_take_call", own, ws.calls + (point_to_point ? 2 : 0)));
  if (res == ncclSuccess && (err = cudaEventRecord(done, own)) != cudaSuccess)
    res = cuda_failed("recording the counted call", err);
  return res;
}

ncclResult_t device_lanes_make(DeviceWorkspace& ws, size_t lanes) {
  cudaError_t err = cudaSuccess;
  if (ws.fork == nullptr) {
    cudaEvent_t fork = nullptr;
    err = cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    ws.fork = fork;
  }
  for (; err == cudaSuccess && ws.lanes < lanes; ws.lanes++) {
    cudaStream_t own = nullptr;
    cudaEvent_t join = nullptr;
    err = cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      if (own != nullptr) cudaStreamDestroy(own);
      break;
    }
    ws.lane_streams[ws.lanes] = own;
    ws.lane_joins[ws.lanes] = join;
  }
  return err == cudaSuccess ? ncclSuccess
                            : cuda_failed("making the streams of a pipelined call's lanes", err);
}

ncclResult_t device_lanes_fork(DeviceWorkspace& ws, cudaStream_t stream, size_t lanes,
                               cudaStream_t* streams) {
  const cudaEvent_t fork = static_cast<cudaEvent_t>(ws.fork);
  cudaError_t err = cudaEventRecord(fork, stream);
  for (size_t j = 0; err == cudaSuccess && j < lanes; j++) {
    streams[j] = static_cast<cudaStream_t>(ws.lane_streams[j]);
    err = cudaStreamWaitEvent(streams[j], fork, 0);
  }
  return err == cudaSuccess ? ncclSuccess : cuda_failed("forking a pipelined call's lanes", err);
}

ncclResult_t device_lanes_join(DeviceWorkspace& ws, cudaStream_t stream, size_t lanes) {
  cudaError_t err = cudaSuccess;
  for (size_t j = 0; err == cudaSuccess && j < lanes; j++) {
    const cudaEvent_t join = static_cast<cudaEvent_t>(ws.lane_joins[j]);
    err = cudaEventRecord(join, static_cast<cudaStream_t>(ws.lane_streams[j]));
    if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, join, 0);
  }
  return err == cudaSuccess ? ncclSuccess : cuda_failed("joining a pipelined call's lanes", err);
}

ncclResult_t alloc_device_residual(DeviceWorkspace& ws, size_t count, bool capturing,
                                   float** values) {
  void* memory = nullptr;
  cudaError_t err = allocate(ws, count * sizeof(float), &memory);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(ncclUnhandledCudaError,
                     "error feedback: cannot allocate the %zu-byte residual of a %zu-value "
                     "buffer on device %d: CUDA error %d: %s; free memory, use fewer buffers, "
                     "or turn error feedback off",
                     count * sizeof(float), count, ws.device, (int)err, cudaGetErrorString(err));
  }
  err = cudaMemsetAsync(memory, 0, count * sizeof(float), static_cast<cudaStream_t>(ws.stream));
  if (err != cudaSuccess) {
    release_device_memory(ws, memory);
    return cuda_failed("clearing a new error-feedback residual", err);
  }
  *values = static_cast<float*>(memory);
  return publish(ws, capturing);
}

namespace {

/* Frees `memory` after the calls queued on the workspace's stream (current
 * device set by the caller): in stream order, or, without memory pools,
 * once they are done (cudaFree promises no order with queued work). */
void free_after_calls(const DeviceWorkspace& ws, void* memory) {
  const cudaStream_t own = static_cast<cudaStream_t>(ws.stream);
  relaxed([&] {  // (a residual dropped while the caller's stream captures)
    if (ws.async_alloc) return cudaFreeAsync(memory, own);
    const cudaError_t err = cudaStreamSynchronize(own);
    return err == cudaSuccess ? cudaFree(memory) : err;
  });
}

/* Runs `f` with the workspace's device current. At process exit the runtime
 * may be gone: nothing is reported then. */
template <class F>
void on_device(const DeviceWorkspace& ws, F f) {
  DeviceScope scope;
  (void)scope.enter("releasing device memory", ws.device);
  f();
  (void)cudaGetLastError();
}

}  // namespace

void release_device_memory(DeviceWorkspace& ws, void* memory) {
  on_device(ws, [&] {
    cudaStreamWaitEvent(static_cast<cudaStream_t>(ws.stream), static_cast<cudaEvent_t>(ws.done), 0);
    free_after_calls(ws, memory);
  });
}

ncclResult_t copy_after_calls(DeviceWorkspace& ws, void* dst, const void* src, size_t bytes) {
  DeviceScope scope;
  QNCCL_CHECK(scope.enter("copying from or to the device", ws.device));
  const cudaStream_t own = static_cast<cudaStream_t>(ws.stream);
  cudaError_t err = cudaStreamWaitEvent(own, static_cast<cudaEvent_t>(ws.done), 0);
  if (err == cudaSuccess) err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, own);
  if (err == cudaSuccess) err = cudaStreamSynchronize(own);
  return err == cudaSuccess ? ncclSuccess : cuda_failed("copying from or to the device", err);
}

ncclResult_t read_device_calls(DeviceWorkspace& ws, uint64_t* next_call, uint64_t* next_p2p_call) {
  uint64_t counters[DeviceWorkspace::kCallCounters];
  QNCCL_CHECK(copy_after_calls(ws, counters, ws.calls, sizeof counters));
  *next_call = counters[0];
  *next_p2p_call = counters[2] & ~kP2pCall;
  return ncclSuccess;
}

ncclResult_t write_device_calls(DeviceWorkspace& ws, uint64_t next_call, uint64_t next_p2p_call) {
  DeviceScope scope;
  QNCCL_CHECK(scope.enter("setting the call counter", ws.device));
  const cudaStream_t own = static_cast<cudaStream_t>(ws.stream);
  const cudaEvent_t done = static_cast<cudaEvent_t>(ws.done);
  ncclResult_t res = ncclSuccess;
  const cudaError_t err = cudaStreamWaitEvent(own, done, 0);
  if (err != cudaSuccess) res = cuda_failed("ordering after the communicator's previous call", err);
  if (res == ncclSuccess)
    res = step("setting the call counter", launch_one("qnccl_set_calls", own, ws.calls, next_call));
  if (res == ncclSuccess)
    res = step("setting the call counter",
               launch_one("qnccl_set_calls", own, ws.calls + 2, kP2pCall | next_p2p_call));
  if (res == ncclSuccess) {
    const cudaError_t recorded = cudaEventRecord(done, own);  // the next call waits for it
    if (recorded != cudaSuccess) res = cuda_failed("recording the counter's new value", recorded);
  }
  return res;
}

void release_device_workspace(DeviceWorkspace& ws) {
  if (ws.stream == nullptr) return;  // never used a device: no CUDA call
  on_device(ws, [&] {
    const cudaStream_t own = static_cast<cudaStream_t>(ws.stream);
    cudaStreamWaitEvent(own, static_cast<cudaEvent_t>(ws.done), 0);
    for (void* old : ws.retired) free_after_calls(ws, old);
    if (ws.memory != nullptr) free_after_calls(ws, ws.memory);
    free_after_calls(ws, ws.calls);
    // These return at once; what they refer to goes once the work before it is done.
    cudaEventDestroy(static_cast<cudaEvent_t>(ws.done));
    cudaStreamDestroy(own);
    if (ws.fork != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(ws.fork));
    for (size_t j = 0; j < ws.lanes; j++) {
      cudaEventDestroy(static_cast<cudaEvent_t>(ws.lane_joins[j]));
      cudaStreamDestroy(static_cast<cudaStream_t>(ws.lane_streams[j]));
    }
  });
  ws = DeviceWorkspace();
}

}  // namespace qnccl

namespace qnccl {

ncclResult_t timing_event(int device, cudaStream_t stream, void** event) {
  DeviceScope scope;
  QNCCL_CHECK(scope.enter("measured auto", device));
  cudaEvent_t e = nullptr;
  cudaError_t err = cudaEventCreate(&e);  // with timing
  if (err == cudaSuccess) {
    err = cudaEventRecord(e, stream);
    if (err != cudaSuccess) cudaEventDestroy(e);
  }
  if (err != cudaSuccess) return cuda_failed("recording a trial's timing event", err);
  *event = e;
  return ncclSuccess;
}

ncclResult_t timing_elapsed(void* start, void* end, double* seconds) {
  const cudaEvent_t a = static_cast<cudaEvent_t>(start), b = static_cast<cudaEvent_t>(end);
  cudaError_t err = cudaEventSynchronize(b);
  float ms = 0;
  if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (err != cudaSuccess) return cuda_failed("reading a trial's time", err);
  *seconds = ms * 1e-3;
  return ncclSuccess;
}

ncclResult_t device_max_allreduce(const NcclApi& nccl, ncclComm_t comm, int device,
                                  cudaStream_t stream, double* values, size_t n,
                                  CommState& state) {
  const size_t bytes = n * sizeof(double);
  DeviceScope scope;
  QNCCL_CHECK(scope.enter("measured auto", device));
  void* memory = nullptr;
  cudaError_t err = cudaMalloc(&memory, bytes);
  if (err != cudaSuccess) return cuda_failed("allocating the tuning agreement's buffer", err);
  ncclResult_t res = ncclSuccess;
  err = cudaMemcpyAsync(memory, values, bytes, cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) res = cuda_failed("copying the trials' times to the device", err);
  if (res == ncclSuccess) {
    const CommHold hold(state);  // an abort waits for it (a blocking call may wait for peers)
    res = hold.held() ? nccl.allReduce(memory, memory, n, ncclFloat64, ncclMax, comm, stream)
                      : set_error(ncclInvalidUsage, "measured auto: the communicator was "
                                  "aborted or destroyed during the call");
  }
  if (res == ncclInProgress) res = wait_until_ready(nccl, comm, state);
  if (res == ncclSuccess) {
    err = cudaMemcpyAsync(values, memory, bytes, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) res = cuda_failed("reading the agreed times", err);
  }
  cudaFree(memory);
  return res;
}

}  // namespace qnccl
