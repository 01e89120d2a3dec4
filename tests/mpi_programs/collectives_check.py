"""qncclReduceScatter, qncclAllGather and qncclAlltoAll on real ranks against the emulator
(docs/collectives.md).

    mpirun -np N python collectives_check.py reducescatter|allgather|alltoall
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
allgather      the same shapes, types, roundings, bits, lanes and specials, in place
alltoall       (allgather: sendbuff = recvbuff + rank * sendcount; all-to-all: sendbuff ==
               recvbuff) or not, interleaved with reduce-scatters and allreduces: bit for bit
               qnccl.emulate.allgather / alltoall; every allgather output is the same bytes
               on every rank.
rotated        the three kinds interleaved with a Hadamard rotation (docs/rotation.md): the
               same shapes (tails that are not a whole block, several segments, counts 0
               and 1), types, roundings, ops, in place or not, bits, lanes and specials,
               blocks 2..4096, every third call clipped: bit for bit the emulator's
               rotation="hadamard" (and clip="gaussian"); an all-to-all's own chunk still
               exact.
counts         the compute steps and real NCCL groups one call of one segment costs each
               rank (qncclCommGetStats): reduce-scatter ring and SRA x sum/avg, allgather,
               all-to-all in place and not, each also rotated (three steps more: the
               signs' table, the rotation of the pieces in and of the pieces out), against
               docs/collectives.md; each call also matches the emulator.
interposed     ncclReduceScatter, ncclAllGather, ncclAlltoAll and ncclAllReduce through
               libqnccl's interposed entry points under the QNCCL_* environment of the job
               (QNCCL_ROTATION and QNCCL_ROTATION_BLOCK included):
               the collectives QNCCL_COLLECTIVES names, bit for bit the emulator at
               QNCCL_<NAME>_BITS (else QNCCL_BITS), also inside a group of all four kinds on
               two communicators at once; the others, and calls below QNCCL_MIN_BYTES,
               byte-identical to the real NCCL's own call.
sendrecv       ncclSend/ncclRecv through libqnccl under the job's QNCCL_* environment: PyTorch's
               all-to-all (a group of a send and a receive per rank, itself included), a
               group of two sends of different types to the right neighbour (one below
               QNCCL_MIN_BYTES) with an allreduce, and lone sends between rank pairs; with
               sendrecv in QNCCL_COLLECTIVES bit for bit qnccl.emulate.alltoall(call=P2P_CALL
               | c) and sendrecv, else byte-identical to the real NCCL's sends.
policy         (QNCCL_COLLECTIVES=none) a communicator's own policy through qnccl.comm
               (qncclCommSetQuantization): its reduce-scatters at 3 bits while another
               communicator's stay exact, an all-to-all at 4 then 2 bits for one call each
               (qnccl.comm.quantization), 0 (exact) and None (the environment again), what
               get_quantization reports, and bad arguments' messages.
misuse         reduce-scatter: algo tree or hier, op ncclMax; allgather and all-to-all: algo
               other than auto; all three: errorFeedback 1, a rotation block that is not a
               power of two, overlapping buffers that are
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

from allreduce_check import (COMM, NCCL_TYPES, NRANKS, OPS, RANK, STREAM, UNWRITTEN, Case,
                             Failures, bits_of, check_nccl, ffi, finish, init_comm, lib,
                             make_config, nccl, ptr, rank_input, synced)
from qnccl import emulate

# kind: (its name in QNCCL_COLLECTIVES, chunks of `count` values in the input, in the output)
KINDS = {"ar": ("allreduce", 1, 1), "rs": ("reducescatter", NRANKS, 1),
         "ag": ("allgather", 1, NRANKS), "a2a": ("alltoall", NRANKS, NRANKS)}


def buffers(kind, case, x):
    """(send, recv) of this rank for input x, in place as the API defines it."""
    n = case.count
    _, _, out_chunks = KINDS[kind]
    recv = np.full(n * out_chunks * x.itemsize, UNWRITTEN, np.uint8).view(x.dtype)
    if not case.inplace:
        return x.copy(), recv
    if kind == "ag":  # sendbuff is chunk `rank` of recvbuff
        recv[RANK * n:(RANK + 1) * n] = x
        return recv[RANK * n:(RANK + 1) * n], recv
    send = x.copy()
    return send, send[RANK * n:(RANK + 1) * n] if kind == "rs" else send


def issue(api, kind, send, recv, case, comm, config=None):
    """One call of `kind` through `api`: the library's qncclXxx (with config) or an NCCL
    library's ncclXxx (lib: the interposed one; nccl: the real one)."""
    args = [ptr(send), ptr(recv), case.count, NCCL_TYPES[case.dtype]]
    if kind in ("ar", "rs"):
        args.append(OPS[case.op])
    if config is not None:
        args.append(config)
    prefix = "qncclAllReduce" if config is not None else "ncclAllReduce"
    name = {"ar": prefix, "rs": prefix.replace("AllReduce", "ReduceScatter"),
            "ag": prefix.replace("AllReduce", "AllGather"),
            "a2a": prefix.replace("AllReduce", "AlltoAll")}[kind]
    return getattr(api, name)(*args, comm, STREAM)


def call_library(kind, comm, case, x):
    """(result, message, output, send buffer afterwards) of the qncclXxx call of `kind` on
    this rank; x holds the call's input (chunks of case.count values)."""
    send, recv = buffers(kind, case, x)
    result = issue(lib, kind, send, recv, case, comm, make_config(case))
    message = "" if result == lib.ncclSuccess else ffi.string(lib.qncclGetLastError()).decode()
    if result == lib.ncclSuccess:
        synced(send, recv)
    return result, message, recv.copy(), send.copy()


def emulated(kind, inputs, case, call, bits=None):
    """What the emulator says every rank's output of call `call` of `kind` is."""
    kw = dict(bits=case.bits if bits is None else bits, bucket_size=case.bucket,
              rounding=case.rounding, seed=case.seed, call=call,
              segment_values=case.segment_values, dtype=case.dtype)
    if case.rotation_block:
        kw.update(rotation="hadamard", rotation_block=case.rotation_block,
                  clip="gaussian" if case.clip else "none")
    if kind == "ar":
        return emulate.allreduce(inputs, algo=case.algo, op=case.op, **kw)
    if kind == "rs":
        return emulate.reduce_scatter(inputs, algo=case.algo, op=case.op, **kw)
    return (emulate.allgather if kind == "ag" else emulate.alltoall)(inputs, **kw)


def whole(kind, case):
    """The case of one rank's whole input."""
    return dataclasses.replace(case, count=case.count * KINDS[kind][1])


def run(comm, calls, failures, first_call=0):
    """calls: [(kind, case)] run in order on every rank, the first being the communicator's
    call `first_call`; rank 0 checks."""
    for call, (kind, case) in enumerate(calls, start=first_call):
        x = rank_input(whole(kind, case), RANK)
        result, message, out, send = call_library(kind, comm, case, x)
        touched = not case.inplace and bits_of(send).tobytes() != bits_of(x).tobytes()
        gathered = COMM.gather((result, message, out, touched), root=0)
        if RANK != 0:
            continue
        inputs = [rank_input(whole(kind, case), r) for r in range(NRANKS)]
        expected = emulated(kind, inputs, case, call)
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
            if kind == "ag" and bits_of(got).tobytes() != bits_of(gathered[0][2]).tobytes():
                failures.add(label, f"rank {r}'s output differs from rank 0's")


SHAPES = [(0, 128, 0), (1, 128, 0), (300, 128, 0), (7919, 64, 0), (5003, 128, 960),
          (1000, 1, 0)]


def mixed_cases(kind, algos, seed, blocks=(0,)):
    """kind's calls over SHAPES x algos x types with varied settings, other kinds between;
    rotation blocks (0: none) rotate through the calls of `kind`, every third rotated call
    with clipped ranges (docs/rotation.md, "Clipped ranges")."""
    rng = np.random.default_rng(seed)
    calls = []
    for i, ((count, bucket, seg), algo, dtype) in enumerate(itertools.product(
            SHAPES, algos, ("float32", "float16", "bfloat16"))):
        case = Case(algo, dtype, count, rounding=("stochastic", "nearest")[i % 2],
                    op=("sum", "avg")[i // 2 % 2], inplace=i % 3 == 1,
                    bits=int(rng.integers(1, 9)), bucket=bucket, segment_values=seg,
                    seed=int(rng.integers(0, 2**64, dtype=np.uint64)), lanes=1 + (i % 4 == 3),
                    rotation_block=blocks[i % len(blocks)])
        case = dataclasses.replace(case, clip=bool(case.rotation_block) and i % 3 == 2)
        calls.append((kind, case))
        if i % 7 == 0:  # the call counter is shared by every kind
            calls.append(("ar", Case("sra", dtype, 3000, seed=i, bucket=bucket)))
        if i % 5 == 2 and kind != "rs":
            calls.append(("rs", Case("auto", dtype, 500, seed=i, bucket=bucket)))
    for algo in algos:  # NaN and Inf: their buckets decode to NaN, the rest stays
        calls.append((kind, Case(algo, "float32", 700, data="special", seed=7, bucket=32,
                                 rotation_block=max(blocks))))
    return calls


def reducescatter(comm, failures):
    calls = mixed_cases("rs", ("ring", "sra", "auto"), 20261124)
    run(comm, calls, failures)
    return len(calls)


def allgather(comm, failures):
    calls = mixed_cases("ag", ("auto",), 20261125)
    run(comm, calls, failures)
    return len(calls)


def alltoall(comm, failures):
    calls = mixed_cases("a2a", ("auto",), 20261126)
    run(comm, calls, failures)
    return len(calls)


ROTATION_BLOCKS = (256, 2, 64, 4096, 8, 1024, 16)


def rotated(comm, failures):
    calls = (mixed_cases("rs", ("ring", "sra"), 20261128, ROTATION_BLOCKS)
             + mixed_cases("ag", ("auto",), 20261129, ROTATION_BLOCKS[3:] + ROTATION_BLOCKS[:3])
             + mixed_cases("a2a", ("auto",), 20261130, ROTATION_BLOCKS[5:] + ROTATION_BLOCKS[:5]))
    run(comm, calls, failures)
    return len(calls)


def expected_counts(kind, case):
    """(compute steps, groups) of one call of one segment (docs/collectives.md); a rotated
    one makes the signs' table and rotates its pieces in and back out, one step each
    (docs/rotation.md), but an all-to-all alone, whose one chunk is its own, copied
    exactly."""
    n = NRANKS
    rotation = 3 * (case.rotation_block > 0 and (kind != "a2a" or n > 1))
    if kind == "ag":  # the encode, the decodes of all N pieces
        return 2 + rotation, n - 1
    if kind == "a2a":  # the N-1 encodes in one step, the copy (not in place), the decodes
        return 2 * (n > 1) + (not case.inplace) + rotation, n - 1
    if case.algo == "sra":  # the N-1 encodes in one step (none alone), the reduction, the store
        steps = (1 if n > 1 else 0) + 2
    else:  # N-1 hops of encode and reduction (alone: the widening), the store
        steps = 2 * (n - 1) + (1 if n == 1 else 0) + 1
    return steps + (case.op == "avg") + rotation, n - 1


def counts(comm, failures):
    import qnccl.comm
    cases = [("rs", Case(algo, "float32", 4096, op=op, seed=43))
             for algo in ("ring", "sra") for op in ("sum", "avg")]
    cases += [("ag", Case("auto", "float32", 4096, seed=44)),
              ("a2a", Case("auto", "float32", 4096, seed=45)),
              ("a2a", Case("auto", "float32", 4096, seed=46, inplace=True))]
    cases += [(kind, dataclasses.replace(case, rotation_block=64)) for kind, case in cases]
    for i, (kind, case) in enumerate(cases):
        before = qnccl.comm.stats(comm)
        run(comm, [(kind, case)], failures, first_call=i)
        after = qnccl.comm.stats(comm)
        got = (after["compute_steps"] - before["compute_steps"], after["groups"] - before["groups"])
        everyone = COMM.gather(got, root=0)
        if RANK == 0:
            want = expected_counts(kind, case)
            for rank, g in enumerate(everyone):
                if g != want:
                    failures.add(f"{kind} {case}", f"rank {rank}: (compute steps, groups) = {g}, "
                                 f"expected {want}")
    return len(cases)


def misuse(comm, failures):
    n = 300
    tree = dataclasses.replace(Case("sra", "float32", n), algo="tree")
    bad = [  # (kind, case, op, what the message must say)
        ("rs", tree, "sum", "algo = 2 has no reduce-scatter; allowed: qncclAlgoAuto (0), "
         "qncclAlgoRing (1), qncclAlgoSra (3)"),
        ("rs", Case("hier", "float32", n), "sum", "algo = 4 has no reduce-scatter"),
        ("rs", Case("sra", "float32", n), "max", "op = 2 is not a quantized reduction"),
        ("ag", Case("ring", "float32", n), "sum", "algo = 1; an allgather or all-to-all has one "
         "algorithm (every rank sends its bytes straight to the others): pass qncclAlgoAuto (0)"),
        ("a2a", Case("sra", "float32", n), "sum", "algo = 3; an allgather or all-to-all"),
    ]
    bad += [(kind, Case("auto", "float32", n), "feedback",
             "errorFeedback = 1; error feedback applies to allreduce only: pass 0")
            for kind in ("rs", "ag", "a2a")]
    bad += [(kind, Case("auto", "float32", n), "rotation",
             "rotationBlock = 48; allowed: 0 (the default, 256) or a power of two from 2 to "
             "16384") for kind in ("rs", "ag", "a2a")]
    lines = []
    for kind, case, op, want in bad:
        x = rank_input(whole(kind, case), RANK)
        send, recv = buffers(kind, case, x)
        config = make_config(case)
        config.errorFeedback = op == "feedback"
        if op == "rotation":
            config.codec.rotation = lib.qncclRotationHadamard
            config.codec.rotationBlock = 48
        args = [ffi.from_buffer(send), ffi.from_buffer(recv), n, lib.ncclFloat32]
        if kind == "rs":
            args.append(lib.ncclMax if op == "max" else lib.ncclSum)
        fn = {"rs": lib.qncclReduceScatter, "ag": lib.qncclAllGather,
              "a2a": lib.qncclAlltoAll}[kind]
        result = fn(*args, config, comm, ffi.NULL)
        message = ffi.string(lib.qncclGetLastError()).decode()
        if result != lib.ncclInvalidArgument or want not in message:
            lines.append(f"{kind} {case} {op}: returned {result} ({message!r}); expected "
                         f"ncclInvalidArgument with {want!r}")
        if bits_of(send).tobytes() != bits_of(x).tobytes():
            lines.append(f"{kind} {case} {op}: a rejected call changed the send buffer")
    # overlapping but not in place: recvbuff (sendbuff) one value past where in place puts it
    overlaps = [("rs", "sendbuff + rank * recvcount", RANK * n + 1),
                ("ag", "sendbuff - rank * sendcount", None), ("a2a", "sendbuff", 1)]
    for kind, in_place, shift in overlaps:
        memory = np.zeros(3 * NRANKS * n, np.float32)
        base = ffi.from_buffer(memory)
        if kind == "ag":  # sendbuff inside recvbuff, one value off its place
            send, recv = base + (RANK * n + 1) * 4, base
        else:
            send, recv = base, base + shift * 4
        args = [send, recv, n, lib.ncclFloat32] + ([lib.ncclSum] if kind == "rs" else [])
        fn = {"rs": lib.qncclReduceScatter, "ag": lib.qncclAllGather,
              "a2a": lib.qncclAlltoAll}[kind]
        result = fn(*args, make_config(Case("auto", "float32", n)), comm, ffi.NULL)
        message = ffi.string(lib.qncclGetLastError()).decode()
        if (result != lib.ncclInvalidArgument
                or f"overlap without recvbuff being {in_place}" not in message):
            lines.append(f"{kind} overlap: returned {result} ({message!r})")
    for rank, rank_lines in enumerate(COMM.gather(lines, root=0) or []):
        for line in rank_lines:
            failures.add(f"misuse rank {rank}", line)
    # nothing above counted: this is call 0
    run(comm, [("ag", Case("auto", "float32", 1000, seed=3))], failures)
    return len(bad) + len(overlaps) + 1


def env_rotation():
    """The rotation block the job's QNCCL_ROTATION and QNCCL_ROTATION_BLOCK ask for (0:
    none)."""
    if os.environ.get("QNCCL_ROTATION", "none") != "hadamard":
        return 0
    return int(os.environ.get("QNCCL_ROTATION_BLOCK", "256"))


def env_clip():
    """Whether the job's QNCCL_CLIP asks for clipped ranges."""
    return os.environ.get("QNCCL_CLIP", "none") == "gaussian"


def interposed(comm, failures):
    """Calls through libqnccl's ncclReduceScatter/ncclAllGather/ncclAlltoAll/ncclAllReduce
    (what LD_PRELOAD gives a plain NCCL program), checked against the emulator or the real
    NCCL's own call."""
    policy = os.environ.get("QNCCL_COLLECTIVES", "allreduce").split(",")
    bits = int(os.environ.get("QNCCL_BITS", "4"))
    min_bytes = int(os.environ.get("QNCCL_MIN_BYTES", 64 << 10))
    other = init_comm()
    calls = {comm: 0, other: 0}  # each communicator's quantized calls so far
    checked = 0
    groups = [  # each: [(communicator, kind, case)], one group when longer than one
        [(comm, "rs", Case("auto", "float32", 20000, seed=1))],
        [(comm, "rs", Case("auto", "bfloat16", 9000, op="avg", seed=2, inplace=True))],
        [(comm, "rs", Case("auto", "float16", 100, seed=3))],  # below QNCCL_MIN_BYTES
        [(comm, "ag", Case("auto", "float32", 20000, seed=11))],
        [(comm, "ag", Case("auto", "bfloat16", 40000, seed=12, inplace=True))],
        [(comm, "ag", Case("auto", "float16", 100, seed=13))],  # below QNCCL_MIN_BYTES
        [(comm, "a2a", Case("auto", "float32", 20000, seed=21))],
        [(comm, "a2a", Case("auto", "float16", 33000, seed=22, inplace=True))],
        [(comm, "a2a", Case("auto", "float32", 100, seed=23))],  # below QNCCL_MIN_BYTES
        [(comm, "rs", Case("auto", "float32", 30000, seed=4)),
         (other, "rs", Case("auto", "float32", 17000, seed=5)),
         (comm, "ar", Case("auto", "float32", 40000, seed=6)),
         (other, "ag", Case("auto", "float32", 25000, seed=9)),
         (comm, "a2a", Case("auto", "bfloat16", 36000, seed=10)),
         (other, "ar", Case("auto", "float16", 25000, op="avg", seed=7)),
         (comm, "rs", Case("auto", "float16", 12000, op="avg", seed=8, inplace=True))],
    ]
    for group in groups:
        issued = []
        if len(group) > 1:
            check_nccl(lib.ncclGroupStart(), "ncclGroupStart")
        for c, kind, case in group:
            x = rank_input(whole(kind, case), RANK)
            send, recv = buffers(kind, case, x)
            check_nccl(issue(lib, kind, send, recv, case, c), f"{kind} {case}")
            issued.append((c, kind, case, x, recv, send))  # a group reads send at its end
        if len(group) > 1:
            check_nccl(lib.ncclGroupEnd(), "ncclGroupEnd")
        synced(*[b for *_, recv, send in issued for b in (recv, send)])
        for c, kind, case, x, recv, _ in issued:
            name = KINDS[kind][0]
            quantized = name in policy and case.count * x.itemsize >= min_bytes
            real = None
            if not quantized:  # the real NCCL's own result, bytes and all
                send, want = buffers(kind, case, x)
                check_nccl(issue(nccl, kind, send, want, case, c), f"the real {kind}")
                synced(send, want)
                real = bits_of(want).tobytes()
            outs = COMM.gather((bits_of(recv).tobytes(), real), root=0)
            if RANK == 0:
                label = f"interposed {kind} {case} ({'quantized' if quantized else 'exact'})"
                if quantized:
                    inputs = [rank_input(whole(kind, case), r) for r in range(NRANKS)]
                    own = int(os.environ.get(f"QNCCL_{name.upper()}_BITS", bits))
                    env = dataclasses.replace(case, bucket=128, seed=0, rounding="stochastic",
                                              segment_values=0,  # the QNCCL_* defaults
                                              rotation_block=env_rotation(), clip=env_clip())
                    expected = emulated(kind, inputs, env, calls[c], bits=own)
                    wants = [bits_of(e).tobytes() for e in expected]
                else:
                    wants = [w for _, w in outs]
                for r, (got, _) in enumerate(outs):
                    if got != wants[r]:
                        failures.add(label, f"rank {r} differs from the "
                                     f"{'emulator' if quantized else 'real NCCL'}")
            if quantized:
                calls[c] += 1
            checked += 1
    check_nccl(lib.ncclCommDestroy(other), "ncclCommDestroy")
    return checked


def sendrecv(comm, failures):
    """Point-to-point calls through the interposed ncclSend/ncclRecv (module docstring)."""
    quantized = "sendrecv" in os.environ.get("QNCCL_COLLECTIVES", "allreduce").split(",")
    bits = int(os.environ.get("QNCCL_SENDRECV_BITS", os.environ.get("QNCCL_BITS", "4")))
    min_bytes = int(os.environ.get("QNCCL_MIN_BYTES", 64 << 10))
    kw = dict(bits=bits, bucket_size=128, rounding="stochastic", seed=0)
    if env_rotation():
        kw.update(rotation="hadamard", rotation_block=env_rotation(),
                  clip="gaussian" if env_clip() else "none")
    right, left = (RANK + 1) % NRANKS, (RANK - 1) % NRANKS
    p2p_calls = 0  # this rank's quantized point-to-point calls so far
    checked = 0

    def compare(label, got, want):
        if bits_of(got).tobytes() != bits_of(want).tobytes():
            failures.add(f"rank {RANK} {label}", "differs from the "
                         f"{'emulator' if quantized else 'real NCCL'}")

    def real(ops):  # the same operations through the real NCCL, outside libqnccl
        check_nccl(nccl.ncclGroupStart(), "ncclGroupStart")
        for send, buf, peer in ops:
            fn = nccl.ncclSend if send else nccl.ncclRecv
            check_nccl(fn(ptr(buf), buf.size, NCCL_TYPES[dtype_name(buf)], peer, comm, STREAM),
                       "the real send/recv")
        check_nccl(nccl.ncclGroupEnd(), "ncclGroupEnd")
        synced(*[buf for _, buf, _ in ops])

    # PyTorch's all_to_all_single: a send and a receive per rank, itself included
    for dtype, count in (("float32", 20000), ("bfloat16", 40000), ("float16", 700)):
        case = Case("auto", dtype, NRANKS * count, seed=31 + count)
        x = rank_input(case, RANK)
        recv = np.zeros_like(x)
        check_nccl(lib.ncclGroupStart(), "ncclGroupStart")
        for r in range(NRANKS):
            chunk = slice(r * count, (r + 1) * count)
            check_nccl(lib.ncclSend(ptr(x[chunk]), count, NCCL_TYPES[dtype], r, comm, STREAM),
                       "ncclSend")
            check_nccl(lib.ncclRecv(ptr(recv[chunk]), count, NCCL_TYPES[dtype], r, comm, STREAM),
                       "ncclRecv")
        check_nccl(lib.ncclGroupEnd(), "ncclGroupEnd")
        synced(x, recv)
        eligible = quantized and count * x.itemsize >= min_bytes and NRANKS > 1
        if eligible:
            inputs = [rank_input(case, r) for r in range(NRANKS)]
            want = emulate.alltoall(inputs, call=emulate.P2P_CALL | p2p_calls, dtype=dtype,
                                    **kw)[RANK]
            p2p_calls += 1
        else:
            want = np.zeros_like(x)
            real([op for r in range(NRANKS) for op in (
                (True, x[r * count:(r + 1) * count], r),
                (False, want[r * count:(r + 1) * count], r))])
        compare(f"all-to-all {dtype} count {count}", recv, want)
        checked += 1
    if NRANKS == 1:
        return checked
    # two sends to the right neighbour in one group, with an allreduce in the group
    a = rank_input(Case("auto", "float32", 30000, seed=50 + RANK), RANK)
    b = rank_input(Case("auto", "float16", 100, seed=60 + RANK), RANK)  # below MIN_BYTES
    c = rank_input(Case("auto", "bfloat16", 50000, seed=70 + RANK), RANK)
    ar = rank_input(Case("auto", "float32", 1000, seed=80), RANK)  # below MIN_BYTES: exact
    got = [np.zeros_like(v) for v in (a, b, c)]
    ar_out = np.zeros_like(ar)
    check_nccl(lib.ncclGroupStart(), "ncclGroupStart")
    for v, out in zip((a, b, c), got):
        check_nccl(lib.ncclSend(ptr(v), v.size, NCCL_TYPES[dtype_name(v)], right, comm, STREAM),
                   "ncclSend")
        check_nccl(lib.ncclRecv(ptr(out), v.size, NCCL_TYPES[dtype_name(v)], left, comm, STREAM),
                   "ncclRecv")
    check_nccl(lib.ncclAllReduce(ptr(ar), ptr(ar_out), ar.size, lib.ncclFloat32, lib.ncclSum, comm,
                                 STREAM), "ncclAllReduce")
    check_nccl(lib.ncclGroupEnd(), "ncclGroupEnd")
    synced(*got, ar_out)
    sent = [rank_input(Case("auto", dtype_name(v), v.size, seed=s + left), left)
            for v, s in ((a, 50), (b, 60), (c, 70))]
    if quantized:
        wants = [emulate.sendrecv(sent[0], left, RANK, NRANKS, call=p2p_calls, index=0, **kw),
                 sent[1],  # below QNCCL_MIN_BYTES: exact
                 emulate.sendrecv(sent[2], left, RANK, NRANKS, call=p2p_calls, index=1,
                                  dtype="bfloat16", **kw)]
        p2p_calls += 1
    else:
        wants = [np.zeros_like(v) for v in (a, b, c)]
        real([(True, v, right) for v in (a, b, c)] + [(False, w, left) for w in wants])
    for i, (g, w) in enumerate(zip(got, wants)):
        compare(f"grouped send {i}", g, w)
    everyone = COMM.allreduce(ar.astype(np.float64))
    if np.abs(ar_out - everyone).max() > 1e-3 * np.abs(everyone).max():
        failures.add(f"rank {RANK} grouped allreduce", "not the sum")
    checked += 3
    # lone sends between pairs (2i, 2i+1) of ranks, one each way
    pair = RANK ^ 1
    if pair < NRANKS:
        x = rank_input(Case("auto", "float32", 20000, seed=90 + RANK), RANK)
        y = np.zeros_like(x)
        for sender in (min(RANK, pair), max(RANK, pair)):
            if sender == RANK:
                check_nccl(lib.ncclSend(ptr(x), x.size, lib.ncclFloat32, pair, comm, STREAM),
                           "ncclSend")
            else:
                check_nccl(lib.ncclRecv(ptr(y), y.size, lib.ncclFloat32, pair, comm, STREAM),
                           "ncclRecv")
        synced(y)
        theirs = rank_input(Case("auto", "float32", 20000, seed=90 + pair), pair)
        if quantized:  # the pair's first lone call is its send or its receive, by rank
            call = p2p_calls + (pair > RANK)
            want = emulate.sendrecv(theirs, pair, RANK, NRANKS, call=call, **kw)
        else:
            want = theirs
        compare("lone send", y, want)
        checked += 1
    return checked


def policy(comm, failures):
    """Per-communicator and per-call control (module docstring), under QNCCL_COLLECTIVES=none."""
    import qnccl.comm
    from qnccl import QncclError
    other = init_comm()
    calls = 0  # comm's quantized calls so far
    checked = 0

    def one(c, kind, case, bits):
        """Runs one interposed call on every rank; checks it against the emulator at `bits`
        (0: the real NCCL's own call)."""
        nonlocal calls
        x = rank_input(whole(kind, case), RANK)
        send, recv = buffers(kind, case, x)
        check_nccl(issue(lib, kind, send, recv, case, c), f"{kind} {case}")
        real = None
        if bits == 0:
            send, want = buffers(kind, case, x)
            check_nccl(issue(nccl, kind, send, want, case, c), f"the real {kind}")
            real = bits_of(want).tobytes()
        outs = COMM.gather((bits_of(recv).tobytes(), real), root=0)
        if RANK == 0:
            if bits:
                inputs = [rank_input(whole(kind, case), r) for r in range(NRANKS)]
                env = dataclasses.replace(case, seed=0)  # QNCCL_SEED's default
                expected = emulated(kind, inputs, env, calls, bits=bits)
                wants = [bits_of(e).tobytes() for e in expected]
            else:
                wants = [w for _, w in outs]
            for r, (got, _) in enumerate(outs):
                if got != wants[r]:
                    failures.add(f"policy {kind} {case} bits={bits}", f"rank {r} differs from "
                                 f"the {'emulator' if bits else 'real NCCL'}")
        if bits:
            calls += 1

    rs = Case("auto", "float32", 20000, seed=101)
    a2a = Case("auto", "float32", 20000, seed=102)
    qnccl.comm.set_quantization(comm, "reducescatter", 3)
    reported = {(name, c == comm): qnccl.comm.get_quantization(c, name)
                for name in ("reducescatter", "alltoall", "allreduce") for c in (comm, other)}
    want = {("reducescatter", True): 3, ("reducescatter", False): 0, ("alltoall", True): 0,
            ("alltoall", False): 0, ("allreduce", True): 0, ("allreduce", False): 0}
    if reported != want:
        failures.add("policy get_quantization", f"rank {RANK}: {reported} != {want}")
    one(comm, "rs", rs, 3)
    one(other, "rs", rs, 0)
    for bits in (4, 2):  # a forward and a backward all-to-all
        with qnccl.comm.quantization(comm, "alltoall", bits):
            one(comm, "a2a", a2a, bits)
        one(comm, "a2a", a2a, 0)
    qnccl.comm.set_quantization(comm, ["reducescatter", "allgather"], 0)
    one(comm, "rs", rs, 0)
    qnccl.comm.set_quantization(comm, "reducescatter", 5)
    one(comm, "rs", rs, 5)
    qnccl.comm.set_quantization(comm, "reducescatter", None)  # the environment: none
    one(comm, "rs", rs, 0)
    checked += 9
    try:  # Python refuses it before the library, in its own terms
        qnccl.comm.set_quantization(comm, "reducescatter", 9)
        failures.add("policy bad arguments", f"rank {RANK}: bits=9 was taken")
    except ValueError as error:
        if not str(error).startswith("bits must be 0 (exact), an integer in 1..8"):
            failures.add("policy bad arguments", f"rank {RANK}: {error}")
    checked += 1
    bad = [(lambda: lib.qncclCommSetQuantization(comm, 2, 9),
            "bits = 9; allowed: 1..8 (quantized), 0 (exact) or -1"),
           (lambda: lib.qncclCommSetQuantization(comm, 0, 4), "collectives = 0"),
           (lambda: lib.qncclCommSetQuantization(comm, 64, 4), "collectives = 0x40"),
           (lambda: lib.qncclCommGetQuantization(comm, 3, ffi.new("int*"), ffi.NULL),
            "collective = 0x3; allowed: one qncclColl* flag"),
           (lambda: lib.qncclCommSetQuantization(ffi.NULL, 1, 4), "comm is NULL")]
    for call, message in bad:
        try:
            result = call()
            got = (result, ffi.string(lib.qncclGetLastError()).decode())
        except QncclError as error:
            got = (error.code, error.message)
        if got[0] != lib.ncclInvalidArgument or message not in got[1]:
            failures.add("policy bad arguments", f"rank {RANK}: {got} lacks {message!r}")
        checked += 1
    check_nccl(lib.ncclCommDestroy(other), "ncclCommDestroy")
    return checked


def dtype_name(values):
    return "bfloat16" if values.dtype == np.uint16 else values.dtype.name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("program", choices=("reducescatter", "allgather", "alltoall", "rotated",
                                            "counts", "misuse", "interposed", "sendrecv",
                                            "policy"))
    args = parser.parse_args()
    comm = init_comm()
    failures = Failures()
    programs = {"reducescatter": reducescatter, "allgather": allgather, "alltoall": alltoall,
                "rotated": rotated, "counts": counts, "misuse": misuse, "interposed": interposed,
                "sendrecv": sendrecv, "policy": policy}
    return finish(comm, failures, args.program, programs[args.program](comm, failures))


if __name__ == "__main__":
    sys.exit(main())
