"""The VM rig's shared parts (no QEMU): scripts/vm_lib.py, what every fact file reads and collects
through, and scripts/vm_lib.sh, the guests' stage marks and the host's relay of them, sourced by
vm_check.sh and by every guest script from the copy beside it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.report_fixtures import make_run, row

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import vm_lib  # noqa: E402 - a script, found through sys.path

LIBRARY = SCRIPTS / "vm_lib.sh"
GUESTS = sorted(SCRIPTS.glob("vm_*guest.sh"))
RIG_SHELL = [SCRIPTS / "vm_check.sh", LIBRARY, *GUESTS]


def _bash(script: str, cwd: Path, source: str = f"source {LIBRARY}") -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -u\n{source}\n{script}"], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_a_fact_is_held_or_failed_and_reads_as_its_condition(capsys):
    fact = vm_lib.Facts()
    assert fact(True, "one") is True and fact(False, "two") is False
    assert fact.report("ok: ", "FAILED: ") == ["two"]
    assert capsys.readouterr().out == "ok: one\nFAILED: two\n"
    assert vm_lib.finish(["two"], "x: ") == 1 and capsys.readouterr().err == "x: two\n"
    assert vm_lib.finish([], "x: ") == 0


def test_a_guests_files_read_as_text_json_and_exit_codes(tmp_path):
    (tmp_path / "run.rc").write_text("2\n")
    (tmp_path / "run.err").write_text("x" * 400 + "the end\n")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "bad.json").write_text("{")
    assert vm_lib.text(tmp_path / "none") == "missing"
    assert vm_lib.text(tmp_path / "none", missing="") == ""
    assert vm_lib.text(tmp_path / "run.err", 7) == "the end"
    assert vm_lib.read_json(tmp_path / "list.json") == {} == vm_lib.read_json(tmp_path / "bad.json")
    fact = vm_lib.Facts()
    assert vm_lib.exit_fact(fact, tmp_path, "run", "run exits 0") == "2"
    assert fact.failed and fact.failed[0].startswith("run exits 0 (rc 2: xxx")
    assert fact.failed[0].endswith("the end)") and len(fact.failed[0]) < 340
    assert vm_lib.exit_fact(fact, tmp_path, "run", "run reports", ok=("0", "2")) == "2"
    assert fact.held == ["run reports (rc 2: " + ("x" * 400 + "the end")[-300:] + ")"]


@pytest.mark.parametrize(("value", "want"), [
    ('{"mtu": "4096"}', {"mtu": "4096"}), ({"mtu": 4096}, {"mtu": 4096}), ("", {}), (None, {}),
    (float("nan"), {}), ("{", {}), ("[1]", {})])
def test_a_rows_json_column_decodes_to_a_dict(value, want):
    assert vm_lib.decoded(value) == want
    assert vm_lib.param({"params": value}, "mtu", "1024") == str(want.get("mtu", "1024"))


def test_rows_come_from_the_newest_stored_run(tmp_path):
    assert vm_lib.latest_run(tmp_path / "nothing") is None and vm_lib.rows(tmp_path) == []
    make_run(tmp_path / "results", [row("load"), row("store", access="write")])
    found = vm_lib.rows(tmp_path / "results")
    assert sorted(r["method"] for r in found) == ["load", "store"]
    assert vm_lib.latest_run(tmp_path / "results").cases["method"].tolist() == \
        [r["method"] for r in found]


def _whatif(terms: dict[str, list]) -> SimpleNamespace:
    return SimpleNamespace(paths=[SimpleNamespace(path=path, terms=[
        SimpleNamespace(hop=hop, way=f"{hop} way", source=source, rows=tuple(rows))
        for hop, source, rows in found]) for path, found in terms.items()])


def test_the_whatif_fact_holds_on_a_hop_from_the_runs_own_rows():
    result = _whatif({"rdma": [("rdma", "measured", ["rdma-read/a"])],
                      "cxl-pool": [("host", "reference", []),
                                   ("pool-gather", "measured", ["memcpy/numa:1/x"])]})
    fact = vm_lib.Facts()
    assert vm_lib.hop_fact(fact, result, "rdma", row_ok=lambda r: r.startswith("rdma-"))
    assert vm_lib.hop_fact(fact, result, "cxl-pool", "pool-gather", lambda r: "numa:1" in r)
    assert not vm_lib.hop_fact(fact, result, "cxl-pool")  # its first hop: a reference's figure
    assert not vm_lib.hop_fact(fact, result, "rdma", row_ok=lambda r: r.startswith("memcpy"))
    assert not vm_lib.hop_fact(fact, result, "host-gpu")
    assert fact.held[0] == "whatif: the rdma path's first hop from the run's own rows " \
                          "(rdma way: rdma-read/a)"
    assert fact.failed[-1].endswith("(-: no such hop)")


def test_every_rig_shell_file_parses():
    for path in RIG_SHELL:
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, f"{path.name}: {done.stderr}"


def test_marks_reach_the_host_in_order_and_once(tmp_path):
    done = _bash('OUT=$PWD\nmark "mount image"\nmark "devices"\n'
                 'stage() { echo "relayed: $1"; }\n'
                 'relay_stages "$OUT" "guest: "\nrelay_stages "$OUT" "guest: "\n'
                 'for i in $(seq 10); do mark "step $i"; done\nrelay_stages "$OUT" "g: "',
                 tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == ["relayed: guest: mount image", "relayed: guest: devices",
                                        *[f"relayed: g: step {i}" for i in range(1, 11)]]
    assert list(tmp_path.iterdir()) == []  # every stage file relayed, no half-written one left


def test_sourcing_the_library_says_nothing_and_gives_the_hosts_addresses(tmp_path):
    done = _bash('echo "${HOST_ADDRESS[a]} ${HOST_ADDRESS[b]} ${HOST_MAC[a]} ${HOST_MAC[b]}"\n'
                 'raw_namespace; raw_namespace region0', tmp_path,
                 source=f'f() {{ source "$1"; }}\nf {LIBRARY}')  # as from inside a function
    assert done.returncode == 0 and done.stderr == ""
    addresses, macs = done.stdout.split()[:2], done.stdout.split()[2:4]
    assert len(set(addresses)) == 2 and all(re.fullmatch(r"10\.\d+\.\d+\.\d+", a) for a in addresses)
    assert len(set(macs)) == 2 and all(m.startswith("52:54:00:") for m in macs)  # QEMU's prefix
    assert done.stdout.split()[4:] == ["namespace0.0", "namespace0.0"]  # no nvdimm here


def test_the_guests_find_the_library_where_their_scripts_are():
    """A guest runs a copy of its script from its own folder (vm_check.sh's start_guest) and
    sources vm_lib.sh beside it: the copy must carry the library."""
    rig = (SCRIPTS / "vm_check.sh").read_text()
    copied = next(line for line in rig.splitlines() if "vm_*guest.sh" in line and "cp " in line)
    assert '"$REPO/scripts/vm_lib.sh"' in copied
    assert 'source "$REPO/scripts/vm_lib.sh"' in rig
    for guest in GUESTS:
        assert 'source "$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh"' in guest.read_text(), guest.name


def test_the_guests_addresses_are_written_once():
    for path in [*RIG_SHELL, *SCRIPTS.glob("vm_*.py")]:
        if path != LIBRARY:
            said = re.findall(r"10\.78\.\d+\.\d+|52:54:00(?::[0-9a-f]{2}){3}", path.read_text())
            assert not said, f"{path.name} writes {said}: they live in vm_lib.sh"


def test_a_json_report_reads_as_its_dict(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"pid": 7}))
    assert vm_lib.read_json(tmp_path / "r.json") == {"pid": 7}
