/* The interposer's shared pieces: reporting to stderr per QNCCL_DEBUG, and
 * the names used in those reports. */
#ifndef QNCCL_SHIM_SHIM_H_
#define QNCCL_SHIM_SHIM_H_

#include "engine/comm_state.h"

namespace qnccl {

/* "QNCCL INFO comm <hex> rank <r>" followed by the text (which starts with
 * ": " or "/<n>: ") when the communicator's QNCCL_DEBUG is INFO or TRACE. */
void info(ncclComm_t comm, const CommState& state, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "QNCCL WARN ...": always printed (the job is about to fail, or degrade). */
void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reports and returns a failure of an interposed call: the application sees
 * NCCL's error code and the message on stderr. */
ncclResult_t fail(ncclResult_t res);

/* "float32", "int32", ... and "sum", "max", ... for reports. */
const char* short_type_name(ncclDataType_t type);
const char* op_name(ncclRedOp_t op);

/* Creates the state of a communicator the real NCCL just made, from the
 * environment read before it was made, and reports its configuration. */
void adopt_comm(ncclComm_t comm, const qncclEnvConfig_t& config);

}  // namespace qnccl

#endif
