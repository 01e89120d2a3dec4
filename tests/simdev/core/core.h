/* What the simulated driver (driver.cc, libcuda.so.1) and runtime
 * (runtime.cc, libcudart.so.12) are built on: every operation once, with
 * CUDA's documented rules (the list is docs/simulated-gpu.md's). Each
 * function takes the simulator's mutex itself; handles are checked against
 * the live objects, so a destroyed or made-up handle is an error, not a
 * crash. Errors come back as cudaError_t with the thread's last message
 * saying what was wrong. */
#ifndef SIMDEV_CORE_CORE_H_
#define SIMDEV_CORE_CORE_H_

#include <stddef.h>
#include <stdint.h>

#include <driver_types.h>

#include "core/objects.h"

namespace simdev {

/* ---- devices and contexts (device.cc) ---- */

int device_count();
Device* device(int ordinal);  // nullptr for a bad ordinal
/* The device's name (cudaDeviceProp::name, cuDeviceGetName) into out[0, size), cut to fit
 * and NUL-terminated as the driver does. */
void device_name(const Device& d, char* out, size_t size);
/* The context current on this thread (a device's primary context), or
 * nullptr: a thread starts with none. */
Device* current_context();
void set_current_context(Device* d);  // nullptr: none
void push_context(Device* d);
Device* pop_context();
/* The runtime's device of this thread: the current context's, or device 0
 * made current (CUDA initializes a context on first need). */
Device* runtime_device();
/* Initializes d's primary context (its legacy stream); fails with d's
 * sticky error once device work has faulted on it. */
cudaError_t use_device(Device* d);
cudaError_t device_synchronize(Device* d);
cudaError_t enable_peer_access(Device* d, int peer);

/* ---- streams (scheduler.cc) ---- */

cudaError_t stream_create(Device* d, unsigned flags, int priority, Stream** out);
cudaError_t stream_destroy(Stream* s);
/* A stream handle as the API takes it: 0 and cudaStreamLegacy are `d`'s
 * legacy stream, cudaStreamPerThread this thread's stream on `d`. */
cudaError_t resolve_stream(void* handle, Device* d, Stream** out);
cudaError_t stream_synchronize(Stream* s);
cudaError_t stream_query(Stream* s);
/* Queues `work` on s (or adds it to s's capture). */
cudaError_t issue(Stream* s, Work work);
cudaError_t host_function(Stream* s, void (*fn)(void*), void* data);

/* ---- events (events.cc) ---- */

cudaError_t event_create(Device* d, unsigned flags, Event** out);
cudaError_t event_destroy(Event* e);
cudaError_t resolve_event(void* handle, Event** out);
cudaError_t event_record(Event* e, Stream* s, unsigned flags);
cudaError_t event_query(Event* e);
cudaError_t event_synchronize(Event* e);
cudaError_t event_elapsed(Event* start, Event* end, float* ms);
cudaError_t stream_wait_event(Stream* s, Event* e, unsigned flags);

/* ---- stream capture and graphs (graphs.cc) ---- */

cudaError_t capture_begin(Stream* s, cudaStreamCaptureMode mode);
cudaError_t capture_end(Stream* s, Graph** out);
/* `handle` as given, for the legacy stream's special answer. */
cudaError_t capture_info(Stream* s, cudaStreamCaptureStatus* status, unsigned long long* id,
                         Graph** graph, Node* const** deps, size_t* ndeps);
cudaError_t exchange_capture_mode(cudaStreamCaptureMode* mode);
/* Before a call CUDA counts as potentially unsafe during capture (memory
 * allocation and the like): fails it, invalidating the captures that
 * forbid it, under this thread's capture interaction mode. */
cudaError_t check_unsafe_call(const char* api);
cudaError_t graph_create(Device* d, Graph** out);
cudaError_t graph_destroy(Graph* g);
cudaError_t graph_instantiate(Graph* g, unsigned long long flags, Exec** out);
cudaError_t graph_launch(Exec* x, Stream* s);
cudaError_t exec_destroy(Exec* x);
cudaError_t user_object_create(void* ptr, void (*destroy)(void*), unsigned refs, unsigned flags,
                               UserObject** out);
cudaError_t user_object_retain(UserObject* o, unsigned count);
cudaError_t user_object_release(UserObject* o, unsigned count);
cudaError_t graph_retain_object(Graph* g, UserObject* o, unsigned count, unsigned flags);
cudaError_t graph_release_object(Graph* g, UserObject* o, unsigned count);

/* ---- memory, copies, memset (transfers.cc) ---- */

cudaError_t device_alloc(Device* d, size_t bytes, const char* api, void** out);
cudaError_t device_free(void* p, const char* api);
cudaError_t async_alloc(Stream* s, size_t bytes, void** out);
cudaError_t async_free(Stream* s, void* p);
cudaError_t host_alloc(size_t bytes, const char* api, void** out);
cudaError_t host_free(void* p);
cudaError_t host_register(void* p, size_t bytes);
cudaError_t host_unregister(void* p);
/* A copy of n bytes on s; `wait`: the host waits for it (the synchronous
 * cudaMemcpy, but device to device). */
cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, Stream* s, bool wait,
                 const char* api);
cudaError_t fill(void* dst, int value, size_t n, Stream* s, const char* api);
cudaError_t pointer_attributes(const void* p, cudaPointerAttributes* out);

/* ---- kernels (modules.cc) ---- */

cudaError_t module_load(Device* d, const void* image, Module** out);
cudaError_t module_unload(Module* m);
cudaError_t module_function(Module* m, const char* name, Function** out);
cudaError_t resolve_function(void* handle, Function** out);
cudaError_t launch(Function* f, simdev_dim3 grid, simdev_dim3 block, unsigned shared_bytes,
                   Stream* s, void** params, void** extra);

Counters counters();

/* A driver API function by its name without version suffix ("cuLaunchKernel"),
 * as cuGetProcAddress finds it; nullptr when the simulator has none. */
void* driver_symbol(const char* name);

}  // namespace simdev

#endif
