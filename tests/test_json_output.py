"""One way to print (issue 59): every command the command line has (its parser's subcommands,
not a hand list) takes `--json`, and its stdout is then one JSON document that
`reporters.json_text` wrote, nothing else; `--json PATH` writes the same to a file."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from nearlocal import reporters
from nearlocal.frontends.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "tests" / "fixtures" / "runs" / "h200-gpu-suite"
SPEC = ROOT / "examples" / "acceptance" / "serving-gpu.toml"


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> dict:
    """Every leaf command by its words (`baseline set`), from the parser itself."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _subcommands(sub, (*prefix, name)) or {(*prefix, name): sub}
    return found


COMMANDS = _subcommands(build_parser())


def _benchmark_file(path: Path) -> str:
    entries = [{"name": f"b{i}", "extra_info": {"case_id": f"load/dram/wb/{64 << i}B",
                                               "method": "load", "region": "dram",
                                               "pattern": f"{64 << i}B"},
                "stats": {"median": 1e-7 * (i + 1), "rounds": 5}} for i in range(2)]
    path.write_text(json.dumps({"benchmarks": entries, "datetime": 20261201}))
    return str(path)


def _trace(path: Path) -> str:
    lines = [{"timestamp": 10 * n, "input_length": 600 + 100 * n, "output_length": 1,
              "hash_ids": [1, 2 + n % 2]} for n in range(3)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


# Each command's arguments on the small fixture store (`store`: a copy of the H200 gpu suite's
# run); a command the parser has and this table lacks fails the test below.
ARGS: dict[tuple[str, ...], Callable[[Path, Path], list[str]]] = {
    ("probe",): lambda tmp, store: [],
    ("run",): lambda tmp, store: ["--method", "load", "--size", "64", "--budget", "0.02",
                                  "--processes", "1", "--out", str(tmp / "fresh")],
    ("runs",): lambda tmp, store: ["--out", str(store)],
    ("show",): lambda tmp, store: ["--out", str(store)],
    ("kv",): lambda tmp, store: ["--select", "dense:4"],
    ("report",): lambda tmp, store: ["--out", str(store)],
    ("whatif",): lambda tmp, store: ["--out", str(store)],
    ("import",): lambda tmp, store: [_benchmark_file(tmp / "bench.json"), "--out",
                                     str(tmp / "imported")],
    ("compare",): lambda tmp, store: [H200.name, H200.name, "--out", str(store)],
    ("baseline", "set"): lambda tmp, store: [H200.name, "--out", str(store)],
    ("baseline", "show"): lambda tmp, store: ["--out", str(store)],
    ("accept",): lambda tmp, store: [str(SPEC), H200.name, "--out", str(store)],
    ("faults",): lambda tmp, store: ["--kills", "3", "--lease", "30ms", "--grace", "60s",
                                     "--region", f"shm:nearlocal-test-json-{os.getpid()}",
                                     "--records", "8"],
    ("replay",): lambda tmp, store: ["--trace", _trace(tmp / "trace.jsonl"), "--layers", "0-1",
                                     "--seconds", "1", "--pool-bytes", "512MiB"],
}


def test_every_command_has_the_one_json_option_and_arguments_here():
    assert set(COMMANDS) == set(ARGS), "a command without a --json check here"
    for words, parser in COMMANDS.items():
        (option,) = [a for a in parser._actions if "--json" in a.option_strings]
        assert (option.nargs, option.const, option.metavar) == ("?", reporters.STDOUT, "PATH"), \
            words


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(H200, root / H200.name)
    return root


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
def test_each_commands_json_is_one_document_from_json_text(words, tmp_path, store, capsys,
                                                           monkeypatch):
    written: list[str] = []
    encode = reporters.json_text
    monkeypatch.setattr(reporters, "json_text", lambda data: written.append(encode(data))
                        or written[-1])
    code = main([*words, *ARGS[words](tmp_path, store), "--json"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    assert written and captured.out == written[-1], words  # stdout is the one encoder's text
    json.loads(captured.out)


def test_json_path_writes_the_same_document_beside_the_text(tmp_path, store, capsys):
    assert main(["kv", "--select", "dense:4", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    path = tmp_path / "kv.json"
    assert main(["kv", "--select", "dense:4", "--json", str(path)]) == 0
    assert "fragments" in capsys.readouterr().out  # the text, as without --json
    assert json.loads(path.read_text()) == alone
    assert main(["runs", "--out", str(store), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in listed["runs"]] == [H200.name] and listed["runs"][0]["complete"]


def test_json_text_is_strict_json():
    import numpy as np

    text = reporters.json_text({"nan": float("nan"), "inf": np.float64("inf"),
                                "n": np.int64(3), "a": np.arange(2), "p": Path("/x")})
    assert json.loads(text) == {"nan": None, "inf": None, "n": 3, "a": [0, 1], "p": "/x"}


@pytest.mark.parametrize("value", ["latest", "20261206T232330-10010b"])
def test_a_run_id_after_json_is_refused_not_written_to(tmp_path, capsys, monkeypatch, value):
    """`show --json RUN` read RUN as --json's PATH: it wrote a file named like the run and
    showed the latest run instead."""
    monkeypatch.chdir(tmp_path)
    assert main(["show", "--json", value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a run id" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
