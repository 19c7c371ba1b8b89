"""Terminal output for probe, run and show: rich tables of rows computed elsewhere."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

from nearlocal.hwprobe import HostInventory
from nearlocal.units import format_ns, format_size

console = Console()
err_console = Console(stderr=True)


def print_inventory(inventory: HostInventory, availability: list[dict]) -> None:
    cpu = inventory.cpu
    console.print(f"[bold]CPU[/] {cpu.model} ({cpu.vendor}), {cpu.logical_cpus} logical CPUs, "
                  f"TSC {inventory.tsc_hz / 1e9:.3f} GHz ({inventory.tsc_source})")
    console.print("  flags: " + "  ".join(
        f"[green]{name}[/]" if present else f"[red]-{name}[/]" for name, present in cpu.flags.items()))
    console.print("  caches: " + ", ".join(
        f"L{c.level} {c.kind} {format_size(c.size_bytes)}" for c in cpu.caches))

    table = Table(title="NUMA nodes", title_justify="left")
    for column in ("node", "cpus", "memory", "note"):
        table.add_column(column)
    for node in inventory.numa:
        table.add_row(str(node.node), f"{len(node.cpus)}", f"{node.mem_total_bytes / 2**30:.1f} GiB",
                      "CPU-less: likely CXL (system-ram)" if node.likely_cxl else "")
    console.print(table)

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
    _print_gpus(inventory)

    print_availability(availability)


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
    table = Table(title="What can run here: attributes per method x region (green = runnable, "
                  "number = skip reason, · = not applicable)", title_justify="left")
    table.add_column("method")
    for region in regions:
        table.add_column(region)
    for method in dict.fromkeys(row["method"] for row in availability):
        marks = (dict.fromkeys(cells.get((method, region), [])) for region in regions)
        table.add_row(method, *(" ".join(m) for m in marks))
    console.print(table)
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
        console.print(table)


def case_table(cases: pd.DataFrame, title: str, include_skipped: bool = False) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("method", "region", "attr", "pattern", "median", "p10-p90", "p99", "GB/s",
                   "n", "status"):
        table.add_column(column, justify="right" if column in ("median", "p99", "GB/s", "n") else "left")
    for row in cases.itertuples():
        if row.status == "skipped" and not include_skipped:
            continue
        if row.status == "ok":
            status = "ok" if row.converged else "ok (not converged)"
            table.add_row(row.method, row.region, row.attr, row.pattern, format_ns(row.median_ns),
                          f"{format_ns(row.p10_ns)} - {format_ns(row.p90_ns)}",
                          format_ns(row.p99_ns), f"{row.gbps:.2f}", str(int(row.n_samples)), status)
        else:
            table.add_row(row.method, row.region, row.attr, row.pattern, "-", "-", "-", "-", "-",
                          f"{row.status}: {row.reason}")
    return table


def print_run(meta: dict, cases: pd.DataFrame, include_skipped: bool = False) -> None:
    counts = cases["status"].value_counts().to_dict()
    console.print(case_table(cases, f"run {meta.get('run_id')}", include_skipped))
    console.print(", ".join(f"{n} {status}" for status, n in counts.items()))
    if not include_skipped and counts.get("skipped"):
        reasons = cases.loc[cases["status"] == "skipped", "reason"].value_counts()
        for reason, n in reasons.items():
            console.print(f"  skipped {n}: {reason}")
