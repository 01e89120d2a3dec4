"""The `qnccl` command.

    qnccl run [options] -- CMD ...   run CMD with libqnccl.so preloaded and QNCCL_* set
    qnccl info                       what is installed and built, and what a job would use:
                                     configuration, GPU driver, the NCCL library
    qnccl bench                      quantized vs uncompressed allreduce on a rate-limited link
                                     (make bench; qnccl/bench/, docs/perf.md)
    qnccl codec-bench                host codec throughput (codec_bench), beside memcpy
    qnccl config --cflags --libs     flags to compile and link a program against this package
"""
import argparse
import ctypes
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import __version__, _checks, _native
from .emulate import rotation
from .comm import COLLECTIVES

# Where `qnccl bench` and `qnccl codec-bench` write, under the current directory.
RESULTS = Path("qnccl-bench")
NCCL_SONAME = "libnccl.so.2"


def libqnccl_path():
    """The libqnccl.so `qnccl run` preloads and `qnccl info` describes: QNCCL_LIB (as for
    the Python binding), else the installed package's, else the one `make` built here."""
    return _native.path("lib/libqnccl.so", "QNCCL_LIB").resolve()


# ---- argument types ------------------------------------------------------------------

def _int_list(low, high=None):
    """argparse type: a comma list of integers in [low, high]."""
    def parse(text):
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        if any(v < low or (high is not None and v > high) for v in values):
            allowed = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{text!r}: each value must be {allowed}")
        return values
    return parse


def _rotation_block(text):
    """argparse type: a rotation block size (docs/rotation.md), as --rotation-block's."""
    return power_of_two_in(rotation.MIN_BLOCK, rotation.MAX_BLOCK)(text)


def power_of_two_in(low, high):
    """argparse type: a power of two in [low, high], K, M and G suffixes allowed (a count of
    values, as size_in's)."""
    parse_int = size_in(low, high)

    def parse(text):
        value = parse_int(text)
        if value & (value - 1):
            raise argparse.ArgumentTypeError(f"must be a power of two in {low}..{high}, got "
                                             f"{text!r}")
        return value
    return parse


def int_in(low, high=None):
    """argparse type: one decimal integer in [low, high] (no upper limit when None).
    argparse prefixes the message with the flag's name."""
    allowed = f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}"

    def parse(text):
        if not re.fullmatch(r"[+-]?\d+", text.strip()):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        value = int(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        return value
    return parse


_SIZE_SUFFIXES = {"": 0, "K": 10, "M": 20, "G": 30}


def size_in(low, high=None):
    """argparse type: a size or a count in [low, high] (no upper limit when None), decimal
    with an optional K, M or G suffix in either case (x 2^10, 2^20, 2^30): what every
    QNCCL_* size variable takes (src/config/config.cc), so a flag and its variable read alike.
    argparse prefixes the message with the flag's name."""
    allowed = (f"an integer {_checks.span(low, high)} with an optional K, M or G suffix "
               f"(x 2^10, 2^20, 2^30)")

    def parse(text):
        match = re.fullmatch(r"(\d+)([KMG]?)", text, re.IGNORECASE)
        value = (None if match is None
                 else int(match.group(1)) << _SIZE_SUFFIXES[match.group(2).upper()])
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        return value
    return parse


_byte_size = size_in(0, 2**64 - 1)  # bytes


def size_list(low, high=None):
    """argparse type: a comma list of sizes or counts, each as size_in(low, high) takes it."""
    one = size_in(low, high)

    def parse(text):
        return [one(value) for value in text.split(",")]
    return parse


def _library_path(text):
    """argparse type: a library file (a path, checked) or a bare name for dlopen's search."""
    if "/" not in text:
        return text
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r} (give the path of "
                                         f"{NCCL_SONAME}, or a library name for dlopen)")
    return str(path.resolve())


# ---- qnccl run ----------------------------------------------------------------------------

# Each option of `qnccl run` and the environment variable it sets: (flag, variable, argparse
# keywords). The library validates the variables again when a communicator is created.
RUN_OPTIONS = (
    ("--bits", "QNCCL_BITS", dict(type=int_in(1, 8), metavar="N",
                                  help="bits per value, 1..8 (default 4)")),
    ("--bucket-size", "QNCCL_BUCKET_SIZE", dict(
        type=size_in(1, 2**40), metavar="N",
        help="values per bucket, 1..2^40; K, M, G suffixes allowed (default 128)")),
    ("--rounding", "QNCCL_ROUNDING", dict(choices=("stochastic", "nearest"),
                                          help="default stochastic")),
    ("--rotation", "QNCCL_ROTATION", dict(choices=("none", "hadamard"),
                                          help="default none; hadamard: rotated buckets "
                                               "(docs/rotation.md)")),
    ("--rotation-block", "QNCCL_ROTATION_BLOCK", dict(
        type=power_of_two_in(rotation.MIN_BLOCK, rotation.MAX_BLOCK), metavar="N",
        help="values per rotation block, a power of two 2..16384; K suffix allowed (default "
             "256)")),
    ("--clip", "QNCCL_CLIP", dict(choices=("none", "gaussian"),
                                  help="default none; gaussian: clipped ranges for rotated "
                                       "buckets, with --rotation hadamard (docs/rotation.md)")),
    ("--algo", "QNCCL_ALGO", dict(choices=("auto", "rule", "ring", "tree", "sra", "hier"),
                                  help="default auto: measured, exact or quantized and the "
                                       "algorithm per size (docs/tuning.md); rule: fixed "
                                       "rules (docs/allreduce.md)")),
    ("--inter-algo", "QNCCL_INTER_ALGO", dict(
        choices=("auto", "ring", "tree", "sra"),
        help="hier: the algorithm between nodes (default auto)")),
    ("--intra-bits", "QNCCL_INTRA_BITS", dict(
        type=int_in(0, 8), metavar="N",
        help="hier: 0 reduces inside a node exactly (default), 1..8 quantizes it")),
    ("--lanes", "QNCCL_LANES", dict(
        type=int_in(0, 8), metavar="N",
        help="lanes of a flat call's pipeline, 1..8; 0: 2 on device buffers, 1 on host "
             "buffers (default 0)")),
    ("--segment-values", "QNCCL_SEGMENT_VALUES", dict(
        type=size_in(0, 2**40), metavar="N",
        help="values per pipelined segment of an allreduce (bounds its workspace); K, M, G "
             "suffixes allowed; 0: 4M (default 0)")),
    ("--collectives", "QNCCL_COLLECTIVES", dict(
        metavar="LIST",
        help="the interposed collectives that are quantized: none, or a comma list of "
             "allreduce, reducescatter, allgather, alltoall, sendrecv (default allreduce)")),
    *((f"--{name}-bits", f"QNCCL_{name.upper()}_BITS", dict(
        type=int_in(1, 8), metavar="N",
        help=f"the bits of quantized {name} calls, 1..8 (default --bits)"))
      for name in COLLECTIVES),
    ("--min-bytes", "QNCCL_MIN_BYTES", dict(
        type=_byte_size, metavar="N",
        help="smaller allreduces pass through exact; K, M, G suffixes allowed (default 64K)")),
    ("--seed", "QNCCL_SEED", dict(type=int_in(0, 2**64 - 1), metavar="N",
                                  help="stochastic-rounding seed, 0..2^64-1 (default 0)")),
    ("--warmup-calls", "QNCCL_WARMUP_CALLS", dict(
        type=int_in(0), metavar="N",
        help="the first N eligible allreduces of each communicator stay exact (default 0)")),
    ("--error-feedback", "QNCCL_ERROR_FEEDBACK", dict(
        action="store_const", const=1,
        help="1: carry each buffer's quantization error into its next allreduce "
             "(docs/allreduce.md, Error feedback)")),
    ("--error-feedback-max-bytes", "QNCCL_ERROR_FEEDBACK_MAX_BYTES", dict(
        type=size_in(1, 2**64 - 1), metavar="N",
        help="the residuals a communicator keeps at most; past it the least recently used "
             "go; K, M, G suffixes allowed (default 4G)")),
    ("--debug", "QNCCL_DEBUG", dict(type=str.upper, choices=("WARN", "INFO", "TRACE"),
                                    metavar="LEVEL", help="WARN (default), INFO or TRACE")),
    ("--nccl-lib", "QNCCL_NCCL_LIB", dict(
        type=_library_path, metavar="PATH",
        help=f"the real NCCL, when the program has not loaded a {NCCL_SONAME} itself")),
    ("--disable", "QNCCL_ENABLE", dict(action="store_const", const=0,
                                       help="0: pass every call through exact")),
)


def _preload_list(value):
    """Entries of an LD_PRELOAD value (ld.so separates them by colons or spaces)."""
    return [entry for entry in re.split(r"[:\s]+", value or "") if entry]


def run_environment(args, environ, library):
    """The environment `qnccl run` gives CMD: `environ` with `library` first in
    LD_PRELOAD (once: an entry naming the same file is dropped, the others kept in
    their order) and the QNCCL_* variable of every flag given (flags win)."""
    env = dict(environ)
    others = [entry for entry in _preload_list(env.get("LD_PRELOAD"))
              if os.path.realpath(entry) != os.path.realpath(library)]
    env["LD_PRELOAD"] = ":".join([str(library), *others])
    for flag, variable, _ in RUN_OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            env[variable] = str(value)
    return env


def cmd_run(args):
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        args.parser.error("missing CMD: qnccl run [options] -- CMD [ARGS...]")
    library = libqnccl_path()
    if not library.is_file():
        print(f"qnccl run: {_native.missing(library, 'QNCCL_LIB')}", file=sys.stderr)
        return 1
    env = run_environment(args, os.environ, library)
    sys.stdout.flush()
    sys.stderr.flush()
    try:  # CMD replaces this process: its signals and exit status are the caller's
        os.execvpe(command[0], command, env)
    except OSError as e:
        print(f"qnccl run: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126  # as env(1) and shells


# ---- qnccl info -----------------------------------------------------------------------------

def _cuda_toolkit():
    """The CUDA toolkit wheels `make` builds the kernels with (Makefile, "CUDA")."""
    try:
        return (f"NVRTC {importlib.metadata.version('nvidia-cuda-nvrtc-cu12')}, runtime "
                f"{importlib.metadata.version('nvidia-cuda-runtime-cu12')} (pip wheels)")
    except importlib.metadata.PackageNotFoundError:
        return ("not installed: `make` here stops before the CUDA kernels (run `make setup` "
                "first, or build without them on purpose: make CUDA=0)")


def _loaded_path(name):
    """Where the dynamic loader found the shared library `name` in this process,
    or None when it is not loaded."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(f"/{name}"):
            return line.split()[-1]
    return None


def cuda_driver():
    """What the CUDA driver API (libcuda.so.1) sees, in words; works without a GPU."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 not found): host buffers only"
    result = cuda.cuInit(0)
    if result != 0:
        return f"CUDA driver present, no usable device (cuInit: CUresult {result})"
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDriverGetVersion(ctypes.byref(version))
    cuda.cuDeviceGetCount(ctypes.byref(count))
    names = []
    for ordinal in range(count.value):
        device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0 and \
                cuda.cuDeviceGetName(name, len(name), device) == 0:
            names.append(name.value.decode(errors="replace"))
    driver = f"driver CUDA {version.value // 1000}.{version.value % 1000 // 10}"
    return f"{count.value} device(s){': ' + ', '.join(names) if names else ''} ({driver})"


def _ld_cache_path(soname):
    """The path ld.so's cache (`ldconfig -p`) gives `soname` for this process's ABI."""
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    if ldconfig is None:
        return None
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    want_64 = ctypes.sizeof(ctypes.c_void_p) == 8
    for match in re.finditer(rf"^\s*{re.escape(soname)} \(([^)]*)\) => (\S+)$", out, re.M):
        if ("64" in match.group(1)) == want_64:
            return match.group(2)
    return None


def nccl_library():
    """(path or name, how it was chosen) of the NCCL libqnccl.so loads, in its order:
    a libnccl.so.2 already loaded, QNCCL_NCCL_LIB, else dlopen's search for
    libnccl.so.2 (LD_LIBRARY_PATH, ld.so's cache, the default directories)."""
    loaded = _loaded_path(NCCL_SONAME)
    if loaded:
        return loaded, "already loaded in this process"
    configured = os.environ.get("QNCCL_NCCL_LIB")
    if configured:
        missing = "/" in configured and not Path(configured).is_file()
        return configured, "QNCCL_NCCL_LIB" + (": no such file" if missing else "")
    for directory in re.split(r"[:;]", os.environ.get("LD_LIBRARY_PATH", "")):
        if directory and (Path(directory) / NCCL_SONAME).is_file():
            return os.path.abspath(Path(directory) / NCCL_SONAME), "LD_LIBRARY_PATH"
    cached = _ld_cache_path(NCCL_SONAME)
    if cached:
        return cached, "ld.so cache"
    for directory in ("/lib", "/usr/lib", "/lib64", "/usr/lib64"):
        if (Path(directory) / NCCL_SONAME).is_file():
            return str(Path(directory) / NCCL_SONAME), "default directory"
    return None, (f"{NCCL_SONAME} not found: set QNCCL_NCCL_LIB, or LD_LIBRARY_PATH="
                  f"{_native.path('host/libnccl.so.2').parent} for the host backend")


def nccl_wheel_library():
    """The libnccl.so.2 of NVIDIA's nvidia-nccl-cu* wheel (what PyTorch loads), or None.
    Looked up along sys.path, not imported: a folder on the path with an nvidia/__init__.py
    (a copied CUDA wheel's, say) hides the wheels' namespace package from an import."""
    for entry in sys.path:
        if entry and Path(entry).is_dir():
            library = Path(entry) / "nvidia" / "nccl" / "lib" / NCCL_SONAME
            if library.is_file():
                return library
    return None


def nccl_wheel():
    """nccl_wheel_library() with the wheel's version, for `qnccl info`; None without it."""
    library = nccl_wheel_library()
    if library is None:
        return None
    versions = []
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return f"{library}" + (f" ({', '.join(versions)})" if versions else "")


_ROUNDING_NAMES = {0: "nearest", 1: "stochastic"}
_ROTATION_NAMES = {0: "none", 1: "hadamard"}
_CLIP_NAMES = {0: "none", 1: "gaussian"}
_ALGO_NAMES = {0: "auto", 1: "ring", 2: "tree", 3: "sra", 4: "hier"}
_DEBUG_NAMES = {0: "WARN", 1: "INFO", 2: "TRACE"}


def describe_env_config(config):
    """A qncclEnvConfig_t in the words of the library's QNCCL_DEBUG=INFO line."""
    allreduce = config.allreduce
    # QNCCL_ALGO=rule is auto by the fixed rules (not measured)
    algo = ("rule" if allreduce.algo == 0 and not config.measured
            else _ALGO_NAMES.get(allreduce.algo, allreduce.algo))
    return (f"bits={allreduce.codec.bits} bucket={allreduce.codec.bucketSize} "
            f"rounding={_ROUNDING_NAMES.get(allreduce.codec.rounding, allreduce.codec.rounding)} "
            f"rotation={_ROTATION_NAMES.get(allreduce.codec.rotation, allreduce.codec.rotation)} "
            f"rotation_block={allreduce.codec.rotationBlock or rotation.DEFAULT_BLOCK} "
            f"clip={_CLIP_NAMES.get(allreduce.codec.clip, allreduce.codec.clip)} "
            f"algo={algo} "
            f"inter_algo={_ALGO_NAMES.get(allreduce.interAlgo, allreduce.interAlgo)} "
            f"intra_bits={allreduce.intraBits} lanes={allreduce.lanes} "
            f"segment_values={allreduce.segmentValues} "
            f"min_bytes={config.minBytes} seed={allreduce.codec.seed} "
            f"warmup={config.warmupCalls} enable={config.enable} "
            f"error_feedback={config.allreduce.errorFeedback} "
            f"error_feedback_max_bytes={config.errorFeedbackMaxBytes} "
            f"debug={_DEBUG_NAMES.get(config.debug, config.debug)} "
            f"{describe_collectives(config)}")


def describe_collectives(config):
    """QNCCL_COLLECTIVES and the per-collective bits in the library's INFO-line words."""
    words = "collectives=" + (",".join(name for i, name in enumerate(COLLECTIVES)
                                       if config.collectives & (1 << i)) or "none")
    return words + "".join(f" {name}_bits={config.collectiveBits[i]}"
                           for i, name in enumerate(COLLECTIVES) if config.collectiveBits[i])


def _cuda_version(encoded):
    return f"CUDA {encoded // 1000}.{encoded % 1000 // 10}"


def driver_verdict(runtime, driver):
    """Whether a driver of CUDA version `driver` runs kernels linked with runtime
    `runtime` (both as 1000 * major + 10 * minor; driver 0: none), in words. A
    driver runs any runtime of its major version or older (CUDA's minor version
    compatibility); machine code then loads, PTX only up to the driver's version."""
    if driver == 0:
        return "no CUDA driver: every buffer is host memory"
    if driver // 1000 < runtime // 1000:
        return (f"no: the driver ({_cuda_version(driver)}) is older than the kernels' runtime "
                f"({_cuda_version(runtime)}); device buffers fail with a message. Update the "
                f"driver to one for CUDA {runtime // 1000}, or build QNCCL with a CUDA "
                f"{driver // 1000} toolkit")
    note = "" if driver >= runtime else (
        f"; PTX from CUDA {runtime // 1000}.{runtime % 1000 // 10} does not JIT on it, so GPUs "
        "without machine code here do not run")
    return f"yes ({_cuda_version(driver)} driver, {_cuda_version(runtime)} runtime{note})"


def _cuda_rows(ffi, lib):
    """Rows about the library's CUDA side: its runtime, architectures, the driver."""
    from . import _lib
    info = ffi.new("qncclCudaInfo_t*")
    _lib.check(lib.qncclCudaInfo(info))
    if not info.compiled:
        return [("CUDA kernels", "not built (host codec only)")]
    sass, ptx = ([a for a in ffi.string(s).decode().split(",") if a] for s in (info.sass, info.ptx))
    return [("CUDA kernels", f"built in, {_cuda_version(info.runtimeVersion)} runtime (static)"),
            ("CUDA archs", " ".join(f"sm_{a}" for a in sass) + ", " +
             ("PTX " + " ".join(f"compute_{a}" for a in ptx) if ptx else "no PTX")),
            ("CUDA compat", driver_verdict(info.runtimeVersion, info.driverVersion))]


def _library_rows():
    """(rows, ok) about libqnccl.so: version, kernels, host codec, the configuration
    the environment gives a communicator."""
    from . import _lib
    try:
        ffi, lib = _lib.ffi(), _lib.lib()
        cuda = _cuda_rows(ffi, lib)
    except Exception as e:  # info reports whatever keeps the library from loading
        return [("library", f"not loaded: {type(e).__name__}: {e}")], False
    rows = [("library", f"{_lib.version()} at {_loaded_path('libqnccl.so') or '?'}"), *cuda]
    ok = True
    isa = ffi.new("const char**")
    try:
        _lib.check(lib.qncclHostCodecIsa(isa))
        rows.append(("host codec", ffi.string(isa[0]).decode()))
    except _lib.QncclError as e:  # a bad QNCCL_HOST_ISA
        rows.append(("host codec", f"unusable: {e.message}"))
        ok = False
    settings = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                        if k.startswith("QNCCL_"))
    rows.append(("environment", settings or "no QNCCL_* variables set (defaults)"))
    config = ffi.new("qncclEnvConfig_t*")
    try:
        _lib.check(lib.qncclConfigFromEnv(config))
        rows.append(("configuration", describe_env_config(config)))
    except _lib.QncclError as e:  # a bad QNCCL_* value: what ncclCommInitRank would say
        rows.append(("configuration", f"invalid: {e.message}"))
        ok = False
    return rows, ok


def cmd_info(_args):
    from .emulate import codec as emulator

    rows = [("qnccl package", __version__)]
    library_rows, ok = _library_rows()
    rows += library_rows
    nccl, how = nccl_library()
    rows.append(("NCCL", f"{nccl} ({how})" if nccl else how))
    ok = ok and "no such file" not in how
    wheel = nccl_wheel()
    if wheel:
        rows.append(("NCCL wheel", wheel))
    rows.append(("GPU", cuda_driver()))
    header = _native.header().read_text()
    wire = re.search(r"#define QNCCL_WIRE_VERSION (\d+)", header).group(1)
    rows.append(("wire format", f"{wire} (qnccl.h), {emulator.WIRE_VERSION} (emulator)"))
    if not _native.installed():  # building here: what `make` compiles the kernels with
        rows.append(("CUDA toolkit", _cuda_toolkit()))
    rows += [(pkg, importlib.metadata.version(pkg)) for pkg in ("numpy", "cffi")]
    for key, value in rows:
        print(f"{key:<14} {value}")
    return 0 if ok else 1


# ---- qnccl bench, qnccl codec-bench ---------------------------------------------------------

def _size_range(text):
    """argparse type: MIN:MAX byte sizes (K, M, G suffixes), 0 < MIN <= MAX."""
    low, sep, high = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX, e.g. 1M:64M, got {text!r}")
    low, high = _byte_size(low), _byte_size(high)
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < MIN <= MAX")
    return low, high


def _name_list(allowed):
    """argparse type: a comma list of names out of `allowed`."""
    def parse(text):
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"{text!r}: each must be one of {', '.join(allowed)}")
        return names
    return parse


# An on|off switch of qnccl bench (default on): its value is a one-name list, as the others.
ON_OFF = dict(type=_name_list(("on", "off")), default=["on"], metavar="on|off")


def _rate_list(text):
    """Rates for perf/netlab --rate, comma-separated (netlab checks each)."""
    rates = [r.strip() for r in text.split(",")]
    if not all(rates) or len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated rates, got {text!r}")
    return rates


def bench_settings(args):
    """`qnccl bench`'s parsed arguments with --quick's settings applied."""
    if args.quick:
        args.sizes, args.bits, args.buckets, args.iters = (1 << 20, 4 << 20), [4], [128], 1
        args.rotated_rows = ["off"]
    return args


def cmd_bench(args):
    from . import bench

    return bench.main(bench_settings(args))


def cmd_codec_bench(args):
    exe = _native.path("bin/codec_bench")
    if not exe.is_file():
        print(f"qnccl codec-bench: {_native.missing(exe)}", file=sys.stderr)
        return 1
    args.json.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), "-b", ",".join(map(str, args.bits)), "-B", ",".join(map(str, args.bucket)),
           "-n", args.bytes, "-r", str(args.reps), "--json", str(args.json)]
    if args.clip and not args.rotation:
        print("qnccl codec-bench: --clip clips rotated buckets' ranges; give --rotation BLOCK "
              "too", file=sys.stderr)
        return 2
    if args.rotation:
        cmd += ["--rotation", str(args.rotation)] + (["--clip"] if args.clip else [])
    rc = subprocess.call(cmd)
    if rc == 0:
        print(f"results: {args.json}")
    return rc


# ---- qnccl config ---------------------------------------------------------------------------

def config_flags():
    """{option: value} of `qnccl config`: how a C or C++ program compiles and links against
    this package's nccl.h and host backend (NCCL's API over MPI), or its qnccl.h API."""
    host = _native.path("host/libnccl.so").parent
    lib = _native.path("lib/libqnccl.so").parent
    return {
        "cflags": " ".join(f"-I{d}" for d in _native.include_dirs()),
        "libs": f"-L{host} -Wl,-rpath,{host} -lnccl",
        "qnccl-libs": f"-L{lib} -Wl,-rpath,{lib} -lqnccl",
        "includedir": " ".join(_native.include_dirs()),
        "libdir": str(host),
        "preload": str(libqnccl_path()),
        "pkg-config-path": str(_native.PACKAGED / "lib" / "pkgconfig"),
    }


def cmd_config(args):
    flags = config_flags()
    asked = [name for name in flags if getattr(args, name.replace("-", "_"))]
    if not asked:
        for name, value in flags.items():
            print(f"--{name:<16} {value}")
        return 0
    if "pkg-config-path" in asked and not _native.installed():
        print("qnccl config: a source tree has no qnccl.pc (an installed package carries it): "
              "use `qnccl config --cflags --libs`", file=sys.stderr)
        return 2
    print(" ".join(flags[name] for name in asked))
    return 0


def build_parser():
    """The parser of every `qnccl` command; parse_args gives `func` to call with the args."""
    parser = argparse.ArgumentParser(prog="qnccl", description="Quantized NCCL collectives.")
    parser.add_argument("--version", action="version", version=f"qnccl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="run a command with libqnccl.so preloaded",
        usage="qnccl run [options] -- CMD [ARGS...]",
        description="Runs CMD in place of this process (exit status and signals are CMD's) "
                    "with libqnccl.so first in LD_PRELOAD, so its ncclAllReduce quantizes "
                    "eligible calls (float32/float16/bfloat16, sum or avg, at least "
                    "--min-bytes). Each option sets its QNCCL_* variable, overriding the "
                    "environment; variables no option sets pass through unchanged. Under MPI "
                    "put it after the launcher (mpirun -np 4 qnccl run -- ./train), or export "
                    "the variables to remote ranks (mpirun -x LD_PRELOAD -x QNCCL_BITS ...).")
    for flag, variable, keywords in RUN_OPTIONS:
        keywords = dict(keywords, help=f"{variable}: {keywords['help']}")
        run.add_argument(flag, **keywords)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                     help="the program to run and its arguments")
    run.set_defaults(func=cmd_run, parser=run)

    info = commands.add_parser(
        "info", help="versions, library, configuration, GPU driver, NCCL library",
        description="Exits 1 when something keeps QNCCL from working here: the library does "
                    "not load, or a QNCCL_* variable has a bad value (the message says which).")
    info.set_defaults(func=cmd_info)

    bench = commands.add_parser(
        "bench", help="quantized vs uncompressed allreduce on a rate-limited link (make bench)",
        description="Runs all_reduce_perf with --ranks MPI ranks inside perf/netlab "
                    "(a network namespace whose loopback tc limits to each of --rates in turn, "
                    "MPI over TCP): uncompressed, then through QNCCL for every bits x bucket x "
                    "algorithm, beside MPI_Allreduce and torch.distributed (gloo) when torch is "
                    "installed. Prints one table per rate (busbw, speedup over uncompressed at "
                    "each size, bytes on the wire per input byte, error), writes "
                    "OUT/report.json, OUT/summary.md (the tables as markdown) and OUT/busbw.png. "
                    "Exits 1 when a run fails or a result "
                    "misses its error bound.")
    bench.add_argument("--ranks", type=int_in(2, 64), default=4, metavar="N",
                       help="MPI ranks (default 4)")
    bench.add_argument("--rates", "--rate", type=_rate_list, default=["1gbit", "10gbit"],
                       metavar="RATES",
                       help="link rates for tc, comma list, e.g. 100mbit, 1gbit, 10gbit, or "
                            "none for an unlimited loopback; the whole matrix runs at each "
                            "(default 1gbit,10gbit)")
    bench.add_argument("--sizes", type=_size_range, default=(1 << 20, 64 << 20), metavar="MIN:MAX",
                       help="message sizes, doubling (default 1M:64M)")
    bench.add_argument("--bits", type=_int_list(1, 8), default=[8, 4, 2],
                       help="bits per value, comma list (default 8,4,2)")
    bench.add_argument("--buckets", type=size_list(1, 2**40), default=[128, 1024],
                       help="bucket sizes, comma list, K suffixes allowed (default 128,1024)")
    bench.add_argument("--algos", type=_name_list(("ring", "tree", "sra")),
                       default=["ring", "tree", "sra"], help="comma list (default ring,tree,sra)")
    bench.add_argument("--dtypes", type=_name_list(("float32", "bfloat16", "float16")),
                       default=["float32", "bfloat16"],
                       help="types the flat and shared-memory sections reduce, each against "
                            "its own uncompressed run; types other than float32 run the first "
                            "of --buckets only (default float32,bfloat16)")
    bench.add_argument("--rounding", choices=("stochastic", "nearest"), default="stochastic",
                       help="default stochastic (QNCCL's default)")
    bench.add_argument("--rotated-rows", **ON_OFF,
                       help="then, in each flat section, the settings that train at fewer bits "
                            "(docs/accuracy.md, \"Fewer bits\"): 3 bits rotated, 2 bits rotated "
                            "and clipped, SRA, blocks of 256, the first of --buckets, float32 "
                            "(default on; off with --quick)")
    bench.add_argument("--baselines", type=_name_list(("mpi", "torch")), default=["mpi", "torch"],
                       help="besides uncompressed all_reduce_perf: mpi, torch (default both)")
    bench.add_argument("--nodes-section", **ON_OFF,
                       help="then 2 emulated nodes x 2 ranks, the first of --rates between "
                            "the nodes: "
                            "uncompressed, MPI_Allreduce, flat ring/SRA and hierarchical at 8 "
                            "and 4 bits, measured auto at 4 (default on)")
    bench.add_argument("--collectives-section", **ON_OFF,
                       help="then, at the first of --rates, reduce-scatter at 4 bits, allgather "
                            "and all-to-all at 8 bits beside each uncompressed (default on)")
    bench.add_argument("--shm-section", **ON_OFF,
                       help="then --ranks ranks on one node over shared memory, no rate limit "
                            "(where uncompressed is fastest): per type of --dtypes, uncompressed, "
                            "and 4 bits / bucket 128 with auto and each of --algos (default on)")
    bench.add_argument("--iters", type=int_in(1), default=3, metavar="N",
                       help="timed calls per size; busbw from their median (default 3; the "
                            "shared-memory section times at least 21)")
    bench.add_argument("--warmup", type=int_in(0), default=1, metavar="N",
                       help="warm-up calls (default 1)")
    bench.add_argument("--timeout", type=int_in(10), default=900, metavar="S",
                       help="seconds one configuration may take (default 900)")
    bench.add_argument("--out", type=Path, default=RESULTS,
                       help=f"output folder (default {RESULTS}/ under the current directory)")
    bench.add_argument("--quick", action="store_true",
                       help="a short run: 1M..4M, 4 bits, bucket 128, one call per size")
    bench.add_argument("--wide", action="store_true",
                       help="print the full tables (busbw and speedup at every size, the "
                            "wire-size limit per row) instead of ones that fit 120 columns; "
                            "report.json has both")
    bench.set_defaults(func=cmd_bench)

    codec_bench = commands.add_parser(
        "codec-bench", help="host codec throughput beside memcpy (median of repetitions)",
        description="Runs codec_bench over every bits x bucket combination: "
                    "quantize (nearest, stochastic) and dequantize-accumulate, in GB/s of "
                    "float32 input and as a fraction of memcpy.")
    codec_bench.add_argument("--bits", type=_int_list(1, 8), default=[8, 4, 2],
                             help="bits per value, comma list (default 8,4,2)")
    codec_bench.add_argument("--bucket", type=size_list(1, 2**40), default=[128, 1024],
                             help="bucket sizes, comma list, K suffixes allowed (default "
                                  "128,1024)")
    codec_bench.add_argument("--bytes", default="64M", help="float32 input size (default 64M)")
    codec_bench.add_argument("--reps", type=int, default=7, help="timed repetitions (default 7)")
    codec_bench.add_argument("--rotation", type=_rotation_block, default=0, metavar="BLOCK",
                             help="also run each operation with a Hadamard rotation in blocks "
                                  "of BLOCK values (docs/rotation.md), beside it")
    codec_bench.add_argument("--clip", action="store_true",
                             help="the rotated operations with clipped ranges (clip gaussian)")
    codec_bench.add_argument("--json", type=Path, default=RESULTS / "codec.json",
                             help=f"where to write the results (default {RESULTS}/codec.json "
                                  "under the current directory)")
    codec_bench.set_defaults(func=cmd_codec_bench)

    config = commands.add_parser(
        "config", help="flags to compile and link a program against this package",
        usage="qnccl config [--cflags] [--libs] [--qnccl-libs] [...]",
        description="Prints the flags for a program of your own: with `--cflags --libs` the "
                    "compiler finds nccl.h (the NCCL API as QNCCL declares it) and qnccl.h, and "
                    "the linker the host backend's libnccl.so (NCCL's API over MPI, for host "
                    "memory), e.g. `mpicc prog.c $(qnccl config --cflags --libs) -o prog`, then "
                    "`qnccl run --bits 4 -- mpirun -np 2 ./prog`. On a GPU machine link NVIDIA's "
                    "NCCL instead (its -lnccl) and let `qnccl run` preload QNCCL. With no option, "
                    "every value.")
    for name, what in (("cflags", "-I flags for nccl.h and qnccl.h"),
                       ("libs", "link flags for the host backend's libnccl.so (-lnccl)"),
                       ("qnccl-libs", "link flags for libqnccl.so (qnccl.h's own API)"),
                       ("includedir", "the folder of the headers (a source tree: two)"),
                       ("libdir", "the folder of the host backend's libnccl.so"),
                       ("preload", "the libqnccl.so `qnccl run` preloads"),
                       ("pkg-config-path", "the folder of qnccl.pc (PKG_CONFIG_PATH), in an "
                                           "installed package")):
        config.add_argument(f"--{name}", action="store_true", help=what)
    config.set_defaults(func=cmd_config)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)
