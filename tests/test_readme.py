"""Every command line the README and the pages under docs/ show is one the CLI accepts: each
parses, every `run` line's selection expands to valid cases (region and pattern syntax, method
parameters), `kv` lines run, and one line is run for real with the store / show / report
commands after it."""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from nearlocal.core import cases as case_rules
from nearlocal.errors import UsageError
from nearlocal.frontends.cli import build_parser, main
from nearlocal.frontends.selection import selected_cases
from nearlocal.probe import probe
from nearlocal.probe.numa import NumaNode

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The README's first screen links reference pages under docs/: their recipes count the same.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# Placeholders the README uses for things only the reader's box has.
PLACEHOLDERS = {"RUN_A": "latest", "RUN_B": "latest", "$STORE": "{out}",
                '"$GITHUB_STEP_SUMMARY"': "{out}/summary.md"}
# What a region validator may say about a device this box lacks; anything else is a README error.
ABSENT_HERE = ("does not exist", "not a device-dax")


def readme_commands(text: str) -> list[str]:
    """Every `nearlocal ...` command in the README's code blocks (fenced or indented), with
    continuation lines joined and comments dropped."""
    commands, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or line.startswith("    ")):
            continue
        code, pending = pending + line.strip(), ""
        if code.endswith("\\"):
            pending = code[:-1] + " "
            continue
        for segment in code.split("&&"):
            segment = re.sub(r"^(- )?(if: .*|run: )", "", segment.strip()).split(" #")[0]
            if segment.strip().startswith("nearlocal "):
                commands.append(segment.strip())
    return commands


COMMANDS = list(dict.fromkeys(c for page in PAGES for c in readme_commands(page.read_text())))


def _argv(command: str, out: Path) -> list[str]:
    for name, value in PLACEHOLDERS.items():
        command = command.replace(name, value.format(out=out))
    return shlex.split(command)[1:]


def test_the_readme_shows_commands():
    assert len(COMMANDS) > 20
    assert any("--region dram,dram:thp,numa:0" in c for c in COMMANDS)
    first = readme_commands(README.read_text())  # the first screen: probe, run, report, accept
    assert {"nearlocal probe", "nearlocal run"} <= set(first)
    assert any(c.startswith("nearlocal accept ") for c in first)


def test_every_link_of_the_readme_and_its_pages_exists():
    for page in PAGES:
        for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / link).exists(), f"{page.name} links {link}, which is missing"


@pytest.fixture(scope="module")
def inventory():
    """This box, with a second (CPU-less) NUMA node so `numa:1` examples validate anywhere."""
    box = probe()
    if not any(n.node == 1 for n in box.numa):
        box = replace(box, numa=[*box.numa, NumaNode(1, [], 2**34, [20, 10])])
    return box


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_parses(command, tmp_path, inventory, capsys):
    if command == "nearlocal --version":
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["--version"])
        assert exited.value.code == 0 and capsys.readouterr().out.startswith("nearlocal 0.")
        return
    args = build_parser().parse_args(_argv(command, tmp_path))
    assert callable(args.func)
    if args.command != "run":
        return
    cases = selected_cases(args)
    assert cases
    for case in cases:
        try:
            case_rules.validate(case, inventory)
        except UsageError as exc:  # only the absence of the README's device is acceptable
            assert any(text in str(exc) for text in ABSENT_HERE), (command, str(exc))


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("nearlocal kv")])
def test_readme_kv_commands_run(command, tmp_path, capsys):
    assert main(_argv(command, tmp_path)) == 0
    assert capsys.readouterr().out.strip()


def test_a_readme_run_line_then_runs_show_and_report(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = next(c for c in COMMANDS if "--region dram,dram:thp,numa:0" in c)
    argv = _argv(line, tmp_path)
    assert main([*argv, "--quiet", "--budget", "0.02"]) == 0
    stored = capsys.readouterr().out
    run_id = Path(stored.split("stored ")[-1].strip()).name
    for command in ("nearlocal runs", "nearlocal show", "nearlocal show latest --all",
                    f"nearlocal show {run_id[:8]}", "nearlocal report --html report.html",
                    "nearlocal report --markdown report.md"):
        assert main(_argv(command, tmp_path)) == 0, command
    out = capsys.readouterr().out
    assert "dram:thp" in out and run_id in out
    assert (tmp_path / "report.html").exists() and (tmp_path / "report.md").exists()
    assert "wrote report.html" in out and "wrote report.md" in out


def parser_options() -> list[tuple[str, argparse.Action, str]]:
    """(command, option, its help as printed) for every option of every subcommand."""
    found = []

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}".strip())
                continue
            lazy = getattr(action, "lazy_help", None)
            found.append((command, action, lazy() if lazy else action.help or ""))

    walk(build_parser(), "")
    return found


def same_default(stated: str, default: object) -> bool:
    """A default as a help text or a page says it ("./results", "0.5 s", "5%%") against the
    parser's own."""
    stated = stated.strip().strip("`").removeprefix("./").removesuffix(" s").replace("%", "").strip()
    default = str(default).replace("%", "").strip()
    try:
        return float(stated) == float(default)
    except ValueError:
        return stated == default


def test_every_default_a_help_text_states_is_the_parsers():
    """A help text's "(default X)" is the default the parser applies: read from the parser,
    never from a copy (accept's --processes once said 0.03 s and 16 where the code had moved to
    0.015 s and 32; those rules are now worded from the engine's constants)."""
    wrong = []
    for command, action, text in parser_options():
        if action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            continue
        stated = re.search(r"\(default[: ]+([^;,):]+)", text)  # the option's own: the first
        if stated and not same_default(stated := stated.group(1), action.default):
            wrong.append(f"{command} {action.option_strings[0]}: help says {stated!r}, "
                         f"parser {action.default!r}")
    assert wrong == []


def test_every_default_the_pages_state_is_the_parsers():
    """README and docs: "`--FLAG` ... (default X)" names a default some command applies to that
    flag, and the worker-process rule they quote is the engine's."""
    from nearlocal.engine import processes

    defaults: dict[str, set] = {}
    for _, action, _ in parser_options():
        for flag in action.option_strings:
            defaults.setdefault(flag, set()).add(action.default)
    text = "\n".join(page.read_text() for page in PAGES)
    stated = re.findall(r"`(--[a-z-]+)[^`]*`[^`.;]{0,40}?\(default ([^;,)]+)\)", text)
    wrong = [f"{flag}: the pages say {value!r}, the parser {sorted(map(str, defaults[flag]))}"
             for flag, value in stated
             if flag in defaults and not any(same_default(value, d) for d in defaults[flag])]
    assert len(stated) >= 2 and wrong == []
    rule = re.findall(r"one per (\d+(?:\.\d+)?) s of `--budget`", text)
    first_look = re.findall(r"first look[^.]*?in up to (\d+)", text)
    assert rule and first_look
    assert {float(x) for x in rule} == {processes.MIN_PROCESS_BUDGET_S}
    assert {int(x) for x in first_look} == {processes.FIRST_LOOK_PROCESSES}


def test_the_running_page_names_every_suite():
    """docs/running.md's list of suites is the registry's (it once lacked storage, rack, rdma)."""
    from nearlocal.core.suites import SUITES, get_suite

    get_suite("quick")  # importing the method modules declares their suites
    listed = (ROOT / "docs" / "running.md").read_text().split("Suites (`--suite`):")[1].split("\n\n")[0]
    assert [name for name in SUITES if f"`{name}`" not in listed] == []
