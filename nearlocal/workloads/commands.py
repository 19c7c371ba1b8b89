"""`nearlocal kv`: what one KV-cache read turns into — fragments, sizes, contiguity and the RDMA
work requests it would need — for a model, a layout and a selection. Nothing is measured."""

from __future__ import annotations

import argparse

from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.reporters import add_json_option, command_formats, emit
from nearlocal.subcommands import register_command
from nearlocal.units import format_size
from nearlocal.workloads.layouts import LAYOUTS, get_layout

kv = lazy_import("nearlocal.workloads.kv")  # numba compiles its selections: only when used


def kv_text(args: argparse.Namespace) -> str:
    """The `kv:` pattern text equivalent to the command's options (usable with run --pattern)."""
    select = args.select.strip()
    if kv.is_explicit(select):
        return f"kv:{select}"
    if ":" in args.model:
        raise UsageError(f"--model {args.model!r}: a config path for kv patterns cannot hold ':'")
    parts = ["kv", args.model, get_layout(args.layout).name, select]
    options = {"tp": args.tp, "bt": args.block_tokens, "dtype": args.dtype, "order": args.order,
               "blocks": args.blocks, "pool": args.pool, "layers": args.layers, "ctx": args.ctx,
               "dist": args.dist, "run": args.run, "seed": args.seed, "align": args.align}
    parts += [f"{key}={value}" for key, value in options.items()
              if value is not None and not (key == "tp" and value == 1)]
    return ":".join(str(p) for p in parts)


def describe(text: str) -> dict:
    """Everything `nearlocal kv` prints, as plain data."""
    pattern = kv.parse_kv_pattern(text)
    lengths = pattern.frags[:, 2]
    axes = pattern.axes
    count = pattern.count
    data = {
        "pattern": text,
        **{k: (v.item() if hasattr(v, "item") else v) for k, v in axes.items()},
        "fragment_count": count,
        "total_bytes": pattern.total_bytes,
        "fragment_bytes_median": pattern.fragment_bytes,
        "fragment_bytes_min": int(lengths.min()) if count else 0,
        "fragment_bytes_max": int(lengths.max()) if count else 0,
        "non_contiguous": 1.0 - float(axes["contiguity"]),
        "rdma_max_sge": kv.RDMA_MAX_SGE,
        "src_span_bytes": pattern.src_span,
        "histogram": [{"size": label, "fragments": n, "bytes": b}
                      for label, n, b in kv.size_histogram(lengths)],
    }
    data.pop("fragment_bytes", None)
    if axes["select"] == "explicit":
        data["paper_note"] = kv.paper_note(count, int(lengths[0]) if count else 0)
    else:
        g = kv.parse_plan(text).geometry
        data["token_bytes"] = g.parts * g.token_bytes
        placed = (f"each on a multiple of {format_size(g.layer_align)}" if g.layer_align
                  else "back to back")
        held = (f"vLLM's {g.tensors} per-layer tensors, {placed} in one mapping; no "
                "fragment spans two" if g.layout.per_layer
                else "vLLM's cross-layer tensor (one for every layer)"
                if g.layout.name == "cross-layer" else "LMCache's chunks")
        data["sides"] = (f"layout side: the region (read in a gather, written in a scatter) holds "
                         f"{held}; packed side: the local buffer or peer, contiguous")
    return data


def _print(data: dict) -> None:
    from rich.table import Table

    from nearlocal.terminal import console

    if data["select"] == "explicit":
        console.print(f"[bold]{data['pattern']}[/]: an explicit shape, not cut from a model")
        if data.get("paper_note"):
            console.print(f"  [yellow]{data['paper_note']}[/]")
    else:
        console.print(
            f"[bold]{data['model']}[/], layout {data['layout']} ({data['order'].upper()}), "
            f"TP {data['tp']}, {data['block_tokens']}-token blocks, {data['kv_dtype']}, "
            f"select {data['select']} ({data['placement']} blocks), layers {data['layers']}; "
            f"pool {format_size(data['pool_bytes'])}; {data['token_bytes']} B per token per layer")
        console.print(f"  {data['sides']}")
    console.print(f"  pattern: {data['pattern']}")
    console.print(
        f"  {data['fragment_count']} fragments ({data['pieces']} pieces before merging "
        f"adjacent runs), {format_size(data['total_bytes'])} in all; fragment size "
        f"{format_size(data['fragment_bytes_min'])} .. {format_size(data['fragment_bytes_max'])}, "
        f"median {format_size(data['fragment_bytes_median'])}")
    console.print(
        f"  contiguity {data['contiguity']:.1%} of pieces continue the previous one "
        f"({data['non_contiguous']:.1%} non-contiguous); RDMA work requests at "
        f"{data['rdma_max_sge']} SGEs each: {data['rdma_work_requests']}")
    table = Table(title="fragment sizes", title_justify="left")
    for column in ("size", "fragments", "bytes"):
        table.add_column(column, justify="right")
    for row in data["histogram"]:
        table.add_row(row["size"], str(row["fragments"]), format_size(row["bytes"]))
    console.print(table)


KV_FORMATS = command_formats("kv", _print)  # the data `describe` gives, as text or JSON

# The words a kv error uses for each of the command's options (the pattern's keys and names).
_OPTION_WORDS = {"tp": ("tp=", "tensor parallelism"), "block_tokens": ("bt=", "block size"),
                 "pool": ("pool=", "the pool"), "layers": ("layers",), "ctx": ("ctx=",),
                 "dist": ("distribution", "dist="), "run": ("run=",), "seed": ("seed=",),
                 "align": ("align",), "dtype": ("dtype",), "order": ("order",),
                 "blocks": ("placement", "blocks="),
                 "select": ("selection", "sparse", "superblock", "dense", "select"),
                 "layout": ("layout",), "model": ("model",)}


def _option_of(args: argparse.Namespace, message: str) -> str | None:
    """`--tp 0`: the option given on the command line that an error about the kv pattern is
    about, when its words say so."""
    for name, words in _OPTION_WORDS.items():
        value = getattr(args, name, None)
        if value is not None and any(word in message for word in words):
            return f"--{name.replace('_', '-')} {value}"
    return None


def _kv(args: argparse.Namespace) -> int:
    try:
        data = describe(kv_text(args))
    except UsageError as exc:  # the error names the option it is about, not only the pattern
        option = _option_of(args, str(exc))
        if option is None or option in str(exc):
            raise
        raise UsageError(f"{option}: {exc}") from None
    emit(KV_FORMATS, data, args)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "kv", help="fragments one KV-cache read turns into, for a model / layout / selection",
        description="Fragments, sizes, contiguity and RDMA work requests of one KV-cache read. "
                    "The `pattern:` line it prints is a kv: pattern for `nearlocal run --pattern`.")
    parser.add_argument("--model", default="qwen2.5-32b",
                        help="built-in model or path of a local config.json (default qwen2.5-32b)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallelism (default 1)")
    parser.add_argument("--block-tokens", type=int, help="tokens per block (layout default)")
    parser.add_argument("--layout", default="flash-attn", help=", ".join(LAYOUTS))
    parser.add_argument("--select", default="dense",
                        help="dense[:N], superblock[:N], sparse[:K] or COUNTxSIZE (default dense)")
    parser.add_argument("--dtype", help="KV dtype: bf16, fp16, fp8, fp32, fp8_ds_mla (deepseek-v3.2, 656 B "
                        "a token) or vLLM's --kv-cache-dtype names (default: the model's)")
    parser.add_argument("--order", help="nhd (default) or hnd")
    parser.add_argument("--blocks", help="block ids contiguous (default) or scattered")
    parser.add_argument("--pool", type=int, help="blocks in the pool (default 2x the table)")
    parser.add_argument("--layers", help="layers A-B or A (default all)")
    parser.add_argument("--ctx", type=int, help="sparse: context tokens (default 4096)")
    parser.add_argument("--dist", help="sparse: uniform (default) or clustered")
    parser.add_argument("--run", type=int, help="sparse clustered: run length (default 8)")
    parser.add_argument("--seed", type=int, help="seed of scattered ids and sparse tokens")
    parser.add_argument("--align", help="per-layer tensors start on a multiple of this (e.g. 2MiB, "
                        "as the CUDA caching allocator rounds); default back to back")
    add_json_option(parser)
    parser.set_defaults(func=_kv)


register_command("kv", register)
