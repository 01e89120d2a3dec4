#include "engine/comm_state.h"

#include <memory>

#include "common/error.h"
#include "common/registry.h"
#include "config/config.h"
#include "engine/compute.h"

namespace qnccl {
namespace {

CommRegistry<CommState>& registry() {
  static CommRegistry<CommState> r;
  return r;
}

}  // namespace

ncclResult_t comm_state(ncclComm_t comm, const qncclEnvConfig_t* config,
                        std::shared_ptr<CommState>* state) {
  return registry().get(
      comm,
      [config](CommState& made) {
        qncclEnvConfig_t c;
        if (config != nullptr) {
          c = *config;
        } else if (ncclResult_t res = config_from_env(&c); res != ncclSuccess) {
          return res;
        }
        made.debug = c.debug;
        made.residual_max_bytes = c.errorFeedbackMaxBytes;
        return ncclSuccess;
      },
      state);
}

qncclStats_t comm_stats(const CommState& state) {
  const CommState::Counters& c = state.stats;
  return qncclStats_t{c.callsCompressed, c.callsPassedThrough, c.bytesIn,      c.bytesOnWire,
                      c.residualBuffers, c.residualBytes,      c.computeSteps, c.groups};
}

void clear_residuals(CommState& state) {
  state.residuals.clear();
  state.stats.residualBuffers = 0;
  state.stats.residualBytes = 0;
}

void reset_all_error_feedback() {
  registry().for_each([](CommState& s) { clear_residuals(s); });
}

namespace {
std::atomic<bool> failed_anywhere{false};
}  // namespace

void note_comm_failed() { failed_anywhere.store(true, std::memory_order_release); }

bool any_comm_failed() { return failed_anywhere.load(std::memory_order_acquire); }

std::shared_ptr<CommState> existing_comm_state(ncclComm_t comm) { return registry().find(comm); }

void forget_comm(ncclComm_t comm) { registry().take(comm); }

CommState::~CommState() {
  residuals.clear();  // device ones are freed on the workspace's stream: before it goes
#ifdef QNCCL_WITH_CUDA
  release_device_workspace(device);
#endif
}

ncclResult_t checked_comm_state(const char* fn, ncclComm_t comm,
                               std::shared_ptr<CommState>* state) {
  if (comm == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  return comm_state(comm, nullptr, state);
}

ncclResult_t get_call_counts(const char* fn, ncclComm_t comm, uint64_t* calls,
                             uint64_t* p2p_calls) {
  if (calls == nullptr || p2p_calls == nullptr)
    return set_error(ncclInvalidArgument, "%s: %s is NULL; pass a uint64_t*", fn,
                     calls == nullptr ? "calls" : "p2pCalls");
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(checked_comm_state(fn, comm, &state));
  *calls = state->calls;
  *p2p_calls = state->p2p_calls;
#ifdef QNCCL_WITH_CUDA
  // The device counters are the truth where they exist: each replay of a
  // captured call takes a number there, and none on the host.
  if (state->device.calls != nullptr)
    QNCCL_CHECK(read_device_calls(state->device, calls, p2p_calls));
#endif
  return ncclSuccess;
}

ncclResult_t set_call_counts(const char* fn, ncclComm_t comm, uint64_t calls, uint64_t p2p_calls) {
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(checked_comm_state(fn, comm, &state));
#ifdef QNCCL_WITH_CUDA
  if (state->device.calls != nullptr)
    QNCCL_CHECK(write_device_calls(state->device, calls, p2p_calls));
#endif
  state->calls = calls;
  state->p2p_calls = p2p_calls;
  return ncclSuccess;
}

}  // namespace qnccl
