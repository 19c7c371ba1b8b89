"""The MPI job nearlocal runs in, when it was launched by mpiexec / srun: one rank per process.

mpi4py is imported only when the environment says this process is a rank of a job of two or
more (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX / Slurm variables), so a plain `nearlocal run` never
loads MPI. Every wait has a deadline: messages are non-blocking requests polled against it (a
collective that waits forever is what a dead rank turns a run into otherwise). A rank that died
(ULFM's MPI_ERR_PROC_FAILED under `mpiexec --with-ft ulfm`) or that did not answer in time is a
`RankLost` naming it. MPI is never used inside a timed interval: the ranks meet through the pool
there (the rpc package's slots and records), and through MPI only between phases.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from nearlocal.errors import UsageError

SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS",
                  "SLURM_STEP_NUM_TASKS")  # srun's step, not a batch script's SLURM_NTASKS
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
POLL_S = 0.0005
TAG = 21


class RankLost(Exception):
    """A rank died or did not answer before the deadline: the run goes on without it."""

    def __init__(self, rank: int, why: str):
        super().__init__(f"rank {rank} {why}")
        self.rank = rank
        self.why = why


def launched_size() -> int:
    """How many ranks the launcher started (1 when this is not an MPI job)."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def in_mpi_job() -> bool:
    """True for a rank of a job of two or more (a single rank is an ordinary run)."""
    return launched_size() > 1 and any(name in os.environ for name in RANK_VARIABLES)


WITHOUT_MPI = ("the rack methods run across the hosts of an MPI job: launch `mpiexec -n N "
               "nearlocal run --suite rack` (pip install 'nearlocal[mpi]')")


def needs_mpi(inventory) -> str | None:
    """Outside an MPI job a rack case is skipped with this reason (e.g. in the `all` suite)."""
    return None if in_mpi_job() else WITHOUT_MPI


@dataclass
class World:
    """COMM_WORLD with deadlines. Objects are pickled (plain data between ranks)."""

    comm: object
    rank: int
    size: int

    def _wait(self, request, deadline: float, peer: int, what: str):
        while True:
            try:
                done, value = request.test()
            except Exception as exc:  # mpi4py.MPI.Exception: e.g. MPI_ERR_PROC_FAILED (ULFM)
                raise RankLost(peer, f"failed while {what} ({_mpi_error(exc)})") from None
            if done:
                return value
            if time.monotonic() > deadline:
                _cancel(request)
                raise RankLost(peer, f"did not answer within the deadline while {what}")
            time.sleep(POLL_S)

    def send(self, obj, dest: int, timeout_s: float, what: str = "sending") -> None:
        self._wait(self.comm.isend(obj, dest=dest, tag=TAG), time.monotonic() + timeout_s,
                   dest, what)

    def recv(self, source: int, timeout_s: float, what: str = "receiving"):
        """A matched probe polled against the deadline, then the receive of what has arrived
        (an irecv of a pickled object would need its size in advance)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = self.comm.improbe(source=source, tag=TAG)
                if message is not None:
                    return message.recv()
            except Exception as exc:  # mpi4py.MPI.Exception: e.g. MPI_ERR_PROC_FAILED (ULFM)
                raise RankLost(source, f"failed while {what} ({_mpi_error(exc)})") from None
            if time.monotonic() > deadline:
                raise RankLost(source, f"did not answer within the deadline while {what}")
            time.sleep(POLL_S)

    def barrier(self, timeout_s: float, what: str = "at a barrier") -> None:
        """MPI_Ibarrier polled against the deadline (the start line of a rack phase)."""
        request = self.comm.Ibarrier()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if request.Test():
                    return
            except Exception as exc:
                raise RankLost(-1, f"failed {what} ({_mpi_error(exc)})") from None
            if time.monotonic() > deadline:
                raise RankLost(-1, f"kept the others waiting {what} past the deadline")
            time.sleep(POLL_S)

    def gather(self, obj, timeout_s: float, what: str) -> list | None:
        """Rank 0 gets every rank's obj (in rank order); the others get None."""
        if self.rank:
            self.send(obj, 0, timeout_s, what)
            return None
        return [obj, *[self.recv(r, timeout_s, what) for r in range(1, self.size)]]

    def bcast(self, obj, timeout_s: float, what: str):
        """Rank 0's obj to everyone (point to point, each with its deadline)."""
        if self.rank:
            return self.recv(0, timeout_s, what)
        for r in range(1, self.size):
            self.send(obj, r, timeout_s, what)
        return obj

    def abort(self, code: int) -> None:
        """End the whole job (ranks that hang or were left behind)."""
        self.comm.Abort(code)

    def pingpong_us(self, peer: int, reps: int = 200, timeout_s: float = 30.0) -> float:
        """MPI's own round trip with a peer (8 bytes, median of reps, us, by MPI.Wtime): what
        coordinating through MPI costs. Both ranks call it; the lower one's value is the figure.
        Requests are busy-polled (no sleep: it would be timed) against the deadline."""
        from mpi4py import MPI

        buffer = bytearray(8)
        deadline = time.monotonic() + timeout_s
        first = self.rank < peer

        def done(request) -> None:
            while not request.Test():
                if time.monotonic() > deadline:
                    _cancel(request)
                    raise RankLost(peer, "did not answer the MPI ping-pong within the deadline")

        times = []
        for _ in range(reps + 10):
            t0 = MPI.Wtime()
            if first:
                done(self.comm.Isend(buffer, dest=peer, tag=TAG + 1))
                done(self.comm.Irecv(buffer, source=peer, tag=TAG + 1))
            else:
                done(self.comm.Irecv(buffer, source=peer, tag=TAG + 1))
                done(self.comm.Isend(buffer, dest=peer, tag=TAG + 1))
            times.append(MPI.Wtime() - t0)
        times = sorted(times[10:])
        return times[len(times) // 2] * 1e6


def _mpi_error(exc: Exception) -> str:
    text = str(exc).strip()
    return text.split(":")[0] if text.startswith("MPI_ERR") else (text or type(exc).__name__)


def _cancel(request) -> None:
    with contextlib.suppress(Exception):  # one that cannot be cancelled: left to the job's end
        request.Cancel()


# MPI is the job's control plane only (phases, endpoints, results, the check's bytes), never
# inside a timed interval. Open MPI left to itself picks UCX on a host with an RDMA device and
# ob1 on one without: two hosts that differ (an RDMA device missing on one) then never finish
# MPI_Init, before nearlocal can name the host. ob1 picks a transport per pair of ranks, so it
# starts everywhere; an operator's own OMPI_MCA_pml wins.
CONTROL_PLANE_ENV = {"OMPI_MCA_pml": "ob1"}


def world() -> World:
    """The job's world, or a one-line error when mpi4py or an MPI library is missing."""
    for name, value in CONTROL_PLANE_ENV.items():
        os.environ.setdefault(name, value)
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise UsageError(f"this is an MPI job ({launched_size()} ranks) but mpi4py cannot be "
                         f"imported ({exc}): pip install 'nearlocal[mpi]'") from None
    comm = MPI.COMM_WORLD
    return World(comm, comm.Get_rank(), comm.Get_size())
