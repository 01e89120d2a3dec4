// The perf driver: nccl-tests' options, sweep, timing, check, table and JSON
// (docs/perf.md). Backends only move bytes (perf.h).
#include "perf.h"

#include <getopt.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/dtype.h"

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

// Unit roundoff of a float type's arithmetic.
double unit_roundoff(const DataType& type) {
  switch (type.nccl) {
    case ncclFloat16: return 0x1p-11;
    case ncclBfloat16: return 0x1p-8;
    case ncclFloat32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

// ---- options ------------------------------------------------------------------------

struct Options {
  size_t min_bytes = 32 << 20, max_bytes = 32 << 20, step_bytes = 1 << 20;
  double step_factor = 1;
  int iters = 20, warmup_iters = 5, check = 1, blocking = 0, average = 1;
  std::vector<const DataType*> types;
  std::vector<const ReduceOp*> ops;
  std::string type_arg = "float", op_arg = "sum";
  std::string json_path;
  Memory memory = Memory::Host;
  std::string memory_arg = "auto";
  std::vector<bool> placements = {false, true};  // in place?
  std::string placement_arg = "both";
};

struct BadOption : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
          "  -d, --datatype TYPE      %s, or all (default float)\n"
          "  -o, --op OP              %s, or all (default sum)\n"
          "  -c, --check 0|1          check every result (default 1): error against the exact\n"
          "                           result, within its bound; ranks agree bit for bit\n"
          "  -z, --blocking 0|1       wait for each call before the next (default 0); the JSON\n"
          "                           then also has the median of the calls' times\n"
          "  -a, --average 0|1|2|3    time reported: rank 0's, mean, min or max over ranks (default 1)\n"
          "  -J, --json FILE          also write every row as JSON\n"
          "      --memory auto|host|device  buffers in host or GPU memory (default auto: device\n"
          "                           when built with CUDA and a GPU is visible)\n"
          "      --placement both|out-of-place|in-place  which to measure (default both)\n"
          "  -g, --ngpus 1, -t, --nthreads 1  accepted for compatibility (one GPU per rank)\n"
          "  -h, --help\n"
          "Exit status: 0 ok, 1 a check failed or a call returned an error, 2 bad options.\n",
          tool, names_of(kTypes).c_str(), names_of(kOps).c_str());
}

// Throws BadOption; returns false after printing the help (-h).
bool parse_options(int argc, char** argv, const char* tool, Options* opt) {
  static const option kLong[] = {
      {"minbytes", required_argument, nullptr, 'b'},  {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'}, {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},     {"warmup_iters", required_argument, nullptr, 'w'},
      {"datatype", required_argument, nullptr, 'd'},  {"op", required_argument, nullptr, 'o'},
      {"check", required_argument, nullptr, 'c'},     {"blocking", required_argument, nullptr, 'z'},
      {"average", required_argument, nullptr, 'a'},   {"json", required_argument, nullptr, 'J'},
      {"ngpus", required_argument, nullptr, 'g'},     {"nthreads", required_argument, nullptr, 't'},
      {"memory", required_argument, nullptr, 'M'},    {"placement", required_argument, nullptr, 'P'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  opterr = 0;
  bool factor_given = false;
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
      case 'o': opt->op_arg = optarg; break;
      case 'c': opt->check = (int)parse_int("-c/--check", optarg, 0, 1); break;
      case 'z': opt->blocking = (int)parse_int("-z/--blocking", optarg, 0, 1); break;
      case 'a': opt->average = (int)parse_int("-a/--average", optarg, 0, 3); break;
      case 'J': opt->json_path = optarg; break;
      case 'g': parse_int("-g/--ngpus (one GPU per rank: start more ranks)", optarg, 1, 1); break;
      case 't': parse_int("-t/--nthreads (one thread per rank: start more ranks)", optarg, 1, 1); break;
      case 'M': opt->memory_arg = optarg; break;
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
  opt->types = parse_types(opt->type_arg.c_str());
  opt->ops = parse_ops(opt->op_arg.c_str());
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

// ---- buffers ---------------------------------------------------------------------

class Buffer {
 public:
  Buffer(size_t bytes, Memory memory) : memory_(memory) {
#ifdef QNCCL_PERF_CUDA
    if (memory == Memory::Device) {
      if (cudaMalloc(&data_, std::max<size_t>(bytes, 1)) != cudaSuccess) throw std::bad_alloc();
      return;
    }
#endif
    data_ = malloc(std::max<size_t>(bytes, 1));
    if (!data_) throw std::bad_alloc();
  }
  ~Buffer() {
#ifdef QNCCL_PERF_CUDA
    if (memory_ == Memory::Device) {
      cudaFree(data_);
      return;
    }
#endif
    free(data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  void upload(const void* host, size_t bytes) { copy(data_, host, bytes); }
  void download(void* host, size_t bytes) const { copy(host, data_, bytes); }
  void fill(unsigned char byte, size_t bytes) {
#ifdef QNCCL_PERF_CUDA
    if (memory_ == Memory::Device) {
      cudaMemset(data_, byte, bytes);
      return;
    }
#endif
    memset(data_, byte, bytes);
  }

 private:
  void copy(void* dst, const void* src, size_t bytes) const {
#ifdef QNCCL_PERF_CUDA
    if (memory_ == Memory::Device) {
      cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
      return;
    }
#endif
    memcpy(dst, src, bytes);
  }
  Memory memory_;
  void* data_ = nullptr;
};

// ---- inputs and the exact result --------------------------------------------------

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's input i, as a double holding exactly the value stored in the
// buffer: a pure function of (tag, r, i), so every rank can rebuild all
// inputs. Floats: uniform in [-1, 1) on a 2^-23 grid (prod: [0.5, 1.5));
// integers: small values, so sums stay exact in every type.
double input_value(const DataType& type, const ReduceOp& op, uint64_t tag, int rank, size_t i) {
  uint64_t h = mix64(mix64(tag ^ ((uint64_t)rank << 48)) + i);
  bool prod = op.nccl == ncclProd;
  if (!type.is_float) {
    if (prod) return (double)(1 + (h >> 63)) * (type.is_signed && (h >> 62 & 1) ? -1 : 1);
    return type.is_signed ? (double)(int)(h >> 60) - 8 : (double)(h >> 61);
  }
  double v = prod ? 0.5 + (double)(h >> 40) * 0x1p-24 : (double)(h >> 40) * 0x1p-23 - 1;
  switch (type.nccl) {  // round to the type as storing it would
    case ncclFloat16: return qnccl::f16_to_f32(qnccl::f32_to_f16((float)v));
    case ncclBfloat16: return qnccl::bf16_to_f32(qnccl::f32_to_bf16((float)v));
    default: return v;
  }
}

void store(const DataType& type, double v, void* base, size_t i) {
  switch (type.nccl) {
    case ncclInt8: ((int8_t*)base)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)base)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)base)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)base)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)base)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)base)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)base)[i] = qnccl::f32_to_f16((float)v); break;
    case ncclBfloat16: ((uint16_t*)base)[i] = qnccl::f32_to_bf16((float)v); break;
    case ncclFloat32: ((float*)base)[i] = (float)v; break;
    default: ((double*)base)[i] = v; break;
  }
}

double load(const DataType& type, const void* base, size_t i) {
  switch (type.nccl) {
    case ncclInt8: return ((const int8_t*)base)[i];
    case ncclUint8: return ((const uint8_t*)base)[i];
    case ncclInt32: return ((const int32_t*)base)[i];
    case ncclUint32: return ((const uint32_t*)base)[i];
    case ncclInt64: return (double)((const int64_t*)base)[i];
    case ncclUint64: return (double)((const uint64_t*)base)[i];
    case ncclFloat16: return qnccl::f16_to_f32(((const uint16_t*)base)[i]);
    case ncclBfloat16: return qnccl::bf16_to_f32(((const uint16_t*)base)[i]);
    case ncclFloat32: return ((const float*)base)[i];
    default: return ((const double*)base)[i];
  }
}

// An integer wrapped to the width and signedness of `type`.
double wrap(const DataType& type, uint64_t bits) {
  switch (type.nccl) {
    case ncclInt8: return (int8_t)bits;
    case ncclUint8: return (uint8_t)bits;
    case ncclInt32: return (int32_t)bits;
    case ncclUint32: return (uint32_t)bits;
    case ncclInt64: return (double)(int64_t)bits;
    default: return (double)bits;
  }
}

// The exact result of element i: floats in double (exact for sums of these
// inputs), integers with the type's wrap-around and integer division. Also
// raises *input_abs_max to the largest |input| of the element.
double exact_value(const DataType& type, const ReduceOp& op, uint64_t tag, int nranks, size_t i,
                   double* input_abs_max) {
  double lo = INFINITY, hi = -INFINITY, sum = 0, prod = 1;
  uint64_t isum = 0, iprod = 1;
  for (int r = 0; r < nranks; r++) {
    double v = input_value(type, op, tag, r, i);
    *input_abs_max = std::max(*input_abs_max, std::fabs(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
    prod *= v;
    isum += (uint64_t)(int64_t)v;
    iprod *= (uint64_t)(int64_t)v;
  }
  switch (op.nccl) {
    case ncclMin: return lo;
    case ncclMax: return hi;
    case ncclProd: return type.is_float ? prod : wrap(type, iprod);
    case ncclAvg:
      if (type.is_float) return sum / nranks;
      return type.is_signed ? (double)((int64_t)wrap(type, isum) / nranks)
                            : (double)((uint64_t)wrap(type, isum) / (uint64_t)nranks);
    default: return type.is_float ? sum : wrap(type, isum);
  }
}

uint64_t hash_bytes(const void* data, size_t bytes) {
  const unsigned char* p = (const unsigned char*)data;
  uint64_t h = bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    memcpy(&word, p + i, 8);
    h = (h ^ word) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  for (; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return mix64(h);
}

// ---- one measurement ---------------------------------------------------------------

struct Result;
void print_row(const Result* out_of_place, const Result* in_place);

struct Result {
  size_t size = 0, count = 0;
  const DataType* type = nullptr;
  const ReduceOp* op = nullptr;
  bool in_place = false;
  double time_us = 0, algbw = 0, busbw = 0;  // time: mean over the iterations, as nccl-tests
  double time_median_us = NAN;                // median of the iterations' times (-z 1 only)
  bool checked = false, agree = true, send_intact = true, ok = true;
  double error = 0, bound = 0;  // relative to max |exact|
  bool compressed = false;
  std::string algo;
  double wire_per_byte = 0;
};

class Runner {
 public:
  Runner(Backend& backend, const Options& opt, int rank, int nranks)
      : backend_(backend), opt_(opt), rank_(rank), nranks_(nranks) {}

  bool run(std::vector<Result>* results);

 private:
  bool call(const void* send, void* recv, size_t count, const DataType& type, const ReduceOp& op) {
    if (!backend_.allreduce(send, recv, count, type, op)) failed_ = true;
    return !failed_;
  }
  bool wait() {
    if (!backend_.wait()) failed_ = true;
    return !failed_;
  }
  void fill_inputs(const DataType& type, const ReduceOp& op, uint64_t tag, size_t count);
  bool measure(Result* row, Buffer& send, Buffer& recv, uint64_t tag);
  bool check(Result* row, Buffer& send, Buffer& recv, uint64_t tag);
  double combine_time(double seconds) const;
  double nominal_wire_per_byte() const { return nranks_ > 1 ? 2.0 * (nranks_ - 1) / nranks_ : 0; }

  Backend& backend_;
  const Options& opt_;
  int rank_, nranks_;
  bool failed_ = false;
  std::vector<unsigned char> host_in_, host_out_;
};

void Runner::fill_inputs(const DataType& type, const ReduceOp& op, uint64_t tag, size_t count) {
  for (size_t i = 0; i < count; i++) store(type, input_value(type, op, tag, rank_, i), host_in_.data(), i);
}

double Runner::combine_time(double seconds) const {
  double out = seconds;
  switch (opt_.average) {
    case 0: MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); return out;
    case 2: MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); return out;
    case 3: MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); return out;
    default:
      MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      return out / nranks_;
  }
}

bool Runner::measure(Result* row, Buffer& send, Buffer& recv, uint64_t tag) {
  const DataType& type = *row->type;
  size_t bytes = row->count * type.size;
  fill_inputs(type, *row->op, tag, row->count);
  send.upload(host_in_.data(), bytes);
  void* out = row->in_place ? send.data() : recv.data();

  WireStats before, after;
  bool have_stats = backend_.wire_stats(&before);
  using Clock = std::chrono::steady_clock;
  std::vector<double> iteration_seconds;  // each call to its completion, with -z 1
  MPI_Barrier(MPI_COMM_WORLD);
  auto start = Clock::now();
  for (int i = 0; i < opt_.iters; i++) {
    auto call_start = Clock::now();
    if (!call(send.data(), out, row->count, type, *row->op)) return false;
    if (!opt_.blocking) continue;
    if (!wait()) return false;
    iteration_seconds.push_back(std::chrono::duration<double>(Clock::now() - call_start).count());
  }
  if (!wait()) return false;
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  double time = combine_time(seconds / opt_.iters);
  row->time_us = time * 1e6;
  if (opt_.blocking) {
    std::sort(iteration_seconds.begin(), iteration_seconds.end());
    size_t n = iteration_seconds.size();
    double median = (iteration_seconds[(n - 1) / 2] + iteration_seconds[n / 2]) / 2;
    row->time_median_us = combine_time(median) * 1e6;
  }
  row->algbw = time > 0 ? (double)row->size / 1e9 / time : 0;
  row->busbw = row->algbw * nominal_wire_per_byte();

  double wire = nominal_wire_per_byte();
  if (have_stats && backend_.wire_stats(&after) && after.calls_compressed > before.calls_compressed) {
    row->compressed = true;
    uint64_t in = after.bytes_in - before.bytes_in;
    wire = in ? (double)(after.bytes_on_wire - before.bytes_on_wire) / (double)in : 0;
  }
  MPI_Allreduce(MPI_IN_PLACE, &wire, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  row->wire_per_byte = wire / nranks_;
  return opt_.check ? check(row, send, recv, tag) : true;
}

bool Runner::check(Result* row, Buffer& send, Buffer& recv, uint64_t tag) {
  const DataType& type = *row->type;
  const ReduceOp& op = *row->op;
  size_t count = row->count, bytes = count * type.size;
  tag ^= 0x5eed;  // fresh inputs: the timed in-place loop overwrote the buffer
  fill_inputs(type, op, tag, count);
  send.upload(host_in_.data(), bytes);
  if (!row->in_place) recv.fill(0xa5, bytes);  // the result must overwrite all of it
  Buffer& out = row->in_place ? send : recv;

  WireStats before, after;
  bool have_stats = backend_.wire_stats(&before);
  if (!call(send.data(), out.data(), count, type, op) || !wait()) return false;
  bool compressed = have_stats && backend_.wire_stats(&after) &&
                    after.calls_compressed > before.calls_compressed;

  out.download(host_out_.data(), bytes);
  int intact = 1;
  if (!row->in_place) {
    std::vector<unsigned char> sent(bytes);
    send.download(sent.data(), bytes);
    intact = memcmp(sent.data(), host_in_.data(), bytes) == 0;
  }

  // Each rank checks its slice against the exact result; hashes of the whole
  // output show whether all ranks hold the same bytes.
  size_t lo = count * rank_ / nranks_, hi = count * (rank_ + 1) / nranks_;
  double local[3] = {0, 0, 0};  // max |out - exact|, max |exact|, max |input|
  for (size_t i = lo; i < hi; i++) {
    double exact = exact_value(type, op, tag, nranks_, i, &local[2]);
    double err = std::fabs(load(type, host_out_.data(), i) - exact);
    local[0] = std::isnan(err) ? INFINITY : std::max(local[0], err);
    local[1] = std::max(local[1], std::fabs(exact));
  }
  double global[3];
  MPI_Allreduce(local, global, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &intact, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  uint64_t hash = hash_bytes(host_out_.data(), bytes);
  std::vector<uint64_t> hashes(nranks_);
  MPI_Allgather(&hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);

  double bound = 0;
  if (compressed) {
    std::string algo;
    // No a-priori bound (error feedback): ranks must still agree bit for bit.
    if (!backend_.quantization_bound(count, type, op, global[2], &bound, &algo)) bound = INFINITY;
    row->algo = algo;
  } else if (type.is_float && op.nccl != ncclMin && op.nccl != ncclMax) {
    // Float rounding of N-1 additions (or products) and of the final store or division.
    double n = nranks_, u = unit_roundoff(type);
    bound = op.nccl == ncclProd ? 2 * (n + 1) * u * global[1] : (n + 2) * u * n * global[2];
  }
  MPI_Bcast(&bound, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  double scale = global[1] > 0 ? global[1] : 1;
  row->checked = true;
  row->error = global[0] / scale;
  row->bound = bound / scale;
  row->agree = std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; });
  row->send_intact = intact;
  row->ok = row->agree && row->send_intact && global[0] <= bound;
  return true;
}

bool Runner::run(std::vector<Result>* results) {
  std::vector<size_t> sizes = sweep(opt_);
  for (const DataType* type : opt_.types) {
    for (const ReduceOp* op : opt_.ops) {
      std::string why = backend_.unsupported(*type, *op, opt_.memory);
      if (!why.empty()) {  // only with -d all or -o all: a single one was rejected up front
        if (rank_ == 0) printf("# skipped %s %s: %s\n", type->name, op->name, why.c_str());
        continue;
      }
      size_t max_count = opt_.max_bytes / type->size, min_count = opt_.min_bytes / type->size;
      Buffer send(max_count * type->size, opt_.memory), recv(max_count * type->size, opt_.memory);
      host_in_.assign(max_count * type->size, 0);
      host_out_.assign(max_count * type->size, 0);
      send.fill(0, max_count * type->size);
      for (size_t count : {max_count, min_count}) {  // warm-up, as nccl-tests does
        for (int i = 0; i < opt_.warmup_iters; i++) {
          if (!call(send.data(), recv.data(), count, *type, *op)) return false;
        }
      }
      if (!wait()) return false;
      for (size_t size : sizes) {
        const Result* placed[2] = {nullptr, nullptr};  // out of place, in place
        for (bool in_place : opt_.placements) {
          Result row;
          row.count = size / type->size;
          row.size = row.count * type->size;
          row.type = type;
          row.op = op;
          row.in_place = in_place;
          uint64_t tag = mix64(row.count * 131 + (uint64_t)type->nccl * 7 + (uint64_t)op->nccl);
          if (!measure(&row, send, recv, tag)) return false;
          results->push_back(row);
        }
        for (size_t i = results->size() - opt_.placements.size(); i < results->size(); i++) {
          placed[(*results)[i].in_place] = &(*results)[i];
        }
        if (rank_ == 0) print_row(placed[0], placed[1]);
      }
    }
  }
  return true;
}

// ---- output ---------------------------------------------------------------------------

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
// #wrong) plus whether ranks agree and the bytes each rank sent per input byte.
// A placement left out by --placement (null) prints N/A in its fields.
void print_row(const Result* oop, const Result* ip) {
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
  printf("  %5s  %5.3f\n", !any.checked ? "N/A" : agree ? "yes" : "NO", any.wire_per_byte);
  fflush(stdout);
}

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

bool write_json(FILE* f, const Backend& backend, const Options& opt, int nranks,
                const std::vector<Result>& rows, double avg_busbw, const char* check) {
  fprintf(f, "{\"tool\": %s, \"collective\": \"allreduce\", \"backend\": %s, \"nranks\": %d,\n",
          json_string(backend.tool()).c_str(), json_string(backend.library()).c_str(), nranks);
  fprintf(f, " \"qnccl\": %s,\n", backend.quantization_json().c_str());
  fprintf(f,
          " \"options\": {\"minbytes\": %zu, \"maxbytes\": %zu, \"stepfactor\": %s, "
          "\"stepbytes\": %zu, \"iters\": %d, \"warmup_iters\": %d, \"check\": %d, "
          "\"blocking\": %d, \"average\": %d, \"datatype\": %s, \"op\": %s, \"memory\": %s, "
          "\"placement\": %s},\n",
          opt.min_bytes, opt.max_bytes, json_number(opt.step_factor).c_str(), opt.step_bytes,
          opt.iters, opt.warmup_iters, opt.check, opt.blocking, opt.average,
          json_string(opt.type_arg).c_str(), json_string(opt.op_arg).c_str(),
          opt.memory == Memory::Device ? "\"device\"" : "\"host\"",
          json_string(opt.placement_arg).c_str());
  fprintf(f, " \"rows\": [");
  for (size_t i = 0; i < rows.size(); i++) {
    const Result& r = rows[i];
    auto checked = [&](std::string value) { return r.checked ? value : std::string("null"); };
    fprintf(f,
            "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": %s, \"redop\": %s, \"root\": -1, "
            "\"placement\": \"%s\", \"time_us\": %s, \"time_us_median\": %s, \"algbw_gbps\": %s, \"busbw_gbps\": %s, "
            "\"error\": %s, \"bound\": %s, \"agree\": %s, \"ok\": %s, \"compressed\": %s, "
            "\"algo\": %s, \"wire_bytes_per_input_byte\": %s}",
            i ? "," : "", r.size, r.count, json_string(r.type->name).c_str(),
            json_string(r.op->name).c_str(), r.in_place ? "in-place" : "out-of-place",
            json_number(r.time_us).c_str(), json_number(r.time_median_us).c_str(),
            json_number(r.algbw).c_str(),
            json_number(r.busbw).c_str(), checked(json_number(r.error)).c_str(),
            checked(json_number(r.bound)).c_str(), checked(r.agree ? "true" : "false").c_str(),
            checked(r.ok ? "true" : "false").c_str(), r.compressed ? "true" : "false",
            r.algo.empty() ? "null" : json_string(r.algo).c_str(),
            json_number(r.wire_per_byte).c_str());
  }
  fprintf(f, "\n ],\n \"avg_busbw_gbps\": %s, \"check\": \"%s\"}\n",
          json_number(avg_busbw).c_str(), check);
  return ferror(f) == 0;
}

// Prints the summary; returns whether every checked row is ok.
bool print_summary(const Backend& backend, const Options& opt, const std::vector<Result>& rows,
                   double avg_busbw) {
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
    if (!(r.error <= r.bound)) {
      why += "; error " + format("%.2e", r.error) + " of max |exact| exceeds the bound " +
             format("%.2e", r.bound) + " of this configuration";
    }
    fprintf(stderr, "%s: check FAILED at %s%s\n", backend.tool(), describe_row(r).c_str(),
            why.c_str());
  }
  if (opt.check) {
    printf("# Errors: max %.1e of max |exact| (bound %.1e), ranks agree bit for bit: %s\n",
           max_error, max_bound, agree ? "yes" : "NO");
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

}  // namespace

int run(int argc, char** argv, Backend& backend) {
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
    if (!parse_options(argc, argv, backend.tool(), &opt)) status = 1;
  } catch (const BadOption& e) {
    if (rank == 0) fprintf(stderr, "%s: %s\n", backend.tool(), e.what());
    status = 2;
  }
  if (status == 0 && opt.types.size() == 1 && opt.ops.size() == 1) {
    std::string why = backend.unsupported(*opt.types[0], *opt.ops[0], opt.memory);
    if (!why.empty()) {
      if (rank == 0) fprintf(stderr, "%s: %s\n", backend.tool(), why.c_str());
      status = 2;
    }
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
  Runner runner(backend, opt, rank, nranks);
  if (!runner.run(&rows)) MPI_Abort(MPI_COMM_WORLD, 1);

  double avg_busbw = 0;
  for (const Result& r : rows) avg_busbw += r.busbw / (double)rows.size();
  bool ok = true;
  if (rank == 0) {
    ok = print_summary(backend, opt, rows, avg_busbw);
    const char* check = !opt.check ? "off" : ok ? "OK" : "FAILED";
    bool written = !json || write_json(json, backend, opt, nranks, rows, avg_busbw, check);
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
