"""Where each CXL memdev, GPU and RDMA NIC sits: its PCIe / CXL link (current and maximum speed
and width), NUMA node, socket and root port; whether DDIO (allocating writes into the LLC) is on
for each of those root ports; and the GPU x adapter x NIC affinity (which paths cross a socket).
Beluga's GPU figures (B10-B12: 26 GB/s per adapter) depend on all of these.

Sources: /sys/bus/pci/devices/X/{current,max}_link_{speed,width} and numa_node; the root port is
the first PCI device on the device's sysfs path below its host bridge. DDIO is read from the root
port's config space (/sys/bus/pci/devices/RP/config; beyond its first 64 bytes only for root) on
the Intel Xeon generations whose register is documented in public tools: perfctrlsts_0 at 0x180,
bit 7 use_allocating_flow_wr (default 1) and bit 3 NoSnoopOpWrEn (default 0), and perfctrlsts_1's
byte at 0x185, bit 0 TPHDIS (default 0); allocating flows are off only when bit 7 and bit 3 are
0 and TPHDIS is 1 (Intel's `ddio` tool, "query and toggle DDIO state per PCIe root port", BSD-3,
2020-2021; Farshin et al., "Reexamining Direct Cache Access to Optimize I/O Intensive
Applications for Multi-hundred-gigabit Networks", ATC 2020, ddio-bench change-ddio.c:
SKX_PERFCTRLSTS_0 0x180). Elsewhere (a VM, AMD, other Xeons) it is "not exposed": never guessed.
nearlocal never writes the register; `ddio_commands` says how an operator switches it.

The box's CPU (vendor, family, model) is the CPU probe's and its PCI functions the one walk of
/sys/bus/pci/devices that probe/pci.py makes; neither is read again here. What a stored run's
topology says is read back from its plain-data form by the functions at the end: a link as text,
the links below their maximum (the self-check), DDIO as a line and as a row records it
(`ddio_state`: the report's B10 and B11), and which adapter a GPU shares (`adapter_shares`: the
what-if).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from dataclasses import dataclass, field

from nearlocal.probe.pci import PciFunction, pci_functions
from nearlocal.sysroot import SysRoot, parse_cpulist

PCI = "/sys/bus/pci/devices"
CXL = "/sys/bus/cxl/devices"
INFINIBAND = "/sys/class/infiniband"
NODE_DIR = "/sys/devices/system/node"
CPU_DIR = "/sys/devices/system/cpu"
ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
NOT_EXPOSED = "not exposed"
NOT_READABLE = "not readable (root needed)"
NOT_RECORDED = "not recorded"  # a run stored before nearlocal read the links
KIND_WORDS = {"cxl": "CXL adapter", "gpu": "GPU", "nic": "RDMA NIC"}
GPU_VENDORS = {"0x10de", "0x1002"}  # NVIDIA, AMD: their display controllers are GPUs
GPU_CLASS_3D = 0x0302  # "3D controller": data-centre GPUs
GPU_CLASS_VGA = 0x0300
# Intel Xeon (family 6) models whose root ports carry perfctrlsts_0 as above: Skylake-SP and
# Cascade Lake-SP (85), Ice Lake-SP (106) and Ice Lake-D (108). Others: not exposed.
DDIO_MODELS = {85: "Skylake-SP / Cascade Lake-SP", 106: "Ice Lake-SP", 108: "Ice Lake-D"}
PERFCTRLSTS_0 = 0x180
USE_ALLOCATING_FLOW_WR = 0x80
NOSNOOPOPWREN = 0x08
PERFCTRLSTS_1_BYTE1 = 0x185
TPHDIS = 0x01
INTEL = "0x8086"


@dataclass
class Link:
    kind: str  # "cxl" (a CXL memdev: the adapter), "gpu", "nic" (an RDMA device)
    name: str  # mem0, GPU 0 (H100), mlx5_0
    address: str  # its PCI function, DDDD:BB:DD.F
    speed: str | None = None  # current_link_speed as the kernel says it ("32.0 GT/s PCIe")
    width: int | None = None
    max_speed: str | None = None
    max_width: int | None = None
    numa_node: int | None = None
    socket: int | None = None  # the package of the node's CPUs
    root_port: str | None = None  # None: on a root bus (root-complex integrated, or a VM)
    gpu_index: int | None = None  # a GPU's device index (gpu:K), where the GPU probe named it


@dataclass
class DdioPort:
    root_port: str
    state: str  # "on", "off", NOT_READABLE, or "not exposed (why)"
    devices: list[str] = field(default_factory=list)  # the links' names behind it
    register: str | None = None  # the bytes read, e.g. "0x180=0x80 0x185=0x00"


@dataclass
class Topology:
    links: list[Link] = field(default_factory=list)
    ddio: list[DdioPort] = field(default_factory=list)
    ddio_reason: str | None = None  # why DDIO is not exposed on this box at all; None: read
    affinity: list[dict] = field(default_factory=list)  # gpu, peer, peer_kind, relation, crosses


def gts(text: str | None) -> float | None:
    """"16.0 GT/s PCIe" -> 16.0; "Unknown", absent -> None."""
    match = re.match(r"\s*([0-9.]+)\s*GT/s", text or "")
    return float(match.group(1)) if match else None


def _path_addresses(root: SysRoot, absolute: str) -> list[str]:
    """The PCI functions on a sysfs device's real path, host bridge first."""
    real = os.path.realpath(root.path(absolute))
    return [part for part in real.split(os.sep) if ADDRESS.fullmatch(part)]


def _socket_of(root: SysRoot, node: int | None) -> int | None:
    if node is None:
        return None
    try:
        cpus = parse_cpulist(root.read(f"{NODE_DIR}/node{node}/cpulist", "") or "")
    except ValueError:
        return None
    if not cpus:
        return None
    return root.read_int(f"{CPU_DIR}/cpu{cpus[0]}/topology/physical_package_id", base=10)


def _link(root: SysRoot, kind: str, name: str, address: str,
          gpu_index: int | None = None) -> Link:
    base = f"{PCI}/{address}"
    width = root.read_int(f"{base}/current_link_width", base=10)
    max_width = root.read_int(f"{base}/max_link_width", base=10)
    node = root.read_int(f"{base}/numa_node", base=10)
    node = node if node is not None and node >= 0 else None
    path = _path_addresses(root, base)
    return Link(kind, name, address, root.read(f"{base}/current_link_speed"),
                width or None, root.read(f"{base}/max_link_speed"), max_width or None,
                node, _socket_of(root, node), path[0] if len(path) > 1 else None, gpu_index)


def _gpu_links(root: SysRoot, gpu, functions: list[PciFunction]) -> list[Link]:
    from nearlocal.probe.gpu import norm_bus_id  # the GPU probe's own reading of a bus id

    named = {}
    for device in getattr(gpu, "devices", []) or []:
        with contextlib.suppress(ValueError):  # a bus id the driver garbled names no link
            if device.pci_bus_id:
                named[norm_bus_id(device.pci_bus_id)] = device
    links = []
    for function in functions:
        code, vendor = function.class_code, (function.vendor or "").lower()
        if code is None:
            continue
        if code >> 8 == GPU_CLASS_3D or (code >> 8 == GPU_CLASS_VGA and vendor in GPU_VENDORS):
            device = named.get(function.address)
            links.append(_link(root, "gpu", f"GPU {device.index} ({device.name})" if device
                               else f"GPU {function.address}", function.address,
                               device.index if device else None))
    return links


def _cxl_links(root: SysRoot) -> list[Link]:
    links = []
    for name in root.listdir(CXL):
        if re.fullmatch(r"mem\d+", name):
            path = _path_addresses(root, f"{CXL}/{name}")
            if path:
                links.append(_link(root, "cxl", name, path[-1]))
    return links


def _nic_links(root: SysRoot, rdma) -> list[Link]:
    links = []
    for device in getattr(rdma, "devices", []) or []:
        path = _path_addresses(root, f"{INFINIBAND}/{device.name}/device")
        if path:  # soft-RoCE (rxe) has no PCI function of its own
            links.append(_link(root, "nic", device.name, path[-1]))
    return links


def ddio_unexposed(cpu) -> str | None:
    """Why this box shows no DDIO switch at all (a VM, AMD, an undocumented Xeon), from the CPU
    probe's reading (probe/cpu.py: vendor, flags, family and model); None: the root ports'
    register may be read."""
    if cpu is not None and cpu.flags.get("hypervisor"):
        return (f"{NOT_EXPOSED} (a virtual machine: its root ports are emulated, the host's "
                "DDIO is the host's)")
    vendor = getattr(cpu, "vendor", "") or ""
    if vendor == "AuthenticAMD":
        return f"{NOT_EXPOSED} (AMD: no per-root-port DDIO switch is documented)"
    if vendor != "GenuineIntel":
        return f"{NOT_EXPOSED} (not an Intel CPU: {vendor or 'unknown vendor'})"
    family, model = getattr(cpu, "family", None), getattr(cpu, "model_number", None)
    if family != 6 or model not in DDIO_MODELS:
        known = ", ".join(f"{name} (model {m})" for m, name in DDIO_MODELS.items())
        return (f"{NOT_EXPOSED} (the root-port register is documented for {known}; this CPU is "
                f"family {family} model {model})")
    return None


def _ddio_port(root: SysRoot, port: str, devices: list[str], vendor: str | None) -> DdioPort:
    if (vendor or "").lower() != INTEL:
        return DdioPort(port, f"{NOT_EXPOSED} (not an Intel root port)", devices)
    try:
        config = root.path(f"{PCI}/{port}/config").read_bytes()
    except OSError:
        return DdioPort(port, f"{NOT_EXPOSED} (its config space cannot be opened)", devices)
    if len(config) <= PERFCTRLSTS_1_BYTE1:
        if len(config) <= 64 and root.is_real() and os.geteuid() != 0:
            return DdioPort(port, NOT_READABLE, devices)
        return DdioPort(port, f"{NOT_EXPOSED} (config space is {len(config)} bytes)", devices)
    pcs0, pcs1 = config[PERFCTRLSTS_0], config[PERFCTRLSTS_1_BYTE1]
    off = not pcs0 & USE_ALLOCATING_FLOW_WR and not pcs0 & NOSNOOPOPWREN and pcs1 & TPHDIS
    return DdioPort(port, "off" if off else "on", devices,
                    f"{PERFCTRLSTS_0:#x}={pcs0:#04x} {PERFCTRLSTS_1_BYTE1:#x}={pcs1:#04x}")


def ddio_commands(port: DdioPort) -> list[str]:
    """The setpci commands that switch a root port's DDIO off and back on (Intel's tool's
    bits, from the bytes read); [] when the state was not read. nearlocal never runs them."""
    match = re.fullmatch(r"0x180=(0x[0-9a-f]+) 0x185=(0x[0-9a-f]+)", port.register or "")
    if not match:
        return []
    pcs0, pcs1 = int(match.group(1), 16), int(match.group(2), 16)
    off0 = pcs0 & ~(USE_ALLOCATING_FLOW_WR | NOSNOOPOPWREN)
    on0 = (pcs0 | USE_ALLOCATING_FLOW_WR) & ~NOSNOOPOPWREN
    return [f"off: setpci -s {port.root_port} 180.b={off0:02x} 185.b={pcs1 | TPHDIS:02x}",
            f"on (the defaults): setpci -s {port.root_port} 180.b={on0:02x} "
            f"185.b={pcs1 & ~TPHDIS:02x}"]


def _relation(gpu: Link, peer: Link) -> tuple[str, bool | None]:
    if gpu.root_port and gpu.root_port == peer.root_port:
        return f"same root port {gpu.root_port}", False
    if gpu.socket is not None and peer.socket is not None:
        if gpu.socket == peer.socket:
            return f"same socket {gpu.socket}, different root ports", False
        return f"crosses sockets ({gpu.socket} -> {peer.socket})", True
    if gpu.numa_node is not None and peer.numa_node is not None:
        if gpu.numa_node == peer.numa_node:
            return f"same NUMA node {gpu.numa_node}", False
        return f"crosses NUMA nodes ({gpu.numa_node} -> {peer.numa_node})", True
    return "unknown (NUMA node not exposed)", None


def probe_topology(root: SysRoot, cpu=None, gpu=None, rdma=None,
                   functions: list[PciFunction] | None = None) -> Topology:
    """The box's links, DDIO and affinity; `cpu`, `gpu`, `rdma`: the other probes' findings,
    `functions`: the PCI functions when already read (pci.pci_functions; else read here)."""
    functions = pci_functions(root) if functions is None else functions
    links = _cxl_links(root) + _gpu_links(root, gpu, functions) + _nic_links(root, rdma)
    affinity = []
    for g in (link for link in links if link.kind == "gpu"):
        for peer in (link for link in links if link.kind != "gpu"):
            relation, crosses = _relation(g, peer)
            affinity.append({"gpu": g.name, "peer": peer.name, "peer_kind": peer.kind,
                             "relation": relation, "crosses": crosses})
    reason = ddio_unexposed(cpu)
    ports: dict[str, list[str]] = {}
    for link in links:
        if link.root_port:
            ports.setdefault(link.root_port, []).append(link.name)
    vendors = {f.address: f.vendor for f in functions}
    ddio = [] if reason else [
        _ddio_port(root, port, names, vendors.get(port) or root.read(f"{PCI}/{port}/vendor"))
        for port, names in ports.items()]
    return Topology(links, ddio, reason, affinity)


# ------------------------------------------------------------------ read back from plain data


def link_text(link: dict) -> str:
    """One link as the probe and the report's inventory say it."""
    def side(speed, width):
        return f"{speed or '?'} x{width if width else '?'}"
    where = [f"node {link.get('numa_node')}" if link.get("numa_node") is not None else
             "node not exposed"]
    if link.get("socket") is not None:
        where.append(f"socket {link['socket']}")
    where.append(f"root port {link['root_port']}" if link.get("root_port") else "on a root bus")
    return (f"{link.get('kind')} {link.get('name')} at {link.get('address')}: "
            f"{side(link.get('speed'), link.get('width'))} (max "
            f"{side(link.get('max_speed'), link.get('max_width'))}), {', '.join(where)}")


def below_maximum(topology: dict | None) -> list[str]:
    """A line per link trained below its maximum width or speed, from a topology's dict form (a
    live probe's or a stored run's; None or {}: none). A GPU lowers its link speed when idle to
    save power, so a GPU's speed alone is said with that caveat; its width is not."""
    lines = []
    for link in (topology or {}).get("links") or []:
        if not isinstance(link, dict):
            continue
        width, top = link.get("width"), link.get("max_width")
        speed, fastest = gts(link.get("speed")), gts(link.get("max_speed"))
        name = f"{link.get('kind')} {link.get('name')} ({link.get('address')})"
        if width and top and width < top:
            lines.append(f"{name} trained at x{width} of x{top}: every figure on its path moves "
                         "with it; reseat it or check its slot")
        elif speed and fastest and speed < fastest:
            idle = (" (a GPU drops its link speed when idle: read it again under load)"
                    if link.get("kind") == "gpu" else "")
            lines.append(f"{name} runs at {speed:g} GT/s of {fastest:g} GT/s{idle}")
    return lines


def ddio_text(topology: dict | None) -> str:
    """DDIO as one line: per root port its state and devices, or why it is not exposed."""
    topology = topology or {}
    if topology.get("ddio_reason"):
        return str(topology["ddio_reason"])
    ports = topology.get("ddio") or []
    if not ports:
        return f"{NOT_EXPOSED} (no GPU, RDMA NIC or CXL adapter behind a root port)"
    return "; ".join(f"{p.get('root_port')} {p.get('state')} ({', '.join(p.get('devices') or [])})"
                     for p in ports if isinstance(p, dict))


def _links_of(topology: dict | None) -> list[Link]:
    """A topology's links back as Links (a field a stored run lacks reads as its default)."""
    known = {f.name for f in dataclasses.fields(Link)}
    return [Link(**{"address": "?", **{k: v for k, v in link.items() if k in known}})
            for link in (topology or {}).get("links") or []
            if isinstance(link, dict) and link.get("kind") and link.get("name")]


def _ddio_ports(topology: dict) -> dict[str, dict]:
    return {str(p["root_port"]): p for p in topology.get("ddio") or []
            if isinstance(p, dict) and p.get("root_port")}


def ddio_state(topology: dict | None, gpus: tuple[int, ...] = ()) -> tuple[str, str]:
    """DDIO as a row records it: (state, where or why) from the topology the run's inventory
    read at its start. `gpus`: the GPUs the row moved bytes between (gpu:K, its region's first);
    the state at the root port of the first whose link names one that was read, else the box's:
    one state at every root port read, "mixed", or why it is not exposed. A run stored before
    nearlocal read the links: NOT_RECORDED."""
    if not isinstance(topology, dict):
        return NOT_RECORDED, "a run stored before nearlocal read the box's links"
    reason = topology.get("ddio_reason")
    if reason:
        return NOT_EXPOSED, str(reason)
    ports = _ddio_ports(topology)
    links = [link for link in _links_of(topology) if link.kind == "gpu"]
    for gpu in gpus:
        for link in links:
            if link.gpu_index == gpu and link.root_port in ports:
                state = str(ports[link.root_port].get("state"))
                return state.split(" (")[0], f"{state} at {link.name}'s root port {link.root_port}"
    states = {str(p.get("state")) for p in ports.values()}
    if len(states) != 1:
        return (NOT_EXPOSED if not ports else "mixed"), ddio_text(topology)
    (state,) = states
    where = (f"root port {next(iter(ports))}" if len(ports) == 1 else
             f"each of the {len(ports)} root ports read")
    return state.split(" (")[0], f"{state} at {where}"


@dataclass(frozen=True)
class AdapterShare:
    """The adapter (or NIC) of one kind nearest a GPU: under its root port, else on its socket,
    else across one; `sharers`: every GPU whose nearest one it is, this GPU first."""

    gpu: str
    adapter: str
    sharers: tuple[str, ...]
    relation: str
    crosses: bool | None


def _nearness(gpu: Link, peer: Link) -> int:
    if gpu.root_port and gpu.root_port == peer.root_port:
        return 0
    return {False: 1, None: 2, True: 3}[_relation(gpu, peer)[1]]


def adapter_shares(topology: dict | None, kind: str,
                   gpu_indices: tuple[int, ...] = ()) -> tuple[list[AdapterShare], str]:
    """Which adapter of `kind` ("cxl", "nic") each GPU shares, from a topology's dict form: the
    GPUs `gpu_indices` name (gpu:K; every GPU where none of them has a link that says so),
    each with the adapter nearest it and the GPUs whose nearest it is too. ([], why) where the
    topology was not recorded or lists no GPU or no adapter of the kind."""
    word = KIND_WORDS.get(kind, kind)
    if not isinstance(topology, dict):
        return [], f"{NOT_RECORDED} (a run stored before nearlocal read the box's links)"
    links = _links_of(topology)
    gpus = [link for link in links if link.kind == "gpu"]
    peers = [link for link in links if link.kind == kind]
    if not gpus or not peers:
        return [], f"the run's inventory lists no {'GPU' if not gpus else word}"
    nearest = {id(g): min(peers, key=lambda p, g=g: (_nearness(g, p), p.name)) for g in gpus}
    chosen = [g for g in gpus if g.gpu_index is not None and g.gpu_index in gpu_indices] or gpus
    shares = []
    for g in chosen:
        peer = nearest[id(g)]
        relation, crosses = _relation(g, peer)
        sharers = (g.name, *(o.name for o in gpus if o is not g and nearest[id(o)] is peer))
        shares.append(AdapterShare(g.name, peer.name, sharers, relation, crosses))
    return shares, ""
