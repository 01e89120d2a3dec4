/* Where the compute of a quantized allreduce runs, chosen per call by where
 * its buffers live: host code (compute_host.cc) for host buffers, CUDA
 * kernels enqueued on the caller's stream (compute_cuda.cu) for device
 * buffers. Both do the same float32 arithmetic from the same sources
 * (codec_math.h, dtype.h), so they write the same bytes (DESIGN invariant 2).
 * Segment's primitives (engine.h) are one call each into this table. */
#ifndef QNCCL_ENGINE_COMPUTE_H_
#define QNCCL_ENGINE_COMPUTE_H_

#include <stddef.h>
#include <stdint.h>

#include "codec/codec.h"

namespace qnccl {

/* Each function does (host) or enqueues (device) one step and returns
 * ncclSuccess, or a failure whose message set_error recorded. `n` may be 0. */
struct Compute {
  const char* name;         // "host" or "device", for messages
  const HostCodec* codec;   // host: the codec of this process
  cudaStream_t stream;      // device: the caller's stream
  /* wire = Q(src), `n` values of `type`. */
  ncclResult_t (*quantize)(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                           const CodecParams& p, uint8_t* wire);
  /* dst = D(wire), or dst = dst + D(wire) with `accumulate`, in `type`. */
  ncclResult_t (*dequantize)(const Compute& c, const uint8_t* wire, size_t n,
                             const CodecParams& p, void* dst, ncclDataType_t type,
                             bool accumulate);
  /* acc[i] = float32(src[i]), exact; with `residual` (error feedback)
   * acc[i] = float32(src[i]) + residual[i], one float32 addition. */
  ncclResult_t (*widen)(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                        const float* residual, float* acc);
  /* acc[i] = acc[i] / divisor, one float32 division. */
  ncclResult_t (*divide)(const Compute& c, float* acc, size_t n, float divisor);
  /* Error feedback's capture: `e` holds D(Q(v)) on entry and gets
   * (v[i] - e[i]) * scale in float32, or 0 where that is not finite. */
  ncclResult_t (*residual)(const Compute& c, const float* v, float* e, size_t n, float scale);
};

/* The host compute, on the host codec of this process (fails as
 * host_codec() does). */
ncclResult_t host_compute(Compute* compute);

#ifdef QNCCL_WITH_CUDA
/* The device compute: kernels on `stream` of the current device. */
Compute device_compute(cudaStream_t stream);

/* ---- The CUDA path's runtime calls (compute_cuda.cu); what to do with
 * them is decided in host code (allreduce.cc). None synchronizes. */

struct DeviceWorkspace;  // engine/comm_state.h

/* The device `ptr` points into, or -1 for host memory (also when there is no
 * driver or device). */
int buffer_device(const void* ptr);

/* Makes `device` the current device; *previous is the one to restore, or -1
 * when it already was current. */
ncclResult_t set_current_device(int device, int* previous);
void restore_current_device(int previous);

/* Whether `stream` is being captured into a CUDA graph. */
ncclResult_t stream_capturing(cudaStream_t stream, bool* capturing);

/* Gives `ws` `bytes` of new memory on the current device (cudaMalloc, in
 * relaxed capture mode so another thread's capture neither fails it nor is
 * invalidated by it). The old buffer is retired, not freed: a captured graph
 * may still use it, and cudaFree would wait for the device. Never called
 * while the caller's stream is being captured. */
ncclResult_t grow_device_workspace(DeviceWorkspace& ws, int device, size_t bytes);

/* Before an uncaptured call's work: makes `stream` wait for the previous
 * uncaptured call's work, which may have used the workspace on another
 * stream (an event, no host synchronization). */
ncclResult_t device_call_begin(DeviceWorkspace& ws, cudaStream_t stream);
/* After an uncaptured call's work: records that point on `stream`. */
ncclResult_t device_call_end(DeviceWorkspace& ws, cudaStream_t stream);

/* Frees the workspace's buffers and event (cudaFree waits for the device's
 * queued work first). */
void release_device_workspace(DeviceWorkspace& ws);

/* Error feedback's residuals on the current device (`device`, for
 * messages): `count` float32 zeros, cleared on `stream`. */
ncclResult_t alloc_device_residual(size_t count, int device, cudaStream_t stream, float** values);
/* cudaFree on `device` (waits for the device's queued work first). */
void free_device_residual(float* values, int device);
/* cudaMemcpy to or from a residual on `device`, after all its queued work. */
ncclResult_t copy_device_residual(void* dst, const void* src, size_t bytes, int device);
#endif

}  // namespace qnccl

#endif
