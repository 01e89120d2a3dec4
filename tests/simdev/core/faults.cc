#include "core/faults.h"

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <string>

#include "core/memory.h"

namespace simdev {
namespace {

thread_local sigjmp_buf* recovery = nullptr;
thread_local Fault* pending = nullptr;
struct sigaction previous_segv, previous_bus;

void chain(int sig, siginfo_t* info, void* context) {
  const struct sigaction& prev = sig == SIGSEGV ? previous_segv : previous_bus;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);  // returning re-runs the access, which now ends the process
}

void on_fault(int sig, siginfo_t* info, void* context) {
  if (recovery != nullptr) {  // device work on a worker: end it, report it
    pending->signal = sig;
    pending->address = (uintptr_t)info->si_addr;
    pending->protection = sig == SIGSEGV && info->si_code == SI_KERNEL;
    sigjmp_buf* to = recovery;
    recovery = nullptr;
    siglongjmp(*to, 1);
  }
  const uintptr_t address = (uintptr_t)info->si_addr;
  if (Memory::get().device_of_range(address) >= 0) {
    const std::string what = Memory::get().describe(address);
    char text[700];
    const int n = snprintf(text, sizeof text,
                           "simdev: host code touched device memory (%s): on a GPU this is a "
                           "segmentation fault too; copy it with cudaMemcpy\n", what.c_str());
    if (n > 0) (void)!write(2, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
  }
  chain(sig, info, context);
}

void install() {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &previous_segv);
  sigaction(SIGBUS, &sa, &previous_bus);
}

}  // namespace

void prepare_worker_thread() {
  static std::once_flag once;
  std::call_once(once, install);
  // Whole pages of its own (AddressSanitizer unmaps a thread's signal stack when the
  // thread ends); it lives as long as the thread.
  const size_t bytes = 256 << 10;
  void* stack = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (stack == MAP_FAILED) return;  // faults then end the process instead of the kernel
  stack_t ss;
  ss.ss_sp = stack;
  ss.ss_size = bytes;
  ss.ss_flags = 0;
  sigaltstack(&ss, nullptr);
}

void raise_fault(const Fault& fault) {
  if (recovery == nullptr) {
    fprintf(stderr, "simdev: a device fault outside device work (a simulator bug)\n");
    abort();
  }
  *pending = fault;
  sigjmp_buf* to = recovery;
  recovery = nullptr;
  siglongjmp(*to, 1);
}

bool run_protected(void (*fn)(void*), void* arg, Fault* fault) {
  sigjmp_buf buf;
  sigjmp_buf* const outer = recovery;
  Fault* const outer_pending = pending;
  if (sigsetjmp(buf, 1) != 0) {
    recovery = outer;
    pending = outer_pending;
    return false;
  }
  *fault = Fault();
  pending = fault;
  recovery = &buf;
  fn(arg);
  recovery = outer;
  pending = outer_pending;
  return true;
}

}  // namespace simdev
