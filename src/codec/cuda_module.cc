#include "codec/cuda_module.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
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

const char* carried_archs(const CudaImage* images, bool ptx) {
  static std::mutex mutex;
  static std::map<std::pair<const CudaImage*, bool>, std::string> lists;
  std::lock_guard<std::mutex> lock(mutex);
  std::string& list = lists[{images, ptx}];
  if (list.empty())
    for (const CudaImage* i = images; i->module != nullptr; i++)
      if (i->ptx == ptx) list += (list.empty() ? "" : ",") + std::to_string(i->arch);
  return list.c_str();
}

namespace {

/* The driver API functions QNCCL uses, from the runtime. */
struct Driver {
  CUresult (*moduleLoadData)(CUmodule*, const void*);
  CUresult (*moduleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**);
  CUresult (*getErrorString)(CUresult, const char**);
};

template <class F>
cudaError_t entry_point(const char* symbol, F* fn) {
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPoint(symbol, reinterpret_cast<void**>(fn), cudaEnableDefault, &found);
  if (err == cudaSuccess && found != cudaDriverEntryPointSuccess) return cudaErrorSymbolNotFound;
  return err;
}

ncclResult_t driver(const Driver** out) {
  static Driver d;
  static cudaError_t err = [] {
    cudaError_t e = entry_point("cuModuleLoadData", &d.moduleLoadData);
    if (e == cudaSuccess) e = entry_point("cuModuleGetFunction", &d.moduleGetFunction);
    if (e == cudaSuccess) e = entry_point("cuLaunchKernel", &d.launchKernel);
    if (e == cudaSuccess) e = entry_point("cuGetErrorString", &d.getErrorString);
    return e;
  }();
  if (err != cudaSuccess)
    return set_error(ncclUnhandledCudaError,
                     "the CUDA driver API is not available (cudaGetDriverEntryPoint: CUDA error "
                     "%d: %s)",
                     (int)err, cudaGetErrorString(err));
  *out = &d;
  return ncclSuccess;
}

const char* driver_error(const Driver& d, CUresult res) {
  const char* text = nullptr;
  return d.getErrorString(res, &text) == CUDA_SUCCESS && text != nullptr ? text : "unknown";
}

/* A module loaded on one device, and the kernels looked up so far. */
struct Loaded {
  CUmodule module = nullptr;
  std::map<std::string, CUfunction> kernels;
};

ncclResult_t kernel(const Driver& d, const CudaImage* images, const char* name,
                    CUfunction* out) {
  static std::mutex mutex;
  static std::map<std::pair<const CudaImage*, int>, Loaded> loaded;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaSetDevice(device);  // its primary context, current
  if (err != cudaSuccess)
    return set_error(ncclUnhandledCudaError, "selecting the device for kernel %s: CUDA error %d: %s",
                     name, (int)err, cudaGetErrorString(err));
  std::lock_guard<std::mutex> lock(mutex);
  Loaded& l = loaded[{images, device}];
  if (l.module == nullptr) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    const CudaImage* image = pick_image(images, 10 * major + minor);
    if (image == nullptr)
      return set_error(ncclUnhandledCudaError,
                       "libqnccl.so has no %s kernels for device %d (compute capability %d.%d): "
                       "it carries machine code for %s and PTX for %s; rebuild it with that "
                       "architecture in CUDA_ARCHS",
                       images->module, device, major, minor, carried_archs(images, false),
                       carried_archs(images, true));
    if (const CUresult res = d.moduleLoadData(&l.module, image->data); res != CUDA_SUCCESS) {
      l.module = nullptr;
      return set_error(ncclUnhandledCudaError,
                       "loading the %s kernels (%s for %d) on device %d failed: %s%s", image->module,
                       image->ptx ? "PTX" : "machine code", image->arch, device,
                       driver_error(d, res),
                       image->ptx ? "; the driver may be too old to compile this PTX: update it, "
                                    "or rebuild with the GPU's architecture in CUDA_ARCHS" : "");
    }
  }
  auto it = l.kernels.find(name);
  if (it == l.kernels.end()) {
    CUfunction f = nullptr;
    if (const CUresult res = d.moduleGetFunction(&f, l.module, name); res != CUDA_SUCCESS)
      return set_error(ncclInternalError, "kernel %s is not in the %s kernels: %s", name,
                       images->module, driver_error(d, res));
    it = l.kernels.emplace(name, f).first;
  }
  *out = it->second;
  return ncclSuccess;
}

}  // namespace

ncclResult_t launch_kernel(const CudaImage* images, const char* name, unsigned grid,
                           unsigned block, cudaStream_t stream, void** args) {
  const Driver* d;
  QNCCL_CHECK(driver(&d));
  CUfunction f = nullptr;
  QNCCL_CHECK(kernel(*d, images, name, &f));
  if (const CUresult res = d->launchKernel(f, grid, 1, 1, block, 1, 1, 0,
                                           reinterpret_cast<CUstream>(stream), args, nullptr);
      res != CUDA_SUCCESS)
    return set_error(ncclUnhandledCudaError, "launching kernel %s failed: %s", name,
                     driver_error(*d, res));
  return ncclSuccess;
}

}  // namespace qnccl
