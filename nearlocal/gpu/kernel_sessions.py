"""One CUDA C kernel for the whole fragment table (nearlocal.kernels.cuda): gather / scatter
between host and GPU, peer copies between two GPUs, and zero-copy sums or fills of mapped host
memory in place."""

from __future__ import annotations

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.gpu.regions import alloc_mapped
from nearlocal.gpu.session import GpuSession, enable_peer_access, int_param


class KernelSession(GpuSession):
    """gather-kernel / scatter-kernel / peer-kernel: one launch moves every fragment, its work
    split by bytes (nearlocal.kernels.cuda). The piece table lives in device memory for device
    timing; for e2e the host writes it into pinned memory inside the interval and the kernel
    reads it from there (no separate upload call)."""

    peer = False  # peer-kernel: both sides must be GPUs
    kernel_name = "nl_copy"
    check_paths = ("e2e", "device")  # pieces read from pinned staging, and from device memory

    def setup(self) -> None:
        params = self.ctx.params
        if self.peer and (self.src.device is None or self.dst.device is None):
            raise UsageError(f"{self.method} copies between two GPUs: use --region gpu:J "
                             "--peer gpu:K")
        for access in (self.src, self.dst):  # the kernel touches the other GPU's memory
            if access.device is not None and access.device != self.device:
                enable_peer_access(self.cp, self.device, access.device, required=True,
                                   info=self.info)
        self.src_ptr = self._pointer(self.src, True)
        self.dst_ptr = self._pointer(self.dst, True)
        self.plan, self.pieces = self.kernel_lib.plan_launch(
            self.table, width=int_param(params, "width", 4, 16),
            threads=int_param(params, "threads", 1, 1024),
            group=int_param(params, "group", 0, 1024))  # each piece's width: its own addresses
        self.info.update(self.plan.info())
        cp = self.cp
        self.pieces_dev = cp.asarray(self.pieces)
        # the host's copy of the pieces, in mapped pinned memory, read in place by e2e launches
        self._staging, staging_dev, staging = alloc_mapped(cp.cuda.runtime, self.pieces.nbytes)
        self.staging_view = staging.view(np.int64).reshape(self.pieces.shape)
        self.args = {"device": self._args(int(self.pieces_dev.data.ptr)),
                     "e2e": self._args(staging_dev)}
        self.e2e_contains = ("the host writing the piece table (" +
                             f"{self.pieces.nbytes} B) into pinned memory, one kernel launch, "
                             "the kernel reading the table from there over the bus (part of "
                             "the figure: no separate upload call and its round trip)")

    def _args(self, pieces_pointer: int) -> tuple:
        return self.kernels.copy_args(self.dst_ptr, self.src_ptr, pieces_pointer, self.plan)

    def decide(self) -> None:
        np.copyto(self.staging_view, self.pieces)

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        self.kernels.launch(self.kernel_name, self.plan, self.args["device"], self.stream)

    def e2e_run(self) -> None:
        self.decide()
        self.kernels.launch(self.kernel_name, self.plan, self.args["e2e"], self.stream)

    def close(self) -> None:
        super().close()
        self.cp.cuda.runtime.freeHost(self._staging)


class PeerKernelSession(KernelSession):
    peer = True


class ZeroCopySession(KernelSession):
    """The kernel reads the region's fragments where they lie (a byte sum per fragment, nothing
    copied to device memory) or writes them in place (a fill byte)."""

    def setup(self) -> None:
        self.sums = self.cp.zeros(self.table.shape[0], dtype=self.cp.uint64)
        self.fill = int_param(self.ctx.params, "fill", 0, 255)
        self.kernel_name = "nl_sum" if self.ctx.case.access == "read" else "nl_fill"
        super().setup()

    def _args(self, pieces_pointer: int) -> tuple:
        if self.ctx.case.access == "read":  # the sums are only read by the check
            return self.kernels.sum_args(self.src_ptr, int(self.sums.data.ptr), pieces_pointer,
                                         self.plan)
        return self.kernels.fill_args(self.dst_ptr, self.fill, pieces_pointer, self.plan)

    def check(self) -> None:
        for path in self.check_paths:
            if self.ctx.case.access == "read":
                self.sums.data.memset_async(0, self.sums.nbytes, self.stream)
                self.run_once(path)
                expected = self.kernel_lib.reference_sums(self.region_bytes(self.ctx.src), self.table)
                if not np.array_equal(self.cp.asnumpy(self.sums), expected):
                    raise RuntimeError("zero-copy-kernel read wrong bytes: fragment sums differ")
                continue
            self.clear_destination()
            self.run_once(path)
            data = self.region_bytes(self.ctx.dst)
            for i, (_, d, n) in enumerate(self.table):
                if np.any(data[d:d + n] != self.fill):
                    raise RuntimeError(f"zero-copy-kernel did not write fragment {i}")
