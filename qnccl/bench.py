"""`qnccl bench` (`make bench`): quantized and uncompressed allreduce side by side
on bandwidth-limited links, then reduce-scatter, allgather and all-to-all
(docs/perf.md).

Every configuration is one MPI job of build/bin/all_reduce_perf (or of a
baseline: mpi_all_reduce_perf, perf/torch_all_reduce_perf.py; or of
reduce_scatter_perf, all_gather_perf, alltoall_perf) inside
perf/netlab, a network namespace whose loopback `tc` limits to a rate, with
MPI over TCP; the whole matrix runs once per rate of --rates. The jobs write
nccl-tests style JSON; this module runs them one after another, shows
progress, and puts their numbers into one comparison table per rate,
build/bench/report.json and a plot of busbw against size.
"""
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import _native

# What the jobs run: the installed package's copies, or a source tree's (qnccl/_native.py).
NETLAB = _native.path("bin/netlab")
TORCH_PERF = _native.path("bin/torch_all_reduce_perf.py")


def tool(name):
    """The perf binary `name` (qnccl/_native.py)."""
    return _native.path(f"bin/{name}")


TORCH_MISSING = 3  # exit status of torch_all_reduce_perf.py without torch
GIB = 1 << 30

# Open MPI as root, more ranks than cores, no busy waiting (2-core machines).
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}
# For jobs on one machine that may use shared memory (the benchmark's own runs go over TCP
# on purpose): no CMA/ptrace single copy, which containers forbid.
MPI_SHARED_MEMORY_ENV = {
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}


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


# ---- running -------------------------------------------------------------------------

def mib(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 and size % (1 << 20) == 0 else f"{size >> 10} KiB"


@dataclasses.dataclass
class Link:
    """What perf/netlab gives the jobs for one requested rate."""
    requested: str
    rate: str         # the rate, or "unthrottled"
    namespace: bool   # False: netlab could not make one (jobs on the host's network)
    message: str      # netlab's own line

    @property
    def limited(self):
        return self.rate != "unthrottled"

    @property
    def words(self):
        if self.limited:
            return f"loopback limited to {self.rate} by tc (perf/netlab)"
        if self.namespace:
            return "unlimited loopback (perf/netlab --rate none)"
        return "unthrottled loopback (perf/netlab could not make a namespace)"


def probe_link(rate):
    """The Link perf/netlab gives the jobs here for `rate`."""
    probe = subprocess.run([str(NETLAB), "--rate", rate, "--", "sh", "-c",
                            'echo "$QNCCL_NETLAB_RATE:$QNCCL_NETLAB_NS"'],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise RuntimeError(f"perf/netlab failed (exit {probe.returncode}): {probe.stderr.strip()}")
    got, _, namespace = probe.stdout.strip().partition(":")
    return Link(rate, got or "unthrottled", bool(namespace), probe.stderr.strip())


def job_environment():
    """The jobs' environment: MPI settings, the host backend as libnccl.so.2, and
    no QNCCL_* from the caller (each configuration sets its own), nor the caller's choice of
    Open MPI transports (OMPI_MCA_btl*): a test shell's `btl_vader_single_copy_mechanism=none`
    made the shared-memory section's uncompressed baseline 3x slower from 8 MiB."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("QNCCL_", "OMPI_MCA_btl"))}
    env.update(MPI_ENV)
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(_native.path("host/libnccl.so.2").parent),
                                                    env.get("LD_LIBRARY_PATH")]))
    env["MASTER_PORT"] = "29500"  # torch.distributed's rendezvous, inside the fresh namespace
    return env


def flat(config):
    """Whether `config` belongs to a flat section (one per rate of --rates)."""
    return config.nodes == 1 and not config.shared_memory


def run_config(config, args, out_dir, log):
    """Runs one configuration; returns its record for the report."""
    json_path = out_dir / "runs" / f"{config.slug}.json"
    log_path = out_dir / "logs" / f"{config.slug}.log"
    json_path.unlink(missing_ok=True)
    mpirun = shutil.which("mpirun") or "mpirun"
    lab = ["--nodes", str(config.nodes)] if config.nodes > 1 or config.shared_memory else []
    binding = SHM_BINDING if config.shared_memory else ()
    cmd = [str(NETLAB), *lab, "--rate", config.rate, "--", mpirun, *binding,
           "-np", str(config.ranks or args.ranks), *config.argv(args), "-J", str(json_path)]
    record = {**dataclasses.asdict(config), "command": cmd, "status": "ok", "message": None}
    start = time.monotonic()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, env=job_environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            for line in proc.stdout:
                log_file.write(line)
                row = re.match(r"^\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s+(\S+)\s+\S+\s+(\S+)\s+(\S+)",
                               line)
                if row:
                    log(f"      {mib(int(row.group(1))):>7}  {float(row.group(2)) / 1e3:9.1f} ms"
                        f"  error {row.group(4)}")
            status = proc.wait(timeout=args.timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
            os.killpg(proc.pid, 15)  # netlab cleans its namespace up on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
            if isinstance(e, KeyboardInterrupt):
                raise
            status = None
    record["wall_s"] = round(time.monotonic() - start, 2)
    record["log"] = str(log_path)
    if status == TORCH_MISSING and config.kind == "torch-gloo":
        record.update(status="skipped", message="torch is not installed "
                      f"({sys.executable} -m pip install torch)")
    elif status != 0 or not json_path.is_file():
        tail = log_path.read_text().strip().splitlines()[-3:]
        record.update(status="failed", message=(
            f"timed out after {args.timeout} s" if status is None else f"exit {status}") +
            (": " + " | ".join(tail) if tail else ""))
    if json_path.is_file():
        record["perf"] = json.loads(json_path.read_text())
    return record


# ---- results ---------------------------------------------------------------------------

def busbw_by_size(record):
    """{size: busbw GB/s} of the out-of-place rows, from the median call time."""
    result = {}
    for row in record.get("perf", {}).get("rows", []):
        if row["placement"] != "out-of-place":
            continue
        seconds = (row.get("time_us_median") or row["time_us"]) / 1e6
        # the collective's bus-bandwidth factor, as the binary applied it
        factor = row["busbw_gbps"] / row["algbw_gbps"] if row["algbw_gbps"] else 0.0
        result[row["size"]] = row["size"] / 1e9 / seconds * factor if seconds > 0 else 0.0
    return result


def summarize(records):
    """Adds busbw, speedup over the uncompressed run of the same type (the section's first
    record of that type), wire ratio and error to every record; returns the sizes."""
    bases = {}
    for record in records:
        bases.setdefault(record.get("dtype", "float32"), record)
    sizes = sorted({size for r in records for size in busbw_by_size(r)})
    for record in records:
        base_record = bases[record.get("dtype", "float32")]
        base = busbw_by_size(base_record) if base_record["status"] == "ok" else {}
        busbw = busbw_by_size(record)
        rows = [row for row in record.get("perf", {}).get("rows", [])
                if row["placement"] == "out-of-place"]
        record["busbw_gbps"] = {str(s): v for s, v in busbw.items()}
        record["speedup"] = {str(s): v / base[s] for s, v in busbw.items() if base.get(s)}
        # --interleave: the speed against the plain NCCL timed in rounds of the same job
        record["vs_plain"] = {str(row["size"]): row["vs_plain"] for row in rows
                              if row.get("vs_plain") is not None}
        wire = [row["wire_bytes_per_input_byte"] for row in rows]
        errors = [row["error"] for row in rows if row.get("error") is not None]
        record["wire_bytes_per_input_byte"] = max(wire) if wire else None
        record["max_error"] = max(errors) if errors else None
        record["check_ok"] = all(row.get("ok") is not False for row in rows) if rows else None
    for record in records:
        # the speedup a link-bound call could reach at most: the uncompressed run's bytes on
        # the wire per byte this one sends
        base_wire = bases[record.get("dtype", "float32")].get("wire_bytes_per_input_byte")
        wire = record["wire_bytes_per_input_byte"]
        record["wire_limit"] = base_wire / wire if base_wire and wire else None
    return sizes


def format_table(records, sizes, header):
    """One line per configuration: wire ratio, the speedup it allows (limit), error, then
    busbw and speedup over the uncompressed run of its type at every size."""
    width = max(len(r["name"]) for r in records)
    lines = [header, "",
             f"{'':<{width}}  {'wire':>5}  {'limit':>6}  {'error':>7}" +
             "".join(f"  {mib(s):>15}" for s in sizes),
             f"{'configuration':<{width}}  {'(B/B)':>5}  {'':>6}  {'':>7}" +
             "".join(f"  {'GB/s':>7} {'speedup':>7}" for _ in sizes)]
    for r in records:
        if not r["busbw_gbps"]:
            lines.append(f"{r['name']:<{width}}  {r['status']}: {r['message']}")
            continue
        wire, limit = r["wire_bytes_per_input_byte"], r.get("wire_limit")
        error = r["max_error"]
        quantized = r["kind"] == "qnccl"
        line = (f"{r['name']:<{width}}  {f'{wire:5.3f}' if wire is not None else '-':>5}"
                f"  {f'{limit:5.2f}x' if quantized and limit else '-':>6}"
                f"  {f'{error:.1e}' if error is not None else '-':>7}")
        for s in sizes:
            busbw, speedup = r["busbw_gbps"].get(str(s)), r["speedup"].get(str(s))
            line += f"  {f'{busbw:.4f}' if busbw is not None else '-':>7}"
            line += f" {f'{speedup:.2f}x' if speedup else '-':>7}"
        if r["status"] != "ok":
            line += f"  <- {r['status']}: {r['message']}"
        lines.append(line)
        if r.get("vs_plain"):
            line = f"{'  same job, vs plain NCCL':<{width}}  {'':>5}  {'':>6}  {'':>7}"
            for s in sizes:
                ratio = r["vs_plain"].get(str(s))
                line += f"  {'':>7} {f'{ratio:.2f}x' if ratio else '-':>7}"
            lines.append(line)
    return "\n".join(lines)


def plot(panels, path):
    """One panel per (records, sizes, title), side by side, in one figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(11 * len(panels), 6.5), squeeze=False)
    for ax, (records, sizes, title) in zip(axes[0], panels):
        plot_panel(ax, records, sizes, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_panel(ax, records, sizes, title):
    colors = {8: "tab:blue", 4: "tab:green", 3: "tab:orange", 2: "tab:red"}
    styles = {"ring": "-", "tree": ":", "sra": "--", "hier": "-."}
    for r in records:
        busbw = [r["busbw_gbps"].get(str(s)) for s in sizes]
        points = [(s, b) for s, b in zip(sizes, busbw) if b is not None]
        if not points:
            continue
        xs, ys = zip(*points)
        other_type = r.get("dtype", "float32") != "float32"  # triangles, paler
        if r["kind"] == "qnccl":
            marker = ("^" if other_type else "D" if r.get("rotation_block") else
                      "o" if r["bucket_size"] == 128 else "s")
            ax.plot(xs, ys, styles.get(r["algo"], "-"), color=colors.get(r["bits"], "tab:purple"),
                    marker=marker, markersize=4, alpha=0.55 if other_type else 1.0,
                    label=r["name"])
        else:
            ax.plot(xs, ys, ":" if other_type else "-",
                    color={"nccl": "black", "mpi": "gray"}.get(r["kind"], "tab:brown"),
                    linewidth=2.5, label=r["name"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # speedups read as vertical distances; baselines stay visible
    ax.set_xticks(sizes, [mib(s) for s in sizes])
    ax.set_xlabel("message size (bytes per rank)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))


# ---- the command ------------------------------------------------------------------------

def time_left(done, todo):
    """', about N min left' from the runs so far: quantized runs and uncompressed
    baselines take very different times, so each kind is estimated from its own."""
    estimate = 0.0
    for quantized in (False, True):
        walls = [r["wall_s"] for r in done if (r["kind"] == "qnccl") == quantized]
        pending = sum((c.kind == "qnccl") == quantized for c in todo)
        if pending and not walls:
            return ""
        estimate += sum(walls) / len(walls) * pending if pending else 0.0
    return f", about {estimate / 60:.1f} min left" if estimate else ""


def missing_parts(args):
    needed = [tool(name) for name in COLLECTIVE_TOOLS.values()]
    needed += [_native.path("lib/libqnccl.so"), _native.path("host/libnccl.so.2"), NETLAB]
    if "mpi" in args.baselines:
        needed.append(tool("mpi_all_reduce_perf"))
    return [p for p in needed if not p.exists()]


def main(args):
    missing = missing_parts(args)
    if missing:
        print(f"qnccl bench: {_native.missing(missing[0])}"
              + (f" (and {len(missing) - 1} more parts)" if len(missing) > 1 else ""),
              file=sys.stderr)
        return 1
    if shutil.which("mpirun") is None:
        print("qnccl bench: mpirun not found: run `make setup` (installs Open MPI)", file=sys.stderr)
        return 1
    out_dir = args.out
    for sub in ("runs", "logs"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)

    def log(message):
        print(message, flush=True)

    links = []
    for rate in args.rates:
        try:
            links.append(probe_link(rate))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"qnccl bench: {e}", file=sys.stderr)
            return 2
    for link in links:
        if not link.namespace:
            log(f"qnccl bench: {link.message}")
    sections = [(link, configurations(args, link.requested)) for link in links]
    first = links[0]
    nodes = (node_configurations(args, first.requested)
             if "on" in args.nodes_section and first.limited else [])
    collectives = (collective_configurations(args, first.requested)
                   if "on" in args.collectives_section else [])
    shm = shm_configurations(args) if "on" in args.shm_section else []
    configs = [c for _, section in sections for c in section] + nodes + collectives + shm
    log(f"qnccl bench: {len(configs)} configurations, {args.ranks} ranks, "
        f"{mib(args.sizes[0])}..{mib(args.sizes[1])}, on "
        + "; then ".join(link.words for link in links)
        + (f"; then {NODES} nodes x {NODE_RANKS // NODES} ranks, {first.rate} between the nodes, "
           f"shared memory inside" if nodes else "")
        + (f"; then reduce-scatter, allgather and all-to-all on {first.words}"
           if collectives else "")
        + (f"; then {args.ranks} ranks on one node over shared memory" if shm else ""))
    started = time.monotonic()
    records = []
    for i, config in enumerate(configs, 1):
        log(f"[{i:2d}/{len(configs)}] {config.name}"
            f"{f' at {config.rate}' if len(links) > 1 and flat(config) else ''}"
            f"{time_left(records, configs[i - 1:])}")
        record = run_config(config, args, out_dir, log)
        records.append(record)
        if record["status"] != "ok":
            log(f"      {record['status']}: {record['message']}")

    tables, panels, report_sections = [], [], []

    def emit(section_records, sizes, title, panel_title):
        """Prints a section's table; keeps it and its plot panel."""
        table = format_table(section_records, sizes, title)
        print("\n" + table + "\n")
        tables.append(table)
        panels.append((section_records, sizes, panel_title))
        return table

    done = iter(records)
    for link, section in sections:
        section_records = [next(done) for _ in section]
        sizes = summarize(section_records)
        table = emit(section_records, sizes,
                     f"allreduce of {' and '.join(args.dtypes)} (sum), {args.ranks} ranks, "
                     f"{link.words}, {args.rounding} rounding; busbw from the median of "
                     f"{args.iters} calls (speedup over uncompressed all_reduce_perf of the "
                     f"same type at the same size; limit: the uncompressed run's wire bytes "
                     f"over this row's, the most a link-bound call can gain)",
                     f"allreduce busbw, {args.ranks} ranks, {link.words}")
        report_sections.append({"link": {"rate": link.rate, "tool": "perf/netlab",
                                         "requested": link.requested},
                                "sizes": sizes, "configurations": section_records,
                                "table": table})
    node_records = [next(done) for _ in nodes]
    collective_records = [next(done) for _ in collectives]
    shm_records = list(done)
    two_nodes = None
    if node_records:
        node_sizes = summarize(node_records)
        node_table = emit(
            node_records, node_sizes,
            f"{NODES} nodes x {NODE_RANKS // NODES} ranks (perf/netlab --nodes): {first.rate} "
            f"between the nodes, shared memory inside; {args.rounding} rounding, bucket 128; "
            f"hier = exact inside nodes, quantized between them",
            f"allreduce busbw, {NODES} nodes x {NODE_RANKS // NODES} ranks, {first.rate} "
            f"between nodes")
        two_nodes = {"nodes": NODES, "nranks": NODE_RANKS, "sizes": node_sizes,
                     "link": {"rate": first.rate, "tool": "perf/netlab --nodes",
                              "requested": first.requested},
                     "configurations": node_records, "table": node_table}
    collective_section = None
    if collective_records:
        for i in range(0, len(collective_records), 2):  # each beside its own uncompressed run
            summarize(collective_records[i:i + 2])
        collective_sizes = sorted({int(s) for r in collective_records for s in r["busbw_gbps"]})
        collective_table = emit(
            collective_records, collective_sizes,
            f"reduce-scatter, allgather and all-to-all of float32, {args.ranks} ranks, "
            f"{first.words}, {args.rounding} rounding, bucket 128 (speedup over the same "
            f"collective uncompressed)",
            f"reduce-scatter, allgather, all-to-all busbw, {args.ranks} ranks, {first.rate}")
        collective_section = {"link": {"rate": first.rate, "tool": "perf/netlab",
                                       "requested": first.requested},
                              "sizes": collective_sizes, "configurations": collective_records,
                              "table": collective_table}
    shm_section = None
    if shm_records:
        shm_sizes = summarize(shm_records)
        shm_table = emit(
            shm_records, shm_sizes,
            f"allreduce of {' and '.join(args.dtypes)} (sum), {args.ranks} ranks on one node "
            f"over shared memory (perf/netlab --nodes 1: MPI btl vader, no rate limit), "
            f"{args.rounding} rounding; busbw from the median of {timed_calls(args, True)} "
            f"calls (auto: of {SHM_ROUNDS} rounds of them) (speedup over uncompressed "
            f"all_reduce_perf of the same type at the same size; below 1x QNCCL is slower: "
            f"docs/perf.md; 'same job': auto against the plain NCCL's calls in "
            f"{SHM_ROUNDS} alternating rounds of its own job, the median of the rounds' "
            f"ratios)",
            f"allreduce busbw, {args.ranks} ranks, shared memory")
        shm_section = {"link": {"rate": "none", "tool": "perf/netlab --nodes 1",
                                "transport": "shared memory"},
                       "sizes": shm_sizes, "configurations": shm_records, "table": shm_table}
    report = {
        "benchmark": "qnccl bench",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": {"name": socket.gethostname(), "cpus": os.cpu_count(),
                 "platform": platform.platform()},
        "nranks": args.ranks, "datatypes": args.dtypes, "op": "sum",
        "rounding": args.rounding, "iters": args.iters, "warmup": args.warmup,
        "command": " ".join(sys.argv), "wall_s": round(time.monotonic() - started, 1),
        "sections": report_sections, "two_nodes": two_nodes,
        "collectives": collective_section, "shared_memory": shm_section,
        "table": "\n\n".join(tables),
    }
    report_path = out_dir / "report.json"
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    plot_path = out_dir / "busbw.png"
    plot(panels, plot_path)
    print(f"report: {report_path}\nplot:   {plot_path}\n"
          f"done in {report['wall_s'] / 60:.1f} min")
    failed = [r["name"] for r in records if r["status"] == "failed" or r.get("check_ok") is False]
    if failed:
        print(f"qnccl bench: failed: {', '.join(failed)} (logs in {out_dir / 'logs'})",
              file=sys.stderr)
        return 1
    return 0
