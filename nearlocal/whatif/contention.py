"""Contention per hop (issue 57, item 1): how a way of moving bytes shares the box when k requests
move at once, from a run's `movers=k` rows (cpu/movers.py: k pinned CPU threads; gpu/movers.py: k
CUDA streams, over D GPUs with `devices=D`; the `contention` suite) and their k = 1 rows (the
method's ordinary row of the same pattern).

Per way and k, plain data a simulation can serve requests with:
- `per_mover_gbps`: one mover's bytes over its median service time (the row's samples are each
  one mover's own pass while the k - 1 others ran theirs);
- `aggregate_gbps`: k x bytes over the span the k passes took (the CPU's last end - first start,
  the GPU's one event pair spanning all k streams), the median over repetitions (the row's info);
- `service_ns`: quantiles of the raw samples (not only their median), and the samples' count:
  the store's samples of the row (every process's; each one mover's pass), else every mover's
  samples the row's info keeps (one process's), else the row's quantile columns;
- `rows`: the case ids it came from.

A way is `HOP/METHOD` where a hop of whatif/paths.py takes the row (its method's delivery mover,
its source's and destination's pool classes), else `REGION/METHOD` (a read that lands nothing in
the peer, such as `load`, stands for no hop but still shows how reads share memory; `... write`
for such a row's stores); followed by
`(WHAT)` where the row's info says what its movers are (`movers_are`).

A measurement whose k movers each stored a row of their own (an MPI job's ranks reading the pool
at once: rack/aggregate.py, one row per rank) says so in the rows' info, read here whatever the
method (no method is named): `movers` (k, where the params have none), `movers_group` (the id
its k rows share: their samples are pooled into one figure at k), `movers_are` (what a mover is,
e.g. "MPI ranks, one per host"), `aggregate_gbps`, and `alone_samples_ns` (each mover's passes
with no other mover running: k = 1 of the same way, pooled over the group's rows)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

import numpy as np

from nearlocal.params import decode_params_or_none
from nearlocal.whatif.paths import HOPS

QUANTILES = (0.1, 0.5, 0.9, 0.99)


def _records(rows: object) -> list[dict]:
    if hasattr(rows, "to_dict"):
        return rows.to_dict("records")  # a DataFrame (the store's cases)
    return [dict(row) for row in rows]


def _info(value: object) -> dict:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str) and value.strip():
        try:
            data = json.loads(value)
        except json.JSONDecodeError:
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def _samples_by_case(samples: object) -> dict[str, np.ndarray]:
    """case id -> raw ns: from the store's samples frame, or a mapping already."""
    if samples is None:
        return {}
    if isinstance(samples, Mapping):
        return {str(k): np.asarray(v, np.float64) for k, v in samples.items()}
    frame = samples
    return {str(case): group["ns"].to_numpy(np.float64)
            for case, group in frame.groupby("case_id", sort=False)}


def _hop_of(row: dict) -> str | None:
    from nearlocal.core.methods import METHODS, load_methods

    load_methods()
    method = METHODS.get(str(row.get("method")))
    delivery = getattr(method, "delivery", None)
    if delivery is None:
        return None
    src, dst = str(row.get("pool_class") or ""), str(row.get("peer_pool_class") or "")
    return next((hop.name for hop in HOPS.values() if hop.takes(delivery.mover, src, dst)), None)


def way_of(row: Mapping) -> str:
    """`hop/method`, or `region/method` when no hop takes the row (`region/method write` for
    its stores: a hop's direction is its own); `... over D devices` when its movers were spread
    over D devices (`devices=D`: the GPU movers over several GPUs), a way of its own beside the
    movers of one device; `... (WHAT)` when the row's info says what its
    movers are (`movers_are`: MPI ranks on hosts are another way than threads of one host)."""
    row = dict(row)
    hop = _hop_of(row)
    way = f"{hop or row.get('region')}/{row.get('method')}"
    access = str(row.get("access") or "read")
    way = way if hop or access == "read" else f"{way} {access}"  # a no-hop row's stores
    devices = devices_of(row)
    way = f"{way} over {devices} devices" if devices > 1 else way
    what = str(_info(row.get("info")).get("movers_are") or "").strip()
    return f"{way} ({what})" if what else way


def movers_of(row: Mapping) -> int:
    """k: the row's `movers` parameter, else its info's `movers` (a measurement whose movers
    are not a parameter: an MPI job's ranks, k = the job's size), else 1."""
    params = decode_params_or_none(row.get("params")) or {}
    text = str(params.get("movers", _info(row.get("info")).get("movers", "1"))).strip()
    return int(text) if text.isdigit() and int(text) >= 1 else 1


def devices_of(row: Mapping) -> int:
    """The devices a row's movers were spread over (`devices=D`; 1 where the row does not say)."""
    params = decode_params_or_none(row.get("params")) or {}
    text = str(params.get("devices", "1")).strip()
    return int(text) if text.isdigit() and int(text) >= 1 else 1


def _threaded(row: Mapping) -> bool:
    params = decode_params_or_none(row.get("params")) or {}
    return str(params.get("threads", "1")) != "1" or bool(str(params.get("cpus", "")).strip())


def _others(row: Mapping) -> tuple:
    """The row's parameters but movers (its effective ones where it has them): a k = 1 row joins
    a way's movers rows only where these are the same (an rdma-read at sge=one or mtu=4096 is
    another way to move the bytes than the sge=batched one whose movers=k rows there are)."""
    params = (decode_params_or_none(row.get("effective_params"))
              or decode_params_or_none(row.get("params")) or {})
    return tuple(sorted((str(k), str(v)) for k, v in params.items() if k != "movers"))


def _quantiles(ns: np.ndarray) -> dict:
    ns = ns[np.isfinite(ns)]
    if not ns.size:
        return {"n": 0}
    out = {f"p{round(q * 100)}_ns": float(np.quantile(ns, q)) for q in QUANTILES}
    return {**out, "mean_ns": float(ns.mean()), "max_ns": float(ns.max()), "n": int(ns.size)}


def contention_of(rows: Iterable[Mapping] | object, samples: object = None) -> dict:
    """{way: {k: {...}}} from case rows (the store's cases frame, or dicts holding method, region,
    pattern, params, info, status, median_ns, bytes_moved, pool_class, peer_pool_class, case_id)
    and, where given, their raw samples (the store's samples frame, or case id -> ns); a row
    without samples falls back to its own quantile columns. Rows split between threads
    (threads=N) are aggregate bandwidth of one request, not k requests: left out. Each way keeps
    the pattern and other parameters its movers > 1 rows have (the serving read), so k = 1 is
    the same request moved the same way. Rows of one `movers_group` are one figure (each one
    mover's row); rows with `alone_samples_ns` give their way's k = 1 too."""
    by_case = _samples_by_case(samples)
    records = [r for r in _records(rows)
               if str(r.get("status", "ok")) == "ok" and not _threaded(r)
               and r.get("median_ns") is not None and not _nan(r.get("median_ns"))]
    patterns: dict[str, set[tuple]] = {}
    for row in records:
        if movers_of(row) > 1:
            patterns.setdefault(way_of(row), set()).add((str(row.get("pattern")), _others(row)))
    # (way, k, group, alone) -> the rows of one figure, in the rows' order
    groups: dict[tuple[str, int, str, bool], list[dict]] = {}
    for row in records:
        way, k = way_of(row), movers_of(row)
        if (str(row.get("pattern")), _others(row)) not in patterns.get(way, ()):
            continue
        info = _info(row.get("info"))
        group = str(info.get("movers_group") or row.get("case_id", ""))
        groups.setdefault((way, k, group, False), []).append(row)
        if k > 1 and info.get("alone_samples_ns"):
            groups.setdefault((way, 1, group, True), []).append(row)
    out: dict[str, dict[int, dict]] = {}
    for (way, k, _, alone), members in groups.items():
        # two figures of one way and k (two runs' rows): the last one's, and it names its rows
        out.setdefault(way, {})[k] = _figure(k, members, by_case, alone)
    return {way: dict(sorted(ks.items())) for way, ks in sorted(out.items())}


def _figure(k: int, members: list[dict], by_case: dict[str, np.ndarray], alone: bool) -> dict:
    """One way's figures at k from the rows of one measurement (one row, or one per mover)."""
    row = members[-1]
    info = _info(row.get("info"))
    nbytes = int(info.get("bytes_per_mover") or row.get("bytes_moved") or 0)
    case_ids = [str(r.get("case_id", "")) for r in members]
    infos = [_info(r.get("info")) for r in members]
    stored = [by_case.get(case) for case in case_ids]
    kept = [v for i in infos for part in i.get("mover_samples_ns") or () for v in part]
    if alone:
        service = _quantiles(np.asarray([v for i in infos for v in i.get("alone_samples_ns")
                                         or ()], np.float64))
        source = ("each mover's passes alone, in turn (the rows' info: "
                  "alone_samples_ns)")
    elif all(ns is not None and ns.size for ns in stored):
        # every process's samples, each one mover's pass; one row per mover: every row's
        service = _quantiles(np.concatenate(stored))
        source = "raw samples" + (f" (the {len(members)} movers' rows)" if len(members) > 1
                                  else "")
    elif kept:
        service = _quantiles(np.asarray(kept, np.float64))
        source = "every mover's raw samples (the row's info: one process's)"
    else:
        service = {f"p{round(q * 100)}_ns": _float(row.get(f"p{round(q * 100)}_ns"))
                   for q in QUANTILES}
        service["p50_ns"] = _float(row.get("median_ns"))
        source = "the row's quantile columns (no samples given)"
    median = service.get("p50_ns")
    per_mover = nbytes / median if nbytes and median else None
    # measured (k x bytes over last end - first start, or the movers' own GB/s summed where each
    # mover kept its own clock), never k x per-mover: the movers' passes need not overlap;
    # k = 1 is the one mover's own figure
    aggregate = info.get("aggregate_gbps") if k > 1 else per_mover
    return {"k": k, "pattern": row.get("pattern"), "bytes_per_mover": nbytes,
            "per_mover_gbps": per_mover, "aggregate_gbps": aggregate,
            "service_ns": service, "service_from": source, "rows": case_ids,
            "movers_are": info.get("movers_are"),
            "per_mover": [] if alone else info.get("per_mover", [])}


def _nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _float(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
