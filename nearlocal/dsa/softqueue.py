"""TEST DOUBLE — a software DSA work queue. Never registered as a method, never measured.

It lets the real encode -> submit -> poll -> page-fault retry code run on machines without DSA:
the compiled driver (dsa/kernels/portal.py) pushes 64-byte descriptors into a portal-like page
with `soft_push` (instead of movdir64b / enqcmd), and a Python thread plays the device. It
decodes the descriptors with `nearlocal.dsa.uapi`, executes memmove, memfill, compare, batch,
drain, noop and cache flush on the addresses they name, and writes completion records with the
real status codes: success, page fault with partial completion (for pages marked not present
with `fault_at`), invalid opcode, descriptor-count and transfer-size errors.

Portal page protocol (the page is ordinary memory, unlike a real portal):
  bytes 0-63   the descriptor slot
  byte  64     doorbell: the submitter sets 1 after writing the slot, the device clears it
  u32   68     credits: free WQ entries (a shared WQ's submitter gets "retry" at 0)
  u32   72     1 for a shared WQ (enqcmd semantics), 0 for a dedicated one

A fault is modelled the way the kernel resolves one: after the device reports a page as not
present, the submitter touches it, so the page counts as present from then on (one-shot).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque

import numpy as np

from nearlocal.dsa import uapi
from nearlocal.dsa.kernels.portal import SOFT_CREDITS, SOFT_DOORBELL, SOFT_SHARED

PAGE = 4096


def _mem(addr: int, size: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(addr)) if size else \
        np.zeros(0, np.uint8)


class SoftWorkQueue:
    """A work queue of `size` entries served by one device thread. Use as a context manager."""

    def __init__(self, mode: str = "dedicated", size: int = 16, max_batch: int = 32,
                 max_transfer: int = 1 << 31, delay_s: float = 0.0):
        if mode not in ("dedicated", "shared"):
            raise ValueError(f"mode must be dedicated or shared, got {mode!r}")
        self.mode, self.size, self.max_batch, self.max_transfer = mode, size, max_batch, max_transfer
        self.delay_s = delay_s
        self.page = uapi.aligned_empty(PAGE, np.uint8, PAGE)
        self.page[SOFT_CREDITS:SOFT_CREDITS + 4].view(np.uint32)[0] = size
        self.page[SOFT_SHARED:SOFT_SHARED + 4].view(np.uint32)[0] = 1 if mode == "shared" else 0
        self.not_present: set[int] = set()
        self.errors: list[str] = []  # what a real device reports in its software error register
        self.executed: list[int] = []  # opcodes, in the order run
        self.dropped = 0  # dedicated-WQ descriptors that found the queue full
        self._pending: deque[tuple[float, np.void]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="soft-dsa", daemon=True)

    @property
    def portal(self) -> int:
        return uapi.address(self.page)

    def fault_at(self, addr: int) -> None:
        """Mark the 4 KiB page holding `addr` not present until the submitter touches it."""
        self.not_present.add(addr & ~(PAGE - 1))

    def __enter__(self) -> SoftWorkQueue:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # --- the device ------------------------------------------------------------------------

    def _credits(self, delta: int) -> None:
        view = self.page[SOFT_CREDITS:SOFT_CREDITS + 4].view(np.uint32)
        view[0] = int(view[0]) + delta

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.page[SOFT_DOORBELL]:
                desc = self.page[:64].copy().view(uapi.DESC_DTYPE)[0]
                if len(self._pending) >= self.size:
                    self.dropped += 1  # a dedicated WQ silently drops what overflows it
                    self.errors.append("descriptor dropped: work queue full")
                else:  # each entry runs `delay_s` after it was accepted; meanwhile more arrive
                    self._pending.append((time.perf_counter() + self.delay_s, desc))
                    self._credits(-1)
                self.page[SOFT_DOORBELL] = 0
                continue
            if self._pending and self._pending[0][0] <= time.perf_counter():
                _, desc = self._pending.popleft()
                self._complete(desc, self._execute(desc, in_batch=False))
                self._credits(+1)
            else:
                time.sleep(0)

    def _fault(self, base: int, size: int) -> int | None:
        """Offset of the first not-present byte in [base, base+size), or None."""
        hits = [max(page, base) - base for page in self.not_present
                if page < base + size and page + PAGE > base]
        return min(hits) if hits else None

    def _resolve(self, addr: int) -> None:
        self.not_present.discard(addr & ~(PAGE - 1))

    def _execute(self, desc, in_batch: bool) -> dict:
        op, flags = uapi.opcode_of(desc), uapi.flags_of(desc)
        self.executed.append(op)
        size = int(desc["xfer_size"])
        src, dst = int(desc["src_addr"]), int(desc["dst_addr"])
        if op in (uapi.Op.NOOP, uapi.Op.DRAIN):  # one device thread: drain has nothing to wait for
            return {"status": uapi.Status.SUCCESS}
        if op == uapi.Op.BATCH:
            if in_batch:
                return {"status": uapi.Status.BAD_OPCODE}
            return self._batch(src, size)
        if op not in (uapi.Op.MEMMOVE, uapi.Op.MEMFILL, uapi.Op.COMPARE, uapi.Op.CFLUSH):
            return {"status": uapi.Status.BAD_OPCODE}
        if size > self.max_transfer:
            return {"status": uapi.Status.XFER_ERANGE}
        # Where does a not-present page stop the operation? (block on fault: resolve and go on)
        reads = [] if op in (uapi.Op.MEMFILL, uapi.Op.CFLUSH) else [src]
        if op == uapi.Op.COMPARE:
            reads.append(dst)
        writes = [dst] if op in (uapi.Op.MEMMOVE, uapi.Op.MEMFILL) else []
        stop, fault, write = size, 0, False
        for base, is_write in [(a, False) for a in reads] + [(a, True) for a in writes]:
            offset = self._fault(base, size)
            if offset is not None and offset < stop:
                stop, fault, write = offset, base + offset, is_write
        if stop < size and flags & uapi.Flag.BOF:
            for base in reads + writes:
                for page in range(base & ~(PAGE - 1), base + size, PAGE):
                    self._resolve(page)
            stop = size
        descending = False
        if op == uapi.Op.MEMMOVE:
            descending = src < dst < src + size and stop == size
            ctypes.memmove(dst, src, stop)
        elif op == uapi.Op.MEMFILL:
            pattern = np.array([src], np.uint64).view(np.uint8)
            target = _mem(dst, stop)
            target[:] = np.resize(pattern, stop)
        elif op == uapi.Op.COMPARE:
            diff = np.flatnonzero(_mem(src, stop) != _mem(dst, stop))
            if diff.size:
                result = 1
                record = {"status": uapi.Status.SUCCESS, "result": 1,
                          "bytes_completed": int(diff[0])}
                expected = int(desc["op_specific"][0])
                if flags & uapi.Flag.CR and expected != result:
                    record["status"] = uapi.Status.SUCCESS_PRED
                return record
        if stop < size:
            self._resolve(fault)
            return {"status": uapi.Status.PAGE_FAULT_NOBOF | (uapi.STATUS_WRITE if write else 0),
                    "fault_info": uapi.FAULT_INFO_WRITE if write else 0,
                    "bytes_completed": stop, "fault_addr": fault}
        record = {"status": uapi.Status.SUCCESS, "result": 1 if descending else 0}
        if op == uapi.Op.COMPARE and flags & uapi.Flag.CR and int(desc["op_specific"][0]) != 0:
            record["status"] = uapi.Status.SUCCESS_PRED
        return record

    def _batch(self, list_addr: int, count: int) -> dict:
        if list_addr % uapi.DESC_ALIGN:
            return {"status": uapi.Status.DESCLIST_ALIGN}
        if not 2 <= count <= self.max_batch:
            return {"status": uapi.Status.DESC_CNT_ERANGE}
        members = _mem(list_addr, count * uapi.DESC_BYTES).copy().view(uapi.DESC_DTYPE)
        failed = False
        completed = 0
        for member in members:
            if failed and uapi.flags_of(member) & uapi.Flag.FENCE:
                break  # a fence after a failure abandons the rest of the batch
            record = self._execute(member, in_batch=True)
            self._complete(member, record)
            failed |= (record["status"] & uapi.STATUS_MASK) not in (uapi.Status.SUCCESS,
                                                                     uapi.Status.SUCCESS_PRED)
            completed += 1
        return {"status": uapi.Status.BATCH_FAIL if failed else uapi.Status.SUCCESS,
                "bytes_completed": completed}

    def _complete(self, desc, record: dict) -> None:
        """Write the record as the device does: only with CRAV; on success only with RCR;
        the status byte last, since it is what the submitter polls."""
        flags = uapi.flags_of(desc)
        ok = (record["status"] & uapi.STATUS_MASK) in (uapi.Status.SUCCESS,
                                                        uapi.Status.SUCCESS_PRED)
        if not flags & uapi.Flag.CRAV or (ok and not flags & uapi.Flag.RCR):
            return
        addr = int(desc["completion_addr"])
        if addr % uapi.COMP_ALIGN:
            self.errors.append(f"completion record address {addr:#x} not 32-byte aligned")
            return
        out = _mem(addr, uapi.COMP_BYTES).view(uapi.COMP_DTYPE)[0]
        out["result"] = record.get("result", 0)
        out["fault_info"] = record.get("fault_info", 0)
        out["bytes_completed"] = record.get("bytes_completed", 0)
        out["fault_addr"] = record.get("fault_addr", 0)
        out["invalid_flags"] = 0
        ctypes.c_uint8.from_address(addr).value = int(record["status"])
