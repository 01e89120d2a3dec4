#!/usr/bin/env python3
"""A DDP job (gloo, CPU) whose qnccl.torch hook state goes through a checkpoint: it trains a
torch.compile'd model (eager backend) inside DDP with gradient accumulation (no_sync on every other
micro-batch) and the 4-bit hook with error feedback, warm-up and per-layer bits, for 2K steps
without stopping; then again from the checkpoint taken after K steps, restoring the model,
the optimizer and the hook state (a) through state_dict()/load_state_dict() and (b) through
torch.save(state)/torch.load + attach(model); and (c) restoring all but the hook state.
Writes, per rank, the final parameters of every run to OUTDIR/rank<r>.pt. With --engine, the
hook reduces through libqnccl's engine on an NCCL communicator of the host backend
(QNCCL_NCCL_LIB), a new one for every run, as a restored job gets a new one.

    MASTER_PORT=P mpirun -np N python tests/torch_programs/ddp_checkpoint.py OUTDIR [--engine]
"""
import io
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_ranks  # noqa: E402
import qnccl.torch  # noqa: E402
from ddp_train import host_communicator  # noqa: E402

K = 3  # the checkpoint is taken after K of 2K steps


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)   # quantized at 3 bits (per_layer)
        self.ln = torch.nn.LayerNorm(64)     # 1-D: exact
        self.fc2 = torch.nn.Linear(64, 32)   # quantized at the default 4 bits
        self.head = torch.nn.Linear(32, 4)   # small: exact

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.ln(self.fc1(x))))))


def per_layer(name, param):  # module level: torch.save can pickle the state that holds it
    return (3, 64) if name.startswith("fc1") else (4, 128)


def make(comm, restored=None):
    """A fresh model, DDP, compiled model, hook state (`restored`, attached to the model, or
    a new one; on `comm`) and optimizer."""
    torch.manual_seed(1234)
    model = Net()
    compiled = torch.compile(model, backend="eager")
    ddp = torch.nn.parallel.DistributedDataParallel(compiled)
    if restored is None:  # made from DDP(torch.compile(model)): names are the model's own
        state = qnccl.torch.QuantizedHookState(ddp, bits=4, bucket_size=128,
                                               min_numel=1024, per_layer=per_layer,
                                               error_feedback=True, warmup_steps=1, seed=5,
                                               comm=comm)
    else:
        state = restored
        state.attach(ddp, comm=comm)
    ddp.register_comm_hook(state, qnccl.torch.sra_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, ddp, compiled, state, optimizer


def train(parts, steps, rank):
    model, ddp, compiled, _, optimizer = parts
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        for micro in range(2):  # gradient accumulation: DDP communicates on the second
            g = torch.Generator().manual_seed(step * 100 + micro * 10 + rank)
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
            context = ddp.no_sync() if micro == 0 else torch.enable_grad()
            with context:
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
        optimizer.step()


def saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def main():
    outdir = sys.argv[1]
    rank, size = gloo_ranks.init(timeout_s=60)
    engine = "--engine" in sys.argv[2:]

    def communicator():
        return host_communicator(rank, size) if engine else None

    parts = make(communicator())
    train(parts, range(K), rank)
    model, _, _, state, optimizer = parts
    checkpoint = saved({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "hook": state.state_dict()})
    whole_state = saved(state)  # torch.save of the state object itself
    train(parts, range(K, 2 * K), rank)
    results = {"never stopped": [p.detach().clone() for p in model.parameters()],
               "residuals": sorted(state.state_dict()["residuals"])}

    for how in ("state_dict", "torch.save", "hook state lost"):
        checkpoint.seek(0)
        loaded = torch.load(checkpoint, weights_only=False)
        restored = None
        if how == "torch.save":
            whole_state.seek(0)
            restored = torch.load(whole_state, weights_only=False)
        parts = make(communicator(), restored)
        model, _, _, state, optimizer = parts
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
        if how == "state_dict":
            state.load_state_dict(loaded["hook"])
        train(parts, range(K, 2 * K), rank)
        results[how] = [p.detach().clone() for p in model.parameters()]
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
    dist.barrier()
    gloo_ranks.finish()


if __name__ == "__main__":
    main()
