/* The simulated GPU's kernel rules, one per run, through the driver API as a
 * program that loads its own module would use it (docs/simulated-gpu.md):
 *
 *     kernel_rules RULE     prints what each call answered and what the
 *                           kernel wrote; tests/test_simdev_runtime.py
 *                           checks it against the GPU's behaviour
 *
 * The module is tests/simdev/checks/rule_kernels.cu, compiled for the
 * simulator and linked in: its image is what cuModuleLoadData gets. A launch
 * the driver refuses prints the simulator's reason (simdevGetLastMessage);
 * a failed kernel's is printed by the simulator itself. */
#include <cuda.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "simdev/abi.h"
#include "simdev/simdev.h"

extern "C" const simdev_module_image simdev_image_checks;

namespace {

CUcontext ctx[2];
CUmodule module;
CUstream stream;

const char* name(CUresult r) {
  const char* s = nullptr;
  cuGetErrorName(r, &s);
  return s != nullptr ? s : "?";
}

void must(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  fprintf(stderr, "kernel_rules: %s failed: %s\n", what, name(r));
  exit(1);
}

void open_device(int ordinal) {
  CUdevice dev;
  must(cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  must(cuDevicePrimaryCtxRetain(&ctx[ordinal], dev), "cuDevicePrimaryCtxRetain");
  must(cuCtxSetCurrent(ctx[ordinal]), "cuCtxSetCurrent");
}

template <class T>
CUdeviceptr upload(const std::vector<T>& host) {
  CUdeviceptr p;
  must(cuMemAlloc(&p, host.size() * sizeof(T)), "cuMemAlloc");
  must(cuMemcpyHtoDAsync(p, host.data(), host.size() * sizeof(T), stream), "cuMemcpyHtoD");
  must(cuStreamSynchronize(stream), "cuStreamSynchronize");  // `host` may be a temporary
  return p;
}

template <class T>
std::vector<T> download(CUdeviceptr p, size_t n) {
  std::vector<T> host(n);
  must(cuMemcpyDtoHAsync(host.data(), p, n * sizeof(T), stream), "cuMemcpyDtoH");
  must(cuStreamSynchronize(stream), "cuStreamSynchronize");
  return host;
}

/* Launches `kernel` with `args` on one grid; prints the launch's and the
 * stream's answers. Whether it ran is what they say. */
bool launch(const char* kernel, unsigned grid, unsigned block, std::vector<void*> args) {
  CUfunction f;
  must(cuModuleGetFunction(&f, module, kernel), "cuModuleGetFunction");
  const CUresult launched = cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, args.data(),
                                           nullptr);
  printf("%s: cuLaunchKernel -> %s\n", kernel, name(launched));
  if (launched != CUDA_SUCCESS) {
    fprintf(stderr, "simdev: %s\n", simdevGetLastMessage());  // why, in words
    return false;
  }
  const CUresult synced = cuStreamSynchronize(stream);
  printf("%s: cuStreamSynchronize -> %s\n", kernel, name(synced));
  return synced == CUDA_SUCCESS;
}

void ints_kernel(const char* kernel, unsigned threads) {
  CUdeviceptr out = upload(std::vector<int>(threads, 0));
  if (!launch(kernel, 1, threads, {&out})) return;
  int ones = 0;
  for (int v : download<int>(out, threads)) ones += v == 1;
  printf("%s: %d of %u lanes wrote\n", kernel, ones, threads);
}

const std::map<std::string, std::function<void()>> rules = {
    {"copy", [] {
       std::vector<float> in(5000);
       for (size_t i = 0; i < in.size(); i++) in[i] = (float)i * 0.25f;
       CUdeviceptr x = upload(in), y = upload(std::vector<float>(in.size(), -1.0f));
       int n = (int)in.size();
       if (launch("copy_values", 3, 128, {&x, &y, &n}))
         printf("copy_values: %s\n", download<float>(y, in.size()) == in ? "equal" : "different");
     }},
    {"big-params", [] {
       static float big[1100] = {1.0f};
       CUdeviceptr out = upload(std::vector<float>(32, 0.0f));
       launch("big_params", 1, 32, {big, &out});
     }},
    {"read-past-end", [] {
       CUdeviceptr in = upload(std::vector<float>(1024, 1.0f));
       CUdeviceptr out = upload(std::vector<float>(32, 0.0f));
       int n = 1024;
       launch("read_past_end", 1, 32, {&in, &out, &n});
     }},
    {"misaligned", [] {
       CUdeviceptr in = upload(std::vector<float>(4 * 32 + 4, 1.0f));
       CUdeviceptr out = upload(std::vector<float>(4 * 32, 0.0f));
       launch("misaligned_vector", 1, 32, {&in, &out});
     }},
    {"divergent-syncwarp", [] { ints_kernel("divergent_syncwarp", 32); }},
    {"early-return", [] { ints_kernel("early_return", 32); }},
    {"mask-mismatch", [] { ints_kernel("mask_mismatch", 32); }},
    {"half-warp", [] { ints_kernel("half_warp", 64); }},
    {"warp-sum", [] {
       std::vector<int> in(96);
       for (size_t i = 0; i < in.size(); i++) in[i] = (int)(i * i % 101);
       CUdeviceptr x = upload(in), y = upload(std::vector<int>(in.size(), 0));
       if (!launch("warp_sum", 1, 96, {&x, &y})) return;
       const std::vector<int> got = download<int>(y, in.size());
       int right = 0;
       for (size_t w = 0; w < 3; w++) {
         int sum = 0;
         for (size_t i = 32 * w; i < 32 * w + 32; i++) sum += in[i];
         for (size_t i = 32 * w; i < 32 * w + 32; i++) right += got[i] == sum;
       }
       printf("warp_sum: %d of 96 lanes hold their warp's sum\n", right);
     }},
    {"shared-unwritten", [] {
       CUdeviceptr out = upload(std::vector<unsigned>(2 * 256, 0));
       if (!launch("shared_unwritten", 2, 256, {&out})) return;
       int zeros = 0;
       for (unsigned v : download<unsigned>(out, 2 * 256)) zeros += v == 0;
       printf("shared_unwritten: %d of 512 values read are zero\n", zeros);
     }},
    {"convert", [] {
       const std::vector<float> in = {1e10f, -1e10f, NAN, -5.0f, 3.9f, -3.9f, 4294967296.0f,
                                      INFINITY};
       CUdeviceptr x = upload(in), i = upload(std::vector<int>(in.size(), 7)),
                   u = upload(std::vector<unsigned>(in.size(), 7));
       unsigned n = (unsigned)in.size();
       if (!launch("convert", 1, n, {&x, &i, &u})) return;
       printf("convert: int");
       for (int v : download<int>(i, n)) printf(" %d", v);
       printf("; unsigned");
       for (unsigned v : download<unsigned>(u, n)) printf(" %u", v);
       printf("\n");
     }},
    {"subnormal", [] {
       const std::vector<float> in = {ldexpf(1.0f, -130), ldexpf(1.0f, -126), -ldexpf(3.0f, -140)};
       CUdeviceptr x = upload(in), y = upload(std::vector<float>(in.size(), 1.0f));
       if (!launch("halve", 1, (unsigned)in.size(), {&x, &y})) return;
       const std::vector<float> got = download<float>(y, in.size());
       bool exact = true;
       for (size_t k = 0; k < in.size(); k++) exact &= got[k] == in[k] * 0.5f && got[k] != 0;
       printf("halve: subnormal results %s\n", exact ? "kept" : "flushed");
     }},
    {"peer", [] {
       // A kernel on device 1 reading device 0's memory, without peer access.
       CUdeviceptr in = upload(std::vector<float>(32, 1.0f));
       open_device(1);
       must(cuModuleLoadData(&module, &simdev_image_checks), "cuModuleLoadData");
       must(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
       CUdeviceptr out = upload(std::vector<float>(32, 0.0f));
       int n = 32;
       launch("copy_values", 1, 32, {&in, &out, &n});
     }},
    {"other-device", [] {
       // The module is device 0's: a launch with device 1 current is refused.
       CUdeviceptr out = upload(std::vector<int>(32, 0));
       open_device(1);
       must(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
       launch("early_return", 1, 32, {&out});
     }},
};

}  // namespace

int main(int argc, char** argv) {
  const auto rule = argc == 2 ? rules.find(argv[1]) : rules.end();
  if (rule == rules.end()) {
    fprintf(stderr, "usage: kernel_rules RULE; the rules:");
    for (const auto& r : rules) fprintf(stderr, " %s", r.first.c_str());
    fprintf(stderr, "\n");
    return 2;
  }
  must(cuInit(0), "cuInit");
  open_device(0);
  must(cuModuleLoadData(&module, &simdev_image_checks), "cuModuleLoadData");
  must(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  rule->second();
  return 0;
}
