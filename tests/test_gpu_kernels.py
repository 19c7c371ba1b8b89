"""The GPU fragment kernels' CUDA C, checked without a GPU: nvcc compiles it to PTX (with the vector
accesses and the clock read), and the same source compiled by g++ (tests/gpu_cpushim.py, every
thread of a launch run in turn) moves bytes exactly as numpy says for odd, unaligned tables and
misaligned base pointers. The work split by bytes is checked on its own against numpy."""

import re
import shutil
import subprocess

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.kernels import cuda as kernels
from tests import gpu_cpushim

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def _gather_table(rng, count: int, max_len: int, src_size: int) -> np.ndarray:
    """Scattered, unaligned sources (they may overlap: reads), packed destinations with odd gaps."""
    lengths = rng.integers(1, max_len, count)
    gaps = rng.integers(0, 5, count)
    dst = np.cumsum(gaps) + np.concatenate([[0], np.cumsum(lengths[:-1])])
    src = rng.integers(0, src_size - max_len, count)
    table = np.stack([src, dst, lengths], axis=1)
    return table[rng.permutation(count)]


def _buffer(rng, size: int, misalign: int) -> np.ndarray:
    """`size` random bytes starting `misalign` bytes past a 64-byte boundary."""
    raw = rng.integers(1, 256, size + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + misalign
    return raw[start:start + size]


def _copy(table, src, dst, width=16, threads=8, group=0):
    table = kernels.validate_fragments(table, src.size, dst.size)
    plan, pieces = kernels.plan_launch(table, width=width, threads=threads, group=group)
    expected = kernels.reference_copy(dst, src, table)
    out = dst.copy()
    gpu_cpushim.launch("nl_copy", plan.blocks, plan.threads,
                       kernels.Kernels.copy_args(gpu_cpushim.ptr(out), gpu_cpushim.ptr(src),
                                                 gpu_cpushim.ptr(pieces), plan))
    return out, expected, plan


def test_pieces_cover_every_fragment_once_in_order():
    table = np.array([[3, 1000, 1], [10, 0, 700], [5000, 2000, 256], [7, 3000, 257]])
    pieces = kernels.split_pieces(table, 256)
    assert pieces[:, 2].max() <= 256 and (pieces[:, 2] > 0).all()
    assert np.bincount(pieces[:, 3]).tolist() == [1, 3, 1, 2]
    for i, (s, d, n) in enumerate(table):
        mine = pieces[pieces[:, 3] == i]
        assert mine[:, 2].sum() == n
        np.testing.assert_array_equal(mine[:, 0] - s, mine[:, 1] - d)  # one shift per fragment
        np.testing.assert_array_equal(mine[:, 0], s + np.concatenate([[0], np.cumsum(mine[:-1, 2])]))


def test_plan_spreads_a_large_fragment_and_keeps_small_ones_whole():
    plan, pieces = kernels.plan_launch(np.array([[0, 0, 64 << 20]]), threads=128)
    assert plan.group == 128 and plan.chunk == 128 * kernels.UNROLL * 16
    assert plan.pieces == pieces.shape[0] == (64 << 20) // plan.chunk == plan.blocks
    plan, pieces = kernels.plan_launch(np.tile([[0, 0, 160]], (1024, 1)) +
                                       np.arange(1024)[:, None] * [160, 160, 0], threads=128)
    assert (plan.group, plan.pieces, plan.blocks) == (16, 1024, 128)  # 10 words -> 16 threads
    plan, _ = kernels.plan_launch(np.array([[0, 0, 65536]]), threads=128)
    assert plan.pieces == 8 and plan.blocks == 8  # 64 KiB: 1024 threads, 4 words each in flight


@needs_gxx
@pytest.mark.parametrize("width", [16, 8, 4])
@pytest.mark.parametrize(("seed", "misalign"), [(1, (0, 0)), (2, (3, 0)), (3, (8, 4))])
def test_gather_kernel_matches_numpy(width, seed, misalign):
    rng = np.random.default_rng(seed)
    src = _buffer(rng, 4000, misalign[0])
    table = _gather_table(rng, 9, 700, src.size)  # several fragments span many pieces
    dst = _buffer(rng, int((table[:, 1] + table[:, 2]).max()) + 9, misalign[1])
    out, expected, plan = _copy(table, src, dst, width, threads=8, group=2)
    assert plan.pieces > len(table)
    np.testing.assert_array_equal(out, expected)  # and nothing outside the fragments moved
    assert kernels.fragments_match(out, src, table) is None


@needs_gxx
@pytest.mark.parametrize("width", [16, 4])
def test_scatter_kernel_matches_numpy(width):
    rng = np.random.default_rng(7)
    gather = _gather_table(rng, 6, 40, 300)
    # scatter: packed source, scattered destinations (distinct 48-byte slots at odd offsets)
    slots = rng.permutation(8)[:6] * 48 + rng.integers(0, 7, 6)
    table = np.stack([gather[:, 1], slots, np.minimum(gather[:, 2], 41)], axis=1)
    src = _buffer(rng, int((table[:, 0] + table[:, 2]).max()) + 3, 1)
    dst = _buffer(rng, 400, 0)
    out, expected, _ = _copy(table, src, dst, width, threads=8, group=2)
    np.testing.assert_array_equal(out, expected)


@needs_gxx
def test_one_long_fragment_grid_stride_and_byte_path():
    rng = np.random.default_rng(3)
    src = _buffer(rng, 20000, 0)
    dst = _buffer(rng, 20000, 0)
    table = np.array([[3, 17, 19000]])  # offsets disagree mod 16, 8 and 4: byte path everywhere
    out, expected, _ = _copy(table, src, dst, 16, threads=32, group=0)
    np.testing.assert_array_equal(out, expected)
    aligned = np.array([[5, 21, 19000]])  # agree mod 16: 11-byte head, words, tail, per piece
    table = kernels.validate_fragments(aligned, src.size, dst.size)
    plan, pieces = kernels.plan_launch(table, threads=8, group=4, max_blocks=3)  # grid stride
    out = dst.copy()
    gpu_cpushim.launch("nl_copy", plan.blocks, plan.threads,
                       kernels.Kernels.copy_args(gpu_cpushim.ptr(out), gpu_cpushim.ptr(src),
                                                 gpu_cpushim.ptr(pieces), plan))
    assert plan.blocks == 3 < plan.pieces
    np.testing.assert_array_equal(out, kernels.reference_copy(dst, src, table))


@needs_gxx
@pytest.mark.parametrize("misalign", [3, 5, 12])
def test_equally_misaligned_bases_keep_the_full_width(misalign):
    """Source and destination both `misalign` bytes past a boundary: the plan keeps width 16 (the
    kernel picks each piece's width and byte head from its own addresses) and the bytes land."""
    rng = np.random.default_rng(11 + misalign)
    src = _buffer(rng, 6000, misalign)
    dst = _buffer(rng, 6000, misalign)
    assert gpu_cpushim.ptr(src) % 16 == gpu_cpushim.ptr(dst) % 16 == misalign
    table = np.array([[0, 0, 4096], [4100, 4200, 700], [5001, 5101, 899]])  # agree mod 4, 4, 4
    out, expected, plan = _copy(table, src, dst, 16, threads=8, group=2)
    assert plan.width == 16 and plan.pieces > len(table)
    np.testing.assert_array_equal(out, expected)
    assert kernels.fragments_match(out, src, table) is None


@needs_gxx
@pytest.mark.parametrize("width", [16, 8, 4])
def test_zero_copy_sum_and_fill_match_numpy(width):
    rng = np.random.default_rng(5)
    region = _buffer(rng, 3000, 5)
    table = kernels.validate_fragments(_gather_table(rng, 5, 900, region.size))
    plan, pieces = kernels.plan_launch(table, width=width, threads=8, group=4)
    sums = np.zeros(len(table), np.uint64)
    gpu_cpushim.launch("nl_sum", plan.blocks, plan.threads, kernels.Kernels.sum_args(
        gpu_cpushim.ptr(region), gpu_cpushim.ptr(sums), gpu_cpushim.ptr(pieces), plan))
    np.testing.assert_array_equal(sums, kernels.reference_sums(region, table))

    target = _buffer(rng, 3000, 3)
    expected = target.copy()
    for _, d, n in table:
        expected[d:d + n] = 0x5A
    gpu_cpushim.launch("nl_fill", plan.blocks, plan.threads, kernels.Kernels.fill_args(
        gpu_cpushim.ptr(target), 0x15A, gpu_cpushim.ptr(pieces), plan))  # only the low byte
    np.testing.assert_array_equal(target, expected)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) is not installed")
def test_kernel_source_compiles_with_nvcc(tmp_path):
    source = tmp_path / "kernels.cu"
    source.write_text(kernels.KERNEL_SOURCE)
    ptx = tmp_path / "kernels.ptx"
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", *kernels.NVRTC_OPTIONS, "-o", str(ptx),
                    str(source)], check=True, capture_output=True, timeout=120)
    text = ptx.read_text()
    for name in kernels.KERNEL_NAMES:
        assert f".entry {name}(" in text
    assert "ld.global.v4.u32" in text and "st.global.v4.u32" in text  # 16-byte words
    assert "%globaltimer" in text


def test_kernel_source_compiles_with_nvrtc():
    """The path nearlocal takes on a GPU box, minus the GPU: compile_image calls NVRTC directly
    (here the real library through ctypes, with the interface of cupy's binding), no header
    search path, a cubin for sm_90 (what the driver loads as it is) and PTX for a newer GPU
    NVRTC does not know."""
    from tests.gpu_fakecupy import CtypesNvrtc, libnvrtc

    lib = libnvrtc()
    if lib is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    nvrtc = CtypesNvrtc(lib)
    image, kind, options = kernels.compile_image(nvrtc, 90)
    assert kind == "cubin" and image.startswith(b"\x7fELF")
    assert options == (*kernels.NVRTC_OPTIONS, "--gpu-architecture=sm_90")
    assert not any(o.startswith(("-I", "--include-path")) for o in options)
    for name in kernels.KERNEL_NAMES:
        assert name.encode() in image
    newest = max(nvrtc.getSupportedArchs())
    ptx, kind, options = kernels.compile_image(nvrtc, newest + 1)  # unknown to this NVRTC
    assert kind == "ptx" and options[-1] == f"--gpu-architecture=compute_{newest}"
    text = ptx.rstrip(b"\0").decode()
    assert ptx.endswith(b"\0")  # cuModuleLoadData reads PTX as a C string
    for name in kernels.KERNEL_NAMES:
        assert f".entry {name}(" in text
    assert re.search(r"ld\.global\.v4\.[ub]32", text) and "%globaltimer" in text  # 16-byte words


def test_nvrtc_arch_choice():
    assert kernels.nvrtc_arch_option(90, (80, 90, 100)) == ("--gpu-architecture=sm_90", "cubin")
    assert kernels.nvrtc_arch_option(95, (80, 90, 100)) == ("--gpu-architecture=compute_90",
                                                            "ptx")
    with pytest.raises(RuntimeError, match="no architecture at or below sm_70"):
        kernels.nvrtc_arch_option(70, (80, 90))


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
    assert kernels.plan_launch(table, alignment=4)[0].width == 4
    assert kernels.pointer_alignment(4096, 4096 + 8) == 8
    assert kernels.pointer_alignment(4096, 4097) == 1


def test_fragments_match_points_at_the_bad_fragment():
    src = np.arange(64, dtype=np.uint8)
    table = np.array([[0, 0, 4], [10, 4, 4]])
    dst = kernels.reference_copy(np.zeros(8, np.uint8), src, table)
    assert kernels.fragments_match(dst, src, table) is None
    dst[5] ^= 1
    assert kernels.fragments_match(dst, src, table) == 1


@needs_gxx
@pytest.mark.parametrize("unroll", kernels.PLAIN_COPY_UNROLLS)
@pytest.mark.parametrize(("nbytes", "blocks", "threads"), [
    (1, 1, 1), (15, 2, 4), (16 * 37 + 5, 3, 8), (20_000, 2, 32), (16 * 12 * 8, 1, 8),
])
def test_plain_copies_match_numpy(unroll, nbytes, blocks, threads):
    """gpu_check's plain SM copy (the gather kernel's reference): every byte of the range, the
    unrolled words, the grid-stride remainder and the byte tail, and nothing past the end."""
    rng = np.random.default_rng(nbytes + unroll)
    src = _buffer(rng, nbytes + 64, 0)
    dst = _buffer(rng, nbytes + 64, 0)
    expected = dst.copy()
    expected[:nbytes] = src[:nbytes]
    gpu_cpushim.launch(f"nl_plain_copy{unroll}", blocks, threads, kernels.Kernels.plain_copy_args(
        gpu_cpushim.ptr(dst), gpu_cpushim.ptr(src), nbytes))
    np.testing.assert_array_equal(dst, expected)


@needs_gxx
@pytest.mark.parametrize("level", ["-O1", "-O2", "-O3"])
def test_kernel_source_builds_warning_free_with_gxx(tmp_path, level):
    """The shim builds with -Werror; g++ 12 at -O3 once flagged the unrolled word arrays as
    maybe-uninitialized (issue 24), which would fail every shim test on such a compiler."""
    source = tmp_path / "shim.cpp"
    source.write_text(gpu_cpushim.shim_source())
    result = subprocess.run(["g++", "-std=c++17", level, "-fno-strict-aliasing", "-fPIC",
                             *gpu_cpushim.WARNING_FLAGS, "-S", "-o", str(tmp_path / "shim.s"),
                             str(source)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
