#include "engine/topology.h"

#include <limits.h>
#include <stdint.h>
#include <unistd.h>

#include "common/env.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"
#include "engine/report.h"

namespace qnccl {
namespace {

/* NCCL_HOSTID when set (NCCL reads it to the same end), else the host name. */
std::string host_id() {
  if (const char* id = env::get(env::Var::kNcclHostId)) return id;
  char name[HOST_NAME_MAX + 1] = "";
  if (gethostname(name, sizeof name) != 0) return "localhost";
  name[HOST_NAME_MAX] = '\0';
  return name;
}

/* A split color per host: the 31-bit FNV-1a hash of its name (distinct hosts
 * share one with probability 2^-31 per pair; they are then taken for one node,
 * which costs speed, never correctness). */
int host_color(const std::string& host) {
  uint32_t h = 2166136261u;
  for (unsigned char c : host) h = (h ^ c) * 16777619u;
  return (int)(h & 0x7fffffffu);
}

/* ncclCommSplit(comm, color, key), waited for on a nonblocking `comm` (the
 * child inherits its mode: the engine waits out its calls anyway). There NCCL
 * answers ncclSuccess or ncclInProgress while the child is still being made
 * (NCCL 2.28 passes its group's ncclInProgress on as ncclSuccess): the parent
 * reports ncclInProgress until then, and *child stays NULL until the child
 * exists. So the parent is waited for whatever the answer, then the child. */
ncclResult_t split(const NcclApi& nccl, ncclComm_t comm, int color, int key, CommState& state,
                   ncclComm_t* child) {
  *child = nullptr;
  ncclResult_t res = nccl.commSplit(comm, color, key, child, nullptr);
  if (res == ncclSuccess || res == ncclInProgress) res = wait_until_ready(nccl, comm, state);
  if (res == ncclSuccess && *child != nullptr) res = wait_until_ready(nccl, *child, state);
  if (res == ncclSuccess && *child == nullptr) {
    return set_error(ncclInternalError, "quantized allreduce: ncclCommSplit of the "
                     "communicator into nodes made no communicator");
  }
  if (res != ncclSuccess && *child != nullptr) {  // a child that failed is ended here
    nccl.commAbort(*child);
    *child = nullptr;
  }
  if (res != ncclSuccess) {
    const char* why = nccl.getLastError(comm);
    return set_error(res, "quantized allreduce: ncclCommSplit of the communicator into nodes "
                     "failed (%d): %s", (int)res, why != nullptr && why[0] ? why : "no message");
  }
  return ncclSuccess;
}

ncclResult_t size_and_rank(const NcclApi& nccl, ncclComm_t comm, int* size, int* rank) {
  if (nccl.commCount(comm, size) != ncclSuccess ||
      (rank != nullptr && nccl.commUserRank(comm, rank) != ncclSuccess))
    return set_error(ncclInternalError, "quantized allreduce: a communicator made by "
                     "ncclCommSplit answers no size or rank");
  return ncclSuccess;
}

void report(ncclComm_t comm, const CommState& state, int nranks) {
  const Topology& t = state.topology;
  if (t.hierarchical())
    info(comm, state.debug, ": %d nodes x %d ranks (this one: %s): auto runs the hierarchical "
         "allreduce", t.nodes, t.local_ranks, t.host.c_str());
  else if (!t.uniform)
    info(comm, state.debug, ": nodes hold different numbers of ranks (this one, %s: %d of %d): "
         "auto runs a flat algorithm, which needs none", t.host.c_str(), t.local_ranks, nranks);
  else if (t.nodes == 1)
    info(comm, state.debug, ": all %d ranks on one node (%s): auto runs a flat algorithm, "
         "a hierarchical call runs exact", nranks, t.host.c_str());
  else
    info(comm, state.debug, ": %d nodes with one rank each: auto runs a flat algorithm",
         t.nodes);
}

/* The layout's work may wait for peers (a split is an NCCL init): an abort
 * waits for it (CommHold); its communicators are published under `api`, where
 * an abort reads them. */
ncclResult_t aborted_error() {
  return set_error(ncclInvalidUsage, "quantized allreduce: the communicator was aborted or "
                   "destroyed (ncclCommAbort, ncclCommDestroy) during the call");
}

void publish(CommState& state, ncclComm_t* slot, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(state.api);
  *slot = comm;
}

}  // namespace

ncclResult_t discover_topology(const NcclApi& nccl, ncclComm_t comm, int rank, int nranks,
                               CommState& state) {
  Topology& t = state.topology;
  if (t.known) return ncclSuccess;
  const CommHold hold(state);
  if (!hold.held()) return aborted_error();
  t.host = host_id();
  ncclComm_t local = nullptr;
  QNCCL_CHECK(split(nccl, comm, host_color(t.host), rank, state, &local));
  ncclResult_t res = size_and_rank(nccl, local, &t.local_ranks, &t.local_rank);
  t.uniform = true;
  if (res == ncclSuccess && t.local_ranks < nranks) {
    // Uniform iff every rank's node holds as many ranks as this one's: then
    // the split by that count puts all ranks together.
    ncclComm_t same = nullptr;
    int together = 0;
    res = split(nccl, comm, t.local_ranks, rank, state, &same);
    if (res == ncclSuccess) {
      res = size_and_rank(nccl, same, &together, nullptr);
      nccl.commDestroy(same);
    }
    t.uniform = together == nranks;
  }
  t.nodes = t.uniform ? nranks / t.local_ranks : 0;
  if (res != ncclSuccess) {
    nccl.commDestroy(local);
    return res;
  }
  t.known = true;
  if (t.hierarchical())
    publish(state, &t.local, local);  // auto will run on it
  else
    nccl.commDestroy(local);
  report(comm, state, nranks);
  return ncclSuccess;
}

ncclResult_t make_hierarchy(const NcclApi& nccl, ncclComm_t comm, int rank, CommState& state) {
  Topology& t = state.topology;  // discovered, uniform
  if (t.local != nullptr && t.cross != nullptr) return ncclSuccess;
  const CommHold hold(state);
  if (!hold.held()) return aborted_error();
  ncclComm_t made = nullptr;
  if (t.local == nullptr) {
    QNCCL_CHECK(split(nccl, comm, host_color(t.host), rank, state, &made));
    publish(state, &t.local, made);
  }
  if (t.cross == nullptr) {
    QNCCL_CHECK(split(nccl, comm, t.local_rank, rank, state, &made));
    publish(state, &t.cross, made);
    int nodes = 0;
    QNCCL_CHECK(size_and_rank(nccl, t.cross, &nodes, &t.node));
    if (nodes != t.nodes)
      return set_error(ncclInternalError, "quantized allreduce: the ranks of local index %d "
                       "span %d nodes, not %d", t.local_rank, nodes, t.nodes);
  }
  return ncclSuccess;
}

void end_topology(const NcclApi& nccl, CommState& state, bool abort) {
  Topology& t = state.topology;
  for (ncclComm_t* c : {&t.cross, &t.local}) {
    if (*c == nullptr) continue;
    (abort ? nccl.commAbort : nccl.commDestroy)(*c);
    *c = nullptr;
  }
}

ncclResult_t comm_topology(const char* fn, ncclComm_t comm, qncclTopology_t* out) {
  if (comm == nullptr || out == nullptr)
    return set_error(ncclInvalidArgument, "%s: %s is NULL", fn,
                     comm == nullptr ? "comm" : "topology");
  const NcclApi* nccl;
  int nranks = 0, rank = 0;
  QNCCL_CHECK(comm_shape(fn, comm, &nccl, &nranks, &rank));
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  QNCCL_CHECK(discover_topology(*nccl, comm, rank, nranks, *state));
  const Topology& t = state->topology;
  *out = qncclTopology_t{t.nodes, t.local_ranks, t.local_rank, t.uniform ? 1 : 0};
  return ncclSuccess;
}

}  // namespace qnccl
