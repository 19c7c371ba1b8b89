"""Issue 13, table-driven: every bad invocation and every damaged store is one line on stderr and
exit 2, never a traceback; an incomplete run is marked and refused as a baseline; nothing the user
owns is written, replaced or removed.

Issue 20 adds each cause class, tried with values other than the issue's (docs/bad-input.md):
run.json fields and Parquet columns of the wrong type, damaged baselines, outputs the OS refuses
(FIFO, devices, /proc, read-only and full tmpfs), unbounded inputs, meaningless values,
malformed imports, ASCII / closed / full stdout, undecodable arguments, a removed or read-only
working directory, SIGTERM to the process group."""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nearlocal.frontends.cli import main
from nearlocal.store import load
from nearlocal.store.catalogue import list_runs
from tests.report_fixtures import INVENTORY, make_run, row

GOOD = "good"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "acceptance"


@pytest.fixture
def store(tmp_path) -> Path:
    """A store with one good run (`good`) and a damaged copy of it per kind of damage."""
    root = tmp_path / "store"
    make_run(root, [row("load", size=64 * 2**k, median=100.0 + k) for k in range(4)], run_id=GOOD)
    good = root / GOOD
    for name, damage in DAMAGES.items():
        shutil.copytree(good, root / name)
        damage(root / name)
        meta = root / name / "run.json"
        if name.startswith("parquet") or name.startswith("samples"):
            data = json.loads(meta.read_text())
            meta.write_text(json.dumps({**data, "run_id": name}))
    return root


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {
    "json-empty": lambda run: (run / "run.json").write_text(""),
    "json-text": lambda run: (run / "run.json").write_text("not json {"),
    "json-binary": lambda run: (run / "run.json").write_bytes(b"\x89PNG\x00\xff\xfe"),
    "json-null": lambda run: (run / "run.json").write_text("null"),
    "json-list": lambda run: (run / "run.json").write_text("[1, 2, 3]"),
    "parquet-empty": lambda run: (run / "cases.parquet").write_bytes(b""),
    "parquet-truncated": lambda run: _truncate(run / "cases.parquet"),
    "parquet-columns": lambda run: pq.write_table(pa.table({"case_id": ["x"]}),
                                                  run / "cases.parquet"),
    "samples-truncated": lambda run: _truncate(run / "samples.parquet"),
}


def _one_line_exit_2(argv: list[str], capsys, fragment: str = "") -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert fragment in err, err
    return err


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("command", ["show", "report", "compare-base", "compare-cand", "accept",
                                     "baseline"])
def test_a_damaged_run_is_one_line_and_exit_2(store, capsys, damage, command):
    out = ["--out", str(store)]
    spec = Path(__file__).parent.parent / "examples" / "acceptance" / "local-dram.toml"
    argv = {
        "show": ["show", damage, *out],
        "report": ["report", damage, "--quiet", *out],
        "compare-base": ["compare", damage, GOOD, *out],
        "compare-cand": ["compare", GOOD, damage, *out],
        "accept": ["accept", str(spec), damage, *out],
        "baseline": ["baseline", "set", damage, *out],
    }[command]
    _one_line_exit_2(argv, capsys, "is damaged")


def test_runs_lists_the_others_and_marks_the_damaged_ones(store, capsys):
    assert main(["runs", "--out", str(store)]) == 0
    out = capsys.readouterr().out
    assert GOOD in out
    for name in DAMAGES:
        line = next(line for line in out.splitlines() if name[:12] in line)
        assert "damaged" in line, line


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--method", "load", "--size", "99999999999999999999999"], "larger than any memory"),
    (["run", "--method", "load", "--size", "1PiB"], "malformed size"),
    (["run", "--method", "load", "--size", str(2**45)], "cannot hold"),
    (["run", "--method", "load", "--region", "shm:nearlocal-i13-huge", "--size", str(2**45)],
     "cannot hold"),
    (["run", "--method", "load", "--budget", "100000000000000000000"], "1 hour"),
    (["run", "--method", "load", "--budget", "2h"], "malformed duration"),
    (["accept", str(EXAMPLES / "local-dram.toml"), "--budget", "3601"], "1 hour"),
    (["accept", str(EXAMPLES / "local-dram.toml"), "--processes", "0"], "--processes"),
    (["compare", GOOD, GOOD, "--seed", "-1"], "--seed"),
    (["compare", GOOD, GOOD, "--history", "-1"], "--history"),
    (["run", "--method", "load", "--size", "64", "--take-turns", "/tmp"], "go together"),
    (["run", "--method", "load", "--size", "64", "--turn", "0/2"], "go together"),
    (["run", "--method", "load", "--size", "64", "--take-turns", "/proc/nearlocal-turns",
      "--turn", "0/2"], "--take-turns /proc/nearlocal-turns"),
    (["run", "--method", "load", "--size", "64", "--take-turns", "/tmp/nearlocal-t",
      "--turn", "2/2"], "--turn 2/2"),
    (["runs", "--out", "/nonexistent/nearlocal"], "does not exist"),
    (["baseline", "show", "--out", "/nonexistent/nearlocal"], "does not exist"),
])
def test_bad_values_are_one_line_and_exit_2(store, capsys, argv, fragment):
    if "--out" not in argv:
        argv = [*argv, "--out", str(store)]
    _one_line_exit_2(argv, capsys, fragment)
    assert not Path("/dev/shm/nearlocal-i13-huge").exists()
    assert sorted(p.name for p in store.iterdir()) == sorted([GOOD, *DAMAGES])  # nothing stored


def test_json_to_a_directory_is_refused_before_measuring(store, tmp_path, capsys):
    _one_line_exit_2(["run", "--method", "load", "--size", "64", "--json", str(tmp_path),
                      "--out", str(store)], capsys, "is a directory")
    assert sorted(p.name for p in store.iterdir()) == sorted([GOOD, *DAMAGES])


@pytest.mark.parametrize("content, fragment", [
    (b"\x00\x01\xff\xfe binary", "not a TOML file"),
    (b'[run]\nallow_write = "no"\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n',
     "allow_write must be true or false"),
    (b'[[requirement]]\ncase = { method = "load" }\nmax = inf\n', "finite"),
    (b'[[requirement]]\ncase = { method = "load" }\nmin_gbps = inf\n', "finite"),
    (b'[run]\nbudget = 1e20\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n',
     "malformed duration"),
    (b'[run]\nbudget = "7200"\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n',
     "1 hour"),
    (b'[run]\nprocesses = "5"\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n',
     "processes must be an integer"),
])
def test_bad_specs_are_one_line_and_exit_2(store, tmp_path, capsys, content, fragment):
    spec = tmp_path / "spec.toml"
    spec.write_bytes(content)
    _one_line_exit_2(["accept", str(spec), GOOD, "--out", str(store)], capsys, fragment)


def _bench_file(tmp_path: Path, entry: dict) -> Path:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"benchmarks": [{"name": "b", **entry}]}))
    return path


@pytest.mark.parametrize("entry, fragment", [
    ({"extra_info": {"case_id": "load/dram/wb/64B"}, "stats": 5}, "stats must be an object"),
    ({"extra_info": {"case_id": ["load"]}, "stats": {}}, "case_id must be a string"),
    ({"extra_info": {"case_id": "x", "host_id": {"a": 1}}, "stats": {}}, "host_id must be"),
    ({"extra_info": {"case_id": "x"}, "stats": {"data": 5}}, "stats.data must be a list"),
    ({"extra_info": {"case_id": "x", "size_bytes": [64, 128]}, "stats": {}},
     "size_bytes must be an integer"),
    ({"extra_info": {"case_id": "x", "median_ns": "fast"}, "stats": {}},
     "median_ns must be a number"),
])
def test_bad_imports_are_one_line_and_exit_2(store, tmp_path, capsys, entry, fragment):
    _one_line_exit_2(["import", str(_bench_file(tmp_path, entry)), "--out", str(store)], capsys,
                     fragment)


def test_a_machine_info_that_is_no_object_is_one_line(store, tmp_path, capsys):
    path = tmp_path / "bench.json"
    entry = {"name": "b", "extra_info": {"case_id": "load/dram/wb/64B"}, "stats": {}}
    path.write_text(json.dumps({"benchmarks": [entry], "machine_info": [1, 2]}))
    _one_line_exit_2(["import", str(path), "--out", str(store)], capsys,
                     "machine_info must be an object")


def test_binary_json_files(store, tmp_path, capsys):
    path = tmp_path / "bench.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    _one_line_exit_2(["import", str(path), "--out", str(store)], capsys, "not a JSON file")


# ------------------------------------------------------------------ incomplete runs


@pytest.fixture
def incomplete(tmp_path) -> Path:
    """A good run and two incomplete ones: one killed (only partial/), one whose samples vanished
    and whose run.json says complete: false."""
    root = tmp_path / "inc"
    rows = [row("load", size=64 * 2**k, median=100.0 + k) for k in range(3)]
    make_run(root, rows, run_id="a-good")
    killed = make_run(root, rows, run_id="b-killed")
    shutil.rmtree(killed / "partial", ignore_errors=True)
    (killed / "partial").mkdir()
    for name in ("cases.parquet", "samples.parquet"):
        (killed / name).unlink()
    (killed / "partial" / "000000.json").write_text(json.dumps(rows[0]))
    half = make_run(root, rows, run_id="c-half")
    (half / "samples.parquet").unlink()
    meta = json.loads((half / "run.json").read_text())
    (half / "run.json").write_text(json.dumps({**meta, "complete": False}))
    return root


@pytest.mark.parametrize("run_id", ["b-killed", "c-half"])
def test_incomplete_runs_are_marked_and_refused_as_baseline(incomplete, capsys, run_id):
    out = ["--out", str(incomplete)]
    assert main(["runs", *out]) == 0
    listed = capsys.readouterr().out
    assert "no:" in next(line for line in listed.splitlines() if run_id in line)
    assert main(["show", run_id, *out]) == 0
    assert "incomplete" in capsys.readouterr().err
    assert main(["report", run_id, "--quiet", *out]) == 0
    assert "incomplete" in capsys.readouterr().out
    _one_line_exit_2(["baseline", "set", run_id, *out], capsys, "--allow-incomplete")
    _one_line_exit_2(["compare", run_id, "a-good", *out], capsys, "--allow-incomplete")
    _one_line_exit_2(["compare", "a-good", run_id, *out], capsys, "--allow-incomplete")
    assert main(["compare", run_id, "a-good", "--allow-incomplete", *out]) in (0, 1)
    assert "INCOMPLETE" in capsys.readouterr().out


def test_an_empty_run_is_no_baseline(tmp_path, capsys):
    make_run(tmp_path, [row("load", status="skipped", reason="no")], run_id="empty")
    _one_line_exit_2(["baseline", "set", "empty", "--out", str(tmp_path)], capsys,
                     "no measured case")


# ------------------------------------------------------------------ what the user owns


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_peer_file_is_protected_like_a_region(tmp_path, capsys):
    existing = tmp_path / "peer.bin"
    existing.write_bytes(os.urandom(1 << 16))
    before = _sha(existing)
    # memcpy writes the region (its first access): the peer is its source, mapped read-only; quick
    # also reads with it (its serving gather), which lands the bytes in the peer: skipped, said
    assert main(["run", "--method", "memcpy", "--size", "4KiB", "--peer", f"file:{existing}",
                 "--budget", "0.02", "--quiet", "--out", str(tmp_path / "r")]) == 0
    cases = load(None, tmp_path / "r").cases.set_index("access")
    assert cases.loc["write", "status"] == "ok" and cases.loc["read", "status"] == "skipped"
    assert "allow-write" in cases.loc["read", "reason"]
    assert _sha(existing) == before
    # reading the region lands the bytes in the peer: a user's file there needs --allow-write
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[run]\nbudget = "0.02"\n[[requirement]]\n'
                    f'case = {{ method = "memcpy", size = "4KiB", access = "read", '
                    f'peer = "file:{existing}" }}\nmax = "1s"\n')
    assert main(["accept", str(spec), "--out", str(tmp_path / "r")]) == 1  # not measured
    assert "peer" in capsys.readouterr().out
    assert _sha(existing) == before


def test_a_spec_size_matches_the_stored_case_however_spelled(tmp_path, capsys):
    make_run(tmp_path, [row("load", size=16384, median=100.0)], run_id="r")
    spec = tmp_path / "spec.toml"
    spec.write_text('[[requirement]]\ncase = { method = "load", size = 16384, access = "read" }\n'
                    'max = "1us"\n')
    from nearlocal.acceptance.spec import parse_spec

    assert parse_spec(spec).requirements[0].case.pattern == "16KiB"
    assert main(["accept", str(spec), "r", "--out", str(tmp_path)]) == 0
    # a run measured with `--pattern 16384` stored that spelling: the spec still finds it
    make_run(tmp_path, [row("load", size=16384, median=100.0, pattern="16384")], run_id="p")
    assert main(["accept", str(spec), "p", "--out", str(tmp_path)]) == 0


def test_a_dangling_symlink_is_neither_followed_nor_removed(tmp_path, capsys):
    link = tmp_path / "pool.bin"
    link.symlink_to(tmp_path / "missing-target")
    _one_line_exit_2(["run", "--method", "store", "--region", f"file:{link}", "--size", "4KiB",
                      "--out", str(tmp_path / "r")], capsys, "dangling symbolic link")
    assert link.is_symlink() and not (tmp_path / "missing-target").exists()


def test_created_files_never_replace_or_remove_what_appeared(tmp_path):
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.regions.files import _held_by_a_run

    spec = parse_region(f"file:{tmp_path / 'made.bin'}")
    kind = region_kind(spec)
    region = kind.open(spec, 4096, "wb", False)
    assert region.info["owned"] and _held_by_a_run(tmp_path / "made.bin")
    # another run planning on the same name is told so, not asked for --allow-write
    assert "in use by another running nearlocal" in kind.unavailable(spec, None)
    (tmp_path / "made.bin").unlink()
    (tmp_path / "made.bin").write_bytes(b"someone's")  # replaced meanwhile: left alone
    region.close()
    assert (tmp_path / "made.bin").read_bytes() == b"someone's"
    assert not list(tmp_path.glob(".made.bin.nearlocal-*"))


def test_a_name_held_by_another_run_is_not_mistaken_for_a_users_file(tmp_path):
    from nearlocal.core.cases import Case, unavailable
    from nearlocal.probe import probe

    path = tmp_path / "shared.bin"
    path.write_bytes(b"\0" * 8192)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # what a live nearlocal run holds on the file it made
        reason = unavailable(Case("store", f"file:{path}", pattern="4KiB"), probe(), False)
    finally:
        os.close(fd)
    assert "in use by another running nearlocal" in reason


def test_results_files_follow_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        run = make_run(tmp_path, [row("load")], run_id="r")
    finally:
        os.umask(old)
    for name in ("run.json", "cases.parquet", "samples.parquet"):
        assert (run / name).stat().st_mode & 0o777 == 0o664, name


def test_a_full_disk_is_one_line_saying_what_was_kept(tmp_path, monkeypatch):
    import errno

    from nearlocal.errors import UsageError
    from nearlocal.store import Store
    from nearlocal.store import writer as store_module

    store = Store.create(tmp_path, {"suite": "t"}, run_id="r")
    store.add_case(row("load", size=64), None, None)
    store.add_case(row("load", size=128), None, None)
    real = store_module.safeio.atomic_write_bytes

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.safeio, "atomic_write_bytes", full)
    with pytest.raises(UsageError, match=r"no space left.*kept the 2 cases") as info:
        store.add_case(row("load", size=256), None, None)
    assert "\n" not in str(info.value)
    monkeypatch.setattr(store_module.safeio, "atomic_write_bytes", real)
    run = load("r", tmp_path)
    assert len(run.cases) == 2 and not run.complete


def test_a_dead_workers_files_are_removed_unless_held(tmp_path):
    from nearlocal.core.cases import Case, resolve
    from nearlocal.regions import files_to_create, remove_leftovers
    from nearlocal.regions.base import CREATED_XATTR

    left, held = tmp_path / "left.bin", tmp_path / "held.bin"
    case = resolve(Case("memcpy", f"file:{left}", pattern="4KiB", peer=f"file:{held}"))
    assert files_to_create((case.region, case.peer)) == [left, held]
    left.write_bytes(b"x")  # what a worker killed mid-case leaves: it carries nearlocal's mark
    try:
        os.setxattr(left, CREATED_XATTR, b"host:1")
    except OSError:
        pytest.skip("this filesystem keeps no user xattrs")
    (tmp_path / ".left.bin.nearlocal-1234abcd").write_bytes(b"x")
    held.write_bytes(b"y")  # made meanwhile by another live run: it holds a flock
    users = tmp_path / "users.bin"  # the user put a file there meanwhile: no mark, never removed
    users.write_bytes(b"z")
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        remove_leftovers([left, held, users])
    finally:
        os.close(fd)
    assert not left.exists() and held.exists() and users.read_bytes() == b"z"
    assert not list(tmp_path.glob(".left.bin.*"))


def test_an_oversized_case_in_a_mix_is_skipped_with_the_reason():
    """Alone it is exit 2 (test_bad_values...); among others (a suite) it is a skipped row."""
    from nearlocal.core.cases import Case, unavailable
    from nearlocal.probe import probe

    inventory = probe()
    assert "cannot hold" in unavailable(Case("load", "dram", pattern=f"{2**45}B"), inventory, False)
    assert unavailable(Case("load", "dram", pattern="64B"), inventory, False) is None


def test_a_killed_runs_leftover_is_not_taken_for_a_users_file(tmp_path):
    """A file nearlocal made (xattr) whose maker is dead and holds no lock may be replaced; the
    same file without the marker is the user's and needs --allow-write."""
    from nearlocal.core.cases import Case, unavailable
    from nearlocal.probe import probe
    from nearlocal.regions.base import CREATED_XATTR
    from nearlocal.regions.files import left_by_a_dead_run

    path = tmp_path / "left.bin"
    path.write_bytes(b"\0" * 8192)
    case = Case("store", f"file:{path}", pattern="4KiB")
    inventory = probe()
    assert "--allow-write" in unavailable(case, inventory, False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    try:
        os.setxattr(path, CREATED_XATTR, f"{os.uname().nodename}:{dead}".encode())
    except OSError:
        pytest.skip("no user xattrs on this file system")
    assert left_by_a_dead_run(path) and unavailable(case, inventory, False) is None
    os.setxattr(path, CREATED_XATTR, f"{os.uname().nodename}:{os.getpid()}".encode())
    assert not left_by_a_dead_run(path)  # its maker is alive


# ================================================================== issue 20, by cause class
# Each class is tried with values other than the issue's: the fix is the mechanism (safeio's
# output check / writer / bounded reader, the schema checked at load), not the example.

NEVER_HANG_S = 60


@pytest.fixture
def never_hangs():
    """A FIFO or /dev/zero read by mistake would block forever: fail the test instead."""
    import signal

    def stuck(signum, frame):
        raise AssertionError(f"blocked for {NEVER_HANG_S} s (a FIFO or a device was read?)")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(NEVER_HANG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _edit_meta(run: Path, change) -> None:
    meta = json.loads((run / "run.json").read_text())
    change(meta)
    (run / "run.json").write_text(json.dumps(meta))


def _set(path: str, value):
    """A damage: the run.json field at `path` (dots, [i] for list items) becomes `value`."""
    def change(meta: dict) -> None:
        *parents, last = path.replace("[", ".[").split(".")
        node = meta
        for part in parents:
            node = node[int(part[1:-1])] if part.startswith("[") else node[part]
        if last.startswith("["):
            node[int(last[1:-1])] = value
        else:
            node[last] = value
    return change


# (damage name) -> (how run.json changes, a word the one line must name)
FIELD_DAMAGES = {
    "inventory-is-a-list": (_set("inventory", [1, 2]), "inventory"),
    "inventory-is-text": (_set("inventory", "box-a"), "inventory"),
    "numa-is-an-int": (_set("inventory.numa", 7), "inventory.numa"),
    "numa-cpus-text": (_set("inventory.numa[0].cpus", "0-3"), "inventory.numa[0].cpus"),
    "numa-node-float-text": (_set("inventory.numa[1].node", "one"), "inventory.numa[1].node"),
    "tsc-is-text": (_set("inventory.tsc_hz", "fast"), "inventory.tsc_hz"),
    "cpu-is-a-list": (_set("inventory.cpu", ["Test CPU"]), "inventory.cpu"),
    "flags-mixed": (_set("inventory.cpu.flags", {"avx2": True, "clwb": "yes"}),
                    "inventory.cpu.flags.clwb"),
    "gpu-devices-object": (_set("inventory.gpu.devices", {"0": "H20"}), "inventory.gpu.devices"),
    "cache-size-text": (_set("inventory.cpu.caches[0].size_bytes", "32MiB"),
                        "inventory.cpu.caches[0].size_bytes"),
    "settings-list": (_set("settings", [0.1]), "settings"),
    "budget-text": (_set("settings.budget_s", "half a second"), "settings.budget_s"),
    "host-id-int": (_set("host_id", 12345), "host_id"),
    "suite-list": (_set("suite", ["quick", "mlc"]), "suite"),
    "complete-text": (_set("complete", "yes"), "complete"),
    "n-cases-huge": (_set("n_cases", 2**70), "n_cases"),
    "started-object": (_set("started", {"at": 1}), "started"),
}


@pytest.fixture
def field_store(tmp_path) -> Path:
    """A good run and, per FIELD_DAMAGES entry, a copy whose run.json has that field damaged."""
    root = tmp_path / "fields"
    make_run(root, [row("load", size=64 * 2**k, median=100.0 + k) for k in range(4)],
             run_id=GOOD)
    for name, (damage, _) in FIELD_DAMAGES.items():
        shutil.copytree(root / GOOD, root / name)
        _edit_meta(root / name, lambda meta, name=name: meta.update(run_id=name))
        _edit_meta(root / name, damage)
    return root


@pytest.mark.parametrize("damage", sorted(FIELD_DAMAGES))
@pytest.mark.parametrize("command", ["show", "report", "compare-base", "compare-cand", "accept",
                                     "baseline"])
def test_a_field_of_the_wrong_type_is_named_in_one_line(field_store, capsys, damage, command):
    out = ["--out", str(field_store)]
    argv = {
        "show": ["show", damage, *out],
        "report": ["report", damage, "--quiet", *out],
        "compare-base": ["compare", damage, GOOD, *out],
        "compare-cand": ["compare", GOOD, damage, *out],
        "accept": ["accept", str(EXAMPLES / "local-dram.toml"), damage, *out],
        "baseline": ["baseline", "set", damage, *out],
    }[command]
    err = _one_line_exit_2(argv, capsys, "is damaged")
    assert f"field {FIELD_DAMAGES[damage][1]}" in err and "expected" in err, err
    assert not (field_store / "baselines").exists() or command != "baseline"


def test_the_other_runs_stay_usable_beside_damaged_fields(field_store, capsys):
    assert main(["runs", "--out", str(field_store)]) == 0
    listed = capsys.readouterr().out
    for name in FIELD_DAMAGES:
        line = next(line for line in listed.splitlines() if name[:12] in line)
        assert "damaged" in line, line
    assert main(["show", GOOD, "--out", str(field_store)]) == 0
    assert main(["report", GOOD, "--quiet", "--out", str(field_store)]) == 0
    assert main(["compare", GOOD, GOOD, "--out", str(field_store)]) == 0


def _rewrite_cases(run: Path, column: str, values) -> None:
    frame = pq.read_table(run / "cases.parquet").to_pandas()
    frame[column] = values
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), run / "cases.parquet")


COLUMN_DAMAGES = {
    "median-text": ("median_ns", ["fast", "slow", "1.0", "x"], "median_ns"),
    "status-int": ("status", [1, 0, 1, 1], "status"),
    "size-text": ("size_bytes", ["64", "128", "256", "512"], "size_bytes"),
    "gbps-lists": ("gbps", [[1.0], [2.0], [3.0], [4.0]], "gbps"),
}


@pytest.mark.parametrize("damage", sorted(COLUMN_DAMAGES))
@pytest.mark.parametrize("command", ["show", "report", "compare", "accept"])
def test_a_parquet_column_of_the_wrong_type_is_one_line(tmp_path, capsys, damage, command):
    root = tmp_path / "columns"
    run = make_run(root, [row("load", size=64 * 2**k, median=100.0 + k) for k in range(4)],
                   run_id="bad")
    make_run(root, [row("load", size=64 * 2**k, median=100.0 + k) for k in range(4)],
             run_id=GOOD)
    column, values, named = COLUMN_DAMAGES[damage]
    _rewrite_cases(run, column, values)
    out = ["--out", str(root)]
    argv = {"show": ["show", "bad", *out], "report": ["report", "bad", "--quiet", *out],
            "compare": ["compare", GOOD, "bad", *out],
            "accept": ["accept", str(EXAMPLES / "local-dram.toml"), "bad", *out]}[command]
    err = _one_line_exit_2(argv, capsys, "is damaged")
    assert named in err, err


@pytest.mark.parametrize("field, value", [("median_ns", "fast"), ("size_bytes", [64]),
                                          ("status", 3), ("converged", "no")])
def test_a_damaged_partial_row_is_one_line(tmp_path, capsys, field, value):
    rows = [row("load", size=64 * 2**k, median=100.0 + k) for k in range(2)]
    killed = make_run(tmp_path, rows, run_id="killed")
    for name in ("cases.parquet", "samples.parquet"):
        (killed / name).unlink()
    (killed / "partial").mkdir()
    (killed / "partial" / "000000.json").write_text(json.dumps({**rows[0], field: value}))
    err = _one_line_exit_2(["show", "killed", "--out", str(tmp_path)], capsys, "is damaged")
    assert f"field {field}" in err, err


# ------------------------------------------------------------------ damaged baselines


def _baseline_store(tmp_path: Path) -> Path:
    root = tmp_path / "bl"
    other = {**INVENTORY, "host_id": "other-host", "cpu": {"model": "Other CPU"}}
    make_run(root, [row("load", median=100.0)], run_id="a")
    make_run(root, [row("load", median=101.0)], run_id="b")
    make_run(root, [row("load", median=100.0)], inventory=other, run_id="other")
    assert main(["baseline", "set", "other", "--out", str(root)]) == 0
    return root


BASELINE_DAMAGES = {
    "history-int": lambda p: p.write_text(json.dumps({"run": "a", "host_id": "abc123",
                                                      "history": 3})),
    "history-mixed": lambda p: p.write_text(json.dumps({"run": "a", "host_id": "abc123",
                                                        "history": ["b", 7]})),
    "run-list": lambda p: p.write_text(json.dumps({"run": ["a"], "host_id": "abc123"})),
    "no-run": lambda p: p.write_text(json.dumps({"host_id": "abc123"})),
    "inventory-list": lambda p: p.write_text(json.dumps(
        {"run": "a", "host_id": "abc123", "meta": {"inventory": [1]}})),
    "binary": lambda p: p.write_bytes(b"\x89PNG\xff\x00"),
    "deep": lambda p: p.write_text('{"run": "a", "host_id": "abc123", "meta": '
                                   + "[" * 5000 + "]" * 5000 + "}"),
    "directory": lambda p: p.mkdir(),
    "fifo": lambda p: os.mkfifo(p),
}


@pytest.mark.parametrize("damage", sorted(BASELINE_DAMAGES))
def test_a_damaged_baseline_is_one_line_and_the_others_stay_usable(tmp_path, capsys, damage,
                                                                   never_hangs):
    root = _baseline_store(tmp_path)
    record = root / "baselines" / "abc123.json"
    BASELINE_DAMAGES[damage](record)
    capsys.readouterr()
    out = ["--out", str(root)]
    assert main(["baseline", "show", *out]) == 0  # the other host's record is still listed
    listed = capsys.readouterr().out
    assert "other-host" in listed and "run other" in listed
    if damage not in ("directory",):  # a directory named *.json is said too, but not as JSON
        assert "abc123.json is damaged" in listed or "not a regular file" in listed, listed
    # this host's comparison against its baseline: one line naming the damaged record
    err = _one_line_exit_2(["compare", "baseline", "b", *out], capsys, "no baseline")
    assert "abc123.json" in err, err
    # setting a new baseline over a damaged record is refused, never silently replaced
    _one_line_exit_2(["baseline", "set", "b", *out], capsys, "abc123.json")
    # the other host's baseline still compares
    assert main(["compare", "baseline", "other", *out]) in (0, 1)


@pytest.mark.parametrize("make_folder", ["file", "fifo", "read-only"])
def test_a_baselines_folder_that_is_no_folder_is_one_line(tmp_path, capsys, mounts,
                                                          make_folder):
    make_run(tmp_path, [row("load")], run_id="a")
    folder = tmp_path / "baselines"
    if make_folder == "read-only":
        mounts(folder, "ro,size=64k")
    else:
        folder.write_text("x") if make_folder == "file" else os.mkfifo(folder)
    _one_line_exit_2(["baseline", "set", "a", "--out", str(tmp_path)], capsys, "baseline")
    assert main(["compare", "a", "a", "--out", str(tmp_path)]) == 0  # history: none, no error


def test_a_baseline_that_cannot_be_written_leaves_no_empty_folder(tmp_path):
    """Issue 49: `baseline set` made `baselines/` and then failed to write its record (a full
    disk), leaving an empty folder. A file-size limit (RLIMIT_FSIZE) makes the write fail for
    real, as a full disk would (EFBIG), on any box and user; the record's folder goes with it."""
    import resource
    import signal

    make_run(tmp_path, [row("load")], run_id="a")

    def limit_file_sizes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    done = subprocess.run(
        [sys.executable, "-m", "nearlocal", "baseline", "set", "a", "--out", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
             "PYTHONDONTWRITEBYTECODE": "1"}, cwd=tmp_path, capture_output=True, text=True,
        timeout=120, preexec_fn=limit_file_sizes)
    assert done.returncode == 2, done
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "EFBIG" in err, err  # the OS's own error, one line
    assert not (tmp_path / "baselines").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temporary file either


# ------------------------------------------------------------------ files the OS says no to

MOUNTS: list[Path] = []


def _mount_tmpfs(where: Path, options: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): "
                    "needs root in a namespace that allows mounts")
    return where


@pytest.fixture
def mounts():
    made: list[Path] = []
    yield lambda where, options: made.append(_mount_tmpfs(where, options)) or made[-1]
    for where in reversed(made):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(folder: Path) -> None:
    """Fill the file system of `folder` to the last block."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)


def _target(kind: str, tmp_path: Path) -> str:
    """An output path the OS refuses, of one kind."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "out.fifo")
        return str(tmp_path / "out.fifo")
    if kind == "file-as-directory":
        (tmp_path / "plain").write_text("x")
        return str(tmp_path / "plain" / "out.json")
    return {"dev-full": "/dev/full", "dev-zero": "/dev/zero", "proc": "/proc/version",
            "proc-new": "/proc/nearlocal-out.json", "directory": str(tmp_path),
            "missing-directory": str(tmp_path / "no" / "such" / "out.json"),
            "long-name": str(tmp_path / ("n" * 300 + ".json")), "empty": ""}[kind]


TARGETS = ["fifo", "file-as-directory", "dev-full", "dev-zero", "proc", "proc-new", "directory",
           "missing-directory", "long-name", "empty"]
OUTPUT_OPTIONS = {
    "run --json": lambda out, path: ["run", "--method", "load", "--size", "64", "--budget",
                                     "0.02", "--json", path, *out],
    "accept --junit": lambda out, path: ["accept", str(EXAMPLES / "local-dram.toml"), GOOD,
                                         "--junit", path, *out],
    "accept --json": lambda out, path: ["accept", str(EXAMPLES / "local-dram.toml"), GOOD,
                                        "--json", path, *out],
    "compare --output": lambda out, path: ["compare", GOOD, GOOD, "--format", "junit",
                                           "--output", path, *out],
    "report --html": lambda out, path: ["report", GOOD, "--html", path, *out],
    "report --markdown": lambda out, path: ["report", GOOD, "--markdown", path, *out],
}


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("option", sorted(OUTPUT_OPTIONS))
def test_an_output_the_os_refuses_is_one_line_before_anything_runs(store, tmp_path, capsys, kind,
                                                                   option, never_hangs):
    before = sorted(p.name for p in store.iterdir())
    argv = OUTPUT_OPTIONS[option](["--out", str(store)], _target(kind, tmp_path))
    err = _one_line_exit_2(argv, capsys, option.split()[-1])
    assert "cannot write" in err, err
    assert sorted(p.name for p in store.iterdir()) == before  # nothing measured, nothing stored


@pytest.mark.parametrize("option", sorted(OUTPUT_OPTIONS))
def test_a_read_only_directory_is_one_line(store, tmp_path, capsys, mounts, option):
    folder = mounts(tmp_path / "ro", "ro,size=64k")
    before = sorted(p.name for p in store.iterdir())
    err = _one_line_exit_2(OUTPUT_OPTIONS[option](["--out", str(store)], str(folder / "x.out")),
                           capsys, "cannot write")
    assert "not writable" in err or "EROFS" in err, err
    assert sorted(p.name for p in store.iterdir()) == before


@pytest.fixture
def full_store(tmp_path, mounts) -> Path:
    """A store with one run on a small tmpfs that is then filled to the last block."""
    root = mounts(tmp_path / "full", "size=512k")
    make_run(root, [row("load", size=64 * 2**k, median=100.0 + k) for k in range(3)],
             run_id=GOOD)
    _fill(root)
    return root


@pytest.mark.parametrize("argv", [
    ["baseline", "set", GOOD],
    ["compare", GOOD, GOOD, "--format", "json", "--output", "{root}/cmp.json"],
    ["compare", GOOD, GOOD, "--output", "{root}/cmp.txt"],
    ["accept", str(EXAMPLES / "local-dram.toml"), GOOD, "--junit", "{root}/junit.xml"],
    ["report", GOOD, "--html", "{root}/r.html"],
    ["report", GOOD, "--markdown", "{root}/r.md"],
])
def test_a_full_file_system_is_one_line_with_the_errno(full_store, capsys, argv):
    outputs = [Path(part.format(root=full_store)) for part in argv if "{root}" in part]
    argv = [part.format(root=full_store) for part in argv] + ["--out", str(full_store)]
    err = _one_line_exit_2(argv, capsys, "ENOSPC")
    assert "No space left" in err or "no space left" in err, err
    assert load(GOOD, full_store).complete  # nothing measured is lost
    assert not [p for p in full_store.rglob("*nearlocal-tmp*")]  # no half-written file left
    # issue 37: no partial output, no plots without their report, no temporary file
    assert not [p for p in outputs if p.exists()]
    assert not list(full_store.glob("*.png")) and not list(full_store.glob(".*"))
    assert not (full_store / "baselines").exists()  # issue 49: no empty folder left either


def test_a_run_into_a_full_store_or_json_says_what_was_kept(full_store, tmp_path, capsys):
    _one_line_exit_2(["run", "--method", "load", "--size", "64", "--budget", "0.02", "--quiet",
                      "--out", str(full_store)], capsys, "")
    elsewhere = tmp_path / "elsewhere"
    err = _one_line_exit_2(["run", "--method", "load", "--size", "64", "--budget", "0.02",
                            "--quiet", "--json", str(full_store / "rows.json"),
                            "--out", str(elsewhere)], capsys, "ENOSPC")
    assert "the run is stored in" in err, err
    (stored,) = list_runs(elsewhere)
    assert load(stored).complete


# ------------------------------------------------------------------ inputs: bounded, regular

def _input(kind: str, tmp_path: Path, fmt: str) -> str:
    path = tmp_path / f"input.{fmt}"
    if kind in ("dev-zero", "dev-urandom"):
        return "/dev/" + kind.split("-")[1]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as handle:  # sparse: costs no disk
            handle.truncate(65 * 2**20)
    elif kind in ("deep", "deep-but-parseable"):
        depth = 100_000 if kind == "deep" else 200
        nested = "[" * depth + "]" * depth
        path.write_text(f"x = {nested}\n" if fmt == "toml" else
                        '{"benchmarks": ' + nested + "}" if fmt == "bench" else
                        '{"num_hidden_layers": ' + nested + "}")
    return str(path)


INPUT_KINDS = ["dev-zero", "dev-urandom", "fifo", "directory", "huge", "deep",
               "deep-but-parseable"]
INPUT_COMMANDS = {
    "accept SPEC": ("toml", lambda path: ["accept", path, GOOD]),
    "import FILE": ("bench", lambda path: ["import", path]),
    "kv --model": ("json", lambda path: ["kv", "--model", path]),
    "run --pattern kv:": ("json", lambda path: ["run", "--method", "load", "--pattern",
                                                f"kv:{path}", "--budget", "0.02"]),
}


@pytest.mark.parametrize("kind", INPUT_KINDS)
@pytest.mark.parametrize("command", sorted(INPUT_COMMANDS))
def test_an_unbounded_input_is_one_line_and_never_hangs(store, tmp_path, capsys, kind, command,
                                                        never_hangs):
    fmt, argv = INPUT_COMMANDS[command]
    path = _input(kind, tmp_path, fmt)
    if kind == "directory" and command.startswith(("kv", "run")):
        path = str(Path(path) / "config.json")  # a model directory without its config
        Path(path).mkdir()
    if command.startswith("run") and not path.endswith(".json"):
        pytest.skip("a kv: pattern names a model config by its .json path")
    before = sorted(p.name for p in store.iterdir())
    _one_line_exit_2([*argv(path), "--out", str(store)] if not command.startswith("kv")
                     else argv(path), capsys)
    assert sorted(p.name for p in store.iterdir()) == before


@pytest.mark.parametrize("cpus", ["0-99999999999", "5-1000000", "0,8192"])
def test_a_cpu_list_is_bounded_before_it_is_expanded(store, capsys, cpus, never_hangs):
    _one_line_exit_2(["run", "--method", "load", "--threads", "2", "--cpus", cpus, "--out",
                      str(store)], capsys, "--cpus")


# ------------------------------------------------------------------ values silently accepted

SPEC = str(EXAMPLES / "local-dram.toml")


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--method", "load", "--budget", "inf"], "duration"),
    (["run", "--method", "load", "--budget", "NaN"], "duration"),
    (["run", "--method", "load", "--budget", "-0.5"], "duration"),
    (["run", "--method", "load", "--budget", ""], "duration"),
    (["run", "--method", "load", "--budget", "3600.001"], "1 hour"),
    (["run", "--method", "load", "--budget", "3700s"], "1 hour"),
    (["run", "--method", "load", "--processes", "101"], "--processes"),
    (["run", "--method", "load", "--processes", "-3"], "--processes"),
    (["run", "--method", "load", "--threads", ""], "--threads"),
    (["run", "--method", "load", "--threads", " "], "--threads"),
    (["run", "--method", "load", "--threads", "0"], "--threads"),
    (["run", "--method", "load", "--cpus", ""], "--cpus"),
    (["run", "--method", "rpc-throughput", "--pattern", "rpc:64x64B", "--param", "qd=65"],
     "--param qd=65"),
    (["run", "--method", "rpc-throughput", "--pattern", "rpc:8x64B", "--param",
      "qd=99999999999999"], "--param qd"),
    (["run", "--method", "rpc-roundtrip", "--pattern", "rpc:8x64B", "--param",
      "client_cpu=4096"], "--param client_cpu"),
    (["run", "--method", "rpc-roundtrip", "--pattern", "rpc:8x64B", "--param",
      "server_cpu=77"], "--param server_cpu"),
    (["run", "--method", "chase", "--size", "4KiB", "--param", "hops=99999999999"], "hops"),
    (["run", "--method", "chase", "--size", "4KiB", "--param", "hops=0"], "hops"),
    (["run", "--method", "loaded-chase", "--size", "4KiB", "--param", "delay=10000000000000"],
     "delay"),
    (["run", "--method", "load", "--region", "shm:" + "s" * 240], "too long"),
    (["run", "--method", "load", "--region", "file:/tmp/" + "f" * 250], "too long"),
    (["run", "--method", "load", "--out", ""], "--out"),
    (["run", "--method", "load", "--out", "  "], "--out"),
    (["accept", SPEC, "--budget", ""], "duration"),
    (["accept", SPEC, "--budget", "7200"], "1 hour"),
    (["accept", SPEC, "--processes", "101"], "--processes"),
    (["accept", SPEC, "--out", ""], "--out"),
    (["compare", GOOD, GOOD, "--output", ""], "--output"),
    (["runs", "--out", ""], "--out"),
    (["baseline", "set", GOOD, "--out", ""], "--out"),
])
def test_a_meaningless_value_is_refused_before_anything_is_created(store, tmp_path, capsys,
                                                                   monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)  # `--out ""` would be here
    if "--out" not in argv:
        argv = [*argv, "--out", str(store)]
    before = sorted(p.name for p in store.iterdir())
    _one_line_exit_2(argv, capsys, fragment)
    assert sorted(p.name for p in store.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # nothing in the cwd
    assert not list(Path("/dev/shm").glob("s" * 240 + "*"))


# ------------------------------------------------------------------ malformed imports


@pytest.mark.parametrize("stats, extra, fragment", [
    ({"rounds": math.inf}, {}, "stats.rounds"),
    ({"rounds": 1e30}, {}, "stats.rounds"),
    ({"rounds": 2**64}, {}, "stats.rounds"),
    ({"median": "fast"}, {}, "stats.median"),
    ({"median": -1.0}, {}, "stats.median"),
    ({"min": math.inf}, {}, "stats.min"),
    ({"stddev": [0.1]}, {}, "stats.stddev"),
    ({}, {"size_bytes": 2**70}, "size_bytes"),
    ({}, {"median_ns": math.inf}, "median_ns"),
    ({}, {"gbps": math.nan}, "gbps"),
    ({}, {"pattern": 5}, "pattern"),
    ({}, {"converged": "yes"}, "converged"),
    ({}, {"suite": ["quick"]}, "suite"),
])
def test_a_malformed_benchmark_is_refused_and_stores_nothing(store, tmp_path, capsys, stats,
                                                              extra, fragment):
    before = sorted(p.name for p in store.iterdir())
    path = _bench_file(tmp_path, {"extra_info": {"case_id": "load/dram/wb/64B", **extra},
                                  "stats": {"median": 1e-7, "rounds": 5, **stats}})
    _one_line_exit_2(["import", str(path), "--out", str(store)], capsys, fragment)
    assert sorted(p.name for p in store.iterdir()) == before


@pytest.mark.parametrize("nearlocal_info, fragment", [
    ({"inventory": [1]}, "inventory"),
    ({"inventory": {"numa": "0-1"}}, "inventory.numa"),
    ({"inventory": {"tsc_hz": "2GHz"}}, "inventory.tsc_hz"),
])
def test_a_malformed_machine_info_stores_nothing(store, tmp_path, capsys, nearlocal_info,
                                                 fragment):
    before = sorted(p.name for p in store.iterdir())
    path = tmp_path / "bench.json"
    entry = {"name": "b", "extra_info": {"case_id": "load/dram/wb/64B"}, "stats": {"median": 1e-7}}
    path.write_text(json.dumps({"benchmarks": [entry],
                                "machine_info": {"nearlocal": nearlocal_info}}))
    _one_line_exit_2(["import", str(path), "--out", str(store)], capsys, fragment)
    assert sorted(p.name for p in store.iterdir()) == before


def test_extra_fields_of_mixed_types_import_and_report(tmp_path, capsys):
    """Fields bench/ does not write, of different types in different entries: kept in the
    row's info, and the stored run compares and reports."""
    path = tmp_path / "bench.json"
    entries = [{"name": f"b{i}", "extra_info": {"case_id": f"load/dram/wb/{64 << i}B",
                                               "method": "load", "region": "dram",
                                               "pattern": f"{64 << i}B", "note": note},
                "stats": {"median": 1e-7 * (i + 1), "rounds": 5}}
               for i, note in enumerate([[1, 2], "text", {"k": 1}, 3])]
    path.write_text(json.dumps({"benchmarks": entries, "datetime": 20261201}))
    assert main(["import", str(path), "--out", str(tmp_path / "s")]) == 0
    (run,) = (tmp_path / "s").iterdir()
    assert main(["compare", run.name, run.name, "--cross-host", "--out",
                 str(tmp_path / "s")]) == 0
    assert main(["report", run.name, "--quiet", "--out", str(tmp_path / "s")]) == 0
    assert load(run).cases["info"][0]["extra_info"] == {"note": [1, 2]}


# ------------------------------------------------------------------ hostile environments


def _cli(argv: list, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, **kwargs.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", *argv], capture_output=True,
                          env=env, timeout=300, **kwargs)


def _one_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    err = result.stderr.decode(errors="replace")
    assert result.returncode == code, (result.returncode, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


ASCII_ENVIRONMENTS = {
    "PYTHONIOENCODING=ascii": {"PYTHONIOENCODING": "ascii"},
    "LC_ALL=C, no UTF-8 mode": {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
                                "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": ""},
    "latin-1": {"PYTHONIOENCODING": "latin-1"},
}


@pytest.mark.parametrize("environment", sorted(ASCII_ENVIRONMENTS))
def test_an_ascii_stdout_gets_ascii_and_no_traceback(store, environment):
    out = ["--out", str(store)]
    env = ASCII_ENVIRONMENTS[environment]
    commands = [["show", GOOD, *out], ["report", GOOD, *out]]
    if environment == "PYTHONIOENCODING=ascii":  # every printer once (each start costs seconds)
        commands += [["runs", *out], ["compare", GOOD, GOOD, *out], ["probe"], ["kv"]]
    for argv in commands:
        result = _cli(argv, env=env)
        assert result.returncode == 0, (argv, result.stderr.decode(errors="replace"))
        assert b"Traceback" not in result.stderr
        encoding = env["PYTHONIOENCODING"] or "ascii"
        result.stdout.decode(encoding)  # only what the stream's encoding holds
    result = _cli(["run", "--method", "load", "--size", "1PiB", *out], env=env)
    _one_line(result)
    result.stderr.decode("ascii" if "latin" not in environment else "latin-1")


PLUGIN_FAILURES = {  # a plugin's source -> what the one line says of it
    None: "ModuleNotFoundError: No module named 'nearlocal_no_such_plugin'",
    "from nearlocal.core.methods import get_method, register_method\n"
    "register_method(get_method('load'))\n": "ValueError: method 'load' declared twice",
    "raise RuntimeError('broken at import')\n": "RuntimeError: broken at import",
}


@pytest.mark.parametrize("source", list(PLUGIN_FAILURES), ids=["missing", "twice", "raises"])
def test_a_plugin_that_does_not_load_is_one_line_naming_it(store, tmp_path, source):
    """NEARLOCAL_PLUGINS is input too: a module that is not there or fails as it registers is
    one line naming it, exit 2, and nothing measured or stored."""
    name = "nearlocal_no_such_plugin"
    if source is not None:
        name = "nearlocal_broken_plugin"
        (tmp_path / f"{name}.py").write_text(source)
    before = sorted(p.name for p in store.iterdir())
    result = _cli(["run", "--method", "load", "--size", "4KiB", "--out", str(store)],
                  env={"NEARLOCAL_PLUGINS": name, "PYTHONPATH": str(tmp_path)})
    err = _one_line(result)
    assert f"NEARLOCAL_PLUGINS: plugin {name!r} did not load: {PLUGIN_FAILURES[source]}" in err
    assert sorted(p.name for p in store.iterdir()) == before


@pytest.mark.parametrize("argv", [["show", GOOD], ["runs"], ["report", GOOD], ["probe", "--json"],
                                  ["baseline", "show"]])
def test_a_closed_stdout_is_one_line(store, argv):
    if argv[0] != "probe":
        argv = [*argv, "--out", str(store)]
    before = sorted(p.name for p in store.iterdir())
    err = _one_line(subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", *argv],
                                   stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1),
                                   timeout=300))
    assert "stdout is closed" in err
    assert sorted(p.name for p in store.iterdir()) == before


@pytest.mark.parametrize("argv", [["show", GOOD], ["runs"], ["report", GOOD],
                                  ["compare", GOOD, GOOD, "--format", "json"]])
def test_a_full_stdout_is_one_line(store, argv):
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", *argv, "--out",
                                 str(store)], stdout=full, stderr=subprocess.PIPE, timeout=300)
    assert "stdout" in _one_line(result) and "ENOSPC" in result.stderr.decode()


@pytest.mark.parametrize("argv", [
    [b"show", b"/tmp/\xff\xfe-run"],
    [b"runs", b"--out", b"/tmp/r\xe9sultats"],
    [b"run", b"--method", b"load", b"--region", b"file:/tmp/\x80.bin", b"--size", b"4KiB"],
    [b"accept", b"/tmp/spec-\xff.toml"],
    [b"compare", b"a", b"b", b"--output", b"/tmp/\xc3(.json"],
])
def test_undecodable_bytes_in_an_argument_are_one_line(argv):
    err = _one_line(subprocess.run([sys.executable.encode(), b"-m", b"nearlocal.frontends.cli", *argv],
                                   capture_output=True, timeout=300))
    assert "not UTF-8" in err


@pytest.mark.parametrize("argv", [["runs"], ["show", GOOD, "--out", "{store}"],
                                  ["report", GOOD, "--out", "{store}", "--html", "r.html"],
                                  ["run", "--method", "load", "--size", "64", "--out",
                                   "{store}/../fresh"]])
def test_a_removed_working_directory_is_one_line(store, tmp_path, argv):
    gone = tmp_path / "gone"
    gone.mkdir()

    def enter_and_remove() -> None:
        os.chdir(gone)
        os.rmdir(gone)

    argv = [part.format(store=store) for part in argv]
    err = _one_line(subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", *argv],
                                   capture_output=True, preexec_fn=enter_and_remove,
                                   timeout=300, env={**os.environ, "PYTHONSAFEPATH": "1"}))
    assert "current directory" in err
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("argv", [["run", "--method", "load", "--size", "64", "--budget", "0.02"],
                                  ["report", GOOD, "--out", "{store}", "--html", "r.html"],
                                  ["import", "{bench}"]])
def test_a_read_only_working_directory_is_one_line(store, tmp_path, mounts, argv):
    folder = mounts(tmp_path / "ro-cwd", "ro,size=64k")
    bench = _bench_file(tmp_path, {"extra_info": {"case_id": "load/dram/wb/64B"},
                                   "stats": {"median": 1e-7}})
    argv = [part.format(store=store, bench=bench) for part in argv]
    err = _one_line(_cli(argv, cwd=folder))
    assert "not writable" in err or "EROFS" in err or "Read-only" in err, err


# ------------------------------------------------------------------ signals


def _group(pgid: int) -> dict[int, str]:
    """The live processes of process group `pgid` (zombies are dead): pid -> command line."""
    members = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            members[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(
                b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):  # it ended while being read
            continue
    return members


def _wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 240):
    """Poll `condition` until it holds; the run ending first, or never getting there, fails."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if process.poll() is not None:
            pytest.fail(f"the run ended (exit {process.returncode}) before {what}: "
                        f"{process.stderr.read().decode(errors='replace')[-2000:]}")
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"no {what} within {timeout} s")


@pytest.mark.parametrize("when", ["while the workers start", "while measuring"])
def test_sigterm_to_the_process_group_ends_every_worker_quietly(tmp_path, when):
    """`timeout`, a CI runner or systemd signal the whole group: the workers get SIGTERM too,
    whatever they are doing (starting, measuring). The run is stored as interrupted with every
    case measured before the signal (exit 143, docs/bad-input.md), nothing is printed as a
    traceback, and no process of the group outlives the run."""
    import signal
    import time

    # 12 cases, one process each, and a CI no case reaches (each runs its whole budget): the run
    # has >= 5 s of cases still to go when the signal comes, however fast the machine is
    sizes = ",".join(str(64 << k) for k in range(12))
    process = subprocess.Popen(
        [sys.executable, "-m", "nearlocal.frontends.cli", "run", "--method", "load", "--size", sizes,
         "--budget", "0.5", "--ci", "0.0001", "--processes", "1", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        if when == "while the workers start":  # the run's store is open and its fork server up
            _wait_for(lambda: list(tmp_path.glob("*/partial")) and any(
                "forkserver" in command for command in _group(process.pid).values()),
                process, "fork server")
            measured: set[str] = set()
        else:
            _wait_for(lambda: list(tmp_path.glob("*/partial/[0-9]*.json")), process,
                      "case stored")
            measured = {json.loads(path.read_text())["case_id"]
                        for path in tmp_path.glob("*/partial/[0-9]*.json")}
        children = {pid: command for pid, command in _group(process.pid).items()
                    if pid != process.pid}
        os.killpg(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    err = err.decode(errors="replace")
    assert process.returncode == 143, (process.returncode, err)
    assert "Traceback" not in err and "SystemExit" not in err and "BrokenPipe" not in err, err
    servers = [command for command in children.values() if "multiprocessing.forkserver" in command]
    # the fork server, and while measuring also the worker it forked (which keeps its command
    # line); a worker may have started already by the time the group was read
    assert len(servers) >= (1 if when == "while the workers start" else 2), children
    # the parent has exited; its children end on their own (the fork server and the resource
    # tracker at EOF on their pipes, a worker at its SIGTERM): none may be left running
    deadline = time.monotonic() + 60
    while _group(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group(process.pid) == {}, f"left alive after the run: {_group(process.pid)}"
    (path,) = list_runs(tmp_path)
    run = load(path)
    assert run.meta["interrupted"] is True and run.meta["complete"] is False
    assert b"(incomplete: interrupted)" in out
    stored = set(run.cases["case_id"])
    assert measured <= stored and len(stored) < 12
    ok = run.cases[run.cases["status"] == "ok"]
    assert set(ok["case_id"]) >= measured
    for case_id, n in zip(ok["case_id"], ok["n_samples"], strict=True):
        assert len(run.samples_of(case_id)) == n > 0  # every stored row has its samples
