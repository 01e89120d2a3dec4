/* What QNCCL keeps per communicator: its configuration (read from the
 * environment when it was created, or at its first call), its call count,
 * statistics and quantized ops. Created on first use, dropped by
 * ncclCommDestroy/ncclCommAbort (exported by libqnccl.so). */
#ifndef QNCCL_ENGINE_COMM_STATE_H_
#define QNCCL_ENGINE_COMM_STATE_H_

#include <stdint.h>

#include <set>
#include <string>
#include <unordered_map>

#include "qnccl.h"

namespace qnccl {

struct CommState {
  qncclEnvConfig_t config;
  uint64_t calls = 0;            // compressed calls so far: the `call` of the random streams
  uint64_t eligible_calls = 0;   // eligible calls so far (warm-up counts these)
  qncclStats_t stats = {};
  std::set<std::string> logged;  // call kinds already reported at QNCCL_DEBUG=INFO
  std::unordered_map<int, qncclQuantizedOpConfig_t> ops;  // quantized ops by value
};

/* The state of `comm`, made on first use with `config` (nullptr: from the
 * environment; fails when the environment is bad). The pointer stays valid
 * until forget_comm(comm). Not synchronized per communicator: like NCCL, one
 * thread at a time uses a communicator. */
ncclResult_t comm_state(ncclComm_t comm, const qncclEnvConfig_t* config, CommState** state);

/* Drops the state of a communicator that ends; a new one that reuses its
 * handle starts from call 0. */
void forget_comm(ncclComm_t comm);

}  // namespace qnccl

#endif
