"""The front ends' printers for probe, run, runs and show: rich tables of rows computed elsewhere,
and each command's formats (`PROBE_FORMATS`, `RUN_FORMATS`, `RUNS_FORMATS`: its text and its
JSON, reporters.command_formats) over the plain data the command builds (the consoles
themselves: terminal.py; the run's progress: progress.py, on stderr)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from nearlocal.lazy import lazy_import
from nearlocal.probe import HostInventory
from nearlocal.reporters import command_formats
from nearlocal.terminal import console, identifier_column, print_table
from nearlocal.units import format_ns, format_number, format_size

pd = lazy_import("pandas")


def print_inventory(inventory: HostInventory, availability: list[dict],
                    regions: dict[str, str | None] | None = None) -> None:
    """`regions`: each region spec the kinds list -> None (mappable here) or why not."""
    cpu = inventory.cpu
    tsc = (f"TSC {inventory.tsc_hz / 1e9:.3f} GHz ({inventory.tsc_source})" if inventory.tsc_hz
           else "TSC frequency not given by the kernel (`nearlocal run` calibrates it)")
    console.print(f"[bold]CPU[/] {cpu.model} ({cpu.vendor}), {cpu.logical_cpus} logical CPUs, {tsc}")
    console.print("  flags: " + "  ".join(
        f"[green]{name}[/]" if present else f"[red]-{name}[/]" for name, present in cpu.flags.items()))
    if cpu.target_features is not None:  # NUMBA_CPU_NAME / NUMBA_CPU_FEATURES: not the CPU's own
        console.print(f"  numba compiles for {cpu.target}: "
                      + (" ".join(f"+{f}" for f in cpu.target_features) or "no features beyond "
                         "x86-64's"), markup=False)
    console.print("  caches: " + ", ".join(
        f"L{c.level} {c.kind} {format_size(c.size_bytes)}" for c in cpu.caches))
    if cpu.measured_llc_bytes:  # a VM: cpuid's LLC is the host's (probe/cache.py)
        console.print(f"  LLC used to judge cases: {format_size(cpu.llc_bytes)}, {cpu.llc_source}",
                      markup=False, highlight=False)

    table = Table(title="NUMA nodes", title_justify="left")
    for column in ("node", "cpus", "memory", "note"):
        table.add_column(column)
    for node in inventory.numa:
        table.add_row(str(node.node), f"{len(node.cpus)}", f"{node.mem_total_bytes / 2**30:.1f} GiB",
                      "CPU-less: likely CXL (system-ram)" if node.likely_cxl else "")
    print_table(table)

    cxl = inventory.cxl
    console.print("[bold]CXL[/] " + (
        f"{len(cxl.memdevs)} memdevs, {len(cxl.decoders)} decoders, {len(cxl.regions)} regions"
        if cxl.present else "none: /sys/bus/cxl/devices is absent"))
    for region in cxl.regions:
        console.print(f"  {region.name}: {format_size(region.size)}, "
                      f"{region.interleave_ways}-way x {region.interleave_granularity} B, "
                      f"targets {', '.join(region.targets)}")
    console.print("[bold]device-dax[/] " + (", ".join(
        f"{d.name} {format_size(d.size)} align {d.align} node {d.target_node} ({d.mode})"
        for d in inventory.dax) or "none: /sys/bus/dax/devices is empty or absent"))
    console.print("[bold]PCI memory BARs[/] " + ("; ".join(
        f"{d.address} BAR{b.index} {format_size(b.size)}"
        f"{' prefetchable' if b.prefetchable else ''} ({'uc, wc' if b.wc_file else 'uc'}): "
        f"pcibar:{d.address}/{b.index}" for d in inventory.pci_memory for b in d.bars)
        or "none (memory-controller class devices)") + " [dim](measured only when named)[/]")
    rdma = inventory.rdma
    console.print("[bold]RDMA[/] " + ("; ".join(
        f"{d.name}: " + ", ".join(
            f"port {p.port} {p.state} {p.link_layer}"
            f"{f' active MTU {p.active_mtu}' if p.active_mtu else ''} ({len(p.gids)} GIDs"
            f"{', ' + p.netdev if p.netdev else ''})" for p in d.ports)
        + (f", max_sge {d.limits['max_sge']}, max_qp_wr {d.limits['max_qp_wr']}, max_mr_size "
           f"{format_size(d.limits['max_mr_size'])}" if "max_sge" in d.limits else "")
        for d in rdma.devices) or "none") + (f" [dim](rdma-*: {rdma.reason})[/]"
                                              if rdma.reason else ""), markup=True)
    dsa = inventory.dsa
    console.print("[bold]DSA[/] " + ("; ".join(
        f"{dev.name} v{dev.version} {dev.state}, {len(dev.engines) or dev.max_engines} engines, "
        f"{len(dev.groups)} groups, max transfer {format_size(dev.max_transfer_size or 0)}, "
        f"max batch {dev.max_batch_size}" for dev in dsa.devices) or "none"))
    for dev in dsa.devices:
        console.print(f"  {dev.name} ops: {' '.join(dev.operations) or '?'}", markup=False)
        for wq in dev.work_queues:
            console.print(f"  {wq.name}: {wq.mode} size {wq.size} priority {wq.priority} type "
                          f"{wq.type} {wq.state} driver {wq.driver or '-'} "
                          f"{wq.dev_path if wq.dev_present else 'no ' + wq.dev_path}"
                          f"{' (usable, ' + wq.submit_instruction + ')' if wq.usable else ''}",
                          markup=False)
    if dsa.reason():
        steps = dsa.reason().replace("with: ", "with:\n    ").replace(" && ", "\n    ")
        console.print(f"  [yellow]{steps}[/]")
    pools = ", ".join(f"{format_size(p.page_bytes)}: {p.free}/{p.total} free"
                      for p in inventory.hugepages.pools)
    console.print(f"[bold]huge pages[/] {pools or 'no hugetlb pools'}; THP {inventory.hugepages.thp_mode}")
    print_settings(inventory)
    _print_gpus(inventory)
    print_topology(inventory)
    print_pool_module(inventory)
    console.print("[bold]block devices[/] " + ("; ".join(d.text for d in inventory.block)
                                               or "none in /sys/block"), markup=True)
    for place in inventory.extra.get("regions", []):
        console.print(f"  {place['region']}: {place['text']}", markup=False)
    if regions is not None:
        print_regions(regions)

    print_availability(availability)


def print_settings(inventory: HostInventory) -> None:
    """The box's own settings (read by probe/settings.py, described and judged by
    engine/stability/settings.py), one line each, then the ones that make figures unstable with
    the command that fixes each (never changed by nearlocal)."""
    from nearlocal.engine.stability.settings import describe_settings, unstable_settings

    box = inventory.box_settings.to_dict()
    console.print("[bold]box settings[/] [dim](what moves every figure; nearlocal never changes "
                  "them: docs/running.md, Prepare a box)[/]")
    for label, text in describe_settings(box):
        console.print(f"  {label}: {text}", markup=False, highlight=False)
    findings = unstable_settings(box)
    if not findings:
        console.print("  no setting here makes figures unstable", markup=False, highlight=False)
    for line in findings:
        console.print(f"  [yellow]unstable[/] {escape(line)}", highlight=False)


def print_topology(inventory: HostInventory) -> None:
    """Each CXL memdev, GPU and RDMA NIC's link, node and root port, DDIO per root port (with
    the commands that switch it: nearlocal never does), the links trained below their maximum,
    and the GPU x adapter / NIC affinity (probe/links.py)."""
    import dataclasses

    from nearlocal.probe.links import below_maximum, ddio_commands, ddio_text, link_text

    topology = dataclasses.asdict(inventory.topology)
    console.print("[bold]links[/] " + ("" if topology["links"] else
                                       "no CXL memdev, GPU or RDMA NIC on a PCI function"))
    for link in topology["links"]:
        console.print(f"  {link_text(link)}", markup=False, highlight=False)
    for line in below_maximum(topology):
        console.print(f"  [yellow]below its maximum[/] {escape(line)}", highlight=False)
    console.print(f"[bold]DDIO[/] {escape(ddio_text(topology))}", highlight=False)
    for port in inventory.topology.ddio:
        for command in ddio_commands(port):
            console.print(f"  {port.root_port} {command}", markup=False, highlight=False)
    if inventory.topology.affinity:
        table = Table(title="GPU x adapter / NIC affinity (a path crossing sockets goes over the "
                      "inter-socket link)", title_justify="left")
        for column in ("GPU", "adapter / NIC", "path"):
            table.add_column(column)
        for pair in inventory.topology.affinity:
            table.add_row(pair["gpu"], f"{pair['peer_kind']} {pair['peer']}", pair["relation"])
        print_table(table)


def print_pool_module(inventory: HostInventory) -> None:
    """The nearlocal_pool kernel module (uc / wc on a pool): bound to which range, or the
    commands that build and load it (nearlocal never loads a module)."""
    module = inventory.pool_module
    if module.usable:
        console.print(f"[bold]nearlocal_pool module[/] loaded, {module.device} maps "
                      f"[{module.start:#x}, {module.start + module.size:#x}) "
                      f"({format_size(module.size)}) wb, uc or wc; {module.mappings or 0} "
                      f"mappings now: ncmem:{module.device}", highlight=False)
        return
    console.print(f"[bold]nearlocal_pool module[/] {escape(module.reason() or '')}",
                  highlight=False)


def print_regions(regions: dict[str, str | None]) -> None:
    """The regions a spec or --region can be aimed at here; the others the kinds list, grouped
    by their reason (gpu:0, pinned, registered:dram: no GPU)."""
    mappable = [text for text, reason in regions.items() if reason is None]
    console.print("[bold]regions[/] " + (", ".join(mappable) or "none"), markup=True)
    by_reason: dict[str, list[str]] = {}
    for text, reason in regions.items():
        if reason:
            by_reason.setdefault(reason, []).append(text)
    for reason, texts in by_reason.items():
        console.print(f"  not here: {', '.join(texts)}: {reason}", markup=False)


def print_availability(availability: list[dict]) -> None:
    """Methods x regions: the attributes that run in each cell, skip reasons as numbered notes;
    a cell where the method does not apply to that kind of region is a dot."""
    regions = list(dict.fromkeys(row["region"] for row in availability))
    reasons = list(dict.fromkeys(row["reason"] for row in availability
                                 if row["reason"] and row["applicable"]))
    cells: dict[tuple[str, str], list[str]] = {}
    for row in availability:
        if not row["applicable"]:
            mark = "[dim]·[/]"
        elif row["runnable"]:
            mark = f"[green]{row['attr']}[/]"
        else:
            mark = f"[dim]{row['attr']}[/][yellow]{reasons.index(row['reason']) + 1}[/]"
        cells.setdefault((row["method"], row["region"]), []).append(mark)
    legend = ("green = runnable, number = skip reason" if console.color_system else
              "an attribute alone = runnable, attribute + number = skipped for that reason")
    table = Table(title=f"What can run here: attributes per method x region ({legend}, "
                  "· = not applicable)", title_justify="left")
    methods = list(dict.fromkeys(row["method"] for row in availability))
    identifier_column(table, "method", methods)
    for region in regions:
        table.add_column(region)
    for method in methods:
        marks = (dict.fromkeys(cells.get((method, region), [])) for region in regions)
        table.add_row(method, *(" ".join(m) for m in marks))
    print_table(table)
    for number, reason in enumerate(reasons, 1):
        console.print(f"  [yellow]{number}[/] {reason}")


def _print_gpus(inventory: HostInventory) -> None:
    gpu = inventory.gpu
    if not gpu.devices:
        console.print(f"[bold]GPU[/] {gpu.reason or 'none'}")
        return
    console.print(f"[bold]GPU[/] driver {gpu.driver_version}, runtime {gpu.runtime_version}, "
                  f"cupy {gpu.cupy_version}, NVRTC {gpu.nvrtc_version or 'unusable'}" +
                  (f"; NVML: {gpu.nvml}" if gpu.nvml else ""))
    if gpu.nvrtc:
        console.print(f"  [yellow]{gpu.nvrtc}[/]")
    elif gpu.kernel_image:
        console.print(f"  kernels: {gpu.kernel_image}")
    for line in gpu.missing:
        console.print(f"  [yellow]missing[/] {line}")
    for g in gpu.devices:
        pcie = (f"PCIe gen {g.pcie_gen} x{g.pcie_width} (max gen {g.pcie_gen_max} "
                f"x{g.pcie_width_max})" if g.pcie_gen else "PCIe link unknown")
        nvlink = f", NVLink {g.nvlink_active} links" if g.nvlink_active else ""
        nvlink += f" ({g.nvswitch_links} to NVSwitches)" if g.nvswitch_links else ""
        console.print(f"  {g.index}: {g.name} {format_size(g.memory_bytes)}, sm_"
                      f"{g.compute_capability.replace('.', '')}, {g.multiprocessors} SMs, "
                      f"{g.copy_engines} copy engines, {pcie}{nvlink}")
    if len(gpu.devices) > 1:
        table = Table(title="GPU pairs: peer access / direct NVLink links", title_justify="left")
        table.add_column("from \\ to")
        for g in gpu.devices:
            table.add_column(str(g.index))
        for i in range(len(gpu.devices)):
            cells = []
            for j in range(len(gpu.devices)):
                links = gpu.nvlink_links[i][j] if gpu.nvlink_links else 0
                cells.append("-" if i == j else
                             ("peer" if gpu.can_access_peer(i, j) else "no peer") +
                             (f", {links} NVLink" if links else ""))
            table.add_row(str(i), *cells)
        print_table(table)


def _range(low: float, high: float) -> str:
    """`10.0–20.0 ns`: one unit when both ends share it."""
    lo, hi = format_ns(low), format_ns(high)
    lo_num, _, lo_unit = lo.partition(" ")
    hi_unit = hi.partition(" ")[2]
    return f"{lo_num}–{hi}" if lo_unit == hi_unit else f"{lo}–{hi}"


def params_text(params) -> str:
    """`protocol=flush qd=8` from the stored JSON text (or a dict); `-` for none; a damaged
    value as it was stored. A float to 6 significant digits (`--json` keeps it whole)."""
    from nearlocal.params import BadParams, decode_params

    try:
        decoded = decode_params(params)
    except BadParams:
        return str(params)
    return " ".join(f"{k}={format_number(v, 6)}" for k, v in sorted(decoded.items())) or "-"


# Key columns of the run table: what tells two rows of one run apart. peer and params are shown
# only when some row has a non-default value (most CPU runs have neither); host and rank only in
# a run of an MPI job (docs/rack.md), whose rows are one per rank.
KEY_COLUMNS = ("method", "access", "region", "attr", "pattern", "peer", "params", "host", "rank")


def case_table(cases: pd.DataFrame, title: str, include_skipped: bool = False,
               compact: bool = False) -> Table:
    """One row per case. `compact` (a terminal too narrow for every column): the key columns
    become the case id, which folds onto more lines but is never cut, and p99 / n are left out."""
    shown = cases if include_skipped else cases[cases["status"] != "skipped"]
    keys = {column: [str(v) for v in shown[column]] if column in shown else []
            for column in KEY_COLUMNS}
    keys["params"] = [params_text(p) for p in shown["params"]] if "params" in shown else []
    optional = {"peer": "dram", "params": "-"}
    columns = [c for c in KEY_COLUMNS if keys[c] and
               (c not in optional or any(v != optional[c] for v in keys[c]))]
    table = Table(title=title, title_justify="left")
    if compact:
        columns = ["case_id"]
        keys["case_id"] = [str(v) for v in shown["case_id"]]
        table.add_column("case", overflow="fold", ratio=1)
    else:
        for column in columns:
            identifier_column(table, column, keys[column])
    numbers = ("median", "p10–p90", "GB/s", "status") if compact else (
        "median", "p10–p90", "p99", "GB/s", "n", "status")
    for column in numbers:
        table.add_column(column, justify="right" if column in ("median", "p99", "GB/s", "n")
                         else "left", overflow="fold", no_wrap=column != "status")
    for index, row in enumerate(shown.itertuples()):
        key = [keys[c][index] for c in columns]
        if row.status == "ok":
            values = {"median": format_ns(row.median_ns),
                      "p10–p90": _range(row.p10_ns, row.p90_ns), "p99": format_ns(row.p99_ns),
                      "GB/s": f"{row.gbps:.2f}" if row.gbps == row.gbps else "-",  # NaN: no bytes
                      "n": str(int(row.n_samples)),
                      "status": "ok" if row.converged else "ok, not converged"}
        else:
            values = {**dict.fromkeys(numbers, "-"), "status": f"{row.status}: {row.reason}"}
        table.add_row(*key, *(values[c] for c in numbers))
    return table


def print_run(meta: dict, cases: pd.DataFrame, include_skipped: bool = False) -> None:
    title = f"run {meta.get('run_id')}"
    table = case_table(cases, title, include_skipped)
    if console.is_terminal:  # too wide for this terminal: the compact form, nothing cut
        wanted = Measurement.get(console, console.options.update_width(1_000_000), table)
        if wanted.maximum > console.width:
            table = case_table(cases, title, include_skipped, compact=True)
    print_table(table)
    counts = cases["status"].value_counts().to_dict()
    console.print(", ".join(f"{n} {status}" for status, n in counts.items()))
    if not include_skipped and counts.get("skipped"):
        reasons = cases.loc[cases["status"] == "skipped", "reason"].value_counts()
        for reason, n in reasons.items():
            console.print(f"  skipped {n}: {reason}", markup=False)


@dataclass(frozen=True)
class Probed:
    """What `probe` found: the inventory, the method x region matrix and each region's verdict
    (None: mappable here, else why not)."""

    inventory: HostInventory
    availability: list[dict]
    regions: dict[str, str | None]

    def to_dict(self) -> dict:
        listed = [{"region": text, "mappable": reason is None, "reason": reason or ""}
                  for text, reason in self.regions.items()]
        return {"inventory": self.inventory.to_dict(), "regions": listed,
                "availability": self.availability}


PROBE_FORMATS = command_formats(
    "probe", lambda p: print_inventory(p.inventory, p.availability, p.regions), Probed.to_dict)


@dataclass(frozen=True)
class RunRows:
    """A stored run's rows as `run` and `show` give them: the table (skipped rows too where
    `include_skipped`), or the rows as records (`columns`: only those)."""

    meta: dict
    cases: pd.DataFrame
    include_skipped: bool = False
    columns: tuple[str, ...] | None = None

    def records(self) -> list[dict]:
        from nearlocal.frontends.selection import case_records

        return case_records(self.cases, list(self.columns) if self.columns else None)


RUN_FORMATS = command_formats(
    "run", lambda r: print_run(r.meta, r.cases, include_skipped=r.include_skipped),
    RunRows.records)


def print_runs(listing: dict) -> None:
    """`runs`: the store's runs as `runs_listing` lists them, one row each."""
    from rich.table import Table as RichTable

    runs = listing["runs"]
    table = RichTable(title=f"runs in {listing['store']}", title_justify="left")
    identifier_column(table, "run", [r["run"] for r in runs])
    for column in ("kind", "suite", "started", "cases", "complete", "host"):
        table.add_column(column)
    for r in runs:
        table.add_row(r["run"], *(_cell(r[k]) for k in ("kind", "suite", "started", "cases")),
                      "yes" if r["complete"] else f"no: {r['state']}", _cell(r["host"]))
    print_table(table)


def _cell(value: object) -> str:
    return "" if value is None else str(value)


RUNS_FORMATS = command_formats("runs", print_runs)
