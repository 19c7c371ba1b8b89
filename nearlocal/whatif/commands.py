"""`nearlocal whatif [RUN]`: a stored run's paths in the units of serving (docs/whatif.md). A
rich table on a terminal, plain lines in a log, `--json`, `--markdown FILE`. Nothing is
measured; the figures are computed from the run's rows and, where asked, a reference box."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nearlocal.errors import UsageError
from nearlocal.reporters import (
    Reporters,
    TextReporter,
    add_json_option,
    command_formats,
    emit,
    json_reporter,
    json_wanted,
)
from nearlocal.subcommands import register_command
from nearlocal.units import format_ns, format_size
from nearlocal.whatif import loadcommand
from nearlocal.whatif.paths import SERVING_PATHS
from nearlocal.whatif.references import reference_names

if TYPE_CHECKING:
    from nearlocal.whatif.claims import Claim
    from nearlocal.whatif.serving import PathFigures, Request, Term, Whatif


def parse_tokens(text: str) -> int:
    """16k, 16K, 16384 or 1M tokens (k = 1024 tokens, as context windows are quoted)."""
    value = text.strip().lower()
    scale = {"k": 1024, "m": 1024 * 1024}.get(value[-1:], 1)
    digits = value[:-1] if scale > 1 else value
    try:
        count = int(digits) * scale
    except ValueError:
        raise UsageError(f"--context {text!r}: a number of tokens, e.g. 16384 or 16k") from None
    if count <= 0:
        raise UsageError(f"--context {text!r}: a positive number of tokens")
    return count


def request_of(args: argparse.Namespace) -> Request:
    from nearlocal.whatif.serving import Request

    return Request(model=args.model, context=parse_tokens(args.context), cached=args.cached,
                   tp=args.tp, layout=args.layout, block_tokens=args.block_tokens,
                   dtype=args.dtype, gpus_per_link=args.gpus_per_link,
                   layer_compute_us=args.layer_compute_us,
                   prefill_tokens_per_s=args.prefill_tokens_per_s, batch=args.batch,
                   fixed_ms=args.fixed_ms)


def _ms(ns: float | None) -> str:
    return "-" if ns is None else format_ns(ns)


def _term_text(term: Term) -> str:
    figure = _ms(term.ns) if term.ns is not None else term.source
    return (f"{term.hop}: {term.fragments} x {format_size(term.fragment_bytes)} = {figure}")


def _source_of(term: Term) -> str:
    if term.ns is None:
        return term.source
    if term.source == "measured":
        return f"measured: {term.way}; rows {', '.join(term.rows)}"
    return term.source


def _verdict(path: PathFigures) -> str:
    if path.beats_recompute is None:
        return "-"
    return "reload" if path.beats_recompute else "recompute"


def _header(result: Whatif) -> list[str]:
    request, shape = result.request, result.shape
    batch = f", {request.batch} requests a turn" if request.batch > 1 else ""
    lines = [f"what-if for run {result.run}: {request.model}, {request.context} tokens "
             f"({request.cached_tokens} cached), TP {request.tp}, {shape.layout}{batch}; one "
             f"request's read = "
             f"{shape.fragments} fragments of {format_size(shape.fragment_bytes)} (median), "
             f"{format_size(shape.total_bytes)} ({format_size(shape.total_bytes // shape.layers)}"
             f" per layer, {shape.layers} layers; pattern {shape.pattern})"]
    if result.emulated:
        lines.append(f"NOTE: {result.emulated}")
    if result.reference:
        lines.append(f"hops this box did not measure come from {result.reference}")
    return lines


def _print(result: Whatif) -> None:
    from rich.table import Table

    from nearlocal.terminal import console, print_table

    for line in _header(result):
        console.print(line, markup=False, highlight=False)
    table = Table(title="reload per turn, per serving path", title_justify="left")
    for column in ("path", "reload", "GB/s", "req/s bound", "pipelined", "vs recompute",
                   "terms"):
        table.add_column(column, justify="left" if column in ("path", "terms") else "right")
    for path in result.paths:
        table.add_row(
            path.path, _ms(path.reload_ns) if path.complete else "incomplete",
            "-" if path.gbps is None else f"{path.gbps:.2f}",
            "-" if path.requests_per_s is None else f"{path.requests_per_s:.3g}",
            _ms(path.pipelined_ns), _verdict(path),
            "; ".join(_term_text(t) for t in path.terms))
    print_table(table)
    console.print("where each term comes from:", markup=False, highlight=False)
    for path in result.paths:
        for term in path.terms:
            console.print(f"  {path.path} / {term.hop}: {_source_of(term)}", markup=False,
                          highlight=False)
            for note in term.notes:
                console.print(f"    note: {note}", markup=False, highlight=False)
        for note in (*path.notes, *([path.shares] if path.shares else [])):
            console.print(f"  {path.path}: {note}", markup=False, highlight=False)


def markdown(result: Whatif) -> str:
    lines = ["# nearlocal what-if", "", *(f"{line}  " for line in _header(result)), "",
             "| path | reload per turn | GB/s | req/s bound | pipelined | vs recompute | terms |",
             "|---|---:|---:|---:|---:|---|---|"]
    for path in result.paths:
        lines.append(
            f"| {path.path} | {_ms(path.reload_ns) if path.complete else 'incomplete'} | "
            f"{'-' if path.gbps is None else f'{path.gbps:.2f}'} | "
            f"{'-' if path.requests_per_s is None else f'{path.requests_per_s:.3g}'} | "
            f"{_ms(path.pipelined_ns)} | {_verdict(path)} | "
            + "<br>".join(f"{_term_text(t)} ({_source_of(t)})" for t in path.terms) + " |")
    notes = [f"- {p.path} / {t.hop}: {n}" for p in result.paths for t in p.terms for n in t.notes]
    notes += [f"- {p.path}: {p.shares}" for p in result.paths if p.shares]
    return "\n".join([*lines, "", *(["Notes:", "", *notes, ""] if notes else [])])


def claims_markdown(claims: list[Claim]) -> str:
    lines = ["| ID | claim | reported by the paper | from the paper's microbenchmarks | "
             "predicted for this box |", "|---|---|---|---|---|"]
    for c in claims:
        rows = f" (rows {', '.join(c.rows)})" if c.rows else ""
        lines.append(f"| {c.id} | {c.what} | {c.reported} | {c.from_papers} | "
                     f"{c.this_box}{rows} |")
    lines += ["", *(f"- {c.id}: {c.explains} (assumed: {c.assumption})" for c in claims)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Answer:
    """What `whatif` gives for one request: the figures per path and, where --claims asked for
    them, the papers' claims recomputed."""

    result: Whatif
    claims: list[Claim] = field(default_factory=list)
    asked_claims: bool = False

    def to_dict(self) -> dict:
        data = self.result.as_dict()
        if self.asked_claims:
            data["claims"] = [asdict(c) for c in self.claims]
        return data

    def markdown(self) -> str:
        return markdown(self.result) + ("\n## The papers' claims recomputed\n\n"
                                        + claims_markdown(self.claims) if self.claims else "")


def _print_answer(answer: Answer) -> None:
    _print(answer.result)
    if answer.claims:
        from nearlocal.terminal import console

        console.print("\nthe papers' claims recomputed:", markup=False, highlight=False)
        console.print(claims_markdown(answer.claims), markup=False, highlight=False)


WHATIF_FORMATS = command_formats("whatif", _print_answer, Answer.to_dict)
WHATIF_FORMATS.register(TextReporter("markdown", "the table as Markdown", Answer.markdown))
REFERENCES_FORMATS: Reporters[list[str]] = Reporters("whatif")  # --reference list
REFERENCES_FORMATS.register(TextReporter("text", "one name a line",
                                         lambda names: "".join(f"{n}\n" for n in names)))
REFERENCES_FORMATS.register(json_reporter())


@dataclass(frozen=True)
class Promoted:
    """--promote NAME: the run as a reference box file (TOML text)."""

    name: str
    toml: str


PROMOTE_FORMATS: Reporters[Promoted] = Reporters("whatif")
PROMOTE_FORMATS.register(TextReporter("toml", "the reference box file", lambda p: p.toml))
PROMOTE_FORMATS.register(json_reporter())


def _whatif(args: argparse.Namespace) -> int:
    from nearlocal import safeio
    from nearlocal.store import load
    from nearlocal.whatif import inputs_of, reference_box, whatif
    from nearlocal.whatif.claims import claims

    if args.reference == "list":
        emit(REFERENCES_FORMATS, reference_names(), args)
        return 0
    if args.promote:
        from nearlocal.whatif.fit import fit_run
        from nearlocal.whatif.references import promoted_toml
        from nearlocal.whatif.serving import best_way, shape_of

        run = load(args.run, Path(args.out))
        shape = shape_of(request_of(args))
        text = promoted_toml(run, fit_run(run.cases), args.promote,  # a gathering way first
                             lambda models: (best_way(models, shape.fragments, shape.fragment_bytes,
                                                      shape.fragments > 1)
                                             or best_way(models, shape.fragments,
                                                         shape.fragment_bytes))[0])
        emit(PROMOTE_FORMATS, Promoted(args.promote, text), args)
        return 0
    target = safeio.check_output("--markdown", args.markdown)  # before anything is computed
    # --trace / --qps: every load option checked and the trace read before the run is
    prepared = (loadcommand.prepare(args, request_of(args), parse_tokens)
                if loadcommand.wanted(args) else None)
    run = load(args.run, Path(args.out))
    reference = reference_box(args.reference, Path(args.out)) if args.reference else None
    inputs = inputs_of(run)
    if not inputs.measured and reference is None:
        raise UsageError(f"run {run.run_id} has no row a serving path stands on (a copy, a GPU "
                         "transfer, RDMA or a file read, timed as one isolated read from "
                         "memory): measure one (`nearlocal run` gathers out of local DRAM; "
                         "--suite gpu, storage, rdma) or name --reference")
    if prepared is not None:
        return loadcommand.run_load(args, prepared, run, inputs, reference, target)
    result = whatif(inputs, request_of(args), reference)
    given = (args.prefill_tokens_per_s,) if args.prefill_tokens_per_s else None
    found = claims(inputs, run.samples, prefill=given) if args.claims else []
    answer = Answer(result, found, args.claims)
    if target is not None:
        WHATIF_FORMATS["markdown"].write(answer, target, "--markdown")
    emit(WHATIF_FORMATS, answer, args, text=target is None)
    if target is not None and not json_wanted(args):
        print(f"wrote {args.markdown}")
    return 0


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """The request's options, shared by `whatif` and `report`'s serving section."""
    parser.add_argument("--model", default="qwen2.5-32b",
                        help="built-in model (as `nearlocal kv`) or a local config.json "
                             "(default qwen2.5-32b)")
    parser.add_argument("--context", default="16k",
                        help="context tokens per request: 16384 or 16k (default 16k)")
    parser.add_argument("--cached", type=float, default=1.0,
                        help="share of the context whose KV is reloaded (default 1)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallelism (default 1)")
    parser.add_argument("--layout",
                        help="KV layout, as `nearlocal kv` (default flash-attn; mla for an MLA "
                             "model)")
    parser.add_argument("--block-tokens", type=int, help="tokens per block (layout default)")
    parser.add_argument("--dtype", help="KV dtype (default: the model's)")
    parser.add_argument("--batch", type=int, default=1,
                        help="requests whose KV reloads in the same turn over the link: one read "
                             "of all their fragments (default 1)")
    parser.add_argument("--gpus-per-link", type=int, default=1,
                        help="GPUs sharing one adapter / NIC: the throughput bound divides "
                             "(default 1)")
    parser.add_argument("--layer-compute-us", type=float,
                        help="a layer's compute time per turn: gives the layer-pipelined reload")
    parser.add_argument("--prefill-tokens-per-s", type=float,
                        help="prefill throughput: gives the break-even against recomputing")
    parser.add_argument("--fixed-ms", type=float, default=0.0,
                        help="what each request costs besides moving its bytes (cache lookup, "
                             "metadata, scheduling), added to its reload (default 0)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "whatif", help="what the box's measured paths mean for serving: KV reload per turn",
        description="KV reload time per turn for a model and context over each serving path ("
                    + ", ".join(SERVING_PATHS) + "), from a stored run's rows; every term "
                    "names the rows it came from. Hops the run did not measure are said so, "
                    "or filled from --reference (docs/whatif.md).")
    parser.add_argument("run", nargs="?", default=None, metavar="RUN",
                        help="run id or directory (default: the latest run)")
    add_request_arguments(parser)
    parser.add_argument("--reference",
                        help="fill the hops this box lacks from a reference box: "
                             + ", ".join(reference_names())
                             + ", a .toml file, or run:RUN (a stored run); `list` lists them")
    parser.add_argument("--promote", metavar="NAME",
                        help="print the run as a reference box file named NAME (per hop the "
                             "way fastest for the request), for nearlocal/data/references/")
    parser.add_argument("--claims", action="store_true",
                        help="also the papers' end-to-end claims (B3, B11, B16, S1-S3) recomputed "
                             "from this run's rows and from the papers' own microbenchmarks, "
                             "and their load claims (B3, B16, S1 and S4 under load)")
    add_json_option(parser)
    parser.add_argument("--markdown", help="write the table as Markdown to this file")
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    loadcommand.add_load_arguments(parser)
    parser.set_defaults(func=_whatif)


register_command("whatif", register)
