"""perf/netlab (docs/netlab.md): a command in a network namespace whose only
link is a loopback rate-limited with tc, or (--nodes K) an MPI job on K
emulated nodes. Checked here: what CMD sees inside (interfaces, qdisc,
environment), exit statuses, cleanup of the namespaces and their processes on
every exit path, that a real MPI job's traffic goes through the shaper, where
the ranks of a multi-node job land and which traffic crosses the uplinks, the
unprivileged fallback and flag errors. No timing is asserted: the goodput the
shaper delivers is measured by hand (docs/netlab.md)."""
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import mpi
from mpi import MPI_ENV, REPO

NETLAB = REPO / "perf" / "netlab"
TIMEOUT_S = 30


def communicate(proc, what, timeout=TIMEOUT_S):
    """Waits for `proc` (started in a session of its own); past `timeout`
    SIGTERMs its process group (so netlab can delete its namespace), then
    SIGKILLs it, and fails the test saying which command hung."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{what} ran past {timeout} s and was killed.\nstdout:\n{out[-3000:]}\n"
                    f"stderr:\n{err[-3000:]}")


def default_signals():
    """In the child before exec: SIGINT, SIGTERM and SIGHUP at their default action. A shell
    cannot trap a signal it was started with ignored (POSIX), and `nohup make test`, or a
    background job of a script (SIGINT), would hand netlab exactly that."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start(args, env=None, prefix=(), cwd=None):
    return subprocess.Popen([*prefix, str(NETLAB), *args], env=env, cwd=cwd, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_signals)


def netlab(*args, env=None, prefix=(), cwd=None, timeout=TIMEOUT_S):
    """Runs perf/netlab with `args`; returns (CompletedProcess, namespace name)."""
    proc = start(args, env, prefix, cwd)
    out, err = communicate(proc, f"perf/netlab {' '.join(args)}", timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), ns_of(proc)


def first_lines(proc, n, what):
    """The first `n` lines of proc's stdout, read straight from the pipe (a buffered readline
    after select can take both lines at once and leave select waiting for data already read);
    fails if they do not come within TIMEOUT_S or the output ends first."""
    fd, data = proc.stdout.fileno(), b""
    deadline = time.monotonic() + TIMEOUT_S
    while data.count(b"\n") < n:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"{what} within {TIMEOUT_S} s (output so far: {data!r})"
        chunk = os.read(fd, 4096)
        assert chunk, f"{what}: the output ended first ({data!r})"
        data += chunk
    return data.decode().split("\n")[:n]


def ns_of(proc):
    return f"qnccl-netlab-{proc.pid}"  # netlab is exec'd by env: same pid


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def can_make_namespaces():
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    name = f"qnccl-netlab-probe-{os.getpid()}"
    try:
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    if made.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return True


needs_netns = pytest.mark.skipif(not can_make_namespaces(),
                                 reason="needs root and iproute2 (ip netns add failed)")


def tc_rate_bits(text):
    """The rate of the tbf qdisc in `tc qdisc show` output, in bit/s."""
    m = re.search(r"qdisc tbf \S+ root .*?rate (\d+(?:\.\d+)?)([KMGT]?)bit", text)
    assert m, f"no root tbf qdisc in:\n{text}"
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]


INSIDE = "ip -o link; echo ---; tc qdisc show dev lo; echo ---; env -0"

LAB_ENV = {
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "GLOO_SOCKET_IFNAME": "lo",
    "MASTER_ADDR": "127.0.0.1",
}


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in LAB_ENV and not k.startswith("QNCCL_NETLAB")}
    env.update(extra)
    return env


@needs_netns
@pytest.mark.parametrize("rate, bits, mtu", [("100mbit", 100e6, None), ("2.5GBit", 2.5e9, "9000")])
def test_inside_the_lab(rate, bits, mtu):
    args = ["--rate", rate, *(["--mtu", mtu] if mtu else []), "--", "sh", "-c", INSIDE]
    result, ns = netlab(*args, env=clean_env())
    assert result.returncode == 0, result.stderr
    links, qdisc, env_text = result.stdout.split("---\n")
    names = [line.split(":")[1].strip() for line in links.splitlines()]
    assert names == ["lo"], links
    assert re.search(r"<[^>]*\bUP\b[^>]*>", links), f"lo is not up:\n{links}"
    assert f" mtu {mtu or 65536} " in links, links
    assert tc_rate_bits(qdisc) == bits
    env = dict(item.split("=", 1) for item in env_text.split("\0") if "=" in item)
    assert env["QNCCL_NETLAB_RATE"] == rate.lower()
    assert env["QNCCL_NETLAB_NS"] == ns
    for key, value in LAB_ENV.items():
        assert env.get(key) == value, key
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"netlab: namespace {ns}, lo limited to "
                                                   f"{rate.lower()} (tbf "), result.stderr
    assert ns not in namespaces()


@needs_netns
def test_user_settings_are_kept_and_rate_none():
    mine = {"OMPI_MCA_btl": "self,vader,tcp", "MASTER_ADDR": "10.1.2.3", "GLOO_SOCKET_IFNAME": ""}
    result, ns = netlab("--rate", "none", "--", "sh", "-c", INSIDE, env=clean_env(**mine))
    assert result.returncode == 0, result.stderr
    links, qdisc, env_text = result.stdout.split("---\n")
    assert "tbf" not in qdisc, qdisc
    env = dict(item.split("=", 1) for item in env_text.split("\0") if "=" in item)
    assert env["QNCCL_NETLAB_RATE"] == "unthrottled"
    assert env["QNCCL_NETLAB_NS"] == ns
    for key, value in mine.items():
        assert env[key] == value, key  # set by the user, even to "": not overridden
    assert env["OMPI_MCA_pml"] == "ob1"
    assert "not limited" in result.stderr


@needs_netns
@pytest.mark.parametrize("cmd, status", [
    ("exit 0", 0),
    ("exit 3", 3),
    ("kill -KILL $$", 128 + signal.SIGKILL),
    ("kill -TERM $$", 128 + signal.SIGTERM),
])
def test_exit_status_is_cmds(cmd, status):
    result, ns = netlab("--rate", "1gbit", "--", "sh", "-c", cmd)
    assert result.returncode == status, result.stderr
    assert ns not in namespaces()


@needs_netns
def test_processes_left_by_cmd_are_killed():
    result, ns = netlab("--", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!")
    assert result.returncode == 0, result.stderr
    assert not alive(int(result.stdout)), "a process CMD left in the namespace outlived netlab"
    assert ns not in namespaces()


@needs_netns
@pytest.mark.parametrize("sig, to_group", [
    (signal.SIGINT, False),
    (signal.SIGINT, True),  # Ctrl-C: netlab and CMD get it
    (signal.SIGTERM, False),
    (signal.SIGHUP, False),
], ids=["INT", "INT-to-group", "TERM", "HUP"])
def test_signal_to_netlab_cleans_up(sig, to_group):
    proc = start(["--rate", "100mbit", "--", "sh", "-c", "echo $$; exec sleep 60"])
    try:
        line, = first_lines(proc, 1, "CMD did not start")  # CMD runs: the lab is up
        assert line.strip().isdigit(), f"CMD did not start: {line!r}"
        cmd_pid = int(line)
        assert ns_of(proc) in namespaces()
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        out, err = communicate(proc, f"perf/netlab after {sig.name}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -sig, err  # netlab dies of the signal it got
    assert not alive(cmd_pid), f"CMD (pid {cmd_pid}) outlived netlab's {sig.name}"
    assert ns_of(proc) not in namespaces()


MPI_JOB = textwrap.dedent("""\
    import os, re, subprocess
    import numpy as np
    from mpi4py import MPI

    def sent():
        out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", "lo"], capture_output=True,
                             text=True, check=True, timeout=10).stdout
        return int(re.search(r"Sent (\\d+) bytes", out).group(1))

    comm = MPI.COMM_WORLD
    assert comm.size == 2
    n = 1 << 20  # 4 MiB of float32
    comm.Barrier()
    before = sent() if comm.rank == 0 else 0
    x = np.arange(n, dtype=np.float32) * (comm.rank + 1)
    y = np.empty_like(x)
    comm.Allreduce(x, y, op=MPI.SUM)
    assert np.array_equal(y, np.arange(n, dtype=np.float32) * 3)
    other = 1 - comm.rank
    r = np.empty_like(x)
    comm.Sendrecv(x, dest=other, recvbuf=r, source=other)
    assert np.array_equal(r, np.arange(n, dtype=np.float32) * (other + 1))
    comm.Barrier()
    if comm.rank == 0:
        print(f"ns={os.environ['QNCCL_NETLAB_NS']} btl={os.environ['OMPI_MCA_btl']} "
              f"sent_before={before} sent_after={sent()}", flush=True)
    """)


@needs_netns
def test_mpi_traffic_goes_through_the_shaper(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(MPI_JOB)
    env = clean_env(**{k: v for k, v in MPI_ENV.items() if k != "OMPI_MCA_btl"})
    result, ns = netlab("--rate", "1gbit", "--", mpi.mpirun(), "-np", "2", sys.executable,
                        str(script), env=env, timeout=90)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    m = re.search(r"ns=(\S+) btl=(\S+) sent_before=(\d+) sent_after=(\d+)", result.stdout)
    assert m, result.stdout
    assert m.group(1) == ns and m.group(2) == "self,tcp"
    # Allreduce of 4 MiB between 2 ranks moves at least 4 MiB into each rank,
    # Sendrecv 4 MiB each way: 16 MiB at least crossed lo's qdisc.
    grown = int(m.group(4)) - int(m.group(3))
    assert grown >= 16 << 20, f"lo's qdisc saw {grown} bytes of a 16 MiB exchange"
    assert ns not in namespaces()


NODES_JOB = textwrap.dedent("""\
    import os, socket, subprocess, sys
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    peer = int(sys.argv[1])
    def sent():  # bytes node 0's uplink has sent
        out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", "eth0"], capture_output=True,
                             text=True).stdout
        return int(out.split("Sent ")[1].split()[0])
    where = comm.gather((socket.gethostname(), os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]), 0)
    if comm.rank == 0:
        for r, (host, local) in enumerate(where):
            print(f"rank {r} host {host} local {local}", flush=True)
    x = np.full(1 << 20, comm.rank + 1, np.float32)
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    assert y[0] == comm.size * (comm.size + 1) / 2
    comm.Barrier()
    before = sent() if comm.rank == 0 else 0
    buf = np.zeros(8 << 20, np.uint8)
    if comm.rank == 0:
        comm.Send(buf, peer)
    elif comm.rank == peer:
        comm.Recv(buf, 0)
    comm.Barrier()
    if comm.rank == 0:
        print(f"uplink_sent={sent() - before}", flush=True)
    """)


@needs_netns
@pytest.mark.parametrize("nodes, ranks", [(2, 4), (2, 6), (2, 3)])
def test_nodes_place_ranks_block_wise(tmp_path, nodes, ranks):
    """Ranks land ceil(N/K) per node, in order, each node with its own host name
    and local ranks (2 x 2, 2 x 3, and 3 ranks on 2 nodes: uneven); an
    Allreduce over all of them is right; 8 MiB from rank 0 to a rank on another
    node crosses node 0's uplink shaper, to a rank of its own node it does not
    (shared memory)."""
    script = tmp_path / "job.py"
    script.write_text(NODES_JOB)
    per_node = -(-ranks // nodes)
    env = clean_env(**{k: v for k, v in MPI_ENV.items() if not k.startswith("OMPI_MCA_btl")})
    for peer, crosses in ((per_node, True), (1, False)):
        result, ns = netlab("--nodes", str(nodes), "--rate", "1gbit", "--", mpi.mpirun(), "-np",
                            str(ranks), sys.executable, str(script), str(peer), env=env,
                            timeout=120)
        assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        placed = {int(r): (h, int(l)) for r, h, l in
                  re.findall(r"^rank (\d+) host (\S+) local (\d+)$", result.stdout, re.M)}
        assert placed == {r: (f"netlab-node{r // per_node}", r % per_node) for r in range(ranks)}
        sent = int(re.search(r"uplink_sent=(\d+)", result.stdout).group(1))
        if crosses:
            assert sent >= 8 << 20, f"node 0's uplink saw {sent} bytes of an 8 MiB transfer"
        else:
            assert sent < 1 << 20, f"8 MiB inside node 0 put {sent} bytes on its uplink"
        assert not {n for n in namespaces() if n.startswith(ns)}, "namespaces left behind"
        assert f"{nodes} nodes" in result.stderr and f"{per_node} ranks per node" in result.stderr


@needs_netns
def test_nodes_intra_rate_uses_the_node_loopback(tmp_path):
    """--intra-rate: no shared memory; ranks of one node talk over the node's
    loopback, which has its own shaper."""
    result, ns = netlab("--nodes", "2", "--intra-rate", "10gbit", "--", mpi.mpirun(), "-np",
                        "2", "sh", "-c", "echo btl=$OMPI_MCA_btl; tc qdisc show dev lo",
                        env=clean_env(**{k: v for k, v in MPI_ENV.items()
                                         if not k.startswith("OMPI_MCA_btl")}), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "btl=self,tcp" in result.stdout
    assert tc_rate_bits(result.stdout) == 10e9
    assert not {n for n in namespaces() if n.startswith(ns)}


@needs_netns
def test_signal_to_a_nodes_lab_cleans_up_every_node():
    """SIGTERM to netlab while an MPI job sleeps on both nodes: every rank (on
    node 0 and, through the rsh agent, on node 1) is gone, and so are all the
    lab's namespaces."""
    env = clean_env(**{k: v for k, v in MPI_ENV.items() if not k.startswith("OMPI_MCA_btl")})
    proc = start(["--nodes", "2", "--", mpi.mpirun(), "-np", "2", "sh", "-c",
                  "echo $$; exec sleep 60"], env=env)
    try:
        pids = []
        for line in first_lines(proc, 2, "the ranks did not start"):
            assert line.strip().isdigit(), f"a rank did not start: {line!r}"
            pids.append(int(line))
        prefix = ns_of(proc)
        assert {f"{prefix}-n0", f"{prefix}-n1", f"{prefix}-sw"} <= namespaces()
        os.kill(proc.pid, signal.SIGTERM)
        out, err = communicate(proc, "perf/netlab --nodes 2 after SIGTERM")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, err
    for pid in pids:  # ranks of both nodes: the host sees them under the same pids
        assert not alive(pid), f"rank (pid {pid}) outlived netlab's SIGTERM"
    assert not {n for n in namespaces() if n.startswith(prefix)}, "namespaces left behind"


@pytest.fixture
def public_netlab():
    """A copy of perf/netlab that an unprivileged user can run."""
    folder = tempfile.mkdtemp(prefix="qnccl-netlab-test-")
    try:
        os.chmod(folder, 0o755)
        copy = Path(folder) / "netlab"
        shutil.copy(NETLAB, copy)
        os.chmod(copy, 0o755)
        yield copy
    finally:
        shutil.rmtree(folder)


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def can_run_as_nobody():
    if shutil.which("setpriv") is None:
        return False
    try:
        return subprocess.run([*AS_NOBODY, "true"], capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.skipif(not can_run_as_nobody(),
                    reason="needs setpriv and the right to switch to user nobody (root)")
def test_unprivileged_fallback_runs_unthrottled(public_netlab):
    proc = subprocess.Popen([*AS_NOBODY, str(public_netlab), "--rate", "100mbit", "--", "sh", "-c",
                             "echo rate=$QNCCL_NETLAB_RATE ns=[$QNCCL_NETLAB_NS] "
                             "btl=$OMPI_MCA_btl; id -u"],
                            env=clean_env(), cwd=public_netlab.parent, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    out, err = communicate(proc, "perf/netlab as nobody")
    assert proc.returncode == 0, err
    assert out.split() == ["rate=unthrottled", "ns=[]", "btl=self,tcp", "65534"]
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "unthrottled" in lines[0] and "root" in lines[0], err
    assert f"qnccl-netlab-{proc.pid}" not in namespaces()


@needs_netns
@pytest.mark.parametrize("tc, words", [
    (None, ["'tc' not found", "iproute2"]),
    ("echo 'RTNETLINK answers: Operation not supported' >&2; exit 2",
     ["cannot add the qdisc 'tbf rate 1gbit", "Operation not supported"]),
], ids=["no-tc", "tc-fails"])
def test_without_shaping_runs_unthrottled(tmp_path, tc, words):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sh", "env", "ip", "awk", "sed", "sleep", "cat", "wc"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if tc is not None:
        (bin_dir / "tc").write_text(f"#!/bin/sh\n{tc}\n")
        (bin_dir / "tc").chmod(0o755)
    result, ns = netlab("--", "sh", "-c", "echo rate=$QNCCL_NETLAB_RATE ns=[$QNCCL_NETLAB_NS]; "
                        "ip -o link | wc -l", env=clean_env(PATH=str(bin_dir)))
    assert result.returncode == 0, result.stderr
    rate, links = result.stdout.split("\n", 1)
    assert rate == "rate=unthrottled ns=[]"
    assert int(links) > 1 or tc is None, "ran in the namespace, not on the host"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "unthrottled" in lines[0], result.stderr
    for word in words:
        assert word in lines[0], result.stderr
    assert ns not in namespaces()


@pytest.mark.parametrize("args, words", [
    (["--rate", "fast", "--", "true"], ["--rate", "fast", "kbit", "mbit", "gbit", "none"]),
    (["--rate", "1gbps", "--", "true"], ["--rate", "1gbps", "gbit"]),
    (["--rate", "0mbit", "--", "true"], ["--rate"]),
    (["--mtu", "10", "--", "true"], ["--mtu", "10", "1280", "65536"]),
    (["--mtu", "70000", "--", "true"], ["--mtu", "1280", "65536"]),
    (["--mtu", "1e4", "--", "true"], ["--mtu", "1280", "65536"]),
    (["--rate"], ["--rate", "needs a value"]),
    (["--speed", "1gbit", "--", "true"], ["--speed", "--rate", "--mtu"]),
    (["true"], ["'--'", "true"]),
    (["--rate", "1gbit"], ["missing the command", "--"]),
    (["--rate", "1gbit", "--"], ["missing the command", "--"]),
    (["--nodes", "0", "--", "mpirun", "-np", "2", "true"], ["--nodes", "1 to 64"]),
    (["--nodes", "2", "--", "true"], ["--nodes", "mpirun -np N"]),
    (["--nodes", "2", "--", "mpirun", "-np", "x", "true"], ["--nodes", "mpirun -np N"]),
    (["--intra-rate", "1gbit", "--", "true"], ["--intra-rate", "needs --nodes"]),
    (["--nodes", "2", "--intra-rate", "fast", "--", "mpirun", "-np", "2", "true"],
     ["--intra-rate", "fast", "gbit"]),
])
def test_bad_flags(args, words):
    result, ns = netlab(*args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    for word in words:
        assert word in result.stderr, f"{word!r} not in: {result.stderr}"
    assert "usage: perf/netlab" in result.stderr
    if shutil.which("ip"):
        assert ns not in namespaces()


def test_help():
    result, _ = netlab("-h")
    assert result.returncode == 0
    assert result.stdout.startswith("netlab: run a command")
    assert "Usage: perf/netlab [--rate RATE] [--mtu BYTES] [-h] -- CMD [ARGS...]" in result.stdout
    assert "--nodes K" in result.stdout and "--intra-rate RATE" in result.stdout
