"""Draws the report's plot data with matplotlib (Agg; no pyplot state): SVG text to embed in the
HTML report, PNG files beside the Markdown one. The sections (report.sections) compute the data."""

from __future__ import annotations

import io
import math
import re

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from nearlocal.report.document import PlotData
from nearlocal.units import format_size

LINE_STYLES = ("-", "--", ":", "-.")  # one per run: run 1 solid, run 2 dashed, ...
RUN_STYLE_NAMES = ("solid", "dashed", "dotted", "dash-dot")
PAPER_COLOR = "#111111"
# Okabe & Ito's colour-blind-safe palette (black kept for the papers' stars); with nine markers
# every series up to 72 has its own colour + marker pair, and neighbours differ in both.
COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442",
          "#882255")  # the last is Paul Tol's wine, for an eighth series (black is the papers')
# Nine shapes that do not pass for one another at 4.5 pt (a hexagon did for a circle: the 9th
# series, memcpy, read as a second blue circle beside load).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
MARKER_NAMES = {"o": "circle", "s": "square", "^": "triangle up", "D": "diamond",
                "v": "triangle down", "P": "plus", "X": "cross", "<": "triangle left",
                ">": "triangle right"}
REF_LINE_COLOR = "#777777"
# Reference lines (the papers' figures, crossovers) get a dash pattern each and a legend entry:
# labels written on the plot overlapped where two figures lie close (B12's 22.5 and 26 GB/s).
REF_DASHES = ((0, (4, 3)), (0, (1, 2)), (0, (6, 2, 1, 2)), (0, (2, 4)), (0, (8, 3)),
              (0, (3, 1, 1, 1, 1, 1)))


def series_styles(plot: PlotData) -> list[tuple[str, str, str]]:
    """(label, colour, marker) of each series as drawn: no two share both colour and marker up
    to len(COLORS) x len(MARKERS) series, and neighbours differ in both."""
    return [(s.label, COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)])
            for i, s in enumerate(plot.series)]


def _size_ticks(low: float, high: float) -> list[float]:
    """Powers of four (64 B, 256 B, 1 KiB ...) spanning the data."""
    start = math.floor(math.log2(max(low, 1)))
    stop = math.ceil(math.log2(max(high, 1)))
    step = 2 if stop - start > 8 else 1
    return [2.0**k for k in range(start - start % step, stop + 1, step)]


def draw(plot: PlotData) -> Figure:
    figure = Figure(figsize=(10.5, 4.8))
    figure.subplots_adjust(left=0.07, right=0.66, bottom=0.11, top=0.93)  # legend on the right
    FigureCanvasAgg(figure)  # the Agg canvas: no pyplot, no display, no global state
    ax = figure.add_subplot()
    for series, (_, color, marker) in zip(plot.series, series_styles(plot), strict=True):
        style = LINE_STYLES[series.run % len(LINE_STYLES)] if plot.connect else "none"
        ax.plot(series.x, series.y, label=series.label, color=color,
                linestyle=style, marker=marker,
                markersize=4.5 if plot.connect else 6, markeredgecolor="#333333",
                markeredgewidth=0.4, linewidth=1.4, alpha=0.95)
    by_x: dict[float, list] = {}
    for point in plot.points:
        by_x.setdefault(point.x, []).append(point)
    for group in by_x.values():  # labels at one size alternate sides so they do not overlap
        for index, point in enumerate(sorted(group, key=lambda p: p.y)):
            right = index % 2 == 0
            ax.scatter([point.x], [point.y], marker="*", s=140, color=PAPER_COLOR, zorder=5)
            ax.annotate(point.label, (point.x, point.y), textcoords="offset points",
                        xytext=(7 if right else -7, 0), ha="left" if right else "right",
                        va="center", fontsize=7, color=PAPER_COLOR, zorder=6,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                              "alpha": 0.8})
    for index, line in enumerate(sorted(plot.lines, key=lambda line: -line.value)):
        draw_line = ax.axhline if line.axis == "y" else ax.axvline
        draw_line(line.value, color=REF_LINE_COLOR, linestyle=REF_DASHES[index % len(REF_DASHES)],
                  linewidth=1.0, label=line.label)  # named in the legend, never on the plot
    if not plot.linear:
        if not plot.categories:
            ax.set_xscale("log", base=2 if plot.x_is_size else 10)
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
    xs = [x for s in plot.series for x in s.x] + [p.x for p in plot.points] + [
        line.value for line in plot.lines if line.axis == "x"]
    if plot.x_is_size and xs:
        ticks = _size_ticks(min(xs), max(xs))
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(round(v))))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if plot.categories:
        ax.set_xticks(range(1, len(plot.categories) + 1), plot.categories, fontsize=8)
        ax.set_xlim(0.5, len(plot.categories) + 0.5)
    ax.set_xlabel(plot.xlabel)
    ax.set_ylabel(plot.ylabel)
    ax.set_title(plot.title, fontsize=11, loc="left")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.6)
    if not plot.series:
        ax.text(0.5, 0.5, "no measured rows for this plot: only the papers' figures are shown",
                transform=ax.transAxes, ha="center", va="center", fontsize=9, color="#888888")
    if plot.points:
        ax.scatter([], [], marker="*", s=100, color=PAPER_COLOR, label="paper figure (reported)")
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
                  ncols=1 if len(handles) <= 24 else 2, borderaxespad=0)
    return figure


def caption(plot: PlotData) -> str:
    """What the plot draws, naming only what is drawn: stars only when the papers' figures are
    points, dashed lines only when reference lines are drawn, line styles only for several runs."""
    parts = [("each coloured line is one of this box's series (median per size)" if plot.connect
              else "each colour and marker is one of this box's series (markers only: the "
              "points are separate cases, not a sweep)")]
    runs = sorted({s.run for s in plot.series})
    if plot.connect and len(runs) > 1:
        parts.append("line style = run (" + ", ".join(
            f"{RUN_STYLE_NAMES[r % len(RUN_STYLE_NAMES)]} #{r + 1}" for r in runs) + ")")
    if plot.points:
        parts.append("black stars are the papers' figures (as reported)")
    if plot.lines:
        kinds = []
        if any("crossover" not in line.label for line in plot.lines):
            kinds.append("the papers' figures (as reported)")
        if any("crossover" in line.label for line in plot.lines):
            kinds.append("crossovers found from this box's medians")
        parts.append("grey dashed lines (each its own dash, named in the legend) are "
                     + " and ".join(kinds))
    if plot.unmeasured:
        parts.append("not measured in this run: " + ", ".join(plot.unmeasured))
    if not plot.series:
        parts.append("no measured series")
    return "; ".join(parts) + "."


_ID = re.compile(r'id="([^"]+)"')


def svg_text(plot: PlotData, prefix: str) -> str:
    """Inline SVG markup; ids are prefixed so several plots share one HTML page safely."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "nearlocal"}):
        draw(plot).savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    ids = set(_ID.findall(text))
    text = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', text)
    text = re.sub(r'(href="#|url\(#)([^")]+)',
                  lambda m: m.group(1) + (f"{prefix}-{m.group(2)}" if m.group(2) in ids
                                          else m.group(2)), text)
    return text


def png_bytes(plot: PlotData) -> bytes:
    """The plot as PNG, in memory: the caller writes it with the report (safeio.write_outputs)."""
    buffer = io.BytesIO()
    draw(plot).savefig(buffer, format="png", dpi=110, metadata={"Software": None},
                       bbox_inches="tight")
    return buffer.getvalue()
