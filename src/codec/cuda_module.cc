#include "codec/cuda_module.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/error.h"

namespace qnccl {

const CudaImage* pick_image(const CudaImage* images, int arch) {
  const CudaImage* sass = nullptr;
  const CudaImage* ptx = nullptr;
  for (const CudaImage* i = images; i->module != nullptr; i++) {
    if (i->arch > arch) continue;
    if (i->ptx) {
      if (ptx == nullptr || i->arch > ptx->arch) ptx = i;
    } else if (i->arch / 10 == arch / 10 && (sass == nullptr || i->arch > sass->arch)) {
      sass = i;
    }
  }
  return sass != nullptr ? sass : ptx;
}

const char* carried_archs(const CudaModule& module, bool ptx) {
  static std::mutex mutex;
  static std::map<std::pair<const CudaModule*, bool>, std::string> lists;
  std::lock_guard<std::mutex> lock(mutex);
  std::string& list = lists[{&module, ptx}];
  if (list.empty())
    for (const CudaImage* i = module.images; i->module != nullptr; i++)
      if (i->ptx == ptx) list += (list.empty() ? "" : ",") + std::to_string(i->arch);
  return list.c_str();
}

namespace {

/* The driver API functions QNCCL uses, from the runtime. */
struct Driver {
  CUresult (*moduleLoadData)(CUmodule*, const void*);
  CUresult (*moduleUnload)(CUmodule);
  CUresult (*moduleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**);
  CUresult (*ctxGetCurrent)(CUcontext*);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*getErrorString)(CUresult, const char**);
  CUresult (*init)(unsigned);
  CUresult (*pointerGetAttributes)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
};

template <class F>
cudaError_t entry_point(const char* symbol, F* fn) {
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPoint(symbol, reinterpret_cast<void**>(fn), cudaEnableDefault, &found);
  if (err == cudaSuccess && found != cudaDriverEntryPointSuccess) return cudaErrorSymbolNotFound;
  return err;
}

/* The table, or the runtime's error resolving it. */
cudaError_t driver_table(const Driver** out) {
  static Driver d;
  static cudaError_t err = [] {
    cudaError_t e = entry_point("cuModuleLoadData", &d.moduleLoadData);
    if (e == cudaSuccess) e = entry_point("cuModuleUnload", &d.moduleUnload);
    if (e == cudaSuccess) e = entry_point("cuModuleGetFunction", &d.moduleGetFunction);
    if (e == cudaSuccess) e = entry_point("cuLaunchKernel", &d.launchKernel);
    if (e == cudaSuccess) e = entry_point("cuCtxGetCurrent", &d.ctxGetCurrent);
    if (e == cudaSuccess) e = entry_point("cuCtxSetCurrent", &d.ctxSetCurrent);
    if (e == cudaSuccess) e = entry_point("cuGetErrorString", &d.getErrorString);
    if (e == cudaSuccess) e = entry_point("cuInit", &d.init);
    if (e == cudaSuccess) e = entry_point("cuPointerGetAttributes", &d.pointerGetAttributes);
    return e;
  }();
  *out = &d;
  return err;
}

ncclResult_t driver(const Driver** out) {
  const cudaError_t err = driver_table(out);
  if (err != cudaSuccess)
    return set_error(ncclUnhandledCudaError,
                     "the CUDA driver API is not available (cudaGetDriverEntryPoint: CUDA error "
                     "%d: %s)",
                     (int)err, cudaGetErrorString(err));
  return ncclSuccess;
}

const char* driver_error(const Driver& d, CUresult res) {
  const char* text = nullptr;
  return d.getErrorString(res, &text) == CUDA_SUCCESS && text != nullptr ? text : "unknown";
}

const CudaModule* const kModules[] = {&kCudaModule_codec, &kCudaModule_engine};
constexpr size_t kModuleCount = sizeof kModules / sizeof kModules[0];
constexpr int kMaxDevices = 64;

/* Every module loaded on one device, its kernels resolved. Never changes
 * once published; kept for the life of the process (as the primary context
 * it lives in). */
struct DeviceKernels {
  CUmodule modules[kModuleCount] = {};
  std::unordered_map<std::string, CUfunction> kernels[kModuleCount];
};

std::atomic<const DeviceKernels*> loaded[kMaxDevices];

void unload(const Driver& d, const DeviceKernels& k) {
  for (CUmodule m : k.modules)
    if (m != nullptr) d.moduleUnload(m);
}

/* Loads module `index` into the current context (device `device`, compute
 * capability `arch`) and resolves all its kernels into `k`. */
ncclResult_t load_module(const Driver& d, size_t index, int device, int arch, DeviceKernels& k) {
  const CudaModule& m = *kModules[index];
  const CudaImage* image = pick_image(m.images, arch);
  if (image == nullptr)
    return set_error(ncclUnhandledCudaError,
                     "libqnccl.so has no %s kernels for device %d (compute capability %d.%d): "
                     "it carries machine code for %s and PTX for %s; rebuild it with that "
                     "architecture in CUDA_ARCHS",
                     m.name, device, arch / 10, arch % 10, carried_archs(m, false),
                     carried_archs(m, true));
  if (const CUresult res = d.moduleLoadData(&k.modules[index], image->data); res != CUDA_SUCCESS) {
    k.modules[index] = nullptr;
    return set_error(ncclUnhandledCudaError,
                     "loading the %s kernels (%s for %d) on device %d failed: %s%s", m.name,
                     image->ptx ? "PTX" : "machine code", image->arch, device,
                     driver_error(d, res),
                     image->ptx ? "; the driver may be too old to compile this PTX: update it, "
                                  "or rebuild with the GPU's architecture in CUDA_ARCHS" : "");
  }
  for (const char* const* name = m.kernels; *name != nullptr; name++) {
    CUfunction f = nullptr;
    if (const CUresult res = d.moduleGetFunction(&f, k.modules[index], *name); res != CUDA_SUCCESS)
      return set_error(ncclUnhandledCudaError, "resolving kernel %s of the %s kernels on device "
                       "%d failed: %s", *name, m.name, device, driver_error(d, res));
    k.kernels[index].emplace(*name, f);
  }
  return ncclSuccess;
}

ncclResult_t check_device(int device) {
  if (device >= 0 && device < kMaxDevices) return ncclSuccess;
  return set_error(ncclInvalidArgument, "device %d: QNCCL's kernels run on devices 0..%d",
                   device, kMaxDevices - 1);
}

}  // namespace

ncclResult_t load_kernels(int device) {
  QNCCL_CHECK(check_device(device));
  if (loaded[device].load(std::memory_order_acquire) != nullptr) return ncclSuccess;
  const Driver* d;
  QNCCL_CHECK(driver(&d));
  DeviceScope scope;
  QNCCL_CHECK(scope.enter("loading QNCCL's CUDA kernels", device));
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  auto made = std::make_unique<DeviceKernels>();
  for (size_t i = 0; i < kModuleCount; i++) {
    if (const ncclResult_t res = load_module(*d, i, device, 10 * major + minor, *made);
        res != ncclSuccess) {
      unload(*d, *made);
      return res;
    }
  }
  const DeviceKernels* none = nullptr;
  if (loaded[device].compare_exchange_strong(none, made.get(), std::memory_order_acq_rel))
    made.release();
  else
    unload(*d, *made);  // another thread's load was first
  return ncclSuccess;
}

ncclResult_t launch_kernel(const CudaModule& module, const char* name, unsigned grid,
                           unsigned block, cudaStream_t stream, void** args) {
  const Driver* d;
  QNCCL_CHECK(driver(&d));
  int device = -1;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess)
    return set_error(ncclUnhandledCudaError, "kernel %s: the current device: CUDA error %d: %s",
                     name, (int)err, cudaGetErrorString(err));
  QNCCL_CHECK(check_device(device));
  const DeviceKernels* k = loaded[device].load(std::memory_order_acquire);
  if (k == nullptr) {
    QNCCL_CHECK(load_kernels(device));
    k = loaded[device].load(std::memory_order_acquire);
  }
  size_t index = 0;
  while (index < kModuleCount && kModules[index] != &module) index++;
  const auto it = index < kModuleCount ? k->kernels[index].find(name) : k->kernels[0].end();
  if (index == kModuleCount || it == k->kernels[index].end())
    return set_error(ncclInternalError, "kernel %s is not in the %s kernels", name, module.name);
  if (const CUresult res = d->launchKernel(it->second, grid, 1, 1, block, 1, 1, 0,
                                           reinterpret_cast<CUstream>(stream), args, nullptr);
      res != CUDA_SUCCESS)
    return set_error(ncclUnhandledCudaError, "launching kernel %s failed: %s", name,
                     driver_error(*d, res));
  return ncclSuccess;
}

ncclResult_t DeviceScope::enter(const char* fn, int device) {
  const Driver* d;
  QNCCL_CHECK(driver(&d));
  CUcontext current = nullptr;
  if (d->ctxGetCurrent(&current) != CUDA_SUCCESS) current = nullptr;
  // Always the device's primary context, where the kernels are loaded (the
  // thread's may be another context of the same device).
  if (const cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(ncclUnhandledCudaError, "%s: selecting device %d failed: CUDA error %d: %s",
                     fn, device, (int)err, cudaGetErrorString(err));
  }
  switched_ = true;
  saved_ = current;
  return ncclSuccess;
}

PointerQuery driver_pointer_device(const void* ptr, int* device, const char** why) {
  *device = -1;
  *why = "";
  const Driver* d;
  if (const cudaError_t err = driver_table(&d); err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = cudaGetErrorString(err);
    return err == cudaErrorNoDevice             ? PointerQuery::kNoDevice
           : err == cudaErrorInsufficientDriver ? PointerQuery::kDriverTooOld
                                                : PointerQuery::kFailed;
  }
  static const CUresult init = d->init(0);  // makes no context
  if (init == CUDA_ERROR_NO_DEVICE) return PointerQuery::kNoDevice;
  unsigned type = 0, managed = 0;
  int ordinal = -1;
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* values[] = {&type, &managed, &ordinal};
  // Memory CUDA does not know comes back as defaults, with CUDA_SUCCESS.
  const CUresult res = init != CUDA_SUCCESS ? init
                       : d->pointerGetAttributes(3, attributes, values,
                                                 reinterpret_cast<CUdeviceptr>(ptr));
  if (res != CUDA_SUCCESS) {
    *why = driver_error(*d, res);
    return PointerQuery::kFailed;
  }
  if (type == CU_MEMORYTYPE_DEVICE || managed != 0) *device = ordinal;
  return PointerQuery::kOk;
}

DeviceScope::~DeviceScope() {
  const Driver* d;
  if (switched_ && driver(&d) == ncclSuccess) d->ctxSetCurrent(static_cast<CUcontext>(saved_));
}

}  // namespace qnccl
