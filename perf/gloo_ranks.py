"""How a process that mpirun started joins a gloo process group: one place for the programs
that train with torch.distributed under mpirun (perf/accuracy_ddp.py, perf/torch_ddp_bench.py,
tests/torch_programs/).

Rank and size come from Open MPI's environment; rank 0 serves the rendezvous store on
MASTER_ADDR (default 127.0.0.1):MASTER_PORT, which the launcher picks with rendezvous_port().
A program ends with finish(), not by returning from its main.
"""
import atexit
import ctypes
import os
import random
import socket
import sys
from datetime import timedelta

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10000  # below it lie the registered services people run on a workstation


def rendezvous_port():
    """A TCP port for the rendezvous store (MASTER_PORT): free now, and outside the kernel's
    ephemeral range, so that no connect() anywhere on the host can be given it.

    Why outside: the ranks that connect to the store start at the same time as rank 0 and
    retry until it listens, and every try draws a local port from the ephemeral range. On
    loopback a try that draws the store's own port connects the socket to itself (TCP
    simultaneous open): rank 0's listen then fails with EADDRINUSE and the job is lost. A
    port from bind(0) lies inside that range; the CI lost a run to exactly this (port 46417).
    The kernel never draws a port below or above its range for a connect."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    candidates = [p for p in range(LOWEST_PORT, 65536) if not low <= p <= high]
    for port in random.SystemRandom().sample(candidates, min(len(candidates), 200)):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {LOWEST_PORT}-65535 outside the ephemeral range "
                       f"{low}-{high} ({EPHEMERAL_RANGE}): free one")


def init(timeout_s=300):
    """Joins the default gloo group, one torch thread per rank; returns (rank, size)."""
    import torch
    import torch.distributed as dist
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                          int(os.environ["MASTER_PORT"]), size, rank == 0,
                          timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s))
    torch.set_num_threads(1)
    return rank, size


def finish(code=0):
    """Ends this rank's process with exit status `code` once its collectives have returned:
    runs Python's atexit handlers (the qnccl.torch hook's worker is joined there), destroys
    the process groups, flushes stdout and stderr, and leaves through C's exit(), without the
    interpreter's finalization.

    Why: a gloo worker thread releases a collective's work after the collective has returned
    to Python, and with it the tensors of the collectives before it (a barrier keeps them
    until it is released), which takes the GIL. A thread that takes the GIL while the
    interpreter finalizes is ended by pthread_exit, and that unwinding through PyTorch's
    noexcept destructors aborts the process: "terminate called without an active
    exception", exit 134, about one two-rank job in 40 on two busy cores (a core dump's
    stack: ProcessGroupGloo::runLoop, ~AsyncBarrierWork, ~AsyncAllreduceWork,
    TensorImpl::decref_pyobject, take_gil, pthread_exit, std::terminate). Destroying the
    group does not join gloo's threads: its backend's shutdown does nothing; only its
    destructor joins them, when the last reference goes, and DDP holds one. C's exit runs the
    C atexit handlers (QNCCL's host backend finalizes MPI there) and the libraries'
    destructors while this thread holds the GIL (PyDLL does not release it), so a gloo thread
    that wants it waits until the process is gone."""
    atexit._run_exitfuncs()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.PyDLL(None).exit(int(code or 0))
