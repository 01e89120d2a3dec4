#!/usr/bin/env python3
"""Trains a small model with DDP (gloo, CPU) under several qnccl.torch hook configurations and
writes, per rank, everything tests/test_torch_hook.py checks: per step the local gradients the
hook received, the averaged gradients DDP produced, a hash of the parameters after the step,
the loss, the error-feedback residuals, the SRA call numbers and the exact part reduced with
a plain all_reduce for comparison. A configuration with "engine": true gives the hook an NCCL
communicator of QNCCL's host backend (QNCCL_NCCL_LIB), so that its quantized groups go through
libqnccl's engine, as CUDA buckets do on a GPU. One with "direct": true registers sra_hook
itself, so that buckets overlap, and records no calls; "scale": {parameter: factor}
multiplies parameters after the initialization.

    MASTER_PORT=P mpirun -np 4 python tests/torch_programs/ddp_train.py OUTDIR CONFIGS_JSON
"""
import hashlib
import json
import os
import pickle
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
import gloo_ranks  # noqa: E402
import qnccl._lib  # noqa: E402
import qnccl.torch  # noqa: E402

STEPS = 6


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)   # 2048 weights: quantized
        self.ln = torch.nn.LayerNorm(64)     # 1-D: exact
        self.fc2 = torch.nn.Linear(64, 32)   # 2048 weights: quantized
        self.head = torch.nn.Linear(32, 4)   # 128 weights < min_numel: exact

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.ln(self.fc1(x))))))


def host_communicator(rank, size):
    """An NCCL communicator over the job's ranks, made by the NCCL library libqnccl talks to
    (QNCCL_NCCL_LIB: the host backend); its unique id travels through the gloo group."""
    ffi = qnccl._lib.ffi()
    lib = ffi.dlopen(os.environ["QNCCL_NCCL_LIB"])
    uid = ffi.new("ncclUniqueId*")
    # every rank: the host backend's first call starts MPI, which all ranks must do together
    qnccl._lib.check(lib.ncclGetUniqueId(uid))
    blob = [bytes(ffi.buffer(uid))]
    dist.broadcast_object_list(blob, src=0)
    ffi.memmove(uid, blob[0], len(blob[0]))
    comm = ffi.new("ncclComm_t*")
    qnccl._lib.check(lib.ncclCommInitRank(comm, size, uid[0], rank))
    return comm[0]


def run(config, rank, size):
    torch.manual_seed(1234)
    model = Net()
    with torch.no_grad():  # "scale": {parameter: factor}, e.g. to set layers' gradients apart
        params = dict(model.named_parameters())
        for name, factor in config.get("scale", {}).items():
            params[name].mul_(factor)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    record = {"config": config, "steps": []}
    state = None
    if config["hook"] == "qnccl":
        comm = host_communicator(rank, size) if config.get("engine") else None
        state = qnccl.torch.QuantizedHookState(model, comm=comm, **config["args"])
        calls = []
        pending = []  # the previous bucket's future

        def hook(st, bucket):
            # sra_hook reduces buckets on its worker thread: wait for the previous one, so
            # that the call number recorded here is this bucket's and the reference
            # all_reduce below does not interleave with the worker's collectives
            while pending:
                pending.pop().wait()
            params, grads = bucket.parameters(), bucket.gradients()
            exact, groups = st.bucket_plan(params)
            calls.append({"call": st.calls, "local": {names[id(p)]: g.detach().reshape(-1).numpy().copy()
                                                       for p, g in zip(params, grads)},
                          "exact": [names[id(params[i])] for i in exact],
                          "groups": [(s, [names[id(params[i])] for i in m]) for s, m in groups]})
            future = qnccl.torch.sra_hook(st, bucket)
            pending.append(future)
            return future

        # "direct": sra_hook itself, its worker free to start a bucket while the one before
        # is in flight (the recording hook above waits for each); nothing is recorded
        ddp.register_comm_hook(state, qnccl.torch.sra_hook if config.get("direct") else hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        if state is not None:
            calls = []
        x = torch.randn(16, 32, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        grads = {n: p.grad.detach().reshape(-1).numpy().copy() for n, p in model.named_parameters()}
        opt.step()
        digest = hashlib.sha256()
        for _, p in sorted(model.named_parameters()):
            digest.update(p.detach().numpy().tobytes())
        entry = {"loss": float(loss.detach()), "grads": grads, "hash": digest.hexdigest()}
        if state is not None:
            entry["calls"] = calls
            entry["residuals"] = {k: v.numpy() for k, v in state.state_dict()["residuals"].items()}
            entry["report"] = state.report()
        record["steps"].append(entry)
    return record


def main():
    outdir, configs = sys.argv[1], json.loads(sys.argv[2])
    rank, size = gloo_ranks.init(timeout_s=60)
    records = [run(c, rank, size) for c in configs]
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(records, f)
    dist.barrier()
    gloo_ranks.finish()


if __name__ == "__main__":
    main()
