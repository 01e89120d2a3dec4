/* Streams and the order their work runs in.
 *
 * Each stream has a worker thread that runs its operations one after
 * another (started on the stream's first operation). An operation starts
 * once the one before it on its stream is done and every completion it
 * waits for (event waits, the legacy stream's implicit ones) is done; under
 * the lazy schedule (core/config.h) also only once the host waits for it or
 * it has been queued for SIMDEV_LAZY_MS, and only as the newest startable
 * operation of its device, one at a time. Host functions of a device run
 * one at a time under its host-function lock, in whatever order their
 * streams reach them (CUDA promises no order), and no CUDA call may be made
 * from one. After device work faults, the device's sticky error fails every
 * later operation and call. */
#include <stdio.h>

#include <algorithm>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "core/config.h"
#include "core/core.h"
#include "core/errors.h"
#include "core/faults.h"
#include "core/internal.h"

namespace simdev {
namespace {

bool lazy() { return config().schedule == Schedule::kLazy; }

bool deps_done(const Op& op) {
  return std::all_of(op.deps.begin(), op.deps.end(), [](const Done& d) { return d->done; });
}

bool aged(const Op& op, Clock::time_point now) {
  return op.forced || now - op.issued >= std::chrono::milliseconds(config().lazy_ms);
}

/* May s's first operation start now? */
bool may_start(const Stream* s, Clock::time_point now) {
  if (s->queue.empty() || s->running) return false;
  const Op& op = *s->queue.front();
  if (!deps_done(op)) return false;
  if (!lazy()) return true;
  if (!aged(op, now)) return false;
  if (op.work.kind != Work::kDevice) return true;
  if (s->device->busy) return false;
  for (const Stream* t : s->device->streams) {  // the newest startable device work goes first
    if (t == s || t->queue.empty() || t->running) continue;
    const Op& other = *t->queue.front();
    if (other.work.kind == Work::kDevice && other.order > op.order && deps_done(other) &&
        aged(other, now))
      return false;
  }
  return true;
}

bool sticky(cudaError_t e) {
  return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
         e == cudaErrorMisalignedAddress || e == cudaErrorIllegalInstruction;
}

cudaError_t run_op(Op& op, Device* d) {
  if (!op.work.run) return cudaSuccess;
  if (op.work.kind != Work::kHost) return op.work.run();
  std::lock_guard<std::mutex> one_at_a_time(d->host_functions);
  set_in_host_function(true);
  const cudaError_t e = op.work.run();
  set_in_host_function(false);
  return e;
}

void work(Stream* s) {
  prepare_worker_thread();
#if defined(__x86_64__)
  _mm_setcsr(0x1f80);  // IEEE: round to nearest, no flush to zero, whatever the host thread set
#endif
  Sim& S = sim();
  Device* d = s->device;
  Lock lock(S.mutex);
  for (;;) {
    if (s->queue.empty()) {
      if (s->destroyed) break;
      S.progress.wait(lock);
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (!may_start(s, now)) {
      const Op& head = *s->queue.front();
      if (lazy() && !head.forced)
        S.progress.wait_until(lock, head.issued + std::chrono::milliseconds(config().lazy_ms));
      else
        S.progress.wait(lock);
      continue;
    }
    std::unique_ptr<Op> op = std::move(s->queue.front());
    s->queue.pop_front();
    op->done->op = nullptr;  // running: nothing left to force
    s->running = true;
    const bool device_work = op->work.kind == Work::kDevice;
    if (device_work && lazy()) d->busy = true;
    cudaError_t error = d->sticky;
    lock.unlock();
    if (error == cudaSuccess) error = run_op(*op, d);
    lock.lock();
    if (sticky(error)) fault_locked(d, error);
    op->done->done = true;
    op->done->time_ms = now_ms();
    op->done->error = error;
    s->running = false;
    if (device_work && lazy()) d->busy = false;
    S.completed++;
    S.progress.notify_all();
    lock.unlock();
    op.reset();  // what it held (a graph's user objects) may call back into the simulator
    lock.lock();
  }
  d->streams.erase(s);
  S.progress.notify_all();
  lock.unlock();
  delete s;
}

void start_worker_locked(Stream* s) {
  if (s->worker_started) return;
  s->worker_started = true;
  std::thread(work, s).detach();
}

/* A report of what every stream waits for: printed when a host wait makes
 * no progress for SIMDEV_HANG_REPORT_S seconds. */
void report_hang_locked(const char* what) {
  Sim& S = sim();
  std::string text = std::string(what) + " has waited " +
                     std::to_string(config().hang_report_s) +
                     " s without any device work completing; the streams:";
  for (const auto& d : S.devices) {
    for (const Stream* s : d->streams) {
      char line[400];
      if (s->queue.empty()) {
        snprintf(line, sizeof line, "\n  device %d stream %lu: %s", d->ordinal,
                 (unsigned long)s->id, s->running ? "running an operation" : "idle");
      } else {
        const Op& op = *s->queue.front();
        size_t waiting = 0;
        for (const Done& dep : op.deps) waiting += !dep->done;
        snprintf(line, sizeof line, "\n  device %d stream %lu: %zu queued; next: %s, waiting for "
                 "%zu other operation(s)%s%s", d->ordinal, (unsigned long)s->id, s->queue.size(),
                 op.work.what.c_str(), waiting, s->running ? "; running one" : "",
                 op.work.kind == Work::kHost ? " (host functions of a device run one at a time)"
                                             : "");
      }
      text += line;
    }
  }
  report("%s", text.c_str());
}

}  // namespace

double now_ms() {
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

Done done_now() {
  Done d = std::make_shared<Completion>();
  d->done = true;
  d->time_ms = now_ms();
  return d;
}

void fault_locked(Device* d, cudaError_t error) {
  if (d->sticky == cudaSuccess) d->sticky = error;
}

bool live_stream_locked(Stream* s) { return sim().streams.count(s) != 0; }

cudaError_t issue_locked(Stream* s, Work work, std::vector<Done> deps) {
  Sim& S = sim();
  Device* d = s->device;
  if (d->sticky != cudaSuccess)
    return fail(d->sticky, "device %d is unusable after device work faulted (error %d)",
                d->ordinal, (int)d->sticky);
  if (s->capture != nullptr) {
    if (s->capture->invalidated)
      return fail(cudaErrorStreamCaptureInvalidated, "%s: the stream's capture was invalidated "
                  "earlier (%s)", work.what.c_str(), s->capture->why.c_str());
    add_node_locked(s, Node::kWork, std::move(work));
    return cudaSuccess;
  }
  if (s->kind == Stream::kLegacy) {
    if (Capture* c = blocking_capture_locked(d)) {
      invalidate_locked(c, "the legacy default stream was used (" + work.what + ")");
      return fail(cudaErrorStreamCaptureImplicit, "%s on the legacy default stream of device %d "
                  "while a blocking stream of it captures: the capture is invalidated; capture "
                  "on a cudaStreamNonBlocking stream or keep the legacy stream out of it",
                  work.what.c_str(), d->ordinal);
    }
    for (Stream* t : d->streams)
      if (t != s && t->blocking() && t->last && !t->last->done) deps.push_back(t->last);
  } else if (s->blocking() && d->legacy != nullptr && d->legacy->last && !d->legacy->last->done) {
    deps.push_back(d->legacy->last);
  }
  auto op = std::make_unique<Op>();
  op->work = std::move(work);
  op->deps = std::move(deps);
  op->order = S.next_order++;
  op->issued = Clock::now();
  op->done = std::make_shared<Completion>();
  op->done->op = op.get();
  op->done->stream = s;
  s->last = op->done;
  s->queue.push_back(std::move(op));
  start_worker_locked(s);
  S.progress.notify_all();
  return cudaSuccess;
}

void force_locked(const Done& done) {
  if (!lazy() || !done) return;
  bool any = false;
  std::vector<Completion*> todo{done.get()};
  while (!todo.empty()) {
    Completion* c = todo.back();
    todo.pop_back();
    if (c->done || c->op == nullptr || c->op->forced) continue;
    for (auto& op : c->stream->queue) {  // what comes before it on its stream, and it
      if (!op->forced) {
        op->forced = true;
        any = true;
        for (const Done& dep : op->deps) todo.push_back(dep.get());
      }
      if (op.get() == c->op) break;
    }
  }
  if (any) sim().progress.notify_all();
}

cudaError_t wait_locked(Lock& lock, const Done& done, const char* what) {
  if (!done) return cudaSuccess;
  Sim& S = sim();
  force_locked(done);
  uint64_t seen = S.completed;
  Clock::time_point progress = Clock::now();
  bool reported = false;
  while (!done->done) {
    S.progress.wait_for(lock, std::chrono::seconds(1));
    const Clock::time_point now = Clock::now();
    if (S.completed != seen) {
      seen = S.completed;
      progress = now;
    } else if (config().hang_report_s > 0 && !reported &&
               now - progress >= std::chrono::seconds(config().hang_report_s)) {
      report_hang_locked(what);
      reported = true;
    }
  }
  return done->error;
}

cudaError_t stream_create(Device* d, unsigned flags, int priority, Stream** out) {
  if (flags & ~(unsigned)cudaStreamNonBlocking)
    return fail(cudaErrorInvalidValue, "stream flags %#x; allowed: cudaStreamDefault (0) or "
                "cudaStreamNonBlocking (1)", flags);
  SIMDEV_CHECK(use_device(d));
  Sim& S = sim();
  Lock lock(S.mutex);
  Stream* s = new Stream();
  s->device = d;
  s->flags = flags;
  s->priority = std::max(-5, std::min(0, priority));  // CUDA clamps to the device's range
  s->id = S.next_stream++;
  S.streams.insert(s);
  d->streams.insert(s);
  *out = s;
  return cudaSuccess;
}

cudaError_t stream_destroy(Stream* s) {
  Sim& S = sim();
  Lock lock(S.mutex);
  if (!live_stream_locked(s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a live stream",
                (void*)s);
  if (s->kind != Stream::kUser)
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: the default streams cannot "
                "be destroyed");
  if (s->capture != nullptr) {
    invalidate_locked(s->capture, "a stream of the capture was destroyed");
    s->capture->members.erase(s);
    s->capture = nullptr;
  }
  S.streams.erase(s);
  s->destroyed = true;  // its work still runs (CUDA releases it once done)
  if (!s->worker_started) {
    s->device->streams.erase(s);
    delete s;
  }
  S.progress.notify_all();
  return cudaSuccess;
}

cudaError_t resolve_stream(void* handle, Device* d, Stream** out) {
  if (handle == nullptr || handle == (void*)cudaStreamLegacy) {
    SIMDEV_CHECK(use_device(d));
    *out = d->legacy;
    return cudaSuccess;
  }
  if (handle == (void*)cudaStreamPerThread) {
    SIMDEV_CHECK(use_device(d));
    static thread_local std::map<int, Stream*> mine;
    Stream*& s = mine[d->ordinal];
    if (s == nullptr) {
      Sim& S = sim();
      Lock lock(S.mutex);
      s = new Stream();
      s->kind = Stream::kPerThread;
      s->device = d;
      s->id = S.next_stream++;
      d->streams.insert(s);
      S.streams.insert(s);
    }
    *out = s;
    return cudaSuccess;
  }
  Stream* s = static_cast<Stream*>(handle);
  Lock lock(sim().mutex);
  if (!live_stream_locked(s))
    return fail(cudaErrorInvalidResourceHandle, "stream %p is not a live stream (destroyed, or "
                "never created)", handle);
  *out = s;
  return cudaSuccess;
}

namespace {

/* The checks of synchronizing or querying s. */
cudaError_t check_waitable_locked(Stream* s, const char* api) {
  if (s->capture != nullptr) {
    invalidate_locked(s->capture, std::string(api) + " on a capturing stream");
    return fail(cudaErrorStreamCaptureUnsupported, "%s on a stream that is capturing: not "
                "allowed (the capture is invalidated)", api);
  }
  if (s->kind == Stream::kLegacy) {
    if (Capture* c = blocking_capture_locked(s->device)) {
      invalidate_locked(c, std::string(api) + " on the legacy default stream");
      return fail(cudaErrorStreamCaptureImplicit, "%s on the legacy default stream while a "
                  "blocking stream of device %d captures (the capture is invalidated)", api,
                  s->device->ordinal);
    }
  }
  if (s->device->sticky != cudaSuccess)
    return fail(s->device->sticky, "%s: device %d is unusable after device work faulted", api,
                s->device->ordinal);
  return cudaSuccess;
}

}  // namespace

cudaError_t stream_synchronize(Stream* s) {
  Lock lock(sim().mutex);
  SIMDEV_CHECK(check_waitable_locked(s, "cudaStreamSynchronize"));
  return wait_locked(lock, s->last, "cudaStreamSynchronize");
}

cudaError_t stream_query(Stream* s) {
  Lock lock(sim().mutex);
  SIMDEV_CHECK(check_waitable_locked(s, "cudaStreamQuery"));
  if (!s->last) return cudaSuccess;
  force_locked(s->last);
  if (!s->last->done) return cudaErrorNotReady;
  return s->last->error;
}

cudaError_t issue(Stream* s, Work work) {
  Lock lock(sim().mutex);
  return issue_locked(s, std::move(work));
}

cudaError_t host_function(Stream* s, void (*fn)(void*), void* data) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue, "cudaLaunchHostFunc: fn is NULL");
  Work w;
  w.kind = Work::kHost;
  w.what = "host function";
  w.run = [fn, data] {
    fn(data);
    Lock lock(sim().mutex);
    sim().counters.host_functions++;
    return cudaSuccess;
  };
  return issue(s, std::move(w));
}

cudaError_t device_synchronize(Device* d) {
  SIMDEV_CHECK(use_device(d));
  Lock lock(sim().mutex);
  for (Stream* s : d->streams)
    if (s->capture != nullptr) {
      invalidate_locked(s->capture, "cudaDeviceSynchronize");
      return fail(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize while a stream of "
                  "device %d captures: not allowed (the capture is invalidated)", d->ordinal);
    }
  std::vector<Done> all;
  for (Stream* s : d->streams)
    if (s->last) all.push_back(s->last);
  cudaError_t result = cudaSuccess;
  for (const Done& done : all) {
    const cudaError_t e = wait_locked(lock, done, "cudaDeviceSynchronize");
    if (result == cudaSuccess) result = e;
  }
  return d->sticky != cudaSuccess ? d->sticky : result;
}

}  // namespace simdev
