/* The CUDA runtime API of the simulated GPU: build/simdev/libcudart.so.12,
 * with the ABI of NVIDIA's (these definitions are compiled against the
 * toolkit's own cuda_runtime_api.h, so every name and signature is the
 * header's). A program built against the real runtime runs on it unchanged
 * with LD_LIBRARY_PATH=build/simdev. Every call the simulator does not
 * implement is a stub (runtime_stubs.cc, generated) that fails with
 * cudaErrorNotSupported and names itself.
 *
 * The runtime's own rules live here: the per-thread last error (every
 * failing call sets it, cudaErrorNotReady excepted; cudaGetLastError
 * resets it, the device's sticky error stays), the current device, stream
 * handles 0 / cudaStreamLegacy / cudaStreamPerThread, no CUDA call from a
 * host function. The rest is core/core.h's. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "core/config.h"
#include "core/core.h"
#include "core/errors.h"

using namespace simdev;

namespace {

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}

/* The start of every call: none from a host function (CUDA forbids it). */
#define ENTER(name)                                                                          \
  do {                                                                                       \
    if (in_host_function())                                                                  \
      return ret(fail_loudly(cudaErrorNotPermitted, "%s called from a host function: CUDA "  \
                             "does not allow CUDA calls there", name));                      \
  } while (0)

#define RETURN_IF(call)                          \
  do {                                           \
    const cudaError_t e_ = (call);               \
    if (e_ != cudaSuccess) return ret(e_);       \
  } while (0)

/* The current device, its context made. */
cudaError_t here(Device** out) {
  *out = runtime_device();
  return use_device(*out);
}

cudaError_t stream_of(cudaStream_t handle, Stream** out) {
  Device* d = nullptr;
  SIMDEV_CHECK(here(&d));
  return resolve_stream(handle, d, out);
}

cudaError_t event_of(cudaEvent_t handle, Event** out) { return resolve_event(handle, out); }

cudaError_t checked_out(const void* p, const char* what, const char* api) {
  return p != nullptr ? cudaSuccess : fail(cudaErrorInvalidValue, "%s: %s is NULL", api, what);
}

constexpr int kVersion = 12090;  // the runtime and driver the simulator follows (CUDA 12.9)

void properties(int ordinal, cudaDeviceProp* p) {
  memset(p, 0, sizeof *p);
  device_name(*device(ordinal), p->name, sizeof p->name);
  for (int i = 0; i < 16; i++) p->uuid.bytes[i] = (char)(0x51 + i + 16 * ordinal);
  p->totalGlobalMem = size_t(80) << 30;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->memPitch = (size_t)1 << 31;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->totalConstMem = 64 << 10;
  p->major = 9;
  p->minor = 0;
  p->textureAlignment = 512;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->maxBlocksPerMultiProcessor = 32;
  p->concurrentKernels = 1;
  p->asyncEngineCount = 2;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 50 << 20;
  p->pciBusID = 0x10 + ordinal;
  p->streamPrioritiesSupported = 1;
  p->globalL1CacheSupported = 1;
  p->managedMemory = 1;
  p->concurrentManagedAccess = 1;
  p->pageableMemoryAccess = 0;
  p->memoryPoolsSupported = config().memory_pools;
  p->hostNativeAtomicSupported = 0;
  p->cooperativeLaunch = 1;
}

}  // namespace

namespace simdev {
cudaError_t runtime_error(cudaError_t e) { return ret(e); }  // for the stubs (gen_stubs.py)
}  // namespace simdev

extern "C" {

/* ---- errors and versions ---- */

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char* cudaGetErrorName(cudaError_t error) { return error_name(error); }

const char* cudaGetErrorString(cudaError_t error) { return error_string(error); }

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  RETURN_IF(checked_out(runtimeVersion, "runtimeVersion", "cudaRuntimeGetVersion"));
  *runtimeVersion = kVersion;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* driverVersion) {
  RETURN_IF(checked_out(driverVersion, "driverVersion", "cudaDriverGetVersion"));
  *driverVersion = kVersion;
  return cudaSuccess;
}

/* ---- devices ---- */

cudaError_t cudaGetDeviceCount(int* count) {
  ENTER("cudaGetDeviceCount");
  RETURN_IF(checked_out(count, "count", "cudaGetDeviceCount"));
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  ENTER("cudaGetDevice");
  RETURN_IF(checked_out(device, "device", "cudaGetDevice"));
  Device* d = current_context();
  *device = d != nullptr ? d->ordinal : 0;  // no context yet: device 0, none made
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  ENTER("cudaSetDevice");
  Device* d = simdev::device(device);
  if (d == nullptr)
    return ret(fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): there are %d devices "
                    "(SIMDEV_DEVICES)", device, device_count()));
  set_current_context(d);
  return ret(use_device(d));  // since CUDA 12.0 the context is made at once
}

cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags) {
  ENTER("cudaInitDevice");
  Device* d = simdev::device(device);
  if (d == nullptr || flags != 0)
    return ret(fail(cudaErrorInvalidValue, "cudaInitDevice(%d, %u, %u)", device, deviceFlags,
                    flags));
  return ret(use_device(d));
}

cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  ENTER("cudaSetDeviceFlags");
  Device* d = runtime_device();
  if (d->initialized)
    return ret(fail(cudaErrorSetOnActiveProcess, "cudaSetDeviceFlags: device %d's context is "
                    "made already", d->ordinal));
  d->flags = flags;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int* flags) {
  ENTER("cudaGetDeviceFlags");
  RETURN_IF(checked_out(flags, "flags", "cudaGetDeviceFlags"));
  *flags = runtime_device()->flags;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  ENTER("cudaGetDeviceProperties");
  RETURN_IF(checked_out(prop, "prop", "cudaGetDeviceProperties"));
  if (simdev::device(device) == nullptr)
    return ret(fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device %d", device));
  properties(device, prop);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  ENTER("cudaDeviceGetAttribute");
  RETURN_IF(checked_out(value, "value", "cudaDeviceGetAttribute"));
  if (simdev::device(device) == nullptr)
    return ret(fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device %d", device));
  cudaDeviceProp p;
  properties(device, &p);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrConcurrentKernels: *value = p.concurrentKernels; break;
    case cudaDevAttrAsyncEngineCount: *value = p.asyncEngineCount; break;
    case cudaDevAttrUnifiedAddressing: *value = p.unifiedAddressing; break;
    case cudaDevAttrCanMapHostMemory: *value = p.canMapHostMemory; break;
    case cudaDevAttrMemoryPoolsSupported: *value = p.memoryPoolsSupported; break;
    case cudaDevAttrPciBusId: *value = p.pciBusID; break;
    case cudaDevAttrPciDeviceId: *value = 0; break;
    case cudaDevAttrPciDomainId: *value = 0; break;
    case cudaDevAttrIntegrated: *value = 0; break;
    case cudaDevAttrManagedMemory: *value = p.managedMemory; break;
    case cudaDevAttrConcurrentManagedAccess: *value = p.concurrentManagedAccess; break;
    case cudaDevAttrPageableMemoryAccess: *value = p.pageableMemoryAccess; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrStreamPrioritiesSupported: *value = p.streamPrioritiesSupported; break;
    case cudaDevAttrCooperativeLaunch: *value = p.cooperativeLaunch; break;
    default:
      return ret(fail_loudly(cudaErrorNotSupported, "cudaDeviceGetAttribute: attribute %d is "
                             "not simulated", (int)attr));
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  ENTER("cudaDeviceSynchronize");
  Device* d = nullptr;
  RETURN_IF(here(&d));
  return ret(device_synchronize(d));
}

cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  ENTER("cudaDeviceCanAccessPeer");
  RETURN_IF(checked_out(canAccessPeer, "canAccessPeer", "cudaDeviceCanAccessPeer"));
  if (simdev::device(device) == nullptr || simdev::device(peerDevice) == nullptr)
    return ret(fail(cudaErrorInvalidDevice, "cudaDeviceCanAccessPeer(%d, %d)", device,
                    peerDevice));
  *canAccessPeer = device != peerDevice;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  ENTER("cudaDeviceEnablePeerAccess");
  if (flags != 0)
    return ret(fail(cudaErrorInvalidValue, "cudaDeviceEnablePeerAccess: flags must be 0"));
  Device* d = nullptr;
  RETURN_IF(here(&d));
  return ret(enable_peer_access(d, peerDevice));
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  ENTER("cudaDeviceGetStreamPriorityRange");
  if (leastPriority != nullptr) *leastPriority = 0;
  if (greatestPriority != nullptr) *greatestPriority = -5;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  ENTER("cudaMemGetInfo");
  Device* d = nullptr;
  RETURN_IF(here(&d));
  if (total != nullptr) *total = size_t(80) << 30;
  if (free != nullptr) *free = size_t(79) << 30;  // an estimate, as the driver's is
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* driverStatus) {
  ENTER("cudaGetDriverEntryPoint");
  return cudaGetDriverEntryPointByVersion(symbol, funcPtr, kVersion, flags, driverStatus);
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* driverStatus) {
  ENTER("cudaGetDriverEntryPointByVersion");
  RETURN_IF(checked_out(symbol, "symbol", "cudaGetDriverEntryPoint"));
  RETURN_IF(checked_out(funcPtr, "funcPtr", "cudaGetDriverEntryPoint"));
  (void)cudaVersion;
  (void)flags;
  *funcPtr = driver_symbol(symbol);
  if (driverStatus != nullptr)
    *driverStatus = *funcPtr != nullptr ? cudaDriverEntryPointSuccess
                                        : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

/* ---- memory ---- */

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  ENTER("cudaMalloc");
  RETURN_IF(checked_out(devPtr, "devPtr", "cudaMalloc"));
  Device* d = nullptr;
  RETURN_IF(here(&d));
  return ret(device_alloc(d, size, "cudaMalloc", devPtr));
}

cudaError_t cudaFree(void* devPtr) {
  ENTER("cudaFree");
  Device* d = nullptr;
  RETURN_IF(here(&d));
  return ret(device_free(devPtr, "cudaFree"));
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  ENTER("cudaMallocAsync");
  RETURN_IF(checked_out(devPtr, "devPtr", "cudaMallocAsync"));
  Stream* s;
  RETURN_IF(stream_of(hStream, &s));
  return ret(async_alloc(s, size, devPtr));
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  ENTER("cudaFreeAsync");
  Stream* s;
  RETURN_IF(stream_of(hStream, &s));
  return ret(async_free(s, devPtr));
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  ENTER("cudaMallocHost");
  RETURN_IF(checked_out(ptr, "ptr", "cudaMallocHost"));
  return ret(host_alloc(size, "cudaMallocHost", ptr));
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  ENTER("cudaHostAlloc");
  RETURN_IF(checked_out(pHost, "pHost", "cudaHostAlloc"));
  if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
    return ret(fail(cudaErrorInvalidValue, "cudaHostAlloc: flags %#x", flags));
  return ret(host_alloc(size, "cudaHostAlloc", pHost));
}

cudaError_t cudaFreeHost(void* ptr) {
  ENTER("cudaFreeHost");
  return ret(host_free(ptr));
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  ENTER("cudaHostRegister");
  (void)flags;
  return ret(host_register(ptr, size));
}

cudaError_t cudaHostUnregister(void* ptr) {
  ENTER("cudaHostUnregister");
  return ret(host_unregister(ptr));
}

cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  ENTER("cudaHostGetDevicePointer");
  cudaPointerAttributes a;
  if (pDevice == nullptr || flags != 0 || pointer_attributes(pHost, &a) != cudaSuccess ||
      a.type != cudaMemoryTypeHost)
    return ret(fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer(%p): not pinned host "
                    "memory", pHost));
  *pDevice = pHost;  // unified addressing
  return cudaSuccess;
}

/* As NVIDIA's runtime answers on a GPU (CUDA 12.9 runtime, driver 580, H100:
 * tests/programs/cuda_runtime_program.c's `pointer-context` rule): on a thread
 * with no current context it answers without making one current, as the
 * driver's cuPointerGetAttributes does. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  ENTER("cudaPointerGetAttributes");
  RETURN_IF(checked_out(attributes, "attributes", "cudaPointerGetAttributes"));
  return ret(pointer_attributes(ptr, attributes));
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  ENTER("cudaMemcpy");
  Stream* s;
  RETURN_IF(stream_of(nullptr, &s));
  cudaPointerAttributes from, to;
  const bool device_to_device = pointer_attributes(src, &from) == cudaSuccess &&
                                pointer_attributes(dst, &to) == cudaSuccess &&
                                from.type == cudaMemoryTypeDevice &&
                                to.type == cudaMemoryTypeDevice;
  // Device to device returns before the copy has run (CUDA: no host synchronization).
  return ret(copy(dst, src, count, kind, s, !device_to_device, "cudaMemcpy"));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  ENTER("cudaMemcpyAsync");
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(copy(dst, src, count, kind, s, false, "cudaMemcpyAsync"));
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                                size_t count, cudaStream_t stream) {
  ENTER("cudaMemcpyPeerAsync");
  (void)dstDevice;
  (void)srcDevice;
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(copy(dst, src, count, cudaMemcpyDeviceToDevice, s, false, "cudaMemcpyPeerAsync"));
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  ENTER("cudaMemset");
  Stream* s;
  RETURN_IF(stream_of(nullptr, &s));
  return ret(fill(devPtr, value, count, s, "cudaMemset"));  // asynchronous to the host (CUDA)
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  ENTER("cudaMemsetAsync");
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(fill(devPtr, value, count, s, "cudaMemsetAsync"));
}

/* ---- streams ---- */

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
  ENTER("cudaStreamCreate");
  RETURN_IF(checked_out(pStream, "pStream", "cudaStreamCreate"));
  Device* d = nullptr;
  RETURN_IF(here(&d));
  Stream* s;
  RETURN_IF(stream_create(d, flags, priority, &s));
  *pStream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  ENTER("cudaStreamDestroy");
  return ret(stream_destroy(reinterpret_cast<Stream*>(stream)));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  ENTER("cudaStreamSynchronize");
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(stream_synchronize(s));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  ENTER("cudaStreamQuery");
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(stream_query(s));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  ENTER("cudaStreamWaitEvent");
  Stream* s;
  Event* e;
  RETURN_IF(stream_of(stream, &s));
  RETURN_IF(event_of(event, &e));
  return ret(stream_wait_event(s, e, flags));
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  ENTER("cudaStreamGetFlags");
  Stream* s;
  RETURN_IF(checked_out(flags, "flags", "cudaStreamGetFlags"));
  RETURN_IF(stream_of(hStream, &s));
  *flags = s->flags;
  return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int* priority) {
  ENTER("cudaStreamGetPriority");
  Stream* s;
  RETURN_IF(checked_out(priority, "priority", "cudaStreamGetPriority"));
  RETURN_IF(stream_of(hStream, &s));
  *priority = s->priority;
  return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int* device) {
  ENTER("cudaStreamGetDevice");
  Stream* s;
  RETURN_IF(checked_out(device, "device", "cudaStreamGetDevice"));
  RETURN_IF(stream_of(hStream, &s));
  *device = s->device->ordinal;
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  ENTER("cudaLaunchHostFunc");
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(host_function(s, fn, userData));
}

/* ---- events ---- */

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  ENTER("cudaEventCreate");
  RETURN_IF(checked_out(event, "event", "cudaEventCreate"));
  Device* d = nullptr;
  RETURN_IF(here(&d));
  Event* e;
  RETURN_IF(event_create(d, flags, &e));
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  ENTER("cudaEventDestroy");
  return ret(event_destroy(reinterpret_cast<Event*>(event)));
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return cudaEventRecordWithFlags(event, stream, cudaEventRecordDefault);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  ENTER("cudaEventRecord");
  Stream* s;
  Event* e;
  RETURN_IF(event_of(event, &e));
  RETURN_IF(stream_of(stream, &s));
  return ret(event_record(e, s, flags));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  ENTER("cudaEventQuery");
  Event* e;
  RETURN_IF(event_of(event, &e));
  return ret(event_query(e));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ENTER("cudaEventSynchronize");
  Event* e;
  RETURN_IF(event_of(event, &e));
  return ret(event_synchronize(e));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  ENTER("cudaEventElapsedTime");
  RETURN_IF(checked_out(ms, "ms", "cudaEventElapsedTime"));
  Event *a, *b;
  RETURN_IF(event_of(start, &a));
  RETURN_IF(event_of(end, &b));
  return ret(event_elapsed(a, b, ms));
}

/* ---- capture and graphs ---- */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  ENTER("cudaStreamBeginCapture");
  Stream* s;
  if (stream == nullptr || stream == cudaStreamLegacy)
    return ret(fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture on the legacy "
                    "default stream: not allowed"));
  RETURN_IF(stream_of(stream, &s));
  return ret(capture_begin(s, mode));
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  ENTER("cudaStreamEndCapture");
  RETURN_IF(checked_out(pGraph, "pGraph", "cudaStreamEndCapture"));
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  Graph* g = nullptr;
  const cudaError_t e = capture_end(s, &g);
  *pGraph = reinterpret_cast<cudaGraph_t>(g);
  return ret(e);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus* pCaptureStatus) {
  ENTER("cudaStreamIsCapturing");
  RETURN_IF(checked_out(pCaptureStatus, "pCaptureStatus", "cudaStreamIsCapturing"));
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(capture_info(s, pCaptureStatus, nullptr, nullptr, nullptr, nullptr));
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus* captureStatus_out,
                                     unsigned long long* id_out, cudaGraph_t* graph_out,
                                     const cudaGraphNode_t** dependencies_out,
                                     size_t* numDependencies_out) {
  ENTER("cudaStreamGetCaptureInfo");
  RETURN_IF(checked_out(captureStatus_out, "captureStatus_out", "cudaStreamGetCaptureInfo"));
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  Graph* g = nullptr;
  Node* const* deps = nullptr;
  RETURN_IF(capture_info(s, captureStatus_out, id_out, &g, &deps, numDependencies_out));
  if (graph_out != nullptr) *graph_out = reinterpret_cast<cudaGraph_t>(g);
  if (dependencies_out != nullptr)
    *dependencies_out = reinterpret_cast<const cudaGraphNode_t*>(deps);
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream,
                                        enum cudaStreamCaptureStatus* captureStatus_out,
                                        unsigned long long* id_out, cudaGraph_t* graph_out,
                                        const cudaGraphNode_t** dependencies_out,
                                        const cudaGraphEdgeData** edgeData_out,
                                        size_t* numDependencies_out) {
  if (edgeData_out != nullptr) *edgeData_out = nullptr;  // no edge data: default edges
  return cudaStreamGetCaptureInfo(stream, captureStatus_out, id_out, graph_out, dependencies_out,
                                  numDependencies_out);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  ENTER("cudaThreadExchangeStreamCaptureMode");
  RETURN_IF(checked_out(mode, "mode", "cudaThreadExchangeStreamCaptureMode"));
  return ret(exchange_capture_mode(mode));
}

cudaError_t cudaGraphCreate(cudaGraph_t* pGraph, unsigned int flags) {
  ENTER("cudaGraphCreate");
  RETURN_IF(checked_out(pGraph, "pGraph", "cudaGraphCreate"));
  if (flags != 0) return ret(fail(cudaErrorInvalidValue, "cudaGraphCreate: flags must be 0"));
  Device* d = nullptr;
  RETURN_IF(here(&d));
  Graph* g;
  RETURN_IF(graph_create(d, &g));
  *pGraph = reinterpret_cast<cudaGraph_t>(g);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  ENTER("cudaGraphDestroy");
  return ret(graph_destroy(reinterpret_cast<Graph*>(graph)));
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
  ENTER("cudaGraphInstantiate");
  RETURN_IF(checked_out(pGraphExec, "pGraphExec", "cudaGraphInstantiate"));
  Exec* x;
  RETURN_IF(graph_instantiate(reinterpret_cast<Graph*>(graph), flags, &x));
  *pGraphExec = reinterpret_cast<cudaGraphExec_t>(x);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                          unsigned long long flags) {
  return cudaGraphInstantiate(pGraphExec, graph, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  ENTER("cudaGraphLaunch");
  Stream* s;
  RETURN_IF(stream_of(stream, &s));
  return ret(graph_launch(reinterpret_cast<Exec*>(graphExec), s));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  ENTER("cudaGraphExecDestroy");
  return ret(exec_destroy(reinterpret_cast<Exec*>(graphExec)));
}

cudaError_t cudaUserObjectCreate(cudaUserObject_t* object_out, void* ptr, cudaHostFn_t destroy,
                                 unsigned int initialRefcount, unsigned int flags) {
  ENTER("cudaUserObjectCreate");
  RETURN_IF(checked_out(object_out, "object_out", "cudaUserObjectCreate"));
  UserObject* o;
  RETURN_IF(user_object_create(ptr, destroy, initialRefcount, flags, &o));
  *object_out = reinterpret_cast<cudaUserObject_t>(o);
  return cudaSuccess;
}

cudaError_t cudaUserObjectRetain(cudaUserObject_t object, unsigned int count) {
  ENTER("cudaUserObjectRetain");
  return ret(user_object_retain(reinterpret_cast<UserObject*>(object), count));
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  ENTER("cudaUserObjectRelease");
  return ret(user_object_release(reinterpret_cast<UserObject*>(object), count));
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                      unsigned int count, unsigned int flags) {
  ENTER("cudaGraphRetainUserObject");
  return ret(graph_retain_object(reinterpret_cast<Graph*>(graph),
                                 reinterpret_cast<UserObject*>(object), count, flags));
}

cudaError_t cudaGraphReleaseUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                       unsigned int count) {
  ENTER("cudaGraphReleaseUserObject");
  return ret(graph_release_object(reinterpret_cast<Graph*>(graph),
                                  reinterpret_cast<UserObject*>(object), count));
}

}  // extern "C"
