"""k concurrent movers (`movers=k`), what every family's form of it shares: the parameter and its
check, and the tally of a row's samples when k transfers run at once (issue 57, item 1).

A family gives a method `movers=k` its own way (cpu/movers.py: k pinned threads; rdma/one_sided.py:
k queue pairs); each then times, per repetition, every mover's own interval (its start and its
end on the run's clock) and hands them to `MoverTally`, which makes the row what
whatif/contention.py reads: sample r of the row is mover r mod k's own interval (one transfer's
service time while k - 1 others moved theirs), the row's info keeps every mover's samples (the
first MOVER_SAMPLES_KEPT), each mover's median and GB/s, and the median over repetitions of the
aggregate: k x bytes over (last end - first start)."""

from __future__ import annotations

import re

import numpy as np

from nearlocal.errors import UsageError

MOVER_PARAMS = {"movers": "1"}
MOVER_SAMPLES_KEPT = 4096  # per mover: the row's info is JSON, bounded


def parse_movers(text: object) -> int:
    """A positive count of concurrent movers."""
    text = str(text).strip()
    if not re.fullmatch(r"\d{1,5}", text) or int(text) < 1:
        raise UsageError(f"malformed movers={text!r}: use a positive count (k concurrent "
                         "movers, each moving the whole pattern)")
    return int(text)


class MoverTally:
    """The samples of k movers, per repetition: their own intervals and the aggregate.

    `labels`: what names each mover in the row (`{"cpu": 3}`, `{"qp": 0}`); `info`: the row's
    info, updated in place after every batch (`per_mover`, `mover_samples_ns`,
    `aggregate_gbps`)."""

    def __init__(self, nbytes: int, labels: list[dict], info: dict):
        self.nbytes, self.labels, self.info = nbytes, labels, info
        self.own: list[list[np.ndarray]] = [[] for _ in labels]
        self.aggregate: list[np.ndarray] = []
        self.taken = 0  # samples handed out: which mover the next sample is
        info.update({"movers": len(labels), "bytes_per_mover": nbytes, "per_mover": [],
                     "mover_samples_ns": [[] for _ in labels]})

    @property
    def k(self) -> int:
        return len(self.labels)

    def add(self, ticks: np.ndarray, own_ns: np.ndarray, span_ns: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
        """One batch of n repetitions: `ticks` and `own_ns` (k, n), each mover's interval, raw
        and in ns (the timer's overhead out); `span_ns` (n,), first start -> last end. Returns
        the row's n samples (raw, ns): sample r is mover r mod k's, counted across batches."""
        k, n = own_ns.shape
        self.aggregate.append(np.where(span_ns > 0, k * self.nbytes / np.maximum(span_ns, 1e-9),
                                       np.nan))
        for m in range(k):
            self.own[m].append(own_ns[m])
            kept = self.info["mover_samples_ns"][m]
            room = MOVER_SAMPLES_KEPT - len(kept)
            if room > 0:
                kept.extend(float(v) for v in own_ns[m, :room])
        pick = (self.taken + np.arange(n)) % k
        self.taken += n
        cols = np.arange(n)
        self._summarise()
        return ticks[pick, cols], own_ns[pick, cols]

    def _summarise(self) -> None:
        rows = []
        for label, parts in zip(self.labels, self.own, strict=True):
            median = float(np.median(np.concatenate(parts)))
            rows.append({**label, "median_ns": median,
                         "gbps": self.nbytes / median if median > 0 else None})
        self.info["per_mover"] = rows
        aggregate = np.concatenate(self.aggregate)
        aggregate = aggregate[np.isfinite(aggregate)]
        self.info["aggregate_gbps"] = float(np.median(aggregate)) if aggregate.size else None
