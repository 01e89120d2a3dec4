"""`qnccl bench` (`make bench`): quantized and uncompressed allreduce side by side on
bandwidth-limited links, then two emulated nodes, reduce-scatter, allgather and all-to-all, and
shared memory (docs/perf.md, docs/benchmark.md).

Every configuration is one MPI job of a perf binary (all_reduce_perf, or a baseline:
mpi_all_reduce_perf, torch_all_reduce_perf.py; or reduce_scatter_perf, all_gather_perf,
alltoall_perf) inside netlab, a network namespace whose loopback `tc` limits to a rate, with MPI
over TCP; the flat section runs once per rate of --rates. The jobs write nccl-tests style JSON;
the command runs them one after another with one progress line each and writes, under --out,
report.json, summary.md (the tables as markdown, and the headline) and busbw.png.

    configs    what runs: Config (one job) and each section's list of them
    jobs       running one: netlab, mpirun, its environment, its record
    estimate   the time left: each job's wall time predicted, calibrated by the finished ones
    report     busbw and speedups, the tables (120 columns, --wide, markdown), the headline
    plots      busbw.png
    (here)     the command: the sections in order, progress, the outputs
"""
import datetime
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import textwrap
import time


from .. import _native
from .configs import (COLLECTIVE_TOOLS, NODE_RANKS, NODES, SHM_ROUNDS,
                      collective_configurations, configurations, mib, node_configurations,
                      shm_configurations, timed_calls, tool)
from .estimate import minutes, run_start, seconds_left, time_left
from .jobs import NETLAB, flat, job_environment, probe_link, run_config
from .plots import plot
from .report import (TABLE_WIDTH, busbw_by_size, compact_table, format_table, render_text,
                     summarize, summary_markdown)

def fit(text, width):
    """A progress line cut to `width` (a rewritten line must not wrap), the time left kept: the
    middle gives way."""
    if len(text) <= width:
        return text
    head, sep, tail = text.rpartition(", about ")
    if sep and len(sep) + len(tail) + 10 <= width:
        return head[:width - len(sep) - len(tail) - 3] + "..." + sep + tail
    return text[:width]


class Progress:
    """The console's progress. On a terminal: a configuration's line is rewritten as its sizes
    come (carriage return, clear to the end of the line), and ends as one line with its result
    and the time left. Elsewhere (CI, pipes): only that last line, one per configuration.
    Failures add their message on a line of its own either way."""

    def __init__(self, stream=None, tty=None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.live = False  # a line being rewritten

    def update(self, text):
        if self.tty:
            columns = shutil.get_terminal_size((TABLE_WIDTH, 24)).columns
            self.stream.write("\r\033[K" + fit(text, max(columns - 1, 20)))
            self.stream.flush()
            self.live = True

    def line(self, text):
        self.stream.write(("\r\033[K" if self.live else "") + text + "\n")
        self.stream.flush()
        self.live = False


def result_words(record, done):
    """What a finished configuration's progress line says of it: busbw at its largest size,
    the speedup over the uncompressed run it is compared with when that ran already, its
    wall time; or its failure."""
    if record["status"] != "ok":
        return f"{record['status']} after {record.get('wall_s', 0):.1f} s"
    busbw = busbw_by_size(record)
    if not busbw:
        return f"no rows, {record['wall_s']:.1f} s"
    size = max(busbw)
    words = f"{mib(size)}: {busbw[size]:.4f} GB/s"
    base = next((r for r in done if r["kind"] == "nccl" and r["status"] == "ok"
                 and r is not record and all(r.get(k) == record.get(k) for k in
                                             ("rate", "nodes", "shared_memory", "collective",
                                              "dtype"))), None)
    if base is not None:
        base_busbw = busbw_by_size(base).get(size)
        if base_busbw:
            words += f" ({busbw[size] / base_busbw:.2f}x)"
    return words + f", {record['wall_s']:.1f} s"


def time_qnccl_run():
    """Seconds one `python -m qnccl run -- true` takes here (the time estimate's start of a
    quantized job, estimate.run_start)."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "qnccl", "run", "--", "true"], env=job_environment(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.monotonic() - start


def missing_parts(args):
    needed = [tool(name) for name in COLLECTIVE_TOOLS.values()]
    needed += [_native.path("lib/libqnccl.so"), _native.path("host/libnccl.so.2"), NETLAB]
    if "mpi" in args.baselines:
        needed.append(tool("mpi_all_reduce_perf"))
    return [p for p in needed if not p.exists()]


def main(args):
    missing = missing_parts(args)
    if missing:
        print(f"qnccl bench: {_native.missing(missing[0])}"
              + (f" (and {len(missing) - 1} more parts)" if len(missing) > 1 else ""),
              file=sys.stderr)
        return 1
    if shutil.which("mpirun") is None:
        print("qnccl bench: mpirun not found: run `make setup` (installs Open MPI)",
              file=sys.stderr)
        return 1
    if importlib.util.find_spec("matplotlib") is None:  # before the jobs, not after them
        print("qnccl bench: busbw.png needs matplotlib, which is not installed: pip install "
              "'qnccl[bench]' (or matplotlib)", file=sys.stderr)
        return 1
    out_dir = args.out
    for sub in ("runs", "logs"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)

    progress = Progress()
    log = progress.line

    links = []
    for rate in args.rates:
        try:
            links.append(probe_link(rate))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"qnccl bench: {e}", file=sys.stderr)
            return 2
    for link in links:
        if not link.namespace:
            log(f"qnccl bench: {link.message}")
    sections = [(link, configurations(args, link.requested)) for link in links]
    first = links[0]
    nodes = (node_configurations(args, first.requested)
             if "on" in args.nodes_section and first.limited else [])
    collectives = (collective_configurations(args, first.requested)
                   if "on" in args.collectives_section else [])
    shm = shm_configurations(args) if "on" in args.shm_section else []
    configs = [c for _, section in sections for c in section] + nodes + collectives + shm
    args.qnccl_run_start_s = round(run_start(time_qnccl_run(), args.ranks, os.cpu_count() or 1),
                                   3)
    log(textwrap.fill(
        f"qnccl bench: {len(configs)} configurations, {args.ranks} ranks, "
        f"{mib(args.sizes[0])}..{mib(args.sizes[1])}, on "
        + "; then ".join(link.words for link in links)
        + (f"; then {NODES} nodes x {NODE_RANKS // NODES} ranks, {first.rate} between the nodes, "
           f"shared memory inside" if nodes else "")
        + (f"; then reduce-scatter, allgather and all-to-all on {first.words}"
           if collectives else "")
        + (f"; then {args.ranks} ranks on one node over shared memory" if shm else "")
        + f"; about {minutes(seconds_left([], configs, args))} in all",
        TABLE_WIDTH, subsequent_indent="  "))
    started = time.monotonic()
    records = []
    digits = max(2, len(str(len(configs))))
    for i, config in enumerate(configs, 1):
        label = (f"[{i:{digits}d}/{len(configs)}] {config.name}"
                 f"{f' at {config.rate}' if len(links) > 1 and flat(config) else ''}")
        # while it runs: what is left of the estimate for it and the rest
        begun = time.monotonic()
        with_it = seconds_left(records, configs[i - 1:], args)
        after_it = seconds_left(records, configs[i:], args)

        def on_size(text, label=label, begun=begun, with_it=with_it, after_it=after_it):
            left = max(with_it - (time.monotonic() - begun), after_it)
            progress.update(f"{label}  {text}, about {minutes(left)} left")

        progress.update(f"{label}  starting, about {minutes(with_it)} left")
        record = run_config(config, args, out_dir, on_size)
        left = time_left([*records, record], configs[i:], args)
        log(f"{label}  {result_words(record, records)}{left}")
        records.append(record)
        if record["status"] != "ok":
            log(textwrap.fill(f"      {record['status']}: {record['message']}", TABLE_WIDTH,
                              subsequent_indent=" " * 8))

    tables, panels, report_sections = [], [], []

    def emit(section_records, sizes, title, panel_title):
        """Prints a section's table (120 columns; --wide: format_table's); keeps it and its
        plot panel. Returns the report's fields of it."""
        table = format_table(section_records, sizes, title)
        compact = render_text(compact_table(section_records, sizes, title))
        print("\n" + (table if getattr(args, "wide", False) else compact) + "\n")
        tables.append(table)
        panels.append((section_records, sizes, panel_title))
        return {"title": title, "table": table, "compact_table": compact}

    done = iter(records)
    for link, section in sections:
        section_records = [next(done) for _ in section]
        sizes = summarize(section_records)
        tables_of = emit(section_records, sizes,
                     f"allreduce of {' and '.join(args.dtypes)} (sum), {args.ranks} ranks, "
                     f"{link.words}, {args.rounding} rounding; busbw from the median of "
                     f"{args.iters} calls (speedup over uncompressed all_reduce_perf of the "
                     f"same type at the same size; limit: the uncompressed run's wire bytes "
                     f"over this row's, the most a link-bound call can gain)",
                     f"allreduce busbw, {args.ranks} ranks, {link.words}")
        report_sections.append({"heading": f"Allreduce at {link.requested}",
                                "link": {"rate": link.rate, "tool": "perf/netlab",
                                         "requested": link.requested},
                                "sizes": sizes, "configurations": section_records,
                                **tables_of})
    node_records = [next(done) for _ in nodes]
    collective_records = [next(done) for _ in collectives]
    shm_records = list(done)
    two_nodes = None
    if node_records:
        node_sizes = summarize(node_records)
        node_tables = emit(
            node_records, node_sizes,
            f"{NODES} nodes x {NODE_RANKS // NODES} ranks (perf/netlab --nodes): {first.rate} "
            f"between the nodes, shared memory inside; {args.rounding} rounding, bucket 128; "
            f"hier = exact inside nodes, quantized between them",
            f"allreduce busbw, {NODES} nodes x {NODE_RANKS // NODES} ranks, {first.rate} "
            f"between nodes")
        two_nodes = {"heading": f"{NODES} nodes x {NODE_RANKS // NODES} ranks, {first.requested} "
                                "between the nodes",
                     "nodes": NODES, "nranks": NODE_RANKS, "sizes": node_sizes,
                     "link": {"rate": first.rate, "tool": "perf/netlab --nodes",
                              "requested": first.requested},
                     "configurations": node_records, **node_tables}
    collective_section = None
    if collective_records:
        for i in range(0, len(collective_records), 2):  # each beside its own uncompressed run
            summarize(collective_records[i:i + 2])
        collective_sizes = sorted({int(s) for r in collective_records for s in r["busbw_gbps"]})
        collective_tables = emit(
            collective_records, collective_sizes,
            f"reduce-scatter, allgather and all-to-all of float32, {args.ranks} ranks, "
            f"{first.words}, {args.rounding} rounding, bucket 128 (speedup over the same "
            f"collective uncompressed)",
            f"reduce-scatter, allgather, all-to-all busbw, {args.ranks} ranks, {first.rate}")
        collective_section = {"heading": f"Reduce-scatter, allgather, all-to-all at "
                                         f"{first.requested}",
                              "link": {"rate": first.rate, "tool": "perf/netlab",
                                       "requested": first.requested},
                              "sizes": collective_sizes, "configurations": collective_records,
                              **collective_tables}
    shm_section = None
    if shm_records:
        shm_sizes = summarize(shm_records)
        shm_tables = emit(
            shm_records, shm_sizes,
            f"allreduce of {' and '.join(args.dtypes)} (sum), {args.ranks} ranks on one node "
            f"over shared memory (perf/netlab --nodes 1: MPI btl vader, no rate limit), "
            f"{args.rounding} rounding; busbw from the median of {timed_calls(args, True)} "
            f"calls (auto: of {SHM_ROUNDS} rounds of them) (speedup over uncompressed "
            f"all_reduce_perf of the same type at the same size; below 1x QNCCL is slower: "
            f"docs/perf.md; 'same job': auto against the plain NCCL's calls in "
            f"{SHM_ROUNDS} alternating rounds of its own job, the median of the rounds' "
            f"ratios)",
            f"allreduce busbw, {args.ranks} ranks, shared memory")
        shm_section = {"heading": "Shared memory, one node",
                       "link": {"rate": "none", "tool": "perf/netlab --nodes 1",
                                "transport": "shared memory"},
                       "sizes": shm_sizes, "configurations": shm_records, **shm_tables}
    report = {
        "benchmark": "qnccl bench",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": {"name": socket.gethostname(), "cpus": os.cpu_count(),
                 "platform": platform.platform()},
        "nranks": args.ranks, "datatypes": args.dtypes, "op": "sum",
        "rounding": args.rounding, "iters": args.iters, "warmup": args.warmup,
        "qnccl_run_start_s": args.qnccl_run_start_s,
        "command": " ".join(sys.argv), "wall_s": round(time.monotonic() - started, 1),
        "sections": report_sections, "two_nodes": two_nodes,
        "collectives": collective_section, "shared_memory": shm_section,
        "table": "\n\n".join(tables),
    }
    report_path = out_dir / "report.json"
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    summary_path = out_dir / "summary.md"
    summary_path.write_text(summary_markdown(report))
    plot_path = out_dir / "busbw.png"
    plot(panels, plot_path)
    print(f"report: {report_path}\nplot:   {plot_path}\nsummary: {summary_path}\n"
          f"done in {report['wall_s'] / 60:.1f} min")
    failed = [r["name"] for r in records if r["status"] == "failed" or r.get("check_ok") is False]
    if failed:
        print(f"qnccl bench: failed: {', '.join(failed)} (logs in {out_dir / 'logs'})",
              file=sys.stderr)
        return 1
    return 0
