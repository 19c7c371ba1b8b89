"""Selections: which blocks or tokens a read wants, and the compiled step that turns them into a
fragment table (workloads/kernels.py) — the metadata work a connector does between "read these"
and the first byte moving.

- dense[:N]: N whole blocks (default 1), their ids contiguous in the pool or scattered (seeded);
- superblock[:N]: N groups of 256 tokens, each group's blocks contiguous (Mooncake's remedy, B3);
- sparse[:K]: the top-K tokens (default 256) of every KV head of every layer out of a context of
  `ctx` tokens, chosen uniformly or in clustered runs, seeded (B14);
- COUNTxSIZE[@STRIDE]: an explicit shape, parsed by workloads.patterns (`1024x160B`).

The builders append pieces in the local buffer's order and merge a piece into the previous one when
it starts where that one ended in the region and lies in the same tensor, as a real connector
would: vLLM hands a connector one pointer per layer tensor, so nothing merges across tensors.

Counts are bounded before anything is sized from them (MAX_* below): a typo like dense:10**12
or ctx=10**15 is a one-line error, not a MemoryError.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nearlocal.core.patterns import MAX_FRAGMENTS  # fragment-table rows one read may build
from nearlocal.errors import UsageError
from nearlocal.workloads.kernels import dense_fragments, sparse_fragments
from nearlocal.workloads.layouts import DenseDescriptor, SparseDescriptor

SUPERBLOCK_TOKENS = 256
DEFAULT_TOP_K = 256
DEFAULT_CONTEXT = 4096
KINDS = ("dense", "superblock", "sparse")
PLACEMENTS = ("contiguous", "scattered")
DISTRIBUTIONS = ("uniform", "clustered")
MAX_BLOCKS = 1 << 20  # blocks one read may name (a 16-token block table of 16M tokens)
MAX_CONTEXT = 1 << 24  # sparse context tokens (16M, past any model's window)


@dataclass(frozen=True)
class Selection:
    """A parsed selection: the kind, its size and how ids and tokens are drawn."""

    kind: str  # dense, superblock, sparse
    count: int  # blocks (dense), superblocks, or top-k tokens (sparse)
    placement: str = "contiguous"
    context: int = DEFAULT_CONTEXT  # sparse: tokens in the sequence
    distribution: str = "uniform"  # sparse
    run: int = 8  # sparse clustered: tokens per cluster
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"unknown selection {self.kind!r}: valid are dense[:N], "
                             "superblock[:N], sparse[:K] or COUNTxSIZE (1024x160B)")
        if self.count <= 0:
            raise UsageError(f"selection {self.kind}:{self.count}: the count must be positive")
        if self.context <= 0 or self.context > MAX_CONTEXT:
            raise UsageError(f"ctx={self.context} tokens is outside 1-{MAX_CONTEXT}")
        if self.kind != "sparse" and self.count > MAX_BLOCKS:
            raise UsageError(f"selection {self.kind}:{self.count} is beyond {MAX_BLOCKS} "
                             "blocks in one read")
        if self.placement not in PLACEMENTS:
            raise UsageError(f"unknown block placement {self.placement!r}: valid are "
                             f"{', '.join(PLACEMENTS)}")
        if self.distribution not in DISTRIBUTIONS:
            raise UsageError(f"unknown token distribution {self.distribution!r}: valid are "
                             f"{', '.join(DISTRIBUTIONS)}")
        if self.kind == "sparse" and self.count > self.context:
            raise UsageError(f"sparse:{self.count} wants more tokens than the context holds "
                             f"(ctx={self.context})")
        if self.run <= 0:
            raise UsageError(f"run={self.run} must be a positive token count")
        if self.distribution == "clustered" and self.run > self.context:  # runs only cluster there
            raise UsageError(f"run={self.run} must be a positive token count up to ctx "
                             f"({self.context})")

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.count}"

    def blocks_needed(self, block_tokens: int) -> int:
        """Blocks of the sequence the selection touches (the block table's length)."""
        if self.kind == "dense":
            return self.count
        if self.kind == "superblock":
            if SUPERBLOCK_TOKENS % block_tokens:
                raise UsageError(f"superblocks are {SUPERBLOCK_TOKENS} tokens: the block size "
                                 f"({block_tokens}) must divide it")
            needed = self.count * (SUPERBLOCK_TOKENS // block_tokens)
            if needed > MAX_BLOCKS:
                raise UsageError(f"superblock:{self.count} at {block_tokens}-token blocks is "
                                 f"{needed} blocks, beyond {MAX_BLOCKS} in one read")
            return needed
        return -(-self.context // block_tokens)

    def default_pool(self, block_tokens: int) -> int:
        """Pool blocks when none is given: room for the table twice over (at least 4), so K and V
        of the blocks read are not neighbours by accident and scattered ids have room to scatter;
        a sparse read of a contiguous context just needs the context's blocks."""
        needed = self.blocks_needed(block_tokens)
        if self.kind == "sparse" and self.placement == "contiguous":
            return max(4, needed)
        return max(4, 2 * needed)

    def block_table(self, block_tokens: int, pool_blocks: int) -> np.ndarray:
        """Physical block ids in logical (sequence) order."""
        needed = self.blocks_needed(block_tokens)
        if needed > pool_blocks:
            raise UsageError(f"the selection needs {needed} blocks but the pool holds "
                             f"{pool_blocks}: raise pool=")
        rng = np.random.default_rng(self.seed)
        if self.kind == "superblock":
            group = SUPERBLOCK_TOKENS // block_tokens
            slots = pool_blocks // group
            if self.placement == "scattered":
                starts = rng.choice(slots, self.count, replace=False) * group
            else:
                starts = np.arange(self.count) * group
            return (starts[:, None] + np.arange(group)[None, :]).reshape(-1).astype(np.int64)
        if self.placement == "scattered":
            return rng.choice(pool_blocks, needed, replace=False).astype(np.int64)
        return np.arange(needed, dtype=np.int64)

    def tokens(self, layers: int, heads: int) -> np.ndarray:
        """Sparse: sorted token positions per (layer, head), shape (layers, heads, k); drawn one
        (layer, head) at a time so long contexts cost O(k), not O(ctx), memory."""
        rng = np.random.default_rng(self.seed + 1)
        k, ctx, run = self.count, self.context, self.run
        windows, want = ctx // run, -(-k // run)
        if self.distribution == "clustered" and want > windows:
            raise UsageError(f"clustered sparse:{k} does not fit ctx={ctx} in runs of {run}: "
                             "lower k or run")
        chosen = np.empty((layers, heads, k), np.int64)
        for li in range(layers):
            for h in range(heads):
                if self.distribution == "uniform":
                    picked = rng.choice(ctx, k, replace=False)
                else:  # runs of `run` consecutive tokens in random, whole, run-aligned windows
                    starts = rng.choice(windows, want, replace=False) * run
                    picked = (starts[:, None] + np.arange(run)).reshape(-1)
                chosen[li, h] = np.sort(picked)[:k]
        return chosen


def check_pieces(pieces: int, what: str) -> None:
    """Refuse a read whose fragment table would be too large to build, before building it."""
    if pieces > MAX_FRAGMENTS:
        raise UsageError(f"{what} is {pieces} pieces, beyond {MAX_FRAGMENTS} in one read: select "
                         "fewer blocks, tokens or layers")


def build_dense(table: np.ndarray, desc: DenseDescriptor) -> tuple[np.ndarray, int]:
    """The fragment table and the piece count before merging."""
    pieces = desc.outer.size * table.size
    check_pieces(pieces, "the read")
    out = np.empty((pieces, 3), np.int64)
    n = dense_fragments(table, desc.outer, desc.tensors, desc.block_stride, desc.piece,
                        desc.block_major, out)
    return out[:n].copy(), pieces


def build_sparse(table: np.ndarray, tokens: np.ndarray, desc: SparseDescriptor,
                 block_tokens: int) -> tuple[np.ndarray, int]:
    pieces = desc.layer_offsets.size * tokens.shape[1] * tokens.shape[2]
    check_pieces(pieces, "the read")
    out = np.empty((pieces, 3), np.int64)
    n = sparse_fragments(table, tokens, desc.layer_offsets, desc.tensors, desc.block_stride,
                         desc.token_stride, desc.head_stride, desc.unit, block_tokens, out)
    return out[:n].copy(), pieces
