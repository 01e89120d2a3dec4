#!/usr/bin/env python3
"""The hook's worker may start a new bucket while an older one waits for its peers, which is
deadlock-free only because a bucket's first step never waits (qnccl/torch/host.py, Worker). On 2
gloo ranks, for a warm-up bucket, a bucket with an exact and a quantized part, and the same on
the engine (a host-backend communicator): rank 1 holds back for a while, and rank 0 must get
through the bucket's first step long before rank 1 joins; then both finish the bucket and
end with the same bytes.

    MASTER_PORT=P QNCCL_NCCL_LIB=build/host/libnccl.so.2 mpirun -np 2 python first_step.py
"""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_ranks  # noqa: E402
import qnccl.torch as qtorch  # noqa: E402
from qnccl.torch import hook as qhook  # noqa: E402
from ddp_train import host_communicator  # noqa: E402

HOLD_S = 3.0  # rank 1's delay; rank 0's first step must take far less


class Bucket:
    """What _reduce_bucket reads of DDP's GradBucket: the buffer, the index and the
    parameters with their gradients (views into the buffer)."""

    def __init__(self, model, rank):
        params = list(model.parameters())
        gen = torch.Generator().manual_seed(rank)
        self._buffer = torch.randn(sum(p.numel() for p in params), generator=gen)
        self._params, self._grads, offset = params, [], 0
        for p in params:
            self._grads.append(self._buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def parameters(self):
        return self._params

    def gradients(self):
        return self._grads


def main():
    rank, size = gloo_ranks.init(timeout_s=60)
    model = torch.nn.Linear(64, 64)  # a quantized weight, an exact bias
    comm = host_communicator(rank, size)
    states = {"warm-up": qtorch.QuantizedHookState(model, warmup_steps=1),
              "exact + quantized": qtorch.QuantizedHookState(model),
              "engine": qtorch.QuantizedHookState(model, comm=comm)}
    for what, state in states.items():
        dist.barrier()
        if rank == 1:
            time.sleep(HOLD_S)
        bucket = Bucket(model, rank)
        steps = qhook.reduce_bucket(state, bucket)
        start = time.perf_counter()
        next(steps)
        first = time.perf_counter() - start
        result = qhook.to_end(steps)
        assert result is bucket.buffer()
        if rank == 0:
            assert first < HOLD_S / 3, f"{what}: the first step waited {first:.2f} s"
        results = [None] * size
        dist.all_gather_object(results, result.numpy().tobytes())
        assert results[0] == results[1], f"{what}: the ranks' results differ"
        print(f"rank {rank}: {what}: first step {first * 1e3:.1f} ms", flush=True)
    gloo_ranks.finish()


if __name__ == "__main__":
    main()
