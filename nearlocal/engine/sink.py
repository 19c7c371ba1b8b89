"""Where a Runner puts what it measured: a declared interface, so a front end's own sink (the MPI
job's rank store, the bench plugin's collector) is checked against the one the runner calls,
rather than probed for methods. store.writer.Store is the sink of a stored run; it implements this
structurally (the store layer sits below the engine and imports nothing from it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np


@runtime_checkable
class RunSink(Protocol):
    """Everything the runner hands on, in the order it has it. `keeps_busy`: whether `add_busy`'s
    record is kept; a sink that keeps none spares the run the busy recorder's sampling thread,
    which wakes a few times a second in the runner's process while the workers time."""

    keeps_busy: bool

    def add_case(self, row: dict, raw: np.ndarray | None = None, ns: np.ndarray | None = None,
                 process: np.ndarray | None = None, placement: np.ndarray | None = None) -> None:
        """One finished case: its row and samples; process and placement tag each sample."""

    def add_host_reading(self, pass_index: int, readings: dict[str, list[float]],
                         facts: dict[str, dict]) -> None:
        """One worker process's host probe samples (engine/stability/hostprobe.py)."""

    def add_host_failure(self, reason: str) -> None:
        """Why the host probes ended before the run did."""

    def add_busy(self, record: dict) -> None:
        """How busy the box was while the run measured (engine/stability/busy.py)."""
