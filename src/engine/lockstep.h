/* Calls that progress together: each runs on its own thread, and each of
 * its transport steps waits until every call still running has reached its
 * next step; the driving thread then moves all those steps' bytes in one
 * real group (transfer()). Calls on several communicators of one process
 * thereby never wait for each other: step k of every call is in group k,
 * and step k of a call only meets step k of its peers. */
#ifndef QNCCL_ENGINE_LOCKSTEP_H_
#define QNCCL_ENGINE_LOCKSTEP_H_

#include <stddef.h>
#include <stdint.h>

#include <condition_variable>
#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace qnccl {

class Lockstep {
 public:
  explicit Lockstep(size_t calls) : running_(calls) {}

  /* From a call's thread: its step, moved with the other calls' next steps. */
  ncclResult_t step(Post& post);
  /* From a call's thread: it has no more steps. */
  void finished();
  /* From the driving thread: moves the steps, round by round, until every
   * call has finished. */
  void drive();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t running_;
  std::vector<Post*> posted_;  // of the round being gathered
  uint64_t round_ = 0;         // rounds moved so far
};

}  // namespace qnccl

#endif
