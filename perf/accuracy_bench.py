#!/usr/bin/env python3
"""accuracy_bench: what quantized allreduce and all-to-all do to training accuracy
(docs/accuracy.md).

Two models learn synthetic tasks with a global batch split over N emulated data-parallel
ranks: a DLRM-style click-through model (perf/accuracy_model.py; Adam, or the paper's SGD)
and a decoder-only transformer language model on a Markov corpus (perf/accuracy_lm.py;
AdamW). Each rank's gradient (its own micro-batch; the DLRM's MLP, the whole LM) goes through
qnccl.emulate's EmulatedAllReduce, bit-exact with libqnccl.so; the DLRM's embedding gradients
are averaged exactly (seeds/000 Table 3: quantized allreduce, full-precision alltoall). Every
configuration is paired with the full-precision run of the same seed (same init, same data
order) and reported as seeds/000 eq. 2: the relative change of each metric in percent
(accuracy and log-loss; validation loss and perplexity), averaged over seeds. One real
4-process job through the qnccl.torch DDP hook (perf/accuracy_ddp.py) is compared with plain
DDP. seeds/000 Table 2 beside it: the embeddings' all-to-alls quantized (forward x backward
bits, through qnccl.emulate.alltoall, 8 ranks owning a table each), the allreduce exact.
--adaptive adds per-layer widths (qnccl.emulate.adaptive) beside uniform ones.

    .venv/bin/python perf/accuracy_bench.py                  # both models, about 50 min
    .venv/bin/python perf/accuracy_bench.py --model dlrm     # the DLRM table, about 13 min
    .venv/bin/python perf/accuracy_bench.py --model lm       # the LM table, about 36 min
    .venv/bin/python perf/accuracy_bench.py --quick          # a few minutes

Writes OUT/results.json (every run with its curve), OUT/table.md and OUT/MODEL_loss.png
(OUT: --out, default build/accuracy). Exit status: 0 done, 1 a run or the DDP job failed,
2 bad options, 3 torch is not installed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOL = "accuracy_bench"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_TORCH = 0, 1, 2, 3
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "perf")]  # qnccl and accuracy_model; workers inherit it

from qnccl.bench.jobs import MPI_ENV as BENCH_MPI_ENV, MPI_SHARED_MEMORY_ENV  # noqa: E402
from qnccl.cli import int_in, size_in  # noqa: E402  (after the path: the repository's qnccl)
from qnccl.emulate import rotation  # noqa: E402
from gloo_ranks import rendezvous_port  # noqa: E402

DDP_PROGRAM = REPO / "perf" / "accuracy_ddp.py"
BITS, ALGOS, RANKS = (8, 4, 2), ("ring", "tree", "sra"), (8, 32)
BIT_CHOICES = (8, 7, 6, 5, 4, 3, 2, 1)  # what --bits takes (BITS: the default)
# seeds/000 Table 2's (forward, backward) bits of the embeddings' all-to-alls, at as many ranks
# as the model has tables (each rank owns one: DLRM's model-parallel embeddings).
ALLTOALL_BITS = ((8, 8), (8, 4), (4, 8), (4, 4), (4, 2), (2, 4), (2, 2))
ALLTOALL_RANKS = 8
DDP_RANKS = 4
DDP_CONFIG = {"bits": 4, "algo": "sra", "error_feedback": False}  # the hook job's allreduce

# Open MPI as root, more ranks than cores, no busy waiting, shared memory between the ranks.
MPI_ENV = {**BENCH_MPI_ENV, **MPI_SHARED_MEMORY_ENV, "PYTHONUNBUFFERED": "1"}

MODELS = ("dlrm", "lm")  # accuracy_model.Task, accuracy_lm.Task
# per model (optimizer steps; test samples, or validation sequences), seeds, DDP time limit in s
FULL = {"dlrm": {"steps": 500, "test": 1 << 18}, "lm": {"steps": 400, "test": 1024},
        "seeds": 3, "ddp_timeout": 1200}
QUICK = {"dlrm": {"steps": 120, "test": 1 << 14}, "lm": {"steps": 80, "test": 256},
         "seeds": 1, "ddp_timeout": 240}
EVALS = 10  # points of each test-loss curve
ADAPTIVE_DECISIONS = 10  # per run, of --adaptive's per-layer widths


# ----------------------------------------------------------------------------------- options

def choice_list(kind, allowed):
    """A comma-separated subset of `allowed` (ints or names), in the given order."""
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        names = [str(a) for a in allowed]
        bad = [t for t in items if t not in names]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"invalid {kind} {text!r}: allowed is a comma-separated list of "
                f"{', '.join(names)}")
        return tuple(allowed[names.index(t)] for t in dict.fromkeys(items))
    return parse


def bit_pairs(text):
    """FWD/BWD bit pairs, comma-separated (each 1..8), or none."""
    if text.strip() == "none":
        return ()
    pairs = []
    for item in (t.strip() for t in text.split(",")):
        fwd, _, bwd = item.partition("/")
        if not (fwd.isdigit() and bwd.isdigit() and 1 <= int(fwd) <= 8 and 1 <= int(bwd) <= 8):
            raise argparse.ArgumentTypeError(
                f"invalid pair {item!r} in {text!r}: allowed is FWD/BWD bits (1..8 each), "
                f"comma-separated, e.g. 8/8,4/2, or none")
        pairs.append((int(fwd), int(bwd)))
    return tuple(dict.fromkeys(pairs))


def rotation_blocks(text):
    """--rotation: a comma-separated list of rotation block sizes, or none."""
    if text == "none":
        return ()
    try:
        blocks = tuple(int(t) for t in text.split(","))
        for b in blocks:
            rotation.check("hadamard", b)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--rotation takes block sizes (powers of two in "
                                         f"[{rotation.MIN_BLOCK}, {rotation.MAX_BLOCK}]) or "
                                         f"none, got {text!r}: {error}") from None
    return blocks


def build_parser():
    p = argparse.ArgumentParser(
        prog=TOOL, description="Training accuracy of a DLRM-style model and a transformer "
        "language model under quantized allreduce (emulated N ranks, plus one real 4-process "
        "DDP-hook job) against full precision, as seeds/000 Table 3.",
        epilog="Exit status: 0 done, 1 a run failed, 2 bad options, 3 torch not installed.")
    p.add_argument("--quick", action="store_true",
                   help=f"DLRM {QUICK['dlrm']['steps']} steps and {QUICK['dlrm']['test']} test "
                        f"samples, LM {QUICK['lm']['steps']} steps and {QUICK['lm']['test']} "
                        f"validation sequences, {QUICK['seeds']} seed")
    p.add_argument("--model", type=choice_list("model", MODELS), default=MODELS,
                   help="dlrm (the DLRM-style model), lm (the transformer language model) or "
                        "dlrm,lm (default)")
    p.add_argument("--out", type=Path, default=REPO / "build" / "accuracy",
                   help="output folder (default build/accuracy)")
    p.add_argument("--seeds", type=int_in(1), default=None,
                   help=f"training seeds 0..K-1 (default {FULL['seeds']}, quick "
                        f"{QUICK['seeds']})")
    p.add_argument("--steps", type=int_in(EVALS), default=None,
                   help=f"optimizer steps of every model (default DLRM {FULL['dlrm']['steps']}, "
                        f"LM {FULL['lm']['steps']})")
    p.add_argument("--bits", type=choice_list("bits", BIT_CHOICES), default=BITS,
                   help="codec widths, e.g. 8,4,3,2 (default 8,4,2)")
    p.add_argument("--algos", type=choice_list("algo", ALGOS), default=ALGOS,
                   help="allreduce algorithms, e.g. ring,tree,sra (default all)")
    p.add_argument("--ranks", type=choice_list("ranks", (4, 8, 16, 32, 64)), default=RANKS,
                   help="emulated rank counts, from 4,8,16,32,64 (default 8,32)")
    p.add_argument("--alltoall", type=bit_pairs, default=ALLTOALL_BITS, metavar="PAIRS",
                   help="Table 2: forward/backward bits of the embeddings' all-to-alls, e.g. "
                        "8/8,4/2, or none (default: the paper's seven pairs)")
    p.add_argument("--bucket-size", type=size_in(1, 2**40), default=128,
                   help="values per quantization bucket (default 128)")
    p.add_argument("--rounding", choices=("auto", "nearest", "stochastic"), default="auto",
                   help="the codec's rounding; auto (default): nearest where error feedback "
                        "pays its bias back, stochastic (unbiased) where nothing does "
                        "(docs/accuracy.md)")
    p.add_argument("--adaptive", action="store_true",
                   help="add per-layer adaptive bits (L-GreCo's knapsack at the bytes of "
                        "uniform bits, qnccl.emulate.adaptive) beside each configuration of "
                        "3..7 bits, re-decided every tenth of the run")
    p.add_argument("--rotation", type=rotation_blocks, default=(), metavar="BLOCKS",
                   help="add rotated twins (randomized Hadamard in blocks of each of BLOCKS "
                        "values, docs/rotation.md) beside every configuration, e.g. 256 or "
                        "64,1024 (default: none)")
    p.add_argument("--clip", action="store_true",
                   help="with --rotation: a twin of each rotated configuration with clipped "
                        "ranges (clip gaussian, docs/rotation.md)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="adam (default; AdamW for the LM) or plain sgd")
    p.add_argument("--workers", type=int_in(1), default=min(2, os.cpu_count() or 1),
                   help="training processes at once, one torch thread each (default: 2 or "
                        "the core count if smaller)")
    p.add_argument("--skip-ddp", action="store_true", help="leave out the real DDP-hook job")
    return p


def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.clip and not args.rotation:
        parser.error("--clip clips rotated configurations' ranges: give --rotation BLOCKS too")
    preset = QUICK if args.quick else FULL
    args.seeds = args.seeds or preset["seeds"]
    args.sizes = {m: {"steps": args.steps or preset[m]["steps"], "test": preset[m]["test"]}
                  for m in args.model}
    args.ddp_timeout = preset["ddp_timeout"]
    return args


# -------------------------------------------------------------------------------------- jobs

def configurations(args):
    """The quantized configurations, in table order (seeds/000 Table 3 rows); with
    --adaptive each one of 3..7 bits is followed by its per-layer adaptive twin (the same
    bytes at most)."""
    out = []
    for b in args.bits:
        for a in args.algos:
            for ef in (False, True):
                out.append({"bits": b, "algo": a, "error_feedback": ef})
                if args.adaptive and 2 < b < 8:
                    out.append({"bits": b, "algo": a, "error_feedback": ef, "adaptive": True})
                for block in args.rotation:
                    out.append({"bits": b, "algo": a, "error_feedback": ef,
                                "rotation_block": block})
                    if args.clip:
                        out.append({"bits": b, "algo": a, "error_feedback": ef,
                                    "rotation_block": block, "clip": "gaussian"})
    return out


def alltoall_configurations(args):
    """Table 2's configurations: the embeddings' all-to-alls quantized, the allreduce exact."""
    return [{"alltoall": list(pair)} for pair in args.alltoall]


def rounding_of(c, settings):
    """The rounding of configuration c: --rounding, or for auto nearest with error feedback
    (which pays nearest's bias back over the next calls; with Adam stochastic rounding's
    variance is what costs accuracy) and stochastic without (unbiased: nothing else
    removes a bias, e.g. in the all-to-alls)."""
    if settings["rounding"] != "auto":
        return settings["rounding"]
    return "nearest" if c.get("error_feedback") else "stochastic"


def config_name(c):
    if c is None:
        return "fp32"
    if "alltoall" in c:
        return "alltoall fwd uint{} bwd uint{}".format(*c["alltoall"])
    return (f"uint{c['bits']} {c['algo']}" + (" EF" if c["error_feedback"] else "")
            + (" adaptive" if c.get("adaptive") else "")
            + (f" rot{c['rotation_block']}" if c.get("rotation_block") else "")
            + (" clip" if c.get("clip", "none") != "none" else ""))


def jobs(args):
    """Every training run: per model and seed the full-batch reference (N=1, exact), per N and
    seed the exact-average baseline and each quantized configuration; for the DLRM model also
    Table 2's all-to-all runs. Longest first, so that the workers finish together."""
    out = []
    for model in args.model:
        out += [{"model": model, "config": None, "nranks": 1, "seed": s}
                for s in range(args.seeds)]
        for n in args.ranks:
            for s in range(args.seeds):
                out.append({"model": model, "config": None, "nranks": n, "seed": s})
                out += [{"model": model, "config": c, "nranks": n, "seed": s}
                        for c in configurations(args)]
    if "dlrm" in args.model:
        for s in range(args.seeds):  # Table 2, beside its own exact run at its rank count
            if args.alltoall and ALLTOALL_RANKS not in args.ranks:
                out.append({"model": "dlrm", "config": None, "nranks": ALLTOALL_RANKS, "seed": s})
            out += [{"model": "dlrm", "config": c, "nranks": ALLTOALL_RANKS, "seed": s}
                    for c in alltoall_configurations(args)]
    return sorted(out, key=lambda j: -job_cost(j, args.sizes))


# milliseconds per step on one core: (gradients and optimizer, allreduce per rank for ring,
# for tree and SRA); the DLRM's all-to-all runs take ALLTOALL_STEP_MS
STEP_MS = {"dlrm": (15.0, 0.8, 0.45), "lm": (25.0, 4.0, 2.5)}
ALLTOALL_STEP_MS = 20.0


def job_cost(job, sizes):
    """Estimated milliseconds of one run on one core, for the order and the ETA."""
    n, c = job["nranks"], job["config"]
    base, ring, other = STEP_MS[job["model"]]
    if c is None:
        per_step = base
    elif "alltoall" in c:
        per_step = ALLTOALL_STEP_MS
    else:
        per_step = base + n * (ring if c["algo"] == "ring" else other)
    return per_step * sizes[job["model"]]["steps"]


# -------------------------------------------------------------------------- training (worker)

_TASKS = {}  # per worker process: each model's task (its data)


def make_task(model, size):
    """The task of `model` with the data for `size` ({"steps", "test"})."""
    return task_class(model)(size["steps"], size["test"])


def init_worker(sizes):
    import torch
    torch.set_num_threads(1)
    for model, size in sizes.items():
        _TASKS[model] = make_task(model, size)


def train(job, settings):
    """One training run; returns its record (final metrics, curve, gradient error, wall time)."""
    import numpy as np
    import torch
    import accuracy_model as am
    from qnccl.emulate.adaptive import AdaptiveBits
    from qnccl.emulate.training import EmulatedAllReduce

    start = time.perf_counter()
    task = _TASKS[job["model"]]
    torch.manual_seed(job["seed"])
    model = task.model()
    steps, batch = settings["sizes"][job["model"]]["steps"], task.BATCH
    optimizer = task.optimizer(model, settings["optimizer"])
    base_lr = [group["lr"] for group in optimizer.param_groups]
    order = torch.randperm(len(task), generator=torch.Generator().manual_seed(job["seed"]))
    c, n = job["config"], job["nranks"]
    allreduce = alltoall = policy = None
    if c is not None and "alltoall" in c:
        alltoall = EmbeddingAlltoall(n, *c["alltoall"], bucket_size=settings["bucket_size"],
                                     rounding=rounding_of(c, settings), seed=job["seed"])
    elif c is not None:
        if c.get("adaptive"):
            policy = AdaptiveBits(task.layers(model), bits=c["bits"],
                                  bucket_size=settings["bucket_size"],
                                  every=max(1, steps // ADAPTIVE_DECISIONS))
        # the training seed also seeds stochastic rounding, as a job's QNCCL_SEED would
        allreduce = EmulatedAllReduce(n, algo=c["algo"], bits=c["bits"],
                                      bucket_size=settings["bucket_size"],
                                      rounding=rounding_of(c, settings),
                                      seed=job["seed"],
                                      error_feedback=c["error_feedback"], adaptive=policy,
                                      rotation="hadamard" if c.get("rotation_block") else "none",
                                      rotation_block=c.get("rotation_block") or 256,
                                      clip=c.get("clip", "none"))
    eval_at = set(np.linspace(0, steps, EVALS + 1).round().astype(int).tolist())
    curve, grad_error, wire = [], 0.0, 0.0
    for step in range(steps + 1):
        if step in eval_at:
            curve.append({"step": step, **task.evaluate(model, curve=True)})
        if step == steps:
            break
        for group, lr in zip(optimizer.param_groups, base_lr):
            group["lr"] = am.learning_rate(step, steps, lr)
        optimizer.zero_grad(set_to_none=True)
        grads = task.gradients(model, order[step * batch:(step + 1) * batch], n, alltoall)
        exact = grads.sum(0) / n  # float32 sum in rank order, / N
        mean = exact
        if allreduce is not None:
            if policy is not None:  # the bytes of this step's widths, per uniform bytes
                wire += policy.wire_bytes() / policy.budget
            mean = torch.from_numpy(allreduce(grads.numpy(), key=task.name))
            grad_error += float((mean - exact).norm() / exact.norm())
        task.set_grads(model, mean)
        optimizer.step()
    rounding = None if c is None else rounding_of(c, settings)
    record = {**job, "name": config_name(c), "rounding": rounding,
              "metrics": task.evaluate(model), "curve": curve,
              "grad_rel_error": grad_error / steps, "wall_s": time.perf_counter() - start}
    if policy is not None:
        record["adaptive"] = {"wire_ratio": wire / steps, "every": policy.every,
                              "decisions": policy.decisions,
                              "assignment": dict(policy.assignment)}
    return record


class EmbeddingAlltoall:
    """The all-to-alls of a model-parallel DLRM's embeddings on N ranks, rank j owning table j
    (so N = the number of tables), quantized as QNCCL quantizes ncclAlltoAll: through
    qnccl.emulate.alltoall, the forward's vectors at `fwd` bits and the backward's gradients at
    `bwd`, one call counter for both (a rank's own chunk stays exact)."""

    def __init__(self, nranks, fwd, bwd, bucket_size, rounding, seed):
        self.n, self.fwd, self.bwd, self.call = nranks, fwd, bwd, 0
        self.codec = dict(bucket_size=bucket_size, rounding=rounding, seed=seed)

    def _exchange(self, inputs, bits):
        from qnccl import emulate
        out = emulate.alltoall([x.reshape(-1).numpy() for x in inputs], bits=bits,
                               call=self.call, **self.codec)
        self.call += 1
        return out

    def forward(self, vectors):
        """vectors: N receivers x micro x tables x dim; owner j sends each rank its chunk."""
        import numpy as np
        import torch
        n, micro, tables, dim = vectors.shape
        assert tables == self.n, f"{tables} tables on {self.n} ranks: one table per rank"
        out = self._exchange(vectors.permute(2, 0, 1, 3).contiguous(), self.fwd)
        # rank k's output: owner j's chunk for it, in owner order
        got = np.stack(out).reshape(n, tables, micro, dim).transpose(0, 2, 1, 3)
        return torch.from_numpy(np.ascontiguousarray(got))

    def backward(self, grads):
        """grads: N senders x micro x tables x dim; rank k sends owner j its chunk."""
        import numpy as np
        import torch
        n, micro, tables, dim = grads.shape
        out = self._exchange(grads.permute(0, 2, 1, 3).contiguous(), self.bwd)
        # owner j's output: rank k's chunk for table j, in sender order
        got = np.stack(out).reshape(tables, n, micro, dim).transpose(1, 2, 0, 3)
        return torch.from_numpy(np.ascontiguousarray(got))


def train_job(payload):
    job, settings = payload
    try:
        return train(job, settings)
    except Exception as error:  # reported by the parent with the job it belongs to
        return {**job, "error": f"{type(error).__name__}: {error}"}


# ------------------------------------------------------------------------------- scheduling

def fmt_time(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def describe(job):
    return f"{job['model']} {config_name(job['config'])}, N={job['nranks']}, seed {job['seed']}"


def run_emulated(args):
    """Runs every job on `args.workers` processes, printing a line per finished run."""
    todo = jobs(args)
    cost = [job_cost(j, args.sizes) for j in todo]
    total_cost, done_cost = sum(cost), 0.0
    sizes = ", ".join(f"{m}: {s['steps']} steps, {s['test']} test" for m, s in args.sizes.items())
    print(f"{TOOL}: {len(todo)} training runs ({sizes}) on {args.workers} worker(s)", flush=True)
    start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # no forked torch thread pools
    records = []
    with ctx.Pool(args.workers, initializer=init_worker, initargs=(args.sizes,)) as pool:
        settings = {"sizes": args.sizes, "bucket_size": args.bucket_size,
                    "rounding": args.rounding, "optimizer": args.optimizer}
        payloads = [(j, settings) for j in todo]
        for i, rec in enumerate(pool.imap_unordered(train_job, payloads), 1):
            if "error" in rec:
                pool.terminate()
                raise RuntimeError(f"run {describe(rec)} failed: {rec['error']}")
            records.append(rec)
            done_cost += job_cost(rec, args.sizes)
            elapsed = time.perf_counter() - start
            eta = elapsed / done_cost * (total_cost - done_cost)
            metrics = " ".join(f"{k} {v:.5f}" for k, v in rec["metrics"].items())
            print(f"[{i:3d}/{len(todo)}] {describe(rec):33s} {metrics}  {rec['wall_s']:5.1f} s | "
                  f"elapsed {fmt_time(elapsed)}, ETA {fmt_time(eta)}", flush=True)
    return records


# ------------------------------------------------------------------------------ DDP job

def run_ddp(args):
    """The real 4-process job (perf/accuracy_ddp.py under mpirun, gloo): plain DDP and the
    4-bit SRA hook, seed 0. Returns its JSON; raises RuntimeError with the job's output."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun not found: install Open MPI (make setup), or pass "
                           "--skip-ddp")
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "ddp.json"
        cmd = [mpirun, "-np", str(DDP_RANKS), sys.executable, str(DDP_PROGRAM),
               "--out", str(result), "--steps", str(args.sizes["dlrm"]["steps"]),
               "--test", str(args.sizes["dlrm"]["test"]),
               "--bucket-size", str(args.bucket_size),
               "--rounding", rounding_of(DDP_CONFIG, vars(args)),
               "--optimizer", args.optimizer]
        env = dict(os.environ, **MPI_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rendezvous_port()))
        print(f"{TOOL}: DDP job: {DDP_RANKS} gloo processes, plain allreduce vs the 4-bit SRA "
              f"hook ({args.sizes['dlrm']['steps']} steps; limit {args.ddp_timeout} s)",
              flush=True)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=args.ddp_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # mpirun and every rank
            out, _ = proc.communicate()
            raise RuntimeError(f"DDP job ran past {args.ddp_timeout} s and was killed. "
                               f"Output:\n{out[-4000:]}") from None
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"DDP job failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                               f"Output:\n{out[-4000:]}")
        ddp = json.loads(result.read_text())
    ddp["wall_s"] = time.perf_counter() - start
    print(f"{TOOL}: DDP job done in {fmt_time(ddp['wall_s'])}", flush=True)
    return ddp


# -------------------------------------------------------------------------------- summary

def delta(value, base):
    """seeds/000 eq. 2 for one seed: relative change in percent."""
    return (value - base) / base * 100


def task_class(model):
    """The Task class of `model` (its metrics, their labels, its title, its batch)."""
    if model == "lm":
        import accuracy_lm
        return accuracy_lm.Task
    import accuracy_model
    return accuracy_model.Task


def metrics_of(model):
    """The metric keys of a model's records, in table order, and their labels."""
    return task_class(model).metrics, task_class(model).labels


def summarize(records, args):
    """Per (model, configuration, N): δ of each metric (relative %, vs the same seed's
    exact-average run) averaged over seeds, with min and max, and the mean relative error
    |quantized - exact| / |exact| of the averaged gradient over the run's steps. The fp32
    row compares the exact N-rank average with the full-batch gradient: only summation order
    differs, so it is the noise floor of a paired comparison."""
    by_key = {(r["model"], r["name"], r["nranks"], r["seed"]): r for r in records}

    def row(model, c, n, base_n, quantized):
        name = config_name(c)
        pairs = [(by_key[(model, name, n, s)], by_key[(model, "fp32", base_n, s)])
                 for s in range(args.seeds)]
        keys, _ = metrics_of(model)
        grad = [q["grad_rel_error"] for q, _ in pairs]
        out = {"model": model, "name": name, "config": c, "nranks": n,
               "d": {k: stats([delta(q["metrics"][k], b["metrics"][k]) for q, b in pairs])
                     for k in keys},
               "grad_rel_error": sum(grad) / len(grad) if quantized else None}
        if c is not None and c.get("adaptive"):
            out["wire_ratio"] = sum(q["adaptive"]["wire_ratio"] for q, _ in pairs) / len(pairs)
        return out

    rows = []
    for model in args.model:
        for c in [None, *configurations(args)]:
            rows += [row(model, c, n, 1 if c is None else n, True) for n in args.ranks]
    if "dlrm" in args.model:  # Table 2: vs the exact run at its rank count
        rows += [row("dlrm", c, ALLTOALL_RANKS, ALLTOALL_RANKS, False)
                 for c in alltoall_configurations(args)]
    return rows


def stats(values):
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values),
            "per_seed": values}


def cell(s, seeds):
    if math.isnan(s["mean"]):
        return "diverged (NaN)"
    if seeds == 1:
        return f"{s['mean']:+.4f}"
    return f"{s['mean']:+.4f} [{s['min']:+.3f}, {s['max']:+.3f}]"


def markdown_table(rows, args, model):
    """One model's allreduce table (seeds/000 Table 3's shape)."""
    keys, labels = metrics_of(model)
    head = ([f"δ {labels[k]} N={n}" for k in keys for n in args.ranks]
            + [f"grad. error N={n}" for n in args.ranks])
    lines = ["| allreduce | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    mine = [r for r in rows if r["model"] == model and r["grad_rel_error"] is not None]
    for name in dict.fromkeys(r["name"] for r in mine):
        by_n = {r["nranks"]: r for r in mine if r["name"] == name}
        label = "fp32 exact (vs full batch)" if name == "fp32" else name
        cells = ([cell(by_n[n]["d"][k], args.seeds) for k in keys for n in args.ranks]
                 + [f"{by_n[n]['grad_rel_error']:.4f}" for n in args.ranks])
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def adaptive_lines(records, rows, model):
    """--adaptive: the bytes the per-layer widths sent per uniform bytes, and the widths of
    one run at its end (where the bits went)."""
    mine = [r for r in rows if r["model"] == model and "wire_ratio" in r]
    if not mine:
        return []
    ratios = [r["wire_ratio"] for r in mine]
    run = next(r for r in records if r["model"] == model and "adaptive" in r
               and r["seed"] == 0 and r["name"] == mine[0]["name"]
               and r["nranks"] == mine[0]["nranks"])
    widths = ", ".join(f"{n} {b}" for n, b in run["adaptive"]["assignment"].items())
    return [f"adaptive: wire bytes per uniform bytes {min(ratios):.4f}..{max(ratios):.4f} "
            f"(mean over steps, first tenth uniform); widths at the end of {run['name']}, "
            f"N={run['nranks']}, seed 0 ({run['adaptive']['decisions']} decisions): {widths}",
            ""]


def markdown_table2(rows, args):
    """seeds/000 Table 2: quantized all-to-all of the embeddings, full-precision allreduce."""
    lines = [f"| all-to-all forward | backward | δ acc N={ALLTOALL_RANKS} | "
             f"δ log-loss N={ALLTOALL_RANKS} |", "|---|---|---|---|"]
    for r in rows:
        if r["config"] is not None and "alltoall" in r["config"]:
            fwd, bwd = r["config"]["alltoall"]
            lines.append(f"| uint{fwd} | uint{bwd} | {cell(r['d']['acc'], args.seeds)} | "
                         f"{cell(r['d']['loss'], args.seeds)} |")
    return "\n".join(lines)


def ddp_lines(ddp):
    base, hook = ddp["runs"]["plain"], ddp["runs"]["sra4"]
    return [f"| DDP hook: uint4 SRA, {DDP_RANKS} gloo processes, seed 0 | "
            f"{delta(hook['test_acc'], base['test_acc']):+.4f} | "
            f"{delta(hook['test_loss'], base['test_loss']):+.4f} | "
            f"{'yes' if ddp['in_sync'] else 'NO'} |"]


def baseline_line(records, model, facts):
    """The full-precision runs' mean metrics, how far they still moved over the last
    interval of their curve, and the data's own bounds (facts of the model's task)."""
    base = [r for r in records if r["model"] == model and r["config"] is None and r["nranks"] > 1]
    keys, labels = metrics_of(model)
    means = ", ".join(f"{labels[k]} {sum(r['metrics'][k] for r in base) / len(base):.5f}"
                      for k in keys)
    last = sum(delta(r["curve"][-1]["loss"], r["curve"][-2]["loss"]) for r in base) / len(base)
    bounds = ", ".join(f"{k} {v:.5f}" for k, v in facts.items())
    return (f"full precision: {means} (mean of {len(base)} runs; the loss changed "
            f"{last:+.3f}% over the last {100 // EVALS}% of the steps); data: {bounds}")


def data_facts(args):
    """Per model, the bounds its data sets on any model (Task.facts), from its test set."""
    return {m: make_task(m, {"steps": 1, "test": args.sizes[m]["test"]}).facts()
            for m in args.model}


def plot(records, args, model, path):
    """One subplot per configuration: mean loss curve per N against its baseline."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in records if r["model"] == model]
    configs = configurations(args)
    cols = min(6, len(configs))
    rows = -(-len(configs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.7 * rows), squeeze=False,
                             sharex=True)
    colors = dict(zip(args.ranks, ("tab:blue", "tab:red", "tab:green", "tab:purple",
                                   "tab:orange")))
    for ax, c in zip(axes.flat, configs):
        for n in args.ranks:
            for name, style in ((config_name(c), "-"), ("fp32", ":")):
                steps, loss = mean_curve(mine, name, n)
                ax.plot(steps, loss, style, color=colors[n], linewidth=1.2,
                        label=f"N={n}" + (" fp32" if name == "fp32" else ""))
        base = [mean_curve(mine, "fp32", n)[1] for n in args.ranks]
        low = min(min(b) for b in base)
        top = low + task_class(model).PLOT_SPAN * (base[0][len(base[0]) // 3] - low) + 0.004
        ax.set_ylim(low - 0.002, top)
        off = [f"N={n}: {mean_curve(mine, config_name(c), n)[1][-1]:.3f}"
               for n in args.ranks if not mean_curve(mine, config_name(c), n)[1][-1] <= top]
        if off:  # a diverged (or NaN) run would otherwise just be missing from the panel
            ax.text(0.5, 0.5, "off scale, final\n" + "\n".join(off), fontsize=7,
                    ha="center", transform=ax.transAxes)
        ax.set_title(config_name(c), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(configs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    _, labels = metrics_of(model)
    for ax in axes[:, 0]:
        ax.set_ylabel(labels["loss"], fontsize=8)
    fig.supxlabel("step")
    fig.suptitle(f"{TOOL}: {task_class(model).title}, bucket {args.bucket_size}, "
                 f"rounding {args.rounding}, "
                 f"{args.optimizer}; {labels['loss']} on the first evaluation samples, mean of "
                 f"seeds (solid: quantized, dotted: full precision)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def mean_curve(records, name, n):
    runs = [r["curve"] for r in records if r["name"] == name and r["nranks"] == n]
    steps = [p["step"] for p in runs[0]]
    loss = [sum(run[i]["loss"] for run in runs) / len(runs) for i in range(len(steps))]
    return steps, loss


# ------------------------------------------------------------------------------------ main

def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch  # noqa: F401
    except ImportError as error:
        print(f"{TOOL}: torch is not installed ({error}): pip install torch", file=sys.stderr)
        return EXIT_NO_TORCH
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"{TOOL}: cannot create --out {args.out}: {error}", file=sys.stderr)
        return EXIT_USAGE
    start = time.perf_counter()
    try:
        records = run_emulated(args)
        ddp = None if args.skip_ddp or "dlrm" not in args.model else run_ddp(args)
    except RuntimeError as error:
        print(f"{TOOL}: {error}", file=sys.stderr)
        return EXIT_FAILED
    rows = summarize(records, args)
    facts = data_facts(args)
    text = [f"δ = relative change vs full precision in percent (seeds/000 eq. 2), mean over "
            f"{args.seeds} seed(s)" + (" [min, max]" if args.seeds > 1 else "")
            + "; accuracy: higher is better; log-loss, validation loss and perplexity: lower "
            "is better. grad. error: mean over steps of |quantized - exact| / |exact| of the "
            "averaged gradient (the DLRM's MLP, the whole LM).", ""]
    ddp_ran = ddp is not None and "dlrm" in args.model
    for model in args.model:
        title = task_class(model).title
        text += [f"{title}: quantized allreduce" + (", full-precision all-to-all (seeds/000 "
                 "Table 3)" if model == "dlrm" else "") + ":", "",
                 markdown_table(rows, args, model), "", *adaptive_lines(records, rows, model)]
        if model == "dlrm" and args.alltoall:
            text += ["Quantized all-to-all of the embeddings (forward: the looked-up vectors "
                     "to the ranks, backward: their gradients to the tables' owners; "
                     f"{ALLTOALL_RANKS} ranks, one table each), full-precision allreduce "
                     "(seeds/000 Table 2):", "", markdown_table2(rows, args), ""]
        text += [f"{title}, " + baseline_line(records, model, facts[model]), ""]
        if model == "dlrm" and ddp_ran:
            text += ["| real DDP job | δ acc | δ log-loss | replicas in sync |",
                     "|---|---|---|---|", *ddp_lines(ddp), ""]
    wall = time.perf_counter() - start
    text += [f"wall time {fmt_time(wall)}, {args.workers} worker(s), "
             f"{platform.node()}, {datetime.date.today()}"]
    print("\n" + "\n".join(text))
    (args.out / "table.md").write_text("\n".join(text) + "\n")
    report = {"tool": TOOL, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "torch": torch.__version__},
              "settings": {"quick": args.quick, "models": list(args.model),
                           "sizes": args.sizes, "seeds": args.seeds,
                           "batch": {m: task_class(m).BATCH for m in args.model},
                           "optimizer": args.optimizer,
                           "lr": {m: task_class(m).LR[args.optimizer] for m in args.model},
                           "bucket_size": args.bucket_size, "adaptive": args.adaptive,
                           "rotation_blocks": list(args.rotation), "clip": args.clip,
                           "rounding": args.rounding, "ranks": list(args.ranks),
                           "alltoall": [list(p) for p in args.alltoall],
                           "workers": args.workers},
              "data": facts,
              "delta": "relative percent, (q - base) / base * 100, vs the same seed",
              "summary": rows, "runs": records, "ddp": ddp, "wall_s": wall}
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    plots = {m: args.out / f"{m}_loss.png" for m in args.model}
    for model, path in plots.items():
        plot(records, args, model, path)
    print(f"{TOOL}: wrote {args.out / 'results.json'}, {args.out / 'table.md'}, "
          + ", ".join(str(p) for p in plots.values()))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
