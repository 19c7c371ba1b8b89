"""The `storage:PATH` region: a file on a real file system, read and written with pread / pwrite /
io_uring (never mapped), so the bytes come from the disk or the page cache as the case says.

An existing file is the user's: opened read-only unless --allow-write, never truncated or grown.
A path that does not exist is a file nearlocal creates (the capacity check refuses a file system
without room first), fills with pseudo-random bytes, writes back and drops from the page cache,
and removes when the case ends, with the same safety as `file:` (temporary name, hard-link
publish, a creation xattr and a shared flock marking it as a live run's).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.probe.block import filesystem_of
from nearlocal.regions.base import (
    MappedRegion,
    RegionKind,
    RegionSpec,
    register_region_kind,
)
from nearlocal.regions.files import clear_dead_leftovers, create_file, in_use_reason, user_owned_file
from nearlocal.units import format_size

if TYPE_CHECKING:
    from nearlocal.probe import HostInventory

FILL_CHUNK = 8 << 20
POSIX_FADV_DONTNEED = 4


@dataclass
class FileRegion(MappedRegion):
    """A storage region: no mapping (`array` is empty), an open descriptor instead."""

    fd: int = -1
    path: str = ""
    length: int = 0  # bytes the case may touch: [0, length) of the file


def storage_path(spec: RegionSpec) -> Path:
    if not spec.arg:
        raise UsageError("storage region needs a path: storage:PATH")
    return Path(spec.arg)


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _validate(spec: RegionSpec, inventory: HostInventory) -> None:
    path = storage_path(spec)
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{path} is a dangling symbolic link (from {spec.text!r}): nearlocal "
                         "neither follows nor replaces it")
    if path.exists():
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{path} is {_kind_of(mode)} (from {spec.text!r}): a storage "
                             "region is a regular file on a disk's file system")
    elif not path.parent.is_dir():
        raise UsageError(f"directory {path.parent} does not exist (from {spec.text!r})")
    fs = filesystem_of(path)
    if fs.pseudo:
        raise UsageError(f"{path} is on {fs.fstype} ({fs.mount_point}), a pseudo file system "
                         f"whose reads ask the kernel, not a disk (from {spec.text!r}): name a "
                         "file on a disk's file system")


def _unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    return in_use_reason(storage_path(spec), spec)


def _capacity(spec: RegionSpec) -> tuple[int, str] | None:
    """A new file: the file system's free space. An existing file: its length (never grown)."""
    path = storage_path(spec)
    if user_owned_file(path):
        try:
            return path.stat().st_size, f"the existing file {path} (never grown)"
        except OSError:
            return None
    if not path.parent.is_dir():
        return None
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:  # a new file cannot be created there
        return 0, f"the read-only file system of {path.parent}"
    return fs.f_bavail * fs.f_frsize, f"the file system of {path.parent}"


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path if path.exists() else path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _read_only(spec: RegionSpec) -> str | None:
    """Writes (and creating a file) on a read-only file system: refused before the run (the text
    says "cannot hold", as the capacity refusals do, so a run of only such cases exits 2)."""
    path = storage_path(spec)
    if _read_only_fs(path):
        return (f"{spec.text} cannot hold writes: {path if path.exists() else path.parent} is "
                "on a read-only file system")
    return None


def _user_owned(spec: RegionSpec) -> bool:
    return user_owned_file(storage_path(spec))


def _describe(path: Path) -> dict:
    fs = filesystem_of(path)
    return {"path": str(path), "fstype": fs.fstype, "mount": fs.mount_point,
            "block_device": fs.device or "-"}


def _fill(fd: int, length: int, path: Path) -> None:
    """Pseudo-random bytes (a virtual disk may compress or deduplicate zeros), then written back
    and dropped from the page cache: a read of this file starts from the disk."""
    rng = np.random.default_rng(0x5EED)
    written = 0
    try:
        while written < length:
            chunk = rng.integers(0, 256, min(FILL_CHUNK, length - written), np.uint8).tobytes()
            view = memoryview(chunk)
            while view:
                done = os.pwrite(fd, view, written)
                view, written = view[done:], written + done
        os.fsync(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise UsageError(f"no room for {format_size(length)} in {path.parent} to create "
                             f"{path.name}: {exc.strerror}; choose a smaller size or free "
                             "space there") from None
        raise
    os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)


def _open(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> FileRegion:
    path = storage_path(spec)
    length = max(size, 1)
    clear_dead_leftovers(path)  # a killed run's file and hidden names, never a user's
    if os.path.lexists(path):
        if path.is_symlink() and not path.exists():
            raise UsageError(f"{path} is a dangling symbolic link: nearlocal neither follows "
                             "nor replaces it")
        writable = allow_write and not _read_only_fs(path)  # reads of a read-only fs are fine
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode):
                raise UsageError(f"{path} is {_kind_of(found.st_mode)}, not a regular file")
            if found.st_size < length:
                raise UsageError(f"{path} holds {found.st_size} bytes, the case needs {length} "
                                 "(an existing file is never grown)")
        except BaseException:
            os.close(fd)
            raise
        return FileRegion(spec, attr, np.zeros(0, np.uint8), writable,
                          {**_describe(path), "owned": False, "file_bytes": found.st_size},
                          lambda: os.close(fd), fd=fd, path=str(path), length=length)
    fd, _, remove = create_file(path, lambda fd: _fill(fd, length, path))
    return FileRegion(spec, attr, np.zeros(0, np.uint8), True,
                      {**_describe(path), "owned": True, "file_bytes": length}, remove,
                      fd=fd, path=str(path), length=length)


STORAGE = register_region_kind(RegionKind(
    name="storage", syntax="storage:PATH", space="storage", attrs=frozenset({"wb"}),
    summary="a file on a disk's file system, read / written with pread or io_uring (never "
            "mapped); created, filled and removed if new, written only with --allow-write",
    validate=_validate, unavailable=_unavailable, open=_open, user_owned=_user_owned,
    instances=lambda inventory: [], capacity=_capacity, creates=storage_path,
    read_only=_read_only,
))
