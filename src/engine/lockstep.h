/* Lanes that share one communicator's (or one group's) transport: each runs
 * on a thread of its own (from a pool kept across calls: lockstep.cc), and
 * its transport steps are moved in an order that
 * depends only on the lanes' step counts, the same on every rank, so a step
 * of a lane only ever meets the same step of its peers' same lane. Two
 * orders:
 * - kTogether: each step waits until every lane still running has reached
 *   its next step; the driving thread then moves all of them in one real
 *   group (transfer()), in lane order. Calls on several communicators of one
 *   process (run_collectives) and a hierarchical call's lanes (whose steps
 *   use different links at once) run so.
 * - kInTurn: step k of lane 0, then step k of lane 1, ..., each its own
 *   group, and a lane goes on as soon as its own step has moved: while one
 *   lane's bytes are in flight the others compute (the overlap of "Pipelined
 *   segments", docs/allreduce.md).
 * A lockstep can run inside a lane of another: each of its rounds (kTogether)
 * or turns (kInTurn) is then one step of that lane. */
#ifndef QNCCL_ENGINE_LOCKSTEP_H_
#define QNCCL_ENGINE_LOCKSTEP_H_

#include <stddef.h>
#include <stdint.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace qnccl {

class Lockstep {
 public:
  enum Order { kTogether, kInTurn };
  /* `lanes` lanes; `outer`: the lockstep whose lane `outer_lane` this one's
   * rounds are steps of, or nullptr. */
  explicit Lockstep(size_t lanes, Order order = kTogether, Lockstep* outer = nullptr,
                    size_t outer_lane = 0)
      : slots_(lanes), running_(lanes), order_(order), outer_(outer), outer_lane_(outer_lane) {}

  /* From lane `lane`'s thread: its step, moved in the lockstep's order; the
   * post's result, its failure in this thread's last error. */
  ncclResult_t step(size_t lane, Post& post);
  /* The same for a step of several posts (an inner lockstep's round): their
   * results are in the posts. */
  void step(size_t lane, Post* const* posts, size_t n);
  /* From the driving thread: runs lane(j) for every lane on a thread of its
   * own and moves the steps until every lane has returned. A lane whose
   * thread cannot start gets not_started(j, why) instead and takes no steps
   * (rank-local, like a failed allocation: its peers wait for its steps
   * until the communicator is aborted). */
  void run(const std::function<void(size_t)>& lane,
           const std::function<void(size_t, const char*)>& not_started);

 private:
  /* A lane's next step, once posted, until it has moved. */
  struct Slot {
    std::vector<Post*> posts;
    bool posted = false;
    bool finished = false;  // the lane has no more steps
    std::condition_variable moved;  // wakes the lane alone
  };
  void finished(size_t lane);
  void drive();
  void move(std::vector<Post*>& posts);  // one round or turn: transfer() or the outer's step
  std::mutex mutex_;
  std::condition_variable arrived_;  // wakes the driving thread
  std::vector<Slot> slots_;
  size_t running_;
  Order order_;
  Lockstep* outer_;
  size_t outer_lane_;
};

}  // namespace qnccl

#endif
