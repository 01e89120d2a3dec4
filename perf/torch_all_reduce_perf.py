#!/usr/bin/env python3
"""torch_all_reduce_perf: the uncompressed baseline of QNCCL's allreduce benchmark.

Times `torch.distributed.all_reduce` on the gloo backend (host memory, TCP) and prints
the same nccl-tests style table as QNCCL's `all_reduce_perf` binary, so one report can
put the two side by side. One process per rank:

    MASTER_PORT=29500 mpirun -np 4 python perf/torch_all_reduce_perf.py -b 1M -e 64M -f 2
    mpirun -np 4 python perf/torch_all_reduce_perf.py --port 29500 -b 1M -e 64M -f 2
    torchrun --nproc-per-node 4 perf/torch_all_reduce_perf.py -b 1M -e 64M -f 2

Ranks: OMPI_COMM_WORLD_RANK/SIZE (Open MPI), else PMI_RANK/PMI_SIZE (MPICH, Intel MPI),
else RANK/WORLD_SIZE (torchrun), else a single process.

Rendezvous (one mechanism: a TCP key-value store, the one torch itself uses).
  * under torchrun: torchrun's own store (`env://`: MASTER_ADDR, MASTER_PORT set by torchrun).
  * otherwise rank 0 serves a torch.distributed.TCPStore on MASTER_ADDR:MASTER_PORT and the
    other ranks connect to it. MASTER_ADDR defaults to 127.0.0.1 (one node; set it to rank 0's
    host for several nodes). The port is MASTER_PORT from the environment, else `--port`; with
    neither the program stops (status 2) and asks for MASTER_PORT: under mpirun the ranks have
    no other channel over which rank 0 could announce a port it picked. The launcher picks a
    free port (bind port 0, read it, close) and passes it in the environment.
  * a single process needs no port (in-process store).

Options follow nccl-tests: -b -e -f -i -n -w -d -o -c -a -z, plus -J FILE (JSON, written by
rank 0). Sizes take K, M, G suffixes (powers of 2) and are rounded down to whole elements.

Exit status: 0 all rows checked OK (or -c 0), 1 a check failed (or a runtime error), 2 bad
options, 3 torch (with torch.distributed and gloo) is not installed: the baseline is skipped.
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time

TOOL = "torch_all_reduce_perf"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_TORCH = 0, 1, 2, 3

# nccl-tests type name -> (torch dtype attribute, element bytes, kind: f float / i signed / u unsigned)
TYPES = {
    "float": ("float32", 4, "f"),
    "half": ("float16", 2, "f"),
    "bfloat16": ("bfloat16", 2, "f"),
    "double": ("float64", 8, "f"),
    "int32": ("int32", 4, "i"),
    "int64": ("int64", 8, "i"),
    "int8": ("int8", 1, "i"),
    "uint8": ("uint8", 1, "u"),
}
TYPE_ALIASES = {"float32": "float", "float16": "half", "float64": "double"}
OPS = ("sum", "prod", "min", "max", "avg")
PLACEMENT_NAMES = ("out-of-place", "in-place")
PLACEMENTS = {"both": (0, 1), "out-of-place": (0,), "in-place": (1,)}
# Unit roundoff (half an ulp of 1) of the float types, and their smallest subnormal.
UNIT_ROUNDOFF = {"float": 2.0**-24, "half": 2.0**-11, "bfloat16": 2.0**-8, "double": 2.0**-53}
SMALLEST = {"float": 2.0**-149, "half": 2.0**-24, "bfloat16": 2.0**-133, "double": 2.0**-1074}
U64 = 2.0**-53  # the float64 reference's own rounding

CHECK_CHUNK = 1 << 20  # elements per step of the input generator and the check: bounded memory

SIZE_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


# ----------------------------------------------------------------------------------- options

def parse_size(text):
    """nccl-tests sizes: a whole number of bytes with an optional K, M or G (powers of 2)."""
    t = text.strip()
    suffix = t[-1:].upper() if t[-1:].isalpha() else ""
    digits = t[:-1] if suffix else t
    if not digits.isdigit() or suffix not in SIZE_SUFFIX:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: allowed is a whole number of bytes with an optional "
            f"K, M or G suffix (powers of 2), e.g. 64K, 32M")
    return int(digits) * SIZE_SUFFIX[suffix]


def int_at_least(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: allowed is an integer >= {low}")
        return value
    return parse


def float_at_least(low):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= low):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: allowed is a number >= {low}")
        return value
    return parse


def int_choice(*allowed):
    def parse(text):
        if text.strip() not in [str(a) for a in allowed]:
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r}: allowed is one of {', '.join(map(str, allowed))}")
        return int(text)
    return parse


def type_name(text):
    name = TYPE_ALIASES.get(text, text)
    if name not in TYPES:
        raise argparse.ArgumentTypeError(
            f"invalid type {text!r}: allowed is one of {', '.join(TYPES)} (float32, float16, "
            f"float64 are accepted for float, half, double)")
    return name


def op_name(text):
    if text not in OPS:
        raise argparse.ArgumentTypeError(f"invalid op {text!r}: allowed is one of {', '.join(OPS)}")
    return text


def port_number(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: allowed is an integer in 1..65535")
    return value


def build_parser():
    p = argparse.ArgumentParser(
        prog=TOOL,
        description="torch.distributed all_reduce (gloo backend) timed and printed like "
                    "nccl-tests' all_reduce_perf: the uncompressed baseline of QNCCL's benchmark.",
        epilog="Rendezvous: torchrun's store under torchrun; otherwise a TCP store served by rank 0 "
               "on MASTER_ADDR (default 127.0.0.1):MASTER_PORT (env, else --port). Exit status: "
               "0 ok, 1 check failed, 2 bad options, 3 torch not installed.")
    p.add_argument("-b", "--minbytes", type=parse_size, default=32 << 20, metavar="MINBYTES",
                   help="smallest size in bytes, K/M/G suffixes (default 32M)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20, metavar="MAXBYTES",
                   help="largest size in bytes (default 32M)")
    p.add_argument("-f", "--stepfactor", type=float_at_least(1), default=1, metavar="STEPFACTOR",
                   help="multiply the size by this between rows; 1 adds -i instead (default 1)")
    p.add_argument("-i", "--stepbytes", type=parse_size, default=1 << 20, metavar="STEPBYTES",
                   help="bytes added between rows when -f is 1 (default 1M)")
    p.add_argument("-n", "--iters", type=int_at_least(1), default=20, metavar="ITERS",
                   help="timed iterations per size and placement (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int_at_least(0), default=5, metavar="WARMUP",
                   help="untimed calls at the largest and the smallest size (default 5)")
    p.add_argument("--settle", type=int_at_least(0), default=0, metavar="N",
                   help="untimed calls before each size's timed ones, as the C perf binaries' "
                        "--settle (default 0)")
    p.add_argument("-d", "--datatype", type=type_name, default="float", metavar="TYPE",
                   help=f"element type: {', '.join(TYPES)} (default float)")
    p.add_argument("-o", "--op", type=op_name, default="sum", metavar="OP",
                   help=f"reduction: {', '.join(OPS)} (default sum)")
    p.add_argument("-c", "--check", type=int_choice(0, 1), default=1, metavar="0|1",
                   help="check every result against the exact one (default 1)")
    p.add_argument("-a", "--average", type=int_choice(0, 1, 2, 3), default=1, metavar="0|1|2|3",
                   help="time across ranks: 0 rank 0's, 1 average, 2 min, 3 max (default 1)")
    # gloo's all_reduce returns when the result is in place, so every call is blocking
    # whatever -z says; -z 1 adds the median call time to the JSON, as the C binaries do.
    p.add_argument("-z", "--blocking", type=int_choice(0, 1), default=0, metavar="0|1",
                   help="gloo calls always block; 1: the JSON also has the median call time")
    p.add_argument("-J", "--output_file", metavar="FILE", default=None,
                   help="also write the results as JSON to FILE (rank 0)")
    p.add_argument("--placement", choices=tuple(PLACEMENTS), default="both",
                   help="which to measure (default both)")
    p.add_argument("--port", type=port_number, default=None,
                   help="rendezvous port when MASTER_PORT is not set (not under torchrun)")
    return p


def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.maxbytes < args.minbytes:
        parser.error(f"argument -e/--maxbytes: {args.maxbytes} is below -b/--minbytes "
                     f"{args.minbytes}: allowed is MAXBYTES >= MINBYTES")
    if args.stepfactor > 1 and args.minbytes == 0:
        parser.error("argument -b/--minbytes: 0 cannot grow by -f/--stepfactor: allowed is "
                     "MINBYTES >= 1 with -f > 1")
    if args.stepfactor == 1 and args.stepbytes == 0:
        parser.error("argument -i/--stepbytes: 0 would never reach -e: allowed is STEPBYTES >= 1")
    return args


def sweep_sizes(args):
    size, sizes = args.minbytes, []
    while size <= args.maxbytes:
        sizes.append(size)
        size = int(size * args.stepfactor) if args.stepfactor > 1 else size + args.stepbytes
    return sizes


# ----------------------------------------------------------------------------- ranks, launch

def launch_env():
    """(rank, world size, launcher) from the launcher's environment; needs no torch."""
    env = os.environ
    for rank_key, size_key, launcher in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"),
                                         ("PMI_RANK", "PMI_SIZE", "mpirun"),
                                         ("RANK", "WORLD_SIZE", "torchrun")):
        if rank_key in env and size_key in env:
            try:
                rank, size = int(env[rank_key]), int(env[size_key])
            except ValueError:
                continue
            if launcher == "torchrun" and "TORCHELASTIC_RUN_ID" not in env:
                launcher = "env"  # RANK/WORLD_SIZE set by hand: our own store, as under mpirun
            return rank, size, launcher
    return 0, 1, "single"


def fail_usage(rank, message):
    if rank == 0:
        print(f"{TOOL}: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def rendezvous_plan(args, rank, size, launcher):
    """How this rank will meet the others, decided before torch is imported, so that a missing
    or bad port fails fast: ("torchrun",), ("local",) or ("tcp", addr, port)."""
    if launcher == "torchrun":
        return ("torchrun",)
    if size == 1 and "MASTER_PORT" not in os.environ and args.port is None:
        return ("local",)
    text = os.environ.get("MASTER_PORT")
    if text is not None:
        try:
            port = port_number(text)
        except argparse.ArgumentTypeError as error:
            fail_usage(rank, f"MASTER_PORT: {error}")
    elif args.port is not None:
        port = args.port
    else:
        fail_usage(rank, "no rendezvous port: set MASTER_PORT (or pass --port PORT) to a free TCP "
                         "port on rank 0's host, the same for every rank; MASTER_ADDR defaults to "
                         "127.0.0.1")
    return ("tcp", os.environ.get("MASTER_ADDR", "127.0.0.1"), port)


def rendezvous(dist, plan, rank, size):
    from datetime import timedelta
    if plan[0] == "torchrun":  # torchrun's agent already serves the store on MASTER_PORT
        dist.init_process_group("gloo", init_method="env://")
    elif plan[0] == "local":
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        _, addr, port = plan
        store = dist.TCPStore(addr, port, size, rank == 0, timeout=timedelta(seconds=300))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)


# ------------------------------------------------------------------------------- test inputs

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _mix64(z):
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return z ^ (z >> 31)


def _hash(np, rank, lo, hi):
    """splitmix64 of (rank, index) for index in [lo, hi): a counter-based generator, so any rank
    can rebuild any rank's input for any slice. Vectorized, uint64 arithmetic wraps mod 2^64."""
    z = np.arange(lo, hi, dtype=np.uint64)
    z *= np.uint64(_GOLDEN)
    z += np.uint64(_mix64((rank + 1) * _GOLDEN & _MASK64))
    t = np.empty_like(z)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        np.right_shift(z, np.uint64(shift), out=t)
        z ^= t
        if mult is not None:
            z *= np.uint64(mult)
    return z


def make_input(torch, np, type_name_, op, rank, lo, hi):
    """Rank `rank`'s input elements [lo, hi) as a tensor of the benchmark type.

    Floats: uniform in [-1, 1) (prod: [0.5, 1.5), so products neither vanish nor blow up),
    with 53 random bits for double and 24 for the others, rounded to the type by torch's
    conversion (round to nearest even). Signed ints: [-8, 8]; uint8: [0, 8]."""
    attr, _, kind = TYPES[type_name_]
    z = _hash(np, rank, lo, hi)
    if kind == "f":
        bits = 53 if type_name_ == "double" else 24
        u = (z >> np.uint64(64 - bits)).astype(np.float64)
        u *= 2.0**-bits  # [0, 1), exact
        if op == "prod":
            u += 0.5
        else:
            u *= 2.0
            u -= 1.0
        values = torch.from_numpy(u)
    else:
        span = 9 if kind == "u" else 17
        v = ((z >> np.uint64(32)) % np.uint64(span)).astype(np.int64)
        if kind == "i":
            v -= 8
        values = torch.from_numpy(v)
    return values.to(getattr(torch, attr))


def fill_input(torch, np, tensor, type_name_, op, rank):
    count = tensor.numel()
    for lo in range(0, count, CHECK_CHUNK):
        hi = min(count, lo + CHECK_CHUNK)
        tensor[lo:hi].copy_(make_input(torch, np, type_name_, op, rank, lo, hi))


# ------------------------------------------------------------------------------------- check

def check_slice(torch, np, outputs, type_name_, op, nranks, lo, hi):
    """Compares outputs[k][lo:hi] with the exact allreduce, rebuilt from every rank's input.

    Returns (max |out - exact| per output, max |exact|, max_i sum_r |x_r,i|) over the slice."""
    kind = TYPES[type_name_][2]
    diffs = [0.0] * len(outputs)
    exact_max = abs_sum_max = 0.0
    for c_lo in range(lo, hi, CHECK_CHUNK):
        c_hi = min(hi, c_lo + CHECK_CHUNK)
        acc = abs_sum = None
        for r in range(nranks):
            x = make_input(torch, np, type_name_, op, r, c_lo, c_hi)
            # floats: reference in float64; ints: in the type itself, wrapping mod 2^bits as
            # gloo (and NCCL) do; sum, prod, min and max are exact in modular arithmetic.
            x = x.to(torch.float64).numpy() if kind == "f" else x.numpy()
            if acc is None:
                acc = x.copy()
                abs_sum = np.abs(x) if kind == "f" else None
                continue
            if op in ("sum", "avg"):
                acc += x
            elif op == "prod":
                acc *= x
            elif op == "min":
                np.minimum(acc, x, out=acc)
            else:
                np.maximum(acc, x, out=acc)
            if kind == "f":
                abs_sum += np.abs(x)
        if op == "avg":
            if kind == "f":
                acc /= nranks
            else:  # truncating division of the (wrapped) sum, like C's / and torch's "trunc"
                s = acc.astype(np.int64)
                acc = np.sign(s) * (np.abs(s) // nranks)
        exact = acc.astype(np.float64)
        if exact.size:
            exact_max = max(exact_max, float(np.max(np.abs(exact))))
            if abs_sum is not None:
                abs_sum_max = max(abs_sum_max, float(np.max(abs_sum)))
            for k, out in enumerate(outputs):
                got = out[c_lo:c_hi].to(torch.float64).numpy()
                # NaN in the output propagates through max and fails the row.
                diffs[k] = max(diffs[k], float(np.max(np.abs(got - exact))))
    return diffs, exact_max, abs_sum_max


def gamma(k, u):
    """Higham's gamma_k = k u / (1 - k u): the relative error of k rounded operations."""
    return k * u / (1.0 - k * u)


def error_bound(type_name_, op, nranks, exact_max, abs_sum_max):
    """What float rounding allows for max |out - exact| / max |exact| (the `error` column).

    With u the type's unit roundoff, N ranks, x_r the inputs (exactly representable in the
    type), S = sum_r x_r and A = max over elements of sum_r |x_r|:
      sum:  the N-1 rounded additions, in any order (ring, tree) give |fl - S| <= gamma_{N-1}(u) A;
            the float64 reference is exact for the narrow types and adds gamma_{N-1}(2^-53) A
            for double, so the bound is (gamma_{N-1}(u) + gamma_{N-1}(2^-53)) A / max|S|.
      avg:  sum, then one division by N in the type (two roundings for half/bfloat16, computed
            in float32 then rounded): + 2u (1 + gamma) max|S|/N, i.e. the sum bound
            (1 + 2u) + 2u, relative to max|S/N|.
      prod: every product rounds with relative error u: |fl - P| <= gamma_{N-1}(u) |P| (+ the
            reference's gamma_{N-1}(2^-53)), plus N smallest subnormals for underflow.
      min, max, and every op on integers (modular arithmetic): exact, bound 0.
    Since |x| < 1.5 the bound is at most about N^2 u in the worst case; with random inputs
    it is near (N-1) u."""
    if TYPES[type_name_][2] != "f" or op in ("min", "max"):
        return 0.0
    u = UNIT_ROUNDOFF[type_name_]
    g = gamma(nranks - 1, u) + gamma(nranks - 1, U64)
    denom = exact_max if exact_max > 0 else 1.0
    if op == "sum":
        return g * abs_sum_max / denom
    if op == "avg":
        return (g * abs_sum_max / nranks * (1 + 2 * u) + 2 * u * exact_max) / denom
    return g + nranks * SMALLEST[type_name_] / denom  # prod


# ------------------------------------------------------------------------------------ output

def time_str(us):
    if us >= 10000.0:
        return "%7.0f" % us
    if us >= 100.0:
        return "%7.1f" % us
    return "%7.2f" % us


def finite_or_none(x):
    return x if x is not None and math.isfinite(x) else None


# The column headers of perf/perf.cc, character for character.
HEADER = (
    "#                                                              out-of-place                        in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw    error     time   algbw   busbw    error  agree   wire\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)              (us)  (GB/s)  (GB/s)                  (B/B)"
)


# -------------------------------------------------------------------------------------- main

def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank, nranks, launcher = launch_env()
    plan = rendezvous_plan(args, rank, nranks, launcher)
    if rank == 0 and args.output_file:
        folder = os.path.dirname(os.path.abspath(args.output_file))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            fail_usage(rank, f"argument -J/--output_file: cannot write {args.output_file!r}: "
                             f"allowed is a file in an existing, writable folder")
    try:
        import numpy as np
        import torch
        import torch.distributed as dist
    except ImportError as error:
        if rank == 0:
            print(f"{TOOL}: torch is not installed ({error}): pip install torch", file=sys.stderr)
        return EXIT_NO_TORCH
    if not dist.is_available() or not dist.is_gloo_available():
        if rank == 0:
            print(f"{TOOL}: this torch {torch.__version__} has no torch.distributed gloo backend: "
                  f"pip install torch", file=sys.stderr)
        return EXIT_NO_TORCH
    # One intra-op thread per rank: the ranks of a node share its cores (4 ranks on 2 cores in
    # CI), the timed work besides gloo's own threads is memory-bound copies and divisions, and
    # extra threads per rank would only oversubscribe the cores and add noise to the timings.
    torch.set_num_threads(1)

    rendezvous(dist, plan, rank, nranks)
    rank, nranks = dist.get_rank(), dist.get_world_size()
    try:
        return benchmark(torch, np, dist, args, rank, nranks)
    finally:
        dist.destroy_process_group()


def benchmark(torch, np, dist, args, rank, nranks):
    tname, op = args.datatype, args.op
    dtype = getattr(torch, TYPES[tname][0])
    elsize, kind = TYPES[tname][1], TYPES[tname][2]
    check = args.check == 1
    gloo_op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
               "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
    # Bytes on the wire per input byte and rank, and nccl-tests' busbw factor: gloo runs large
    # allreduces as a ring (reduce-scatter then allgather), which sends 2(N-1)/N of the data per
    # rank, uncompressed. This is the assumed algorithm, not a measured byte count.
    factor = 2.0 * (nranks - 1) / nranks

    def reduce_in_place(buf):
        dist.all_reduce(buf, op=gloo_op)
        if op == "avg":
            # gloo has no AVG: sum, then divide in place. The division is part of the timed call,
            # as NCCL's ncclAvg also does the division inside the collective.
            if kind == "f":
                buf.div_(nranks)
            else:
                buf.div_(nranks, rounding_mode="trunc")

    def out_of_place(send, recv):
        # torch's all_reduce is in place only: copy, then reduce. The copy is timed, as NCCL's
        # out-of-place allreduce also reads sendbuff and writes every byte of recvbuff.
        recv.copy_(send)
        reduce_in_place(recv)

    def gather(values, dtype_=torch.float64):
        mine = torch.tensor(values, dtype=dtype_)
        parts = [torch.empty_like(mine) for _ in range(nranks)]
        dist.all_gather(parts, mine)
        return torch.stack(parts)  # [nranks, len(values)]

    def combine(per_rank):  # -a: rank 0's time, the average, the minimum or the maximum
        return {0: per_rank[0], 1: sum(per_rank) / len(per_rank), 2: min(per_rank),
                3: max(per_rank)}[args.average]

    def timed(fn):
        """(mean, median) seconds per call over -n calls."""
        dist.barrier()
        calls = []
        start = time.perf_counter()
        for _ in range(args.iters):
            fn()
            calls.append(time.perf_counter())
        total = calls[-1] - start
        calls = sorted(b - a for a, b in zip([start] + calls[:-1], calls))
        return total / args.iters, (calls[(len(calls) - 1) // 2] + calls[len(calls) // 2]) / 2

    if rank == 0:
        step = (f"{args.stepfactor:g}(factor)" if args.stepfactor > 1 else f"{args.stepbytes}(bytes)")
        print(f"# {TOOL}: nranks {nranks} minBytes {args.minbytes} maxBytes {args.maxbytes} "
              f"step: {step} warmup iters: {args.warmup_iters} iters: {args.iters} validation: "
              f"{args.check} blocking: {args.blocking} average: {args.average} memory: host")
        print("#")
        print(f"# torch {torch.__version__}: torch.distributed all_reduce, backend gloo")
        print(HEADER, flush=True)

    sizes = sweep_sizes(args)
    for size in sorted({sizes[-1], sizes[0]}, reverse=True):  # warm-up, as nccl-tests does
        buf = torch.zeros(size // elsize, dtype=dtype)
        for _ in range(args.warmup_iters):
            reduce_in_place(buf)
    rows, failures = [], []
    for size in sizes:
        count = size // elsize
        nbytes = count * elsize
        send = torch.empty(count, dtype=dtype)
        recv = torch.empty(count, dtype=dtype)
        # The checked inputs are the timed inputs too. In-place timing reduces recv over and
        # over (values grow for sum/prod, as in nccl-tests); it starts from the reduced inputs.
        fill_input(torch, np, send, tname, op, rank)
        recv.copy_(send)
        placements = PLACEMENTS[args.placement]  # 0 out of place, 1 in place
        calls = {0: lambda: out_of_place(send, recv), 1: lambda: reduce_in_place(recv)}
        for _ in range(args.settle):
            calls[placements[0]]()
        if args.settle:
            recv.copy_(send)
        times = gather([t for k in placements for t in timed(calls[k])])  # mean, median each
        secs = {k: combine(times[:, 2 * i].tolist()) for i, k in enumerate(placements)}
        medians = {k: combine(times[:, 2 * i + 1].tolist()) for i, k in enumerate(placements)}

        errors, bounds, agrees = {}, {}, {}
        if check:
            recv.copy_(send)
            if 0 in placements:
                out_of_place(send, recv)  # out-of-place result in recv
            if 1 in placements:
                reduce_in_place(send)     # in-place result in send (its input is still there)
            outputs = [recv if k == 0 else send for k in placements]
            # Each rank checks its 1/N slice against the exact result; the hashes prove that
            # every rank holds the same bytes, so together the slices cover every output.
            lo, hi = count * rank // nranks, count * (rank + 1) // nranks
            diffs, exact_max, abs_sum_max = check_slice(torch, np, outputs, tname, op,
                                                        nranks, lo, hi)
            digests = [int.from_bytes(hashlib.blake2b(t.view(torch.uint8).numpy(),
                                                      digest_size=8).digest(), "little", signed=True)
                       for t in outputs]
            stats = gather(diffs + [exact_max, abs_sum_max])
            hashes = gather(digests, torch.int64)
            m = len(placements)
            exact_max, abs_sum_max = stats[:, m].max().item(), stats[:, m + 1].max().item()
            denom = exact_max if exact_max > 0 else 1.0
            bound = error_bound(tname, op, nranks, exact_max, abs_sum_max)
            for i, k in enumerate(placements):
                # torch's max propagates NaN: a NaN anywhere in an output fails its row.
                errors[k] = stats[:, i].max().item() / denom
                bounds[k] = bound
                agrees[k] = bool((hashes[:, i] == hashes[0, i]).all())
                problems = []
                if not errors[k] <= bound:
                    problems.append(f"error {errors[k]:.1e} of max |exact| is over the bound "
                                    f"{bound:.1e}")
                if not agrees[k]:
                    odd = [r for r in range(nranks) if hashes[r, i] != hashes[0, i]]
                    problems.append(f"ranks disagree: the output of rank(s) "
                                    f"{', '.join(map(str, odd))} differs from rank 0's")
                if problems:
                    failures.append(f"{nbytes} B {tname} {op} {PLACEMENT_NAMES[k]}: " +
                                    "; ".join(problems))
        del send, recv

        line = "%12d  %12d  %8s  %6s  %6d" % (nbytes, count, tname, op, -1)
        for k, placement in enumerate(PLACEMENT_NAMES):
            if k not in placements:  # left out by --placement
                line += "  %7s  %6s  %6s  %7s" % ("N/A", "N/A", "N/A", "N/A")
                continue
            us = secs[k] * 1e6
            algbw = nbytes / secs[k] / 1e9 if secs[k] > 0 else 0.0
            busbw = algbw * factor
            line += "  %7s  %6.2f  %6.2f  %7s" % (time_str(us), algbw, busbw,
                                                  "%.1e" % errors[k] if check else "N/A")
            ok = (errors[k] <= bounds[k] and agrees[k]) if check else None
            rows.append({"size": nbytes, "count": count, "type": tname, "redop": op, "root": -1,
                         "placement": placement, "time_us": us,
                         "time_us_median": medians[k] * 1e6 if args.blocking else None,
                         "algbw_gbps": algbw,
                         "busbw_gbps": busbw, "error": finite_or_none(errors[k]) if check else None,
                         "bound": bounds.get(k), "agree": agrees.get(k), "ok": ok,
                         "compressed": False, "algo": None, "wire_bytes_per_input_byte": factor})
        agree_str = ("yes" if all(agrees.values()) else "NO") if check else "N/A"
        line += "  %5s  %5.3f" % (agree_str, factor)
        if rank == 0:
            print(line, flush=True)

    avg_busbw = sum(r["busbw_gbps"] for r in rows) / len(rows) if rows else 0.0
    status = ("FAILED" if failures else "OK") if check else "off"
    if rank == 0:
        if check:  # maxima over the rows, as the C binaries print them; no line with -c 0
            worst = max([r["error"] if r["error"] is not None else math.inf for r in rows] or [0.0])
            bound = max([r["bound"] for r in rows] or [0.0])
            agree = "yes" if all(r["agree"] for r in rows) else "NO"
            print(f"# Errors: max {worst:.1e} of max |exact| (bound {bound:.1e}), "
                  f"ranks agree bit for bit: {agree}")
        print(f"# Check: {status}")
        print(f"# Avg bus bandwidth    : {avg_busbw:g} ")
        print("#", flush=True)
        for failure in failures:
            print(f"{TOOL}: check FAILED at {failure}", file=sys.stderr)
        if args.output_file:
            report = {
                "tool": TOOL, "collective": "allreduce", "backend": "torch-gloo",
                "version": torch.__version__, "nranks": nranks, "qnccl": None,
                "options": {"minbytes": args.minbytes, "maxbytes": args.maxbytes,
                            "stepfactor": args.stepfactor, "stepbytes": args.stepbytes,
                            "iters": args.iters, "warmup_iters": args.warmup_iters,
                            "check": args.check, "blocking": args.blocking,
                            "average": args.average, "datatype": tname, "op": op,
                            "memory": "host", "placement": args.placement},
                "rows": rows, "avg_busbw_gbps": avg_busbw, "check": status,
            }
            with open(args.output_file, "w") as f:
                json.dump(report, f, indent=1)
                f.write("\n")
    # Every rank returns the same status; none leaves before rank 0 has written everything, as
    # mpirun aborts the job (rank 0 included) when the first rank exits non-zero.
    dist.barrier()
    return EXIT_FAILED if failures else EXIT_OK


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gloo_ranks  # the way out of a gloo job that cannot abort at exit
    gloo_ranks.finish(main())
