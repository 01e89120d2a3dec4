"""Measured auto (QNCCL_ALGO=auto, docs/tuning.md) through the interposer, on 4 real MPI
ranks over the host backend: mpi_programs/tuning_check.py (its docstring lists the checks:
skewed timings, the schedule, every call against the emulator or the real library, groups,
statistics, reduce-scatter and allgather), and the decisions' INFO lines."""
import re

import pytest

from mpi import REPO, run_python

# Its skewed ranks are 12 ms apart in the near-tie case: no other test's load beside it.
pytestmark = pytest.mark.serial

PROGRAM = REPO / "tests" / "mpi_programs" / "tuning_check.py"
NRANKS = 4


def test_ranks_decide_alike_under_skewed_timings(tmp_path):
    result = run_python(NRANKS, PROGRAM, timeout=240, env={"TUNE_DIR": str(tmp_path)})
    assert f"SUMMARY tuning: {NRANKS} ranks" in result.stdout and "0 failures" in result.stdout, \
        result.stdout[-3000:]
    # One INFO line per rank and key, all naming the same choice: SRA for the skewed
    # allreduce, whose delayed candidates took >= 0.2 s in the agreed times.
    decisions = re.findall(r"rank (\d): measured auto: ncclAllReduce float32 of 65536\.\.131071 "
                           r"bytes per rank runs (\w+) \(the slowest rank's median trial "
                           r"\[its fastest, the slowest of any rank\], ms: "
                           r"exact ([\d.]+ \[[\d.]+, [\d.]+\]), ring ([\d.]+ \[[\d.]+, [\d.]+\]), "
                           r"tree ([\d.]+ \[[\d.]+, [\d.]+\]), sra ([\d.]+ \[[\d.]+, [\d.]+\]); "
                           r"20 trial calls\)", result.stdout)
    assert sorted(int(d[0]) for d in decisions) == list(range(NRANKS)), result.stdout[-3000:]
    assert {d[1] for d in decisions} == {"sra"}, decisions
    assert len({d[2:] for d in decisions}) == 1, f"the ranks' agreed times differ: {decisions}"
    for key in ("ncclReduceScatter float32 of 16384..32767", "ncclAllGather float32 of 16384..32767"):
        choices = re.findall(rf"rank \d: measured auto: {key} bytes per rank runs (\w+)",
                             result.stdout)
        assert len(choices) == NRANKS and len(set(choices)) == 1, (key, choices)
    # QNCCL_TUNE_FILE (the program's tunefile section): a stored decision runs without
    # trials and says so; each file not trusted is named in one warning per rank.
    stored = re.findall(r"rank \d: measured auto: ncclAllReduce float32 of 16384\.\.32767 bytes "
                        r"per rank runs tree \(QNCCL_TUNE_FILE, no trials", result.stdout)
    assert len(stored) == NRANKS, result.stdout[-3000:]
    output = result.stdout + result.stderr
    for problem in ("line 3 is not", "was not written by this libqnccl"):
        warnings = re.findall(rf"QNCCL WARN QNCCL_TUNE_FILE=\S+shared.tune {problem}", output)
        assert len(warnings) == NRANKS, (problem, output[-3000:])
    # the mistyped path: untrusted on every rank, and its one writer (one node) leaves it
    assert len(re.findall(r"QNCCL WARN QNCCL_TUNE_FILE=\S+script.sh is not a tune file",
                          output)) == 1, output[-3000:]
