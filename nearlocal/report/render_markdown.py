"""The report as Markdown, with each plot as a PNG file beside it."""

from __future__ import annotations

from pathlib import Path

from nearlocal import safeio
from nearlocal.report.document import Report, Section, Table, header
from nearlocal.report.fmt import NOT_CONVERGED_MEANS, cell_text, collapsed_text, numeric
from nearlocal.report.plots import caption, png_bytes


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: Table) -> str:
    heads = [_escape(header(c)) for c in table.columns]
    align = ["---:" if numeric(c) else ":---" for c in table.columns]
    lines = ["| " + " | ".join(heads) + " |", "| " + " | ".join(align) + " |"]
    for row in table.rows:
        cells = [_escape(cell_text(c, v)) for c, v in zip(table.columns, row, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _section(section: Section, stem: str, folder: Path, plots: dict[Path, bytes]) -> str:
    parts = [f"## {section.title}", ""]
    parts += [f"**{lead}**\n" for lead in section.lead]
    parts += [section.intro, ""] if section.intro else []
    for ref in section.refs:
        parts.append(f"- **{ref.id}** ({ref.citation}): {_escape(ref.what)} — "
                     f"**{_escape(ref.text)}**")
    if section.refs:
        parts.append("")
    if section.absent:
        parts += [f"> {section.absent}", ""]
    if section.table is not None and section.table.rows:
        parts += [table_markdown(section.table), ""]
    if section.table is not None and section.table.collapsed:
        parts += [f"- {collapsed_text(section.table, c)}" for c in section.table.collapsed]
        parts.append("")
    for note in section.notes:
        parts.append(f"- {note}")
    if section.notes:
        parts.append("")
    for plot in section.plots:
        path = folder / f"{stem}-{plot.name}.png"
        plots[path] = png_bytes(plot)
        parts += [f"![{plot.title}]({path.name})", "", f"*{plot.title}: {caption(plot)}*", ""]
    return "\n".join(parts)


def markdown(report: Report, path: Path) -> tuple[str, dict[Path, bytes]]:
    """The Markdown for PATH and its PNG plots (PATH's stem + plot name, beside it)."""
    path = Path(path)
    plots: dict[Path, bytes] = {}
    runs = ", ".join(f"{r.run_id} ({r.host})" for r in report.runs)
    body = [f"# nearlocal report: {runs}", "",
            "The papers' figures (as reported by the papers, never measured here) beside what "
            f"this box measured. Latency cells: median (10th–90th percentile); {NOT_CONVERGED_MEANS}.",
            ""]
    body += [_section(s, path.stem, path.parent, plots) for s in report.sections]
    return "\n".join(body), plots


def write_markdown(report: Report, path: Path, option: str = "--markdown") -> list[Path]:
    """Writes PATH and its PNG plots (PATH's stem + plot name), all or none (a full disk);
    returns every file written, PATH first."""
    text, plots = markdown(report, path)
    written = safeio.write_outputs(option, {**plots, Path(path): text.encode()})
    return [written[-1], *written[:-1]]
