/* Communicators from an ncclUniqueId, over MPI_COMM_WORLD point-to-point.
 *
 * Any subset of the world's processes can form a communicator without the
 * others taking part (PyTorch makes one per process group), so nothing here is
 * collective over MPI_COMM_WORLD. The id names a rendezvous root: the world
 * rank that called ncclGetUniqueId, which must also call ncclCommInitRank with
 * it. The id holds (magic, format version, root world rank, world size,
 * serial, nonce); the serial picks the tags, the nonce tells this rendezvous'
 * messages from stale ones of abandoned rendezvous that share the tags.
 *
 *   1. join     member -> root     world rank, nccl rank, nranks
 *   2. verdict  root -> members    success and the world rank of every nccl
 *                                  rank, or an error code and message
 *   3. ready    member -> root     "I will enter MPI_Comm_create_group"
 *   4. commit   root -> members    go, or an error (someone was not ready)
 *   then all members call MPI_Comm_create_group on the members ordered by
 *   nccl rank, so MPI rank == nccl rank.
 *
 * The root waits QNCCL_HOST_INIT_TIMEOUT seconds for the joins and validates
 * them (all nranks agree, every rank 0..nranks-1 exactly once); its verdict
 * names what went wrong, e.g. the ranks that did not arrive. Members wait
 * twice as long, so the root's verdict reaches them before they give up on
 * their own. Steps 3-4 exist because MPI_Comm_create_group cannot time out: a
 * member that gave up before the verdict came never says "ready", and the
 * root then tells the others to fail instead of entering it.
 *
 * Messages are bytes (homogeneous machines) of one layout, received with a
 * matched probe so their size may vary; tags come from the top of MPI's tag
 * range (kTagSlots * kTagsPerSlot values below MPI_TAG_UB). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <string>
#include <vector>

#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

constexpr uint64_t kIdMagic = 0x514e4343484f5354ull;  // "QNCCHOST"
constexpr uint32_t kIdVersion = 1;
constexpr int kTagSlots = 1024;

/* Tags of one rendezvous, as offsets below its slot's base tag. */
enum Step { kJoin, kVerdict, kReady, kCommit, kCreateGroup, kTagsPerSlot };

struct IdContents {
  uint64_t magic;
  uint32_t version;
  int32_t root;        // world rank of the rendezvous root
  int32_t world_size;  // of the MPI job that made the id
  uint32_t serial;     // per root: which tags the rendezvous uses
  uint64_t nonce;
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "the id must fit ncclUniqueId");

/* One layout for every step; a verdict is followed by int32 world ranks. */
struct Message {
  uint64_t nonce;
  int32_t world_rank;
  int32_t rank;
  int32_t nranks;
  int32_t code;
  char text[512];
};

int world_rank() {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int tag_of(const IdContents& id, Step step) {
  void* value;
  int found;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found);
  // Spread the slots of different roots, which count their serials alike.
  int slot = (int)((id.serial + 7919u * (uint32_t)id.root) % kTagSlots);
  return *(int*)value - kTagsPerSlot * slot - step;
}

/* Sends `message` (and `trailer`) to `dest`, waiting for the send to
 * complete until `deadline`, which also bounds the caller's next wait: a send
 * can stay incomplete until the receiver enters MPI. On timeout the request
 * is let go and its copy of the bytes deliberately leaked: MPI may still
 * deliver it, and the receiver's nonce check decides what it is worth. */
void send_message(const Message& message, int dest, int tag, Deadline& deadline,
                  const std::vector<int32_t>& trailer = {}) {
  auto* bytes = new std::vector<char>(sizeof message + trailer.size() * sizeof(int32_t));
  memcpy(bytes->data(), &message, sizeof message);
  if (!trailer.empty()) memcpy(bytes->data() + sizeof message, trailer.data(), trailer.size() * 4);
  MPI_Request request;
  MPI_Isend(bytes->data(), (int)bytes->size(), MPI_BYTE, dest, tag, MPI_COMM_WORLD, &request);
  for (;; deadline.pause()) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) {
      delete bytes;
      return;
    }
    if (deadline.passed()) {
      MPI_Request_free(&request);
      return;
    }
  }
}

/* Receives the next message of this rendezvous (`nonce`) from `source` (or
 * any) with `tag` before the deadline, dropping stale ones; false on timeout. */
bool receive_message(uint64_t nonce, int source, int tag, Deadline& deadline,
                     std::vector<char>* bytes, Message* message) {
  for (;; deadline.pause()) {
    int found = 0;
    MPI_Message handle;
    MPI_Status status;
    MPI_Improbe(source, tag, MPI_COMM_WORLD, &found, &handle, &status);
    if (found) {
      int size;
      MPI_Get_count(&status, MPI_BYTE, &size);
      bytes->resize(size);
      MPI_Mrecv(bytes->data(), size, MPI_BYTE, &handle, MPI_STATUS_IGNORE);
      if ((size_t)size < sizeof *message) continue;
      memcpy(message, bytes->data(), sizeof *message);
      if (message->nonce == nonce) return true;
    } else if (deadline.passed()) {
      return false;
    }
  }
}

Message make_message(const IdContents& id, int rank, int nranks, ncclResult_t code,
                     const std::string& text) {
  Message message{};
  message.nonce = id.nonce;
  message.world_rank = world_rank();
  message.rank = rank;
  message.nranks = nranks;
  message.code = code;
  snprintf(message.text, sizeof message.text, "%s", text.c_str());
  return message;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  return text;
}

std::string list_of(const std::vector<int>& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return text;
}

/* What the root learns from the joins: the world rank of each nccl rank and
 * the first problem found. */
struct Joins {
  std::vector<int> world_of;      // -1: not arrived
  std::vector<int> joined_world;  // world ranks that sent a join, in arrival order
  ncclResult_t code = ncclSuccess;
  std::string problem;

  void fail(ncclResult_t c, const std::string& text) {
    if (code != ncclSuccess) return;
    code = c;
    problem = text;
  }
};

void check_join(const Message& join, int nranks, Joins* joins) {
  joins->joined_world.push_back(join.world_rank);
  if (join.nranks != nranks) {
    joins->fail(ncclInvalidUsage,
                format("ranks disagree on nranks: world rank %d passed nranks=%d, the root "
                       "(world rank %d) passed %d",
                       join.world_rank, join.nranks, world_rank(), nranks));
  } else if (join.rank < 0 || join.rank >= nranks) {
    joins->fail(ncclInvalidArgument, format("world rank %d passed rank %d, outside 0..%d",
                                            join.world_rank, join.rank, nranks - 1));
  } else if (joins->world_of[join.rank] != -1) {
    joins->fail(ncclInvalidUsage, format("rank %d was passed by two processes: world ranks %d "
                                         "and %d",
                                         join.rank, joins->world_of[join.rank], join.world_rank));
  } else {
    joins->world_of[join.rank] = join.world_rank;
  }
}

void collect_joins(const IdContents& id, int nranks, double timeout_s, Joins* joins) {
  Deadline deadline(timeout_s);
  std::vector<char> bytes;
  Message join;
  while ((int)joins->joined_world.size() < nranks - 1 &&
         receive_message(id.nonce, MPI_ANY_SOURCE, tag_of(id, kJoin), deadline, &bytes, &join)) {
    check_join(join, nranks, joins);
  }
  if (joins->code != ncclSuccess || (int)joins->joined_world.size() == nranks - 1) return;
  std::vector<int> missing;
  for (int r = 0; r < nranks; r++) {
    if (joins->world_of[r] == -1) missing.push_back(r);
  }
  joins->fail(ncclSystemError,
              format("ranks %s (of %d) did not call ncclCommInitRank within %g s "
                     "(QNCCL_HOST_INIT_TIMEOUT); arrived: world ranks %d (root), %s",
                     list_of(missing).c_str(), nranks, timeout_s, world_rank(),
                     list_of(joins->joined_world).c_str()));
}

/* Steps 3-4 at the root: OK only when every member said it is ready. */
ncclResult_t confirm_ready(const IdContents& id, int nranks, double timeout_s,
                           const Joins& joins) {
  Deadline deadline(timeout_s);
  std::vector<char> bytes;
  Message ready;
  std::vector<int> silent;
  for (int member : joins.joined_world) {
    if (!receive_message(id.nonce, member, tag_of(id, kReady), deadline, &bytes, &ready)) {
      silent.push_back(member);
    }
  }
  ncclResult_t code = silent.empty() ? ncclSuccess : ncclSystemError;
  std::string text = silent.empty() ? "" :
      format("ncclCommInitRank: world ranks %s gave up before the communicator was complete "
             "(the rendezvous root, world rank %d, came late?)", list_of(silent).c_str(),
             world_rank());
  Message commit = make_message(id, 0, nranks, code, text);
  Deadline sending(timeout_s);
  for (int member : joins.joined_world) send_message(commit, member, tag_of(id, kCommit), sending);
  return code == ncclSuccess ? ncclSuccess : set_error(code, "%s", text.c_str());
}

ncclResult_t root_rendezvous(const IdContents& id, int nranks, int rank, double timeout_s,
                             std::vector<int>* members) {
  Joins joins;
  joins.world_of.assign(nranks, -1);
  joins.world_of[rank] = world_rank();
  collect_joins(id, nranks, timeout_s, &joins);
  Message verdict =
      make_message(id, rank, nranks, joins.code, "ncclCommInitRank: " + joins.problem);
  std::vector<int32_t> trailer;
  if (joins.code == ncclSuccess) trailer.assign(joins.world_of.begin(), joins.world_of.end());
  Deadline sending(timeout_s);
  for (int member : joins.joined_world) {
    send_message(verdict, member, tag_of(id, kVerdict), sending, trailer);
  }
  if (joins.code != ncclSuccess) return set_error(joins.code, "%s", verdict.text);
  *members = joins.world_of;
  return confirm_ready(id, nranks, timeout_s, joins);
}

ncclResult_t no_answer(const IdContents& id, const char* step, double waited_s) {
  return set_error(ncclSystemError,
                   "ncclCommInitRank: no %s from the rendezvous root (world rank %d, the process "
                   "that called ncclGetUniqueId; it must call ncclCommInitRank with the id too) "
                   "within %g s (2 x QNCCL_HOST_INIT_TIMEOUT)",
                   step, id.root, waited_s);
}

/* Tells the root `step` (join or ready), then waits for its answer (verdict
 * or commit) until 2 x timeout_s after the call; copies its error, if any. */
ncclResult_t ask_root(const IdContents& id, const Message& message, Step step, double timeout_s,
                      std::vector<char>* bytes) {
  Deadline deadline(2 * timeout_s);
  send_message(message, id.root, tag_of(id, step), deadline);
  Step answer_step = step == kJoin ? kVerdict : kCommit;
  Message answer;
  if (!receive_message(id.nonce, id.root, tag_of(id, answer_step), deadline, bytes, &answer)) {
    return no_answer(id, step == kJoin ? "verdict" : "go-ahead", 2 * timeout_s);
  }
  if (answer.code != ncclSuccess) {
    return set_error((ncclResult_t)answer.code, "%s (reported by the rendezvous root)",
                     answer.text);
  }
  return ncclSuccess;
}

ncclResult_t member_rendezvous(const IdContents& id, int nranks, int rank, double timeout_s,
                               std::vector<int>* members) {
  Message message = make_message(id, rank, nranks, ncclSuccess, "");
  std::vector<char> bytes;
  QNCCL_CHECK(ask_root(id, message, kJoin, timeout_s, &bytes));
  if (bytes.size() != sizeof(Message) + nranks * sizeof(int32_t)) {
    return set_error(ncclInternalError, "ncclCommInitRank: malformed verdict from the root");
  }
  members->resize(nranks);
  memcpy(members->data(), bytes.data() + sizeof(Message), nranks * sizeof(int32_t));
  return ask_root(id, message, kReady, timeout_s, &bytes);
}

ncclResult_t create_group(const IdContents& id, const std::vector<int>& members, MPI_Comm* out) {
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, (int)members.size(), members.data(), &group);
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag_of(id, kCreateGroup), out);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return mpi_result(rc, "ncclCommInitRank", "MPI_Comm_create_group");
}

ncclResult_t read_id(const ncclUniqueId& raw, IdContents* id) {
  memcpy(id, raw.internal, sizeof *id);
  if (id->magic != kIdMagic || id->version != kIdVersion) {
    return set_error(ncclInvalidArgument, "ncclCommInitRank: commId was not made by the host "
                     "backend's ncclGetUniqueId (or by another version of it)");
  }
  if (id->world_size != world_size() || id->root < 0 || id->root >= id->world_size) {
    return set_error(ncclInvalidArgument, "ncclCommInitRank: commId comes from another MPI job "
                     "(%d processes, root %d; this job has %d): ids must be exchanged within "
                     "one MPI_COMM_WORLD", id->world_size, id->root, world_size());
  }
  return ncclSuccess;
}

uint64_t random_nonce() {
  std::random_device device;
  uint64_t time = (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
  return ((uint64_t)device() << 32 ^ device()) ^ time ^ ((uint64_t)getpid() << 40);
}

}  // namespace

ncclResult_t new_unique_id(ncclUniqueId* out) {
  static std::atomic<uint32_t> serial{0};
  IdContents id{kIdMagic, kIdVersion, world_rank(), world_size(), serial++, random_nonce()};
  memset(out, 0, sizeof *out);
  memcpy(out->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t rendezvous(const ncclUniqueId& raw, int nranks, int rank, double timeout_s,
                        MPI_Comm* out) {
  IdContents id;
  QNCCL_CHECK(read_id(raw, &id));
  bool root = world_rank() == id.root;
  if (rank < 0 || rank >= nranks || nranks > world_size()) {
    // Tell the root, which then fails everyone at once instead of timing out.
    if (!root && nranks >= 1) {
      Deadline sending(timeout_s);
      send_message(make_message(id, rank, nranks, ncclSuccess, ""), id.root, tag_of(id, kJoin),
                   sending);
    }
    return set_error(ncclInvalidArgument, "ncclCommInitRank: rank %d with nranks %d: need "
                     "0 <= rank < nranks <= %d (the MPI job's processes; one per rank)",
                     rank, nranks, world_size());
  }
  std::vector<int> members;
  QNCCL_CHECK(root ? root_rendezvous(id, nranks, rank, timeout_s, &members)
                   : member_rendezvous(id, nranks, rank, timeout_s, &members));
  return create_group(id, members, out);
}

}  // namespace host
}  // namespace qnccl
