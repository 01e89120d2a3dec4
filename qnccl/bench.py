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
build/bench/report.json, summary.md (the tables as markdown) and a plot of busbw against size.
"""
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import textwrap
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


def run_config(config, args, out_dir, on_size=lambda text: None):
    """Runs one configuration; returns its record for the report. on_size(text): what each
    size's row said, as the job prints it (the console's progress)."""
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
                    on_size(f"{mib(int(row.group(1)))}: {float(row.group(2)) / 1e3:.1f} ms a call,"
                            f" error {row.group(4)}")
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


TABLE_WIDTH = 120  # the console's tables, summary.md's


@dataclasses.dataclass
class Table:
    """A section's table as cells, for the console (render_text) and summary.md
    (render_markdown)."""
    title: str
    columns: list  # headers; the first is the configurations'
    rows: list     # each a list of cells, or (name, message): a line of words, no numbers
    notes: list    # footnotes


def _baselines(records):
    """The uncompressed record of each type: the first of the section's records of that type
    (summarize's speedups are over it)."""
    bases = {}
    for record in records:
        bases.setdefault(record.get("dtype", "float32"), record)
    return bases


def compact_table(records, sizes, title, width=TABLE_WIDTH):
    """The console's table of a section, at most `width` columns: per row the wire bytes, the
    wire-size limit, the error, then per size the speedup over the uncompressed row of its type
    (the uncompressed rows themselves: their busbw). Where that is too wide the limit goes into
    a footnote, then every other size (the largest kept) until it fits; --wide prints
    format_table's instead."""
    base_ids = {id(r) for r in records if r["kind"] == "nccl"}

    def cells(shown, with_limit):
        blank = [""] * (2 + with_limit)
        rows = []
        for r in records:
            if not r.get("busbw_gbps"):
                rows.append((r["name"], f"{r['status']}: {r['message']}"))
                continue
            wire, limit, error = r["wire_bytes_per_input_byte"], r.get("wire_limit"), r["max_error"]
            row = [r["name"], f"{wire:.3f}" if wire is not None else "-"]
            if with_limit:
                row.append(f"{limit:.2f}x" if r["kind"] == "qnccl" and limit else "-")
            row.append(f"{error:.1e}" if error is not None else "-")
            for s in shown:
                if id(r) in base_ids:
                    busbw = r["busbw_gbps"].get(str(s))
                    row.append(f"{busbw:.4f}" if busbw is not None else "-")
                else:
                    speedup = r["speedup"].get(str(s))
                    row.append(f"{speedup:.2f}x" if speedup else "-")
            rows.append(row)
            if r["status"] != "ok":
                rows.append(("", f"<- {r['status']}: {r['message']}"))
            if r.get("vs_plain"):
                rows.append(["  same job, vs plain NCCL", *blank] +
                            [f"{v:.2f}x" if (v := r["vs_plain"].get(str(s))) else "-"
                             for s in shown])
        columns = ["configuration", "wire", *(["limit"] if with_limit else []), "error",
                   *(mib(s) for s in shown)]
        return Table(title, columns, rows, [])

    shown, with_limit = list(sizes), True
    table = cells(shown, with_limit)
    while _text_width(table) > width and (with_limit or len(shown) > 1):
        if with_limit:
            with_limit = False
        else:
            shown = shown[::-1][::2][::-1]  # every other size, the largest kept
        table = cells(shown, with_limit)
    table.notes.append(
        "Per size: the uncompressed (NCCL API) rows' busbw in GB/s, the other rows' speedup over "
        "the uncompressed row of their type (and collective) at that size. wire: bytes each rank "
        "sent per input byte; error: the largest max |result - exact| / max |exact| over the "
        "sizes.")
    if not with_limit:
        table.notes.append("The wire-size limit, the most a link-bound row can gain: the wire of "
                           "the uncompressed row it is compared with over its own.")
    if len(shown) < len(sizes):
        left_out = [mib(s) for s in sizes if s not in shown]
        table.notes.append(f"Sizes left out to fit {width} columns: {', '.join(left_out)} "
                           f"(qnccl bench --wide, report.json).")
    return table


def _column_widths(table):
    widths = [len(c) for c in table.columns]
    for row in table.rows:
        if isinstance(row, list):
            widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    return widths


def _text_width(table):
    widths = _column_widths(table)
    return sum(widths) + 2 * (len(widths) - 1)


def render_text(table, width=TABLE_WIDTH):
    """A Table as the console prints it: the title wrapped to `width`, aligned columns, the
    lines without numbers and the footnotes wrapped too."""
    widths = _column_widths(table)

    def line(cells):
        return "  ".join([f"{cells[0]:<{widths[0]}}"] +
                         [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:])]).rstrip()

    lines = [*textwrap.wrap(table.title, width), "", line(table.columns)]
    for row in table.rows:
        if isinstance(row, list):
            lines.append(line(row))
        else:
            name, message = row
            lines += textwrap.wrap(f"{name:<{widths[0]}}  {message}", width,
                                   subsequent_indent=" " * (widths[0] + 4))
    for note in table.notes:
        lines += textwrap.wrap(note, width)
    return "\n".join(line.rstrip() for line in lines)


def _md_cell(text):
    return text.replace("|", "\\|").strip() or " "


def render_markdown(table, heading=None):
    """A Table as markdown: the heading (a line such as '### ...'), the title, the table
    (numbers right-aligned), the footnotes."""
    out = [heading, ""] if heading else []
    out += [table.title, ""] if table.title else []
    out += ["| " + " | ".join(_md_cell(c) for c in table.columns) + " |",
            "| --- |" + " ---: |" * (len(table.columns) - 1)]
    for row in table.rows:
        if not isinstance(row, list):
            row = [row[0], row[1]] + [""] * (len(table.columns) - 2)
        out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if table.notes:
        out += ["", " ".join(table.notes)]
    return "\n".join(out)


def link_label(link):
    """A report section's link as a column header: '1 Gbit/s', 'unlimited'."""
    requested = link.get("requested") or link.get("rate")
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?)bit", str(requested).lower())
    label = f"{match.group(1)} {match.group(2).upper()}bit/s" if match else "unlimited"
    if match and link.get("rate") == "unthrottled":
        label += " (unthrottled: no namespace)"
    return label


def display_command(command):
    """The report's command as a user types it: 'qnccl bench ...' (run as python -m qnccl,
    sys.argv[0] is qnccl/__main__.py)."""
    program, _, rest = command.partition(" ")
    if program.endswith(("__main__.py", "qnccl")):
        return f"qnccl {rest}".strip()
    return command


def measured_line(report):
    """'Measured <date> on <host>, <cpus> CPUs, <platform>; `<command>`'."""
    host = report.get("host", {})
    date = str(report.get("date", "?")).replace("T", " ")
    return (f"Measured {date} on {host.get('name', '?')}, "
            f"{host.get('cpus', '?')} CPUs, {host.get('platform', '?')}; "
            f"`{display_command(report.get('command', 'qnccl bench'))}`")


def headline(report):
    """The headline: float32 allreduce at the largest size, the speedup over uncompressed of
    each row of the flat sections at the first bucket size (the uncompressed row: its busbw),
    one column per flat section's link, and one for the two-node section, whose rows share the
    flat rows' lines (the hierarchical rows have their own). (caption, Table), or None
    without a flat section."""
    sections = [s for s in report.get("sections", []) if s.get("configurations")]
    if not sections:
        return None
    size = max(sections[0]["sizes"])
    columns = [(link_label(s["link"]), s["configurations"]) for s in sections]
    two_nodes = report.get("two_nodes")
    if two_nodes and two_nodes.get("configurations"):
        columns.append((f"{two_nodes['nodes']} nodes x {two_nodes['nranks'] // two_nodes['nodes']}"
                        f" ranks, {link_label(two_nodes['link'])} between",
                        two_nodes["configurations"]))
    autos = [r for s in sections for r in s["configurations"] if r.get("algo") == "auto"]
    bucket = autos[0]["bucket_size"] if autos else None
    rows = {}  # row name: {column: cell}
    for c, (_, records) in enumerate(columns):
        base = _baselines(records).get("float32")
        for r in records:
            if r.get("dtype", "float32") != "float32" or (
                    bucket and r["kind"] == "qnccl" and r.get("bucket_size") != bucket):
                continue
            name = r["name"][4:] if r["name"].startswith("2x2 ") else r["name"]
            if r is base:
                value = r.get("busbw_gbps", {}).get(str(size))
                cell = f"{value:.4f} GB/s" if value is not None else "-"
            else:
                value = r.get("speedup", {}).get(str(size))
                cell = f"{value:.2f}x" if value else "-"
            rows.setdefault(name, {})[c] = cell
    table = Table("", ["configuration", *(label for label, _ in columns)],
                  [[name, *(cells.get(c, "") for c in range(len(columns)))]
                   for name, cells in rows.items()], [])
    limited = [link_label(s["link"]) for s in sections if rate_bps(s["link"].get("requested"))]
    links = ([f"a loopback limited by tc (perf/netlab) to {', '.join(limited)}"] if limited else [])
    links += [link_words(s["link"]) for s in sections if not rate_bps(s["link"].get("requested"))]
    if len(columns) > len(sections):
        links.append(f"{columns[-1][0]} the nodes, shared memory inside (hier: exact inside a "
                     f"node, quantized between the nodes)")
    caption = (f"Speedup over the uncompressed allreduce (NCCL API) on the same link: "
               f"{mib(size)} of float32 per rank, {report.get('nranks', '?')} ranks, "
               f"{report.get('rounding', 'stochastic')} rounding"
               f"{f', bucket {bucket}' if bucket else ''} (the uncompressed row: its busbw). "
               f"Links: {'; '.join(links)}.")
    return caption, table


def link_words(link):
    """A report section's link in words (Link.words)."""
    if link.get("rate") == "unthrottled":
        return ("unlimited loopback" if link.get("requested") == "none" else
                "unthrottled loopback (no namespace)")
    return f"loopback limited to {link['rate']} by tc"


def sections_of(report):
    """The report's sections in order: (heading, its dict)."""
    found = [(s.get("heading") or f"allreduce at {s['link'].get('requested')}", s)
             for s in report.get("sections", [])]
    for key, heading in (("two_nodes", "Two nodes"), ("collectives", "Other collectives"),
                         ("shared_memory", "Shared memory")):
        if report.get(key):
            found.append((report[key].get("heading") or heading, report[key]))
    return found


def section_table(section):
    """A report section's console table (compact_table), from its records."""
    title = section.get("title") or section.get("table", "").split("\n", 1)[0]  # older reports
    return compact_table(section["configurations"], section["sizes"], title)


def headline_markdown(report):
    """README's block: the measured line, the headline's caption and table."""
    found = headline(report)
    parts = [measured_line(report)]
    if found:
        caption, table = found
        parts += [caption, render_markdown(table)]
    return "\n\n".join(parts) + "\n"


def summary_markdown(report, level=2, title=True):
    """summary.md: the measured line, the headline, then every section's console table as
    markdown, headings at `level` (title: a '#' heading first)."""
    hashes = "#" * level
    parts = ["# qnccl bench"] if title else []
    parts.append(measured_line(report))
    found = headline(report)
    if found:
        caption, table = found
        parts += [f"{hashes} Headline", caption, render_markdown(table)]
    for heading, section in sections_of(report):
        parts.append(render_markdown(section_table(section), f"{hashes} {heading}"))
    return "\n\n".join(parts) + "\n"


# ---- the plot ------------------------------------------------------------------------------
#
# busbw.png: one panel per section, two to a row, each its own legend below its axes. A line's
# color says its bits (a lighter shade: a bucket size past the section's first; rotated rows
# their own hue) or its baseline (uncompressed NCCL API black, MPI_Allreduce gray, torch gloo
# brown); its dash pattern and marker say the algorithm (or, in the collectives section, the
# collective); its marker's fill the type (float32 filled, bfloat16 hollow and paler, float16
# half-filled). No two entries of a panel's legend look alike: a clash takes a spare marker.

PANEL_WIDTH_IN, AXES_HEIGHT_IN, PLOT_DPI = 7.0, 3.6, 110  # two panels: 1540 px wide
LEGEND_FONT = 8
BITS_COLORS = {8: ("#1f4e9c", "#6fa8dc"), 4: ("#1b7a3a", "#74c476"), 3: ("#d95f02", "#fdae6b"),
               2: ("#b2182b", "#f4a582"), 1: ("#6a3d9a", "#cab2d6")}
OTHER_BITS_COLORS = ("#8c6d31", "#e7ba52")
ROTATED_COLORS = {2: "#e7298a", 3: "#a6761d", 4: "#1b9e77", 8: "#7570b3"}
BASELINE_COLORS = {"nccl": "#000000", "mpi": "#7f7f7f", "torch-gloo": "#8c564b"}
BASELINE_MARKERS = {"nccl": "h", "mpi": "d", "torch-gloo": "<"}
# dash pattern (in line widths) and marker per algorithm, and per collective
ALGO_STYLES = {"ring": ("-", "o"), "tree": (":", "^"), "sra": ((0, (7, 2.5)), "s"),
               "hier": ("-.", "P"), "auto": ((0, (9, 2, 1.5, 2, 1.5, 2)), "*"),
               "rule": ((0, (3, 1.5)), "v")}
COLLECTIVE_STYLES = {"reducescatter": ("-", "o"), "allgather": ((0, (7, 2.5)), "s"),
                     "alltoall": (":", "^")}
DTYPE_FILLS = {"float32": ("full", 1.0), "bfloat16": ("none", 0.65), "float16": ("bottom", 0.8)}
SPARE_MARKERS = ("X", "p", "8", ">", "H", "D", "1", "2", "+", "x")


def legend_label(name):
    """A configuration's name in a legend: its section's prefix, 'qnccl ' and '(NCCL API)' left
    out (the panel's title says them; MPI's and torch's baselines have their own names)."""
    for prefix in ("2x2 ", "shm "):
        name = name[len(prefix):] if name.startswith(prefix) else name
    return name.replace("qnccl ", "").replace(" (NCCL API)", "")


def line_styles(records):
    """Each record's line style in one panel: dicts of matplotlib Line2D properties, no two
    with the same (color, marker, fill) (ALGO_STYLES give each algorithm its own marker, so
    that is the whole look but the dashes)."""
    buckets = sorted({r["bucket_size"] for r in records if r["kind"] == "qnccl"
                      and r.get("bucket_size") and not r.get("rotation_block")})
    styles, seen = [], set()
    for r in records:
        fill, alpha = DTYPE_FILLS.get(r.get("dtype", "float32"), ("left", 0.8))
        look = (COLLECTIVE_STYLES.get(r.get("collective"), ("-", "o"))
                if r.get("collective", "allreduce") != "allreduce" else None)
        if r["kind"] == "qnccl":
            dash, marker = look or ALGO_STYLES.get(r.get("algo"), ("-", "o"))
            if r.get("rotation_block"):
                color = ROTATED_COLORS.get(r["bits"], "#666666")
            else:
                shades = BITS_COLORS.get(r["bits"], OTHER_BITS_COLORS)
                color = shades[0 if buckets and r.get("bucket_size") == buckets[0] else 1]
            width = 1.6
        else:
            dash, marker = look or ("-", BASELINE_MARKERS.get(r["kind"], "o"))
            color, width = BASELINE_COLORS.get(r["kind"], "#17becf"), 2.6
        if (color, marker, fill) in seen:  # a spare marker, else another fill
            marker = next((m for m in SPARE_MARKERS if (color, m, fill) not in seen), marker)
            fill = next((f for f in (fill, "left", "right", "top", "bottom", "full", "none")
                         if (color, marker, f) not in seen), fill)
        seen.add((color, marker, fill))
        styles.append(dict(color=color, linestyle=dash, marker=marker, fillstyle=fill,
                           alpha=alpha, linewidth=width, markersize=5.5,
                           markeredgecolor=color, markerfacecolor=color))
    return styles


def _legend_layout(labels):
    """(columns, height in inches) of a legend of `labels` below a panel: as many columns as
    fit the panel's width (up to 4), filled column by column as matplotlib does."""
    from matplotlib.textpath import TextPath

    em = LEGEND_FONT / 72  # inches
    text = [TextPath((0, 0), label, size=LEGEND_FONT).get_extents().width / 72
            for label in labels]
    for columns in range(min(4, max(1, len(labels))), 0, -1):
        rows = -(-len(labels) // columns)
        widest = [max(text[c * rows:(c + 1) * rows], default=0) for c in range(columns)]
        # the handle (4 em), its pad (0.8 em), the text, the space between columns (1.2 em)
        if sum(6 * em + w for w in widest) <= PANEL_WIDTH_IN - 0.6 or columns == 1:
            return columns, rows * 1.5 * em + 0.2
    return 1, 0.2


def figure(panels):
    """busbw.png's figure: one panel per (records, sizes, title), two to a row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 2 if len(panels) > 1 else 1
    grid = [panels[i:i + columns] for i in range(0, len(panels), columns)]
    title_h, label_h, gap = 0.45, 0.6, 0.3
    layouts = [[_legend_layout([legend_label(r["name"]) for r in records
                                if r.get("busbw_gbps")]) for records, _, _ in row]
               for row in grid]
    heights = [title_h + AXES_HEIGHT_IN + label_h + max(h for _, h in row) + gap
               for row in layouts]
    fig_w, fig_h = columns * PANEL_WIDTH_IN, sum(heights)
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=PLOT_DPI)
    top = fig_h
    for row, row_layouts, height in zip(grid, layouts, heights):
        for c, ((records, sizes, title), (ncol, legend_h)) in enumerate(zip(row, row_layouts)):
            left = c * PANEL_WIDTH_IN + 0.8
            ax = fig.add_axes([left / fig_w, (top - title_h - AXES_HEIGHT_IN) / fig_h,
                               (PANEL_WIDTH_IN - 1.1) / fig_w, AXES_HEIGHT_IN / fig_h])
            legend_box = ((c * PANEL_WIDTH_IN + 0.3) / fig_w,
                          (top - title_h - AXES_HEIGHT_IN - label_h - legend_h) / fig_h,
                          (PANEL_WIDTH_IN - 0.6) / fig_w, legend_h / fig_h)
            plot_panel(ax, records, sizes, title, ncol, legend_box)
        top -= height
    return fig


def plot(panels, path):
    """Writes busbw.png (figure)."""
    import matplotlib.pyplot as plt

    fig = figure(panels)
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot_panel(ax, records, sizes, title, ncol=2, legend_box=None):
    """One section's busbw against size, log-log, its legend in legend_box (figure
    coordinates: x, y, width, height), else beside the axes."""
    import matplotlib.ticker

    for r, style in zip(records, line_styles(records)):
        points = [(s, r["busbw_gbps"].get(str(s))) for s in sizes]
        points = [(s, b) for s, b in points if b is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=legend_label(r["name"]), **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # speedups read as vertical distances; baselines stay visible
    ax.set_xticks(sizes, [mib(s) for s in sizes], rotation=30 if len(sizes) > 8 else 0)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.tick_params(labelsize=8)
    ax.set_xlabel("message size (bytes per rank)", fontsize=9)
    ax.set_ylabel("busbw (GB/s)", fontsize=9)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))

    def minor_label(value, _):  # 2, 3 and 5 of each decade where the axis spans 2 or fewer
        low, high = ax.get_ylim()
        mantissa = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
        return f"{value:g}" if high <= 100 * low and mantissa in (2, 3, 5) else ""
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor_label))
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if not ax.lines:
        return
    if legend_box is None:
        ax.legend(fontsize=LEGEND_FONT, ncol=1, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  handlelength=4)
    else:
        ax.legend(fontsize=LEGEND_FONT, ncol=ncol, loc="upper left", mode="expand",
                  bbox_to_anchor=legend_box, bbox_transform=ax.figure.transFigure,
                  handlelength=4, frameon=False, borderaxespad=0, columnspacing=1.2)


# ---- the time estimate -------------------------------------------------------------------
#
# Each configuration's wall time is predicted from what it does (predict_wall: its sizes, the
# calls per size, the bytes each call puts on the link at its rate, the codec's work, the job's
# start), then scaled by how the finished ones compared with their predictions (seconds_left).
# The constants were fitted to 64 MiB runs on the 2-core VM of the README's measurements
# (tests/bench_walls.json holds three: every job's configuration and wall time; the test
# replays them, worst error 14% after the first job). Another CPU mostly moves the compute
# terms, which the calibration picks up from the first jobs of each kind; the shared-memory,
# torch and collectives terms, which no recorded run has, are estimates.

RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

JOB_START_S = 0.3          # perf/netlab's namespace(s), mpirun, MPI_Init, the binary's setup
QNCCL_RUN_START_S = 0.6    # python -m qnccl run on every rank (4 ranks on 2 cores)
TORCH_START_S = 6.0        # python and `import torch.distributed` on every rank (4 on 2 cores)
SIZE_NS_PER_VALUE = 62.0   # per size: every rank's inputs, the check's exact result of its slice
TORCH_SIZE_NS_PER_VALUE = 120.0  # the same in numpy (perf/torch_all_reduce_perf.py; a guess)
# Compute of one call per value reduced, beside the link (4 ranks on 2 cores, flat over TCP):
PLAIN_NS_PER_VALUE = 6.0   # uncompressed: the sums and TCP's copies
CODEC_NS_PER_VALUE = 2.5   # quantized ring: encode, decode-accumulate
CODEC_ALGO_FACTOR = {"sra": 1.27, "tree": 1.1}
ROTATION_NS_PER_VALUE = 1.6  # the rotated rows' Hadamard transforms
SHM_PLAIN_NS_PER_VALUE = 6.0   # over shared memory, nothing else bounds the call (README's
SHM_CODEC_NS_PER_VALUE = 9.0   # busbw of that section)
TORCH_LINK_EFFICIENCY = 0.85   # gloo reaches this share of the link (README)
# Two nodes: the share of N x wire bytes that crosses a node's uplink per algorithm (ring: the
# two crossing hops; SRA: 2 of 3 peers; hier: its shard, a third of SRA's wire, all of it
# crossing), and what the uplinks reach of their rate.
NODE_CROSSING = {"nccl": 0.143, "mpi": 0.22, "ring": 0.25, "tree": 0.25, "rule": 0.25,
                 "sra": 1 / 3, "hier": 0.136}
NODE_EFFICIENCY = 0.73
TRIALS_PER_CANDIDATE = 5   # measured auto's trials per candidate and size (docs/tuning.md)
ETA_PRIOR = 1.0            # the calibration's prior weight, in typical configurations


def rate_bps(rate):
    """Bits per second of a perf/netlab rate ('1gbit', '2.5gbit', '100mbit'); None for 'none'
    (an unlimited loopback) or anything else."""
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?bit)", str(rate).strip().lower())
    return float(match.group(1)) * RATE_UNITS[match.group(2)] if match else None


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
        ns = SHM_CODEC_NS_PER_VALUE if quantized else SHM_PLAIN_NS_PER_VALUE
    elif quantized:
        ns = (CODEC_NS_PER_VALUE * CODEC_ALGO_FACTOR.get(algo, 1.0)
              + (ROTATION_NS_PER_VALUE if config.rotation_block else 0.0))
    else:
        ns = PLAIN_NS_PER_VALUE
    return (link ** 2 + (size / width * ns * 1e-9) ** 2) ** 0.5


def predict_wall(config, args):
    """A configuration's predicted wall time in seconds: the job's start, then per size the
    untimed calls (SETTLE; under measured auto first five trials of each candidate), the timed
    ones and the check's call (with --interleave, the plain NCCL's rounds too), and the warm-up
    calls at the largest and the smallest size (Config.argv, perf/perf.cc)."""
    total = (JOB_START_S + (QNCCL_RUN_START_S if config.kind == "qnccl" else 0)
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


def minutes(seconds):
    """'12.3 min', or '45 s' under two minutes."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def time_left(done, todo, args):
    """', about N min left' for the configurations `todo` (seconds_left)."""
    return f", about {minutes(seconds_left(done, todo, args))} left" if todo else ""


# ---- the command ------------------------------------------------------------------------

class Progress:
    """The console's progress. On a terminal: a configuration's line is rewritten as its sizes
    come (carriage return, clear to the end of the line), and ends as one line with its result
    and the time left. Elsewhere (CI, pipes): only that last line, one per configuration.
    Failures add their message on a line of its own either way."""

    def __init__(self, stream=None, tty=None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.live = False  # a line being rewritten

    def update(self, text):
        if self.tty:
            columns = shutil.get_terminal_size((TABLE_WIDTH, 24)).columns
            self.stream.write("\r\033[K" + text[:max(columns - 1, 20)])
            self.stream.flush()
            self.live = True

    def line(self, text):
        self.stream.write(("\r\033[K" if self.live else "") + text + "\n")
        self.stream.flush()
        self.live = False


def result_words(record, done):
    """What a finished configuration's progress line says of it: busbw at its largest size,
    the speedup over the uncompressed run it is compared with when that ran already, its
    wall time; or its failure."""
    if record["status"] != "ok":
        return f"{record['status']} after {record.get('wall_s', 0):.1f} s"
    busbw = busbw_by_size(record)
    if not busbw:
        return f"no rows, {record['wall_s']:.1f} s"
    size = max(busbw)
    words = f"{mib(size)}: {busbw[size]:.4f} GB/s"
    base = next((r for r in done if r["kind"] == "nccl" and r["status"] == "ok"
                 and r is not record and all(r.get(k) == record.get(k) for k in
                                             ("rate", "nodes", "shared_memory", "collective",
                                              "dtype"))), None)
    if base is not None:
        base_busbw = busbw_by_size(base).get(size)
        if base_busbw:
            words += f" ({busbw[size] / base_busbw:.2f}x)"
    return words + f", {record['wall_s']:.1f} s"


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

    progress = Progress()
    log = progress.line

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
    log(textwrap.fill(
        f"qnccl bench: {len(configs)} configurations, {args.ranks} ranks, "
        f"{mib(args.sizes[0])}..{mib(args.sizes[1])}, on "
        + "; then ".join(link.words for link in links)
        + (f"; then {NODES} nodes x {NODE_RANKS // NODES} ranks, {first.rate} between the nodes, "
           f"shared memory inside" if nodes else "")
        + (f"; then reduce-scatter, allgather and all-to-all on {first.words}"
           if collectives else "")
        + (f"; then {args.ranks} ranks on one node over shared memory" if shm else "")
        + f"; about {minutes(seconds_left([], configs, args))} in all",
        TABLE_WIDTH, subsequent_indent="  "))
    started = time.monotonic()
    records = []
    digits = max(2, len(str(len(configs))))
    for i, config in enumerate(configs, 1):
        label = (f"[{i:{digits}d}/{len(configs)}] {config.name}"
                 f"{f' at {config.rate}' if len(links) > 1 and flat(config) else ''}")
        # while it runs: what is left of the estimate for it and the rest
        begun = time.monotonic()
        with_it = seconds_left(records, configs[i - 1:], args)
        after_it = seconds_left(records, configs[i:], args)

        def on_size(text, label=label, begun=begun, with_it=with_it, after_it=after_it):
            left = max(with_it - (time.monotonic() - begun), after_it)
            progress.update(f"{label}  {text}, about {minutes(left)} left")

        progress.update(f"{label}  starting, about {minutes(with_it)} left")
        record = run_config(config, args, out_dir, on_size)
        left = time_left([*records, record], configs[i:], args)
        log(f"{label}  {result_words(record, records)}{left}")
        records.append(record)
        if record["status"] != "ok":
            log(textwrap.fill(f"      {record['status']}: {record['message']}", TABLE_WIDTH,
                              subsequent_indent=" " * 8))

    tables, panels, report_sections = [], [], []

    def emit(section_records, sizes, title, panel_title):
        """Prints a section's table (120 columns; --wide: format_table's); keeps it and its
        plot panel. Returns the report's fields of it."""
        table = format_table(section_records, sizes, title)
        compact = render_text(compact_table(section_records, sizes, title))
        print("\n" + (table if getattr(args, "wide", False) else compact) + "\n")
        tables.append(table)
        panels.append((section_records, sizes, panel_title))
        return {"title": title, "table": table, "compact_table": compact}

    done = iter(records)
    for link, section in sections:
        section_records = [next(done) for _ in section]
        sizes = summarize(section_records)
        tables_of = emit(section_records, sizes,
                     f"allreduce of {' and '.join(args.dtypes)} (sum), {args.ranks} ranks, "
                     f"{link.words}, {args.rounding} rounding; busbw from the median of "
                     f"{args.iters} calls (speedup over uncompressed all_reduce_perf of the "
                     f"same type at the same size; limit: the uncompressed run's wire bytes "
                     f"over this row's, the most a link-bound call can gain)",
                     f"allreduce busbw, {args.ranks} ranks, {link.words}")
        report_sections.append({"heading": f"Allreduce at {link.requested}",
                                "link": {"rate": link.rate, "tool": "perf/netlab",
                                         "requested": link.requested},
                                "sizes": sizes, "configurations": section_records,
                                **tables_of})
    node_records = [next(done) for _ in nodes]
    collective_records = [next(done) for _ in collectives]
    shm_records = list(done)
    two_nodes = None
    if node_records:
        node_sizes = summarize(node_records)
        node_tables = emit(
            node_records, node_sizes,
            f"{NODES} nodes x {NODE_RANKS // NODES} ranks (perf/netlab --nodes): {first.rate} "
            f"between the nodes, shared memory inside; {args.rounding} rounding, bucket 128; "
            f"hier = exact inside nodes, quantized between them",
            f"allreduce busbw, {NODES} nodes x {NODE_RANKS // NODES} ranks, {first.rate} "
            f"between nodes")
        two_nodes = {"heading": f"{NODES} nodes x {NODE_RANKS // NODES} ranks, {first.requested} "
                                "between the nodes",
                     "nodes": NODES, "nranks": NODE_RANKS, "sizes": node_sizes,
                     "link": {"rate": first.rate, "tool": "perf/netlab --nodes",
                              "requested": first.requested},
                     "configurations": node_records, **node_tables}
    collective_section = None
    if collective_records:
        for i in range(0, len(collective_records), 2):  # each beside its own uncompressed run
            summarize(collective_records[i:i + 2])
        collective_sizes = sorted({int(s) for r in collective_records for s in r["busbw_gbps"]})
        collective_tables = emit(
            collective_records, collective_sizes,
            f"reduce-scatter, allgather and all-to-all of float32, {args.ranks} ranks, "
            f"{first.words}, {args.rounding} rounding, bucket 128 (speedup over the same "
            f"collective uncompressed)",
            f"reduce-scatter, allgather, all-to-all busbw, {args.ranks} ranks, {first.rate}")
        collective_section = {"heading": f"Reduce-scatter, allgather, all-to-all at "
                                         f"{first.requested}",
                              "link": {"rate": first.rate, "tool": "perf/netlab",
                                       "requested": first.requested},
                              "sizes": collective_sizes, "configurations": collective_records,
                              **collective_tables}
    shm_section = None
    if shm_records:
        shm_sizes = summarize(shm_records)
        shm_tables = emit(
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
        shm_section = {"heading": "Shared memory, one node",
                       "link": {"rate": "none", "tool": "perf/netlab --nodes 1",
                                "transport": "shared memory"},
                       "sizes": shm_sizes, "configurations": shm_records, **shm_tables}
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
    summary_path = out_dir / "summary.md"
    summary_path.write_text(summary_markdown(report))
    plot_path = out_dir / "busbw.png"
    plot(panels, plot_path)
    print(f"report: {report_path}\nplot:   {plot_path}\nsummary: {summary_path}\n"
          f"done in {report['wall_s'] / 60:.1f} min")
    failed = [r["name"] for r in records if r["status"] == "failed" or r.get("check_ok") is False]
    if failed:
        print(f"qnccl bench: failed: {', '.join(failed)} (logs in {out_dir / 'logs'})",
              file=sys.stderr)
        return 1
    return 0
