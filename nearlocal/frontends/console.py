"""The front ends' printers for probe, run and show: rich tables of rows computed elsewhere, and
the run's progress (the consoles themselves: terminal.py)."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from nearlocal.lazy import lazy_import
from nearlocal.probe import HostInventory
from nearlocal.terminal import console, err_console, identifier_column, print_table
from nearlocal.units import format_ns, format_size

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
            f"port {p.port} {p.state} {p.link_layer} ({len(p.gids)} GIDs"
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
    _print_gpus(inventory)
    console.print("[bold]block devices[/] " + ("; ".join(d.text for d in inventory.block)
                                               or "none in /sys/block"), markup=True)
    for place in inventory.extra.get("regions", []):
        console.print(f"  {place['region']}: {place['text']}", markup=False)
    if regions is not None:
        print_regions(regions)

    print_availability(availability)


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
    value as it was stored."""
    from nearlocal.params import BadParams, decode_params

    try:
        decoded = decode_params(params)
    except BadParams:
        return str(params)
    return " ".join(f"{k}={v}" for k, v in sorted(decoded.items())) or "-"


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


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


BEAT_POLL_S = 0.5  # how often the CI heartbeat looks whether the log has been quiet


def plural(count: int, noun: str) -> str:
    """`1 case`, `2 cases`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class RunProgress:
    """Progress of `nearlocal run` on stderr, counting only what will be measured (skipped cases
    cost nothing): compiling kernels as a step of its own, then every measurement of every pass
    (K processes per case = K passes), the case in flight and an ETA (engine.eta: what each case
    took in the last pass). On a terminal a live bar; otherwise (a CI log) lines: at each step,
    for every failed case, and a heartbeat so the log is never silent for more than `interval_s`.
    `clock` and `heartbeat=False` let a test drive it."""

    def __init__(self, case_ids: list[str], runnable: list[bool], budget_s: float,
                 enabled: bool = True, target: Console | None = None, interval_s: float = 3.0,
                 processes: int = 1, clock=time.monotonic, heartbeat: bool = True,
                 patterns: list[str] | None = None, arms: int = 1):
        """arms: the runs of a turn-taking group (run --take-turns) this one's passes alternate
        with: the ETA counts their passes too, as long as this run's own."""
        from nearlocal.engine.eta import OPEN_PRIOR_S, EtaModel

        kept = [i for i, run in enumerate(runnable) if run]
        self.ids = [case_ids[i] for i in kept]
        self.skipped = len(case_ids) - len(self.ids)
        self.total = len(self.ids)  # cases to measure
        self.processes = self.passes = max(1, processes)  # passes: with the settling ones
        self.settling: list[str] = []  # cases given processes beyond `processes`
        self.eta = EtaModel(self.ids, self.processes, budget_s / self.processes + OPEN_PRIOR_S,
                            [patterns[i] for i in kept] if patterns else None)
        self.budget_s = budget_s
        self.enabled, self.target, self.interval_s = enabled, target or err_console, interval_s
        self.clock, self.heartbeat = clock, heartbeat
        self.pass_index, self.pass_label, self.position = 0, "", 0
        self.compiling_text = ""  # while kernels compile: "compiling kernels ...: k of n"
        self.arms, self.waiting_text = max(1, arms), ""  # "waiting for its turn ..." meanwhile
        self.started = self.last_event = self.last_line = 0.0
        self._live = self._task = self._beat = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    @property
    def in_ci(self) -> bool:
        return self.enabled and self._live is None

    def current_id(self) -> str:
        """The case being measured: the next one of this pass still to measure."""
        return next((case_id for case_id in self.ids[self.position:]
                     if self.eta.left.get(case_id, 0) > 0), "")

    def current(self) -> str:
        if self.waiting_text:
            return self.waiting_text
        case_id = self.current_id()
        if case_id:
            return self.pass_label + case_id
        # a pass's last case ended and the next pass has not begun: "done" only at the end
        return "done" if self.eta.done >= self.eta.total else "starting the next process"

    def eta_s(self, now: float) -> float:
        return self.arms * self.eta.remaining_s(self.current_id(), now - self.last_event)

    def waiting(self, text: str) -> None:
        """While a turn-taking run waits for its next pass: what the log says it is doing."""
        with self._lock:
            self.waiting_text = text

    def status(self, now: float) -> str:
        """The line a CI log gets: counts, elapsed, ETA, what is happening now."""
        if self.compiling_text:
            return f"{_duration(now - self.started)}: {self.compiling_text}"
        return (f"[{self.eta.done}/{self.eta.total}] {_duration(now - self.started)}, ETA "
                f"{_duration(self.eta_s(now))}: {self.current()}")

    def _line(self, text: str, now: float) -> None:
        self.last_line = now
        self.target.print(text, markup=False, highlight=False)

    def __enter__(self) -> RunProgress:
        self.started = self.last_event = self.last_line = self.clock()
        if not self.enabled:
            return self
        measurements = self.total * self.processes
        header = (f"measuring {plural(self.total, 'case')} ({self.skipped} skipped: they cannot "
                  f"run here), " + (f"each in {self.processes} processes ({measurements} "
                                    "measurements), " if self.processes > 1 else "") +
                  f"up to {self.budget_s:g} s per case")
        if not self.target.is_terminal:
            self._line(header, self.started)
            if self.heartbeat:
                self._beat = threading.Thread(target=self._beat_loop, daemon=True)
                self._beat.start()
            return self
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        class _Eta(ProgressColumn):  # counts down between measurements, from the last estimate
            def render(self, task) -> Text:
                eta_at = task.fields["eta_at"]
                return Text("" if eta_at is None else "ETA " + _duration(eta_at - time.monotonic()))

        self.target.print(header, markup=False, highlight=False)
        self._live = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), _Eta(),
                              TextColumn("{task.fields[case]}", markup=False),
                              console=self.target, transient=True)
        self._live.__enter__()
        self._task = self._live.add_task("measuring", total=max(1, measurements),
                                         eta_at=self.started + self.eta_s(self.started),
                                         case=self.current())
        return self

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_POLL_S):
            self.beat()

    def beat(self) -> None:
        """A CI log line when nothing was printed for nearly `interval_s` (the heartbeat
        thread wakes every BEAT_POLL_S, so no gap in the log exceeds `interval_s`)."""
        with self._lock:
            now = self.clock()
            if self.in_ci and now - self.last_line >= self.interval_s - BEAT_POLL_S:
                self._line(self.status(now), now)

    def compiling(self, done: int, of: int, case_id: str, compiled: int) -> None:
        """The runner's compile step: `done` of `of` kernel sets ready, `compiled` by numba."""
        with self._lock:
            now = self.clock()
            if done < of:
                self.compiling_text = (f"compiling kernels (first run only): {done} of {of} "
                                       f"({case_id})")
                if self._live is not None:
                    self._live.update(self._task, description="compiling kernels (first run "
                                      "only)", completed=done, total=of, eta_at=None, case=case_id)
                elif self.in_ci and (done == 0 or now - self.last_line >= self.interval_s):
                    self._line(self.status(now), now)
                return
            self.compiling_text = ""
            self.last_event = now  # the ETA counts measurements only
            if self.enabled and of:
                text = (f"{_duration(now - self.started)}: kernels ready ({of} sets; "
                        f"{plural(compiled, 'kernel')} compiled, the rest from numba's cache)")
                if self._live is not None:
                    self._live.update(self._task, description="measuring", completed=0,
                                      total=max(1, self.eta.total), case=self.current(),
                                      eta_at=now + self.eta_s(now))
                    self.target.print(text, markup=False, highlight=False)
                else:
                    self._line(text, now)

    def new_pass(self, index: int) -> None:
        """With --processes K the runner makes K passes over the cases; rows finish in the last
        pass (or when they fail)."""
        with self._lock:
            self.pass_index, self.position = index, 0
            self.eta.new_pass()
            if self.processes <= 1 or not self.enabled:
                return
            now = self.clock()
            self.pass_label = f"process {index + 1} of {self.passes}: "
            if self._live is not None:
                self._live.update(self._task, case=self.current())
                return
            settling = index == self.processes and self.settling
            if settling:
                from nearlocal.engine.runner import SETTLED_SPREAD

                self._line(f"{_duration(now - self.started)}: "
                           f"{plural(len(self.settling), 'case')} whose {self.processes} processes "
                           f"disagree by over {SETTLED_SPREAD:.0%} "
                           f"{'gets' if len(self.settling) == 1 else 'get'} "
                           f"up to {self.passes}: {', '.join(self.settling)}", now)
            if index and not settling and now - self.last_line < self.interval_s:
                return  # passes of a few cases take well under a second: a line per 3 s
            over = "over the cases" if index < self.processes else \
                f"over {plural(sum(self.eta.left[c] > 0 for c in self.settling), 'case')}"
            self._line(f"{_duration(now - self.started)}: pass {index + 1} of {self.passes} "
                       f"{over}, ETA {_duration(self.eta_s(now))}", now)

    def settle(self, case_id: str, extra: int) -> None:
        """The runner gives `case_id` `extra` processes more (runner.processes_to_settle)."""
        with self._lock:
            self.eta.more(case_id, extra)
            self.settling.append(case_id)
            self.passes = max(self.passes, self.processes + extra)

    def measured(self, case_id: str, failed: bool) -> None:
        """One measurement (one case in one pass) ended."""
        with self._lock:
            now = self.clock()
            self.eta.measured(case_id, now - self.last_event, failed)
            self.last_event = now
            if case_id in self.ids:
                self.position = self.ids.index(case_id) + 1
            if self._live is not None:
                self._live.update(self._task, completed=self.eta.done, total=max(1, self.eta.total),
                                  eta_at=now + self.eta_s(now), case=self.current())
            elif self.in_ci and (now - self.last_line >= self.interval_s
                                 or self.eta.done == self.eta.total):
                self._line(self.status(now), now)

    def finished(self, row: dict) -> None:
        """One case's row is stored (measured, failed or skipped): failures get a line."""
        with self._lock:
            if self.in_ci and row.get("status") == "failed":
                now = self.clock()
                self._line(f"[{self.eta.done}/{self.eta.total}] {_duration(now - self.started)}: "
                           f"{row.get('case_id')} failed: {row.get('reason', '')}", now)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(2)
        if self._live is not None:
            self._live.__exit__(*exc)
