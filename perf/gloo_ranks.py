"""How a process that mpirun started joins a gloo process group: one place for the programs
that train with torch.distributed under mpirun (perf/accuracy_ddp.py, perf/torch_ddp_bench.py,
tests/torch_programs/).

Rank and size come from Open MPI's environment; rank 0 serves the rendezvous store on
MASTER_ADDR (default 127.0.0.1):MASTER_PORT, which the launcher picks (it is free where the
launcher looked, and inside a fresh netlab namespace every port is).
"""
import os
from datetime import timedelta


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
