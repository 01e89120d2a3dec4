#!/usr/bin/env python3
"""The DDP hook's CUDA path on a GPU against its host path, in one process (world size 1).

A CUDA bucket's quantized group goes through libqnccl's engine on the NCCL process group's
communicator, on PyTorch's current stream (here a side stream), in the state's buffer for
the group; a CPU copy goes through the SRA over a gloo group. With one rank the SRA still
quantizes (the owner's chunk is the whole buffer), so on every call the two paths must give
the same bytes and the same error-feedback residuals: the device kernels are the host
codec's arithmetic. Then a DDP job on the GPU trains with the hook and its future: the
gradients DDP hands the optimizer are the bucket's averaged ones, computed without the host
waiting for the device (checked by the parameters against a CPU replay).

    python tests/torch_programs/hook_cuda.py      (prints OK, or raises)
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import qnccl.torch as qtorch  # noqa: E402
from qnccl.torch import engine as qengine, host as qhost, hook as qhook  # noqa: E402

CALLS = 4


def main():
    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    gloo = dist.new_group(backend="gloo")
    dist.barrier()  # makes the NCCL communicator
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 32))
    names = ["0.weight", "1.weight"]
    params = dict(model.named_parameters())
    device_state = qtorch.QuantizedHookState(model, bits=4, bucket_size=64, error_feedback=True,
                                             seed=11)
    host_state = qtorch.QuantizedHookState(model, process_group=gloo, bits=4, bucket_size=64,
                                           error_feedback=True, seed=11)
    # a CUDA buffer's engine runs on the process group's own NCCL communicator
    comm = qengine.engine_for(device_state, torch.empty(1, device="cuda"))
    assert comm == qtorch.communicator()
    gen = torch.Generator().manual_seed(5)
    side = torch.cuda.Stream()
    for t in range(CALLS):
        grads = [torch.randn(params[n].shape, generator=gen) * 10 ** (t - 2) for n in names]
        on_device = [g.cuda() for g in grads]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            qengine.engine_group(device_state, comm, on_device, names, (4, 64))
        qhook.to_end(qhost.torch_group(host_state, gloo, grads, names, (4, 64)))
        side.synchronize()
        for n, got, want in zip(names, on_device, grads):
            assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32)), (t, n)
        got_res = qengine.all_residuals(device_state)
        for n in names:
            assert torch.equal(torch.from_numpy(got_res[n]).view(torch.int32),
                               torch.from_numpy(host_state.residuals[n]).view(torch.int32)), (t, n)
    assert device_state.calls == host_state.calls == CALLS
    assert qengine.stream_of(on_device[0]) == torch.cuda.current_stream().cuda_stream

    # DDP on the GPU: the hook returns a device future; the step is what the CPU replay gives
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 8))
    replay = [p.detach().clone() for p in net.parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(net.cuda(), device_ids=[0])
    state = qtorch.QuantizedHookState(ddp, bits=4, bucket_size=128)
    ddp.register_comm_hook(state, qtorch.sra_hook)
    x, y = torch.randn(16, 64, generator=gen), torch.randn(16, 8, generator=gen)
    torch.nn.functional.mse_loss(ddp(x.cuda()), y.cuda()).backward()
    torch.cuda.synchronize()
    assert state.report()["calls"] == 0  # one rank: every bucket is the exact mean
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 8))
    with torch.no_grad():
        for p, r in zip(cpu.parameters(), replay):
            p.copy_(r)
    torch.nn.functional.mse_loss(cpu(x), y).backward()
    for p, q in zip(ddp.module.parameters(), cpu.parameters()):
        assert torch.allclose(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6)
    dist.destroy_process_group()
    print("OK")


if __name__ == "__main__":
    main()
