// all_gather_perf: ncclAllGather measured the nccl-tests way (docs/perf.md).
#include "nccl_backend.h"

int main(int argc, char** argv) {
  return perf::run_nccl(argc, argv, "all_gather_perf", perf::Collective::AllGather);
}
