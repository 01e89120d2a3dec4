// The perf driver's options: nccl-tests' flags, the types and ops, the sweep
// of sizes (docs/perf.md, "The perf binaries").
#include <errno.h>
#include <getopt.h>
#include <string.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "driver.h"

#ifdef QNCCL_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace perf {
namespace {

// ---- types and ops ---------------------------------------------------------------

const DataType kTypes[] = {
    {"int8", ncclInt8, 1, false, true},       {"uint8", ncclUint8, 1, false, false},
    {"int32", ncclInt32, 4, false, true},     {"uint32", ncclUint32, 4, false, false},
    {"int64", ncclInt64, 8, false, true},     {"uint64", ncclUint64, 8, false, false},
    {"half", ncclFloat16, 2, true, true},     {"float", ncclFloat32, 4, true, true},
    {"double", ncclFloat64, 8, true, true},   {"bfloat16", ncclBfloat16, 2, true, true},
};
const struct { const char* alias; const char* name; } kTypeAliases[] = {
    {"char", "int8"},      {"int", "int32"},       {"float16", "half"},  {"fp16", "half"},
    {"float32", "float"},  {"fp32", "float"},      {"float64", "double"}, {"bf16", "bfloat16"},
};
const ReduceOp kOps[] = {
    {"sum", ncclSum}, {"prod", ncclProd}, {"max", ncclMax}, {"min", ncclMin}, {"avg", ncclAvg},
};
// The op of the collectives without one (its inputs are those of a sum).
const ReduceOp kNoOp = {"none", ncclSum};

[[noreturn]] void bad(const std::string& message) { throw BadOption(message); }

size_t parse_size(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  int shift = 0;
  if (end != text && *end) {
    switch (*end) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      default: shift = -1;
    }
    if (shift >= 0 && (end[1] == '\0' || ((end[1] == 'B' || end[1] == 'b') && end[2] == '\0'))) {
      end = const_cast<char*>(text) + strlen(text);
    }
  }
  if (end == text || *end || errno || text[0] == '-' || shift < 0 || (value << shift) >> shift != value) {
    bad(std::string(flag) + ": expected a size in bytes with an optional K, M or G suffix "
        "(powers of 2), got '" + text + "'");
  }
  return (size_t)(value << shift);
}

long parse_int(const char* flag, const char* text, long low, long high) {
  char* end = nullptr;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (end == text || *end || errno || value < low || value > high) {
    bad(std::string(flag) + ": expected an integer in " + std::to_string(low) + ".." +
        std::to_string(high) + ", got '" + text + "'");
  }
  return value;
}

template <class T, size_t N>
std::string names_of(const T (&table)[N]) {
  std::string names;
  for (const T& entry : table) names += std::string(names.empty() ? "" : ", ") + entry.name;
  return names;
}

std::vector<const DataType*> parse_types(const char* text) {
  std::vector<const DataType*> types;
  if (strcmp(text, "all") == 0) {
    for (const DataType& type : kTypes) types.push_back(&type);
    return types;
  }
  const char* name = text;
  for (const auto& alias : kTypeAliases) {
    if (strcmp(text, alias.alias) == 0) name = alias.name;
  }
  for (const DataType& type : kTypes) {
    if (strcmp(name, type.name) == 0) return {&type};
  }
  bad(std::string("-d/--datatype: unknown type '") + text + "' (allowed: " + names_of(kTypes) +
      ", all)");
}

std::vector<const ReduceOp*> parse_ops(const char* text) {
  std::vector<const ReduceOp*> ops;
  for (const ReduceOp& op : kOps) {
    if (strcmp(text, "all") == 0 || strcmp(text, op.name) == 0) ops.push_back(&op);
  }
  if (ops.empty()) {
    bad(std::string("-o/--op: unknown op '") + text + "' (allowed: " + names_of(kOps) + ", all)");
  }
  return ops;
}

bool cuda_device_present() {
#ifdef QNCCL_PERF_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

void usage(const char* tool, FILE* out) {
  fprintf(out,
          "USAGE: mpirun -np N %s [options]\n"
          "One rank per process. Options (nccl-tests conventions):\n"
          "  -b, --minbytes SIZE      smallest size (default 32M; K, M, G suffixes)\n"
          "  -e, --maxbytes SIZE      largest size (default 32M)\n"
          "  -i, --stepbytes SIZE     increment between sizes (default 1M)\n"
          "  -f, --stepfactor F       multiply sizes by F instead (> 1)\n"
          "  -n, --iters N            timed iterations per size (default 20)\n"
          "  -w, --warmup_iters N     warm-up iterations at the largest and smallest size (default 5)\n"
          "      --settle N           untimed calls before each size's timed ones (default: what\n"
          "                           the library needs: 26 under QNCCL's measured auto, for its\n"
          "                           trials; else 0)\n"
          "  -d, --datatype TYPE      %s, or all (default float)\n"
          "  -o, --op OP              %s, or all (default sum; reductions only)\n"
          "  -c, --check 0|1          check every result (default 1): error against the exact\n"
          "                           result, within its bound; ranks agree bit for bit\n"
          "  -z, --blocking 0|1       wait for each call before the next (default 0); the JSON\n"
          "                           then also has the median of the calls' times\n"
          "  -a, --average 0|1|2|3    time reported: rank 0's, mean, min or max over ranks (default 1)\n"
          "  -J, --json FILE          also write every row as JSON\n"
          "      --memory auto|host|device  buffers in host or GPU memory (default auto: device\n"
          "                           when built with CUDA and a GPU is visible)\n"
          "      --placement both|out-of-place|in-place  which to measure (default both)\n"
          "      --interleave R       time each row in R rounds, each -n calls of the plain NCCL\n"
          "                           this binary links (bypassing a preloaded QNCCL) and -n of\n"
          "                           its own, in alternating order; reports both and their\n"
          "                           ratio (default 0: own calls only)\n"
          "  -g, --ngpus 1, -t, --nthreads 1  accepted for compatibility (one GPU per rank)\n"
          "  -h, --help\n"
          "Exit status: 0 ok, 1 a check failed or a call returned an error, 2 bad options.\n",
          tool, names_of(kTypes).c_str(), names_of(kOps).c_str());
}

}  // namespace

bool parse_options(int argc, char** argv, const char* tool, Collective collective, Options* opt) {
  static const option kLong[] = {
      {"minbytes", required_argument, nullptr, 'b'},  {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'}, {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},     {"warmup_iters", required_argument, nullptr, 'w'},
      {"datatype", required_argument, nullptr, 'd'},  {"op", required_argument, nullptr, 'o'},
      {"check", required_argument, nullptr, 'c'},     {"blocking", required_argument, nullptr, 'z'},
      {"average", required_argument, nullptr, 'a'},   {"json", required_argument, nullptr, 'J'},
      {"ngpus", required_argument, nullptr, 'g'},     {"nthreads", required_argument, nullptr, 't'},
      {"memory", required_argument, nullptr, 'M'},    {"placement", required_argument, nullptr, 'P'},
      {"settle", required_argument, nullptr, 'S'},    {"interleave", required_argument, nullptr, 'I'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  opterr = 0;
  bool factor_given = false, op_given = false;
  int c;
  while ((c = getopt_long(argc, argv, ":b:e:i:f:n:w:d:o:c:z:a:J:g:t:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'b': opt->min_bytes = parse_size("-b/--minbytes", optarg); break;
      case 'e': opt->max_bytes = parse_size("-e/--maxbytes", optarg); break;
      case 'i': opt->step_bytes = parse_size("-i/--stepbytes", optarg); break;
      case 'f': {
        char* end = nullptr;
        opt->step_factor = strtod(optarg, &end);
        if (end == optarg || *end || !(opt->step_factor > 1) || !std::isfinite(opt->step_factor)) {
          bad(std::string("-f/--stepfactor: expected a number > 1, got '") + optarg + "'");
        }
        factor_given = true;
        break;
      }
      case 'n': opt->iters = (int)parse_int("-n/--iters", optarg, 1, 1 << 30); break;
      case 'w': opt->warmup_iters = (int)parse_int("-w/--warmup_iters", optarg, 0, 1 << 30); break;
      case 'd': opt->type_arg = optarg; break;
      case 'o':
        opt->op_arg = optarg;
        op_given = true;
        break;
      case 'c': opt->check = (int)parse_int("-c/--check", optarg, 0, 1); break;
      case 'z': opt->blocking = (int)parse_int("-z/--blocking", optarg, 0, 1); break;
      case 'a': opt->average = (int)parse_int("-a/--average", optarg, 0, 3); break;
      case 'J': opt->json_path = optarg; break;
      case 'g': parse_int("-g/--ngpus (one GPU per rank: start more ranks)", optarg, 1, 1); break;
      case 't': parse_int("-t/--nthreads (one thread per rank: start more ranks)", optarg, 1, 1); break;
      case 'M': opt->memory_arg = optarg; break;
      case 'S': opt->settle = (int)parse_int("--settle", optarg, 0, 1 << 20); break;
      case 'I': opt->interleave = (int)parse_int("--interleave", optarg, 0, 1000); break;
      case 'P':
        opt->placement_arg = optarg;
        if (opt->placement_arg == "both") {
          opt->placements = {false, true};
        } else if (opt->placement_arg == "out-of-place" || opt->placement_arg == "in-place") {
          opt->placements = {opt->placement_arg == "in-place"};
        } else {
          bad("--placement: expected both, out-of-place or in-place, got '" + opt->placement_arg + "'");
        }
        break;
      case 'h': usage(tool, stdout); return false;
      case ':': bad(std::string("option ") + argv[optind - 1] + " needs a value (see -h)");
      default:
        bad(std::string("unknown option ") + argv[optind - 1] + " (see -h for the options)");
    }
  }
  if (optind < argc) bad(std::string("unexpected argument '") + argv[optind] + "' (see -h)");
  if (opt->min_bytes > opt->max_bytes) bad("-b/--minbytes must not exceed -e/--maxbytes");
  if (!factor_given) opt->step_factor = 1;
  if (!factor_given && opt->step_bytes == 0 && opt->min_bytes < opt->max_bytes) {
    bad("-i/--stepbytes must be > 0 when -b < -e (or give -f)");
  }
  if (factor_given && opt->min_bytes == 0) bad("-b/--minbytes must be > 0 with -f/--stepfactor");
  if (!shape_of(collective, 0, 1).has_in_place && opt->placement_arg == "in-place")
    bad(std::string("--placement in-place: ") + tool + " has no in-place form");
  opt->types = parse_types(opt->type_arg.c_str());
  if (shape_of(collective, 0, 1).reduces) {
    opt->ops = parse_ops(opt->op_arg.c_str());
  } else if (op_given) {
    bad(std::string("-o/--op: ") + tool + " reduces nothing: leave -o out");
  } else {
    opt->ops = {&kNoOp};
    opt->op_arg = kNoOp.name;
  }
  if (opt->memory_arg == "host") {
    opt->memory = Memory::Host;
  } else if (opt->memory_arg == "device") {
#ifndef QNCCL_PERF_CUDA
    bad("--memory device: this binary was built without CUDA (build with nvcc on the PATH)");
#endif
    if (!cuda_device_present()) bad("--memory device: no CUDA device is visible (use --memory host)");
    opt->memory = Memory::Device;
  } else if (opt->memory_arg == "auto") {
    opt->memory = cuda_device_present() ? Memory::Device : Memory::Host;
  } else {
    bad("--memory: expected auto, host or device, got '" + opt->memory_arg + "'");
  }
  return true;
}

std::vector<size_t> sweep(const Options& opt) {
  std::vector<size_t> sizes;
  for (size_t size = opt.min_bytes; size <= opt.max_bytes;) {
    sizes.push_back(size);
    size_t next = opt.step_factor > 1 ? (size_t)((double)size * opt.step_factor) : size + opt.step_bytes;
    if (next <= size) break;  // -i 0 with -b == -e, or overflow
    size = next;
  }
  return sizes;
}

}  // namespace perf
