/* Helpers the core's files share; each expects Sim::mutex held (the
 * `lock` argument says so where it waits). */
#ifndef SIMDEV_CORE_INTERNAL_H_
#define SIMDEV_CORE_INTERNAL_H_

#include <mutex>
#include <string>
#include <vector>

#include "core/objects.h"

namespace simdev {

using Lock = std::unique_lock<std::mutex>;

double now_ms();
/* A completion that is already done, stamped now. */
Done done_now();

/* Queues `work` on s after `deps` (and s's implicit legacy-stream
 * dependencies), or adds it to s's capture. */
cudaError_t issue_locked(Stream* s, Work work, std::vector<Done> deps = {});
/* The host waits for `done`: it runs (lazy schedule) and is waited for;
 * its error, or the device's sticky one. */
cudaError_t wait_locked(Lock& lock, const Done& done, const char* what);
/* Marks `done`'s operation (and what it waits for) as waited for. */
void force_locked(const Done& done);

/* A capture stops being usable: every later call on its streams fails and
 * its end returns no graph. */
void invalidate_locked(Capture* c, const std::string& why);
/* The capture of d's blocking streams, if one of them captures (the legacy
 * stream cannot be used then). */
Capture* blocking_capture_locked(Device* d);
/* Adds a node to s's capture after s's tail; s's tail becomes it. */
Node* add_node_locked(Stream* s, Node::Kind kind, Work work, Event* event = nullptr);
/* Runs a graph launch's steps (on a stream's worker, without the mutex). */
cudaError_t run_exec(Exec& x);

/* The handle checks, under the mutex. */
bool live_stream_locked(Stream* s);
bool live_event_locked(Event* e);

/* Sets d's sticky error after device work failed (reported already). */
void fault_locked(Device* d, cudaError_t error);

}  // namespace simdev

#endif
