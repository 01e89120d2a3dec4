"""perf/accuracy_bench.py: the training-accuracy benchmark (docs/accuracy.md).

Unit checks of its pieces (the DLRM's per-rank gradients, the teacher's data, the options) and
a `--quick` run per model end to end, whose JSON must hold every configuration it ran, a
baseline that learned, small 8-bit deltas, a gradient error that grows as the bits shrink, and
(DLRM) a DDP job whose replicas stayed identical. The two runs split the work between them (the
allreduce of a run is the same code whatever the model and the rank count): the DLRM runs every
allreduce configuration, the language model the SRA ones, both at 8 ranks (32 adds a fifth of
the DLRM run's time and nothing the rank gradients' own test at 32 does not check). The language
model's own pieces: tests/test_accuracy_lm.py."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from mpi import REPO

torch = pytest.importorskip("torch")
sys.path.insert(0, str(REPO / "perf"))
import accuracy_bench as bench  # noqa: E402
import accuracy_model as am  # noqa: E402

SCRIPT = REPO / "perf" / "accuracy_bench.py"
QUICK_TIMEOUT = 600  # s; the quick runs take about 85 s (DLRM) and 40 s (LM) on 2 idle cores
LM_ALGOS = ("sra",)  # the LM quick run's allreduce algorithms (the DLRM's: all of bench.ALGOS)


def small_batch(n=64, seed=3):
    teacher = am.Teacher(am.Shape())
    return am.make_data(teacher, n, stream=seed)


def head_and_table_grads(model):
    head = torch.cat([p.grad.reshape(-1) for p in model.head.parameters()])
    return head, [t.weight.grad.clone() for t in model.emb]


@pytest.mark.parametrize("nranks", [1, 8, 32])
def test_exact_average_of_rank_gradients_is_the_full_batch_gradient(nranks):
    data = small_batch()
    torch.manual_seed(0)
    model = am.DLRM(am.Shape())
    am.loss_fn(model(data.dense, data.cats), data.labels).backward()
    full_head, full_tables = head_and_table_grads(model)
    model.zero_grad(set_to_none=True)

    grads = am.rank_gradients(model, data.dense, data.cats, data.labels, nranks)
    assert grads.shape == (nranks, full_head.numel())
    torch.testing.assert_close(grads.sum(0) / nranks, full_head, rtol=1e-5, atol=1e-7)
    for table, full in zip(model.emb, full_tables):
        torch.testing.assert_close(table.weight.grad, full, rtol=1e-5, atol=1e-7)


def test_each_rank_gradient_is_its_own_micro_batch():
    data = small_batch()
    torch.manual_seed(0)
    model = am.DLRM(am.Shape())
    grads = am.rank_gradients(model, data.dense, data.cats, data.labels, 8)
    for rank in (0, 5):
        model.zero_grad(set_to_none=True)
        part = slice(rank * 8, rank * 8 + 8)
        am.loss_fn(model(data.dense[part], data.cats[part]), data.labels[part]).backward()
        head, _ = head_and_table_grads(model)
        torch.testing.assert_close(grads[rank], head, rtol=1e-5, atol=1e-7)


def test_batch_must_split_evenly():
    data = small_batch(60)
    with pytest.raises(ValueError, match="not a multiple of 8 ranks"):
        am.rank_gradients(am.DLRM(am.Shape()), data.dense, data.cats, data.labels, 8)


def test_teacher_labels_have_signal_and_noise():
    """The task: a learnable signal (Bayes accuracy well above the majority class) with
    Criteo-like label noise, the same whatever the training seed."""
    torch.manual_seed(123)
    first = am.make_data(am.Teacher(am.Shape()), 20000, stream=2)
    torch.manual_seed(456)
    second = am.make_data(am.Teacher(am.Shape()), 20000, stream=2)
    assert torch.equal(first.labels, second.labels)
    bayes_acc, _ = am.bayes(first)
    clicks = float(first.labels.mean())
    assert 0.15 < clicks < 0.4
    assert max(clicks, 1 - clicks) + 0.03 < bayes_acc < 0.9
    # Zipf-like categorical ids: the most frequent id of the largest table is far above uniform
    counts = torch.bincount(first.cats[:, 0])
    assert counts.max() > 20 * len(first) / am.Shape().tables[0]


@pytest.mark.parametrize("argv, allowed", [
    (["--bits", "9"], "8, 7, 6, 5, 4, 3, 2, 1"),
    (["--rotation", "100"], "powers of two in [2, 16384]"),
    (["--algos", "ring,butterfly"], "ring, tree, sra"),
    (["--ranks", "7"], "4, 8, 16, 32, 64"),
    (["--seeds", "0"], "an integer >= 1"),
    (["--optimizer", "lion"], "'adam', 'sgd'"),
    (["--rounding", "up"], "'auto', 'nearest', 'stochastic'"),
    (["--alltoall", "9/4"], "FWD/BWD bits (1..8 each)"),
    (["--alltoall", "4"], "FWD/BWD bits (1..8 each)"),
    (["--model", "gpt"], "dlrm, lm"),
])
def test_bad_options_exit_2_naming_the_allowed_values(argv, allowed):
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert argv[0] in proc.stderr and allowed in proc.stderr, proc.stderr


def test_table_has_one_row_per_configuration():
    args = bench.parse_args(["--quick", "--model", "dlrm", "--bits", "4", "--algos", "sra",
                             "--ranks", "8", "--alltoall", "4/2"])
    assert [bench.config_name(c) for c in bench.configurations(args)] == [
        "uint4 sra", "uint4 sra EF"]
    assert [bench.config_name(c) for c in bench.alltoall_configurations(args)] == [
        "alltoall fwd uint4 bwd uint2"]
    # full batch, fp32 N=8, 2 allreduce configurations, 1 all-to-all configuration
    assert len(bench.jobs(args)) == args.seeds * (1 + 1 + 2 + 1)
    args = bench.parse_args(["--quick", "--ranks", "32", "--alltoall", "none"])
    assert not any(j["nranks"] == 8 for j in bench.jobs(args))
    # both models (the default): the LM has no all-to-all; the same runs per N for each
    args = bench.parse_args(["--bits", "4", "--algos", "sra", "--ranks", "8,32"])
    per_model = {m: [j for j in bench.jobs(args) if j["model"] == m] for m in ("dlrm", "lm")}
    assert len(per_model["lm"]) == args.seeds * (1 + 2 * (1 + 2))
    assert len(per_model["dlrm"]) == len(per_model["lm"]) + args.seeds * len(bench.ALLTOALL_BITS)
    assert args.sizes == {"dlrm": bench.FULL["dlrm"], "lm": bench.FULL["lm"]}


def test_auto_rounding_is_nearest_with_error_feedback_and_stochastic_without():
    auto = {"rounding": "auto"}
    args = bench.parse_args(["--bits", "4", "--algos", "ring,sra"])
    for c in bench.configurations(args):
        expected = "nearest" if c["error_feedback"] else "stochastic"
        assert bench.rounding_of(c, auto) == expected, c
    for c in bench.alltoall_configurations(args):  # no feedback on the all-to-alls
        assert bench.rounding_of(c, auto) == "stochastic"
    assert bench.rounding_of(bench.DDP_CONFIG, auto) == "stochastic"
    for chosen in ("nearest", "stochastic"):
        assert {bench.rounding_of(c, {"rounding": chosen})
                for c in bench.configurations(args)} == {chosen}


def test_embedding_alltoall_routes_every_chunk_to_its_owner():
    """Forward: rank k receives owner j's vectors for its micro-batch, backward: owner j its
    table's gradients from rank k; both are the identity on the N x micro x tables x dim
    layout up to one quantization (within the codec's widest cell), exact where k == j, and the
    same bytes as qnccl.emulate.alltoall (call 0 forward, 1 backward)."""
    from qnccl import emulate
    n, micro, dim = 8, 16, 16
    rng = np.random.default_rng(5)
    values = torch.from_numpy(rng.uniform(-1, 1, (n, micro, n, dim)).astype(np.float32))
    a2a = bench.EmbeddingAlltoall(n, 4, 8, bucket_size=128, rounding="stochastic", seed=3)
    fwd = a2a.forward(values)
    bwd = a2a.backward(values)
    for got, bits in ((fwd, 4), (bwd, 8)):
        error = (got - values).abs()
        # stochastic rounding errs by less than a cell: for values in [-1, 1] a cubic grid's
        # widest is below 3 (max - min) / (L - 1) <= 6 / (L - 1) (docs/wire-format.md)
        assert error.max() <= 6 / (2**bits - 2) + 1e-6, bits
        for k in range(n):
            assert torch.equal(got[k, :, k, :], values[k, :, k, :])
        assert error.max() > 0
    inputs = [values[:, :, j, :].reshape(-1).numpy() for j in range(n)]  # owner j's sends
    want = emulate.alltoall(inputs, bits=4, bucket_size=128, seed=3, call=0)
    for k in range(n):
        assert np.array_equal(fwd[k].permute(1, 0, 2).reshape(-1).numpy(), want[k])


def test_identity_alltoall_changes_no_gradient():
    """rank_gradients with an all-to-all that changes nothing is rank_gradients without one."""
    class Identity:
        def forward(self, v):
            return v.clone()

        def backward(self, g):
            return g.clone()
    torch.manual_seed(0)
    model = am.DLRM(am.Shape())
    data = am.make_data(am.Teacher(am.Shape()), 256, stream=1)
    plain = am.rank_gradients(model, data.dense, data.cats, data.labels, 8)
    plain_emb = [t.weight.grad.clone() for t in model.emb]
    model.zero_grad()
    routed = am.rank_gradients(model, data.dense, data.cats, data.labels, 8, Identity())
    assert torch.equal(plain, routed)
    for a, t in zip(plain_emb, model.emb):
        assert torch.equal(a, t.weight.grad)


# ------------------------------------------------------------------------- the quick runs

def run_quick(out, *argv):
    """accuracy_bench --quick with `argv` into `out`: (its JSON report, its output)."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--quick", "--out", str(out), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=QUICK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers and the MPI job too
        log, _ = proc.communicate()
        pytest.fail(f"accuracy_bench --quick {' '.join(argv)} ran past {QUICK_TIMEOUT} s and "
                    f"was killed. Output:\n{log[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"accuracy_bench --quick {' '.join(argv)} failed (exit "
                    f"{proc.returncode}). Output:\n{log[-6000:]}")
    return json.loads((out / "results.json").read_text()), log


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The DLRM model: every allreduce configuration and Table 2 at 8 ranks, the DDP job."""
    out = tmp_path_factory.mktemp("accuracy")
    return (out, *run_quick(out, "--model", "dlrm", "--ranks", "8"))


@pytest.fixture(scope="module")
def quick_lm(tmp_path_factory):
    """The language model: the SRA configurations at 8 ranks (ring and tree run the same code
    on any model's gradients, exercised by the DLRM run), and the 4-bit ones' per-layer
    adaptive twins."""
    out = tmp_path_factory.mktemp("accuracy_lm")
    return (out, *run_quick(out, "--model", "lm", "--ranks", "8", "--algos", ",".join(LM_ALGOS),
                            "--adaptive"))


def names(algos=bench.ALGOS):
    return [f"uint{bits} {algo}{ef}" for bits in (8, 4, 2) for algo in algos
            for ef in ("", " EF")]


def test_quick_run_has_every_configuration(quick):
    _, report, log = quick
    runs = {(r["model"], r["name"], r["nranks"], r["seed"]) for r in report["runs"]}
    for name in names():
        assert ("dlrm", name, 8, 0) in runs, name
        assert f"| {name} |" in log
    assert {("dlrm", "fp32", n, 0) for n in (1, 8)} <= runs
    for fwd, bwd in bench.ALLTOALL_BITS:
        assert ("dlrm", f"alltoall fwd uint{fwd} bwd uint{bwd}", 8, 0) in runs
        assert f"| uint{fwd} | uint{bwd} |" in log
    assert len(report["summary"]) == (1 + 18) + len(bench.ALLTOALL_BITS)
    for r in report["runs"]:  # the default rounding, auto, per configuration
        if r["config"] is not None:
            assert r["rounding"] == bench.rounding_of(r["config"], {"rounding": "auto"}), r["name"]


def test_quick_baseline_learned(quick):
    _, report, _ = quick
    data = report["data"]["dlrm"]
    for run in report["runs"]:
        if run["name"] == "fp32":
            assert run["metrics"]["acc"] > data["majority_rate"] + 0.002, run
            assert run["metrics"]["loss"] < data["label_entropy"] - 0.01, run
            assert run["metrics"]["loss"] > data["bayes_loss"]
            first, last = run["curve"][0], run["curve"][-1]
            assert last["loss"] < first["loss"] - 0.01


def rows(report):
    return {(r["name"], r["nranks"]): r for r in report["summary"]}


def assert_deltas_order_by_bits(report, ranks, algos=bench.ALGOS):
    """8 bits barely moves any metric; the gradient error grows as the bits shrink; exact
    averaging differs from the full-batch gradient by float rounding only."""
    table = rows(report)
    for n in ranks:
        fp32 = table[("fp32", n)]
        assert all(abs(d["mean"]) < 0.05 for d in fp32["d"].values()), fp32
        for algo in algos:
            for ef in ("", " EF"):
                q = {b: table[(f"uint{b} {algo}{ef}", n)] for b in (8, 4, 2)}
                assert all(abs(d["mean"]) < 0.5 for d in q[8]["d"].values()), q[8]
                assert (q[8]["grad_rel_error"] < q[4]["grad_rel_error"]
                        < q[2]["grad_rel_error"]), (algo, ef, n)


def test_quick_deltas_order_by_bits(quick):
    assert_deltas_order_by_bits(quick[1], (8,))


def test_quick_alltoall_8_bits_barely_moves_the_result(quick):
    """Table 2: 8-bit forward and backward all-to-alls stay near full precision; 2-bit ones
    move the result more than 8-bit ones."""
    _, report, _ = quick
    table = rows(report)
    eight = table[("alltoall fwd uint8 bwd uint8", 8)]["d"]
    two = table[("alltoall fwd uint2 bwd uint2", 8)]["d"]
    assert abs(eight["loss"]["mean"]) < 0.5 and abs(eight["acc"]["mean"]) < 0.5
    assert abs(two["loss"]["mean"]) > abs(eight["loss"]["mean"])


def test_quick_ddp_replicas_in_sync(quick):
    _, report, _ = quick
    ddp = report["ddp"]
    assert ddp["ranks"] == 4 and ddp["in_sync"]
    plain, hook = ddp["runs"]["plain"], ddp["runs"]["sra4"]
    assert plain["in_sync"] and hook["in_sync"]
    assert len(hook["curve"]) == bench.EVALS + 1
    # the hook run trains: its loss is near plain DDP's and far below the label entropy
    assert abs(hook["test_loss"] - plain["test_loss"]) < 0.02 * plain["test_loss"]
    assert hook["test_loss"] < report["data"]["dlrm"]["label_entropy"] - 0.01


def test_quick_writes_its_files(quick):
    out, _, _ = quick
    png = (out / "dlrm_loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    assert "| allreduce |" in (out / "table.md").read_text()


def test_quick_lm_has_every_configuration(quick_lm):
    out, report, log = quick_lm
    assert report["settings"]["models"] == ["lm"] and report["ddp"] is None
    runs = {(r["model"], r["name"], r["nranks"]) for r in report["runs"]}
    adaptive = [f"uint4 {algo}{ef} adaptive" for algo in LM_ALGOS for ef in ("", " EF")]
    assert runs == ({("lm", name, 8) for name in ["fp32", *names(LM_ALGOS), *adaptive]}
                    | {("lm", "fp32", 1)})
    for name in names(LM_ALGOS) + adaptive:
        assert f"| {name} |" in log
    assert "| allreduce | δ val. loss N=8 | δ perplexity N=8 |" in log
    png = (out / "lm_loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000


def test_quick_lm_baseline_learned(quick_lm):
    """The full-precision LM ends far below the uniform guess and, as any model must, above
    the source's own loss; its perplexity is exp(loss)."""
    _, report, _ = quick_lm
    data = report["data"]["lm"]
    assert data["bayes_loss"] < data["bigram_loss"] < data["uniform_loss"]
    for run in report["runs"]:
        if run["name"] == "fp32":
            loss = run["metrics"]["loss"]
            assert data["bayes_loss"] < loss < data["uniform_loss"] - 0.5, run
            assert run["metrics"]["ppl"] == pytest.approx(np.exp(loss), rel=1e-9)
            assert run["curve"][-1]["loss"] < run["curve"][0]["loss"] - 0.5


def test_quick_lm_deltas_order_by_bits(quick_lm):
    assert_deltas_order_by_bits(quick_lm[1], (8,), algos=LM_ALGOS)


def test_quick_lm_4bit_sra_within_one_percent(quick_lm):
    """The transformer's criterion (docs/accuracy.md): 4-bit SRA ends within 1% of full
    precision's validation loss."""
    d = rows(quick_lm[1])[("uint4 sra", 8)]["d"]["loss"]["mean"]
    assert abs(d) < 1.0, d


def test_quick_lm_adaptive_bits_cut_the_error_at_no_more_bytes(quick_lm):
    """Per-layer widths (L-GreCo's knapsack at uniform 4 bits' bytes): never more bytes, a
    smaller gradient error than uniform 4 bits with and without error feedback, widths that
    differ between layers, and the table says where they went."""
    _, report, log = quick_lm
    table = rows(report)
    for algo in LM_ALGOS:
        for ef in ("", " EF"):
            uniform = table[(f"uint4 {algo}{ef}", 8)]
            adaptive = table[(f"uint4 {algo}{ef} adaptive", 8)]
            assert adaptive["wire_ratio"] <= 1.0, adaptive
            assert adaptive["grad_rel_error"] < uniform["grad_rel_error"], (algo, ef)
    run = next(r for r in report["runs"] if "adaptive" in r)
    assert run["adaptive"]["decisions"] == bench.ADAPTIVE_DECISIONS
    assert len(set(run["adaptive"]["assignment"].values())) > 1
    assert "adaptive: wire bytes per uniform bytes" in log
