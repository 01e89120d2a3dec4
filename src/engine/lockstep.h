/* Lanes that progress together: each runs on its own thread, and each of
 * its transport steps waits until every lane still running has reached its
 * next step; the driving thread then moves all those steps' bytes in one
 * real group (transfer()), in lane order. Lanes (calls on several
 * communicators of one process, or segments of one call: engine/pipeline.cc)
 * thereby never wait for each other: step k of every lane is in round k,
 * and step k of a lane only meets step k of its peers' same lane. A lockstep
 * can run inside a lane of another: each of its rounds is then one step of
 * that lane. */
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
  /* `lanes` lanes; `outer`: the lockstep whose lane `outer_lane` this one's
   * rounds are steps of, or nullptr. */
  explicit Lockstep(size_t lanes, Lockstep* outer = nullptr, size_t outer_lane = 0)
      : running_(lanes), outer_(outer), outer_lane_(outer_lane) {}

  /* From lane `lane`'s thread: its step, moved with the other lanes' next
   * steps; the post's result, its failure in this thread's last error. */
  ncclResult_t step(size_t lane, Post& post);
  /* The same for a step of several posts (an inner lockstep's round): their
   * results are in the posts. */
  void step(size_t lane, Post* const* posts, size_t n);
  /* From the driving thread: runs lane(j) for every lane on a thread of its
   * own and moves the steps, round by round, until every lane has returned.
   * A lane whose thread cannot start gets not_started(j, why) instead and
   * takes no steps (rank-local, like a failed allocation: its peers wait for
   * its steps until the communicator is aborted). */
  void run(const std::function<void(size_t)>& lane,
           const std::function<void(size_t, const char*)>& not_started);

 private:
  void finished();  // a lane has no more steps
  void drive();
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t running_;
  size_t arrived_ = 0;  // lanes that posted the round being gathered
  std::vector<std::pair<size_t, Post*>> posted_;  // (lane, post) of that round
  uint64_t round_ = 0;  // rounds moved so far
  Lockstep* outer_;
  size_t outer_lane_;
};

}  // namespace qnccl

#endif
