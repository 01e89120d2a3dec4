#!/usr/bin/env python3
"""rotation_study: what a randomized Hadamard rotation does to a quantized allreduce's error
on real gradients, at equal wire bytes (docs/rotation.md, "Measured").

Each model of perf/accuracy_bench.py (the DLRM-style one's MLP, the transformer LM) trains
at full precision on N emulated ranks; at a few steps along the way every rank's gradient
is kept. Each configuration then reduces those gradients through qnccl.emulate (bit-exact
with libqnccl.so), and its error is the relative L2 error of the averaged gradient,
|quantized - exact| / |exact|, averaged over the kept steps. A rotation adds no wire bytes
(the signs come from the seed), so every row compares configurations of equal bytes.

Grids: the library rotates onto the uniform grid (a rotated bucket is close to Gaussian);
the study also runs the two other pairings, the cubic grid rotated and the uniform grid
unrotated, so that the table shows what the rotation and the grid each contribute; and the
best block once more with clipped ranges (clip="gaussian", docs/rotation.md "Clipped ranges").

    .venv/bin/python perf/rotation_study.py           # both models, about 5 min
    .venv/bin/python perf/rotation_study.py --quick   # under a minute

Writes OUT/rotation.json and OUT/rotation.md (OUT: --out, default build/rotation). Exit
status: 0 done, 2 bad options, 3 torch is not installed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "perf")]

from accuracy_bench import choice_list, task_class  # noqa: E402
from qnccl.cli import int_in  # noqa: E402
from qnccl.emulate import rotation  # noqa: E402
from qnccl.emulate.allreduce import _Config, auto_algo, run  # noqa: E402

TOOL = "rotation_study"
EXIT_OK, EXIT_USAGE, EXIT_NO_TORCH = 0, 2, 3
MODELS = ("dlrm", "lm")
BITS = (2, 3, 4, 5)
BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096)
BLOCKS = (16, 64, 256, 1024, 4096)
STEPS = {"dlrm": 500, "lm": 400}  # accuracy_bench's full runs
QUICK_STEPS = {"dlrm": 120, "lm": 80}
SNAPSHOTS = 5  # kept steps per model, evenly spread over the run


def parse_args(argv):
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter training, fewer settings")
    p.add_argument("--model", type=choice_list("model", MODELS), default=MODELS)
    p.add_argument("--ranks", type=int_in(2), default=8, help="emulated ranks (default 8)")
    p.add_argument("--algo", choices=("auto", "ring", "tree", "sra"), default="auto",
                   help="the allreduce algorithm (default auto: SRA up to 16 ranks)")
    p.add_argument("--rounding", choices=("nearest", "stochastic"), default="stochastic")
    p.add_argument("--bits", type=choice_list("bits", BITS), default=BITS)
    p.add_argument("--buckets", type=choice_list("buckets", BUCKETS), default=BUCKETS)
    p.add_argument("--blocks", type=choice_list("blocks", BLOCKS), default=BLOCKS)
    p.add_argument("--out", type=Path, default=REPO / "build" / "rotation")
    args = p.parse_args(argv)
    if args.quick:
        args.buckets = tuple(b for b in args.buckets if b in (128, 1024)) or args.buckets[:1]
        args.blocks = tuple(b for b in args.blocks if b in (64, 256)) or args.blocks[:1]
    return args


def snapshots(model, nranks, quick):
    """[N x n float32 per-rank gradients] at SNAPSHOTS steps of a full-precision run."""
    import torch
    import accuracy_model as am
    torch.set_num_threads(1)
    steps = (QUICK_STEPS if quick else STEPS)[model]
    task = task_class(model)(steps, 256)
    torch.manual_seed(0)
    net = task.model()
    optimizer = task.optimizer(net, "adam")
    base_lr = [group["lr"] for group in optimizer.param_groups]
    order = torch.randperm(len(task), generator=torch.Generator().manual_seed(0))
    keep = set(np.linspace(0, steps - 1, SNAPSHOTS).round().astype(int).tolist())
    kept = []
    for step in range(steps):
        for group, lr in zip(optimizer.param_groups, base_lr):
            group["lr"] = am.learning_rate(step, steps, lr)
        optimizer.zero_grad(set_to_none=True)
        grads = task.gradients(net, order[step * task.BATCH:(step + 1) * task.BATCH], nranks)
        if step in keep:
            kept.append(grads.numpy().astype(np.float32))
        task.set_grads(net, grads.sum(0) / nranks)
        optimizer.step()
    return kept


def error(grads, algo, bits, bucket, rounding, grid, block, clip="none"):
    """Mean over the kept steps of the averaged gradient's relative L2 error (clip: the
    rotated buckets' ranges, docs/rotation.md "Clipped ranges")."""
    out = []
    for call, x in enumerate(grads):
        nranks, count = x.shape
        name = auto_algo(count, "float32", nranks) if algo == "auto" else algo
        cfg = _Config(nranks, bits, bucket, rounding, 7, call, True, False,
                      rotation_block=block, cubic=grid == "cubic",
                      clip=clip)
        y = run(x, name, cfg, 0)[0].astype(np.float64)
        exact = x.astype(np.float64).mean(axis=0)
        out.append(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    return float(np.mean(out))


def study(args, model, grads):
    rows = []
    for bits in args.bits:
        for bucket in args.buckets:
            def err(grid, block):
                return error(grads, args.algo, bits, bucket, args.rounding, grid, block)
            row = {"bits": bits, "bucket": bucket, "wire_bits": bits + 64 / bucket,
                   "cubic": err("cubic", 0), "uniform": err("uniform", 0),
                   "rotated": {b: err("uniform", b) for b in args.blocks},
                   "rotated_cubic": {b: err("cubic", b) for b in args.blocks}}
            best = min(row["rotated"], key=row["rotated"].get)
            row["best_block"] = best
            row["reduction"] = 1 - row["rotated"][best] / row["cubic"]
            row["clipped"] = error(grads, args.algo, bits, bucket, args.rounding, "uniform", best,
                                   "gaussian")
            row["clipped_reduction"] = 1 - row["clipped"] / row["cubic"]
            rows.append(row)
            print(f"{model} {bits} bits, bucket {bucket:4d}: cubic {row['cubic']:.4f}, "
                  f"rotated (block {best}) {row['rotated'][best]:.4f}, "
                  f"{-100 * row['reduction']:+.0f}%, clipped {row['clipped']:.4f}, "
                  f"{-100 * row['clipped_reduction']:+.0f}%", flush=True)
    return rows


def markdown(model, rows, args):
    blocks = " | ".join(f"rot. {b}" for b in args.blocks)
    head = (f"| bits | bucket | wire bits/value | cubic (today) | uniform | {blocks} | "
            "best rotated vs today | rot. cubic, best | best block clipped | clipped vs today |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        rot = " | ".join(f"{r['rotated'][b]:.4f}" for b in args.blocks)
        best_cubic = min(r["rotated_cubic"].values())
        lines.append(f"| {r['bits']} | {r['bucket']} | {r['wire_bits']:.3f} | {r['cubic']:.4f} "
                     f"| {r['uniform']:.4f} | {rot} | {-100 * r['reduction']:+.0f}% "
                     f"(block {r['best_block']}) | {best_cubic:.4f} | {r['clipped']:.4f} "
                     f"| {-100 * r['clipped_reduction']:+.0f}% |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError as e:
        print(f"{TOOL}: torch is not installed ({e}): pip install torch", file=sys.stderr)
        return EXIT_NO_TORCH
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"{TOOL}: cannot create --out {args.out}: {e}", file=sys.stderr)
        return EXIT_USAGE
    start = time.perf_counter()
    results, text = {}, []
    for model in args.model:
        grads = snapshots(model, args.ranks, args.quick)
        print(f"{TOOL}: {model}: {grads[0].shape[1]} values per rank, {len(grads)} kept steps, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        results[model] = study(args, model, grads)
        text += [f"{model}: relative L2 error of the averaged gradient, {args.ranks} ranks, "
                 f"{args.algo}, {args.rounding} rounding, mean of {len(grads)} steps of a "
                 f"full-precision run (rot. B: rotated in blocks of B onto the uniform grid)",
                 "", markdown(model, results[model], args), ""]
    wall = time.perf_counter() - start
    text.append(f"{TOOL}, {datetime.date.today()}, {platform.node()}, {wall:.0f} s")
    print("\n" + "\n".join(text))
    (args.out / "rotation.md").write_text("\n".join(text) + "\n")
    report = {"tool": TOOL, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "torch": torch.__version__, "settings": {
                  k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "rotation_stream": rotation.ROTATION_STREAM, "results": results, "wall_s": wall}
    (args.out / "rotation.json").write_text(json.dumps(report, indent=1))
    print(f"{TOOL}: wrote {args.out / 'rotation.md'}, {args.out / 'rotation.json'}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
