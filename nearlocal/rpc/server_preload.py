"""Preloaded by the fork server an MPI rank's RPC servers are forked from (slots.ServerProcess):
the server's kernel loaded once, so each server is ready in milliseconds. Ctrl-C is the rank's to
handle: the fork server ends when the rank does, and its servers with it."""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)

from nearlocal.rpc.slots import load_server_kernel  # noqa: E402

load_server_kernel()
