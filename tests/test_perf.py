"""The nccl-tests style perf binaries (build/bin/all_reduce_perf and
mpi_all_reduce_perf, docs/perf.md) as MPI jobs over QNCCL's host backend:

- the table has nccl-tests' fields in its order, its numbers add up
  (count = size / element size, busbw = algbw * 2(n-1)/n) and match the JSON;
- without QNCCL every result is exact up to the float rounding bound; with
  libqnccl.so preloaded the compressed rows report QNCCL's configuration, the
  algorithm, the bytes each rank sent per input byte (recomputed here from
  docs/allreduce.md) and an error within QNCCL's bound;
- the check fails, with exit status 1 and a message, on a deliberately wrong
  NCCL (programs/faulty_nccl.c preloaded in front of the real one): ranks
  that disagree, an error over the configuration's bound, a modified send
  buffer;
- bad options exit 2 naming the option and what is allowed.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import mpi
from conftest import sent_bytes
from mpi import BUILD, HOST_NCCL, LIBQNCCL, REPO

BIN = BUILD / "bin"
ALL_REDUCE_PERF = BIN / "all_reduce_perf"
MPI_ALL_REDUCE_PERF = BIN / "mpi_all_reduce_perf"
QNCCL = [sys.executable, "-m", "qnccl"]
SMALL_SWEEP = ["-b", "256K", "-e", "1M", "-f", "4", "-n", "2", "-w", "1"]
ELEMENT_SIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
                "half": 2, "float": 4, "double": 8, "bfloat16": 2}
# nccl-tests' fields, in its order; `error` stands where it prints #wrong.
FIELDS = ["size", "count", "type", "redop", "root",
          "time", "algbw", "busbw", "error", "time", "algbw", "busbw", "error", "agree", "wire"]


@pytest.fixture(scope="module", autouse=True)
def binaries():
    for exe in (ALL_REDUCE_PERF, MPI_ALL_REDUCE_PERF, HOST_NCCL):
        if not exe.is_file():
            pytest.fail(f"{exe} is missing: run `make` in {REPO}")


@pytest.fixture(scope="module")
def faulty_nccl(tmp_path_factory):
    """programs/faulty_nccl.c as a shared library to preload."""
    cc = shutil.which("gcc") or shutil.which("cc") or pytest.fail("no C compiler: run `make setup`")
    out = tmp_path_factory.mktemp("faulty") / "libfaulty_nccl.so"
    built = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror",
                            f"-I{REPO / 'build' / 'include' / 'nccl'}", f"-I{REPO / 'src' / 'include'}",
                            str(REPO / "tests" / "programs" / "faulty_nccl.c"), "-o", str(out), "-ldl"],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"building faulty_nccl.c failed:\n{built.stderr}")
    return out


def run_perf(nranks, args, tmp_path, exe=ALL_REDUCE_PERF, qnccl=None, wrapper=(), check=True):
    """`exe args` on `nranks` ranks, through `qnccl run <qnccl> --` unless None,
    else after `wrapper`; returns (CompletedProcess, JSON report or None). No
    QNCCL_* from outside."""
    report = tmp_path / f"report{len(list(tmp_path.glob('report*.json')))}.json"
    argv = [*wrapper, str(exe), *args, "-J", str(report)]
    if qnccl is not None:
        argv = [*QNCCL, "run", *qnccl, "--", *argv]
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("QNCCL_")]:
            patch.delenv(name)
        result = mpi.run(nranks, argv, timeout=180, check=check,
                         env={"LD_LIBRARY_PATH": str(HOST_NCCL.parent)})
    data = json.loads(report.read_text()) if report.is_file() and report.stat().st_size else None
    return result, data


def table(output):
    """Header fields and rows (lists of fields) of the table in `output`."""
    lines = output.splitlines()
    header = next(line for line in lines if line.startswith("#") and "redop" in line)
    rows = [line.split() for line in lines if re.match(r"^\s+\d", line)]
    return header[1:].split(), rows


def summary(output, key):
    match = re.search(rf"^# {key}\s*:?\s*(.*)$", output, re.M)
    assert match, f"no '# {key}' line in:\n{output}"
    return match.group(1).strip()


def check_table(output, data, nranks):
    """The properties every table has; returns its rows."""
    header, rows = table(output)
    assert header == FIELDS
    assert rows, output
    factor = 2 * (nranks - 1) / nranks
    for fields in rows:
        assert len(fields) == len(FIELDS), fields
        size, count = int(fields[0]), int(fields[1])
        assert count == size // ELEMENT_SIZE[fields[2]] and fields[4] == "-1"
        for t, algbw, busbw in ((5, 6, 7), (9, 10, 11)):
            time_us = float(fields[t])
            # times print with 4-5 digits, bandwidths with 2 decimals
            assert float(fields[algbw]) == pytest.approx(size / time_us / 1e3, rel=2e-3, abs=0.006)
            assert float(fields[busbw]) == pytest.approx(float(fields[algbw]) * factor, abs=0.011)
    # JSON: one row per (size, placement), same numbers as the table.
    assert [(r["size"], r["placement"]) for r in data["rows"]] == \
        [(int(f[0]), p) for f in rows for p in ("out-of-place", "in-place")]
    for fields, (oop, ip) in zip(rows, zip(data["rows"][::2], data["rows"][1::2])):
        for r, t in ((oop, 5), (ip, 9)):
            assert r["count"] == int(fields[1]) and r["type"] == fields[2] and r["redop"] == fields[3]
            assert float(fields[t]) == pytest.approx(r["time_us"], rel=0.01, abs=0.01)
            assert float(fields[t + 2]) == pytest.approx(r["busbw_gbps"], abs=0.006)
            assert float(fields[t + 3]) == pytest.approx(r["error"], rel=0.06, abs=1e-300)
        assert float(fields[14]) == pytest.approx(oop["wire_bytes_per_input_byte"], abs=6e-4)
    mean = sum(r["busbw_gbps"] for r in data["rows"]) / len(data["rows"])
    assert float(summary(output, "Avg bus bandwidth")) == pytest.approx(mean, rel=1e-4)
    assert data["avg_busbw_gbps"] == pytest.approx(mean, rel=1e-4)
    assert data["nranks"] == nranks
    return rows


@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_plain_nccl_is_exact(nranks, tmp_path):
    result, data = run_perf(nranks, [*SMALL_SWEEP, "-o", "avg"], tmp_path)
    check_table(result.stdout, data, nranks)
    assert "QNCCL not loaded" in result.stdout and data["qnccl"] is None
    for r in data["rows"]:
        assert r["ok"] and r["agree"] and not r["compressed"] and r["algo"] is None
        assert r["error"] <= r["bound"] < 1e-5  # float rounding only
        assert r["wire_bytes_per_input_byte"] == pytest.approx(2 * (nranks - 1) / nranks)
    assert summary(result.stdout, "Check") == "OK"


@pytest.mark.parametrize("algo", ["ring", "tree", "sra"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_quantized_rows(algo, op, tmp_path):
    nranks, bits, bucket = 4, 4, 128
    flags = ["--bits", str(bits), "--bucket-size", str(bucket), "--algo", algo,
             "--rounding", "nearest", "--min-bytes", "512K"]
    result, data = run_perf(nranks, [*SMALL_SWEEP, "-o", op, "-z", "1"], tmp_path, qnccl=flags)
    check_table(result.stdout, data, nranks)
    assert data["qnccl"] == {"version": data["qnccl"]["version"], "enable": 1, "bits": bits,
                             "bucket_size": bucket, "rounding": "nearest", "rotation": "none",
                             "rotation_block": 0, "clip": "none", "algo": algo,
                             "min_bytes": 512 << 10, "seed": 0, "warmup_calls": 0,
                             "error_feedback": 0, "measured": False}
    assert (f"bits=4 bucket=128 rounding=nearest rotation=none rotation_block=0 clip=none "
            f"algo={algo}") in result.stdout
    for r in data["rows"]:
        assert r["ok"] and r["agree"] and r["time_us_median"] > 0
        if r["size"] < 512 << 10:  # below QNCCL_MIN_BYTES: passed through, exact
            assert not r["compressed"] and r["error"] <= r["bound"] < 1e-5
            continue
        assert r["compressed"] and r["algo"] == algo
        wire = sum(sent_bytes(r["count"], "float32", nranks, rank, algo, bits, bucket)
                   for rank in range(nranks)) / nranks / r["size"]
        assert r["wire_bytes_per_input_byte"] == pytest.approx(wire, rel=1e-5)
        assert 1e-3 < r["error"] <= r["bound"] < 1  # quantized, yet within QNCCL's bound


def test_measured_auto_rows(tmp_path):
    """QNCCL's default, measured auto (docs/tuning.md): every size first settles with untimed
    calls (the header says how many), so the timed calls all run the choice: a compressed row
    names its algorithm, meets that algorithm's bound and has exactly its bytes on the wire
    (a trial of another candidate among the timed calls would change them); an exact row is
    NCCL's call."""
    nranks, bits, bucket = 4, 4, 128
    result, data = run_perf(nranks, ["-b", "64K", "-e", "1M", "-f", "4", "-n", "3", "-w", "1"],
                            tmp_path, qnccl=["--bits", str(bits), "--rounding", "nearest"])
    check_table(result.stdout, data, nranks)
    assert data["qnccl"]["measured"] is True and data["qnccl"]["algo"] == "auto"
    assert "# settle: 26 untimed calls before each size's timed ones" in result.stdout
    assert "measured auto: a size's first calls are its trials" in result.stdout
    for r in data["rows"]:
        assert r["ok"] and r["agree"], r
        if not r["compressed"]:
            assert r["error"] <= r["bound"] < 1e-5 and r["wire_bytes_per_input_byte"] == 1.5, r
            continue
        assert r["algo"] in ("ring", "tree", "sra") and 1e-3 < r["error"] <= r["bound"] < 1, r
        wire = sum(sent_bytes(r["count"], "float32", nranks, rank, r["algo"], bits, bucket)
                   for rank in range(nranks)) / nranks / r["size"]
        assert r["wire_bytes_per_input_byte"] == pytest.approx(wire, rel=1e-5), r


@pytest.mark.parametrize("settle", [0, 3])
def test_settle_is_what_was_asked(settle, tmp_path):
    """--settle N: N untimed calls per size in any run (the bench gives every run, baselines
    too, the same), which QNCCL's statistics count; 0 under measured auto leaves the trials
    in the timed calls, and nothing is said about settling."""
    result, data = run_perf(2, ["-b", "64K", "-e", "128K", "-f", "2", "-n", "2", "-w", "0",
                                "--settle", str(settle), "--placement", "out-of-place"],
                            tmp_path, qnccl=["--bits", "4", "--algo", "ring", "--debug", "info"])
    said = f"# settle: {settle} untimed calls before each size's timed ones"
    assert (said in result.stdout) == (settle > 0), result.stdout
    assert data["rows"] and all(r["ok"] and r["compressed"] for r in data["rows"])
    # At destroy: the settling calls, the timed ones and the checked one, of each size.
    counts = re.findall(r"rank \d: compressed=(\d+)", result.stdout)
    assert counts and set(counts) == {str(2 * (settle + 2 + 1))}, result.stdout


@pytest.mark.parametrize("through", ["qnccl", "plain"])
def test_interleave_times_the_plain_library_beside(through, tmp_path):
    """--interleave R: each row in R rounds of -n calls of the plain libnccl.so.2 and -n of
    the binary's own, which a preloaded QNCCL interposes: the plain calls never reach QNCCL
    (its statistics count only the own calls), every row reports both sides' times and
    their ratio, and one plain call's result passes the plain NCCL's check (a plain side that
    issued nothing would leave the output unwritten). Without QNCCL both sides are the same
    library's calls."""
    rounds, iters = 3, 2
    qnccl = ["--bits", "4", "--algo", "ring", "--debug", "info"] if through == "qnccl" else None
    result, data = run_perf(2, ["-b", "64K", "-e", "128K", "-f", "2", "-n", str(iters), "-w", "0",
                                "--settle", "0", "-z", "1", "--interleave", str(rounds)],
                            tmp_path, qnccl=qnccl)
    check_table(result.stdout, data, 2)
    assert data["options"]["interleave"] == rounds
    assert f"# interleave: {rounds} rounds of {iters} calls each of the plain NCCL " \
           f"({HOST_NCCL.parent}" in result.stdout.replace("/bin/../host", "/host"), result.stdout
    plain = re.findall(r"^#  plain:  out-of-place .* us, own .*x of plain's speed  in-place .*x",
                       result.stdout, re.M)
    assert len(plain) == len(data["rows"]) // 2, result.stdout
    for r in data["rows"]:
        assert r["ok"] and r["plain_ok"] is True, r
        assert r["plain_time_us"] > 0 and r["plain_time_us_median"] > 0, r
        assert 0 < r["vs_plain"] < float("inf") and r["compressed"] == (through == "qnccl"), r
    if through == "qnccl":
        # At destroy, per size and placement: the own timed calls of every round and the
        # checked one.
        counts = re.findall(r"rank \d: compressed=(\d+)", result.stdout)
        assert counts and set(counts) == {str(2 * 2 * (rounds * iters + 1))}, result.stdout


def test_all_types_and_ops(tmp_path):
    """-d all -o all through QNCCL: float sum/avg quantized within the bound,
    everything else passes through and is exact (integers, min, max) or
    within float rounding (prod)."""
    result, data = run_perf(3, ["-b", "1M", "-e", "1M", "-n", "1", "-w", "0", "-d", "all",
                                "-o", "all"], tmp_path, qnccl=["--bits", "4", "--algo", "rule"])
    assert summary(result.stdout, "Check") == "OK"
    seen = {(r["type"], r["redop"]) for r in data["rows"]}
    assert len(seen) == 10 * 5
    for r in data["rows"]:
        assert r["ok"] and r["agree"], r
        quantized = r["type"] in ("float", "half", "bfloat16") and r["redop"] in ("sum", "avg")
        assert r["compressed"] == quantized, r
        if r["type"].startswith(("int", "uint")) or r["redop"] in ("min", "max"):
            assert r["error"] == 0, r


@pytest.mark.parametrize("placement", ["out-of-place", "in-place"])
def test_one_placement(placement, tmp_path):
    result, data = run_perf(2, [*SMALL_SWEEP, "--placement", placement], tmp_path)
    _, rows = table(result.stdout)
    skipped = range(9, 13) if placement == "out-of-place" else range(5, 9)
    assert all(f[i] == "N/A" for f in rows for i in skipped) and all(f[13] == "yes" for f in rows)
    assert [r["placement"] for r in data["rows"]] == [placement] * len(rows)
    assert data["options"]["placement"] == placement and summary(result.stdout, "Check") == "OK"


def test_check_off(tmp_path):
    result, data = run_perf(2, [*SMALL_SWEEP, "-c", "0"], tmp_path)
    _, rows = table(result.stdout)
    assert all(f[8] == f[12] == f[13] == "N/A" for f in rows)
    assert summary(result.stdout, "Check") == "off" and data["check"] == "off"
    assert all(r["error"] is None and r["ok"] is None for r in data["rows"])


# ---- the check catches wrong results ------------------------------------------------

def run_faulty(fault, faulty_nccl, tmp_path, quantized=False):
    """all_reduce_perf on 4 ranks with the faulty ncclAllReduce in front of the
    host backend's, or of libqnccl.so's (4 bits, nearest, ring: measured auto might run the
    exact call) when `quantized`."""
    preload = [faulty_nccl, LIBQNCCL] if quantized else [faulty_nccl]
    wrapper = ["env", f"FAULTY_NCCL={fault}", f"LD_PRELOAD={':'.join(map(str, preload))}",
               "QNCCL_BITS=4", "QNCCL_ROUNDING=nearest", "QNCCL_ALGO=ring"]
    return run_perf(4, ["-b", "1M", "-e", "1M", "-n", "1", "-w", "0"], tmp_path, wrapper=wrapper,
                    check=False)


@pytest.mark.parametrize("quantized", [False, True], ids=["plain", "qnccl"])
def test_check_fails_when_ranks_disagree(quantized, faulty_nccl, tmp_path):
    result, data = run_faulty("disagree:2", faulty_nccl, tmp_path, quantized)
    assert result.returncode == 1, result.stdout
    assert "ranks disagree" in result.stdout and "check FAILED at 1048576 B float sum" in result.stdout
    _, rows = table(result.stdout)
    assert rows[0][13] == "NO"
    assert summary(result.stdout, "Check") == "FAILED" and data["check"] == "FAILED"
    assert all(not r["agree"] and not r["ok"] for r in data["rows"])
    assert all(r["compressed"] == quantized for r in data["rows"])


def test_check_fails_over_the_bound(faulty_nccl, tmp_path):
    """The same offset on every rank: only the bound can catch it. An offset of
    1e-3 is inside 4-bit quantization's bound but far outside float rounding's;
    an offset of 10 is outside both."""
    result, data = run_faulty("offset:1e-3", faulty_nccl, tmp_path, quantized=True)
    assert result.returncode == 0, result.stdout
    assert all(r["ok"] and r["compressed"] for r in data["rows"])

    result, data = run_faulty("offset:1e-3", faulty_nccl, tmp_path)
    assert result.returncode == 1, result.stdout
    assert re.search(r"error \S+ of max \|exact\| exceeds the bound \S+ of this configuration",
                     result.stdout)
    assert all(r["agree"] and not r["ok"] and r["error"] > r["bound"] for r in data["rows"])

    result, data = run_faulty("offset:10", faulty_nccl, tmp_path, quantized=True)
    assert result.returncode == 1 and "exceeds the bound" in result.stdout, result.stdout
    assert all(r["compressed"] and not r["ok"] for r in data["rows"])


def test_check_fails_when_send_buffer_changes(faulty_nccl, tmp_path):
    result, data = run_faulty("send", faulty_nccl, tmp_path)
    assert result.returncode == 1
    assert "out-of-place call modified the send buffer" in result.stdout
    oop, ip = data["rows"]
    assert not oop["ok"] and ip["ok"]  # in place there is no separate send buffer


# ---- MPI's own allreduce -----------------------------------------------------------------

def test_mpi_baseline(tmp_path):
    result, data = run_perf(3, [*SMALL_SWEEP, "-d", "all", "-o", "all"], tmp_path,
                            exe=MPI_ALL_REDUCE_PERF)
    assert data["tool"] == "mpi_all_reduce_perf" and data["backend"] == "mpi"
    assert "# MPI_Allreduce of Open MPI" in result.stdout
    assert "# skipped half sum: MPI has no datatype for half" in result.stdout
    assert "# skipped float avg: MPI has no reduction op avg" in result.stdout
    assert {r["type"] for r in data["rows"]} == {"int8", "uint8", "int32", "uint32", "int64",
                                                 "uint64", "float", "double"}
    check_table(result.stdout, data, 3)
    assert all(r["ok"] for r in data["rows"]) and summary(result.stdout, "Check") == "OK"
    for r in data["rows"]:
        assert r["wire_bytes_per_input_byte"] == pytest.approx(4 / 3)


# ---- options -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["-b", "2M", "-e", "1M"], "-b/--minbytes must not exceed -e/--maxbytes"),
    (["-b", "1X"], "-b/--minbytes: expected a size in bytes with an optional K, M or G suffix"),
    (["-e", "-5"], "-e/--maxbytes: expected a size"),
    (["-f", "1"], "-f/--stepfactor: expected a number > 1"),
    (["-n", "0"], "-n/--iters: expected an integer in 1.."),
    (["-w", "x"], "-w/--warmup_iters: expected an integer"),
    (["--settle", "-1"], "--settle: expected an integer in 0.."),
    (["--interleave", "-1"], "--interleave: expected an integer in 0..1000"),
    (["-d", "quad"], "-d/--datatype: unknown type 'quad' (allowed: int8, uint8"),
    (["-o", "xor"], "-o/--op: unknown op 'xor' (allowed: sum, prod, max, min, avg, all)"),
    (["-c", "2"], "-c/--check: expected an integer in 0..1"),
    (["-z", "3"], "-z/--blocking: expected an integer in 0..1"),
    (["-a", "4"], "-a/--average: expected an integer in 0..3"),
    (["-g", "2"], "-g/--ngpus (one GPU per rank: start more ranks): expected an integer in 1..1"),
    (["--memory", "disk"], "--memory: expected auto, host or device"),
    (["--memory", "device"], "--memory device: "),
    (["--placement", "inside"], "--placement: expected both, out-of-place or in-place"),
    (["-Q"], "unknown option -Q"),
    (["-n"], "option -n needs a value"),
    (["extra"], "unexpected argument 'extra'"),
    (["-J", "/nonexistent/dir/out.json"], "-J/--json: cannot write /nonexistent/dir/out.json"),
])
def test_bad_options(args, message):
    result = mpi.run(2, [str(ALL_REDUCE_PERF), *args], timeout=60,
                     env={"LD_LIBRARY_PATH": str(HOST_NCCL.parent)}, check=False)
    assert result.returncode == 2, result.stdout
    assert message in result.stdout
    assert result.stdout.count(message) == 1  # rank 0 reports, once


@pytest.mark.parametrize("args, message", [
    (["-d", "half"], "MPI has no datatype for half (allowed: int8, uint8, int32, uint32, int64, "
                     "uint64, float, double)"),
    (["-o", "avg"], "MPI has no reduction op avg (allowed: sum, prod, max, min)"),
])
def test_mpi_baseline_rejects_what_mpi_lacks(args, message):
    result = mpi.run(2, [str(MPI_ALL_REDUCE_PERF), *args], timeout=60, check=False)
    assert result.returncode == 2 and message in result.stdout, result.stdout


def test_mpi_baseline_has_no_plain_library_to_interleave():
    result = mpi.run(2, [str(MPI_ALL_REDUCE_PERF), "--interleave", "2"], timeout=60, check=False)
    assert result.returncode == 2, result.stdout
    assert "--interleave: no plain library to time beside this binary's calls" in result.stdout


def test_help():
    result = mpi.run(1, [str(ALL_REDUCE_PERF), "-h"], timeout=60,
                     env={"LD_LIBRARY_PATH": str(HOST_NCCL.parent)})
    for flag in ("-b, --minbytes", "-e, --maxbytes", "-i, --stepbytes", "-f, --stepfactor",
                 "-n, --iters", "-w, --warmup_iters", "-d, --datatype", "-o, --op", "-c, --check",
                 "-z, --blocking", "-a, --average", "-J, --json", "--settle N", "--interleave R", "-h, --help"):
        assert flag in result.stdout
