"""Intel DSA devices, engines, groups and work queues (/sys/bus/dsa/devices, /dev/dsa/wqX.Y).

The idxd driver lists each device (`dsaN`), its engines (`engineN.M`), groups (`groupN.M`) and
work queues (`wqN.M`) side by side under /sys/bus/dsa/devices. A work queue can be used from
user space when it is enabled, of type `user` (bound to the `user` driver on newer kernels) and
its character device /dev/dsa/wqN.M exists. When none is, `reason()` says why and, where DSA
devices exist, which accel-config commands would enable one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from nearlocal.sysroot import SysRoot

BASE = "/sys/bus/dsa/devices"
DEV_DIR = "/dev/dsa"

# enum dsa_opcode bit positions in op_cap (see nearlocal.dsa.uapi.Op).
OPCODE_NAMES = {0x00: "noop", 0x01: "batch", 0x02: "drain", 0x03: "memmove", 0x04: "memfill",
                0x05: "compare", 0x06: "compval", 0x07: "cr_delta", 0x08: "ap_delta",
                0x09: "dualcast", 0x0A: "transl_fetch", 0x10: "crcgen", 0x11: "copy_crc",
                0x12: "dif_check", 0x13: "dif_ins", 0x14: "dif_strp", 0x15: "dif_updt",
                0x17: "dix_gen", 0x20: "cflush"}


def decode_op_cap(text: str | None) -> int:
    """The 256-bit operation-capability bitmap from any of the kernel's op_cap formats:
    `0x1ff` (one 64-bit word, before 5.13), `0x1ff 0x0 0x0 0x0` (four words, lowest first),
    or `00000000,...,000001ff` (%*pb: 32-bit groups, highest first)."""
    text = (text or "").strip()
    if not text:
        return 0
    if "," in text:
        value = 0
        for group in text.split(","):
            value = (value << 32) | int(group.strip() or "0", 16)
        return value
    words = text.split()
    return sum(int(word, 16) << (64 * i) for i, word in enumerate(words))


def op_names(bitmap: int) -> list[str]:
    """Names of the DSA operations whose bit is set (unknown bits as opcode numbers)."""
    names = []
    bit = 0
    while bitmap >> bit:
        if bitmap >> bit & 1:
            names.append(OPCODE_NAMES.get(bit, f"op{bit:#x}"))
        bit += 1
    return names


@dataclass
class DsaWorkQueue:
    name: str
    mode: str | None  # dedicated / shared
    size: int | None
    priority: int | None
    type: str | None  # user / kernel / none
    state: str | None  # enabled / disabled
    wq_name: str | None
    dev_path: str
    dev_present: bool
    driver: str | None = None  # bound driver (user, dmaengine, ...) where the kernel says
    group_id: int | None = None
    block_on_fault: bool | None = None
    threshold: int | None = None
    max_transfer_size: int | None = None
    max_batch_size: int | None = None

    @property
    def device(self) -> str:
        return "dsa" + self.name[2:].split(".")[0]

    @property
    def usable(self) -> bool:
        return (self.state == "enabled" and self.type == "user" and self.dev_present
                and self.driver in (None, "user"))

    @property
    def submit_instruction(self) -> str:
        """What user space submits with: movdir64b to a dedicated WQ, enqcmd to a shared one."""
        return "enqcmd" if self.mode == "shared" else "movdir64b"


@dataclass
class DsaEngine:
    name: str
    group_id: int | None


@dataclass
class DsaGroup:
    name: str
    engines: list[str]
    work_queues: list[str]


@dataclass
class DsaDevice:
    name: str
    version: str | None
    max_engines: int | None
    max_transfer_size: int | None
    max_batch_size: int | None
    op_cap: str | None  # as the kernel prints it
    state: str | None
    work_queues: list[DsaWorkQueue] = field(default_factory=list)
    max_groups: int | None = None
    max_work_queues: int | None = None
    max_work_queues_size: int | None = None
    numa_node: int | None = None
    engines: list[DsaEngine] = field(default_factory=list)
    groups: list[DsaGroup] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)  # op_cap decoded

    def enable_commands(self) -> list[str]:
        """accel-config commands that would give this device one enabled dedicated user WQ."""
        dev = self.name
        index = dev[3:]
        wq = _pick_wq(self.work_queues) or f"wq{index}.0"
        configured_group = next((g for g in self.groups if g.engines), None)
        group_id = configured_group.name.split(".")[-1] if configured_group else "0"
        commands: list[str] = []
        if self.state != "enabled":
            if configured_group is None:
                commands.append(f"accel-config config-engine {dev}/engine{index}.0 --group-id=0")
            size = max(1, min(16, self.max_work_queues_size or 16))
            commands.append(f"accel-config config-wq {dev}/{wq} --group-id={group_id} "
                            f"--mode=dedicated --wq-size={size} --priority=10 --type=user "
                            f"--name=nearlocal --driver-name=user")
            commands.append(f"accel-config enable-device {dev}")
        else:
            current = next((w for w in self.work_queues if w.name == wq), None)
            if current is None or current.type != "user" or not current.size:
                commands.append(f"accel-config config-wq {dev}/{wq} --group-id={group_id} "
                                f"--mode=dedicated --wq-size=16 --priority=10 --type=user "
                                f"--name=nearlocal --driver-name=user")
        commands.append(f"accel-config enable-wq {dev}/{wq}")
        return commands


def _pick_wq(work_queues: list[DsaWorkQueue]) -> str | None:
    """A disabled WQ to enable: one already configured for user space first."""
    disabled = [w for w in work_queues if w.state != "enabled"]
    for wq in disabled:
        if wq.type == "user" and wq.size:
            return wq.name
    return disabled[0].name if disabled else None


@dataclass
class DsaInfo:
    module_loaded: bool
    devices: list[DsaDevice]
    char_devices: list[str] = field(default_factory=list)  # /dev/dsa entries

    @property
    def work_queues(self) -> list[DsaWorkQueue]:
        return [wq for dev in self.devices for wq in dev.work_queues]

    @property
    def usable_wqs(self) -> list[DsaWorkQueue]:
        return [wq for wq in self.work_queues if wq.usable]

    def reason(self) -> str | None:
        """Why no user WQ can be used, or None when one can."""
        if self.usable_wqs:
            return None
        if not self.module_loaded:
            return "no DSA: the idxd driver is not loaded (no /sys/bus/dsa; modprobe idxd)"
        if not self.devices:
            return "no DSA: the idxd driver is loaded but lists no DSA devices"
        missing = [wq for wq in self.work_queues
                   if wq.state == "enabled" and wq.type == "user" and not wq.dev_present]
        if missing:
            return (f"DSA {missing[0].name} is an enabled user WQ but {missing[0].dev_path} is "
                    "missing (is the idxd user driver bound? check udev)")
        commands = self.devices[0].enable_commands()
        return ("DSA present but no enabled user work queue; enable one with: "
                + " && ".join(commands))


def _bool(text: str | None) -> bool | None:
    return None if text is None else text.strip() in ("1", "Y", "y", "true")


def _driver(root: SysRoot, path: str) -> str | None:
    """The bound driver: the `driver` link's target name, else `driver_name` (newer kernels
    name the driver a WQ should bind to there)."""
    link = root.path(f"{path}/driver")
    if link.is_symlink():
        return os.path.basename(os.readlink(link))
    return root.read(f"{path}/driver_name") or None


def _probe_wq(root: SysRoot, name: str) -> DsaWorkQueue:
    path = f"{BASE}/{name}"
    dev_path = f"{DEV_DIR}/{name}"
    return DsaWorkQueue(
        name=name,
        mode=root.read(f"{path}/mode"),
        size=root.read_int(f"{path}/size", base=10),
        priority=root.read_int(f"{path}/priority", base=10),
        type=root.read(f"{path}/type"),
        state=root.read(f"{path}/state"),
        wq_name=root.read(f"{path}/name"),
        dev_path=dev_path,
        dev_present=root.exists(dev_path),
        driver=_driver(root, path),
        group_id=root.read_int(f"{path}/group_id", base=10),
        block_on_fault=_bool(root.read(f"{path}/block_on_fault")),
        threshold=root.read_int(f"{path}/threshold", base=10),
        max_transfer_size=root.read_int(f"{path}/max_transfer_size", base=10),
        max_batch_size=root.read_int(f"{path}/max_batch_size", base=10),
    )


def probe_dsa(root: SysRoot) -> DsaInfo:
    loaded = root.exists("/sys/bus/dsa") or root.exists("/sys/module/idxd")
    devices: dict[str, DsaDevice] = {}
    names = root.listdir(BASE)
    for name in names:
        if re.fullmatch(r"dsa\d+", name):
            path = f"{BASE}/{name}"
            op_cap = root.read(f"{path}/op_cap")
            devices[name] = DsaDevice(
                name=name,
                version=root.read(f"{path}/version"),
                max_engines=root.read_int(f"{path}/max_engines", base=10),
                max_transfer_size=root.read_int(f"{path}/max_transfer_size", base=10),
                max_batch_size=root.read_int(f"{path}/max_batch_size", base=10),
                op_cap=op_cap,
                state=root.read(f"{path}/state"),
                operations=op_names(decode_op_cap(op_cap)),
                max_groups=root.read_int(f"{path}/max_groups", base=10),
                max_work_queues=root.read_int(f"{path}/max_work_queues", base=10),
                max_work_queues_size=root.read_int(f"{path}/max_work_queues_size", base=10),
                numa_node=root.read_int(f"{path}/numa_node", base=10),
            )
    for name in names:
        match = re.fullmatch(r"(wq|engine|group)(\d+)\.(\d+)", name)
        if not match:
            continue
        parent = devices.get(f"dsa{match.group(2)}")
        if parent is None:
            continue  # an IAA (iax) queue or engine on the same bus
        path = f"{BASE}/{name}"
        if match.group(1) == "wq":
            parent.work_queues.append(_probe_wq(root, name))
        elif match.group(1) == "engine":
            parent.engines.append(DsaEngine(name, root.read_int(f"{path}/group_id", base=10)))
        else:
            parent.groups.append(DsaGroup(
                name,
                engines=(root.read(f"{path}/engines") or "").split(),
                work_queues=(root.read(f"{path}/work_queues") or "").split()))
    char_devices = [f"{DEV_DIR}/{n}" for n in root.listdir(DEV_DIR) if re.fullmatch(r"wq\d+\.\d+", n)]
    return DsaInfo(loaded, list(devices.values()), char_devices)
