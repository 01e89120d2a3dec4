"""The CUDA codec's bandwidth against the device's: qncclQuantize, qncclDequantize and
qncclDequantizeAccumulate on one float32 buffer in device memory, beside a device-to-device
copy of the same buffer, in the same run (PyTorch allocates and times; CUDA events).

    python tests/gpu/codec_roofline.py [--mib 256] [--reps 20] [--json FILE]

GB/s counts the float32 input's bytes per second (1 GB = 1e9 bytes), as `qnccl
codec-bench` does; the copy's row counts the same bytes, so `of copy` is the time of
one copy over the time of the codec call. Needs a GPU and PyTorch with CUDA."""
import argparse
import json
import statistics
import sys

import torch

from qnccl import _lib


def timed(fn, reps):
    """Median milliseconds of `fn` over `reps` runs on the current stream, after 3 warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="float32 input size in MiB")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", help="also write the rows as JSON")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("codec_roofline: needs a CUDA device")
    ffi, lib = _lib.ffi(), _lib.lib()
    count = args.mib << 18
    x = torch.randn(count, device="cuda")
    acc = torch.randn(count, device="cuda")
    out = torch.empty_like(x)
    stream = ffi.cast("cudaStream_t", torch.cuda.current_stream().cuda_stream)
    ptr = lambda t: ffi.cast("void*", t.data_ptr())  # noqa: E731
    copy_ms = timed(lambda: out.copy_(x), args.reps)
    rows = [{"op": "copy (device to device)", "bits": None, "bucket": None, "rounding": None,
             "ms": copy_ms}]
    for bits in (2, 4, 8):
        for rounding in ("nearest", "stochastic"):
            cfg = ffi.new("qncclCodecConfig_t*")
            cfg.bits, cfg.bucketSize, cfg.seed = bits, 128, 1
            cfg.rounding = lib.qncclRoundStochastic if rounding == "stochastic" else \
                lib.qncclRoundNearest
            size = ffi.new("size_t*")
            _lib.check(lib.qncclCompressedSize(count, cfg, size))
            wire = torch.empty(size[0], dtype=torch.uint8, device="cuda")
            calls = {
                "quantize": lambda: _lib.check(lib.qncclQuantize(
                    ptr(x), count, lib.ncclFloat32, cfg, 0, ptr(wire), size[0], stream)),
                "dequantize": lambda: _lib.check(lib.qncclDequantize(
                    ptr(wire), size[0], count, cfg, ptr(out), lib.ncclFloat32, stream)),
                "dequantize-accumulate": lambda: _lib.check(lib.qncclDequantizeAccumulate(
                    ptr(wire), size[0], count, cfg, ptr(acc), lib.ncclFloat32, stream)),
            }
            for op, fn in calls.items():
                if op != "quantize" and rounding == "stochastic":
                    continue  # decoding does not depend on the rounding
                rows.append({"op": op, "bits": bits, "bucket": 128, "rounding": rounding,
                             "ms": timed(fn, args.reps)})
    name = torch.cuda.get_device_name()
    print(f"# {name}, {args.mib} MiB of float32, median of {args.reps}")
    print(f"{'op':24} {'bits':>4} {'rounding':>10} {'ms':>8} {'GB/s':>8} {'of copy':>8}")
    for row in rows:
        row["GBps"] = count * 4 / (row["ms"] * 1e-3) / 1e9
        row["of_copy"] = copy_ms / row["ms"]
        print(f"{row['op']:24} {row['bits'] or '':>4} {row['rounding'] or '':>10} "
              f"{row['ms']:8.3f} {row['GBps']:8.1f} {row['of_copy']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "mib": args.mib, "reps": args.reps, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
