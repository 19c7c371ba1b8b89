"""How long a run has left, from what its measurements took so far (issue 19: the first run
said "ETA 52 s" and took 2 min 16 s). Plain arithmetic on progress events; no clock here.

With K processes per case the runner makes K passes over the same cases, so from the second pass on
a case costs about what it cost in the last one (worker start-up included: it falls on the first
case of each pass). A case not measured yet costs what cases of its group (its pattern: suites
sweep each method over the same sizes) cost so far, else the mean of this pass (or of every pass),
else, before anything was measured, the budget of one process plus OPEN_PRIOR_S. The first case of
a pass, which also waited for its worker to start, counts for itself only. Once PACE_AFTER cases of
a pass ran, the cases measured before are scaled by how much slower or faster it runs than the last
(a shared box's load moves every case alike).
"""

from __future__ import annotations

PACE_AFTER = 10  # measurements of a pass before its pace against the last one counts
# What a measurement costs beyond its budget before any was seen (opening the case, its warm-up,
# a share of the worker's start): 0.07-0.09 s on the 2-vCPU development VM with spawned workers
# (the quick suite's first ETA at the budget alone read 52 s for a run of 4 min 55 s), ~0.02 s
# since workers are forked ready and peers a method never touches are one line (2 min 44 s)
OPEN_PRIOR_S = 0.025


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class EtaModel:
    def __init__(self, case_ids: list[str], passes: int, prior_s: float,
                 groups: list[str] | None = None):
        self.left = dict.fromkeys(case_ids, max(1, passes))  # measurements left per case
        self.group = dict(zip(case_ids, groups, strict=True)) if groups else {}
        self.last: dict[str, float] = {}  # seconds of each case's latest measurement
        self.by_group: dict[str, list[float]] = {}
        self.this_pass: list[float] = []
        self.started_pass = False
        self.pace_now = self.pace_before = 0.0
        self.prior_s = prior_s
        self.done = 0

    @property
    def total(self) -> int:
        """Measurements done and left (a failed case's later passes are not counted)."""
        return sum(self.left.values()) + self.done

    def more(self, case_id: str, measurements: int) -> None:
        """`case_id` is to be measured `measurements` more times (its processes disagreed)."""
        if case_id in self.left:
            self.left[case_id] += max(0, measurements)

    def new_pass(self) -> None:
        self.this_pass, self.started_pass = [], False
        self.pace_now = self.pace_before = 0.0

    def pace(self) -> float:
        """This pass's speed against the last one's over the cases both measured (a box that
        grows busier slows every later case too), once enough of the pass ran to tell."""
        if len(self.this_pass) < PACE_AFTER or not self.pace_before:
            return 1.0
        return min(2.0, max(0.5, self.pace_now / self.pace_before))

    def measured(self, case_id: str, seconds: float, failed: bool = False) -> None:
        """One measurement of `case_id` took `seconds`; a failed case is not measured again."""
        if self.left.get(case_id, 0) <= 0:
            return
        self.done += 1
        if case_id in self.last and self.started_pass:  # how this pass compares with the last
            self.pace_now += seconds
            self.pace_before += self.last[case_id]
        self.last[case_id] = seconds
        if self.started_pass:  # the first of a pass also waited for the worker to start
            self.this_pass.append(seconds)
            if case_id in self.group:
                self.by_group.setdefault(self.group[case_id], []).append(seconds)
        self.started_pass = True
        self.left[case_id] = 0 if failed else self.left[case_id] - 1

    def cost_s(self, case_id: str) -> float:
        """What the next measurement of `case_id` should take."""
        if case_id in self.last:
            return self.last[case_id]
        same = _mean(self.by_group.get(self.group.get(case_id, ""), []))
        if same is not None:
            return same
        mean = _mean(self.this_pass) or _mean(list(self.last.values()))
        return self.prior_s if mean is None else mean

    def remaining_s(self, in_flight: str = "", in_flight_s: float = 0.0) -> float:
        """Seconds left; the measurement in flight (`in_flight`, for `in_flight_s` so far) counts
        only what it should still take."""
        total, pace = 0.0, self.pace()
        for case_id, n in self.left.items():
            if n:
                cost = self.cost_s(case_id) * (pace if case_id in self.last else 1.0)
                total += n * cost - (min(in_flight_s, cost) if case_id == in_flight else 0.0)
        return max(0.0, total)
