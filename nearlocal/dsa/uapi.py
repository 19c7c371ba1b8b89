"""Intel DSA descriptors and completion records, laid out as Linux `include/uapi/linux/idxd.h`
defines `struct dsa_hw_desc` (64 bytes, packed) and `struct dsa_completion_record` (32 bytes).

Descriptors are plain numpy rows so the compiled submit loop and the tests see the same bytes:
`DESC_DTYPE` names every field at its uapi offset; union members the header overlays (the fill
`pattern` on `src_addr`, a batch's `desc_list_addr` / `desc_count`, compare's `expected_res`)
are written through the encoders below. The first two dwords hold bitfields: pasid:20, rsvd:11,
priv:1, then flags:24, opcode:8 (opcode in the top byte of the second dword, little-endian).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

DESC_BYTES = 64
COMP_BYTES = 32
COMP_ALIGN = 32  # the device rejects a completion record address that is not 32-byte aligned
DESC_ALIGN = 64  # a batch's descriptor list must be 64-byte aligned


class Op(enum.IntEnum):
    """enum dsa_opcode."""

    NOOP = 0x00
    BATCH = 0x01
    DRAIN = 0x02
    MEMMOVE = 0x03
    MEMFILL = 0x04
    COMPARE = 0x05
    COMPVAL = 0x06
    CR_DELTA = 0x07
    AP_DELTA = 0x08
    DUALCAST = 0x09
    TRANSL_FETCH = 0x0A
    CRCGEN = 0x10
    COPY_CRC = 0x11
    DIF_CHECK = 0x12
    DIF_INS = 0x13
    DIF_STRP = 0x14
    DIF_UPDT = 0x15
    DIX_GEN = 0x17
    CFLUSH = 0x20


class Flag(enum.IntFlag):
    """IDXD_OP_FLAG_* (descriptor flags, 24 bits)."""

    FENCE = 0x0001  # wait for earlier descriptors of the same batch
    BOF = 0x0002  # block on fault: the device waits for the page instead of stopping
    CRAV = 0x0004  # completion record address valid
    RCR = 0x0008  # request completion record (without it, written only on error)
    RCI = 0x0010  # request completion interrupt
    CRSTS = 0x0020
    CR = 0x0080
    CC = 0x0100  # cache control: destination writes allocate in the LLC instead of memory
    ADDR1_TCS = 0x0200
    ADDR2_TCS = 0x0400
    ADDR3_TCS = 0x0800
    CR_TCS = 0x1000
    STORD = 0x2000  # strict ordering
    DRDBK = 0x4000  # destination readback
    DSTS = 0x8000


class Status(enum.IntEnum):
    """enum dsa_completion_status (the low 7 bits of the status byte)."""

    NONE = 0x00
    SUCCESS = 0x01
    SUCCESS_PRED = 0x02
    PAGE_FAULT_NOBOF = 0x03
    PAGE_FAULT_IR = 0x04
    BATCH_FAIL = 0x05
    BATCH_PAGE_FAULT = 0x06
    DR_OFFSET_NOINC = 0x07
    DR_OFFSET_ERANGE = 0x08
    DIF_ERR = 0x09
    BAD_OPCODE = 0x10
    INVALID_FLAGS = 0x11
    NOZERO_RESERVE = 0x12
    XFER_ERANGE = 0x13
    DESC_CNT_ERANGE = 0x14
    DR_ERANGE = 0x15
    OVERLAP_BUFFERS = 0x16
    DCAST_ERR = 0x17
    DESCLIST_ALIGN = 0x18
    INT_HANDLE_INVAL = 0x19
    CRA_XLAT = 0x1A
    CRA_ALIGN = 0x1B
    ADDR_ALIGN = 0x1C
    PRIV_BAD = 0x1D
    TRAFFIC_CLASS_CONF = 0x1E
    PFAULT_RDBA = 0x1F
    HW_ERR1 = 0x20
    HW_ERR_DRB = 0x21
    TRANSLATION_FAIL = 0x22
    DRAIN_EVL = 0x26
    BATCH_EVL_ERR = 0x27


STATUS_MASK = 0x7F  # DSA_COMP_STATUS_MASK
STATUS_WRITE = 0x80  # DSA_COMP_STATUS_WRITE: the faulting access was a write
FAULT_INFO_WRITE = 0x01  # fault_info bit 0 (newer headers): the fault was on a write
RESULT_DESCENDING = 0x01  # memmove result bit 0: the copy ran from the end (overlapping buffers)

# Plain ints for compiled code (numba freezes module-level ints; it does not type IntFlag).
ST_SUCCESS = int(Status.SUCCESS)
ST_PAGE_FAULT_NOBOF = int(Status.PAGE_FAULT_NOBOF)
ST_BATCH_FAIL = int(Status.BATCH_FAIL)
FLAGS_RECORD = int(Flag.CRAV | Flag.RCR)

# struct dsa_hw_desc: canonical (first) member of every union at its offset.
DESC_DTYPE = np.dtype({
    "names": ["pasid_priv", "flags_opcode", "completion_addr", "src_addr", "dst_addr",
              "xfer_size", "int_handle", "rsvd1", "op_specific"],
    "formats": ["<u4", "<u4", "<u8", "<u8", "<u8", "<u4", "<u2", "<u2", ("u1", 24)],
    "offsets": [0, 4, 8, 16, 24, 32, 36, 38, 40],
    "itemsize": DESC_BYTES,
})

# struct dsa_completion_record (fault_info is `rsvd` in older headers: same byte).
COMP_DTYPE = np.dtype({
    "names": ["status", "result", "fault_info", "rsvd", "bytes_completed", "fault_addr",
              "invalid_flags", "op_specific"],
    "formats": ["u1", "u1", "u1", "u1", "<u4", "<u8", "<u4", ("u1", 12)],
    "offsets": [0, 1, 2, 3, 4, 8, 16, 20],
    "itemsize": COMP_BYTES,
})

# Offsets the compiled code and the software queue use (in bytes; union aliases included).
OFF_FLAGS_OPCODE = 4
OFF_COMPLETION_ADDR = 8
OFF_SRC = OFF_PATTERN = OFF_DESC_LIST = 16
OFF_DST = OFF_SRC2 = 24
OFF_XFER_SIZE = OFF_DESC_COUNT = 32
OFF_EXPECTED_RES = 40
OFF_PATTERN_UPPER = 40
COMP_OFF_STATUS = 0
COMP_OFF_RESULT = 1
COMP_OFF_FAULT_INFO = 2
COMP_OFF_BYTES_COMPLETED = 4
COMP_OFF_FAULT_ADDR = 8
COMP_OFF_INVALID_FLAGS = 16


def flags_opcode(opcode: int, flags: int) -> int:
    """The second dword: flags in bits 0-23, opcode in bits 24-31."""
    if not 0 <= flags < 1 << 24:
        raise ValueError(f"descriptor flags {flags:#x} do not fit in 24 bits")
    if not 0 <= opcode < 1 << 8:
        raise ValueError(f"opcode {opcode:#x} does not fit in 8 bits")
    return (opcode << 24) | flags


def pasid_priv(pasid: int = 0, priv: int = 0) -> int:
    """The first dword: pasid in bits 0-19, bit 31 privileged. User submissions leave both 0
    (a dedicated WQ carries the PASID the driver bound at open; ENQCMD inserts the process's)."""
    if not 0 <= pasid < 1 << 20:
        raise ValueError(f"PASID {pasid:#x} does not fit in 20 bits")
    return pasid | ((priv & 1) << 31)


def aligned_empty(shape: int | tuple[int, ...], dtype, align: int) -> np.ndarray:
    """A zeroed array whose data starts on an `align`-byte boundary (numpy guarantees only 16)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.zeros(count * dtype.itemsize + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def descriptors(n: int) -> np.ndarray:
    """n zeroed 64-byte descriptors, 64-byte aligned (so a batch may point at them)."""
    return aligned_empty(n, DESC_DTYPE, DESC_ALIGN)


def completion_records(n: int, stride: int = 64) -> np.ndarray:
    """n completion records as uint8 rows of `stride` bytes (32-aligned; 64 keeps each record on
    its own cache line so polling one never shares a line the device is writing for another)."""
    if stride % COMP_ALIGN:
        raise ValueError(f"completion record stride {stride} is not a multiple of {COMP_ALIGN}")
    return aligned_empty((n, stride), np.uint8, 64)


def address(array: np.ndarray, index: int = 0) -> int:
    """Virtual address of row `index` of a descriptor or completion-record array."""
    return int(array.ctypes.data) + index * int(array.strides[0])


def _fill(desc: np.void | np.ndarray, opcode: int, flags: int, completion_addr: int) -> None:
    if completion_addr % COMP_ALIGN:
        raise ValueError(f"completion record address {completion_addr:#x} is not 32-byte aligned")
    desc["pasid_priv"] = pasid_priv()
    desc["flags_opcode"] = flags_opcode(opcode, flags)
    desc["completion_addr"] = completion_addr
    desc["src_addr"] = 0
    desc["dst_addr"] = 0
    desc["xfer_size"] = 0
    desc["int_handle"] = 0
    desc["rsvd1"] = 0
    desc["op_specific"] = 0


def encode_memmove(desc, src: int, dst: int, size: int, completion_addr: int, flags: int) -> None:
    _fill(desc, Op.MEMMOVE, flags, completion_addr)
    desc["src_addr"], desc["dst_addr"], desc["xfer_size"] = src, dst, size


def encode_memfill(desc, dst: int, size: int, pattern: int, completion_addr: int,
                   flags: int) -> None:
    """Fill with an 8-byte pattern (it sits where src_addr is)."""
    _fill(desc, Op.MEMFILL, flags, completion_addr)
    desc["src_addr"], desc["dst_addr"], desc["xfer_size"] = pattern, dst, size


def encode_compare(desc, src1: int, src2: int, size: int, completion_addr: int, flags: int,
                   expected: int | None = None) -> None:
    """Compare two buffers; `expected` (0 equal / 1 different) with Flag.CR makes a mismatch of
    the expectation an error, as the uapi's expected_res does."""
    _fill(desc, Op.COMPARE, flags, completion_addr)
    desc["src_addr"], desc["dst_addr"], desc["xfer_size"] = src1, src2, size
    if expected is not None:
        desc["op_specific"][0] = expected


def encode_batch(desc, list_addr: int, count: int, completion_addr: int, flags: int) -> None:
    if list_addr % DESC_ALIGN:
        raise ValueError(f"batch descriptor list {list_addr:#x} is not 64-byte aligned")
    _fill(desc, Op.BATCH, flags, completion_addr)
    desc["src_addr"], desc["xfer_size"] = list_addr, count


def encode_simple(desc, opcode: int, completion_addr: int, flags: int) -> None:
    """noop, drain: nothing but the header."""
    _fill(desc, opcode, flags, completion_addr)


def encode_cflush(desc, dst: int, size: int, completion_addr: int, flags: int) -> None:
    """Cache flush of [dst, dst+size); Flag.CC keeps the lines (write back without invalidate)."""
    _fill(desc, Op.CFLUSH, flags, completion_addr)
    desc["dst_addr"], desc["xfer_size"] = dst, size


def opcode_of(desc) -> int:
    return int(desc["flags_opcode"]) >> 24


def flags_of(desc) -> int:
    return int(desc["flags_opcode"]) & 0xFFFFFF


@dataclass(frozen=True)
class Completion:
    """A decoded completion record."""

    status: int  # full byte, STATUS_WRITE included
    result: int
    fault_info: int
    bytes_completed: int  # descs_completed for a batch
    fault_addr: int
    invalid_flags: int

    @property
    def code(self) -> int:
        return self.status & STATUS_MASK

    @property
    def name(self) -> str:
        return status_name(self.status)

    @property
    def done(self) -> bool:
        return self.status != 0

    @property
    def ok(self) -> bool:
        return self.code in (Status.SUCCESS, Status.SUCCESS_PRED)

    @property
    def partial(self) -> bool:
        """A page fault stopped the operation after `bytes_completed`: resubmit the rest."""
        return self.code == Status.PAGE_FAULT_NOBOF

    @property
    def fault_on_write(self) -> bool:
        return bool(self.status & STATUS_WRITE or self.fault_info & FAULT_INFO_WRITE)


def decode_completion(record: np.ndarray) -> Completion:
    """Decode the first 32 bytes of a uint8 completion record row."""
    fields = np.asarray(record, np.uint8)[:COMP_BYTES].view(COMP_DTYPE)[0]
    return Completion(int(fields["status"]), int(fields["result"]), int(fields["fault_info"]),
                      int(fields["bytes_completed"]), int(fields["fault_addr"]),
                      int(fields["invalid_flags"]) & 0xFFFFFF)


def status_name(status: int) -> str:
    code = status & STATUS_MASK
    try:
        return Status(code).name.lower()
    except ValueError:
        return f"status {code:#x}"


def remainder(src: int, dst: int, size: int, done: int, result: int) -> tuple[int, int, int]:
    """What is left of a memmove stopped after `done` bytes: ascending copies did the front,
    descending ones (result bit 0, overlapping buffers) did the back."""
    if result & RESULT_DESCENDING:
        return src, dst, size - done
    return src + done, dst + done, size - done
