"""Issue 23: file-read / file-write on storage:PATH. The bytes read are the file's bytes (odd sizes
buffered; unaligned O_DIRECT refused and named), O_DIRECT leaves the page cache empty (mincore),
the user's file is never written without --allow-write, bad input is one line and exit 2, probe
shows block devices and a path's file system, the S2 report row shows the best read."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nearlocal.core.cases import Case, unavailable
from nearlocal.core.patterns import parse_pattern
from nearlocal.engine.worker import open_case
from nearlocal.errors import UsageError
from nearlocal.frontends.cli import main
from nearlocal.probe import probe
from nearlocal.probe.block import filesystem_of, probe_block
from nearlocal.report.tables import build_report
from nearlocal.storage import uring
from nearlocal.storage.methods import resident_fraction, resident_pages
from nearlocal.store import load
from nearlocal.sysroot import SysRoot
from tests.report_fixtures import make_run, row

TSC_HZ = 2.0e9
ODD_BYTES = 6 * 2**20 + 4093  # not a multiple of any block size: an unaligned tail


def _user_file(path: Path, nbytes: int = ODD_BYTES) -> bytes:
    data = np.random.default_rng(7).integers(0, 256, nbytes, np.uint8).tobytes()
    path.write_bytes(data)
    return data


def _drop(path: Path) -> None:
    """Write the file back and drop its pages (dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert resident_fraction(fd, path.stat().st_size) < 0.05
    finally:
        os.close(fd)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _direct_works(folder: Path) -> bool:
    probe_file = folder / ".direct-probe"
    probe_file.write_bytes(b"\0" * 4096)
    try:
        os.close(os.open(probe_file, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe_file.unlink()


@pytest.fixture
def folder(tmp_path) -> Path:
    return tmp_path


@pytest.fixture
def direct_folder(tmp_path) -> Path:
    if not _direct_works(tmp_path):
        pytest.skip(f"{filesystem_of(tmp_path).fstype} at {tmp_path} refuses O_DIRECT")
    return tmp_path


def _expected(data: bytes, pattern: str) -> np.ndarray:
    frags = parse_pattern(pattern).frags
    out = np.zeros(int((frags[:, 1] + frags[:, 2]).max()), np.uint8)
    source = np.frombuffer(data, np.uint8)
    for src, dst, length in frags:
        out[dst:dst + length] = source[src:src + length]
    return out


def _read_into_peer(case: Case, samples: int = 2) -> tuple[np.ndarray, dict]:
    with open_case(case, TSC_HZ, 0.0, allow_write=False) as opened:
        raw, ns = opened.session.sample(samples)
        assert len(raw) == samples and np.all(ns > 0)
        return opened.session.ctx.dst.array.copy(), opened.info


# --- the bytes --------------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "params"), [
    ("1000x333B", (("cache", "warm"),)),  # odd pieces, buffered: any size goes
    ("1000x333B", (("cache", "cold"), ("qd", "8"))),
    ("7x65537B@300001B", (("cache", "warm"), ("engine", "threads"), ("qd", "3"))),
    (f"{ODD_BYTES}B", (("cache", "cold"), ("block", "64KiB"), ("qd", "16"))),  # to the odd end
])
def test_buffered_reads_land_the_files_bytes(folder, pattern, params):
    path = folder / "user.bin"
    data = _user_file(path)
    before = _digest(path)
    got, info = _read_into_peer(Case("file-read", f"storage:{path}", pattern=pattern,
                                     params=params))
    expected = _expected(data, pattern)
    assert np.array_equal(got[:expected.size], expected)
    assert _digest(path) == before and info["owned"] is False  # the user's file, untouched
    assert info["engine"] in ("io_uring", "threads") and info["o_direct"] is False


@pytest.mark.parametrize("params", [
    (("qd", "16"),),
    (("qd", "1"),),
    (("qd", "16"), ("engine", "threads")),
    (("qd", "4"), ("engine", "io_uring")),
])
def test_direct_reads_land_the_files_bytes_and_skip_the_page_cache(direct_folder, params):
    if dict(params).get("engine") == "io_uring" and uring.unavailable():
        pytest.skip(uring.unavailable())
    path = direct_folder / "user.bin"
    data = _user_file(path)
    _drop(path)
    got, info = _read_into_peer(Case("file-read", f"storage:{path}", pattern="128x20KiB",
                                     params=params))
    assert np.array_equal(got, _expected(data, "128x20KiB"))
    assert info["o_direct"] is True and info["requests"] == 128
    assert info["page_cache_resident"] == 0.0  # mincore: O_DIRECT brought no page in


def test_the_ring_records_the_setup_flags_the_kernel_took():
    if uring.unavailable():
        pytest.skip(uring.unavailable())
    ring = uring.setup(4, uring.SETUP_FLAG_CHOICES)  # the mmap flags once overwrote these
    try:
        assert ring.flags in uring.SETUP_FLAG_CHOICES
        names = uring.flag_names(ring.flags)
        assert (names == "none") if ring.flags == 0 else ("coop-taskrun" in names)
    finally:
        ring.close()


def test_warm_reads_fill_the_page_cache(folder):
    path = folder / "user.bin"
    _user_file(path)
    _, warm = _read_into_peer(Case("file-read", f"storage:{path}", pattern="128x20KiB@20KiB",
                                   params=(("cache", "warm"),)))
    assert warm["page_cache_resident"] > 0.99  # of the span the pattern reads


# cache=warm / cold over a 32 MiB file: the pattern reads 16 pages in its first 128 KiB; its last
# MiB is never read, and beyond any readahead (read_ahead_kb is 128 KiB to 8 MiB)
COLD_FILE_BYTES, COLD_PATTERN = 32 << 20, "16x4KiB@8KiB"
FAR = slice((31 << 20) // 4096, (32 << 20) // 4096)  # pages of the last MiB
READ = slice(0, 32, 2)  # the pages the pattern reads


def _pages(path: Path) -> np.ndarray:
    fd = os.open(path, os.O_RDONLY)
    try:
        return resident_pages(fd, path.stat().st_size)
    finally:
        os.close(fd)


def _warm_far_end(path: Path) -> None:
    """Bring the file's last MiB into the page cache, as another reader of the file would."""
    with open(path, "rb") as file:
        file.seek(FAR.start * 4096)
        file.read()
    assert _pages(path)[FAR].all()


def _device_read_bytes() -> int:
    """Bytes this process (all its threads) had the block layer fetch (/proc/self/io)."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError as exc:
        pytest.skip(f"no per-process I/O accounting here (/proc/self/io: {exc.strerror})")
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("read_bytes")))


def _cold_ready_files(folder: Path) -> tuple[Path, Path]:
    """The measured file and a bystander, written back so their clean pages can be dropped;
    skipped where the file system keeps every page (tmpfs: fadvise DONTNEED drops nothing)."""
    files = folder / "user.bin", folder / "bystander.bin"
    for path in files:
        _user_file(path, COLD_FILE_BYTES)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if _pages(files[0]).any():
        pytest.skip(f"{filesystem_of(folder).fstype} at {folder} keeps a file's pages after "
                    f"fadvise DONTNEED: cache=cold cannot drop them there")
    return files


ENGINES = [(("engine", "threads"), ("qd", "1")), (("engine", "threads"), ("qd", "4")),
           (("engine", "io_uring"), ("qd", "4"))]


@pytest.mark.parametrize("params", ENGINES)
def test_cold_reads_drop_the_files_pages_before_every_sample(folder, params):
    """cache=cold, the method's parameter: before each sample this file's pages are dropped,
    so every sample's reads go to the device (its pages were gone), the pages it read are
    cached after it (dropped before the reads, not after), a part of the file it never reads
    that another reader cached is gone again after each sample, and another file's pages stay."""
    if dict(params)["engine"] == "io_uring" and uring.unavailable():
        pytest.skip(uring.unavailable())
    path, bystander = _cold_ready_files(folder)
    data = path.read_bytes()
    _warm_far_end(bystander)
    case = Case("file-read", f"storage:{path}", pattern=COLD_PATTERN,
                params=(("cache", "cold"), *params))
    pattern_bytes = parse_pattern(COLD_PATTERN).total_bytes
    with open_case(case, TSC_HZ, 0.0, allow_write=False) as opened:
        session = opened.session
        assert opened.info["cache"] == "cold" and "pages dropped" in opened.info["timed"]
        for _ in range(3):
            _warm_far_end(path)
            before = _device_read_bytes()
            session.sample(1)
            assert _device_read_bytes() - before >= pattern_bytes  # none of it was cached
            pages = _pages(path)
            assert not pages[FAR].any()  # the whole file's pages dropped ...
            assert pages[READ].all()  # ... before the sample read its own back in
        before = _device_read_bytes()
        session.sample(4)
        assert _device_read_bytes() - before >= 4 * pattern_bytes  # dropped before each of 4
        got = session.ctx.dst.array.copy()
    assert np.array_equal(got[:pattern_bytes], _expected(data, COLD_PATTERN))
    assert _pages(bystander)[FAR].all()  # this file only, never the box's caches


@pytest.mark.parametrize("params", ENGINES)
def test_warm_reads_keep_the_files_pages(folder, params):
    """cache=warm on the same file: the untimed first pass caches the pattern's pages, the
    samples then fetch nothing from the device, and nothing cached is dropped."""
    if dict(params)["engine"] == "io_uring" and uring.unavailable():
        pytest.skip(uring.unavailable())
    path, _ = _cold_ready_files(folder)
    case = Case("file-read", f"storage:{path}", pattern=COLD_PATTERN,
                params=(("cache", "warm"), *params))
    with open_case(case, TSC_HZ, 0.0, allow_write=False) as opened:
        assert _pages(path)[READ].all()  # the untimed pass
        _warm_far_end(path)
        before = _device_read_bytes()
        opened.session.sample(4)
        assert _device_read_bytes() - before < parse_pattern(COLD_PATTERN).total_bytes
        pages = _pages(path)
        assert pages[FAR].all() and pages[READ].all()


def test_unaligned_direct_reads_are_refused_naming_the_request(direct_folder):
    path = direct_folder / "user.bin"
    _user_file(path)
    case = Case("file-read", f"storage:{path}", pattern="1000x333B")
    with pytest.raises(UsageError, match=r"request 0 is 333 B.*cache=warm or cold"), \
            open_case(case, TSC_HZ, 0.0, False):
        pass


@pytest.mark.parametrize("params", [(("qd", "4"),), (("qd", "4"), ("engine", "threads")),
                                    (("engine", "threads"),)])
def test_a_short_read_fails_the_case_naming_the_request(folder, params):
    """The file shrinks under the open case: the read at its old end comes back empty."""
    path = folder / "user.bin"
    _user_file(path)
    case = Case("file-read", f"storage:{path}", pattern="16x64KiB@64KiB",
                params=(("cache", "cold"), *params))
    with open_case(case, TSC_HZ, 0.0, False) as opened:
        os.truncate(path, 512 * 1024)
        with pytest.raises(RuntimeError, match=r"pread of 65536 B at file offset 524288 .*"
                                               r"moved 0 of 65536 B \(end of file\)"):
            opened.session.sample(1)


def test_the_storage_suite_is_valid_input(folder, monkeypatch):
    from nearlocal.core.cases import validate
    from nearlocal.core.suites import suite_cases

    monkeypatch.setenv("NEARLOCAL_STORAGE", str(folder / "suite.bin"))
    inventory = probe(calibrate=False, gpu=False)
    cases = suite_cases("storage")
    assert {c.method for c in cases} == {"file-read", "file-write"} and len(cases) > 15
    for case in cases:
        validate(case, inventory)
        assert unavailable(case, inventory, allow_write=False) is None, case.id


def test_a_new_file_is_created_filled_and_removed(direct_folder):
    path = direct_folder / "new.bin"
    got, info = _read_into_peer(Case("file-read", f"storage:{path}", pattern="64x64KiB@64KiB",
                                     params=(("qd", "8"),)))
    assert info["owned"] is True and not path.exists()
    assert info["page_cache_resident"] == 0.0 and np.count_nonzero(got) > got.size * 0.9


def test_file_write_lands_the_peers_bytes_in_the_file(direct_folder):
    path = direct_folder / "target.bin"
    _user_file(path, 4 << 20)
    case = Case("file-write", f"storage:{path}", pattern="32x64KiB", params=(("qd", "8"),))
    with open_case(case, TSC_HZ, 0.0, allow_write=True) as opened:
        opened.session.sample(1)
        peer = opened.session.ctx.src.array.copy()
    written = np.frombuffer(path.read_bytes(), np.uint8)
    frags = parse_pattern("32x64KiB").frags  # scattered in the file, packed in the peer
    for file_off, peer_off, length in frags:
        assert np.array_equal(written[file_off:file_off + length], peer[peer_off:peer_off + length])


def test_file_write_needs_allow_write_on_an_existing_file(folder):
    path = folder / "user.bin"
    _user_file(path)
    case = Case("file-write", f"storage:{path}", pattern="64KiB")
    reason = unavailable(case, probe(calibrate=False, gpu=False), allow_write=False)
    assert "--allow-write" in reason
    before = _digest(path)
    assert main(["run", "--method", "file-write", "--region", f"storage:{path}", "--size",
                 "64KiB", "--out", str(folder / "results"), "--quiet"]) == 2
    assert _digest(path) == before


# --- bad input: one line, exit 2 ----------------------------------------------------------------

def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "fifo")
    return f"storage:{folder / 'fifo'}"


def _small(folder: Path) -> str:
    (folder / "small").write_bytes(b"x" * 1000)
    return f"storage:{folder / 'small'}"


BAD = {
    "directory": (lambda f: f"storage:{f}", [], "is a directory"),
    "fifo": (_fifo, [], "is a FIFO"),
    "proc file": (lambda f: "storage:/proc/cpuinfo", [], "pseudo file system"),
    "smaller than the pattern": (_small, [], "cannot hold 16KiB"),
    "no path": (lambda f: "storage:", [], "needs a path"),
    "missing directory": (lambda f: f"storage:{f}/no/such/file", [], "does not exist"),
    "qd 0": (lambda f: f"storage:{f}/new", ["--param", "qd=0"], "qd=0 is out of range"),
    "qd 10^6": (lambda f: f"storage:{f}/new", ["--param", "qd=1000000"], "out of range"),
    "qd text": (lambda f: f"storage:{f}/new", ["--param", "qd=many"], "not a whole number"),
    "cache": (lambda f: f"storage:{f}/new", ["--param", "cache=hot"], "valid are direct"),
    "engine": (lambda f: f"storage:{f}/new", ["--param", "engine=aio"], "valid are auto"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_storage_input_is_one_line_and_exit_2(folder, capsys, name):
    make_region, extra, fragment = BAD[name]
    argv = ["run", "--method", "file-read", "--region", make_region(folder), "--size", "16KiB",
            *extra, "--out", str(folder / "results"), "--quiet", "--budget", "0.05"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert fragment in err, err


def test_file_write_on_a_read_only_file_system_is_one_line_and_exit_2(folder):
    """A read-only tmpfs in a private user + mount namespace (nothing on the box is touched)."""
    unshare = shutil.which("unshare")
    mount_point = folder / "ro"
    mount_point.mkdir()
    if not unshare or subprocess.run([unshare, "-rm", "true"], capture_output=True).returncode:
        pytest.skip("unshare -rm (user and mount namespaces) is not allowed here")
    # this interpreter and this checkout: a `nearlocal` on PATH may be another Python's (a shim)
    nearlocal = f"{sys.executable} -m nearlocal"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for target, flags in ((mount_point / "new.bin", []), (mount_point / "old.bin",
                                                          ["--allow-write"])):
        script = (f"mount -t tmpfs -o size=8m tmpfs {mount_point} && "
                  f"head -c 1048576 /dev/zero > {mount_point}/old.bin && "
                  f"mount -o remount,ro {mount_point} && "
                  f"{nearlocal} run --method file-write --region storage:{target} --size 64KiB "
                  f"--out {folder}/results --quiet {' '.join(flags)}")
        done = subprocess.run([unshare, "-rm", "sh", "-c", script], capture_output=True,
                              text=True, timeout=120, env=env)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "read-only file system" in lines[0], done.stderr


# --- probe ------------------------------------------------------------------------------------

def test_block_devices_from_a_recorded_tree(tmp_path):
    def put(path: str, text: str) -> None:
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    put("/sys/block/nvme0n1/size", "3907029168\n")
    put("/sys/block/nvme0n1/device/model", "Samsung SSD 990 PRO 2TB\n")
    put("/sys/block/nvme0n1/queue/logical_block_size", "512\n")
    put("/sys/block/nvme0n1/queue/rotational", "0\n")
    for q in range(8):
        (tmp_path / f"sys/block/nvme0n1/mq/{q}").mkdir(parents=True)
    put("/sys/block/vda/size", "536870912\n")
    put("/sys/block/vda/device/vendor", "0x1af4\n")
    (tmp_path / "sys/block/vda/mq/0").mkdir(parents=True)
    put("/sys/block/loop0/size", "0\n")
    found = {d.name: d for d in probe_block(SysRoot(tmp_path))}
    assert set(found) == {"nvme0n1", "vda"}  # an empty loop device is no disk
    nvme, vda = found["nvme0n1"], found["vda"]
    assert nvme.nvme and nvme.queues == 8 and nvme.model.startswith("Samsung")
    assert nvme.size_bytes == 3907029168 * 512 and "NVMe" in nvme.text
    assert not vda.nvme and vda.transport == "virtio" and "virtual disk" in vda.text


def test_probe_names_the_file_system_of_a_region(folder, capsys):
    assert main(["probe", "--region", f"storage:{folder}/kv.bin"]) == 0
    out = capsys.readouterr().out
    fstype = filesystem_of(folder).fstype
    assert f"storage:{folder}/kv.bin: {fstype}" in out and "block devices" in out


def test_probe_refuses_a_bad_region_in_one_line(capsys):
    assert main(["probe", "--region", "storage:/proc/cpuinfo"]) == 2
    assert "pseudo file system" in capsys.readouterr().err


# --- the report ---------------------------------------------------------------------------------

def test_s2_ssd_row_is_the_best_read_from_the_disk(tmp_path):
    file = "storage:/data/kv.bin"
    rows = [
        row("file-read", file, size=64 << 20, fragments=64, median=64e6, params={"qd": "32"}),
        row("file-read", file, size=64 << 20, fragments=64, median=128e6),
        row("file-read", file, size=64 << 20, fragments=64, median=8e6,  # memory, not the disk
            params={"qd": "32", "cache": "warm"}),
    ]
    report = build_report([load(make_run(tmp_path, rows))])
    ssd = next(r for r in report.section("s2").table.rows if r[0] == "NVMe SSD")
    assert ssd[2] == pytest.approx((64 << 20) / 64e6)
    assert "qd=32" in ssd[4] and "cache=direct" in ssd[4] and "64x1MiB" in ssd[4]


def test_without_io_uring_auto_falls_back_to_threads_and_says_why(folder, monkeypatch):
    path = folder / "user.bin"
    data = _user_file(path)
    why = "io_uring is not available here: Operation not permitted (1)"
    monkeypatch.setattr(uring, "unavailable", lambda: why)
    got, info = _read_into_peer(Case("file-read", f"storage:{path}", pattern="64x4KiB",
                                     params=(("cache", "warm"), ("qd", "4"))))
    assert info["engine"] == "threads" and info["io_uring"] == why
    assert np.array_equal(got, _expected(data, "64x4KiB"))
    case = Case("file-read", f"storage:{path}", pattern="64x4KiB",
                params=(("cache", "warm"), ("engine", "io_uring")))
    with pytest.raises(RuntimeError, match="not available"), open_case(case, TSC_HZ, 0.0, False):
        pass


def test_reload_media_plot_draws_the_s2_rows_and_names_the_absent_media(tmp_path):
    from nearlocal.report.plots import caption, draw

    rows = [
        row("file-read", "storage:/data/kv.bin", size=64 << 20, fragments=64, median=64e6,
            params={"qd": "32"}),
        row("file-read-gpu", "storage:/data/kv.bin", peer="gpu:0", size=64 << 20, fragments=64,
            median=32e6, params={"qd": "32"}, marker="gpu"),  # the reload into the GPU: faster
        row("peer-memcpy", "gpu:1", peer="gpu:0", size=64 << 20, median=(64 << 20) / 450,
            marker="gpu"),
    ]
    report = build_report([load(make_run(tmp_path, rows))])
    section = report.section("s2")
    ssd = next(r for r in section.table.rows if r[0] == "NVMe SSD")
    assert ssd[4].startswith("file-read-gpu: storage:/data/kv.bin -> gpu:0") and "qd=32" in ssd[4]
    plot = next(p for p in section.plots if p.name == "reload-media")
    drawn = {s.label.split(":")[0]: s.y[0] for s in plot.series}
    assert drawn == {"NVMe SSD": pytest.approx((64 << 20) / 32e6),
                     "peer GPU (NVLink)": pytest.approx(450)}  # the table's peaks, as drawn
    assert plot.unmeasured == ("host memory (PCIe)", "CXL pool")
    assert [c.endswith("not measured") for c in plot.categories] == [True, True, False, False]
    assert "not measured in this run: host memory (PCIe), CXL pool" in caption(plot)
    assert len(plot.points) == 4 and all("reported by the paper" in p.label for p in plot.points)
    assert {p.y for p in plot.points} == {16, 26, 600, 7}  # S2's figures and B12's adapter cap
    ax = draw(plot).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(plot.categories)
