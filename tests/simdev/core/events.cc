/* Events. A record queues a marker on the stream; the event then stands for
 * the completion of everything queued on the stream before it, and a later
 * record replaces that (a wait already issued keeps what it saw). Inside a
 * capture a record makes the event a captured one (it stands for the
 * stream's capture tail; a stream that waits on it joins the capture), and
 * an external record or wait becomes a graph node. */
#include <algorithm>

#include "core/core.h"
#include "core/errors.h"
#include "core/internal.h"

namespace simdev {
namespace {

/* The capture `e` was last recorded in, if it is still in progress. */
Capture* capture_of(const Event* e) {
  auto it = sim().captures.find(e->capture_id);
  return it == sim().captures.end() ? nullptr : it->second;
}

/* Querying or synchronizing an event last recorded inside a capture is
 * not allowed (it stands for graph nodes, not device work). */
cudaError_t check_not_captured_locked(Event* e, const char* api) {
  if (e->capture_id == 0) return cudaSuccess;
  if (Capture* c = capture_of(e)) invalidate_locked(c, std::string(api) + " on a captured event");
  return fail(cudaErrorCapturedEvent, "%s: the event was last recorded in a stream capture", api);
}

}  // namespace

bool live_event_locked(Event* e) { return sim().events.count(e) != 0; }

cudaError_t event_create(Device* d, unsigned flags, Event** out) {
  const unsigned allowed = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (flags & ~allowed)
    return fail(cudaErrorInvalidValue, "event flags %#x; allowed: cudaEventDefault, "
                "cudaEventBlockingSync, cudaEventDisableTiming, cudaEventInterprocess", flags);
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
    return fail(cudaErrorInvalidValue, "cudaEventInterprocess needs cudaEventDisableTiming");
  SIMDEV_CHECK(use_device(d));
  Lock lock(sim().mutex);
  Event* e = new Event();
  e->device = d;
  e->flags = flags;
  sim().events.insert(e);
  *out = e;
  return cudaSuccess;
}

cudaError_t resolve_event(void* handle, Event** out) {
  Event* e = static_cast<Event*>(handle);
  Lock lock(sim().mutex);
  if (!live_event_locked(e))
    return fail(cudaErrorInvalidResourceHandle, "event %p is not a live event (destroyed, or "
                "never created)", handle);
  *out = e;
  return cudaSuccess;
}

cudaError_t event_destroy(Event* e) {
  Lock lock(sim().mutex);
  if (!live_event_locked(e))
    return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event",
                (void*)e);
  sim().events.erase(e);  // legal with work pending: waits already issued keep their completion
  delete e;
  return cudaSuccess;
}

cudaError_t event_record(Event* e, Stream* s, unsigned flags) {
  if (flags & ~(unsigned)cudaEventRecordExternal)
    return fail(cudaErrorInvalidValue, "event record flags %#x; allowed: cudaEventRecordDefault, "
                "cudaEventRecordExternal", flags);
  Lock lock(sim().mutex);
  if (e->device != s->device)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: the event is device %d's and "
                "the stream device %d's", e->device->ordinal, s->device->ordinal);
  if (s->capture != nullptr) {
    if (s->capture->invalidated)
      return fail(cudaErrorStreamCaptureInvalidated, "cudaEventRecord: the stream's capture "
                  "was invalidated earlier (%s)", s->capture->why.c_str());
    if (flags & cudaEventRecordExternal) {
      add_node_locked(s, Node::kEventRecord, Work(), e);
    } else {
      e->capture_id = s->capture->id;
      e->captured = s->tail;
    }
    return cudaSuccess;
  }
  Work marker;
  marker.what = "event record";
  SIMDEV_CHECK(issue_locked(s, std::move(marker)));
  e->snapshot = s->last;
  e->capture_id = 0;
  e->captured.clear();
  return cudaSuccess;
}

cudaError_t event_query(Event* e) {
  Lock lock(sim().mutex);
  SIMDEV_CHECK(check_not_captured_locked(e, "cudaEventQuery"));
  if (!e->snapshot) return cudaSuccess;  // never recorded: no work
  force_locked(e->snapshot);
  if (!e->snapshot->done) return cudaErrorNotReady;
  return e->snapshot->error;
}

cudaError_t event_synchronize(Event* e) {
  Lock lock(sim().mutex);
  SIMDEV_CHECK(check_not_captured_locked(e, "cudaEventSynchronize"));
  return wait_locked(lock, e->snapshot, "cudaEventSynchronize");
}

cudaError_t event_elapsed(Event* start, Event* end, float* ms) {
  Lock lock(sim().mutex);
  SIMDEV_CHECK(check_not_captured_locked(start, "cudaEventElapsedTime"));
  SIMDEV_CHECK(check_not_captured_locked(end, "cudaEventElapsedTime"));
  if (!start->snapshot || !end->snapshot)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never "
                "recorded");
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created "
                "with cudaEventDisableTiming");
  if (start->device != end->device)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: the events are of "
                "devices %d and %d", start->device->ordinal, end->device->ordinal);
  if (!start->snapshot->done || !end->snapshot->done) return cudaErrorNotReady;
  *ms = (float)(end->snapshot->time_ms - start->snapshot->time_ms);
  return cudaSuccess;
}

cudaError_t stream_wait_event(Stream* s, Event* e, unsigned flags) {
  if (flags & ~(unsigned)cudaEventWaitExternal)
    return fail(cudaErrorInvalidValue, "cudaStreamWaitEvent flags %#x; allowed: "
                "cudaEventWaitDefault, cudaEventWaitExternal", flags);
  Lock lock(sim().mutex);
  if (e->capture_id != 0) {
    Capture* c = capture_of(e);
    if (c == nullptr)
      return fail(cudaErrorCapturedEvent, "cudaStreamWaitEvent: the event was last recorded in "
                  "a capture that has ended");
    if (s->capture == nullptr) {  // s joins the capture: a fork
      s->capture = c;
      s->tail = e->captured;
      c->members.insert(s);
      return cudaSuccess;
    }
    if (s->capture != c) {
      invalidate_locked(c, "a stream of another capture waited on one of its events");
      invalidate_locked(s->capture, "it waited on an event of another capture");
      return fail(cudaErrorStreamCaptureMerge, "cudaStreamWaitEvent: the stream and the event "
                  "belong to two different captures");
    }
    for (Node* n : e->captured)
      if (std::find(s->tail.begin(), s->tail.end(), n) == s->tail.end()) s->tail.push_back(n);
    return cudaSuccess;
  }
  if (s->capture != nullptr) {
    if (s->capture->invalidated)
      return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamWaitEvent: the stream's capture "
                  "was invalidated earlier (%s)", s->capture->why.c_str());
    if (flags & cudaEventWaitExternal) {
      add_node_locked(s, Node::kEventWait, Work(), e);
      return cudaSuccess;
    }
    invalidate_locked(s->capture, "a captured stream waited on an event recorded outside it");
    return fail(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent: a capturing stream may "
                "only wait on events recorded in its capture, or with cudaEventWaitExternal");
  }
  if (!e->snapshot || e->snapshot->done) return cudaSuccess;
  Work marker;
  marker.what = "event wait";
  return issue_locked(s, std::move(marker), {e->snapshot});
}

}  // namespace simdev
