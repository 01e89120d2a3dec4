/* Fibers: each CUDA thread of a block runs on a stack of its own and
 * switches to the executor at every warp operation. A switch saves only
 * what the C ABI makes callee-saved (and the floating-point control
 * words), so it costs a few nanoseconds; stacks have a guard page below
 * them, so an overflow faults instead of corrupting a neighbour. */
#ifndef SIMDEV_CORE_FIBER_H_
#define SIMDEV_CORE_FIBER_H_

#include <stddef.h>

#include <vector>

namespace simdev {

struct FiberStack {
  char* base = nullptr;  // lowest usable byte (the guard page is below it)
  size_t size = 0;
};

/* A saved execution context: the worker's own, or a fiber's. */
struct Fiber {
  void* sp = nullptr;
  FiberStack stack;           // empty for the worker's own context
  void* asan_fake_stack = nullptr;
  const void* asan_bottom = nullptr;  // where the fiber's stack is, as seen by AddressSanitizer
  size_t asan_size = 0;
};

/* Prepares `f` to run fn(arg) on `stack` at its first switch. fn must end
 * by switching away for good; it never returns. */
void fiber_make(Fiber* f, FiberStack stack, void (*fn)(void*), void* arg);

/* Saves the current context in `from` and continues `to`. */
void fiber_switch(Fiber* from, Fiber* to);

/* The last switch out of a fiber that is done (its stack may be reused). */
void fiber_exit(Fiber* from, Fiber* to);

/* To be called first thing in fn (fiber_make): completes the switch into it
 * (and learns where `from`'s stack is, for the switches back). */
void fiber_entered(Fiber* from);

/* Stacks of one worker thread: reused from one lane to the next. */
class StackPool {
 public:
  ~StackPool();
  FiberStack take();
  void give(FiberStack s) { free_.push_back(s); }
  static size_t stack_bytes();

 private:
  std::vector<FiberStack> free_;
  std::vector<FiberStack> all_;
};

}  // namespace simdev

#endif
