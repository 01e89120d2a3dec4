#!/usr/bin/env python3
"""The real data-parallel job of the accuracy benchmark: the DLRM-style model of
perf/accuracy_model.py trained by 4 gloo processes with DistributedDataParallel, once with
plain DDP allreduce (full precision) and once with qnccl.torch's 4-bit SRA hook, same seed,
same init, same data order (rank r takes the r-th quarter of each global batch).

As in the emulated runs, the embedding tables stay exact (per_layer {"emb": None}: the
full-precision alltoall of seeds/000 Table 3) and every MLP weight matrix is quantized
(min_numel 0); the hook keeps 1-D parameters (biases) exact. After every evaluation the ranks
compare a hash of their parameters. Rank 0 writes the JSON that perf/accuracy_bench.py reads.

    MASTER_PORT=P mpirun -np 4 python perf/accuracy_ddp.py --out FILE --steps S --test T \
        [--bucket-size B] [--rounding nearest|stochastic] [--optimizer adam|sgd]
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "perf"))
import accuracy_model as am  # noqa: E402
import gloo_ranks  # noqa: E402
import qnccl.torch  # noqa: E402
from accuracy_bench import EVALS  # noqa: E402

BATCH, LR = am.Task.BATCH, am.Task.LR  # the emulated runs' batch and learning rates

SEED = 0


def param_hash(model):
    digest = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()


def train(hook, args, data, rank, size):
    """One training run; returns (final test loss, accuracy, curve, replicas in sync)."""
    train_set, test_set = data
    torch.manual_seed(SEED)
    model = am.DLRM(am.Shape())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if hook:
        state = qnccl.torch.QuantizedHookState(model, bits=4, bucket_size=args.bucket_size,
                                               rounding=args.rounding, min_numel=0,
                                               per_layer={"emb": None}, seed=SEED)
        ddp.register_comm_hook(state, qnccl.torch.sra_hook)
    lr = LR[args.optimizer]
    optimizer = (torch.optim.SGD if args.optimizer == "sgd" else torch.optim.Adam)(
        ddp.parameters(), lr=lr)
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(SEED))
    micro = BATCH // size
    eval_at = set(np.linspace(0, args.steps, EVALS + 1).round().astype(int).tolist())
    curve, in_sync = [], True
    for step in range(args.steps + 1):
        if step in eval_at:
            hashes = [None] * size
            dist.all_gather_object(hashes, param_hash(model))
            in_sync &= len(set(hashes)) == 1
            if rank == 0:
                curve.append([step, *am.evaluate(model, test_set)])
        if step == args.steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = am.learning_rate(step, args.steps, lr)
        optimizer.zero_grad(set_to_none=True)
        batch = order[step * BATCH:(step + 1) * BATCH][rank * micro:(rank + 1) * micro]
        dense, cats, labels = train_set.take(batch)
        am.loss_fn(ddp(dense, cats), labels).backward()
        optimizer.step()
    final = am.evaluate(model, test_set) if rank == 0 else (None, None)
    return {"test_loss": final[0], "test_acc": final[1], "curve": curve, "in_sync": in_sync}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--test", type=int, required=True)
    p.add_argument("--bucket-size", type=int, default=128)
    p.add_argument("--rounding", choices=("nearest", "stochastic"), default="nearest")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    args = p.parse_args()
    rank, size = gloo_ranks.init()
    teacher = am.Teacher(am.Shape())
    data = (am.make_data(teacher, args.steps * BATCH, stream=1),
            am.make_data(teacher, args.test, stream=2))
    runs = {name: train(hook, args, data, rank, size)
            for name, hook in (("plain", False), ("sra4", True))}
    if rank == 0:
        result = {"ranks": size, "seed": SEED, "steps": args.steps, "runs": runs,
                  "in_sync": all(r["in_sync"] for r in runs.values())}
        Path(args.out).write_text(json.dumps(result))
    dist.barrier()
    gloo_ranks.finish()


if __name__ == "__main__":
    main()
