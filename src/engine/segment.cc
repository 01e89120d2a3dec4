/* The primitives of Segment: compute on the host codec, transport through
 * the real NCCL's point-to-point calls. */
#include <algorithm>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/engine.h"

namespace qnccl {

uint64_t stream_id(uint64_t call, uint64_t segment, uint64_t rank, uint64_t step) {
  return mix64(mix64(mix64(call) ^ segment) ^ (rank << 32 | step));
}

Range Segment::chunk(int k) const {
  const size_t buckets = num_buckets(count, params.bucket);
  const size_t first = buckets * (size_t)k / (size_t)nranks;
  const size_t last = buckets * (size_t)(k + 1) / (size_t)nranks;
  return Range{std::min(count, first * params.bucket), std::min(count, last * params.bucket)};
}

size_t Segment::max_chunk(size_t values, size_t bucket, int nranks) {
  const size_t buckets = num_buckets(values, bucket);
  return std::min(values, (buckets / (size_t)nranks + 1) * bucket);
}

size_t Segment::wire_bytes(size_t values) const {
  return compressed_bytes(values, params.bits, params.bucket);
}

void Segment::encode_input(Range r, uint64_t step, uint8_t* wire) {
  params.stream = stream_id(call, index, (uint64_t)rank, step);
  codec->quantize(input(r), r.size(), type, params, wire);
}

void Segment::encode_acc(const float* acc, size_t n, uint64_t step, uint8_t* wire) {
  params.stream = stream_id(call, index, (uint64_t)rank, step);
  codec->quantize(acc, n, ncclFloat32, params, wire);
}

void Segment::decode_output(const uint8_t* wire, Range r) const {
  codec->dequantize(wire, r.size(), params, output(r), type, false);
}

void Segment::add_decoded(const uint8_t* wire, size_t n, float* acc) const {
  codec->dequantize(wire, n, params, acc, ncclFloat32, true);
}

void Segment::widen_input(Range r, float* acc) const {
  const char* in = input(r);
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    const typename D::T* values = reinterpret_cast<const typename D::T*>(in);
    for (size_t i = 0; i < r.size(); i++) acc[i] = D::load(values[i]);
  });
}

void Segment::finish(float* acc, size_t n) const {
  if (!average) return;
  const float ranks = (float)nranks;
  for (size_t i = 0; i < n; i++) acc[i] = acc[i] / ranks;
}

ncclResult_t Segment::exchange(const Transfer* sends, int nsends, const Transfer* recvs,
                               int nrecvs) const {
  ncclResult_t res = nccl->groupStart();
  for (int i = 0; i < nsends && res == ncclSuccess; i++) {
    if (sends[i].len == 0) continue;
    res = nccl->send(sends[i].bytes, sends[i].len, ncclUint8, sends[i].peer, comm, stream);
    *wire_sent += sends[i].len;
  }
  for (int i = 0; i < nrecvs && res == ncclSuccess; i++)
    if (recvs[i].len > 0)
      res = nccl->recv(recvs[i].bytes, recvs[i].len, ncclUint8, recvs[i].peer, comm, stream);
  const ncclResult_t end = nccl->groupEnd();  // always close the group we opened
  if (res == ncclSuccess) res = end;
  if (res != ncclSuccess)
    return set_error(res, "qncclAllReduce: the NCCL transfer of rank %d failed (%d)", rank,
                     (int)res);
  return ncclSuccess;
}

}  // namespace qnccl
