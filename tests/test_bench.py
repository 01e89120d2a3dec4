"""`qnccl bench` (qnccl/bench.py, `make bench`): a small sweep run for real,
MPI jobs inside perf/netlab, and the table, report.json and plot checked
against what the jobs measured and against docs/allreduce.md's byte counts.
Bad options fail before any job starts."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import sent_bytes
from mpi import REPO
from qnccl import bench

QNCCL = [sys.executable, "-m", "qnccl"]


def run_bench(args, timeout=300):
    """`qnccl bench ARGS` in its own process group, killed whole past `timeout`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QNCCL_")}
    proc = subprocess.Popen([*QNCCL, "bench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                            cwd=REPO)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # netlab deletes its namespace on SIGTERM
        out, _ = proc.communicate()
        pytest.fail(f"qnccl bench {' '.join(args)} ran past {timeout} s and was killed:\n{out}")
    return proc.returncode, out


def bench_report(tmp_path, args):
    """`qnccl bench ARGS --out TMP_PATH`, which must succeed: (its output, its report)."""
    status, output = run_bench([*args, "--out", str(tmp_path)])
    assert status == 0, output
    return output, json.loads((tmp_path / "report.json").read_text())


RATES = ("10gbit", "none")  # the small sweep runs at both: a limited and an unlimited loopback
NAMES = ["uncompressed (NCCL API)", "MPI_Allreduce", "qnccl 4b B128 sra", "qnccl 4b B128 ring",
         "qnccl 4b B1024 sra", "qnccl 4b B1024 ring", "qnccl 4b B128 auto",
         # the rotated rows (docs/accuracy.md, "Fewer bits"): float32 only
         "qnccl 3b B128 sra rot256", "qnccl 2b B128 sra rot256 clip",
         # bfloat16 (the default --dtypes' second type): the first bucket size only
         "uncompressed (NCCL API) bf16", "qnccl 4b B128 sra bf16", "qnccl 4b B128 ring bf16",
         "qnccl 4b B128 auto bf16"]


@pytest.fixture(scope="module")
def small_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    args = ["--sizes", "256K:512K", "--bits", "4", "--buckets", "128,1024", "--algos", "sra,ring",
            "--baselines", "mpi", "--iters", "2", "--rates", ",".join(RATES),
            "--nodes-section", "off", "--collectives-section", "off", "--shm-section", "off",
            "--out", str(out)]
    status, output = run_bench(args)
    assert status == 0, output
    return out, output, json.loads((out / "report.json").read_text())


def test_every_configuration_ran(small_bench):
    out, output, report = small_bench
    assert report["nranks"] == 4 and report["two_nodes"] is None and report["collectives"] is None
    assert [s["link"]["requested"] for s in report["sections"]] == list(RATES)
    for section in report["sections"]:
        assert [c["name"] for c in section["configurations"]] == NAMES
        assert section["sizes"] == [256 << 10, 512 << 10]
        for config in section["configurations"]:
            assert config["status"] == "ok" and config["check_ok"], config
            assert config["rate"] == section["link"]["requested"]
            slug = re.sub(r"[^a-z0-9.]+", "-", f"{config['rate']} {config['name']}".lower())
            assert (out / "logs" / f"{slug.strip('-')}.log").is_file()
            assert f"--rate {config['rate']} " in " ".join(config["command"])
            assert config["perf"]["options"]["iters"] == 2  # --iters
            rows = config["perf"]["rows"]
            assert {r["size"] for r in rows} == {256 << 10, 512 << 10}
            assert all(r["ok"] and r["agree"] for r in rows)
            if config["kind"] == "qnccl":
                assert config["perf"]["qnccl"]["bits"] == config["bits"]
                assert config["perf"]["qnccl"]["bucket_size"] == config["bucket_size"]
                rotated = config["rotation_block"] > 0
                assert config["perf"]["qnccl"]["rotation"] == ("hadamard" if rotated else "none")
                if rotated:
                    assert config["perf"]["qnccl"]["rotation_block"] == config["rotation_block"]
                assert config["perf"]["qnccl"]["clip"] == ("gaussian" if config["clip"] else "none")
            if config["algo"] == "auto":  # measured: the exact call, or an algorithm
                assert all(r["algo"] in ("ring", "tree", "sra") for r in rows if r["compressed"])
            else:
                assert all(r["compressed"] == (config["kind"] == "qnccl") for r in rows)
                if config["kind"] == "qnccl":
                    assert {r["algo"] for r in rows} == {config["algo"]}
    # Progress: a line per configuration, then per size as the job prints it.
    assert re.search(r"^\[ 1/26\] uncompressed \(NCCL API\) at 10gbit", output, re.M)
    assert re.search(r"^\[26/26\] qnccl 4b B128 auto bf16 at none", output, re.M)
    assert len(re.findall(r"^\s+512 KiB\s+\S+ ms\s+error", output, re.M)) == 26


@pytest.mark.parametrize("section", range(len(RATES)), ids=RATES)
def test_table_matches_the_jobs(small_bench, section):
    _, output, report = small_bench
    sec = report["sections"][section]
    assert sec["table"] in output and sec["table"] in report["table"]
    lines = {line.split("  ")[0].strip(): line for line in sec["table"].splitlines()}
    for config in sec["configurations"]:
        # each speedup is over the uncompressed run of the same type
        base = next(c for c in sec["configurations"]
                    if c["kind"] == "nccl" and c["dtype"] == config["dtype"])
        fields = lines[config["name"]][len(config["name"]):].split()
        wire, limit, error, cells = float(fields[0]), fields[1], float(fields[2]), fields[3:]
        oop = [r for r in config["perf"]["rows"] if r["placement"] == "out-of-place"]
        assert error == pytest.approx(max(r["error"] for r in oop), rel=0.06)
        for i, size in enumerate(sec["sizes"]):
            row = next(r for r in oop if r["size"] == size)
            busbw = size / 1e9 / (row["time_us_median"] / 1e6) * 1.5  # 2(n-1)/n, n = 4
            base_row = next(r for r in base["perf"]["rows"]
                            if r["size"] == size and r["placement"] == "out-of-place")
            speedup = busbw / (size / 1e9 / (base_row["time_us_median"] / 1e6) * 1.5)
            assert float(cells[2 * i]) == pytest.approx(busbw, abs=6e-5, rel=1e-3)
            assert float(cells[2 * i + 1].rstrip("x")) == pytest.approx(speedup, abs=0.006)
        if config["kind"] == "qnccl":  # the bytes docs/allreduce.md says each rank sends
            width = 4 if config["dtype"] == "float32" else 2

            def wire_of(size):  # auto: what it ran at that size (exact: NCCL's 1.5)
                row = next(r for r in oop if r["size"] == size)
                if not row["compressed"]:
                    return 1.5
                return sum(sent_bytes(size // width, config["dtype"], 4, rank, row["algo"],
                                      config["bits"], config["bucket_size"])
                           for rank in range(4)) / 4 / size
            expected = max(wire_of(size) for size in sec["sizes"])
            assert wire == pytest.approx(expected, abs=6e-4)
            assert float(limit.rstrip("x")) == pytest.approx(
                1.5 / config["wire_bytes_per_input_byte"], abs=0.006)
        else:
            assert wire == 1.5 and limit == "-"


def test_report_and_plot(small_bench):
    out, output, report = small_bench
    limited, unlimited = (s["link"] for s in report["sections"])
    assert limited["requested"] == "10gbit" and limited["rate"] in ("10gbit", "unthrottled")
    assert unlimited["requested"] == "none" and unlimited["rate"] == "unthrottled"
    assert "allreduce of float32 and bfloat16 (sum), 4 ranks, unlimited loopback (perf/netlab " \
        "--rate none)" in output or "could not make a namespace" in output
    png = (out / "busbw.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert f"report: {out / 'report.json'}" in output and f"plot:   {out / 'busbw.png'}" in output


@pytest.mark.parametrize("args, message", [
    (["--sizes", "2M:1M"], "need 0 < MIN <= MAX"),
    (["--sizes", "1M"], "expected MIN:MAX"),
    (["--bits", "9"], "each value must be 1..8"),
    (["--algos", "ring,star"], "each must be one of ring, tree, sra"),
    (["--dtypes", "float32,int8"], "each must be one of float32, bfloat16, float16"),
    (["--baselines", "nccl"], "each must be one of mpi, torch"),
    (["--ranks", "1"], "must be an integer in 2..64"),
    (["--rate", "fast"], "--rate 'fast' is not a rate"),
    (["--rates", "1gbit,fast"], "--rate 'fast' is not a rate"),
    (["--rates", "1gbit,,10gbit"], "expected distinct comma-separated rates"),
    (["--rates", "1gbit,1gbit"], "expected distinct comma-separated rates"),
])
def test_bad_options(args, message, tmp_path):
    status, output = run_bench([*args, "--out", str(tmp_path)], timeout=60)
    assert status == 2, output
    assert message in output
    assert not (tmp_path / "report.json").exists()


def test_two_node_section(tmp_path):
    """The multi-node section: 2 nodes x 2 ranks, every configuration ran and
    checked, hierarchical runs put a third of flat SRA's bytes per input byte on
    the wire (only the shard crosses nodes: 1/L, L = 2, of 2(K-1)/K = 1 vs 3/2)."""
    args = ["--sizes", "256K:256K", "--bits", "4", "--buckets", "128", "--algos", "sra",
            "--baselines", "mpi", "--iters", "1", "--rate", "10gbit", "--shm-section", "off",
            "--dtypes", "float32", "--rotated-rows", "off"]
    output, report = bench_report(tmp_path, args)
    section = report["two_nodes"]
    names = [c["name"] for c in section["configurations"]]
    assert names == ["2x2 uncompressed (NCCL API)", "2x2 MPI_Allreduce"] + [
        f"2x2 qnccl {b}b B128 {a}" for b in (8, 4) for a in ("ring", "sra", "hier")] + [
        "2x2 qnccl 4b B128 auto"]
    by_name = {c["name"]: c for c in section["configurations"]}
    for config in section["configurations"]:
        assert config["status"] == "ok" and config["check_ok"], config
        assert config["nodes"] == 2 and config["perf"]["nranks"] == 4
    for bits in (8, 4):
        hier = by_name[f"2x2 qnccl {bits}b B128 hier"]
        sra = by_name[f"2x2 qnccl {bits}b B128 sra"]
        assert {r["algo"] for r in hier["perf"]["rows"]} == {"hier"}
        assert hier["wire_bytes_per_input_byte"] == pytest.approx(
            sra["wire_bytes_per_input_byte"] / 3, rel=0.02)
    for row in by_name["2x2 qnccl 4b B128 auto"]["perf"]["rows"]:  # measured: any candidate
        assert row["ok"] and (not row["compressed"] or row["algo"] in ("ring", "tree", "sra",
                                                                       "hier")), row
    assert section["table"] in output and section["table"] in report["table"]


def test_collectives_section(tmp_path):
    """--collectives-section on: reduce-scatter at 4 bits, allgather and all-to-all at 8,
    each beside its own uncompressed run at the first rate; the quantized ones compressed,
    within their bound, sending the bytes docs/collectives.md says; speedups over their
    own uncompressed run."""
    from qnccl.emulate import compressed_size
    args = ["--sizes", "512K:512K", "--bits", "4", "--buckets", "128", "--algos", "sra",
            "--baselines", "mpi", "--iters", "2", "--rates", "10gbit", "--nodes-section", "off",
            "--collectives-section", "on", "--shm-section", "off", "--dtypes", "float32",
            "--rotated-rows", "off"]
    output, report = bench_report(tmp_path, args)
    section = report["collectives"]
    names = [c["name"] for c in section["configurations"]]
    assert names == ["reducescatter uncompressed (NCCL API)", "reducescatter qnccl 4b B128",
                     "allgather uncompressed (NCCL API)", "allgather qnccl 8b B128",
                     "alltoall uncompressed (NCCL API)", "alltoall qnccl 8b B128"]
    assert section["table"] in output
    for base, quantized in zip(section["configurations"][::2], section["configurations"][1::2]):
        assert base["status"] == quantized["status"] == "ok" and quantized["check_ok"]
        assert quantized["perf"]["collective"] == quantized["collective"]
        rows = quantized["perf"]["rows"]
        assert all(r["compressed"] and r["ok"] for r in rows)
        count = rows[0]["count"]
        bits = quantized["bits"]
        per = count // 4
        sent = 3 * compressed_size(per, bits, 128)
        expected = sent / (4 * (per if quantized["collective"] == "allgather" else count))
        assert quantized["wire_bytes_per_input_byte"] == pytest.approx(expected, rel=1e-6)
        size = str(rows[0]["size"])
        assert quantized["speedup"][size] == pytest.approx(
            quantized["busbw_gbps"][size] / base["busbw_gbps"][size])


def test_shared_memory_section(tmp_path):
    """--shm-section on: the ranks on one emulated node, MPI over shared memory with no rate
    limit: uncompressed, then 4 bits / bucket 128 with auto and each of --algos. Every run is
    checked within its bound on 4 ranks of one node; each fixed algorithm runs as named, auto
    runs what it measured fastest (docs/tuning.md): the exact call with NCCL's bytes, or an
    algorithm with that algorithm's bytes on the wire; speedups are over the section's own
    uncompressed run, and auto's also over the plain NCCL's calls timed in its own job
    (--interleave), a line of the table of its own."""
    args = ["--sizes", "256K:512K", "--bits", "4", "--buckets", "128", "--algos", "ring,sra",
            "--baselines", "mpi", "--iters", "2", "--rates", "10gbit", "--nodes-section", "off",
            "--collectives-section", "off", "--shm-section", "on", "--dtypes", "float32",
            "--rotated-rows", "off"]
    output, report = bench_report(tmp_path, args)
    section = report["shared_memory"]
    configs = {c["name"]: c for c in section["configurations"]}
    assert list(configs) == ["shm uncompressed (NCCL API)", "shm qnccl 4b B128 auto",
                             "shm qnccl 4b B128 ring", "shm qnccl 4b B128 sra"]
    assert section["table"] in output and section["table"] in report["table"]
    base = configs["shm uncompressed (NCCL API)"]
    for config in configs.values():
        assert config["status"] == "ok" and config["check_ok"], config
        assert config["shared_memory"] and config["perf"]["nranks"] == 4
        netlab = config["command"][1:config["command"].index("--")]
        assert netlab == ["--nodes", "1", "--rate", "none"], config["command"]
        mpirun = config["command"][config["command"].index("--") + 1:]
        assert mpirun[1:3] == ["--bind-to", "core:overload-allowed"], config["command"]
        assert config["perf"]["options"]["iters"] == 21  # bench.SHM_MIN_ITERS over --iters 2
        for size, busbw in config["busbw_gbps"].items():
            assert config["speedup"][size] == pytest.approx(busbw / base["busbw_gbps"][size])
        interleaved = config["name"] == "shm qnccl 4b B128 auto"
        assert config["perf"]["options"]["interleave"] == (bench.SHM_ROUNDS if interleaved else 0)
        assert bool(config["vs_plain"]) == interleaved, config["vs_plain"]
        if interleaved:
            assert config["vs_plain"] == {str(r["size"]): r["vs_plain"]
                                          for r in config["perf"]["rows"]}
            assert all(0 < v < float("inf") for v in config["vs_plain"].values())
    same_job = [line for line in section["table"].splitlines()
                if line.startswith("  same job, vs plain NCCL")]
    assert len(same_job) == 1 and same_job[0].count("x") == 2, section["table"]
    for algo in ("ring", "sra"):
        rows = configs[f"shm qnccl 4b B128 {algo}"]["perf"]["rows"]
        assert {r["algo"] for r in rows} == {algo} and all(r["compressed"] for r in rows)
    for row in configs["shm qnccl 4b B128 auto"]["perf"]["rows"]:  # measured: any candidate
        if not row["compressed"]:  # the exact call was fastest: NCCL's own bytes
            assert row["ok"] and row["wire_bytes_per_input_byte"] == pytest.approx(1.5), row
            continue
        assert row["algo"] in ("ring", "tree", "sra"), row
        if f"shm qnccl 4b B128 {row['algo']}" not in configs:
            continue
        fixed = configs[f"shm qnccl 4b B128 {row['algo']}"]["perf"]["rows"]
        twin = next(r for r in fixed
                    if (r["size"], r["placement"]) == (row["size"], row["placement"]))
        assert row["wire_bytes_per_input_byte"] == twin["wire_bytes_per_input_byte"]


def test_shared_memory_section_per_type(tmp_path):
    """The shared-memory section runs each type of --dtypes, each configuration's speedup over
    its own type's uncompressed run (bfloat16's wire is half of float32's)."""
    args = ["--sizes", "256K:256K", "--bits", "4", "--buckets", "128", "--algos", "sra",
            "--baselines", "mpi", "--iters", "1", "--rates", "10gbit", "--nodes-section", "off",
            "--collectives-section", "off", "--shm-section", "on",
            "--dtypes", "float32,bfloat16", "--rotated-rows", "off"]
    _, report = bench_report(tmp_path, args)
    configs = {c["name"]: c for c in report["shared_memory"]["configurations"]}
    assert list(configs) == ["shm uncompressed (NCCL API)", "shm qnccl 4b B128 auto",
                             "shm qnccl 4b B128 sra", "shm uncompressed (NCCL API) bf16",
                             "shm qnccl 4b B128 auto bf16", "shm qnccl 4b B128 sra bf16"]
    for name, config in configs.items():
        dtype = "bfloat16" if name.endswith("bf16") else "float32"
        assert config["status"] == "ok" and config["check_ok"] and config["dtype"] == dtype
        assert config["perf"]["rows"][0]["type"] == {"float32": "float"}.get(dtype, dtype)
        base = configs["shm uncompressed (NCCL API)" + (" bf16" if dtype == "bfloat16" else "")]
        for size, busbw in config["busbw_gbps"].items():
            assert config["speedup"][size] == pytest.approx(busbw / base["busbw_gbps"][size])
    sra16 = configs["shm qnccl 4b B128 sra bf16"]
    assert sra16["wire_limit"] == pytest.approx(
        configs["shm uncompressed (NCCL API) bf16"]["wire_bytes_per_input_byte"]
        / sra16["wire_bytes_per_input_byte"])


@pytest.mark.parametrize("extra, rotated", [([], True), (["--rotated-rows", "off"], False),
                                            (["--quick"], False)])
def test_rotated_rows(extra, rotated):
    """The flat section's rotated rows (docs/accuracy.md, "Fewer bits"): float32 only, SRA,
    bucket 128, blocks of 256, after measured auto; --rotated-rows off and --quick leave them
    out. Each row's qnccl run asks for its rotation and clip."""
    from qnccl import cli

    args = cli.bench_settings(cli.build_parser().parse_args(["bench", *extra]))
    configs = bench.configurations(args, "1gbit")
    rows = [c for c in configs if c.rotation_block]
    if not rotated:
        assert rows == []
        return
    assert [c.name for c in rows] == ["qnccl 3b B128 sra rot256", "qnccl 2b B128 sra rot256 clip"]
    names = [c.name for c in configs]
    assert names.index(rows[0].name) == names.index("qnccl 4b B128 auto") + 1
    for c, clip in zip(rows, (False, True)):
        assert (c.dtype, c.algo, c.bucket_size, c.rotation_block, c.clip) == \
            ("float32", "sra", 128, 256, clip)
        argv = c.argv(args)
        run = argv[:argv.index("--")]
        assert run[run.index("--rotation") + 1] == "hadamard"
        assert run[run.index("--rotation-block") + 1] == "256"
        assert ("--clip" in run) == clip
        assert not clip or run[run.index("--clip") + 1] == "gaussian"
