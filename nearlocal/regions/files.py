"""The life of a file nearlocal creates for a region (file:, shm: and storage: regions): made under
its owner link and a shared flock, published without replacing anything, removed when done; and
how a killed run's leftovers are told from a user's file and a live run's."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nearlocal.errors import UsageError
from nearlocal.regions.base import CREATED_XATTR, RegionSpec, hidden_names, maker_of, owner_link_name
from nearlocal.units import format_size

T = TypeVar("T")


def _held_by_a_run(path: Path) -> bool:
    """True when a live nearlocal process created this file and still uses it: it holds a shared
    flock on it until it removes it (what tells it from a user's file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # also drops the lock it may have taken
    return False


def _maker() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def left_by_a_dead_run(path: Path) -> bool:
    """True for a file nearlocal created (its xattr or owner link says so) whose maker, on this
    host, is dead and holds no lock: a SIGKILLed run's leftover, not a user's file, so it may be
    replaced."""
    maker = maker_of(path)
    if maker is None or not maker[0] or _held_by_a_run(path):
        return False
    try:
        os.kill(maker[1], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False  # its maker is alive (a pid reused is alive too: left alone)


def clear_dead_leftovers(path: Path) -> None:
    """Remove what killed runs left for this name: the file at it with its owner link, and the
    hidden names of files they never published (each holds its memory on a tmpfs). A user's file
    (no record of nearlocal making it) and a live run's are left alone."""
    if left_by_a_dead_run(path):
        path.unlink(missing_ok=True)
    for hidden in hidden_names(path):
        if left_by_a_dead_run(hidden):
            hidden.unlink(missing_ok=True)


def in_use_reason(path: Path, spec: RegionSpec) -> str | None:
    """Why a file another live run created (and removes when done) cannot be this case's."""
    if not _held_by_a_run(path):
        return None
    return (f"{path} is in use by another running nearlocal process (it created the file and "
            f"removes it when done): give another name than {spec.text!r}, or wait")


def user_owned_file(path: Path) -> bool:
    """A file that is there and not a dead run's leftover is the user's (a dangling link too)."""
    return os.path.lexists(path) and not left_by_a_dead_run(path)


def _publish(temp: Path, path: Path) -> None:
    """Give the new file its name without replacing anything that appeared there meanwhile (a
    user's file, a link, another run's region): a hard link fails where a rename would replace."""
    try:
        os.link(temp, path, follow_symlinks=False)
    except FileExistsError:
        raise UsageError(f"{path} appeared while nearlocal was creating it (another run, or "
                         "someone's file): it was left alone; give another name") from None


def _reserve(fd: int, length: int, path: Path) -> None:
    """Allocate the file's blocks now: on a full file system (a 2 MiB tmpfs, /dev/shm filled by
    someone else since the capacity check) the first touch of a sparse mapping is a SIGBUS that
    kills the process; reserving first makes it an ENOSPC here, reported as one line."""
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate there: sparse, as before
            os.ftruncate(fd, length)
            return
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.ENOMEM):
            raise UsageError(f"no room for {format_size(length)} in {path.parent} to create "
                             f"{path.name}: {exc.strerror}; choose a smaller size or free "
                             "space there") from None
        raise


def create_file(path: Path, prepare: Callable[[int], T],
                discard: Callable[[T], None] = lambda prepared: None) -> tuple[int, T, Callable[[], None]]:
    """Create a new file at `path` as nearlocal's own (file:, shm: and storage: regions): made
    under its owner link (O_EXCL, no link followed; the name says which process on which host
    made it, so the file is never without that record, whatever the file system keeps), marked
    as a live run's (a shared flock held until it is removed; the creation xattr where the file
    system keeps one), `prepare(fd)`d (filled, mapped), then published with a hard link that
    never replaces what appeared meanwhile (`discard(prepared)` if that fails). The owner link
    stays while the file does: a SIGKILL at any point leaves only what `clear_dead_leftovers`
    knows as a dead run's. Returns (fd, what prepare returned, remove): remove() unlinks only the
    file made here (whatever has the name now is left alone), then its owner link, and closes fd."""
    temp = owner_link_name(path)
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # held until removed: marks the file as a live run's
        with contextlib.suppress(OSError):  # a file system without user xattrs: the link says it
            os.setxattr(fd, CREATED_XATTR, _maker().encode())
        identity = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        prepared = prepare(fd)
        try:
            _publish(temp, path)
        except BaseException:
            discard(prepared)
            raise
    except BaseException:
        os.close(fd)
        temp.unlink(missing_ok=True)  # never published: nothing of it is left
        raise

    def remove() -> None:
        try:
            for name in (path, temp):  # the name first: a file without its owner link is a user's
                with contextlib.suppress(OSError):
                    found = os.lstat(name)
                    if (found.st_dev, found.st_ino) == identity:
                        name.unlink()
        finally:
            os.close(fd)

    return fd, prepared, remove


def reserve_and_map(fd: int, length: int, path: Path) -> mmap.mmap:
    _reserve(fd, length, path)
    return mmap.mmap(fd, length, flags=mmap.MAP_SHARED)

