"""Running test programs as real MPI jobs.

Every multi-process test goes through run(): it starts `mpirun` in a process
group of its own and, past the timeout, kills the whole group and fails with
a message that says which job hung. Ranks are oversubscribed on these 2-core
machines, so MPI is told to yield the CPU while it waits.
"""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from qnccl.bench.jobs import MPI_ENV as BENCH_MPI_ENV, MPI_SHARED_MEMORY_ENV

REPO = Path(__file__).resolve().parents[1]
# The build the tests run against, and what every rank preloads first: `make
# sanitize` (scripts/sanitize.sh) points them at a sanitized build and its
# sanitizer runtime; by default `make`'s build, nothing preloaded.
BUILD = Path(os.environ.get("QNCCL_TEST_BUILD") or REPO / "build")
RANK_PRELOAD = os.environ.get("QNCCL_TEST_RANK_PRELOAD", "")
HOST_NCCL = BUILD / "host" / "libnccl.so.2"
# The libqnccl.so the ranks preload: the one the Python side opens (QNCCL_LIB, which `make
# sanitize` points at the AddressSanitizer build's library on the simulated GPU), else the
# build's.
LIBQNCCL = Path(os.environ.get("QNCCL_LIB") or BUILD / "lib" / "libqnccl.so")

# Open MPI as root in a container, more ranks than cores, no busy waiting,
# shared memory between the ranks of this machine.
MPI_ENV = {**BENCH_MPI_ENV, **MPI_SHARED_MEMORY_ENV, "PYTHONUNBUFFERED": "1"}


def mpirun():
    path = shutil.which("mpirun")
    if path is None:
        pytest.fail("mpirun not found: run `make setup` (installs Open MPI)")
    return path


def joined(out, err):
    """A job's stdout, then its stderr, each on lines of its own."""
    return out + ("\n" if out and err and not out.endswith("\n") else "") + err


def excerpt(out, tail=4000):
    """What a job said that a failure report needs: its FAIL and SUMMARY lines (the checks
    that failed, wherever they are in a long output), then the output's last `tail`
    characters."""
    key = [line for line in out.splitlines() if line.startswith(("FAIL", "SUMMARY"))]
    if not key:
        return out[-tail:]
    more = f"\n... and {len(key) - 40} more" if len(key) > 40 else ""
    return "\n".join(key[:40]) + more + f"\n--- the output's last {tail} characters ---\n" + \
        out[-tail:]


def run(nprocs, argv, timeout, env=None, check=True, cwd=None, launcher=()):
    """Runs `argv` as an MPI job of `nprocs` ranks; returns the CompletedProcess. `launcher`
    comes before mpirun (e.g. `qnccl run ... --`, which execs it), `cwd` is the job's folder.

    A job that outlives `timeout` seconds is killed with its whole process
    group and the test fails saying so. With `check`, a non-zero exit fails
    the test with the job's output."""
    preload = ["-x", f"LD_PRELOAD={RANK_PRELOAD}"] if RANK_PRELOAD else []
    cmd = [*launcher, mpirun(), "-np", str(nprocs), *preload, *argv]
    job_env = dict(os.environ, **MPI_ENV, **(env or {}))
    if RANK_PRELOAD:  # the ranks preload it (-x), mpirun itself does not
        job_env.pop("LD_PRELOAD", None)
    # stdout, then stderr: mpirun forwards the ranks' two streams separately, so
    # one pipe for both could splice a line of one into a line of the other.
    proc = subprocess.Popen(cmd, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = joined(*proc.communicate())
        pytest.fail(f"MPI job hung: {nprocs} ranks of {' '.join(map(str, argv))} ran past "
                    f"{timeout} s and were killed. Output:\n{excerpt(out)}")
    out = joined(out, err)
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    if check and proc.returncode != 0:
        pytest.fail(f"MPI job failed (exit {proc.returncode}): {nprocs} ranks of "
                    f"{' '.join(map(str, argv))}. Output:\n{excerpt(out)}")
    return result


def run_python(nprocs, script, *args, timeout=120, env=None, check=True):
    """Runs a Python test program under mpirun with this interpreter."""
    return run(nprocs, [sys.executable, str(script), *map(str, args)], timeout, env, check)


def run_checks(nprocs, script, *args, timeout=120, env=None):
    """Runs a checking program (one that prints a line per failure, then
    `SUMMARY ... N failures`) and asserts it ended with 0 failures; its stdout."""
    result = run_python(nprocs, script, *args, timeout=timeout, env=env)
    summary = [line for line in result.stdout.splitlines() if line.startswith("SUMMARY")]
    assert summary and summary[-1].endswith(" 0 failures"), excerpt(result.stdout)
    return result.stdout
