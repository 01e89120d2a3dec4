"""What `qnccl bench` runs: one Config per MPI job, the sections' lists of them, and the
programs they start (the installed package's copies, or a source tree's: qnccl/_native.py)."""
import dataclasses
import re
import sys


from .. import _native

TORCH_PERF = _native.path("bin/torch_all_reduce_perf.py")


def tool(name):
    """The perf binary `name` (qnccl/_native.py)."""
    return _native.path(f"bin/{name}")


TORCH_MISSING = 3  # exit status of torch_all_reduce_perf.py without torch
GIB = 1 << 30

@dataclasses.dataclass
class Config:
    """One line of the comparison: what runs, and how it is called."""
    name: str
    kind: str  # "nccl" (uncompressed all_reduce_perf), "qnccl", "mpi", "torch-gloo"
    bits: int = None
    bucket_size: int = None
    algo: str = None
    nodes: int = 1  # > 1: emulated nodes (perf/netlab --nodes), the rate between them
    shared_memory: bool = False  # one node, MPI over shared memory, no rate limit
    ranks: int = None  # None: --ranks
    rate: str = "1gbit"  # perf/netlab --rate: of the loopback, or between the nodes
    collective: str = "allreduce"  # the perf binary's (COLLECTIVE_TOOLS), in QNCCL_COLLECTIVES
    dtype: str = "float32"  # of the values reduced (DTYPES)
    interleave: int = 0  # > 0: rounds of the plain NCCL's calls beside QNCCL's in one job
    rotation_block: int = 0  # > 0: rotated buckets in blocks of this many values
    clip: bool = False  # clipped ranges (with a rotation)

    @property
    def slug(self):
        return re.sub(r"[^a-z0-9.]+", "-", f"{self.rate} {self.name}".lower()).strip("-")

    def argv(self, args):
        """The rank command (what mpirun starts) for this configuration."""
        perf_args = ["-b", str(args.sizes[0]), "-e", str(args.sizes[1]), "-f", "2",
                     "-n", str(timed_calls(args, self.shared_memory)), "-w", str(args.warmup),
                     "--settle", str(SETTLE),
                     "-z", "1", "-c", "1",
                     "-d", DTYPES[self.dtype], "-o", "sum", "--placement", "out-of-place"]
        if self.interleave:
            perf_args += ["--interleave", str(self.interleave)]
        if self.kind == "mpi":
            return [str(tool("mpi_all_reduce_perf")), *perf_args]
        if self.kind == "torch-gloo":
            return [sys.executable, str(TORCH_PERF), *perf_args]
        if self.collective != "allreduce":  # their only op and placement is these
            perf_args = [a for a in perf_args if a not in ("-o", "sum")]
        perf = [str(tool(COLLECTIVE_TOOLS[self.collective])), *perf_args]
        if self.kind == "nccl":
            return perf
        policy = ([] if self.collective == "allreduce" else
                  ["--collectives", self.collective, f"--{self.collective}-bits", str(self.bits)])
        rotation = (["--rotation", "hadamard", "--rotation-block", str(self.rotation_block)]
                    if self.rotation_block else [])
        if self.clip:
            rotation += ["--clip", "gaussian"]
        return [sys.executable, "-m", "qnccl", "run", "--bits", str(self.bits),
                "--bucket-size", str(self.bucket_size), "--algo", self.algo,
                "--rounding", args.rounding, *rotation, *policy, "--", *perf]


# The types a flat section reduces (--dtypes), by the perf binaries' -d names, and how a
# configuration's name shows one other than float32.
DTYPES = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}
DTYPE_TAGS = {"float32": "", "bfloat16": " bf16", "float16": " fp16"}


# Untimed calls before each size, in every run alike (baselines too, so that all are as
# warm): what QNCCL's measured auto needs to decide a size, 5 trials of each of at most 5
# candidates and the deciding call (docs/tuning.md).
SETTLE = 26

# The perf binary of each collective.
COLLECTIVE_TOOLS = {"allreduce": "all_reduce_perf", "reducescatter": "reduce_scatter_perf",
                    "allgather": "all_gather_perf", "alltoall": "alltoall_perf"}
# The collectives section: each beside its uncompressed run at these bits (ZeRO++'s:
# 4-bit gradients, 8-bit weights; 8-bit embeddings).
COLLECTIVE_BITS = (("reducescatter", 4), ("allgather", 8), ("alltoall", 8))


def collective_configurations(args, rate):
    """The collectives section: reduce-scatter, allgather and all-to-all at `rate`, each
    uncompressed then quantized (bucket 128; auto's rule, so that every row shows the
    quantized collective: measured auto may choose the exact call)."""
    configs = []
    for name, bits in COLLECTIVE_BITS:
        configs += [Config(f"{name} uncompressed (NCCL API)", "nccl", rate=rate, collective=name),
                    Config(f"{name} qnccl {bits}b B128", "qnccl", bits, 128, "rule", rate=rate,
                           collective=name)]
    return configs


NODES, NODE_RANKS = 2, 4  # the multi-node section: 2 nodes x 2 ranks


SHM_BITS, SHM_BUCKET = 4, 128  # the shared-memory section's codec configuration
# Timed calls per size in the shared-memory section, at least: its calls are short (0.1 ms at
# 64 KiB) and on a machine with fewer cores than ranks one call's time swings by a third.
SHM_MIN_ITERS = 21


# Over shared memory each rank is bound to a core (two to a core when there are more ranks
# than cores): unbound, the scheduler placed 4 ranks on 2 cores differently from job to job,
# and one job's 64 KiB allreduce took 60 us, the next one's 98 us (bound: 57-60 us).
SHM_BINDING = ("--bind-to", "core:overload-allowed")

# Measured auto over shared memory is also timed against the plain NCCL in its own job, in
# this many rounds of alternating order (all_reduce_perf --interleave): separate jobs of the
# same exact call differ by up to a half on this VM, rounds of one job by a few percent.
SHM_ROUNDS = 4


def timed_calls(args, shared_memory):
    """The perf binary's -n: --iters, raised to SHM_MIN_ITERS over shared memory."""
    return max(args.iters, SHM_MIN_ITERS) if shared_memory else args.iters


def shm_configurations(args):
    """The shared-memory section: --ranks ranks on one emulated node, MPI over shared memory
    with no rate limit, the fastest link the uncompressed allreduce gets here; per type of
    --dtypes, its uncompressed run, then QNCCL at 4 bits / bucket 128 with auto (also timed
    against the plain NCCL inside its own job: SHM_ROUNDS) and with each algorithm of
    --algos."""
    configs = []
    for dtype in args.dtypes:
        where = dict(shared_memory=True, rate="none", dtype=dtype)
        tag = DTYPE_TAGS[dtype]
        configs.append(Config(f"shm uncompressed (NCCL API){tag}", "nccl", **where))
        configs += [Config(f"shm qnccl {SHM_BITS}b B{SHM_BUCKET} {algo}{tag}", "qnccl", SHM_BITS,
                           SHM_BUCKET, algo, interleave=SHM_ROUNDS if algo == "auto" else 0,
                           **where)
                    for algo in dict.fromkeys(("auto", *args.algos))]
    return configs


def node_configurations(args, rate):
    """The multi-node section: 2 nodes x 2 ranks, `rate` between the nodes: uncompressed,
    MPI's, ring, SRA and hierarchical at 8 and 4 bits, then measured auto at 4 bits."""
    where = dict(nodes=NODES, ranks=NODE_RANKS, rate=rate)
    configs = [Config("2x2 uncompressed (NCCL API)", "nccl", **where)]
    if "mpi" in args.baselines:
        configs.append(Config("2x2 MPI_Allreduce", "mpi", **where))
    configs += [Config(f"2x2 qnccl {bits}b B128 {algo}", "qnccl", bits, 128, algo, **where)
                for bits in (8, 4) for algo in ("ring", "sra", "hier")]
    configs.append(Config("2x2 qnccl 4b B128 auto", "qnccl", 4, 128, "auto", **where))
    return configs


# The rotated rows of the flat section (float32, the first bucket size, SRA): the settings
# that train within full precision's reach at fewer bits (docs/accuracy.md, "Fewer bits"):
# 3 bits rotated, 2 bits rotated with clipped ranges; (bits, clip), in blocks of 256.
ROTATED_ROWS, ROTATED_BLOCK = ((3, False), (2, True)), 256


def configurations(args, rate):
    """The flat section at one rate, per type of --dtypes: its uncompressed baseline (float32:
    also MPI's and torch's), then bits x buckets x algorithms (other types: the first bucket
    size only, which bounds the run time), then measured auto at 4 bits (else the first of
    --bits) and the first bucket size, each measured against its own type's baseline; for
    float32, with --rotated-rows on, then ROTATED_ROWS."""
    configs = []
    for dtype in args.dtypes:
        tag = DTYPE_TAGS[dtype]
        configs.append(Config(f"uncompressed (NCCL API){tag}", "nccl", rate=rate, dtype=dtype))
        if dtype == "float32" and "mpi" in args.baselines:
            configs.append(Config("MPI_Allreduce", "mpi", rate=rate))
        if dtype == "float32" and "torch" in args.baselines:
            configs.append(Config("torch gloo", "torch-gloo", rate=rate))
        buckets = args.buckets if dtype == "float32" else args.buckets[:1]
        configs += [Config(f"qnccl {bits}b B{bucket} {algo}{tag}", "qnccl", bits, bucket, algo,
                           rate=rate, dtype=dtype)
                    for bits in args.bits for bucket in buckets for algo in args.algos]
        bits = 4 if 4 in args.bits else args.bits[0]
        configs.append(Config(f"qnccl {bits}b B{buckets[0]} auto{tag}", "qnccl", bits,
                              buckets[0], "auto", rate=rate, dtype=dtype))
        if dtype == "float32" and "on" in args.rotated_rows:
            configs += [Config(f"qnccl {b}b B{buckets[0]} sra rot{ROTATED_BLOCK}"
                               + (" clip" if clip else ""), "qnccl", b, buckets[0], "sra",
                               rate=rate, rotation_block=ROTATED_BLOCK, clip=clip)
                        for b, clip in ROTATED_ROWS]
    return configs


def mib(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 and size % (1 << 20) == 0 else f"{size >> 10} KiB"


RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def rate_bps(rate):
    """Bits per second of a perf/netlab rate ('1gbit', '2.5gbit', '100mbit'); None for 'none'
    (an unlimited loopback) or anything else."""
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?bit)", str(rate).strip().lower())
    return float(match.group(1)) * RATE_UNITS[match.group(2)] if match else None
