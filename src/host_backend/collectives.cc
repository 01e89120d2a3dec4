/* Collectives: each call is checked at once, then is posted (now, or at the
 * outermost ncclGroupEnd) as MPI's nonblocking collectives over pieces of at
 * most kMaxMessageBytes, which group.cc completes. Rank-major buffers (AllGather's output, AlltoAll's two)
 * are addressed per piece with a type whose extent is one rank's block.
 *
 * In place: AllReduce/Reduce (sendbuff == recvbuff), AllGather
 * (sendbuff == recvbuff + rank*count) and AlltoAll (sendbuff == recvbuff) map
 * to MPI_IN_PLACE. ReduceScatter's NCCL form (recvbuff == sendbuff +
 * rank*recvcount) aliases MPI's input, so it reduces into a temporary. */
#include <stdint.h>
#include <string.h>

#include <vector>

#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

/* Address of element `index` of `base`; null stays null (unused buffers). */
char* at(const void* base, size_t index, size_t size) {
  return base == nullptr ? nullptr : (char*)base + index * size;
}

/* `n` consecutive elements spaced `stride` bytes from the next rank's: one
 * rank's part of a piece of a rank-major buffer. */
class RankBlock {
 public:
  RankBlock(MPI_Datatype element, int n, size_t stride) {
    MPI_Datatype contiguous;
    MPI_Type_contiguous(n, element, &contiguous);
    MPI_Type_create_resized(contiguous, 0, (MPI_Aint)stride, &type_);
    MPI_Type_commit(&type_);
    MPI_Type_free(&contiguous);
  }
  ~RankBlock() { MPI_Type_free(&type_); }
  RankBlock(const RankBlock&) = delete;
  RankBlock& operator=(const RankBlock&) = delete;
  MPI_Datatype type() const { return type_; }

 private:
  MPI_Datatype type_;
};

/* ---- argument checks ---- */

ncclResult_t check_buffer(const void* buf, size_t count, const char* name, const char* fn) {
  if (buf == nullptr && count > 0) {
    return set_error(ncclInvalidArgument, "%s: %s is NULL with count %zu", fn, name, count);
  }
  return ncclSuccess;
}

/* count * factor elements of `size` bytes must be addressable. */
ncclResult_t check_count(size_t count, size_t factor, size_t size, const char* fn) {
  if (count > (size_t)PTRDIFF_MAX / size / factor) {
    return set_error(ncclInvalidArgument, "%s: count %zu is too large", fn, count);
  }
  return ncclSuccess;
}

ncclResult_t check_root(const ncclComm* comm, int root, const char* fn) {
  if (root < 0 || root >= comm->nranks) {
    return set_error(ncclInvalidArgument, "%s: root %d is outside 0..%d", fn, root,
                     comm->nranks - 1);
  }
  return ncclSuccess;
}

/* Type and count of a data-movement collective on a usable `comm`. */
ncclResult_t check_move(ncclDataType_t type, size_t count, size_t factor, const char* fn,
                        MPI_Datatype* mpi) {
  QNCCL_CHECK(mpi_type(type, fn, mpi));
  return check_count(count, factor, type_size(type), fn);
}

/* Type, op and count of a reducing collective on a usable `comm`. */
ncclResult_t check_reduce(const ncclComm* comm, ncclDataType_t type, ncclRedOp_t op,
                          size_t count, size_t factor, const char* fn, Reduction* red) {
  QNCCL_CHECK(resolve_reduction(comm, type, op, fn, red));
  return check_count(count, factor, type_size(type), fn);
}

/* ---- execution: posting MPI's nonblocking collectives ---- */

/* A temporary of `bytes` that lives until the collective completes. */
char* temporary(Posted* out, size_t bytes) {
  auto memory = std::make_shared<std::vector<char>>(bytes);
  out->keep.push_back(memory);
  return memory->data();
}

/* What MPI reduces: the PreMulSum-scaled copy, MPI_IN_PLACE when the input
 * already is the output, else the input. */
const void* reduce_input(const Reduction& red, const void* in, const void* out, size_t count,
                         Posted* posted) {
  if (red.premul) {
    char* scaled = temporary(posted, count * type_size(red.type));
    premultiply(red, in, scaled, count);
    return scaled;
  }
  return in == out ? MPI_IN_PLACE : in;
}

/* Records the request a posting call (its result `rc`) wrote to *request, or
 * turns MPI's failure into an NCCL error. */
ncclResult_t posted(int rc, const MPI_Request* request, const char* fn, const char* what,
                    Posted* out) {
  QNCCL_CHECK(mpi_result(rc, fn, what));
  out->requests.push_back(*request);
  return ncclSuccess;
}

/* ncclAvg: the sum divided by nranks once it is complete. */
void average_when_done(const CommRef& comm, const Reduction& red, void* result, size_t count,
                       Posted* out) {
  if (!red.average || result == nullptr) return;
  const int nranks = comm->nranks;
  const ncclDataType_t type = red.type;
  out->finish = [=] { divide(type, result, count, nranks); };
}

ncclResult_t post_all_reduce(const CommRef& comm, const void* send, void* recv, size_t count,
                             const Reduction& red, Posted* out) {
  const size_t size = type_size(red.type);
  const void* input = reduce_input(red, send, recv, count, out);
  QNCCL_CHECK(for_each_chunk(count, size, [&](size_t offset, int n) {
    MPI_Request r;
    const void* in = input == MPI_IN_PLACE ? MPI_IN_PLACE : at(input, offset, size);
    return posted(MPI_Iallreduce(in, at(recv, offset, size), n, red.mpi_type, red.op, comm->mpi,
                                 &r), &r, "ncclAllReduce", "MPI_Iallreduce", out);
  }));
  average_when_done(comm, red, recv, count, out);
  return ncclSuccess;
}

ncclResult_t post_reduce(const CommRef& comm, const void* send, void* recv, size_t count,
                         const Reduction& red, int root, Posted* out) {
  const size_t size = type_size(red.type);
  void* result = comm->rank == root ? recv : nullptr;  // recvbuff matters at the root only
  const void* input = reduce_input(red, send, result, count, out);
  QNCCL_CHECK(for_each_chunk(count, size, [&](size_t offset, int n) {
    MPI_Request r;
    const void* in = input == MPI_IN_PLACE ? MPI_IN_PLACE : at(input, offset, size);
    return posted(MPI_Ireduce(in, at(result, offset, size), n, red.mpi_type, red.op, root,
                              comm->mpi, &r), &r, "ncclReduce", "MPI_Ireduce", out);
  }));
  average_when_done(comm, red, result, count, out);
  return ncclSuccess;
}

/* Rank r's output is the reduction of every rank's block r of `in`. One
 * MPI_Ireduce_scatter_block when a block fits one message, else one
 * MPI_Ireduce per rank and piece (MPI's predefined ops take no strided type). */
ncclResult_t post_blocks(const CommRef& comm, const void* in, void* out, size_t recvcount,
                         const Reduction& red, Posted* posted_out) {
  const size_t size = type_size(red.type);
  const char* fn = "ncclReduceScatter";
  if (recvcount * size <= kMaxMessageBytes) {
    MPI_Request r;
    return posted(MPI_Ireduce_scatter_block(in, out, (int)recvcount, red.mpi_type, red.op,
                                            comm->mpi, &r), &r, fn, "MPI_Ireduce_scatter_block",
                  posted_out);
  }
  return for_each_chunk(recvcount, size, [&](size_t offset, int n) {
    for (int r = 0; r < comm->nranks; r++) {
      void* mine = r == comm->rank ? at(out, offset, size) : nullptr;
      MPI_Request request;
      QNCCL_CHECK(posted(MPI_Ireduce(at(in, r * recvcount + offset, size), mine, n,
                                     red.mpi_type, red.op, r, comm->mpi, &request),
                         &request, fn, "MPI_Ireduce", posted_out));
    }
    return ncclSuccess;
  });
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + b_bytes && y < x + a_bytes;
}

ncclResult_t post_reduce_scatter(const CommRef& comm, const void* send, void* recv,
                                 size_t recvcount, const Reduction& red, Posted* out) {
  const size_t size = type_size(red.type);
  const size_t total = recvcount * comm->nranks;
  const void* in = send;
  if (red.premul) {
    char* scaled = temporary(out, total * size);
    premultiply(red, send, scaled, total);
    in = scaled;
  }
  void* result = recv;
  if (overlaps(in, total * size, recv, recvcount * size)) result = temporary(out, recvcount * size);
  QNCCL_CHECK(post_blocks(comm, in, result, recvcount, red, out));
  const int nranks = comm->nranks;
  const ncclDataType_t type = red.type;
  const bool average = red.average;
  out->finish = [=] {
    if (result != recv) memcpy(recv, result, recvcount * size);
    if (average) divide(type, recv, recvcount, nranks);
  };
  return ncclSuccess;
}

ncclResult_t post_all_gather(const CommRef& comm, const void* send, void* recv, size_t count,
                             MPI_Datatype type, size_t size, Posted* out) {
  const bool in_place = send == at(recv, comm->rank * count, size);
  return for_each_chunk(count, size, [&](size_t offset, int n) {
    RankBlock block(type, n, count * size);  // MPI keeps what a posted call uses
    const void* in = in_place ? MPI_IN_PLACE : at(send, offset, size);
    MPI_Request r;
    return posted(MPI_Iallgather(in, n, type, at(recv, offset, size), 1, block.type(), comm->mpi,
                                 &r), &r, "ncclAllGather", "MPI_Iallgather", out);
  });
}

ncclResult_t post_all_to_all(const CommRef& comm, const void* send, void* recv, size_t count,
                             MPI_Datatype type, size_t size, Posted* out) {
  const bool in_place = send == recv;
  return for_each_chunk(count, size, [&](size_t offset, int n) {
    RankBlock block(type, n, count * size);
    const void* in = in_place ? MPI_IN_PLACE : at(send, offset, size);
    MPI_Request r;
    return posted(MPI_Ialltoall(in, 1, block.type(), at(recv, offset, size), 1, block.type(),
                                comm->mpi, &r), &r, "ncclAlltoAll", "MPI_Ialltoall", out);
  });
}

ncclResult_t post_broadcast(const CommRef& comm, const void* send, void* recv, size_t count,
                            MPI_Datatype type, size_t size, int root, Posted* out) {
  if (comm->rank == root && send != recv) memmove(recv, send, count * size);
  return for_each_chunk(count, size, [&](size_t offset, int n) {
    MPI_Request r;
    return posted(MPI_Ibcast(at(recv, offset, size), n, type, root, comm->mpi, &r), &r,
                  "ncclBroadcast", "MPI_Ibcast", out);
  });
}

/* ---- entry points, checked ---- */

ncclResult_t all_reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, ncclComm* handle) {
  const char* fn = "ncclAllReduce";
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  Reduction red;
  QNCCL_CHECK(check_reduce(comm.get(), type, op, count, 1, fn, &red));
  QNCCL_CHECK(check_buffer(send, count, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, count, "recvbuff", fn));
  return submit_collective(comm, fn, [=](Posted* out) {
    return post_all_reduce(comm, send, recv, count, red, out);
  });
}

ncclResult_t reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                    ncclRedOp_t op, int root, ncclComm* handle) {
  const char* fn = "ncclReduce";
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  Reduction red;
  QNCCL_CHECK(check_reduce(comm.get(), type, op, count, 1, fn, &red));
  QNCCL_CHECK(check_root(comm.get(), root, fn));
  QNCCL_CHECK(check_buffer(send, count, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, comm->rank == root ? count : 0, "recvbuff", fn));
  return submit_collective(comm, fn, [=](Posted* out) {
    return post_reduce(comm, send, recv, count, red, root, out);
  });
}

ncclResult_t reduce_scatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                            ncclRedOp_t op, ncclComm* handle) {
  const char* fn = "ncclReduceScatter";
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  Reduction red;
  QNCCL_CHECK(check_reduce(comm.get(), type, op, recvcount, comm->nranks, fn, &red));
  QNCCL_CHECK(check_buffer(send, recvcount, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, recvcount, "recvbuff", fn));
  return submit_collective(comm, fn, [=](Posted* out) {
    return post_reduce_scatter(comm, send, recv, recvcount, red, out);
  });
}

// The checks of a collective that moves `count` values per rank without reducing them.
ncclResult_t check_move_call(const void* send, void* recv, size_t count, ncclDataType_t type,
                             ncclComm* handle, const char* fn, CommRef* comm, MPI_Datatype* mpi) {
  QNCCL_CHECK(acquire_usable(handle, fn, comm));
  QNCCL_CHECK(check_move(type, count, (*comm)->nranks, fn, mpi));
  QNCCL_CHECK(check_buffer(send, count, "sendbuff", fn));
  return check_buffer(recv, count, "recvbuff", fn);
}

ncclResult_t all_gather(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclComm* handle) {
  const char* fn = "ncclAllGather";
  CommRef comm;
  MPI_Datatype mpi;
  QNCCL_CHECK(check_move_call(send, recv, count, type, handle, fn, &comm, &mpi));
  const size_t size = type_size(type);
  return submit_collective(comm, fn, [=](Posted* out) {
    return post_all_gather(comm, send, recv, count, mpi, size, out);
  });
}

ncclResult_t all_to_all(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclComm* handle) {
  const char* fn = "ncclAlltoAll";
  CommRef comm;
  MPI_Datatype mpi;
  QNCCL_CHECK(check_move_call(send, recv, count, type, handle, fn, &comm, &mpi));
  const size_t size = type_size(type);
  return submit_collective(comm, fn, [=](Posted* out) {
    return post_all_to_all(comm, send, recv, count, mpi, size, out);
  });
}

ncclResult_t broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                       ncclComm* handle, const char* fn) {
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  MPI_Datatype mpi;
  QNCCL_CHECK(check_move(type, count, 1, fn, &mpi));
  QNCCL_CHECK(check_root(comm.get(), root, fn));
  QNCCL_CHECK(check_buffer(send, comm->rank == root ? count : 0, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, count, "recvbuff", fn));
  const size_t size = type_size(type);
  return submit_collective(comm, fn, [=](Posted* out) {
    return post_broadcast(comm, send, recv, count, mpi, size, root, out);
  });
}

}  // namespace
}  // namespace host
}  // namespace qnccl

using namespace qnccl::host;

/* Streams are accepted and ignored: the work is done when the call returns
 * (or at the outermost ncclGroupEnd), or, on a nonblocking communicator, when
 * ncclCommGetAsyncError reports ncclSuccess. */

QNCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op,
                                        ncclComm_t comm, cudaStream_t /*stream*/) {
  return note_group_error(all_reduce(sendbuff, recvbuff, count, datatype, op, comm));
}

QNCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, int root,
                                     ncclComm_t comm, cudaStream_t /*stream*/) {
  return note_group_error(reduce(sendbuff, recvbuff, count, datatype, op, root, comm));
}

QNCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff,
                                            size_t recvcount, ncclDataType_t datatype,
                                            ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t /*stream*/) {
  return note_group_error(reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm));
}

QNCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t /*stream*/) {
  return note_group_error(all_gather(sendbuff, recvbuff, sendcount, datatype, comm));
}

QNCCL_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t /*stream*/) {
  return note_group_error(all_to_all(sendbuff, recvbuff, count, datatype, comm));
}

QNCCL_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t /*stream*/) {
  return note_group_error(
      broadcast(sendbuff, recvbuff, count, datatype, root, comm, "ncclBroadcast"));
}

QNCCL_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t /*stream*/) {
  return note_group_error(broadcast(buff, buff, count, datatype, root, comm, "ncclBcast"));
}
