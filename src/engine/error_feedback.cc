/* Error feedback's residual store (docs/allreduce.md, "Error feedback"):
 * one float32 residual per (communicator, sendbuff, count, datatype), made
 * zeroed on a buffer's first call, and the C API that resets and reads
 * them. The arithmetic lives in the engine's primitives (segment.cc). */
#include <string.h>

#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/compute.h"
#include "engine/report.h"

namespace qnccl {

ncclResult_t Residual::make(size_t count, int device, bool capturing, DeviceWorkspace* ws,
                            std::unique_ptr<Residual>* out) {
  float* values = nullptr;
  if (device < 0) {
    values = new (std::nothrow) float[count]();
    if (values == nullptr)
      return set_error(ncclSystemError,
                       "error feedback: cannot allocate the %zu-byte residual of a %zu-value "
                       "buffer in host memory; free memory, use fewer buffers, or turn error "
                       "feedback off",
                       count * sizeof(float), count);
  } else {
#ifdef QNCCL_WITH_CUDA
    QNCCL_CHECK(alloc_device_residual(*ws, count, capturing, &values));
#else
    (void)capturing;
    (void)ws;
    return set_error(ncclInternalError, "error feedback: a device residual in a build without CUDA");
#endif
  }
  out->reset(new Residual(values, count, device, ws));
  return ncclSuccess;
}

Residual::~Residual() {
  if (device_ < 0) {
    delete[] values_;
    return;
  }
#ifdef QNCCL_WITH_CUDA
  release_device_memory(*ws_, values_);
#endif
}

Residual* find_residual(CommState& state, const void* sendbuff, size_t count,
                        ncclDataType_t type, int device) {
  auto it = state.residuals.find(ResidualKey{sendbuff, count, type});
  if (it == state.residuals.end() || it->second->device() != device) return nullptr;
  return it->second.get();
}

ncclResult_t residual_for_call(ncclComm_t comm, CommState& state, const void* sendbuff,
                               size_t count, ncclDataType_t type, int device, bool capturing,
                               float** values) {
  if (Residual* found = find_residual(state, sendbuff, count, type, device)) {
    *values = found->values();
    return ncclSuccess;
  }
  std::unique_ptr<Residual> made;
  QNCCL_CHECK(Residual::make(count, device, capturing, &state.device, &made));
  *values = made->values();
  std::unique_ptr<Residual>& slot = state.residuals[ResidualKey{sendbuff, count, type}];
  if (slot != nullptr) {  // a stale one, on another device
    state.stats.residualBuffers--;
    state.stats.residualBytes -= slot->bytes();
  }
  state.stats.residualBuffers++;
  state.stats.residualBytes += made->bytes();
  slot = std::move(made);
  const qncclStats_t stats = comm_stats(state);
  info(comm, state.debug,
       ": error feedback: new residual for buffer %p (%zu values, %zu bytes of %s memory); "
       "%llu buffers, %llu bytes in all",
       sendbuff, count, count * sizeof(float), device < 0 ? "host" : "device",
       (unsigned long long)stats.residualBuffers, (unsigned long long)stats.residualBytes);
  return ncclSuccess;
}

ncclResult_t reset_error_feedback(const char* fn, ncclComm_t comm) {
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(checked_comm_state(fn, comm, &state));
  clear_residuals(*state);
  return ncclSuccess;
}

ncclResult_t get_residual(const char* fn, ncclComm_t comm, const void* sendbuff, size_t count,
                          ncclDataType_t datatype, float* residual) {
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(checked_comm_state(fn, comm, &state));
  if (residual == nullptr)
    return set_error(ncclInvalidArgument, "%s: residual is NULL; pass %zu floats of host memory",
                     fn, count);
  auto it = state->residuals.find(ResidualKey{sendbuff, count, datatype});
  if (it == state->residuals.end())
    return set_error(ncclInvalidArgument,
                     "%s: this communicator holds no residual for buffer %p with count %zu and "
                     "datatype %d; residuals exist for the buffers that allreduces with error "
                     "feedback have used since the last reset (qncclCommGetStats counts them)",
                     fn, sendbuff, count, (int)datatype);
  const Residual& r = *it->second;
  if (r.device() < 0) {
    memcpy(residual, r.values(), r.bytes());
    return ncclSuccess;
  }
#ifdef QNCCL_WITH_CUDA
  return copy_after_calls(state->device, residual, r.values(), r.bytes());
#else
  return ncclInternalError;  // no device residuals without CUDA
#endif
}

}  // namespace qnccl
