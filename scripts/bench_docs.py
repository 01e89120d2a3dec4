#!/usr/bin/env python3
"""Puts a `qnccl bench` run into the docs.

    scripts/bench_docs.py REPORT [--readme README.md] [--doc docs/benchmark.md]

REPORT: the run's report.json, its output folder (make bench: build/bench) or the summary.md
beside its report.json. Replaces the lines between

    <!-- bench:summary:begin -->  and  <!-- bench:summary:end -->   in README.md

with the headline (where and when it was measured, 64 MiB float32 speedups per row and link:
qnccl.bench.report.headline_markdown), and between

    <!-- bench:full:begin -->  and  <!-- bench:full:end -->   in docs/benchmark.md

with the full summary (summary.md's tables: qnccl.bench.report.summary_markdown). The marker lines
stay; running it again on the same report changes nothing. Exits 1, changing no file, when a
file lacks a marker (or has it twice, or end before begin) or the report cannot be read.
"""
import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qnccl.bench import report as bench  # noqa: E402  (the source tree's, beside this script)


class MarkerError(Exception):
    pass


def replace_between(text, name, content, where):
    """`text` with the lines between the marker lines <!-- bench:NAME:begin --> and
    <!-- bench:NAME:end --> replaced by `content`."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    lines = text.split("\n")
    found = {tag: [i for i, line in enumerate(lines) if line.strip() == tag]
             for tag in (begin, end)}
    for tag, at in found.items():
        if len(at) != 1:
            raise MarkerError(f"{where}: the marker line {tag} is "
                              f"{'missing' if not at else f'there {len(at)} times'}; "
                              f"it must be on a line of its own once, {begin} before {end}")
    first, last = found[begin][0], found[end][0]
    if first > last:
        raise MarkerError(f"{where}: {end} comes before {begin}")
    return "\n".join(lines[:first + 1] + content.rstrip("\n").split("\n") + lines[last:])


def load_report(path):
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    elif path.suffix == ".md":
        path = path.with_name("report.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MarkerError(f"cannot read the report {path}: {e}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Replaces the benchmark blocks of README.md and docs/benchmark.md with a "
                    "qnccl bench run's headline and full summary.")
    parser.add_argument("report", help="report.json, its folder, or the summary.md beside it")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="gets the headline between <!-- bench:summary:begin/end --> "
                             "(default: the repository's README.md)")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmark.md",
                        help="gets the full summary between <!-- bench:full:begin/end --> "
                             "(default: the repository's docs/benchmark.md)")
    args = parser.parse_args(argv)
    try:
        report = load_report(args.report)
        updates = [(args.readme, replace_between(args.readme.read_text(), "summary",
                                                 bench.headline_markdown(report), args.readme)),
                   (args.doc, replace_between(args.doc.read_text(), "full",
                                              bench.summary_markdown(report, level=3,
                                                                     title=False), args.doc))]
    except (MarkerError, OSError) as e:
        print(f"bench_docs: {e}", file=sys.stderr)
        return 1
    for path, text in updates:  # both checked before either is written
        if path.read_text() != text:
            path.write_text(text)
            print(f"bench_docs: updated {path}")
        else:
            print(f"bench_docs: {path} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
