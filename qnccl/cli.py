"""The `qnccl` command.

    qnccl info     what is installed and built: versions, library, CUDA, nvcc
    qnccl bench    host codec throughput (build/bin/codec_bench), beside memcpy

`qnccl run -- CMD` (LD_PRELOAD launcher) arrives with the interposer.
"""
import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import __version__

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "build"


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


def cmd_bench(args):
    exe = BUILD / "bin" / "codec_bench"
    if not exe.is_file():
        print(f"qnccl bench: {exe} is missing: run `make` in {REPO}", file=sys.stderr)
        return 1
    args.json.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), "-b", ",".join(map(str, args.bits)), "-B", ",".join(map(str, args.bucket)),
           "-n", args.bytes, "-r", str(args.reps), "--json", str(args.json)]
    rc = subprocess.call(cmd)
    if rc == 0:
        print(f"results: {args.json}")
    return rc


def _nvcc():
    """Path and release of the nvcc that `make` would use (same search as the Makefile)."""
    cuda_nvcc = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "bin" / "nvcc"
    path = shutil.which("nvcc") or (str(cuda_nvcc) if os.access(cuda_nvcc, os.X_OK) else None)
    if path is None:
        return "not found (CPU-only build)"
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release ([\d.]+)", out)
    return f"{path} (CUDA {release.group(1) if release else '?'})"


def _loaded_path(name):
    """Where the dynamic loader found the shared library `name` in this process."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(name) or f"/{name} " in line:
            return line.split()[-1]
    return "?"


def cmd_info(_args):
    from . import _lib
    from .emulate import codec as emulator

    rows = [("qnccl package", __version__)]
    status = 0
    try:
        compiled = _lib.ffi().new("int*")
        _lib.check(_lib.lib().qncclCudaCompiled(compiled))
        rows += [("library", f"{_lib.version()} at {_loaded_path('libqnccl.so')}"),
                 ("CUDA kernels", "built in" if compiled[0] else "not built (host codec only)")]
    except Exception as e:  # info reports whatever keeps the library from loading
        rows.append(("library", f"not loaded: {type(e).__name__}: {e}"))
        status = 1
    if status == 0:
        isa = _lib.ffi().new("const char**")
        try:
            _lib.check(_lib.lib().qncclHostCodecIsa(isa))
            rows.append(("host codec", _lib.ffi().string(isa[0]).decode()))
        except _lib.QncclError as e:  # a bad QNCCL_HOST_ISA
            rows.append(("host codec", f"unusable: {e.message}"))
            status = 1
    header = (REPO / "src" / "include" / "qnccl.h").read_text()
    wire = re.search(r"#define QNCCL_WIRE_VERSION (\d+)", header).group(1)
    rows += [("wire format", f"{wire} (qnccl.h), {emulator.WIRE_VERSION} (emulator)"),
             ("nvcc", _nvcc())]
    rows += [(pkg, importlib.metadata.version(pkg)) for pkg in ("numpy", "cffi")]
    for key, value in rows:
        print(f"{key:<14} {value}")
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(prog="qnccl", description="Quantized NCCL collectives.")
    parser.add_argument("--version", action="version", version=f"qnccl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="versions, library, CUDA support, tools")
    info.set_defaults(func=cmd_info)

    bench = commands.add_parser(
        "bench", help="host codec throughput beside memcpy (median of repetitions)",
        description="Runs build/bin/codec_bench over every bits x bucket combination: "
                    "quantize (nearest, stochastic) and dequantize-accumulate, in GB/s of "
                    "float32 input and as a fraction of memcpy.")
    bench.add_argument("--bits", type=_int_list(1, 8), default=[8, 4, 2],
                       help="bits per value, comma list (default 8,4,2)")
    bench.add_argument("--bucket", type=_int_list(1), default=[128, 1024],
                       help="bucket sizes, comma list (default 128,1024)")
    bench.add_argument("--bytes", default="64M", help="float32 input size (default 64M)")
    bench.add_argument("--reps", type=int, default=7, help="timed repetitions (default 7)")
    bench.add_argument("--json", type=Path, default=BUILD / "bench" / "codec.json",
                       help="where to write the results (default build/bench/codec.json)")
    bench.set_defaults(func=cmd_bench)

    args = parser.parse_args(argv)
    return args.func(args)
