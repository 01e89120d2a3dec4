#!/usr/bin/env python3
"""accuracy_bench: what quantized allreduce and all-to-all do to training accuracy
(docs/accuracy.md).

A DLRM-style model learns a synthetic click-through task (perf/accuracy_model.py) with a global
batch split over N emulated data-parallel ranks. Each rank's MLP gradient (its own micro-batch)
goes through qnccl.emulate's EmulatedAllReduce, bit-exact with libqnccl.so; the embedding
gradients are averaged exactly (seeds/000 Table 3: quantized allreduce, full-precision
alltoall). Every configuration is paired with the full-precision run of the same seed (same
init, same data order) and reported as seeds/000 eq. 2: the relative change of the test
accuracy in percent, averaged over seeds; the same for the test log-loss. One real 4-process
job through the qnccl.torch DDP hook (perf/accuracy_ddp.py) is compared with plain DDP.
seeds/000 Table 2 beside it: the embeddings' all-to-alls quantized (forward x backward bits,
through qnccl.emulate.alltoall, 8 ranks owning a table each), the allreduce exact.

    .venv/bin/python perf/accuracy_bench.py              # full run, < 30 min on 2 cores
    .venv/bin/python perf/accuracy_bench.py --quick      # < 3 min: the test's run

Writes OUT/results.json (every run with its curve), OUT/table.md and OUT/test_loss.png
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
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOL = "accuracy_bench"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_TORCH = 0, 1, 2, 3
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "perf")]  # qnccl and accuracy_model; workers inherit it

from qnccl.bench import MPI_ENV as BENCH_MPI_ENV, MPI_SHARED_MEMORY_ENV  # noqa: E402
from qnccl.cli import int_in  # noqa: E402  (after the path: the repository's qnccl)

DDP_PROGRAM = REPO / "perf" / "accuracy_ddp.py"
BITS, ALGOS, RANKS = (8, 4, 2), ("ring", "tree", "sra"), (8, 32)
# seeds/000 Table 2's (forward, backward) bits of the embeddings' all-to-alls, at as many ranks
# as the model has tables (each rank owns one: DLRM's model-parallel embeddings).
ALLTOALL_BITS = ((8, 8), (8, 4), (4, 8), (4, 4), (4, 2), (2, 4), (2, 2))
ALLTOALL_RANKS = 8
DDP_RANKS = 4
DDP_CONFIG = {"bits": 4, "algo": "sra", "error_feedback": False}  # the hook job's allreduce

# Open MPI as root, more ranks than cores, no busy waiting, shared memory between the ranks.
MPI_ENV = {**BENCH_MPI_ENV, **MPI_SHARED_MEMORY_ENV, "PYTHONUNBUFFERED": "1"}

# (steps, train samples = steps x batch, test samples, seeds, DDP job time limit in s)
FULL = {"steps": 500, "test": 1 << 18, "seeds": 3, "ddp_timeout": 1200}
QUICK = {"steps": 120, "test": 1 << 14, "seeds": 1, "ddp_timeout": 240}
BATCH = 1024  # global batch, the same for every N: one baseline trajectory per seed
LR = 0.003  # Adam, warm-up then linear decay (accuracy_model.learning_rate)
SGD_LR = 3.0  # --optimizer sgd (seeds/000's optimizer; slower to converge on this task)
EVALS = 10  # points of each test-loss curve
CURVE_SAMPLES = 1 << 16  # the curve's points use the first test samples; the final, all


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


def build_parser():
    p = argparse.ArgumentParser(
        prog=TOOL, description="Training accuracy of a DLRM-style model under quantized "
        "allreduce (emulated N ranks, plus one real 4-process DDP-hook job) against full "
        "precision, as seeds/000 Table 3.",
        epilog="Exit status: 0 done, 1 a run failed, 2 bad options, 3 torch not installed.")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK['steps']} steps, {QUICK['test']} test samples, "
                        f"{QUICK['seeds']} seed (< 3 min; what the test runs)")
    p.add_argument("--out", type=Path, default=REPO / "build" / "accuracy",
                   help="output folder (default build/accuracy)")
    p.add_argument("--seeds", type=int_in(1), default=None,
                   help=f"training seeds 0..K-1 (default {FULL['seeds']}, quick "
                        f"{QUICK['seeds']})")
    p.add_argument("--steps", type=int_in(EVALS), default=None,
                   help=f"optimizer steps (default {FULL['steps']}, quick {QUICK['steps']})")
    p.add_argument("--bits", type=choice_list("bits", BITS), default=BITS,
                   help="codec widths, e.g. 8,4,2 (default all)")
    p.add_argument("--algos", type=choice_list("algo", ALGOS), default=ALGOS,
                   help="allreduce algorithms, e.g. ring,tree,sra (default all)")
    p.add_argument("--ranks", type=choice_list("ranks", (4, 8, 16, 32, 64)), default=RANKS,
                   help="emulated rank counts, from 4,8,16,32,64 (default 8,32)")
    p.add_argument("--alltoall", type=bit_pairs, default=ALLTOALL_BITS, metavar="PAIRS",
                   help="Table 2: forward/backward bits of the embeddings' all-to-alls, e.g. "
                        "8/8,4/2, or none (default: the paper's seven pairs)")
    p.add_argument("--bucket-size", type=int_in(1), default=128,
                   help="values per quantization bucket (default 128)")
    p.add_argument("--rounding", choices=("auto", "nearest", "stochastic"), default="auto",
                   help="the codec's rounding; auto (default): nearest where error feedback "
                        "pays its bias back, stochastic (unbiased) where nothing does "
                        "(docs/accuracy.md)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help=f"adam (lr {LR}, default) or plain sgd (lr {SGD_LR})")
    p.add_argument("--workers", type=int_in(1), default=min(2, os.cpu_count() or 1),
                   help="training processes at once, one torch thread each (default: 2 or "
                        "the core count if smaller)")
    p.add_argument("--skip-ddp", action="store_true", help="leave out the real DDP-hook job")
    return p


def parse_args(argv):
    args = build_parser().parse_args(argv)
    preset = QUICK if args.quick else FULL
    args.seeds = args.seeds or preset["seeds"]
    args.steps = args.steps or preset["steps"]
    args.test = preset["test"]
    args.ddp_timeout = preset["ddp_timeout"]
    return args


# -------------------------------------------------------------------------------------- jobs

def configurations(args):
    """The quantized configurations, in table order (seeds/000 Table 3 rows)."""
    return [{"bits": b, "algo": a, "error_feedback": ef}
            for b in args.bits for a in args.algos for ef in (False, True)]


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
    return f"uint{c['bits']} {c['algo']}" + (" EF" if c["error_feedback"] else "")


def jobs(args):
    """Every training run: per seed the full-batch reference (N=1, exact), per N and seed the
    exact-average baseline and each quantized configuration. Longest first, so that the two
    workers finish together."""
    out = [{"config": None, "nranks": 1, "seed": s} for s in range(args.seeds)]
    for n in args.ranks:
        for s in range(args.seeds):
            out.append({"config": None, "nranks": n, "seed": s})
            out += [{"config": c, "nranks": n, "seed": s} for c in configurations(args)]
    for s in range(args.seeds):  # Table 2, beside its own exact run at its rank count
        if args.alltoall and ALLTOALL_RANKS not in args.ranks:
            out.append({"config": None, "nranks": ALLTOALL_RANKS, "seed": s})
        out += [{"config": c, "nranks": ALLTOALL_RANKS, "seed": s}
                for c in alltoall_configurations(args)]
    return sorted(out, key=lambda j: -job_cost(j))


def job_cost(job):
    """Milliseconds per step on one core, for the ETA: the gradients and the optimizer about
    15, the emulated allreduce about 0.8 per rank for ring, 0.45 for tree and SRA."""
    n, c = job["nranks"], job["config"]
    if c is None:
        return 15.0
    if "alltoall" in c:
        return 20.0
    return 15.0 + n * (0.8 if c["algo"] == "ring" else 0.45)


# -------------------------------------------------------------------------- training (worker)

_DATA = {}  # per worker process: the teacher's train and test sets


def init_worker(steps, test_size):
    import torch
    import accuracy_model as am
    torch.set_num_threads(1)
    teacher = am.Teacher(am.Shape())
    _DATA["train"] = am.make_data(teacher, steps * BATCH, stream=1)
    _DATA["test"] = am.make_data(teacher, test_size, stream=2)


def train(job, settings):
    """One training run; returns its record (final test loss/accuracy, curve, wall time)."""
    import numpy as np
    import torch
    import accuracy_model as am
    from qnccl.emulate.training import EmulatedAllReduce

    start = time.perf_counter()
    train_set, test_set = _DATA["train"], _DATA["test"]
    curve_set = am.Dataset(*(t[:CURVE_SAMPLES] for t in (
        test_set.dense, test_set.cats, test_set.labels, test_set.click_prob)))
    torch.manual_seed(job["seed"])
    model = am.DLRM(am.Shape())
    steps, lr = settings["steps"], SGD_LR if settings["optimizer"] == "sgd" else LR
    optimizer = (torch.optim.SGD if settings["optimizer"] == "sgd" else torch.optim.Adam)(
        model.parameters(), lr=lr)
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(job["seed"]))
    c, n = job["config"], job["nranks"]
    allreduce = alltoall = None
    if c is not None and "alltoall" in c:
        alltoall = EmbeddingAlltoall(n, *c["alltoall"], bucket_size=settings["bucket_size"],
                                     rounding=rounding_of(c, settings), seed=job["seed"])
    elif c is not None:
        # the training seed also seeds stochastic rounding, as a job's QNCCL_SEED would
        allreduce = EmulatedAllReduce(n, algo=c["algo"], bits=c["bits"],
                                      bucket_size=settings["bucket_size"],
                                      rounding=rounding_of(c, settings),
                                      seed=job["seed"],
                                      error_feedback=c["error_feedback"])
    eval_at = set(np.linspace(0, steps, EVALS + 1).round().astype(int).tolist())
    curve, grad_error = [], 0.0
    for step in range(steps + 1):
        if step in eval_at:
            loss, acc = am.evaluate(model, curve_set)
            curve.append([step, loss, acc])
        if step == steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = am.learning_rate(step, steps, lr)
        optimizer.zero_grad(set_to_none=True)
        grads = am.rank_gradients(model, *train_set.take(order[step * BATCH:(step + 1) * BATCH]),
                                  n, alltoall)
        exact = grads.sum(0) / n  # float32 sum in rank order, / N
        mean = exact
        if allreduce is not None:
            mean = torch.from_numpy(allreduce(grads.numpy(), key="mlp"))
            grad_error += float((mean - exact).norm() / exact.norm())
        am.set_head_grads(model, mean)
        optimizer.step()
    loss, acc = am.evaluate(model, test_set)
    rounding = None if c is None else rounding_of(c, settings)
    return {**job, "name": config_name(c), "rounding": rounding, "test_loss": loss,
            "test_acc": acc, "curve": curve,
            "grad_rel_error": grad_error / steps, "wall_s": time.perf_counter() - start}


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
    return f"{config_name(job['config'])}, N={job['nranks']}, seed {job['seed']}"


def run_emulated(args):
    """Runs every job on `args.workers` processes, printing a line per finished run."""
    todo = jobs(args)
    total_cost, done_cost = sum(map(job_cost, todo)), 0.0
    print(f"{TOOL}: {len(todo)} training runs ({args.steps} steps of {BATCH} samples, "
          f"{args.test} test samples) on {args.workers} worker(s)", flush=True)
    start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # no forked torch thread pools
    records = []
    with ctx.Pool(args.workers, initializer=init_worker,
                  initargs=(args.steps, args.test)) as pool:
        settings = {"steps": args.steps, "bucket_size": args.bucket_size,
                    "rounding": args.rounding, "optimizer": args.optimizer}
        payloads = [(j, settings) for j in todo]
        for i, rec in enumerate(pool.imap_unordered(train_job, payloads), 1):
            if "error" in rec:
                pool.terminate()
                raise RuntimeError(f"run {describe(rec)} failed: {rec['error']}")
            records.append(rec)
            done_cost += job_cost(rec)
            elapsed = time.perf_counter() - start
            eta = elapsed / done_cost * (total_cost - done_cost)
            print(f"[{i:3d}/{len(todo)}] {describe(rec):28s} test acc {rec['test_acc']:.5f} "
                  f"loss {rec['test_loss']:.5f}  {rec['wall_s']:5.1f} s | elapsed "
                  f"{fmt_time(elapsed)}, ETA {fmt_time(eta)}", flush=True)
    return records


# ------------------------------------------------------------------------------ DDP job

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
               "--out", str(result), "--steps", str(args.steps), "--test", str(args.test),
               "--bucket-size", str(args.bucket_size),
               "--rounding", rounding_of(DDP_CONFIG, vars(args)),
               "--optimizer", args.optimizer]
        env = dict(os.environ, **MPI_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        print(f"{TOOL}: DDP job: {DDP_RANKS} gloo processes, plain allreduce vs the 4-bit SRA "
              f"hook ({args.steps} steps; limit {args.ddp_timeout} s)", flush=True)
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


def summarize(records, args):
    """Per (configuration, N): δ accuracy and δ log-loss (relative %, vs the same seed's
    exact-average run) averaged over seeds, with min and max, and the mean relative error
    |quantized - exact| / |exact| of the averaged MLP gradient over the run's steps. The fp32
    row compares the exact N-rank average with the full-batch gradient: only summation order
    differs, so it is the noise floor of a paired comparison."""
    by_key = {(r["name"], r["nranks"], r["seed"]): r for r in records}
    rows = []
    for c in [None, *configurations(args)]:
        name = config_name(c)
        for n in args.ranks:
            base_n = 1 if c is None else n
            pairs = [(by_key[(name, n, s)], by_key[("fp32", base_n, s)])
                     for s in range(args.seeds)]
            acc = [delta(q["test_acc"], b["test_acc"]) for q, b in pairs]
            loss = [delta(q["test_loss"], b["test_loss"]) for q, b in pairs]
            grad = [q["grad_rel_error"] for q, _ in pairs]
            rows.append({"name": name, "config": c, "nranks": n, "d_acc": stats(acc),
                         "d_loss": stats(loss), "grad_rel_error": sum(grad) / len(grad)})
    for c in alltoall_configurations(args):  # Table 2: vs the exact run at its rank count
        pairs = [(by_key[(config_name(c), ALLTOALL_RANKS, s)],
                  by_key[("fp32", ALLTOALL_RANKS, s)]) for s in range(args.seeds)]
        rows.append({"name": config_name(c), "config": c, "nranks": ALLTOALL_RANKS,
                     "d_acc": stats([delta(q["test_acc"], b["test_acc"]) for q, b in pairs]),
                     "d_loss": stats([delta(q["test_loss"], b["test_loss"]) for q, b in pairs]),
                     "grad_rel_error": None})
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


def markdown_table(rows, args):
    head = ([f"δ acc N={n}" for n in args.ranks] + [f"δ log-loss N={n}" for n in args.ranks]
            + [f"grad. error N={n}" for n in args.ranks])
    lines = ["| allreduce | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for name in dict.fromkeys(r["name"] for r in rows if r["grad_rel_error"] is not None):
        mine = {r["nranks"]: r for r in rows if r["name"] == name}
        label = "fp32 exact (vs full batch)" if name == "fp32" else name
        cells = ([cell(mine[n]["d_acc"], args.seeds) for n in args.ranks]
                 + [cell(mine[n]["d_loss"], args.seeds) for n in args.ranks]
                 + [f"{mine[n]['grad_rel_error']:.4f}" for n in args.ranks])
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_table2(rows, args):
    """seeds/000 Table 2: quantized all-to-all of the embeddings, full-precision allreduce."""
    lines = [f"| all-to-all forward | backward | δ acc N={ALLTOALL_RANKS} | "
             f"δ log-loss N={ALLTOALL_RANKS} |", "|---|---|---|---|"]
    for r in rows:
        if r["grad_rel_error"] is None:
            fwd, bwd = r["config"]["alltoall"]
            lines.append(f"| uint{fwd} | uint{bwd} | {cell(r['d_acc'], args.seeds)} | "
                         f"{cell(r['d_loss'], args.seeds)} |")
    return "\n".join(lines)


def ddp_lines(ddp):
    base, hook = ddp["runs"]["plain"], ddp["runs"]["sra4"]
    return [f"| DDP hook: uint4 SRA, {DDP_RANKS} gloo processes, seed 0 | "
            f"{delta(hook['test_acc'], base['test_acc']):+.4f} | "
            f"{delta(hook['test_loss'], base['test_loss']):+.4f} | "
            f"{'yes' if ddp['in_sync'] else 'NO'} |"]


def baseline_line(records, facts):
    base = [r for r in records if r["config"] is None and r["nranks"] > 1]
    acc = sum(r["test_acc"] for r in base) / len(base)
    loss = sum(r["test_loss"] for r in base) / len(base)
    # convergence: how much the curve's test loss still fell over its last interval
    last = sum(delta(r["curve"][-1][1], r["curve"][-2][1]) for r in base) / len(base)
    bayes_acc, bayes_loss, majority, entropy = facts
    return (f"full precision: test accuracy {acc:.5f}, log-loss {loss:.5f} (mean of "
            f"{len(base)} runs; the test loss changed {last:+.3f}% over the last "
            f"{100 // EVALS}% of the steps); teacher (Bayes): {bayes_acc:.5f} / "
            f"{bayes_loss:.5f}; majority class {majority:.5f} / label entropy {entropy:.5f}")


def data_facts(args):
    """Bayes accuracy/log-loss, majority-class rate and label entropy of the test set."""
    import accuracy_model as am
    teacher = am.Teacher(am.Shape())
    test = am.make_data(teacher, args.test, stream=2)
    clicks = float(test.labels.mean())
    entropy = -(clicks * math.log(clicks) + (1 - clicks) * math.log(1 - clicks))
    return (*am.bayes(test), max(clicks, 1 - clicks), entropy)


def plot(records, args, path):
    """One subplot per configuration: mean test-loss curve per N against its baseline."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
                steps, loss = mean_curve(records, name, n)
                ax.plot(steps, loss, style, color=colors[n], linewidth=1.2,
                        label=f"N={n}" + (" fp32" if name == "fp32" else ""))
        base = [mean_curve(records, "fp32", n)[1] for n in args.ranks]
        low = min(min(b) for b in base)
        top = low + 4 * (base[0][len(base[0]) // 3] - low) + 0.004
        ax.set_ylim(low - 0.002, top)
        off = [f"N={n}: {mean_curve(records, config_name(c), n)[1][-1]:.3f}"
               for n in args.ranks if not mean_curve(records, config_name(c), n)[1][-1] <= top]
        if off:  # a diverged (or NaN) run would otherwise just be missing from the panel
            ax.text(0.5, 0.5, "off scale, final\n" + "\n".join(off), fontsize=7,
                    ha="center", transform=ax.transAxes)
        ax.set_title(config_name(c), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(configs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    for ax in axes[:, 0]:
        ax.set_ylabel("test log-loss", fontsize=8)
    fig.supxlabel("step")
    fig.suptitle(f"{TOOL}: DLRM-style model, global batch {BATCH}, bucket {args.bucket_size}, "
                 f"rounding {args.rounding}, {args.optimizer}; test log-loss on the first "
                 f"{CURVE_SAMPLES} test samples, mean of seeds (solid: quantized, dotted: "
                 f"full precision)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def mean_curve(records, name, n):
    runs = [r["curve"] for r in records if r["name"] == name and r["nranks"] == n]
    steps = [p[0] for p in runs[0]]
    loss = [sum(run[i][1] for run in runs) / len(runs) for i in range(len(steps))]
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
        ddp = None if args.skip_ddp else run_ddp(args)
    except RuntimeError as error:
        print(f"{TOOL}: {error}", file=sys.stderr)
        return EXIT_FAILED
    rows = summarize(records, args)
    facts = data_facts(args)
    table = markdown_table(rows, args)
    text = [f"δ = relative change vs full precision in percent (seeds/000 eq. 2), mean over "
            f"{args.seeds} seed(s)" + (" [min, max]" if args.seeds > 1 else "")
            + "; accuracy: higher is better, log-loss: lower is better. grad. error: mean "
            "over steps of |quantized - exact| / |exact| of the averaged MLP gradient.", "",
            "Quantized allreduce, full-precision all-to-all (seeds/000 Table 3):", "",
            table, ""]
    if args.alltoall:
        text += ["Quantized all-to-all of the embeddings (forward: the looked-up vectors to the "
                 "ranks, backward: their gradients to the tables' owners; "
                 f"{ALLTOALL_RANKS} ranks, one table each), full-precision allreduce "
                 "(seeds/000 Table 2):", "", markdown_table2(rows, args), ""]
    text += [baseline_line(records, facts)]
    if ddp is not None:
        text += ["", "| real DDP job | δ acc | δ log-loss | replicas in sync |",
                 "|---|---|---|---|", *ddp_lines(ddp)]
    wall = time.perf_counter() - start
    text += ["", f"wall time {fmt_time(wall)}, {args.workers} worker(s), "
                 f"{platform.node()}, {datetime.date.today()}"]
    print("\n" + "\n".join(text))
    (args.out / "table.md").write_text("\n".join(text) + "\n")
    report = {"tool": TOOL, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "torch": torch.__version__},
              "settings": {"quick": args.quick, "steps": args.steps, "batch": BATCH,
                           "test_samples": args.test, "seeds": args.seeds,
                           "optimizer": args.optimizer,
                           "lr": SGD_LR if args.optimizer == "sgd" else LR,
                           "bucket_size": args.bucket_size,
                           "rounding": args.rounding, "ranks": list(args.ranks),
                           "alltoall": [list(p) for p in args.alltoall],
                           "workers": args.workers},
              "data": dict(zip(("bayes_acc", "bayes_loss", "majority_rate", "label_entropy"),
                               facts)),
              "delta": "relative percent, (q - base) / base * 100, vs the same seed",
              "summary": rows, "runs": records, "ddp": ddp, "wall_s": wall}
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    plot(records, args, args.out / "test_loss.png")
    print(f"{TOOL}: wrote {args.out / 'results.json'}, {args.out / 'table.md'}, "
          f"{args.out / 'test_loss.png'}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
