// sendrecv_perf: ncclSend to the next rank and ncclRecv from the previous one, in one group measured the nccl-tests way (docs/perf.md).
#include "nccl_backend.h"

int main(int argc, char** argv) {
  return perf::run_nccl(argc, argv, "sendrecv_perf", perf::Collective::SendRecv);
}
