/* Collectives: each call is checked at once, then is posted (now, or at the
 * outermost ncclGroupEnd) as MPI's nonblocking collectives over pieces of at
 * most kMaxMessageBytes, which group.cc completes. Rank-major buffers (AllGather's output, AlltoAll's two)
 * are addressed per piece with a type whose extent is one rank's block.
 *
 * In place: AllReduce (sendbuff == recvbuff), AllGather (sendbuff ==
 * recvbuff + rank*count) and AlltoAll (sendbuff == recvbuff) map to
 * MPI_IN_PLACE. Reduce and ReduceScatter gather the ranks' contributions
 * into a temporary and reduce them there in rank order, so in place needs
 * nothing more and their result is a function of the inputs alone. */
#include <stdint.h>
#include <string.h>

#include <map>
#include <memory>
#include <mutex>
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

/* Freed temporaries, reused by later collectives: a fresh one cost a pass
 * to clear it and, whenever malloc had given its pages back to the system,
 * a page fault per page (a 16 MiB ReduceScatter took 3x as long every other
 * call). Buffers come back when the last collective using them lets go
 * (group.cc keeps an abandoned one's); at most kCachedBytes stay cached. */
class TemporaryPool {
 public:
  static TemporaryPool& get() {
    static TemporaryPool* pool = new TemporaryPool();  // outlives the progress thread's last use
    return *pool;
  }

  /* A buffer of at least `bytes`, uninitialized, back in the pool when the
   * last copy of the pointer goes. */
  std::shared_ptr<char> take(size_t bytes) {
    std::unique_ptr<char[]> buffer;
    size_t capacity = bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes) {  // not a much larger one
        capacity = it->first;
        buffer = std::move(it->second);
        cached_ -= capacity;
        free_.erase(it);
      }
    }
    if (!buffer) buffer.reset(new char[capacity > 0 ? capacity : 1]);
    char* p = buffer.release();
    return std::shared_ptr<char>(p, [capacity](char* q) { get().give_back(q, capacity); });
  }

 private:
  static constexpr size_t kCachedBytes = (size_t)256 << 20;

  void give_back(char* p, size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.emplace(capacity, std::unique_ptr<char[]>(p));
    cached_ += capacity;
    while (cached_ > kCachedBytes) {  // the smallest go first
      cached_ -= free_.begin()->first;
      free_.erase(free_.begin());
    }
  }

  std::mutex mutex_;
  std::multimap<size_t, std::unique_ptr<char[]>> free_;  // by capacity
  size_t cached_ = 0;
};

/* A temporary of `bytes` (uninitialized) that lives until the collective
 * completes. */
char* temporary(Posted* out, size_t bytes) {
  std::shared_ptr<char> memory = TemporaryPool::get().take(bytes);
  out->keep.push_back(memory);
  return memory.get();
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

/* result = ((b_0 op b_1) op b_2) ... op b_{n-1} of the `nranks` blocks of
 * `count` values at block[0..n-1], rounding to the type after each
 * operation. NCCL's result depends on its algorithm's order; the backend's
 * on the inputs alone, so qnccl.emulate can reproduce it
 * (docs/host-backend.md). One block may be `result` itself (its values are
 * already there); when that is not block 0, block 0 must be writable: it
 * carries the partial result up to it. */
void reduce_in_rank_order(const Reduction& red, const std::vector<const char*>& block,
                          size_t count, void* result) {
  const size_t size = type_size(red.type);
  if (count == 0) return;
  // inout = in op inout: the ops are commutative, so each is the rank order's.
  auto fold = [&](const void* in, void* inout) {
    for_each_chunk(count, size, [&](size_t offset, int n) {
      MPI_Reduce_local(at(in, offset, size), at(inout, offset, size), n, red.mpi_type, red.op);
      return ncclSuccess;
    });
  };
  const int nranks = (int)block.size();
  int there = -1;  // the block already in `result`
  for (int k = 0; k < nranks; k++)
    if (block[k] == result) there = k;
  if (there < 0) memmove(result, block[0], count * size);
  void* acc = there > 0 ? const_cast<char*>(block[0]) : result;
  for (int k = 1; k < nranks; k++) {
    if (k == there) {
      fold(acc, result);
      acc = result;
    } else {
      fold(block[k], acc);
    }
  }
}

/* Once the blocks are in: the rank-order reduction into `result`, then avg. */
void reduce_when_done(const Reduction& red, std::vector<const char*> block, size_t count,
                      void* result, Posted* out) {
  const int nranks = (int)block.size();
  out->finish = [=] {
    reduce_in_rank_order(red, block, count, result);
    if (red.average) divide(red.type, result, count, nranks);
  };
}

/* ---- ranks in one process (clique.cc): each collective run by the last
 * rank to post its part, with every rank's buffers. Reductions go in rank
 * order into a temporary first, so in place needs nothing more. ---- */

/* `red` of the ranks' blocks block(k), in rank order, into a temporary. */
template <class Block>
std::shared_ptr<char> reduce_together(const Reduction& red, size_t nranks, size_t count,
                                      Block block) {
  std::shared_ptr<char> sum = TemporaryPool::get().take(count * type_size(red.type));
  std::vector<const char*> blocks;
  for (size_t k = 0; k < nranks; k++) blocks.push_back(static_cast<const char*>(block(k)));
  reduce_in_rank_order(red, blocks, count, sum.get());
  return sum;
}

/* Allreduce (root < 0) or reduce to `root`: each rank's input, reduced. */
ncclResult_t together_reduce(const CommRef& comm, const void* input, void* recv, size_t count,
                             const Reduction& red, int root, Posted* out) {
  QNCCL_CHECK(post_together(comm, {input, recv}, [=](const std::vector<Part>& parts) {
    std::shared_ptr<char> sum = reduce_together(red, parts.size(), count,
                                                [&](size_t k) { return parts[k].send; });
    for (size_t r = 0; r < parts.size(); r++)
      if (root < 0 || (int)r == root) memcpy(parts[r].recv, sum.get(), count * type_size(red.type));
  }, out));
  average_when_done(comm, red, comm->rank == root || root < 0 ? recv : nullptr, count, out);
  return ncclSuccess;
}

ncclResult_t post_all_reduce(const CommRef& comm, const void* send, void* recv, size_t count,
                             const Reduction& red, Posted* out) {
  const size_t size = type_size(red.type);
  const void* input = reduce_input(red, send, recv, count, out);
  if (comm->clique)
    return together_reduce(comm, input == MPI_IN_PLACE ? recv : input, recv, count, red, -1, out);
  QNCCL_CHECK(for_each_chunk(count, size, [&](size_t offset, int n) {
    MPI_Request r;
    const void* in = input == MPI_IN_PLACE ? MPI_IN_PLACE : at(input, offset, size);
    return posted(MPI_Iallreduce(in, at(recv, offset, size), n, red.mpi_type, red.op, comm->mpi,
                                 &r), &r, "ncclAllReduce", "MPI_Iallreduce", out);
  }));
  average_when_done(comm, red, recv, count, out);
  return ncclSuccess;
}

/* Every rank's `count` values of `in` gathered at `root` as rank-major blocks
 * of a temporary (other ranks: nullptr). */
ncclResult_t post_gather(const CommRef& comm, const void* in, size_t count, const Reduction& red,
                         int root, const char* fn, char** blocks, Posted* out) {
  const size_t size = type_size(red.type);
  *blocks = comm->rank == root ? temporary(out, comm->nranks * count * size) : nullptr;
  return for_each_chunk(count, size, [&](size_t offset, int n) {
    RankBlock block(red.mpi_type, n, count * size);
    MPI_Request r;
    return posted(MPI_Igather(at(in, offset, size), n, red.mpi_type, at(*blocks, offset, size), 1,
                              block.type(), root, comm->mpi, &r), &r, fn, "MPI_Igather", out);
  });
}

/* An MPI_Ialltoallv of whole blocks of `count` values: rank k gets block k
 * of `in` when to[k], and block j of `recv` is rank j's when from[j] (the
 * flags live as counts until the operation completes). */
ncclResult_t post_block_exchange(const CommRef& comm, const void* in, const std::vector<int>& to,
                                 char* recv, const std::vector<int>& from, size_t count,
                                 const Reduction& red, const char* fn, Posted* out) {
  const size_t size = type_size(red.type);
  auto counts = std::make_shared<std::vector<int>>(to);
  counts->insert(counts->end(), from.begin(), from.end());
  for (int k = 0; k < comm->nranks; k++) counts->push_back(k);  // displacements, in blocks
  out->keep.push_back(counts);
  const int* sendcounts = counts->data();
  const int* recvcounts = sendcounts + comm->nranks;
  const int* displs = recvcounts + comm->nranks;
  return for_each_chunk(count, size, [&](size_t offset, int n) {
    RankBlock block(red.mpi_type, n, count * size);
    MPI_Request r;
    return posted(MPI_Ialltoallv(at(in, offset, size), sendcounts, displs, block.type(),
                                 at(recv, offset, size), recvcounts, displs, block.type(),
                                 comm->mpi, &r), &r, fn, "MPI_Ialltoallv", out);
  });
}

/* Gathered at the root, reduced there in rank order. */
ncclResult_t post_reduce(const CommRef& comm, const void* send, void* recv, size_t count,
                         const Reduction& red, int root, Posted* out) {
  const void* input = reduce_input(red, send, nullptr, count, out);
  if (comm->clique) return together_reduce(comm, input, recv, count, red, root, out);
  char* blocks = nullptr;
  QNCCL_CHECK(post_gather(comm, input, count, red, root, "ncclReduce", &blocks, out));
  if (comm->rank != root) return ncclSuccess;
  std::vector<const char*> block;
  for (int k = 0; k < comm->nranks; k++) block.push_back(blocks + k * count * type_size(red.type));
  reduce_when_done(red, block, count, recv, out);
  return ncclSuccess;
}

/* Rank r's output is the reduction of every rank's block r of the input.
 * Each rank's block r goes to rank r, nothing to itself; block 0 (rank 0's)
 * lands straight in the output where the output does not hold the rank's
 * own block (in place), so only rank 0 copies a block there. */
ncclResult_t post_reduce_scatter(const CommRef& comm, const void* send, void* recv,
                                 size_t recvcount, const Reduction& red, Posted* out) {
  const int nranks = comm->nranks, rank = comm->rank;
  const char* input =
      static_cast<const char*>(reduce_input(red, send, nullptr, recvcount * nranks, out));
  const size_t stride = recvcount * type_size(red.type);
  if (comm->clique) {
    QNCCL_CHECK(post_together(comm, {input, recv}, [=](const std::vector<Part>& parts) {
      for (size_t r = 0; r < parts.size(); r++) {  // rank r's block of every rank's input
        std::shared_ptr<char> sum = reduce_together(red, parts.size(), recvcount, [&](size_t k) {
          return static_cast<const char*>(parts[k].send) + r * stride;
        });
        memcpy(parts[r].recv, sum.get(), stride);
      }
    }, out));
    average_when_done(comm, red, recv, recvcount, out);
    return ncclSuccess;
  }
  const char* own = input + rank * stride;
  char* result = static_cast<char*>(recv);
  const bool direct = rank != 0 && own != result;
  char* blocks = temporary(out, nranks * stride);
  // Rank 0's blocks, then everyone else's.
  std::vector<int> to(nranks, 0), from(nranks, 0);
  for (int k = 1; k < nranks; k++) to[k] = rank == 0;
  from[0] = rank != 0;
  const char* fn = "ncclReduceScatter";
  QNCCL_CHECK(post_block_exchange(comm, input, to, direct ? result : blocks, from, recvcount, red,
                                  fn, out));
  for (int k = 0; k < nranks; k++) {
    to[k] = rank != 0 && k != rank;
    from[k] = k != 0 && k != rank;
  }
  QNCCL_CHECK(post_block_exchange(comm, input, to, blocks, from, recvcount, red, fn, out));
  std::vector<const char*> block;
  for (int k = 0; k < nranks; k++)
    block.push_back(k == rank ? own : k == 0 && direct ? result : blocks + k * stride);
  reduce_when_done(red, block, recvcount, result, out);
  return ncclSuccess;
}

ncclResult_t post_all_gather(const CommRef& comm, const void* send, void* recv, size_t count,
                             MPI_Datatype type, size_t size, Posted* out) {
  const bool in_place = send == at(recv, comm->rank * count, size);
  if (comm->clique) {  // each rank's block goes to every other rank's output
    return post_together(comm, {send, recv}, [=](const std::vector<Part>& parts) {
      const size_t bytes = count * size;
      for (size_t r = 0; r < parts.size(); r++)
        for (size_t k = 0; k < parts.size(); k++) {
          char* to = static_cast<char*>(parts[r].recv) + k * bytes;
          if (to != parts[k].send) memcpy(to, parts[k].send, bytes);
        }
    }, out);
  }
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
  if (comm->clique) {  // block r of rank k's input is block k of rank r's output
    return post_together(comm, {send, recv}, [=](const std::vector<Part>& parts) {
      const size_t n = parts.size(), bytes = count * size;
      std::shared_ptr<char> inputs = TemporaryPool::get().take(n * n * bytes);  // (in place)
      for (size_t k = 0; k < n; k++) memcpy(inputs.get() + k * n * bytes, parts[k].send, n * bytes);
      for (size_t r = 0; r < n; r++)
        for (size_t k = 0; k < n; k++)
          memcpy(static_cast<char*>(parts[r].recv) + k * bytes,
                 inputs.get() + (k * n + r) * bytes, bytes);
    }, out);
  }
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
  if (comm->clique) {
    return post_together(comm, {send, recv}, [=](const std::vector<Part>& parts) {
      const void* from = parts[(size_t)root].send;
      for (const Part& p : parts)
        if (p.recv != from) memmove(p.recv, from, count * size);
    }, out);
  }
  if (comm->rank == root && send != recv) memmove(recv, send, count * size);
  return for_each_chunk(count, size, [&](size_t offset, int n) {
    MPI_Request r;
    return posted(MPI_Ibcast(at(recv, offset, size), n, type, root, comm->mpi, &r), &r,
                  "ncclBroadcast", "MPI_Ibcast", out);
  });
}

/* ---- entry points, checked ---- */

ncclResult_t all_reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, ncclComm* handle, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  Reduction red;
  QNCCL_CHECK(check_reduce(comm.get(), type, op, count, 1, fn, &red));
  QNCCL_CHECK(check_buffer(send, count, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, count, "recvbuff", fn));
  const size_t bytes = count * type_size(type);
  return submit_collective(comm, fn, {send, bytes, recv, bytes}, stream,
                           [=](const void* s, void* r, Posted* out) {
                             return post_all_reduce(comm, s, r, count, red, out);
                           });
}

ncclResult_t reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                    ncclRedOp_t op, int root, ncclComm* handle, cudaStream_t stream) {
  const char* fn = "ncclReduce";
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  Reduction red;
  QNCCL_CHECK(check_reduce(comm.get(), type, op, count, 1, fn, &red));
  QNCCL_CHECK(check_root(comm.get(), root, fn));
  QNCCL_CHECK(check_buffer(send, count, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, comm->rank == root ? count : 0, "recvbuff", fn));
  const size_t bytes = count * type_size(type);
  return submit_collective(comm, fn, {send, bytes, recv, comm->rank == root ? bytes : 0}, stream,
                           [=](const void* s, void* r, Posted* out) {
                             return post_reduce(comm, s, r, count, red, root, out);
                           });
}

ncclResult_t reduce_scatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                            ncclRedOp_t op, ncclComm* handle, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  Reduction red;
  QNCCL_CHECK(check_reduce(comm.get(), type, op, recvcount, comm->nranks, fn, &red));
  QNCCL_CHECK(check_buffer(send, recvcount, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, recvcount, "recvbuff", fn));
  const size_t bytes = recvcount * type_size(type);
  return submit_collective(comm, fn, {send, bytes * comm->nranks, recv, bytes}, stream,
                           [=](const void* s, void* r, Posted* out) {
                             return post_reduce_scatter(comm, s, r, recvcount, red, out);
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
                        ncclComm* handle, cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  CommRef comm;
  MPI_Datatype mpi;
  QNCCL_CHECK(check_move_call(send, recv, count, type, handle, fn, &comm, &mpi));
  const size_t size = type_size(type);
  return submit_collective(comm, fn, {send, count * size, recv, count * size * comm->nranks},
                           stream, [=](const void* s, void* r, Posted* out) {
                             return post_all_gather(comm, s, r, count, mpi, size, out);
                           });
}

ncclResult_t all_to_all(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclComm* handle, cudaStream_t stream) {
  const char* fn = "ncclAlltoAll";
  CommRef comm;
  MPI_Datatype mpi;
  QNCCL_CHECK(check_move_call(send, recv, count, type, handle, fn, &comm, &mpi));
  const size_t size = type_size(type);
  const size_t bytes = count * size * comm->nranks;
  return submit_collective(comm, fn, {send, bytes, recv, bytes}, stream,
                           [=](const void* s, void* r, Posted* out) {
                             return post_all_to_all(comm, s, r, count, mpi, size, out);
                           });
}

ncclResult_t broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                       ncclComm* handle, cudaStream_t stream, const char* fn) {
  CommRef comm;
  QNCCL_CHECK(acquire_usable(handle, fn, &comm));
  MPI_Datatype mpi;
  QNCCL_CHECK(check_move(type, count, 1, fn, &mpi));
  QNCCL_CHECK(check_root(comm.get(), root, fn));
  QNCCL_CHECK(check_buffer(send, comm->rank == root ? count : 0, "sendbuff", fn));
  QNCCL_CHECK(check_buffer(recv, count, "recvbuff", fn));
  const size_t size = type_size(type);
  const size_t bytes = count * size;
  return submit_collective(comm, fn, {send, comm->rank == root ? bytes : 0, recv, bytes}, stream,
                           [=](const void* s, void* r, Posted* out) {
                             return post_broadcast(comm, s, r, count, mpi, size, root, out);
                           });
}

}  // namespace
}  // namespace host
}  // namespace qnccl

using namespace qnccl::host;

/* On host memory the work is done when the call returns (or at the outermost
 * ncclGroupEnd), or, on a nonblocking communicator, when
 * ncclCommGetAsyncError reports ncclSuccess; on device memory it is ordered
 * on `stream` (streams.cc). */

QNCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op,
                                        ncclComm_t comm, cudaStream_t stream) {
  return note_group_error(all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
}

QNCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
  return note_group_error(reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}

QNCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff,
                                            size_t recvcount, ncclDataType_t datatype,
                                            ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t stream) {
  return note_group_error(
      reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}

QNCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream) {
  return note_group_error(all_gather(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}

QNCCL_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t stream) {
  return note_group_error(all_to_all(sendbuff, recvbuff, count, datatype, comm, stream));
}

QNCCL_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream) {
  return note_group_error(
      broadcast(sendbuff, recvbuff, count, datatype, root, comm, stream, "ncclBroadcast"));
}

QNCCL_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  return note_group_error(broadcast(buff, buff, count, datatype, root, comm, stream, "ncclBcast"));
}
