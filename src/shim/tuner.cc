#include "shim/tuner.h"

#include <math.h>
#include <stdlib.h>

#include <algorithm>
#include <mutex>
#include <tuple>

#include "common/error.h"
#include "config/config.h"
#include "engine/comm_state.h"
#include "engine/compute.h"
#include "engine/engine.h"

namespace qnccl {

bool TuneKey::operator<(const TuneKey& o) const {
  return std::tie(kind, type, size_class) < std::tie(o.kind, o.type, o.size_class);
}

int size_class(size_t bytes) { return bytes == 0 ? 0 : 63 - __builtin_clzll(bytes); }

std::vector<int> tune_candidates(qncclCollective_t kind, int nranks, const Topology& topology) {
  std::vector<int> c = {kExactCandidate};
  if (nranks < 2) return c;
  switch (kind) {
    case qncclCollAllReduce:
      c.insert(c.end(), {qncclAlgoRing, qncclAlgoTree, qncclAlgoSra});
      if (topology.hierarchical()) c.push_back(qncclAlgoHier);
      break;
    case qncclCollReduceScatter: c.insert(c.end(), {qncclAlgoRing, qncclAlgoSra}); break;
    default: c.push_back(qncclAlgoAuto); break;  // the allgather's, the all-to-all's
  }
  if (c.size() > QNCCL_MAX_CANDIDATES) abort();  // qncclTuning_t could not hold them: a bug
  return c;
}

uint64_t trial_calls(const Tuning& t) {
  return t.candidates.size() > 1 && !t.stored ? t.candidates.size() * kTrialsPerCandidate : 0;
}

TuneStep next_step(Tuning& t) {
  const uint64_t call = t.calls++;
  if (t.choice < 0 && t.candidates.size() == 1) t.choice = 0;
  if (t.choice >= 0) return {TuneStep::kDecided, t.choice, false};
  if (call < trial_calls(t)) {  // the quantized candidates in order, then exact
    const int slot = (int)(call / kTrialsPerCandidate) + 1;
    return {TuneStep::kTrial, slot % (int)t.candidates.size(),
            call % kTrialsPerCandidate >= (uint64_t)kUntimedTrials};
  }
  return {TuneStep::kDecide, -1, false};
}

int choose(const AgreedTimes& times) {
  const std::vector<double>& median = times.median;
  int best = 0;
  for (size_t i = 1; i < median.size(); i++) {
    const bool clear = median[i] < median[0] * (1 - kQuantizedGain) &&
                       times.ceiling[i] < times.floor[0];
    if (clear && (best == 0 || median[i] < median[best])) best = (int)i;
  }
  return best;
}

const char* candidate_name(int candidate) {
  if (candidate == kExactCandidate) return "exact";
  return candidate == qncclAlgoAuto ? "quantized" : algo_name((qncclAlgo_t)candidate);
}

void record_trial(Tuning& t, int index, double seconds) {
  if (t.trials.size() != t.candidates.size()) t.trials.resize(t.candidates.size());
  t.trials[index].push_back(seconds);
}

double median_seconds(std::vector<double> seconds) {
  const size_t n = seconds.size();
  if (n == 0) return INFINITY;
  std::sort(seconds.begin(), seconds.end());
  return n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
}

ncclResult_t decide(Tuning& t, const NcclApi& nccl, ncclComm_t comm, cudaStream_t stream,
                    int device, CommState& state) {
  ncclResult_t res = ncclSuccess;
  for (const Tuning::Pending& p : t.pending) {  // device trials: the one wait, for the last
    double seconds = INFINITY;
#ifdef QNCCL_WITH_CUDA
    const ncclResult_t read = timing_elapsed(p.start, p.end, &seconds);
    if (res == ncclSuccess) res = read;
#endif
    record_trial(t, p.index, seconds);
  }
  t.pending.clear();
  QNCCL_CHECK(res);
  const size_t n = t.candidates.size();
  t.trials.resize(n);  // should no trial have been recorded
  std::vector<double> values(3 * n, INFINITY);  // medians, fastest, slowest
  for (size_t i = 0; i < n; i++) {
    const std::vector<double>& trials = t.trials[i];
    values[i] = median_seconds(trials);
    if (trials.empty()) continue;
    const auto [fastest, slowest] = std::minmax_element(trials.begin(), trials.end());
    values[n + i] = *fastest;
    values[2 * n + i] = *slowest;
  }
  t.trials.clear();
  QNCCL_CHECK(agree_max(values, nccl, comm, stream, device, state));
  t.agreed.median.assign(values.begin(), values.begin() + n);
  t.agreed.floor.assign(values.begin() + n, values.begin() + 2 * n);
  t.agreed.ceiling.assign(values.begin() + 2 * n, values.end());
  t.choice = choose(t.agreed);
  return ncclSuccess;
}

ncclResult_t agree_max(std::vector<double>& values, const NcclApi& nccl, ncclComm_t comm,
                       cudaStream_t stream, int device, CommState& state) {
  if (device >= 0) {
#ifdef QNCCL_WITH_CUDA
    return device_max_allreduce(nccl, comm, device, stream, values.data(), values.size(), state);
#else
    return set_error(ncclInternalError, "measured auto: device buffers in a build without CUDA");
#endif
  }
  ncclResult_t res;
  {
    const CommHold hold(state);  // it may wait for the peers: an abort waits for it
    res = hold.held() ? nccl.allReduce(values.data(), values.data(), values.size(), ncclFloat64,
                                       ncclMax, comm, stream)
                      : set_error(ncclInvalidUsage, "measured auto: the communicator was "
                                  "aborted or destroyed during the call");
  }
  if (res == ncclInProgress) res = wait_until_ready(nccl, comm, state);
  return res;
}

ncclResult_t agree_equal(uint64_t value, const NcclApi& nccl, ncclComm_t comm,
                         cudaStream_t stream, int device, CommState& state, bool* equal) {
  const double hi = (double)(value >> 32), lo = (double)(value & 0xffffffffu);
  std::vector<double> v = {hi, lo, -hi, -lo};
  QNCCL_CHECK(agree_max(v, nccl, comm, stream, device, state));
  *equal = v[0] == hi && v[1] == lo && v[2] == -hi && v[3] == -lo;  // max == min
  return ncclSuccess;
}

}  // namespace qnccl
