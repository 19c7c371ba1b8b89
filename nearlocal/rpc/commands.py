"""`nearlocal faults`: run the fault injector on a shared region and report whether the record
store's coherence protocol held (exit 0) or not (exit 1: a torn read, a missed or late detection)."""

from __future__ import annotations

import argparse

from nearlocal.errors import UsageError, naming
from nearlocal.reporters import (
    JUnitCase,
    TextReporter,
    add_format_options,
    check_outputs,
    command_formats,
    emit,
    junit_xml,
    write_outputs,
)
from nearlocal.subcommands import register_command
from nearlocal.units import parse_duration, parse_size


def _config(args: argparse.Namespace):
    from nearlocal.rpc.faults import FaultConfig

    def parsed(option: str, parse, text: str | None):
        if text is None:
            return None
        with naming(f"{option} {text}"):
            return parse(text)

    config = FaultConfig(
        region=args.region, kills=args.kills,
        duration_s=parsed("--duration", parse_duration, args.duration),
        lease_s=parsed("--lease", parse_duration, args.lease), readers=args.readers,
        records=args.records, record_bytes=parsed("--record-size", parse_size, args.record_size),
        protocol=args.protocol, seed=args.seed,
        read_timeout_s=parsed("--read-timeout", parse_duration, args.read_timeout),
        grace_s=parsed("--grace", parse_duration, args.grace),
        allow_write=args.allow_write)
    config.check()
    return config


def _print(report: dict) -> None:
    from rich.table import Table

    from nearlocal.terminal import console

    config = report["config"]
    detect = report["detect_ms"]
    rows = [
        ("writes attempted / completed",
         f"{report['writes_attempted']:,} / {report['writes_completed']:,}"),
        ("writer kills (inside a write)", f"{report['writer_kills']} ({report['kills_mid_write']})"),
        ("freezes past the lease (fenced itself after / went on, killed)",
         f"{report['freezes']} ({report['writers_fenced_after_freeze']} / "
         f"{report['frozen_writers_killed']})"),
        ("lease lapses (writer starved, fenced itself)", str(report["lease_lapses"])),
        ("writes begun after the owner was judged lost", str(report["writes_after_loss"])),
        ("headers corrupted", str(report["header_corruptions"])),
        ("reads / whole", f"{report['reads']:,} / {report['reads_ok']:,}"),
        ("torn reads past the sequence check (returned to the caller)",
         f"[{'red' if report['torn_reads'] else 'green'}]{report['torn_reads']}[/] "
         f"({report['torn_reads_returned']})"),
        ("retries / checksum rejects", f"{report['retries']:,} / {report['checksum_rejects']:,}"),
        ("fallbacks (recompute): stale / timeout / checksum",
         f"{report['fallbacks_stale']:,} / {report['fallbacks_timeout']:,} / "
         f"{report['fallbacks_corrupt']:,}"),
        ("owners lost / stale detections (all readers)",
         f"{report['owners_lost']} / {report['stale_detections']}"),
        ("missed detections", str(report["missed_detections"])),
        ("time to detect (ms) min / median / p99 / max",
         " / ".join(f"{detect[k]:.1f}" for k in ("min", "median", "p99", "max")) if detect else "-"),
        ("detections later than the bound", f"{report['detections_late']} "
         f"(bound {report['detect_bound_ms']:.0f} ms = lease + grace)"),
        ("judged lost before the fault (starved writer)", str(report["detected_before_fault"])),
        ("records invalidated / writes retried / repaired",
         f"{report['invalidated']} / {report['idempotent_retries']} / {report['repaired']}"),
        ("longest read (timeout)",
         f"{report['max_read_ms']:.1f} ms ({report['read_timeout_ms']:.0f} ms)"),
    ]
    table = Table(title=f"fault run on {config['region']}: {config['records']} records of "
                        f"{config['record_bytes']} B, {config['readers']} readers, lease "
                        f"{config['lease_s'] * 1e3:g} ms, protocol {config['protocol']}, "
                        f"{report['elapsed_s']:.1f} s", title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if report["stopped_early"]:
        console.print(f"stopped early: {report['stopped_early']}")
    for check in report["checks"]:
        if not check["passed"]:
            console.print(f"[red]failed[/]: {check['check']} ({check['count']} = {check['value']})")
    console.print("[green]PASS[/]" if report["passed"] else "[red]FAIL[/]")


def render_junit(report: dict) -> str:
    """A test case per check of the run (rpc/faults.py CHECKS), failed where its count is not 0,
    the count as the detail; the run's set-up and time as properties."""
    config = report["config"]
    cases = [JUnitCase(c["check"], "nearlocal.faults", 0.0, f"{c['count']} = {c['value']}",
                       "passed" if c["passed"] else "failed", "fault")
             for c in report["checks"]]
    return junit_xml(f"nearlocal faults {config['region']}", cases,
                     [("protocol", str(config["protocol"])), ("kills", str(config["kills"])),
                      ("elapsed_s", f"{report['elapsed_s']:.1f}"),
                      *([("stopped_early", report["stopped_early"])]
                        if report["stopped_early"] else [])])


# run_faults' report: as text (the default), JSON, and JUnit (--junit PATH)
FAULTS_FORMATS = command_formats("faults", _print)
FAULTS_FORMATS.register(TextReporter("junit", "also write a JUnit XML report here: a case per "
                                     "check, failed where it did not hold", render_junit))


def _faults(args: argparse.Namespace) -> int:
    from nearlocal.probe import probe
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.rpc.faults import run_faults

    config = _config(args)
    check_outputs(FAULTS_FORMATS, args)
    inventory = probe()
    spec = parse_region(config.region)
    kind = region_kind(spec)
    kind.validate(spec, inventory)
    reason = kind.unavailable(spec, inventory)
    if reason:
        raise UsageError(f"region {config.region} cannot be used here: {reason}")
    report = run_faults(config, inventory.tsc_hz)
    write_outputs(FAULTS_FORMATS, report, args)
    emit(FAULTS_FORMATS, report, args)
    return 0 if report["passed"] else 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "faults", help="kill / freeze the writer of a shared record store mid-write, with "
                       "readers reading throughout; check no torn read and every owner loss seen")
    parser.add_argument("--region", default="shm:nearlocal-faults",
                        help="the shared region (shm:NAME, file:PATH, devdax:..., numa:N)")
    parser.add_argument("--kills", type=int, default=200, help="writer SIGKILLs (default 200)")
    parser.add_argument("--duration", default="30s",
                        help="stop after this long even if the kills are not done (default 30s)")
    parser.add_argument("--lease", default="20ms",
                        help="owner lease: no heartbeat for this long = owner lost (default 20ms)")
    parser.add_argument("--grace", help="allowed detection delay beyond the lease "
                        "(default: one lease)")
    parser.add_argument("--read-timeout", help="longest a read may wait (default 5 leases)")
    parser.add_argument("--readers", type=int, default=2, help="reader processes (default 2)")
    parser.add_argument("--records", type=int, default=64, help="records (default 64)")
    parser.add_argument("--record-size", default="16KiB", help="record payload (default 16KiB)")
    parser.add_argument("--protocol", default="flush", choices=("flush", "coherent"),
                        help="visibility protocol (default flush: what a non-coherent pool needs)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--allow-write", action="store_true",
                        help="allow writing to devdax: regions and existing files")
    add_format_options(parser, FAULTS_FORMATS)  # --json [PATH], --junit PATH
    parser.set_defaults(func=_faults)


register_command("faults", register)
