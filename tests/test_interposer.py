"""libqnccl.so as a drop-in for NCCL: an unmodified NCCL program under
`qnccl run` (LD_PRELOAD), the QNCCL_* configuration, quantized ops,
communicators and their statistics, and the `qnccl run` / `qnccl info`
commands.

MPI jobs (tests/mpi.py) run over QNCCL's host backend:

- programs/nccl_allreduce.c, a plain NCCL + MPI program built here against
  QNCCL's ABI header, on 4 ranks: as is (exact results), through
  `qnccl run --bits 4 ... --debug INFO` (eligible calls are bit for bit
  qnccl.emulate.allreduce with the communicator's call numbers, every other
  call the plain run's bytes; the INFO lines; the statistics), with
  --disable (all exact), and with bad settings (communicator creation fails
  naming the variable);
- mpi_programs/interposer_check.py: the exported entry points called from
  Python: quantized ops, warm-up, split, per-communicator statistics.

The rest (configuration parsing, the CLI) runs in this process or in plain
subprocesses.
"""
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import mpi
from conftest import cuda_device_count, from_float32, sent_bytes, widen
from mpi import HOST_NCCL, LIBQNCCL, REPO
from qnccl import cli
from qnccl.emulate import allreduce as emulate_allreduce
from qnccl.emulate.allreduce import auto_algo

TESTS = Path(__file__).resolve().parent
PROGRAM_SOURCE = TESTS / "programs" / "nccl_allreduce.c"
CHECK_PROGRAM = TESTS / "mpi_programs" / "interposer_check.py"
QNCCL = [sys.executable, "-m", "qnccl"]  # the `qnccl` command of this interpreter
NRANKS = 4

# Every variable of the interposer's configuration: the tests start from none set.
CONFIG_VARIABLES = tuple(variable for _, variable, _ in cli.RUN_OPTIONS) + (
    "QNCCL_ERROR_FEEDBACK",)
# What libqnccl.so must export to stand in for NCCL, and its own API for it.
INTERPOSED = ("ncclAllReduce", "pncclAllReduce", "ncclCommInitRank", "ncclCommInitRankConfig",
              "ncclCommInitAll", "ncclCommSplit", "ncclCommDestroy", "ncclCommAbort",
              "ncclGroupStart", "ncclGroupEnd", "ncclRedOpDestroy", "ncclCommGetAsyncError",
              "ncclReduce", "pncclReduce", "ncclReduceScatter",
              "qncclConfigFromEnv",
              "qncclRedOpCreateQuantized", "qncclCommGetStats")


@pytest.fixture(autouse=True)
def no_qnccl_settings(monkeypatch):
    for name in CONFIG_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def interposer():
    """libqnccl.so with the interposer, and the host backend."""
    for path in (LIBQNCCL, HOST_NCCL):
        if not path.is_file():
            pytest.fail(f"{path} is missing: run `make` in {REPO}")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(LIBQNCCL)], capture_output=True,
                             text=True).stdout
    missing = [name for name in INTERPOSED if not re.search(rf" [TW] {name}$", symbols, re.M)]
    if missing:
        pytest.fail(f"{LIBQNCCL} does not export {', '.join(missing)}: run `make` in {REPO}")


# ---- the NCCL program ------------------------------------------------------------------

@pytest.fixture(scope="session")
def program(tmp_path_factory, interposer):
    """programs/nccl_allreduce.c compiled against an nccl.h that is QNCCL's ABI
    header (the NCCL API without CUDA) and linked with the host backend."""
    mpicc = shutil.which("mpicc") or pytest.fail("mpicc not found: run `make setup`")
    build = tmp_path_factory.mktemp("nccl_program")
    (build / "include").mkdir()
    (build / "include" / "nccl.h").write_text(
        f'/* NCCL\'s API, as QNCCL declares it */\n'
        f'#include "{REPO / "src" / "include" / "nccl_abi.h"}"\n')
    exe = build / "nccl_allreduce"
    compiled = subprocess.run(
        [mpicc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{build / 'include'}",
         str(PROGRAM_SOURCE), "-o", str(exe), f"-L{HOST_NCCL.parent}", "-lnccl"],
        capture_output=True, text=True)
    if compiled.returncode != 0:
        pytest.fail(f"compiling {PROGRAM_SOURCE.name} failed:\n{compiled.stderr}")
    return exe


def run_program(program, outdir, qnccl_flags=None, nprocs=NRANKS, env=None, check=True):
    """The program on `nprocs` ranks writing to `outdir`; through `qnccl run
    <qnccl_flags> --` unless None. Its libnccl.so.2 is the host backend."""
    argv = [str(program), str(outdir)]
    if qnccl_flags is not None:
        argv = [*QNCCL, "run", *qnccl_flags, "--", *argv]
    with pytest.MonkeyPatch.context() as patch:  # module fixtures: no QNCCL_* from outside
        for name in CONFIG_VARIABLES:
            patch.delenv(name, raising=False)
        return mpi.run(nprocs, argv, timeout=120, check=check,
                       env={"LD_LIBRARY_PATH": str(HOST_NCCL.parent), **(env or {})})


STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
           "int32": np.int32, "float64": np.float64}


@dataclasses.dataclass
class Call:
    """One ncclAllReduce of the program (a line of its manifest.tsv) and every
    rank's input and output."""
    name: str
    dtype: str
    op: str
    count: int
    inplace: bool
    group_depth: int
    inputs: list
    outputs: list

    @property
    def nbytes(self):
        return self.count * np.dtype(STORAGE[self.dtype]).itemsize


def load_run(directory, nranks=NRANKS):
    calls = []
    for line in (directory / "manifest.tsv").read_text().splitlines():
        _, name, dtype, op, count, inplace, depth = line.split("\t")

        def read(kind):
            return [np.fromfile(directory / f"{name}.r{r}.{kind}", STORAGE[dtype])
                    for r in range(nranks)]
        calls.append(Call(name, dtype, op, int(count), inplace == "1", int(depth), read("in"),
                          read("out")))
    return calls


@dataclasses.dataclass
class Run:
    calls: list
    output: str


def program_run(program, tmp_path_factory, name, qnccl_flags=None):
    outdir = tmp_path_factory.mktemp(name)
    output = run_program(program, outdir, qnccl_flags).stdout
    return Run(load_run(outdir), output)


# The preloaded run's configuration: flags of `qnccl run` and what they mean.
SEED = 20261122
RUN_FLAGS = ["--bits", "4", "--bucket-size", "64", "--min-bytes", "16K", "--seed", str(SEED),
             "--algo", "rule", "--debug", "info"]  # the rule's bytes: measured auto, test_tuning
CONFIG = dict(bits=4, bucket_size=64, rounding="stochastic", seed=SEED)
MIN_BYTES = 16 << 10
CODEC_TYPES = ("float32", "float16", "bfloat16")


def eligible(call):
    """The interposer's rule: a codec type, sum or avg, at least QNCCL_MIN_BYTES."""
    return call.dtype in CODEC_TYPES and call.op in ("sum", "avg") and call.nbytes >= MIN_BYTES


@pytest.fixture(scope="module")
def plain(program, tmp_path_factory):
    return program_run(program, tmp_path_factory, "plain")


@pytest.fixture(scope="module")
def preloaded(program, tmp_path_factory):
    return program_run(program, tmp_path_factory, "preloaded", RUN_FLAGS)


def same_bytes(a, b):
    return a.nbytes == b.nbytes and np.array_equal(a.view(np.uint8), b.view(np.uint8))


# float rounding of one step of the host backend's reduction, per type
UNIT = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float64": 2.0**-53}


def test_plain_run_is_exact(plain):
    """Without QNCCL the program gets NCCL's (the host backend's) results:
    int32 and max exactly, float sums within a few roundings of the exact sum."""
    assert sum(map(eligible, plain.calls)) >= 8 and sum(not eligible(c) for c in plain.calls) >= 6
    for call in plain.calls:
        values = np.stack([widen(x, call.dtype) for x in call.inputs])
        if call.op == "max":
            want, tolerance = values.max(axis=0), 0.0
        else:
            divisor = NRANKS if call.op == "avg" else 1
            want = values.sum(axis=0) / divisor
            tolerance = (0.0 if call.dtype == "int32" else
                         (NRANKS + 1) * UNIT[call.dtype] * np.abs(values).sum(axis=0) / divisor)
        for rank, out in enumerate(call.outputs):
            error = np.abs(widen(out, call.dtype) - want)
            assert np.all(error <= tolerance), (
                f"{call.name} rank {rank}: {np.count_nonzero(error > tolerance)} values off by "
                f"up to {error.max():.3g}")


def emulate(call, number):
    return emulate_allreduce(call.inputs, algo="auto", op=call.op, call=number,
                             dtype=call.dtype, **CONFIG)[0]


def test_preloaded_run_quantizes_exactly_the_eligible_calls(plain, preloaded):
    """Under `qnccl run`: every eligible call (float32/float16/bfloat16, sum or
    avg, >= 16 KiB) is bit for bit the emulator's allreduce with the flags'
    configuration, on every rank, its call number counting the compressed calls
    in issue order (grouped calls included, nested groups, mixed with calls
    that pass through); every other call (int32, max, float64, below the
    minimum) is the plain run's bytes."""
    failures = []
    number = 0
    for before, call in zip(plain.calls, preloaded.calls):
        assert all(same_bytes(a, b) for a, b in zip(before.inputs, call.inputs)), call.name
        if not eligible(call):
            failures += [f"{call.name} rank {r}: passed-through call differs from the plain run"
                         for r in range(NRANKS) if not same_bytes(call.outputs[r],
                                                                  before.outputs[r])]
            continue
        expected = emulate(call, number)
        wrong = [r for r in range(NRANKS) if not same_bytes(call.outputs[r], expected)]
        if wrong:
            match = next((c for c in range(number + 8) if c != number and
                          same_bytes(call.outputs[wrong[0]], emulate(call, c))), None)
            failures.append(f"{call.name} (compressed call {number}): ranks {wrong} differ from "
                            f"the emulator" + (f"; rank {wrong[0]} has its call {match}"
                                               if match is not None else ""))
        number += 1
    assert not failures, "\n".join(failures)


INFO = r"QNCCL INFO comm (?:0x)?[0-9a-fA-F]+ rank (\d+)"


def test_info_lines(preloaded):
    """QNCCL_DEBUG=INFO: each rank prints its communicator's configuration and
    the NCCL it forwards to, one line per (datatype, op, decision) kind seen,
    and its statistics at ncclCommDestroy."""
    output = preloaded.output
    configs = re.findall(
        rf"{INFO}/{NRANKS}: bits=4 bucket=64 rounding=stochastic rotation=none "
        rf"rotation_block=256 clip=none algo=rule inter_algo=auto "
        rf"intra_bits=0 lanes=0 segment_values=0 min_bytes={MIN_BYTES} "
        rf"seed={SEED} warmup=0 error_feedback=0 error_feedback_max_bytes={4 << 30} enable=1 "
        rf"collectives=allreduce nccl=(\S+)$",
        output, re.M)
    assert sorted(int(rank) for rank, _ in configs) == list(range(NRANKS)), output[-4000:]
    assert {Path(path).resolve() for _, path in configs} == {HOST_NCCL.resolve()}

    expected = set()  # (dtype, op, "compressed" or "passed through", algo or None)
    for call in preloaded.calls:
        if eligible(call):
            expected.add((call.dtype, call.op, "compressed",
                          auto_algo(call.count, call.dtype, NRANKS)))
        else:
            expected.add((call.dtype, call.op, "passed through", None))
    lines = re.findall(rf"{INFO}: ncclAllReduce (\w+) (\w+): (compressed|passed through) "
                       rf"\(([^)]*)\)$", output, re.M)
    for rank in range(NRANKS):
        mine = [line[1:] for line in lines if int(line[0]) == rank]
        assert len(mine) == len(set(mine)), f"rank {rank} repeats a kind: {mine}"
        kinds = {(dtype, op, decision) for dtype, op, decision, _ in mine}
        assert kinds == {kind[:3] for kind in expected}, f"rank {rank}: {mine}"
        for dtype, op, decision, detail in mine:
            if decision == "compressed":
                assert (dtype, op, decision, detail) in expected, f"rank {rank}: {mine}"


def expected_stats(calls, rank):
    compressed = [call for call in calls if eligible(call)]
    return (len(compressed), len(calls) - len(compressed),
            sum(call.nbytes for call in compressed),
            sum(sent_bytes(call.count, call.dtype, NRANKS, rank, "auto", CONFIG["bits"],
                           CONFIG["bucket_size"]) for call in compressed))


def stats_lines(output):
    return {int(rank): tuple(map(int, counters)) for rank, *counters in re.findall(
        rf"{INFO}: compressed=(\d+) passed_through=(\d+) bytes_in=(\d+) bytes_on_wire=(\d+) "
        r"residual_buffers=0 residual_bytes=0 compute_steps=\d+ groups=\d+$", output, re.M)}


def test_statistics_at_destroy(preloaded):
    """The INFO line at ncclCommDestroy counts the compressed and passed-through
    calls, the compressed calls' input bytes and the bytes this rank sent for
    them (docs/allreduce.md); at 4 bits those are under a fifth of what NCCL's
    ring would send uncompressed (2(N-1)/N of the input)."""
    stats = stats_lines(preloaded.output)
    assert sorted(stats) == list(range(NRANKS)), preloaded.output[-4000:]
    for rank, (compressed, passed, bytes_in, on_wire) in stats.items():
        assert (compressed, passed, bytes_in, on_wire) == expected_stats(preloaded.calls, rank)
        assert compressed > 0
        assert on_wire < 2 * (NRANKS - 1) / NRANKS * bytes_in / 5


def test_disable_passes_everything_through(program, plain, tmp_path):
    """`qnccl run --disable`: libqnccl.so is loaded but every call is NCCL's."""
    result = run_program(program, tmp_path, ["--disable", "--debug", "INFO"])
    for before, call in zip(plain.calls, load_run(tmp_path)):
        for rank in range(NRANKS):
            assert same_bytes(call.outputs[rank], before.outputs[rank]), (call.name, rank)
    assert stats_lines(result.stdout) == {
        rank: (0, len(plain.calls), 0, 0) for rank in range(NRANKS)}, result.stdout[-4000:]


@pytest.mark.parametrize("nprocs, flags, why", [
    (NRANKS, ["--algo", "hier"], "hierarchical on one node: nothing crosses a node link")])
def test_nothing_is_quantized_where_nothing_crosses_a_link(program, tmp_path, nprocs, flags,
                                                           why):
    """The hierarchical algorithm with every rank on one node: quantizing would add error
    and save nothing (its quantized stage runs between nodes), so every call is the real
    NCCL's, bit for bit the plain run's, and the INFO lines and statistics say so."""
    runs = {}
    for name, qnccl_flags in (("plain", None), ("preloaded", RUN_FLAGS + flags)):
        outdir = tmp_path / name
        outdir.mkdir()
        output = run_program(program, outdir, qnccl_flags, nprocs=nprocs).stdout
        runs[name] = Run(load_run(outdir, nprocs), output)
    plain_calls, calls = runs["plain"].calls, runs["preloaded"].calls
    assert sum(map(eligible, calls)) >= 8
    for before, call in zip(plain_calls, calls):
        for rank in range(nprocs):
            assert same_bytes(call.outputs[rank], before.outputs[rank]), (call.name, rank)
    output = runs["preloaded"].output
    decided = re.findall(rf"{INFO}: ncclAllReduce (\w+) (\w+): (compressed|passed through) "
                         rf"\(([^)]*)\)$", output, re.M)
    eligible_kinds = {(c.dtype, c.op) for c in calls if eligible(c)}
    for rank in range(nprocs):
        mine = {(dtype, op, decision, detail) for r, dtype, op, decision, detail in decided
                if int(r) == rank}
        assert {kind + ("passed through", why) for kind in eligible_kinds} <= mine, (rank, mine)
        assert not any(decision == "compressed" for _, _, decision, _ in mine), (rank, mine)
    assert stats_lines(output) == {
        rank: (0, len(calls), 0, 0) for rank in range(nprocs)}, output[-4000:]


@pytest.mark.parametrize("variable, value, message", [
    ("QNCCL_ERROR_FEEDBACK", "2", "allowed: 0 or 1"),
    ("QNCCL_BUCKET_SIZE", "0", r"1\.\.2\^40 values.*K, M or G"),
])
def test_bad_setting_fails_communicator_creation(program, tmp_path, variable, value, message):
    """An unmodified program with a bad QNCCL_* value fails at ncclCommInitRank
    with ncclInvalidArgument (4) and a WARN naming the variable: it never runs
    with a setting it did not ask for."""
    result = run_program(program, tmp_path, [], nprocs=2, env={variable: value}, check=False)
    assert result.returncode != 0, result.stdout[-4000:]
    assert re.search(rf"^QNCCL WARN .*{variable}.*{message}", result.stdout, re.M), \
        result.stdout[-4000:]
    assert re.search(r"ncclCommInitRank\(.*failed: .*\(4\)", result.stdout), result.stdout[-4000:]


# ---- the exported entry points from Python ------------------------------------------

def test_quantized_ops_warmup_split_and_statistics(interposer):
    """mpi_programs/interposer_check.py on 4 ranks: quantized ops with every
    algorithm (also with QNCCL_ENABLE=0 and below the minimum size), op
    destroy then reuse, warm-up calls, per-communicator call numbers and
    statistics, ncclCommSplit reading the environment, bad settings at
    ncclCommInitRank/ncclCommInitRankConfig/ncclCommSplit, a one-rank
    communicator, a nonblocking communicator asked nothing while it is being made
    (its reports name a real rank and size) whose first call splits it."""
    result = mpi.run_python(NRANKS, CHECK_PROGRAM, timeout=120)
    summary = [line for line in result.stdout.splitlines() if line.startswith("SUMMARY")]
    assert summary and summary[-1].endswith(" 0 failures"), result.stdout[-6000:]
    # The one-rank section's INFO: each QNCCL_ALGO passes through, and says why.
    one_rank = re.findall(r"^QNCCL INFO comm \S+ rank 0: ncclAllReduce float32 sum: passed "
                          r"through \(one rank: nothing crosses a link\)$", result.stdout, re.M)
    assert len(one_rank) == 6 * NRANKS, result.stdout[-6000:]  # each rank has its own
    reports = [r for r in re.findall(r"^QNCCL INFO comm \S+ rank (-?\d+)/(-?\d+): bits=",
                                     result.stdout, re.M) if r[1] != "1"]  # not one-rank's
    assert sorted(int(rank) for rank, size in reports) == list(range(NRANKS)) and \
        all(int(size) == NRANKS for rank, size in reports), \
        f"the nonblocking communicator's reports {reports}: one per rank, of {NRANKS} ranks, " \
        f"expected:\n{result.stdout[-6000:]}"


@pytest.mark.parametrize("mode", ["abort", "destroy", "split"])
def test_abort_waits_for_the_quantized_group(interposer, monkeypatch, mode):
    """mpi_programs/abort_check.py on 2 ranks: ncclCommAbort (ncclCommDestroy) from a
    second thread while a quantized call waits in its ncclGroupEnd (split: in the
    ncclCommSplit that finds the node layout) for a peer that is gone. NVIDIA's NCCL
    would free the communicator under it; the host backend says so on stderr when it
    happens. libqnccl stops the group (ncclCommRevoke) or waits for it to give up, then
    lets the real library end the communicator: the call fails saying why, the abort
    returns within seconds, and the backend saw no communicator ended under a group."""
    for name in CONFIG_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    result = mpi.run_python(2, TESTS / "mpi_programs" / "abort_check.py", mode, timeout=60,
                            # the destroy waits for the group to give up by itself
                            env={"QNCCL_HOST_INIT_TIMEOUT": "2" if mode == "destroy" else "30"})
    assert f"SUMMARY abort_check {mode}: 0 failures" in result.stdout, result.stdout[-4000:]
    assert "QNCCL WARN host backend" not in result.stdout, result.stdout[-4000:]


# ---- configuration from the environment ---------------------------------------------

def env_config(capi):
    """describe_env_config of qncclConfigFromEnv for this process's environment,
    or raises QncclError."""
    from qnccl import _lib
    ffi, lib = capi
    config = ffi.new("qncclEnvConfig_t*")
    _lib.check(lib.qncclConfigFromEnv(config))
    return cli.describe_env_config(config)


DEFAULTS = ("bits=4 bucket=128 rounding=stochastic rotation=none rotation_block=256 clip=none "
            "algo=auto "
            "inter_algo=auto intra_bits=0 "
            "lanes=0 segment_values=0 min_bytes=65536 seed=0 warmup=0 enable=1 error_feedback=0 "
            f"error_feedback_max_bytes={4 << 30} debug=WARN "
            "collectives=allreduce")


def test_default_configuration(capi):
    assert env_config(capi) == DEFAULTS


@pytest.mark.parametrize("variable, value, shown", [
    ("QNCCL_ENABLE", "0", "enable=0"),
    ("QNCCL_BITS", "1", "bits=1"),
    ("QNCCL_BITS", "8", "bits=8"),
    ("QNCCL_BUCKET_SIZE", "1", "bucket=1"),
    ("QNCCL_BUCKET_SIZE", "4096", "bucket=4096"),
    ("QNCCL_BUCKET_SIZE", "1K", "bucket=1024"),  # suffixes, as every size variable takes them
    ("QNCCL_BUCKET_SIZE", "2k", "bucket=2048"),
    ("QNCCL_MIN_BYTES", "64k", f"min_bytes={64 << 10}"),
    ("QNCCL_ROUNDING", "nearest", "rounding=nearest"),
    ("QNCCL_ROTATION", "hadamard", "rotation=hadamard"),
    ("QNCCL_ROTATION", "none", "rotation=none"),
    ("QNCCL_ROTATION_BLOCK", "2", "rotation_block=2"),
    ("QNCCL_ROTATION_BLOCK", "16K", f"rotation_block={16 << 10}"),
    ("QNCCL_ALGO", "auto", "algo=auto"),
    ("QNCCL_ALGO", "rule", "algo=rule"),
    ("QNCCL_ALGO", "sra", "algo=sra"),
    ("QNCCL_ALGO", "tree", "algo=tree"),
    ("QNCCL_ALGO", "hier", "algo=hier"),
    ("QNCCL_INTER_ALGO", "ring", "inter_algo=ring"),
    ("QNCCL_INTER_ALGO", "sra", "inter_algo=sra"),
    ("QNCCL_INTRA_BITS", "0", "intra_bits=0"),
    ("QNCCL_INTRA_BITS", "8", "intra_bits=8"),
    ("QNCCL_LANES", "0", "lanes=0"),
    ("QNCCL_LANES", "3", "lanes=3"),
    ("QNCCL_LANES", "8", "lanes=8"),
    ("QNCCL_SEGMENT_VALUES", "4096", "segment_values=4096"),
    ("QNCCL_SEGMENT_VALUES", "64K", f"segment_values={64 << 10}"),
    ("QNCCL_SEGMENT_VALUES", "1024G", f"segment_values={1 << 40}"),
    ("QNCCL_MIN_BYTES", "0", "min_bytes=0"),
    ("QNCCL_MIN_BYTES", "12345", "min_bytes=12345"),
    ("QNCCL_MIN_BYTES", "2K", "min_bytes=2048"),
    ("QNCCL_MIN_BYTES", "3M", f"min_bytes={3 << 20}"),
    ("QNCCL_MIN_BYTES", "1G", f"min_bytes={1 << 30}"),
    ("QNCCL_ERROR_FEEDBACK_MAX_BYTES", "16M", f"error_feedback_max_bytes={16 << 20}"),
    ("QNCCL_SEED", str(2**64 - 1), f"seed={2**64 - 1}"),
    ("QNCCL_WARMUP_CALLS", "7", "warmup=7"),
    ("QNCCL_ERROR_FEEDBACK", "0", "error_feedback=0"),
    ("QNCCL_ERROR_FEEDBACK", "1", "error_feedback=1"),
    ("QNCCL_DEBUG", "TRACE", "debug=TRACE"),
    ("QNCCL_COLLECTIVES", "reducescatter", "collectives=reducescatter"),
    ("QNCCL_COLLECTIVES", "reducescatter,allreduce", "collectives=allreduce,reducescatter"),
    ("QNCCL_COLLECTIVES", "sendrecv,alltoall,allgather",
     "collectives=allgather,alltoall,sendrecv"),
    ("QNCCL_COLLECTIVES", "none", "collectives=none"),
])
def test_configuration_values(capi, monkeypatch, variable, value, shown):
    monkeypatch.setenv(variable, value)
    key = shown.split("=")[0]
    assert env_config(capi) == re.sub(rf"\b{key}=\S+", shown, DEFAULTS)


def test_clip_takes_a_rotation(capi, monkeypatch):
    """QNCCL_CLIP=gaussian clips rotated buckets' ranges: shown with QNCCL_ROTATION=hadamard,
    refused without it, with a message naming both variables."""
    from qnccl import QncclError
    monkeypatch.setenv("QNCCL_CLIP", "gaussian")
    with pytest.raises(QncclError) as error:
        env_config(capi)
    assert "QNCCL_CLIP=gaussian clips rotated buckets' ranges and needs " \
        "QNCCL_ROTATION=hadamard" in error.value.message
    monkeypatch.setenv("QNCCL_ROTATION", "hadamard")
    assert env_config(capi) == DEFAULTS.replace("rotation=none", "rotation=hadamard").replace(
        "clip=none", "clip=gaussian")
    monkeypatch.setenv("QNCCL_CLIP", "none")
    assert "clip=none" in env_config(capi)


@pytest.mark.parametrize("variable, value, shown", [
    ("QNCCL_ALLREDUCE_BITS", "2", "allreduce_bits=2"),
    ("QNCCL_REDUCESCATTER_BITS", "8", "reducescatter_bits=8"),
    ("QNCCL_ALLGATHER_BITS", "8", "allgather_bits=8"),
    ("QNCCL_ALLTOALL_BITS", "4", "alltoall_bits=4"),
    ("QNCCL_SENDRECV_BITS", "2", "sendrecv_bits=2"),
])
def test_collective_bits_are_shown_when_set(capi, monkeypatch, variable, value, shown):
    monkeypatch.setenv(variable, value)
    assert env_config(capi) == f"{DEFAULTS} {shown}"


# What each variable's message must say is allowed.
ALLOWED = {
    "QNCCL_ENABLE": r"\b0\b.*\b1\b",
    "QNCCL_BITS": r"1 ?\.\. ?8",
    "QNCCL_BUCKET_SIZE": r"1\.\.2\^40 values.*K, M or G",
    "QNCCL_ROUNDING": r"stochastic.*nearest|nearest.*stochastic",
    "QNCCL_ROTATION": r"none or hadamard",
    "QNCCL_ROTATION_BLOCK": r"a power of two from 2 to 16384",
    "QNCCL_CLIP": r"none or gaussian",
    "QNCCL_ALGO": r"auto.*ring.*tree.*sra.*hier",
    "QNCCL_INTER_ALGO": r"auto.*ring.*tree.*sra",
    "QNCCL_INTRA_BITS": r"0 \(exact\) or 1\.\.8",
    "QNCCL_LANES": r"0 \(auto.*\) or 1\.\.8",
    "QNCCL_SEGMENT_VALUES": r"0 \(4M\) or 1\.\.2\^40 values.*K.*M.*G",
    "QNCCL_MIN_BYTES": r">= ?0.*K.*M.*G",
    "QNCCL_SEED": r"64-bit|2\^64",
    "QNCCL_ERROR_FEEDBACK": r"\b0 or 1\b",
    "QNCCL_ERROR_FEEDBACK_MAX_BYTES": r">= ?1.*K.*M.*G",
    "QNCCL_WARMUP_CALLS": r">= ?0",
    "QNCCL_DEBUG": r"WARN.*INFO.*TRACE",
    "QNCCL_COLLECTIVES": r"none, or a comma list of allreduce, reducescatter, allgather, "
                         r"alltoall, sendrecv",
    "QNCCL_ALLREDUCE_BITS": r"1\.\.8 \(unset: QNCCL_BITS\)",
    "QNCCL_REDUCESCATTER_BITS": r"1\.\.8",
    "QNCCL_ALLGATHER_BITS": r"1\.\.8",
    "QNCCL_ALLTOALL_BITS": r"1\.\.8",
    "QNCCL_SENDRECV_BITS": r"1\.\.8",
}


@pytest.mark.parametrize("variable, value", [
    ("QNCCL_ENABLE", "2"), ("QNCCL_ENABLE", "yes"),
    ("QNCCL_BITS", "0"), ("QNCCL_BITS", "9"), ("QNCCL_BITS", "four"), ("QNCCL_BITS", "4.5"),
    ("QNCCL_BITS", "-1"),
    ("QNCCL_BUCKET_SIZE", "0"), ("QNCCL_BUCKET_SIZE", "-5"), ("QNCCL_BUCKET_SIZE", "12abc"),
    ("QNCCL_BUCKET_SIZE", "1KB"), ("QNCCL_BUCKET_SIZE", "2T"),
    ("QNCCL_ROUNDING", "round"),
    ("QNCCL_ROTATION", "walsh"), ("QNCCL_ROTATION_BLOCK", "0"), ("QNCCL_ROTATION_BLOCK", "1"),
    ("QNCCL_ROTATION_BLOCK", "48"), ("QNCCL_ROTATION_BLOCK", "32K"), ("QNCCL_CLIP", "max"),
    ("QNCCL_ALGO", "butterfly"),
    ("QNCCL_INTER_ALGO", "hier"), ("QNCCL_INTER_ALGO", "fast"),
    ("QNCCL_INTRA_BITS", "9"), ("QNCCL_INTRA_BITS", "-1"), ("QNCCL_INTRA_BITS", "exact"),
    ("QNCCL_LANES", "9"), ("QNCCL_LANES", "two"),
    ("QNCCL_SEGMENT_VALUES", "-1"), ("QNCCL_SEGMENT_VALUES", "1.5M"),
    ("QNCCL_SEGMENT_VALUES", "1025G"),
    ("QNCCL_MIN_BYTES", "-1"), ("QNCCL_MIN_BYTES", "10X"), ("QNCCL_MIN_BYTES", "1.5M"),
    ("QNCCL_MIN_BYTES", "99999999999G"),
    ("QNCCL_SEED", "-1"), ("QNCCL_SEED", str(2**64)), ("QNCCL_SEED", "abc"),
    ("QNCCL_ERROR_FEEDBACK", "2"), ("QNCCL_ERROR_FEEDBACK", "on"),
    ("QNCCL_ERROR_FEEDBACK_MAX_BYTES", "0"), ("QNCCL_ERROR_FEEDBACK_MAX_BYTES", "lots"),
    ("QNCCL_WARMUP_CALLS", "-1"), ("QNCCL_WARMUP_CALLS", "many"),
    ("QNCCL_DEBUG", "VERBOSE"),
    ("QNCCL_COLLECTIVES", "allreduce,allreduce"), ("QNCCL_COLLECTIVES", "none,allreduce"),
    ("QNCCL_COLLECTIVES", "allreduce,"), ("QNCCL_COLLECTIVES", "broadcast"),
    ("QNCCL_ALLREDUCE_BITS", "0"), ("QNCCL_REDUCESCATTER_BITS", "9"),
    ("QNCCL_ALLGATHER_BITS", "eight"), ("QNCCL_ALLTOALL_BITS", "0"), ("QNCCL_SENDRECV_BITS", "9"),
])
def test_bad_configuration_names_the_variable(capi, monkeypatch, variable, value):
    from qnccl import QncclError
    monkeypatch.setenv(variable, value)
    with pytest.raises(QncclError) as error:
        env_config(capi)
    assert error.value.code == 4  # ncclInvalidArgument
    assert variable in error.value.message and re.search(ALLOWED[variable], error.value.message), \
        error.value.message


# ---- qnccl run ---------------------------------------------------------------------------

def parse_run(*argv):
    return cli.build_parser().parse_args(["run", *argv])


def test_run_flags_set_the_variables():
    """Each flag sets its variable (overriding the environment), values in the
    library's syntax; variables without a flag pass through untouched."""
    args = parse_run("--bits", "3", "--bucket-size", "256", "--rounding", "nearest",
                     "--rotation", "hadamard", "--rotation-block", "1024", "--clip", "gaussian",
                     "--algo", "tree", "--inter-algo", "ring", "--intra-bits", "6",
                     "--lanes", "3", "--segment-values", "64K", "--collectives", "allreduce,reducescatter",
                     "--allreduce-bits", "5", "--reducescatter-bits", "2",
                     "--allgather-bits", "8", "--alltoall-bits", "6", "--sendrecv-bits", "1",
                     "--min-bytes", "2K", "--seed", str(2**64 - 1),
                     "--warmup-calls", "5", "--error-feedback", "--debug", "info",
                     "--nccl-lib", str(HOST_NCCL), "--disable", "--", "prog", "--bits", "7")
    env = cli.run_environment(args, {"QNCCL_BITS": "2", "QNCCL_ERROR_FEEDBACK": "0",
                                     "HOME": "/home/x"}, LIBQNCCL)
    assert args.cmd == ["--", "prog", "--bits", "7"]
    assert {k: v for k, v in env.items() if k.startswith("QNCCL_")} == {
        "QNCCL_BITS": "3", "QNCCL_BUCKET_SIZE": "256", "QNCCL_ROUNDING": "nearest",
        "QNCCL_ROTATION": "hadamard", "QNCCL_ROTATION_BLOCK": "1024", "QNCCL_CLIP": "gaussian",
        "QNCCL_ALGO": "tree", "QNCCL_INTER_ALGO": "ring", "QNCCL_INTRA_BITS": "6",
        "QNCCL_LANES": "3", "QNCCL_SEGMENT_VALUES": "65536", "QNCCL_COLLECTIVES": "allreduce,reducescatter",
        "QNCCL_ALLREDUCE_BITS": "5", "QNCCL_REDUCESCATTER_BITS": "2",
        "QNCCL_ALLGATHER_BITS": "8", "QNCCL_ALLTOALL_BITS": "6", "QNCCL_SENDRECV_BITS": "1",
        "QNCCL_MIN_BYTES": "2048", "QNCCL_SEED": str(2**64 - 1),
        "QNCCL_WARMUP_CALLS": "5", "QNCCL_DEBUG": "INFO",
        "QNCCL_NCCL_LIB": str(HOST_NCCL.resolve()), "QNCCL_ENABLE": "0",
        "QNCCL_ERROR_FEEDBACK": "1"}
    assert env["HOME"] == "/home/x" and env["LD_PRELOAD"] == str(LIBQNCCL)
    untouched = cli.run_environment(parse_run("--", "prog"), {"QNCCL_BITS": "2"}, LIBQNCCL)
    assert untouched == {"QNCCL_BITS": "2", "LD_PRELOAD": str(LIBQNCCL)}


@pytest.mark.parametrize("argv, message", [
    (["--bits", "0"], r"--bits: must be an integer in 1\.\.8"),
    (["--bits", "9"], r"--bits: must be an integer in 1\.\.8"),
    (["--bits", "x"], r"--bits: must be an integer in 1\.\.8"),
    (["--bucket-size", "0"], r"--bucket-size: must be an integer in 1\.\.2\*\*40 with an "
                             r"optional K, M or G suffix"),
    (["--bucket-size", "1KB"], r"--bucket-size: must be an integer in 1\.\.2\*\*40"),
    (["--rounding", "up"], r"--rounding: invalid choice: 'up' \(choose from '?stochastic'?, "
                           r"'?nearest'?\)"),
    (["--rotation", "walsh"], r"--rotation: invalid choice: 'walsh'"),
    (["--rotation-block", "48"], r"--rotation-block: must be a power of two in 2\.\.16384"),
    (["--rotation-block", "1"], r"--rotation-block: must be an integer in 2\.\.16384"),
    (["--algo", "butterfly"], r"--algo: invalid choice: 'butterfly' \(choose from '?auto'?, "
                              r"'?rule'?, '?ring'?, '?tree'?, '?sra'?, '?hier'?\)"),
    (["--inter-algo", "hier"], r"--inter-algo: invalid choice: 'hier'"),
    (["--intra-bits", "9"], r"--intra-bits: must be an integer in 0\.\.8"),
    (["--lanes", "9"], r"--lanes: must be an integer in 0\.\.8"),
    (["--min-bytes", "-1"], r"--min-bytes: must be an integer in 0\.\.2\*\*64-1 with an "
                            r"optional K, M or G"),
    (["--min-bytes", "5X"], r"--min-bytes: must be an integer in 0\.\.2\*\*64-1 with an "
                            r"optional K, M or G"),
    (["--segment-values", "1025G"], r"--segment-values: must be an integer in 0\.\.2\*\*40"),
    (["--error-feedback-max-bytes", "0"], r"--error-feedback-max-bytes: must be an integer in "
                                          r"1\.\.2\*\*64-1"),
    (["--seed", "-1"], r"--seed: must be an integer in 0\.\.18446744073709551615"),
    (["--seed", str(2**64)], r"--seed: must be an integer in 0\.\.18446744073709551615"),
    (["--warmup-calls", "-1"], r"--warmup-calls: must be an integer >= 0"),
    (["--debug", "loud"], r"--debug: invalid choice: 'LOUD' \(choose from '?WARN'?, '?INFO'?, "
                          r"'?TRACE'?\)"),
    (["--nccl-lib", "/nonexistent/libnccl.so.2"], r"--nccl-lib: no such file"),
    ([], r"missing CMD"),
    (["--bits", "4"], r"missing CMD"),
    (["--bits", "4", "--"], r"missing CMD"),
])
def test_run_rejects_bad_flags(capsys, argv, message):
    """Exit 2 and a message naming the flag and the allowed values; nothing runs."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", *argv, *(["--", "true"] if "missing" not in message else [])])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)


# Every size flag of `qnccl run` and the variable it sets, and the name qnccl info shows it by.
SIZE_FLAGS = (("--bucket-size", "QNCCL_BUCKET_SIZE", "bucket"),
              ("--rotation-block", "QNCCL_ROTATION_BLOCK", "rotation_block"),
              ("--segment-values", "QNCCL_SEGMENT_VALUES", "segment_values"),
              ("--min-bytes", "QNCCL_MIN_BYTES", "min_bytes"),
              ("--error-feedback-max-bytes", "QNCCL_ERROR_FEEDBACK_MAX_BYTES",
               "error_feedback_max_bytes"))


@pytest.mark.parametrize("flag, variable, shown", SIZE_FLAGS)
@pytest.mark.parametrize("text", ["64", "1K", "2k", "16K", "4m", "1G", "1024G", "1025G", "0",
                                  "1KB", "1KiB", "2T", "1.5M", " 4K", "4 K", "+4", "-4", "K"])
def test_size_flags_read_as_their_variables(capi, monkeypatch, capsys, flag, variable, shown,
                                            text):
    """A size flag takes what its variable takes (K, M, G in either case, powers of 1024,
    nothing else) and means the same by it: `qnccl run` refuses exactly the text the library
    would refuse in the variable, and sets the value the library would read from it."""
    from qnccl import QncclError
    monkeypatch.setenv(variable, text)
    try:
        library = re.search(rf"\b{shown}=(\d+)", env_config(capi))[1]
    except QncclError:
        library = None
    try:
        flag_value = cli.run_environment(parse_run(flag, text, "--", "prog"), {}, LIBQNCCL)
        flag_value = flag_value[variable]
    except SystemExit:
        flag_value = None
        assert f"{flag}: must be" in capsys.readouterr().err
    assert flag_value == library, f"{flag} {text!r} gives {flag_value}, {variable} {library}"


SHOW_PRELOAD = [sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'], os.getpid())"]


@pytest.mark.parametrize("existing, expected", [
    (None, "{lib}"),
    ("libm.so.6", "{lib}:libm.so.6"),
    ("libm.so.6 {lib}", "{lib}:libm.so.6"),  # ld.so also splits on spaces; no duplicate
])
def test_run_prepends_to_ld_preload(monkeypatch, existing, expected):
    """`qnccl run` puts libqnccl.so first in LD_PRELOAD, keeping what was there,
    and becomes the command (os.exec: same process id)."""
    lib = cli.libqnccl_path()
    if existing is None:
        monkeypatch.delenv("LD_PRELOAD", raising=False)
    else:
        monkeypatch.setenv("LD_PRELOAD", existing.format(lib=lib))
    proc = subprocess.Popen([*QNCCL, "run", "--", *SHOW_PRELOAD], stdout=subprocess.PIPE,
                            text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.split() == [expected.format(lib=lib), str(proc.pid)]


@pytest.mark.parametrize("code, expected", [
    ("import sys; sys.exit(7)", 7),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM),
])
def test_run_passes_exit_status_and_signals_through(code, expected):
    result = subprocess.run([*QNCCL, "run", "--", sys.executable, "-c", code], timeout=60)
    assert result.returncode == expected


def test_run_command_not_found():
    result = subprocess.run([*QNCCL, "run", "--bits", "2", "--", "/nonexistent/program"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 127
    assert "qnccl run: cannot run '/nonexistent/program'" in result.stderr


# ---- qnccl info ---------------------------------------------------------------------------

def info(env):
    return subprocess.run([*QNCCL, "info"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


def test_info_shows_the_effective_configuration_and_nccl():
    result = info({"QNCCL_BITS": "2", "QNCCL_MIN_BYTES": "1M", "QNCCL_NCCL_LIB": str(HOST_NCCL)})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = dict(re.findall(r"^(\S+(?: \S+)?) {2,}(.*)$", result.stdout, re.M))
    assert rows["configuration"] == DEFAULTS.replace("bits=4", "bits=2").replace(
        "min_bytes=65536", f"min_bytes={1 << 20}")
    assert {"QNCCL_BITS=2", "QNCCL_MIN_BYTES=1M", f"QNCCL_NCCL_LIB={HOST_NCCL}"} <= set(
        rows["environment"].split())
    assert rows["NCCL"] == f"{HOST_NCCL} (QNCCL_NCCL_LIB)"
    assert "GPU" in rows


def test_info_fails_on_a_bad_setting():
    result = info({"QNCCL_ALGO": "butterfly"})
    assert result.returncode == 1
    assert re.search(r"^configuration +invalid: .*QNCCL_ALGO.*auto.*ring.*tree.*sra",
                     result.stdout, re.M), result.stdout


def test_info_finds_nccl_like_dlopen(monkeypatch, tmp_path):
    """Which libnccl.so.2 libqnccl.so would load: QNCCL_NCCL_LIB, else
    LD_LIBRARY_PATH, else ld.so's cache and the default directories."""
    monkeypatch.setattr(cli, "_loaded_path", lambda name: None)  # none loaded in this process
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path}:{HOST_NCCL.parent}")
    monkeypatch.delenv("QNCCL_NCCL_LIB", raising=False)
    assert cli.nccl_library() == (str(HOST_NCCL.parent / "libnccl.so.2"), "LD_LIBRARY_PATH")
    monkeypatch.setenv("QNCCL_NCCL_LIB", str(tmp_path / "libnccl.so.2"))
    assert cli.nccl_library() == (str(tmp_path / "libnccl.so.2"),
                                  "QNCCL_NCCL_LIB: no such file")


def test_info_gpu_driver_row():
    """The GPU row comes from the driver API and needs no GPU."""
    devices = cuda_device_count()
    row = cli.cuda_driver()
    assert row.startswith(f"{devices} device(s)") if devices else row.startswith(
        ("no CUDA driver", "CUDA driver present, no usable device"))


# ---- the way PyTorch's ProcessGroupNCCL drives NCCL ------------------------------------

PROCESS_GROUP = TESTS / "mpi_programs" / "process_group_check.py"
PG_BUCKETS = (("b0", "float32", 70001), ("b1", "float16", 40000), ("b2", "bfloat16", 9000),
              ("b3", "float32", 1000), ("b4", "float16", 300))
PG_MIN_BYTES = 16 << 10


def run_process_group(nprocs, mode, outdir, env=None):
    argv = [*QNCCL, "run", "--bits", "4", "--min-bytes", "16K", "--algo", "rule", "--",
            sys.executable,
            str(PROCESS_GROUP), mode, str(outdir)]
    result = mpi.run(nprocs, argv, timeout=180, env=env)
    assert f"SUMMARY process group ({mode}): {nprocs} ranks, 0 failures" in result.stdout, \
        result.stdout[-6000:]
    return int(re.search(r"ncclInProgress answers: (\d+)", result.stdout).group(1))


def pg_output(outdir, name, rank, dtype):
    return np.fromfile(outdir / f"{name}.r{rank}.bin", STORAGE[dtype])


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_process_group_nonblocking_matches_blocking(interposer, tmp_path, nprocs):
    """mpi_programs/process_group_check.py under `qnccl run --bits 4`, once with
    blocking and once with nonblocking communicators: nonblocking creation and
    split polled to readiness, a watchdog thread polling every communicator,
    coalesced in-place ncclAvg buckets over several steps (quantized ones and
    ones below QNCCL_MIN_BYTES in one group; one group over both communicators,
    issued in opposite orders on even and odd ranks), a PreMulSum average, the child
    aborted while the parent keeps working, finalize and destroy. Every output
    is bit-identical across ranks and between the two runs; quantized buckets
    are the emulator's bytes (call numbers in issue order per communicator; on one
    rank every bucket passes through, its own input); the PreMulSum average is exact
    (passed through); the host backend answered ncclInProgress during the
    nonblocking run."""
    check_process_group(tmp_path, nprocs)


def check_process_group(tmp_path, nprocs, env=None):
    """The process-group job in both modes (in `env`: the simulated GPU's device buffers in
    test_simdev_engine.py), checked as the test above says."""
    runs = {}
    for mode in ("blocking", "nonblocking"):
        (tmp_path / mode).mkdir()
        runs[mode] = run_process_group(nprocs, mode, tmp_path / mode, env)
    assert runs["blocking"] == 0 and runs["nonblocking"] >= 10 * nprocs, runs

    def inputs(label, step, name, dtype, count):
        rng = lambda r: np.random.default_rng([zlib.crc32(name.encode()), step,
                                               r]).standard_normal(count)
        return [from_float32(rng(r).astype(np.float32), dtype) for r in ranks(label)]

    def ranks(label):  # in the communicator's rank order (the child's is reversed)
        return list(range(nprocs)) if label == "parent" else list(reversed(range(nprocs)))

    for label, steps in (("parent", range(7)), ("child", range(5))):
        call = 0
        for step in steps:
            for name, dtype, count in PG_BUCKETS:
                key = f"{label}.s{step}.{name}"
                outs = {mode: [pg_output(tmp_path / mode, key, r, dtype) for r in range(nprocs)]
                        for mode in runs}
                for mode, per_rank in outs.items():
                    assert all(np.array_equal(per_rank[0], o) for o in per_rank), \
                        f"{key} ({mode}): ranks disagree"
                assert np.array_equal(outs["blocking"][0], outs["nonblocking"][0]), \
                    f"{key}: the nonblocking run differs from the blocking one"
                nbytes = count * np.dtype(STORAGE[dtype]).itemsize
                if nbytes >= PG_MIN_BYTES and nprocs == 1:  # nothing crosses a link: exact
                    want = inputs(label, step, name, dtype, count)[0]  # the average of one
                    assert np.array_equal(outs["blocking"][0].view(np.uint8),
                                          np.asarray(want).view(np.uint8)), \
                        f"{key}: one rank, not its input (the call must pass through)"
                elif nbytes >= PG_MIN_BYTES:
                    want = emulate_allreduce(inputs(label, step, name, dtype, count), bits=4,
                                             op="avg", call=call, dtype=dtype)[0]
                    assert np.array_equal(outs["blocking"][0].view(np.uint8),
                                          np.asarray(want).view(np.uint8)), \
                        f"{key}: not the emulator's bytes (call {call})"
                    call += 1
        premul = [pg_output(tmp_path / mode, f"{label}.premul", r, "float32")
                  for mode in runs for r in range(nprocs)]
        assert all(np.array_equal(premul[0], p) for p in premul), f"{label} PreMulSum differs"
        exact = sum(widen(x, "float32") for x in inputs(label, 0, "premul", "float32", 40000))
        assert np.max(np.abs(premul[0] - exact / nprocs)) <= 1e-6 * np.max(np.abs(exact)), \
            f"{label}: the PreMulSum average is not exact (it must pass through)"



@pytest.mark.serial  # asserts a time: under 60 s
def test_fault_on_one_rank_fails_the_others_within_the_timeout(interposer):
    """Rank 1's quantized call fails before any transfer (QNCCL_HOST_ISA names no
    instruction set, set on rank 1 alone): it returns the error at once and
    ncclCommGetAsyncError reports it there; ranks 0, 2, 3 fail with a message
    within QNCCL_HOST_INIT_TIMEOUT (3 s) instead of waiting forever. Then a
    quantized call waiting for a rank that never joins ends within seconds
    when a second thread aborts its communicator."""
    argv = [*QNCCL, "run", "--bits", "4", "--min-bytes", "16K", "--algo", "rule", "--",
            sys.executable,
            str(PROCESS_GROUP), "fault", "3"]
    started = time.monotonic()
    result = mpi.run(4, argv, timeout=120, env={"QNCCL_HOST_INIT_TIMEOUT": "3"})
    assert "SUMMARY process group (fault): 4 ranks, 0 failures" in result.stdout, \
        result.stdout[-6000:]
    assert "no-such-isa" in result.stdout and "made no progress for 3 s" in result.stdout, \
        result.stdout[-6000:]
    assert time.monotonic() - started < 60
