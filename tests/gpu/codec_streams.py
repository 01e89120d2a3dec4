"""qnccl.codec on CuPy arrays and PyTorch CUDA tensors on a non-default stream, on a GPU:
the device's bytes equal the host codec's (float32, float16, bfloat16; quantize,
dequantize, dequantize-accumulate), ordered on that stream behind a large kernel queued
ahead on it (a codec call that ran on another stream could overtake it: a timing-dependent
check, not a proof). Prints a line per check and
OK last; exits 1 on the first difference."""
import sys

import cupy
import numpy as np
import torch

from qnccl import codec


def same(what, device_bytes, host_bytes):
    a, b = np.asarray(device_bytes).view(np.uint8), np.asarray(host_bytes).view(np.uint8)
    if a.shape != b.shape or not np.array_equal(a, b):
        print(f"FAIL: {what}: the device's bytes differ from the host's", flush=True)
        sys.exit(1)
    print(f"{what}: {a.size} bytes equal", flush=True)


def main():
    rng = np.random.default_rng(7)
    for dtype in ("float32", "float16", "bfloat16"):
        x32 = (rng.standard_normal(1 << 20) * 3).astype(np.float32)
        bits32 = x32.view(np.uint32)
        host = x32 if dtype == "float32" else (
            x32.astype(np.float16) if dtype == "float16" else (bits32 >> 16).astype(np.uint16))
        q = codec.quantize(host, 4, 128, "stochastic", seed=3, stream=5, dtype=dtype)
        want_out = codec.dequantize(q)
        acc_host = host.copy()
        codec.dequantize_accumulate(q, acc_host)

        side = cupy.cuda.Stream(non_blocking=True)
        with side:
            big = cupy.ones(1 << 26, dtype=cupy.float32)   # queued ahead on the same stream
            big *= 2
            xd = cupy.asarray(host)
            qd = codec.quantize(xd, 4, 128, "stochastic", seed=3, stream=5, dtype=dtype)
            outd = codec.dequantize(qd)
            accd = xd.copy()
            codec.dequantize_accumulate(qd, accd)
        side.synchronize()
        same(f"cupy {dtype} quantize (non-default stream)", qd.data.get(), q.data)
        same(f"cupy {dtype} dequantize", outd.get(), want_out)
        same(f"cupy {dtype} dequantize_accumulate", accd.get(), acc_host)

        torch_dtype = {"float32": torch.float32, "float16": torch.float16,
                       "bfloat16": torch.bfloat16}[dtype]
        cpu = torch.from_numpy(host.view(np.int16) if dtype == "bfloat16" else host)
        cpu = cpu.view(torch.bfloat16) if dtype == "bfloat16" else cpu
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            big = torch.ones(1 << 26, device="cuda")  # queued ahead on the same stream
            big *= 2
            t = cpu.to("cuda", non_blocking=False)
            qt = codec.quantize(t, 4, 128, "stochastic", seed=3, stream=5)
            outt = codec.dequantize(qt)
            acct = t.clone()
            codec.dequantize_accumulate(qt, acct)
        stream.synchronize()
        assert outt.dtype == torch_dtype
        same(f"torch {dtype} quantize (side stream)", qt.data.cpu().numpy(), q.data)
        same(f"torch {dtype} dequantize", outt.cpu().view(torch.int16 if dtype != "float32"
                                                           else torch.float32).numpy(), want_out)
        same(f"torch {dtype} dequantize_accumulate",
             acct.cpu().view(torch.int16 if dtype != "float32" else torch.float32).numpy(),
             acc_host)
    print("OK", flush=True)


if __name__ == "__main__":
    main()
