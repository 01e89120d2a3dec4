/* The CUDA driver API of the simulated GPU: build/simdev/libcuda.so.1 (the
 * simulator's core lives in it too, as NVIDIA's runtime is built on its
 * driver). Compiled against the toolkit's cuda.h: names and signatures are
 * the header's (cuMemcpyAsync, cuEventDestroy_v2, ...). What QNCCL and its
 * host backend use, plus the basics around them; programs find functions
 * with cuGetProcAddress (or the runtime's cudaGetDriverEntryPoint), which
 * answers "not found" for the ones not here. Unlike the runtime, the driver
 * makes no context current by itself: a call that needs one without it
 * fails with CUDA_ERROR_INVALID_CONTEXT. */
#include <cuda.h>
#include <string.h>

#include "core/core.h"
#include "core/errors.h"
#include "simdev/simdev.h"

using namespace simdev;

namespace {

/* The driver's code for an error: the runtime's number, but where they
 * differ. */
CUresult cu(cudaError_t e) {
  switch (e) {
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection: return CUDA_ERROR_INVALID_VALUE;
    default: return static_cast<CUresult>(e);
  }
}

#define ENTER(name)                                                                          \
  do {                                                                                       \
    if (in_host_function())                                                                  \
      return cu(fail_loudly(cudaErrorNotPermitted, "%s called from a host function: CUDA "   \
                            "does not allow CUDA calls there", name));                       \
  } while (0)

#define RETURN_IF(call)                      \
  do {                                       \
    const cudaError_t e_ = (call);           \
    if (e_ != cudaSuccess) return cu(e_);    \
  } while (0)

cudaError_t context(Device** out, const char* api) {
  *out = current_context();
  if (*out == nullptr)
    return fail(cudaErrorDeviceUninitialized, "%s: no context is current on this thread "
                "(cuCtxSetCurrent, or cudaSetDevice through the runtime)", api);
  return use_device(*out);
}

/* A stream handle: 0 and CU_STREAM_LEGACY are the current context's legacy
 * stream, CU_STREAM_PER_THREAD this thread's. */
cudaError_t stream(CUstream handle, Stream** out, const char* api) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    Device* d;
    SIMDEV_CHECK(context(&d, api));
    return resolve_stream(handle, d, out);
  }
  return resolve_stream(handle, current_context(), out);
}

cudaError_t out_ok(const void* p, const char* what, const char* api) {
  return p != nullptr ? cudaSuccess : fail(cudaErrorInvalidValue, "%s: %s is NULL", api, what);
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int Flags) {
  return Flags == 0 ? CUDA_SUCCESS : cu(fail(cudaErrorInvalidValue, "cuInit: flags must be 0"));
}

CUresult cuDriverGetVersion(int* driverVersion) {
  RETURN_IF(out_ok(driverVersion, "driverVersion", "cuDriverGetVersion"));
  *driverVersion = 12090;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pStr = error_string((int)error);
  return CUDA_SUCCESS;
}

/* The driver's names (its codes are the runtime's numbers; cu() above). */
CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define NAME(e) \
  case e: *pStr = #e; return CUDA_SUCCESS;
    NAME(CUDA_SUCCESS) NAME(CUDA_ERROR_INVALID_VALUE) NAME(CUDA_ERROR_OUT_OF_MEMORY)
    NAME(CUDA_ERROR_NOT_INITIALIZED) NAME(CUDA_ERROR_NO_DEVICE) NAME(CUDA_ERROR_INVALID_DEVICE)
    NAME(CUDA_ERROR_INVALID_IMAGE) NAME(CUDA_ERROR_INVALID_CONTEXT)
    NAME(CUDA_ERROR_NO_BINARY_FOR_GPU) NAME(CUDA_ERROR_INVALID_HANDLE)
    NAME(CUDA_ERROR_ILLEGAL_STATE) NAME(CUDA_ERROR_NOT_FOUND) NAME(CUDA_ERROR_NOT_READY)
    NAME(CUDA_ERROR_ILLEGAL_ADDRESS) NAME(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
    NAME(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) NAME(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    NAME(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) NAME(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    NAME(CUDA_ERROR_MISALIGNED_ADDRESS) NAME(CUDA_ERROR_LAUNCH_FAILED)
    NAME(CUDA_ERROR_NOT_PERMITTED) NAME(CUDA_ERROR_NOT_SUPPORTED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_MERGE) NAME(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_UNJOINED) NAME(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
    NAME(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) NAME(CUDA_ERROR_CAPTURED_EVENT)
    NAME(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) NAME(CUDA_ERROR_UNKNOWN)
#undef NAME
    default: *pStr = nullptr; return CUDA_ERROR_INVALID_VALUE;  // as the driver answers
  }
}

/* ---- devices and contexts ---- */

CUresult cuDeviceGetCount(int* count) {
  RETURN_IF(out_ok(count, "count", "cuDeviceGetCount"));
  *count = device_count();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  RETURN_IF(out_ok(dev, "device", "cuDeviceGet"));
  if (simdev::device(ordinal) == nullptr)
    return cu(fail(cudaErrorInvalidDevice, "cuDeviceGet(%d): there are %d devices", ordinal,
                   device_count()));
  *dev = ordinal;
  return CUDA_SUCCESS;
}

/* As the driver: the name cut to len - 1 characters; a NULL name, len <= 0 or a bad device
 * is an error. */
CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  RETURN_IF(out_ok(name, "name", "cuDeviceGetName"));
  if (len <= 0) return cu(fail(cudaErrorInvalidValue, "cuDeviceGetName: len = %d", len));
  const Device* d = simdev::device(dev);
  if (d == nullptr) return cu(fail(cudaErrorInvalidDevice, "cuDeviceGetName(%d)", dev));
  device_name(*d, name, (size_t)len);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRetain");
  RETURN_IF(out_ok(pctx, "pctx", "cuDevicePrimaryCtxRetain"));
  Device* d = simdev::device(dev);
  if (d == nullptr) return cu(fail(cudaErrorInvalidDevice, "cuDevicePrimaryCtxRetain(%d)", dev));
  RETURN_IF(use_device(d));
  *pctx = reinterpret_cast<CUcontext>(d);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return simdev::device(dev) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* A context handle: a device's primary context. */
static cudaError_t ctx_of(CUcontext c, Device** out) {
  for (int i = 0; i < device_count(); i++)
    if (reinterpret_cast<Device*>(c) == simdev::device(i)) {
      *out = simdev::device(i);
      return cudaSuccess;
    }
  return fail(cudaErrorDeviceUninitialized, "%p is not a context", (void*)c);
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  RETURN_IF(out_ok(pctx, "pctx", "cuCtxGetCurrent"));
  *pctx = reinterpret_cast<CUcontext>(current_context());
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  ENTER("cuCtxSetCurrent");
  Device* d = nullptr;
  if (ctx != nullptr) RETURN_IF(ctx_of(ctx, &d));
  set_current_context(d);
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  ENTER("cuCtxPushCurrent");
  Device* d = nullptr;
  RETURN_IF(ctx_of(ctx, &d));
  push_context(d);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  ENTER("cuCtxPopCurrent");
  Device* d = pop_context();
  if (d == nullptr)
    return cu(fail(cudaErrorDeviceUninitialized, "cuCtxPopCurrent: no context to pop"));
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(d);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  RETURN_IF(out_ok(device, "device", "cuCtxGetDevice"));
  Device* d = nullptr;
  RETURN_IF(context(&d, "cuCtxGetDevice"));
  *device = d->ordinal;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  ENTER("cuCtxSynchronize");
  Device* d = nullptr;
  RETURN_IF(context(&d, "cuCtxSynchronize"));
  return cu(device_synchronize(d));
}

/* ---- streams and events ---- */

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  ENTER("cuStreamCreate");
  RETURN_IF(out_ok(phStream, "phStream", "cuStreamCreate"));
  Device* d = nullptr;
  RETURN_IF(context(&d, "cuStreamCreate"));
  Stream* s;
  RETURN_IF(stream_create(d, Flags, 0, &s));
  *phStream = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream) {
  ENTER("cuStreamDestroy");
  return cu(stream_destroy(reinterpret_cast<Stream*>(hStream)));
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  ENTER("cuStreamGetCtx");
  RETURN_IF(out_ok(pctx, "pctx", "cuStreamGetCtx"));
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuStreamGetCtx"));
  *pctx = reinterpret_cast<CUcontext>(s->device);
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream) {
  ENTER("cuStreamSynchronize");
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuStreamSynchronize"));
  return cu(stream_synchronize(s));
}

CUresult cuStreamQuery(CUstream hStream) {
  ENTER("cuStreamQuery");
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuStreamQuery"));
  return cu(stream_query(s));
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  ENTER("cuStreamWaitEvent");
  Stream* s;
  Event* e;
  RETURN_IF(stream(hStream, &s, "cuStreamWaitEvent"));
  RETURN_IF(resolve_event(hEvent, &e));
  return cu(stream_wait_event(s, e, Flags));
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  ENTER("cuLaunchHostFunc");
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuLaunchHostFunc"));
  return cu(host_function(s, fn, userData));
}

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  ENTER("cuEventCreate");
  RETURN_IF(out_ok(phEvent, "phEvent", "cuEventCreate"));
  Device* d = nullptr;
  RETURN_IF(context(&d, "cuEventCreate"));
  Event* e;
  RETURN_IF(event_create(d, Flags, &e));
  *phEvent = reinterpret_cast<CUevent>(e);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) {
  ENTER("cuEventDestroy");
  return cu(event_destroy(reinterpret_cast<Event*>(hEvent)));
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  ENTER("cuEventRecord");
  Stream* s;
  Event* e;
  RETURN_IF(resolve_event(hEvent, &e));
  RETURN_IF(stream(hStream, &s, "cuEventRecord"));
  return cu(event_record(e, s, flags));
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  return cuEventRecordWithFlags(hEvent, hStream, CU_EVENT_RECORD_DEFAULT);
}

CUresult cuEventQuery(CUevent hEvent) {
  ENTER("cuEventQuery");
  Event* e;
  RETURN_IF(resolve_event(hEvent, &e));
  return cu(event_query(e));
}

CUresult cuEventSynchronize(CUevent hEvent) {
  ENTER("cuEventSynchronize");
  Event* e;
  RETURN_IF(resolve_event(hEvent, &e));
  return cu(event_synchronize(e));
}

/* ---- memory ---- */

CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  ENTER("cuMemAlloc");
  RETURN_IF(out_ok(dptr, "dptr", "cuMemAlloc"));
  Device* d = nullptr;
  RETURN_IF(context(&d, "cuMemAlloc"));
  void* p = nullptr;
  RETURN_IF(device_alloc(d, bytesize, "cuMemAlloc", &p));
  *dptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr) {
  ENTER("cuMemFree");
  return cu(device_free((void*)dptr, "cuMemFree"));
}

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  ENTER("cuMemHostAlloc");
  RETURN_IF(out_ok(pp, "pp", "cuMemHostAlloc"));
  (void)Flags;
  return cu(host_alloc(bytesize, "cuMemHostAlloc", pp));
}

CUresult cuMemAllocHost(void** pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

CUresult cuMemFreeHost(void* p) {
  ENTER("cuMemFreeHost");
  return cu(host_free(p));
}

CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  ENTER("cuMemHostRegister");
  (void)Flags;
  return cu(host_register(p, bytesize));
}

CUresult cuMemHostUnregister(void* p) {
  ENTER("cuMemHostUnregister");
  return cu(host_unregister(p));
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  ENTER("cuMemcpyAsync");
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuMemcpyAsync"));
  return cu(copy((void*)dst, (const void*)src, ByteCount, cudaMemcpyDefault, s, false,
                 "cuMemcpyAsync"));
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                           CUstream hStream) {
  ENTER("cuMemcpyHtoDAsync");
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuMemcpyHtoDAsync"));
  return cu(copy((void*)dstDevice, srcHost, ByteCount, cudaMemcpyHostToDevice, s, false,
                 "cuMemcpyHtoDAsync"));
}

CUresult cuMemcpyDtoHAsync(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                           CUstream hStream) {
  ENTER("cuMemcpyDtoHAsync");
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuMemcpyDtoHAsync"));
  return cu(copy(dstHost, (const void*)srcDevice, ByteCount, cudaMemcpyDeviceToHost, s, false,
                 "cuMemcpyDtoHAsync"));
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  ENTER("cuPointerGetAttribute");
  RETURN_IF(out_ok(data, "data", "cuPointerGetAttribute"));
  cudaPointerAttributes a;
  RETURN_IF(pointer_attributes((const void*)ptr, &a));
  if (a.type == cudaMemoryTypeUnregistered)  // the driver, unlike the runtime, says so
    return cu(fail(cudaErrorInvalidValue, "cuPointerGetAttribute(%#llx): not memory CUDA "
                   "knows", (unsigned long long)ptr));
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) =
          a.type == cudaMemoryTypeDevice ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(data) = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = (CUdeviceptr)a.devicePointer;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<void**>(data) = a.hostPointer;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) =
          reinterpret_cast<CUcontext>(a.type == cudaMemoryTypeDevice ? simdev::device(a.device)
                                                                     : nullptr);
      return CUDA_SUCCESS;
    default:
      return cu(fail_loudly(cudaErrorNotSupported, "cuPointerGetAttribute: attribute %d is not "
                            "simulated", (int)attribute));
  }
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
                                void** data, CUdeviceptr ptr) {
  ENTER("cuPointerGetAttributes");
  if (numAttributes > 0 && (attributes == nullptr || data == nullptr))
    return cu(fail(cudaErrorInvalidValue, "cuPointerGetAttributes: NULL arrays"));
  cudaPointerAttributes a;
  const cudaError_t known = pointer_attributes((const void*)ptr, &a);
  for (unsigned i = 0; i < numAttributes; i++) {
    if (known != cudaSuccess || a.type == cudaMemoryTypeUnregistered) {
      // not CUDA memory: default values, and success (unlike cuPointerGetAttribute)
      if (attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        *static_cast<int*>(data[i]) = -2;
      else if (attributes[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE ||
               attributes[i] == CU_POINTER_ATTRIBUTE_IS_MANAGED)
        *static_cast<unsigned*>(data[i]) = 0;
      else
        *static_cast<void**>(data[i]) = nullptr;
      continue;
    }
    const CUresult r = cuPointerGetAttribute(data[i], attributes[i], ptr);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

/* ---- capture, graphs, user objects ---- */

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  ENTER("cuThreadExchangeStreamCaptureMode");
  RETURN_IF(out_ok(mode, "mode", "cuThreadExchangeStreamCaptureMode"));
  return cu(exchange_capture_mode(reinterpret_cast<cudaStreamCaptureMode*>(mode)));
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  ENTER("cuStreamIsCapturing");
  RETURN_IF(out_ok(captureStatus, "captureStatus", "cuStreamIsCapturing"));
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuStreamIsCapturing"));
  return cu(capture_info(s, reinterpret_cast<cudaStreamCaptureStatus*>(captureStatus), nullptr,
                         nullptr, nullptr, nullptr));
}

CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                cuuint64_t* id_out, CUgraph* graph_out,
                                const CUgraphNode** dependencies_out, size_t* numDependencies_out) {
  ENTER("cuStreamGetCaptureInfo");
  RETURN_IF(out_ok(captureStatus_out, "captureStatus_out", "cuStreamGetCaptureInfo"));
  Stream* s;
  RETURN_IF(stream(hStream, &s, "cuStreamGetCaptureInfo"));
  Graph* g = nullptr;
  Node* const* deps = nullptr;
  unsigned long long id = 0;
  RETURN_IF(capture_info(s, reinterpret_cast<cudaStreamCaptureStatus*>(captureStatus_out), &id,
                         &g, &deps, numDependencies_out));
  if (id_out != nullptr) *id_out = id;
  if (graph_out != nullptr) *graph_out = reinterpret_cast<CUgraph>(g);
  if (dependencies_out != nullptr) *dependencies_out = reinterpret_cast<const CUgraphNode*>(deps);
  return CUDA_SUCCESS;
}

CUresult cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy,
                            unsigned int initialRefcount, unsigned int flags) {
  ENTER("cuUserObjectCreate");
  RETURN_IF(out_ok(object_out, "object_out", "cuUserObjectCreate"));
  UserObject* o;
  RETURN_IF(user_object_create(ptr, destroy, initialRefcount, flags, &o));
  *object_out = reinterpret_cast<CUuserObject>(o);
  return CUDA_SUCCESS;
}

CUresult cuUserObjectRetain(CUuserObject object, unsigned int count) {
  ENTER("cuUserObjectRetain");
  return cu(user_object_retain(reinterpret_cast<UserObject*>(object), count));
}

CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  ENTER("cuUserObjectRelease");
  return cu(user_object_release(reinterpret_cast<UserObject*>(object), count));
}

CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                 unsigned int flags) {
  ENTER("cuGraphRetainUserObject");
  return cu(graph_retain_object(reinterpret_cast<Graph*>(graph),
                                reinterpret_cast<UserObject*>(object), count, flags));
}

CUresult cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) {
  ENTER("cuGraphReleaseUserObject");
  return cu(graph_release_object(reinterpret_cast<Graph*>(graph),
                                 reinterpret_cast<UserObject*>(object), count));
}

/* ---- modules and kernels ---- */

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  ENTER("cuModuleLoadData");
  RETURN_IF(out_ok(module, "module", "cuModuleLoadData"));
  Device* d = nullptr;
  RETURN_IF(context(&d, "cuModuleLoadData"));
  Module* m;
  RETURN_IF(module_load(d, image, &m));
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod) {
  ENTER("cuModuleUnload");
  return cu(module_unload(reinterpret_cast<Module*>(hmod)));
}

CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  ENTER("cuModuleGetFunction");
  RETURN_IF(out_ok(hfunc, "hfunc", "cuModuleGetFunction"));
  RETURN_IF(out_ok(name, "name", "cuModuleGetFunction"));
  Function* f;
  RETURN_IF(module_function(reinterpret_cast<Module*>(hmod), name, &f));
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void** kernelParams, void** extra) {
  ENTER("cuLaunchKernel");
  Function* fn;
  Stream* s;
  Device* d = nullptr;
  RETURN_IF(context(&d, "cuLaunchKernel"));
  RETURN_IF(resolve_function(f, &fn));
  RETURN_IF(stream(hStream, &s, "cuLaunchKernel"));
  return cu(launch(fn, simdev_dim3{gridDimX, gridDimY, gridDimZ},
                   simdev_dim3{blockDimX, blockDimY, blockDimZ}, sharedMemBytes, s, kernelParams,
                   extra));
}

/* ---- lookup ---- */

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* symbolStatus) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)cudaVersion;
  (void)flags;
  *pfn = driver_symbol(symbol);
  if (symbolStatus != nullptr)
    *symbolStatus = *pfn != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
                                    : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* ---- for tests ---- */

int simdevGetCounters(simdevCounters* out) {
  if (out == nullptr) return 1;
  const Counters c = counters();
  *out = simdevCounters{c.kernels,        c.graph_launches,  c.allocations_in_capture,
                        c.host_functions, c.modules_loaded, c.kernels_resolved};
  return 0;
}

const char* simdevGetLastMessage(void) { return last_message(); }

}  // extern "C"

namespace simdev {

void* driver_symbol(const char* name) {
  // each by the name cuGetProcAddress takes; the header's macros give the versioned function
#define ENTRY(f) {#f, reinterpret_cast<void*>(&f)}
  static const struct {
    const char* name;
    void* fn;
  } table[] = {
      ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuGetErrorString), ENTRY(cuGetErrorName),
      ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet), ENTRY(cuDeviceGetName),
      ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuDevicePrimaryCtxRelease), ENTRY(cuCtxGetCurrent),
      ENTRY(cuCtxSetCurrent), ENTRY(cuCtxPushCurrent), ENTRY(cuCtxPopCurrent),
      ENTRY(cuCtxGetDevice), ENTRY(cuCtxSynchronize), ENTRY(cuStreamCreate), ENTRY(cuStreamDestroy),
      ENTRY(cuStreamGetCtx), ENTRY(cuStreamSynchronize), ENTRY(cuStreamQuery),
      ENTRY(cuStreamWaitEvent), ENTRY(cuLaunchHostFunc), ENTRY(cuEventCreate),
      ENTRY(cuEventDestroy), ENTRY(cuEventRecord), ENTRY(cuEventRecordWithFlags),
      ENTRY(cuEventQuery), ENTRY(cuEventSynchronize), ENTRY(cuMemAlloc), ENTRY(cuMemFree),
      ENTRY(cuMemHostAlloc), ENTRY(cuMemAllocHost), ENTRY(cuMemFreeHost), ENTRY(cuMemHostRegister),
      ENTRY(cuMemHostUnregister), ENTRY(cuMemcpyAsync), ENTRY(cuMemcpyHtoDAsync),
      ENTRY(cuMemcpyDtoHAsync), ENTRY(cuPointerGetAttribute), ENTRY(cuPointerGetAttributes),
      ENTRY(cuThreadExchangeStreamCaptureMode), ENTRY(cuStreamIsCapturing),
      ENTRY(cuStreamGetCaptureInfo), ENTRY(cuUserObjectCreate), ENTRY(cuUserObjectRetain),
      ENTRY(cuUserObjectRelease), ENTRY(cuGraphRetainUserObject), ENTRY(cuGraphReleaseUserObject),
      ENTRY(cuModuleLoadData), ENTRY(cuModuleUnload), ENTRY(cuModuleGetFunction),
      ENTRY(cuLaunchKernel), ENTRY(cuGetProcAddress),
  };
#undef ENTRY
  for (const auto& e : table)
    if (strcmp(e.name, name) == 0) return e.fn;
  return nullptr;
}

}  // namespace simdev
