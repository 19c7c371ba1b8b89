"""The papers' reference figures (nearlocal/data/papers.toml), loaded once into typed records.

Every figure is as reported by its paper, never measured here; reports show the provenance. The
stated entries (`stated()`) are hardware figures a paper or its vendor states (a switch box's total
bandwidth): ceilings to name, never figures a measurement is compared with."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

# Time units to nanoseconds; other units are shown as they are.
_TIME_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_SIZE_B = {"B": 1, "KB": 1024, "MB": 1024**2}  # the papers' sizes are powers of two
_ATTACHED = {"%", "x"}  # units the papers write against the number: "+33.2%", "2.7x"
_WORD_QUALIFIERS = {"up to", "<", ">"}  # qualifiers written with a space before the number
REPORTED, STATED = "reported", "stated"  # a figure the paper measured; one it (or a vendor) states


def paper_number(number: float) -> str:
    """A number as papers.toml holds it, so as the paper writes it: 1,024 and 13.0, not 1024
    and 13."""
    if isinstance(number, int):
        return f"{number:,}"
    return repr(float(number))


@dataclass(frozen=True)
class Value:
    name: str
    unit: str
    value: float | None = None  # a single number, or
    low: float | None = None  # a range
    high: float | None = None
    qualifier: str = ""  # the paper's word before the number: "~", ">=", "<", "up to", "+"

    @property
    def central(self) -> float:
        """The number to compare against: the value, or a range's midpoint."""
        if self.value is not None:
            return self.value
        return (self.low + self.high) / 2

    def ns(self) -> float:
        """The central value in nanoseconds (time units only)."""
        if self.unit not in _TIME_NS:
            raise ValueError(f"{self.name} is in {self.unit}, not a time")
        return self.central * _TIME_NS[self.unit]

    def bytes(self) -> int:
        if self.unit not in _SIZE_B:
            raise ValueError(f"{self.name} is in {self.unit}, not a size")
        return int(self.central * _SIZE_B[self.unit])

    def text(self) -> str:
        """The value as the paper writes it: its qualifier, digits and unit ("~16 GB/s",
        "+33.2%", "< 24 KB", "$1,745", "1,024")."""
        if self.value is not None:
            number = paper_number(self.value)
        elif self.unit in _ATTACHED:
            number = f"{paper_number(self.low)}{self.unit} – {paper_number(self.high)}"
        else:
            number = f"{paper_number(self.low)} – {paper_number(self.high)}"
        if self.unit == "USD":
            number = f"${number}"
        elif self.unit in _ATTACHED:
            number = f"{number}{self.unit}"
        elif self.unit != "count":
            number = f"{number} {self.unit}"
        space = " " if self.qualifier in _WORD_QUALIFIERS else ""
        return f"{self.qualifier}{space}{number}" if self.qualifier else number


@dataclass(frozen=True)
class Paper:
    key: str
    title: str
    arxiv: str
    venue: str
    setting: str


@dataclass(frozen=True)
class Figure:
    id: str
    paper: Paper
    what: str
    text: str
    provenance: str
    values: tuple[Value, ...]
    kind: str = REPORTED  # STATED: a hardware figure stated, not measured (a ceiling at most)

    def value(self, name: str | None = None) -> Value:
        """One named value (the only one when `name` is None)."""
        if name is None:
            if len(self.values) != 1:
                raise KeyError(f"{self.id} has {len(self.values)} values; name one")
            return self.values[0]
        for value in self.values:
            if value.name == name:
                return value
        raise KeyError(f"{self.id} has no value {name!r}")

    @property
    def citation(self) -> str:
        return f"{self.paper.title.split(':')[0]}, arXiv {self.paper.arxiv}, {self.provenance}"


@cache
def _load() -> dict[str, dict[str, Figure]]:
    """papers.toml's [[figure]] and [[stated]] entries by kind, then ID (one ID space)."""
    text = resources.files("nearlocal").joinpath("data/papers.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    papers = {key: Paper(key, p["title"], p["arxiv"], p["venue"], p["setting"])
              for key, p in data["papers"].items()}
    loaded: dict[str, dict[str, Figure]] = {REPORTED: {}, STATED: {}}
    for kind, table in ((REPORTED, "figure"), (STATED, "stated")):
        for entry in data.get(table, []):
            values = tuple(Value(v["name"], v["unit"], v.get("value"), v.get("low"),
                                 v.get("high"), v.get("qualifier", ""))
                           for v in entry["values"])
            for value in values:
                if (value.value is None) == (value.low is None or value.high is None):
                    raise ValueError(f"papers.toml: {entry['id']} {value.name}: give value or "
                                     "low+high")
            if any(entry["id"] in known for known in loaded.values()):
                raise ValueError(f"papers.toml: figure {entry['id']} declared twice")
            loaded[kind][entry["id"]] = Figure(entry["id"], papers[entry["paper"]],
                                               entry["what"], entry["text"],
                                               entry["provenance"], values, kind)
    return loaded


def figures() -> dict[str, Figure]:
    """Every reference figure the papers report (B1 ... S5), by ID, in the file's order."""
    return _load()[REPORTED]


def stated() -> dict[str, Figure]:
    """The hardware figures stated, not measured (Beluga's switch box), by ID."""
    return _load()[STATED]


def figure(figure_id: str) -> Figure:
    """A figure the paper reports (a measurement of the paper's, to compare with)."""
    return figures()[figure_id]


def statement(stated_id: str) -> Figure:
    """A stated hardware figure: to name as a ceiling, never to compare a measurement with."""
    return stated()[stated_id]
