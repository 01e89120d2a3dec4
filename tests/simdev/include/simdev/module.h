/* The image of a kernel module for the simulated GPU: included by the
 * module's generated translation unit (tests/simdev/gen_module.py) after
 * simdev/kernel.h and the kernel source, then
 *
 *     SIMDEV_MODULE(codec, SIMDEV_KERNEL(qnccl_stats_f32, 256), ...)
 *
 * defines simdev_image_codec, the bytes cuModuleLoadData receives. Each
 * kernel's parameter types come from its own declaration, so the thunk
 * unpacks exactly what the kernel takes. */
#ifndef SIMDEV_MODULE_H_
#define SIMDEV_MODULE_H_

#include <stddef.h>

#include <type_traits>
#include <utility>

#include "simdev/abi.h"

namespace simdev {

template <class Signature, Signature F>
struct Entry;

template <class... A, void (*F)(A...)>
struct Entry<void (*)(A...), F> {
  static constexpr size_t sizes[sizeof...(A) + 1] = {sizeof(std::decay_t<A>)..., 0};
  static constexpr size_t aligns[sizeof...(A) + 1] = {alignof(std::decay_t<A>)..., 0};

  template <size_t... I>
  static void call(const unsigned char* params, const size_t* offsets, std::index_sequence<I...>) {
    F(*reinterpret_cast<const std::decay_t<A>*>(params + offsets[I])...);
  }
  static void run(const unsigned char* params, const size_t* offsets) {
    call(params, offsets, std::index_sequence_for<A...>{});
  }
};

static inline const simdev_lane** lane_slot() { return &simdev_current_lane; }
static inline void attach(const simdev_hooks* hooks) { simdev_module_hooks = hooks; }

}  // namespace simdev

extern "C" unsigned char __start_simdev_shared[] __attribute__((weak, visibility("hidden")));
extern "C" unsigned char __stop_simdev_shared[] __attribute__((weak, visibility("hidden")));

#define SIMDEV_KERNEL(name, bounds)                                                          \
  simdev_kernel {                                                                            \
    #name, (unsigned)(bounds), sizeof(::simdev::Entry<decltype(&name), &name>::sizes) /      \
                                   sizeof(size_t) - 1,                                       \
        ::simdev::Entry<decltype(&name), &name>::sizes,                                      \
        ::simdev::Entry<decltype(&name), &name>::aligns,                                     \
        &::simdev::Entry<decltype(&name), &name>::run                                        \
  }

#define SIMDEV_MODULE(module, ...)                                                           \
  static const simdev_kernel simdev_kernels_##module[] = {__VA_ARGS__};                      \
  extern "C" __attribute__((visibility("hidden"))) const simdev_module_image                 \
      simdev_image_##module = {SIMDEV_IMAGE_MAGIC,                                           \
                               #module,                                                      \
                               simdev_kernels_##module,                                      \
                               sizeof simdev_kernels_##module / sizeof(simdev_kernel),       \
                               &::simdev::lane_slot,                                         \
                               &::simdev::attach,                                            \
                               __start_simdev_shared,                                        \
                               __stop_simdev_shared};

#endif
