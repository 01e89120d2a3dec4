#!/usr/bin/env python3
"""torch_ddp_bench: the same DDP training job under each communication hook, side by side.

An MLP of about 8M parameters (4 x Linear(1408, 1408)) trains on a synthetic regression task
with DistributedDataParallel on N gloo processes inside perf/netlab (a loopback `tc` limits to
--rate, MPI launches the ranks, gloo talks TCP): with no hook, with PyTorch's own
fp16_compress_hook, bf16_compress_hook and PowerSGD (rank 2, error feedback, after 2 plain
steps, its buckets one at a time), and with qnccl.torch's SRA hook (bucket 128) at 8 and 4
bits, at 3 and 2 bits rotated in blocks of 256 (docs/rotation.md), and at 2 bits rotated with
clipped ranges ("Clipped ranges" there). Every job starts from the same weights and sees the
same data; it prints seconds per step (the median over the timed steps of the slowest rank's
step) and the final training loss (the mean over the last 5 steps).

    .venv/bin/python perf/torch_ddp_bench.py                    # 4 ranks, 1 Gbit/s, ~4 min
    .venv/bin/python perf/torch_ddp_bench.py --steps 30         # docs/torch-hook.md's table, ~8 min
    .venv/bin/python perf/torch_ddp_bench.py --rate 10gbit --steps 20

Writes OUT/ddp_hooks.json and OUT/ddp_hooks.md (OUT: --out, default build/bench). Exit status:
0 done, 1 a job failed (its row says why; the others still run), 2 bad options, 3 torch is
not installed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from qnccl.bench.jobs import MPI_ENV  # noqa: E402
from gloo_ranks import rendezvous_port  # noqa: E402  (this file's folder)

# qnccl.torch's hook settings (bucket 128): "r", rotated in blocks of 256 (docs/rotation.md)
QNCCL_HOOKS = {"qnccl8": {"bits": 8}, "qnccl4": {"bits": 4},
               "qnccl3r": {"bits": 3, "rotation": "hadamard", "rotation_block": 256},
               "qnccl2r": {"bits": 2, "rotation": "hadamard", "rotation_block": 256},
               "qnccl2rc": {"bits": 2, "rotation": "hadamard", "rotation_block": 256,
                            "clip": "gaussian"}}
HOOKS = ("none", "fp16", "bf16", "powersgd", *QNCCL_HOOKS)
NAMES = {"none": "DDP, no hook", "fp16": "PyTorch fp16_compress_hook",
         "bf16": "PyTorch bf16_compress_hook", "powersgd": "PyTorch PowerSGD, rank 2 (buckets one at a time)",
         "qnccl8": "qnccl.torch sra_hook, 8 bits", "qnccl4": "qnccl.torch sra_hook, 4 bits",
         "qnccl3r": "qnccl.torch sra_hook, 3 bits, rotated",
         "qnccl2r": "qnccl.torch sra_hook, 2 bits, rotated",
         "qnccl2rc": "qnccl.torch sra_hook, 2 bits, rotated, clipped"}
WIDTH, LAYERS, BATCH = 1408, 4, 64  # about 8M parameters; per-rank batch
LR = 0.02
LAST = 5  # steps the final loss is averaged over


def model():
    """The MLP, He-initialized (with PyTorch's default initialization a 4-layer ReLU stack
    this wide passes almost no signal, and the loss would not move in a benchmark's steps)."""
    import torch
    torch.manual_seed(0)
    layers = []
    for i in range(LAYERS):
        linear = torch.nn.Linear(WIDTH, WIDTH)
        torch.nn.init.kaiming_normal_(linear.weight,
                                      nonlinearity="relu" if i < LAYERS - 1 else "linear")
        torch.nn.init.zeros_(linear.bias)
        layers.append(linear)
        if i < LAYERS - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def one_bucket_at_a_time(hook):
    """`hook`, starting a bucket only once the previous bucket's future is done. PowerSGD
    issues its second and third all_reduce from the callbacks of the first one's future;
    on gloo those run on the process group's threads, so with two buckets in flight the
    ranks can issue their collectives in different orders, which gloo aborts on ("Received
    data size doesn't match expected size", measured on 4 ranks). Waiting keeps every
    rank's order that of the buckets, at the cost of PowerSGD's overlap between buckets."""
    previous = []

    def serialized(state, bucket):
        if previous:
            previous.pop().wait()
        future = hook(state, bucket)
        previous.append(future)
        return future
    return serialized


def rank_job(args):
    """One rank of one job: DDP under args.hook; rank 0 writes the JSON."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    import qnccl.torch
    import gloo_ranks
    rank, size = gloo_ranks.init()
    net = model()
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_cap_mb)
    if args.hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.hook == "bf16":
        try:  # PyTorch allows it on NCCL (CUDA 11+, NCCL 2.10+) and XCCL only
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        except (TypeError, RuntimeError) as error:
            if rank == 0:
                Path(args.json).write_text(json.dumps({"hook": args.hook,
                                                       "unavailable": str(error)}))
            gloo_ranks.finish()
    elif args.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, one_bucket_at_a_time(powerSGD_hook.powerSGD_hook))
    elif args.hook in QNCCL_HOOKS:
        state = qnccl.torch.QuantizedHookState(net, bucket_size=128, **QNCCL_HOOKS[args.hook])
        ddp.register_comm_hook(state, qnccl.torch.sra_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    teacher = torch.Generator().manual_seed(7)
    target = torch.randn(WIDTH, WIDTH, generator=teacher) / WIDTH ** 0.5
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(BATCH, WIDTH, generator=g)
        y = torch.tanh(x @ target)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step of the slowest rank
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(float(mean_loss) / size)
        if step >= args.warmup:
            times.append(float(elapsed))
    if rank == 0:
        Path(args.json).write_text(json.dumps({"hook": args.hook, "ranks": size,
                                               "step_s": times, "loss": losses}))
    dist.barrier()
    gloo_ranks.finish()


def run_job(hook, args, out):
    path = out / "runs" / f"ddp_{hook}.json"
    path.unlink(missing_ok=True)
    cmd = [str(REPO / "perf" / "netlab"), "--rate", args.rate, "--", shutil.which("mpirun"),
           "-np", str(args.ranks), sys.executable, __file__, "--rank-job", "--hook", hook,
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--bucket-cap-mb", str(args.bucket_cap_mb), "--json", str(path)]
    env = dict(os.environ, **MPI_ENV, MASTER_PORT=str(rendezvous_port()))
    env = {k: v for k, v in env.items() if not k.startswith("QNCCL_")}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                            start_new_session=True)
    if result.returncode != 0 or not path.is_file():
        raise RuntimeError(f"{NAMES[hook]}: exit {result.returncode}\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")
    return json.loads(path.read_text())


def table(runs, args):
    base = statistics.median(runs["none"]["step_s"])
    fp16 = statistics.median(runs["fp16"]["step_s"]) if "step_s" in runs.get("fp16", {}) \
        else None
    lines = [f"DDP of a {WIDTH}x{WIDTH}x{LAYERS} MLP ({sum_params() / 1e6:.1f}M parameters), "
             f"{args.ranks} gloo ranks, batch {BATCH} per rank, DDP buckets of "
             f"{args.bucket_cap_mb:g} MB, {args.rate} (perf/netlab); "
             f"median of {args.steps} steps (the slowest rank's); final loss: the mean "
             f"training loss of steps {args.warmup + args.steps - LAST + 1}.."
             f"{args.warmup + args.steps}", "",
             "| hook | s/step | speedup vs no hook | vs fp16 hook | final loss | loss vs no hook |",
             "|---|---|---|---|---|---|"]
    base_loss = final_loss(runs["none"])
    for hook, run in runs.items():
        if "unavailable" in run or "failed" in run:
            why = (f"not on this backend: {run['unavailable']}" if "unavailable" in run
                   else f"failed: {run['failed']}")
            lines.append(f"| {NAMES[hook]} | {why} | | | | |")
            continue
        t = statistics.median(run["step_s"])
        loss = final_loss(run)
        lines.append(f"| {NAMES[hook]} | {t:.3f} | {base / t:.2f}x | "
                     f"{f'{fp16 / t:.2f}x' if fp16 else '-'} | {loss:.5f} | "
                     f"{(loss - base_loss) / base_loss * 100:+.2f}% |")
    return "\n".join(lines)


def final_loss(run):
    """The mean loss over the last LAST steps (one step's batch alone is noisy)."""
    return statistics.fmean(run["loss"][-LAST:])


def sum_params():
    return LAYERS * (WIDTH * WIDTH + WIDTH)


def main(argv=None):
    p = argparse.ArgumentParser(prog="torch_ddp_bench", description=__doc__.split("\n")[0])
    p.add_argument("--rate", default="1gbit", help="link rate for perf/netlab (default 1gbit)")
    p.add_argument("--ranks", type=int, default=4, help="gloo processes (default 4)")
    p.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps (default 3)")
    p.add_argument("--bucket-cap-mb", type=float, default=8,
                   help="DDP's bucket_cap_mb, the same for every hook (default 8: a bucket "
                        "per layer, so that communication overlaps the backward pass)")
    p.add_argument("--hooks", default=",".join(HOOKS),
                   help=f"comma list of {', '.join(HOOKS)} (default all)")
    p.add_argument("--out", type=Path, default=REPO / "build" / "bench")
    p.add_argument("--timeout", type=int, default=900, help="seconds per job (default 900)")
    p.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hook", choices=HOOKS, help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_job:
        return rank_job(args)
    hooks = [h.strip() for h in args.hooks.split(",") if h.strip()]
    if "none" not in hooks or any(h not in HOOKS for h in hooks):
        p.error(f"--hooks: a comma list of {', '.join(HOOKS)} that includes none")
    if args.ranks < 2 or args.steps < 1 or args.warmup < 0:
        p.error("--ranks must be >= 2, --steps >= 1, --warmup >= 0")
    try:
        import torch
    except ImportError as error:
        print(f"torch_ddp_bench: torch is not installed ({error}): pip install torch",
              file=sys.stderr)
        return 3
    print(f"torch_ddp_bench: torch {torch.__version__}, {len(hooks)} jobs of {args.ranks} "
          f"ranks on {args.rate}", flush=True)
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    runs = {}
    for i, hook in enumerate(hooks, 1):
        print(f"[{i}/{len(hooks)}] {NAMES[hook]}", flush=True)
        try:
            runs[hook] = run_job(hook, args, args.out)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"torch_ddp_bench: {error}", file=sys.stderr)
            if hook == "none":
                return 1  # the baseline of every row
            runs[hook] = {"hook": hook, "failed": str(error).splitlines()[0]}
            continue
        run = runs[hook]
        print(f"      unavailable: {run['unavailable']}" if "unavailable" in run else
              f"      {statistics.median(run['step_s']):.3f} s/step, final loss "
              f"{final_loss(run):.5f}", flush=True)
    text = table(runs, args)
    print("\n" + text)
    (args.out / "ddp_hooks.md").write_text(text + "\n")
    (args.out / "ddp_hooks.json").write_text(json.dumps(
        {"rate": args.rate, "ranks": args.ranks, "steps": args.steps, "warmup": args.warmup,
         "runs": runs, "table": text}, indent=1))
    print(f"wrote {args.out / 'ddp_hooks.md'}, {args.out / 'ddp_hooks.json'}")
    return 1 if any("failed" in run for run in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
