"""PyTorch's NCCL backend through the interposer, on a GPU: run under `qnccl run`, one
process per rank (torchrun's variables, or a world of one by default).

    QNCCL_MIN_BYTES=0 qnccl run --bits 4 --debug INFO -- python tests/gpu/torch_check.py MODE

ddp      a small regression model under DistributedDataParallel trains for 60 steps: the
         loss must fall to a fifth; then a float16 and a bfloat16 all_reduce, whose error
         against the exact sum is checked against the library's bound.
compile  the same model through torch.compile.
graph    the first collective of the process is dist.all_reduce captured in
         torch.cuda.graph (no eager call before it); three replays on fresh inputs each
         give the sum within the bound, as does an eager call after them.
abort    (without `qnccl run`) the DDP hook's engine path asks PyTorch for the process
         group's communicator: after the group's backend is aborted (what its watchdog does to
         a failed communicator), qnccl.torch.engine.communicator must raise CommunicatorEnded
         instead of handing out the freed communicator.

Prints one line per check and OK last; exits 1 on the first failure."""
import os
import sys

import torch
import torch.distributed as dist


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def bound(inputs, bits):
    """The error bound of a quantized allreduce (sum) of `inputs` on every rank: the library's
    own (qncclAllReduceErrorBound, docs/allreduce.md), the largest over the algorithms auto
    may pick, for the configuration `qnccl run` set."""
    from qnccl import _lib
    ffi, lib = _lib.ffi(), _lib.lib()
    config = ffi.new("qncclAllReduceConfig_t*")
    config.codec.bits = bits
    config.codec.bucketSize = int(os.environ.get("QNCCL_BUCKET_SIZE", "128"))
    config.codec.rounding = lib.qncclRoundNearest if os.environ.get(
        "QNCCL_ROUNDING") == "nearest" else lib.qncclRoundStochastic  # qnccl run's default
    dtype = {torch.float32: lib.ncclFloat32, torch.float16: lib.ncclFloat16,
             torch.bfloat16: lib.ncclBfloat16}[inputs.dtype]
    worst, out = 0.0, ffi.new("double*")
    for algo in (lib.qncclAlgoRing, lib.qncclAlgoTree, lib.qncclAlgoSra):
        config.algo = algo
        _lib.check(lib.qncclAllReduceErrorBound(inputs.numel(), dtype, lib.ncclSum, config,
                                                dist.get_world_size(),
                                                inputs.float().abs().max().item(), out))
        worst = max(worst, out[0])
    return worst


def same_on_every_rank(count, device, seed, dtype=torch.float32):
    """Normal values, the same on every rank (so the exact sum is world * x)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(count, device=device, generator=g).to(dtype)


def check_allreduce(x, what):
    """all_reduce of x (the same on every rank): within bound() of world * x."""
    bits = int(os.environ.get("QNCCL_BITS", "8"))
    want = x.float() * dist.get_world_size()
    y = x.clone()
    dist.all_reduce(y)
    error = (y.float() - want).abs().max().item()
    limit = bound(x, bits)
    print(f"{what}: {x.numel()} values of {x.dtype}: max error {error:.3g} (bound {limit:.3g})",
          flush=True)
    if not error <= limit:
        fail(f"{what}: error {error} above the bound {limit}")


def train(compiled):
    torch.manual_seed(0)
    device = torch.device("cuda", torch.cuda.current_device())
    teacher = torch.nn.Linear(512, 1).to(device)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    step_model = torch.compile(ddp) if compiled else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for step in range(60):
        g = torch.Generator(device=device).manual_seed(1000 * dist.get_rank() + step)
        x = torch.randn(256, 512, device=device, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(step_model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps", flush=True)
    if not losses[-1] < losses[0] / 5:  # exact gradients: 0.46 -> 0.03 (on a CPU)
        fail(f"the loss did not fall to a fifth: {losses[0]} -> {losses[-1]}")


def graph():
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.empty(1 << 20, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(g, stream=side):
        dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(side)
    bits = int(os.environ.get("QNCCL_BITS", "8"))
    for replay in range(3):
        source = same_on_every_rank(1 << 20, device, 100 + replay)
        x.copy_(source)
        g.replay()
        torch.cuda.synchronize()
        error = (x - source * dist.get_world_size()).abs().max().item()
        limit = bound(source, bits)
        print(f"replay {replay}: max error {error:.3g} (bound {limit:.3g})", flush=True)
        if not error <= limit:
            fail(f"replay {replay}: error {error} above the bound {limit}")
    check_allreduce(same_on_every_rank(1 << 20, device, 7), "eager after the replays")


def abort():
    from qnccl.torch import engine
    device = torch.device("cuda", torch.cuda.current_device())
    dist.all_reduce(torch.ones(4, device=device))
    torch.cuda.synchronize()
    address = engine.communicator()
    print(f"communicator before the abort: {address:#x}", flush=True)
    dist.distributed_c10d._get_default_group()._get_backend(device).abort()
    try:
        address = engine.communicator()
    except engine.CommunicatorEnded as exc:
        print(f"after the abort: {exc}", flush=True)
        return
    fail(f"after the abort the engine path was handed the communicator {address:#x}")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "ddp"
    if mode not in ("ddp", "compile", "graph", "abort"):
        fail(f"unknown mode {mode!r}: ddp, compile, graph or abort")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    # device_id: the communicator is made now, not at the first collective (which, in
    # graph mode, is inside the capture)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, "
          f"{torch.cuda.get_device_name()}, mode {mode}, world {dist.get_world_size()}",
          flush=True)
    if mode == "graph":
        graph()
    elif mode == "abort":
        abort()
        print("OK", flush=True)
        return
    else:
        train(compiled=mode == "compile")
        device = torch.device("cuda", local)
        for seed, dtype in enumerate((torch.float16, torch.bfloat16)):
            check_allreduce(same_on_every_rank(1 << 20, device, seed, dtype), "all_reduce")
    dist.barrier()
    dist.destroy_process_group()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
