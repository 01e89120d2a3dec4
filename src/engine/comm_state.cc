#include "engine/comm_state.h"

#include <memory>
#include <mutex>

#include "common/error.h"
#include "config/config.h"
#include "engine/compute.h"

namespace qnccl {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<ncclComm_t, std::unique_ptr<CommState>> comms;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

ncclResult_t comm_state(ncclComm_t comm, const qncclEnvConfig_t* config, CommState** state) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::unique_ptr<CommState>& slot = r.comms[comm];
  if (!slot) {
    qncclEnvConfig_t c;
    if (config != nullptr) {
      c = *config;
    } else if (ncclResult_t res = config_from_env(&c); res != ncclSuccess) {
      r.comms.erase(comm);
      return res;
    }
    slot.reset(new CommState());
    slot->config = c;
  }
  *state = slot.get();
  return ncclSuccess;
}

qncclStats_t comm_stats(const CommState& state) {
  qncclStats_t stats = state.stats;
  stats.residualBuffers = state.residuals.size();
  for (const auto& entry : state.residuals) stats.residualBytes += entry.second->bytes();
  return stats;
}

void reset_all_error_feedback() {
  std::vector<ResidualStore> dropped;  // freed after the lock: cudaFree waits for the device
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& entry : r.comms) dropped.push_back(std::move(entry.second->residuals));
  for (auto& entry : r.comms) entry.second->residuals.clear();
}

void forget_comm(ncclComm_t comm) {
  std::unique_ptr<CommState> state;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.comms.find(comm);
    if (it == r.comms.end()) return;
    state = std::move(it->second);
    r.comms.erase(it);
  }
#ifdef QNCCL_WITH_CUDA
  release_device_workspace(state->device);  // outside the lock: it may wait for the device
#endif
}

}  // namespace qnccl
