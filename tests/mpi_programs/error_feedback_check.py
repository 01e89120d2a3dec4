"""Error feedback in libqnccl.so on real ranks (docs/allreduce.md, "Error feedback").

    mpirun -np N python error_feedback_check.py emulator
    mpirun -np N python error_feedback_check.py bookkeeping
    mpirun -np N python error_feedback_check.py switching
    mpirun -np N python error_feedback_check.py interposer
    mpirun -np N python error_feedback_check.py ring_warning

emulator     qncclAllReduce with config.errorFeedback = 1, CALLS calls per buffer, for
             ring/tree/SRA x float32/float16/bfloat16 x sum/avg x both roundings, buffers
             in segments (on 1, 2 or 3 pipeline lanes), in place and not, NaN/Inf in
             one call: after every call each rank's output and its residual
             (qncclCommGetResidual) are bit for bit what qnccl.emulate.allreduce(...,
             residuals=) gives; the output is the same on every rank; out of place, the
             send buffer is untouched.
bookkeeping  float32, 40 calls on one buffer per algorithm, op and rounding: after each
             call the result differs from the owner's full sum, sum_r z_r - sum_r e_r,new
             (z_r = x_r + e_r,old), by at most one quantization of that sum (the float32
             rounding bound added, computed from the data), and every value has a rank
             whose residual there is 0 (its owner); without feedback the same check
             fails at 1% of the values or more (observed 4-31%).
interposer   QNCCL_ERROR_FEEDBACK=1 makes the interposed ncclAllReduce feed back (matches
             the emulator call after call), a quantized op with errorFeedback = 1 does the
             same whatever the environment says; qncclCommGetStats counts the residual
             buffers and bytes; qncclCommResetErrorFeedback and qnccl.comm's
             reset_error_feedback() free them and the next call starts from zero; asking
             for an unknown buffer's residual or passing errorFeedback = 2 fails with a
             message saying what is allowed.
switching    one buffer whose calls alternate ring, SRA and tree (auto's measurements):
             outputs and residuals as the emulator's, which carry from call to call.
ring_warning error feedback on ring at 2 bits, then at 3 bits, then SRA at 2 bits (the
             test counts the library's warnings).
hier         the hierarchical algorithm on the job's node layout (perf/netlab --nodes), as
             `emulator`: inter ring/tree/SRA x types, the intra stage exact or quantized.
moving       buffers that move: 3,000 in-place allreduces of 256 KiB with error feedback,
             each on a freshly allocated buffer, 8 alive at a time (a program that
             allocates per call; a caching allocator's blocks): under
             QNCCL_ERROR_FEEDBACK_MAX_BYTES (the test sets 4M) the residuals stay within
             it and the process's resident memory stays flat from call 500 on (kept
             residuals would add 625 MiB).
call_counts  qncclCommGetCallCounts counts a communicator's quantized calls; after
             qncclCommSetCallCounts the next calls are the emulator's calls of those numbers,
             on the same communicator and on a new one (a restored checkpoint's); NULL
             arguments fail with messages.

Prints one line per failure, then a summary; exits non-zero on any failure.
"""
import argparse
import dataclasses
import itertools
import os
import re
import socket
import sys

import numpy as np

import allreduce_check
from allreduce_check import (COMM, NCCL_TYPES, NRANKS, OPS, RANK, STREAM, Case, Failures,
                             bits_of, check_nccl, ffi, init_comm, lib, make_config, ptr,
                             rank_input, residual, synced)
import qnccl.comm
from qnccl import QncclError
from qnccl.emulate import allreduce as emulate_allreduce
from qnccl.emulate import codec

CALLS = 4
U = 2.0**-24  # float32 unit roundoff


@dataclasses.dataclass(frozen=True)
class FeedbackCase(Case):
    calls: int = CALLS

    def at_call(self, t):
        """The Case whose rank_input is call t's data (NaN/Inf in call 2 of 'special')."""
        data = self.data if (self.data != "special" or t == 2) else "wide"
        return dataclasses.replace(self, seed=self.seed + 7919 * t, data=data)


def run_call(comm, case, t, send, recv, config, op=None, interposed=False):
    """Call t of `case` on the persistent buffers `send`/`recv` (recv is send in place)."""
    x = rank_input(case.at_call(t), RANK)
    send[:] = x
    if interposed:
        result = lib.ncclAllReduce(ptr(send), ptr(recv), case.count, NCCL_TYPES[case.dtype], op,
                                   comm, STREAM)
    else:
        result = lib.qncclAllReduce(ptr(send), ptr(recv), case.count, NCCL_TYPES[case.dtype],
                                    OPS[case.op], config, comm, STREAM)
    if result != lib.ncclSuccess:  # the other ranks would wait for us: stop the job
        print(f"FAIL [N={NRANKS}] {case}: rank {RANK}: call {t} returned {result}: "
              f"{ffi.string(lib.qncclGetLastError()).decode()}", flush=True)
        COMM.Abort(1)
    synced(send, recv)
    send_ok = case.inplace or np.array_equal(bits_of(send), bits_of(x))
    e = residual(comm, send, dtype=case.dtype)
    return x, recv.copy(), e, send_ok


def new_buffers(case):
    x = rank_input(case, RANK)
    send = np.empty_like(x)
    return send, (send if case.inplace else np.empty_like(x))


class Emulation:
    """Rank 0's emulator state of one buffer: N residual arrays and the call counter."""

    def __init__(self, case, first_call):
        self.case, self.call = case, first_call
        self.residuals = [np.zeros(case.count, np.float32) for _ in range(NRANKS)]

    def step(self, inputs):
        c = self.case
        out = emulate_allreduce(inputs, algo=c.algo, bits=c.bits, bucket_size=c.bucket,
                                rounding=c.rounding, seed=c.seed, op=c.op, call=self.call,
                                segment_values=c.segment_values, dtype=c.dtype,
                                residuals=self.residuals, nodes=allreduce_check.NODES,
                                inter_algo=c.inter, intra_bits=c.intra_bits,
                                **allreduce_check.rotation_of(c))[0]
        self.call += 1
        return out


def compare(failures, case, what, got, want):
    differ = np.flatnonzero(bits_of(got) != bits_of(want))
    if differ.size:
        i = int(differ[0])
        failures.add(case, f"{what}: {differ.size} of {case.count} values differ from the "
                           f"emulator; first at {i}: {got[i]!r} vs {want[i]!r}")


def check_against_emulator(comm, case, first_call, failures, config, op=None, interposed=False,
                           buffers=None):
    """`case.calls` calls on one pair of buffers (new ones, or `buffers`), each checked on
    rank 0 against an emulation whose residuals start at zero. Returns the next call number
    and the buffers."""
    send, recv = buffers or new_buffers(case)
    emulation = Emulation(case, first_call) if RANK == 0 else None
    for t in range(case.calls):
        gathered = COMM.gather(run_call(comm, case, t, send, recv, config, op, interposed),
                               root=0)
        if RANK != 0:
            continue
        inputs, outputs, residuals, send_oks = zip(*gathered)
        want = emulation.step(list(inputs))
        for r in range(NRANKS):
            if not send_oks[r]:
                failures.add(case, f"call {t}, rank {r}: the send buffer changed")
            compare(failures, case, f"call {t}, rank {r} output", outputs[r], want)
            compare(failures, case, f"call {t}, rank {r} residual", residuals[r],
                    emulation.residuals[r])
    return first_call + case.calls, (send, recv)


def emulator_cases():
    combos = list(itertools.product(("nearest", "stochastic"), ("sum", "avg"), (False, True)))
    cases = []
    for i, (algo, dtype) in enumerate(itertools.product(("ring", "tree", "sra"), NCCL_TYPES)):
        for j in range(2):
            rounding, op, inplace = combos[(3 * i + 5 * j) % len(combos)]
            count, bucket, segment = ((5003, 64, 1000), (300, 7, 0))[j]
            # The case of several segments also runs them on 2 and 3 pipeline lanes.
            cases.append(FeedbackCase(algo, dtype, count, rounding, op, inplace, bits=(2, 3)[j],
                                      bucket=bucket, segment_values=segment, seed=100 + 10 * i + j,
                                      data=("wide", "special")[(i + j) % 2],
                                      lanes=(0, 2, 3)[i % 3] if segment else 0))
    return cases


def rotated_cases():
    """emulator_cases() rotated (docs/rotation.md: the residuals live in the rotated domain)."""
    return [dataclasses.replace(case, rotation_block=(256, 64, 8)[i % 3])
            for i, case in enumerate(emulator_cases())]


def emulator(comm, failures, cases=None):
    call = 0
    cases = emulator_cases() if cases is None else cases
    for case in cases:
        call, _ = check_against_emulator(comm, case, call, failures, make_feedback_config(case))
        # Its buffers are freed now, and a new array may reuse an address (and count and
        # dtype): that is the same buffer to the library, so start the next case afresh.
        qnccl.comm.reset_error_feedback(comm)
    return len(cases)


def rotated(comm, failures):
    return emulator(comm, failures, rotated_cases())


def switching(comm, failures):
    """One buffer whose calls alternate ring, SRA and tree with error feedback (what auto's
    measurements do on a job's first calls): each call rewrites every residual, the values
    its owners hold included, so no algorithm inherits another's; checked against the
    emulator, whose residuals carry from call to call."""
    base = FeedbackCase("ring", "float32", 3001, "nearest", "avg", bits=3, bucket=64, seed=77,
                        data="normal", calls=1)
    send, recv = new_buffers(base)
    emulation = Emulation(base, 0) if RANK == 0 else None
    algos = ("ring", "sra", "tree", "ring", "tree", "sra", "ring")
    for t, algo in enumerate(algos):
        case = dataclasses.replace(base, algo=algo, seed=base.seed + t)
        gathered = COMM.gather(run_call(comm, case, 0, send, recv, make_feedback_config(case)),
                               root=0)
        if RANK != 0:
            continue
        emulation.case = case
        inputs, outputs, residuals, _ = zip(*gathered)
        want = emulation.step(list(inputs))
        for r in range(NRANKS):
            compare(failures, case, f"call {t} ({algo}), rank {r} output", outputs[r], want)
            compare(failures, case, f"call {t} ({algo}), rank {r} residual", residuals[r],
                    emulation.residuals[r])
    return len(algos)


def hier(comm, failures):
    """emulator_cases() through the hierarchical algorithm on the host names' layout; then
    six of them rotated."""
    host = os.environ.get("NCCL_HOSTID") or socket.gethostname()
    allreduce_check.NODES = COMM.allgather(host)
    call = 0
    cases = []
    for i, case in enumerate(emulator_cases()):
        cases.append(dataclasses.replace(case, algo="hier", inter=case.algo,
                                         intra_bits=(0, 3)[i % 2]))
    cases += [dataclasses.replace(case, rotation_block=(256, 64, 8)[i % 3])
              for i, case in enumerate(cases[:6])]
    for case in cases:
        call, _ = check_against_emulator(comm, case, call, failures, make_feedback_config(case))
        qnccl.comm.reset_error_feedback(comm)
    return len(cases)


def make_feedback_config(case, error_feedback=1):
    config = make_config(case)
    config.errorFeedback = error_feedback
    return config


def result_error_bound(s, case):
    """What the owner's one quantization of the full sums `s` (float64, sum units) may change
    per value: rho * the widest cell of its bucket (stochastic 1, nearest 1/2) plus the
    codec's float32 slack, on the buckets of `s` (avg: of s / N, times N)."""
    scale = NRANKS if case.op == "avg" else 1
    v = (s / scale).astype(np.float32)
    starts = np.arange(0, v.size, case.bucket)  # chunks start on bucket boundaries
    lo, hi = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
    cell = codec.grid_step(codec.bucket_params(lo, hi, case.bits))
    mag = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float64)
    rho = 0.5 if case.rounding == "nearest" else 1.0
    return np.repeat(rho * cell + 12 * U * mag + 2.0**-148, case.bucket)[:v.size] * scale


def bookkeeping(comm, failures):
    """40 calls per buffer; rank 0 checks the per-call bookkeeping from the data. The owners'
    zero residuals are what tells this rule from feeding the result's error back too (whose
    owner sums would also be within one quantization of the result)."""
    calls, checked = 40, 0
    for algo, op, rounding in itertools.product(("ring", "tree", "sra"), ("sum", "avg"),
                                                ("stochastic", "nearest")):
        case = FeedbackCase(algo, "float32", 2000, rounding, op, bits=2, bucket=64,
                            seed=7 + checked, data="normal", calls=calls)
        for feedback in (1, 0):
            qnccl.comm.reset_error_feedback(comm)  # a new array may reuse a freed one's address
            send, recv = new_buffers(case)
            config = make_feedback_config(case, feedback)
            e_old = np.zeros((NRANKS, case.count))
            missed = owned = values = 0
            worst = 0.0
            for t in range(calls):
                x = rank_input(case.at_call(t), RANK)
                send[:] = x
                check_nccl(lib.qncclAllReduce(ptr(send), ptr(recv), case.count,
                                              NCCL_TYPES["float32"], OPS[op], config, comm,
                                              STREAM), f"{case} call {t}")
                synced(send, recv)
                e = residual(comm, send) if feedback else np.zeros(case.count, np.float32)
                gathered = COMM.gather((x, e), root=0)
                if RANK != 0:
                    continue
                xs = np.stack([g[0] for g in gathered]).astype(np.float64)
                e_new = np.stack([g[1] for g in gathered]).astype(np.float64)
                z = xs + e_old
                # the owner's full sum: what entered minus what the ranks' sends left behind
                s = z.sum(axis=0) - e_new.sum(axis=0)
                slack = ((NRANKS + 2) * U * (np.abs(z).sum(axis=0) + np.abs(e_new).sum(axis=0))
                         + NRANKS * 2.0**-149)
                miss = np.abs(recv.astype(np.float64) * (NRANKS if op == "avg" else 1) - s)
                bound = result_error_bound(s, case) + slack
                missed += int(np.count_nonzero(miss > bound))
                worst = max(worst, float(np.max(miss / bound)))
                owned += int(np.count_nonzero((e_new == 0).any(axis=0)))
                values += case.count
                e_old = e_new
            if RANK != 0:
                continue
            label = f"{case} error feedback {'on' if feedback else 'off'}"
            if feedback and missed:
                failures.add(label, f"{missed} of {values} results differ from the owner's "
                                    f"full sum by more than one quantization of it "
                                    f"(worst {worst:.3g} x the bound)")
            if feedback and owned != values:
                failures.add(label, f"{values - owned} of {values} values have a nonzero "
                                    f"residual on every rank: the owner's must be 0")
            if not feedback and NRANKS > 1 and missed < 0.01 * values:
                failures.add(label, f"without feedback only {missed} of {values} results miss "
                                    f"the bound: the check has no teeth")
            print(f"bookkeeping N={NRANKS} {algo} {op} {rounding} feedback={feedback}: "
                  f"{missed} of {values} beyond one quantization of the sum (worst "
                  f"{worst:.3g} x)", flush=True)
        checked += 1
    return checked


def interposer(comm, failures):
    handle = int(ffi.cast("uintptr_t", comm))
    # The environment was read when the communicator's state was made (its first use).
    assert os.environ.get("QNCCL_ERROR_FEEDBACK") == "1", "run with QNCCL_ERROR_FEEDBACK=1"
    env = ffi.new("qncclEnvConfig_t*")
    check_nccl(lib.qncclConfigFromEnv(env), "qncclConfigFromEnv")
    if env.allreduce.errorFeedback != 1:
        failures.add("qncclConfigFromEnv", f"errorFeedback = {env.allreduce.errorFeedback}")
    codec = env.allreduce.codec
    case = FeedbackCase(qnccl_algo(env), "float32", 70000, "stochastic", "sum", bits=codec.bits,
                        bucket=codec.bucketSize, seed=codec.seed, calls=3)
    call, _ = check_against_emulator(comm, case, 0, failures, None, op=OPS["sum"],
                                     interposed=True)
    stats = qnccl.comm.stats(handle)
    if stats["residual_buffers"] != 1 or stats["residual_bytes"] != 4 * case.count:
        failures.add("stats", f"{stats}: want 1 residual buffer of {4 * case.count} bytes")

    # A quantized op carries its own errorFeedback, whatever the environment says.
    op_case = FeedbackCase("tree", "bfloat16", 3000, "nearest", "avg", inplace=True, bits=3,
                           bucket=50, seed=9, calls=3)
    op_config = ffi.new("qncclQuantizedOpConfig_t*")
    op_config.allreduce = make_feedback_config(op_case)[0]
    op_config.reduction = OPS["avg"]
    op = ffi.new("ncclRedOp_t*")
    check_nccl(lib.qncclRedOpCreateQuantized(op, op_config, comm), "qncclRedOpCreateQuantized")
    call, op_buffers = check_against_emulator(comm, op_case, call, failures, None, op=op[0],
                                              interposed=True)
    stats = qnccl.comm.stats(handle)
    want_bytes = 4 * (case.count + op_case.count)
    if stats["residual_buffers"] != 2 or stats["residual_bytes"] != want_bytes:
        failures.add("stats", f"{stats}: want 2 residual buffers, {want_bytes} bytes")

    # Reset: freed, and the next calls on the same buffers start from zero again.
    check_nccl(lib.qncclCommResetErrorFeedback(comm), "qncclCommResetErrorFeedback")
    if qnccl.comm.stats(handle)["residual_buffers"] != 0:
        failures.add("qncclCommResetErrorFeedback", f"left {qnccl.comm.stats(handle)}")
    call, _ = check_against_emulator(comm, op_case, call, failures, None, op=op[0],
                                     interposed=True, buffers=op_buffers)
    qnccl.comm.reset_error_feedback()  # every communicator of the process
    if qnccl.comm.stats(handle)["residual_buffers"] != 0:
        failures.add("qnccl.comm.reset_error_feedback()", f"left {qnccl.comm.stats(handle)}")
    check_against_emulator(comm, op_case, call, failures, None, op=op[0], interposed=True,
                           buffers=op_buffers)
    check_nccl(lib.ncclRedOpDestroy(op[0], comm), "ncclRedOpDestroy")
    check_messages(handle, failures)
    return 4


def qnccl_algo(env):
    return {lib.qncclAlgoAuto: "auto", lib.qncclAlgoRing: "ring", lib.qncclAlgoTree: "tree",
            lib.qncclAlgoSra: "sra"}[env.allreduce.algo]


def check_messages(handle, failures):
    """Bad requests fail on this rank alone, with messages naming what is allowed."""
    unknown = np.zeros(10, np.float32)
    try:
        qnccl.comm.residual(handle, unknown)
        failures.add("qncclCommGetResidual", "an unknown buffer did not fail")
    except QncclError as err:
        if not re.search(r"no residual for buffer .* count 10", err.message):
            failures.add("qncclCommGetResidual", f"message: {err.message}")
    bad = make_feedback_config(Case("ring", "float32", 10), error_feedback=2)
    result = lib.qncclAllReduce(ffi.from_buffer(unknown), ffi.from_buffer(unknown), 10,
                                NCCL_TYPES["float32"], OPS["sum"], bad,
                                ffi.cast("ncclComm_t", handle), ffi.NULL)
    expect_failure(failures, "qncclAllReduce", result,
                   r"errorFeedback = 2; allowed: 0 \(off\) or 1 \(on\)")
    result = lib.qncclAllReduceErrorBound(10, NCCL_TYPES["float32"], OPS["sum"],
                                          make_feedback_config(Case("ring", "float32", 10)),
                                          NRANKS, 1.0, ffi.new("double*"))
    expect_failure(failures, "qncclAllReduceErrorBound", result,
                   r"errorFeedback = 1: .*pass errorFeedback = 0")


def expect_failure(failures, fn, result, pattern):
    message = ffi.string(lib.qncclGetLastError()).decode()
    if result != lib.ncclInvalidArgument or not re.search(pattern, message):
        failures.add(fn, f"returned {result}: {message}")


def ring_warning(comm, failures):
    """Error feedback on ring at 2 bits: the library warns (once per communicator) from 8
    ranks on; 3 bits and SRA at 2 bits say nothing. The test counts the lines."""
    cases = [FeedbackCase("ring", "float32", 1000, bits=2, calls=2),
             FeedbackCase("ring", "float32", 1000, bits=3, calls=1),
             FeedbackCase("sra", "float32", 1000, bits=2, calls=1)]
    call = 0
    for case in cases:
        call, _ = check_against_emulator(comm, case, call, failures, make_feedback_config(case))
        qnccl.comm.reset_error_feedback(comm)
    return len(cases)


def call_counts(comm, failures):
    cases = [FeedbackCase(algo, "float32", 1000, calls=2) for algo in ("sra", "ring")]

    def expect(handle, want, when):
        got = qnccl.comm.call_counts(handle)
        if got != want:
            failures.add("qncclCommGetCallCounts", f"{when}: {got}, expected {want}")

    expect(comm, (0, 0), "a new communicator")
    call = 0
    for case in cases:  # counted from 0
        call, _ = check_against_emulator(comm, case, call, failures, make_feedback_config(case))
        qnccl.comm.reset_error_feedback(comm)  # the next case's buffers may reuse the address
    expect(comm, (4, 0), "after 4 calls")
    qnccl.comm.set_call_counts(comm, 1000, 3)
    expect(comm, (1000, 3), "after setting them")
    call = 1000
    for case in cases:  # continued from the number set
        call, _ = check_against_emulator(comm, case, call, failures, make_feedback_config(case))
        qnccl.comm.reset_error_feedback(comm)
    expect(comm, (1004, 3), "4 calls later")
    other = init_comm()  # a restored job's new communicator continues the saved streams
    qnccl.comm.set_call_counts(other, 1004)
    expect(other, (1004, 0), "a second communicator set to the first one's count")
    check_against_emulator(other, cases[0], 1004, failures, make_feedback_config(cases[0]))
    check_nccl(lib.ncclCommDestroy(other), "ncclCommDestroy")
    calls = ffi.new("uint64_t*")
    expect_failure(failures, "qncclCommGetCallCounts",
                   lib.qncclCommGetCallCounts(ffi.NULL, calls, calls), "comm is NULL")
    expect_failure(failures, "qncclCommGetCallCounts",
                   lib.qncclCommGetCallCounts(comm, calls, ffi.NULL),
                   r"p2pCalls is NULL; pass a uint64_t\*")
    expect_failure(failures, "qncclCommSetCallCounts",
                   lib.qncclCommSetCallCounts(ffi.NULL, 1, 1), "comm is NULL")
    return 3 * len(cases)


def resident_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def moving(comm, failures):
    count, calls, alive, settled = 1 << 16, int(os.environ.get("MOVING_CALLS", "3000")), 8, 500
    config = make_feedback_config(FeedbackCase("ring", "float32", count))
    buffers, rss = [], {}
    rng = np.random.default_rng([3, RANK])
    for call in range(calls):
        buffers.append(rng.standard_normal(count).astype(np.float32))  # a new allocation
        if len(buffers) > alive:
            buffers.pop(0)
        x = buffers[-1]
        check_nccl(lib.qncclAllReduce(ptr(x), ptr(x), count, NCCL_TYPES["float32"], OPS["sum"],
                                      config, comm, STREAM), "qncclAllReduce")
        if call + 1 in (settled, calls):
            rss[call + 1] = resident_bytes()
    stats = qnccl.comm.stats(comm)
    cap = int(os.environ["QNCCL_ERROR_FEEDBACK_MAX_BYTES"].rstrip("M")) << 20  # the test's "4M"
    if stats["residual_bytes"] > cap:
        failures.add("moving", f"rank {RANK}: {stats['residual_bytes']} bytes of residuals, "
                     f"more than the {cap} allowed")
    grown = rss[calls] - rss[settled]
    print(f"moving: rank {RANK}: resident {rss[settled] >> 20} MiB after {settled:,} calls, "
          f"{rss[calls] >> 20} MiB after {calls:,}; {stats['residual_buffers']} residuals "
          f"({stats['residual_bytes'] >> 20} MiB)", flush=True)
    if grown > 8 << 20:
        failures.add("moving", f"rank {RANK}: resident memory grew by {grown >> 20} MiB from call "
                     f"{settled:,} to call {calls:,}")
    return 1


PROGRAMS = {"call_counts": call_counts, "moving": moving, "emulator": emulator, "bookkeeping": bookkeeping, "switching": switching, "interposer": interposer,
            "ring_warning": ring_warning, "hier": hier, "rotated": rotated}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("program", choices=sorted(PROGRAMS))
    args = parser.parse_args()
    comm = init_comm()
    failures = Failures()
    count = PROGRAMS[args.program](comm, failures)
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    lines = COMM.gather(failures.lines, root=0)
    if RANK == 0:
        total = sum(len(x) for x in lines)
        print(f"SUMMARY {args.program} N={NRANKS}: {count} cases, {total} failures", flush=True)
    sys.exit(1 if COMM.bcast(any(failures.lines), root=0) else 0)


if __name__ == "__main__":
    main()
