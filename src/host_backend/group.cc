/* Groups and point-to-point operations.
 *
 * Inside ncclGroupStart/End (nested: only the outermost end acts) calls are
 * recorded. At the outermost end every send and receive is posted as
 * MPI_Isend/MPI_Irecv, then the group's collectives run in issue order, then
 * the sends and receives are awaited; so grouped sends and receives never
 * deadlock, whatever their order. The wait gives up after
 * QNCCL_HOST_INIT_TIMEOUT seconds without any of them completing (peers that
 * never post the matching operation): the operations are cancelled and their
 * communicators marked unusable. A send or receive outside a group is a group
 * of its own. An invalid call inside a group fails the whole group at its
 * end, as in NCCL: nothing of it runs. */
#include <stdio.h>

#include <string>
#include <vector>

#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

/* All p2p messages of a communicator share one tag: MPI matches them in
 * posting order per peer, which is NCCL's ordering rule. */
constexpr int kP2pTag = 0;

struct P2p {
  ncclComm* comm;
  bool send;
  void* buf;
  size_t count;
  ncclDataType_t type;
  MPI_Datatype mpi_type;
  int peer;
};

struct Collective {
  ncclComm* comm;
  std::function<ncclResult_t()> run;
};

struct Work {
  std::vector<P2p> p2p;
  std::vector<Collective> collectives;
};

struct Group {
  int depth = 0;
  Work work;
  ncclResult_t error = ncclSuccess;  // of the first invalid call inside the group
  std::string message;
};

thread_local Group group;

/* Posted requests and, for each, the index of its P2p. */
struct Requests {
  std::vector<MPI_Request> requests;
  std::vector<size_t> owner;
};

ncclResult_t post(const P2p& op, size_t index, const char* fn, Requests* out) {
  const size_t size = type_size(op.type);
  return for_each_chunk(op.count, size, [&](size_t offset, int n) {
    MPI_Request request;
    char* buf = (char*)op.buf + offset * size;
    int rc = op.send ? MPI_Isend(buf, n, op.mpi_type, op.peer, kP2pTag, op.comm->mpi, &request)
                     : MPI_Irecv(buf, n, op.mpi_type, op.peer, kP2pTag, op.comm->mpi, &request);
    QNCCL_CHECK(mpi_result(rc, fn, op.send ? "MPI_Isend" : "MPI_Irecv"));
    out->requests.push_back(request);
    out->owner.push_back(index);
    return ncclSuccess;
  });
}

/* Cancels what is still pending and makes those communicators unusable. */
void abandon(const Work& work, Requests* posted, const char* message) {
  for (size_t i = 0; i < posted->requests.size(); i++) {
    if (posted->requests[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&posted->requests[i]);
    MPI_Request_free(&posted->requests[i]);
    mark_unusable(work.p2p[posted->owner[i]].comm, ncclSystemError, message);
  }
}

std::string describe(const P2p& op) {
  char text[160];
  snprintf(text, sizeof text, "%s rank %d (this rank: %d of %d; %zu x %s)",
           op.send ? "send to" : "recv from", op.peer, op.comm->rank, op.comm->nranks, op.count,
           type_name(op.type));
  return text;
}

ncclResult_t timed_out(const Work& work, Requests* posted, double timeout_s, const char* fn) {
  std::vector<bool> pending(work.p2p.size(), false);
  for (size_t i = 0; i < posted->requests.size(); i++) {
    if (posted->requests[i] != MPI_REQUEST_NULL) pending[posted->owner[i]] = true;
  }
  std::string list;
  int count = 0;
  for (size_t i = 0; i < work.p2p.size(); i++) {
    if (pending[i] && count++ < 4) list += (list.empty() ? "" : "; ") + describe(work.p2p[i]);
  }
  char message[1024];
  snprintf(message, sizeof message, "%s: %d point-to-point operation(s) made no progress for "
           "%g s (QNCCL_HOST_INIT_TIMEOUT): %s%s. Did the peers post the matching "
           "ncclSend/ncclRecv? The communicator is now unusable: destroy it with ncclCommAbort",
           fn, count, timeout_s, list.c_str(), count > 4 ? "; ..." : "");
  abandon(work, posted, message);
  return set_error(ncclSystemError, "%s", message);
}

/* Waits while requests keep completing; timeout_s without any is an error. */
ncclResult_t wait_all(const Work& work, Requests* posted, const char* fn) {
  double timeout_s = 0;
  for (const P2p& op : work.p2p) timeout_s = std::max(timeout_s, op.comm->timeout_s);
  std::vector<int> done(posted->requests.size());
  for (Deadline deadline(timeout_s);; deadline.pause()) {
    int ndone;
    int rc = MPI_Testsome((int)posted->requests.size(), posted->requests.data(), &ndone,
                          done.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      ncclResult_t result = mpi_result(rc, fn, "MPI_Testsome");
      abandon(work, posted, last_error());
      return result;
    }
    if (ndone == MPI_UNDEFINED) return ncclSuccess;  // none left
    if (ndone > 0) {
      deadline.restart();
    } else if (deadline.passed()) {
      return timed_out(work, posted, timeout_s, fn);
    }
  }
}

ncclResult_t check_still_usable(const Work& work, const char* fn) {
  for (const P2p& op : work.p2p) QNCCL_CHECK(check_usable(op.comm, fn));
  for (const Collective& c : work.collectives) QNCCL_CHECK(check_usable(c.comm, fn));
  return ncclSuccess;
}

ncclResult_t run(const Work& work, const char* fn) {
  QNCCL_CHECK(check_still_usable(work, fn));
  Requests posted;
  ncclResult_t result = ncclSuccess;
  for (size_t i = 0; i < work.p2p.size() && result == ncclSuccess; i++) {
    result = post(work.p2p[i], i, fn, &posted);
  }
  for (size_t i = 0; i < work.collectives.size() && result == ncclSuccess; i++) {
    result = work.collectives[i].run();
  }
  if (result != ncclSuccess) {
    abandon(work, &posted, last_error());
    return result;
  }
  return wait_all(work, &posted, fn);
}

ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t type, int peer,
                 ncclComm* comm, const char* fn) {
  QNCCL_CHECK(check_usable(comm, fn));
  P2p op{comm, send, buf, count, type, MPI_DATATYPE_NULL, peer};
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
    group.work.p2p.push_back(op);
    return ncclSuccess;
  }
  return run(Work{{op}, {}}, fn);
}

}  // namespace

ncclResult_t note_group_error(ncclResult_t code) {
  if (code != ncclSuccess && group.depth > 0 && group.error == ncclSuccess) {
    group.error = code;
    group.message = last_error();
  }
  return code;
}

ncclResult_t submit_collective(ncclComm* comm, std::function<ncclResult_t()> run_now) {
  if (group.depth == 0) return run_now();
  group.work.collectives.push_back({comm, std::move(run_now)});
  return ncclSuccess;
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
  Work work = std::move(group.work);
  group.work = Work();
  ncclResult_t error = group.error;
  group.error = ncclSuccess;
  if (error != ncclSuccess) {
    return set_error(error, "ncclGroupEnd: the group was dropped: one of its calls failed: %s",
                     group.message.c_str());
  }
  return run(work, "ncclGroupEnd");
}

QNCCL_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t /*stream*/) {
  return note_group_error(p2p(true, (void*)sendbuff, count, datatype, peer, comm, "ncclSend"));
}

QNCCL_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t /*stream*/) {
  return note_group_error(p2p(false, recvbuff, count, datatype, peer, comm, "ncclRecv"));
}
