#include "engine/comm_state.h"

#include <memory>
#include <mutex>

#include "common/error.h"
#include "config/config.h"

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

void forget_comm(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.comms.erase(comm);
}

}  // namespace qnccl
