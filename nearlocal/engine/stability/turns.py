"""Runs that take turns: N `nearlocal run` processes on one box (each from its own checkout, or
with its own environment) measure pass by pass in alternation, so the baseline and the candidate
of a CI job are measured under the same host. On a shared 2-vCPU VM the host's L3 and memory
moved by 1.1-1.5x between runs minutes apart (docs/ci.md), while within a run a 1.3x slowdown
read 1.26-1.30x against its unchanged twin in every run: what one run's passes share, the arms
of a turn-taking group share too.

The arms meet in a directory (`--take-turns DIR --turn I/N`): a small JSON state under an
advisory lock (fcntl) holds the slot counter, the arms that checked in and those done. No arm
measures before all N checked in (their start-up, kernel compilation and host-probe rings are
laid concurrently, outside every pass). Slots go round by round, the order reversed every other
round (0 1 2, 2 1 0, 0 1 2, ...), so a drift within a round favours no arm; an arm that is done,
or whose process died, loses its slots. Waiting is outside every timed interval: an arm's pass
starts (its worker process, the host probe) only once its slot has come."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nearlocal.errors import UsageError

STATE = "turns.json"
LOCK = "turns.lock"
POLL_S = 0.05
CHECK_IN_S = 600.0  # how long the arms that came wait for the rest to check in
MAX_ARMS = 64  # a group of N takes N times one run: more is a typo, not a plan


def parse_turn(text: str) -> tuple[int, int]:
    """'I/N' (0 <= I < N, N >= 2) -> (I, N)."""
    head, _, tail = text.partition("/")
    try:
        arm, arms = int(head), int(tail)
    except ValueError:
        raise UsageError(f"--turn takes ARM/ARMS, e.g. 0/2 (arm 0 of 2), got {text!r}") from None
    if not 2 <= arms <= MAX_ARMS or not 0 <= arm < arms:
        raise UsageError(f"--turn {text}: ARMS must be 2 to {MAX_ARMS} and ARM one of "
                         "0..ARMS-1")
    return arm, arms


def slot_arm(slot: int, arms: int) -> int:
    """The arm whose turn slot `slot` is: round by round, every other round reversed."""
    round_, position = divmod(slot, arms)
    return position if round_ % 2 == 0 else arms - 1 - position


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Turns:
    """One arm of a turn-taking group. `take` before each pass (it hands on the slot the arm
    held for its last pass, then waits for its next), `finish` when the arm's run is over.

    The state: `group` (an id drawn by the group's first arm: runs of one group are paired pass
    by pass in compare), `arms`, `slot`, `pids` (the arms present: opened, alive), `ready` (checked
    in at their first pass) and `done`."""

    directory: Path
    arm: int
    arms: int
    alive: Callable[[int], bool] = _alive
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    group: str = ""
    holding: bool = False
    checked_in: bool = False

    @classmethod
    def open(cls, directory: str, turn: str, alive: Callable[[int], bool] = _alive) -> Turns:
        """Join (or start) the group meeting in `directory` as arm I of N ('I/N')."""
        arm, arms = parse_turn(turn)
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--take-turns {directory}: {exc.strerror}") from None
        turns = cls(path, arm, arms, alive=alive)
        with turns._state() as state:
            live = {int(a): pid for a, pid in state["pids"].items()
                    if int(a) not in state["done"] and turns.alive(pid)}
            if not live:  # a group that ended (or died) left its state: a new group starts
                state.clear()
                state.update(turns._fresh())
            elif state["arms"] != arms:
                raise UsageError(f"--take-turns {directory}: a group of {state['arms']} arms "
                                 f"meets there, not {arms} (--turn {turn})")
            elif arm in live and live[arm] != os.getpid():
                raise UsageError(f"--take-turns {directory}: arm {arm} is already taken by "
                                 f"process {live[arm]}")
            state["pids"][str(arm)] = os.getpid()
            turns.group = state["group"]
        return turns

    def _fresh(self) -> dict:
        return {"group": uuid.uuid4().hex[:12], "arms": self.arms, "slot": 0, "pids": {},
                "ready": [], "done": []}

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict]:
        """The group's state, read and written back under the lock."""
        with open(self.directory / LOCK, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.directory / STATE
            try:
                state = json.loads(path.read_text()) if path.exists() else {}
            except (OSError, ValueError):
                state = {}
            if not isinstance(state, dict) or not all(key in state for key in self._fresh()):
                state = self._fresh()
            before = json.dumps(state)
            yield state
            if json.dumps(state) != before:  # a waiting arm polls: it reads, it does not write
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(state))
                tmp.replace(path)

    def _advance(self, state: dict) -> None:
        """The slot moves on to the next arm not done (or stays when all are)."""
        if len(state["done"]) >= self.arms:
            return
        state["slot"] += 1
        while slot_arm(state["slot"], self.arms) in state["done"]:
            state["slot"] += 1

    def _retire(self, state: dict, arm: int) -> None:
        if arm not in state["done"]:
            state["done"].append(arm)
        if slot_arm(state["slot"], self.arms) == arm:
            self._advance(state)

    def _retire_the_dead(self, state: dict) -> None:
        """Arms whose process is gone (killed mid-run, or failed before checking in) are done."""
        for arm, pid in list(state["pids"].items()):
            if int(arm) != self.arm and int(arm) not in state["done"] and not self.alive(pid):
                self._retire(state, int(arm))

    def take(self) -> None:
        """Hand on the slot held for the last pass, then wait for this arm's next slot."""
        started = self.clock()
        with self._state() as state:
            if not self.checked_in:
                if self.arm not in state["ready"]:
                    state["ready"].append(self.arm)
                self.checked_in = True
            if self.holding:
                self._advance(state)
                self.holding = False
        while True:
            with self._state() as state:
                self._retire_the_dead(state)
                missing = [a for a in range(self.arms)
                           if a not in state["ready"] and a not in state["done"]]
                if not missing and slot_arm(state["slot"], self.arms) == self.arm:
                    self.holding = True
                    return
                if missing and self.clock() - started > CHECK_IN_S:
                    raise UsageError(
                        f"--take-turns {self.directory}: arm{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(str, missing))} of {self.arms} did not check in within "
                        f"{CHECK_IN_S:.0f} s")
            self.sleep(POLL_S)

    def finish(self) -> None:
        """This arm is done (measured, interrupted or failed): its slots go to the others."""
        with self._state() as state:
            self._retire(state, self.arm)
        self.holding = False

    def facts(self) -> dict:
        """What the run's metadata says of the group (compare pairs runs of one group)."""
        return {"group": self.group, "arm": self.arm, "arms": self.arms,
                "directory": str(self.directory),
                "order": "round by round, every other round reversed"}


def same_group(base_meta: dict, cand_meta: dict) -> bool:
    """Two runs that took turns in one group, as different arms: their passes alternated."""
    base, cand = base_meta.get("turns"), cand_meta.get("turns")
    return isinstance(base, dict) and isinstance(cand, dict) and bool(base.get("group")) \
        and base.get("group") == cand.get("group") and base.get("arm") != cand.get("arm")
