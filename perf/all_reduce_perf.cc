// all_reduce_perf: ncclAllReduce measured the nccl-tests way (docs/perf.md).
#include "nccl_backend.h"

int main(int argc, char** argv) {
  return perf::run_nccl(argc, argv, "all_reduce_perf", perf::Collective::AllReduce);
}
