"""Whether two runs come from the same hardware: runs from other hardware are refused unless
--cross-host, and a baseline is kept per hardware."""

from __future__ import annotations


def _identity(meta: dict) -> dict | None:
    """probe.hardware_identity less what a bench import's inventory lacks (CPU count, CXL
    flags), with the TSC: what two runs whose host ids differ are compared by."""
    from nearlocal.probe import hardware_identity

    inventory = meta.get("inventory") or {}
    if not inventory.get("cpu"):
        return None
    exact = hardware_identity(inventory)
    return {
        "cpu": exact["cpu"],
        "tsc_hz": float(inventory.get("tsc_hz") or 0.0),
        "numa": [(node, cpus) for node, cpus, _ in exact["numa"]],
        "gpus": exact["gpus"],
    }


def host_id(meta: dict) -> str | None:
    return meta.get("host_id") or (meta.get("inventory") or {}).get("host_id")


def host_differences(base: dict, cand: dict) -> list[str]:
    """What makes two runs' hardware differ (empty: same hardware). host_id is exact, but on a VM
    the memory size balloons and a calibrated TSC drifts, so inventories are compared instead: CPU
    model, TSC within 0.5%, NUMA nodes and their CPUs, GPUs; memory sizes are left out."""
    if host_id(base) and host_id(base) == host_id(cand):
        return []
    a, b = _identity(base), _identity(cand)
    if a is None or b is None:
        return [f"host id {host_id(base)} vs {host_id(cand)} (no inventory to compare)"]
    found = []
    if a["cpu"] != b["cpu"]:
        found.append(f"CPU {a['cpu']} vs {b['cpu']}")
    if not a["tsc_hz"] or abs(a["tsc_hz"] - b["tsc_hz"]) > 0.005 * a["tsc_hz"]:
        found.append(f"TSC {a['tsc_hz'] / 1e6:.0f} vs {b['tsc_hz'] / 1e6:.0f} MHz")
    if a["numa"] != b["numa"]:
        found.append(f"NUMA nodes (node, CPUs) {a['numa']} vs {b['numa']}")
    if a["gpus"] != b["gpus"]:
        found.append(f"GPUs {a['gpus']} vs {b['gpus']}")
    return found


def host_note(base_meta: dict, cand_meta: dict, cross_host: bool, names: tuple[str, str]) -> str:
    """What a comparison says of the two runs' hosts; UsageError for other hardware without
    `cross_host`."""
    from nearlocal.errors import UsageError

    differences = host_differences(base_meta, cand_meta)
    if differences:
        if not cross_host:
            raise UsageError(f"runs {names[0]} and {names[1]} come from different hardware ("
                             + "; ".join(differences) + "): pass --cross-host to compare anyway")
        return "cross-host comparison: " + "; ".join(differences)
    if host_id(base_meta) != host_id(cand_meta):
        return (f"host ids {host_id(base_meta)} / {host_id(cand_meta)} differ only in memory "
                "size or calibrated TSC: same hardware")
    return ""
