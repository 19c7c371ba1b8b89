"""Fragment kernels as CUDA C, compiled by NVRTC (called directly, through cupy's binding of it),
loaded from the compiled image and launched by cupy (Beluga B9, B13-B14). Not cupy.RawModule:
cupy 14 compiles a RawModule (and every elementwise kernel) only where it finds the CUDA runtime
headers, although this source includes none; a pip-only box may have none. No numba-cuda: its
typing does not import under numpy >= 2.5, and cupy
launches a raw kernel far more cheaply than numba's dispatcher.

Work is split by BYTES, not by fragment: the host cuts every fragment into pieces of at most
`chunk` bytes (`split_pieces`, int64 rows (src offset, dst offset, length, fragment index)), and
each piece is moved by a group of `group` threads. So a 64 MiB fragment spreads over thousands of
blocks and the whole GPU, while 1024 fragments of 160 B get a 16-thread group each. Within a
piece a thread moves a byte-wise head up to the first address where source and destination are
both aligned to the access width, then words of 16, 8 or 4 bytes (the widest the two addresses
agree on, at most `width`), up to 4 independent loads in flight before their stores, then a
byte-wise tail.

The same walk serves zero-copy access: `nl_sum` adds every byte of every piece into its
fragment's sum where the bytes lie (mapped host memory read in place over the bus), `nl_fill`
writes a byte over them in place. `nl_spin` is the short blocking kernel that work is queued
behind so the host's enqueue cost stays out of CUDA-event timings (the nvbench method); it also
stands in for compute in the layer stream.

The source compiles three ways: NVRTC on a GPU box (`compile_image`, the module loaded from its
cubin or PTX); nvcc -ptx (a test on any box with
the CUDA toolkit, so syntax errors show without a GPU); g++ with a shim that runs every thread of
a launch one after another (tests/gpu_cpushim.py), so the tests check bytes land where they
should for odd, unaligned tables on a CPU. Everything above the `--- host side` line is plain
numpy and needs no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nearlocal.errors import UsageError

WIDTHS = (16, 8, 4)  # the word widths a kernel may use; 1 is the byte-wise fallback
MAX_THREADS = 1024
UNROLL = 4  # words a thread loads before storing them (must match NL_UNROLL below)
PIECE_COLUMNS = 4

KERNEL_SOURCE = r"""
// nearlocal fragment kernels. Pieces: int64 rows (src offset, dst offset, length, fragment).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define NL_DEVICE __device__ __forceinline__
#define NL_GLOBAL extern "C" __global__
#else  // the CPU shim of the tests: threadIdx & co. are globals, a thread is a call
#define NL_DEVICE static inline
#define NL_GLOBAL extern "C"
#endif
#define NL_UNROLL 4

typedef unsigned long long nl_u64;
typedef long long nl_i64;
typedef unsigned char nl_u8;
// 16- and 8-byte words: one vector load / store each (ld.global.v4.u32, ld.global.v2.u32)
struct alignas(16) nl_v16 { unsigned x, y, z, w; };
struct alignas(8) nl_v8 { unsigned x, y; };

NL_DEVICE int nl_width(nl_u64 a, nl_u64 b, int width) {
  // the widest allowed width at which addresses a and b can both be aligned (16, 8, 4 or 1)
  int w = width;
  while (w > 1 && ((a ^ b) & (nl_u64)(w - 1)) != 0) w = w > 4 ? w / 2 : 1;
  return w;
}

NL_DEVICE nl_i64 nl_head(nl_u64 a, nl_i64 n, int w) {
  // bytes before the first w-aligned address (all of them when w == 1)
  if (w == 1) return n;
  nl_i64 head = (nl_i64)((w - (a & (nl_u64)(w - 1))) & (nl_u64)(w - 1));
  return head > n ? n : head;
}

NL_DEVICE unsigned nl_bsum32(unsigned v) {
  v = (v & 0x00FF00FFu) + ((v >> 8) & 0x00FF00FFu);
  return (v & 0xFFFFu) + (v >> 16);
}
NL_DEVICE nl_u64 nl_bsum(nl_v16 v) {
  return (nl_u64)nl_bsum32(v.x) + nl_bsum32(v.y) + nl_bsum32(v.z) + nl_bsum32(v.w);
}
NL_DEVICE nl_u64 nl_bsum(nl_v8 v) { return (nl_u64)nl_bsum32(v.x) + nl_bsum32(v.y); }
NL_DEVICE nl_u64 nl_bsum(unsigned v) { return nl_bsum32(v); }
NL_DEVICE void nl_splat(nl_v16* out, unsigned x) { out->x = out->y = out->z = out->w = x; }
NL_DEVICE void nl_splat(nl_v8* out, unsigned x) { out->x = out->y = x; }
NL_DEVICE void nl_splat(unsigned* out, unsigned x) { *out = x; }

template <typename T>
NL_DEVICE void nl_copy_words(nl_u8* dst, const nl_u8* src, nl_i64 words, int lane, int group) {
  const T* s = (const T*)src;
  T* d = (T*)dst;
  for (nl_i64 k = lane; k < words; k += (nl_i64)NL_UNROLL * group) {
    T v[NL_UNROLL] = {};  // every slot set: no maybe-uninitialized from host compilers
#pragma unroll
    for (int u = 0; u < NL_UNROLL; u++) {
      nl_i64 j = k + (nl_i64)u * group;
      if (j < words) v[u] = s[j];
    }
#pragma unroll
    for (int u = 0; u < NL_UNROLL; u++) {
      nl_i64 j = k + (nl_i64)u * group;
      if (j < words) d[j] = v[u];
    }
  }
}

template <typename T>
NL_DEVICE nl_u64 nl_sum_words(const nl_u8* src, nl_i64 words, int lane, int group) {
  const T* s = (const T*)src;
  nl_u64 acc = 0;
  for (nl_i64 k = lane; k < words; k += (nl_i64)NL_UNROLL * group) {
    T v[NL_UNROLL] = {};  // every slot set: no maybe-uninitialized from host compilers
#pragma unroll
    for (int u = 0; u < NL_UNROLL; u++) {
      nl_i64 j = k + (nl_i64)u * group;
      if (j < words) v[u] = s[j];
    }
#pragma unroll
    for (int u = 0; u < NL_UNROLL; u++) {
      nl_i64 j = k + (nl_i64)u * group;
      if (j < words) acc += nl_bsum(v[u]);
    }
  }
  return acc;
}

template <typename T>
NL_DEVICE void nl_fill_words(nl_u8* dst, nl_i64 words, unsigned pattern, int lane, int group) {
  T* d = (T*)dst;
  T v;
  nl_splat(&v, pattern);
  for (nl_i64 k = lane; k < words; k += group) d[k] = v;
}

NL_DEVICE void nl_copy_piece(nl_u8* dst, const nl_u8* src, nl_i64 n, int width, int lane,
                             int group) {
  int w = nl_width((nl_u64)src, (nl_u64)dst, width);
  nl_i64 head = nl_head((nl_u64)src, n, w);
  nl_i64 words = w == 1 ? 0 : (n - head) / w;
  for (nl_i64 i = lane; i < head; i += group) dst[i] = src[i];
  if (w == 16) nl_copy_words<nl_v16>(dst + head, src + head, words, lane, group);
  else if (w == 8) nl_copy_words<nl_v8>(dst + head, src + head, words, lane, group);
  else if (w == 4) nl_copy_words<unsigned>(dst + head, src + head, words, lane, group);
  for (nl_i64 i = head + words * w + lane; i < n; i += group) dst[i] = src[i];
}

NL_DEVICE nl_u64 nl_sum_piece(const nl_u8* src, nl_i64 n, int width, int lane, int group) {
  int w = nl_width((nl_u64)src, (nl_u64)src, width);
  nl_i64 head = nl_head((nl_u64)src, n, w);
  nl_i64 words = w == 1 ? 0 : (n - head) / w;
  nl_u64 acc = 0;
  for (nl_i64 i = lane; i < head; i += group) acc += src[i];
  if (w == 16) acc += nl_sum_words<nl_v16>(src + head, words, lane, group);
  else if (w == 8) acc += nl_sum_words<nl_v8>(src + head, words, lane, group);
  else if (w == 4) acc += nl_sum_words<unsigned>(src + head, words, lane, group);
  for (nl_i64 i = head + words * w + lane; i < n; i += group) acc += src[i];
  return acc;
}

NL_DEVICE void nl_fill_piece(nl_u8* dst, nl_i64 n, int width, unsigned byte, int lane,
                             int group) {
  int w = nl_width((nl_u64)dst, (nl_u64)dst, width);
  nl_i64 head = nl_head((nl_u64)dst, n, w);
  nl_i64 words = w == 1 ? 0 : (n - head) / w;
  unsigned pattern = (byte & 0xFFu) * 0x01010101u;
  for (nl_i64 i = lane; i < head; i += group) dst[i] = (nl_u8)byte;
  if (w == 16) nl_fill_words<nl_v16>(dst + head, words, pattern, lane, group);
  else if (w == 8) nl_fill_words<nl_v8>(dst + head, words, pattern, lane, group);
  else if (w == 4) nl_fill_words<unsigned>(dst + head, words, pattern, lane, group);
  for (nl_i64 i = head + words * w + lane; i < n; i += group) dst[i] = (nl_u8)byte;
}

// every launch: `group` threads per piece, blockDim.x / group pieces per block, grid-stride
#define NL_PIECE_LOOP(BODY)                                                              \
  int lane = (int)(threadIdx.x % (unsigned)group);                                       \
  nl_i64 per_block = (nl_i64)(blockDim.x / (unsigned)group);                             \
  nl_i64 stride = (nl_i64)gridDim.x * per_block;                                         \
  const nl_i64* table = (const nl_i64*)pieces;                                           \
  for (nl_i64 p = (nl_i64)blockIdx.x * per_block + threadIdx.x / (unsigned)group;        \
       p < count; p += stride) {                                                         \
    const nl_i64* row = table + 4 * p;                                                   \
    BODY                                                                                 \
  }

NL_GLOBAL void nl_copy(nl_u64 dst, nl_u64 src, nl_u64 pieces, nl_i64 count, int width,
                       int group) {
  NL_PIECE_LOOP(nl_copy_piece((nl_u8*)dst + row[1], (const nl_u8*)src + row[0], row[2],
                              width, lane, group);)
}

NL_GLOBAL void nl_sum(nl_u64 src, nl_u64 sums, nl_u64 pieces, nl_i64 count, int width,
                      int group) {
  NL_PIECE_LOOP(nl_u64 acc = nl_sum_piece((const nl_u8*)src + row[0], row[2], width, lane,
                                          group);
                atomicAdd((nl_u64*)sums + row[3], acc);)
}

NL_GLOBAL void nl_fill(nl_u64 dst, unsigned byte, nl_u64 pieces, nl_i64 count, int width,
                       int group) {
  NL_PIECE_LOOP(nl_fill_piece((nl_u8*)dst + row[1], row[2], width, byte, lane, group);)
}

// plain SM copies of one contiguous range (gpu_check's reference for the gather kernel): every
// thread of the grid moves 16-byte words at a grid-wide stride, U loads in flight before their
// stores (4: nearlocal's own depth; 12: nvbandwidth's stridingMemcpyKernel), then a byte tail.
// Both pointers must be 16-byte aligned.
template <int U>
NL_DEVICE void nl_plain_copy(nl_u64 dst, nl_u64 src, nl_i64 nbytes) {
  const nl_v16* s = (const nl_v16*)src;
  nl_v16* d = (nl_v16*)dst;
  nl_i64 words = nbytes / 16;
  nl_i64 threads = (nl_i64)gridDim.x * blockDim.x;
  nl_i64 t = (nl_i64)blockIdx.x * blockDim.x + threadIdx.x;
  nl_i64 k = t;
  for (; k + (nl_i64)(U - 1) * threads < words; k += (nl_i64)U * threads) {
    nl_v16 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = s[k + u * threads];
#pragma unroll
    for (int u = 0; u < U; u++) d[k + u * threads] = v[u];
  }
  for (; k < words; k += threads) d[k] = s[k];
  for (nl_i64 i = words * 16 + t; i < nbytes; i += threads)
    ((nl_u8*)dst)[i] = ((const nl_u8*)src)[i];
}

NL_GLOBAL void nl_plain_copy4(nl_u64 dst, nl_u64 src, nl_i64 nbytes) {
  nl_plain_copy<4>(dst, src, nbytes);
}

NL_GLOBAL void nl_plain_copy12(nl_u64 dst, nl_u64 src, nl_i64 nbytes) {
  nl_plain_copy<12>(dst, src, nbytes);
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
NL_DEVICE nl_u64 nl_globaltimer() {
  nl_u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

NL_GLOBAL void nl_spin(nl_u64 duration_ns, nl_u64 out) {
  // one thread busy-waits duration_ns on the GPU's nanosecond clock and writes what it waited
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    nl_u64 start = nl_globaltimer(), now = start;
    while (now - start < duration_ns) now = nl_globaltimer();
    *(nl_u64*)out = now - start;
  }
}
#endif
"""
KERNEL_NAMES = ("nl_copy", "nl_sum", "nl_fill", "nl_plain_copy4", "nl_plain_copy12", "nl_spin")
PLAIN_COPY_UNROLLS = (4, 12)  # nl_plain_copy<U> instances
# NVRTC and nvcc default to C++17 (stated anyway); compile_image adds the architecture. No -I:
# the source includes nothing, so no CUDA header has to be found.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)


# --- host side: tables, work split, launch geometry, numpy references (no GPU needed) ----------

@dataclass(frozen=True)
class LaunchPlan:
    """Launch geometry of one fragment kernel; recorded with the case."""

    blocks: int
    threads: int
    group: int  # threads per piece
    width: int  # widest word access allowed
    chunk: int  # most bytes in one piece
    pieces: int  # pieces the fragments were cut into

    def info(self) -> dict:
        return {"blocks": self.blocks, "threads": self.threads, "group": self.group,
                "width": self.width, "chunk_bytes": self.chunk, "pieces": self.pieces}


def validate_fragments(frags: np.ndarray, src_nbytes: int | None = None,
                       dst_nbytes: int | None = None) -> np.ndarray:
    """The table as contiguous int64 (n, 3), or UsageError naming the first bad fragment."""
    table = np.ascontiguousarray(np.asarray(frags), dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 3:
        raise UsageError(f"a fragment table has 3 columns (src offset, dst offset, length); "
                         f"got shape {table.shape}")
    if table.shape[0] == 0:
        raise UsageError("the fragment table is empty: give at least one fragment")
    src, dst, length = table[:, 0], table[:, 1], table[:, 2]
    bad = np.flatnonzero(length <= 0)
    if bad.size:
        i = int(bad[0])
        raise UsageError(f"fragment {i} has length {int(length[i])}: every fragment must move at "
                         "least 1 byte (zero-length fragments are rejected)")
    bad = np.flatnonzero((src < 0) | (dst < 0))
    if bad.size:
        i = int(bad[0])
        raise UsageError(f"fragment {i} has a negative offset ({int(src[i])}, {int(dst[i])})")
    for name, offsets, limit in (("source", src, src_nbytes), ("destination", dst, dst_nbytes)):
        if limit is None:
            continue
        bad = np.flatnonzero(offsets + length > limit)
        if bad.size:
            i = int(bad[0])
            raise UsageError(f"fragment {i} ends at byte {int(offsets[i] + length[i])} of the "
                             f"{name}, which holds {limit} bytes")
    order = np.argsort(dst, kind="stable")
    ends = dst[order] + length[order]
    clash = np.flatnonzero(ends[:-1] > dst[order][1:])
    if clash.size:
        a, b = int(order[clash[0]]), int(order[clash[0] + 1])
        raise UsageError(f"fragments {a} and {b} overlap in the destination (bytes "
                         f"{int(dst[b])}..{int(min(dst[a] + length[a], dst[b] + length[b])) - 1}): "
                         "each destination byte may be written by one fragment only")
    return table


def pointer_alignment(*pointers: int) -> int:
    """The widest access width (16, 8, 4, or 1) every base pointer is aligned to. Not needed to
    launch: the kernels choose the width per piece from the piece's own addresses (nl_width,
    nl_head), so equally misaligned bases still move words after a byte-wise head."""
    for width in WIDTHS:
        if all(int(p) % width == 0 for p in pointers):
            return width
    return 1


def split_pieces(table: np.ndarray, chunk: int) -> np.ndarray:
    """Every fragment cut into pieces of at most `chunk` bytes: int64 (m, 4) rows (src offset,
    dst offset, length, fragment index), in fragment order. The work split by bytes."""
    if chunk < 1:
        raise UsageError(f"chunk must be at least 1 byte, got {chunk}")
    lengths = table[:, 2]
    counts = -(-lengths // chunk)
    frag = np.repeat(np.arange(table.shape[0], dtype=np.int64), counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    k = np.arange(frag.size, dtype=np.int64) - np.repeat(first, counts)  # piece within fragment
    start = k * chunk
    pieces = np.empty((frag.size, PIECE_COLUMNS), np.int64)
    pieces[:, 0] = table[frag, 0] + start
    pieces[:, 1] = table[frag, 1] + start
    pieces[:, 2] = np.minimum(chunk, lengths[frag] - start)
    pieces[:, 3] = frag
    return pieces


def plan_launch(table: np.ndarray, width: int = 16, threads: int = 128, group: int = 0,
                alignment: int = 16, max_blocks: int = 65535) -> tuple[LaunchPlan, np.ndarray]:
    """Geometry and pieces for a table. `group` threads per piece (0: one thread per 16-byte word
    of the median fragment, a power of two up to `threads`); a piece holds at most
    group x UNROLL words of 16 B, so a large fragment is cut into many pieces (one group each)
    and a small one stays whole; enough blocks for every piece (grid-stride beyond max_blocks).
    `alignment` only caps the width (the kernels already pick each piece's width from its own
    source and destination addresses; sessions leave it at 16)."""
    if width not in WIDTHS:
        raise UsageError(f"load width {width} is not supported: valid widths are 4, 8, 16 (bytes)")
    if not 1 <= threads <= MAX_THREADS:
        raise UsageError(f"threads per block must be 1..{MAX_THREADS}, got {threads}")
    if group < 0 or (group and (group > threads or threads % group)):
        raise UsageError(f"group {group} must divide the {threads} threads per block (0: auto)")
    if not group:
        words = max(1, -(-int(np.median(table[:, 2])) // 16))
        group = min(1 << (words - 1).bit_length(), threads)
        while threads % group:
            group //= 2
    chunk = group * UNROLL * 16
    pieces = split_pieces(table, chunk)
    per_block = threads // group
    blocks = max(1, min(-(-pieces.shape[0] // per_block), max_blocks))
    plan = LaunchPlan(blocks, threads, group, min(width, alignment), chunk, int(pieces.shape[0]))
    return plan, pieces


def reference_copy(dst: np.ndarray, src: np.ndarray, table: np.ndarray) -> np.ndarray:
    """What a copy kernel must produce, in numpy."""
    out = dst.copy()
    for s, d, n in table[:, :3]:
        out[d:d + n] = src[s:s + n]
    return out


def reference_sums(src: np.ndarray, table: np.ndarray) -> np.ndarray:
    return np.array([int(src[s:s + n].sum(dtype=np.uint64)) for s, _, n in table[:, :3]],
                    np.uint64)


def fragments_match(dst: np.ndarray, src: np.ndarray, table: np.ndarray) -> int | None:
    """Index of the first fragment whose destination bytes differ from its source, or None."""
    for i, (s, d, n) in enumerate(table[:, :3]):
        if not np.array_equal(dst[d:d + n], src[s:s + n]):
            return i
    return None


# --- device side: compile once per process and device, launch on a stream ---------------------

def nvrtc_arch_option(capability: int, supported: tuple[int, ...]) -> tuple[str, str]:
    """The NVRTC architecture option and what it yields for a GPU of compute capability
    `capability` (90 for 9.0): a cubin for the GPU itself when this NVRTC knows it (no JIT by the
    driver, whose PTX compiler may be older than NVRTC), else PTX for the newest architecture
    NVRTC knows at or below it (the driver compiles that PTX when loading)."""
    if capability in supported:
        return f"--gpu-architecture=sm_{capability}", "cubin"
    older = [a for a in supported if a <= capability]
    if not older:
        raise RuntimeError(f"this NVRTC supports no architecture at or below sm_{capability} "
                           f"(it knows {', '.join(map(str, supported)) or 'none'})")
    return f"--gpu-architecture=compute_{max(older)}", "ptx"


def compile_image(nvrtc, capability: int) -> tuple[bytes, str, tuple[str, ...]]:
    """KERNEL_SOURCE compiled by NVRTC directly (cupy's binding of it, `cupy.cuda.nvrtc`): the
    source includes no header, so nothing looks for the CUDA headers (cupy's RawModule and
    elementwise kernels refuse to compile without them, even for a header-free source).
    Returns (image, "cubin" or "ptx", the options used); a failed compile raises with NVRTC's
    log."""
    try:
        supported = tuple(int(a) for a in nvrtc.getSupportedArchs())
    except Exception:  # an NVRTC too old to say: ask for the GPU's own architecture
        supported = (capability,)
    arch, kind = nvrtc_arch_option(capability, supported)
    options = (*NVRTC_OPTIONS, arch)
    program = nvrtc.createProgram(KERNEL_SOURCE, "nearlocal_kernels.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(program, options)
        except Exception as exc:
            try:
                log = nvrtc.getProgramLog(program)
            except Exception:
                log = ""
            raise RuntimeError(f"NVRTC could not compile nearlocal's kernels with "
                               f"{' '.join(options)}: {exc}; log: {log.strip()[:2000]}") from exc
        image = nvrtc.getCUBIN(program) if kind == "cubin" else nvrtc.getPTX(program) + b"\0"
    finally:
        nvrtc.destroyProgram(program)
    return image, kind, options


class Kernels:
    """The compiled module on the current device and cheap launchers: NVRTC compiles the source
    (compile_image), the driver loads the image (cupy.cuda.function.Module.load, i.e.
    cuModuleLoadData), so neither cupy's compile cache nor the CUDA headers are involved.
    Arguments are packed as numpy scalars once per session (`args_*`), a launch is one cupy
    call on `stream`."""

    def __init__(self, cp):
        self.cp = cp
        device = cp.cuda.Device()
        capability = int(device.compute_capability)
        self.image, self.image_kind, self.options = compile_image(cp.cuda.nvrtc, capability)
        self.module = cp.cuda.function.Module()
        self.module.load(self.image)
        self.fn = {name: self.module.get_function(name) for name in KERNEL_NAMES}

    def info(self) -> dict:
        """How the module was built (the probe and gpu_check state it)."""
        return {"image": self.image_kind, "image_bytes": len(self.image),
                "nvrtc_options": " ".join(self.options)}

    @staticmethod
    def copy_args(dst: int, src: int, pieces: int, plan: LaunchPlan) -> tuple:
        return (np.uint64(dst), np.uint64(src), np.uint64(pieces), np.int64(plan.pieces),
                np.int32(plan.width), np.int32(plan.group))

    # nl_sum(src, sums, pieces, count, width, group) packs exactly like nl_copy(dst, src, ...)
    sum_args = copy_args

    @staticmethod
    def fill_args(dst: int, value: int, pieces: int, plan: LaunchPlan) -> tuple:
        return (np.uint64(dst), np.uint32(value & 0xFF), np.uint64(pieces),
                np.int64(plan.pieces), np.int32(plan.width), np.int32(plan.group))

    @staticmethod
    def plain_copy_args(dst: int, src: int, nbytes: int) -> tuple:
        """nl_plain_copy4 / nl_plain_copy12(dst, src, nbytes): one contiguous range."""
        return (np.uint64(dst), np.uint64(src), np.int64(nbytes))

    def launch(self, name: str, plan: LaunchPlan, args: tuple, stream) -> None:
        with stream:
            self.fn[name]((plan.blocks,), (plan.threads,), args)

    def spin(self, duration_ns: int, out_pointer: int, stream) -> None:
        """One thread busy-waits `duration_ns` on %globaltimer (the blocking kernel)."""
        with stream:
            self.fn["nl_spin"]((1,), (1,), (np.uint64(duration_ns), np.uint64(out_pointer)))


MEMCPY_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice


def fill_device(cp, pointer: int, nbytes: int, block: np.ndarray) -> None:
    """Write `nbytes` of device memory at `pointer` with `block` (uint8) repeated, made on the
    host and copied in (cudaMemcpy, block by block): no cupy elementwise kernel, which cupy
    compiles with the CUDA headers and refuses to compile where they are missing."""
    block = np.ascontiguousarray(block, dtype=np.uint8)
    runtime = cp.cuda.runtime
    for start in range(0, nbytes, block.size):
        n = min(block.size, nbytes - start)
        runtime.memcpy(pointer + start, int(block.ctypes.data), n, MEMCPY_HOST_TO_DEVICE)


_COMPILED: dict[tuple[int, int], Kernels] = {}


def compiled(cp) -> Kernels:
    """The module for the current device, compiled by NVRTC on first use in this process."""
    key = (id(cp), int(cp.cuda.Device().id))
    if key not in _COMPILED:
        _COMPILED[key] = Kernels(cp)
    return _COMPILED[key]
