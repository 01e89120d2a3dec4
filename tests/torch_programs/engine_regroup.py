#!/usr/bin/env python3
"""The DDP hook's engine path when DDP regroups parameters (its bucket rebuild after the first
iteration): the engine keeps error feedback's residual per group buffer, so when a parameter
moves to another group its residual has to move with it. Calls the two implementations of a
quantized group directly, on the same gradients, through a sequence of groupings, and checks
on every call that the engine path (on a host-backend communicator) gives the torch path's
bytes, and at the end the same residuals by name.

    MASTER_PORT=P QNCCL_NCCL_LIB=build/host/libnccl.so.2 mpirun -np N python engine_regroup.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_ranks  # noqa: E402
import qnccl.torch as qtorch  # noqa: E402
from qnccl.torch import engine as qengine, host as qhost, hook as qhook  # noqa: E402
from ddp_train import host_communicator  # noqa: E402

# One grouping per call: the groups of one "bucket", each one quantized call.
GROUPINGS = [[["a"], ["b"]], [["a"], ["b"]], [["a", "b"]], [["a", "b"], ["c"]], [["c", "a"]],
             [["a"], ["b"], ["c"]]]


def main():
    rank, size = gloo_ranks.init(timeout_s=60)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(40, 30), "b": torch.nn.Linear(30, 50),
                                 "c": torch.nn.Linear(50, 7)})
    shapes = {n: dict(model.named_parameters())[f"{n}.weight"].shape for n in "abc"}
    kwargs = dict(bits=3, bucket_size=32, error_feedback=True, seed=9, min_numel=0)
    host = qtorch.QuantizedHookState(model, **kwargs)
    engine = qtorch.QuantizedHookState(model, comm=host_communicator(rank, size), **kwargs)
    comm = qengine.engine_for(engine, torch.empty(0))
    gen = torch.Generator().manual_seed(rank)
    for t, grouping in enumerate(GROUPINGS):
        for members in grouping:
            names = [f"{n}.weight" for n in members]
            grads = [torch.randn(shapes[n], generator=gen) for n in members]
            copies = [g.clone() for g in grads]
            qhook.to_end(qhost.torch_group(host, host._group(), grads, names, (3, 32)))
            qengine.engine_group(engine, comm, copies, names, (3, 32))
            for name, want, got in zip(names, grads, copies):
                assert torch.equal(want.view(torch.int32), got.view(torch.int32)), (t, name)
    want, got = host.state_dict()["residuals"], engine.state_dict()["residuals"]
    assert sorted(want) == sorted(got) == ["a.weight", "b.weight", "c.weight"], (want, got)
    for name in want:
        assert torch.equal(want[name].view(torch.int32), got[name].view(torch.int32)), name
        # with one rank it owns every value, and an owner's residual is 0 (docs/allreduce.md)
        assert (want[name].abs().max() > 0) == (size > 1), name
    assert host.calls == engine.calls == sum(len(g) for g in GROUPINGS)
    print(f"rank {rank}: OK", flush=True)
    gloo_ranks.finish()


if __name__ == "__main__":
    main()
