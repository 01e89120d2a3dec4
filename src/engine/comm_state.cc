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
  std::unordered_map<ncclComm_t, std::shared_ptr<CommState>> comms;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

ncclResult_t comm_state(ncclComm_t comm, const qncclEnvConfig_t* config,
                        std::shared_ptr<CommState>* state) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::shared_ptr<CommState>& slot = r.comms[comm];
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
  *state = slot;
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

std::shared_ptr<CommState> existing_comm_state(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.comms.find(comm);
  return it == r.comms.end() ? nullptr : it->second;
}

void forget_comm(ncclComm_t comm) {
  std::shared_ptr<CommState> state;  // the last reference may go here: outside the lock
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.comms.find(comm);
  if (it == r.comms.end()) return;
  state = std::move(it->second);
  r.comms.erase(it);
}

CommState::~CommState() {
#ifdef QNCCL_WITH_CUDA
  release_device_workspace(device);
#endif
}

}  // namespace qnccl
