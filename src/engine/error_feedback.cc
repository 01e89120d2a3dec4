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
  if (captured)
    ws_->retired.push_back(values_);  // freed with the workspace
  else
    release_device_memory(*ws_, values_);
#endif
}

namespace {

/* Makes room for `bytes` more under QNCCL_ERROR_FEEDBACK_MAX_BYTES: drops the
 * least recently used residuals (their buffers' next calls start from zero),
 * reporting the first drop as a warning and each at QNCCL_DEBUG=INFO. */
void make_room(ncclComm_t comm, CommState& state, size_t bytes) {
  while (!state.residuals.empty() && state.stats.residualBytes + bytes > state.residual_max_bytes) {
    auto oldest = state.residuals.begin();
    for (auto it = state.residuals.begin(); it != state.residuals.end(); ++it)
      if (it->second->last_use < oldest->second->last_use) oldest = it;
    const Residual& r = *oldest->second;
    const unsigned long long idle = state.residual_uses - r.last_use;
    if (!state.warned_residual_max) {
      state.warned_residual_max = true;
      warn("comm %p: error feedback's residuals would exceed QNCCL_ERROR_FEEDBACK_MAX_BYTES=%zu "
           "bytes: the least recently used are dropped (first: buffer %p, %zu values, unused "
           "for %llu calls), and their buffers' next calls start from zero. Residuals belong "
           "to buffer addresses: buffers that move (a caching allocator's) leave theirs behind. "
           "If this job's buffers stay in place and need more, raise the limit (warned once "
           "per communicator)",
           (void*)comm, state.residual_max_bytes, oldest->first.buffer, r.count(), idle);
    }
    info(comm, state.debug, ": error feedback: dropped the residual of buffer %p (%zu values, "
         "unused for %llu calls) to stay within QNCCL_ERROR_FEEDBACK_MAX_BYTES",
         oldest->first.buffer, r.count(), idle);
    state.stats.residualBuffers--;
    state.stats.residualBytes -= r.bytes();
    state.residuals.erase(oldest);
  }
}

}  // namespace

Residual* find_residual(CommState& state, const void* sendbuff, size_t count,
                        ncclDataType_t type, int device) {
  auto it = state.residuals.find(ResidualKey{sendbuff, count, type});
  if (it == state.residuals.end() || it->second->device() != device) return nullptr;
  return it->second.get();
}

ncclResult_t residual_for_call(ncclComm_t comm, CommState& state, const void* sendbuff,
                               size_t count, ncclDataType_t type, int device, bool capturing,
                               float** values) {
  const uint64_t use = ++state.residual_uses;
  if (Residual* found = find_residual(state, sendbuff, count, type, device)) {
    found->last_use = use;
    found->captured = found->captured || capturing;
    *values = found->values();
    return ncclSuccess;
  }
  auto stale = state.residuals.find(ResidualKey{sendbuff, count, type});
  if (stale != state.residuals.end()) {  // on another device: replaced
    state.stats.residualBuffers--;
    state.stats.residualBytes -= stale->second->bytes();
    state.residuals.erase(stale);
  }
  make_room(comm, state, count * sizeof(float));
  std::unique_ptr<Residual> made;
  QNCCL_CHECK(Residual::make(count, device, capturing, &state.device, &made));
  *values = made->values();
  made->last_use = use;
  made->captured = capturing;
  std::unique_ptr<Residual>& slot = state.residuals[ResidualKey{sendbuff, count, type}];
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
