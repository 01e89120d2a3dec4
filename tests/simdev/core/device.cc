/* Devices and their primary contexts. The current context is a per-thread
 * setting (a thread starts with none: CUDA makes device 0's current on the
 * first call that needs one); a device's primary context, with its legacy
 * default stream, is made when first used. */
#include <stdio.h>
#include <stdlib.h>

#include "core/config.h"
#include "core/core.h"
#include "core/errors.h"
#include "core/internal.h"

namespace simdev {
namespace {

/* The thread's context stack; its top is current. Trivially destructible, so
 * it stays valid while the process exits (a library's exit handlers may
 * still ask for the current context, as the CUDA driver allows). */
constexpr int kMaxContextDepth = 64;
thread_local Device* contexts[kMaxContextDepth];
thread_local int depth = 0;

}  // namespace

Sim& sim() {
  static Sim* s = [] {
    auto* made = new Sim();  // never destroyed: workers may run while the process exits
    for (int i = 0; i < config().devices; i++) {
      made->devices.push_back(std::make_unique<Device>());
      made->devices.back()->ordinal = i;
    }
    return made;
  }();
  return *s;
}

int device_count() { return (int)sim().devices.size(); }

Device* device(int ordinal) {
  if (ordinal < 0 || ordinal >= device_count()) return nullptr;
  return sim().devices[(size_t)ordinal].get();
}

void device_name(const Device& d, char* out, size_t size) {
  snprintf(out, size, "QNCCL simulated GPU %d (simdev)", d.ordinal);
}

Device* current_context() { return depth == 0 ? nullptr : contexts[depth - 1]; }

void set_current_context(Device* d) {
  if (d == nullptr) {
    depth = 0;
  } else if (depth == 0) {
    contexts[depth++] = d;
  } else {
    contexts[depth - 1] = d;
  }
}

void push_context(Device* d) {
  if (depth == kMaxContextDepth) {
    fprintf(stderr, "simdev: cuCtxPushCurrent: more than %d contexts pushed on one thread\n",
            kMaxContextDepth);
    abort();
  }
  contexts[depth++] = d;
}

Device* pop_context() { return depth == 0 ? nullptr : contexts[--depth]; }

Device* runtime_device() {
  if (current_context() == nullptr) set_current_context(device(0));
  return current_context();
}

cudaError_t use_device(Device* d) {
  Sim& S = sim();
  Lock lock(S.mutex);
  if (d->sticky != cudaSuccess)
    return fail(d->sticky, "device %d is unusable after device work faulted on it (error %d); "
                "CUDA requires a new process", d->ordinal, (int)d->sticky);
  if (!d->initialized) {
    Stream* legacy = new Stream();
    legacy->kind = Stream::kLegacy;
    legacy->device = d;
    legacy->id = S.next_stream++;
    d->legacy = legacy;
    d->streams.insert(legacy);
    S.streams.insert(legacy);
    d->initialized = true;
  }
  return cudaSuccess;
}

cudaError_t enable_peer_access(Device* d, int peer) {
  if (device(peer) == nullptr || peer == d->ordinal)
    return fail(cudaErrorInvalidDevice, "cudaDeviceEnablePeerAccess(%d) from device %d: not "
                "another device", peer, d->ordinal);
  Lock lock(sim().mutex);
  if (!d->peers.insert(peer).second)
    return fail(cudaErrorPeerAccessAlreadyEnabled, "peer access from device %d to %d is "
                "enabled already", d->ordinal, peer);
  return cudaSuccess;
}

Counters counters() {
  Lock lock(sim().mutex);
  return sim().counters;
}

}  // namespace simdev
