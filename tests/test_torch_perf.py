"""perf/torch_all_reduce_perf.py: the torch.distributed (gloo) baseline of the benchmark.

Real MPI jobs of 1, 2 and 4 ranks (rendezvous on a fresh MASTER_PORT each), the table and
the JSON read back field by field, exact results for integers and max, a wrong allreduce
caught by the check (injected from here, by a wrapper that patches all_reduce), bad options,
and a Python without torch.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from mpi import REPO, run  # noqa: E402

sys.path.insert(0, str(REPO / "perf"))
import gloo_ranks  # noqa: E402
from gloo_ranks import rendezvous_port  # noqa: E402

SCRIPT = REPO / "perf" / "torch_all_reduce_perf.py"
TIMEOUT_S = 120
SWEEP = ["-b", "64K", "-e", "1M", "-f", "4", "-n", "2", "-w", "1"]
HEADER_COLUMNS = ("# size count type redop root time algbw busbw error "
                  "time algbw busbw error agree wire").split()


def run_perf(nprocs, args, check=True, program=(str(SCRIPT),)):
    env = {"MASTER_PORT": str(rendezvous_port()), "MASTER_ADDR": "127.0.0.1"}
    return run(nprocs, [sys.executable, *program, *map(str, args)], TIMEOUT_S, env=env, check=check)


def time_str(us):
    return "%7.0f" % us if us >= 10000 else "%7.1f" % us if us >= 100 else "%7.2f" % us


def parse(output):
    """Header fields, table rows (whitespace fields) and '# Key: value' summary lines."""
    lines = output.splitlines()
    header = [ln for ln in lines if ln.startswith("#       size")]
    assert len(header) == 1, output
    assert header[0].split() == HEADER_COLUMNS
    rows = [ln.split() for ln in lines if ln[:1] == " " and ln.split()[0].isdigit()]
    for ln in lines:
        if ln[:1] == " " and ln.split()[0].isdigit():
            assert len(ln) == len(header[0]), (ln, header[0])  # columns end where headings end
    summary = {}
    for ln in lines:
        if ln.startswith("# ") and ":" in ln:
            key, _, value = ln[2:].partition(":")
            summary[key.strip()] = value.strip()
    return rows, summary


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_table_and_json(tmp_path, nranks, op):
    out_json = tmp_path / "r.json"
    result = run_perf(nranks, [*SWEEP, "-d", "float", "-o", op, "-J", out_json])
    out = result.stdout
    rows, summary = parse(out)
    assert (f"# torch_all_reduce_perf: nranks {nranks} minBytes 65536 maxBytes 1048576 "
            f"step: 4(factor) warmup iters: 1 iters: 2 validation: 1 blocking: 0 average: 1 "
            f"memory: host") in out
    assert "torch.distributed all_reduce, backend gloo" in out
    factor = 2 * (nranks - 1) / nranks
    sizes = [64 << 10, 256 << 10, 1 << 20]
    assert [int(r[0]) for r in rows] == sizes
    report = json.loads(out_json.read_text())
    assert report["tool"] == "torch_all_reduce_perf" and report["backend"] == "torch-gloo"
    assert report["collective"] == "allreduce" and report["nranks"] == nranks
    assert report["qnccl"] is None and report["check"] == "OK"
    assert report["options"] == {"minbytes": 65536, "maxbytes": 1 << 20, "stepfactor": 4,
                                 "stepbytes": 1 << 20, "iters": 2, "warmup_iters": 1, "check": 1,
                                 "blocking": 0, "average": 1, "datatype": "float", "op": op,
                                 "memory": "host", "placement": "both"}
    assert len(report["rows"]) == 2 * len(rows)
    busbws = []
    for i, r in enumerate(rows):
        assert len(r) == 15, r
        size, count = int(r[0]), int(r[1])
        assert count == size // 4 and r[2:5] == ["float", op, "-1"]
        assert r[13] == "yes" and float(r[14]) == pytest.approx(factor, abs=5e-4)
        for k, placement in enumerate(("out-of-place", "in-place")):
            t, algbw, busbw, err = r[5 + 4 * k: 9 + 4 * k]
            assert abs(float(busbw) - float(algbw) * factor) <= 0.005 * (1 + factor) + 1e-9
            row = report["rows"][2 * i + k]
            assert (row["size"], row["count"], row["type"], row["redop"], row["root"],
                    row["placement"]) == (size, count, "float", op, -1, placement)
            assert time_str(row["time_us"]).strip() == t
            assert "%.2f" % row["algbw_gbps"] == algbw and "%.2f" % row["busbw_gbps"] == busbw
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
            assert row["algbw_gbps"] == pytest.approx(size / row["time_us"] / 1e3)
            assert "%.1e" % row["error"] == err
            assert 0 <= row["error"] <= row["bound"] and row["agree"] is True and row["ok"] is True
            if nranks == 1 and op == "sum":
                assert row["error"] == 0.0
            assert row["compressed"] is False
            assert row["wire_bytes_per_input_byte"] == pytest.approx(factor)
            busbws.append(row["busbw_gbps"])
    assert summary["Check"] == "OK"
    assert summary["Errors"].startswith("max ") and summary["Errors"].endswith(
        "ranks agree bit for bit: yes")
    assert float(summary["Avg bus bandwidth"]) == pytest.approx(sum(busbws) / len(busbws),
                                                                rel=1e-5, abs=1e-6)
    assert report["avg_busbw_gbps"] == pytest.approx(sum(busbws) / len(busbws))


@pytest.mark.parametrize("dtype,op", [("int32", "sum"), ("float", "max")])
def test_exact_ops(dtype, op):
    rows, summary = parse(run_perf(2, ["-b", "4K", "-e", "256K", "-f", "8", "-n", "2", "-w", "1",
                                       "-d", dtype, "-o", op]).stdout)
    assert len(rows) == 3
    for r in rows:
        assert r[2:4] == [dtype, op] and r[8] == r[12] == "0.0e+00" and r[13] == "yes"
    assert summary["Check"] == "OK"
    assert summary["Errors"].startswith("max 0.0e+00 of max |exact| (bound 0.0e+00)")


FAULTY = """
    import runpy, sys
    import torch.distributed as dist

    real_all_reduce = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):  # a wrong allreduce: +1 on the chosen ranks
        work = real_all_reduce(tensor, *args, **kwargs)
        if {ranks!r} == "all" or dist.get_rank() == int({ranks!r}):
            tensor.add_(1)
        return work

    dist.all_reduce = all_reduce
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("ranks", ["1", "all"])
def test_check_catches_wrong_results(tmp_path, ranks):
    wrapper = tmp_path / "faulty_all_reduce.py"
    wrapper.write_text(textwrap.dedent(FAULTY.format(ranks=ranks)))
    result = run_perf(2, ["-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "-J", tmp_path / "r.json"],
                      check=False, program=(str(wrapper), str(SCRIPT)))
    out = result.stdout
    assert result.returncode == 1, out
    rows, summary = parse(out)
    assert summary["Check"] == "FAILED"
    assert "check FAILED at 65536 B float sum out-of-place" in out
    assert "is over the bound" in out
    if ranks == "1":
        assert rows[0][13] == "NO"
        assert "ranks disagree: the output of rank(s) 1 differs from rank 0's" in out
        assert summary["Errors"].endswith("ranks agree bit for bit: NO")
    else:
        assert rows[0][13] == "yes" and "ranks disagree" not in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["check"] == "FAILED" and not any(row["ok"] for row in report["rows"])


def run_single(args, env=None):
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("OMPI_", "PMI_", "MASTER_")) and k not in ("RANK", "WORLD_SIZE")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], env=full_env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,flag", [
    (["-d", "float17"], "-d"), (["-o", "xor"], "-o"), (["-b", "1X"], "-b"), (["-e", "12Q"], "-e"),
    (["-a", "4"], "-a"), (["-c", "2"], "-c"), (["-z", "yes"], "-z"), (["-n", "0"], "-n"),
    (["-w", "-1"], "-w"), (["-f", "0"], "-f"), (["-i", "0"], "-i"), (["-b", "2M", "-e", "1M"], "-e"),
    (["--port", "70000"], "--port"), (["-x", "1"], "-x"),
])
def test_bad_flags(args, flag):
    result = run_single(args)
    assert result.returncode == 2, result
    assert flag in result.stderr, result.stderr
    assert "allowed" in result.stderr or "unrecognized" in result.stderr, result.stderr


def test_rendezvous_needs_a_port():
    several = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    result = run_single(["-b", "1K", "-e", "1K"], env=several)
    assert result.returncode == 2 and "set MASTER_PORT" in result.stderr, result
    result = run_single(["-b", "1K", "-e", "1K"], env={**several, "MASTER_PORT": "http"})
    assert result.returncode == 2 and "MASTER_PORT" in result.stderr, result


def test_the_rendezvous_port_is_one_no_connect_can_take():
    """The launchers' MASTER_PORT: free, and outside the kernel's ephemeral range, where a
    rank's connect() retries could draw it and connect to themselves before rank 0 listens."""
    with open(gloo_ranks.EPHEMERAL_RANGE) as f:
        low, high = map(int, f.read().split())
    ports = {rendezvous_port() for _ in range(20)}
    for port in ports:
        assert gloo_ranks.LOWEST_PORT <= port <= 65535 and not low <= port <= high, (port, low, high)
        with socket.socket() as s:
            s.bind(("", port))  # free
    assert len(ports) > 1, ports  # drawn at random: two launchers at once rarely meet


def test_without_torch(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    env = {"PYTHONPATH": str(tmp_path / "fake")}
    result = run_single(["-b", "1K", "-e", "1K"], env=env)
    assert result.returncode == 3, result
    assert "torch is not installed" in result.stderr and "pip install torch" in result.stderr
    assert result.stdout == ""
    helped = run_single(["-h"], env=env)
    assert helped.returncode == 0 and "-b MINBYTES" in helped.stdout, helped


def test_check_off(tmp_path):
    result = run_single(["-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "-c", "0",
                         "-J", tmp_path / "r.json"])
    assert result.returncode == 0, result
    rows, summary = parse(result.stdout)
    assert [r[8] for r in rows] == ["N/A"] and rows[0][12:14] == ["N/A", "N/A"]
    assert summary["Check"] == "off" and "Errors" not in summary
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["check"] == "off"
    assert all(row[k] is None for row in report["rows"] for k in ("error", "bound", "agree", "ok"))


@pytest.mark.parametrize("placement", ["out-of-place", "in-place"])
def test_one_placement(tmp_path, placement):
    result = run_perf(2, [*SWEEP, "-z", "1", "--placement", placement, "-J", tmp_path / "r.json"])
    rows, summary = parse(result.stdout)
    skipped = range(9, 13) if placement == "out-of-place" else range(5, 9)
    assert rows and all(r[i] == "N/A" for r in rows for i in skipped)
    assert all(r[13] == "yes" for r in rows) and summary["Check"] == "OK"
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["placement"] for r in report["rows"]] == [placement] * len(rows)
    assert all(r["time_us_median"] > 0 and r["ok"] for r in report["rows"])
    assert report["options"]["placement"] == placement


# ---- perf/torch_ddp_bench.py: DDP under each hook, side by side ----------------------------

def test_ddp_hook_bench_runs_every_hook(tmp_path):
    """Two ranks, three steps (PowerSGD from the third) on an unlimited netlab loopback: a
    row per hook, s/step and a final loss each (the compressed hooks' within 1% of plain
    DDP's), PyTorch's bf16 hook reported as unavailable on gloo rather than failing the run.
    QNCCL's rotated 3-bit hook stands for the others (the same code, rotated or not)."""
    result = subprocess.run([sys.executable, str(REPO / "perf" / "torch_ddp_bench.py"),
                             "--ranks", "2", "--steps", "2", "--warmup", "1", "--rate", "none",
                             "--hooks", "none,fp16,bf16,powersgd,qnccl3r",
                             "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "ddp_hooks.json").read_text())
    runs = report["runs"]
    assert list(runs) == ["none", "fp16", "bf16", "powersgd", "qnccl3r"]
    assert "NCCL" in runs["bf16"]["unavailable"]
    base = runs["none"]["loss"][-1]
    for hook in ("fp16", "powersgd", "qnccl3r"):
        assert len(runs[hook]["step_s"]) == 2 and min(runs[hook]["step_s"]) > 0
        assert abs(runs[hook]["loss"][-1] - base) <= 0.01 * base, hook
    table = (tmp_path / "ddp_hooks.md").read_text()
    assert "| qnccl.torch sra_hook, 3 bits, rotated |" in table and table in result.stdout


def test_ddp_hook_bench_rejects_unknown_hooks(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "perf" / "torch_ddp_bench.py"),
                             "--hooks", "none,zip", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--hooks: a comma list of none, fp16" in result.stderr
