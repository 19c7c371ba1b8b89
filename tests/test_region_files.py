"""file:/shm: regions nearlocal creates: nothing is left behind when creating one fails, and a
full file system is a one-line error at creation, never a SIGBUS at the first touch."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nearlocal.errors import UsageError
from nearlocal.regions import host, mapping_cache, parse_region, region_kind
from nearlocal.regions.memory import MAP_HUGETLB, MEMORY_HEADROOM


def _mounted(where: Path, fstype: str, *options: str):
    """A fresh file system of `fstype` mounted at `where` for the test (root only; skipped where
    mounting is not permitted), unmounted after it."""
    where.mkdir()
    done = subprocess.run(["mount", "-t", fstype, *options, fstype, str(where)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {fstype} here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def small_tmpfs(tmp_path) -> Path:
    """A 2 MiB tmpfs."""
    yield from _mounted(tmp_path / "tmpfs", "tmpfs", "-o", "size=2M")


def _open(path: Path, size: int):
    spec = parse_region(f"file:{path}")
    return region_kind(spec).open(spec, size, "wb", False)  # past the planner's capacity check


def test_a_full_tmpfs_is_one_error_at_creation_and_leaves_nothing(small_tmpfs):
    with pytest.raises(UsageError, match="no room for 4MiB") as raised:
        _open(small_tmpfs / "big.bin", 4 << 20)  # before: created, then SIGBUS at the first touch
    assert "\n" not in str(raised.value)
    assert list(small_tmpfs.iterdir()) == []
    region = _open(small_tmpfs / "fits.bin", 1 << 20)  # what fits still maps and is filled
    try:
        assert region.array.size == 1 << 20 and region.array.min() > 0
        with pytest.raises(UsageError, match="no room"):  # the rest of the space is reserved
            _open(small_tmpfs / "second.bin", 1536 << 10)
    finally:
        region.close()
    assert list(small_tmpfs.iterdir()) == []


def test_a_failed_mmap_leaves_no_temporary_file(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(host.mmap, "mmap", refuse)
    with pytest.raises(OSError, match="Cannot allocate memory"):
        _open(tmp_path / "pool.bin", 8192)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_fill_removes_the_published_file(tmp_path, monkeypatch):
    def interrupted(array):
        raise SystemExit(143)  # what SIGTERM raises in a worker

    monkeypatch.setattr(host, "fill_owned", interrupted)
    with pytest.raises(SystemExit):
        _open(tmp_path / "pool.bin", 8192)
    assert list(tmp_path.iterdir()) == []


def test_no_fallocate_support_falls_back_to_a_sparse_file(tmp_path, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(host.os, "posix_fallocate", unsupported)
    region = _open(tmp_path / "pool.bin", 8192)
    try:
        assert os.path.getsize(tmp_path / "pool.bin") == 8192
    finally:
        region.close()
    assert list(tmp_path.iterdir()) == []


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_killed_runs_shm_object_is_its_own_leftover_and_a_users_is_left_alone():
    """Issue 49: on a file system without user xattrs (/dev/shm before Linux 6.6) an object a
    SIGKILLed run had published carried no record of its maker: the next run refused it as the
    user's (exit 2) and nothing removed it. The object is made under its owner link (which names
    its maker) and published from it, so at every kill point what is left names a dead maker.
    Made here as the code leaves it at two kill points, without xattrs; a user's object beside
    is still refused and untouched."""
    from nearlocal.core.cases import Case, unavailable
    from nearlocal.probe import probe
    from nearlocal.regions.base import owner_link_name

    dead, tag = _dead_pid(), f"i49-{os.getpid()}"
    ours, users = Path(f"/dev/shm/nearlocal-{tag}"), Path(f"/dev/shm/nearlocal-{tag}-users")
    made = owner_link_name(ours, dead)  # killed after publishing: the object and its owner link
    made.write_bytes(b"\1" * 8192)
    os.link(made, ours)
    unpublished = owner_link_name(ours, dead)  # killed before publishing: its hidden name only
    unpublished.write_bytes(b"\1" * 8192)
    users.write_bytes(b"mine" * 2048)  # the user's own object, no record of nearlocal
    beside_users = owner_link_name(users, dead)  # a dead run's unpublished try at the same name
    beside_users.write_bytes(b"\1" * 8192)
    inventory = probe()
    try:
        spec = parse_region(f"shm:{ours.name}")
        assert not region_kind(spec).user_owned(spec)
        assert unavailable(Case("store", f"shm:{ours.name}", pattern="4KiB"), inventory,
                           False) is None
        region = region_kind(spec).open(spec, 8192, "wb", False)
        try:
            assert region.info["owned"] and not made.exists() and not unpublished.exists()
        finally:
            region.close()
        assert not ours.exists() and not list(Path("/dev/shm").glob(f".{ours.name}.*"))
        user_spec = parse_region(f"shm:{users.name}")
        assert region_kind(user_spec).user_owned(user_spec)
        assert "--allow-write" in unavailable(Case("store", f"shm:{users.name}", pattern="4KiB"),
                                              inventory, False)
        region = region_kind(user_spec).open(user_spec, 8192, "wb", False)
        try:
            assert not region.info["owned"]
        finally:
            region.close()
        assert users.read_bytes() == b"mine" * 2048 and not beside_users.exists()
    finally:
        for path in (ours, made, unpublished, users, beside_users):
            path.unlink(missing_ok=True)


@pytest.fixture
def ramfs(tmp_path) -> Path:
    """A ramfs: a file system that keeps no user xattrs."""
    yield from _mounted(tmp_path / "ramfs", "ramfs")


def test_a_region_of_a_sigkilled_process_is_replaced_where_no_xattr_is_kept(ramfs):
    """The same for real: a process holding a file: region it made is SIGKILLed; on a file
    system without user xattrs the next open still knows the file as a dead run's."""
    path = ramfs / "pool.bin"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from nearlocal.regions import parse_region, region_kind\n"
         f"spec = parse_region('file:{path}')\n"
         "region = region_kind(spec).open(spec, 8192, 'wb', False)\n"
         "print('open', flush=True)\ntime.sleep(120)\n"],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
    finally:
        holder.kill()
        holder.wait()
    spec = parse_region(f"file:{path}")
    assert path.exists() and not region_kind(spec).user_owned(spec)
    region = _open(path, 8192)
    try:
        assert region.info["owned"]
        names = sorted(p.name for p in ramfs.iterdir())
        assert names[-1] == "pool.bin" and len(names) == 2, names  # the old owner link is gone
    finally:
        region.close()
    assert list(ramfs.iterdir()) == []


def _open_dram(size: int):
    spec = parse_region("dram")
    return region_kind(spec).open(spec, size, "wb", False)


def test_a_closed_dram_mapping_serves_the_next_region_of_its_size_refilled():
    first = _open_dram(1 << 20)
    address = first.array.ctypes.data
    first.array[:] = 0  # what the last case left
    first.close()
    again = _open_dram(1 << 20)
    try:
        assert again.array.ctypes.data == address  # the same pages, no new faults
        assert again.array.min() > 0  # filled afresh: a region never reads the zero page
    finally:
        again.close()
    other = _open_dram((1 << 20) + 4096)  # another length maps anew
    try:
        assert other.array.ctypes.data != address
    finally:
        other.close()


def test_a_region_beyond_the_idle_limit_is_unmapped_on_close(monkeypatch):
    monkeypatch.setattr(mapping_cache.IdleMappings, "LIMIT", 1 << 20)
    monkeypatch.setattr(mapping_cache, "IDLE", mapping_cache.IdleMappings())
    big = _open_dram(2 << 20)
    big.close()
    assert mapping_cache.IDLE.held == 0 and not mapping_cache.IDLE.free
    small = _open_dram(1 << 20)
    small.close()
    assert mapping_cache.IDLE.held == 1 << 20


def test_idle_mappings_are_unmapped_when_a_new_region_would_not_fit_beside_them(monkeypatch):
    monkeypatch.setattr(mapping_cache, "IDLE", mapping_cache.IdleMappings())
    _open_dram(1 << 20).close()
    assert mapping_cache.IDLE.held == 1 << 20
    # the capacity check counted the idle mapping as free: opening another length gives it back
    monkeypatch.setattr(mapping_cache, "memory_available", lambda: 2 << 20)
    other = _open_dram(2 << 20)
    try:
        assert mapping_cache.IDLE.held == 0 and not mapping_cache.IDLE.free
    finally:
        other.close()


def test_idle_hugetlb_mappings_count_as_free_2m_pages_and_are_given_back_for_a_new_one(
        monkeypatch):
    """A process that closed a 256 MiB dram:2M region holds its pages idle: the next 2 MiB-page
    region of the process must count them as free (once it read "the pool has 64MiB free")."""
    from nearlocal.regions.base import RegionSpec

    class Held:
        closed = False

        def close(self):
            self.closed = True

    idle = mapping_cache.IdleMappings()
    huge, plain = Held(), Held()
    idle.free = {(256 << 20, MAP_HUGETLB | 2): [huge], (1 << 20, 2): [plain]}
    monkeypatch.setattr(mapping_cache, "IDLE", idle)
    for module in (host, mapping_cache):  # the dram kind's capacity and the cache's make_room
        monkeypatch.setattr(module, "free_hugetlb_bytes", lambda: 64 << 20)
        monkeypatch.setattr(module, "memory_available", lambda: 8 << 30)
    assert host._dram_capacity(RegionSpec("dram:2M", "dram", "2M"))[0] == 320 << 20
    assert host._dram_capacity(RegionSpec("dram", "dram", ""))[0] == int(((8 << 30) + (1 << 20))
                                                                    * MEMORY_HEADROOM)
    idle.make_room(128 << 20, MAP_HUGETLB)  # 64 MiB free: the idle 2 MiB pages go back
    assert huge.closed and not plain.closed and idle.held == 1 << 20  # no 2 MiB page in those
    idle.make_room(64 << 20, MAP_HUGETLB)  # nothing of that kind left to give back
    assert not plain.closed


def _vm_flags(address: int) -> set[str]:
    """The smaps VmFlags of the mapping holding an address ('nh': MADV_NOHUGEPAGE, 'hg':
    MADV_HUGEPAGE)."""
    start = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            start = low <= address < high
        elif head == "VmFlags:" and start:
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize(("text", "flag", "absent"), [("dram", "nh", "hg"), ("dram:thp", "hg", "nh")])
def test_a_dram_region_asks_for_the_page_size_its_row_says(text, flag, absent):
    """Plain dram refuses huge pages before any fault (THP `always` would back it with whatever
    the kernel gives, and the row says 4K); dram:thp asks for them."""
    spec = parse_region(text)
    region = region_kind(spec).open(spec, 8 << 20, "wb", False)
    try:
        flags = _vm_flags(region.array.ctypes.data)
        assert flag in flags and absent not in flags
        assert region.info["pages"] == ("4K" if text == "dram" else "thp")
    finally:
        region.close()
