/* What QNCCL keeps per communicator, from its first quantized call until
 * ncclCommDestroy/ncclCommAbort (exported by libqnccl.so) forgets it. */
#ifndef QNCCL_ENGINE_COMM_STATE_H_
#define QNCCL_ENGINE_COMM_STATE_H_

#include <stdint.h>

#include "nccl_abi.h"

namespace qnccl {

/* The number of this quantized call on `comm`: 0, 1, 2, ... (the `call` of
 * the random streams). Every rank makes the same calls, so all count alike. */
uint64_t next_call(ncclComm_t comm);

/* Drops the state of a communicator that ends; a new one that reuses its
 * handle starts from call 0. */
void forget_comm(ncclComm_t comm);

}  // namespace qnccl

#endif
