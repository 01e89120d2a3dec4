"""The hierarchical allreduce on emulated nodes (perf/netlab --nodes, docs/netlab.md):
each node a network namespace with its own host name, ranks of one node on shared
memory, nodes on a rate-limited link. Every rank's output is bit-identical to every
other rank's and to qnccl.emulate.allreduce(..., nodes=) for every case of
mpi_programs/allreduce_check.py's and error_feedback_check.py's `hier` programs (all
dtypes, sum/avg, in and out of place, exact and quantized intra stage, inter ring,
tree, SRA and auto; with and without error feedback); on a layout whose nodes hold
different numbers of ranks, auto runs flat and an explicit hier is refused alike on
every rank."""
import re
import sys
from pathlib import Path

import pytest

import mpi
from mpi import MPI_ENV
from test_netlab import clean_env, namespaces, needs_netns, netlab

PROGRAMS = Path(__file__).resolve().parent / "mpi_programs"


def run_on_nodes(nodes, ranks, program, name, timeout):
    env = clean_env(**{k: v for k, v in MPI_ENV.items() if not k.startswith("OMPI_MCA_btl")})
    result, ns = netlab("--nodes", str(nodes), "--rate", "10gbit", "--", mpi.mpirun(), "-np",
                        str(ranks), sys.executable, str(PROGRAMS / program), name, env=env,
                        timeout=timeout)
    assert not {n for n in namespaces() if n.startswith(ns)}, "namespaces left behind"
    summary = [line for line in result.stdout.splitlines() if line.startswith("SUMMARY")]
    assert result.returncode == 0 and summary and summary[-1].endswith(" 0 failures"), (
        f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
    return result.stdout


@needs_netns
@pytest.mark.parametrize("nodes, ranks", [(2, 4), (2, 6), (2, 3)])
def test_hierarchical_matches_the_emulator(nodes, ranks):
    out = run_on_nodes(nodes, ranks, "allreduce_check.py", "hier", timeout=400)
    per_node = -(-ranks // nodes)
    layout = [f"netlab-node{r // per_node}" for r in range(ranks)]
    assert f"layout: {layout}" in out


def test_hierarchical_on_host_ids_matches_the_emulator():
    """The same program on one host, its 4 ranks made 2 nodes by NCCL_HOSTID (all
    on shared memory): the layout comes from the variable as from host names.
    Needs no namespaces, so `make sanitize` runs it under ThreadSanitizer: the
    lanes of pipelined segments, nested in the lock-step of a group's calls."""
    out = mpi.run(4, [sys.executable, str(PROGRAMS / "allreduce_check.py"), "hier",
                      "--ranks-per-node", "2"], timeout=900).stdout
    assert "layout: ['node0', 'node0', 'node1', 'node1']" in out
    assert re.search(r"SUMMARY hier: 4 ranks, \d+ cases, 0 failures", out), out[-6000:]


def test_hierarchical_on_one_node_runs_exact():
    """All 4 ranks on one node (NCCL_HOSTID): an explicit hierarchical call, alone or in a
    group, with or without error feedback, crosses no node link and is the real library's
    exact allreduce (docs/allreduce.md, "Where nothing crosses a link")."""
    out = mpi.run(4, [sys.executable, str(PROGRAMS / "allreduce_check.py"), "hier",
                      "--ranks-per-node", "4"], timeout=300).stdout
    assert "layout: ['node0', 'node0', 'node0', 'node0']" in out
    assert re.search(r"SUMMARY hier: 4 ranks, 6 cases, 0 failures", out), out[-6000:]


@needs_netns
@pytest.mark.parametrize("nodes, ranks", [(2, 4), (2, 6)])
def test_hierarchical_error_feedback_matches_the_emulator(nodes, ranks):
    run_on_nodes(nodes, ranks, "error_feedback_check.py", "hier", timeout=400)
