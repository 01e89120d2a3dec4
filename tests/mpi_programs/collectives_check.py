"""qncclReduceScatter on real ranks against the emulator (docs/collectives.md).

    mpirun -np N python collectives_check.py reducescatter
    mpirun -np N python collectives_check.py counts
    mpirun -np N python collectives_check.py misuse
    QNCCL_COLLECTIVES=... mpirun -np N python collectives_check.py interposed

reducescatter  ring/SRA/auto x float32/float16/bfloat16 x recvcounts (0, 1, 300, 7919, 5003
               in segments of 960, 1000 in buckets of 1), both roundings, sum/avg, in place
               (recvbuff = sendbuff + rank * recvcount) or not, bits 1..8, 64-bit seeds,
               segments on 1 or 2 pipeline lanes, NaN/Inf inputs; interleaved with
               allreduce calls (one call counter). Rank 0 gathers every output and checks
               it bit for bit against qnccl.emulate.reduce_scatter / allreduce; out of
               place, every send buffer is untouched.
counts         the compute steps and real NCCL groups one reduce-scatter of one segment
               costs each rank (qncclCommGetStats), ring and SRA x sum/avg, against
               docs/collectives.md; each call also matches the emulator.
interposed     ncclReduceScatter and ncclAllReduce through libqnccl's interposed entry points
               under the QNCCL_* environment of the job: with reducescatter in
               QNCCL_COLLECTIVES, bit for bit the emulator at QNCCL_REDUCESCATTER_BITS (else
               QNCCL_BITS), also inside a group with an allreduce and on two communicators
               at once; without it, and below QNCCL_MIN_BYTES, byte-identical to the real
               NCCL's own ncclReduceScatter.
misuse         algo tree or hier, errorFeedback 1, op ncclMax, overlapping buffers that are
               not in place: ncclInvalidArgument naming the argument and what is allowed,
               on every rank, without counting as a call (a valid stochastic call then
               matches the emulator's call 0).

Prints one line per failure, then a summary; exits non-zero on any failure.
"""
import argparse
import dataclasses
import itertools
import os
import sys

import numpy as np

from allreduce_check import (COMM, NCCL_TYPES, NRANKS, OPS, RANK, UNWRITTEN, Case,
                             Failures, bits_of, call_allreduce, check_nccl, ffi, finish,
                             init_comm, lib, make_config, nccl, rank_input)
from qnccl.emulate import allreduce as emulate_allreduce
from qnccl.emulate import reduce_scatter as emulate_reduce_scatter


def call_reduce_scatter(comm, case, x):
    """(result, message, output, send buffer afterwards) of qncclReduceScatter on this rank:
    x holds NRANKS * case.count values."""
    send = x.copy()
    n = case.count
    recv = (send[RANK * n:(RANK + 1) * n] if case.inplace
            else np.full(n * x.itemsize, UNWRITTEN, np.uint8).view(x.dtype))
    result = lib.qncclReduceScatter(ffi.from_buffer(send), ffi.from_buffer(recv), n,
                                    NCCL_TYPES[case.dtype], OPS[case.op], make_config(case), comm,
                                    ffi.NULL)
    message = "" if result == lib.ncclSuccess else ffi.string(lib.qncclGetLastError()).decode()
    return result, message, recv.copy(), send


def emulator_kwargs(case, call):
    return dict(bits=case.bits, bucket_size=case.bucket, rounding=case.rounding, seed=case.seed,
                op=case.op, call=call, segment_values=case.segment_values, dtype=case.dtype)


def run(comm, calls, failures, first_call=0):
    """calls: [(kind, case)] run in order on every rank ("rs" or "ar"), the first being the
    communicator's call `first_call`; rank 0 checks."""
    for call, (kind, case) in enumerate(calls, start=first_call):
        whole = dataclasses.replace(case, count=case.count * (NRANKS if kind == "rs" else 1))
        x = rank_input(whole, RANK)
        if kind == "rs":
            result, message, out, send = call_reduce_scatter(comm, case, x)
        else:
            result, message, out, send = call_allreduce(comm, case, x)
        touched = not case.inplace and bits_of(send).tobytes() != bits_of(x).tobytes()
        gathered = COMM.gather((result, message, out, touched), root=0)
        if RANK != 0:
            continue
        inputs = [rank_input(whole, r) for r in range(NRANKS)]
        if kind == "rs":
            expected = emulate_reduce_scatter(inputs, algo=case.algo, **emulator_kwargs(case, call))
        else:
            expected = emulate_allreduce(inputs, algo=case.algo, **emulator_kwargs(case, call))
        label = f"{kind} call {call} {case}"
        for r, (res, msg, got, was_touched) in enumerate(gathered):
            if res != lib.ncclSuccess:
                failures.add(label, f"rank {r} returned {res}: {msg}")
                continue
            differ = np.flatnonzero(bits_of(got) != bits_of(expected[r]))
            if differ.size:
                i = differ[0]
                failures.add(label, f"rank {r} differs from the emulator at {differ.size} values, "
                             f"first {i}: {bits_of(got)[i]:#x} != {bits_of(expected[r])[i]:#x}")
            if was_touched:
                failures.add(label, f"rank {r}: the send buffer changed (out of place)")


def reducescatter(comm, failures):
    rng = np.random.default_rng(20261124)
    shapes = [(0, 128, 0), (1, 128, 0), (300, 128, 0), (7919, 64, 0), (5003, 128, 960),
              (1000, 1, 0)]
    calls = []
    for i, ((count, bucket, seg), algo, dtype) in enumerate(itertools.product(
            shapes, ("ring", "sra", "auto"), ("float32", "float16", "bfloat16"))):
        case = Case(algo, dtype, count, rounding=("stochastic", "nearest")[i % 2],
                    op=("sum", "avg")[i // 2 % 2], inplace=i % 3 == 1,
                    bits=int(rng.integers(1, 9)), bucket=bucket, segment_values=seg,
                    seed=int(rng.integers(0, 2**64, dtype=np.uint64)), lanes=1 + (i % 4 == 3))
        calls.append(("rs", case))
        if i % 7 == 0:  # the call counter is shared with allreduce
            calls.append(("ar", Case("sra", dtype, 3000, seed=i, bucket=bucket)))
    for algo in ("ring", "sra"):  # NaN and Inf: their buckets decode to NaN, the rest stays
        calls.append(("rs", Case(algo, "float32", 700, data="special", seed=7, bucket=32)))
    run(comm, calls, failures)
    return len(calls)


def expected_counts(algo, op):
    """(compute steps, groups) of one reduce-scatter of one segment (docs/collectives.md)."""
    n = NRANKS
    if algo == "sra":  # the N-1 encodes in one step (none alone), the reduction, the store
        steps = (1 if n > 1 else 0) + 2
    else:  # N-1 hops of encode and reduction (alone: the widening), the store
        steps = 2 * (n - 1) + (1 if n == 1 else 0) + 1
    return steps + (op == "avg"), n - 1


def counts(comm, failures):
    import qnccl.comm
    cases = [Case(algo, "float32", 4096, op=op, seed=43)
             for algo in ("ring", "sra") for op in ("sum", "avg")]
    for i, case in enumerate(cases):
        before = qnccl.comm.stats(comm)
        run(comm, [("rs", case)], failures, first_call=i)
        after = qnccl.comm.stats(comm)
        got = (after["compute_steps"] - before["compute_steps"], after["groups"] - before["groups"])
        everyone = COMM.gather(got, root=0)
        if RANK == 0:
            want = expected_counts(case.algo, case.op)
            for rank, g in enumerate(everyone):
                if g != want:
                    failures.add(case, f"rank {rank}: (compute steps, groups) = {g}, expected "
                                 f"{want}")
    return len(cases)


def misuse(comm, failures):
    n = 300
    x = rank_input(Case("sra", "float32", NRANKS * n), RANK)
    send = x.copy()
    recv = np.zeros(n, np.float32)
    bad = [
        (dataclasses.replace(Case("sra", "float32", n), algo="tree"), lib.ncclSum,
         "algo = 2 has no reduce-scatter; allowed: qncclAlgoAuto (0), qncclAlgoRing (1), "
         "qncclAlgoSra (3)"),
        (Case("hier", "float32", n), lib.ncclSum, "algo = 4 has no reduce-scatter"),
        (Case("sra", "float32", n), lib.ncclMax, "op = 2 is not a quantized reduction"),
    ]
    lines = []
    for case, op, want in bad:
        result = lib.qncclReduceScatter(ffi.from_buffer(send), ffi.from_buffer(recv), n,
                                        lib.ncclFloat32, op, make_config(case), comm, ffi.NULL)
        message = ffi.string(lib.qncclGetLastError()).decode()
        if result != lib.ncclInvalidArgument or want not in message:
            lines.append(f"{case} op {op}: returned {result} ({message!r}); expected "
                         f"ncclInvalidArgument with {want!r}")
    config = make_config(Case("sra", "float32", n))
    config.errorFeedback = 1
    result = lib.qncclReduceScatter(ffi.from_buffer(send), ffi.from_buffer(recv), n,
                                    lib.ncclFloat32, lib.ncclSum, config, comm, ffi.NULL)
    message = ffi.string(lib.qncclGetLastError()).decode()
    if result != lib.ncclInvalidArgument or "error feedback applies to allreduce only" not in message:
        lines.append(f"errorFeedback 1: returned {result} ({message!r})")
    # overlapping but not in place: recvbuff one value past this rank's chunk
    shifted = ffi.from_buffer(send) + (RANK * n + 1) * 4
    result = lib.qncclReduceScatter(ffi.from_buffer(send), shifted, n, lib.ncclFloat32,
                                    lib.ncclSum, make_config(Case("sra", "float32", n)), comm,
                                    ffi.NULL)
    message = ffi.string(lib.qncclGetLastError()).decode()
    if (result != lib.ncclInvalidArgument
            or "overlap without recvbuff being sendbuff + rank * recvcount" not in message):
        lines.append(f"overlap: returned {result} ({message!r})")
    if bits_of(send).tobytes() != bits_of(x).tobytes():
        lines.append("a rejected call changed the send buffer")
    for rank, rank_lines in enumerate(COMM.gather(lines, root=0) or []):
        for line in rank_lines:
            failures.add(f"misuse rank {rank}", line)
    # nothing above counted: this is call 0
    run(comm, [("rs", Case("sra", "float32", 1000, seed=3))], failures)
    return len(bad) + 3


def interposed(comm, failures):
    """Calls through libqnccl's ncclReduceScatter/ncclAllReduce (what LD_PRELOAD gives a
    plain NCCL program), checked against the emulator or the real NCCL's own call."""
    policy = os.environ.get("QNCCL_COLLECTIVES", "allreduce").split(",")
    bits = int(os.environ.get("QNCCL_BITS", "4"))
    rs_bits = int(os.environ.get("QNCCL_REDUCESCATTER_BITS", bits))
    min_bytes = int(os.environ.get("QNCCL_MIN_BYTES", 64 << 10))
    other = init_comm()
    calls = {comm: 0, other: 0}  # each communicator's quantized calls so far
    checked = 0
    groups = [  # each: [(communicator, kind, case)], one group when longer than one
        [(comm, "rs", Case("auto", "float32", 20000, seed=1))],
        [(comm, "rs", Case("auto", "bfloat16", 9000, op="avg", seed=2, inplace=True))],
        [(comm, "rs", Case("auto", "float16", 100, seed=3))],  # below QNCCL_MIN_BYTES
        [(comm, "rs", Case("auto", "float32", 30000, seed=4)),
         (other, "rs", Case("auto", "float32", 17000, seed=5)),
         (comm, "ar", Case("auto", "float32", 40000, seed=6)),
         (other, "ar", Case("auto", "float16", 25000, op="avg", seed=7)),
         (comm, "rs", Case("auto", "float16", 12000, op="avg", seed=8, inplace=True))],
    ]
    for group in groups:
        issued = []
        if len(group) > 1:
            check_nccl(lib.ncclGroupStart(), "ncclGroupStart")
        for c, kind, case in group:
            n = case.count * (NRANKS if kind == "rs" else 1)
            x = rank_input(dataclasses.replace(case, count=n), RANK)
            send = x.copy()
            if kind == "rs":
                recv = (send[RANK * case.count:(RANK + 1) * case.count] if case.inplace
                        else np.zeros(case.count, x.dtype))
                res = lib.ncclReduceScatter(ffi.from_buffer(send), ffi.from_buffer(recv),
                                            case.count, NCCL_TYPES[case.dtype], OPS[case.op], c,
                                            ffi.NULL)
            else:
                recv = send if case.inplace else np.zeros_like(x)
                res = lib.ncclAllReduce(ffi.from_buffer(send), ffi.from_buffer(recv), case.count,
                                        NCCL_TYPES[case.dtype], OPS[case.op], c, ffi.NULL)
            check_nccl(res, f"{kind} {case}")
            issued.append((c, kind, case, x, recv, send))  # a group reads send at its end
        if len(group) > 1:
            check_nccl(lib.ncclGroupEnd(), "ncclGroupEnd")
        for c, kind, case, x, recv, _ in issued:
            itemsize = x.itemsize
            quantized = (("reducescatter" if kind == "rs" else "allreduce") in policy
                         and case.count * itemsize >= min_bytes)
            if kind == "rs" and not quantized:  # the real NCCL's own result, bytes and all
                want = np.zeros(case.count, x.dtype)
                check_nccl(nccl.ncclReduceScatter(ffi.from_buffer(x.copy()),
                                                  ffi.from_buffer(want), case.count,
                                                  NCCL_TYPES[case.dtype], OPS[case.op], c,
                                                  ffi.NULL), "the real ncclReduceScatter")
                mine = [want]
            else:
                mine = None
            outs = COMM.gather((bits_of(recv).tobytes(), None if mine is None
                                else bits_of(mine[0]).tobytes()), root=0)
            n = case.count * (NRANKS if kind == "rs" else 1)
            if RANK == 0:
                label = f"interposed {kind} {case} ({'quantized' if quantized else 'exact'})"
                if quantized:
                    inputs = [rank_input(dataclasses.replace(case, count=n), r)
                              for r in range(NRANKS)]
                    kw = dict(bits=rs_bits if kind == "rs" else bits, bucket_size=128,
                              rounding="stochastic", seed=0, op=case.op, call=calls[c],
                              dtype=case.dtype)
                    expected = (emulate_reduce_scatter(inputs, **kw) if kind == "rs"
                                else emulate_allreduce(inputs, **kw))
                    wants = [bits_of(e).tobytes() for e in expected]
                else:
                    wants = [w for _, w in outs] if kind == "rs" else None
                for r, (got, _) in enumerate(outs):
                    if wants is not None and got != wants[r]:
                        failures.add(label, f"rank {r} differs from the "
                                     f"{'emulator' if quantized else 'real NCCL'}")
            if quantized:
                calls[c] += 1
            checked += 1
    check_nccl(lib.ncclCommDestroy(other), "ncclCommDestroy")
    return checked


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("program", choices=("reducescatter", "counts", "misuse", "interposed"))
    args = parser.parse_args()
    comm = init_comm()
    failures = Failures()
    programs = {"reducescatter": reducescatter, "counts": counts, "misuse": misuse,
                "interposed": interposed}
    return finish(comm, failures, args.program, programs[args.program](comm, failures))


if __name__ == "__main__":
    sys.exit(main())
