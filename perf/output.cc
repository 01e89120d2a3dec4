// The perf driver's output: the header, nccl-tests' table, the summary and
// the JSON (docs/perf.md, "Output").
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "driver.h"

namespace perf {
namespace {

std::string format(const char* fmt, double value) {
  char buf[64];
  snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

// Seven characters, as nccl-tests prints times.
std::string time_str(double us) {
  return format(us >= 10000 ? "%7.0f" : us >= 100 ? "%7.1f" : "%7.2f", us);
}

std::string error_str(const Result& r) { return r.checked ? format("%.1e", r.error) : "N/A"; }

}  // namespace

void print_table_header() {
  // Each placement's title centred over its 34 columns.
  printf("#\n#%51s%11s%s%11s%13s%s\n", "", "", "out-of-place", "", "", "in-place");
  printf("#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
  for (int i = 0; i < 2; i++) printf("  %7s  %6s  %6s  %7s", "time", "algbw", "busbw", "error");
  printf("  %5s  %5s\n", "agree", "wire");
  printf("#%11s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
  for (int i = 0; i < 2; i++) printf("  %7s  %6s  %6s  %7s", "(us)", "(GB/s)", "(GB/s)", "");
  printf("  %5s  %5s\n", "", "(B/B)");
  fflush(stdout);
}

// The row of nccl-tests (fields 0..12 in its order, the error in place of
// #wrong) plus whether ranks agree (where they must: "-" elsewhere) and the
// bytes each rank sent per input byte. A placement left out by --placement,
// or the collective (null), prints N/A in its fields.
void print_row(const Result* oop, const Result* ip, bool same_output) {
  const Result& any = oop ? *oop : *ip;
  printf("%12zu  %12zu  %8s  %6s  %6d", any.size, any.count, any.type->name, any.op->name, -1);
  bool agree = true;
  for (const Result* r : {oop, ip}) {
    if (!r) {
      printf("  %7s  %6s  %6s  %7s", "N/A", "N/A", "N/A", "N/A");
      continue;
    }
    printf("  %7s  %6.2f  %6.2f  %7s", time_str(r->time_us).c_str(), r->algbw, r->busbw,
           error_str(*r).c_str());
    agree = agree && r->agree;
  }
  printf("  %5s  %5.3f\n", !any.checked ? "N/A" : !same_output ? "-" : agree ? "yes" : "NO",
         any.wire_per_byte);
  fflush(stdout);
}

void print_plain(const Result* oop, const Result* ip) {
  printf("#  plain:");
  for (const Result* r : {oop, ip}) {
    if (!r) continue;
    printf("  %s %s us, own %.3fx of plain's speed", r->in_place ? "in-place" : "out-of-place",
           time_str(r->plain_time_us).c_str(), r->vs_plain);
  }
  printf("\n");
  fflush(stdout);
}

namespace {

std::string describe_row(const Result& r) {
  return std::to_string(r.size) + " B " + r.type->name + " " + r.op->name + " " +
         (r.in_place ? "in-place" : "out-of-place");
}

std::string json_number(double v) { return std::isfinite(v) ? format("%.10g", v) : "null"; }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if ((unsigned char)c < 0x20) {
      out += format("\\u%04x", (unsigned char)c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

bool write_json(FILE* f, const Backend& backend, Collective c, const Options& opt, int nranks,
                const std::vector<Result>& rows, double avg_busbw, const char* check) {
  fprintf(f, "{\"tool\": %s, \"collective\": \"%s\", \"backend\": %s, \"nranks\": %d,\n",
          json_string(backend.tool()).c_str(), shape_of(c, 0, nranks).name,
          json_string(backend.library()).c_str(), nranks);
  fprintf(f, " \"qnccl\": %s,\n", backend.quantization_json().c_str());
  fprintf(f,
          " \"options\": {\"minbytes\": %zu, \"maxbytes\": %zu, \"stepfactor\": %s, "
          "\"stepbytes\": %zu, \"iters\": %d, \"warmup_iters\": %d, \"check\": %d, "
          "\"blocking\": %d, \"average\": %d, \"datatype\": %s, \"op\": %s, \"memory\": %s, "
          "\"placement\": %s, \"interleave\": %d},\n",
          opt.min_bytes, opt.max_bytes, json_number(opt.step_factor).c_str(), opt.step_bytes,
          opt.iters, opt.warmup_iters, opt.check, opt.blocking, opt.average,
          json_string(opt.type_arg).c_str(), json_string(opt.op_arg).c_str(),
          opt.memory == Memory::Device ? "\"device\"" : "\"host\"",
          json_string(opt.placement_arg).c_str(), opt.interleave);
  fprintf(f, " \"rows\": [");
  for (size_t i = 0; i < rows.size(); i++) {
    const Result& r = rows[i];
    auto checked = [&](std::string value) { return r.checked ? value : std::string("null"); };
    fprintf(f,
            "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": %s, \"redop\": %s, \"root\": -1, "
            "\"placement\": \"%s\", \"time_us\": %s, \"time_us_median\": %s, \"algbw_gbps\": %s, \"busbw_gbps\": %s, "
            "\"error\": %s, \"bound\": %s, \"agree\": %s, \"ok\": %s, \"compressed\": %s, "
            "\"algo\": %s, \"wire_bytes_per_input_byte\": %s, \"plain_time_us\": %s, "
            "\"plain_time_us_median\": %s, \"vs_plain\": %s, \"plain_ok\": %s}",
            i ? "," : "", r.size, r.count, json_string(r.type->name).c_str(),
            json_string(r.op->name).c_str(), r.in_place ? "in-place" : "out-of-place",
            json_number(r.time_us).c_str(), json_number(r.time_median_us).c_str(),
            json_number(r.algbw).c_str(),
            json_number(r.busbw).c_str(), checked(json_number(r.error)).c_str(),
            checked(json_number(r.bound)).c_str(), checked(r.agree ? "true" : "false").c_str(),
            checked(r.ok ? "true" : "false").c_str(), r.compressed ? "true" : "false",
            r.algo.empty() ? "null" : json_string(r.algo).c_str(),
            json_number(r.wire_per_byte).c_str(), json_number(r.plain_time_us).c_str(),
            json_number(r.plain_time_median_us).c_str(), json_number(r.vs_plain).c_str(),
            opt.interleave > 0 ? checked(r.plain_ok ? "true" : "false").c_str() : "null");
  }
  fprintf(f, "\n ],\n \"avg_busbw_gbps\": %s, \"check\": \"%s\"}\n",
          json_number(avg_busbw).c_str(), check);
  return ferror(f) == 0;
}

bool print_summary(const Backend& backend, const Options& opt, const std::vector<Result>& rows,
                   double avg_busbw, bool same_output) {
  double max_error = 0, max_bound = 0;
  bool agree = true, ok = true;
  for (const Result& r : rows) {
    if (!r.checked) continue;
    max_error = std::isnan(r.error) ? INFINITY : std::max(max_error, r.error);
    max_bound = std::max(max_bound, r.bound);
    agree = agree && r.agree;
    if (r.ok) continue;
    ok = false;
    std::string why;
    if (!r.agree) why += "; ranks disagree (their results differ bit for bit)";
    if (!r.send_intact) why += "; the out-of-place call modified the send buffer";
    if (!r.plain_ok) why += "; the plain NCCL's call (--interleave) failed the same check";
    if (!(r.error <= r.bound)) {
      why += "; error " + format("%.2e", r.error) + " of max |exact| exceeds the bound " +
             format("%.2e", r.bound) + " of this configuration";
    }
    fprintf(stderr, "%s: check FAILED at %s%s\n", backend.tool(), describe_row(r).c_str(),
            why.c_str());
  }
  if (opt.check) {
    printf("# Errors: max %.1e of max |exact| (bound %.1e)", max_error, max_bound);
    if (same_output) printf(", ranks agree bit for bit: %s", agree ? "yes" : "NO");
    printf("\n");
  }
  printf("# Check: %s\n", !opt.check ? "off" : ok ? "OK" : "FAILED");
  printf("# Avg bus bandwidth    : %g \n#\n", avg_busbw);
  fflush(stdout);
  return ok;
}

void print_header(const Backend& backend, const Options& opt, int rank, int nranks,
                  int local_rank) {
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  struct Line { char host[MPI_MAX_PROCESSOR_NAME]; int pid, local_rank; } mine{}, *all = nullptr;
  memcpy(mine.host, host, sizeof host);
  mine.pid = (int)getpid();
  mine.local_rank = local_rank;
  std::vector<Line> lines(rank == 0 ? nranks : 0);
  all = rank == 0 ? lines.data() : nullptr;
  MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  printf("# %s: nranks %d minBytes %zu maxBytes %zu step: ", backend.tool(), nranks, opt.min_bytes,
         opt.max_bytes);
  if (opt.step_factor > 1) {
    printf("%g(factor)", opt.step_factor);
  } else {
    printf("%zu(bytes)", opt.step_bytes);
  }
  printf(" warmup iters: %d iters: %d validation: %d blocking: %d average: %d memory: %s\n#\n",
         opt.warmup_iters, opt.iters, opt.check, opt.blocking, opt.average,
         opt.memory == Memory::Device ? "device" : "host");
  const int settle = settle_calls(backend, opt);
  if (settle > 0) printf("# settle: %d untimed calls before each size's timed ones\n#\n", settle);
  if (opt.interleave > 0)
    printf("# interleave: %d rounds of %d calls each of the plain NCCL (%s) and of this "
           "binary's own, in alternating order; the row's time is its own calls'\n#\n",
           opt.interleave, opt.iters, backend.plain_library().c_str());
  printf("# Using devices\n");
  for (int r = 0; r < nranks; r++) {
    std::string device = opt.memory == Memory::Device ? "cuda:" + std::to_string(lines[r].local_rank) : "host";
    printf("#  Rank %2d Group  0 Pid %6d on %10s device %s\n", r, lines[r].pid, lines[r].host,
           device.c_str());
  }
  std::string description = backend.describe();
  size_t start = 0;
  while (start < description.size()) {
    size_t end = description.find('\n', start);
    if (end == std::string::npos) end = description.size();
    printf("# %s\n", description.substr(start, end - start).c_str());
    start = end + 1;
  }
}

}  // namespace perf
