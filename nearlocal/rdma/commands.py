"""rdma's command face: `nearlocal replay --method rdma-read` (docs/rdma.md, docs/whatif.md "A
replay"), declared into the replay command's registry of movers. An MPI job of two ranks: rank 0
builds the replay (its data), rank 1 serves the pool (rdma/replay.py), a further rank has nothing
to do. Loaded by the commands group only; it imports nothing heavy at its top."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from nearlocal.errors import UsageError
from nearlocal.frontends.replay import Opened, ReplayMethod, register_replay_method, source_of

METHOD = "rdma-read"


def check(args: argparse.Namespace, cpus: int) -> dict:
    """--movers queue pairs and --param's sge, device, mtu, as `run --method rdma-read` takes
    them: one line when bad."""
    from nearlocal.rdma import replay as rdma_replay

    rdma_replay.check_movers(args.movers)
    return rdma_replay.check_params(args.param or [])


def launch(args: argparse.Namespace, build: Callable[[Any], dict]) -> dict | int:
    """Rank 0 builds the replay (the data, with the job as its movers' context), rank 1 serves
    the pool (its exit code), a further rank has nothing to do."""
    from nearlocal.rack import mpi
    from nearlocal.rdma import replay as rdma_replay

    if not mpi.in_mpi_job():
        raise UsageError(rdma_replay.WITHOUT_MPI)
    job = mpi.world()
    try:
        if job.rank == 1:
            return rdma_replay.serve(job, lambda region: source_of(region, METHOD)[2])
        if job.rank > 1:
            return 0
        job.started = False
        try:
            return build(job)
        except BaseException:
            if not job.started:  # rank 1 waits for the pool: tell it there is none
                job.send({"abort": True}, 1, rdma_replay.SET_UP_S, "telling rank 1 to stop")
            raise
    except mpi.RankLost as exc:
        print(f"nearlocal replay: rank {job.rank}: {exc}", flush=True)
        return 1


class RdmaMovers:
    """G queue pairs of rank 0 reading the pool in rank 1's region (rdma/replay.py)."""

    def __init__(self, opened: Opened):
        from nearlocal.rdma import replay as rdma_replay

        job, args = opened.context, opened.args
        job.started = True  # rank 1 hears the pool from here on (no abort to send)
        self.reads = rdma_replay.ReplayReads(job, args.method_params, args.region,
                                             opened.pool.region_bytes, opened.dst_bytes,
                                             args.movers, opened.frags, opened.first, opened.hz,
                                             args.allow_write)
        self.move = self.reads.run

    def close(self) -> None:
        self.reads.close()

    def facts(self, emulated: str) -> dict:
        from nearlocal.rdma import replay as rdma_replay

        reads = self.reads
        peer = reads.peer.get("emulated") or ""
        notes = [n for n in (emulated, peer and f"rank 1 ({reads.peer.get('host')}): {peer}") if n]
        return {"timed": rdma_replay.TIMED, "rdma": reads.facts(),
                "data_check": reads.checked.line(), "emulated": "; ".join(notes)}


register_replay_method(ReplayMethod(
    METHOD, "nic", "rdma-read, {region} pool on rank 1 -> each queue pair's dram buffer on rank 0",
    "an MPI job of 2 ranks: rank 0 reads the pool in rank 1's --region by --movers queue pairs",
    check, launch, RdmaMovers,
    params_help=f"sge, device, mtu (as `nearlocal run --method {METHOD}` takes them)",
    allow_write_help="rank 1 may register a region of yours (verbs registers it writable; its "
                     "bytes are only read)"))
