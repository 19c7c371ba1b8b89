"""What every command's output formats share, as google/benchmark's BenchmarkReporter: each
format is a `Reporter` of one command's model (the report, a comparison, an acceptance) that
gives the whole output as text, shows it on stdout or writes it to a file; a command's formats
are a `Reporters` registry by name, which its --format choices or per-format file options come
from. The renderers stay where they are (report/render_*.py, gate/render.py,
acceptance/render.py): a reporter wraps one. Every command's JSON comes from here: the command
builds plain data, `json_reporter` gives it as JSON (`json_text`, the one encoder), and `emit`
is the one `--json [PATH]` path (`add_json_option` wires it): `--json` alone puts the JSON on
stdout in place of the text, `--json PATH` writes it there beside the text. And the one JUnit
XML writer, to which the gate's comparison and acceptance's verdicts map their results (CI reads
both the same way). A utility below every layer that reports."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import re
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

from nearlocal import safeio
from nearlocal.errors import UsageError

M = TypeVar("M")
M_in = TypeVar("M_in", contravariant=True)


class Reporter(Protocol[M_in]):
    """One output format of a command's model."""

    @property
    def name(self) -> str:
        """The format's name: a --format choice, or the option --NAME PATH."""

    @property
    def help(self) -> str:
        """What the format is, for --help."""

    def report(self, model: M_in) -> str:
        """The whole output as text."""

    def show(self, model: M_in) -> None:
        """On stdout (a terminal's table in colour)."""

    def write(self, model: M_in, path: Path, option: str) -> list[Path]:
        """To PATH whole or not at all (files beside it too: a report's plots), PATH first;
        `option` names it in a one-line error."""


@dataclass(frozen=True)
class TextReporter(Generic[M]):
    """A format whose output is one text (Markdown, JSON, JUnit XML, HTML): on stdout as it is,
    in a file whole; `writer` where the file has others beside it."""

    name: str
    help: str
    render: Callable[[M], str]
    writer: Callable[[M, Path, str], list[Path]] | None = None

    def report(self, model: M) -> str:
        return self.render(model)

    def show(self, model: M) -> None:
        sys.stdout.write(self.report(model))

    def write(self, model: M, path: Path, option: str = "--output") -> list[Path]:
        if self.writer is not None:
            return self.writer(model, Path(path), option)
        return [safeio.write_output(option, path, self.report(model))]


@dataclass(frozen=True)
class ConsoleReporter(Generic[M]):
    """A format printed on a console (rich tables): in colour on a terminal, full-width Markdown
    tables in a pipe or a log, plain text in a file. `printer(model, file)`: None is stdout's own
    console."""

    name: str
    help: str
    printer: Callable[[M, IO[str] | None], None]

    def report(self, model: M) -> str:
        buffer = io.StringIO()
        self.printer(model, buffer)
        return buffer.getvalue()

    def show(self, model: M) -> None:
        self.printer(model, None)

    def write(self, model: M, path: Path, option: str = "--output") -> list[Path]:
        return [safeio.write_output(option, path, self.report(model))]


class Reporters(Generic[M]):
    """One command's formats by name, in the order registered; the first is the default (what
    the command prints when no other is asked for)."""

    def __init__(self, command: str):
        self.command = command
        self._formats: dict[str, Reporter[M]] = {}

    def register(self, reporter: Reporter[M]) -> Reporter[M]:
        if reporter.name in self._formats:
            raise ValueError(f"{self.command} has a format {reporter.name!r} already")
        self._formats[reporter.name] = reporter
        return reporter

    def __getitem__(self, name: str) -> Reporter[M]:
        try:
            return self._formats[name]
        except KeyError:
            raise UsageError(f"{self.command} has no format {name!r} (valid: "
                             f"{', '.join(self.names)})") from None

    def __iter__(self) -> Iterator[Reporter[M]]:
        return iter(self._formats.values())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._formats)

    @property
    def default(self) -> Reporter[M]:
        return next(iter(self._formats.values()))

    def others(self) -> list[Reporter[M]]:
        """Every format but the default: those a command writes to a file when asked."""
        return list(self._formats.values())[1:]

    def help(self) -> str:
        """`NAME (default): what; NAME: what; ...` for a --format option's help."""
        return "; ".join(f"{r.name}{' (default)' if r is self.default else ''}: {r.help}"
                         for r in self)

# ---------------------------------------------------------------------------------------------
# The one --json path

STDOUT = "-"  # `--json` given without a PATH: the JSON is the command's stdout


def plain(value: Any) -> Any:
    """`value` as JSON's own types: dataclasses and mappings as objects, sequences as arrays,
    numpy scalars and arrays as numbers and arrays, a path as text, a float that is not finite
    as null (strict JSON has no NaN). Nothing is computed: a printer only lays out."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # a numpy array or scalar (numpy is not imported here)
        return plain(value.tolist())
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # a pandas DataFrame
        return plain(value.to_dict(orient="records"))
    return str(value)  # a Path, an enum, a timestamp: as it reads


def json_text(data: Any) -> str:
    """The one JSON encoder of every command's output: strict JSON, one line per value."""
    return json.dumps(plain(data), indent=1, allow_nan=False) + "\n"


def json_reporter(to_data: Callable[[Any], Any] | None = None,
                  help: str = "the command's output as JSON") -> TextReporter[Any]:
    """A command's `json` format: its model made plain data by `to_data` (the model itself when
    it is plain data already), as JSON."""
    return TextReporter("json", help,
                        lambda model: json_text(to_data(model) if to_data else model))


def add_json_option(parser: argparse.ArgumentParser,
                    help: str = "the output as JSON: on stdout in place of the text, or "
                                "written to PATH") -> None:
    """Every command's `--json [PATH]`."""
    parser.add_argument("--json", nargs="?", const=STDOUT, metavar="PATH", type=json_target,
                        help=help)


RUN_ID_LIKE = re.compile(r"latest|\d{8}T\d{6}-[0-9a-z]+")


def json_target(value: str) -> str:
    """`--json`'s PATH, unless it is a run id (`show --json RUN` read RUN as the file to write
    and showed the latest run): said in one line, nothing written."""
    if RUN_ID_LIKE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is a run id, not a file to write the JSON to: put the run before "
            "--json (`show RUN --json`), or give --json a path")
    return value


def add_format_options(parser: argparse.ArgumentParser, formats: Reporters[Any]) -> None:
    """`--NAME PATH` for each format but the default (`--json [PATH]` for json)."""
    for reporter in formats.others():
        if reporter.name == "json":
            add_json_option(parser, reporter.help + " (no PATH: on stdout, in place of the text)")
        else:
            parser.add_argument(f"--{reporter.name}", metavar="PATH", help=reporter.help)


def check_outputs(formats: Reporters[Any], args: argparse.Namespace) -> None:
    """Before anything is measured: every file `--NAME PATH` (and `--json PATH`) names can be
    written, else one line (exit 2)."""
    from nearlocal import safeio

    for reporter in formats.others():  # --json alone (stdout): no file to check
        path = json_path(args) if reporter.name == "json" else getattr(args, reporter.name, None)
        safeio.check_output(f"--{reporter.name}", path)


def write_outputs(formats: Reporters[M], model: M, args: argparse.Namespace) -> None:
    """Each file format asked for by `--NAME PATH` (the JSON aside: `emit` writes it)."""
    for reporter in formats.others():
        path = getattr(args, reporter.name, None) if reporter.name != "json" else None
        if path:
            reporter.write(model, Path(path), f"--{reporter.name}")


def json_wanted(args: argparse.Namespace) -> bool:
    """Whether stdout carries the JSON: every other line the command says goes to stderr."""
    return getattr(args, "json", None) == STDOUT


def json_path(args: argparse.Namespace) -> str | None:
    """The file `--json PATH` names; None without one (no --json, or the JSON on stdout)."""
    target = getattr(args, "json", None)
    return None if target in (None, STDOUT) else target


def side_console(args: argparse.Namespace):
    """Where a command's lines beside its output go: stdout's console, or stderr's where stdout
    carries the JSON (so that it stays JSON)."""
    from nearlocal.terminal import console, err_console

    return err_console if json_wanted(args) else console


def emit(formats: Reporters[M], model: M, args: argparse.Namespace, text: bool = True) -> None:
    """The one `--json` path: `--json` alone shows the json format on stdout and nothing else;
    `--json PATH` writes it there whole, and the default format is shown as without it (`text`
    False: not shown)."""
    if json_wanted(args):
        formats["json"].show(model)
        return
    path = json_path(args)
    if path is not None:
        formats["json"].write(model, Path(path), "--json")
    if text:
        formats.default.show(model)


def on_console(printer: Callable[[M], None]) -> Callable[[M, IO[str] | None], None]:
    """A printer that prints on stdout's console (nearlocal.terminal.console) as a
    `ConsoleReporter`'s: into a file, that console is pointed at the file for the call."""
    def printed(model: M, file: IO[str] | None) -> None:
        if file is None:
            printer(model)
            return
        from nearlocal.terminal import console

        with console.into(file):
            printer(model)

    return printed


def command_formats(command: str, printer: Callable[[M], None],
                    to_data: Callable[[M], Any] | None = None,
                    text_help: str = "the text on the terminal (plain lines in a log or a "
                                     "pipe)") -> Reporters[M]:
    """A command's registry of the two formats every command has: its text (the default; a
    printer on stdout's console) and its JSON."""
    formats: Reporters[M] = Reporters(command)
    formats.register(ConsoleReporter("terminal", text_help, on_console(printer)))
    formats.register(json_reporter(to_data))
    return formats


# ---------------------------------------------------------------------------------------------
# JUnit

OUTCOMES = ("passed", "failed", "skipped")


@dataclass(frozen=True)
class JUnitCase:
    """One test case: passed (its detail in system-out), failed (a failure whose message and text
    are the detail) or skipped (a skipped element whose message is the detail)."""

    name: str
    classname: str
    seconds: float
    detail: str
    outcome: str = "passed"
    failure_type: str = ""  # the failure's type: what kind of failure CI is told it is

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")


def junit_xml(suite: str, cases: Sequence[JUnitCase], properties: Sequence[tuple[str, str]] = (),
              time_digits: int = 3) -> str:
    """One <testsuite> in <testsuites>, its counts from the cases' outcomes, stamped now (local
    time, as JUnit readers expect); `time_digits`: the decimals of each case's seconds."""
    element = ET.Element("testsuite", name=suite, tests=str(len(cases)),
                         failures=str(sum(c.outcome == "failed" for c in cases)), errors="0",
                         skipped=str(sum(c.outcome == "skipped" for c in cases)),
                         timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    if properties:
        listed = ET.SubElement(element, "properties")
        for name, value in properties:
            ET.SubElement(listed, "property", name=name, value=value)
    for case in cases:
        node = ET.SubElement(element, "testcase", classname=case.classname, name=case.name,
                             time=f"{case.seconds:.{time_digits}f}")
        if case.outcome == "failed":
            ET.SubElement(node, "failure", message=case.detail,
                          type=case.failure_type).text = case.detail
        elif case.outcome == "skipped":
            ET.SubElement(node, "skipped", message=case.detail)
        else:
            ET.SubElement(node, "system-out").text = case.detail
    root = ET.Element("testsuites")
    root.append(element)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
