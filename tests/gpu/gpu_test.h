/* What the GPU test programs share: result checks that print the first
 * failure, the deterministic input generator and a stream gate for the
 * "returns without waiting for its stream" checks. Header-only: each
 * program is one translation unit. */
#ifndef QNCCL_TESTS_GPU_TEST_H_
#define QNCCL_TESTS_GPU_TEST_H_

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "qnccl.h"

namespace gpu_test {

using Clock = std::chrono::steady_clock;

constexpr size_t kGuard = 64;       // bytes checked untouched past every device output
constexpr uint8_t kGarbage = 0xa5;  // device outputs start as this

/* Each check prints its failure and returns false. */
inline bool cuda_ok(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return true;
  printf("FAIL: %s: %s\n", what.c_str(), cudaGetErrorString(err));
  return false;
}

inline bool nccl_ok(ncclResult_t res, const std::string& what) {
  if (res == ncclSuccess) return true;
  printf("FAIL: %s: result %d: %s\n", what.c_str(), (int)res, qncclGetLastError());
  return false;
}

/* splitmix64: the next of a deterministic stream of 64-bit numbers. */
inline uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A stream held shut by a host function until open() (or 20 s): device
 * calls enqueued behind it must return before it opens. */
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    cuda_ok(cudaLaunchHostFunc(stream, &StreamGate::hold, this), "cudaLaunchHostFunc");
  }
  void open() { open_ = true; }

 private:
  static void hold(void* self) {
    const auto until = Clock::now() + std::chrono::seconds(20);
    while (!static_cast<StreamGate*>(self)->open_ && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::atomic<bool> open_{false};
};

}  // namespace gpu_test

#endif
