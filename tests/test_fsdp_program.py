"""A plain NCCL program (programs/fsdp_step.c: no QNCCL header) issuing FSDP's step (allgather
the parameters, reduce-scatter the gradients, update the shard) and PyTorch's all-to-all of
embeddings (grouped ncclSend/ncclRecv), run under `qnccl run` with a policy, on QNCCL's host
backend: every output is what qnccl.emulate computes from the bytes the program wrote, step
after step (the collectives share one call counter, the sends count their own); without the
policy every output is the real NCCL's, exact."""
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mpi
from mpi import HOST_NCCL, REPO
from qnccl import emulate
from test_allreduce import built  # noqa: F401  (fails the module without a build)

SOURCE = REPO / "tests" / "programs" / "fsdp_step.c"
SHARD, EMB, STEPS, LR = 50000, 20000, 3, np.float32(0.25)
POLICY = ["--collectives", "allgather,reducescatter,sendrecv", "--allgather-bits", "8",
          "--reducescatter-bits", "4", "--sendrecv-bits", "3", "--min-bytes", "16K"]


def compile_program(build, *flags):
    """programs/fsdp_step.c built against QNCCL's nccl.h (its ABI header) and the host backend,
    with `flags` (-DFSDP_DEVICE and the CUDA runtime's: test_simdev_engine.py)."""
    mpicc = shutil.which("mpicc") or pytest.fail("mpicc not found: run `make setup`")
    (build / "include").mkdir()
    (build / "include" / "nccl.h").write_text(
        f'#include "{REPO / "src" / "include" / "nccl_abi.h"}"\n')
    exe = build / "fsdp_step"
    compiled = subprocess.run([mpicc, "-std=c11", "-O2", "-ffp-contract=off", "-Wall", "-Wextra",
                               "-Werror", f"-I{build / 'include'}", str(SOURCE), "-o", str(exe),
                               f"-L{HOST_NCCL.parent}", "-lnccl", *flags], capture_output=True,
                              text=True)
    if compiled.returncode != 0:
        pytest.fail(f"compiling {SOURCE.name} failed:\n{compiled.stderr}")
    return exe


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return compile_program(tmp_path_factory.mktemp("fsdp"))


def run(program, outdir, nranks, flags, env=None):
    argv = [str(program), str(outdir), str(STEPS)]
    if flags is not None:
        # auto's fixed rules, which the emulator follows (measured auto: test_tuning.py)
        argv = [sys.executable, "-m", "qnccl", "run", "--algo", "rule", *flags, "--", *argv]
    mpi.run(nranks, argv, timeout=300, env=env or {"LD_LIBRARY_PATH": str(HOST_NCCL.parent)})

    def load(step, what, dtype):
        return [np.fromfile(outdir / f"s{step}.{what}.r{r}", dtype) for r in range(nranks)]
    return load


def same(got, want, what):
    for r, (g, w) in enumerate(zip(got, want)):
        differ = np.flatnonzero(g.view(np.uint8) != w.view(np.uint8))
        assert differ.size == 0, f"{what}, rank {r}: {differ.size} bytes differ"


@pytest.mark.parametrize("nranks", [2, 4])
def test_quantized_step_matches_the_emulator(program, tmp_path, nranks):
    check_quantized_step(program, tmp_path, nranks)


def check_quantized_step(program, tmp_path, nranks, env=None):
    """The program under POLICY: every step's outputs are the emulator's."""
    load = run(program, tmp_path, nranks, POLICY, env)
    kw = dict(bucket_size=128, rounding="stochastic", seed=0)
    for step in range(STEPS):
        shards = load(step, "shard", np.float32)
        params = load(step, "params", np.float32)
        same(params, emulate.allgather(shards, bits=8, call=2 * step, **kw), f"step {step} params")
        grads = load(step, "grads", np.float32)
        grad_shards = load(step, "grad_shard", np.float32)
        same(grad_shards, emulate.reduce_scatter(grads, bits=4, op="avg", call=2 * step + 1, **kw),
             f"step {step} gradients")
        if step + 1 < STEPS:  # the program's own float32 update
            same(load(step + 1, "shard", np.float32), [s - LR * g for s, g in
                                                       zip(shards, grad_shards)],
                 f"step {step} update")
        embeddings = load(step, "emb_in", np.uint16)
        same(load(step, "emb_out", np.uint16),
             emulate.alltoall(embeddings, bits=3, call=emulate.P2P_CALL | step, dtype="bfloat16",
                              **kw), f"step {step} embeddings")


def test_without_the_policy_everything_is_exact(program, tmp_path):
    nranks = 3
    load = run(program, tmp_path, nranks, [])  # qnccl run, default policy: allreduce only
    for step in range(STEPS):
        shards = load(step, "shard", np.float32)
        same(load(step, "params", np.float32), [np.concatenate(shards)] * nranks, "params")
        grads = np.stack(load(step, "grads", np.float32)).reshape(nranks, nranks, SHARD)
        mean = grads.astype(np.float64).sum(axis=0) / nranks
        for r, g in enumerate(load(step, "grad_shard", np.float32)):
            np.testing.assert_allclose(g, mean[r], rtol=0, atol=4 * 2.0**-24 * 2)
        sent = np.stack(load(step, "emb_in", np.uint16)).reshape(nranks, nranks, EMB)
        same(load(step, "emb_out", np.uint16),
             [sent[:, r].reshape(-1) for r in range(nranks)], "embeddings")
