"""Why a GPU method cannot run on this box (`Method.needs`): the reasons `probe` shows and a
run's skipped rows carry, from the probed inventory alone (nothing here imports cupy)."""

from __future__ import annotations

from nearlocal.gpu.bindings import BATCH_MIN_VERSION
from nearlocal.gpu.regions import no_gpu
from nearlocal.probe import HostInventory


def needs_gpu(inventory: HostInventory) -> str | None:
    """A GPU and cupy (the regions' reason), and NVRTC: every session's device clock queues the
    work behind a blocking kernel, and the kernel methods are CUDA C compiled at run time."""
    reason = no_gpu(inventory)
    if reason is None and inventory.gpu.nvrtc:
        reason = inventory.gpu.nvrtc
    return reason


def needs_two(inventory: HostInventory) -> str | None:
    reason = needs_gpu(inventory)
    count = len(inventory.gpu.devices)
    if reason is None and count < 2:
        reason = f"fewer than 2 GPUs (this box has {count})"
    return reason


def needs_peer(inventory: HostInventory) -> str | None:
    reason = needs_two(inventory)
    count = len(inventory.gpu.devices)
    if reason is None and not any(inventory.gpu.can_access_peer(i, j)
                                  for i in range(count) for j in range(count) if i != j):
        reason = f"no peer access between any pair of the {count} GPUs"
    return reason


def needs_batch(inventory: HostInventory) -> str | None:
    reason = needs_gpu(inventory)
    if reason:
        return reason
    versions = [v for v in (inventory.gpu.runtime_version, inventory.gpu.driver_version) if v]
    if not versions or min(versions) < BATCH_MIN_VERSION:
        return (f"cudaMemcpyBatchAsync needs CUDA >= 12.8 (runtime "
                f"{inventory.gpu.runtime_version}, driver {inventory.gpu.driver_version})")
    try:
        from cuda.bindings import runtime
    except Exception as exc:  # absent, or installed and broken: its own words say which
        return (f"cuda-bindings is not importable ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}; pip install nearlocal[cuda12] "
                "or [cuda13])")
    if not hasattr(runtime, "cudaMemcpyBatchAsync"):
        return "this cuda-bindings has no cudaMemcpyBatchAsync (needs >= 12.8)"
    return None
