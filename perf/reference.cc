// The perf driver's buffers and reference: what each collective does to a
// row (shape_of), the inputs every rank can rebuild, the exact result every
// output value is checked against, and the calls into the backend with the
// buffers placed as the collective wants them (docs/perf.md, "Checks").
#include <mpi.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "codec/dtype.h"
#include "driver.h"

#ifdef QNCCL_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace perf {

Shape shape_of(Collective c, size_t count, int nranks) {
  const size_t n = (size_t)nranks;
  const double spread = nranks > 1 ? (double)(nranks - 1) / nranks : 0;
  switch (c) {
    case Collective::ReduceScatter:
      return {"reducescatter", true, false, true, n, count, count / n, count / n, spread, spread};
    case Collective::AllGather:
      return {"allgather", false, true, true, n, count / n, count, count / n, spread,
              (double)(nranks - 1)};
    case Collective::AlltoAll:
      return {"alltoall", false, false, false, n, count, count, count / n, spread, spread};
    case Collective::SendRecv:
      return {"sendrecv", false, false, false, 1, count, count, count, 1, nranks > 1 ? 1.0 : 0};
    default:
      return {"allreduce", true, true, true, 1, count, count, count, 2 * spread, 2 * spread};
  }
}

// ---- buffers ---------------------------------------------------------------------

Buffer::Buffer(size_t bytes, Memory memory) : memory_(memory) {
#ifdef QNCCL_PERF_CUDA
  if (memory == Memory::Device) {
    if (cudaMalloc(&data_, std::max<size_t>(bytes, 1)) != cudaSuccess) throw std::bad_alloc();
    return;
  }
#endif
  data_ = malloc(std::max<size_t>(bytes, 1));
  if (!data_) throw std::bad_alloc();
}

Buffer::~Buffer() {
#ifdef QNCCL_PERF_CUDA
  if (memory_ == Memory::Device) {
    cudaFree(data_);
    return;
  }
#endif
  free(data_);
}

namespace {

void copy(Memory memory, void* dst, const void* src, size_t bytes) {
#ifdef QNCCL_PERF_CUDA
  if (memory == Memory::Device) {
    // cudaMemcpy from pageable memory may return before its DMA has reached the
    // device (CUDA's API synchronization behaviour), and the calls run on a
    // non-blocking stream, which does not wait for the legacy stream's copy:
    // wait for it (on an H200 the first in-place call read stale bytes).
    cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    cudaDeviceSynchronize();
    return;
  }
#endif
  (void)memory;
  memcpy(dst, src, bytes);
}

}  // namespace

void Buffer::upload(const void* host, size_t bytes, size_t offset) {
  copy(memory_, data() + offset, host, bytes);
}

void Buffer::download(void* host, size_t bytes, size_t offset) const {
  copy(memory_, host, data() + offset, bytes);
}

void Buffer::fill(unsigned char byte, size_t bytes) {
#ifdef QNCCL_PERF_CUDA
  if (memory_ == Memory::Device) {
    cudaMemset(data_, byte, bytes);  // asynchronous, on the legacy stream (as copy() says)
    cudaDeviceSynchronize();
    return;
  }
#endif
  memset(data_, byte, bytes);
}

// ---- inputs and the exact result --------------------------------------------------

namespace {

// Unit roundoff of a float type's arithmetic.
double unit_roundoff(const DataType& type) {
  switch (type.nccl) {
    case ncclFloat16: return 0x1p-11;
    case ncclBfloat16: return 0x1p-8;
    case ncclFloat32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

// ---- inputs and the exact result --------------------------------------------------

}  // namespace

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

// Rank r's input i, as a double holding exactly the value stored in the
// buffer: a pure function of (tag, r, i), so every rank can rebuild all
// inputs. Floats: uniform in [-1, 1) on a 2^-23 grid (prod: [0.5, 1.5));
// integers: small values, so sums stay exact in every type.
double input_value(const DataType& type, const ReduceOp& op, uint64_t tag, int rank, size_t i) {
  uint64_t h = mix64(mix64(tag ^ ((uint64_t)rank << 48)) + i);
  bool prod = op.nccl == ncclProd;
  if (!type.is_float) {
    if (prod) return (double)(1 + (h >> 63)) * (type.is_signed && (h >> 62 & 1) ? -1 : 1);
    return type.is_signed ? (double)(int)(h >> 60) - 8 : (double)(h >> 61);
  }
  double v = prod ? 0.5 + (double)(h >> 40) * 0x1p-24 : (double)(h >> 40) * 0x1p-23 - 1;
  switch (type.nccl) {  // round to the type as storing it would
    case ncclFloat16: return qnccl::f16_to_f32(qnccl::f32_to_f16((float)v));
    case ncclBfloat16: return qnccl::bf16_to_f32(qnccl::f32_to_bf16((float)v));
    default: return v;
  }
}

void store(const DataType& type, double v, void* base, size_t i) {
  switch (type.nccl) {
    case ncclInt8: ((int8_t*)base)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)base)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)base)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)base)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)base)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)base)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)base)[i] = qnccl::f32_to_f16((float)v); break;
    case ncclBfloat16: ((uint16_t*)base)[i] = qnccl::f32_to_bf16((float)v); break;
    case ncclFloat32: ((float*)base)[i] = (float)v; break;
    default: ((double*)base)[i] = v; break;
  }
}

double load(const DataType& type, const void* base, size_t i) {
  switch (type.nccl) {
    case ncclInt8: return ((const int8_t*)base)[i];
    case ncclUint8: return ((const uint8_t*)base)[i];
    case ncclInt32: return ((const int32_t*)base)[i];
    case ncclUint32: return ((const uint32_t*)base)[i];
    case ncclInt64: return (double)((const int64_t*)base)[i];
    case ncclUint64: return (double)((const uint64_t*)base)[i];
    case ncclFloat16: return qnccl::f16_to_f32(((const uint16_t*)base)[i]);
    case ncclBfloat16: return qnccl::bf16_to_f32(((const uint16_t*)base)[i]);
    case ncclFloat32: return ((const float*)base)[i];
    default: return ((const double*)base)[i];
  }
}

// An integer wrapped to the width and signedness of `type`.
double wrap(const DataType& type, uint64_t bits) {
  switch (type.nccl) {
    case ncclInt8: return (int8_t)bits;
    case ncclUint8: return (uint8_t)bits;
    case ncclInt32: return (int32_t)bits;
    case ncclUint32: return (uint32_t)bits;
    case ncclInt64: return (double)(int64_t)bits;
    default: return (double)bits;
  }
}

// The exact reduction of every rank's input i: floats in double (exact for
// sums of these inputs), integers with the type's wrap-around and integer
// division. Also raises *input_abs_max to the largest |input| of it.
double exact_reduction(const DataType& type, const ReduceOp& op, uint64_t tag, int nranks,
                       size_t i, double* input_abs_max) {
  double lo = INFINITY, hi = -INFINITY, sum = 0, prod = 1;
  uint64_t isum = 0, iprod = 1;
  for (int r = 0; r < nranks; r++) {
    double v = input_value(type, op, tag, r, i);
    *input_abs_max = std::max(*input_abs_max, std::fabs(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
    prod *= v;
    isum += (uint64_t)(int64_t)v;
    iprod *= (uint64_t)(int64_t)v;
  }
  switch (op.nccl) {
    case ncclMin: return lo;
    case ncclMax: return hi;
    case ncclProd: return type.is_float ? prod : wrap(type, iprod);
    case ncclAvg:
      if (type.is_float) return sum / nranks;
      return type.is_signed ? (double)((int64_t)wrap(type, isum) / nranks)
                            : (double)((uint64_t)wrap(type, isum) / (uint64_t)nranks);
    default: return type.is_float ? sum : wrap(type, isum);
  }
}

uint64_t hash_bytes(const void* data, size_t bytes) {
  const unsigned char* p = (const unsigned char*)data;
  uint64_t h = bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    memcpy(&word, p + i, 8);
    h = (h ^ word) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  for (; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return mix64(h);
}

}  // namespace

// ---- the calls -----------------------------------------------------------------------

Calls::Calls(Backend& b, Collective c, const Options& o, int r, int n, const DataType& type,
             size_t max_count)
    : backend(b), collective(c), opt(o), rank(r), nranks(n),
      send_(shape_of(c, max_count, n).send * type.size, o.memory),
      recv_(shape_of(c, max_count, n).recv * type.size, o.memory) {
  const Shape s = shape_of(c, max_count, n);
  host_in_.assign(s.send * type.size, 0);
  host_out_.assign(s.recv * type.size, 0);
  send_.fill(0, s.send * type.size);
}

// In place, nccl-tests' placement: the allreduce's output is its input, the
// reduce-scatter's is chunk `rank` of its input, the allgather's input is
// chunk `rank` of its output.
Calls::Place Calls::send_place(const Result& row) {
  if (row.in_place && collective == Collective::AllGather)
    return {&recv_, (size_t)rank * shape_of(collective, row.count, nranks).param * row.type->size};
  return {&send_, 0};
}

Calls::Place Calls::recv_place(const Result& row) {
  if (!row.in_place || collective == Collective::AllGather) return {&recv_, 0};
  if (collective == Collective::ReduceScatter)
    return {&send_, (size_t)rank * shape_of(collective, row.count, nranks).param * row.type->size};
  return {&send_, 0};
}

bool Calls::call(const Result& row, bool plain) {
  const Shape s = shape_of(collective, row.count, nranks);
  void* send = send_place(row).data();
  void* recv = recv_place(row).data();
  if (!(plain ? backend.start_plain(collective, send, recv, s.param, *row.type, *row.op)
              : backend.start(collective, send, recv, s.param, *row.type, *row.op)))
    failed_ = true;
  return !failed_;
}

bool Calls::wait() {
  if (!backend.wait()) failed_ = true;
  return !failed_;
}

void Calls::fill_inputs(const Result& row, uint64_t tag) {
  const DataType& type = *row.type;
  const size_t n = shape_of(collective, row.count, nranks).send;
  for (size_t i = 0; i < n; i++) store(type, input_value(type, *row.op, tag, rank, i), host_in_.data(), i);
  const Place at = send_place(row);
  at.buffer->upload(host_in_.data(), n * type.size, at.offset);
}

bool Calls::check(Result* row, uint64_t tag, bool plain) {
  const DataType& type = *row->type;
  const ReduceOp& op = *row->op;
  const Shape s = shape_of(collective, row->count, nranks);
  tag ^= 0x5eed;  // fresh inputs: the timed in-place loop overwrote the buffer
  fill_inputs(*row, tag);
  const size_t out_bytes = s.recv * type.size;
  if (!row->in_place) recv_.fill(0xa5, out_bytes);  // the result must overwrite all of it

  WireStats before, after;
  const bool have_stats = backend.wire_stats(&before);
  if (!call(*row, plain) || !wait()) return false;
  const bool compressed = have_stats && backend.wire_stats(&after) &&
                          after.calls_compressed > before.calls_compressed;
  const Place out = recv_place(*row);
  out.buffer->download(host_out_.data(), out_bytes, out.offset);
  int intact = 1;
  if (!row->in_place) {
    std::vector<unsigned char> sent(s.send * type.size);
    send_.download(sent.data(), sent.size());
    intact = memcmp(sent.data(), host_in_.data(), sent.size()) == 0;
  }

  // Every rank checks its own output (the allreduce's ranks a slice each:
  // they must agree anyway); hashes of the whole output show whether ranks
  // hold the same bytes where they must.
  size_t lo = 0, hi = s.recv;
  if (collective == Collective::AllReduce) {
    lo = s.recv * rank / nranks;
    hi = s.recv * (rank + 1) / nranks;
  }
  double local[3] = {0, 0, 0};  // max |out - exact|, max |exact|, max |input|
  for (size_t i = lo; i < hi; i++) {
    double exact;
    switch (collective) {
      case Collective::ReduceScatter:
        exact = exact_reduction(type, op, tag, nranks, (size_t)rank * s.param + i, &local[2]);
        break;
      case Collective::AllGather:
        exact = input_value(type, op, tag, (int)(i / s.param), i % s.param);
        break;
      case Collective::AlltoAll:
        exact = input_value(type, op, tag, (int)(i / s.param), (size_t)rank * s.param + i % s.param);
        break;
      case Collective::SendRecv:
        exact = input_value(type, op, tag, (rank + nranks - 1) % nranks, i);
        break;
      default:
        exact = exact_reduction(type, op, tag, nranks, i, &local[2]);
    }
    if (!s.reduces) local[2] = std::max(local[2], std::fabs(exact));
    const double err = std::fabs(load(type, host_out_.data(), i) - exact);
    local[0] = std::isnan(err) ? INFINITY : std::max(local[0], err);
    local[1] = std::max(local[1], std::fabs(exact));
  }
  double global[3];
  MPI_Allreduce(local, global, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &intact, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const uint64_t hash = hash_bytes(host_out_.data(), out_bytes);
  std::vector<uint64_t> hashes(nranks);
  MPI_Allgather(&hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);

  double bound = 0;
  if (compressed) {
    std::string algo;
    // No a-priori bound (error feedback): ranks must still agree bit for bit.
    if (!backend.quantization_bound(collective, s.param, type, op, global[2], &bound, &algo))
      bound = INFINITY;
    row->algo = algo;
  } else if (s.reduces && type.is_float && op.nccl != ncclMin && op.nccl != ncclMax) {
    // Float rounding of N-1 additions (or products) and of the final store or division.
    const double n = nranks, u = unit_roundoff(type);
    bound = op.nccl == ncclProd ? 2 * (n + 1) * u * global[1] : (n + 2) * u * n * global[2];
  }
  MPI_Bcast(&bound, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const double scale = global[1] > 0 ? global[1] : 1;
  row->checked = true;
  row->error = global[0] / scale;
  row->bound = bound / scale;
  row->agree = !s.same_output ||
               std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; });
  row->send_intact = intact;
  row->ok = row->agree && row->send_intact && global[0] <= bound;
  return true;
}

}  // namespace perf
