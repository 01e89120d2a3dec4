"""Running one configuration: perf/netlab's rate-limited link, mpirun, the job's JSON."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time


from .. import _native
from .configs import SHM_BINDING, TORCH_MISSING, mib

NETLAB = _native.path("bin/netlab")

# Open MPI as root, more ranks than cores, no busy waiting (2-core machines).
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}
# For jobs on one machine that may use shared memory (the benchmark's own runs go over TCP
# on purpose): no CMA/ptrace single copy, which containers forbid.
MPI_SHARED_MEMORY_ENV = {
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}


@dataclasses.dataclass
class Link:
    """What perf/netlab gives the jobs for one requested rate."""
    requested: str
    rate: str         # the rate, or "unthrottled"
    namespace: bool   # False: netlab could not make one (jobs on the host's network)
    message: str      # netlab's own line

    @property
    def limited(self):
        return self.rate != "unthrottled"

    @property
    def words(self):
        if self.limited:
            return f"loopback limited to {self.rate} by tc (perf/netlab)"
        if self.namespace:
            return "unlimited loopback (perf/netlab --rate none)"
        return "unthrottled loopback (perf/netlab could not make a namespace)"


def probe_link(rate):
    """The Link perf/netlab gives the jobs here for `rate`."""
    probe = subprocess.run([str(NETLAB), "--rate", rate, "--", "sh", "-c",
                            'echo "$QNCCL_NETLAB_RATE:$QNCCL_NETLAB_NS"'],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise RuntimeError(f"perf/netlab failed (exit {probe.returncode}): {probe.stderr.strip()}")
    got, _, namespace = probe.stdout.strip().partition(":")
    return Link(rate, got or "unthrottled", bool(namespace), probe.stderr.strip())


def job_environment():
    """The jobs' environment: MPI settings, the host backend as libnccl.so.2, and
    no QNCCL_* from the caller (each configuration sets its own), nor the caller's choice of
    Open MPI transports (OMPI_MCA_btl*): a test shell's `btl_vader_single_copy_mechanism=none`
    made the shared-memory section's uncompressed baseline 3x slower from 8 MiB."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("QNCCL_", "OMPI_MCA_btl"))}
    env.update(MPI_ENV)
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(_native.path("host/libnccl.so.2").parent),
                                                    env.get("LD_LIBRARY_PATH")]))
    env["MASTER_PORT"] = "29500"  # torch.distributed's rendezvous, inside the fresh namespace
    return env


def flat(config):
    """Whether `config` belongs to a flat section (one per rate of --rates)."""
    return config.nodes == 1 and not config.shared_memory


def run_config(config, args, out_dir, on_size=lambda text: None):
    """Runs one configuration; returns its record for the report. on_size(text): what each
    size's row said, as the job prints it (the console's progress)."""
    json_path = out_dir / "runs" / f"{config.slug}.json"
    log_path = out_dir / "logs" / f"{config.slug}.log"
    json_path.unlink(missing_ok=True)
    mpirun = shutil.which("mpirun") or "mpirun"
    lab = ["--nodes", str(config.nodes)] if config.nodes > 1 or config.shared_memory else []
    binding = SHM_BINDING if config.shared_memory else ()
    cmd = [str(NETLAB), *lab, "--rate", config.rate, "--", mpirun, *binding,
           "-np", str(config.ranks or args.ranks), *config.argv(args), "-J", str(json_path)]
    record = {**dataclasses.asdict(config), "command": cmd, "status": "ok", "message": None}
    start = time.monotonic()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, env=job_environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            for line in proc.stdout:
                log_file.write(line)
                row = re.match(r"^\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s+(\S+)\s+\S+\s+(\S+)\s+(\S+)",
                               line)
                if row:
                    on_size(f"{mib(int(row.group(1)))}: {float(row.group(2)) / 1e3:.1f} ms a call,"
                            f" error {row.group(4)}")
            status = proc.wait(timeout=args.timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
            os.killpg(proc.pid, 15)  # netlab cleans its namespace up on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
            if isinstance(e, KeyboardInterrupt):
                raise
            status = None
    record["wall_s"] = round(time.monotonic() - start, 2)
    record["log"] = str(log_path)
    if status == TORCH_MISSING and config.kind == "torch-gloo":
        record.update(status="skipped", message="torch is not installed "
                      f"({sys.executable} -m pip install torch)")
    elif status != 0 or not json_path.is_file():
        tail = log_path.read_text().strip().splitlines()[-3:]
        record.update(status="failed", message=(
            f"timed out after {args.timeout} s" if status is None else f"exit {status}") +
            (": " + " | ".join(tail) if tail else ""))
    if json_path.is_file():
        record["perf"] = json.loads(json_path.read_text())
    return record
