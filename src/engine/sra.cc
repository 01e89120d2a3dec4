/* Quantized SRA allreduce (docs/allreduce.md, "SRA"): every rank sends each
 * chunk straight to its owner (all-to-all), the owner adds them, in rank
 * order once all have arrived, and encodes the result once, and every owner
 * sends its bytes to all (all-to-all).
 * Two quantizations on every value's path, whatever the rank count. The
 * first all-to-all alone is SRA's quantized ncclReduceScatter
 * (docs/collectives.md): one quantization per contribution. */
#include "engine/engine.h"

#include "common/error.h"

namespace qnccl {

ncclResult_t scatter_reduce(Segment& s, Workspace& w, Range (*part)(const Segment&, int),
                            size_t slot, bool own_residual, float* acc) {
  const int n = s.nranks, r = s.rank;
  const Range own = part(s, r);
  // Slot k holds what goes to rank k; slot n + k what comes from rank k.
  auto to = [&](int k) { return w.slot((size_t)k, slot); };
  auto from = [&](int k) { return w.slot((size_t)(n + k), slot); };
  std::vector<Transfer> sends(n), recvs(n);  // indexed by peer
  std::vector<Range> parts;                  // the others', encoded in one step
  std::vector<uint64_t> steps;
  std::vector<uint8_t*> wires;
  for (int k = 0; k < n; k++) {
    if (k == r) continue;
    const Range c = part(s, k);
    parts.push_back(c);
    steps.push_back((uint64_t)k);
    wires.push_back(to(k));
    sends[k] = {to(k), s.wire_bytes(c.size()), k};
    recvs[k] = {from(k), s.wire_bytes(own.size()), k};
  }
  s.encode_inputs(parts.data(), steps.data(), (int)parts.size(), wires.data());
  QNCCL_CHECK(s.all_to_all(sends.data(), recvs.data()));
  std::vector<const uint8_t*> received;  // in rank order
  for (int j = 0; j < n; j++)
    if (j != r) received.push_back(from(j));
  s.reduce_input(own, received.data(), (int)received.size(), acc, own_residual);
  return s.status;
}

ncclResult_t sra(Segment& s, Workspace& w) {
  const int n = s.nranks, r = s.rank;
  const Range own = s.chunk(r);
  const size_t slot = s.wire_bytes(Segment::max_chunk(s.count, s.params.bucket, n));
  w.acc.resize(own.size());
  w.wire.resize(2 * (size_t)n * slot);
  auto to = [&](int k) { return w.slot((size_t)k, slot); };
  auto from = [&](int k) { return w.slot((size_t)(n + k), slot); };
  float* acc = w.acc.data();

  // Scatter-reduce: chunk k of this rank's values goes to rank k.
  QNCCL_CHECK(scatter_reduce(
      s, w, [](const Segment& g, int k) { return g.chunk(k); }, slot, true, acc));

  // Allgather: this rank's result, encoded once, goes to every rank.
  std::vector<Transfer> sends(n), recvs(n);  // indexed by peer
  s.encode_result(own, acc, (uint64_t)n, to(r));
  s.decode_output(to(r), own);
  for (int k = 0; k < n; k++) {
    if (k == r) continue;
    sends[k] = {to(r), s.wire_bytes(own.size()), k};
    recvs[k] = {from(k), s.wire_bytes(s.chunk(k).size()), k};
  }
  QNCCL_CHECK(s.all_to_all(sends.data(), recvs.data()));
  std::vector<const uint8_t*> received;
  std::vector<Range> ranges;
  for (int k = 0; k < n; k++) {
    if (k == r) continue;
    received.push_back(from(k));
    ranges.push_back(s.chunk(k));
  }
  s.decode_outputs(received.data(), ranges.data(), (int)received.size());
  return ncclSuccess;
}

ncclResult_t reduce_scatter_sra(Segment& s, Workspace& w) {
  const size_t slot = s.wire_bytes(s.count);
  w.acc.resize(s.count);
  w.wire.resize(2 * (size_t)s.nranks * slot);
  float* acc = w.acc.data();
  QNCCL_CHECK(scatter_reduce(
      s, w, [](const Segment& g, int k) { return g.piece(k); }, slot, false, acc));
  s.store_result(acc);
  return s.status;
}

}  // namespace qnccl
