/* The perf binaries over NCCL (nccl_backend.cc): each is this with its
 * collective. */
#ifndef QNCCL_PERF_NCCL_BACKEND_H_
#define QNCCL_PERF_NCCL_BACKEND_H_

#include "perf.h"

namespace perf {

// main() of the NCCL perf binary `tool` measuring `collective`.
int run_nccl(int argc, char** argv, const char* tool, Collective collective);

}  // namespace perf

#endif
