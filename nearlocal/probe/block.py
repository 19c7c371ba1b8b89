"""Block devices (what a file-read / file-write case really reads from) and the file system a
path lives on: from /sys/block and /proc/self/mountinfo."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nearlocal.sysroot import SysRoot

# file systems whose files are not storage (reading them asks a driver, not a disk)
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs", "cgroup",
    "cgroup2", "pstore", "bpf", "configfs", "fusectl", "mqueue", "efivarfs", "binfmt_misc",
    "autofs", "rpc_pipefs", "nsfs", "hugetlbfs", "ramfs",
})


@dataclass
class BlockDevice:
    name: str
    model: str  # "" when the driver shows none (virtio)
    nvme: bool
    transport: str  # "nvme", "virtio", "scsi", "zram", ... from the driver
    queues: int | None  # blk-mq hardware queues (/sys/block/X/mq/*)
    rotational: bool
    logical_block_bytes: int | None
    size_bytes: int

    @property
    def text(self) -> str:
        what = "NVMe" if self.nvme else f"not NVMe ({self.transport or 'unknown transport'})"
        if self.transport == "virtio":
            what += ": a VM's virtual disk"
        queues = f"{self.queues} queue{'s' if self.queues != 1 else ''}" \
            if self.queues is not None else "queues unknown"
        return (f"{self.name} {self.model or '(no model)'}, {what}, {queues}, logical block "
                f"{self.logical_block_bytes or '?'} B, {self.size_bytes / 2**30:.0f} GiB")


def _transport(root: SysRoot, name: str) -> str:
    if name.startswith("nvme"):
        return "nvme"
    for prefix in ("zram", "loop", "nbd", "md", "dm-", "ram"):
        if name.startswith(prefix):
            return prefix.rstrip("-")
    driver = root.path(f"/sys/block/{name}/device/driver")
    try:
        found = os.path.basename(os.readlink(driver)) if driver.is_symlink() else ""
    except OSError:
        found = ""
    if found.startswith("virtio") or root.read(f"/sys/block/{name}/device/vendor") == "0x1af4":
        return "virtio"
    return {"sd": "scsi"}.get(found, found) or ("scsi" if name.startswith("sd") else "")


def probe_block(root: SysRoot) -> list[BlockDevice]:
    """Disks with a size (empty loop and zram devices are left out)."""
    found = []
    for name in sorted(root.listdir("/sys/block")):
        base = f"/sys/block/{name}"
        sectors = root.read_int(f"{base}/size", 0) or 0
        if not sectors:
            continue
        model = (root.read(f"{base}/device/model") or "").strip()
        queues = root.listdir(f"{base}/mq") if root.exists(f"{base}/mq") else None
        transport = _transport(root, name)
        found.append(BlockDevice(
            name=name, model=model, nvme=transport == "nvme", transport=transport,
            queues=len(queues) if queues is not None else None,
            rotational=root.read_int(f"{base}/queue/rotational", 0) == 1,
            logical_block_bytes=root.read_int(f"{base}/queue/logical_block_size"),
            size_bytes=sectors * 512))
    return found


@dataclass
class FileSystem:
    path: str  # the path asked about
    mount_point: str
    fstype: str
    source: str  # the device or "none"
    device: str  # /sys/block name holding it, "" when not a block device
    free_bytes: int | None

    @property
    def pseudo(self) -> bool:
        return self.fstype in PSEUDO_FILESYSTEMS

    @property
    def text(self) -> str:
        free = f", {self.free_bytes / 2**30:.1f} GiB free" if self.free_bytes is not None else ""
        on = f" on {self.source}" if self.source not in ("", "none") else ""
        return f"{self.fstype}{on} mounted at {self.mount_point}{free}"


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
        .replace("\\134", "\\")


def _disk_of(root: SysRoot, dev: int) -> str:
    """The /sys/block disk holding device number `dev` (a partition's parent)."""
    link = root.path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    try:
        real = Path(os.path.realpath(link))
    except OSError:
        return ""
    if not real.exists():
        return ""
    return real.parent.name if (real / "partition").exists() else real.name


def filesystem_of(path: str | Path, root: SysRoot | None = None) -> FileSystem:
    """The mount (longest matching mount point of /proc/self/mountinfo) holding `path`, or its
    parent when it does not exist yet."""
    root = root or SysRoot.default()
    target = Path(path)
    while not target.exists() and target != target.parent:
        target = target.parent
    real = os.path.realpath(target)
    best: tuple[str, str, str, int] = ("/", "unknown", "", 0)
    for line in (root.read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        mount = _unescape(fields[4])
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            major, _, minor = fields[2].partition(":")
            best = (mount, tail[0], tail[1], os.makedev(int(major), int(minor)))
    try:
        vfs = os.statvfs(target)
        free = vfs.f_bavail * vfs.f_frsize
    except OSError:
        free = None
    try:
        dev = os.stat(target).st_dev
    except OSError:
        dev = best[3]
    return FileSystem(str(path), best[0], best[1], best[2], _disk_of(root, dev), free)
