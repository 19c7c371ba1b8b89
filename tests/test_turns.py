"""Runs that take turns (engine/stability/turns.py): the arms' passes alternate, round by round with every
other round reversed; an arm that is done or dead loses its slots; bad --turn input is one line."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nearlocal.engine.stability import turns as turns_module
from nearlocal.engine.stability.turns import Turns, parse_turn, slot_arm
from nearlocal.errors import UsageError
from nearlocal.store.catalogue import list_runs


def test_slots_go_round_by_round_every_other_round_reversed():
    assert [slot_arm(s, 3) for s in range(9)] == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    assert [slot_arm(s, 2) for s in range(6)] == [0, 1, 1, 0, 0, 1]


@pytest.mark.parametrize("text", ["1", "a/2", "2/2", "0/1", "-1/3", "", "0/100000000"])
def test_a_bad_turn_is_one_line(text):
    with pytest.raises(UsageError, match="--turn"):
        parse_turn(text)


def _arm(directory: str, arm: int, arms: int, passes: int, log: str) -> None:
    turns = Turns.open(directory, f"{arm}/{arms}")
    for index in range(passes):
        turns.take()
        with open(log, "a") as out:  # one short write per pass: O_APPEND keeps lines whole
            out.write(f"{arm} {index} start\n")
        time.sleep(0.01)  # a pass: another arm's write here would break the alternation
        with open(log, "a") as out:
            out.write(f"{arm} {index} end\n")
    turns.finish()


def _run_group(tmp_path, passes: list[int]) -> list[tuple[int, int]]:
    log = str(tmp_path / "log")
    context = multiprocessing.get_context("fork")
    arms = [context.Process(target=_arm, args=(str(tmp_path / "meet"), arm, len(passes), n, log))
            for arm, n in enumerate(passes)]
    for process in arms:
        process.start()
    for process in arms:
        process.join(60)
        assert process.exitcode == 0
    lines = [line.split() for line in Path(log).read_text().splitlines()]
    starts = [(int(a), int(p)) for a, p, what in lines if what == "start"]
    # no pass overlaps another: every start is followed by its own end
    assert [(int(a), int(p)) for a, p, what in lines if what == "end"] == starts
    assert all(lines[2 * i][:2] == lines[2 * i + 1][:2] for i in range(len(starts)))
    return starts


def test_two_arms_alternate_pass_by_pass(tmp_path):
    starts = _run_group(tmp_path, [4, 4])
    assert starts == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)]


def test_an_arm_that_is_done_loses_its_slots(tmp_path):
    starts = _run_group(tmp_path, [3, 1, 4])
    assert starts == [(0, 0), (1, 0), (2, 0), (2, 1), (0, 1), (0, 2), (2, 2), (2, 3)]


def test_a_dead_arm_loses_its_slots(tmp_path):
    """An arm whose process died (killed mid-run) holds nobody up."""
    dead = 2**22 + 12345
    first = Turns.open(str(tmp_path / "meet"), "0/2", alive=lambda pid: pid != dead)
    with first._state() as state:  # arm 1 checked in from a process that is gone now
        state["pids"]["1"] = dead
        state["ready"].append(1)
    first.take()  # checks in; arm 1 is found dead: done
    assert first.holding
    first.take()  # hands slot 0 on; slots 1 and 2 were arm 1's, so 3 is arm 0's
    assert first.holding
    with first._state() as state:
        assert state["done"] == [1] and state["slot"] == 3


def test_an_arm_that_died_before_checking_in_holds_nobody_up(tmp_path):
    dead = 2**22 + 12345
    first = Turns.open(str(tmp_path / "meet"), "0/2", alive=lambda pid: pid != dead)
    with first._state() as state:  # arm 1 opened, then failed before its first pass
        state["pids"]["1"] = dead
    first.take()
    assert first.holding


def test_nobody_measures_before_every_arm_checked_in(tmp_path, monkeypatch):
    monkeypatch.setattr(turns_module, "CHECK_IN_S", 0.0)
    turns = Turns.open(str(tmp_path / "meet"), "0/3")
    with pytest.raises(UsageError, match="arms 1, 2 of 3 did not check in"):
        turns.take()


def test_a_group_of_another_size_or_a_taken_arm_is_refused(tmp_path):
    directory = str(tmp_path / "meet")
    Turns.open(directory, "0/2")
    with Turns.open(directory, "1/2")._state() as state:
        state["pids"]["0"] = os.getppid()  # arm 0 is a live process (this one's parent)
        state["pids"]["1"] = os.getppid()
    with pytest.raises(UsageError, match="a group of 2 arms meets there, not 3"):
        Turns.open(directory, "1/3")
    with pytest.raises(UsageError, match="arm 0 is already taken by process"):
        Turns.open(directory, "0/2")


def test_a_finished_group_leaves_the_directory_to_the_next(tmp_path):
    _run_group(tmp_path, [1, 1])
    turns = Turns.open(str(tmp_path / "meet"), "0/3")  # a new group of another size
    with turns._state() as state:
        assert state["arms"] == 3 and state["slot"] == 0 and state["done"] == []
        assert state["pids"] == {"0": os.getpid()}


def take_turns(cand: Path, base: Path, store: Path, *options: str) -> subprocess.CompletedProcess:
    """The candidate checkout's scripts/take_turns.sh BASE, as the README gives it, run from
    the candidate, its runs in `store` and its meeting place beside it."""
    env = {**os.environ, "NEARLOCAL_STORE": str(store), "PYTHON": sys.executable,
           "TMPDIR": str(store.parent)}
    return subprocess.run(["bash", str(cand / "scripts" / "take_turns.sh"), str(base), *options],
                          capture_output=True, text=True, env=env, cwd=cand, timeout=900)


def test_take_turns_script_runs_both_checkouts_in_turns_and_compares(tmp_path):
    """scripts/take_turns.sh BASE: two real runs (this checkout as both baseline and candidate)
    taking turns, stored with the group's facts, then compare's Markdown naming the case."""
    root = Path(__file__).resolve().parent.parent
    store = tmp_path / "store"
    done = take_turns(root, root, store, "--method", "load", "--size", "4KiB", "--processes", "2",
                      "--budget", "0.1")
    # the same code on both sides: a `slower` (exit 1) would be a false regression
    assert done.returncode == 0, done.stdout + done.stderr
    # the case is listed when it changed or is ambiguous, else counted among the `same`
    assert "load/dram/wb/4KiB" in done.stdout or "1 same" in done.stdout, done.stdout
    metas = [json.loads((run / "run.json").read_text()) for run in list_runs(store)]
    assert sorted(meta["turns"]["arm"] for meta in metas) == [0, 1]
    assert all(meta["turns"]["arms"] == 2 for meta in metas)
    assert all(meta["for_gate"] == "code" for meta in metas)  # runs made for code CI
    assert "code CI, paired: the runs took turns" in done.stdout


def test_take_turns_script_refuses_a_base_that_is_no_checkout(tmp_path):
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(["bash", str(root / "scripts" / "take_turns.sh"), str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "BASE is a checkout of nearlocal" in done.stderr


def detection_curve():
    """scripts/detection_curve.py as a module: its regressions injected into a tree's kernels."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "detection_curve.py"
    spec = importlib.util.spec_from_file_location("detection_curve", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_take_turns_measures_each_tree_with_its_own_code(tmp_path):
    """Code CI compares two trees' code: a candidate whose chase and load kernels do 3x their
    work reads `slower` for both cases, exit 1, and each run says which tree its code came from
    (python -c once put the candidate's checkout first on the baseline's path: both sides
    measured the candidate). The slowdown is measured alone first, both trees' kernels in turns
    on one buffer: the verdict follows from what it measured on this box, not from what it was
    meant to be (issue 56: a "~10x" chain of multiply-adds compiled to a closed form and read
    1.2x, too little for 4 processes to call)."""
    curve = detection_curve()
    root = Path(__file__).resolve().parent.parent
    base = curve.checkout_copy(root, tmp_path / "base")
    cand = curve.checkout_copy(root, tmp_path / "cand")
    curve.inject(cand, {"chase": 2.0, "load": 2.0})
    for kernel in ("chase", "load"):
        alone = curve.measure_alone(base, cand, kernel, "64KiB", rounds=11)
        # 3x the work: at least 2x alone on any box, or the injection is not what it claims
        assert alone > 2.0, f"the {kernel} kernel doing 3x its work read {alone:.2f}x alone"
    store = tmp_path / "store"
    # with 6 pairs, a 2x slowdown stays `slower` while the pairs spread up to ~50 %
    done = take_turns(cand, base, store, "--method", "chase,load", "--size", "64KiB",
                      "--processes", "6", "--budget", "0.2")
    assert done.returncode == 1, done.stdout + done.stderr
    for case in ("chase/dram/wb/64KiB", "load/dram/wb/64KiB"):
        assert re.search(rf"\| slower +\| {case} ", done.stdout), done.stdout
    metas = {json.loads((run / "run.json").read_text())["turns"]["arm"]:
             json.loads((run / "run.json").read_text()) for run in list_runs(store)}
    assert metas[0]["code"]["path"] == str(base) and metas[1]["code"]["path"] == str(cand)


def test_compare_refuses_runs_whose_code_came_from_another_tree(tmp_path, capsys):
    from nearlocal.frontends.cli import main

    store = tmp_path / "store"
    assert main(["run", "--method", "load", "--size", "4KiB", "--budget", "0.02", "--out",
                 str(store), "--quiet"]) == 0
    capsys.readouterr()
    here = str(Path(__file__).resolve().parent.parent)
    assert main(["compare", "latest", "latest", "--out", str(store), "--trees", here, here]) in (0, 1)
    capsys.readouterr()
    assert main(["compare", "latest", "latest", "--out", str(store), "--trees", str(tmp_path), here]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"measured the code of {here}, not {tmp_path}" in err
