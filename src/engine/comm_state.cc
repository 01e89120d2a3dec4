#include "engine/comm_state.h"

#include <mutex>
#include <unordered_map>

namespace qnccl {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<ncclComm_t, uint64_t> calls;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

uint64_t next_call(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.calls[comm]++;
}

void forget_comm(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.calls.erase(comm);
}

}  // namespace qnccl
