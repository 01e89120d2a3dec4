/* Faults of device work. A kernel or a copy runs on a worker thread inside
 * run_protected(); an access to memory the device may not touch (freed or
 * never allocated device memory, past the end of an allocation: the
 * simulator maps none of it) raises SIGSEGV, which ends the work there and
 * comes back as a Fault, as an illegal address ends a kernel on the GPU.
 * The same handler names device memory that host code touches by mistake
 * (a crash either way, on a GPU too). */
#ifndef SIMDEV_CORE_FAULTS_H_
#define SIMDEV_CORE_FAULTS_H_

#include <stdint.h>

namespace simdev {

struct Fault {
  int signal = 0;
  uintptr_t address = 0;
  /* A general-protection fault, which has no address: on x86-64 an aligned
   * vector instruction on a misaligned address (the GPU's misaligned
   * address), or a non-canonical address. */
  bool protection = false;
  /* A vector type at a misaligned address (the kernels' own check). */
  const char* misaligned_type = nullptr;
  unsigned alignment = 0;
};

/* Ends the device work running on this thread with `fault`, as a signal
 * would (back to run_protected). Outside device work it aborts. */
[[noreturn]] void raise_fault(const Fault& fault);

/* Runs fn(arg) and returns true, or false with *fault when it faulted
 * (fn may switch fibers; the fault comes back here from any of them). */
bool run_protected(void (*fn)(void*), void* arg, Fault* fault);

/* Once per worker thread: an alternate signal stack, so that a fiber's
 * stack overflow can be reported. */
void prepare_worker_thread();

}  // namespace simdev

#endif
