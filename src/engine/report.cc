#include "engine/report.h"

#include <stdarg.h>
#include <stdio.h>

#include "engine/nccl_api.h"

namespace qnccl {

void info(ncclComm_t comm, qncclDebugLevel_t debug, const char* fmt, ...) {
  if (debug < qncclDebugInfo) return;
  const NcclApi* nccl;
  int rank = -1;
  if (real_nccl(&nccl) == ncclSuccess) nccl->commUserRank(comm, &rank);
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  fprintf(stderr, "QNCCL INFO comm %p rank %d%s\n", (void*)comm, rank, text);
}

void warn(const char* fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  fprintf(stderr, "QNCCL WARN %s\n", text);
}

}  // namespace qnccl
