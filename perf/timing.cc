// The perf driver's timing: a row's calls timed the nccl-tests way (mean over
// the iterations, combined over ranks as -a says; with -z 1 also the median
// of the calls' own times), its bandwidths and the bytes on the wire.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "driver.h"

namespace perf {
namespace {

double combine_time(const Options& opt, int nranks, double seconds) {
  double out = seconds;
  switch (opt.average) {
    case 0: MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); return out;
    case 2: MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); return out;
    case 3: MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); return out;
    default:
      MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      return out / nranks;
  }
}

}  // namespace

bool measure(Calls& calls, Result* row, uint64_t tag) {
  const Options& opt = calls.opt;
  const Shape s = shape_of(calls.collective, row->count, calls.nranks);
  calls.fill_inputs(*row, tag);

  WireStats before, after;
  const bool have_stats = calls.backend.wire_stats(&before);
  using Clock = std::chrono::steady_clock;
  std::vector<double> iteration_seconds;  // each call to its completion, with -z 1
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  for (int i = 0; i < opt.iters; i++) {
    const auto call_start = Clock::now();
    if (!calls.call(*row)) return false;
    if (!opt.blocking) continue;
    if (!calls.wait()) return false;
    iteration_seconds.push_back(std::chrono::duration<double>(Clock::now() - call_start).count());
  }
  if (!calls.wait()) return false;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double time = combine_time(opt, calls.nranks, seconds / opt.iters);
  row->time_us = time * 1e6;
  if (opt.blocking) {
    std::sort(iteration_seconds.begin(), iteration_seconds.end());
    const size_t n = iteration_seconds.size();
    const double median = (iteration_seconds[(n - 1) / 2] + iteration_seconds[n / 2]) / 2;
    row->time_median_us = combine_time(opt, calls.nranks, median) * 1e6;
  }
  row->algbw = time > 0 ? (double)row->size / 1e9 / time : 0;
  row->busbw = row->algbw * s.busbw;

  double wire = s.wire;
  if (have_stats && calls.backend.wire_stats(&after) &&
      after.calls_compressed > before.calls_compressed) {
    row->compressed = true;
    const uint64_t in = after.bytes_in - before.bytes_in;
    wire = in ? (double)(after.bytes_on_wire - before.bytes_on_wire) / (double)in : 0;
  }
  MPI_Allreduce(MPI_IN_PLACE, &wire, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  row->wire_per_byte = wire / calls.nranks;
  return opt.check ? calls.check(row, tag) : true;
}

}  // namespace perf
