/* NCCL data types and reduction ops as MPI types and ops: the one mapping of
 * each. MPI has no float16/bfloat16, so those travel as 2-byte types of our
 * own and reduce through user ops computing in float32 (exact for prod, max,
 * min; sum rounds once per addition, as NCCL's half arithmetic does). */
#include <cmath>
#include <string.h>
#include <type_traits>

#include "codec/dtype.h"
#include "codec/rng.h"
#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

MPI_Datatype mpi_float16 = MPI_DATATYPE_NULL;
MPI_Datatype mpi_bfloat16 = MPI_DATATYPE_NULL;
MPI_Op half_ops[4];  // ncclSum, ncclProd, ncclMax, ncclMin on float16/bfloat16

/* Element access for the types MPI computes itself; F16/BF16 (dtype.h) widen
 * to float32. */
template <class X>
struct Native {
  typedef X T;
  static X load(X v) { return v; }
  static X store(X v) { return v; }
};

/* Calls fn(V{}) with the element access V of a supported type. */
template <class Fn>
void with_type(ncclDataType_t type, Fn&& fn) {
  switch (type) {
    case ncclInt8: return fn(Native<int8_t>{});
    case ncclUint8: return fn(Native<uint8_t>{});
    case ncclInt32: return fn(Native<int32_t>{});
    case ncclUint32: return fn(Native<uint32_t>{});
    case ncclInt64: return fn(Native<int64_t>{});
    case ncclUint64: return fn(Native<uint64_t>{});
    case ncclFloat16: return fn(F16{});
    case ncclFloat32: return fn(Native<float>{});
    case ncclFloat64: return fn(Native<double>{});
    case ncclBfloat16: return fn(BF16{});
    default: return;
  }
}

/* a * b; integers wrap around (in unsigned arithmetic: no signed overflow). */
template <class X>
X multiply(X a, X b) {
  if constexpr (std::is_integral_v<X>) {
    typedef std::make_unsigned_t<X> U;
    return (X)(U)((U)a * (U)b);
  } else {
    return a * b;
  }
}

/* a / n; integers in 64 bits, so n may exceed the type's range. */
template <class X>
X divide_by(X a, int n) {
  if constexpr (std::is_integral_v<X>) {
    typedef std::conditional_t<std::is_signed_v<X>, int64_t, uint64_t> W;
    return (X)((W)a / (W)n);
  } else {
    return a / (X)n;
  }
}

struct Sum { float operator()(float a, float b) const { return a + b; } };
struct Prod { float operator()(float a, float b) const { return a * b; } };
struct Max { float operator()(float a, float b) const { return std::fmax(a, b); } };
struct Min { float operator()(float a, float b) const { return std::fmin(a, b); } };

template <class V, class Combine>
void combine(const void* in, void* inout, int count) {
  const auto* a = (const typename V::T*)in;
  auto* b = (typename V::T*)inout;
  for (int i = 0; i < count; i++) b[i] = V::store(Combine()(V::load(a[i]), V::load(b[i])));
}

/* MPI user op on float16 or bfloat16, told apart by the MPI type. */
template <class Combine>
void half_op(void* in, void* inout, int* count, MPI_Datatype* type) {
  if (*type == mpi_float16) {
    combine<F16, Combine>(in, inout, *count);
  } else {
    combine<BF16, Combine>(in, inout, *count);
  }
}

ncclResult_t create_half_type(MPI_Datatype* out, const char* name) {
  QNCCL_CHECK(mpi_result(MPI_Type_dup(MPI_UINT16_T, out), "starting MPI", "MPI_Type_dup"));
  MPI_Type_set_name(*out, name);
  return mpi_result(MPI_Type_commit(out), "starting MPI", "MPI_Type_commit");
}

MPI_Op native_op(ncclRedOp_t op) {
  const MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
  return ops[op];
}

/* The MPI op of a built-in sum/prod/max/min on `type`. */
MPI_Op mpi_op(ncclDataType_t type, ncclRedOp_t op) {
  bool half = type == ncclFloat16 || type == ncclBfloat16;
  return half ? half_ops[op] : native_op(op);
}

/* The value of the index-th op made on `comm` (index >= ncclNumOps): the
 * index XORed with a 31-bit salt hashed from the communicator's address, as
 * NVIDIA's NCCL hands out user ops, so values land anywhere in
 * [ncclNumOps, INT_MAX] and differ between communicators. An index whose
 * XOR would fall on a built-in op keeps its own value; that value's XOR is
 * then a built-in, never an index, so values stay distinct. */
int spread_op_value(const ncclComm* comm, int index) {
  const uint32_t salt = (uint32_t)(mix64((uint64_t)(uintptr_t)comm) >> 33);  // 31 bits
  const int value = (int)(salt ^ (uint32_t)index);
  return value < (int)ncclNumOps ? index : value;
}

}  // namespace

ncclResult_t init_datatypes() {
  QNCCL_CHECK(create_half_type(&mpi_float16, "qnccl_float16"));
  QNCCL_CHECK(create_half_type(&mpi_bfloat16, "qnccl_bfloat16"));
  MPI_User_function* const fns[] = {half_op<Sum>, half_op<Prod>, half_op<Max>, half_op<Min>};
  for (int i = 0; i < 4; i++) {
    QNCCL_CHECK(mpi_result(MPI_Op_create(fns[i], 1, &half_ops[i]), "starting MPI",
                           "MPI_Op_create"));
  }
  return ncclSuccess;
}

ncclResult_t mpi_type(ncclDataType_t type, const char* fn, MPI_Datatype* out) {
  switch (type) {
    case ncclInt8: *out = MPI_INT8_T; return ncclSuccess;
    case ncclUint8: *out = MPI_UINT8_T; return ncclSuccess;
    case ncclInt32: *out = MPI_INT32_T; return ncclSuccess;
    case ncclUint32: *out = MPI_UINT32_T; return ncclSuccess;
    case ncclInt64: *out = MPI_INT64_T; return ncclSuccess;
    case ncclUint64: *out = MPI_UINT64_T; return ncclSuccess;
    case ncclFloat16: *out = mpi_float16; return ncclSuccess;
    case ncclFloat32: *out = MPI_FLOAT; return ncclSuccess;
    case ncclFloat64: *out = MPI_DOUBLE; return ncclSuccess;
    case ncclBfloat16: *out = mpi_bfloat16; return ncclSuccess;
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return set_error(ncclInvalidArgument, "%s: datatype %s is not supported by the host backend",
                       fn, type_name(type));
    default:
      return set_error(ncclInvalidArgument, "%s: unknown datatype %d (valid: 0..%d)", fn,
                       (int)type, (int)ncclNumTypes - 1);
  }
}

size_t type_size(ncclDataType_t type) {
  size_t size = 0;
  with_type(type, [&](auto v) { size = sizeof(typename decltype(v)::T); });
  return size;
}

ncclResult_t resolve_reduction(const ncclComm* comm, ncclDataType_t type, ncclRedOp_t op,
                               const char* fn, Reduction* out) {
  out->type = type;
  QNCCL_CHECK(mpi_type(type, fn, &out->mpi_type));
  if (op >= ncclSum && op <= ncclMin) {
    out->op = mpi_op(type, op);
    return ncclSuccess;
  }
  out->op = mpi_op(type, ncclSum);
  if (op == ncclAvg) {
    out->average = true;
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lock(const_cast<ncclComm*>(comm)->mutex);
  auto found = comm->premul_ops.find((int)op);
  if (found == comm->premul_ops.end()) {
    return set_error(ncclInvalidArgument,
                     "%s: unknown reduction op %d (built-in: 0..%d; others must come from "
                     "ncclRedOpCreatePreMulSum on this communicator)",
                     fn, (int)op, (int)ncclNumOps - 1);
  }
  if (found->second.type != type) {
    return set_error(ncclInvalidArgument, "%s: op %d was created for %s, not %s", fn, (int)op,
                     type_name(found->second.type), type_name(type));
  }
  out->premul = found->second;
  return ncclSuccess;
}

void premultiply(const Reduction& red, const void* in, void* out, size_t count) {
  with_type(red.type, [&](auto v) {
    typedef decltype(v) V;
    typename V::T scalar;
    memcpy(&scalar, red.premul->scalar, sizeof scalar);
    const auto* src = (const typename V::T*)in;
    auto* dst = (typename V::T*)out;
    for (size_t i = 0; i < count; i++) {
      dst[i] = V::store(multiply(V::load(src[i]), V::load(scalar)));
    }
  });
}

void divide(ncclDataType_t type, void* buf, size_t count, int nranks) {
  with_type(type, [&](auto v) {
    typedef decltype(v) V;
    auto* values = (typename V::T*)buf;
    for (size_t i = 0; i < count; i++) values[i] = V::store(divide_by(V::load(values[i]), nranks));
  });
}

}  // namespace host
}  // namespace qnccl

using namespace qnccl;
using namespace qnccl::host;

/* PreMulSum: each rank's input times `scalar`, then summed. The scalar is
 * read now (host memory); ops belong to `comm`. Their values are spread over
 * the positive int range as NVIDIA's NCCL spreads them (spread_op_value), so
 * whatever sits above the real library meets any value there. */
QNCCL_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                   ncclDataType_t datatype,
                                                   ncclScalarResidence_t residence,
                                                   ncclComm_t comm) {
  const char* fn = "ncclRedOpCreatePreMulSum";
  CommRef ref;
  QNCCL_CHECK(acquire_ready(comm, fn, &ref));
  if (op == nullptr || scalar == nullptr) {
    return set_error(ncclInvalidArgument, "%s: %s is NULL", fn, op == nullptr ? "op" : "scalar");
  }
  MPI_Datatype unused;
  QNCCL_CHECK(mpi_type(datatype, fn, &unused));
  if (residence == ncclScalarDevice) {
    return set_error(ncclInvalidArgument, "%s: ncclScalarDevice: the host backend has no device "
                     "memory; pass the scalar as ncclScalarHostImmediate", fn);
  }
  if (residence != ncclScalarHostImmediate) {
    return set_error(ncclInvalidArgument, "%s: unknown residence %d", fn, (int)residence);
  }
  PreMulSum premul{datatype, {}};
  memcpy(premul.scalar, scalar, type_size(datatype));
  std::lock_guard<std::mutex> lock(comm->mutex);
  const int value = spread_op_value(comm, comm->next_op++);
  comm->premul_ops[value] = premul;
  *op = (ncclRedOp_t)value;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const char* fn = "ncclRedOpDestroy";
  CommRef ref;
  QNCCL_CHECK(acquire_ready(comm, fn, &ref));
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (comm->premul_ops.erase((int)op) == 0) {
    return set_error(ncclInvalidArgument, "%s: op %d was not created on this communicator%s", fn,
                     (int)op, op >= ncclSum && op < ncclNumOps ? " (built-in ops cannot be "
                     "destroyed)" : "");
  }
  return ncclSuccess;
}
