#!/usr/bin/env python3
"""The DDP hook's engine path after its communicator was aborted behind libqnccl's back, as
PyTorch's watchdog aborts a failed one through the NCCL library itself when libqnccl is not
preloaded: the next backward pass fails with a message saying the communicator is gone, no
call reaches it, and libqnccl holds nothing more for it.

Two steps of DDP with sra_hook on a host-backend communicator (engine path, error feedback),
then every rank aborts the communicator with the host backend's own ncclCommAbort; the third
step's backward must raise CommunicatorEnded's message, and qnccl.comm.forget must find
nothing left to drop.

    MASTER_PORT=P QNCCL_NCCL_LIB=build/host/libnccl.so.2 mpirun -np 2 python engine_after_abort.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_ranks  # noqa: E402
import qnccl  # noqa: E402
import qnccl.comm  # noqa: E402
import qnccl.torch as qtorch  # noqa: E402
from ddp_train import host_communicator  # noqa: E402


def step(ddp, x):
    ddp.zero_grad()
    ddp(x).square().sum().backward()


def main():
    rank, size = gloo_ranks.init(timeout_s=60)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    comm = host_communicator(rank, size)
    address = qnccl.comm._comm_address(comm)
    state = qtorch.QuantizedHookState(model, comm=comm, bits=4, error_feedback=True,
                                      min_numel=0, warmup_steps=0)
    ddp.register_comm_hook(state, qtorch.sra_hook)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        step(ddp, x)
    held = qnccl.comm.stats(comm)
    assert held["calls_compressed"] > 0 and held["residual_buffers"] > 0, held

    nccl = qnccl._lib.ffi().dlopen(os.environ["QNCCL_NCCL_LIB"])
    qnccl._lib.check(nccl.ncclCommAbort(comm))  # the library's own: libqnccl does not see it
    calls = state.calls
    try:
        step(ddp, x)
    except RuntimeError as exc:
        message = str(exc)
    else:
        message = None
    assert message is not None, "the backward pass on an aborted communicator succeeded"
    assert f"NCCL communicator {address:#x} of the hook's engine path is gone" in message, message
    assert state.calls == calls, "a quantized group ran on the aborted communicator"
    try:
        qnccl.comm.forget(address)
    except qnccl._lib.QncclError as exc:
        assert "holds nothing" in exc.message, exc.message
    else:
        raise AssertionError("libqnccl still held state for the aborted communicator")
    print(f"rank {rank}: OK", flush=True)
    gloo_ranks.finish()


if __name__ == "__main__":
    main()
