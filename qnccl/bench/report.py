"""The results: busbw per size, speedups, the tables (console, --wide, markdown), the headline
and summary.md."""
import dataclasses
import re
import textwrap

from .configs import mib, rate_bps


def busbw_by_size(record):
    """{size: busbw GB/s} of the out-of-place rows, from the median call time."""
    result = {}
    for row in record.get("perf", {}).get("rows", []):
        if row["placement"] != "out-of-place":
            continue
        seconds = (row.get("time_us_median") or row["time_us"]) / 1e6
        # the collective's bus-bandwidth factor, as the binary applied it
        factor = row["busbw_gbps"] / row["algbw_gbps"] if row["algbw_gbps"] else 0.0
        result[row["size"]] = row["size"] / 1e9 / seconds * factor if seconds > 0 else 0.0
    return result


def summarize(records):
    """Adds busbw, speedup over the uncompressed run of the same type (the section's first
    record of that type), wire ratio and error to every record; returns the sizes."""
    bases = {}
    for record in records:
        bases.setdefault(record.get("dtype", "float32"), record)
    sizes = sorted({size for r in records for size in busbw_by_size(r)})
    for record in records:
        base_record = bases[record.get("dtype", "float32")]
        base = busbw_by_size(base_record) if base_record["status"] == "ok" else {}
        busbw = busbw_by_size(record)
        rows = [row for row in record.get("perf", {}).get("rows", [])
                if row["placement"] == "out-of-place"]
        record["busbw_gbps"] = {str(s): v for s, v in busbw.items()}
        record["speedup"] = {str(s): v / base[s] for s, v in busbw.items() if base.get(s)}
        # --interleave: the speed against the plain NCCL timed in rounds of the same job
        record["vs_plain"] = {str(row["size"]): row["vs_plain"] for row in rows
                              if row.get("vs_plain") is not None}
        wire = [row["wire_bytes_per_input_byte"] for row in rows]
        errors = [row["error"] for row in rows if row.get("error") is not None]
        record["wire_bytes_per_input_byte"] = max(wire) if wire else None
        record["max_error"] = max(errors) if errors else None
        record["check_ok"] = all(row.get("ok") is not False for row in rows) if rows else None
    for record in records:
        # the speedup a link-bound call could reach at most: the uncompressed run's bytes on
        # the wire per byte this one sends
        base_wire = bases[record.get("dtype", "float32")].get("wire_bytes_per_input_byte")
        wire = record["wire_bytes_per_input_byte"]
        record["wire_limit"] = base_wire / wire if base_wire and wire else None
    return sizes


def format_table(records, sizes, header):
    """One line per configuration: wire ratio, the speedup it allows (limit), error, then
    busbw and speedup over the uncompressed run of its type at every size."""
    width = max(len(r["name"]) for r in records)
    lines = [header, "",
             f"{'':<{width}}  {'wire':>5}  {'limit':>6}  {'error':>7}" +
             "".join(f"  {mib(s):>15}" for s in sizes),
             f"{'configuration':<{width}}  {'(B/B)':>5}  {'':>6}  {'':>7}" +
             "".join(f"  {'GB/s':>7} {'speedup':>7}" for _ in sizes)]
    for r in records:
        if not r["busbw_gbps"]:
            lines.append(f"{r['name']:<{width}}  {r['status']}: {r['message']}")
            continue
        wire, limit = r["wire_bytes_per_input_byte"], r.get("wire_limit")
        error = r["max_error"]
        quantized = r["kind"] == "qnccl"
        line = (f"{r['name']:<{width}}  {f'{wire:5.3f}' if wire is not None else '-':>5}"
                f"  {f'{limit:5.2f}x' if quantized and limit else '-':>6}"
                f"  {f'{error:.1e}' if error is not None else '-':>7}")
        for s in sizes:
            busbw, speedup = r["busbw_gbps"].get(str(s)), r["speedup"].get(str(s))
            line += f"  {f'{busbw:.4f}' if busbw is not None else '-':>7}"
            line += f" {f'{speedup:.2f}x' if speedup else '-':>7}"
        if r["status"] != "ok":
            line += f"  <- {r['status']}: {r['message']}"
        lines.append(line)
        if r.get("vs_plain"):
            line = f"{'  same job, vs plain NCCL':<{width}}  {'':>5}  {'':>6}  {'':>7}"
            for s in sizes:
                ratio = r["vs_plain"].get(str(s))
                line += f"  {'':>7} {f'{ratio:.2f}x' if ratio else '-':>7}"
            lines.append(line)
    return "\n".join(lines)


TABLE_WIDTH = 120  # the console's tables, summary.md's


@dataclasses.dataclass
class Table:
    """A section's table as cells, for the console (render_text) and summary.md
    (render_markdown)."""
    title: str
    columns: list  # headers; the first is the configurations'
    rows: list     # each a list of cells, or (name, message): a line of words, no numbers
    notes: list    # footnotes


def _baselines(records):
    """The uncompressed record of each type: the first of the section's records of that type
    (summarize's speedups are over it)."""
    bases = {}
    for record in records:
        bases.setdefault(record.get("dtype", "float32"), record)
    return bases


def compact_table(records, sizes, title, width=TABLE_WIDTH):
    """The console's table of a section, at most `width` columns: per row the wire bytes, the
    wire-size limit, the error, then per size the speedup over the uncompressed row of its type
    (the uncompressed rows themselves: their busbw). Where that is too wide the limit goes into
    a footnote, then every other size (the largest kept) until it fits; --wide prints
    format_table's instead."""
    base_ids = {id(r) for r in records if r["kind"] == "nccl"}

    def cells(shown, with_limit):
        blank = [""] * (2 + with_limit)
        rows = []
        for r in records:
            if not r.get("busbw_gbps"):
                rows.append((r["name"], f"{r['status']}: {r['message']}"))
                continue
            wire, limit, error = r["wire_bytes_per_input_byte"], r.get("wire_limit"), r["max_error"]
            row = [r["name"], f"{wire:.3f}" if wire is not None else "-"]
            if with_limit:
                row.append(f"{limit:.2f}x" if r["kind"] == "qnccl" and limit else "-")
            row.append(f"{error:.1e}" if error is not None else "-")
            for s in shown:
                if id(r) in base_ids:
                    busbw = r["busbw_gbps"].get(str(s))
                    row.append(f"{busbw:.4f}" if busbw is not None else "-")
                else:
                    speedup = r["speedup"].get(str(s))
                    row.append(f"{speedup:.2f}x" if speedup else "-")
            rows.append(row)
            if r["status"] != "ok":
                rows.append(("", f"<- {r['status']}: {r['message']}"))
            if r.get("vs_plain"):
                rows.append(["  same job, vs plain NCCL", *blank] +
                            [f"{v:.2f}x" if (v := r["vs_plain"].get(str(s))) else "-"
                             for s in shown])
        columns = ["configuration", "wire", *(["limit"] if with_limit else []), "error",
                   *(mib(s) for s in shown)]
        return Table(title, columns, rows, [])

    shown, with_limit = list(sizes), True
    table = cells(shown, with_limit)
    while _text_width(table) > width and (with_limit or len(shown) > 1):
        if with_limit:
            with_limit = False
        else:
            shown = shown[::-1][::2][::-1]  # every other size, the largest kept
        table = cells(shown, with_limit)
    table.notes.append(
        "Per size: the uncompressed (NCCL API) rows' busbw in GB/s, the other rows' speedup over "
        "the uncompressed row of their type (and collective) at that size. wire: bytes each rank "
        "sent per input byte; error: the largest max |result - exact| / max |exact| over the "
        "sizes.")
    if not with_limit:
        table.notes.append("The wire-size limit, the most a link-bound row can gain: the wire of "
                           "the uncompressed row it is compared with over its own.")
    if len(shown) < len(sizes):
        left_out = [mib(s) for s in sizes if s not in shown]
        table.notes.append(f"Sizes left out to fit {width} columns: {', '.join(left_out)} "
                           f"(qnccl bench --wide, report.json).")
    return table


def _column_widths(table):
    widths = [len(c) for c in table.columns]
    for row in table.rows:
        if isinstance(row, list):
            widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    return widths


def _text_width(table):
    widths = _column_widths(table)
    return sum(widths) + 2 * (len(widths) - 1)


def render_text(table, width=TABLE_WIDTH):
    """A Table as the console prints it: the title wrapped to `width`, aligned columns, the
    lines without numbers and the footnotes wrapped too."""
    widths = _column_widths(table)

    def line(cells):
        return "  ".join([f"{cells[0]:<{widths[0]}}"] +
                         [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:])]).rstrip()

    lines = [*textwrap.wrap(table.title, width), "", line(table.columns)]
    for row in table.rows:
        if isinstance(row, list):
            lines.append(line(row))
        else:
            name, message = row
            lines += textwrap.wrap(f"{name:<{widths[0]}}  {message}", width,
                                   subsequent_indent=" " * (widths[0] + 4))
    for note in table.notes:
        lines += textwrap.wrap(note, width)
    return "\n".join(line.rstrip() for line in lines)


def _md_cell(text):
    return text.replace("|", "\\|").strip() or " "


def render_markdown(table, heading=None):
    """A Table as markdown: the heading (a line such as '### ...'), the title, the table
    (numbers right-aligned), the footnotes."""
    out = [heading, ""] if heading else []
    out += [table.title, ""] if table.title else []
    out += ["| " + " | ".join(_md_cell(c) for c in table.columns) + " |",
            "| --- |" + " ---: |" * (len(table.columns) - 1)]
    for row in table.rows:
        if not isinstance(row, list):
            row = [row[0], row[1]] + [""] * (len(table.columns) - 2)
        out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if table.notes:
        out += ["", " ".join(table.notes)]
    return "\n".join(out)


def link_label(link):
    """A report section's link as a column header: '1 Gbit/s', 'unlimited'."""
    requested = link.get("requested") or link.get("rate")
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?)bit", str(requested).lower())
    label = f"{match.group(1)} {match.group(2).upper()}bit/s" if match else "unlimited"
    if match and link.get("rate") == "unthrottled":
        label += " (unthrottled: no namespace)"
    return label


def display_command(command):
    """The report's command as a user types it: 'qnccl bench ...' (run as python -m qnccl,
    sys.argv[0] is qnccl/__main__.py)."""
    program, _, rest = command.partition(" ")
    if program.endswith(("__main__.py", "qnccl")):
        return f"qnccl {rest}".strip()
    return command


def measured_line(report):
    """'Measured <date> on <host>, <cpus> CPUs, <platform>; `<command>`'."""
    host = report.get("host", {})
    date = str(report.get("date", "?")).replace("T", " ")
    return (f"Measured {date} on {host.get('name', '?')}, "
            f"{host.get('cpus', '?')} CPUs, {host.get('platform', '?')}; "
            f"`{display_command(report.get('command', 'qnccl bench'))}`")


def headline(report):
    """The headline: float32 allreduce at the largest size, the speedup over uncompressed of
    each row of the flat sections at the first bucket size (the uncompressed row: its busbw),
    one column per flat section's link, and one for the two-node section, whose rows share the
    flat rows' lines (the hierarchical rows have their own). (caption, Table), or None
    without a flat section."""
    sections = [s for s in report.get("sections", []) if s.get("configurations")]
    sized = [s for s in sections if s.get("sizes")]  # (a section whose every job failed: none)
    if not sized:
        return None
    size = max(sized[0]["sizes"])
    columns = [(link_label(s["link"]), s["configurations"]) for s in sections]
    two_nodes = report.get("two_nodes")
    if two_nodes and two_nodes.get("configurations"):
        columns.append((f"{two_nodes['nodes']} nodes x {two_nodes['nranks'] // two_nodes['nodes']}"
                        f" ranks, {link_label(two_nodes['link'])} between",
                        two_nodes["configurations"]))
    autos = [r for s in sections for r in s["configurations"] if r.get("algo") == "auto"]
    bucket = autos[0]["bucket_size"] if autos else None
    rows = {}  # row name: {column: cell}
    for c, (_, records) in enumerate(columns):
        base = _baselines(records).get("float32")
        for r in records:
            if r.get("dtype", "float32") != "float32" or (
                    bucket and r["kind"] == "qnccl" and r.get("bucket_size") != bucket):
                continue
            name = r["name"][4:] if r["name"].startswith("2x2 ") else r["name"]
            if r is base:
                value = r.get("busbw_gbps", {}).get(str(size))
                cell = f"{value:.4f} GB/s" if value is not None else "-"
            else:
                value = r.get("speedup", {}).get(str(size))
                cell = f"{value:.2f}x" if value else "-"
            rows.setdefault(name, {})[c] = cell
    table = Table("", ["configuration", *(label for label, _ in columns)],
                  [[name, *(cells.get(c, "") for c in range(len(columns)))]
                   for name, cells in rows.items()], [])
    limited = [link_label(s["link"]) for s in sections if rate_bps(s["link"].get("requested"))]
    links = ([f"a loopback limited by tc (perf/netlab) to {', '.join(limited)}"] if limited else [])
    links += [link_words(s["link"]) for s in sections if not rate_bps(s["link"].get("requested"))]
    if len(columns) > len(sections):
        links.append(f"{columns[-1][0]} the nodes, shared memory inside (hier: exact inside a "
                     f"node, quantized between the nodes)")
    caption = (f"Speedup over the uncompressed allreduce (NCCL API) on the same link: "
               f"{mib(size)} of float32 per rank, {report.get('nranks', '?')} ranks, "
               f"{report.get('rounding', 'stochastic')} rounding"
               f"{f', bucket {bucket}' if bucket else ''} (the uncompressed row: its busbw). "
               f"Links: {'; '.join(links)}.")
    return caption, table


def link_words(link):
    """A report section's link in words (Link.words)."""
    if link.get("rate") == "unthrottled":
        return ("unlimited loopback" if link.get("requested") == "none" else
                "unthrottled loopback (no namespace)")
    return f"loopback limited to {link['rate']} by tc"


def sections_of(report):
    """The report's sections in order: (heading, its dict)."""
    found = [(s.get("heading") or f"allreduce at {s['link'].get('requested')}", s)
             for s in report.get("sections", [])]
    for key, heading in (("two_nodes", "Two nodes"), ("collectives", "Other collectives"),
                         ("shared_memory", "Shared memory")):
        if report.get(key):
            found.append((report[key].get("heading") or heading, report[key]))
    return found


def section_table(section):
    """A report section's console table (compact_table), from its records."""
    title = section.get("title") or section.get("table", "").split("\n", 1)[0]  # older reports
    return compact_table(section["configurations"], section["sizes"], title)


def headline_markdown(report):
    """README's block: the measured line, the headline's caption and table."""
    found = headline(report)
    parts = [measured_line(report)]
    if found:
        caption, table = found
        parts += [caption, render_markdown(table)]
    return "\n\n".join(parts) + "\n"


def summary_markdown(report, level=2, title=True):
    """summary.md: the measured line, the headline, then every section's console table as
    markdown, headings at `level` (title: a '#' heading first)."""
    hashes = "#" * level
    parts = ["# qnccl bench"] if title else []
    parts.append(measured_line(report))
    found = headline(report)
    if found:
        caption, table = found
        parts += [f"{hashes} Headline", caption, render_markdown(table)]
    for heading, section in sections_of(report):
        parts.append(render_markdown(section_table(section), f"{hashes} {heading}"))
    return "\n\n".join(parts) + "\n"
