"""reduce_scatter_perf, all_gather_perf, alltoall_perf and sendrecv_perf (docs/perf.md): the
driver of all_reduce_perf (tests/test_perf.py) with nccl-tests' counts and bus-bandwidth
factors, as MPI jobs over QNCCL's host backend:

- the table's numbers add up (count a multiple of the ranks where the call divides it,
  busbw = algbw * (n-1)/n, or 1 for sendrecv) and match the JSON; collectives without an
  in-place form print N/A there, those whose ranks need not agree print '-';
- without QNCCL every value is exactly the input it comes from (reduce-scatter: within the
  float rounding bound of its sum); with libqnccl.so preloaded and the collective in
  QNCCL_COLLECTIVES the rows are compressed, within qncclCollectiveErrorBound, and each rank
  sent the bytes the wire format says (recomputed here);
- options a collective cannot take exit 2 naming them.
"""
import pytest

import mpi
from mpi import HOST_NCCL
from qnccl.emulate import compressed_size
from test_perf import BIN, ELEMENT_SIZE, FIELDS, SMALL_SWEEP, run_perf, summary, table

# tool: (QNCCL_COLLECTIVES name, busbw / algbw for n ranks, in place?, ranks agree?)
TOOLS = {
    "reduce_scatter_perf": ("reducescatter", lambda n: (n - 1) / n, True, False),
    "all_gather_perf": ("allgather", lambda n: (n - 1) / n, True, True),
    "alltoall_perf": ("alltoall", lambda n: (n - 1) / n, False, False),
    "sendrecv_perf": ("sendrecv", lambda n: 1.0, False, False),
}


def check_rows(tool, output, data, nranks):
    """The table's and JSON's shared properties; returns the JSON rows."""
    name, factor, in_place, agree = TOOLS[tool]
    header, rows = table(output)
    assert header == FIELDS and rows, output
    assert data["tool"] == tool and data["collective"] == name and data["nranks"] == nranks
    placements = ("out-of-place", "in-place") if in_place else ("out-of-place",)
    assert [(r["size"], r["placement"]) for r in data["rows"]] == \
        [(int(f[0]), p) for f in rows for p in placements]
    for fields in rows:
        size, count = int(fields[0]), int(fields[1])
        assert count == size // ELEMENT_SIZE[fields[2]]
        if tool != "sendrecv_perf":
            assert count % nranks == 0
        assert fields[3] == ("sum" if name == "reducescatter" else "none")
        algbw, busbw = float(fields[6]), float(fields[7])
        assert algbw == pytest.approx(size / float(fields[5]) / 1e3, rel=2e-3, abs=0.006)
        assert busbw == pytest.approx(algbw * factor(nranks), abs=0.011)
        assert (fields[9:13] != ["N/A"] * 4) == in_place
        assert (fields[13] == "-") == (not agree)
    return data["rows"]


@pytest.mark.parametrize("nranks", [1, 3])
@pytest.mark.parametrize("tool", TOOLS)
def test_plain_nccl_is_exact(tool, nranks, tmp_path):
    result, data = run_perf(nranks, [*SMALL_SWEEP, "-d", "all"], tmp_path, exe=BIN / tool)
    for r in check_rows(tool, result.stdout, data, nranks):
        assert r["ok"] and not r["compressed"] and r["error"] <= r["bound"], r
        if tool != "reduce_scatter_perf":
            assert r["error"] == 0  # moved, not computed
    assert summary(result.stdout, "Check") == "OK"


def wire_per_byte(tool, count, nranks, bits, bucket):
    """Bytes each rank sends per input byte of a compressed float row (docs/collectives.md):
    every piece quantized once, sent once."""
    n = nranks
    per = count // n
    if tool == "sendrecv_perf":
        return compressed_size(count, bits, bucket) / (4 * count)
    if tool == "all_gather_perf":
        return (n - 1) * compressed_size(per, bits, bucket) / (4 * per)
    return (n - 1) * compressed_size(per, bits, bucket) / (4 * count)


@pytest.mark.parametrize("tool", TOOLS)
def test_quantized_rows(tool, tmp_path):
    nranks, bucket = 4, 128
    name = TOOLS[tool][0]
    bits = 8 if name == "allgather" else 4
    flags = ["--collectives", name, f"--{name}-bits", str(bits), "--min-bytes", "0",
             "--algo", "rule"]  # every row quantized (measured auto: test_perf.py)
    result, data = run_perf(nranks, SMALL_SWEEP, tmp_path, exe=BIN / tool, qnccl=flags)
    assert data["qnccl"]["bits"] == bits and f"bits={bits} bucket=128" in result.stdout
    for r in check_rows(tool, result.stdout, data, nranks):
        assert r["ok"] and r["compressed"], r
        assert 1e-4 < r["error"] <= r["bound"] < 1, r  # quantized, within QNCCL's bound
        assert r["algo"] == ("auto" if name == "reducescatter" else "direct")  # the rule's
        assert r["wire_bytes_per_input_byte"] == pytest.approx(
            wire_per_byte(tool, r["count"], nranks, bits, bucket), rel=1e-6)
    assert summary(result.stdout, "Check") == "OK"


def test_outside_the_policy_the_collective_is_exact(tmp_path):
    """QNCCL preloaded but the collective not in QNCCL_COLLECTIVES: NCCL's own call."""
    result, data = run_perf(3, SMALL_SWEEP, tmp_path, exe=BIN / "all_gather_perf",
                            qnccl=["--collectives", "allreduce"])
    assert "this collective is not quantized" in result.stdout and data["qnccl"] is None
    for r in check_rows("all_gather_perf", result.stdout, data, 3):
        assert r["ok"] and not r["compressed"] and r["error"] == 0


@pytest.mark.parametrize("tool, args, message", [
    ("all_gather_perf", ["-o", "sum"], "-o/--op: all_gather_perf reduces nothing"),
    ("sendrecv_perf", ["-o", "max"], "-o/--op: sendrecv_perf reduces nothing"),
    ("alltoall_perf", ["--placement", "in-place"],
     "--placement in-place: alltoall_perf has no in-place form"),
    ("reduce_scatter_perf", ["-o", "xor"], "-o/--op: unknown op 'xor'"),
])
def test_bad_options(tool, args, message):
    result = mpi.run(2, [str(BIN / tool), *args], timeout=60,
                     env={"LD_LIBRARY_PATH": str(HOST_NCCL.parent)}, check=False)
    assert result.returncode == 2, result.stdout
    assert result.stdout.count(message) == 1, result.stdout
