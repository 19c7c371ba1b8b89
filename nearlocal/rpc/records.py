"""A single-writer / multi-reader record store in shared memory that never exposes a torn record.

Records (e.g. 16 KiB KV blocks) carry a header line: a seqlock sequence (odd while a write is in
progress), the record's version, the writer's epoch, flags and a checksum of index, version and
payload. The writer publishes with the protocol's discipline (rpc/kernels/sync.py): sequence odd,
payload, header, sequence even. Readers copy the record between two reads of the sequence and
accept it only if the sequence did not move and the checksum matches; otherwise they retry until
their timeout. The kernels that do it are in rpc/kernels/records.py; here are the layout, the
set-up and the Python handle.

Owner liveness is a lease: the writer bumps a heartbeat word with every write; a reader that sees
no change for `lease` declares that epoch's owner dead (it never looks at the writer's clock, so
this works between hosts), records when, and answers "recompute" (a fallback) for the record the
dead owner left half-written instead of waiting. The next writer (a new epoch) invalidates records
left odd, retries the interrupted write with the same version (writes are idempotent: the content
of (record, version) is fixed) and rewrites records whose checksum no longer matches. A writer that
finds more than a lease passed since its last heartbeat (frozen, descheduled) stops before writing
again (self-fencing, _lease_held): it can finish the one write it was in, never start another.

Under `flush` every shared word follows rpc/kernels/sync.py's rule: written with nontemporal stores
or flushed, read after invalidation (the writer's own lines too: the previous owner wrote them).

Layout (uint64 words; each line written by one agent):
    line 0      setup: magic, records, payload words, protocol, lease ticks, stop, readers, epochs
    lines 1-2   writer: epoch, heartbeat, intent record, intent version, counters,
                when it last checked its lease before a write
    reader r    2 counter lines + one detection timestamp per epoch
    records     from a 4 KiB boundary: header line + payload, per record
"""

from __future__ import annotations

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.rpc.kernels.records import (
    C_EPOCHS,
    C_LEASE,
    C_MAGIC,
    C_PAYLOAD,
    C_PROTOCOL,
    C_READERS,
    C_RECORDS,
    FALLBACK_CORRUPT,
    FALLBACK_STALE,
    FALLBACK_TIMEOUT,
    H_SEQ,
    MAGIC,
    R_DETECTIONS,
    R_FB_CORRUPT,
    R_FB_STALE,
    R_FB_TIMEOUT,
    R_MARKED,
    R_MAX_READ,
    R_OK,
    R_READS,
    R_REJECTS,
    R_RETRIES,
    R_TORN,
    R_TORN_RETURNED,
    READ_OK,
    READER_COUNTERS,
    READERS_BASE,
    W_COMPLETED,
    W_EPOCH,
    W_HEARTBEAT,
    W_INTENT_INDEX,
    W_INVALIDATED,
    W_REPAIRED,
    W_RETRIED,
    W_STARTED,
    W_WRITE_CHECK,
    read_record,
    record_base,
    write_record,
)
from nearlocal.rpc.kernels.sync import WORDS_PER_LINE, flush_written, invalidate, publish_flag, read_flag
from nearlocal.rpc.protocols import protocol_code

OUTCOMES = {READ_OK: "ok", FALLBACK_STALE: "recompute (owner lost or record invalidated)",
            FALLBACK_TIMEOUT: "recompute (timed out)", FALLBACK_CORRUPT: "recompute (checksum)"}


class Layout:
    """Word offsets of one store; everything the kernels need is in the setup line too."""

    def __init__(self, records: int, record_bytes: int, readers: int, epochs: int):
        if records < 1 or readers < 0 or epochs < 1:
            raise UsageError("a record store needs at least one record and one epoch")
        if record_bytes <= 0 or record_bytes % 64:
            raise UsageError(f"record size {record_bytes} B is not valid: use a positive "
                             "multiple of 64 bytes, e.g. 16KiB")
        self.records, self.record_bytes, self.readers, self.epochs = (records, record_bytes,
                                                                      readers, epochs)
        self.payload_words = record_bytes // 8
        self.reader_words = READER_COUNTERS + -(-epochs // WORDS_PER_LINE) * WORDS_PER_LINE
        control_bytes = (READERS_BASE + readers * self.reader_words) * 8
        self.records_word = -(-control_bytes // 4096) * 4096 // 8
        self.record_words = WORDS_PER_LINE + self.payload_words
        self.nbytes = (self.records_word + records * self.record_words) * 8

    def reader_base(self, reader: int) -> int:
        return READERS_BASE + reader * self.reader_words


def init_store(raw: np.ndarray, layout: Layout, lease_ticks: int, protocol: str) -> np.ndarray:
    """Zero the store, write the setup line and every record at version 1 (epoch 0, no owner).

    The zeroing and the setup line are cached stores, so under `flush` they are written back
    before the records are published; the magic word goes last."""
    if raw.size < layout.nbytes:
        raise UsageError(f"the record store needs {layout.nbytes} bytes, the region has {raw.size}")
    code = protocol_code(protocol)
    raw = raw[:layout.nbytes]
    raw[:] = 0
    words = raw.view(np.uint64)
    words[C_RECORDS], words[C_PAYLOAD], words[C_PROTOCOL] = (layout.records,
                                                             layout.payload_words, code)
    words[C_LEASE], words[C_READERS], words[C_EPOCHS] = lease_ticks, layout.readers, layout.epochs
    flush_written(raw, 0, words.size, code)
    for index in range(layout.records):
        write_record(raw, words, index, 1, 0, code)
    publish_flag(words, W_STARTED, np.uint64(0), code)
    publish_flag(words, W_COMPLETED, np.uint64(0), code)
    publish_flag(words, C_MAGIC, np.uint64(MAGIC), code)
    return words


class RecordStore:
    """A Python handle on a store: reads for tests and tools (one reader area per handle)."""

    def __init__(self, raw: np.ndarray, layout: Layout, protocol: str, reader: int = 0):
        self.raw = raw[:layout.nbytes]
        self.words = self.raw.view(np.uint64)
        self.layout = layout
        self.protocol = protocol_code(protocol)
        self.area = layout.reader_base(reader)
        self.local = np.empty(layout.payload_words, np.uint64)
        self.monitor = np.zeros(4, np.int64)
        invalidate(self.raw, self.words, 0, WORDS_PER_LINE, self.protocol)  # setup, read plainly

    def read(self, index: int, timeout_ticks: int) -> tuple[str, int, bytes | None]:
        """(outcome, version, payload bytes or None for a fallback)."""
        outcome, version = read_record(self.raw, self.words, index, self.local, self.monitor,
                                       self.area, np.uint64(timeout_ticks), self.protocol, True)
        payload = self.local.tobytes() if outcome == READ_OK else None
        return OUTCOMES[outcome], int(version), payload

    def write(self, index: int, version: int, epoch: int) -> None:
        write_record(self.raw, self.words, index, version, epoch, self.protocol)

    def counters(self, reader: int | None = None) -> dict[str, int]:
        area = self.area if reader is None else self.layout.reader_base(reader)
        invalidate(self.raw, self.words, area, READER_COUNTERS, self.protocol)
        names = {"reads": R_READS, "reads_ok": R_OK, "retries": R_RETRIES,
                 "checksum_rejects": R_REJECTS, "torn_reads": R_TORN,
                 "torn_reads_returned": R_TORN_RETURNED,
                 "stale_detections": R_DETECTIONS, "max_read_ticks": R_MAX_READ,
                 "stale_marked": R_MARKED, "fallbacks_stale": R_FB_STALE,
                 "fallbacks_timeout": R_FB_TIMEOUT, "fallbacks_corrupt": R_FB_CORRUPT}
        return {name: int(self.words[area + offset]) for name, offset in names.items()}

    def detection_ticks(self, reader: int, epoch: int) -> int:
        base = self.layout.reader_base(reader) + READER_COUNTERS
        return int(read_flag(self.raw, self.words, base + epoch, self.protocol))

    def writer_counters(self) -> dict[str, int]:
        invalidate(self.raw, self.words, W_EPOCH, 2 * WORDS_PER_LINE, self.protocol)
        names = {"epoch": W_EPOCH, "heartbeat": W_HEARTBEAT, "intent_index": W_INTENT_INDEX,
                 "writes_attempted": W_STARTED, "writes_completed": W_COMPLETED,
                 "invalidated": W_INVALIDATED, "idempotent_retries": W_RETRIED,
                 "repaired": W_REPAIRED, "write_check_ticks": W_WRITE_CHECK}
        return {name: int(self.words[offset]) for name, offset in names.items()}

    def in_progress(self, index: int) -> bool:
        base = record_base(self.words, index)
        return bool(read_flag(self.raw, self.words, base + H_SEQ, self.protocol) & 1)

    def header_word(self, index: int, field: int) -> int:
        return int(read_flag(self.raw, self.words, record_base(self.words, index) + field,
                             self.protocol))

    def set_header_word(self, index: int, field: int, value: int) -> None:
        """Fault injection only: overwrite a header word as a stray writer would."""
        word = record_base(self.words, index) + field
        self.words[word] = np.uint64(value)
        flush_written(self.raw, word, 1, self.protocol)
