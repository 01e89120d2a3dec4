"""busbw.png: a grid of panels, one per section.

busbw.png: one panel per section, two to a row, each its own legend below its axes. A line's
color says its bits (a lighter shade: a bucket size past the section's first; rotated rows
their own hue) or its baseline (uncompressed NCCL API black, MPI_Allreduce gray, torch gloo
brown); its dash pattern and marker say the algorithm (or, in the collectives section, the
collective); its marker's fill the type (float32 filled, bfloat16 hollow and paler, float16
half-filled). No two entries of a panel's legend look alike: a clash takes a spare marker.
"""
import math

from .configs import mib


PANEL_WIDTH_IN, AXES_HEIGHT_IN, PLOT_DPI = 7.0, 3.6, 110  # two panels: 1540 px wide
LEGEND_FONT = 8
BITS_COLORS = {8: ("#1f4e9c", "#6fa8dc"), 4: ("#1b7a3a", "#74c476"), 3: ("#d95f02", "#fdae6b"),
               2: ("#b2182b", "#f4a582"), 1: ("#6a3d9a", "#cab2d6")}
OTHER_BITS_COLORS = ("#8c6d31", "#e7ba52")
ROTATED_COLORS = {2: "#e7298a", 3: "#a6761d", 4: "#1b9e77", 8: "#7570b3"}
BASELINE_COLORS = {"nccl": "#000000", "mpi": "#7f7f7f", "torch-gloo": "#8c564b"}
BASELINE_MARKERS = {"nccl": "h", "mpi": "d", "torch-gloo": "<"}
# dash pattern (in line widths) and marker per algorithm, and per collective
ALGO_STYLES = {"ring": ("-", "o"), "tree": (":", "^"), "sra": ((0, (7, 2.5)), "s"),
               "hier": ("-.", "P"), "auto": ((0, (9, 2, 1.5, 2, 1.5, 2)), "*"),
               "rule": ((0, (3, 1.5)), "v")}
COLLECTIVE_STYLES = {"reducescatter": ("-", "o"), "allgather": ((0, (7, 2.5)), "s"),
                     "alltoall": (":", "^")}
DTYPE_FILLS = {"float32": ("full", 1.0), "bfloat16": ("none", 0.65), "float16": ("bottom", 0.8)}
SPARE_MARKERS = ("X", "p", "8", ">", "H", "D", "1", "2", "+", "x")


def legend_label(name):
    """A configuration's name in a legend: its section's prefix, 'qnccl ' and '(NCCL API)' left
    out (the panel's title says them; MPI's and torch's baselines have their own names)."""
    for prefix in ("2x2 ", "shm "):
        name = name[len(prefix):] if name.startswith(prefix) else name
    return name.replace("qnccl ", "").replace(" (NCCL API)", "")


def line_styles(records):
    """Each record's line style in one panel: dicts of matplotlib Line2D properties, no two
    with the same (color, marker, fill) (ALGO_STYLES give each algorithm its own marker, so
    that is the whole look but the dashes)."""
    buckets = sorted({r["bucket_size"] for r in records if r["kind"] == "qnccl"
                      and r.get("bucket_size") and not r.get("rotation_block")})
    styles, seen = [], set()
    for r in records:
        fill, alpha = DTYPE_FILLS.get(r.get("dtype", "float32"), ("left", 0.8))
        look = (COLLECTIVE_STYLES.get(r.get("collective"), ("-", "o"))
                if r.get("collective", "allreduce") != "allreduce" else None)
        if r["kind"] == "qnccl":
            dash, marker = look or ALGO_STYLES.get(r.get("algo"), ("-", "o"))
            if r.get("rotation_block"):
                color = ROTATED_COLORS.get(r["bits"], "#666666")
            else:
                shades = BITS_COLORS.get(r["bits"], OTHER_BITS_COLORS)
                color = shades[0 if buckets and r.get("bucket_size") == buckets[0] else 1]
            width = 1.6
        else:
            dash, marker = look or ("-", BASELINE_MARKERS.get(r["kind"], "o"))
            color, width = BASELINE_COLORS.get(r["kind"], "#17becf"), 2.6
        if (color, marker, fill) in seen:  # a spare marker, else another fill
            marker = next((m for m in SPARE_MARKERS if (color, m, fill) not in seen), marker)
            fill = next((f for f in (fill, "left", "right", "top", "bottom", "full", "none")
                         if (color, marker, f) not in seen), fill)
        seen.add((color, marker, fill))
        styles.append(dict(color=color, linestyle=dash, marker=marker, fillstyle=fill,
                           alpha=alpha, linewidth=width, markersize=5.5,
                           markeredgecolor=color, markerfacecolor=color))
    return styles


def _legend_layout(labels):
    """(columns, height in inches) of a legend of `labels` below a panel: as many columns as
    fit the panel's width (up to 4), filled column by column as matplotlib does."""
    from matplotlib.textpath import TextPath

    em = LEGEND_FONT / 72  # inches
    text = [TextPath((0, 0), label, size=LEGEND_FONT).get_extents().width / 72
            for label in labels]
    for columns in range(min(4, max(1, len(labels))), 0, -1):
        rows = -(-len(labels) // columns)
        widest = [max(text[c * rows:(c + 1) * rows], default=0) for c in range(columns)]
        # the handle (4 em), its pad (0.8 em), the text, the space between columns (1.2 em)
        if sum(6 * em + w for w in widest) <= PANEL_WIDTH_IN - 0.6 or columns == 1:
            return columns, rows * 1.5 * em + 0.2
    return 1, 0.2


def figure(panels):
    """busbw.png's figure: one panel per (records, sizes, title), two to a row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 2 if len(panels) > 1 else 1
    grid = [panels[i:i + columns] for i in range(0, len(panels), columns)]
    title_h, label_h, gap = 0.45, 0.6, 0.3
    layouts = [[_legend_layout([legend_label(r["name"]) for r in records
                                if r.get("busbw_gbps")]) for records, _, _ in row]
               for row in grid]
    heights = [title_h + AXES_HEIGHT_IN + label_h + max(h for _, h in row) + gap
               for row in layouts]
    fig_w, fig_h = columns * PANEL_WIDTH_IN, sum(heights)
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=PLOT_DPI)
    top = fig_h
    for row, row_layouts, height in zip(grid, layouts, heights):
        for c, ((records, sizes, title), (ncol, legend_h)) in enumerate(zip(row, row_layouts)):
            left = c * PANEL_WIDTH_IN + 0.8
            ax = fig.add_axes([left / fig_w, (top - title_h - AXES_HEIGHT_IN) / fig_h,
                               (PANEL_WIDTH_IN - 1.1) / fig_w, AXES_HEIGHT_IN / fig_h])
            legend_box = ((c * PANEL_WIDTH_IN + 0.3) / fig_w,
                          (top - title_h - AXES_HEIGHT_IN - label_h - legend_h) / fig_h,
                          (PANEL_WIDTH_IN - 0.6) / fig_w, legend_h / fig_h)
            plot_panel(ax, records, sizes, title, ncol, legend_box)
        top -= height
    return fig


def plot(panels, path):
    """Writes busbw.png (figure)."""
    import matplotlib.pyplot as plt

    fig = figure(panels)
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot_panel(ax, records, sizes, title, ncol=2, legend_box=None):
    """One section's busbw against size, log-log, its legend in legend_box (figure
    coordinates: x, y, width, height), else beside the axes."""
    import matplotlib.ticker

    for r, style in zip(records, line_styles(records)):
        points = [(s, r["busbw_gbps"].get(str(s))) for s in sizes]
        points = [(s, b) for s, b in points if b is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=legend_label(r["name"]), **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # speedups read as vertical distances; baselines stay visible
    ax.set_xticks(sizes, [mib(s) for s in sizes], rotation=30 if len(sizes) > 8 else 0)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.tick_params(labelsize=8)
    ax.set_xlabel("message size (bytes per rank)", fontsize=9)
    ax.set_ylabel("busbw (GB/s)", fontsize=9)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))

    def minor_label(value, _):  # 2, 3 and 5 of each decade where the axis spans 2 or fewer
        low, high = ax.get_ylim()
        mantissa = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
        return f"{value:g}" if high <= 100 * low and mantissa in (2, 3, 5) else ""
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor_label))
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if not ax.lines:
        return
    if legend_box is None:
        ax.legend(fontsize=LEGEND_FONT, ncol=1, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  handlelength=4)
    else:
        ax.legend(fontsize=LEGEND_FONT, ncol=ncol, loc="upper left", mode="expand",
                  bbox_to_anchor=legend_box, bbox_transform=ax.figure.transFigure,
                  handlelength=4, frameon=False, borderaxespad=0, columnspacing=1.2)
