// The perf driver's timing: a row's calls timed the nccl-tests way (mean over
// the iterations, combined over ranks as -a says; with -z 1 also the median
// of the calls' own times), its bandwidths and the bytes on the wire; with
// --interleave, in rounds beside the plain library's calls.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n ? (v[(n - 1) / 2] + v[n / 2]) / 2 : NAN;
}

// One side's timed calls so far, in seconds.
struct Side {
  std::vector<double> rounds;   // mean seconds per call of each round, combined over ranks
  std::vector<double> typical;  // each round's median call with -z 1, else its mean, combined
  std::vector<double> calls;    // each call to its completion, this rank's (-z 1 only)
};

// Times opt.iters calls of `row` (the plain library's when `plain`) into `side`, on the
// inputs of `tag` (refilled, untimed: in place, each call sums the last one's output).
bool time_round(Calls& calls, const Result& row, uint64_t tag, bool plain, Side* side) {
  const Options& opt = calls.opt;
  using Clock = std::chrono::steady_clock;
  calls.fill_inputs(row, tag);
  std::vector<double> each;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  for (int i = 0; i < opt.iters; i++) {
    const auto call_start = Clock::now();
    if (!calls.call(row, plain)) return false;
    if (!opt.blocking) continue;
    if (!calls.wait()) return false;
    each.push_back(std::chrono::duration<double>(Clock::now() - call_start).count());
  }
  if (!calls.wait()) return false;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  side->rounds.push_back(combine_time(opt, calls.nranks, seconds / opt.iters));
  side->typical.push_back(opt.blocking ? combine_time(opt, calls.nranks, median_of(each))
                                       : side->rounds.back());
  side->calls.insert(side->calls.end(), each.begin(), each.end());
  return true;
}

double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / (double)v.size();
}

}  // namespace

bool measure(Calls& calls, Result* row, uint64_t tag) {
  const Options& opt = calls.opt;
  const Shape s = shape_of(calls.collective, row->count, calls.nranks);

  WireStats before, after;
  const bool have_stats = calls.backend.wire_stats(&before);
  Side own, plain;
  if (opt.interleave == 0) {
    if (!time_round(calls, *row, tag, false, &own)) return false;
  } else {
    // Rounds of both sides in alternating order (plain first, then own first, ...), so
    // that a drift of the machine's speed weighs on both alike, each round's pair compared
    // by their typical calls (the median call with -z 1: a call the VM's host stalled
    // moves no ratio); the plain side gets two untimed calls first.
    for (int i = 0; i < 2; i++)
      if (!calls.call(*row, true)) return false;
    if (!calls.wait()) return false;
    for (int r = 0; r < opt.interleave; r++) {
      for (bool plain_side : {r % 2 == 0, r % 2 != 0})
        if (!time_round(calls, *row, tag, plain_side, plain_side ? &plain : &own)) return false;
    }
    std::vector<double> ratios;
    for (size_t r = 0; r < own.typical.size(); r++)
      ratios.push_back(plain.typical[r] / own.typical[r]);
    row->vs_plain = median_of(ratios);
    row->plain_time_us = mean_of(plain.rounds) * 1e6;
    if (opt.blocking)
      row->plain_time_median_us = combine_time(opt, calls.nranks, median_of(plain.calls)) * 1e6;
  }
  const double time = mean_of(own.rounds);
  row->time_us = time * 1e6;
  if (opt.blocking)
    row->time_median_us = combine_time(opt, calls.nranks, median_of(own.calls)) * 1e6;
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
  if (!opt.check) return true;
  if (opt.interleave > 0) {  // the plain side's calls are checked too, by one of them
    Result plain_row = *row;
    if (!calls.check(&plain_row, tag, true)) return false;
    row->plain_ok = plain_row.ok;
  }
  if (!calls.check(row, tag)) return false;
  row->ok = row->ok && row->plain_ok;
  return true;
}

}  // namespace perf
