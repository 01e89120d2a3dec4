/* Per-communicator state of one layer, by communicator handle: shared
 * references, so a call holds its state while it runs and an abort or
 * destroy from another thread (PyTorch's watchdog) never frees it under the
 * call. Used by the engine (engine/comm_state.h) and the interposer
 * (shim/shim.h), each for its own state. */
#ifndef QNCCL_COMMON_REGISTRY_H_
#define QNCCL_COMMON_REGISTRY_H_

#include <memory>
#include <mutex>
#include <unordered_map>

#include "nccl_abi.h"

namespace qnccl {

template <class State>
class CommRegistry {
 public:
  /* The state of `comm`, made by `make(State&)` (which may fail: nothing is
   * kept then) on first use. */
  template <class Make>
  ncclResult_t get(ncclComm_t comm, Make make, std::shared_ptr<State>* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = states_.find(comm);
    if (it == states_.end()) {
      std::shared_ptr<State> made(new State());
      if (const ncclResult_t res = make(*made); res != ncclSuccess) return res;
      it = states_.emplace(comm, std::move(made)).first;
    }
    *out = it->second;
    return ncclSuccess;
  }

  /* The state of `comm` if it has one (nothing is made). */
  std::shared_ptr<State> find(ncclComm_t comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = states_.find(comm);
    return it == states_.end() ? nullptr : it->second;
  }

  /* Removes the state of `comm` and hands it over: the caller drops the
   * reference outside the registry's lock (the last one may free device
   * memory). */
  std::shared_ptr<State> take(ncclComm_t comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = states_.find(comm);
    if (it == states_.end()) return nullptr;
    std::shared_ptr<State> state = std::move(it->second);
    states_.erase(it);
    return state;
  }

  /* `f(State&)` on every state, under the registry's lock. */
  template <class F>
  void for_each(F f) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : states_) f(*entry.second);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<ncclComm_t, std::shared_ptr<State>> states_;
};

}  // namespace qnccl

#endif
