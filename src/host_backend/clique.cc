/* Communicators whose ranks all live in this process (ncclCommInitAll of
 * several devices: docs/host-backend.md, "Ranks in one process"). Their
 * operations cannot go through MPI, which has one rank per process; they
 * meet here instead, and complete MPI generalized requests, so a group's
 * flight waits for them exactly as for MPI's (group.cc):
 *   - a send and a receive between two ranks are matched in posting order
 *     per (sender, receiver), as MPI matches them, and the receive copies
 *     the bytes when both are there;
 *   - each rank's k-th collective is the clique's k-th: the last rank to
 *     post its part runs the collective for all of them. */
#include <string.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "host_backend/host.h"

namespace qnccl {
namespace host {

class Clique {
 public:
  explicit Clique(int nranks) : next_(nranks, 0) {}

  /* One posted send or receive. */
  struct Message {
    char* buf;
    size_t bytes;
    MPI_Request request = MPI_REQUEST_NULL;
    bool cancelled = false;
    bool done = false;
    std::pair<int, int> pair;  // (sender, receiver)
    bool send;
    Clique* clique;
  };

  ncclResult_t post_message(bool send, int from, int to, char* buf, size_t bytes,
                            MPI_Request* out) {
    auto* m = new Message{buf, bytes, MPI_REQUEST_NULL, false, false, {from, to}, send, this};
    QNCCL_CHECK(start(m, &m->request, "a send or receive between ranks of this process"));
    *out = m->request;
    Message* other = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::deque<Message*>& mine = (send ? sends_ : recvs_)[m->pair];
      std::deque<Message*>& theirs = (send ? recvs_ : sends_)[m->pair];
      if (theirs.empty()) {
        mine.push_back(m);
        return ncclSuccess;
      }
      other = theirs.front();
      theirs.pop_front();
    }
    Message* s = send ? m : other;
    Message* r = send ? other : m;
    if (s->bytes != r->bytes)
      fprintf(stderr, "QNCCL WARN host backend: rank %d sends %zu bytes to rank %d, which "
              "receives %zu: the first %zu arrive\n", s->pair.first, s->bytes, s->pair.second,
              r->bytes, std::min(s->bytes, r->bytes));
    memcpy(r->buf, s->buf, std::min(s->bytes, r->bytes));
    finish(s);
    finish(r);
    return ncclSuccess;
  }

  ncclResult_t post_part(int rank, Part part, RunTogether run, MPI_Request* out) {
    auto* token = new Message{nullptr, 0, MPI_REQUEST_NULL, false, false, {rank, rank}, false,
                              this};
    QNCCL_CHECK(start(token, &token->request, "a collective of ranks of this process"));
    *out = token->request;
    Slot ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Slot& slot = slots_[next_[(size_t)rank]++];
      if (slot.parts.empty()) {
        slot.parts.resize(next_.size());
        slot.tokens.resize(next_.size());
      }
      slot.parts[(size_t)rank] = part;
      slot.tokens[(size_t)rank] = token;
      if (++slot.arrived < next_.size()) return ncclSuccess;
      ready = std::move(slot);
      slots_.erase(next_[(size_t)rank] - 1);
    }
    run(ready.parts);
    for (Message* t : ready.tokens) finish(t);
    return ncclSuccess;
  }

 private:
  struct Slot {
    std::vector<Part> parts;
    std::vector<Message*> tokens;
    size_t arrived = 0;
  };

  static int query(void* state, MPI_Status* status) {
    const Message* m = static_cast<const Message*>(state);
    MPI_Status_set_elements(status, MPI_BYTE, m->cancelled ? 0 : (int)std::min<size_t>(
                                                                   m->bytes, 1 << 30));
    MPI_Status_set_cancelled(status, m->cancelled);
    status->MPI_SOURCE = m->pair.first;
    status->MPI_TAG = 0;
    return MPI_SUCCESS;
  }

  static int free_state(void* state) {
    delete static_cast<Message*>(state);
    return MPI_SUCCESS;
  }

  /* MPI_Cancel: a send or receive still unmatched leaves its queue. */
  static int cancel(void* state, int complete) {
    Message* m = static_cast<Message*>(state);
    if (complete) return MPI_SUCCESS;
    Clique* c = m->clique;
    bool removed = false;
    {
      std::lock_guard<std::mutex> lock(c->mutex_);
      std::deque<Message*>& q = (m->send ? c->sends_ : c->recvs_)[m->pair];
      for (auto it = q.begin(); it != q.end(); ++it)
        if (*it == m) {
          q.erase(it);
          removed = true;
          break;
        }
    }
    if (removed) {
      m->cancelled = true;
      finish(m);
    }
    return MPI_SUCCESS;
  }

  static ncclResult_t start(Message* m, MPI_Request* request, const char* what) {
    const int rc = MPI_Grequest_start(query, free_state, cancel, m, request);
    if (rc != MPI_SUCCESS) delete m;
    return mpi_result(rc, what, "MPI_Grequest_start");
  }

  static void finish(Message* m) {
    m->done = true;
    MPI_Grequest_complete(m->request);
  }

  std::mutex mutex_;
  std::map<std::pair<int, int>, std::deque<Message*>> sends_, recvs_;
  std::vector<uint64_t> next_;  // each rank's next collective
  std::map<uint64_t, Slot> slots_;
};

std::shared_ptr<Clique> make_clique(int nranks) { return std::make_shared<Clique>(nranks); }

ncclResult_t post_clique_message(const P2p& op, char* buf, size_t bytes, MPI_Request* out) {
  const int me = op.comm->rank;
  return op.comm->clique->post_message(op.send, op.send ? me : op.peer, op.send ? op.peer : me,
                                       buf, bytes, out);
}

ncclResult_t post_together(const CommRef& comm, Part part, RunTogether run, Posted* out) {
  MPI_Request request;
  QNCCL_CHECK(comm->clique->post_part(comm->rank, part, std::move(run), &request));
  out->requests.push_back(request);
  return ncclSuccess;
}

}  // namespace host
}  // namespace qnccl
