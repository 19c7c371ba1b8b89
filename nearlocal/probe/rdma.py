"""RDMA devices (/sys/class/infiniband): ports, link layer, state, GIDs, and the device limits
(max_sge, max_qp_wr, max_mr_size) from ibv_query_device and each port's active and max MTU from
ibv_query_port when libibverbs loads (sysfs has no MTU file for a port). The rdma-*
methods run on a device with an active port; without one, `reason` says why (probe prints it,
the runner skips those cases with it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nearlocal.sysroot import SysRoot

BASE = "/sys/class/infiniband"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass
class RdmaPort:
    port: int
    state: str  # "ACTIVE", "DOWN", ... (the text after "N: " in ports/N/state)
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"
    lid: int
    gids: list[tuple[int, str, str]] = field(default_factory=list)  # index, gid, type ("RoCE v2")
    netdev: str = ""
    # ibv_query_port's, in bytes (256 .. 4096); 0: not asked (no libibverbs, a fake tree) or
    # the query failed. A path MTU (the rdma-* `mtu`) above active_mtu cannot run on the port.
    active_mtu: int = 0
    max_mtu: int = 0


@dataclass
class RdmaDevice:
    name: str
    ports: list[RdmaPort]
    limits: dict = field(default_factory=dict)  # ibv_query_device's; {} when libibverbs is absent

    def active_port(self) -> RdmaPort | None:
        return next((p for p in self.ports if p.state == "ACTIVE"), None)


@dataclass
class RdmaInfo:
    devices: list[RdmaDevice] = field(default_factory=list)
    verbs: bool = False  # libibverbs.so.1 loads
    reason: str = ""  # why no rdma-* method can run ("" when one can)

    def device(self, name: str) -> RdmaDevice | None:
        return next((d for d in self.devices if d.name == name), None)


def _ports(root: SysRoot, name: str) -> list[RdmaPort]:
    ports = []
    for text in root.listdir(f"{BASE}/{name}/ports"):
        if not text.isdigit():
            continue
        path = f"{BASE}/{name}/ports/{text}"
        gids = []
        for index in sorted(root.listdir(f"{path}/gids"), key=lambda s: int(s) if s.isdigit() else 0):
            gid = root.read(f"{path}/gids/{index}", ZERO_GID) or ZERO_GID
            if index.isdigit() and gid != ZERO_GID:
                kind = root.read(f"{path}/gid_attrs/types/{index}", "") or ""
                gids.append((int(index), gid, kind))
        netdevs = root.listdir(f"{BASE}/{name}/device/net")
        netdev = root.read(f"{path}/gid_attrs/ndevs/{gids[0][0]}", "") if gids else ""
        ports.append(RdmaPort(
            port=int(text),
            state=(root.read(f"{path}/state", "") or "").split(":")[-1].strip(),
            link_layer=root.read(f"{path}/link_layer", "") or "",
            lid=root.read_int(f"{path}/lid", 0) or 0,
            gids=gids, netdev=netdev or (netdevs[0] if netdevs else "")))
    return ports


def gid_index(port: RdmaPort) -> int:
    """The GID the QPs use: the first RoCE v2 one (routable), else the first one there is."""
    for index, _, kind in port.gids:
        if "v2" in kind:
            return index
    return port.gids[0][0] if port.gids else 0


def probe_rdma(root: SysRoot, query_limits: bool = True) -> RdmaInfo:
    names = root.listdir(BASE)
    devices = [RdmaDevice(name, _ports(root, name)) for name in names]
    lib = None
    if query_limits and root.is_real():
        from nearlocal.probe.verbs import load_library, query_device

        lib = load_library()
        for device in devices:
            try:
                device.limits, mtus = (query_device(lib, device.name, [p.port for p in device.ports])
                                       if lib else ({}, {}))
            except Exception as exc:  # a device libibverbs cannot open (no provider): say so
                device.limits = {"error": str(exc)}
                continue
            for port in device.ports:
                port.active_mtu = mtus.get(port.port, {}).get("active_mtu", 0)
                port.max_mtu = mtus.get(port.port, {}).get("max_mtu", 0)
    verbs = lib is not None if root.is_real() else True  # a fake tree: the library is not asked
    return RdmaInfo(devices, verbs, _reason(root, devices, verbs))


def _reason(root: SysRoot, devices: list[RdmaDevice], verbs: bool) -> str:
    if not root.exists(BASE):
        return ("no RDMA device: /sys/class/infiniband does not exist (no RDMA NIC, or its "
                "driver is not loaded; soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type "
                "rxe netdev IF)")
    if not devices:
        return "no RDMA device: /sys/class/infiniband is empty"
    if not verbs:
        return "libibverbs.so.1 cannot be loaded: apt-get install rdma-core ibverbs-providers"
    if not any(d.active_port() for d in devices):
        states = ", ".join(f"{d.name} port {p.port} {p.state or '?'}" for d in devices
                           for p in d.ports) or "no ports"
        return f"no RDMA port is ACTIVE ({states})"
    return ""
