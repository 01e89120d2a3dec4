/* Kernel modules and launches. A module is loaded into the current
 * context, and its kernels launch only there, on a stream of that device.
 * A launch copies its arguments when it is issued (as cuLaunchKernel does).
 * While it runs, the memory of every other device it has no peer access to
 * is unmapped, so a kernel that follows a pointer there faults as it would
 * on the GPU. */
#include <string.h>

#include "core/core.h"
#include "core/errors.h"
#include "core/executor.h"
#include "core/internal.h"
#include "core/memory.h"

namespace simdev {
namespace {

constexpr size_t kMaxParamBytes = 4096;  // the portable limit (every architecture, any driver)

}  // namespace

cudaError_t module_load(Device* d, const void* image, Module** out) {
  SIMDEV_CHECK(use_device(d));
  if (image == nullptr) return fail(cudaErrorInvalidValue, "cuModuleLoadData: image is NULL");
  const auto* img = static_cast<const simdev_module_image*>(image);
  if (memcmp(img->magic, SIMDEV_IMAGE_MAGIC, sizeof img->magic) != 0)
    return fail(cudaErrorInvalidKernelImage, "cuModuleLoadData: not an image for the simulated "
                "GPU (machine code or PTX for a real GPU cannot run here: build with `make "
                "simdev`)");
  img->attach(executor_hooks());  // the same hooks every time
  Lock lock(sim().mutex);
  auto* m = new Module{d, img};
  sim().modules.insert(m);
  sim().counters.modules_loaded++;
  *out = m;
  return cudaSuccess;
}

cudaError_t module_unload(Module* m) {
  Lock lock(sim().mutex);
  if (!sim().modules.erase(m))
    return fail(cudaErrorInvalidResourceHandle, "cuModuleUnload(%p): not a loaded module",
                (void*)m);
  for (auto it = sim().functions.begin(); it != sim().functions.end();)
    if ((*it)->module == m) {
      delete *it;
      it = sim().functions.erase(it);
    } else {
      ++it;
    }
  delete m;
  return cudaSuccess;
}

/* CUDA's lazy loading (the default since CUDA 12.2): a kernel's first
 * cuModuleGetFunction loads it, which may need the context synchronized and,
 * on drivers before 12.3, fails while a stream of the device captures. The
 * simulator does both, always: a program must resolve its kernels before
 * work that waits on other threads or processes is in flight (NCCL touches
 * all of its own at init). */
static cudaError_t lazy_load(Module* m, const char* name) {
  Device* d = nullptr;
  {
    Lock lock(sim().mutex);
    if (!sim().modules.count(m)) return cudaSuccess;  // reported by the caller
    for (Function* f : sim().functions)
      if (f->module == m && strcmp(f->kernel->name, name) == 0) return cudaSuccess;
    d = m->device;
    for (Stream* s : d->streams)
      if (s->capture != nullptr)
        return fail(cudaErrorStreamCaptureUnsupported,
                    "cuModuleGetFunction(%s): loading a kernel while a stream of device %d "
                    "captures (CUDA's lazy loading cannot on drivers before 12.3): resolve "
                    "every kernel before capturing", name, d->ordinal);
  }
  return device_synchronize(d);
}

cudaError_t module_function(Module* m, const char* name, Function** out) {
  SIMDEV_CHECK(lazy_load(m, name));
  Lock lock(sim().mutex);
  if (!sim().modules.count(m))
    return fail(cudaErrorInvalidResourceHandle, "cuModuleGetFunction: %p is not a loaded module",
                (void*)m);
  for (Function* f : sim().functions)
    if (f->module == m && strcmp(f->kernel->name, name) == 0) {
      *out = f;
      return cudaSuccess;
    }
  const simdev_module_image* img = m->image;
  for (size_t i = 0; i < img->nkernels; i++) {
    const simdev_kernel& k = img->kernels[i];
    if (strcmp(k.name, name) != 0) continue;
    auto* f = new Function{m, &k, {}, 0};
    size_t end = 0;
    for (size_t p = 0; p < k.nparams; p++) {
      end = (end + k.param_aligns[p] - 1) / k.param_aligns[p] * k.param_aligns[p];
      f->offsets.push_back(end);
      end += k.param_sizes[p];
    }
    f->param_bytes = end;
    sim().functions.insert(f);
    sim().counters.kernels_resolved++;
    *out = f;
    return cudaSuccess;
  }
  return fail(cudaErrorSymbolNotFound, "cuModuleGetFunction: module %s has no kernel %s",
              img->name, name);
}

cudaError_t resolve_function(void* handle, Function** out) {
  Lock lock(sim().mutex);
  Function* f = static_cast<Function*>(handle);
  if (!sim().functions.count(f))
    return fail(cudaErrorInvalidResourceHandle, "%p is not a kernel of a loaded module", handle);
  *out = f;
  return cudaSuccess;
}

cudaError_t launch(Function* f, simdev_dim3 grid, simdev_dim3 block, unsigned shared_bytes,
                   Stream* s, void** params, void** extra) {
  const simdev_kernel* k = f->kernel;
  Device* here = current_context();
  if (f->module->device != here || s->device != here)
    return fail(cudaErrorInvalidResourceHandle, "cuLaunchKernel %s: the kernel was loaded on "
                "device %d, the stream is device %d's and the current device is %d: all three "
                "must be the same", k->name, f->module->device->ordinal, s->device->ordinal,
                here != nullptr ? here->ordinal : -1);
  if (extra != nullptr)
    return fail(cudaErrorNotSupported, "cuLaunchKernel %s: `extra` is not simulated; pass "
                "kernelParams", k->name);
  if (shared_bytes != 0)
    return fail(cudaErrorNotSupported, "cuLaunchKernel %s: dynamic shared memory is not "
                "simulated", k->name);
  const uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      threads > 1024)
    return fail(cudaErrorInvalidConfiguration, "cuLaunchKernel %s: grid (%u,%u,%u) of blocks "
                "(%u,%u,%u) is outside the device's limits", k->name, grid.x, grid.y, grid.z,
                block.x, block.y, block.z);
  if (threads > k->max_threads)
    return fail(cudaErrorLaunchOutOfResources, "cuLaunchKernel %s: %lu threads per block, its "
                "__launch_bounds__ allow %u", k->name, (unsigned long)threads, k->max_threads);
  if (f->param_bytes > kMaxParamBytes)
    return fail(cudaErrorLaunchOutOfResources, "cuLaunchKernel %s: %zu bytes of parameters, "
                "more than %zu", k->name, f->param_bytes, kMaxParamBytes);
  if (k->nparams > 0 && params == nullptr)
    return fail(cudaErrorInvalidValue, "cuLaunchKernel %s: kernelParams is NULL", k->name);
  auto block_bytes = std::make_shared<std::vector<unsigned char>>(f->param_bytes);
  for (size_t p = 0; p < k->nparams; p++)
    memcpy(block_bytes->data() + f->offsets[p], params[p], k->param_sizes[p]);
  Launch l{f->module->image, k, grid, block, nullptr, nullptr, here->ordinal, {}};
  Device* d = here;
  std::vector<size_t> offsets = f->offsets;
  Work w;
  w.kind = Work::kDevice;
  w.what = std::string("kernel ") + k->name;
  w.run = [l, d, block_bytes, offsets]() mutable {
    {
      Lock lock(sim().mutex);
      for (int other = 0; other < device_count(); other++)
        if (other != d->ordinal && !d->peers.count(other)) l.hidden.push_back(other);
      sim().counters.kernels++;
    }
    l.params = block_bytes->data();
    l.offsets = offsets.data();
    return execute(l);
  };
  return issue(s, std::move(w));
}

}  // namespace simdev
