/* Groups, point-to-point operations and the execution of all operations.
 *
 * Inside ncclGroupStart/End (nested: only the outermost end acts) calls are
 * recorded. At the outermost end the group becomes a Flight: every send and
 * receive is posted as MPI_Isend/MPI_Irecv, then the group's collectives as
 * MPI's nonblocking collectives in issue order, so grouped sends and receives
 * never deadlock, whatever their order. A call outside a group is a group of
 * its own. On blocking communicators the caller then waits for the flight; on
 * nonblocking ones the call answers ncclInProgress and the backend's progress
 * thread completes it, the communicators reporting ncclInProgress until then
 * (ncclCommGetAsyncError). A group may not mix the two kinds, as in NCCL. A
 * group on device memory is queued on its streams instead (streams.cc), and
 * its flight runs in a host function there (complete_queued).
 *
 * A flight fails, cancelling what it still waits for and making its
 * communicators unusable, when its sends and receives make no progress for
 * QNCCL_HOST_INIT_TIMEOUT seconds (peers that never post the matching
 * operation, or a peer that failed or aborted), or when one of its
 * communicators is aborted (from any thread). Collectives wait without a
 * timeout, as in NCCL. An invalid call inside a group fails
 * the whole group at its end, as in NCCL: nothing of it runs.
 *
 * ncclCommRevoke ends a communicator's flights like an abort but frees
 * nothing (comm.cc). A group holds its communicators (Holding) from its first
 * operation until its end returns: NVIDIA's NCCL frees a communicator aborted
 * or destroyed under such a group, so release() warns when one is. */
#include <stdio.h>

#include <algorithm>
#include <condition_variable>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

/* All p2p messages of a communicator share one tag: MPI matches them in
 * posting order per peer, which is NCCL's ordering rule. */
constexpr int kP2pTag = 0;

/* The communicators a group holds operations on, each counted once in its
 * `holders` from the group's first operation on it until the group's end (or
 * the call outside a group) returns. */
class Holding {
 public:
  Holding() = default;
  explicit Holding(const CommRef& comm) { add(comm); }
  Holding(Holding&& other) noexcept : comms_(std::move(other.comms_)) { other.comms_.clear(); }
  Holding& operator=(Holding&&) = delete;
  ~Holding() {
    for (const CommRef& comm : comms_) comm->holders--;
  }
  void add(const CommRef& comm) {
    if (std::find(comms_.begin(), comms_.end(), comm) != comms_.end()) return;
    comm->holders++;
    comms_.push_back(comm);
  }

 private:
  std::vector<CommRef> comms_;
};

struct Group {
  int depth = 0;
  Work work;
  Holding holding;
  ncclResult_t error = ncclSuccess;  // of the first invalid call inside the group
  std::string message;
};

thread_local Group group;

/* A Work in flight: its posted requests and, for each, the operation it
 * belongs to (p2p index >= 0, or -1 - collective index). */
struct Flight {
  Work work;
  const char* fn;
  std::vector<CommRef> comms;  // each communicator of the work once
  std::vector<MPI_Request> requests;
  std::vector<long> owner;
  std::vector<Posted> posted;  // per collective
  Deadline deadline;
  ncclResult_t error = ncclSuccess;  // why it failed
  explicit Flight(Work w, const char* name) : work(std::move(w)), fn(name), deadline(0) {
    double timeout_s = 0;
    auto add = [&](const CommRef& c) {
      timeout_s = std::max(timeout_s, c->timeout_s);
      if (std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
    };
    for (const P2p& op : work.p2p) add(op.comm);
    for (const Collective& c : work.collectives) add(c.comm);
    deadline = Deadline(timeout_s);
    for (const CommRef& c : comms) c->flights++;
  }
  Flight(const Flight&) = delete;
  Flight& operator=(const Flight&) = delete;
  ~Flight() {
    for (const CommRef& c : comms) c->flights--;
  }
};

enum class Status { kPending, kDone, kFailed };

/* Collective requests MPI cannot cancel: kept, with what they use, for good. */
std::mutex abandoned_mutex;
std::vector<Posted>* abandoned = new std::vector<Posted>();  // outlives exit
std::vector<CommRef>* abandoned_comms = new std::vector<CommRef>();

std::string describe(const P2p& op) {
  char text[160];
  snprintf(text, sizeof text, "%s rank %d (this rank: %d of %d; %zu x %s)",
           op.send ? "send to" : "recv from", op.peer, op.comm->rank, op.comm->nranks, op.count,
           type_name(op.type));
  return text;
}

/* Gives up on `f`: cancels its pending sends and receives, keeps its pending
 * collectives' requests for good, and makes its communicators unusable with
 * `code` and `message` (set as this thread's error too). */
ncclResult_t fail(Flight& f, ncclResult_t code, const std::string& message) {
  std::vector<Posted> kept;
  for (size_t i = 0; i < f.requests.size(); i++) {
    if (f.requests[i] == MPI_REQUEST_NULL) continue;
    if (f.owner[i] >= 0) {
      MPI_Cancel(&f.requests[i]);
      MPI_Request_free(&f.requests[i]);
    } else {
      Posted p;
      p.requests.push_back(f.requests[i]);
      p.keep = f.posted[-1 - f.owner[i]].keep;
      kept.push_back(std::move(p));
    }
  }
  for (const CommRef& comm : f.comms) mark_unusable(comm.get(), code, message);
  f.error = code;
  if (!kept.empty()) {
    std::lock_guard<std::mutex> lock(abandoned_mutex);
    for (Posted& p : kept) abandoned->push_back(std::move(p));
    abandoned_comms->insert(abandoned_comms->end(), f.comms.begin(), f.comms.end());
  }
  return set_error(code, "%s", message.c_str());
}

ncclResult_t post_p2p(Flight& f, size_t index) {
  const P2p& op = f.work.p2p[index];
  const size_t size = type_size(op.type);
  if (op.comm->clique) {
    MPI_Request request;
    QNCCL_CHECK(post_clique_message(op, static_cast<char*>(op.buf), op.count * size, &request));
    f.requests.push_back(request);
    f.owner.push_back((long)index);
    return ncclSuccess;
  }
  return for_each_chunk(op.count, size, [&](size_t offset, int n) {
    MPI_Request request;
    char* buf = (char*)op.buf + offset * size;
    int rc = op.send ? MPI_Isend(buf, n, op.mpi_type, op.peer, kP2pTag, op.comm->mpi, &request)
                     : MPI_Irecv(buf, n, op.mpi_type, op.peer, kP2pTag, op.comm->mpi, &request);
    QNCCL_CHECK(mpi_result(rc, f.fn, op.send ? "MPI_Isend" : "MPI_Irecv"));
    f.requests.push_back(request);
    f.owner.push_back((long)index);
    return ncclSuccess;
  });
}

/* Posts every operation of `f`; on a failure, gives up on what was posted. */
ncclResult_t start(Flight& f) {
  ncclResult_t res = ncclSuccess;
  for (size_t i = 0; i < f.work.p2p.size() && res == ncclSuccess; i++) res = post_p2p(f, i);
  f.posted.resize(f.work.collectives.size());
  for (size_t i = 0; i < f.work.collectives.size() && res == ncclSuccess; i++) {
    const Collective& c = f.work.collectives[i];
    res = c.post(c.buffers.send, c.buffers.recv, &f.posted[i]);
    for (MPI_Request r : f.posted[i].requests) {
      f.requests.push_back(r);
      f.owner.push_back(-1 - (long)i);
    }
  }
  if (res != ncclSuccess) return fail(f, res, last_error());
  return ncclSuccess;
}

/* One poll of `f`. */
Status step(Flight& f) {
  int ndone = 0;
  std::vector<int> done(f.requests.size());
  int rc = MPI_Testsome((int)f.requests.size(), f.requests.data(), &ndone, done.data(),
                        MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    mpi_result(rc, f.fn, "MPI_Testsome");
    fail(f, ncclSystemError, last_error());
    return Status::kFailed;
  }
  if (ndone == MPI_UNDEFINED) {  // none left
    for (Posted& p : f.posted)
      if (p.finish) p.finish();
    return Status::kDone;
  }
  if (ndone > 0) f.deadline.restart();
  for (const CommRef& comm : f.comms) {
    char text[256];
    if (comm->aborted || comm->revoked) {
      snprintf(text, sizeof text, "%s: the communicator was %s while this operation was in "
               "flight", f.fn,
               comm->aborted ? "aborted (ncclCommAbort)" : "revoked (ncclCommRevoke)");
      fail(f, ncclSystemError, text);
      return Status::kFailed;
    }
  }
  if (!f.deadline.passed()) return Status::kPending;
  std::vector<bool> pending(f.work.p2p.size(), false);
  for (size_t i = 0; i < f.requests.size(); i++)
    if (f.requests[i] != MPI_REQUEST_NULL && f.owner[i] >= 0) pending[f.owner[i]] = true;
  std::string list;
  int count = 0;
  for (size_t i = 0; i < f.work.p2p.size(); i++)
    if (pending[i] && count++ < 4) list += (list.empty() ? "" : "; ") + describe(f.work.p2p[i]);
  if (count == 0) {  // only collectives wait: they have no timeout
    f.deadline.restart();
    return Status::kPending;
  }
  char message[1024];
  snprintf(message, sizeof message, "%s: %d point-to-point operation(s) made no progress for "
           "%g s (QNCCL_HOST_INIT_TIMEOUT): %s%s. Did the peers post the matching "
           "ncclSend/ncclRecv? The communicator is now unusable: destroy it with ncclCommAbort",
           f.fn, count, f.comms.front()->timeout_s, list.c_str(), count > 4 ? "; ..." : "");
  fail(f, ncclSystemError, message);
  return Status::kFailed;
}

/* ---- the progress thread of nonblocking communicators -------------------- */

class Progress {
 public:
  static Progress& get() {
    static Progress* progress = new Progress();  // its thread outlives exit
    return *progress;
  }

  void submit(std::unique_ptr<Flight> flight) {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.push_back(std::move(flight));
    if (!started_) {
      started_ = true;
      std::thread([this] { loop(); }).detach();
    }
    wake_.notify_one();
  }

 private:
  void loop() {
    std::list<std::unique_ptr<Flight>> flights;
    Deadline idle(0);
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // Idle, the thread makes no MPI call: the application may finalize MPI.
        wake_.wait(lock, [&] { return !flights.empty() || !incoming_.empty(); });
        for (auto& f : incoming_) flights.push_back(std::move(f));
        incoming_.clear();
      }
      bool progressed = false;
      for (auto it = flights.begin(); it != flights.end();) {
        const size_t before = pending_requests(**it);
        const Status status = step(**it);
        progressed |= status != Status::kPending || pending_requests(**it) != before;
        if (status == Status::kPending) {
          ++it;
          continue;
        }
        complete(**it);
        it = flights.erase(it);
      }
      if (progressed) {
        idle.restart();
      } else {
        idle.pause();
      }
    }
  }

  static size_t pending_requests(const Flight& f) {
    return std::count_if(f.requests.begin(), f.requests.end(),
                         [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  }

  /* The flight ended (its failure is already recorded): each communicator is
   * ready again once none of its operations is in flight. */
  static void complete(const Flight& f) {
    for (const CommRef& comm : f.comms) {
      if (--comm->pending > 0) continue;
      ncclResult_t expected = ncclInProgress;
      comm->state.compare_exchange_strong(expected, ncclSuccess);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Flight>> incoming_;
  bool started_ = false;
};

ncclResult_t check_still_usable(const Work& work, const char* fn) {
  CommRef ref;
  for (const P2p& op : work.p2p) QNCCL_CHECK(acquire_usable(op.comm.get(), fn, &ref));
  for (const Collective& c : work.collectives) QNCCL_CHECK(acquire_usable(c.comm.get(), fn, &ref));
  return ncclSuccess;
}

/* Posts every operation of `work` and waits for all of them. */
ncclResult_t run_flight(Work work, const char* fn) {
  Flight flight(std::move(work), fn);
  if (flight.comms.empty()) return ncclSuccess;
  QNCCL_CHECK(start(flight));
  for (Deadline pace(0);; pace.pause()) {
    switch (step(flight)) {
      case Status::kDone: return ncclSuccess;
      case Status::kFailed: return flight.error;
      case Status::kPending: break;
    }
  }
}

/* Runs `work`: on device memory, queued on its streams; on host memory,
 * waited for on blocking communicators, handed to the progress thread
 * (ncclInProgress) on nonblocking ones. */
ncclResult_t run(Work work, const char* fn) {
  QNCCL_CHECK(check_still_usable(work, fn));
  auto flight = std::make_unique<Flight>(std::move(work), fn);
  if (flight->comms.empty()) return ncclSuccess;
  const bool blocking = flight->comms.front()->blocking;
  for (const CommRef& comm : flight->comms) {
    if (comm->blocking != blocking)
      return set_error(ncclInvalidArgument, "%s: blocking and nonblocking communicators are not "
                       "allowed in the same group (as in NCCL)", fn);
  }
  if (on_device(flight->work)) {
    QNCCL_CHECK(enqueue_on_streams(std::move(flight->work), fn));
    return blocking ? ncclSuccess : ncclInProgress;  // (nothing left in progress: it is queued)
  }
  for (const CommRef& comm : flight->comms) QNCCL_CHECK(wait_device_work(*comm, fn));
  if (blocking) return complete(std::move(flight->work), fn);
  QNCCL_CHECK(start(*flight));
  for (const CommRef& comm : flight->comms) {
    comm->pending++;
    ncclResult_t expected = ncclSuccess;
    comm->state.compare_exchange_strong(expected, ncclInProgress);
  }
  Progress::get().submit(std::move(flight));
  return ncclInProgress;
}

ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t type, int peer,
                 ncclComm* handle, cudaStream_t stream, const char* fn) {
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  P2p op{comm, send, buf, count, type, MPI_DATATYPE_NULL, peer, stream};
  QNCCL_CHECK(mpi_type(type, fn, &op.mpi_type));
  if (peer < 0 || peer >= comm->nranks) {
    return set_error(ncclInvalidArgument, "%s: peer %d is outside 0..%d", fn, peer,
                     comm->nranks - 1);
  }
  if (buf == nullptr && count > 0) {
    return set_error(ncclInvalidArgument, "%s: %s is NULL with count %zu", fn,
                     send ? "sendbuff" : "recvbuff", count);
  }
  if (group.depth > 0) {
    group.holding.add(op.comm);
    group.work.p2p.push_back(std::move(op));
    return ncclSuccess;
  }
  Holding holding(op.comm);
  Work work;
  work.p2p.push_back(std::move(op));
  return run(std::move(work), fn);
}

}  // namespace

ncclResult_t note_group_error(ncclResult_t code) {
  if (code != ncclSuccess && code != ncclInProgress && group.depth > 0 &&
      group.error == ncclSuccess) {
    group.error = code;
    group.message = last_error();
  }
  return code;
}

ncclResult_t complete(Work work, const char* fn) {
  QNCCL_CHECK(check_still_usable(work, fn));
  return run_flight(std::move(work), fn);
}

ncclResult_t complete_queued(Work work, const char* fn) {
  std::vector<CommRef> comms;
  for (const P2p& op : work.p2p) comms.push_back(op.comm);
  for (const Collective& c : work.collectives) comms.push_back(c.comm);
  for (const CommRef& comm : comms) {
    CommRef ref;
    ncclResult_t res = acquire(comm.get(), fn, &ref);  // not destroyed or aborted since
    const ncclResult_t state = res == ncclSuccess ? ref->state.load() : res;
    if (state != ncclSuccess && state != ncclInProgress)
      res = acquire_ready(comm.get(), fn, &ref);  // failed since: says why
    if (res == ncclSuccess && ref->revoked)
      res = set_error(ncclInvalidUsage, "%s: the communicator was revoked (ncclCommRevoke) "
                      "before this work on device buffers ran", fn);
    if (res == ncclSuccess && mpi_finalized())
      res = set_error(ncclSystemError, "%s: MPI is already finalized", fn);
    if (res == ncclSuccess) continue;
    // The peers' parts may wait for this one: each communicator says why.
    for (const CommRef& c : comms) mark_unusable(c.get(), res, last_error());
    return res;
  }
  return run_flight(std::move(work), fn);
}

ncclResult_t submit_collective(const CommRef& comm, const char* fn, const Buffers& buffers,
                               cudaStream_t stream, PostCollective post) {
  Collective c{comm, std::move(post), buffers, stream};
  if (group.depth > 0) {
    group.holding.add(comm);
    group.work.collectives.push_back(std::move(c));
    return ncclSuccess;
  }
  Holding holding(comm);
  Work work;
  work.collectives.push_back(std::move(c));
  return run(std::move(work), fn);
}

}  // namespace host
}  // namespace qnccl

using namespace qnccl;
using namespace qnccl::host;

QNCCL_EXPORT ncclResult_t ncclGroupStart(void) {
  group.depth++;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclGroupEnd(void) {
  if (group.depth == 0) {
    return set_error(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart is open");
  }
  if (--group.depth > 0) return ncclSuccess;
  const Holding holding(std::move(group.holding));  // until this end returns
  Work work = std::move(group.work);
  group.work = Work();
  ncclResult_t error = group.error;
  group.error = ncclSuccess;
  if (error != ncclSuccess) {
    return set_error(error, "ncclGroupEnd: the group was dropped: one of its calls failed: %s",
                     group.message.c_str());
  }
  return run(std::move(work), "ncclGroupEnd");
}

QNCCL_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
  return note_group_error(
      p2p(true, (void*)sendbuff, count, datatype, peer, comm, stream, "ncclSend"));
}

QNCCL_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
  return note_group_error(p2p(false, recvbuff, count, datatype, peer, comm, stream, "ncclRecv"));
}
