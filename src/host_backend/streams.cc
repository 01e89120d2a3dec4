/* Work on device memory, ordered on the caller's streams as NVIDIA's NCCL
 * orders it (docs/host-backend.md, "Device buffers").
 *
 * A group whose buffers are device memory becomes, on its first operation's
 * stream G (the others joined to it through events, as NCCL joins a
 * group's streams):
 *   1. each device buffer it reads copied into pinned host memory, on the
 *      stream of its operation;
 *   2. a host function that posts the MPI operations on those copies (and
 *      on the group's host buffers) and waits for them;
 *   3. each device buffer it writes copied back, on its operation's stream.
 * The caller returns at once; the work runs when the streams reach it, so
 * the inputs are read after what the caller queued before and the outputs
 * are there for what it queues after. Every communicator's device work
 * waits for its previous device work (an event recorded after it), so its
 * MPI operations run in issue order on every rank whatever streams the
 * calls use, and host functions, which CUDA may run one at a time in any
 * order, never wait for one another. Inside a stream capture all of this
 * becomes graph nodes: each replay copies and communicates again, and the
 * pinned copies live as long as the graph (a CUDA user object).
 *
 * The host function makes no CUDA call (CUDA forbids it); everything else
 * here runs on the calling thread. */
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

/* Pinned host memory, kept for reuse (device work allocates nothing on a
 * hot path after the first calls of each size). */
class StagingPool {
 public:
  static StagingPool& get() {
    static StagingPool* pool = new StagingPool();  // blocks may be returned during exit
    return *pool;
  }

  /* A block of at least `bytes`, or nullptr with the error set. */
  ncclResult_t take(size_t bytes, std::pair<char*, size_t>* out) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end()) {
        *out = {it->second, it->first};
        free_.erase(it);
        return ncclSuccess;
      }
    }
    size_t size = 64 << 10;
    while (size < bytes) size *= 2;
    const Cuda& c = *cuda();
    // Pinned memory is not stream-ordered: in relaxed capture mode, so that a
    // capture in this or another thread neither fails it nor is invalidated.
    int mode = kCuStreamCaptureModeRelaxed;
    c.threadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    const CuResult r = c.memHostAlloc(&p, size, kCuMemHostAllocPortable);
    c.threadExchangeStreamCaptureMode(&mode);
    if (r != 0)
      return set_error(ncclUnhandledCudaError, "staging device buffers: cuMemHostAlloc of %zu "
                       "bytes failed: %s", size, cuda_error(r));
    *out = {static_cast<char*>(p), size};
    return ncclSuccess;
  }

  /* No CUDA call: may run in a host function. */
  void give(std::pair<char*, size_t> block) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.emplace(block.second, block.first);
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, char*> free_;
};

/* One device range copied to or from pinned memory on `stream`. */
struct Copy {
  uintptr_t device;
  char* host;
  size_t bytes;
  CuStream stream;
};

/* A group on device memory: its work on the pinned copies. */
struct DeviceWork {
  Work work;
  const char* fn;
  std::vector<Copy> in, out;
  std::vector<std::pair<char*, size_t>> blocks;
  ~DeviceWork() {
    for (const auto& b : blocks) StagingPool::get().give(b);
  }
};

/* Host functions (no CUDA call in them). */
void run_work(void* arg) {
  const DeviceWork* w = static_cast<const DeviceWork*>(arg);
  complete_queued(w->work, w->fn);  // a failure marks the communicators unusable
}

void delete_work(void* arg) { delete static_cast<DeviceWork*>(arg); }

/* The context of a stream, current while this lives. */
class OnStream {
 public:
  explicit OnStream(CuStream s) {
    CuContext ctx = nullptr;
    result_ = cuda()->streamGetCtx(s, &ctx);
    if (result_ == 0) result_ = cuda()->ctxPushCurrent(ctx);
    pushed_ = result_ == 0;
  }
  ~OnStream() {
    CuContext ignored;
    if (pushed_) cuda()->ctxPopCurrent(&ignored);
  }
  CuResult result() const { return result_; }

 private:
  CuResult result_ = 0;
  bool pushed_ = false;
};

/* The CUDA calls of one enqueue; the first failure is kept and ends it. */
class Enqueue {
 public:
  explicit Enqueue(const char* fn) : fn_(fn) {}
  bool ok() const { return result_ == 0; }
  ncclResult_t result() const {
    if (ok()) return ncclSuccess;
    return set_error(ncclUnhandledCudaError, "%s on device buffers: %s failed: %s", fn_, what_,
                     cuda_error(result_));
  }
  void call(const char* what, CuResult r) {
    if (ok() && r != 0) {
      result_ = r;
      what_ = what;
    }
  }
  /* An event recorded on s now (created for this, destroyed once waited on). */
  CuEvent record(CuStream s) {
    CuEvent e = nullptr;
    call("cuEventCreate", cuda()->eventCreate(&e, kCuEventDisableTiming));
    if (ok()) call("cuEventRecord", cuda()->eventRecordWithFlags(e, s, 0));
    return e;
  }
  /* `to` waits for what is queued on `from` so far. */
  void join(CuStream to, CuStream from) {
    if (to == from || !ok()) return;
    CuEvent e;
    {
      OnStream on(from);
      call("cuStreamGetCtx", on.result());
      e = record(from);
    }
    OnStream on(to);
    call("cuStreamGetCtx", on.result());
    call("cuStreamWaitEvent", cuda()->streamWaitEvent(to, e, 0));
    if (e != nullptr) cuda()->eventDestroy(e);  // legal with work pending
  }

 private:
  const char* fn_;
  const char* what_ = "";
  CuResult result_ = 0;
};

bool capturing(CuStream s, CuGraph* graph) {
  int status = 0;
  uint64_t id = 0;
  *graph = nullptr;
  if (cuda()->streamGetCaptureInfo(s, &status, &id, graph, nullptr, nullptr) != 0) return false;
  return status == kCuStreamCaptureStatusActive;
}

/* Stages one buffer pair of an operation: device ranges become pinned
 * copies (one copy for both when they overlap, as in place), with the
 * copies in and out they need. */
ncclResult_t stage(DeviceWork& w, CuStream stream, const void* send, size_t send_bytes,
                   void* recv, size_t recv_bytes, const void** send_out, void** recv_out) {
  *send_out = send;
  *recv_out = recv;
  const bool send_dev = send_bytes > 0 && device_of(send) >= 0;
  const bool recv_dev = recv_bytes > 0 && device_of(recv) >= 0;
  auto block = [&](size_t bytes, char** out) {
    std::pair<char*, size_t> b;
    QNCCL_CHECK(StagingPool::get().take(bytes, &b));
    w.blocks.push_back(b);
    *out = b.first;
    return ncclSuccess;
  };
  const uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
  if (send_dev && recv_dev && s < r + recv_bytes && r < s + send_bytes) {
    const uintptr_t lo = std::min(s, r), hi = std::max(s + send_bytes, r + recv_bytes);
    char* host;
    QNCCL_CHECK(block(hi - lo, &host));
    *send_out = host + (s - lo);
    *recv_out = host + (r - lo);
    w.in.push_back({s, host + (s - lo), send_bytes, stream});
    w.out.push_back({r, host + (r - lo), recv_bytes, stream});
    return ncclSuccess;
  }
  if (send_dev) {
    char* host;
    QNCCL_CHECK(block(send_bytes, &host));
    *send_out = host;
    w.in.push_back({s, host, send_bytes, stream});
  }
  if (recv_dev) {
    char* host;
    QNCCL_CHECK(block(recv_bytes, &host));
    *recv_out = host;
    w.out.push_back({r, host, recv_bytes, stream});
  }
  return ncclSuccess;
}

}  // namespace

bool on_device(const Work& work) {
  if (cuda() == nullptr) return false;
  for (const P2p& op : work.p2p)
    if (op.count > 0 && device_of(op.buf) >= 0) return true;
  for (const Collective& c : work.collectives)
    if ((c.buffers.send_bytes > 0 && device_of(c.buffers.send) >= 0) ||
        (c.buffers.recv_bytes > 0 && device_of(c.buffers.recv) >= 0))
      return true;
  return false;
}

ncclResult_t enqueue_on_streams(Work work, const char* fn) {
  const Cuda& c = *cuda();
  auto w = std::make_unique<DeviceWork>();
  w->fn = fn;
  std::vector<CuStream> streams;             // in order of first use; the first is G
  std::vector<std::pair<CommRef, CuStream>> comms;  // each communicator, with its first stream
  auto use = [&](const CommRef& comm, CuStream s) {
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
    for (const auto& seen : comms)
      if (seen.first == comm) return;
    comms.push_back({comm, s});
  };
  for (P2p& op : work.p2p) {
    use(op.comm, op.stream);
    const size_t bytes = op.count * type_size(op.type);
    const void* send = op.send ? op.buf : nullptr;
    void* recv = op.send ? nullptr : op.buf;
    const void* s2;
    void* r2;
    QNCCL_CHECK(stage(*w, op.stream, send, op.send ? bytes : 0, recv, op.send ? 0 : bytes, &s2,
                      &r2));
    op.buf = op.send ? const_cast<void*>(s2) : r2;
  }
  for (Collective& col : work.collectives) {
    use(col.comm, col.stream);
    Buffers& b = col.buffers;
    QNCCL_CHECK(
        stage(*w, col.stream, b.send, b.send_bytes, b.recv, b.recv_bytes, &b.send, &b.recv));
  }
  w->work = std::move(work);
  const CuStream g = streams.front();
  CuGraph graph = nullptr;
  const bool captured = capturing(g, &graph);
  const unsigned wait_flags = captured ? kCuEventWaitExternal : 0;
  const unsigned record_flags = captured ? kCuEventRecordExternal : 0;
  Enqueue q(fn);
  // Each communicator's previous device work first, then the inputs.
  for (const auto& [comm, s] : comms) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->device_event == nullptr) continue;
    OnStream on(s);
    q.call("cuStreamGetCtx", on.result());
    if (q.ok()) q.call("cuStreamWaitEvent", c.streamWaitEvent(s, comm->device_event, wait_flags));
  }
  for (const Copy& in : w->in) {
    OnStream on(in.stream);
    q.call("cuStreamGetCtx", on.result());
    if (q.ok()) q.call("cuMemcpyAsync", c.memcpyAsync((uintptr_t)in.host, in.device, in.bytes,
                                                      in.stream));
  }
  for (CuStream s : streams) q.join(g, s);
  DeviceWork* raw = w.get();
  {
    OnStream on(g);
    q.call("cuStreamGetCtx", on.result());
    if (q.ok()) q.call("cuLaunchHostFunc", c.launchHostFunc(g, run_work, raw));
  }
  for (CuStream s : streams) q.join(s, g);
  for (const Copy& out : w->out) {
    OnStream on(out.stream);
    q.call("cuStreamGetCtx", on.result());
    if (q.ok()) q.call("cuMemcpyAsync", c.memcpyAsync(out.device, (uintptr_t)out.host, out.bytes,
                                                      out.stream));
  }
  for (const auto& [comm, s] : comms) {
    OnStream on(s);
    q.call("cuStreamGetCtx", on.result());
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (q.ok() && comm->device_event == nullptr)
      q.call("cuEventCreate", c.eventCreate(&comm->device_event, kCuEventDisableTiming));
    if (q.ok())
      q.call("cuEventRecord", c.eventRecordWithFlags(comm->device_event, s, record_flags));
  }
  // The pinned copies go once the work is done: after the copies back on an
  // eager stream; with the graph, which runs them again at every replay.
  if (captured) {
    CuUserObject object = nullptr;
    q.call("cuUserObjectCreate", c.userObjectCreate(&object, raw, delete_work, 1,
                                                    kCuUserObjectNoDestructorSync));
    if (q.ok()) {
      w.release();  // the graph owns it now
      q.call("cuGraphRetainUserObject",
             c.graphRetainUserObject(graph, object, 1, kCuGraphUserObjectMove));
    }
  } else {
    for (CuStream s : streams) q.join(g, s);
    OnStream on(g);
    q.call("cuStreamGetCtx", on.result());
    if (q.ok()) q.call("cuLaunchHostFunc", c.launchHostFunc(g, delete_work, raw));
    if (q.ok()) w.release();  // the last host function deletes it
  }
  if (!q.ok()) {
    // Part of the group may be queued (a host function may still use the
    // work: it is left allocated), and the peers would wait for the rest.
    w.release();
    const ncclResult_t res = q.result();
    for (const auto& seen : comms) mark_unusable(seen.first.get(), res, last_error());
    return res;
  }
  return ncclSuccess;
}

ncclResult_t wait_device_work(ncclComm& comm, const char* fn) {
  CuEvent e;
  {
    std::lock_guard<std::mutex> lock(comm.mutex);
    e = comm.device_event;
  }
  if (e == nullptr) return ncclSuccess;
  const CuResult r = cuda()->eventSynchronize(e);
  if (r == 0) return ncclSuccess;
  return set_error(ncclUnhandledCudaError, "%s: waiting for the communicator's work on device "
                   "buffers failed: %s", fn, cuda_error(r));
}

void release_device_state(ncclComm& comm) {
  CuEvent e;
  {
    std::lock_guard<std::mutex> lock(comm.mutex);
    e = comm.device_event;
    comm.device_event = nullptr;
  }
  if (e != nullptr) cuda()->eventDestroy(e);  // legal with work pending
}

}  // namespace host
}  // namespace qnccl
