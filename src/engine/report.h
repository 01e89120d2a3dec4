/* Reports on stderr: INFO lines per QNCCL_DEBUG, and warnings. */
#ifndef QNCCL_ENGINE_REPORT_H_
#define QNCCL_ENGINE_REPORT_H_

#include "qnccl.h"

namespace qnccl {

/* "QNCCL INFO comm <hex> rank <r>" followed by the text (which starts with
 * ": " or "/<n>: ") when `debug` (the communicator's QNCCL_DEBUG) is INFO or
 * TRACE. */
void info(ncclComm_t comm, qncclDebugLevel_t debug, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "QNCCL WARN ...": always printed (the job is about to fail, or degrade). */
void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace qnccl

#endif
