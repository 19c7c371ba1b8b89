"""Reference boxes: path figures from named, dated sources (a paper, a public measurement, a
vendor's claim), one TOML file each in nearlocal/data/references/ (its README says the format).
`whatif --reference NAME` fills the hops a box did not measure from one, labelled per term; a
figure here was never measured by nearlocal. Adding a box is one data file."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from nearlocal import safeio
from nearlocal.core.methods import CALL_RULES
from nearlocal.errors import UsageError
from nearlocal.whatif.fit import PathFit
from nearlocal.whatif.paths import HOPS

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "data" / "references"
KINDS = ("paper", "public-measurement", "vendor-claim", "measured-run")


@dataclass(frozen=True)
class ReferenceBox:
    name: str
    title: str
    kind: str
    source: str
    date: str
    links: dict[str, tuple[PathFit, ...]]  # hop -> its stated model (a run's: every way)

    @property
    def label(self) -> str:
        return f"reference {self.name} ({self.kind}: {self.source}, {self.date})"


def reference_names() -> list[str]:
    return sorted(p.stem for p in REFERENCE_DIR.glob("*.toml"))


def _number(link: dict, key: str, where: str, default: float | None = None,
            signed: bool = False) -> float:
    """A link's number: finite, and >= 0 unless `signed` (a per-fragment cost is below zero
    where calls overlap: a stream of copies costs less per copy than one isolated copy's a)."""
    value = link.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or (value < 0 and not signed):
        raise UsageError(f"{where}: {key} must be a finite number"
                         f"{'' if signed else ' >= 0'}, got {value!r}")
    return float(value)


def parse_reference(data: dict, where: str) -> ReferenceBox:
    """A reference box from its TOML data; a malformed one is a one-line error naming it."""
    box = data.get("box")
    if not isinstance(box, dict):
        raise UsageError(f"{where}: no [box] table")
    missing = [k for k in ("name", "title", "kind", "source", "date") if not box.get(k)]
    if missing:
        raise UsageError(f"{where}: [box] lacks {', '.join(missing)}")
    if box["kind"] not in KINDS:
        raise UsageError(f"{where}: kind {box['kind']!r} is not one of {', '.join(KINDS)}")
    label = f"reference {box['name']} ({box['kind']}: {box['source']}, {box['date']})"
    links: dict[str, tuple[PathFit, ...]] = {}
    for number, link in enumerate(data.get("link") or [], 1):
        at = f"{where}: link {number}"
        hop = link.get("hop")
        if hop not in HOPS:
            raise UsageError(f"{at}: hop {hop!r} is not one of {', '.join(HOPS)}")
        if hop in links:
            raise UsageError(f"{at}: hop {hop!r} is stated twice")
        bandwidth = _number(link, "bandwidth_gbps", at)
        if bandwidth <= 0:
            raise UsageError(f"{at}: bandwidth_gbps must be above 0")
        calls = link.get("calls", "one")
        if calls not in CALL_RULES:
            raise UsageError(f"{at}: calls {calls!r} is not one of {', '.join(CALL_RULES)}")
        facts = {"max_sge": int(_number(link, "max_sge", at, 0))} if "max_sge" in link else {}
        notes = () if "calls" in link else (
            f"{label}: the source states no call count; one call per read assumed",)
        links[hop] = (PathFit(hop, f"{label}: {link.get('basis', '')}".rstrip(": "), calls,
                               _number(link, "call_us", at, 0.0) * 1e3, source=label,
                               facts=facts, bandwidth_gbps=bandwidth,
                               fragment_ns=_number(link, "fragment_us", at, 0.0,
                                                   signed=True) * 1e3,
                               notes=notes),)
    return ReferenceBox(str(box["name"]), str(box["title"]), str(box["kind"]),
                        str(box["source"]), str(box["date"]), links)


def _run_source(run) -> tuple[str, str, str]:
    """A stored run as a reference's (title, source, date): its id, host, CPU and GPUs."""
    inventory = run.meta.get("inventory") or {}
    host = str(inventory.get("hostname", "?"))
    gpus = ", ".join(str(d.get("name")) for d in (inventory.get("gpu") or {}).get("devices", []))
    machine = str((inventory.get("cpu") or {}).get("model", "?")) + (f"; {gpus}" if gpus else "")
    title = f"nearlocal run {run.run_id} on {host}"
    return title, f"{title} ({machine})", str(run.meta.get("started", "?"))[:10]


def run_reference(run, measured: dict[str, list[PathFit]]) -> ReferenceBox:
    """A stored run of this project promoted to a reference: its fitted hops, labelled with the
    run's id, host and date (for a box without a GPU, a GPU box's run)."""
    title, source, date = _run_source(run)
    box = ReferenceBox(run.run_id, title, "measured-run", source, date, {})
    return replace(box, links={hop: tuple(replace(m, source=box.label) for m in models)
                               for hop, models in measured.items()})


def promoted_toml(run, measured: dict[str, list[PathFit]], name: str,
                  choose) -> str:
    """A stored run as a reference box file (what `whatif RUN --promote NAME` prints): per hop
    the way `choose(models)` picks, as a + s / BW per transfer and d per fragment, with the run,
    its host, its date and the rows it was fitted from."""
    title, source, date = _run_source(run)
    lines = [f"# promoted from {source}, {date}: figures fitted from that run's rows "
             "(nearlocal whatif --promote)",
             "[box]", f'name = "{name}"', f'title = "{title}"', 'kind = "measured-run"',
             f'source = "{source}"', f'date = "{date}"']
    for hop, models in sorted(measured.items()):
        model = choose(models)
        if not model.singles:
            continue
        top = model.singles[-1]
        bandwidth = top.size / max(top.ns - model.call_ns, 1e-9)
        extras = [p.ns - p.size / bandwidth for p in model.fragmented]
        fragment_ns = sorted(extras)[len(extras) // 2] if extras else 0.0
        lines += ["", "[[link]]", f'hop = "{hop}"', f"bandwidth_gbps = {bandwidth:.4g}",
                  f"call_us = {model.call_ns / 1e3:.4g}",
                  f"fragment_us = {fragment_ns / 1e3:.4g}", f'calls = "{model.calls}"']
        if "max_sge" in model.facts:
            lines.append(f"max_sge = {int(model.facts['max_sge'])}")
        rows = ", ".join(model.rows)
        lines.append(f'basis = "{model.way}: a from the smallest single transfer, bandwidth '
                     f'from the largest, d the median over the many-fragment rows; rows {rows}"')
    return "\n".join(lines) + "\n"


def load_reference(name: str) -> ReferenceBox:
    """A shipped reference box by name, or the path of a TOML file in the same format."""
    path = Path(name) if name.endswith(".toml") else REFERENCE_DIR / f"{name}.toml"
    if not name.endswith(".toml") and not path.is_file():
        raise UsageError(f"unknown reference box {name!r}: shipped are "
                         f"{', '.join(reference_names())}, or give the path of a .toml file")
    # bounded, a regular file only: a FIFO or a huge file is one line, never a hang
    raw = safeio.read_input(path, "reference box")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"reference box {path}: not valid TOML: {exc}") from None
    return parse_reference(data, f"reference box {path}")
