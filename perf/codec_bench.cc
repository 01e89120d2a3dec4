// Host codec throughput: GB/s of float32 input for qncclQuantize (nearest,
// stochastic) and qncclDequantizeAccumulate into float32, beside a plain
// memcpy of the same buffer in the same run. Single thread, public API only.
//
//   codec_bench [-b BITS[,BITS..]] [-B BUCKET[,BUCKET..]] [-n BYTES] [-r REPS]
//               [--rotation BLOCK [--clip]] [--json FILE]
//
// --rotation adds each operation rotated (docs/rotation.md: a randomized
// Hadamard rotation in blocks of BLOCK before quantizing, back after
// decoding), so the rotation's cost reads beside the operation it wraps;
// --clip rotates them with their ranges clipped (qncclClipGaussian).
// Lists in -b/-B sweep every combination. Each figure is the median of REPS
// timed passes over the whole buffer, after one untimed warm-up pass.
#include <qnccl.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

const char kUsage[] =
    "usage: codec_bench [-b BITS] [-B BUCKET] [-n BYTES] [-r REPS] [--rotation BLOCK]\n"
    "                   [--clip] [--json FILE] [-h]\n"
    "  -b BITS     bits per value, 1..8, or a comma list to sweep (default 4)\n"
    "  -B BUCKET   values per bucket, or a comma list to sweep (default 128)\n"
    "  -n BYTES    float32 input size, suffix K/M/G allowed, multiple of 4 (default 64M)\n"
    "  -r REPS     timed repetitions, the median is reported (default 7)\n"
    "  --rotation BLOCK  also each operation with a Hadamard rotation in blocks of BLOCK\n"
    "              (a power of two, 2..16384)\n"
    "  --clip      the rotated operations with clipped ranges (qncclClipGaussian)\n"
    "  --json FILE also write the results as JSON\n"
    "GB/s = bytes of float32 input / time (1 GB = 1e9 bytes).\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "codec_bench: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

// A positive integer with an optional binary K/M/G suffix; 0 when malformed.
size_t parse_size(const std::string& text, bool allow_suffix) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || text[0] == '-') return 0;
  std::string suffix(end);
  if (allow_suffix && suffix.size() == 1) {
    const std::string units = "KMG";
    size_t shift = units.find(static_cast<char>(std::toupper(suffix[0])));
    if (shift == std::string::npos) return 0;
    v <<= 10 * (shift + 1);
    suffix.clear();
  }
  return suffix.empty() ? static_cast<size_t>(v) : 0;
}

std::vector<size_t> parse_list(const std::string& text, const char* flag) {
  std::vector<size_t> values;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    size_t v = parse_size(text.substr(start, comma - start), false);
    if (v == 0) usage_error(std::string("bad value for ") + flag + ": '" + text + "'");
    values.push_back(v);
    start = comma + 1;
  }
  return values;
}

void check(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  std::fprintf(stderr, "codec_bench: %s failed (%d): %s\n", what, static_cast<int>(result),
               qncclGetLastError());
  std::exit(1);
}

// One timed operation and its samples.
struct Op {
  int bits;  // 0 for memcpy
  size_t bucket;
  const char* name;
  std::function<void()> pass;
  std::vector<double> seconds;

  double median() const {
    std::vector<double> t = seconds;
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

// A codec configuration and its compressed buffer.
struct Codec {
  qncclCodecConfig_t config;
  std::vector<unsigned char> packed;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> bits_list = {4}, bucket_list = {128};
  size_t bytes = 64u << 20;
  int reps = 7;
  std::string json_path;
  size_t rotation_block = 0;
  bool clip = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--clip") {
      clip = true;
      continue;
    }
    if (arg != "-b" && arg != "-B" && arg != "-n" && arg != "-r" && arg != "--json" &&
        arg != "--rotation")
      usage_error("unknown option '" + arg + "'");
    if (i + 1 == argc) usage_error("option " + arg + " needs a value");
    std::string value = argv[++i];
    if (arg == "-b") bits_list = parse_list(value, "-b");
    if (arg == "-B") bucket_list = parse_list(value, "-B");
    if (arg == "-n") bytes = parse_size(value, true);
    if (arg == "-r") reps = static_cast<int>(std::min<size_t>(parse_size(value, false), 1000));
    if (arg == "--json") json_path = value;
    if (arg == "--rotation") {
      rotation_block = parse_size(value, false);
      if (rotation_block < QNCCL_MIN_ROTATION_BLOCK || rotation_block > QNCCL_MAX_ROTATION_BLOCK ||
          (rotation_block & (rotation_block - 1)) != 0)
        usage_error("--rotation must be a power of two from 2 to 16384");
    }
  }
  if (clip && rotation_block == 0) usage_error("--clip clips rotated ranges: give --rotation too");
  for (size_t b : bits_list)
    if (b < QNCCL_MIN_BITS || b > QNCCL_MAX_BITS) usage_error("-b must be 1..8");
  if (bytes == 0 || bytes % sizeof(float) != 0) usage_error("-n must be a positive multiple of 4");
  if (reps == 0) usage_error("-r must be >= 1");

  const size_t count = bytes / sizeof(float);
  std::vector<float> src(count), copy(count), acc(count, 0.0f);
  std::mt19937 gen(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : src) v = normal(gen);

  std::vector<Codec> codecs;
  codecs.reserve(2 * bits_list.size() * bucket_list.size());  // the ops keep pointers into it
  std::vector<Op> ops;
  ops.push_back({0, 0, "memcpy", [&] { std::memcpy(copy.data(), src.data(), bytes); }, {}});
  // The three operations of one codec config, rotated or not.
  auto add_codec = [&](int bits, size_t bucket, bool rotated) {
    Codec* c = &codecs.emplace_back();
    c->config = {bits, bucket, qncclRoundNearest, 1,
                 rotated ? qncclRotationHadamard : qncclRotationNone, rotation_block,
                 rotated && clip ? qncclClipGaussian : qncclClipNone};
    size_t packed_bytes = 0;
    check(qncclCompressedSize(count, &c->config, &packed_bytes), "qncclCompressedSize");
    c->packed.resize(packed_bytes);
    auto quantize = [&src, count, c](qncclRounding_t rounding) {
      c->config.rounding = rounding;
      check(qncclQuantize(src.data(), count, ncclFloat32, &c->config, 0, c->packed.data(),
                          c->packed.size(), nullptr),
            "qncclQuantize");
    };
    ops.push_back({bits, bucket, rotated ? "rotated quantize nearest" : "quantize nearest",
                   [=] { quantize(qncclRoundNearest); }, {}});
    ops.push_back({bits, bucket, rotated ? "rotated quantize stochastic" : "quantize stochastic",
                   [=] { quantize(qncclRoundStochastic); }, {}});
    // Runs after "quantize stochastic" in every round: decodes that encoding.
    const char* decode = rotated ? "rotated dequantize-accumulate" : "dequantize-accumulate";
    ops.push_back({bits, bucket, decode,
                   [&acc, count, c] {
                     check(qncclDequantizeAccumulate(c->packed.data(), c->packed.size(), count,
                                                     &c->config, acc.data(), ncclFloat32,
                                                     nullptr),
                           "qncclDequantizeAccumulate");
                   },
                   {}});
  };
  for (size_t bits : bits_list)
    for (size_t bucket : bucket_list) {
      add_codec(static_cast<int>(bits), bucket, false);
      if (rotation_block != 0) add_codec(static_cast<int>(bits), bucket, true);
    }

  // Warm-up (faults the pages in), then rounds that run every op once, so a
  // disturbance while timing hits memcpy and the codec alike.
  for (Op& op : ops) op.pass();
  for (int r = 0; r < reps; ++r) {
    for (Op& op : ops) {
      auto t0 = std::chrono::steady_clock::now();
      op.pass();
      op.seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }

  auto gbps = [&](const Op& op) { return bytes / op.median() / 1e9; };
  const double memcpy_gbps = gbps(ops[0]);
  std::printf("codec_bench: %zu MiB float32 input, median of %d, single thread\n", bytes >> 20,
              reps);
  const int width = rotation_block ? 29 : 22;
  std::printf("%4s  %6s  %-*s %8s  %8s\n", "bits", "bucket", width, "operation", "GB/s",
              "x memcpy");
  for (const Op& op : ops) {
    std::string bits = op.bits ? std::to_string(op.bits) : "-";
    std::string bucket = op.bits ? std::to_string(op.bucket) : "-";
    std::printf("%4s  %6s  %-*s %8.2f  %8.2f\n", bits.c_str(), bucket.c_str(), width, op.name,
                gbps(op), gbps(op) / memcpy_gbps);
  }

  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "codec_bench: cannot write %s: %s\n", json_path.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(f,
                 "{\"bytes\": %zu, \"reps\": %d, \"rotation_block\": %zu, \"clip\": %s, "
                 "\"memcpy_gbps\": %.4f, \"results\": [",
                 bytes, reps, rotation_block, clip ? "true" : "false", memcpy_gbps);
    for (size_t i = 1; i < ops.size(); ++i) {
      const Op& op = ops[i];
      std::fprintf(f,
                   "%s\n  {\"bits\": %d, \"bucket\": %zu, \"operation\": \"%s\", "
                   "\"median_s\": %.6g, \"gbps\": %.4f, \"ratio_to_memcpy\": %.4f}",
                   i > 1 ? "," : "", op.bits, op.bucket, op.name, op.median(), gbps(op),
                   gbps(op) / memcpy_gbps);
    }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
  return 0;
}
