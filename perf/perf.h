/*
 * The driver of QNCCL's nccl-tests style perf binaries (docs/perf.md).
 *
 * A perf binary is a Backend, which only issues one collective of one
 * library, plus perf::run, which owns everything else, in files that each do
 * one job: the options (options.cc), buffers and the exact reference the
 * results are checked against (reference.cc), timing (timing.cc), the table
 * and JSON (output.cc), and the sweep that ties them (perf.cc). One rank per
 * process, launched by mpirun; MPI is the bootstrap.
 */
#ifndef QNCCL_PERF_PERF_H_
#define QNCCL_PERF_PERF_H_

#include <nccl.h>

#include <stddef.h>
#include <stdint.h>

#include <string>

namespace perf {

struct DataType {
  const char* name;  // nccl-tests' name: "float", "half", ...
  ncclDataType_t nccl;
  size_t size;
  bool is_float;
  bool is_signed;
};

struct ReduceOp {
  const char* name;  // "sum", "prod", "max", "min", "avg"; "none" for the collectives without
  ncclRedOp_t nccl;
};

// Where the buffers live: device memory only in builds with CUDA.
enum class Memory { Host, Device };

// The collective a binary measures. The count of a row is nccl-tests': the
// elements of the larger buffer (rounded down to a multiple of the ranks
// where the call divides it among them).
enum class Collective {
  AllReduce,      // ncclAllReduce(count)
  ReduceScatter,  // ncclReduceScatter(recvcount = count / N)
  AllGather,      // ncclAllGather(sendcount = count / N)
  AlltoAll,       // ncclAlltoAll(count / N per peer)
  SendRecv,       // ncclSend(count) to rank + 1, ncclRecv(count) from rank - 1, one group
};

// QNCCL's counters for this communicator (qncclStats_t), when it is loaded.
struct WireStats {
  uint64_t calls_compressed = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_on_wire = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* tool() const = 0;     // program name: "all_reduce_perf"
  virtual const char* library() const = 0;  // JSON "backend": "nccl", "mpi"
  // Empty when this backend can run the combination, else why not.
  virtual std::string unsupported(Collective c, const DataType& type, const ReduceOp& op,
                                  Memory memory) const = 0;
  // After MPI_Init: create the communicator. Prints its own error.
  virtual bool init(int rank, int nranks, int local_rank, Memory memory) = 0;
  // Header lines (without '#') describing the library and its configuration.
  virtual std::string describe() const = 0;
  // JSON value of the "qnccl" key: QNCCL's configuration, or "null".
  virtual std::string quantization_json() const { return "null"; }
  // Issues one call of `c`; `count` is the NCCL call's own count argument.
  virtual bool start(Collective c, const void* send, void* recv, size_t count,
                     const DataType& type, const ReduceOp& op) = 0;
  // The same call of the plain library this binary links, bypassing any library preloaded
  // in front of it (QNCCL): the other side of --interleave. False when there is none.
  virtual bool start_plain(Collective /*c*/, const void* /*send*/, void* /*recv*/,
                           size_t /*count*/, const DataType& /*type*/, const ReduceOp& /*op*/) {
    return false;
  }
  // Where start_plain's calls go; empty when this backend has no plain library.
  virtual std::string plain_library() const { return ""; }
  // Until every call made so far has completed.
  virtual bool wait() = 0;
  // QNCCL's counters; false when QNCCL is not in the process.
  virtual bool wire_stats(WireStats* /*stats*/) const { return false; }
  // QNCCL's a-priori bound on |result - exact| of a compressed call of `c`
  // (`count` as start() takes it), and the algorithm it runs; false when
  // QNCCL is not in the process or gives no bound.
  virtual bool quantization_bound(Collective /*c*/, size_t /*count*/, const DataType& /*type*/,
                                  const ReduceOp& /*op*/, double /*input_abs_max*/,
                                  double* /*bound*/, std::string* /*algo*/) const {
    return false;
  }
  // Untimed calls each size gets before its measurement, so that what runs
  // is settled (QNCCL's measured auto tries its candidates on a size's first
  // calls: docs/tuning.md); 0 when nothing needs them.
  virtual int settling_calls() const { return 0; }
  virtual void finalize() = 0;
};

// main() of a perf binary measuring `collective`: 0 on success, 1 when a
// check failed or a call returned an error, 2 for bad options.
int run(int argc, char** argv, Backend& backend, Collective collective);

}  // namespace perf

#endif
