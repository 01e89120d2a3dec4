/* Which ranks of a communicator share a node, and the two communicators the
 * hierarchical allreduce runs on (docs/allreduce.md, "Hierarchical"). All
 * of it comes from ncclCommSplit on the communicator: ranks split by a hash
 * of their host name agree on who shares a node without exchanging a byte
 * themselves, as nccl-tests and NCCL itself group ranks by host hash. */
#ifndef QNCCL_ENGINE_TOPOLOGY_H_
#define QNCCL_ENGINE_TOPOLOGY_H_

#include <string>

#include "engine/nccl_api.h"
#include "qnccl.h"

namespace qnccl {

struct CommState;

struct Topology {
  bool known = false;
  std::string host;      // this rank's host name, or NCCL_HOSTID
  int local_ranks = 1;   // ranks on this rank's node
  int local_rank = 0;    // this rank's index among them, by rank
  bool uniform = true;   // every node has local_ranks ranks
  int nodes = 1;         // when uniform (else 0)
  // Made by make_hierarchy(), ended with the communicator (end_topology()).
  ncclComm_t local = nullptr;  // the ranks of this node, by rank
  ncclComm_t cross = nullptr;  // the ranks of this local index, one per node, by rank
  int node = 0;                // this rank's index in `cross`

  /* What qncclAlgoAuto needs to pick the hierarchical algorithm: at least
   * two nodes, at least two ranks on each, the same number everywhere. */
  bool hierarchical() const { return known && uniform && nodes >= 2 && local_ranks >= 2; }
  /* Whether a hierarchical call needs no more NCCL inits (splits): the
   * layout is known and, where it has several nodes, their communicators
   * are made. */
  bool ready() const {
    return known && (!uniform || nodes == 1 || (local != nullptr && cross != nullptr));
  }
};

/* Fills state.topology once per communicator: collective over `comm`
 * (every rank reaches it at the same call, as any call on it). Reported at
 * QNCCL_DEBUG=INFO with what qncclAlgoAuto makes of it. */
ncclResult_t discover_topology(const NcclApi& nccl, ncclComm_t comm, int rank, int nranks,
                               CommState& state);

/* Makes state.topology's local and cross communicators (collective, once)
 * once discover_topology() found a layout whose nodes hold the same number of
 * ranks. */
ncclResult_t make_hierarchy(const NcclApi& nccl, ncclComm_t comm, int rank, CommState& state);

/* Ends those communicators (`abort`: ncclCommAbort, else ncclCommDestroy),
 * when their parent ends. */
void end_topology(const NcclApi& nccl, CommState& state, bool abort);

/* qncclCommTopology; `fn` names it in messages. */
ncclResult_t comm_topology(const char* fn, ncclComm_t comm, qncclTopology_t* out);

}  // namespace qnccl

#endif
