"""The GPU fragment kernels under numba-cuda's simulator (tests/conftest.py sets
NUMBA_ENABLE_CUDASIM=1), checked byte for byte against numpy. Tables are tiny and blocks small:
the simulator runs every GPU thread as a Python thread."""

import numpy as np
import pytest

from nearlocal.errors import UsageError

kernels = pytest.importorskip("nearlocal.gpu.kernels", reason="numba-cuda is not installed")


def _gather_table(rng, count: int, max_len: int, src_size: int) -> np.ndarray:
    """Scattered, unaligned sources (they may overlap: reads), packed destinations with odd gaps."""
    lengths = rng.integers(1, max_len, count)
    gaps = rng.integers(0, 5, count)
    dst = np.cumsum(gaps) + np.concatenate([[0], np.cumsum(lengths[:-1])])
    src = rng.integers(0, src_size - max_len, count)
    table = np.stack([src, dst, lengths], axis=1)
    return table[rng.permutation(count)]


def _run_copy(table, src, dst, width, threads=8, group=4):
    table = kernels.validate_fragments(table, src.size, dst.size)
    plan = kernels.plan_launch(table, width=width, threads=threads, group=group)
    expected = kernels.reference_copy(dst, src, table)
    out = dst.copy()
    kernels.copy_fragments(out, src, table, plan)
    return out, expected, table


@pytest.mark.parametrize("width", [16, 8, 4])
@pytest.mark.parametrize("seed", [1, 2])
def test_gather_kernel_matches_numpy(width, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 256, 400, dtype=np.uint8)
    table = _gather_table(rng, 7, 45, src.size)
    dst = np.zeros(int((table[:, 1] + table[:, 2]).max()) + 9, np.uint8)
    out, expected, table = _run_copy(table, src, dst, width)
    np.testing.assert_array_equal(out, expected)
    assert kernels.fragments_match(out, src, table) is None


@pytest.mark.parametrize("width", [16, 4])
def test_scatter_kernel_matches_numpy(width):
    rng = np.random.default_rng(7)
    gather = _gather_table(rng, 6, 40, 300)
    # scatter: packed source, scattered destinations (distinct 48-byte slots at odd offsets)
    slots = rng.permutation(8)[:6] * 48 + rng.integers(0, 7, 6)
    table = np.stack([gather[:, 1], slots, np.minimum(gather[:, 2], 41)], axis=1)
    src = rng.integers(1, 256, int((table[:, 0] + table[:, 2]).max()) + 3, dtype=np.uint8)
    dst = rng.integers(1, 256, 400, dtype=np.uint8)
    out, expected, _ = _run_copy(table, src, dst, width, threads=8, group=2)
    np.testing.assert_array_equal(out, expected)  # bytes outside the fragments are untouched


def test_one_fragment_longer_than_the_group_and_auto_geometry():
    rng = np.random.default_rng(3)
    src = rng.integers(1, 256, 300, dtype=np.uint8)
    table = np.array([[3, 17, 250]])  # offsets disagree mod 16, 8 and 4: byte path
    dst = np.zeros(280, np.uint8)
    out, expected, table = _run_copy(table, src, dst, 16, threads=8, group=0)
    np.testing.assert_array_equal(out, expected)
    aligned = np.array([[5, 21, 200]])  # 5 and 21 agree mod 16: 11-byte head, words, tail
    out, expected, _ = _run_copy(aligned, src, dst, 16, threads=4, group=4)
    np.testing.assert_array_equal(out, expected)


def test_zero_copy_sum_and_fill_match_numpy():
    rng = np.random.default_rng(5)
    region = rng.integers(0, 256, 320, dtype=np.uint8)
    table = kernels.validate_fragments(_gather_table(rng, 5, 60, region.size))
    plan = kernels.plan_launch(table, width=16, threads=8, group=4)
    sums = np.zeros(len(table), np.uint64)
    kernels.sum_fragments(region, table, plan, sums)
    np.testing.assert_array_equal(sums, kernels.reference_sums(region, table))

    target = rng.integers(0, 256, 400, dtype=np.uint8)
    expected = target.copy()
    for _, d, n in table:
        expected[d:d + n] = 0x5A
    kernels.fill_fragments(target, table, plan, 0x5A)
    np.testing.assert_array_equal(target, expected)


def test_spin_kernel_waits():
    out = np.zeros(1, np.uint64)
    kernels.spin(200_000, out)
    assert out[0] >= 200_000


def test_zero_length_fragment_is_rejected():
    with pytest.raises(UsageError, match="fragment 1 has length 0"):
        kernels.validate_fragments(np.array([[0, 0, 8], [8, 8, 0]]), 64, 64)


def test_overlapping_destinations_are_rejected():
    table = np.array([[0, 0, 8], [32, 40, 16], [64, 50, 8]])
    with pytest.raises(UsageError, match=r"fragments 1 and 2 overlap in the destination "
                                         r"\(bytes 50\.\.55\)"):
        kernels.validate_fragments(table, 128, 128)
    # touching is fine, and overlapping sources are reads
    kernels.validate_fragments(np.array([[0, 0, 16], [8, 16, 16]]), 64, 64)


@pytest.mark.parametrize(("table", "message"), [
    (np.array([[60, 0, 8]]), "ends at byte 68 of the source"),
    (np.array([[0, 60, 8]]), "ends at byte 68 of the destination"),
    (np.array([[-1, 0, 8]]), "negative offset"),
    (np.zeros((0, 3)), "empty"),
    (np.zeros((2, 2)), "3 columns"),
])
def test_bad_tables_are_rejected(table, message):
    with pytest.raises(UsageError, match=message):
        kernels.validate_fragments(table, 64, 64)


def test_launch_options_are_checked():
    table = np.array([[0, 0, 160]])
    with pytest.raises(UsageError, match="valid widths are 4, 8, 16"):
        kernels.plan_launch(table, width=2)
    with pytest.raises(UsageError, match="threads per block"):
        kernels.plan_launch(table, threads=2048)
    with pytest.raises(UsageError, match="must divide"):
        kernels.plan_launch(table, threads=96, group=64)
    plan = kernels.plan_launch(np.tile(table, (1024, 1)), width=16, threads=128)
    assert (plan.group, plan.blocks, plan.width) == (16, 128, 16)  # 10 words -> 16 threads
    assert kernels.plan_launch(table, alignment=4).width == 4
    assert kernels.pointer_alignment(4096, 4096 + 8) == 8
    assert kernels.pointer_alignment(4096, 4097) == 1


def test_fragments_match_points_at_the_bad_fragment():
    src = np.arange(64, dtype=np.uint8)
    table = np.array([[0, 0, 4], [10, 4, 4]])
    dst = kernels.reference_copy(np.zeros(8, np.uint8), src, table)
    assert kernels.fragments_match(dst, src, table) is None
    dst[5] ^= 1
    assert kernels.fragments_match(dst, src, table) == 1
