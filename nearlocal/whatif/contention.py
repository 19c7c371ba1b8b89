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
the peer, such as `load`, stands for no hop but still shows how reads share memory)."""

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
    """`hop/method`, or `region/method` when no hop takes the row; `... over D devices` when its
    movers were spread over D devices (`devices=D`: the GPU movers over several GPUs), a way of
    its own beside the movers of one device."""
    row = dict(row)
    way = f"{_hop_of(row) or row.get('region')}/{row.get('method')}"
    devices = devices_of(row)
    return f"{way} over {devices} devices" if devices > 1 else way


def movers_of(row: Mapping) -> int:
    params = decode_params_or_none(row.get("params")) or {}
    text = str(params.get("movers", "1")).strip()
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
    the same request moved the same way."""
    by_case = _samples_by_case(samples)
    records = [r for r in _records(rows)
               if str(r.get("status", "ok")) == "ok" and not _threaded(r)
               and r.get("median_ns") is not None and not _nan(r.get("median_ns"))]
    patterns: dict[str, set[tuple]] = {}
    for row in records:
        if movers_of(row) > 1:
            patterns.setdefault(way_of(row), set()).add((str(row.get("pattern")), _others(row)))
    out: dict[str, dict[int, dict]] = {}
    for row in records:
        way, k = way_of(row), movers_of(row)
        if (str(row.get("pattern")), _others(row)) not in patterns.get(way, ()):
            continue
        info = _info(row.get("info"))
        nbytes = int(info.get("bytes_per_mover") or row.get("bytes_moved") or 0)
        case_id = str(row.get("case_id", ""))
        ns = by_case.get(case_id)
        kept = [v for part in info.get("mover_samples_ns") or () for v in part]
        if ns is not None and ns.size:  # every process's samples, each one mover's pass
            service = _quantiles(ns)
            source = "raw samples"
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
        # measured (k x bytes over last end - first start), never k x per-mover: the movers'
        # passes need not overlap; k = 1 is the one mover's own figure
        aggregate = info.get("aggregate_gbps") if k > 1 else per_mover
        entry = {"k": k, "pattern": row.get("pattern"), "bytes_per_mover": nbytes,
                 "per_mover_gbps": per_mover, "aggregate_gbps": aggregate,
                 "service_ns": service, "service_from": source, "rows": [case_id],
                 "per_mover": info.get("per_mover", [])}
        # two rows of one way and k (two runs' rows): the figure is the last row's, and names it
        out.setdefault(way, {})[k] = entry
    return {way: dict(sorted(ks.items())) for way, ks in sorted(out.items())}


def _nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _float(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
