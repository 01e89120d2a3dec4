"""Measured auto (QNCCL_ALGO=auto, docs/tuning.md) on real ranks: libqnccl's interposed
ncclAllReduce, ncclReduceScatter and ncclAllGather over QNCCL's host backend, called from
Python as in interposer_check.py.

    mpirun -np 4 python tuning_check.py
    QNCCL_TEST_MEMORY=device mpirun -np 4 python tuning_check.py   (the simulated GPU in CI)

Every call of every section is checked: its output is the same bytes on every rank; a call
that ran quantized is the emulator's bytes for the candidate the documented schedule names
(five trials of each candidate in a row, the first two untimed: the quantized candidates in
order, then exact; the next call decides; the rest run the choice)
at the communicator's call number (only quantized calls take one); a call that ran exact is
the real library's own result of the same call. qncclCommGetStats counts both kinds.

skew     float32 allreduce of 64 KiB (candidates exact, ring, tree, SRA): ranks 1, 2 and 3
         each arrive 0.2 s late at every trial of exact, ring and tree respectively. Each of
         those is slow for every rank but the late one, which finds it fast (the others
         were already waiting): their own timings disagree, yet every rank must decide SRA,
         the one candidate nobody delayed, from the agreed (slowest rank's) times, in which
         the delayed ones take >= 0.2 s (less the ranks' arrival skew, ARRIVAL_SLACK_S).
         Then decided calls; then, inside a group, a size no call has tried yet: auto's
         rule, nothing tried or counted. Then a near-tie (8
         KiB): rank 1 arrives 0.5 s late at every trial of exact, rank 2 0.488 s at SRA's,
         rank 3 0.6 s at ring's and tree's; SRA's agreed time is the least (its call, even
         on the simulated GPU, takes less than the 12 ms between the delays), but not 5% less
         than exact's, so every rank decides exact. Then a lucky trial (4 KiB): rank 1
         arrives 0.3 s late at ring's last two trials, rank 2 0.2 s late at every trial of
         the others; ring's median (>= 0.3 s) loses although its first timed trial was the
         fastest of all. Then the untimed trials (2 KiB): rank 1 arrives 0.4 s late at
         exact's first three trials of five; exact's agreed time is a fast trial's (the
         median of its trials 3-5). Then overlapping trials (1 KiB): rank 1 arrives 0.2 s
         late at every trial of exact, rank 2 0.3 s at SRA's last, rank 3 0.25 s at ring's
         and tree's: SRA's median is the least by far, but its slowest trial took longer than
         exact's fastest (on the slowest rank), so every rank decides exact.
others   a reduce-scatter (candidates exact, ring, SRA) and an allgather (exact, quantized)
         tried and decided alike on every rank, with the same checks.
tunefile (with a folder in TUNE_DIR) QNCCL_TUNE_FILE: a decision made by trials is stored
         under its key; a new communicator whose ranks read a file naming another valid
         choice (tree) runs it from its key's first call, without trials, and says so in its
         table; a file with a malformed line, or written by another version, is ignored with
         a warning (trials run, then the file is rewritten whole); a file that is not a tune
         file is never written; ranks whose files differ, one rank without the variable, run
         the trials and decide alike.
capture  (device buffers) a call of a size not yet decided, captured into a CUDA graph: it
         is not a trial and counts nothing (no tuning row), runs auto's rule (SRA) at each
         replay, the emulator's next call number.

On device buffers (tests/buffers.py) the trials are timed by CUDA events, read at the
deciding call, and the agreement runs in device memory.

Prints one line per failure, then a summary; exits non-zero on any failure.
"""
import os
import sys
import time
from pathlib import Path

import numpy as np

from allreduce_check import MEMORY, STREAM, Case, check_case, ptr, rank_input, synced
from interposer_check import (COMM, NRANKS, RANK, bits_of, expect, failures, ffi, init_comm,
                              lib, nccl, require)
import interposer_check
from qnccl import comm as qcomm
from qnccl.emulate import collectives as emulate

LATE_S = 0.2
# A late rank's delay, as the others time it: their clocks start when each reaches the call,
# up to a few milliseconds after the late rank began its delay (a run under load measured
# 0.1998 s for a 0.2 s delay). Bounds on agreed times allow this much less.
ARRIVAL_SLACK_S = 0.02
CANDIDATES = {"allreduce": ["exact", "ring", "tree", "sra"],
              "reducescatter": ["exact", "ring", "sra"], "allgather": ["exact", "quantized"]}
TRIALS = 5  # per candidate, in a row (docs/tuning.md): the first two untimed
SETTINGS = dict(min_bytes="1K", collectives="allreduce,reducescatter,allgather", debug="INFO")


def trial_schedule(kind):
    """The candidate of each of a key's trial calls, in order (docs/tuning.md)."""
    names = CANDIDATES[kind]
    return [name for name in (*names[1:], names[0]) for _ in range(TRIALS)]  # exact last


class Comm:
    """A communicator made under SETTINGS, with what this program expects of it."""

    def __init__(self):
        result, self.comm = init_comm(**SETTINGS)
        require(result, "ncclCommInitRank")
        self.call = 0  # the engine's next call number: quantized calls take one
        self.compressed = self.passed = 0

    def stats_check(self, label):
        stats = qcomm.stats(self.comm)
        got = (stats["calls_compressed"], stats["calls_passed_through"])
        expect(got == (self.compressed, self.passed), label,
               f"(compressed, passed through) = {got}, expected "
               f"{(self.compressed, self.passed)}")


def interposed(kind, comm, x, nranks=NRANKS, real=False):
    """This rank's output of one ncclAllReduce / ncclReduceScatter / ncclAllGather of `x`
    (float32, sum): libqnccl's, or the real library's own with `real`."""
    api = nccl if real else lib
    if kind == "allreduce":
        out = np.empty_like(x)
        result = api.ncclAllReduce(ptr(x), ptr(out), x.size, lib.ncclFloat32, lib.ncclSum, comm,
                                   STREAM)
    elif kind == "reducescatter":
        out = np.empty(x.size // nranks, np.float32)
        result = api.ncclReduceScatter(ptr(x), ptr(out), out.size, lib.ncclFloat32, lib.ncclSum,
                                       comm, STREAM)
    else:
        out = np.empty(x.size * nranks, np.float32)
        result = api.ncclAllGather(ptr(x), ptr(out), x.size, lib.ncclFloat32, comm, STREAM)
    require(result, f"{'the real ' if real else ''}{kind}")
    synced(out)
    return out


def expected_quantized(kind, candidate, inputs, call, count):
    """Rank 0: what every rank's output must be when the call ran `candidate` quantized."""
    if kind == "reducescatter":
        return emulate.reduce_scatter(inputs, algo=candidate, call=call)
    if kind == "allgather":
        return emulate.allgather(inputs, call=call)
    return None  # allreduce: allreduce_check.check_case


def checked_call(c, kind, count, candidate, label, late=0.0):
    """One call of `kind` on `c` that the schedule says runs `candidate`; this rank arrives
    `late` seconds late."""
    case = Case(candidate if candidate != "exact" else "sra", "float32", count)
    x = rank_input(case, RANK).astype(np.float32)
    if late:
        time.sleep(late)
    out = interposed(kind, c.comm, x)
    inputs = COMM.gather(x, root=0)
    outputs = COMM.gather(out, root=0)
    if candidate == "exact":
        c.passed += 1
        want = interposed(kind, c.comm, x, real=True)  # every rank calls the real library
        expect(np.array_equal(bits_of(out), bits_of(want)), label,
               "an exact call's output is not the real library's")
    elif RANK == 0:
        if kind == "allreduce":
            check_case(case, c.call, outputs, [True] * NRANKS, failures)
        else:
            want = expected_quantized(kind, candidate, inputs, c.call, count)
            for r in range(NRANKS):
                expect(np.array_equal(bits_of(outputs[r]), bits_of(want[r])), label,
                       f"rank {r}'s output is not the emulator's {kind} ({candidate}, call "
                       f"{c.call})")
    if candidate != "exact":
        c.call += 1
        c.compressed += 1
    if RANK == 0 and kind != "reducescatter":  # every rank holds the same result
        same = all(np.array_equal(bits_of(o), bits_of(outputs[0])) for o in outputs)
        expect(same, label, "the ranks' outputs differ")


def entry(c, kind, count):
    """This rank's qncclCommGetTuning row of `kind`'s float32 calls of `count` values of
    input (a reduce-scatter's key is its recvcount's bytes)."""
    nbytes = count * 4 // (NRANKS if kind == "reducescatter" else 1)
    rows = [row for row in qcomm.tuning(c.comm) if row["collective"] == kind
            and row["dtype"] == "float32" and row["min_bytes"] <= nbytes <= row["max_bytes"]]
    expect(len(rows) == 1, kind, f"{len(rows)} tuning rows for {nbytes} bytes, expected 1")
    return rows[0] if rows else None


def try_and_decide(c, kind, count, late=None):
    """The trials, the deciding call and two decided calls of one key; returns the choice
    every rank agreed on and this rank's table row (None, None on failure). `late`: a
    candidate -> (rank, seconds) that rank arrives late at each of its trials, or (rank,
    seconds, trials) at those of its trials only (0: its first)."""
    names, schedule = CANDIDATES[kind], trial_schedule(kind)
    for i, candidate in enumerate(schedule):
        rank, seconds, *which = (late or {}).get(candidate, (None, 0.0))
        if which and i % TRIALS not in which[0]:
            seconds = 0.0
        checked_call(c, kind, count, candidate, f"{kind} trial {i} ({candidate})",
                     seconds if RANK == rank else 0.0)
    row = entry(c, kind, count)
    trials = len(schedule)
    expect(row is not None and row["choice"] is None and row["calls"] == trials, kind,
           f"after the trials: {row}, expected no choice yet and {trials} calls")
    # The deciding call: what it runs is not known before it; the table says afterwards.
    x_case = Case("sra", "float32", count)
    x = rank_input(x_case, RANK).astype(np.float32)
    out = interposed(kind, c.comm, x)
    row = entry(c, kind, count)
    if row is None:
        return None, None
    choice = row["choice"]
    choices = COMM.allgather(choice)
    expect(len(set(choices)) == 1, kind, f"the ranks decided differently: {choices}")
    expect(row["candidates"] == names and row["trial_calls"] == trials, kind,
           f"candidates {row['candidates']} with {row['trial_calls']} trial calls, expected "
           f"{names} with {trials}")
    outputs = COMM.gather(out, root=0)
    if choice == "exact":
        c.passed += 1
        want = interposed(kind, c.comm, x, real=True)
        expect(np.array_equal(bits_of(out), bits_of(want)), f"{kind} deciding call",
               "the exact choice's output is not the real library's")
    else:
        inputs = COMM.gather(x, root=0)
        if RANK == 0:
            if kind == "allreduce":
                check_case(Case(choice, "float32", count), c.call, outputs, [True] * NRANKS,
                           failures)
            else:
                want = expected_quantized(kind, choice, inputs, c.call, count)
                expect(all(np.array_equal(bits_of(o), bits_of(w)) for o, w in zip(outputs, want)),
                       f"{kind} deciding call", f"not the emulator's {choice} at call {c.call}")
        c.call += 1
        c.compressed += 1
    for i in range(2):
        checked_call(c, kind, count, choice, f"{kind} decided call {i} ({choice})")
    row = entry(c, kind, count)
    expect(row is not None and row["calls"] == trials + 3, kind,
           f"calls counted: {row and row['calls']}, expected {trials + 3}")
    c.stats_check(f"{kind}: statistics")
    return choice, row


def skew_section():
    c = Comm()
    # The communicator's first quantizable call finds the node layout (a collective of its
    # own, before the call is timed), which would absorb a late rank's delay: one call of
    # another size does that first (the first trial of its own key: ring).
    checked_call(c, "allreduce", 8192, "ring", "allreduce, the first call")
    count = 16384  # 64 KiB of float32
    late = {"exact": (1, LATE_S), "ring": (2, LATE_S), "tree": (3, LATE_S)}
    choice, row = try_and_decide(c, "allreduce", count, late)
    expect(choice == "sra", "skew", f"decided {choice}; expected sra, the one nobody delayed")
    if row is not None:
        seconds = dict(zip(row["candidates"], row["seconds"]))
        expect(all(seconds[name] >= LATE_S - ARRIVAL_SLACK_S for name in late)
               and seconds["sra"] < LATE_S - ARRIVAL_SLACK_S,
               "skew", f"agreed times {seconds}: the delayed candidates must take >= {LATE_S} s")
    # A size no call has tried, inside a group: auto's rule (SRA on 4 ranks above 64 KiB),
    # nothing tried and no row made.
    require(lib.ncclGroupStart(), "ncclGroupStart")
    x = rank_input(Case("sra", "float32", 65536), RANK).astype(np.float32)
    out = np.empty_like(x)
    require(lib.ncclAllReduce(ptr(x), ptr(out), x.size, lib.ncclFloat32, lib.ncclSum, c.comm,
                              STREAM), "ncclAllReduce in a group")
    require(lib.ncclGroupEnd(), "ncclGroupEnd")
    synced(out)
    outputs = COMM.gather(out, root=0)
    if RANK == 0:
        check_case(Case("sra", "float32", 65536), c.call, outputs, [True] * NRANKS, failures)
    c.call += 1
    c.compressed += 1
    expect(len(qcomm.tuning(c.comm)) == 2, "group", "a call inside a group made a tuning row")
    c.stats_check("skew: statistics")
    # A near-tie (docs/tuning.md: a quantized candidate must be more than 5% faster).
    near = {"exact": (1, 0.5), "sra": (2, 0.488), "ring": (3, 0.6), "tree": (3, 0.6)}
    choice, row = try_and_decide(c, "allreduce", 2048, near)
    if row is not None:
        seconds = dict(zip(row["candidates"], row["seconds"]))
        expect(seconds["sra"] < seconds["exact"] < seconds["sra"] / 0.95, "near-tie",
               f"agreed times {seconds}: expected SRA's the least, within 5% of exact's")
    expect(choice == "exact", "near-tie", f"decided {choice}; expected exact (SRA is not 5% "
           "faster)")
    # A lucky trial (docs/tuning.md: a candidate's median trial counts): ring is late in two
    # timed trials of three, fast in the other; exact, tree and SRA are late in every trial,
    # by less.
    lucky = {"ring": (1, 0.3, {3, 4}), "exact": (2, 0.2), "tree": (2, 0.2), "sra": (2, 0.2)}
    choice, row = try_and_decide(c, "allreduce", 1024, lucky)
    if row is not None:
        seconds = dict(zip(row["candidates"], row["seconds"]))
        expect(seconds["ring"] >= 0.3 - ARRIVAL_SLACK_S
               and all(0.2 - ARRIVAL_SLACK_S <= seconds[n] < 0.3 for n in
                                                ("exact", "tree", "sra")),
               "lucky trial", f"agreed times {seconds}: expected ring's >= 0.3 s (its median), "
               "the others' in [0.2, 0.3)")
    expect(choice != "ring", "lucky trial", "decided ring, from its one fast trial")
    # The first two trials are not timed: exact late in those and its first timed trial
    # only, its median is a fast trial's.
    choice, row = try_and_decide(c, "allreduce", 512, {"exact": (1, 0.4, {0, 1, 2})})
    if row is not None:
        seconds = dict(zip(row["candidates"], row["seconds"]))
        expect(seconds["exact"] < 0.2, "untimed trials",
               f"agreed times {seconds}: exact's must be a fast trial's (< 0.2 s)")
    # Trials that overlap (docs/tuning.md: a quantized candidate's every timed trial must
    # beat exact's fastest): SRA's median is far below exact's, but one of its timed trials
    # on one rank took longer than the slowest rank's fastest exact trial.
    overlap = {"exact": (1, 0.2), "sra": (2, 0.3, {4}), "ring": (3, 0.25), "tree": (3, 0.25)}
    choice, row = try_and_decide(c, "allreduce", 256, overlap)
    if row is not None:
        seconds = dict(zip(row["candidates"], row["seconds"]))
        floor = dict(zip(row["candidates"], row["floor_seconds"]))
        ceiling = dict(zip(row["candidates"], row["ceiling_seconds"]))
        expect(seconds["sra"] < 0.95 * seconds["exact"]
               and floor["exact"] >= 0.2 - ARRIVAL_SLACK_S
               and ceiling["sra"] >= 0.3 - ARRIVAL_SLACK_S
               and floor["sra"] <= seconds["sra"] <= ceiling["sra"],
               "overlapping trials", f"agreed medians {seconds}, floors {floor}, ceilings "
               f"{ceiling}: expected SRA's median the least, its ceiling >= 0.3 s, exact's "
               "floor >= 0.2 s")
    expect(choice == "exact", "overlapping trials", f"decided {choice}; expected exact (a "
           "trial of SRA was slower than exact's fastest)")
    require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")


def others_section():
    c = Comm()
    try_and_decide(c, "reducescatter", 4096 * NRANKS)
    try_and_decide(c, "allgather", 4096)
    require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")


TUNE_COUNT = 4096  # 16 KiB of float32: size class 14
TUNE_KEY = (f"allreduce float32 class=14 ranks=4 nodes=1 local=4 "
            f"memory={'device' if MEMORY.device_mode else 'host'} bits=4 bucket=128 "
            f"rounding=stochastic feedback=0 inter=auto intra=0 lanes=0 segment=0 rotation=0")
HEADER = "qnccl-tune-file 1 libqnccl "


def tune_file(path):
    """Makes the next communicator's ranks read `path` (None: the variable unset)."""
    if path is None:
        os.environ.pop("QNCCL_TUNE_FILE", None)
    else:
        os.environ["QNCCL_TUNE_FILE"] = str(path)


def stored_lines(path):
    """The file's lines, once every rank is past its last write (and before any writes
    it again)."""
    COMM.barrier()
    lines = Path(path).read_text().splitlines()
    COMM.barrier()
    return lines


def write_file(path, text):
    """Rank 0 writes `path`; every rank waits for it."""
    if RANK == 0:
        Path(path).write_text(text)
    COMM.barrier()


def decided_without_trials(c, choice, label):
    """Two calls of the key that a stored decision decides: both run `choice`, and the
    table row says stored, with no trial calls."""
    for i in range(2):
        checked_call(c, "allreduce", TUNE_COUNT, choice, f"{label}: call {i} ({choice})")
    row = entry(c, "allreduce", TUNE_COUNT)
    expect(row is not None and row["stored"] and row["choice"] == choice and
           row["trial_calls"] == 0 and row["calls"] == 2, label,
           f"row {row}: expected the stored choice {choice}, no trials, 2 calls")


def tunefile_section(folder):
    shared = folder / "shared.tune"
    tune_file(shared)
    c = Comm()
    choice, row = try_and_decide(c, "allreduce", TUNE_COUNT)
    expect(row is not None and not row["stored"], "tune file: trials", f"row {row}")
    require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")
    lines = stored_lines(shared)
    version = lines[0][len(HEADER):] if lines else ""
    expect(lines[:1] == [HEADER + version] and len(lines) == 2 and
           lines[1].startswith(f"{TUNE_KEY} : {choice} exact="), "tune file: stored",
           f"the file holds {lines}, expected the header and '{TUNE_KEY} : {choice} ...'")
    # Another valid choice in its place: a new communicator runs it without trials.
    tree = f"{HEADER}{version}\n{TUNE_KEY} : tree exact=9000 ring=9000 tree=1000 sra=9000\n"
    write_file(shared, tree)
    c = Comm()
    decided_without_trials(c, "tree", "tune file: reloaded")
    require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")
    # Not trusted: a malformed line, then another version's file; trials run, and the
    # decision rewrites the file whole.
    for label, text in (("malformed", tree + "allreduce float32 : ring\n"),
                        ("stale", tree.replace(HEADER + version, HEADER + "9.9.9"))):
        write_file(shared, text)
        c = Comm()
        choice, row = try_and_decide(c, "allreduce", TUNE_COUNT)
        expect(row is not None and not row["stored"], f"tune file {label}", f"row {row}")
        require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")
        lines = stored_lines(shared)
        expect(len(lines) == 2 and lines[0] == HEADER + version and
               lines[1].startswith(f"{TUNE_KEY} : {choice} "), f"tune file {label}",
               f"not rewritten whole: {lines}")
    # A file that is not a tune file (a mistyped path): read as untrusted, never written.
    script = folder / "script.sh"
    write_file(script, "#!/bin/sh\necho hello\n")
    tune_file(script)
    c = Comm()
    try_and_decide(c, "allreduce", TUNE_COUNT)
    require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")
    expect(stored_lines(script) == ["#!/bin/sh", "echo hello"], "not a tune file",
           "the file was changed")
    # Files that differ between ranks, and a rank without the variable: not used, trials.
    own = folder / f"rank{RANK}.tune"
    own.write_text(tree.replace(": tree", ": ring") if RANK == 1 else tree)
    tune_file(None if RANK == 3 else own)
    c = Comm()
    choice, row = try_and_decide(c, "allreduce", TUNE_COUNT)
    expect(row is not None and not row["stored"], "tune files differ", f"row {row}")
    require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")
    tune_file(None)


def capture_section():
    c = Comm()
    # Trials of another size first: the layout found and the workspace grown by its
    # quantized trials, so that the capture needs no new memory (CUDA forbids it there).
    for i, candidate in enumerate(trial_schedule("allreduce")):
        checked_call(c, "allreduce", 32768, candidate, f"capture section, trial {i}")
    count = 16384
    case = Case("sra", "float32", count)
    x = rank_input(case, RANK).astype(np.float32)
    out = np.zeros_like(x)
    pointers = (ptr(x), ptr(out))  # uploaded before the capture

    def allreduce():
        require(lib.ncclAllReduce(*pointers, count, lib.ncclFloat32, lib.ncclSum, c.comm,
                                  STREAM), "a captured ncclAllReduce")

    graph = MEMORY.capture(allreduce)
    rows = [r for r in qcomm.tuning(c.comm) if r["max_bytes"] >= count * 4 >= r["min_bytes"]]
    expect(not rows, "capture", f"a captured call made or counted a tuning row: {rows}")
    for replay in range(2):
        MEMORY.replay(graph)
        synced(out)
        outputs = COMM.gather(out.copy(), root=0)
        if RANK == 0:  # the rule's SRA, each replay the next call number
            check_case(case, c.call, outputs, [True] * NRANKS, failures)
        c.call += 1
    require(lib.ncclCommDestroy(c.comm), "ncclCommDestroy")


def main():
    if NRANKS != 4:
        print("tuning_check.py runs on 4 ranks", flush=True)
        return 2
    skew_section()
    others_section()
    if os.environ.get("TUNE_DIR"):
        tunefile_section(Path(os.environ["TUNE_DIR"]))
    if MEMORY.device_mode:
        capture_section()
    failed = COMM.allreduce(len(failures.lines))
    total = COMM.allreduce(interposer_check.checks)
    if RANK == 0:
        print(f"SUMMARY tuning: {NRANKS} ranks, {total} checks, {failed} failures", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
