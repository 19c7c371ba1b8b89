"""A DSA work queue's portal: the 4 KiB page of `/dev/dsa/wqX.Y`, mapped write-only, and the
choice of the compiled push and wait (dsa/kernels/portal.py) the CPU can run.

The functions that contain movdir64b / enqcmd / umwait are compiled only when `push_for` /
`wait_for` hand them out, after the CPU flag check: LLVM aborts the whole process if it is asked
for an instruction the CPU lacks.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from dataclasses import dataclass

import numpy as np

from nearlocal.dsa import uapi
from nearlocal.dsa.kernels.portal import (
    ERR_RETRIES,
    ERR_TIMEOUT,
    push_enqcmd,
    push_movdir64b,
    wait_pause,
    wait_spin,
    wait_umwait,
)

PORTAL_BYTES = 4096
MAP_POPULATE = 0x8000

# --- choosing the instructions: only after the CPU flag check --------------------------------


def push_for(mode: str, has_flag) -> object:
    """The push for a WQ mode; raises if the CPU lacks its instruction (never compile it then)."""
    if mode == "dedicated":
        if not has_flag("movdir64b"):
            raise RuntimeError("a dedicated DSA WQ needs movdir64b, which this CPU lacks")
        return push_movdir64b
    if mode == "shared":
        if not has_flag("enqcmd"):
            raise RuntimeError("a shared DSA WQ needs enqcmd, which this CPU lacks")
        return push_enqcmd
    raise RuntimeError(f"unknown DSA WQ mode {mode!r}")


WAITS = ("spin", "pause", "umwait")


def wait_for(name: str, has_flag) -> object:
    if name == "umwait":
        if not has_flag("waitpkg"):
            raise RuntimeError("wait=umwait needs the waitpkg CPU flag, which this CPU lacks")
        return wait_umwait
    return {"spin": wait_spin, "pause": wait_pause}[name]


# --- the portal page -------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass
class Portal:
    """An open `/dev/dsa/wqX.Y` with its portal page mapped write-only (never read: reads of a
    portal return all ones and stall)."""

    path: str
    fd: int
    address: int

    @classmethod
    def open(cls, path: str) -> Portal:
        try:
            fd = os.open(path, os.O_RDWR)
        except PermissionError:
            raise PermissionError(errno.EACCES, f"cannot open {path}: needs root or a udev rule "
                                  "granting read/write on /dev/dsa") from None
        address = _libc.mmap(None, PORTAL_BYTES, mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_POPULATE,
                             fd, 0)
        if address in (None, MAP_FAILED):
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"mmap of the {path} portal failed: {os.strerror(err)}")
        return cls(path, fd, int(address))

    def close(self) -> None:
        if self.fd >= 0:
            _libc.munmap(ctypes.c_void_p(self.address), PORTAL_BYTES)
            os.close(self.fd)
            self.fd = -1


def describe_error(err: np.ndarray) -> str:
    """One line from a kernel's err array."""
    code, index, done, fault = (int(x) for x in err[:4])
    if code == ERR_TIMEOUT:
        return f"descriptor {index}: no completion within the timeout (is the WQ enabled?)"
    if code == ERR_RETRIES:
        return f"descriptor {index}: the shared WQ never accepted it"
    return (f"descriptor {index}: DSA status {uapi.status_name(code)} ({code:#x}), "
            f"{done} bytes completed, fault address {fault:#x}")
