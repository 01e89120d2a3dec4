#include "core/executor.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "core/config.h"
#include "core/errors.h"
#include "core/faults.h"
#include "core/fiber.h"
#include "core/memory.h"

namespace simdev {
namespace {

constexpr int kWarp = 32;

enum class OpKind { kShflXor, kSyncwarp };
const char* op_name(OpKind k) { return k == OpKind::kShflXor ? "__shfl_xor_sync" : "__syncwarp"; }

struct WarpOp {
  OpKind kind;
  simdev_site site;
  uint32_t mask;
  uint64_t value;
  int bytes, lane_mask, width;
};

enum class State { kNew, kRunning, kWaiting, kDone };

struct Lane {
  simdev_lane info;
  Fiber fiber;
  State state = State::kNew;
  WarpOp op;
  uint64_t result = 0;
};

struct Warp {
  int first = 0, size = 0;  // lanes [first, first + size) of the block
  int waiting = 0, done = 0;
};

/* One block in execution on this thread. */
struct Block {
  const Launch* launch = nullptr;
  const simdev_lane** slot = nullptr;
  StackPool* stacks = nullptr;
  std::mt19937_64* rng = nullptr;
  Fiber scheduler;
  std::vector<Lane> lanes;
  std::vector<Warp> warps;
  std::deque<int> ready;
  Lane* current = nullptr;
  std::string error;  // why the block failed, if it did
  simdev_dim3 index;
};

thread_local Block* block = nullptr;

std::string site(const simdev_site& s) {
  const char* file = strrchr(s.file, '/');
  return std::string(file ? file + 1 : s.file) + ":" + std::to_string(s.line);
}

/* The order of `n` indices from `first` under the lane order. */
void in_order(int first, int n, std::vector<int>* out) {
  out->clear();
  for (int i = 0; i < n; i++) out->push_back(first + i);
  switch (config().lane_order) {
    case LaneOrder::kForward: break;
    case LaneOrder::kReverse: std::reverse(out->begin(), out->end()); break;
    case LaneOrder::kRandom: std::shuffle(out->begin(), out->end(), *block->rng); break;
  }
}

/* ---- warp operations (called by lanes, on their fibers) ---- */

uint64_t arrive(const WarpOp& op) {
  Lane* me = block->current;
  me->op = op;
  me->state = State::kWaiting;
  fiber_switch(&me->fiber, &block->scheduler);
  return me->result;
}

uint64_t shfl_xor(uint32_t mask, uint64_t value, int bytes, int lane_mask, int width,
                  simdev_site where) {
  return arrive(WarpOp{OpKind::kShflXor, where, mask, value, bytes, lane_mask, width});
}

void syncwarp(uint32_t mask, simdev_site where) {
  arrive(WarpOp{OpKind::kSyncwarp, where, mask, 0, 0, 0, 0});
}

[[noreturn]] void misaligned(const void* address, unsigned alignment, const char* type) {
  Fault f;
  f.address = (uintptr_t)address;
  f.misaligned_type = type;
  f.alignment = alignment;
  raise_fault(f);
}

const simdev_hooks kHooks = {shfl_xor, syncwarp, misaligned};

void lane_main(void* arg) {
  Lane* lane = static_cast<Lane*>(arg);
  fiber_entered(&block->scheduler);
  block->launch->kernel->run(block->launch->params, block->launch->offsets);
  lane->state = State::kDone;
  fiber_exit(&lane->fiber, &block->scheduler);
}

/* ---- meeting points ---- */

bool fail_warp(const Warp& w, const std::string& why) {
  char where[96];
  snprintf(where, sizeof where, "block (%u,%u,%u), warp %d: ", block->index.x, block->index.y,
           block->index.z, w.first / kWarp);
  block->error = where + why;
  return false;
}

std::string describe_lane(const Warp& w, int lane) {
  const Lane& l = block->lanes[(size_t)(w.first + lane)];
  if (l.state == State::kDone) return "lane " + std::to_string(lane) + " returned";
  char text[160];
  snprintf(text, sizeof text, "lane %d is at %s (%s, mask %#x)", lane, site(l.op.site).c_str(),
           op_name(l.op.kind), l.op.mask);
  return text;
}

/* Every lane of `w` waits or is done and some wait: complete the operations
 * whose lanes are all there, or fail naming what does not match. */
bool resolve(Warp& w) {
  const uint32_t present = w.size == kWarp ? 0xffffffffu : ((1u << w.size) - 1);
  uint32_t open = 0;  // waiting lanes not yet in a completed group
  for (int i = 0; i < w.size; i++)
    if (block->lanes[(size_t)(w.first + i)].state == State::kWaiting) open |= 1u << i;
  std::vector<int> order;
  while (open != 0) {
    const int first = __builtin_ctz(open);
    const Lane& lead = block->lanes[(size_t)(w.first + first)];
    const WarpOp& op = lead.op;
    const std::string at = std::string(op_name(op.kind)) + " at " + site(op.site);
    if ((op.mask & (1u << first)) == 0)
      return fail_warp(w, "lane " + std::to_string(first) + " called " + at + " with mask " +
                              std::to_string(op.mask) + ", which does not name itself");
    if ((op.mask & ~present) != 0)
      return fail_warp(w, at + ": the mask names lanes the block does not have");
    for (int i = 0; i < kWarp; i++) {
      if ((op.mask & (1u << i)) == 0) continue;
      const Lane& l = block->lanes[(size_t)(w.first + i)];
      if (l.state == State::kDone)
        return fail_warp(w, "lane " + std::to_string(i) + " returned while lane " +
                                std::to_string(first) + " waits for it at " + at +
                                " (every lane the mask names must reach it)");
      if (l.op.kind != op.kind || l.op.mask != op.mask || l.op.site.line != op.site.line ||
          strcmp(l.op.site.file, op.site.file) != 0)
        return fail_warp(w, "the lanes of a warp operation disagree: " + describe_lane(w, first) +
                                ", " + describe_lane(w, i));
    }
    if (op.kind == OpKind::kShflXor) {
      for (int i = 0; i < kWarp; i++) {
        if ((op.mask & (1u << i)) == 0) continue;
        Lane& l = block->lanes[(size_t)(w.first + i)];
        const int width = l.op.width;
        if (width < 1 || width > kWarp || (width & (width - 1)) != 0)
          return fail_warp(w, at + ": width " + std::to_string(width) +
                                  " is not a power of two from 1 to 32");
        if (l.op.bytes != op.bytes)
          return fail_warp(w, at + ": lanes shuffle values of different sizes");
        const int target = i ^ l.op.lane_mask;
        if (target < 0 || target >= kWarp || target / width > i / width) {
          l.result = l.op.value;  // beyond the lane's group: its own value (CUDA)
          continue;
        }
        if ((op.mask & (1u << target)) == 0)
          return fail_warp(w, at + ": lane " + std::to_string(i) + " reads lane " +
                                  std::to_string(target) + ", which the mask leaves out");
        l.result = block->lanes[(size_t)(w.first + target)].op.value;
      }
    }
    in_order(0, kWarp, &order);
    for (int i : order) {
      if ((op.mask & (1u << i)) == 0) continue;
      block->lanes[(size_t)(w.first + i)].state = State::kRunning;
      block->ready.push_back(w.first + i);
      w.waiting--;
    }
    open &= ~op.mask;
  }
  return true;
}

/* Runs the block set up in `block` to its end: false with block->error
 * when its warp operations do not match. */
bool run_block() {
  std::vector<int> warps, lanes;
  in_order(0, (int)block->warps.size(), &warps);
  for (int w : warps) {
    in_order(block->warps[(size_t)w].first, block->warps[(size_t)w].size, &lanes);
    for (int i : lanes) block->ready.push_back(i);
  }
  while (!block->ready.empty()) {
    const int i = block->ready.front();
    block->ready.pop_front();
    Lane& l = block->lanes[(size_t)i];
    block->current = &l;
    *block->slot = &l.info;
    if (l.state == State::kNew) {
      l.fiber = Fiber();
      fiber_make(&l.fiber, block->stacks->take(), lane_main, &l);
    }
    l.state = State::kRunning;
    fiber_switch(&block->scheduler, &l.fiber);
    Warp& w = block->warps[(size_t)(i / kWarp)];
    if (l.state == State::kDone) {
      block->stacks->give(l.fiber.stack);
      w.done++;
    } else {
      w.waiting++;
    }
    if (w.waiting > 0 && w.waiting + w.done == w.size && !resolve(w)) return false;
  }
  for (const Warp& w : block->warps)
    if (w.done != w.size) return fail_warp(w, "lanes never completed (an executor bug)");
  return true;
}

void run_block_protected(void* ok) { *static_cast<bool*>(ok) = run_block(); }

/* The lanes' stacks of a block that ended early go back to the pool. */
void reclaim() {
  for (Lane& l : block->lanes)
    if (l.state != State::kNew && l.state != State::kDone) block->stacks->give(l.fiber.stack);
}

bool floating_point_ok(std::string* why) {
#if defined(__x86_64__)
  const unsigned csr = _mm_getcsr();
  if ((csr & 0x8040u) != 0 || (csr & 0x6000u) != 0) {
    char text[160];
    snprintf(text, sizeof text, "the worker's MXCSR is %#x: flush-to-zero, denormals-are-zero "
             "or a rounding mode other than nearest is on; the GPU's IEEE arithmetic is not", csr);
    *why = text;
    return false;
  }
#else
  (void)why;
#endif
  return true;
}

/* Unmaps the memory of `devices` while it lives. */
class HiddenMemory {
 public:
  explicit HiddenMemory(const std::vector<int>& devices) : devices_(devices) {
    for (int d : devices_) Memory::get().hide_device(d, true);
  }
  ~HiddenMemory() {
    for (int d : devices_) Memory::get().hide_device(d, false);
  }

 private:
  const std::vector<int>& devices_;
};

}  // namespace

const simdev_hooks* executor_hooks() { return &kHooks; }

std::mutex& device_work_lock() {
  static std::mutex* m = new std::mutex();
  return *m;
}

cudaError_t execute(const Launch& launch) {
  std::lock_guard<std::mutex> one_at_a_time(device_work_lock());
  HiddenMemory hide(launch.hidden);
  const char* name = launch.kernel->name;
  std::string why;
  if (!floating_point_ok(&why)) return fail_loudly(cudaErrorLaunchFailure, "kernel %s: %s", name,
                                                   why.c_str());
  static thread_local StackPool stacks;
  static uint64_t launches = 0;
  std::mt19937_64 rng(config().seed * 0x9e3779b97f4a7c15ull + ++launches);
  Block b;
  b.launch = &launch;
  b.slot = launch.image->lane_slot();
  b.stacks = &stacks;
  b.rng = &rng;
  const simdev_dim3 g = launch.grid, d = launch.block;
  const int threads = (int)(d.x * d.y * d.z);
  b.lanes.resize((size_t)threads);
  for (int w = 0; w * kWarp < threads; w++)
    b.warps.push_back(Warp{w * kWarp, std::min(kWarp, threads - w * kWarp)});
  unsigned char* shared = launch.image->shared_begin;
  const size_t shared_bytes = launch.image->shared_end - shared;
  Block* const outer = block;
  block = &b;
  cudaError_t result = cudaSuccess;
  for (unsigned bz = 0; bz < g.z && result == cudaSuccess; bz++)
    for (unsigned by = 0; by < g.y && result == cudaSuccess; by++)
      for (unsigned bx = 0; bx < g.x && result == cudaSuccess; bx++) {
        b.index = simdev_dim3{bx, by, bz};
        for (int t = 0; t < threads; t++) {
          Lane& l = b.lanes[(size_t)t];
          l.state = State::kNew;
          l.info.thread_idx = simdev_dim3{(unsigned)t % d.x, (unsigned)t / d.x % d.y,
                                          (unsigned)t / (d.x * d.y)};
          l.info.block_idx = b.index;
          l.info.block_dim = d;
          l.info.grid_dim = g;
        }
        for (Warp& w : b.warps) w.waiting = w.done = 0;
        b.ready.clear();
        if (shared_bytes > 0) memset(shared, (int)(rng() % 255) + 1, shared_bytes);
        bool ok = false;
        Fault fault;
        if (!run_protected(run_block_protected, &ok, &fault)) {
          reclaim();
          std::string what;
          if (fault.misaligned_type != nullptr) {
            char text[160];
            snprintf(text, sizeof text, "accessed a %s at %p, which is not %u-byte aligned",
                     fault.misaligned_type, (void*)fault.address, fault.alignment);
            what = text;
          } else if (fault.protection) {
            what = "made a general-protection fault: a misaligned vector access or a "
                   "non-canonical address";
          } else {
            what = std::string(fault.signal == SIGBUS ? "made a bus-faulting access at "
                                                      : "touched memory the device may not use: ") +
                   Memory::get().describe(fault.address);
          }
          const bool misaligned = fault.misaligned_type != nullptr || fault.protection;
          const Lane* l = b.current;
          result = fail_loudly(
              misaligned ? cudaErrorMisalignedAddress : cudaErrorIllegalAddress,
              "kernel %s (grid %u,%u,%u, block %u,%u,%u) on device %d: block (%u,%u,%u) thread "
              "(%u,%u,%u) %s", name, g.x, g.y, g.z, d.x, d.y, d.z, launch.device, bx, by, bz,
              l ? l->info.thread_idx.x : 0, l ? l->info.thread_idx.y : 0,
              l ? l->info.thread_idx.z : 0, what.c_str());
        } else if (!ok) {
          reclaim();
          result = fail_loudly(cudaErrorLaunchFailure, "kernel %s (grid %u,%u,%u, block %u,%u,%u) "
                               "on device %d: %s", name, g.x, g.y, g.z, d.x, d.y, d.z,
                               launch.device, b.error.c_str());
        }
      }
  block = outer;
  return result;
}

}  // namespace simdev
