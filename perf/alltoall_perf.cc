// alltoall_perf: ncclAlltoAll measured the nccl-tests way (docs/perf.md).
#include "nccl_backend.h"

int main(int argc, char** argv) {
  return perf::run_nccl(argc, argv, "alltoall_perf", perf::Collective::AlltoAll);
}
