/* Error reporting of the public API: a result code plus a message that names
 * the offending argument or setting and what is allowed, kept per thread for
 * qncclGetLastError(). */
#ifndef QNCCL_COMMON_ERROR_H_
#define QNCCL_COMMON_ERROR_H_

#include "nccl_abi.h"

/* Marks an entry point exported from libqnccl.so (everything else is hidden). */
#define QNCCL_EXPORT extern "C" __attribute__((visibility("default")))

/* Returns from the calling function when `call` fails. */
#define QNCCL_CHECK(call)                             \
  do {                                                \
    ncclResult_t qnccl_res_ = (call);                 \
    if (qnccl_res_ != ncclSuccess) return qnccl_res_; \
  } while (0)

namespace qnccl {

/* Records the message and returns `code`, so callers write
 *   return set_error(ncclInvalidArgument, "...", ...);                      */
ncclResult_t set_error(ncclResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* A failure `res` (whose message set_error recorded) with the printf-style
 * context put in front: "<context>: <message>". ncclSuccess passes through. */
ncclResult_t prefix_error(ncclResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of the last set_error on this thread (qncclGetLastError,
 * and the host backend's ncclGetLastError). */
const char* last_error();

/* Name of an NCCL data type for messages ("ncclFloat32", or "unknown"). */
const char* type_name(ncclDataType_t type);

}  // namespace qnccl

#endif
