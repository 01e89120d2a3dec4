"""`qnccl bench` (qnccl/bench/, `make bench`): a small sweep run for real,
MPI jobs inside perf/netlab, and the table, report.json and plot checked
against what the jobs measured and against docs/allreduce.md's byte counts.
Bad options fail before any job starts."""
import io
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
from qnccl.bench import configs as bench_configs, estimate as bench_estimate, \
    jobs as bench_jobs, plots as bench_plots, report as tables

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
            "--wide", "--out", str(out)]
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
    # Progress, not on a terminal: one line per configuration when it ends, its result and
    # the time left (none after the last); no line per size.
    assert re.search(r"^\[ 1/26\] uncompressed \(NCCL API\) at 10gbit  512 KiB: \S+ GB/s, "
                     r"\S+ s, about \S+ (s|min) left$", output, re.M)
    assert re.search(r"^\[ 2/26\] MPI_Allreduce at 10gbit  512 KiB: \S+ GB/s \(\S+x\), ",
                     output, re.M)
    assert re.search(r"^\[26/26\] qnccl 4b B128 auto bf16 at none  512 KiB: \S+ GB/s "
                     r"\(\S+x\), \S+ s$", output, re.M)
    assert len(re.findall(r"^\[..?/26\] ", output, re.M)) == 26
    assert "KiB: " not in output.replace("512 KiB: ", "")


@pytest.mark.parametrize("section", range(len(RATES)), ids=RATES)
def test_table_matches_the_jobs(small_bench, section):
    """--wide prints the full tables (report.json's "table"): busbw and speedup at every
    size, wire, limit and error per row, as the jobs measured them."""
    _, output, report = small_bench
    sec = report["sections"][section]
    assert sec["table"] in output and sec["table"] in report["table"]
    assert sec["compact_table"] not in output
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
    assert section["compact_table"] in output and section["table"] in report["table"]


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
    assert section["compact_table"] in output and section["table"] in report["table"]
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
    assert section["compact_table"] in output and section["table"] in report["table"]
    base = configs["shm uncompressed (NCCL API)"]
    for config in configs.values():
        assert config["status"] == "ok" and config["check_ok"], config
        assert config["shared_memory"] and config["perf"]["nranks"] == 4
        netlab = config["command"][1:config["command"].index("--")]
        assert netlab == ["--nodes", "1", "--rate", "none"], config["command"]
        mpirun = config["command"][config["command"].index("--") + 1:]
        assert mpirun[1:3] == ["--bind-to", "core:overload-allowed"], config["command"]
        assert config["perf"]["options"]["iters"] == 21  # SHM_MIN_ITERS over --iters 2
        for size, busbw in config["busbw_gbps"].items():
            assert config["speedup"][size] == pytest.approx(busbw / base["busbw_gbps"][size])
        interleaved = config["name"] == "shm qnccl 4b B128 auto"
        rounds = bench_configs.SHM_ROUNDS if interleaved else 0
        assert config["perf"]["options"]["interleave"] == rounds
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
    configs = bench_configs.configurations(args, "1gbit")
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


@pytest.mark.parametrize("command, flag", [("bench", "--buckets"), ("codec-bench", "--bucket")])
@pytest.mark.parametrize("text, values", [("128,1K", [128, 1024]), ("2k,64", [2048, 64]),
                                          ("0", None), ("1KB", None), ("128,", None),
                                          ("2T", None)])
def test_bucket_lists_read_as_qnccl_bucket_size(capsys, command, flag, text, values):
    """The benchmarks' bucket lists take each value as QNCCL_BUCKET_SIZE does: 1..2^40 with an
    optional K, M or G suffix in either case, nothing else; a refusal says what is allowed."""
    from qnccl import cli

    if values is not None:
        args = cli.build_parser().parse_args([command, flag, text])
        assert getattr(args, flag.lstrip("-")) == values
        return
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, flag, text])
    assert "1..2**40 with an optional K, M or G suffix" in capsys.readouterr().err


# ---- outputs, console and time estimate, without running jobs --------------------------------

def bench_args(*extra):
    from qnccl import cli

    return cli.bench_settings(cli.build_parser().parse_args(["bench", *extra]))


def fake_record(config, args, index, fail=False):
    """A record as run_config returns it, with made-up rows at every size of args (busbw
    from the link's rate and the row's wire bytes); fail: a failed job with a long message."""
    import dataclasses

    ranks = config.ranks or args.ranks
    factor = (2 if config.collective == "allreduce" else 1) * (ranks - 1) / ranks
    width = bench_estimate.DTYPE_BYTES[config.dtype]
    wire = factor * ((config.bits / 8 + 8 / config.bucket_size) / width
                     if config.kind == "qnccl" else 1)
    bps = bench_configs.rate_bps(config.rate) or 8e9
    rows = []
    for size in bench_estimate.sweep(args):
        busbw = bps / 8e9 / ranks * factor / wire * (1 + 0.01 * (index % 7))
        seconds = size * factor / (busbw * 1e9)
        rows.append({"size": size, "placement": "out-of-place", "time_us": seconds * 1e6,
                     "time_us_median": seconds * 1e6, "algbw_gbps": busbw / factor,
                     "busbw_gbps": busbw, "wire_bytes_per_input_byte": wire,
                     "error": 0.2 / config.bits if config.bits else 3e-8, "ok": True,
                     "vs_plain": 0.97 if config.interleave else None})
    record = {**dataclasses.asdict(config), "status": "ok", "message": None,
              "wall_s": round(bench_estimate.predict_wall(config, args), 2), "perf": {"rows": rows}}
    if fail:
        record.update(status="failed", perf={"rows": []},
                      message="exit 1: " + "a long line of the job's log " * 12)
    return record


def synthetic_report(*extra, fail_every=0):
    """A report of every configuration of `qnccl bench EXTRA` (all sections; with
    --dtypes float32,bfloat16,float16 every kind, algorithm, bits, type and rotated row a real
    run has), with made-up rows; fail_every: every n-th a failed job."""
    args = bench_args(*extra)
    count = iter(range(1, 10_000))

    def records(configs):
        return [fake_record(c, args, i, fail=bool(fail_every) and i % fail_every == 0)
                for c, i in zip(configs, count)]

    report = {"benchmark": "qnccl bench", "date": "2026-11-29T10:26:35+00:00",
              "host": {"name": "vm", "cpus": 2, "platform": "Linux-6.18-x86_64"},
              "nranks": args.ranks, "rounding": args.rounding, "iters": args.iters,
              "command": "/x/qnccl/__main__.py bench --out build/bench", "sections": []}
    for rate in args.rates:
        recs = records(bench_configs.configurations(args, rate))
        report["sections"].append({"link": {"rate": rate, "requested": rate},
                                   "sizes": tables.summarize(recs), "configurations": recs,
                                   "title": f"allreduce at {rate}, " + "explained at length " * 9})
    two = records(bench_configs.node_configurations(args, args.rates[0]))
    report["two_nodes"] = {"nodes": 2, "nranks": 4, "link": {"rate": args.rates[0],
                                                            "requested": args.rates[0]},
                           "sizes": tables.summarize(two), "configurations": two, "title": "2x2"}
    collectives = records(bench_configs.collective_configurations(args, args.rates[0]))
    for i in range(0, len(collectives), 2):
        tables.summarize(collectives[i:i + 2])
    report["collectives"] = {"link": {"rate": args.rates[0], "requested": args.rates[0]},
                             "sizes": bench_estimate.sweep(args), "configurations": collectives,
                             "title": "collectives"}
    shm = records(bench_configs.shm_configurations(args))
    report["shared_memory"] = {"link": {"rate": "none"}, "sizes": tables.summarize(shm),
                               "configurations": shm, "title": "shared memory"}
    return args, report


ALL_TYPES = ("--dtypes", "float32,bfloat16,float16")


def test_plot_grid_and_styles(tmp_path):
    """busbw.png: a grid of panels two wide that fits a laptop screen's width, each legend
    below its own axes (not over any panel, inside the figure, font 8 or more), and within
    each panel no two legend entries alike: (color, linestyle, marker, fill) read back from
    the legend's lines. Every kind, algorithm, bits, type and rotated row of a real run."""
    args, report = synthetic_report(*ALL_TYPES)
    panels = [(s["configurations"], s["sizes"], heading)
              for heading, s in tables.sections_of(report)]
    assert len(panels) == 5
    fig = bench_plots.figure(panels)
    width, height = fig.get_size_inches() * fig.dpi
    assert width <= 1600 and 700 <= width / 2
    axes = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert len(axes) == 5 == len(fig.axes)
    columns = sorted({round(ax.get_position().x0, 3) for ax in axes})
    rows = sorted({round(ax.get_position().y0, 3) for ax in axes})
    assert len(columns) == 2 and len(rows) == 3  # 2 + 2 + 1
    fig.canvas.draw()  # the legends' places
    renderer = fig.canvas.get_renderer()
    figure_box = fig.bbox
    panel_parts = [box for ax in fig.axes for box in (
        ax.get_window_extent(renderer), ax.xaxis.get_tightbbox(renderer),
        ax.yaxis.get_tightbbox(renderer), ax.title.get_window_extent(renderer))]
    for ax, (records, _, title) in zip(axes, panels):
        legend = ax.get_legend()
        lines = legend.get_lines()
        assert len(lines) == len(records), title
        looks = [(line.get_color(), line.get_linestyle(), line.get_marker(),
                  line.get_fillstyle()) for line in lines]
        clashes = [(label.get_text(), look) for label, look in zip(legend.get_texts(), looks)
                   if looks.count(look) > 1]
        assert not clashes, f"{title}: legend entries alike: {clashes}"
        assert all(text.get_fontsize() >= 8 for text in legend.get_texts())
        box = legend.get_window_extent(renderer)
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 + 1
        assert figure_box.y0 <= box.y0 and box.y1 <= figure_box.y1 + 1
        assert box.width > 0.8 * width / 2  # below its own axes, as wide as they are
        assert ax.get_window_extent(renderer).x0 - 100 < box.x0 < ax.get_window_extent(renderer).x0
        clash = [part for part in panel_parts if box.overlaps(part)]  # over no panel's axes,
        assert not clash, (title, clash)  # tick labels, axis labels or title
        # dash patterns long enough to tell in the legend
        assert legend.handlelength >= 4
    # in the flat panels: each algorithm its own dash pattern and marker, each type its fill
    flat = axes[0].get_legend()
    by_label = {t.get_text(): line for t, line in zip(flat.get_texts(), flat.get_lines())}
    markers = {algo: by_label[f"4b B128 {algo}"].get_marker() for algo in ("ring", "tree", "sra")}
    markers["auto"] = by_label["4b B128 auto"].get_marker()
    assert len(set(markers.values())) == 4
    fills = {by_label[f"4b B128 ring{tag}"].get_fillstyle() for tag in ("", " bf16", " fp16")}
    assert len(fills) == 3
    # records that would look alike (the same settings twice, a baseline thrice) still differ
    twins = [*panels[0][0][:1] * 3, *[r for r in panels[0][0] if r["rotation_block"]] * 2]
    looks = [(s["color"], s["marker"], s["fillstyle"]) for s in bench_plots.line_styles(twins)]
    assert len(set(looks)) == len(twins) == 7
    path = tmp_path / "busbw.png"
    bench_plots.plot(panels, path)
    png = path.read_bytes()
    assert int.from_bytes(png[16:20], "big") == round(width) <= 1600
    assert int.from_bytes(png[20:24], "big") == round(height)


@pytest.mark.parametrize("extra", [(), ("--sizes", "64K:64M", *ALL_TYPES)],
                         ids=["default", "11 sizes, 3 types"])
def test_compact_tables_fit_120_columns(extra):
    """The console's tables (and summary.md's) fit 120 columns, titles, failures and footnotes
    wrapped; the per-size cells go first to every other size (the largest kept, a footnote
    names the rest), after the limit column; --wide's table keeps every column."""
    args, report = synthetic_report(*extra, fail_every=9)
    sizes = bench_estimate.sweep(args)
    for heading, section in tables.sections_of(report):
        text = tables.render_text(tables.section_table(section))
        too_wide = [line for line in text.splitlines() if len(line) > 120]
        assert not too_wide, f"{heading}:\n" + "\n".join(too_wide)
        assert any(line.startswith("configuration ") for line in text.splitlines())
        assert f"  {bench_configs.mib(sizes[-1])}" in text
        for record in section["configurations"]:
            assert record["name"] in text
            if record["status"] != "ok":
                assert "failed: exit 1: a long line" in text
        wide = tables.format_table(section["configurations"], section["sizes"], "title")
        header = wide.splitlines()[2:4]
        assert all(f"{bench_configs.mib(s):>15}" in header[0] for s in section["sizes"])
        assert header[0].split()[:3] == ["wire", "limit", "error"]
        assert header[1].count("GB/s speedup") == len(section["sizes"])
    if len(sizes) == 11:  # thinned
        table = tables.section_table(report["sections"][0])
        assert "limit" not in table.columns
        assert any("Sizes left out" in note and "32 MiB" in note for note in table.notes)
        assert "64 KiB" in table.columns and "64 MiB" in table.columns
    else:
        assert tables.section_table(report["sections"][0]).columns == [
            "configuration", "wire", "limit", "error", *(bench_configs.mib(s) for s in sizes)]


def test_summary_markdown_and_headline():
    """summary.md: where and when, the headline (largest size, float32, a column per link and
    one for the two nodes, whose hierarchical rows have lines of their own), then every
    section's console table as markdown."""
    args, report = synthetic_report()
    text = tables.summary_markdown(report)
    assert text.startswith("# qnccl bench\n\nMeasured 2026-11-29 10:26:35+00:00 on vm, 2 CPUs, "
                           "Linux-6.18-x86_64; `qnccl bench --out build/bench`\n")
    caption, table = tables.headline(report)
    assert table.columns == ["configuration", "1 Gbit/s", "10 Gbit/s",
                             "2 nodes x 2 ranks, 1 Gbit/s between"]
    assert "64 MiB of float32" in caption and "bucket 128" in caption
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["uncompressed (NCCL API)"][0].endswith(" GB/s")
    hier = rows["qnccl 4b B128 hier"]
    assert hier[:2] == ["", ""] and hier[2].endswith("x")
    assert rows["qnccl 4b B128 ring"][2].endswith("x")  # the two-node row on the flat row's line
    assert "qnccl 2b B128 sra rot256 clip" in rows
    assert not any("bf16" in name or "B1024" in name for name in rows)
    for heading, section in tables.sections_of(report):
        md = tables.render_markdown(tables.section_table(section))
        assert md in text
        assert len([line for line in md.splitlines() if line.startswith("| ")]) >= 1 + len(
            section["configurations"])


def run_main(monkeypatch, tmp_path, extra, stream, fail_name=None):
    """bench.main with jobs that do not run: run_config returns fake_record's rows, announcing
    each size as a job's row would (fail_name: the configuration that fails; "*": every one)."""
    args = bench_args("--out", str(tmp_path), *extra)
    count = iter(range(1, 10_000))

    def fake_run(config, args, out_dir, on_size=lambda text: None):
        for size in bench_estimate.sweep(args):
            on_size(f"{bench_configs.mib(size)}: 1.0 ms a call, error 1e-02")
        return fake_record(config, args, next(count), fail=fail_name in ("*", config.name))

    monkeypatch.setattr(bench, "run_config", fake_run)
    monkeypatch.setattr(bench, "missing_parts", lambda args: [])
    monkeypatch.setattr(bench.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(bench, "probe_link", lambda rate: bench_jobs.Link(
        rate, "unthrottled" if rate == "none" else rate, True, ""))
    monkeypatch.setattr(sys, "stdout", stream)
    status = bench.main(args)
    configs = [c for rate in args.rates for c in bench_configs.configurations(args, rate)]
    configs += (bench_configs.node_configurations(args, args.rates[0])
                + bench_configs.collective_configurations(args, args.rates[0])
                + bench_configs.shm_configurations(args))
    return status, stream.getvalue(), configs


QUICK = ("--sizes", "1M:4M", "--bits", "4", "--buckets", "128", "--algos", "ring,sra",
         "--dtypes", "float32,bfloat16")


def test_every_job_failing_still_writes_the_outputs(monkeypatch, tmp_path):
    """A run whose every job fails ends with exit 1 and the failures named, not a traceback:
    report.json, summary.md (no headline: nothing measured) and busbw.png are written."""
    status, output, configs = run_main(monkeypatch, tmp_path, QUICK, io.StringIO(), "*")
    assert status == 1
    assert "Traceback" not in output
    for name in ("report.json", "summary.md", "busbw.png"):
        assert (tmp_path / name).is_file(), name
    assert len(json.loads((tmp_path / "report.json").read_text())["sections"]) == 2  # the rates


def test_a_missing_matplotlib_stops_before_the_jobs(monkeypatch, tmp_path, capsys):
    """Without matplotlib (a package installed without its bench extra) the command says what to
    install and exits 1 before running a job, not after an hour of them."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    ran = []
    monkeypatch.setattr(bench, "run_config", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(bench, "missing_parts", lambda args: [])
    assert bench.main(bench_args("--out", str(tmp_path), *QUICK)) == 1
    assert ran == []
    assert "pip install 'qnccl[bench]'" in capsys.readouterr().err


def test_console_not_a_terminal(monkeypatch, tmp_path):
    """Not on a terminal: exactly one line per configuration, when it ends ('[ i/N] name  its
    busbw at the largest size (speedup), wall time, about X left'), a failure's message on a
    line of its own, no line per size; the tables fit 120 columns; summary.md is written."""

    status, output, configs = run_main(monkeypatch, tmp_path, QUICK, io.StringIO(),
                                       fail_name="qnccl 4b B128 sra")
    assert status == 1  # the failed job
    assert "\r" not in output and "\033" not in output
    progress = [line for line in output.splitlines() if re.match(r"\[ *\d+/\d+\] ", line)]
    n = len(configs)
    assert len(progress) == n
    for i, (line, config) in enumerate(zip(progress, configs), 1):
        assert line.startswith(f"[{i:2d}/{n}] {config.name}"), line
        assert re.search(r"(\d+ s|[\d.]+ min) left$" if i < n else r"\d s$", line), line
        if config.name == "qnccl 4b B128 sra" and config.rate == "1gbit":
            assert "failed after" in line
    assert re.search(r"^\[ 2/\d+\] MPI_Allreduce at 1gbit  4 MiB: [\d.]+ GB/s \(1\.0\dx\), "
                     r"[\d.]+ s, about [\d.]+ min left$", output, re.M)
    assert len(re.findall(r"^      failed: exit 1: a long line", output, re.M)) == 2  # 2 rates
    assert "1.0 ms a call" not in output
    tables = output[output.index("\nallreduce of"):output.index("\nreport: ")]
    assert max(len(line) for line in tables.splitlines()) <= 120
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# qnccl bench\n\nMeasured ") and "## Headline" in summary
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["sections"][0]["compact_table"] in output
    assert report["sections"][0]["table"] not in output
    assert f"summary: {tmp_path / 'summary.md'}" in output


@pytest.mark.parametrize("width", [40, 79, 200])
def test_a_progress_line_fits_the_terminal_and_keeps_the_time_left(width):
    """A rewritten progress line never wraps (a wrapped line is not rewritten, it piles up),
    and on a narrow terminal the configuration's name gives way before the time left."""
    text = ("[12/95] qnccl 2b B128 sra rot256 clip at 10gbit  32 MiB: 3.1 ms a call, error "
            "2e-01, about 37.1 min left")
    shown = bench.fit(text, width)
    assert len(shown) <= width
    assert shown.endswith(", about 37.1 min left")
    assert shown == text or "..." in shown


def test_console_on_a_terminal(monkeypatch, tmp_path):
    """On a terminal: each configuration's line rewritten in place as its sizes come (carriage
    return, clear the line), then left as one line with its result; --wide prints the full
    tables."""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "120")  # the terminal's width (the lines fit it)
    status, output, configs = run_main(monkeypatch, tmp_path, (*QUICK, "--wide"), Terminal())
    assert status == 0
    n = len(configs)
    shown = [line.rsplit("\r\033[K", 1)[-1] for line in output.split("\n")]  # what stays
    progress = [line for line in shown if re.match(r"\[ *\d+/\d+\] ", line)]
    assert [line[:line.index("]") + 1] for line in progress] == [
        f"[{i:2d}/{n}]" for i in range(1, n + 1)]
    assert "\r\033[K[ 1/%d] uncompressed (NCCL API) at 1gbit  4 MiB: 1.0 ms a call, error " \
           "1e-02, about " % n in output
    assert output.count("\r\033[K") >= n * 4  # a start and three sizes each
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["sections"][0]["table"] in output  # --wide


def replay(run, monkeypatch):
    """(estimated, actual) seconds left at each step of a recorded run after its first
    configuration: estimate.seconds_left from the finished ones' wall times against what the rest
    took (with torch importable or not, as where the run was measured)."""
    import types

    monkeypatch.setattr(bench_estimate, "torch_installed", lambda: run.get("torch", True))
    args = types.SimpleNamespace(**run["args"])
    records = run["configurations"]
    configs = [bench_estimate.config_of(r) for r in records]
    return [(bench_estimate.seconds_left(records[:i], configs[i:], args),
             sum(r["wall_s"] for r in records[i:])) for i in range(1, len(records))]


def test_time_estimate_replays_measured_runs(monkeypatch):
    """The time left, replayed over measured runs (tests/bench_walls.json: every job's
    configuration and wall time): within 20% of what the rest took at every step from the
    first configuration on. (The small sweeps' jobs take about a second each, mostly their
    start, which varies by a few tenths from job to job: there 0.5 s counts as close enough.)"""
    runs = json.loads((REPO / "tests" / "bench_walls.json").read_text())["runs"]
    assert len(runs) >= 3
    for run in runs:
        steps = replay(run, monkeypatch)
        worst = max(steps, key=lambda step: abs(step[0] / step[1] - 1))
        misses = [(i, f"{est:.1f} s for {actual:.1f} s") for i, (est, actual) in enumerate(steps, 2)
                  if abs(est / actual - 1) > 0.2 and abs(est - actual) > 0.5]
        assert not misses, (run["command"], misses)
        if run["wall_s"] > 60:  # the 64 MiB runs
            assert abs(worst[0] / worst[1] - 1) <= 0.2


def test_time_estimate_model():
    """What the prediction follows: the link's rate, the wire bytes (bits), the sizes, the
    calls per size; 'none' has no link term."""
    assert bench_configs.rate_bps("1gbit") == 1e9 and bench_configs.rate_bps("2.5gbit") == 2.5e9
    assert bench_configs.rate_bps("100mbit") == 1e8 and bench_configs.rate_bps("none") is None
    args = bench_args("--sizes", "64M:64M")
    base = bench_configs.Config("u", "nccl", rate="1gbit")
    # 4 ranks x 1.5 bytes per byte of 64 MiB on one 1 Gbit/s link: 3.2 s a call
    assert bench_estimate.call_seconds(base, args, 64 << 20) == pytest.approx(3.22, rel=0.01)
    four = bench_configs.Config("q", "qnccl", 4, 128, "ring", rate="1gbit")
    two = bench_configs.Config("q", "qnccl", 2, 128, "ring", rate="1gbit")
    assert bench_estimate.predict_wall(four, args) < bench_estimate.predict_wall(base, args) / 5
    assert bench_estimate.predict_wall(two, args) < bench_estimate.predict_wall(four, args)
    assert bench_estimate.predict_wall(bench_configs.Config("u", "nccl", rate="10gbit"), args) < \
        bench_estimate.predict_wall(base, args) / 5
    more = bench_args("--sizes", "32M:64M")
    predict = bench_estimate.predict_wall
    assert predict(base, more) == pytest.approx(1.5 * predict(base, args), rel=0.05)
    auto = bench_configs.Config("q", "qnccl", 4, 128, "auto", rate="1gbit")
    torch = [bench_configs.Config("t", "torch-gloo", rate=rate) for rate in ("1gbit", "10gbit")]
    assert bench_estimate.seconds_left([], torch[1:], args) > 10
    skipped = {**fake_record(torch[0], args, 1), "status": "skipped", "wall_s": 2.0}
    assert bench_estimate.seconds_left([skipped], torch[1:], args) == 2.0  # torch is missing
    # five trials of the exact call (3.2 s) in place of five quantized ones (0.46 s)
    assert predict(auto, args) - predict(four, args) == pytest.approx(5 * (3.22 - 0.46), rel=0.05)


def test_bench_docs_script(tmp_path):
    """scripts/bench_docs.py puts a report's headline into README.md's block and its full
    summary into docs/benchmark.md's, the markers kept; a second run changes nothing; a
    missing marker fails with a message naming the file and the marker, and writes nothing."""
    _, report = synthetic_report()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.json").write_text(json.dumps(report))
    readme, doc = tmp_path / "README.md", tmp_path / "benchmark.md"
    readme.write_text("# x\n\n<!-- bench:summary:begin -->\nold\n<!-- bench:summary:end -->\n"
                      "\nafter\n")
    doc.write_text("intro\n<!-- bench:full:begin -->\n<!-- bench:full:end -->\nrest\n")
    script = [sys.executable, str(REPO / "scripts" / "bench_docs.py")]

    def run(*args):
        return subprocess.run([*script, *args, "--readme", str(readme), "--doc", str(doc)],
                              capture_output=True, text=True, timeout=60)

    first = run(str(tmp_path / "out"))
    assert first.returncode == 0, first.stderr
    texts = readme.read_text(), doc.read_text()
    assert texts[0].startswith("# x\n\n<!-- bench:summary:begin -->\nMeasured 2026-11-29 ")
    assert texts[0].endswith("| \n<!-- bench:summary:end -->\n\nafter\n") or \
        texts[0].endswith("|\n<!-- bench:summary:end -->\n\nafter\n")
    assert tables.headline_markdown(report).strip() in texts[0] and "old" not in texts[0]
    assert tables.summary_markdown(report, level=3, title=False).strip() in texts[1]
    assert texts[1].startswith("intro\n<!-- bench:full:begin -->\nMeasured ")
    assert texts[1].endswith("\n<!-- bench:full:end -->\nrest\n") and "### Headline" in texts[1]
    second = run(str(tmp_path / "out" / "report.json"))
    assert second.returncode == 0 and (readme.read_text(), doc.read_text()) == texts
    doc.write_text("intro\n<!-- bench:full:begin -->\nrest\n")
    readme.write_text(texts[0].replace("after", "changed"))
    broken = run(str(tmp_path / "out"))
    assert broken.returncode == 1
    assert f"{doc}: the marker line <!-- bench:full:end --> is missing" in broken.stderr
    assert readme.read_text() == texts[0].replace("after", "changed")  # nothing written
