"""The facts the VM rig's guest must show (scripts/vm_check.sh): what its kernel presented and
what nearlocal saw, mapped and read back. Never speeds: TCG has no memory timing.

    python scripts/vm_facts.py OUT   (exit 1 naming every fact that does not hold)
"""

from __future__ import annotations

import sys
from pathlib import Path

from vm_lib import Facts, exit_fact, finish, hop_fact, latest_run, read_json, rows, text, whatif_of

BAR = "0000:00:0b.0"


def check(out: Path) -> list[str]:
    fact = Facts()
    exit_fact(fact, out, "probe", "nearlocal probe --json exits 0")
    inventory = read_json(out / "probe.json").get("inventory")
    if inventory is not None:
        nodes = {n["node"]: n for n in inventory["numa"]}
        fact(1 in nodes and not nodes[1]["cpus"] and nodes[1]["mem_total_bytes"] > 0,
             "probe: node 1 is CPU-less with memory")
        devdax = [d for d in inventory["dax"] if d["mode"] == "devdax"]
        fact(len(devdax) >= 2, f"probe: two device-dax instances in devdax mode (saw "
             f"{[d['name'] for d in devdax]})")
        cxl = inventory["cxl"]
        fact(cxl["present"] and len(cxl["memdevs"]) >= 1 and len(cxl["decoders"]) >= 1
             and any(r["size"] > 0 for r in cxl["regions"]),
             f"probe: CXL memdev, decoders and a sized region ({len(cxl['memdevs'])} memdevs, "
             f"{len(cxl['decoders'])} decoders, {len(cxl['regions'])} regions)")
        topology = inventory.get("topology") or {}
        links = [link for link in topology.get("links", []) if link["kind"] == "cxl"]
        fact(bool(links) and all(link["speed"] and link["width"] and link["max_speed"]
                                 and link["max_width"] and link["root_port"] for link in links),
             "probe: the CXL memdev's link, its speed and width (current, maximum), NUMA node and "
             "root port (" + "; ".join(
                 f"{link['name']} {link['address']}: {link['speed']} x{link['width']} of "
                 f"{link['max_speed']} x{link['max_width']}, node {link['numa_node']}, root port "
                 f"{link['root_port']}" for link in links) + ")")
        fact(str(topology.get("ddio_reason", "")).startswith("not exposed"),
             f"probe: DDIO {topology.get('ddio_reason')}")
        bars = {(d["address"], b["index"]): b for d in inventory.get("pci_memory", []) for b in d["bars"]}
        bar = bars.get((BAR, 2))
        fact(bar is not None and bar["prefetchable"] and bar["wc_file"],
             f"probe: ivshmem {BAR} BAR2 is a prefetchable memory BAR with resource2_wc")

    exit_fact(fact, out, "run", "nearlocal run exits 0")
    measured = rows(out / "results")
    cxl_dax = text(out / "cxl-dax.txt", missing="")
    fact(bool(cxl_dax), "a device-dax instance sits on the CXL region")
    by_key = {(row["region"], row["attr"]): row for row in measured}

    def row_is(region: str, attr: str, status: str, memtype: str | None = None) -> None:
        row = by_key.get((region, attr))
        if row is None:
            fact(False, f"run: a {region} {attr} row")
            return
        info = row.get("info") or {}
        seen = info.get("memtype", "")
        ok = row["status"] == status and (memtype is None or seen.startswith(memtype))
        fact(ok, f"run: {region} {attr} is {status}" + (f" with memtype {memtype}" if memtype else "")
             + ("" if ok else f" (saw {row['status']}: {row.get('reason') or seen})"))

    row_is("numa:1", "wb", "ok")
    row_is("numa:1", "uc", "skipped")
    for region in sorted({row["region"] for row in measured if row["region"].startswith("devdax:")}):
        row_is(region, "wb", "ok", "write-back")
        row_is(region, "wc", "skipped")
        uc = by_key.get((region, "uc"))
        if uc is not None:  # device-dax holds its range write-back: /dev/mem uc is refused
            reason = uc.get("reason") or ""
            mapped = (uc.get("info") or {}).get("memtype", "")
            fact((uc["status"] == "ok" and mapped.startswith("uncached"))
                 or (uc["status"] in ("failed", "skipped") and ("PAT" in reason or "DEVMEM" in reason)),
                 f"run: {region} uc is mapped uncached or refused naming PAT / STRICT_DEVMEM "
                 f"({uc['status']}: {reason[:160]})")
    if cxl_dax:
        fact(f"devdax:/dev/{cxl_dax}" in {r["region"] for r in measured},
             "run: the CXL devdax was measured")
    row_is(f"pcibar:{BAR}/2", "uc", "ok", "uncached-minus")
    row_is(f"pcibar:{BAR}/2", "wc", "ok", "write-combining")
    row_is(f"pcibar:{BAR}/2", "wb", "skipped")

    faults = read_json(out / "faults.json")
    fact(bool(faults), f"nearlocal faults on the devdax reports (rc {text(out / 'faults.rc')}: "
         f"{text(out / 'faults.err', 300, '')})")
    if faults:
        fact(faults.get("torn_reads") == 0 and faults.get("torn_reads_returned") == 0,
             f"faults: 0 torn reads ({faults.get('torn_reads')}, returned "
             f"{faults.get('torn_reads_returned')})")
        fact(faults.get("missed_detections") == 0 and faults.get("writes_after_loss") == 0,
             f"faults: every owner loss detected, no write after loss ({faults.get('missed_detections')} "
             f"missed, {faults.get('writes_after_loss')} writes after loss)")
    _accept_facts(out, fact)
    _whatif_facts(out, fact)
    _replay_facts(out, fact)
    fact((out / "trees.tar").is_file(), "the guest's trees were recorded")
    return fact.report("vm_check: fact: ")


def _whatif_facts(out: Path, fact: Facts) -> None:
    """`nearlocal whatif` on the guest's memcpy run: the CXL pool path's gather out of the
    CPU-less node stands on that node's own rows, and the figures say they are a VM's."""
    rc = exit_fact(fact, out, "whatif-run", "nearlocal run (memcpy on numa:1, for the what-if) "
                   "exits 0")
    if rc != "0":
        return
    run = latest_run(out / "whatif-results")
    if not fact(run is not None, "the what-if's run was stored in whatif-results/"):
        return
    result = whatif_of(run)
    hop_fact(fact, result, "cxl-pool", "pool-gather", lambda row: "numa:1" in row)
    fact(bool(result.emulated), f"whatif: the figures say they are a VM's ({result.emulated!r})")


def _replay_facts(out: Path, fact: Facts) -> None:
    """`nearlocal replay`'s pool path (scripts/replay_check.py --region devdax:...): the trace's
    reloads moved out of the guest's devdax, read only; every request with hits gathered, with
    the bytes and fragments the simulation was fed; the simulation stood on the guest's own rows
    of that devdax and says its figures are an emulated box's. Never a ratio or a verdict: TCG
    checks the protocol, not the timing."""
    exit_fact(fact, out, "replay-check", "replay_check on the devdax reports (0 pass / 1 fail, "
              "not judged under TCG)", ok=("0", "1"))
    check = read_json(out / "replay-check.json")
    if not check:
        return
    pool = text(out / "replay-pool.txt", missing="?")
    fact(check.get("region") == pool, f"replay_check: rows and replay out of {pool} "
         f"(saw {check.get('region')})")
    loads = check.get("loads") or []
    fact(bool(loads), "replay_check: a replay was compared")
    for entry in loads:
        name = Path(str(entry.get("replay_json"))).name  # the guest's path: its file is here
        replay = read_json(out / "replay-check" / name)
        if not fact(bool(replay), f"replay: its records replay-check/{name}"):
            continue
        source = replay.get("source") or {}
        fact(replay.get("region") == pool and pool in str(replay.get("path"))
             and source.get("region") == pool and source.get("owned") is False,
             f"replay: gathered out of {pool}, read only ({replay.get('path')}; "
             f"{source.get('memtype')})")
        moved = [r for r in replay.get("per_request", []) if r["bytes"] > 0]
        fact(bool(moved) and all(r["mover"] >= 0 and r["transfer_ns"] > 0 for r in moved),
             f"replay: every request with hits was gathered by a mover ({len(moved)} of "
             f"{replay.get('requests')}, {replay.get('bytes')} B in {replay.get('fragments')} "
             "fragments)")
        same = entry.get("same_requests") or {}
        fact(all(same.get(k) is True for k in ("requests", "hit_tokens", "bytes", "fragments")),
             f"replay: the simulation was fed its requests, hit tokens, bytes and fragments "
             f"({same})")
        memory = replay.get("pool_bytes", 0) > 4 * replay.get("llc_bytes", 0)
        fact(replay.get("memory_figure") is memory and (replay.get("pool_note") is None) is memory,
             f"replay: a pool of {replay.get('pool_bytes')} B over an LLC of "
             f"{replay.get('llc_bytes')} B is " + ("a memory figure" if memory else
                                                  f"marked: {replay.get('pool_note')}"))
        fact("emulated box" in str(replay.get("emulated")),
             f"replay: says its figures are an emulated box's ({replay.get('emulated')!r})")
        simulated = entry.get("simulated_reload") or {}
        fact(simulated.get("p50_ns") is not None and simulated.get("p99_ns") is not None,
             "replay_check: the simulation served the replay's requests (its P50 / P99; no "
             "ratio is checked)")
    used = list(dict.fromkeys([*check.get("transfer_rows", []), *check.get("contention_rows", [])]))
    stored = {r["case_id"] for r in rows(out / "replay-check" / "rows")}
    fact(check.get("rows_wall_s") is not None and bool(used) and set(used) <= stored
         and all(pool in r for r in used),
         f"replay_check: the simulation stood on the guest's own rows of {pool} "
         f"({', '.join(used) or 'none'})")
    fact("emulated box" in str(check.get("emulated")),
         f"replay_check: the figures say they are an emulated box's ({check.get('emulated')!r})")


def _accept_facts(out: Path, fact: Facts) -> None:
    """Beluga's spec aimed at the guest's devdax: a verdict per requirement, its CPU cases
    measured on that pool, its GPU cases not measured (no GPU). Never whether it passed: TCG."""
    exit_fact(fact, out, "accept", "nearlocal accept gives verdicts (0 pass / 1 fail)",
              ok=("0", "1"))
    verdicts = read_json(out / "accept.json").get("verdicts") or []
    pool = text(out / "accept-pool.txt", missing="?")
    measured = [v for v in verdicts if v.get("measured") is not None]
    fact(bool(verdicts) and all("requirement" in v and "passed" in v for v in verdicts),
         f"accept: a verdict for each of the spec's {len(verdicts)} requirements")
    on_pool = [v for v in measured if f"/{pool}/" in f"/{v['case']}/" or pool in v["case"]]
    fact(bool(on_pool), f"accept: requirements measured on the guest's pool {pool} "
         f"({len(on_pool)} of {len(measured)} measured)")
    accepted = rows(out / "accept-results")
    regions = {r["region"] for r in accepted if r["status"] == "ok"}
    fact(bool(accepted) and regions <= {pool, "dram"},
         f"accept: every measured row is on {pool} or local dram (saw {sorted(regions)})")


if __name__ == "__main__":
    sys.exit(finish(check(Path(sys.argv[1])), "vm_check: FAILED: "))
