/* Where the compute of a quantized allreduce runs, chosen per call by where
 * its buffers live: host code (compute_host.cc) for host buffers, CUDA
 * kernels enqueued on the caller's stream (compute_cuda.cc) for device
 * buffers. Both do the same float32 arithmetic from the same sources
 * (codec_math.h, dtype.h), so they write the same bytes (DESIGN invariant 2).
 * Segment's primitives (engine.h) are one call each into this table. */
#ifndef QNCCL_ENGINE_COMPUTE_H_
#define QNCCL_ENGINE_COMPUTE_H_

#include <stddef.h>
#include <stdint.h>

#include "codec/codec.h"
#include "engine/nccl_api.h"

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
  /* wires[i] = Q(srcs[i]) of counts[i] values of `type` with params ps[i]
   * (their own random streams) for i < n: the bytes of n quantizes, in one
   * step (SRA's scatter). */
  ncclResult_t (*quantize_many)(const Compute& c, const void* const* srcs, const size_t* counts,
                                int n, ncclDataType_t type, const CodecParams* ps,
                                uint8_t* const* wires);
  /* dst = D(wire), or dst = dst + D(wire) with `accumulate`, in `type`. */
  ncclResult_t (*dequantize)(const Compute& c, const uint8_t* wire, size_t n,
                             const CodecParams& p, void* dst, ncclDataType_t type,
                             bool accumulate);
  /* dsts[i] = D(wires[i]) of counts[i] values, in `type`, for i < n: the
   * bytes of n dequantizes, in one step (the allgather's decodes). */
  ncclResult_t (*decode_many)(const Compute& c, const uint8_t* const* wires, void* const* dsts,
                              const size_t* counts, int n, const CodecParams& p,
                              ncclDataType_t type);
  /* acc = widen(src) as widen() does, then acc = acc + D(wires[j]) for
   * j = 0..nwires-1 in order, as dequantize with `accumulate` does: the same
   * float32 additions in one step (the reduction of ring, tree and SRA). */
  ncclResult_t (*reduce)(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                         const float* residual, const uint8_t* const* wires, int nwires,
                         const CodecParams& p, float* acc);
  /* acc[i] = float32(src[i]), exact; with `residual` (error feedback)
   * acc[i] = float32(src[i]) + residual[i], one float32 addition. */
  ncclResult_t (*widen)(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                        const float* residual, float* acc);
  /* acc[i] = acc[i] / divisor, one float32 division. */
  ncclResult_t (*divide)(const Compute& c, float* acc, size_t n, float divisor);
  /* dst[i] = acc[i] stored in `type` (a NaN as the canonical NaN): a
   * reduce-scatter's result. */
  ncclResult_t (*narrow)(const Compute& c, const float* acc, size_t n, ncclDataType_t type,
                         void* dst);
  /* dst = src, `bytes` bytes bit for bit (an all-to-all's own chunk). */
  ncclResult_t (*copy)(const Compute& c, const void* src, void* dst, size_t bytes);
  /* Error feedback's capture: `e` holds D(Q(v)) on entry and gets
   * v[i] - e[i] in float32, or 0 where that is not finite. */
  ncclResult_t (*residual)(const Compute& c, const float* v, float* e, size_t n);
  /* e[i] = 0: a residual the call leaves empty (an owner's result). */
  ncclResult_t (*clear)(const Compute& c, float* e, size_t n);
  /* signs[j] = the sign mask of value j of a segment (docs/rotation.md) with
   * the signs of `seed`, j < n: the table rotate() and unrotate() read. */
  ncclResult_t (*rotation_signs)(const Compute& c, uint64_t seed, size_t n, uint32_t* signs);
  /* zs[i] = the forward rotation of srcs[i] (counts[i] values of `type`, a
   * piece of one segment: docs/rotation.md) in blocks of `block` with the
   * table `signs` (min(largest count, block) masks), float32, for i < n, in
   * one step. */
  ncclResult_t (*rotate)(const Compute& c, const void* const* srcs, const size_t* counts, int n,
                         ncclDataType_t type, size_t block, const uint32_t* signs,
                         float* const* zs);
  /* dsts[i] (`type`) = the inverse rotation of zs[i] (counts[i] values,
   * which it overwrites) for i < n, in one step, with the same table. */
  ncclResult_t (*unrotate)(const Compute& c, float* const* zs, const size_t* counts, int n,
                           size_t block, const uint32_t* signs, void* const* dsts,
                           ncclDataType_t type);
};

/* The host compute, on the host codec of this process (fails as
 * host_codec() does). */
ncclResult_t host_compute(Compute* compute);

#ifdef QNCCL_WITH_CUDA
/* The device compute: kernels on `stream` of the current device. */
Compute device_compute(cudaStream_t stream);

/* ---- The CUDA path's runtime calls (compute_cuda.cc); what to do with
 * them is decided in host code (allreduce.cc). None synchronizes. */

struct DeviceWorkspace;  // engine/comm_state.h
struct CommState;

/* Whether `stream` (of `device`, whose context is entered for the query: a
 * runtime call on a thread without a context would make device 0's) is
 * being captured into a CUDA graph. The legacy default
 * stream while a blocking stream of its device captures has no answer (CUDA
 * error cudaErrorStreamCaptureImplicit: any work on it would invalidate that
 * capture): ncclInvalidUsage, with a message saying so, CUDA's last error
 * cleared. */
ncclResult_t stream_capturing(int device, cudaStream_t stream, bool* capturing);

/* Gives `ws` `bytes` of new memory on the current device (`device`),
 * allocated on the workspace's private stream (in stream order where the
 * device can: cudaMallocAsync), in relaxed capture mode, so neither a
 * capture of the caller's stream nor another thread's fails it or is
 * invalidated by it, and `done` recorded after it: the call waits for it
 * before its work. The first time it also makes the private stream, `done`
 * and the call counter, which starts at `next_call` (and `next_p2p_call`).
 * The old buffer is retired, not freed: a captured graph may still use it.
 * `capturing`: the caller's stream is being captured; the host then waits
 * for the private stream, so no replay depends on work outside its graph.
 * A captured call therefore runs exactly as an eager one: whether it is
 * quantized never depends on this rank's history (docs/allreduce.md,
 * "Decisions every rank shares"). */
ncclResult_t grow_device_workspace(DeviceWorkspace& ws, int device, size_t bytes,
                                   uint64_t next_call, uint64_t next_p2p_call, bool capturing);

/* Before a call's work on `stream`: waits for the communicator's previous
 * call, which may have used the workspace on another stream (an event, no
 * host synchronization; during a capture an external-event wait node, so
 * each replay waits for the call before it), then a one-thread kernel takes
 * the next call number from `counter` (ws.calls, or ws.calls + 2 for a
 * point-to-point call) into counter[1], where the codec's kernels read it (a
 * replay takes a new one). */
ncclResult_t device_call_begin(DeviceWorkspace& ws, cudaStream_t stream, bool capturing,
                               uint64_t* counter);
/* After a call's work: records `done` on `stream` (during a capture an
 * external-event record node). */
ncclResult_t device_call_end(DeviceWorkspace& ws, cudaStream_t stream, bool capturing);
/* A call of the communicator that runs on the host (no values, or host
 * buffers) takes its number from the device counter too, on the private
 * stream after the previous call, so the device's numbers keep counting
 * every call (`point_to_point`: the point-to-point counter). */
ncclResult_t device_call_skipped(DeviceWorkspace& ws, bool point_to_point);

/* Runs lanes of a call on streams of their own (docs/allreduce.md,
 * "Pipelined segments"). make gives the workspace `lanes` streams
 * (non-blocking, private) with their events, kept until the workspace goes
 * (creating streams and events is allowed during a capture). fork orders each of the first `lanes`
 * after the work queued so far on the caller's `stream` (an event, no host
 * synchronization; during a capture the graph's fork) and gives them in
 * streams[0..lanes); join orders `stream` after everything queued on them.
 * Every fork that succeeded is joined, also after a failure. */
ncclResult_t device_lanes_make(DeviceWorkspace& ws, size_t lanes);
ncclResult_t device_lanes_fork(DeviceWorkspace& ws, cudaStream_t stream, size_t lanes,
                               cudaStream_t* streams);
ncclResult_t device_lanes_join(DeviceWorkspace& ws, cudaStream_t stream, size_t lanes);

/* Frees the workspace's memory, stream, event and counter once the calls
 * queued before it are done, without waiting for them (cudaFreeAsync on the
 * private stream after `done`; where the device lacks stream-ordered
 * allocation, cudaFree, which waits). */
void release_device_workspace(DeviceWorkspace& ws);
/* The same for one buffer of the workspace's device (a residual). */
void release_device_memory(DeviceWorkspace& ws, void* memory);

/* Error feedback's residuals on the workspace's device (the current one):
 * `count` float32 zeros, allocated and cleared on the private stream like
 * grow_device_workspace's memory (`capturing` as there). */
ncclResult_t alloc_device_residual(DeviceWorkspace& ws, size_t count, bool capturing,
                                   float** values);
/* Copies to or from host memory (a residual, the call counters) once the
 * communicator's calls queued so far are done (its own event: not the whole
 * device's work). */
ncclResult_t copy_after_calls(DeviceWorkspace& ws, void* dst, const void* src, size_t bytes);

/* The device call counters' next numbers (collective and point-to-point),
 * read after the calls queued so far; and set, ordered after them and before
 * the next call (qncclCommSetCallCounts). */
ncclResult_t read_device_calls(DeviceWorkspace& ws, uint64_t* next_call, uint64_t* next_p2p_call);
ncclResult_t write_device_calls(DeviceWorkspace& ws, uint64_t next_call, uint64_t next_p2p_call);

/* Measured auto's trials on device buffers (shim/tuner.cc). timing_event
 * makes an event on `device` and records it on `stream`, of that device
 * (never during a capture);
 * timing_elapsed waits until `end` has happened and gives the seconds since
 * `start`, then destroys both (also on failure). */
ncclResult_t timing_event(int device, cudaStream_t stream, void** event);
ncclResult_t timing_elapsed(void* start, void* end, double* seconds);
/* values[i] = the maximum over the ranks of `comm` of values[i], i < n: one
 * exact allreduce of the real NCCL on `stream` in memory of `device`, waited
 * for (its small copies and the allreduce only: the
 * stream's earlier work is done by then). */
ncclResult_t device_max_allreduce(const NcclApi& nccl, ncclComm_t comm, int device,
                                  cudaStream_t stream, double* values, size_t n,
                                  CommState& state);
#endif

}  // namespace qnccl

#endif
