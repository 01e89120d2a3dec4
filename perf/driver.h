/* The perf driver's parts (perf.h says which file does what): what they
 * share, private to the driver. */
#ifndef QNCCL_PERF_DRIVER_H_
#define QNCCL_PERF_DRIVER_H_

#include <math.h>
#include <stdio.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "perf.h"

namespace perf {

// ---- the collective (reference.cc) ---------------------------------------------------

// What a collective does with a row of `count` elements on N ranks.
struct Shape {
  const char* name;   // JSON "collective": "allreduce", "reducescatter", ...
  bool reduces;       // takes an op
  bool same_output;   // every rank's output is the same bytes (checked)
  bool has_in_place;  // nccl-tests measures it in place too
  size_t divide;      // count is rounded down to a multiple of this (N or 1)
  size_t send, recv;  // elements of each rank's buffers
  size_t param;       // the NCCL call's count
  double busbw;       // bus bandwidth / algorithm bandwidth (nccl-tests' factor)
  double wire;        // bytes each rank sends per input byte, uncompressed
};
Shape shape_of(Collective c, size_t count, int nranks);

// ---- options (options.cc) --------------------------------------------------------------

struct Options {
  size_t min_bytes = 32 << 20, max_bytes = 32 << 20, step_bytes = 1 << 20;
  double step_factor = 1;
  int iters = 20, warmup_iters = 5, check = 1, blocking = 0, average = 1;
  int settle = -1;  // untimed calls per size (-1: the backend's settling_calls())
  int interleave = 0;  // rounds of plain and own calls, alternating (0: own calls only)
  std::vector<const DataType*> types;
  std::vector<const ReduceOp*> ops;
  std::string type_arg = "float", op_arg = "sum";
  std::string json_path;
  Memory memory = Memory::Host;
  std::string memory_arg = "auto";
  std::vector<bool> placements = {false, true};  // in place?
  std::string placement_arg = "both";
};

// Untimed calls before each size's measurement: --settle, else what the backend needs.
inline int settle_calls(const Backend& backend, const Options& opt) {
  return opt.settle >= 0 ? opt.settle : backend.settling_calls();
}

struct BadOption : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws BadOption; returns false after printing the help (-h). A
// collective without a reduction runs with the op "none" (and rejects -o).
bool parse_options(int argc, char** argv, const char* tool, Collective c, Options* opt);
// The sizes of the sweep, in bytes.
std::vector<size_t> sweep(const Options& opt);

// ---- buffers and the reference (reference.cc) -----------------------------------------

class Buffer {
 public:
  Buffer(size_t bytes, Memory memory);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return static_cast<char*>(data_); }
  // Host bytes to and from the buffer, from byte `offset` on.
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill(unsigned char byte, size_t bytes);

 private:
  Memory memory_;
  void* data_ = nullptr;
};

uint64_t mix64(uint64_t x);

// One measured row: a size, type, op and placement.
struct Result {
  size_t size = 0, count = 0;
  const DataType* type = nullptr;
  const ReduceOp* op = nullptr;
  bool in_place = false;
  double time_us = 0, algbw = 0, busbw = 0;  // time: mean over the iterations, as nccl-tests
  double time_median_us = NAN;               // median of the iterations' times (-z 1 only)
  // --interleave: the plain library's calls timed beside these (time_us as above), and the
  // median over the rounds of plain time / own time (> 1: the own calls are faster)
  double plain_time_us = NAN, plain_time_median_us = NAN, vs_plain = NAN;
  bool plain_ok = true;  // --interleave: a plain call's result passed the same check
  bool checked = false, agree = true, send_intact = true, ok = true;
  double error = 0, bound = 0;  // relative to max |exact|
  bool compressed = false;
  std::string algo;
  double wire_per_byte = 0;
};

// The buffers of one type's rows and the calls into the backend.
class Calls {
 public:
  Calls(Backend& backend, Collective c, const Options& opt, int rank, int nranks,
        const DataType& type, size_t max_count);
  // The call of `row` (in place or not), its buffers as the collective places them;
  // `plain`: the plain library's (Backend::start_plain).
  bool call(const Result& row, bool plain = false);
  bool wait();
  // Rank `rank_`'s inputs of `row` (tag: which), into its send buffer.
  void fill_inputs(const Result& row, uint64_t tag);
  // Runs `row` once more on fresh inputs and checks every output value
  // against the exact result (within its bound), that ranks agree bit for
  // bit where they must, and that out of place the send buffer is intact;
  // `plain`: the plain library's call (Backend::start_plain).
  bool check(Result* row, uint64_t tag, bool plain = false);

  Backend& backend;
  const Collective collective;
  const Options& opt;
  const int rank, nranks;

 private:
  struct Place {  // where a call's buffer starts
    Buffer* buffer;
    size_t offset;
    char* data() const { return buffer->data() + offset; }
  };
  Place send_place(const Result& row);
  Place recv_place(const Result& row);
  Buffer send_, recv_;
  std::vector<unsigned char> host_in_, host_out_;
  bool failed_ = false;
};

// ---- timing (timing.cc) -----------------------------------------------------------------

// Times opt.iters calls of `row` (after filling its inputs) into its time,
// bandwidths and bytes on the wire.
bool measure(Calls& calls, Result* row, uint64_t tag);

// ---- output (output.cc) -----------------------------------------------------------------

void print_header(const Backend& backend, const Options& opt, int rank, int nranks,
                  int local_rank);
void print_table_header();
// A row of the table: its out-of-place and in-place results (either null).
void print_row(const Result* out_of_place, const Result* in_place, bool same_output);
// With --interleave, after the row: the plain library's times and the ratios.
void print_plain(const Result* out_of_place, const Result* in_place);
// Prints the summary; returns whether every checked row is ok.
bool print_summary(const Backend& backend, const Options& opt, const std::vector<Result>& rows,
                   double avg_busbw, bool same_output);
bool write_json(FILE* f, const Backend& backend, Collective c, const Options& opt, int nranks,
                const std::vector<Result>& rows, double avg_busbw, const char* check);

}  // namespace perf

#endif
