"""What `probe --region` says of each region a user names: validated, and where it is a file, the
file system and disk holding it. Here, not in probe: it asks the region kinds (above the probe)."""

from __future__ import annotations

from nearlocal.probe.block import filesystem_of
from nearlocal.regions.base import parse_region, region_kind


def describe_regions(texts: list[str], inventory) -> list[dict]:
    """For `probe --region`: each region validated (bad input: UsageError, exit 2); one backed by
    a file (its kind's `creates` path) with the file system and disk holding it."""
    disks = {d.name: d for d in inventory.block}
    found = []
    for text in texts:
        spec = parse_region(text)
        kind = region_kind(spec)
        kind.validate(spec, inventory)
        path = kind.creates(spec) if kind.creates else None
        if path is None:
            found.append({"region": text, "text": f"{kind.summary} (no file)"})
            continue
        fs = filesystem_of(path)
        disk = disks.get(fs.device)
        text_ = f"{fs.text}" + (f"; disk {disk.text}" if disk else
                                "; not on a block device (memory-backed or remote)")
        found.append({"region": text, "path": str(path), "fstype": fs.fstype,
                      "mount": fs.mount_point, "source": fs.source, "free_bytes": fs.free_bytes,
                      "block_device": fs.device, "nvme": bool(disk and disk.nvme),
                      "text": text_})
    return found
