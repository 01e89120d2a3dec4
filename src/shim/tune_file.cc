#include "shim/tune_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <sstream>
#include <thread>

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
    if (fd_ >= 0 && flock(fd_, how) != 0) {
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
  static const char* const fields[] = {"class=", "ranks=", "nodes=", "local=", "bits=",
                                       "bucket=", "rounding=", "feedback=", "inter=",
                                       "intra=", "lanes="};
  std::istringstream in(key);
  std::string collective, type, word;
  if (!(in >> collective >> type)) return false;
  for (const char* field : fields)
    if (!(in >> word) || word.rfind(field, 0) != 0 || word.size() == strlen(field)) return false;
  return !(in >> word);
}

/* Parses "<choice> name=ms name=ms ..." into d; false when malformed. */
bool parse_value(const std::string& text, StoredDecision* d) {
  std::istringstream in(text);
  std::string choice, pair;
  if (!(in >> choice)) return false;
  while (in >> pair) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    char* end = nullptr;
    const double ms = strtod(pair.c_str() + eq + 1, &end);
    if (end == pair.c_str() + eq + 1 || *end != '\0' || !(ms >= 0.0)) return false;
    d->candidates.push_back(pair.substr(0, eq));
    d->seconds.push_back(ms * 1e-3);
    if (d->candidates.back() == choice) d->choice = (int)d->candidates.size() - 1;
  }
  return d->choice >= 0;
}

std::string format_value(const StoredDecision& d) {
  std::string out = d.candidates[d.choice];
  char ms[64];
  for (size_t i = 0; i < d.candidates.size(); i++) {
    snprintf(ms, sizeof ms, "%.6g", d.seconds[i] * 1e3);
    out += " " + d.candidates[i] + "=" + ms;
  }
  return out;
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
      *problem = "line " + std::to_string(number) + " is not '<key> : <choice> <name>=<ms>...': '" +
                 line.substr(0, 80) + "'";
      return false;
    }
    (*out)[key] = d;
  }
  return true;
}

/* The file's text; false when it does not exist or cannot be read (errno). */
bool slurp(const char* path, std::string* text) {
  FILE* f = fopen(path, "rb");
  if (f == nullptr) return false;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) text->append(buf, n);
  const bool ok = !ferror(f);
  fclose(f);
  return ok;
}

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::string tune_file_key(qncclCollective_t kind, ncclDataType_t type, int size_class, int ranks,
                          int nodes, int local_ranks, const qncclAllReduceConfig_t& config) {
  char key[320];
  snprintf(key, sizeof key,
           "%s %s class=%d ranks=%d nodes=%d local=%d bits=%d bucket=%zu rounding=%s "
           "feedback=%d inter=%s intra=%d lanes=%d",
           collective_word(kind), short_type_name(type), size_class, ranks, nodes, local_ranks,
           config.codec.bits, config.codec.bucketSize, rounding_name(config.codec.rounding),
           config.errorFeedback, algo_name(config.interAlgo), config.intraBits, config.lanes);
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
  for (const auto& [key, d] : snap.decisions) h = fnv1a(key + " : " + format_value(d) + "\n", h);
  snap.hash = snap.decisions.empty() ? 0 : h;
  return snap;
}

void store_tune_decision(const char* path, const std::string& key, const StoredDecision& d) {
  const FileLock lock(path, LOCK_EX);
  std::string text, problem;
  std::map<std::string, StoredDecision> all;
  if (slurp(path, &text) && !parse(text, &all, &problem)) all.clear();  // not trusted: replaced
  all[key] = d;
  std::ostringstream tmp_name;
  tmp_name << path << ".tmp." << getpid() << "." << std::this_thread::get_id();
  const std::string tmp = tmp_name.str();
  FILE* f = fopen(tmp.c_str(), "wb");
  bool ok = f != nullptr;
  if (ok) {
    fprintf(f, "%s\n", kHeader);
    for (const auto& [k, v] : all) fprintf(f, "%s : %s\n", k.c_str(), format_value(v).c_str());
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
