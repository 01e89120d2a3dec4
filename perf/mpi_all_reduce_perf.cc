// mpi_all_reduce_perf: MPI's own MPI_Allreduce, measured and printed exactly
// like all_reduce_perf, as the baseline a CPU cluster would otherwise use
// (docs/perf.md).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <string>

#include "perf.h"

namespace {

MPI_Datatype mpi_type(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;  // MPI has no 16-bit float types
  }
}

MPI_Op mpi_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: return MPI_OP_NULL;  // MPI has no average
  }
}

class MpiAllReduce : public perf::Backend {
 public:
  const char* tool() const override { return "mpi_all_reduce_perf"; }
  const char* library() const override { return "mpi"; }

  std::string unsupported(perf::Collective c, const perf::DataType& type,
                          const perf::ReduceOp& op, perf::Memory memory) const override {
    if (c != perf::Collective::AllReduce) return "mpi_all_reduce_perf measures MPI_Allreduce only";
    if (memory == perf::Memory::Device) {
      return "--memory device: the MPI baseline uses host memory (CUDA-aware MPI is not assumed)";
    }
    if (mpi_type(type.nccl) == MPI_DATATYPE_NULL) {
      return std::string("MPI has no datatype for ") + type.name +
             " (allowed: int8, uint8, int32, uint32, int64, uint64, float, double)";
    }
    if (mpi_op(op.nccl) == MPI_OP_NULL) {
      return std::string("MPI has no reduction op ") + op.name + " (allowed: sum, prod, max, min)";
    }
    return "";
  }

  bool init(int rank, int, int, perf::Memory) override {
    rank_ = rank;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // report, then abort the job
    return true;
  }

  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string text(version, length);
    return "MPI_Allreduce of " + text.substr(0, text.find_first_of("\n,"));
  }

  bool start(perf::Collective, const void* send, void* recv, size_t count,
             const perf::DataType& type, const perf::ReduceOp& op) override {
    if (count > INT_MAX) {  // MPI-3 counts are int
      fprintf(stderr, "rank %d: MPI_Allreduce takes at most %d values, asked for %zu\n", rank_,
              INT_MAX, count);
      return false;
    }
    int r = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count,
                          mpi_type(type.nccl), mpi_op(op.nccl), comm_);
    if (r != MPI_SUCCESS) {
      char message[MPI_MAX_ERROR_STRING];
      int length = 0;
      MPI_Error_string(r, message, &length);
      fprintf(stderr, "rank %d: MPI_Allreduce failed: %s\n", rank_, message);
      return false;
    }
    return true;
  }

  bool wait() override { return true; }  // MPI_Allreduce is blocking

  void finalize() override { MPI_Comm_free(&comm_); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  MpiAllReduce backend;
  return perf::run(argc, argv, backend, perf::Collective::AllReduce);
}
