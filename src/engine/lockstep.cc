/* run_collectives: a group's deferred quantized calls, those of different
 * communicators in lock-step (engine/lockstep.h). */
#include "engine/lockstep.h"

#include <pthread.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

#include "common/error.h"
#include "engine/comm_state.h"

namespace qnccl {
namespace {

/* The threads lanes run on, kept for the next call: a call of two lanes
 * used to start two threads and join them, every call. A lane takes an idle
 * thread, or a new one when none is idle (a lockstep inside a lane takes
 * more while its outer lane waits), named "qnccl-lane". The pool is never
 * destroyed and its threads are detached: at process exit they wait on
 * their condition variable and end with the process. */
class LanePool {
 public:
  static LanePool& get() {
    static LanePool* pool = [] {
      LanePool* made = new LanePool();
      // A fork while another thread holds the pool's mutex would leave the
      // child's copy locked for good: the fork waits for it, and the child
      // starts with no threads (its parent's are not in it).
      pthread_atfork([] { get().mutex_.lock(); }, [] { get().mutex_.unlock(); },
                     [] {
                       // (the parent's workers are left as they are: their
                       // condition variables have waiters the child lacks)
                       LanePool& p = get();
                       new std::vector<std::shared_ptr<Worker>>(std::move(p.workers_));
                       p.workers_.clear();
                       p.mutex_.unlock();
                     });
      return made;
    }();
    return *pool;
  }

  /* Runs `task` on a pooled thread, then `done` once that thread is idle
   * again (so a call that waits for every `done` finds its threads idle for
   * the next); false (with `why`) when no thread could be started for it. */
  bool start(std::function<void()> task, std::function<void()> done, std::string* why) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (const std::shared_ptr<Worker>& w : workers_) {
      if (w->busy) continue;
      w->busy = true;
      w->task = std::move(task);
      w->done = std::move(done);
      w->wake.notify_one();
      return true;
    }
    auto worker = std::make_shared<Worker>();
    worker->busy = true;
    worker->task = std::move(task);
    worker->done = std::move(done);
    try {
      std::thread thread([this, worker] { serve(*worker); });
      pthread_setname_np(thread.native_handle(), "qnccl-lane");
      thread.detach();
    } catch (const std::system_error& e) {
      *why = e.what();
      return false;
    }
    workers_.push_back(worker);  // (its thread waits for `mutex_`, held here)
    return true;
  }

 private:
  struct Worker {
    bool busy = false;           // given a task whose `done` has not run yet
    std::function<void()> task;  // the task given, until its thread takes it
    std::function<void()> done;
    std::condition_variable wake;
  };

  void serve(Worker& w) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      w.wake.wait(lock, [&] { return static_cast<bool>(w.task); });
      std::function<void()> task = std::move(w.task), done = std::move(w.done);
      w.task = nullptr;
      lock.unlock();
      task();
      task = nullptr;  // what it holds goes before the thread counts as idle
      lock.lock();
      w.busy = false;
      lock.unlock();
      done();
      done = nullptr;
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::vector<std::shared_ptr<Worker>> workers_;
};

}  // namespace

ncclResult_t Lockstep::step(size_t lane, Post& post) {
  Post* one = &post;
  step(lane, &one, 1);
  if (post.result == ncclSuccess) return ncclSuccess;
  return set_error(post.result, "%s", post.message.c_str());  // into this thread's last error
}

void Lockstep::step(size_t lane, Post* const* posts, size_t n) {
  std::unique_lock<std::mutex> lock(mutex_);
  Slot& slot = slots_[lane];
  slot.posts.assign(posts, posts + n);
  slot.posted = true;
  arrived_.notify_one();
  slot.moved.wait(lock, [&] { return !slot.posted; });
}

void Lockstep::finished(size_t lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  slots_[lane].finished = true;
  running_--;
  arrived_.notify_one();
}

void Lockstep::run(const std::function<void(size_t)>& lane,
                   const std::function<void(size_t, const char*)>& not_started) {
  // Each lane's thread counts itself out here once it is idle again, after
  // its last use of this lockstep: run() returns only then (as joins did),
  // and the next call finds the same threads free.
  struct Done {
    std::mutex mutex;
    std::condition_variable all;
    size_t left = 0;
  };
  auto done = std::make_shared<Done>();
  done->left = slots_.size();
  for (size_t j = 0; j < slots_.size(); j++) {
    std::string why;
    const bool started = LanePool::get().start(
        [this, &lane, j] {
          lane(j);
          finished(j);
        },
        [done] {
          std::lock_guard<std::mutex> lock(done->mutex);
          if (--done->left == 0) done->all.notify_one();
        },
        &why);
    if (!started) {
      not_started(j, why.c_str());
      finished(j);
      std::lock_guard<std::mutex> lock(done->mutex);
      done->left--;
    }
  }
  drive();
  std::unique_lock<std::mutex> lock(done->mutex);
  done->all.wait(lock, [&] { return done->left == 0; });
}

void Lockstep::move(std::vector<Post*>& posts) {
  if (outer_ != nullptr)
    outer_->step(outer_lane_, posts.data(), posts.size());
  else
    transfer(posts.data(), posts.size());
}

void Lockstep::drive() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&](size_t j) { return slots_[j].posted || slots_[j].finished; };
  std::vector<Post*> posts;
  for (;;) {
    if (order_ == kTogether) {
      // Every running lane's next step in one group, in lane order: steps of
      // several lanes on one communicator then pair up with their peers'.
      arrived_.wait(lock, [&] {
        for (size_t j = 0; j < slots_.size(); j++)
          if (!ready(j)) return false;
        return true;
      });
      if (running_ == 0) return;
      posts.clear();
      for (const Slot& slot : slots_)
        if (slot.posted) posts.insert(posts.end(), slot.posts.begin(), slot.posts.end());
      lock.unlock();
      move(posts);
      lock.lock();
      for (Slot& slot : slots_) {
        slot.posted = false;
        slot.moved.notify_one();
      }
    } else {
      // Lane 0's next step, then lane 1's, ...: each alone, each lane free
      // to compute again as soon as its own step has moved.
      for (size_t j = 0; j < slots_.size(); j++) {
        arrived_.wait(lock, [&] { return ready(j); });
        if (!slots_[j].posted) continue;
        posts = slots_[j].posts;
        lock.unlock();
        move(posts);
        lock.lock();
        slots_[j].posted = false;
        slots_[j].moved.notify_one();
      }
      if (running_ == 0) return;
    }
  }
}

namespace {

ncclResult_t run_call(const CollectiveCall& c, CommState& state, Lockstep* lockstep,
                      size_t lane) {
  switch (c.kind) {
    case qncclCollReduceScatter:
      return run_reduce_scatter(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.config, c.comm,
                                c.stream, state, lockstep, lane);
    case qncclCollAllGather:
      return run_allgather(c.sendbuff, c.recvbuff, c.count, c.type, c.config, c.comm, c.stream,
                           state, lockstep, lane);
    case qncclCollAllToAll:
      return run_alltoall(c.sendbuff, c.recvbuff, c.count, c.type, c.config, c.comm, c.stream,
                          state, lockstep, lane);
    case qncclCollSendRecv:
      return run_sendrecv(c.p2p, c.config, c.comm, c.stream, state, lockstep, lane);
    default:
      return run_allreduce(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.config, c.comm,
                           c.stream, state, lockstep, lane);
  }
}

/* The calls of one communicator, in issue order, and how they ended. */
struct Sequence {
  std::vector<const CollectiveCall*> calls;
  ncclResult_t result = ncclSuccess;
  bool in_progress = false;
  size_t failed_at = 0;  // issue index of the failed call
  std::string message;
};

/* Runs `seq` (as lane `lane` of `lockstep` unless it is null); stops at its
 * first failure. */
void run_sequence(Sequence& seq, const std::vector<CollectiveCall>& all, Lockstep* lockstep,
                  size_t lane) {
  for (const CollectiveCall* c : seq.calls) {
    std::shared_ptr<CommState> state;
    ncclResult_t res = comm_state(c->comm, nullptr, &state);
    if (res == ncclSuccess) res = run_call(*c, *state, lockstep, lane);
    if (res == ncclInProgress) {
      seq.in_progress = true;
    } else if (res != ncclSuccess) {
      seq.result = res;
      seq.failed_at = (size_t)(c - all.data());
      seq.message = last_error();
      break;
    }
  }
}

}  // namespace

ncclResult_t run_collectives(const std::vector<CollectiveCall>& calls) {
  std::vector<Sequence> seqs;
  std::map<ncclComm_t, size_t> of_comm;
  for (const CollectiveCall& c : calls) {
    auto it = of_comm.emplace(c.comm, seqs.size()).first;
    if (it->second == seqs.size()) seqs.emplace_back();
    seqs[it->second].calls.push_back(&c);
  }
  if (seqs.size() == 1) {
    run_sequence(seqs[0], calls, nullptr, 0);
  } else {
    Lockstep lockstep(seqs.size());
    lockstep.run([&](size_t i) { run_sequence(seqs[i], calls, &lockstep, i); },
                 [&](size_t i, const char* why) {
                   seqs[i].result = ncclSystemError;
                   seqs[i].failed_at = (size_t)(seqs[i].calls[0] - calls.data());
                   seqs[i].message = std::string("quantized call: could not start a "
                                                 "thread for the group's calls on another "
                                                 "communicator: ") + why;
                 });
  }
  const Sequence* failed = nullptr;
  bool in_progress = false;
  for (const Sequence& s : seqs) {
    in_progress = in_progress || s.in_progress;
    if (s.result != ncclSuccess && (failed == nullptr || s.failed_at < failed->failed_at))
      failed = &s;
  }
  if (failed != nullptr) return set_error(failed->result, "%s", failed->message.c_str());
  return in_progress ? ncclInProgress : ncclSuccess;
}

}  // namespace qnccl
