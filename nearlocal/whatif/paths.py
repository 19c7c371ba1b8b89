"""The serving paths a KV cache can be reloaded over, and the hops they are made of: one registry
each, declared once. A hop selects the rows that can stand for it by what the rows carry (the
mover their method declares in `Method.delivery`, the source's and destination's pool classes),
never by a method's or region's name, so a plugin's method joins the hop it moves bytes on.

The hops of no one family (the CPU's gathers, the GPU's copies) are declared here; a family's own
hops, and a plugin's hops and paths, come from the modules of the entry-point group
plugins.HOP_GROUP (nearlocal/rdma/serving.py, nearlocal/storage/serving.py), loaded when this
module is: a serving path may name a hop declared there, and is checked once all are loaded."""

from __future__ import annotations

from dataclasses import dataclass

from nearlocal.plugins import declare

POOL = frozenset({"devdax", "cxl-node"})  # POOL_CLASSES keys of a CXL pool
LOCAL = frozenset({"local"})
GPU = frozenset({"gpu"})


@dataclass(frozen=True)
class Hop:
    """One leg of a reload: rows whose delivery mover is one of `movers` and whose source and
    destination pool classes are in `src` / `dst` (None: any) stand for it."""

    name: str
    what: str
    movers: frozenset[str]
    src: frozenset[str] | None
    dst: frozenset[str] | None

    def takes(self, mover: str, src: str, dst: str) -> bool:
        return (mover in self.movers and (self.src is None or src in self.src)
                and (self.dst is None or dst in self.dst))


HOPS: dict[str, Hop] = {}


def register_hop(hop: Hop) -> Hop:
    return declare(HOPS, hop.name, hop, "hop")


for _hop in (
    Hop("host-gather", "the CPU gathers the fragments out of local DRAM", frozenset({"cpu", "dsa"}),
        LOCAL, LOCAL),
    Hop("pool-gather", "the CPU gathers the fragments out of a CXL pool into local DRAM",
        frozenset({"cpu", "dsa"}), POOL, LOCAL),
    Hop("host->gpu", "host DRAM -> GPU over PCIe", frozenset({"gpu"}), LOCAL, GPU),
    Hop("pool->gpu", "CXL pool -> GPU (the GPU reads the pool's mapping)", frozenset({"gpu"}),
        POOL, GPU),
    Hop("gpu-peer", "a peer GPU's HBM -> this GPU (NVLink when peered)", frozenset({"gpu"}), GPU,
        GPU),
):
    register_hop(_hop)


@dataclass(frozen=True)
class ServingPath:
    """Where a request's KV cache comes back from, as routes of hops: the first hop of a route
    moves the request's fragments as the layout cuts them; a later hop moves the bytes the first
    one packed, one piece per layer. The path's figure is its fastest complete route."""

    name: str
    what: str
    routes: tuple[tuple[str, ...], ...]
    # the kind of link (probe/links.py: "cxl" an adapter, "nic" an RDMA NIC) the path's GPU
    # reaches its KV through, whose sharing the what-if names; None: no adapter of its own
    adapter: str | None = None

    def unknown_hops(self) -> list[str]:
        return sorted({hop for route in self.routes for hop in route} - set(HOPS))


SERVING_PATHS: dict[str, ServingPath] = {}


def register_serving_path(path: ServingPath) -> ServingPath:
    return declare(SERVING_PATHS, path.name, path, "serving path")


for _path in (
    ServingPath("cpu-offload", "KV offloaded to host DRAM, reloaded over PCIe",
                (("host->gpu",), ("host-gather", "host->gpu"))),
    ServingPath("cxl-pool", "KV in a CXL pool (device-dax or a CPU-less node; Beluga)",
                (("pool->gpu",), ("pool-gather", "host->gpu")), adapter="cxl"),
    ServingPath("rdma", "KV in another host's DRAM, fetched over RDMA (Mooncake's path)",
                (("rdma", "host->gpu"),), adapter="nic"),
    ServingPath("nvme", "KV in files on an NVMe SSD", (("nvme->gpu",), ("nvme->host", "host->gpu"))),
    ServingPath("nvlink", "KV lent by a peer GPU's idle HBM over NVLink (SwiftCache)",
                (("gpu-peer",),)),
):
    register_serving_path(_path)


def _load_family_hops() -> None:
    """The group's hops and paths (nearlocal's families', then plugins'), then every path's hops
    checked: a path naming a hop nobody declared is a bug of the module that declared it."""
    from nearlocal.plugins import HOP_GROUP, load_group

    load_group(HOP_GROUP)
    for path in SERVING_PATHS.values():
        if path.unknown_hops():
            raise ValueError(f"serving path {path.name!r} names unknown hops {path.unknown_hops()}")


_load_family_hops()
