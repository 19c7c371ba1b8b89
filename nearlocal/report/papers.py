"""The papers' reference figures (nearlocal/data/papers.toml), loaded once into typed records.

Every figure is as reported by its paper, never measured here; reports show the provenance."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

# Time units to nanoseconds; other units are shown as they are.
_TIME_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_SIZE_B = {"B": 1, "KB": 1024, "MB": 1024**2}  # the papers' sizes are powers of two


@dataclass(frozen=True)
class Value:
    name: str
    unit: str
    value: float | None = None  # a single number, or
    low: float | None = None  # a range
    high: float | None = None

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
        number = (f"{self.value:g}" if self.value is not None
                  else f"{self.low:g} – {self.high:g}")
        return f"{number} {self.unit}" if self.unit != "count" else number


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


def _load() -> dict[str, Figure]:
    text = resources.files("nearlocal").joinpath("data/papers.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    papers = {key: Paper(key, p["title"], p["arxiv"], p["venue"], p["setting"])
              for key, p in data["papers"].items()}
    figures = {}
    for entry in data["figure"]:
        values = tuple(Value(v["name"], v["unit"], v.get("value"), v.get("low"), v.get("high"))
                       for v in entry["values"])
        for value in values:
            if (value.value is None) == (value.low is None or value.high is None):
                raise ValueError(f"papers.toml: {entry['id']} {value.name}: give value or low+high")
        if entry["id"] in figures:
            raise ValueError(f"papers.toml: figure {entry['id']} declared twice")
        figures[entry["id"]] = Figure(entry["id"], papers[entry["paper"]], entry["what"],
                                      entry["text"], entry["provenance"], values)
    return figures


@cache
def figures() -> dict[str, Figure]:
    """Every reference figure by ID (B1 ... S5), in the file's order."""
    return _load()


def figure(figure_id: str) -> Figure:
    return figures()[figure_id]
