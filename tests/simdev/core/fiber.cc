#include "core/fiber.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define SIMDEV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIMDEV_ASAN 1
#endif
#endif

#ifdef SIMDEV_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace simdev {

#if defined(__x86_64__)
/* simdev_switch(&from->sp, to->sp): pushes the callee-saved registers and
 * the MXCSR and x87 control words, swaps stacks, pops the other side's. A
 * new fiber's stack holds such a frame whose return address is the
 * trampoline, which calls r12(rbx). */
extern "C" void simdev_switch(void** from_sp, void* to_sp);
extern "C" void simdev_trampoline();
asm(R"(
  .text
  .globl simdev_switch
  .hidden simdev_switch
  .type simdev_switch, @function
simdev_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simdev_switch, .-simdev_switch

  .globl simdev_trampoline
  .hidden simdev_trampoline
  .type simdev_trampoline, @function
simdev_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  movq %rbx, %rdi
  callq *%r12
  ud2
  .cfi_endproc
  .size simdev_trampoline, .-simdev_trampoline
)");

void fiber_make(Fiber* f, FiberStack stack, void (*fn)(void*), void* arg) {
  f->stack = stack;
  uintptr_t top = ((uintptr_t)(stack.base + stack.size) & ~(uintptr_t)15) - 16;
  uint64_t* frame = reinterpret_cast<uint64_t*>(top - 64);
  frame[0] = 0x1f80u | (uint64_t)0x037fu << 32;  // MXCSR: round to nearest, no FTZ/DAZ; x87 CW
  frame[1] = 0;                                   // r15
  frame[2] = 0;                                   // r14
  frame[3] = 0;                                   // r13
  frame[4] = (uint64_t)(uintptr_t)fn;             // r12
  frame[5] = (uint64_t)(uintptr_t)arg;            // rbx
  frame[6] = 0;                                   // rbp
  frame[7] = (uint64_t)(uintptr_t)&simdev_trampoline;
  f->sp = frame;
  f->asan_bottom = stack.base;
  f->asan_size = stack.size;
}

void fiber_switch(Fiber* from, Fiber* to) {
#ifdef SIMDEV_ASAN
  __sanitizer_start_switch_fiber(&from->asan_fake_stack, to->asan_bottom, to->asan_size);
#endif
  simdev_switch(&from->sp, to->sp);
#ifdef SIMDEV_ASAN
  __sanitizer_finish_switch_fiber(from->asan_fake_stack, nullptr, nullptr);
#endif
}

#else  // other architectures: ucontext, slower but portable

namespace {
struct Start {
  void (*fn)(void*);
  void* arg;
};
void start(unsigned hi, unsigned lo) {
  const Start* s = reinterpret_cast<const Start*>((uintptr_t)hi << 32 | lo);
  s->fn(s->arg);
  abort();
}
}  // namespace

void fiber_make(Fiber* f, FiberStack stack, void (*fn)(void*), void* arg) {
  f->stack = stack;
  auto* uc = new ucontext_t();
  auto* s = new Start{fn, arg};  // lives as long as the stack's first use
  getcontext(uc);
  uc->uc_stack.ss_sp = stack.base;
  uc->uc_stack.ss_size = stack.size;
  uc->uc_link = nullptr;
  makecontext(uc, (void (*)())start, 2, (unsigned)((uintptr_t)s >> 32), (unsigned)(uintptr_t)s);
  f->sp = uc;
  f->asan_bottom = stack.base;
  f->asan_size = stack.size;
}

void fiber_switch(Fiber* from, Fiber* to) {
  if (from->sp == nullptr) from->sp = new ucontext_t();
#ifdef SIMDEV_ASAN
  __sanitizer_start_switch_fiber(&from->asan_fake_stack, to->asan_bottom, to->asan_size);
#endif
  swapcontext(static_cast<ucontext_t*>(from->sp), static_cast<ucontext_t*>(to->sp));
#ifdef SIMDEV_ASAN
  __sanitizer_finish_switch_fiber(from->asan_fake_stack, nullptr, nullptr);
#endif
}

#endif

void fiber_exit(Fiber* from, Fiber* to) {
#ifdef SIMDEV_ASAN
  __sanitizer_start_switch_fiber(nullptr, to->asan_bottom, to->asan_size);
#if defined(__x86_64__)
  simdev_switch(&from->sp, to->sp);
#else
  swapcontext(static_cast<ucontext_t*>(from->sp), static_cast<ucontext_t*>(to->sp));
#endif
#else
  fiber_switch(from, to);
#endif
}

void fiber_entered(Fiber* from) {
#ifdef SIMDEV_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &from->asan_bottom, &from->asan_size);
#else
  (void)from;
#endif
}

size_t StackPool::stack_bytes() {
#ifdef SIMDEV_ASAN
  return 512 << 10;  // instrumented frames are larger
#else
  return 128 << 10;
#endif
}

FiberStack StackPool::take() {
  if (!free_.empty()) {
    FiberStack s = free_.back();
    free_.pop_back();
    return s;
  }
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t bytes = stack_bytes();
  void* p = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                 MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "simdev: cannot map a %zu-byte fiber stack\n", bytes);
    abort();
  }
  mprotect(p, page, PROT_NONE);  // the guard page
  FiberStack s{static_cast<char*>(p) + page, bytes};
  all_.push_back(s);
  return s;
}

StackPool::~StackPool() {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (const FiberStack& s : all_) munmap(s.base - page, s.size + page);
}

}  // namespace simdev
