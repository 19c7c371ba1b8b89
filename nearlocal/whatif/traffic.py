"""The requests a serving simulation is driven by (issue 57, docs/whatif.md "Serving under load"):
a trace in Mooncake's JSONL format (arrival time, input and output tokens, the hashes of the
prompt's 512-token blocks), or a seeded Poisson stream at a given QPS with a given context
distribution; and the KV prefix store each request's prefix hits (LRU over blocks, or unbounded:
every repeated prefix block hits). Plain data out: numpy arrays, one entry per request."""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.units import format_size
from nearlocal.workloads.replay import TRACE_BLOCK_TOKENS

# Mooncake's FAST'25 conversation trace, shipped unchanged (Apache-2.0; its README beside it)
SHIPPED_TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "mooncake-conversation.jsonl"

MAX_TRACE_BYTES = 256 << 20  # a trace past 256 MiB is refused before it is read
MAX_TRACE_REQUESTS = 2_000_000  # and one past 2M requests (the simulation holds them all)
MAX_STREAM_REQUESTS = 2_000_000
TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True, eq=False)
class Trace:
    """A trace's requests in arrival order: arrival in seconds from its start, tokens, and each
    request's prompt blocks (hash ids; `offsets[i]:offsets[i + 1]` are request i's)."""

    source: str
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hashes: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def rate(self) -> float:
        """Requests per second over the trace's span."""
        return len(self) / self.duration_s if self.duration_s > 0 else math.inf


def _count(value: object, line: int, name: str, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise UsageError(f"{path}:{line}: {name} must be a number, got {value!r}")
    if value < 0:
        raise UsageError(f"{path}:{line}: {name} must not be negative, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise UsageError(f"{path}:{line}: {name} must be a whole number, got {value!r}")
    return int(value)


def read_trace(path: str | os.PathLike, max_bytes: int | None = None) -> Trace:
    """A Mooncake JSONL trace, checked line by line: each bad line is named by its number.
    One past `max_bytes` (MAX_TRACE_BYTES) is refused before it is read."""
    where = str(path)
    max_bytes = MAX_TRACE_BYTES if max_bytes is None else max_bytes
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise UsageError(f"--trace {where}: cannot be read ({exc.strerror})") from None
    if size > max_bytes:
        raise UsageError(f"--trace {where}: {format_size(size)} is past the {format_size(max_bytes)} a "
                         "trace may hold (cut it, or simulate a stretch of it)")
    arrivals, inputs, outputs, hashes, offsets = [], [], [], [], [0]
    last = -math.inf
    try:
        with Path(path).open(encoding="utf-8") as handle:
            lines = list(handle)
    except OSError as exc:
        raise UsageError(f"--trace {where}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--trace {where}: cannot be read as UTF-8 text ({exc.reason})") from None
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}:{number}: malformed JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{where}:{number}: a request must be a JSON object")
        missing = [name for name in TRACE_FIELDS if name not in record]
        if missing:
            raise UsageError(f"{where}:{number}: missing field {missing[0]!r} (a request holds "
                             f"{', '.join(TRACE_FIELDS)})")
        stamp = record["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp):
            raise UsageError(f"{where}:{number}: timestamp must be a number, got {stamp!r}")
        if stamp < 0:
            raise UsageError(f"{where}:{number}: timestamp must not be negative, got {stamp!r}")
        if stamp < last:
            raise UsageError(f"{where}:{number}: timestamp {stamp} goes back (the line before "
                             f"arrived at {last}): a trace is in arrival order")
        last = stamp
        tokens = _count(record["input_length"], number, "input_length", where)
        ids = record["hash_ids"]
        if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int)
                                            for h in ids):
            raise UsageError(f"{where}:{number}: hash_ids must be a list of integers")
        arrivals.append(stamp / 1000.0)
        inputs.append(tokens)
        outputs.append(_count(record["output_length"], number, "output_length", where))
        hashes.extend(ids)
        offsets.append(len(hashes))
        if len(arrivals) > MAX_TRACE_REQUESTS:
            raise UsageError(f"--trace {where}: more than {MAX_TRACE_REQUESTS} requests")
    if not arrivals:
        raise UsageError(f"--trace {where}: holds no request")
    return Trace(where, np.asarray(arrivals, float), np.asarray(inputs, np.int64),
                 np.asarray(outputs, np.int64), np.asarray(hashes, np.int64),
                 np.asarray(offsets, np.int64))


# ---------------------------------------------------------------------------------------------
# The prefix store


@dataclass(frozen=True)
class Hits:
    """What the store gave each request: the leading blocks found, and the tokens they hold."""

    blocks: np.ndarray  # hit blocks per request
    tokens: np.ndarray  # hit tokens per request (the last block may be partial)
    hit_blocks: int
    total_blocks: int
    capacity_blocks: int | None  # None: unbounded

    @property
    def ratio(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0


def prefix_hits(trace: Trace, capacity_blocks: int | None = None) -> Hits:
    """Each request looks its blocks up in order and hits the leading run found (a prefix: KV
    past the first miss cannot be reused); then every block of its prompt is stored, most
    recently used, evicting the least recently used past `capacity_blocks` (None: unbounded)."""
    if capacity_blocks is not None and capacity_blocks < 1:
        raise UsageError(f"store capacity must hold at least one block, got {capacity_blocks}")
    hashes = trace.hashes.tolist()
    offsets = trace.offsets.tolist()
    hit = np.zeros(len(trace), np.int64)
    held: OrderedDict[int, None] = OrderedDict()  # least recently used first
    for i in range(len(trace)):
        blocks = hashes[offsets[i]:offsets[i + 1]]
        k = 0
        for h in blocks:
            if h not in held:
                break
            k += 1
        hit[i] = k
        for h in blocks:
            if h in held:
                held.move_to_end(h)
            else:
                held[h] = None
        while capacity_blocks is not None and len(held) > capacity_blocks:
            held.popitem(last=False)
    tokens = np.minimum(hit * TRACE_BLOCK_TOKENS, trace.input_tokens)
    return Hits(hit, tokens, int(hit.sum()), len(trace.hashes), capacity_blocks)


# ---------------------------------------------------------------------------------------------
# A Poisson stream


@dataclass(frozen=True)
class Contexts:
    """The context distribution of a synthetic stream: `fixed` (every request `tokens`),
    `uniform` (between `low` and `high`) or `exponential` (mean `tokens`)."""

    kind: str = "fixed"
    tokens: int = 16384
    low: int = 0
    high: int = 0

    def describe(self) -> str:
        if self.kind == "uniform":
            return f"uniform over {self.low}..{self.high} tokens"
        if self.kind == "exponential":
            return f"exponential, mean {self.tokens} tokens"
        return f"{self.tokens} tokens each"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, n, dtype=np.int64)
        if self.kind == "exponential":
            return np.maximum(1, np.rint(rng.exponential(self.tokens, n))).astype(np.int64)
        return np.full(n, self.tokens, np.int64)


CONTEXT_KINDS = ("fixed", "uniform:LOW:HIGH", "exponential")


def parse_contexts(text: str, tokens: int, parse_tokens) -> Contexts:
    """--contexts fixed | uniform:4k:32k | exponential (the mean being --context)."""
    parts = text.strip().split(":")
    if parts == ["fixed"]:
        return Contexts("fixed", tokens)
    if parts == ["exponential"]:
        return Contexts("exponential", tokens)
    if parts[0] == "uniform" and len(parts) == 3:
        low, high = parse_tokens(parts[1]), parse_tokens(parts[2])
        if low > high:
            raise UsageError(f"--contexts {text!r}: the low end is past the high end")
        return Contexts("uniform", (low + high) // 2, low, high)
    raise UsageError(f"--contexts {text!r}: one of {', '.join(CONTEXT_KINDS)}")


@dataclass(frozen=True, eq=False)
class Stream:
    """A seeded Poisson stream: exponential gaps of mean 1 (divide by the QPS for arrival
    times, so one draw serves every load the capacity search tries) and contexts."""

    qps: float
    contexts: Contexts
    seed: int
    unit_arrivals: np.ndarray
    input_tokens: np.ndarray
    notes: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.unit_arrivals)


def poisson(qps: float, requests: int, contexts: Contexts, seed: int = 0) -> Stream:
    """`requests` arrivals of a Poisson process at `qps`, contexts drawn from `contexts`."""
    if not (qps > 0 and math.isfinite(qps)):
        raise UsageError(f"--qps must be a positive number of requests per second, got {qps}")
    if not 1 <= requests <= MAX_STREAM_REQUESTS:
        raise UsageError(f"--requests must lie in 1..{MAX_STREAM_REQUESTS}, got {requests}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, requests)
    gaps[0] = 0.0
    return Stream(qps, contexts, seed, np.cumsum(gaps), contexts.draw(rng, requests))
