/* Errors of the simulated GPU. Calls return cudaError_t values (the driver
 * API's CUresult values are the same numbers for every error the simulator
 * raises). Each failure also leaves a sentence saying what was wrong in the
 * calling thread's last message (simdevGetLastMessage); faults of device
 * work (a kernel's, a copy's) and calls the simulator does not implement are
 * printed to stderr as well, since no caller may be looking. */
#ifndef SIMDEV_CORE_ERRORS_H_
#define SIMDEV_CORE_ERRORS_H_

#include <driver_types.h>

#define SIMDEV_CHECK(call)               \
  do {                                   \
    const cudaError_t e_ = (call);       \
    if (e_ != cudaSuccess) return e_;    \
  } while (0)

namespace simdev {

/* Records `fmt` as this thread's last message and returns `code`. */
cudaError_t fail(cudaError_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* fail(), and the message printed to stderr. */
cudaError_t fail_loudly(cudaError_t code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints "simdev: <message>" to stderr. */
void report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* This thread's last message ("" after a call that succeeded is not
 * guaranteed: messages are only written on failure). */
const char* last_message();

/* The name ("cudaErrorInvalidValue") and description of an error code. */
const char* error_name(int error);
const char* error_string(int error);

/* A CUDA call a host function made (CUDA forbids it): set while one runs. */
bool in_host_function();
void set_in_host_function(bool in);

}  // namespace simdev

#endif
