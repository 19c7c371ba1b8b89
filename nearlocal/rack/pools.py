"""The pools of an MPI job's rack cases: each mapped under the same name on every rank and proven
to be one memory (rank 0 writes a random token, every rank reads it back), and the regions each
rank maps for itself (an rdma-* case's, which RDMA registers); a pool a host cannot map is the
one line every rank exits 2 with."""

from __future__ import annotations

import secrets

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.rack.hosts import START_TIMEOUT_S
from nearlocal.rack.mpi import World

TOKEN_WORDS = 2


def pool_sizes(entries: list, size: int, shared: bool = True) -> dict[str, int]:
    """Bytes to map of each region the rack cases (`entries`, the plan's) use: the shared pools,
    or (shared=False) the regions each rank maps for itself (RDMA registers them)."""
    from nearlocal.rack.framework import RACK_METHODS

    sizes: dict[str, int] = {}
    for entry in entries:
        method = RACK_METHODS[entry.case.method]
        if method.shared_pool == shared and entry.runs:
            need = method.pool_bytes(entry.resolved, size)
            region = entry.case.region
            sizes[region] = max(sizes.get(region, 4096), -(-need // 4096) * 4096)
    return sizes


def open_pools(job: World, entries: list, allow_write: bool, hosts: list[dict]) -> dict:
    """Every pool of the rack cases (`entries`) mapped on every rank, proven to be one memory;
    else exit 2 for all."""
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.rpc.kernels.sync import flush_written
    from nearlocal.rpc.protocols import FLUSH

    sizes = pool_sizes(entries, job.size)
    pools: dict = {}
    local_problem = ""  # a region each rank maps for itself (rdma-*): told like a pool's
    for text, size in pool_sizes(entries, job.size, shared=False).items():
        spec = parse_region(text)
        try:
            pools[text] = region_kind(spec).open(spec, size, "wb", allow_write)
        except (UsageError, OSError) as exc:
            local_problem = (f"on host {hosts[job.rank]['hostname']} (rank {job.rank}): cannot "
                             f"map {text}: {exc}")
            break
    tokens = {}
    problem = local_problem if job.rank == 0 else ""
    if job.rank == 0 and not problem:
        try:
            for text, size in sizes.items():
                spec = parse_region(text)
                pools[text] = region_kind(spec).open(spec, size, "wb", allow_write)
                token = np.frombuffer(secrets.token_bytes(8 * TOKEN_WORDS), np.uint64).copy()
                words = pools[text].array.view(np.uint64)
                words[:TOKEN_WORDS] = token
                flush_written(pools[text].array, 0, TOKEN_WORDS, FLUSH)
                tokens[text] = token.tolist()
        except (UsageError, OSError) as exc:
            problem = f"pool {text} cannot be mapped on host {hosts[0]['hostname']} (rank 0): {exc}"
    tokens = job.bcast((tokens, problem), START_TIMEOUT_S, "hearing the pool's token")
    tokens, problem = tokens
    if job.rank and not problem:
        problem = local_problem or attach(pools, sizes, tokens, hosts[job.rank])
    problems = job.gather(problem, START_TIMEOUT_S, "checking the pool on every host")
    first = next((p for p in problems if p), "") if job.rank == 0 else ""
    first = job.bcast(first, START_TIMEOUT_S, "hearing whether the pool is one memory")
    if first:
        for region in pools.values():
            region.close()
        if job.rank == 0:
            raise UsageError(first)
        raise SystemExit(2)
    return pools


def attach(pools: dict, sizes: dict, tokens: dict, me: dict) -> str:
    """Map each pool on this host by the same name; "" or the problem, naming this host."""
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.rpc.kernels.sync import invalidate
    from nearlocal.rpc.protocols import FLUSH

    for text, size in sizes.items():
        spec = parse_region(text)
        where = f"on host {me['hostname']} (rank {me['rank']})"
        kind = region_kind(spec)  # a file: the same one must be there on every host
        if kind.creates is not None and not kind.creates(spec).exists():
            return (f"pool {text} does not exist {where}: every rank needs the same pool "
                    "(a shared device or file)")
        try:
            pools[text] = region_kind(spec).open(spec, size, "wb", True)
        except (UsageError, OSError) as exc:
            return f"pool {text} cannot be mapped {where}: {exc}"
        raw = pools[text].array
        words = raw.view(np.uint64)
        invalidate(raw, words, 0, TOKEN_WORDS, FLUSH)
        if words[:TOKEN_WORDS].tolist() != tokens[text]:
            return (f"pool {text} {where} is not the memory rank 0 mapped (its token is not "
                    "there): a different device or file of the same name")
    return ""
