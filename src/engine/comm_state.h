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
#include <vector>

#include "qnccl.h"

namespace qnccl {

/* The workspace of the communicator's calls on device buffers
 * (engine/compute_cuda.cu): device memory that only grows, so repeated calls
 * allocate nothing and a CUDA graph captured with it stays valid; freed when
 * the communicator is forgotten. */
struct DeviceWorkspace {
  int device = -1;               // the device it lives on (-1: none yet)
  void* memory = nullptr;
  size_t bytes = 0;
  std::vector<void*> retired;    // outgrown buffers: a captured graph may still use them
  void* done = nullptr;          // cudaEvent_t recorded after each uncaptured call
  bool warned_capture = false;   // the pass-through during capture was reported
};

struct CommState {
  qncclEnvConfig_t config;
  uint64_t calls = 0;            // compressed calls so far: the `call` of the random streams
  uint64_t eligible_calls = 0;   // eligible calls so far (warm-up counts these)
  qncclStats_t stats = {};
  std::set<std::string> logged;  // call kinds already reported at QNCCL_DEBUG=INFO
  std::unordered_map<int, qncclQuantizedOpConfig_t> ops;  // quantized ops by value
  DeviceWorkspace device;        // calls on device buffers
};

/* The state of `comm`, made on first use with `config` (nullptr: from the
 * environment; fails when the environment is bad). The pointer stays valid
 * until forget_comm(comm). Not synchronized per communicator: like NCCL, one
 * thread at a time uses a communicator. */
ncclResult_t comm_state(ncclComm_t comm, const qncclEnvConfig_t* config, CommState** state);

/* Drops the state of a communicator that ends; a new one that reuses its
 * handle starts from call 0. Frees its device workspace with cudaFree, which
 * waits for the device's queued work (as the real ncclCommDestroy does). */
void forget_comm(ncclComm_t comm);

}  // namespace qnccl

#endif
