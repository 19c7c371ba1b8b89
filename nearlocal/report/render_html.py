"""The report as ONE self-contained HTML file: inline CSS, plots as inline SVG, no scripts and no
network references, so it opens anywhere (mail it, attach it to a ticket)."""

from __future__ import annotations

from html import escape
from pathlib import Path

from nearlocal import safeio
from nearlocal.report.document import Report, Section, Stat, Table
from nearlocal.report.fmt import NOT_CONVERGED_MEANS, cell_text, collapsed_text, is_reason, numeric
from nearlocal.report.plots import caption, svg_text

CSS = """
:root { --ink: #1d2330; --dim: #6b7280; --line: #d9dde4; --band: #f5f7fa; --accent: #0b6bcb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0; background: #fff; }
header { background: #13243a; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 0; color: #c9d4e3; font-size: 13px; }
nav { padding: 10px 32px; border-bottom: 1px solid var(--line); background: var(--band);
      font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 14px; white-space: nowrap; }
main { padding: 8px 32px 40px; max-width: 1500px; }
section { margin: 26px 0 10px; }
h2 { font-size: 18px; margin: 0 0 6px; border-bottom: 2px solid var(--accent);
     padding-bottom: 3px; }
p.intro { color: var(--dim); margin: 4px 0 8px; }
ul.refs { margin: 4px 0 10px; padding-left: 18px; font-size: 13px; }
ul.refs .id { font-weight: 700; color: var(--accent); }
ul.refs .fig { font-weight: 600; }
ul.refs .prov { color: var(--dim); }
.absent { background: #fff7e0; border-left: 4px solid #e0a800; padding: 6px 10px; margin: 8px 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
th, td { border: 1px solid var(--line); padding: 3px 8px; vertical-align: top; }
th { background: var(--band); text-align: left; font-weight: 600; }
th.run { text-align: center; background: #e8eef7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.why { color: var(--dim); font-style: italic; font-size: 12px; max-width: 420px;
         white-space: normal; text-align: left; }
tbody tr:nth-child(even) td { background: #fbfcfd; }
ul.notes { margin: 6px 0; padding-left: 18px; }
figure { margin: 12px 0; }
figure svg { width: 100%; max-width: 1100px; height: auto; display: block; }
figcaption { color: var(--dim); font-size: 12px; }
footer { color: var(--dim); font-size: 12px; padding: 0 32px 24px; }
.verdict { background: #eef5ff; border-left: 5px solid var(--accent); padding: 10px 14px;
           margin: 8px 0 12px; font-size: 15px; max-width: 1100px; }
.verdict p { margin: 0 0 6px; }
.verdict p:last-child { margin-bottom: 0; }
ul.collapsed { margin: 2px 0 8px; padding-left: 18px; color: var(--dim); font-size: 13px; }
"""


def _header_rows(table: Table) -> str:
    runs = [c.run for c in table.columns]
    if not any(runs):
        return "<tr>" + "".join(f"<th>{escape(c.name)}</th>" for c in table.columns) + "</tr>"
    top, index = [], 0
    while index < len(runs):  # one spanning cell per run group, key columns span both rows
        run = runs[index]
        width = 1
        while index + width < len(runs) and runs[index + width] == run and run:
            width += 1
        if run:
            top.append(f'<th class="run" colspan="{width}">run #{escape(run)}</th>')
        else:
            top.append(f'<th rowspan="2">{escape(table.columns[index].name)}</th>')
        index += width
    second = "".join(f"<th>{escape(c.name)}</th>" for c in table.columns if c.run)
    return f"<tr>{''.join(top)}</tr><tr>{second}</tr>"


def table_html(table: Table) -> str:
    body = []
    for row in table.rows:
        cells = []
        for column, value in zip(table.columns, row, strict=True):
            text = escape(cell_text(column, value))
            if is_reason(value):
                cells.append(f'<td class="why">{text}</td>')
            elif numeric(column):
                title = ""
                if isinstance(value, Stat) and not value.converged:
                    title = ' title="the median\'s CI did not reach its target"'
                cells.append(f'<td class="num"{title}>{text}</td>')
            else:
                cells.append(f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table><thead>{_header_rows(table)}</thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _section(section: Section) -> str:
    parts = [f'<section id="{escape(section.key)}"><h2>{escape(section.title)}</h2>']
    if section.lead:
        parts.append('<div class="verdict">' + "".join(f"<p>{escape(p)}</p>"
                                                      for p in section.lead) + "</div>")
    if section.intro:
        parts.append(f'<p class="intro">{escape(section.intro)}</p>')
    if section.refs:
        items = "".join(
            f'<li><span class="id">{escape(r.id)}</span> {escape(r.what)}: '
            f'<span class="fig">{escape(r.text)}</span> '
            f'<span class="prov">({escape(r.citation)})</span></li>' for r in section.refs)
        parts.append(f'<ul class="refs">{items}</ul>')
    if section.absent:
        parts.append(f'<div class="absent">{escape(section.absent)}</div>')
    if section.table is not None and section.table.rows:
        parts.append(table_html(section.table))
    if section.table is not None and section.table.collapsed:
        parts.append('<ul class="collapsed">' + "".join(
            f"<li>{escape(collapsed_text(section.table, c))}</li>"
            for c in section.table.collapsed) + "</ul>")
    if section.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>"
                                                    for n in section.notes) + "</ul>")
    for plot in section.plots:
        parts.append(f'<figure class="plot">{svg_text(plot, f"{section.key}-{plot.name}")}'
                     f"<figcaption>{escape(plot.title)}: {escape(caption(plot))}"
                     "</figcaption></figure>")
    parts.append("</section>")
    return "\n".join(parts)


def report_html(report: Report) -> str:
    runs = ", ".join(f"{r.run_id} on {r.host}" for r in report.runs)
    nav = "\n".join(f'<a href="#{escape(s.key)}">{escape(s.title.split(" — ")[0])}</a>'
                    for s in report.sections)  # whitespace between links lets the bar wrap
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nearlocal report: {escape(runs)}</title>
<style>{CSS}</style></head>
<body>
<header><h1>nearlocal report</h1>
<p>{escape(runs)}. The Beluga and SwiftCache papers' figures (as reported by the papers, never
measured here) beside this box's medians. Latency cells: median (10th–90th percentile);
{escape(NOT_CONVERGED_MEANS)}.</p></header>
<nav>{nav}</nav>
<main>
{"".join(_section(s) for s in report.sections)}
</main>
<footer>Generated by nearlocal from {escape(", ".join(r.path for r in report.runs))}.</footer>
</body></html>
"""


def write_html(report: Report, path: Path) -> Path:
    return safeio.write_output("--html", path, report_html(report))  # whole or not at all
