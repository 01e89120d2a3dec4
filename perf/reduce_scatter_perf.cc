// reduce_scatter_perf: ncclReduceScatter measured the nccl-tests way (docs/perf.md).
#include "nccl_backend.h"

int main(int argc, char** argv) {
  return perf::run_nccl(argc, argv, "reduce_scatter_perf", perf::Collective::ReduceScatter);
}
