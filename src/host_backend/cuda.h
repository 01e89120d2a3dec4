/* The CUDA driver, as the host backend uses it for device buffers
 * (docs/host-backend.md, "Device buffers"). The backend needs no CUDA to
 * build or run: it declares the few driver types and values it uses here
 * (tests/test_abi.py checks them against the toolkit's cuda.h) and takes
 * the functions from a libcuda.so.1 the process has already loaded. A
 * process that never loaded the driver has no device memory, and every
 * buffer is host memory without any CUDA call. The same code runs on
 * NVIDIA's driver and on the simulated GPU's (tests/simdev). */
#ifndef QNCCL_HOST_BACKEND_CUDA_H_
#define QNCCL_HOST_BACKEND_CUDA_H_

#include <stddef.h>
#include <stdint.h>

namespace qnccl {
namespace host {

using CuResult = int;
using CuContext = void*;
using CuStream = void*;
using CuEvent = void*;
using CuGraph = void*;
using CuUserObject = void*;
using CuHostFn = void (*)(void*);

/* cuda.h's values the backend uses. */
enum : int {
  kCuPointerAttributeMemoryType = 2,    // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  kCuPointerAttributeDeviceOrdinal = 9, // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  kCuMemoryTypeDevice = 2,              // CU_MEMORYTYPE_DEVICE
  kCuEventDisableTiming = 2,            // CU_EVENT_DISABLE_TIMING
  kCuEventRecordExternal = 1,           // CU_EVENT_RECORD_EXTERNAL
  kCuEventWaitExternal = 1,             // CU_EVENT_WAIT_EXTERNAL
  kCuStreamCaptureStatusActive = 1,     // CU_STREAM_CAPTURE_STATUS_ACTIVE
  kCuStreamCaptureModeRelaxed = 2,      // CU_STREAM_CAPTURE_MODE_RELAXED
  kCuMemHostAllocPortable = 1,          // CU_MEMHOSTALLOC_PORTABLE
  kCuUserObjectNoDestructorSync = 1,    // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
  kCuGraphUserObjectMove = 1,           // CU_GRAPH_USER_OBJECT_MOVE
};

struct Cuda {
  CuResult (*pointerGetAttributes)(unsigned, int*, void**, uintptr_t);
  CuResult (*streamGetCtx)(CuStream, CuContext*);
  CuResult (*ctxPushCurrent)(CuContext);
  CuResult (*ctxPopCurrent)(CuContext*);
  CuResult (*ctxGetDevice)(int*);
  CuResult (*memcpyAsync)(uintptr_t, uintptr_t, size_t, CuStream);
  CuResult (*launchHostFunc)(CuStream, CuHostFn, void*);
  CuResult (*eventCreate)(CuEvent*, unsigned);
  CuResult (*eventRecordWithFlags)(CuEvent, CuStream, unsigned);
  CuResult (*eventSynchronize)(CuEvent);
  CuResult (*eventDestroy)(CuEvent);
  CuResult (*streamWaitEvent)(CuStream, CuEvent, unsigned);
  CuResult (*memHostAlloc)(void**, size_t, unsigned);
  CuResult (*streamGetCaptureInfo)(CuStream, int*, uint64_t*, CuGraph*, const void**, size_t*);
  CuResult (*threadExchangeStreamCaptureMode)(int*);
  CuResult (*userObjectCreate)(CuUserObject*, void*, CuHostFn, unsigned, unsigned);
  CuResult (*graphRetainUserObject)(CuGraph, CuUserObject, unsigned, unsigned);
  CuResult (*getErrorString)(CuResult, const char**);
};

/* The driver's functions when the process has loaded libcuda.so.1 (and it
 * has them all), else nullptr. */
const Cuda* cuda();

/* The device whose memory holds p, or -1 (host memory, or no CUDA). */
int device_of(const void* p);

/* The device of the calling thread's current CUDA context, or -1 (no CUDA,
 * or no context current). */
int current_device();

/* "CUDA error 700 (an illegal memory access was encountered)". */
const char* cuda_error(CuResult r);

}  // namespace host
}  // namespace qnccl

#endif
