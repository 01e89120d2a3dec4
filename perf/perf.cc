// The perf driver's sweep: for every type, op and size the row's
// placements, measured and checked, printed as they come (docs/perf.md).
// Each part lives in its own file: options.cc, reference.cc, timing.cc,
// output.cc.
#include "perf.h"

#include <errno.h>
#include <mpi.h>
#include <string.h>

#include <cstdio>
#include <string>
#include <vector>

#include "driver.h"

namespace perf {
namespace {

bool run_sweep(Backend& backend, Collective collective, const Options& opt, int rank,
               int nranks, std::vector<Result>* results) {
  const std::vector<size_t> sizes = sweep(opt);
  const Shape shape = shape_of(collective, 0, nranks);
  for (const DataType* type : opt.types) {
    for (const ReduceOp* op : opt.ops) {
      const std::string why = backend.unsupported(collective, *type, *op, opt.memory);
      if (!why.empty()) {  // only with -d all or -o all: a single one was rejected up front
        if (rank == 0) printf("# skipped %s %s: %s\n", type->name, op->name, why.c_str());
        continue;
      }
      auto row_count = [&](size_t bytes) { return bytes / type->size / shape.divide * shape.divide; };
      Calls calls(backend, collective, opt, rank, nranks, *type, row_count(opt.max_bytes));
      for (size_t bytes : {opt.max_bytes, opt.min_bytes}) {  // warm-up, as nccl-tests does
        Result warm;
        warm.count = row_count(bytes);
        warm.type = type;
        warm.op = op;
        for (int i = 0; i < opt.warmup_iters; i++)
          if (!calls.call(warm)) return false;
      }
      if (!calls.wait()) return false;
      for (size_t size : sizes) {
        const Result* placed[2] = {nullptr, nullptr};  // out of place, in place
        size_t measured = 0;
        for (bool in_place : opt.placements) {
          if (in_place && !shape.has_in_place) continue;
          Result row;
          row.count = row_count(size);
          row.size = row.count * type->size;
          row.type = type;
          row.op = op;
          row.in_place = in_place;
          const uint64_t tag =
              mix64(row.count * 131 + (uint64_t)type->nccl * 7 + (uint64_t)op->nccl);
          if (in_place == opt.placements[0]) {  // once per size: its placements share it
            for (int i = 0; i < settle_calls(backend, opt); i++)
              if (!calls.call(row)) return false;
            if (!calls.wait()) return false;
          }
          if (!measure(calls, &row, tag)) return false;
          results->push_back(row);
          measured++;
        }
        for (size_t i = results->size() - measured; i < results->size(); i++)
          placed[(*results)[i].in_place] = &(*results)[i];
        if (rank == 0 && measured > 0) print_row(placed[0], placed[1], shape.same_output);
        if (rank == 0 && measured > 0 && opt.interleave > 0) print_plain(placed[0], placed[1]);
      }
    }
  }
  return true;
}

}  // namespace

int run(int argc, char** argv, Backend& backend, Collective collective) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1, local_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);

  Options opt;
  int status = 0;  // 0 run, 1 stop (help printed), 2 bad options
  try {
    if (!parse_options(argc, argv, backend.tool(), collective, &opt)) status = 1;
  } catch (const BadOption& e) {
    if (rank == 0) fprintf(stderr, "%s: %s\n", backend.tool(), e.what());
    status = 2;
  }
  if (status == 0 && opt.types.size() == 1 && opt.ops.size() == 1) {
    std::string why = backend.unsupported(collective, *opt.types[0], *opt.ops[0], opt.memory);
    if (!why.empty()) {
      if (rank == 0) fprintf(stderr, "%s: %s\n", backend.tool(), why.c_str());
      status = 2;
    }
  }
  if (status == 0 && opt.interleave > 0 && backend.plain_library().empty()) {
    if (rank == 0)
      fprintf(stderr,
              "%s: --interleave: no plain library to time beside this binary's calls (the NCCL "
              "perf binaries time the libnccl.so.2 they link, NCCL 2.28 or later for "
              "alltoall_perf); leave --interleave out\n",
              backend.tool());
    status = 2;
  }
  FILE* json = nullptr;
  if (status == 0 && rank == 0 && !opt.json_path.empty()) {
    json = fopen(opt.json_path.c_str(), "w");
    if (!json) {
      fprintf(stderr, "%s: -J/--json: cannot write %s: %s\n", backend.tool(), opt.json_path.c_str(),
              strerror(errno));
      status = 2;
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (status != 0) {
    if (json) fclose(json);
    MPI_Finalize();
    return status == 1 ? 0 : 2;
  }

  // A rank that fails inside a collective cannot tell the others, which would
  // wait forever: every failure past this point aborts the whole job.
  if (!backend.init(rank, nranks, local_rank, opt.memory)) MPI_Abort(MPI_COMM_WORLD, 1);
  print_header(backend, opt, rank, nranks, local_rank);
  if (rank == 0) print_table_header();
  std::vector<Result> rows;
  if (!run_sweep(backend, collective, opt, rank, nranks, &rows)) MPI_Abort(MPI_COMM_WORLD, 1);

  double avg_busbw = 0;
  for (const Result& r : rows) avg_busbw += r.busbw / (double)rows.size();
  bool ok = true;
  if (rank == 0) {
    const bool same_output = shape_of(collective, 0, nranks).same_output;
    ok = print_summary(backend, opt, rows, avg_busbw, same_output);
    const char* check = !opt.check ? "off" : ok ? "OK" : "FAILED";
    bool written = !json || write_json(json, backend, collective, opt, nranks, rows, avg_busbw, check);
    if (json && (fclose(json) != 0 || !written)) {
      fprintf(stderr, "%s: -J/--json: writing %s failed: %s\n", backend.tool(),
              opt.json_path.c_str(), strerror(errno));
      ok = false;
    }
  }
  int failed = !ok;
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  backend.finalize();
  MPI_Finalize();
  return failed ? 1 : 0;
}

}  // namespace perf
