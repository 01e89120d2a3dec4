/* QNCCL_TUNE_FILE (docs/tuning.md): measured auto's decisions kept across
 * jobs. A text file, one decision per line under a header naming the
 * library's version:
 *
 *   qnccl-tune-file 1 libqnccl 0.1.0
 *   allreduce float32 class=20 ranks=4 nodes=1 local=4 memory=host bits=4 bucket=128
 *     rounding=stochastic feedback=0 inter=auto intra=0 lanes=0 : ring exact=1234 ring=456
 *     tree=789 sra=512
 *
 * (one line per decision: its key, then the choice and the agreed times of
 * every candidate in whole microseconds). A file another version wrote, or
 * with a line that is not of this form, is not trusted: its reader warns once
 * and reads nothing, and the next decision stored rewrites it whole; a file
 * whose first line is not a tune file's header is never written. */
#ifndef QNCCL_SHIM_TUNE_FILE_H_
#define QNCCL_SHIM_TUNE_FILE_H_

#include <stdint.h>

#include <map>
#include <string>
#include <vector>

#include "qnccl.h"

namespace qnccl {

/* Everything a decision depends on besides the links: the key's line text.
 * Every rank must pass the same values (nodes and local_ranks 0 on a layout
 * whose nodes hold different numbers of ranks). */
std::string tune_file_key(qncclCollective_t kind, ncclDataType_t type, int size_class, int ranks,
                          int nodes, int local_ranks, bool device,
                          const qncclAllReduceConfig_t& config);

/* One stored decision: its candidates' names in order, the choice's index
 * and the agreed times (seconds). */
struct StoredDecision {
  std::vector<std::string> candidates;
  int choice = -1;
  std::vector<double> seconds;
};

/* The decisions of a file, as read once. */
struct TuneFileSnapshot {
  std::map<std::string, StoredDecision> decisions;
  uint64_t hash = 0;  // of the decisions read (0: none): ranks compare it
};

/* Reads `path` (null: nothing) under a shared lock. A missing file is empty;
 * an unreadable, stale or malformed one is empty too, with one warning per
 * process naming the path and what is wrong. */
TuneFileSnapshot read_tune_file(const char* path);

/* Adds (or replaces) `key`'s decision in `path` under an exclusive lock on
 * `path`.lock: the file is read, merged (a tune file not trusted is dropped;
 * any other file is left alone, with a warning) and written whole to a
 * temporary renamed over it, so readers see the old file or the new one. A
 * failure warns once per process; the job goes on. */
void store_tune_decision(const char* path, const std::string& key, const StoredDecision& d);

}  // namespace qnccl

#endif
