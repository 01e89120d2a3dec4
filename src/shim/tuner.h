/* Measured auto (docs/tuning.md): with QNCCL_ALGO=auto the interposer tries
 * the candidates of each (collective, type, size class) of a communicator on
 * the job's own first calls of it (the real NCCL's exact call and each
 * quantized algorithm that applies), the ranks agree on the one whose
 * slowest rank's median trial was fastest, and that candidate runs from then on. Bits and
 * bucket stay the user's: only speed is tuned.
 *
 * Every rank issues the same calls, so a key's call count, its candidates
 * and the call at which it decides are values all ranks share; the times
 * differ per rank and enter the decision only through one exact allreduce
 * (the maximum), so every rank decides alike. */
#ifndef QNCCL_SHIM_TUNER_H_
#define QNCCL_SHIM_TUNER_H_

#include <stddef.h>
#include <stdint.h>

#include <map>
#include <vector>

#include "engine/nccl_api.h"
#include "engine/topology.h"
#include "qnccl.h"

namespace qnccl {

struct CommState;

/* A candidate: the real NCCL's exact call, or a quantized algorithm
 * (qncclAlgoAuto: the one an allgather or all-to-all has). */
constexpr int kExactCandidate = QNCCL_EXACT_CANDIDATE;

/* Each candidate's trials run in a row, the quantized ones first and exact's
 * last: the first two warm it up and are not timed, and of the timed ones the
 * median counts. The first trials of a size meet the job cold (the perf
 * binaries' warm-up calls are trials too): run first, exact's took 0.34 ms at
 * 64 KiB over shared memory against 0.25 once warm, and auto chose tree, which
 * then ran 0.82-0.88x of the plain NCCL. Last, exact finds the job as warm as a
 * decided key does, and whatever cold start remains slows a quantized
 * candidate, which must beat exact clearly anyway. A
 * decided key runs its choice call after call, and that steady state is
 * what the trials must measure: a candidate's first calls at a new size pay
 * for what later ones reuse (the exact call over Open MPI's shared memory
 * took 3-5 times its steady time on the first run and up to twice on the
 * second), and a call right after another candidate's finds that one's
 * buffers in the caches and the ranks leaving at that one's skew (in rounds
 * of one call per candidate, exact's trials over shared memory on 4 ranks
 * at 4 MiB took 8.5 ms against 4.1 once warm, SRA's 6.5 against 8.0: auto
 * ran SRA, 0.71x the exact call). The median, not the fastest trial: a
 * fastest trial rewards one lucky call. */
constexpr int kTrialsPerCandidate = QNCCL_TRIALS_PER_CANDIDATE;
constexpr int kUntimedTrials = 2;

/* A quantized candidate is chosen over the exact call only when its agreed
 * median is less than (1 - kQuantizedGain) of exact's and its timed trials
 * stay apart from exact's: its slowest trial on any rank took less than the
 * slowest rank's fastest trial of exact. It costs accuracy, and three trials
 * cannot tell a near-tie apart where one call's time swings by a third (64 KiB
 * over shared memory on a busy 2-core VM: medians alone chose a quantized
 * algorithm in 4 of 8 jobs, which then ran 0.78-0.95x of the plain NCCL), so
 * that goes to the exact call (never slower than the real NCCL). Where
 * compression pays (a slow link) every trial of it beats every trial of exact. */
constexpr double kQuantizedGain = 0.05;

/* What a decision is kept under, per communicator. */
struct TuneKey {
  qncclCollective_t kind;
  ncclDataType_t type;
  int size_class;  // floor(log2(bytes of this rank's input)): 20 is 1-2 MiB
  bool operator<(const TuneKey& o) const;
};

/* The size class of a call whose input on each rank is `bytes` (>= 1). */
int size_class(size_t bytes);

/* The candidates of a call of `kind` on `nranks` ranks laid out as
 * `topology` says: exact first, then the quantized algorithms that apply
 * (an allreduce: ring, tree, SRA, and hierarchical on two or more even
 * nodes; a reduce-scatter: ring and SRA; an allgather or all-to-all: its
 * one). One rank has only exact: nothing crosses a link. */
std::vector<int> tune_candidates(qncclCollective_t kind, int nranks, const Topology& topology);

/* The agreed times of a key's candidates (seconds, in candidate order). */
struct AgreedTimes {
  std::vector<double> median;   // the slowest rank's median trial
  std::vector<double> floor;    // the slowest rank's fastest timed trial
  std::vector<double> ceiling;  // the slowest timed trial of any rank
};

/* One key of one communicator. */
struct Tuning {
  std::vector<int> candidates;
  uint64_t calls = 0;           // its calls so far (trials, the deciding call, the rest)
  std::vector<std::vector<double>> trials;  // this rank's trials of each candidate, seconds
  AgreedTimes agreed;           // once decided (a stored decision: its medians only)
  int choice = -1;              // decided: an index into candidates
  bool stored = false;          // decided by QNCCL_TUNE_FILE (shim/tune_file.h), no trials
  /* Trials on device buffers: events around each on the call's stream, read
   * by the deciding call (engine/compute.h, timing_event). */
  struct Pending {
    int index;
    void* start;
    void* end;
  };
  std::vector<Pending> pending;
};

/* What one call of a key does. */
struct TuneStep {
  enum What { kTrial, kDecide, kDecided } what;
  int index;  // kTrial: the candidate it tries; kDecided: the choice
  bool timed;  // kTrial: past the candidate's untimed trials
};

/* How many of a key's calls are trials: kTrialsPerCandidate for each of
 * its C candidates, none when one candidate or QNCCL_TUNE_FILE decided it. */
uint64_t trial_calls(const Tuning& t);

/* The next call's step, counting it: call i < trial_calls(t) tries the
 * (i / kTrialsPerCandidate + 1)-th candidate, exact (the 0th) after the last one
 * (timed from its kUntimedTrials-th trial on); the next call decides first; later
 * ones run the choice.
 * A key with one candidate is decided at once, without trials. */
TuneStep next_step(Tuning& t);

/* Of the quantized candidates that beat exact (candidate 0) clearly (median
 * kQuantizedGain below exact's, ceiling below exact's floor), the one with
 * the least median (a tie goes to the earlier one); exact when none does. */
int choose(const AgreedTimes& times);

/* "exact", "ring", ..., or "quantized" for an allgather's or all-to-all's. */
const char* candidate_name(int candidate);

/* Records a trial of candidate `index` that took `seconds` on this rank. */
void record_trial(Tuning& t, int index, double seconds);

/* The median of `seconds` (of an even count, the mean of the middle two);
 * infinity for none. */
double median_seconds(std::vector<double> seconds);

/* values = their maximum over the ranks: one exact allreduce (float64) of
 * the real NCCL on `comm`, in host memory for calls on host buffers
 * (`device` -1), else in memory of `device` on `stream` (which it waits
 * for). Fails as the allreduce does. */
ncclResult_t agree_max(std::vector<double>& values, const NcclApi& nccl, ncclComm_t comm,
                       cudaStream_t stream, int device, CommState& state);

/* Whether every rank holds the same 64-bit `value`: agree_max of its halves
 * and their negations (exact in float64). */
ncclResult_t agree_equal(uint64_t value, const NcclApi& nccl, ncclComm_t comm,
                         cudaStream_t stream, int device, CommState& state, bool* equal);

/* The deciding call's agreement: this rank's median, fastest and slowest timed
 * trial of every candidate, their maximum over the ranks in one agree_max,
 * then the choice. */
ncclResult_t decide(Tuning& t, const NcclApi& nccl, ncclComm_t comm, cudaStream_t stream,
                    int device, CommState& state);

/* The decisions of one communicator. */
using TuneTable = std::map<TuneKey, Tuning>;

}  // namespace qnccl

#endif
