"""DSA descriptors and completion records byte for byte as Linux include/uapi/linux/idxd.h lays
them out: a literal table from the header, and (where gcc and the header are installed) the
header itself compiled and compared."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from nearlocal.dsa import uapi

HEADER = Path("/usr/include/linux/idxd.h")

# From idxd.h: the union members' offsets in struct dsa_hw_desc / struct dsa_completion_record.
DESC_OFFSETS = {"completion_addr": 8, "src_addr": 16, "dst_addr": 24, "xfer_size": 32,
                "int_handle": 36, "rsvd1": 38, "op_specific": 40}
COMP_OFFSETS = {"status": 0, "result": 1, "bytes_completed": 4, "fault_addr": 8,
                "invalid_flags": 16}
OPCODES = {"NOOP": 0, "BATCH": 1, "DRAIN": 2, "MEMMOVE": 3, "MEMFILL": 4, "COMPARE": 5,
           "COMPVAL": 6, "CR_DELTA": 7, "AP_DELTA": 8, "DUALCAST": 9, "CRCGEN": 0x10,
           "COPY_CRC": 0x11, "DIF_CHECK": 0x12, "DIF_INS": 0x13, "DIF_STRP": 0x14,
           "DIF_UPDT": 0x15, "CFLUSH": 0x20}
FLAGS = {"FENCE": 0x1, "BOF": 0x2, "CRAV": 0x4, "RCR": 0x8, "RCI": 0x10, "CRSTS": 0x20,
         "CR": 0x80, "CC": 0x100, "ADDR1_TCS": 0x200, "ADDR2_TCS": 0x400, "ADDR3_TCS": 0x800,
         "CR_TCS": 0x1000, "STORD": 0x2000, "DRDBK": 0x4000, "DSTS": 0x8000}
STATUSES = {"NONE": 0, "SUCCESS": 1, "SUCCESS_PRED": 2, "PAGE_FAULT_NOBOF": 3,
            "PAGE_FAULT_IR": 4, "BATCH_FAIL": 5, "BATCH_PAGE_FAULT": 6, "BAD_OPCODE": 0x10,
            "INVALID_FLAGS": 0x11, "XFER_ERANGE": 0x13, "DESC_CNT_ERANGE": 0x14,
            "DESCLIST_ALIGN": 0x18, "CRA_ALIGN": 0x1B, "ADDR_ALIGN": 0x1C,
            "TRANSLATION_FAIL": 0x22}


def test_sizes_and_offsets():
    assert uapi.DESC_DTYPE.itemsize == 64 and uapi.COMP_DTYPE.itemsize == 32
    for name, offset in DESC_OFFSETS.items():
        assert uapi.DESC_DTYPE.fields[name][1] == offset, name
    for name, offset in COMP_OFFSETS.items():
        assert uapi.COMP_DTYPE.fields[name][1] == offset, name
    assert uapi.OFF_PATTERN == uapi.OFF_DESC_LIST == uapi.OFF_SRC == 16
    assert uapi.OFF_DESC_COUNT == uapi.OFF_XFER_SIZE == 32 and uapi.OFF_EXPECTED_RES == 40


def test_constants_match_the_header_values():
    assert {k: int(uapi.Op[k]) for k in OPCODES} == OPCODES
    assert {k: int(uapi.Flag[k]) for k in FLAGS} == FLAGS
    assert {k: int(uapi.Status[k]) for k in STATUSES} == STATUSES
    assert uapi.STATUS_MASK == 0x7F and uapi.STATUS_WRITE == 0x80


def test_bitfield_dwords_little_endian():
    desc = uapi.descriptors(1)
    uapi.encode_memmove(desc[0], 0x1000, 0x2000, 4096, 0x40, uapi.Flag.CRAV | uapi.Flag.RCR)
    raw = desc.view(np.uint8)
    assert raw[7] == uapi.Op.MEMMOVE  # opcode: top byte of the second dword
    assert int.from_bytes(raw[4:7].tobytes(), "little") == 0x0C  # flags: its low 24 bits
    desc[0]["pasid_priv"] = uapi.pasid_priv(0xABCDE, 1)
    assert raw[:4].tobytes() == (0xABCDE | 1 << 31).to_bytes(4, "little")
    assert int.from_bytes(raw[8:16].tobytes(), "little") == 0x40
    assert int.from_bytes(raw[32:36].tobytes(), "little") == 4096


def test_alignment():
    for n in (1, 3, 17):
        comps = uapi.completion_records(n)
        assert all(uapi.address(comps, i) % uapi.COMP_ALIGN == 0 for i in range(n))
        assert uapi.address(uapi.descriptors(n)) % 64 == 0
    desc = uapi.descriptors(1)
    with pytest.raises(ValueError, match="32-byte aligned"):
        uapi.encode_memmove(desc[0], 0, 0, 1, uapi.address(uapi.completion_records(1)) + 8, 0)
    with pytest.raises(ValueError, match="64-byte aligned"):
        uapi.encode_batch(desc[0], 0x1020, 2, 0, 0)
    with pytest.raises(ValueError, match="24 bits"):
        uapi.flags_opcode(3, 1 << 24)


def test_decode_completion_and_remainder():
    rec = np.zeros(64, np.uint8)
    view = rec[:32].view(uapi.COMP_DTYPE)[0]
    view["status"], view["result"], view["bytes_completed"], view["fault_addr"] = 0x83, 0, 5000, 0xBEEF
    done = uapi.decode_completion(rec)
    assert done.partial and done.fault_on_write and done.name == "page_fault_nobof"
    assert done.bytes_completed == 5000 and done.fault_addr == 0xBEEF and not done.ok
    assert uapi.remainder(100, 200, 8192, 5000, 0) == (5100, 5200, 3192)
    assert uapi.remainder(100, 200, 8192, 5000, uapi.RESULT_DESCENDING) == (100, 200, 3192)
    assert uapi.status_name(0x7E) == "status 0x7e"


C_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <stddef.h>
#include <stdint.h>
#include <linux/idxd.h>
static void dump(const char *name, const void *p, size_t n) {
    printf("%s ", name);
    for (size_t i = 0; i < n; i++) printf("%02x", ((const unsigned char *)p)[i]);
    printf("\n");
}
int main(void) {
    struct dsa_hw_desc d;
    struct dsa_completion_record c;
    memset(&d, 0, sizeof d);
    d.pasid = 0xABCDE; d.priv = 1;
    d.flags = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR | IDXD_OP_FLAG_CC | IDXD_OP_FLAG_BOF;
    d.opcode = DSA_OPCODE_MEMMOVE;
    d.completion_addr = 0x1122334455667780ULL;
    d.src_addr = 0x0102030405060708ULL; d.dst_addr = 0x1112131415161718ULL;
    d.xfer_size = 0x12345;
    dump("memmove", &d, sizeof d);
    memset(&d, 0, sizeof d);
    d.flags = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR; d.opcode = DSA_OPCODE_BATCH;
    d.completion_addr = 0x40; d.desc_list_addr = 0x7f0000001000ULL; d.desc_count = 16;
    dump("batch", &d, sizeof d);
    memset(&d, 0, sizeof d);
    d.flags = IDXD_OP_FLAG_CRAV; d.opcode = DSA_OPCODE_MEMFILL;
    d.completion_addr = 0x80; d.pattern = 0xA5A5A5A55A5A5A5AULL; d.dst_addr = 0x2000;
    d.xfer_size = 100;
    dump("memfill", &d, sizeof d);
    memset(&d, 0, sizeof d);
    d.flags = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR | IDXD_OP_FLAG_CR; d.opcode = DSA_OPCODE_COMPARE;
    d.completion_addr = 0xC0; d.src_addr = 0x3000; d.src2_addr = 0x4000; d.xfer_size = 64;
    d.expected_res = 1;
    dump("compare", &d, sizeof d);
    memset(&d, 0, sizeof d);
    d.flags = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR | IDXD_OP_FLAG_CC; d.opcode = DSA_OPCODE_CFLUSH;
    d.completion_addr = 0x100; d.dst_addr = 0x5000; d.xfer_size = 4096;
    dump("cflush", &d, sizeof d);
    memset(&d, 0, sizeof d);
    d.flags = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR | IDXD_OP_FLAG_FENCE; d.opcode = DSA_OPCODE_DRAIN;
    d.completion_addr = 0x140;
    dump("drain", &d, sizeof d);
    memset(&c, 0, sizeof c);
    c.status = 0x83; c.result = 1; c.bytes_completed = 0xABCDE; c.fault_addr = 0x7f00deadb000ULL;
    c.invalid_flags = 0x123456;
    dump("completion", &c, sizeof c);
    printf("sizes %zu %zu\n", sizeof(struct dsa_hw_desc), sizeof(struct dsa_completion_record));
    printf("offsets %zu %zu %zu %zu %zu %zu %zu\n", offsetof(struct dsa_hw_desc, completion_addr),
           offsetof(struct dsa_hw_desc, src_addr), offsetof(struct dsa_hw_desc, dst_addr),
           offsetof(struct dsa_hw_desc, xfer_size), offsetof(struct dsa_hw_desc, int_handle),
           offsetof(struct dsa_completion_record, bytes_completed),
           offsetof(struct dsa_completion_record, fault_addr));
@CONSTANTS@
    return 0;
}
"""


@pytest.fixture(scope="module")
def header_dump(tmp_path_factory) -> dict[str, str]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not HEADER.exists():
        pytest.skip("needs a C compiler and the kernel uapi header linux/idxd.h")
    text = HEADER.read_text()
    lines = []
    for prefix, enum in (("DSA_OPCODE_", uapi.Op), ("IDXD_OP_FLAG_", uapi.Flag),
                         ("DSA_COMP_", uapi.Status)):
        for member in enum:
            name = prefix + member.name
            if re.search(rf"\b{name}\b", text):  # older headers lack the newest names
                lines.append(f'    printf("{name} %d\\n", (int){name});')
    work = tmp_path_factory.mktemp("idxd")
    (work / "dump.c").write_text(C_PROGRAM.replace("@CONSTANTS@", "\n".join(lines)))
    subprocess.run([cc, "-o", str(work / "dump"), str(work / "dump.c")], check=True)
    out = subprocess.run([str(work / "dump")], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def _bytes(desc) -> str:
    return desc.view(np.uint8).tobytes().hex()


def test_encoders_match_the_compiled_header(header_dump):
    d = uapi.descriptors(1)
    uapi.encode_memmove(d[0], 0x0102030405060708, 0x1112131415161718, 0x12345,
                        0x1122334455667780, uapi.Flag.CRAV | uapi.Flag.RCR | uapi.Flag.CC |
                        uapi.Flag.BOF)
    d[0]["pasid_priv"] = uapi.pasid_priv(0xABCDE, 1)
    assert _bytes(d) == header_dump["memmove"]
    uapi.encode_batch(d[0], 0x7F0000001000, 16, 0x40, uapi.Flag.CRAV | uapi.Flag.RCR)
    assert _bytes(d) == header_dump["batch"]
    uapi.encode_memfill(d[0], 0x2000, 100, 0xA5A5A5A55A5A5A5A, 0x80, uapi.Flag.CRAV)
    assert _bytes(d) == header_dump["memfill"]
    uapi.encode_compare(d[0], 0x3000, 0x4000, 64, 0xC0,
                        uapi.Flag.CRAV | uapi.Flag.RCR | uapi.Flag.CR, expected=1)
    assert _bytes(d) == header_dump["compare"]
    uapi.encode_cflush(d[0], 0x5000, 4096, 0x100, uapi.Flag.CRAV | uapi.Flag.RCR | uapi.Flag.CC)
    assert _bytes(d) == header_dump["cflush"]
    uapi.encode_simple(d[0], uapi.Op.DRAIN, 0x140,
                       uapi.Flag.CRAV | uapi.Flag.RCR | uapi.Flag.FENCE)
    assert _bytes(d) == header_dump["drain"]


def test_completion_record_matches_the_compiled_header(header_dump):
    raw = np.frombuffer(bytes.fromhex(header_dump["completion"]), np.uint8)
    done = uapi.decode_completion(raw)
    assert (done.status, done.result, done.bytes_completed, done.fault_addr, done.invalid_flags) \
        == (0x83, 1, 0xABCDE, 0x7F00DEADB000, 0x123456)
    assert header_dump["sizes"] == "64 32"
    assert header_dump["offsets"] == "8 16 24 32 36 4 8"


def test_every_constant_matches_the_compiled_header(header_dump):
    consts = {k: int(v) for k, v in header_dump.items() if k.startswith(("DSA_", "IDXD_"))}
    assert len(consts) > 40, "too few constants dumped"
    ours = {**{f"DSA_OPCODE_{m.name}": int(m) for m in uapi.Op},
            **{f"IDXD_OP_FLAG_{m.name}": int(m) for m in uapi.Flag},
            **{f"DSA_COMP_{m.name}": int(m) for m in uapi.Status}}
    for name, value in consts.items():
        assert ours[name] == value, name
