#include "shim/tune_file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "codec/codec.h"
#include "config/config.h"
#include "engine/report.h"
#include "shim/shim.h"

namespace qnccl {

namespace {

#define QNCCL_STR2(x) #x
#define QNCCL_STR(x) QNCCL_STR2(x)
const char kHeader[] = "qnccl-tune-file 1 libqnccl " QNCCL_STR(QNCCL_MAJOR) "." QNCCL_STR(
    QNCCL_MINOR) "." QNCCL_STR(QNCCL_PATCH);

const char* collective_word(qncclCollective_t kind) {
  return collective_name(__builtin_ctz((unsigned)kind));
}

/* One warning per (path, problem) per process. */
void warn_once(const std::string& path, const std::string& problem) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(path + "\n" + problem).second) return;
  warn("QNCCL_TUNE_FILE=%s %s", path.c_str(), problem.c_str());
}

/* A lock held on `path`.lock for the object's life (none when it cannot be
 * taken: the caller goes on without it, as a missing lock only risks a lost
 * update). */
class FileLock {
 public:
  FileLock(const std::string& path, int how) {
    fd_ = open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    int res = -1;
    while (fd_ >= 0 && (res = flock(fd_, how)) != 0 && errno == EINTR) {
    }
    if (fd_ >= 0 && res != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

/* Whether `key` has tune_file_key's words in their order. */
bool key_well_formed(const std::string& key) {
  static const char* const fields[] = {"class=", "ranks=", "nodes=", "local=", "memory=",
                                       "bits=", "bucket=", "rounding=", "feedback=", "inter=",
                                       "intra=", "lanes=", "segment=", "rotation="};
  std::istringstream in(key);
  std::string collective, type, word;
  if (!(in >> collective >> type)) return false;
  for (const char* field : fields)
    if (!(in >> word) || word.rfind(field, 0) != 0 || word.size() == strlen(field)) return false;
  return !(in >> word);
}

/* Parses "<choice> name=us name=us ..." into d (whole microseconds, or "-"
 * for a candidate never timed: integers, so no locale changes a byte); false
 * when malformed. */
bool parse_value(const std::string& text, StoredDecision* d) {
  std::istringstream in(text);
  std::string choice, pair;
  if (!(in >> choice)) return false;
  while (in >> pair) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == pair.size()) return false;
    const std::string value = pair.substr(eq + 1);
    double seconds = INFINITY;
    if (value != "-") {
      if (value.size() > 15 || value.find_first_not_of("0123456789") != std::string::npos)
        return false;
      seconds = (double)strtoull(value.c_str(), nullptr, 10) * 1e-6;
    }
    d->candidates.push_back(pair.substr(0, eq));
    d->seconds.push_back(seconds);
    if (d->candidates.back() == choice) d->choice = (int)d->candidates.size() - 1;
  }
  return d->choice >= 0;
}

std::string format_value(const StoredDecision& d) {
  std::string out = d.candidates[d.choice];
  for (size_t i = 0; i < d.candidates.size(); i++) {
    const double us = d.seconds[i] * 1e6;
    out += " " + d.candidates[i] + "=" +
           (us >= 0.0 && us < 1e15 ? std::to_string((unsigned long long)llround(us)) : "-");
  }
  return out;
}

/* One decision's line, as the file holds it. */
std::string line_text(const std::string& key, const StoredDecision& d) {
  return key + " : " + format_value(d) + "\n";
}

/* The decisions of the file's text; false (with what is wrong in *problem)
 * when the text is not a whole file of this version. */
bool parse(const std::string& text, std::map<std::string, StoredDecision>* out,
           std::string* problem) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) {
    *problem = "was not written by this libqnccl (its first line is '" + line.substr(0, 80) +
               "', expected '" + kHeader + "')";
    return false;
  }
  for (int number = 2; std::getline(in, line); number++) {
    const size_t colon = line.find(" : ");
    StoredDecision d;
    const std::string key = colon == std::string::npos ? "" : line.substr(0, colon);
    const bool key_ok = key_well_formed(key);
    if (!key_ok || !parse_value(line.substr(colon + 3), &d)) {
      *problem = "line " + std::to_string(number) + " is not '<key> : <choice> <name>=<us>...': '" +
                 line.substr(0, 80) + "'";
      return false;
    }
    (*out)[key] = d;
  }
  return true;
}

/* A tune file holds a few hundred lines: more than this is not one. */
constexpr size_t kMaxFileBytes = 4u << 20;

/* The file's text; false when it does not exist (errno ENOENT), is not a
 * regular file of at most kMaxFileBytes (a FIFO would block the rank while
 * the others wait for it) or cannot be read (errno). */
bool slurp(const char* path, std::string* text) {
  const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = fstat(fd, &st) == 0;
  if (ok && (!S_ISREG(st.st_mode) || (size_t)st.st_size > kMaxFileBytes)) {
    errno = S_ISREG(st.st_mode) ? EFBIG : EINVAL;
    ok = false;
  }
  char buf[4096];
  ssize_t n = 0;
  while (ok && text->size() <= kMaxFileBytes && (n = read(fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ok = false;
    else text->append(buf, (size_t)n);
  }
  if (ok && text->size() > kMaxFileBytes) {  // grew while read
    errno = EFBIG;
    ok = false;
  }
  const int saved = errno;
  close(fd);
  errno = saved;
  return ok;
}

/* Whether `text` may be replaced by a tune file: empty, or one already. */
bool replaceable(const std::string& text) {
  return text.empty() || text.rfind("qnccl-tune-file ", 0) == 0;
}

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::string tune_file_key(qncclCollective_t kind, ncclDataType_t type, int size_class, int ranks,
                          int nodes, int local_ranks, bool device,
                          const qncclAllReduceConfig_t& config) {
  char key[320];
  snprintf(key, sizeof key,
           "%s %s class=%d ranks=%d nodes=%d local=%d memory=%s bits=%d bucket=%zu rounding=%s "
           "feedback=%d inter=%s intra=%d lanes=%d segment=%zu rotation=%zu",
           collective_word(kind), short_type_name(type), size_class, ranks, nodes, local_ranks,
           device ? "device" : "host", config.codec.bits, config.codec.bucketSize,
           rounding_name(config.codec.rounding), config.errorFeedback,
           algo_name(config.interAlgo), config.intraBits, config.lanes,
           config.segmentValues, rotation_block(config.codec));
  return key;
}

TuneFileSnapshot read_tune_file(const char* path) {
  TuneFileSnapshot snap;
  if (path == nullptr) return snap;
  std::string text;
  {
    const FileLock lock(path, LOCK_SH);
    errno = 0;
    if (!slurp(path, &text)) {
      if (errno != ENOENT)
        warn_once(path, std::string("cannot be read (") + strerror(errno) +
                            "): measured auto runs its trials");
      return snap;
    }
  }
  std::string problem;
  if (!parse(text, &snap.decisions, &problem)) {
    warn_once(path, problem + ": not trusted, measured auto runs its trials and rewrites it");
    snap.decisions.clear();
    return snap;
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [key, d] : snap.decisions) h = fnv1a(line_text(key, d), h);
  snap.hash = snap.decisions.empty() ? 0 : h;
  return snap;
}

void store_tune_decision(const char* path, const std::string& key, const StoredDecision& d) {
  const FileLock lock(path, LOCK_EX);
  std::string text, problem;
  std::map<std::string, StoredDecision> all;
  errno = 0;
  if (!slurp(path, &text) && errno != ENOENT) {  // not a regular file, or unreadable
    warn_once(path, std::string("cannot be read (") + strerror(errno) +
                        "): left alone, no decision stored");
    return;
  }
  if (!replaceable(text)) {  // a typo must not destroy someone's file
    warn_once(path, "is not a tune file (its first line is not 'qnccl-tune-file ...'): left "
                    "alone, no decision stored");
    return;
  }
  if (!parse(text, &all, &problem)) all.clear();  // not trusted: replaced whole
  all[key] = d;
  std::ostringstream tmp_name;
  tmp_name << path << ".tmp." << getpid() << "." << std::this_thread::get_id();
  const std::string tmp = tmp_name.str();
  FILE* f = fopen(tmp.c_str(), "wb");
  bool ok = f != nullptr;
  if (ok) {
    fprintf(f, "%s\n", kHeader);
    for (const auto& [k, v] : all) fputs(line_text(k, v).c_str(), f);
    ok = fflush(f) == 0 && !ferror(f);
    ok = (fclose(f) == 0) && ok;
    ok = ok && rename(tmp.c_str(), path) == 0;
  }
  if (!ok) {
    warn_once(path, std::string("cannot be written (") + strerror(errno) +
                        "): later jobs will run the trials again");
    unlink(tmp.c_str());
  }
}

}  // namespace qnccl
