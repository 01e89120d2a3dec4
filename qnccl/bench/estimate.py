"""The time estimate of a run.

Each configuration's wall time is predicted from what it does (predict_wall: its sizes, the
calls per size, the bytes each call puts on the link at its rate, the codec's work, the job's
start), then scaled by how the finished ones compared with their predictions (seconds_left).
The constants were fitted to 64 MiB runs on a 2-core VM, the shared-memory section's to the
first full `make bench` (tests/bench_walls.json holds these and smaller sweeps: every job's
configuration and wall time; the test replays them). Replayed, the estimate is within 8% of
what was left at every step from the first job on (the small sweeps' one-second jobs: 24%, or
half a second). Another CPU mostly moves the compute terms, which the calibration picks up from
the first jobs of each kind.
"""
import dataclasses
import functools
import importlib.util

from .configs import SETTLE, Config, rate_bps, timed_calls


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

JOB_START_S = 0.3          # perf/netlab's namespace(s), mpirun, MPI_Init, the binary's setup
QNCCL_RUN_START_S = 0.6    # python -m qnccl run on every rank (4 ranks on 2 cores), where
                           # the run did not time it (args.qnccl_run_start_s: run_start)
TORCH_START_S = 6.0        # python and `import torch.distributed` on every rank (4 on 2 cores)
TORCH_SKIP_S = 0.4         # its job without torch: the ranks' python starts, and ends
SIZE_NS_PER_VALUE = 62.0   # per size: every rank's inputs, the check's exact result of its slice
TORCH_SIZE_NS_PER_VALUE = 120.0  # the same in numpy (perf/torch_all_reduce_perf.py; a guess)
# Compute of one call per value reduced, beside the link (4 ranks on 2 cores, flat over TCP):
PLAIN_NS_PER_VALUE = 6.0   # uncompressed: the sums and TCP's copies
CODEC_NS_PER_VALUE = 2.5   # quantized ring: encode, decode-accumulate
CODEC_ALGO_FACTOR = {"sra": 1.27, "tree": 1.1}
ROTATION_NS_PER_VALUE = 1.6  # the rotated rows' Hadamard transforms
# over shared memory nothing else bounds the call: the plain sum's copies per byte, the codec's
# work per value (fitted to the first full run's shared-memory section, 2026-11-29)
SHM_PLAIN_NS_PER_BYTE = 1.5
SHM_CODEC_NS_PER_VALUE = 4.0
TORCH_LINK_EFFICIENCY = 0.85   # gloo reaches this share of the link (docs/benchmark.md)
# Two nodes: the share of N x wire bytes that crosses a node's uplink per algorithm (ring: the
# two crossing hops; SRA: 2 of 3 peers; hier: its shard, a third of SRA's wire, all of it
# crossing), and what the uplinks reach of their rate.
NODE_CROSSING = {"nccl": 0.143, "mpi": 0.22, "ring": 0.25, "tree": 0.25, "rule": 0.25,
                 "sra": 1 / 3, "hier": 0.136}
NODE_EFFICIENCY = 0.73
TRIALS_PER_CANDIDATE = 5   # measured auto's trials per candidate and size (docs/tuning.md)
ETA_PRIOR = 1.0            # the calibration's prior weight, in typical configurations


def sweep(args):
    """The sizes a run measures: --sizes, doubling."""
    sizes, size = [], args.sizes[0]
    while size <= args.sizes[1]:
        sizes.append(size)
        size *= 2
    return sizes


def call_seconds(config, args, size, algo=None, compute=True):
    """One call's predicted time at `size` bytes: the link's share (its wire bytes over the
    rate) and the compute's, combined as sqrt(link^2 + compute^2) (each hides most of the
    other). algo: what runs ('exact': the uncompressed call under QNCCL); compute=False: the
    link's share alone."""
    algo = algo or config.algo
    quantized = config.kind == "qnccl" and algo != "exact"
    ranks = config.ranks or args.ranks
    width = DTYPE_BYTES.get(config.dtype, 4)
    wire = (2 * (ranks - 1) if config.collective == "allreduce" else ranks - 1) / ranks
    if quantized:  # b bits per value and 8 bytes of (min, max) per bucket
        wire *= (config.bits / 8 + 8 / config.bucket_size) / width
    bps = None if config.shared_memory else rate_bps(config.rate)
    link = ranks * wire * size * 8 / bps if bps else 0.0  # every rank's bytes share the link
    if link and config.nodes > 1:
        kind = algo if quantized else "nccl" if config.kind == "qnccl" else config.kind
        link *= NODE_CROSSING.get(kind, 0.25) / NODE_EFFICIENCY
    elif link and config.kind == "torch-gloo":
        link /= TORCH_LINK_EFFICIENCY
    if not compute:
        return link
    if config.shared_memory:
        ns = SHM_CODEC_NS_PER_VALUE if quantized else SHM_PLAIN_NS_PER_BYTE * width
    elif quantized:
        ns = (CODEC_NS_PER_VALUE * CODEC_ALGO_FACTOR.get(algo, 1.0)
              + (ROTATION_NS_PER_VALUE if config.rotation_block else 0.0))
    else:
        ns = PLAIN_NS_PER_VALUE
    return (link ** 2 + (size / width * ns * 1e-9) ** 2) ** 0.5


@functools.lru_cache(maxsize=None)
def torch_installed():
    """Whether the torch gloo baseline will run: its script runs on this interpreter, and
    exits at once without torch (the job is then skipped)."""
    return importlib.util.find_spec("torch") is not None


def predict_wall(config, args):
    """A configuration's predicted wall time in seconds: the job's start, then per size the
    untimed calls (SETTLE; under measured auto first five trials of each candidate), the timed
    ones and the check's call (with --interleave, the plain NCCL's rounds too), and the warm-up
    calls at the largest and the smallest size (Config.argv, perf/perf.cc). The torch gloo
    baseline without torch: its skip (the interpreter's start)."""
    if config.kind == "torch-gloo" and not torch_installed():
        return TORCH_SKIP_S
    run_start = getattr(args, "qnccl_run_start_s", None) or QNCCL_RUN_START_S
    total = (JOB_START_S + (run_start if config.kind == "qnccl" else 0)
             + (TORCH_START_S if config.kind == "torch-gloo" else 0))
    iters = timed_calls(args, config.shared_memory)
    per_value = TORCH_SIZE_NS_PER_VALUE if config.kind == "torch-gloo" else SIZE_NS_PER_VALUE
    sizes = sweep(args)
    for size in sizes:
        if config.kind == "qnccl" and config.algo == "auto":
            exact = call_seconds(config, args, size, "exact")
            tried = [call_seconds(config, args, size, algo)
                     for algo in ("ring", "tree", "sra", "hier")[:3 + (config.nodes > 1)]]
            run = min(exact, *tried)
            trials = TRIALS_PER_CANDIDATE * (len(tried) + 1)
            settle = TRIALS_PER_CANDIDATE * (exact + sum(tried)) + max(0, SETTLE - trials) * run
        else:
            run = call_seconds(config, args, size)
            settle = SETTLE * run
        timed = (iters + 1) * run  # the timed calls and the check's
        if config.interleave:  # rounds of the plain NCCL's calls beside its own, 2 untimed
            plain = call_seconds(config, args, size, "exact")
            timed += ((config.interleave - 1) * iters * run
                      + (config.interleave * iters + 3) * plain)
        total += settle + timed + size / DTYPE_BYTES.get(config.dtype, 4) * per_value * 1e-9
    return total + args.warmup * (call_seconds(config, args, sizes[0])
                                  + call_seconds(config, args, sizes[-1]))


def calibration_keys(config, args):
    """The groups whose measured / predicted ratio scales this configuration's prediction,
    the narrowest first: its section, whether quantized, whether the link or the compute
    bounds its largest call, whether measured auto, its type; then without the type; then
    quantized and bound alone."""
    size = sweep(args)[-1]
    quantized = "qnccl" if config.kind == "qnccl" else "plain"
    bound = ("link" if call_seconds(config, args, size, compute=False)
             >= 0.5 * call_seconds(config, args, size) else "compute")
    section = ("shm" if config.shared_memory else "nodes" if config.nodes > 1 else
               "torch" if config.kind == "torch-gloo" else
               "flat" if config.collective == "allreduce" else "collectives")
    auto = config.algo == "auto"
    return [(section, quantized, bound, auto, config.dtype), (section, quantized, bound, auto),
            (quantized, bound)]


def config_of(record):
    """The Config of a report's record (fields it lacks: their defaults)."""
    return Config(**{f.name: record.get(f.name, f.default) for f in dataclasses.fields(Config)})


def seconds_left(done, todo, args):
    """The estimated seconds the configurations `todo` will take, given the finished records
    `done` (their wall_s): each prediction scaled by measured / predicted of the finished ones,
    narrowest group first (calibration_keys), each group's ratio shrunk towards its wider
    group's by the weight of ETA_PRIOR typical (median) configurations, the widest towards all
    finished ones', that towards 1. A kind of job
    that was skipped (torch gloo without torch) takes what its skip took."""
    sums, skipped, predictions = {}, {}, []
    for record in done:
        if record.get("status") == "skipped":  # torch missing: its other jobs will be skipped too
            skipped[record["kind"]] = record.get("wall_s") or 0.0
        if record.get("status") != "ok" or record.get("wall_s") is None:
            continue  # a failed or skipped job says nothing about the others' speed
        config = config_of(record)
        predicted = predict_wall(config, args)
        predictions.append(predicted)
        for key in [None, *calibration_keys(config, args)]:
            measured0, predicted0 = sums.get(key, (0.0, 0.0))
            sums[key] = (measured0 + record["wall_s"], predicted0 + predicted)

    todo = [(config, predict_wall(config, args)) for config in todo]
    predictions = sorted(predictions + [predicted for _, predicted in todo])
    weight = ETA_PRIOR * (predictions[len(predictions) // 2] if predictions else 1.0)

    def ratio(key, prior):
        measured, predicted = sums.get(key, (0.0, 0.0))
        return (measured + weight * prior) / (predicted + weight)

    overall = ratio(None, 1.0)
    total = 0.0
    for config, predicted in todo:
        if config.kind in skipped:
            total += skipped[config.kind]
            continue
        scale = overall
        for key in reversed(calibration_keys(config, args)):
            scale = ratio(key, scale)
        total += predicted * scale
    return total


def run_start(one, ranks, cpus):
    """What `python -m qnccl run` adds to a quantized job's start: `one` start timed on this
    machine, times the ranks each core starts (they start together, each a Python
    interpreter importing the package). The quantized jobs' start depends on the machine's
    Python more than anything the model holds; a job's size does not tell it."""
    return one * max(1.0, ranks / max(cpus, 1))


def minutes(seconds):
    """'12.3 min', or '45 s' under two minutes."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def time_left(done, todo, args):
    """', about N min left' for the configurations `todo` (seconds_left)."""
    return f", about {minutes(seconds_left(done, todo, args))} left" if todo else ""
