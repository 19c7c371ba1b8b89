"""The VM rig (scripts/vm_check.sh): its bad-input lines run everywhere; the guest itself boots
only under the `vm` marker with NEARLOCAL_VM=1 (minutes under TCG; `.ci/run` runs the script
after the unit tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "vm_check.sh"
sys.path.insert(0, str(REPO / "scripts"))
from vm_facts import check  # noqa: E402 - a script, found through sys.path (as it finds vm_lib)


def _rig(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def _work_folders() -> set[str]:
    return {p.name for p in Path("/var/tmp").glob("nearlocal-vm.*")}


def test_a_missing_qemu_is_one_line_and_exit_2():
    before = _work_folders()
    done = _rig("--no-install", NEARLOCAL_VM_QEMU="/nonexistent/qemu-system-x86_64")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "qemu-system-x86_64 is missing" in done.stderr and "apt-get install qemu-system-x86" in done.stderr
    assert _work_folders() == before


def test_a_missing_kernel_is_one_line_and_exit_2():
    before = _work_folders()
    done = _rig("--no-install", NEARLOCAL_VM_QEMU="bash", NEARLOCAL_VM_KERNEL="/nonexistent/vmlinuz")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "no kernel /nonexistent/vmlinuz" in done.stderr
    assert _work_folders() == before


def test_an_unknown_option_is_one_line_and_exit_2():
    done = _rig("--fast")
    assert done.returncode == 2 and done.stderr.strip() == \
        "vm_check: unknown option --fast (valid: --no-install, --keep-trees DIR)"


def _guest_out(tmp_path: Path, memtype_wc: str = "write-combining",
               accept_region: str = "devdax:/dev/dax0.0", replay: dict | None = None,
               same: dict | None = None) -> Path:
    """What a guest writes, as vm_facts reads it (the run rows come from a real store)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "trees.tar").write_bytes(b"")
    inventory = {
        "numa": [{"node": 0, "cpus": [0, 1], "mem_total_bytes": 1 << 30},
                 {"node": 1, "cpus": [], "mem_total_bytes": 512 << 20}],
        "dax": [{"name": "dax0.0", "mode": "devdax"}, {"name": "dax1.0", "mode": "devdax"}],
        "cxl": {"present": True, "memdevs": [{}], "decoders": [{}], "regions": [{"size": 1 << 28}]},
        "pci_memory": [{"address": "0000:00:0b.0",
                        "bars": [{"index": 2, "prefetchable": True, "wc_file": True}]}],
        "topology": {  # as the rig's 6.1 guest showed it on 2026-12-07
            "links": [{"kind": "cxl", "name": "mem0", "address": "0000:0d:00.0",
                       "speed": "2.5 GT/s PCIe", "width": 1, "max_speed": "2.5 GT/s PCIe",
                       "max_width": 1, "numa_node": None, "socket": None,
                       "root_port": "0000:0c:00.0", "gpu_index": None}],
            "ddio": [], "affinity": [],
            "ddio_reason": "not exposed (a virtual machine: its root ports are emulated, the "
                           "host's DDIO is the host's)"},
    }
    (out / "probe.json").write_text(json.dumps({"inventory": inventory}))
    (out / "faults.json").write_text(json.dumps({"torn_reads": 0, "torn_reads_returned": 0,
                                                 "missed_detections": 0, "writes_after_loss": 0}))
    for name in ("probe", "run", "faults"):
        (out / f"{name}.rc").write_text("0\n")
    (out / "cxl-dax.txt").write_text("dax1.0\n")
    from nearlocal.store.writer import Store

    store = Store.create(out / "results", {"host_id": "guest"})
    rows = [("numa:1", "wb", "ok", "write-back (anonymous RAM)"), ("numa:1", "uc", "skipped", ""),
            ("devdax:/dev/dax0.0", "wb", "ok", "write-back"), ("devdax:/dev/dax0.0", "wc", "skipped", ""),
            ("devdax:/dev/dax1.0", "wb", "ok", "write-back"), ("devdax:/dev/dax1.0", "wc", "skipped", ""),
            ("pcibar:0000:00:0b.0/2", "uc", "ok", "uncached-minus"),
            ("pcibar:0000:00:0b.0/2", "wc", "ok", memtype_wc),
            ("pcibar:0000:00:0b.0/2", "wb", "skipped", "")]
    for region, attr, status, memtype in rows:
        store.add_case({"case_id": f"load/{region}/{attr}/4KiB", "method": "load", "region": region,
                        "attr": attr, "status": status, "reason": "",
                        "info": {"memtype": memtype} if memtype else {}}, None, None, None)
    store.finish()
    pool = "devdax:/dev/dax0.0"
    (out / "accept.rc").write_text("1\n")  # the GPU requirements fail as not measured
    (out / "accept-pool.txt").write_text(pool + "\n")
    case = f"nt-store/{accept_region}/wb/16KiB"
    (out / "accept.json").write_text(json.dumps({"verdicts": [
        {"requirement": "B7a", "case": case, "measured": 2400.0, "passed": True},
        {"requirement": "B11", "case": f"cuda-memcpy/registered:{pool}/wb/16KiB",
         "measured": None, "passed": False, "reason": "not measured: no GPU"}]}))
    accepted = Store.create(out / "accept-results", {"host_id": "guest"})
    accepted.add_case({"case_id": case, "method": "nt-store", "region": accept_region,
                       "attr": "wb", "status": "ok", "reason": ""}, None, None, None)
    accepted.finish()
    (out / "whatif-run.rc").write_text("0\n")
    whatif = Store.create(out / "whatif-results", {
        "host_id": "guest", "inventory": {"cpu": {"flags": {"hypervisor": True}}}})
    for pattern, count, size, ns in (("64MiB", 1, 64 << 20, 2e7),
                                     ("kv:qwen2.5-32b:flash-attn:dense:16:blocks=scattered", 2048,
                                      32 << 10, 3e7)):
        whatif.add_case({"case_id": f"memcpy/numa:1/wb/{pattern}/read", "method": "memcpy",
                         "region": "numa:1", "peer": "dram", "attr": "wb", "access": "read",
                         "pattern": pattern, "status": "ok", "reason": "",
                         "measures": "transfer", "fragment_count": count, "fragment_bytes": size,
                         "size_bytes": count * size, "median_ns": ns,
                         "effective_params": '{"drain": "before"}', "pool_class": "cxl-node",
                         "peer_pool_class": "local", "reaches_memory": True}, None, None, None)
    whatif.finish()
    _replay_out(out, pool, replay or {}, same or {})
    return out


TCG_NOTE = ("measured on an emulated box (QEMU TCG CPU version 2.5+): QEMU's TCG has no memory "
            "timing, so its figures show that the paths work, never how fast they are")


def _replay_out(out: Path, pool: str, replay: dict, same: dict) -> None:
    """What scripts/replay_check.py --region POOL --out replay-check --json leaves: its rows, one
    replay's records, the comparison (a verdict that under TCG is not checked)."""
    from nearlocal.store.writer import Store

    (out / "replay-pool.txt").write_text(pool + "\n")
    (out / "replay-check.rc").write_text("1\n")
    rows = [f"memcpy/{pool}/wb/80x1048576B/read", f"memcpy/{pool}/wb/80x1048576B/read/movers=2"]
    stored = Store.create(out / "replay-check" / "rows", {"host_id": "guest"})
    for case in rows:
        stored.add_case({"case_id": case, "method": "memcpy", "region": pool, "attr": "wb",
                         "status": "ok", "reason": ""}, None, None, None)
    stored.finish()
    (out / "replay-check" / "replay-0.5.json").write_text(json.dumps({
        "region": pool, "path": f"pool-gather (memcpy, {pool} pool -> each mover's dram buffer)",
        "source": {"region": pool, "device": pool.split(":", 1)[1], "owned": False,
                   "memtype": "write-back"},
        "requests": 2, "bytes": 4 << 20, "fragments": 4, "pool_bytes": 130 << 20,
        "llc_bytes": 16 << 20, "memory_figure": True, "pool_note": None, "emulated": TCG_NOTE,
        "per_request": [{"bytes": 0, "mover": 0, "transfer_ns": 0.0, "fragments": 0},
                        {"bytes": 4 << 20, "mover": 0, "transfer_ns": 9e6, "fragments": 4}],
        **replay}))
    (out / "replay-check.json").write_text(json.dumps({
        "region": pool, "way": "pool-gather/memcpy", "emulated": TCG_NOTE, "rows_wall_s": 61.0,
        "transfer_rows": rows[:1], "contention_rows": rows,
        "loads": [{"load": 0.5, "pass": False, "p50_ratio": 3.0,
                   "replay_json": "/var/tmp/nearlocal-vm.x/out/replay-check/replay-0.5.json",
                   "same_requests": {"requests": True, "hit_tokens": True, "bytes": True,
                                     "fragments": True, "arrival_max_diff_ns": 0.2, **same},
                   "simulated_reload": {"p50_ns": 2.6e7, "p99_ns": 3.1e7}}]}))


def test_an_accept_measured_off_the_guests_pool_is_a_failed_fact(tmp_path):
    problems = check(_guest_out(tmp_path, accept_region="numa:1"))
    assert len(problems) == 2 and all(p.startswith("accept:") for p in problems), problems


def test_the_facts_hold_on_what_a_good_guest_writes(tmp_path):
    assert check(_guest_out(tmp_path)) == []


def test_a_bar_mapped_with_the_wrong_type_is_a_failed_fact(tmp_path):
    problems = check(_guest_out(tmp_path, memtype_wc="uncached-minus"))
    assert problems == ["run: pcibar:0000:00:0b.0/2 wc is ok with memtype write-combining "
                        "(saw ok: uncached-minus)"]


def _pair(tmp_path: Path, **reader: object) -> tuple[Path, Path]:
    """What the two guests of the pair stage write when all goes well (scripts/vm_pair.py)."""
    a, b = tmp_path / "pair-a", tmp_path / "pair-b"
    a.mkdir()
    b.mkdir()
    (a / "writer.json").write_text(json.dumps({"writing": True, "tsc_hz": 2e9}))
    (a / "killed.json").write_text(json.dumps({"pid": 4242, "reads_ok_before": 310}))
    report = {"final": True, "reads_ok": 512, "retries": 3, "stale_detections": 1,
              "stale_marked": 1, "owner_lost_s": 41.2, "torn_reads": 0,
              "torn_reads_returned": 0, "heartbeats": [7, 9, 9, 9], "elapsed_s": 63.0}
    (b / "reader.json").write_text(json.dumps({**report, **reader}))
    return a, b


def _pair_check(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", str(REPO / "scripts" / "vm_pair.py"), "check", str(a),
                           str(b)], capture_output=True, text=True, timeout=60)


def test_the_pair_facts_hold_on_what_two_good_guests_write(tmp_path):
    done = _pair_check(*_pair(tmp_path))
    assert done.returncode == 0, done.stdout
    assert "FAIL" not in done.stdout and "judged the owner lost" in done.stdout


@pytest.mark.parametrize(("reader", "fact"), [
    ({"torn_reads": 1}, "no torn read"),
    ({"torn_reads_returned": 1}, "no torn read"),
    ({"stale_detections": 0}, "judged the owner lost"),
    ({"heartbeats": [7, 8, 9, 10]}, "heartbeat frozen"),
    ({"final": False}, "read to the end"),
])
def test_a_torn_read_or_a_missed_loss_is_a_failed_pair_fact(tmp_path, reader, fact):
    done = _pair_check(*_pair(tmp_path, **reader))
    assert done.returncode == 1
    assert [line for line in done.stdout.splitlines() if line.startswith("vm_pair: FAIL")
            and fact in line], done.stdout


@pytest.mark.vm
@pytest.mark.slow
def test_the_guest_boots_and_every_fact_holds():
    if os.environ.get("NEARLOCAL_VM") != "1":
        pytest.skip("boots a QEMU guest under TCG (minutes): set NEARLOCAL_VM=1 or run "
                    "bash scripts/vm_check.sh")
    before = _work_folders()
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "vm_check: fact: probe: node 1 is CPU-less with memory" in done.stdout
    assert _work_folders() == before


def test_a_whatif_run_that_failed_is_a_failed_fact(tmp_path):
    out = _guest_out(tmp_path)
    (out / "whatif-run.rc").write_text("1\n")
    (out / "whatif-run.err").write_text("nearlocal: error: numa:1 is not on this box\n")
    problems = check(out)
    assert len(problems) == 1 and problems[0].startswith("nearlocal run (memcpy on numa:1")


@pytest.mark.parametrize(("replay", "same", "fact"), [
    ({"region": "dram", "path": "host-gather (memcpy, dram pool -> each mover's dram buffer)",
      "source": {"region": "dram", "owned": True}}, {}, "replay: gathered out of"),
    ({"per_request": [{"bytes": 4 << 20, "mover": -1, "transfer_ns": 0.0, "fragments": 4}]}, {},
     "replay: every request with hits was gathered"),
    ({}, {"fragments": False}, "replay: the simulation was fed its requests"),
    ({"pool_bytes": 32 << 20}, {}, "replay: a pool of 33554432 B"),  # in 4x the LLC, unmarked
    ({"emulated": ""}, {}, "replay: says its figures are an emulated box's"),
])
def test_a_replay_off_the_pool_or_unlike_the_simulations_is_a_failed_fact(tmp_path, replay,
                                                                          same, fact):
    problems = check(_guest_out(tmp_path, replay=replay, same=same))
    assert len(problems) == 1 and problems[0].startswith(fact), problems


def test_a_cache_resident_pool_holds_when_marked(tmp_path):
    note = "cache-resident pool: not a memory figure (devdax:/dev/dax0.0 holds 250MiB, ...)"
    out = _guest_out(tmp_path, replay={"pool_bytes": 200 << 20, "llc_bytes": 64 << 20,
                                       "memory_figure": False, "pool_note": note})
    assert check(out) == []


def test_a_replay_check_that_did_not_run_is_a_failed_fact(tmp_path):
    out = _guest_out(tmp_path)
    (out / "replay-check.rc").write_text("2\n")
    (out / "replay-check.err").write_text("replay_check: --region devdax:/dev/dax0.0 holds "
                                          "250MiB, the pool spans 258MiB\n")
    (out / "replay-check.json").write_text("")
    problems = check(out)
    assert len(problems) == 1 and "holds 250MiB" in problems[0]
