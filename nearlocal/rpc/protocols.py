"""The RPC / record-store protocols by name, as plain data: registering the rpc methods and suite
needs them without compiling the kernels (rpc/kernels/sync.py, which branches on the codes)."""

from __future__ import annotations

from nearlocal.errors import UsageError

COHERENT = 0
FLUSH = 1
PROTOCOLS = {"coherent": COHERENT, "flush": FLUSH}


def protocol_code(name: str) -> int:
    if name not in PROTOCOLS:
        raise UsageError(f"unknown protocol {name!r}: valid protocols are {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]
